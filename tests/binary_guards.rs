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

/// TLS, OpenID Connect and sealed secrets at `trace`: no private key, bearer token (valid,
/// expired or with an unknown key), sealed value's key or notification token in the log.
#[tokio::test]
async fn no_token_key_or_certificate_key_reaches_the_logs_even_at_trace() {
    use support::idp::{Idp, SigningKey};
    let dir = TempDir::new();
    let tls_key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .self_signed(&tls_key)
        .expect("cert");
    let cert_file = dir.path.join("cert.pem");
    let key_file = dir.path.join("key.pem");
    std::fs::write(&cert_file, cert.pem()).expect("write");
    std::fs::write(&key_file, tls_key.serialize_pem()).expect("write");
    let signing = SigningKey::new("k1", jsonwebtoken::Algorithm::ES256);
    let idp = Idp::start(&[&signing]).await;
    let rx = Receiver::ok().await;
    const SEALING_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const NOTIFY_TOKEN: &str = "NotifyToken-Secret-0123";
    let config = format!(
        "[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n[webhooks]\nallow_private_networks = true\n\
         [secrets]\nkey = \"{SEALING_KEY}\"\n[[auth.oidc]]\nissuer = \"{}\"\naudiences = [\"a2ad\"]\n\
         fetch_timeout_seconds = 1\njwks_refresh_min_seconds = 1\n[[agents]]\nid = \"echo\"\n",
        cert_file.display().to_string(),
        key_file.display().to_string(),
        idp.issuer
    );
    let bin = Binary::start(&config, &[("RUST_LOG", "trace")], &[]);
    assert!(bin.base.starts_with("https://"), "{}", bin.base);
    let port = bin.base.rsplit(':').next().unwrap_or_default().to_string();
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(cert.pem().as_bytes()).expect("cert")])
        .build()
        .expect("client");
    let now = chrono::Utc::now().timestamp();
    let claims = |exp: i64| json!({"iss": idp.issuer, "sub": "user-1", "aud": "a2ad", "exp": exp});
    let valid = signing.sign(&claims(now + 600));
    let expired = signing.sign(&claims(now - 3600));
    let stranger = SigningKey::new("k9", jsonwebtoken::Algorithm::ES256).sign(&claims(now + 600));
    let call = |token: String, method: &str, params: Value| {
        let client = client.clone();
        let url = format!("https://localhost:{port}/api/v1/a2a/echo/jsonrpc/v1");
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        async move {
            let resp = client
                .post(url)
                .header("authorization", format!("Bearer {token}"))
                .header("a2a-version", "1.0")
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .expect("request");
            (resp.status().as_u16(), resp.bytes().await.expect("body"))
        }
    };
    let msg = support::official::message(support::official::V::V10, "hi", None);
    let (status, body) = call(valid.clone(), "SendMessage", json!({"message": msg})).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let task: Value = serde_json::from_slice(&body).expect("json");
    let task = task["result"]["task"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let (status, _) = call(
        valid.clone(),
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "url": rx.url, "token": NOTIFY_TOKEN}),
    )
    .await;
    assert_eq!(status, 200);
    for token in [expired.clone(), stranger.clone()] {
        assert_eq!(call(token, "GetTask", json!({"id": task})).await.0, 401);
    }
    let (code, log) = bin.stop();
    assert_eq!(code, 0);
    assert!(log.contains("TRACE"), "the log is at trace level");
    assert!(
        log.contains("bearer token refused"),
        "the refusals were logged"
    );
    let mut secrets = vec![SEALING_KEY.to_string(), NOTIFY_TOKEN.to_string()];
    // Each line of the TLS private key's PEM body.
    secrets.extend(
        tls_key
            .serialize_pem()
            .lines()
            .filter(|l| !l.starts_with("-----") && l.len() >= 16)
            .map(String::from),
    );
    for token in [&valid, &expired, &stranger] {
        // The whole token, and its signature on its own.
        secrets.push(token.clone());
        secrets.push(token.rsplit('.').next().unwrap_or_default().to_string());
    }
    for secret in secrets {
        assert!(!log.contains(&secret), "{secret} leaked into the log");
    }
}
