//! The durable store's failure modes, against the real binary and real files: a file with
//! zeroed pages, records that cannot be read (refused, or set aside on the operator's
//! word), an empty file, and a full disk — a real ENOSPC on a private tmpfs — that the
//! server recovers from once space is back, and that cannot hold a shutdown past its grace.

use crate::support;

use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::binary::{BIN, Binary, TempDir};

const KEY: &str = "key-damage-0123456789";

/// A `.redb` path names a redb store; anything else, the default log's directory.
fn backend(store: &Path) -> &'static str {
    if store.extension().is_some_and(|e| e == "redb") {
        "backend = \"redb\"\n"
    } else {
        ""
    }
}

fn config(store: &Path, server: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
{server}

[[api_keys]]
name = "d"
key = "{KEY}"

[[agents]]
id = "echo"
[agents.limits]
requests_per_minute = 1000000

[store]
{}path = "{}"
"#,
        backend(store),
        store.display()
    )
}

async fn call(base: &str, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let resp = reqwest::Client::new()
        .post(format!("{base}/api/v1/a2a/echo"))
        .header("x-api-key", KEY)
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(120))
        .body(body.to_string())
        .send()
        .await
        .expect("request");
    serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json")
}

async fn send(base: &str, text: &str) -> Value {
    let message = json!({"message": {"role": "user", "messageId": uuid::Uuid::new_v4().to_string(),
                                     "parts": [{"type": "text", "text": text}]}});
    call(base, "message/send", message).await
}

/// Fills a store with `n` finished tasks of about 2 KB each; returns their ids.
async fn fill(base: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let v = send(base, &format!("{i}:{}", "x".repeat(2000))).await;
        assert_eq!(v["result"]["status"]["state"], "completed", "{v}");
        ids.push(v["result"]["id"].as_str().expect("id").to_string());
    }
    ids
}

/// Every task is served, completed, with its own text.
async fn all_served(base: &str, ids: &[String]) {
    for id in ids {
        let v = call(base, "tasks/get", json!({"id": id})).await;
        assert_eq!(v["result"]["status"]["state"], "completed", "{id}: {v}");
    }
}

/// Starts the binary on `text` (with `extra` arguments): `Ok` once it listens, or the exit
/// code and stderr when it refused to start.
fn start_or_refuse(text: &str, extra: &[&str]) -> Result<Binary, (Option<i32>, String)> {
    let dir = TempDir::new();
    let path = dir.path.join("a2ad.toml");
    std::fs::write(&path, text).expect("write");
    let mut child = Command::new(BIN)
        .current_dir(&dir.path)
        .args([
            "--config",
            &path.display().to_string(),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let listening = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("listening on"));
    let _ = child.kill();
    let out = child.wait_with_output().expect("wait");
    if listening {
        return Ok(Binary::start_with(text, &[], &[], extra));
    }
    Err((
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Defect 6: 64 KiB of zeros inside a cleanly closed store. The server refuses to start
/// (exit 2, one line naming the file) and leaves the file as it was — or, where the zeros
/// fell on unused space, starts and serves every task. It never panics.
#[tokio::test]
async fn zeroed_pages_refuse_the_start_and_leave_the_file_untouched() {
    let dir = TempDir::new();
    let clean = dir.path.join("clean.redb");
    let server = Binary::start(&config(&clean, ""), &[], &[]);
    let ids = fill(&server.base, 300).await;
    let (code, err) = server.stop();
    assert_eq!(code, 0, "{err}");
    let mut refusals = 0;
    for (i, fraction) in [0.25, 0.5].into_iter().enumerate() {
        let damaged = dir.path.join(format!("damaged-{i}.redb"));
        std::fs::copy(&clean, &damaged).expect("copy");
        let len = std::fs::metadata(&damaged).expect("len").len();
        let at = (len as f64 * fraction) as u64 / 4096 * 4096;
        {
            use std::io::{Seek, SeekFrom};
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&damaged)
                .expect("open");
            f.seek(SeekFrom::Start(at)).expect("seek");
            f.write_all(&[0u8; 65536]).expect("zeros");
        }
        let before = std::fs::read(&damaged).expect("read");
        match start_or_refuse(&config(&damaged, ""), &[]) {
            Err((code, err)) => {
                refusals += 1;
                assert_eq!(code, Some(2), "{err}");
                assert!(!err.contains("panicked"), "{err}");
                assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
                assert!(err.contains(&damaged.display().to_string()), "{err}");
                assert!(err.contains("damaged"), "{err}");
                assert!(
                    std::fs::read(&damaged).expect("read") == before,
                    "untouched"
                );
            }
            Ok(server) => {
                all_served(&server.base, &ids).await;
                let (code, err) = server.stop();
                assert_eq!(code, 0, "{err}");
            }
        }
    }
    assert!(refusals >= 1, "zeros inside the data were not noticed");
}

/// Overwrites every `every`-th task record's value with bytes that are no record.
fn damage_records(path: &Path, every: usize) -> usize {
    let db = redb::Database::open(path).expect("open");
    let tasks: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("tasks");
    let keys: Vec<Vec<u8>> = {
        use redb::{ReadableDatabase as _, ReadableTable as _};
        let read = db.begin_read().expect("read");
        let t = read.open_table(tasks).expect("table");
        t.iter()
            .expect("iter")
            .map(|e| e.expect("row").0.value().to_vec())
            .collect()
    };
    let w = db.begin_write().expect("write");
    let mut n = 0;
    {
        let mut t = w.open_table(tasks).expect("table");
        for k in keys.iter().step_by(every) {
            t.insert(k.as_slice(), b"\xff\x00 not a task record".as_slice())
                .expect("insert");
            n += 1;
        }
    }
    w.commit().expect("commit");
    n
}

/// Defect 7: records that cannot be decoded refuse the start (exit 2, the file and the
/// count, the file untouched); `--set-aside-damaged` copies them beside the store, removes
/// them and serves the rest, and later starts need nothing special.
#[tokio::test]
async fn damaged_records_refuse_the_start_unless_set_aside() {
    let dir = TempDir::new();
    let store = dir.path.join("a2ad.redb");
    let text = config(&store, "");
    let server = Binary::start(&text, &[], &[]);
    let ids = fill(&server.base, 40).await;
    let (code, err) = server.stop();
    assert_eq!(code, 0, "{err}");
    let damaged = damage_records(&store, 5);
    assert_eq!(damaged, 8);

    let before = std::fs::read(&store).expect("read");
    let Err((code, err)) = start_or_refuse(&text, &[]) else {
        panic!("started on a file with damaged records");
    };
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&store.display().to_string()), "{err}");
    assert!(err.contains("8 damaged record(s)"), "{err}");
    assert!(err.contains("tasks: 8"), "{err}");
    assert!(
        err.contains("--set-aside-damaged"),
        "says what to do: {err}"
    );
    assert!(std::fs::read(&store).expect("read") == before, "untouched");

    let server = start_or_refuse(&text, &["--set-aside-damaged"]).expect("starts");
    let mut served = 0;
    for id in &ids {
        let v = call(&server.base, "tasks/get", json!({"id": id})).await;
        if v["result"]["status"]["state"] == "completed" {
            served += 1;
        } else {
            assert_eq!(v["error"]["code"], -32000, "{v}");
        }
    }
    assert_eq!(served, ids.len() - damaged);
    let (code, err) = server.stop();
    assert_eq!(code, 0, "{err}");
    let aside: Vec<PathBuf> = std::fs::read_dir(&dir.path)
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("a2ad.redb.damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    let lines = std::fs::read_to_string(&aside[0]).expect("read");
    assert_eq!(lines.lines().count(), damaged);
    for line in lines.lines() {
        let v: Value = serde_json::from_str(line).expect("json line");
        assert_eq!(v["table"], "tasks");
        assert!(v["value"].as_str().expect("hex").starts_with("ff00"), "{v}");
    }
    // Set aside once: an ordinary start now serves the rest.
    let server = start_or_refuse(&text, &[]).expect("starts without the flag");
    let v = call(&server.base, "tasks/get", json!({"id": ids[1]})).await;
    assert_eq!(v["result"]["status"]["state"], "completed", "{v}");
    drop(server);
}

/// Defect 9: an existing empty file is not a new store.
#[test]
fn an_empty_store_file_is_refused_and_left_empty() {
    let dir = TempDir::new();
    let store = dir.path.join("a2ad.redb");
    std::fs::write(&store, b"").expect("truncate");
    let Err((code, err)) = start_or_refuse(&config(&store, ""), &[]) else {
        panic!("started on an empty file");
    };
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is empty"), "{err}");
    assert!(err.contains(&store.display().to_string()), "{err}");
    assert_eq!(
        std::fs::metadata(&store).expect("meta").len(),
        0,
        "left empty"
    );
}

async fn health(base: &str) -> (u16, String) {
    match reqwest::Client::new()
        .get(format!("{base}/healthz"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
    {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

async fn wait_health(base: &str, status: u16, within: Duration) -> String {
    let end = Instant::now() + within;
    loop {
        let (s, body) = health(base).await;
        if s == status {
            return body;
        }
        assert!(
            Instant::now() < end,
            "/healthz never answered {status} (last {s} {body})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes 1 MiB blocks to `path` until the file system is full.
fn fill_disk(path: &Path) {
    let mut f = std::fs::File::create(path).expect("filler");
    let block = vec![7u8; 1 << 20];
    for _ in 0..1024 {
        if f.write_all(&block).and_then(|()| f.sync_all()).is_err() {
            return;
        }
    }
    panic!("the private tmpfs never filled up");
}

/// Whether this machine lets the test make a private tmpfs (root and `unshare`).
fn private_tmpfs_available() -> bool {
    let ok = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=1m tmpfs /mnt && umount /mnt")
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("A2AD_REQUIRE_UNSHARE").is_none(),
            "A2AD_REQUIRE_UNSHARE is set but a private tmpfs cannot be made (needs root and unshare)"
        );
        eprintln!("SKIPPED: a private tmpfs needs root and unshare");
    }
    ok
}

/// Starts the binary (`server` settings added) with its log on a private 24 MiB tmpfs of
/// its own mount namespace; returns it and that tmpfs as the test reaches it (the
/// process's own view, `/proc/PID/root`), for the test to fill. `None` where this machine
/// cannot make one (`private_tmpfs_available`).
fn start_on_private_tmpfs(dir: &TempDir, server: &str) -> Option<(Binary, PathBuf)> {
    if !private_tmpfs_available() {
        return None;
    }
    let mnt = dir.path.join("mnt");
    std::fs::create_dir_all(&mnt).expect("mkdir");
    let text = config(&mnt.join("log"), server);
    let mount = "mount -t tmpfs -o size=24m tmpfs \"$0\" && exec \"$@\"";
    let mnt_arg = mnt.display().to_string();
    let binary = Binary::start(
        &text,
        &[],
        &[
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            mount,
            &mnt_arg,
        ],
    );
    let inside = PathBuf::from(format!("/proc/{}/root{}", binary.pid(), mnt.display()));
    assert!(inside.join("log").join("LOCK").exists(), "{inside:?}");
    Some((binary, inside))
}

/// Defect 5: on a full disk (a real ENOSPC) the server says `store failing`, acknowledges
/// nothing, and recovers by itself once space is back: the stalled sends complete and new
/// ones work. Full again, a SIGTERM ends the process within its grace, non-zero, saying
/// how many writes never became durable.
#[tokio::test]
async fn a_full_disk_stalls_then_recovers_and_cannot_hold_a_shutdown() {
    let dir = TempDir::new();
    let Some((server, inside)) = start_on_private_tmpfs(&dir, "shutdown_grace_seconds = 2") else {
        return;
    };
    let base = server.base.clone();
    fill(&base, 5).await;

    fill_disk(&inside.join("filler"));
    let stalled: Vec<_> = (0..4)
        .map(|i| {
            let base = base.clone();
            tokio::spawn(async move {
                send(&base, &format!("during {i}: {}", "y".repeat(20_000))).await
            })
        })
        .collect();
    let body = wait_health(&base, 503, Duration::from_secs(60)).await;
    assert!(body.contains("store failing"), "{body}");
    std::fs::remove_file(inside.join("filler")).expect("free the space");
    wait_health(&base, 200, Duration::from_secs(60)).await;
    for s in stalled {
        let v = s.await.expect("join");
        assert_eq!(v["result"]["status"]["state"], "completed", "{v}");
    }
    let after = send(&base, "after the disk had room again").await;
    assert_eq!(after["result"]["status"]["state"], "completed", "{after}");
    let log = server.stderr();
    assert!(log.contains("store commits succeed again"), "{log}");

    // Full again, and the operator stops the server: it ends within its grace.
    fill_disk(&inside.join("filler"));
    let base2 = base.clone();
    let _pending = tokio::spawn(async move { send(&base2, &"z".repeat(50_000)).await });
    wait_health(&base, 503, Duration::from_secs(60)).await;
    let stopping = Instant::now();
    let (code, err) =
        tokio::task::spawn_blocking(move || server.stop_within(Duration::from_secs(30)))
            .await
            .expect("stop");
    assert!(
        stopping.elapsed() < Duration::from_secs(20),
        "{:?}",
        stopping.elapsed()
    );
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("never became durable"), "{err}");
}

/// A task whose last turn ends it stops its actor at once and leaves its end to the
/// commit (docs/decisions/a-task-ends-in-its-commits-continuation.md). While a full disk
/// holds that commit, the task is still there: a read and a cancel wait for it (no "not
/// found" from a task whose actor is gone and whose record is not durable yet), and answer
/// from the record once the disk has room.
#[tokio::test]
async fn a_task_whose_end_waits_for_a_full_disk_is_read_and_cancelled_from_its_record() {
    let dir = TempDir::new();
    // Longer than the disk stays full below: the waiting calls answer from the record.
    let Some((server, inside)) = start_on_private_tmpfs(&dir, "actor_call_timeout_seconds = 60")
    else {
        return;
    };
    let base = server.base.clone();
    fill(&base, 2).await;

    fill_disk(&inside.join("filler"));
    let id = "ends-while-the-disk-is-full";
    let sent = {
        let base = base.clone();
        tokio::spawn(async move {
            let message = json!({"role": "user", "messageId": uuid::Uuid::new_v4().to_string(),
                                 "parts": [{"type": "text", "text": "y".repeat(20_000)}]});
            call(&base, "message/send", json!({"id": id, "message": message})).await
        })
    };
    let body = wait_health(&base, 503, Duration::from_secs(60)).await;
    assert!(body.contains("store failing"), "{body}");
    let mut get = {
        let base = base.clone();
        tokio::spawn(async move { call(&base, "tasks/get", json!({"id": id})).await })
    };
    let cancel = {
        let base = base.clone();
        tokio::spawn(async move { call(&base, "tasks/cancel", json!({"id": id})).await })
    };
    // Nothing about the task is told while its end is not durable.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut get)
            .await
            .is_err(),
        "a read answered while the task's end was not durable"
    );
    std::fs::remove_file(inside.join("filler")).expect("free the space");
    let v = sent.await.expect("join");
    assert_eq!(v["result"]["status"]["state"], "completed", "{v}");
    let v = get.await.expect("join");
    assert_eq!(v["result"]["id"], id, "{v}");
    assert_eq!(v["result"]["status"]["state"], "completed", "{v}");
    let v = cancel.await.expect("join");
    // -32003 when it waited for the end (it ended before it could be canceled), -32001
    // when it came after.
    let code = v["error"]["code"].as_i64();
    assert!(matches!(code, Some(-32003 | -32001)), "{v}");
    let v = call(&base, "tasks/get", json!({"id": id})).await;
    assert_eq!(v["result"]["status"]["state"], "completed", "{v}");
}
