//! Regression tests for the second outside attack (issue "Break it before users do, round
//! 2"), each over real sockets against a real server: unfinished HTTP/2 prefaces, batches
//! that would build gigantic responses, and hostile model upstreams.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{TestServer, config, metric};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn assert_healthy(s: &TestServer) {
    let health = s
        .client
        .get(format!("{}/healthz", s.base))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
}

/// Reads until the server closes the connection (or `limit` passes); whether it closed.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let end = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(end, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// Defect 1: every proper prefix of the HTTP/2 preface, then silence, is closed by the
/// header read time-out (the idle and first-byte time-outs are far away here).
#[tokio::test]
async fn every_prefix_of_the_http2_preface_is_closed_by_the_header_timeout() {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut c = config(&["echo"]);
    c.server.header_read_timeout_seconds = 1.0;
    c.server.idle_timeout_seconds = 600.0;
    c.server.first_byte_timeout_seconds = 600.0;
    let s = TestServer::start(c).await;
    let mut conns = Vec::new();
    for n in 1..PREFACE.len() {
        let mut conn = TcpStream::connect(s.addr()).await.expect("connect");
        conn.write_all(&PREFACE[..n]).await.expect("write");
        conns.push((n, conn));
    }
    let started = Instant::now();
    for (n, conn) in &mut conns {
        assert!(
            closed_within(conn, Duration::from_secs(30)).await,
            "a connection that sent {n} bytes of the preface is still open"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(30));
    let m = s.scrape().await;
    assert_eq!(
        metric(
            &m,
            "a2ad_connections_closed_total{reason=\"header_timeout\"}"
        ),
        (PREFACE.len() - 1) as f64
    );
    // A whole preface is HTTP/2, and the server still answers HTTP/1 and HTTP/2 clients.
    let tcp = TcpStream::connect(s.addr()).await.expect("connect");
    let (mut h2, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(conn);
    let req = http::Request::get(format!("{}/healthz", s.base))
        .body(())
        .expect("request");
    let (resp, _) = h2.send_request(req, true).expect("send");
    assert_eq!(resp.await.expect("response").status(), 200);
    assert_healthy(&s).await;
}

/// Defect 2: a ListTasks page is bounded in bytes (it stops early, and paging still walks
/// every task exactly once), and a batch's answer is bounded in bytes (items past the
/// budget get -32600 with `data.limit`), in the official and the seed dialect.
#[tokio::test]
async fn list_pages_and_batch_answers_are_bounded_in_bytes() {
    use support::official::V;
    let mut c = config(&["echo"]);
    c.server.max_list_page_bytes = 64 << 10;
    c.server.max_batch_response_bytes = 256 << 10;
    let s = TestServer::start(c).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        // About 100 KB per task view: the message and its echo.
        let t = s
            .send("echo", &format!("{i}{}", "x".repeat(50_000)), json!({}))
            .await;
        ids.push(t["id"].as_str().expect("id").to_string());
    }
    // Paging: every page holds one task (two would pass 64 KiB), and names the next.
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..20 {
        let v = s
            .official(
                "echo",
                V::V10,
                "ListTasks",
                json!({"pageSize": 100, "pageToken": token}),
            )
            .await;
        let r = s.result(v);
        let tasks = r["tasks"].as_array().expect("tasks");
        assert_eq!(tasks.len(), 1, "one ~100 KB task per 64 KiB page");
        assert_eq!(r["totalSize"], 6);
        seen.push(tasks[0]["id"].as_str().expect("id").to_string());
        token = r["nextPageToken"].as_str().expect("token").to_string();
        if token.is_empty() {
            break;
        }
    }
    seen.sort();
    ids.sort();
    assert_eq!(seen, ids, "paging walks every task exactly once");

    // A batch of ten pages of 100: the answer stays within 256 KiB plus one error per item.
    let item = |i: usize| json!({"jsonrpc": "2.0", "id": i, "method": "ListTasks", "params": {"pageSize": 100}});
    let batch = Value::Array((0..10).map(item).collect()).to_string();
    let resp = s
        .client
        .post(s.official_url("echo", V::V10))
        .header("content-type", "application/json")
        .header("a2a-version", "1.0")
        .header("x-api-key", support::ALICE)
        .body(batch)
        .send()
        .await
        .expect("batch");
    let bytes = resp.bytes().await.expect("body");
    assert!(
        bytes.len() < (256 << 10) + 10 * 1024,
        "{} bytes",
        bytes.len()
    );
    let items: Vec<Value> = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(items.len(), 10);
    let answered = items.iter().filter(|v| v.get("result").is_some()).count();
    let refused: Vec<&Value> = items.iter().filter(|v| v.get("error").is_some()).collect();
    assert!((1..=3).contains(&answered), "{answered} answered");
    assert_eq!(answered + refused.len(), 10);
    for e in refused {
        assert_eq!(e["error"]["code"], -32600, "{e}");
        assert!(e.to_string().contains("on its own"), "{e}");
    }
    for (i, v) in items.iter().enumerate() {
        assert_eq!(v["id"], i, "order and ids kept");
    }

    // The seed dialect: 20 × tasks/get of one ~100 KB task.
    let gets: Vec<Value> = (0..20)
        .map(
            |i| json!({"jsonrpc": "2.0", "id": i, "method": "tasks/get", "params": {"id": ids[0]}}),
        )
        .collect();
    let (status, _, v) = s
        .post_raw("echo", Some(support::ALICE), Value::Array(gets).to_string())
        .await;
    assert_eq!(status, 200);
    let items = v.as_array().expect("array");
    assert_eq!(items.len(), 20);
    let answered = items.iter().filter(|v| v.get("result").is_some()).count();
    assert!((1..=3).contains(&answered), "{answered} answered");
    let refused = items
        .iter()
        .find(|v| v.get("error").is_some())
        .expect("a refusal");
    assert_eq!(refused["error"]["code"], -32600);
    assert_eq!(refused["error"]["data"]["limit"], 256 << 10);
    // One at a time, each is served.
    let one = s.call("echo", "tasks/get", json!({"id": ids[0]})).await;
    assert_eq!(s.ok(one)["id"], ids[0].as_str());
}

/// Defects 3, 4 and 8: a hostile model upstream — a stream that floods tokens and never
/// ends, a JSON body that never ends, an endless SSE line — fails its task at once with a
/// clear reason, long before the upstream time-out, and the server serves on.
#[tokio::test]
async fn hostile_upstreams_fail_their_task_at_once() {
    let _turn = support::heavy().await;
    use support::upstream::{Mode, Upstream};
    let cases: Vec<(Mode, &str)> = vec![
        (Mode::Flood { chunk: 1000 }, "reply too large"),
        (Mode::Flood { chunk: 1 }, "reply too large"),
        (Mode::EndlessJson, "answer too large"),
        (Mode::EndlessLine, "longer than"),
    ];
    for (mode, needle) in cases {
        let up = Upstream::start(mode.clone()).await;
        let mut a = support::agent("llm");
        a.backend = "openai".into();
        a.limits.max_message_length = 20_000;
        let mut o = a2ad::config::OpenAiConfig::new(&up.base_url, "m");
        o.request_timeout_seconds = 120.0;
        o.max_response_bytes = 4 << 20;
        a.openai = Some(o);
        let mut c = config(&[]);
        c.agents = vec![a, support::agent("echo")];
        let s = TestServer::start(c).await;
        let started = Instant::now();
        let t = s.send("llm", "hi", json!({})).await;
        assert_eq!(t["status"]["state"], "failed", "{mode:?}: {t}");
        let message = t["status"]["error"]["message"].as_str().expect("message");
        assert!(message.contains(needle), "{mode:?}: {message}");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{mode:?} failed only after {:?}",
            started.elapsed()
        );
        // The server is fine.
        assert_healthy(&s).await;
    }
}
