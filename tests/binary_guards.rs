//! The real binary under hostile conditions: configurations it must refuse (exit 2), logs
//! at `trace` that must hold no secret, and a low open-file limit it must live within.

use crate::support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::binary::{BIN, Binary, TempDir};
use support::receiver::{Answer, Receiver};

/// Runs the binary on a configuration that must be refused; returns its stderr.
fn refused(text: &str) -> String {
    let dir = TempDir::new();
    let path = dir.path.join("bad.toml");
    std::fs::write(&path, text).expect("write");
    let mut child = Command::new(BIN)
        .args([
            "--config",
            &path.display().to_string(),
            "--listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let end = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("a2ad started on a configuration it must refuse: {text}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    use std::io::Read as _;
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    assert_eq!(code, Some(2), "{text}: {err}");
    assert!(err.contains("bad.toml"), "names the file: {err}");
    err
}

#[test]
fn out_of_range_numbers_agentless_keys_other_backends_options_and_empty_files_exit_2() {
    for (text, key) in [
        (
            "[[agents]]\nid = \"e\"\n[agents.limits]\nmax_file_size = 18446744073709551615\n",
            "agents[0].limits.max_file_size",
        ),
        (
            "[server]\nmax_body_bytes = 99999999999999\n",
            "server.max_body_bytes",
        ),
        (
            "[[api_keys]]\nname = \"n\"\nkey = \"k-0123456789\"\nagents = []\n",
            "api_keys[0].agents",
        ),
        (
            "[[agents]]\nid = \"llm\"\nbackend = \"openai\"\n[agents.openai]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n[agents.echo]\ndelay_ms = 1\n",
            "agents[0].echo",
        ),
    ] {
        let err = refused(text);
        assert!(err.contains(key), "names {key}: {err}");
    }
    let err = refused("# only a comment\n");
    assert!(err.contains("no settings"), "{err}");
}

const SECRETS: [&str; 6] = [
    "ApiKey-Secret-0123456789",
    "UrlPassw0rd-Secret",
    "QueryToken-Secret",
    "HeaderToken-Secret",
    "HmacKey-Secret-0123456789",
    // base64("hookuser:UrlPassw0rd-Secret"): the Basic credentials a URL's userinfo becomes.
    "aG9va3VzZXI6VXJsUGFzc3cwcmQtU2VjcmV0",
];

#[tokio::test]
async fn no_secret_reaches_the_logs_even_at_trace() {
    let rx = Receiver::start(Arc::new(|n| {
        if n % 2 == 0 {
            Answer::status(500)
        } else {
            Answer::status(200)
        }
    }))
    .await;
    let config = format!(
        "[webhooks]\nallow_private_networks = true\n[[api_keys]]\nname = \"alice\"\nkey = \"{}\"\n[[agents]]\nid = \"echo\"\n",
        SECRETS[0]
    );
    let bin = Binary::start(&config, &[("RUST_LOG", "trace")], &[]);
    let client = reqwest::Client::new();
    let call = |method: &str, params: Value| {
        let client = client.clone();
        let url = format!("{}/api/v1/a2a/echo", bin.base);
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        async move {
            let resp = client
                .post(url)
                .header("x-api-key", SECRETS[0])
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .expect("request");
            serde_json::from_slice::<Value>(&resp.bytes().await.expect("body")).expect("json")
        }
    };
    let url = format!(
        "http://hookuser:{}@127.0.0.1:{}/hook?token={}",
        SECRETS[1], rx.port, SECRETS[2]
    );
    let set = call(
        "tasks/pushNotificationConfig/set",
        json!({"config": {
            "url": url,
            "headers": {"Authorization": format!("Bearer {}", SECRETS[3])},
            "secret": SECRETS[4],
            "retryPolicy": {"maxRetries": 0, "initialDelay": 0.05},
        }}),
    )
    .await;
    assert_eq!(set["result"]["configured"], true, "{set}");
    let sent = call("message/send", support::send_params("hi", json!({}))).await;
    assert_eq!(sent["result"]["status"]["state"], "completed", "{sent}");
    // Three events: the first attempt of one of them gets a 500 and fails (logged).
    rx.wait_for(3).await;
    let got = call("tasks/pushNotificationConfig/get", json!({})).await;
    assert!(
        got["result"]["config"]["url"]
            .as_str()
            .is_some_and(|u| u.contains("***"))
    );
    let (code, log) = bin.stop();
    assert_eq!(code, 0);
    assert!(
        log.contains("webhook delivery failed"),
        "the failure was logged"
    );
    assert!(log.contains("TRACE"), "the log is at trace level");
    for secret in SECRETS {
        assert!(!log.contains(secret), "{secret} leaked into the log");
    }
}

#[tokio::test]
async fn a_low_open_file_limit_caps_connections_and_silent_ones_cannot_take_the_server_down() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("SKIPPED: prlimit (util-linux) is not installed");
        return;
    }
    let config = "[[api_keys]]\nname = \"alice\"\nkey = \"key-alice-0123456789\"\n[[agents]]\nid = \"echo\"\n";
    let bin = Binary::start(config, &[], &["prlimit", "--nofile=256:256", "--"]);
    let addr = bin.base.trim_start_matches("http://").to_string();
    // More silent connections than the process has descriptors.
    let mut silent = Vec::new();
    for _ in 0..300 {
        silent.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect"),
        );
    }
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/a2a/echo", bin.base))
        .header("x-api-key", "key-alice-0123456789")
        .header("content-type", "application/json")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": support::send_params("hi", json!({}))})
                .to_string(),
        )
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("served");
    assert_eq!(resp.status(), 200);
    let metrics = reqwest::get(format!("{}/metrics", bin.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let errors = metrics.lines().find_map(|l| {
        l.strip_prefix("a2ad_accept_errors_total ")?
            .parse::<f64>()
            .ok()
    });
    assert_eq!(errors, Some(0.0), "never ran out of descriptors");
    drop(silent);
    let (code, log) = bin.stop();
    assert_eq!(code, 0);
    assert!(log.contains("max_connections lowered"), "{log}");
}
