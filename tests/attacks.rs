//! Regression tests for what an outside attack found (issue "Break it before users do"),
//! each over real sockets against a real server: silent, idle and non-reading connections,
//! slowloris, starvation of connection slots, amplification by many parts, oversized
//! batches and header blocks, conflicting credentials, misleading reasons, unbounded
//! webhook headers, IPv6 transition forms, secrets in URLs, and uncounted skipped events.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::receiver::{Answer, Receiver};
use support::{ALICE, TestServer, config, metric, new_id, poll_until, send_params};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the server closes the connection (or `limit` passes); returns what arrived
/// and whether it closed.
async fn read_to_close(stream: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let end = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(end, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (got, false),
        }
    }
}

fn rpc(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
}

#[tokio::test]
async fn silent_and_one_byte_connections_are_closed_by_their_timeouts() {
    let mut c = config(&["echo"]);
    c.server.first_byte_timeout_seconds = 0.5;
    c.server.idle_timeout_seconds = 1.0;
    let s = TestServer::start(c).await;
    let started = Instant::now();
    let mut silent = TcpStream::connect(s.addr()).await.expect("connect");
    let mut one_byte = TcpStream::connect(s.addr()).await.expect("connect");
    // "P" could be the start of the HTTP/2 preface: the version sniffing waits for more.
    one_byte.write_all(b"P").await.expect("write");
    let (_, closed) = read_to_close(&mut silent, Duration::from_secs(20)).await;
    assert!(closed, "a silent connection is closed");
    assert!(started.elapsed() >= Duration::from_millis(400));
    let (_, closed) = read_to_close(&mut one_byte, Duration::from_secs(20)).await;
    assert!(closed, "a connection that sent one byte is closed");
    let m = s.scrape().await;
    assert!(
        metric(
            &m,
            "a2ad_connections_closed_total{reason=\"first_byte_timeout\"}"
        ) >= 1.0
    );
    assert!(metric(&m, "a2ad_connections_closed_total{reason=\"idle_timeout\"}") >= 1.0);
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_its_last_request() {
    let mut c = config(&["echo"]);
    c.server.idle_timeout_seconds = 1.0;
    let s = TestServer::start(c).await;
    let mut conn = TcpStream::connect(s.addr()).await.expect("connect");
    let body = rpc("agent/authenticatedExtendedCard", json!({}));
    let req = format!(
        "POST /api/v1/a2a/echo HTTP/1.1\r\nHost: x\r\nx-api-key: {ALICE}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.expect("write");
    let (got, closed) = read_to_close(&mut conn, Duration::from_secs(20)).await;
    assert!(closed, "the idle keep-alive connection was closed");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains("\"agent\""),
        "the response came first: {text}"
    );
}

#[tokio::test]
async fn a_client_that_stops_reading_its_responses_is_disconnected() {
    let mut c = config(&["echo"]);
    c.server.write_timeout_seconds = 1.0;
    let s = TestServer::start(c).await;
    // A task whose history is large: every tasks/get answers about 200 KB.
    let t = s.send("echo", &"x".repeat(100_000), json!({})).await;
    let get = rpc("tasks/get", json!({"taskId": t["id"]}));
    let one = format!(
        "POST /api/v1/a2a/echo HTTP/1.1\r\nHost: x\r\nx-api-key: {ALICE}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{get}",
        get.len()
    );
    // A small receive buffer, and requests pipelined but never read: the server's writes
    // fill the socket and stop making progress.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let mut conn = socket
        .connect(s.addr().parse().expect("addr"))
        .await
        .expect("connect");
    conn.write_all(one.repeat(100).as_bytes())
        .await
        .expect("write");
    poll_until(Duration::from_secs(30), || async {
        let m = s.scrape().await;
        (metric(
            &m,
            "a2ad_connections_closed_total{reason=\"write_stalled\"}",
        ) >= 1.0)
            .then_some(())
    })
    .await;
    // The server is fine for everyone else.
    let again = s.send("echo", "still here", json!({})).await;
    assert_eq!(again["status"]["state"], "completed");
}

#[tokio::test]
async fn silent_connections_cannot_starve_other_clients() {
    let mut c = config(&["echo"]);
    c.server.max_connections = 40;
    c.server.first_byte_timeout_seconds = 60.0;
    c.server.idle_timeout_seconds = 60.0;
    let s = TestServer::start(c).await;
    let mut silent = Vec::new();
    for _ in 0..60 {
        silent.push(TcpStream::connect(s.addr()).await.expect("connect"));
    }
    // Every slot is taken by a connection that sends nothing; with the slots short, idle
    // connections give theirs back within about a second instead of a minute.
    let started = Instant::now();
    let client = reqwest::Client::new();
    let resp = client
        .post(s.url("echo"))
        .header("x-api-key", ALICE)
        .header("content-type", "application/json")
        .body(rpc("message/send", send_params("hello", json!({}))))
        .timeout(Duration::from_secs(50))
        .send()
        .await
        .expect("served despite the silent connections");
    assert_eq!(resp.status(), 200);
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "served long before the 60 s timeouts: {:?}",
        started.elapsed()
    );
    drop(silent);
}

#[tokio::test]
async fn slowloris_headers_and_bodies_are_cut_off() {
    let mut c = config(&["echo"]);
    c.server.header_read_timeout_seconds = 1.0;
    c.server.body_read_timeout_seconds = 1.0;
    let s = TestServer::start(c).await;

    // Headers dripped one byte at a time never complete.
    let mut conn = TcpStream::connect(s.addr()).await.expect("connect");
    conn.write_all(b"POST /api/v1/a2a/echo HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let drip = async {
        for _ in 0..200 {
            if conn.write_all(b"X").await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(30), drip)
            .await
            .unwrap_or(false),
        "the server closed a connection whose headers never ended"
    );

    // A body dripped slower than its time-out: 408 with a JSON-RPC envelope.
    let mut conn = TcpStream::connect(s.addr()).await.expect("connect");
    conn.write_all(
        format!(
            "POST /api/v1/a2a/echo HTTP/1.1\r\nHost: x\r\nx-api-key: {ALICE}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{"
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let (got, _) = read_to_close(&mut conn, Duration::from_secs(20)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("-32600"), "{text}");
}

#[tokio::test]
async fn too_many_parts_are_refused_before_they_cost_memory() {
    let s = TestServer::start(config(&["echo"])).await;
    // 470,000 empty text parts: about 12 MB, under the body cap.
    let parts = vec![r#"{"type":"text","text":""}"#; 470_000].join(",");
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"message/send","params":{{"message":{{"role":"user","messageId":"{}","parts":[{parts}]}}}}}}"#,
        new_id()
    );
    let (status, _, v) = s.post_raw("echo", Some(ALICE), body).await;
    assert_eq!(status, 200);
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert_eq!(v["error"]["data"]["field"], "message.parts");
    assert!(
        v["error"]["data"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("at most 100")),
        "{v}"
    );
    // At the cap is fine.
    let parts: Vec<Value> = (0..100)
        .map(|i| json!({"type": "text", "text": i.to_string()}))
        .collect();
    let ok = s
        .call(
            "echo",
            "message/send",
            json!({"message": {"role": "user", "messageId": new_id(), "parts": parts}}),
        )
        .await;
    assert_eq!(s.ok(ok)["status"]["state"], "completed");
    if !support::on_postgres() {
        // The shared store keeps finished tasks in PostgreSQL, not in this process.
        let m = s.scrape().await;
        assert!(metric(&m, "a2ad_finished_tasks_retained_bytes") > 0.0);
    }
}

#[tokio::test]
async fn a_batch_over_the_cap_is_refused_and_one_at_the_cap_is_served() {
    let mut c = config(&["echo"]);
    c.server.max_batch_size = 5;
    let s = TestServer::start(c).await;
    let item = json!({"jsonrpc": "2.0", "id": 1, "method": "agent/authenticatedExtendedCard"});
    let (status, _, v) = s
        .post_raw(
            "echo",
            Some(ALICE),
            Value::from(vec![item.clone(); 6]).to_string(),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(v["error"]["code"], -32600, "{v}");
    assert!(
        v["error"]["data"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("at most 5"))
    );
    let (_, _, v) = s
        .post_raw("echo", Some(ALICE), Value::from(vec![item; 5]).to_string())
        .await;
    assert_eq!(v.as_array().map(Vec::len), Some(5), "{v}");
}

#[tokio::test]
async fn an_oversized_header_block_is_refused_by_hyper_and_the_server_keeps_serving() {
    let s = TestServer::start(config(&["echo"])).await;
    let mut conn = TcpStream::connect(s.addr()).await.expect("connect");
    let req = format!(
        "POST /api/v1/a2a/echo HTTP/1.1\r\nHost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(100_000)
    );
    let _ = conn.write_all(req.as_bytes()).await;
    let (got, _) = read_to_close(&mut conn, Duration::from_secs(20)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    let ok = s.send("echo", "fine", json!({})).await;
    assert_eq!(ok["status"]["state"], "completed");
}

#[tokio::test]
async fn two_different_api_keys_in_one_request_are_401() {
    let s = TestServer::start(config(&["echo"])).await;
    let body = rpc("agent/authenticatedExtendedCard", json!({}));
    for keys in [[ALICE, support::BOB], [support::BOB, ALICE]] {
        let mut headers = reqwest::header::HeaderMap::new();
        for k in keys {
            headers.append("x-api-key", k.parse().expect("value"));
        }
        let resp = s
            .client
            .post(s.url("echo"))
            .headers(headers)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .expect("request");
        assert_eq!(resp.status(), 401);
        assert!(resp.headers().contains_key("www-authenticate"));
        let v: Value = serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
        assert_eq!(v["error"]["code"], -32005);
    }
}

#[tokio::test]
async fn a_lone_surrogate_and_deep_metadata_get_reasons_that_name_them() {
    let s = TestServer::start(config(&["echo"])).await;
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"message/send","params":{{"message":{{"role":"user","messageId":"{}","parts":[{{"type":"text","text":"\ud800"}}]}}}}}}"#,
        new_id()
    );
    let (_, _, v) = s.post_raw("echo", Some(ALICE), body).await;
    assert_eq!(v["error"]["data"]["field"], "message.parts[0].text", "{v}");
    assert!(
        v["error"]["data"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("surrogate")),
        "{v}"
    );
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"message/send","params":{{"message":{{"role":"user","messageId":"{}","parts":[{{"type":"text","text":"a"}}]}},"metadata":{{"x":{deep}}}}}}}"#,
        new_id()
    );
    let (_, _, v) = s.post_raw("echo", Some(ALICE), body).await;
    assert_eq!(v["error"]["data"]["field"], "metadata", "{v}");
    assert!(
        v["error"]["data"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("deeper than")),
        "{v}"
    );
}

#[tokio::test]
async fn webhook_headers_are_bounded_at_set() {
    let s = TestServer::start(config(&["echo"])).await;
    let many: serde_json::Map<String, Value> = (0..1000)
        .map(|i| (format!("x-h{i}"), Value::from("v")))
        .collect();
    for (headers, field) in [
        (Value::Object(many), "config.headers"),
        (
            json!({"x-big": "v".repeat(100_000)}),
            "config.headers.x-big",
        ),
    ] {
        let v = s
            .call(
                "echo",
                "tasks/pushNotificationConfig/set",
                json!({"config": {"url": "http://127.0.0.1:9/h", "headers": headers}}),
            )
            .await;
        assert_eq!(v["error"]["code"], -32602, "{v}");
        assert_eq!(v["error"]["data"]["field"], field, "{v}");
    }
}

#[tokio::test]
async fn ipv6_forms_that_carry_a_forbidden_ipv4_address_are_refused_at_set() {
    let mut c = config(&["echo"]);
    c.webhooks.allow_private_networks = false;
    let s = TestServer::start(c).await;
    for url in [
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[2002:a9fe:a9fe::]/",
        "http://[::127.0.0.1]/",
        "http://[::ffff:0:a9fe:a9fe]/",
    ] {
        let v = s
            .call(
                "echo",
                "tasks/pushNotificationConfig/set",
                json!({"config": {"url": url}}),
            )
            .await;
        assert_eq!(v["error"]["code"], -32602, "{url}: {v}");
        assert_eq!(v["error"]["data"]["field"], "config.url", "{url}: {v}");
    }
}

#[tokio::test]
async fn passwords_and_query_values_in_webhook_urls_are_masked_when_read() {
    let s = TestServer::start(config(&["echo"])).await;
    let url = "http://hook-user:Sup3rSecretPass@127.0.0.1:9/hook?token=TokenValue42&v=1";
    let set = s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": url}}),
        )
        .await;
    let set = s.ok(set);
    let got = s
        .call("echo", "tasks/pushNotificationConfig/get", json!({}))
        .await;
    let got = s.ok(got);
    for shown in [&set["url"], &got["config"]["url"]] {
        let shown = shown.as_str().expect("url");
        assert!(
            !shown.contains("Sup3rSecretPass") && !shown.contains("TokenValue42"),
            "{shown}"
        );
        assert_eq!(
            shown,
            "http://hook-user:***@127.0.0.1:9/hook?token=***&v=***"
        );
    }
}

#[tokio::test]
async fn events_of_a_deactivated_configuration_are_counted_as_skipped() {
    let rx = Receiver::start(Arc::new(|_| Answer::status(503))).await;
    let s = TestServer::start(config(&["echo"])).await;
    let set = s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": rx.url, "events": ["task.completed"], "retryPolicy": {"maxRetries": 0, "initialDelay": 0.05}}}),
        )
        .await;
    s.ok(set);
    let metrics = s
        .handle
        .as_ref()
        .expect("handle")
        .runtime()
        .webhook_metrics();
    for i in 0..10 {
        s.send("echo", &i.to_string(), json!({})).await;
    }
    poll_until(Duration::from_secs(30), || async {
        (metrics.failed.load(Relaxed) == 10).then_some(())
    })
    .await;
    for i in 0..3 {
        s.send("echo", &format!("after {i}"), json!({})).await;
    }
    let total = |m: &a2ad::metrics::WebhookMetrics| {
        m.delivered.load(Relaxed)
            + m.failed.load(Relaxed)
            + m.discarded.load(Relaxed)
            + m.skipped.load(Relaxed)
    };
    poll_until(Duration::from_secs(30), || async {
        (total(metrics) == 13).then_some(())
    })
    .await;
    assert_eq!(metrics.skipped.load(Relaxed), 3);
    let m = s.scrape().await;
    assert_eq!(metric(&m, "a2ad_webhook_skipped_total"), 3.0);
}

#[tokio::test]
async fn an_h2c_upgrade_request_is_answered_over_http1() {
    let s = TestServer::start(config(&["echo"])).await;
    let mut conn = TcpStream::connect(s.addr()).await.expect("connect");
    let body = rpc("agent/authenticatedExtendedCard", json!({}));
    let req = format!(
        "POST /api/v1/a2a/echo HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nx-api-key: {ALICE}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    while !String::from_utf8_lossy(&got).contains("\"agent\"") {
        let n = tokio::time::timeout_at(end, conn.read(&mut buf))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
}
