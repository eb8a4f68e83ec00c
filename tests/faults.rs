//! Fault injection over real sockets, kept in the suite as a standing guard: webhook
//! receivers that reset, stall, throttle and flap; a storm of clients that disconnect;
//! streams nobody reads; HTTP/2 clients that open many streams, reset them rapidly, send
//! huge header lists or stop granting flow-control credit.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{Value, json};
use support::receiver::{Answer, Hit, Receiver, Script};
use support::{ALICE, SseReader, TestServer, agent, config, metric, poll_until, send_params};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Waits until the server holds no task actor and no open stream.
async fn nothing_left_behind(s: &TestServer) {
    poll_until(Duration::from_secs(60), || async {
        let m = s.scrape().await;
        (metric(&m, "a2ad_task_actors ") == 0.0 && metric(&m, "a2ad_streams_open ") == 0.0)
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn webhook_receivers_that_reset_stall_throttle_and_flap_lose_nothing() {
    let _turn = support::heavy().await;
    let scripts: Vec<(&str, Script)> = vec![
        (
            "reset",
            Arc::new(|n| {
                if n % 2 == 0 {
                    Answer::reset()
                } else {
                    Answer::status(200)
                }
            }),
        ),
        // The first attempt stalls past the 5 s attempt time-out.
        (
            "stall",
            Arc::new(|n| {
                if n == 0 {
                    Answer::after(200, Duration::from_secs(6))
                } else {
                    Answer::status(200)
                }
            }),
        ),
        (
            "burst",
            Arc::new(|n| match n {
                0..=2 => Answer {
                    retry_after: Some(1),
                    ..Answer::status(429)
                },
                3..=5 => Answer::status(503),
                _ => Answer::status(200),
            }),
        ),
        (
            "flap",
            Arc::new(|n| {
                if (n / 4) % 2 == 0 {
                    Answer::status(503)
                } else {
                    Answer::status(200)
                }
            }),
        ),
    ];
    let mut c = config(&["echo"]);
    let mut receivers = Vec::new();
    for (name, script) in scripts {
        let mut a = agent(name);
        a.limits.concurrent_tasks = 64;
        c.agents.push(a);
        receivers.push((name, Receiver::start(script.clone()).await, script));
    }
    let s = TestServer::start(c).await;
    for (name, rx, _) in &receivers {
        let v = s
            .call(
                name,
                "tasks/pushNotificationConfig/set",
                json!({"config": {"url": rx.url, "secret": "0123456789abcdef", "retryPolicy": {"maxRetries": 10, "initialDelay": 0.05, "backoffMultiplier": 1.0}}}),
            )
            .await;
        s.ok(v);
    }
    const TASKS: usize = 5;
    let mut ids: HashMap<&str, Vec<String>> = HashMap::new();
    for (name, ..) in &receivers {
        for i in 0..TASKS {
            let t = s.send(name, &i.to_string(), json!({})).await;
            ids.entry(name)
                .or_default()
                .push(t["id"].as_str().expect("id").to_string());
        }
    }
    let metrics = s
        .handle
        .as_ref()
        .expect("handle")
        .runtime()
        .webhook_metrics();
    let expected = (receivers.len() * TASKS * 3) as u64;
    poll_until(Duration::from_secs(60), || async {
        let done = metrics.delivered.load(Relaxed)
            + metrics.failed.load(Relaxed)
            + metrics.discarded.load(Relaxed)
            + metrics.skipped.load(Relaxed);
        (done == expected).then_some(())
    })
    .await;
    assert_eq!(
        metrics.delivered.load(Relaxed),
        expected,
        "every delivery arrived within its retry budget"
    );
    assert_eq!(metrics.failed.load(Relaxed), 0);
    for (name, rx, script) in &receivers {
        let hits = rx.hits();
        // A delivery counts once the receiver answered it 2xx in time (a stalled answer
        // came too late); every event reached its receiver, repeats keep their id.
        let accepted: Vec<&Hit> = hits
            .iter()
            .enumerate()
            .filter(|(n, _)| {
                let a = script(*n);
                (200..300).contains(&a.status) && a.delay < Duration::from_secs(5)
            })
            .map(|(_, h)| h)
            .collect();
        let ids_seen: HashSet<&str> = accepted
            .iter()
            .map(|h| h.header("x-webhook-delivery"))
            .collect();
        assert_eq!(
            ids_seen.len(),
            TASKS * 3,
            "{name}: every event delivered once at least"
        );
        for task in &ids[name] {
            let order: Vec<String> = accepted
                .iter()
                .map(|h| h.json())
                .filter(|p| p["taskId"] == task.as_str())
                .map(|p| p["event"].as_str().expect("event").to_string())
                .collect();
            let mut firsts = order.clone();
            firsts.dedup();
            assert_eq!(
                firsts,
                ["task.submitted", "task.working", "task.completed"],
                "{name}: per-task order holds"
            );
        }
    }
}

#[tokio::test]
async fn a_storm_of_2000_streams_that_disconnect_leaves_nothing_behind() {
    let _turn = support::heavy().await;
    let mut slow = agent("slow");
    slow.echo.delay_ms = 300;
    slow.limits.concurrent_tasks = 10_000;
    slow.limits.max_queued_tasks = Some(10_000);
    let mut c = config(&["echo"]);
    c.agents.push(slow);
    let s = TestServer::start(c).await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let storms = (0..2000).map(|i| {
        let client = client.clone();
        let url = s.url("slow");
        async move {
            let body = json!({"jsonrpc": "2.0", "id": i, "method": "message/stream", "params": send_params("storm", json!({}))});
            let resp = client
                .post(url)
                .header("x-api-key", ALICE)
                .header("content-type", "application/json")
                .header("accept", "text/event-stream")
                .body(body.to_string())
                .send()
                .await
                .expect("stream");
            let mut sse = SseReader::new(resp);
            let first = sse.next_event().await.expect("first event");
            assert_eq!(first.0, Some(1));
            // Gone without reading further: the body is dropped here.
        }
    });
    join_all(storms).await;
    drop(client);
    nothing_left_behind(&s).await;
    // The tasks went on without their clients.
    let m = s.scrape().await;
    assert_eq!(
        metric(
            &m,
            "a2ad_tasks_finished_total{agent=\"slow\",state=\"completed\"}"
        ),
        2000.0
    );
}

#[tokio::test]
async fn a_stream_nobody_reads_is_dropped_and_counted_and_the_task_goes_on() {
    let _turn = support::heavy().await;
    // 100,000 progress events as fast as the agent can make them: tens of megabytes of
    // SSE, far beyond what socket buffers hold for a client that does not read.
    let mut busy = agent("busy");
    busy.echo.progress_steps = 100_000;
    let mut c = config(&["echo"]);
    c.agents.push(busy);
    c.server.stream_buffer = 8;
    let s = TestServer::start(c).await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "message/stream", "params": send_params("flood", json!({"id": "unread-task"}))}).to_string();
    let req = format!(
        "POST /api/v1/a2a/busy HTTP/1.1\r\nHost: x\r\nx-api-key: {ALICE}\r\ncontent-type: application/json\r\naccept: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let mut conn = socket
        .connect(s.addr().parse().expect("addr"))
        .await
        .expect("connect");
    conn.write_all(req.as_bytes()).await.expect("write");
    let mut head = [0u8; 64];
    let _ = conn.read(&mut head).await.expect("the stream starts");
    // ... and is never read again.
    poll_until(Duration::from_secs(60), || async {
        let m = s.scrape().await;
        (metric(&m, "a2ad_stream_subscribers_dropped_total ") >= 1.0).then_some(())
    })
    .await;
    poll_until(Duration::from_secs(60), || async {
        let v = s
            .call("busy", "tasks/get", json!({"taskId": "unread-task"}))
            .await;
        (v["result"]["status"]["state"] == "completed").then_some(())
    })
    .await;
    drop(conn);
    nothing_left_behind(&s).await;
}

fn h2_request(s: &TestServer, agent: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("{}/api/v1/a2a/{agent}", s.base))
        .header("x-api-key", ALICE)
        .header("content-type", "application/json")
        .body(())
        .expect("request")
}

#[tokio::test]
async fn http2_many_concurrent_streams_on_one_connection_are_all_served() {
    let _turn = support::heavy().await;
    // Room for all of them at once: this is about HTTP/2, not admission (a slower store
    // would otherwise fill the agent's queue and answer some with -32009, correctly).
    let mut c = config(&["echo"]);
    c.agents[0].limits.concurrent_tasks = 1000;
    c.agents[0].limits.max_queued_tasks = Some(1000);
    let s = TestServer::start(c).await;
    let h2c = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    let calls = (0..1000).map(|i| {
        let h2c = h2c.clone();
        let url = s.url("echo");
        async move {
            let body = json!({"jsonrpc": "2.0", "id": i, "method": "message/send", "params": send_params("h2", json!({}))});
            let resp = h2c
                .post(url)
                .header("x-api-key", ALICE)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .expect("h2 request");
            assert_eq!(resp.version(), reqwest::Version::HTTP_2);
            let v: Value = serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
            (v["result"]["status"]["state"] == "completed", v)
        }
    });
    let done = join_all(calls).await;
    let failed: Vec<&Value> = done.iter().filter(|(ok, _)| !ok).map(|(_, v)| v).collect();
    assert!(
        failed.is_empty(),
        "{} not completed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    nothing_left_behind(&s).await;
}

#[tokio::test]
async fn http2_rapid_reset_does_not_hurt_the_server_or_other_clients() {
    let s = TestServer::start(config(&["echo"])).await;
    let mut client = s.h2().await;
    let mut sent = 0;
    for _ in 0..5000 {
        let Ok(ready) = client.clone().ready().await else {
            break; // The server sent GOAWAY: it refused the abuse.
        };
        client = ready;
        match client.send_request(h2_request(&s, "echo"), false) {
            Ok((_, mut body)) => {
                body.send_reset(h2::Reason::CANCEL);
                sent += 1;
            }
            Err(_) => break,
        }
    }
    assert!(sent > 0);
    // Everyone else is served, and nothing leaked.
    let ok = s.send("echo", "after the storm", json!({})).await;
    assert_eq!(ok["status"]["state"], "completed");
    nothing_left_behind(&s).await;
}

#[tokio::test]
async fn http2_a_huge_header_list_is_refused_and_the_server_keeps_serving() {
    let s = TestServer::start(config(&["echo"])).await;
    let client = s.h2().await;
    let mut req = h2_request(&s, "echo");
    req.headers_mut()
        .insert("x-huge", "a".repeat(200_000).parse().expect("value"));
    let refused = match client.ready().await {
        Ok(mut c) => match c.send_request(req, true) {
            Ok((resp, _)) => match resp.await {
                Ok(r) => r.status() == 431,
                Err(_) => true,
            },
            Err(_) => true,
        },
        Err(_) => true,
    };
    assert!(refused, "a 200 KB header list is refused");
    let ok = s.send("echo", "fine", json!({})).await;
    assert_eq!(ok["status"]["state"], "completed");
}

#[tokio::test]
async fn http2_a_client_that_grants_no_flow_control_credit_holds_up_only_itself() {
    let _turn = support::heavy().await;
    let mut busy = agent("busy");
    busy.echo.delay_ms = 1000;
    busy.echo.progress_steps = 5000;
    let mut c = config(&["echo"]);
    c.agents.push(busy);
    let s = TestServer::start(c).await;
    let tcp = tokio::net::TcpStream::connect(s.addr())
        .await
        .expect("connect");
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(1024)
        .initial_connection_window_size(1024)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client.ready().await.expect("ready");
    let mut req = h2_request(&s, "busy");
    req.headers_mut()
        .insert("accept", "text/event-stream".parse().expect("value"));
    let (resp, mut body) = client.send_request(req, false).expect("send");
    let payload = json!({"jsonrpc": "2.0", "id": 1, "method": "message/stream", "params": send_params("stall", json!({"id": "stalled"}))});
    body.send_data(bytes::Bytes::from(payload.to_string()), true)
        .expect("body");
    let resp = resp.await.expect("response head");
    assert_eq!(resp.status(), 200);
    // Never read, never release capacity. Meanwhile other clients are served.
    for i in 0..20 {
        let ok = s.send("echo", &i.to_string(), json!({})).await;
        assert_eq!(ok["status"]["state"], "completed");
    }
    poll_until(Duration::from_secs(60), || async {
        let v = s
            .call("busy", "tasks/get", json!({"taskId": "stalled"}))
            .await;
        (v["result"]["status"]["state"] == "completed").then_some(())
    })
    .await;
    // The client gives up: its stream is reset and the server lets go of it.
    drop((resp, body, client));
    nothing_left_behind(&s).await;
}
