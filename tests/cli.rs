//! The `a2ad` binary: --help, bad configuration (exit 2), the listening line, the
//! development key, and SIGTERM during a stream (exit 0); and the load tool's floor servers
//! and the caps it sets on a server it starts.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_a2ad");
const LOAD: &str = env!("CARGO_BIN_EXE_a2ad-load");

fn write_config(text: &str) -> (tempdir::Dir, String) {
    let dir = tempdir::Dir::new();
    let path = dir.path.join("a2ad.toml");
    std::fs::write(&path, text).expect("write config");
    let p = path.display().to_string();
    (dir, p)
}

/// A minimal temporary directory, removed on drop.
mod tempdir {
    pub struct Dir {
        pub path: std::path::PathBuf,
    }
    impl Dir {
        pub fn new() -> Self {
            let path = std::env::temp_dir().join(format!("a2ad-test-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&path).expect("mkdir");
            Self { path }
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Starts the binary in `dir` (where its default store file goes) and reads stdout up to
/// the listening line; returns (child, base url, lines seen before it).
fn start(dir: &tempdir::Dir, args: &[&str]) -> (Child, String, Vec<String>) {
    start_program(BIN, dir, args)
}

/// [`start`] for another of the package's programs.
fn start_program(program: &str, dir: &tempdir::Dir, args: &[&str]) -> (Child, String, Vec<String>) {
    let mut child = spawn_program(program, dir, args);
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("line");
        if let Some(at) = line.find("listening on http://") {
            let url = line[at + "listening on ".len()..].trim().to_string();
            // Keep draining stdout so the child never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return (child, url, seen);
        }
        seen.push(line);
    }
    let _ = child.kill();
    let status = child.wait();
    panic!("{program} exited before listening ({status:?}); stdout: {seen:?}");
}

/// The binary in `dir` with its stdout piped.
fn spawn(dir: &tempdir::Dir, args: &[&str]) -> Child {
    spawn_program(BIN, dir, args)
}

fn spawn_program(program: &str, dir: &tempdir::Dir, args: &[&str]) -> Child {
    Command::new(program)
        .args(args)
        .current_dir(&dir.path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the program")
}

fn terminate(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

fn wait_exit(child: &mut Child) -> i32 {
    let end = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.code().expect("exit code");
        }
        assert!(
            std::time::Instant::now() < end,
            "a2ad did not exit within 30s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A JSON-RPC POST of `body` to agent `agent` of the server at `url`, with API key `key`.
fn rpc(
    client: &reqwest::Client,
    url: &str,
    agent: &str,
    key: &str,
    body: &serde_json::Value,
) -> reqwest::RequestBuilder {
    client
        .post(format!("{url}/api/v1/a2a/{agent}"))
        .header("content-type", "application/json")
        .header("x-api-key", key)
        .body(body.to_string())
}

#[test]
fn help_describes_the_options_and_exits_zero() {
    let out = Command::new(BIN).arg("--help").output().expect("run");
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in ["--config", "--listen", "listening on", "SIGTERM"] {
        assert!(text.contains(needle), "--help lacks {needle}: {text}");
    }
}

#[test]
fn a_bad_configuration_names_file_and_key_and_exits_2() {
    let cases = [
        (
            "[server]\nlisten = \"127.0.0.1:0\"\npingg = 3\n",
            "server.pingg",
        ),
        (
            "[[agents]]\nid = \"a\"\n[agents.limits]\nconcurrent_tasks = \"many\"\n",
            "agents[0].limits.concurrent_tasks",
        ),
        (
            "[[agents]]\nid = \"a\"\nbackend = \"gpt\"\n",
            "agents[0].backend",
        ),
        ("[server\n", "line 1"),
    ];
    for (text, needle) in cases {
        let (_dir, path) = write_config(text);
        let out = Command::new(BIN)
            .args(["--config", &path])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&path), "names the file: {err}");
        assert!(err.contains(needle), "names {needle}: {err}");
        assert!(
            out.stdout.is_empty(),
            "nothing starts: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let out = Command::new(BIN)
        .args(["--config", "/nonexistent/a2ad.toml"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(BIN)
        .args(["--listen", "not-an-address"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.listen"));
}

#[tokio::test]
async fn without_keys_a_development_key_is_printed_and_works() {
    let dir = tempdir::Dir::new();
    let (mut child, url, seen) = start(&dir, &["--listen", "127.0.0.1:0"]);
    let key_line = seen
        .iter()
        .find(|l| l.contains("a2ad-dev-"))
        .expect("dev key printed");
    let key = key_line.split_whitespace().last().expect("key").to_string();
    let client = reqwest::Client::new();
    let card = json!({"jsonrpc": "2.0", "id": 1, "method": "agent/authenticatedExtendedCard"});
    let call = |k: &str| rpc(&client, &url, "echo", k, &card).send();
    assert_eq!(call(&key).await.expect("send").status().as_u16(), 200);
    assert_eq!(call("guess").await.expect("send").status().as_u16(), 401);
    terminate(&child);
    assert_eq!(wait_exit(&mut child), 0);
}

#[tokio::test]
async fn sigterm_ends_open_streams_and_exits_zero() {
    let (dir, path) = write_config(
        "[server]\nlisten = \"127.0.0.1:0\"\n[[api_keys]]\nname = \"a\"\nkey = \"k-0123456789\"\n[[agents]]\nid = \"slow\"\n[agents.echo]\ndelay_ms = 60000\n",
    );
    let (mut child, url, _) = start(&dir, &["--config", &path]);
    let mid = uuid::Uuid::new_v4().to_string();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "message/stream", "params": {"message": {"role": "user", "messageId": mid, "parts": [{"type": "text", "text": "x"}]}}});
    let mut resp = rpc(&reqwest::Client::new(), &url, "slow", "k-0123456789", &body)
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("stream");
    let first = resp.chunk().await.expect("read").expect("first event");
    assert!(String::from_utf8_lossy(&first).contains("submitted"));
    terminate(&child);
    let mut rest = Vec::new();
    while let Some(c) = tokio::time::timeout(Duration::from_secs(20), resp.chunk())
        .await
        .expect("stream ends")
        .expect("read")
    {
        rest.extend_from_slice(&c);
    }
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.contains("\"canceled\"") && rest.contains("\"shutdown\""),
        "{rest}"
    );
    assert_eq!(wait_exit(&mut child), 0);
}

/// Starts the binary and returns its stdout lines as they come (all of them, read on a
/// thread into a shared list).
fn start_collecting(
    dir: &tempdir::Dir,
    args: &[&str],
) -> (
    Child,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    std::thread::JoinHandle<()>,
) {
    let mut child = spawn(dir, args);
    let stdout = child.stdout.take().expect("stdout");
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let l = lines.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            l.lock().expect("lock").push(line);
        }
    });
    (child, lines, reader)
}

fn wait_line(lines: &std::sync::Mutex<Vec<String>>, prefix: &str) -> String {
    let end = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(l) = lines
            .lock()
            .expect("lock")
            .iter()
            .find(|l| l.starts_with(prefix))
        {
            return l.clone();
        }
        assert!(std::time::Instant::now() < end, "no `{prefix}` line");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn the_inspectors_address_is_printed_and_the_printed_key_signs_in() {
    let dir = tempdir::Dir::new();
    let (mut child, lines, _) = start_collecting(&dir, &["--listen", "127.0.0.1:0"]);
    let listening = wait_line(&lines, "listening on ");
    let base = listening
        .trim_start_matches("listening on ")
        .trim()
        .to_string();
    let ui = wait_line(&lines, "inspector: ");
    assert_eq!(ui, format!("inspector: {base}/ui/"));
    let key = wait_line(&lines, "development API key")
        .split_whitespace()
        .last()
        .expect("key")
        .to_string();
    let client = reqwest::Client::new();
    let page = client.get(format!("{base}/ui/")).send().await.expect("ui");
    assert_eq!(page.status().as_u16(), 200);
    let agents = client
        .get(format!("{base}/api/v1/agents"))
        .header("authorization", format!("Bearer {key}"))
        .send()
        .await
        .expect("agents");
    assert_eq!(agents.status().as_u16(), 200);
    let body: serde_json::Value = agents.json().await.expect("json");
    assert_eq!(body["principal"], "dev");
    assert_eq!(body["agents"][0]["id"], "echo");
    terminate(&child);
    assert_eq!(wait_exit(&mut child), 0);

    // Turned off: no address printed, nothing served.
    let (dir, path) = write_config(
        "[server]\nlisten = \"127.0.0.1:0\"\n[store]\nbackend = \"memory\"\n[ui]\nenabled = false\n",
    );
    let (mut child, lines, reader) = start_collecting(&dir, &["--config", &path]);
    let listening = wait_line(&lines, "listening on ");
    let base = listening
        .trim_start_matches("listening on ")
        .trim()
        .to_string();
    let page = client.get(format!("{base}/ui/")).send().await.expect("ui");
    assert_eq!(page.status().as_u16(), 404);
    terminate(&child);
    assert_eq!(wait_exit(&mut child), 0);
    reader.join().expect("every line read");
    assert!(
        !lines
            .lock()
            .expect("lock")
            .iter()
            .any(|l| l.starts_with("inspector:")),
        "{:?}",
        lines.lock().expect("lock")
    );
}

/// `server.global_queue_interval` reaches the runtime: at 1 (the shared queue first, the
/// smallest value) the server answers 300 requests at once, over as many connections —
/// more runnable tasks than a worker's local queue holds, so some go through the shared
/// queue — each with its own completed echo.
#[tokio::test]
async fn a_fixed_global_queue_interval_serves_more_connections_than_the_local_queue_holds() {
    let (dir, path) = write_config(
        "[server]\nlisten = \"127.0.0.1:0\"\nglobal_queue_interval = 1\n[store]\nbackend = \"memory\"\n[[api_keys]]\nname = \"a\"\nkey = \"k-0123456789\"\n[[agents]]\nid = \"echo\"\n[agents.limits]\nconcurrent_tasks = 1000\nmax_queued_tasks = 1000\n",
    );
    let (mut child, url, _) = start(&dir, &["--config", &path]);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let calls = (0..300).map(|i| {
        let client = client.clone();
        let url = url.clone();
        async move {
            let body = json!({
                "jsonrpc": "2.0", "id": i, "method": "message/send",
                "params": {"message": {"role": "user", "messageId": uuid::Uuid::new_v4().to_string(),
                    "parts": [{"type": "text", "text": format!("<{i}>")}]}}
            });
            let reply: serde_json::Value = rpc(&client, &url, "echo", "k-0123456789", &body)
                .send()
                .await
                .expect("send")
                .json()
                .await
                .expect("json");
            (i, reply)
        }
    });
    let replies = futures_util::future::join_all(calls).await;
    for (i, reply) in replies {
        assert_eq!(reply["id"], json!(i), "{reply}");
        let task = &reply["result"];
        assert_eq!(task["status"]["state"], "completed", "{reply}");
        // Delimited, so that request 1's text is not found inside request 10's.
        assert!(reply.to_string().contains(&format!("<{i}>")), "{reply}");
    }
    terminate(&child);
    assert_eq!(wait_exit(&mut child), 0);
}

/// Starts the binary with stderr written to `log` (a file: not a terminal), as `a2ad > log`
/// would.
fn start_logging(dir: &tempdir::Dir, args: &[&str], log: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .current_dir(&dir.path)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).expect("log file"))
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .spawn()
        .expect("spawn a2ad");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.expect("line");
        if let Some(at) = line.find("listening on http://") {
            let url = line[at + "listening on ".len()..].trim().to_string();
            std::thread::spawn(move || for _ in lines {});
            return (child, url);
        }
    }
    let _ = child.kill();
    let status = child.wait();
    panic!("a2ad exited before listening ({status:?})");
}

#[tokio::test]
async fn json_logs_are_one_object_a_line_and_redirected_text_logs_carry_no_colour() {
    for format in ["json", "text"] {
        let (dir, path) = write_config(&format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[log]\nformat = \"{format}\"\nlevel = \"a2ad=debug,info\"\n[[api_keys]]\nname = \"a\"\nkey = \"k-0123456789\"\n[[agents]]\nid = \"echo\"\n"
        ));
        let log = dir.path.join("a2ad.log");
        let (mut child, url) = start_logging(&dir, &["--config", &path], &log);
        let mid = uuid::Uuid::new_v4().to_string();
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {"role": "user", "messageId": mid, "parts": [{"type": "text", "text": "x"}]}}});
        let resp = rpc(&reqwest::Client::new(), &url, "echo", "k-0123456789", &body)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status().as_u16(), 200);
        terminate(&child);
        assert_eq!(wait_exit(&mut child), 0);
        let text = std::fs::read_to_string(&log).expect("log");
        assert!(
            !text.contains('\u{1b}'),
            "{format}: no escape codes in a file: {text}"
        );
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(lines.len() >= 2, "{format}: {text}");
        // `level = "a2ad=debug,info"` took effect: the request's debug line is there.
        assert!(text.contains("request done"), "{format}: {text}");
        if format == "json" {
            for line in &lines {
                let v: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"));
                assert!(
                    v["timestamp"].is_string() && v["level"].is_string(),
                    "{line}"
                );
                assert!(
                    v["target"].is_string() && v["fields"]["message"].is_string(),
                    "{line}"
                );
            }
        }
    }
}

#[test]
fn a_bad_log_setting_names_its_key() {
    let (dir, path) = write_config("[log]\nformat = \"xml\"\n");
    let out = Command::new(BIN)
        .args(["--config", &path])
        .current_dir(&dir.path)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("log.format"),
        "{out:?}"
    );
    let (dir, path) = write_config("[log]\nlevel = \"a2ad=loud\"\n");
    let out = Command::new(BIN)
        .args(["--config", &path])
        .current_dir(&dir.path)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("log.level"),
        "{out:?}"
    );
}

#[test]
fn a_first_start_on_the_built_in_configuration_warns_about_nothing() {
    let dir = tempdir::Dir::new();
    let log = dir.path.join("a2ad.log");
    let (mut child, _url) = start_logging(&dir, &["--listen", "127.0.0.1:0"], &log);
    terminate(&child);
    assert_eq!(wait_exit(&mut child), 0);
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.contains("INFO"), "the log is there: {text}");
    assert!(
        !text.contains("WARN") && !text.contains("ERROR"),
        "nothing a newcomer must act on: {text}"
    );
}

#[test]
fn check_config_says_ok_or_names_the_key_and_starts_nothing() {
    let check = |path: &str| {
        Command::new(BIN)
            .args(["--check-config", path])
            .output()
            .expect("run")
    };
    // A good file whose store would be made in directories that do not exist yet: `ok`,
    // exit 0, and nothing made.
    let nested = std::env::temp_dir()
        .join(format!("a2ad-check-{}", uuid::Uuid::new_v4()))
        .join("data");
    let (_dir, path) = write_config(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = \"{}\"\n[[api_keys]]\nname = \"a\"\nkey = \"k-0123456789\"\n",
        nested.display()
    ));
    let out = check(&path);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    assert!(
        !nested.parent().expect("parent").exists(),
        "nothing was created"
    );
    let (dir, path) = write_config(
        "[server]\nlisten = \"127.0.0.1:0\"\n[[api_keys]]\nname = \"a\"\nkey = \"k-0123456789\"\n[[agents]]\nid = \"echo\"\n",
    );
    let out = Command::new(BIN)
        .args(["--check-config", &path])
        .current_dir(&dir.path)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    assert!(!dir.path.join("a2ad-data").exists(), "no store was opened");
    // While a server runs on the same file (and its store): still `ok`.
    let (mut child, _url) = start_logging(&dir, &["--config", &path], &dir.path.join("log"));
    let out = Command::new(BIN)
        .args(["--check-config", &path])
        .current_dir(&dir.path)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    terminate(&child);
    assert_eq!(wait_exit(&mut child), 0);
    // A bad key, a missing TLS file, an unreadable file, a store path under a file.
    for (text, key) in [
        ("[[agents]]\nid = \"a b\"\n", "agents[0].id"),
        (
            "[server.tls]\ncert_file = \"/nonexistent/cert.pem\"\nkey_file = \"/nonexistent/key.pem\"\n",
            "server.tls",
        ),
        ("[store]\npath = \"/etc/hostname/data\"\n", "store.path"),
    ] {
        let (_dir, path) = write_config(text);
        let out = check(&path);
        assert_eq!(out.status.code(), Some(2), "{text}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key) && err.contains(&path), "{text}: {err}");
        assert!(out.stdout.is_empty());
    }
    let out = check("/nonexistent/a2ad.toml");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/a2ad.toml"));
}

/// The production example in docs/deploy checks as it is documented to.
#[test]
fn the_production_example_passes_check_config() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/deploy/production.toml");
    let out = Command::new(BIN)
        .args(["--check-config", file])
        .env(
            "A2AD_SECRETS_KEY",
            "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
        )
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // Without the secrets key it names the key that needs it.
    let out = Command::new(BIN)
        .args(["--check-config", file])
        .env_remove("A2AD_SECRETS_KEY")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("secrets.key"),
        "{out:?}"
    );
}

fn hangup(child: &Child) {
    let status = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// `a2ad_config_reloads_total{outcome}` as the server counts it.
async fn reloads(client: &reqwest::Client, url: &str, outcome: &str) -> f64 {
    let text = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let name = format!("a2ad_config_reloads_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(name.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

/// Polls until `check` holds, for up to 30 s.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(std::time::Instant::now() < end, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn sighup_reloads_keys_agents_and_webhooks_names_what_needs_a_restart_and_keeps_a_bad_file_out()
 {
    // `extra`: more agents and settings after the first agent.
    let config = |key: &str, max_body: u64, extra: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmax_body_bytes = {max_body}\n[store]\nbackend = \"memory\"\n[log]\nformat = \"json\"\n[webhooks]\nworkers = 2\n[[api_keys]]\nname = \"ops\"\nkey = \"{key}\"\n[[agents]]\nid = \"echo\"\n{extra}"
        )
    };
    let (dir, path) = write_config(&config("k-old-0123456789", 1_048_576, ""));
    let log = dir.path.join("a2ad.log");
    let (mut child, url) = start_logging(&dir, &["--config", &path], &log);
    let client = reqwest::Client::new();
    let send = |agent: &'static str, key: &'static str| {
        let mid = uuid::Uuid::new_v4().to_string();
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {"role": "user", "messageId": mid, "parts": [{"type": "text", "text": "x"}]}}});
        let req = rpc(&client, &url, agent, key, &body);
        async move {
            let resp = req.send().await.expect("send");
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            (status, body)
        }
    };
    assert_eq!(send("echo", "k-old-0123456789").await.0, 200);
    assert_eq!(send("second", "k-old-0123456789").await.0, 404);
    assert_eq!(reloads(&client, &url, "ok").await, 0.0);
    // A new key in place of the old one, a new agent with its own name, and settings
    // that need a restart (one of them under [webhooks]).
    let second =
        "[[agents]]\nid = \"second\"\nname = \"Second\"\n[agents.echo]\nprogress_steps = 1\n";
    std::fs::write(
        &path,
        config("k-new-0123456789", 2_097_152, second)
            .replace("workers = 2", "workers = 3\nmax_configs_per_task = 5"),
    )
    .expect("rewrite");
    hangup(&child);
    until("the reload counted", || async {
        reloads(&client, &url, "ok").await == 1.0
    })
    .await;
    assert_eq!(send("echo", "k-new-0123456789").await.0, 200);
    assert_eq!(send("echo", "k-old-0123456789").await.0, 401);
    let (status, body) = send("second", "k-new-0123456789").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["status"]["state"], "completed", "{body}");
    let card: serde_json::Value = client
        .get(format!(
            "{url}/api/v1/a2a/second/.well-known/agent-card.json"
        ))
        .send()
        .await
        .expect("card")
        .json()
        .await
        .expect("json");
    assert_eq!(card["name"], "Second", "{card}");
    let text = std::fs::read_to_string(&log).expect("log");
    let mut restart: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("needs a restart"))
        .collect();
    restart.sort_unstable();
    assert_eq!(restart.len(), 2, "{text}");
    assert!(
        restart[0].contains("server.max_body_bytes"),
        "{}",
        restart[0]
    );
    assert!(restart[1].contains("webhooks.workers"), "{}", restart[1]);
    // The agent removed again: refused from then on.
    std::fs::write(&path, config("k-new-0123456789", 2_097_152, "")).expect("rewrite");
    hangup(&child);
    until("the second reload counted", || async {
        reloads(&client, &url, "ok").await == 2.0
    })
    .await;
    assert_eq!(send("second", "k-new-0123456789").await.0, 404);
    // A file that does not check changes nothing, and says why (file and key).
    std::fs::write(
        &path,
        config("k-bad-0123456789", 2_097_152, second).replace(
            "id = \"echo\"",
            "id = \"echo\"\n[agents.limits]\nconcurrent_tasks = 0",
        ),
    )
    .expect("rewrite");
    hangup(&child);
    until("the refusal counted", || async {
        reloads(&client, &url, "error").await == 1.0
    })
    .await;
    assert_eq!(send("echo", "k-new-0123456789").await.0, 200);
    assert_eq!(send("echo", "k-bad-0123456789").await.0, 401);
    assert_eq!(send("second", "k-new-0123456789").await.0, 404);
    assert_eq!(reloads(&client, &url, "ok").await, 2.0);
    let text = std::fs::read_to_string(&log).expect("log");
    let refused = text
        .lines()
        .find(|l| l.contains("was not reloaded"))
        .unwrap_or_else(|| panic!("no refusal logged: {text}"));
    assert!(
        refused.contains("a2ad.toml") && refused.contains("concurrent_tasks"),
        "{refused}"
    );
    terminate(&child);
    assert_eq!(wait_exit(&mut child), 0);
}

/// The load tool's two floors (`--floor-server`, and with `--floor-actor` an actor spawned
/// per call that answers and stops) answer every call with the floor's result, and a body
/// that is not JSON with 400 — many calls on one connection and several at once, so that
/// each call's actor is known to answer and go.
#[tokio::test]
async fn the_load_tools_floors_answer_each_call() {
    for args in [
        &["--floor-server", "127.0.0.1:0"][..],
        &["--floor-server", "127.0.0.1:0", "--floor-actor"][..],
    ] {
        let dir = tempdir::Dir::new();
        let (mut child, url, _) = start_program(LOAD, &dir, args);
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client");
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {}});
        let calls = (0..4).map(|_| {
            let (client, url, call) = (client.clone(), url.clone(), call.to_string());
            tokio::spawn(async move {
                let mut states = Vec::new();
                for _ in 0..50 {
                    let r = client
                        .post(format!("{url}/api/v1/a2a/echo"))
                        .body(call.clone())
                        .send()
                        .await
                        .expect("post");
                    assert_eq!(r.status(), 200);
                    let v: serde_json::Value = r.json().await.expect("json");
                    states.push(v["result"]["status"]["state"].clone());
                }
                states
            })
        });
        for states in futures_util::future::join_all(calls).await {
            let states = states.expect("calls");
            assert_eq!(states.len(), 50);
            assert!(
                states.iter().all(|s| s == "completed"),
                "{args:?}: {states:?}"
            );
        }
        let bad = client
            .post(format!("{url}/api/v1/a2a/echo"))
            .body("{not json")
            .send()
            .await
            .expect("post");
        assert_eq!(bad.status(), 400, "{args:?}");
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `--keep N` sets the caps of a server the load tool starts (the server takes the
/// configuration and the run completes without an error); a cap of 0, or a cap for a
/// server at `--url` that the tool does not start, is refused before anything runs.
#[test]
fn the_load_tool_caps_what_its_server_keeps_and_refuses_a_cap_it_cannot_set() {
    let dir = tempdir::Dir::new();
    let run = |args: &[&str]| {
        Command::new(LOAD)
            .args(args)
            .current_dir(&dir.path)
            .output()
            .expect("run the load tool")
    };
    let out = run(&[
        "--scenario",
        "send",
        "--store",
        "memory",
        "-c",
        "2",
        "--requests",
        "200",
        "--keep",
        "10",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("errors: none"), "{stdout}");

    let zero = run(&["--scenario", "send", "--keep", "0"]);
    assert_eq!(zero.status.code(), Some(2), "a cap of 0 is not a cap");
    let elsewhere = run(&[
        "--scenario",
        "send",
        "--keep",
        "10",
        "--url",
        "http://127.0.0.1:9",
        "--key",
        "k",
    ]);
    assert_eq!(elsewhere.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&elsewhere.stderr).contains("--keep"),
        "the refusal names the option"
    );
}
