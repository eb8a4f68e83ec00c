//! The durable store across restarts of the real binary: files it must refuse (exit 2,
//! left untouched), push configurations and waiting tasks that outlive the process, a
//! webhook retry that resumes with its delivery id, a graceful shutdown, and the memory
//! backend that keeps nothing.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::binary::{BIN, Binary, TempDir};
use support::receiver::{Answer, Receiver};

const KEY: &str = "key-restart-0123456789";

fn config(extra: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
{extra}
[webhooks]
allow_private_networks = true

[[api_keys]]
name = "r"
key = "{KEY}"

[[agents]]
id = "echo"

[[agents]]
id = "tck"
backend = "tck"

[[agents]]
id = "slow"
[agents.echo]
delay_ms = 60000
"#
    )
}

/// A `.redb` path names a redb store; anything else, the default log's directory.
fn store_at(path: &std::path::Path) -> String {
    let backend = if path.extension().is_some_and(|e| e == "redb") {
        "backend = \"redb\"\n"
    } else {
        ""
    };
    format!("[store]\n{backend}path = \"{}\"\n", path.display())
}

async fn call(base: &str, path: &str, method: &str, params: Value, v: &str) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let mut req = reqwest::Client::new()
        .post(format!("{base}/api/v1/a2a/{path}"))
        .header("x-api-key", KEY)
        .header("content-type", "application/json")
        .body(body.to_string());
    if !v.is_empty() {
        req = req.header("a2a-version", v);
    }
    let resp = req.send().await.expect("request");
    serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json")
}

/// The official task `id` is still waiting for input.
async fn assert_still_waiting(base: &str, id: &str) {
    let v = call(base, "tck/jsonrpc/v1", "GetTask", json!({"id": id}), "1.0").await;
    assert_eq!(
        v["result"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{v}"
    );
}

fn seed_message(text: &str) -> Value {
    json!({"message": {"role": "user", "messageId": uuid::Uuid::new_v4().to_string(),
                       "parts": [{"type": "text", "text": text}]}})
}

/// Runs the binary on a configuration it must refuse; returns (exit code, stderr).
fn refused(text: &str) -> (Option<i32>, String) {
    let dir = TempDir::new();
    let path = dir.path.join("a2ad.toml");
    std::fs::write(&path, text).expect("write");
    let out = Command::new(BIN)
        .current_dir(&dir.path)
        .args(["--config", &path.display().to_string()])
        .output()
        .expect("run");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Starting on `file` exits 2 with a message containing `needle`, and the file is byte for
/// byte as it was.
fn refused_untouched(file: &std::path::Path, needle: &str) {
    let before = std::fs::read(file).expect("read");
    let (code, err) = refused(&config(&store_at(file)));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(needle), "{err}");
    assert!(
        std::fs::read(file).expect("read") == before,
        "left untouched"
    );
}

#[test]
fn a_locked_foreign_unreadable_or_newer_file_exits_2_and_is_left_as_it_was() {
    let dir = TempDir::new();
    // Locked by a running a2ad.
    let store = dir.path.join("live.redb");
    let text = config(&store_at(&store));
    let running = Binary::start(&text, &[], &[]);
    let (code, err) = refused(&text);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("in use by another a2ad"), "{err}");
    drop(running);

    // Not a redb file at all.
    let foreign = dir.path.join("foreign.redb");
    std::fs::write(&foreign, b"these are someone's notes, not a database").expect("write");
    refused_untouched(&foreign, "not an a2ad store");

    // A redb file of another program.
    let other = dir.path.join("other.redb");
    {
        let db = redb::Database::create(&other).expect("create");
        let w = db.begin_write().expect("write");
        {
            let t: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("theirs");
            w.open_table(t)
                .expect("table")
                .insert("k", "v")
                .expect("insert");
        }
        w.commit().expect("commit");
    }
    refused_untouched(&other, "another program");

    // An a2ad store of a newer schema.
    let newer = dir.path.join("newer.redb");
    {
        let db = redb::Database::create(&newer).expect("create");
        let w = db.begin_write().expect("write");
        {
            let t: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("meta");
            let mut meta = w.open_table(t).expect("table");
            meta.insert(b"app".as_slice(), b"a2ad".as_slice())
                .expect("insert");
            meta.insert(b"schema".as_slice(), 99u32.to_be_bytes().as_slice())
                .expect("insert");
        }
        w.commit().expect("commit");
    }
    refused_untouched(&newer, "newer a2ad");

    // The default log store, in use by a running a2ad.
    let log = config(&store_at(&dir.path.join("log")));
    let running = Binary::start(&log, &[], &[]);
    let (code, err) = refused(&log);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("in use by another a2ad"), "{err}");
    drop(running);

    // Unreadable: the path is a directory.
    let folder = dir.path.join("folder.redb");
    std::fs::create_dir_all(&folder).expect("mkdir");
    let (code, err) = refused(&config(&store_at(&folder)));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("folder.redb"), "names the file: {err}");
}

#[tokio::test]
async fn the_default_store_is_a_directory_beside_the_server_and_it_says_where() {
    let dir = TempDir::new();
    let path = dir.path.join("a2ad.toml");
    std::fs::write(&path, config("")).expect("write");
    let out = Command::new(BIN)
        .current_dir(&dir.path)
        .args([
            "--config",
            &path.display().to_string(),
            "--listen",
            "127.0.0.1:0",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let mut child = out;
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let first = lines.next().expect("a line").expect("text");
    assert_eq!(first, "store: ./a2ad-data/log (log)");
    let _ = child.kill();
    let _ = child.wait();
    assert!(dir.path.join("a2ad-data").join("log").join("LOCK").exists());
}

#[tokio::test]
async fn waiting_tasks_push_configurations_and_a_retried_delivery_outlive_a_crash() {
    let dir = TempDir::new();
    let text = config(&store_at(&dir.path.join("log")));
    // The receiver refuses the first attempt, so the delivery waits 10 s to retry.
    let rx = Receiver::start(std::sync::Arc::new(|n| {
        if n == 0 {
            Answer::status(503)
        } else {
            Answer::status(200)
        }
    }))
    .await;
    let server = Binary::start(&text, &[], &[]);
    let base = server.base.clone();
    // A task waiting for input (official 1.0), with a named push configuration.
    let msg = json!({"message": {"role": "ROLE_USER", "messageId": format!("tck-input-required-{}", uuid::Uuid::new_v4()),
                                 "parts": [{"text": "wait"}]}});
    let v = call(&base, "tck/jsonrpc/v1", "SendMessage", msg, "1.0").await;
    let waiting = v["result"]["task"].clone();
    assert_eq!(
        waiting["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{v}"
    );
    let task = waiting["id"].as_str().expect("id").to_string();
    let v = call(
        &base,
        "tck/jsonrpc/v1",
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "id": "keep-me", "url": "http://127.0.0.1:9/never"}),
        "1.0",
    )
    .await;
    assert_eq!(v["result"]["id"], "keep-me", "{v}");
    // A seed delivery whose first attempt fails and retries in 30 s.
    let v = call(
        &base,
        "echo",
        "tasks/pushNotificationConfig/set",
        json!({"config": {"url": rx.url, "events": ["task.completed"],
                          "retryPolicy": {"maxRetries": 3, "initialDelay": 10}}}),
        "",
    )
    .await;
    assert_eq!(v["result"]["configured"], true, "{v}");
    let v = call(&base, "echo", "message/send", seed_message("notify"), "").await;
    assert_eq!(v["result"]["status"]["state"], "completed", "{v}");
    let first = rx.wait_for(1).await;
    let delivery = first[0].header("x-webhook-delivery").to_string();
    assert_eq!(first[0].json()["delivery"]["attempt"], 1);
    // Crash once the retry is scheduled and recorded (the outbox then says attempt 2,
    // due 10 s after the first).
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = reqwest::get(format!("{base}/metrics"))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        let value = |name: &str| {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(-1.0)
        };
        if value("a2ad_webhook_retries_total ") >= 1.0 && value("a2ad_store_pending_writes ") == 0.0
        {
            break;
        }
        assert!(Instant::now() < end, "the retry was never recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = server.kill9();

    let server = Binary::start(&text, &[], &[]);
    let base = server.base.clone();
    assert_still_waiting(&base, &task).await;
    let v = call(
        &base,
        "tck/jsonrpc/v1",
        "GetTaskPushNotificationConfig",
        json!({"taskId": task, "id": "keep-me"}),
        "1.0",
    )
    .await;
    assert_eq!(v["result"]["url"], "http://127.0.0.1:9/never", "{v}");
    // The waiting task continues on the restarted server.
    let mut more = json!({"role": "ROLE_USER", "messageId": format!("tck-complete-task-{}", uuid::Uuid::new_v4()),
                          "parts": [{"text": "go on"}], "taskId": task});
    more["contextId"] = waiting["contextId"].clone();
    let v = call(
        &base,
        "tck/jsonrpc/v1",
        "SendMessage",
        json!({"message": more}),
        "1.0",
    )
    .await;
    assert_eq!(
        v["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{v}"
    );
    // The retry is due 10 s after the first attempt; it arrives then, with the same id.
    let end = Instant::now() + Duration::from_secs(90);
    let retried = loop {
        let hits = rx.hits();
        if hits.len() >= 2 {
            break hits[1].clone();
        }
        assert!(Instant::now() < end, "the pending delivery never resumed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(retried.header("x-webhook-delivery"), delivery);
    assert_eq!(retried.json()["delivery"]["attempt"], 2);
    let waited = retried.at.duration_since(first[0].at);
    assert!(
        waited >= Duration::from_secs(9),
        "the retry kept its due time: {waited:?}"
    );
    let (code, _) = server.stop();
    assert_eq!(code, 0);
}

#[tokio::test]
async fn a_graceful_shutdown_cancels_running_tasks_and_keeps_waiting_ones() {
    let dir = TempDir::new();
    let text = config(&store_at(&dir.path.join("log")));
    let server = Binary::start(&text, &[], &[]);
    let base = server.base.clone();
    let msg = json!({"message": {"role": "ROLE_USER", "messageId": format!("tck-input-required-{}", uuid::Uuid::new_v4()),
                                 "parts": [{"text": "wait"}]}});
    let v = call(&base, "tck/jsonrpc/v1", "SendMessage", msg, "1.0").await;
    let waiting = v["result"]["task"]["id"].as_str().expect("id").to_string();
    let mut running = seed_message("forever");
    running["configuration"] = json!({"blocking": false});
    let v = call(&base, "slow", "message/send", running, "").await;
    let slow = v["result"]["id"].as_str().expect("id").to_string();
    let (code, _) = server.stop();
    assert_eq!(code, 0);

    let server = Binary::start(&text, &[], &[]);
    let base = server.base.clone();
    assert_still_waiting(&base, &waiting).await;
    let v = call(&base, "slow", "tasks/get", json!({"taskId": slow}), "").await;
    assert_eq!(v["result"]["status"]["state"], "canceled", "{v}");
    assert_eq!(v["result"]["status"]["reason"], "shutdown", "{v}");
    let (code, _) = server.stop();
    assert_eq!(code, 0);
}

#[tokio::test]
async fn the_memory_backend_keeps_nothing_across_a_restart() {
    let text = config("[store]\nbackend = \"memory\"\n");
    let server = Binary::start(&text, &[], &[]);
    let v = call(
        &server.base,
        "echo",
        "message/send",
        seed_message("gone"),
        "",
    )
    .await;
    let task = v["result"]["id"].as_str().expect("id").to_string();
    let _ = server.kill9();
    let server = Binary::start(&text, &[], &[]);
    let v = call(
        &server.base,
        "echo",
        "tasks/get",
        json!({"taskId": task}),
        "",
    )
    .await;
    assert_eq!(v["error"]["code"], -32000, "{v}");
}

/// The reply's text parts, joined.
fn reply_text(v: &Value) -> String {
    v["result"]["status"]["message"]["parts"]
        .as_array()
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_go_on_after_a_crash_with_their_turns() {
    let dir = TempDir::new();
    let text = config(&store_at(&dir.path.join("log")));
    let server = Binary::start(&text, &[], &[]);
    // One conversation the server named, one the client named; two turns each.
    let v = call(
        &server.base,
        "echo",
        "message/send",
        seed_message("one"),
        "",
    )
    .await;
    let made = v["result"]["contextId"]
        .as_str()
        .expect("context")
        .to_string();
    let named = uuid::Uuid::new_v4().to_string();
    for context in [&made, &named] {
        let mut m = seed_message("again");
        m["contextId"] = json!(context);
        if context == &named {
            let mut first = seed_message("first");
            first["contextId"] = json!(context);
            let v = call(&server.base, "echo", "message/send", first, "").await;
            assert!(reply_text(&v).contains("turn 1"), "{v}");
        }
        let v = call(&server.base, "echo", "message/send", m, "").await;
        assert!(reply_text(&v).contains("turn 2"), "{v}");
    }
    let _ = server.kill9();

    let server = Binary::start(&text, &[], &[]);
    for context in [&made, &named] {
        let mut m = seed_message("after the crash");
        m["contextId"] = json!(context);
        let v = call(&server.base, "echo", "message/send", m, "").await;
        assert!(
            reply_text(&v).contains("turn 3"),
            "the conversation went on: {v}"
        );
    }
    let (code, _) = server.stop();
    assert_eq!(code, 0);
}

/// A finished task's record carries its conversation turn; evicted (here by
/// `max_finished_tasks`), it leaves the turn behind as a row of its own — on the redb file
/// as on the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_goes_on_after_a_crash_when_its_tasks_were_evicted() {
    let dir = TempDir::new();
    for store in [dir.path.join("log"), dir.path.join("a2ad.redb")] {
        let text = config(&format!("max_finished_tasks = 1\n{}", store_at(&store)));
        let server = Binary::start(&text, &[], &[]);
        let mut turns = Vec::new();
        for text in ["one", "two"] {
            let v = call(&server.base, "echo", "message/send", seed_message(text), "").await;
            assert!(reply_text(&v).contains("turn 1"), "{v}");
            let task = v["result"]["id"].as_str().expect("id").to_string();
            let context = v["result"]["contextId"].as_str().expect("context");
            turns.push((task, context.to_string()));
        }
        // The second task evicted the first (one finished task is retained).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = call(
                &server.base,
                "echo",
                "tasks/get",
                json!({"taskId": turns[0].0}),
                "",
            )
            .await;
            if v["error"]["code"] == -32000 {
                break;
            }
            assert!(Instant::now() < deadline, "the first task stays: {v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = server.kill9();

        let server = Binary::start(&text, &[], &[]);
        for (_, context) in &turns {
            let mut m = seed_message("after the crash");
            m["contextId"] = json!(context);
            let v = call(&server.base, "echo", "message/send", m, "").await;
            assert!(
                reply_text(&v).contains("turn 2"),
                "the conversation went on ({}): {v}",
                store.display()
            );
        }
        let (code, _) = server.stop();
        assert_eq!(code, 0);
    }
}

#[test]
fn an_unreachable_postgresql_at_start_up_exits_2_naming_it_without_its_password() {
    // Port 1 on loopback: nothing listens (connection refused at once).
    let text = config(
        "[cluster]\nengine = \"postgres\"\nurl = \"postgres://a2ad:s3cret@127.0.0.1:1/a2ad\"\n",
    );
    let (code, err) = refused(&text);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("127.0.0.1:1"), "names the server: {err}");
    assert!(err.contains("cannot connect"), "{err}");
    assert!(!err.contains("s3cret"), "the password is masked: {err}");
}
