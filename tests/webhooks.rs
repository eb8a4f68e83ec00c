//! Webhook deliveries to a real local receiver (spec §5.2, §5.3, §6.2; DECISIONS §7, §9).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use hmac::{KeyInit, Mac};
use serde_json::{Value, json};
use support::receiver::{Answer, Receiver};
use support::*;

const SECRET: &str = "whsec-0123456789abcdef";

fn echo(delay_ms: u64, fail: bool) -> a2ad::config::AgentConfig {
    let mut a = agent("echo");
    a.echo.delay_ms = delay_ms;
    a.echo.fail = fail;
    a
}

async fn server(agents: Vec<a2ad::config::AgentConfig>) -> TestServer {
    let mut c = config(&[]);
    c.agents = agents;
    TestServer::start(c).await
}

async fn set(s: &TestServer, config: Value) -> Value {
    let v = s
        .call("echo", "tasks/pushNotificationConfig/set", config)
        .await;
    s.ok(v)
}

fn verify(secret: &str, hit: &support::receiver::Hit) {
    let sig = hit.header("x-webhook-signature");
    let hex = sig.strip_prefix("sha256=").expect("sha256= prefix");
    assert!(
        hex.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "lowercase hex"
    );
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    let mut mac =
        <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(&hit.body);
    mac.verify_slice(&bytes)
        .expect("the signature verifies over the exact body bytes");
}

fn metrics(s: &TestServer) -> &a2ad::metrics::WebhookMetrics {
    s.handle
        .as_ref()
        .expect("handle")
        .runtime()
        .webhook_metrics()
}

#[tokio::test]
async fn every_event_is_delivered_in_order_signed_with_the_documented_headers_and_payload() {
    let rx = Receiver::ok().await;
    let s = server(vec![echo(100, false)]).await;
    set(&s, json!({"config": {"url": rx.url, "secret": SECRET, "headers": {"Authorization": "Bearer rcv-token", "X-Webhook-Event": "forged", "User-Agent": "forged"}}})).await;
    let t = s.send("echo", "hook me", json!({})).await;
    let hits = rx.wait_for(3).await;
    let events: Vec<_> = hits
        .iter()
        .map(|h| h.header("x-webhook-event").to_string())
        .collect();
    assert_eq!(events, ["task.submitted", "task.working", "task.completed"]);
    let mut ids = std::collections::HashSet::new();
    for h in &hits {
        assert_eq!(h.header("content-type"), "application/json");
        assert_eq!(h.header("user-agent"), "a2ad-webhook/1.0");
        assert_eq!(h.header("authorization"), "Bearer rcv-token");
        assert_eq!(h.headers.get_all("x-webhook-event").iter().count(), 1);
        let id = h.header("x-webhook-delivery");
        assert!(uuid::Uuid::parse_str(id).is_ok());
        assert!(ids.insert(id.to_string()), "one id per delivery");
        verify(SECRET, h);
        let p = h.json();
        assert_eq!(p["event"], h.header("x-webhook-event"));
        assert_eq!(p["agentId"], "echo");
        assert_eq!(p["taskId"], t["id"]);
        assert!(p["timestamp"].as_str().is_some_and(|ts| ts.ends_with('Z')));
        assert_eq!(p["delivery"], json!({"attempt": 1, "maxAttempts": 4}));
        assert_eq!(p["data"]["taskId"], t["id"]);
    }
    let submitted = hits[0].json();
    assert!(submitted["data"]["submittedAt"].is_string());
    assert!(submitted["data"]["estimatedDuration"].is_u64());
    let working = hits[1].json();
    assert!(working["data"]["startedAt"].is_string());
    assert!(working["data"].get("progress").is_some());
    let completed = hits[2].json();
    let d = &completed["data"];
    assert_eq!(d["status"]["state"], "completed");
    assert_eq!(texts(&d["status"]["message"]), ["echo: hook me", "turn 1"]);
    assert_eq!(d["contextId"], t["contextId"]);
    assert!(d["duration"].as_u64().is_some_and(|ms| ms >= 90), "{d}");
    assert!(d["completedAt"].is_string());
    // lastUsed is set once deliveries were attempted.
    let got = s.ok(s
        .call("echo", "tasks/pushNotificationConfig/get", json!({}))
        .await);
    assert!(got["config"]["lastUsed"].is_string());
    assert_eq!(got["active"], true);
}

#[tokio::test]
async fn failed_and_canceled_payloads() {
    let rx = Receiver::ok().await;
    let mut slow = echo(60_000, false);
    slow.id = "slow".into();
    let s = server(vec![echo(0, true), slow]).await;
    set(
        &s,
        json!({"config": {"url": rx.url, "events": ["task.failed"]}}),
    )
    .await;
    let v = s
        .call(
            "slow",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": rx.url, "events": ["task.canceled"]}}),
        )
        .await;
    s.ok(v);
    let failed = s.send("echo", "x", json!({})).await;
    let hits = rx.wait_for(1).await;
    let p = hits[0].json();
    assert_eq!(p["event"], "task.failed");
    assert!(
        hits[0].headers.get("x-webhook-signature").is_none(),
        "no secret, no signature"
    );
    assert_eq!(p["data"]["taskId"], failed["id"]);
    assert_eq!(p["data"]["status"]["state"], "failed");
    assert!(p["data"]["status"]["error"]["message"].is_string());
    assert!(p["data"]["duration"].is_u64());
    assert!(p["data"]["failedAt"].is_string());

    let v = s
        .call(
            "slow",
            "message/send",
            send_params("x", json!({"configuration": {"blocking": false}})),
        )
        .await;
    let t = s.ok(v);
    let v = s
        .call(
            "slow",
            "tasks/cancel",
            json!({"taskId": t["id"], "reason": "enough"}),
        )
        .await;
    s.ok(v);
    let hits = rx.wait_for(2).await;
    let p = hits[1].json();
    assert_eq!(p["event"], "task.canceled");
    assert_eq!(p["data"]["reason"], "enough");
    assert!(p["data"]["canceledAt"].is_string());
}

#[tokio::test]
async fn a_500_is_retried_with_the_same_delivery_id_and_a_growing_attempt() {
    let rx = Receiver::start(Arc::new(|n| Answer::status(if n < 2 { 500 } else { 200 }))).await;
    let s = server(vec![echo(0, false)]).await;
    set(
        &s,
        json!({"config": {"url": rx.url, "secret": SECRET, "events": ["task.completed"],
        "retryPolicy": {"maxRetries": 3, "backoffMultiplier": 2.0, "initialDelay": 0.1}}}),
    )
    .await;
    s.send("echo", "x", json!({})).await;
    let hits = rx.wait_for(3).await;
    let ids: Vec<_> = hits
        .iter()
        .map(|h| h.header("x-webhook-delivery").to_string())
        .collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    let attempts: Vec<_> = hits
        .iter()
        .map(|h| h.json()["delivery"]["attempt"].clone())
        .collect();
    assert_eq!(attempts, [json!(1), json!(2), json!(3)]);
    for h in &hits {
        verify(SECRET, h);
        assert_eq!(h.json()["delivery"]["maxAttempts"], 4);
    }
    let gap1 = hits[1].at - hits[0].at;
    let gap2 = hits[2].at - hits[1].at;
    assert!(gap1 >= Duration::from_millis(90), "{gap1:?}");
    assert!(gap2 >= Duration::from_millis(190), "{gap2:?}");
    poll_until(Duration::from_secs(20), || async {
        (metrics(&s).delivered.load(Relaxed) == 1).then_some(())
    })
    .await;
    assert_eq!(metrics(&s).retries.load(Relaxed), 2);
}

#[tokio::test]
async fn a_429_honours_retry_after() {
    let rx = Receiver::start(Arc::new(|n| {
        if n == 0 {
            Answer {
                status: 429,
                retry_after: Some(1),
                delay: Duration::ZERO,
            }
        } else {
            Answer::status(200)
        }
    }))
    .await;
    let s = server(vec![echo(0, false)]).await;
    set(&s, json!({"config": {"url": rx.url, "events": ["task.completed"], "retryPolicy": {"initialDelay": 0.05}}})).await;
    s.send("echo", "x", json!({})).await;
    let hits = rx.wait_for(2).await;
    assert!(
        hits[1].at - hits[0].at >= Duration::from_millis(950),
        "waited Retry-After"
    );
    assert_eq!(
        hits[1].header("x-webhook-delivery"),
        hits[0].header("x-webhook-delivery")
    );
}

#[tokio::test]
async fn no_answer_within_5_seconds_is_retried() {
    let rx = Receiver::start(Arc::new(|n| Answer {
        status: 200,
        retry_after: None,
        delay: if n == 0 {
            Duration::from_secs(7)
        } else {
            Duration::ZERO
        },
    }))
    .await;
    let s = server(vec![echo(0, false)]).await;
    set(&s, json!({"config": {"url": rx.url, "events": ["task.completed"], "retryPolicy": {"initialDelay": 0.05}}})).await;
    s.send("echo", "x", json!({})).await;
    let hits = rx.wait_for(2).await;
    let gap = hits[1].at - hits[0].at;
    // A second attempt at all proves the time-out (the first answer would have been a 200
    // after 7 s); the gap shows it came after the 5 s bound.
    assert!(gap >= Duration::from_millis(4900), "{gap:?}");
    assert_eq!(hits[1].json()["delivery"]["attempt"], 2);
}

#[tokio::test]
async fn a_400_or_a_redirect_is_not_retried() {
    for status in [400, 302] {
        let rx = Receiver::start(Arc::new(move |_| Answer::status(status))).await;
        let s = server(vec![echo(0, false)]).await;
        set(&s, json!({"config": {"url": rx.url, "events": ["task.completed"], "retryPolicy": {"maxRetries": 3, "initialDelay": 0.05}}})).await;
        s.send("echo", "x", json!({})).await;
        poll_until(Duration::from_secs(20), || async {
            (metrics(&s).failed.load(Relaxed) == 1).then_some(())
        })
        .await;
        assert_eq!(rx.hits().len(), 1, "status {status}: exactly one attempt");
        assert_eq!(metrics(&s).retries.load(Relaxed), 0);
    }
}

#[tokio::test]
async fn the_events_filter_and_task_scope_choose_what_is_sent() {
    let wide = Receiver::ok().await;
    let scoped = Receiver::ok().await;
    let s = server(vec![echo(300, false)]).await;
    set(
        &s,
        json!({"config": {"url": wide.url, "events": ["task.completed"]}}),
    )
    .await;
    let a = s
        .send("echo", "a", json!({"configuration": {"blocking": false}}))
        .await;
    set(&s, json!({"taskId": a["id"], "config": {"url": scoped.url, "events": ["task.completed", "task.failed"]}})).await;
    let b = s.send("echo", "b", json!({})).await;
    // The agent-wide configuration gets both tasks' completions, nothing else.
    let hits = wide.wait_for(2).await;
    let mut tasks: Vec<_> = hits.iter().map(|h| h.json()["taskId"].clone()).collect();
    tasks.sort_by_key(|v| v.to_string());
    let mut expected = vec![a["id"].clone(), b["id"].clone()];
    expected.sort_by_key(|v| v.to_string());
    assert_eq!(tasks, expected);
    assert!(
        hits.iter()
            .all(|h| h.header("x-webhook-event") == "task.completed")
    );
    // The task-scoped one gets only task a.
    let hits = scoped.wait_for(1).await;
    assert_eq!(hits[0].json()["taskId"], a["id"]);
    poll_until(Duration::from_secs(20), || async {
        (metrics(&s).delivered.load(Relaxed) == 3).then_some(())
    })
    .await;
    assert_eq!(scoped.hits().len(), 1);
    assert_eq!(wide.hits().len(), 2);
}

#[tokio::test]
async fn ten_exhausted_deliveries_in_a_row_deactivate_the_configuration() {
    let rx = Receiver::start(Arc::new(|_| Answer::status(503))).await;
    let s = server(vec![echo(0, false)]).await;
    set(&s, json!({"config": {"url": rx.url, "events": ["task.completed"], "retryPolicy": {"maxRetries": 1, "initialDelay": 0.05}}})).await;
    for i in 0..10 {
        s.send("echo", &format!("{i}"), json!({})).await;
    }
    poll_until(Duration::from_secs(30), || async {
        (metrics(&s).failed.load(Relaxed) == 10).then_some(())
    })
    .await;
    assert_eq!(rx.hits().len(), 20, "two attempts each");
    let got = s.ok(s
        .call("echo", "tasks/pushNotificationConfig/get", json!({}))
        .await);
    assert_eq!(got["active"], false);
    s.send("echo", "after", json!({})).await;
    // Setting it again starts afresh; the new configuration delivers.
    let ok = Receiver::ok().await;
    set(
        &s,
        json!({"config": {"url": ok.url, "events": ["task.completed"]}}),
    )
    .await;
    s.send("echo", "again", json!({})).await;
    let hits = ok.wait_for(1).await;
    assert_eq!(hits[0].json()["event"], "task.completed");
    assert_eq!(
        rx.hits().len(),
        20,
        "the deactivated configuration sent nothing more"
    );
}

#[tokio::test]
async fn loopback_targets_by_name_are_refused_when_private_networks_are_not_allowed() {
    let rx = Receiver::ok().await;
    let mut c = config(&[]);
    c.agents = vec![echo(0, false)];
    c.webhooks.allow_private_networks = false;
    let s = TestServer::start(c).await;
    let v = s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": rx.url}}),
        )
        .await;
    assert_eq!(
        v["error"]["code"], -32602,
        "a literal loopback address is refused at set"
    );
    let by_name = format!("http://localhost:{}/hook", rx.port);
    set(&s, json!({"config": {"url": by_name, "events": ["task.completed"], "retryPolicy": {"maxRetries": 2, "initialDelay": 0.05}}})).await;
    s.send("echo", "x", json!({})).await;
    poll_until(Duration::from_secs(20), || async {
        (metrics(&s).failed.load(Relaxed) == 1).then_some(())
    })
    .await;
    assert!(
        rx.hits().is_empty(),
        "nothing reached the loopback receiver"
    );
    assert_eq!(
        metrics(&s).retries.load(Relaxed),
        0,
        "a refused target is not retried"
    );
}

#[tokio::test]
async fn a_dead_receiver_does_not_hold_up_tasks_or_other_receivers() {
    let dead = Receiver::start(Arc::new(|_| Answer {
        status: 200,
        retry_after: None,
        delay: Duration::from_secs(30),
    }))
    .await;
    let live = Receiver::ok().await;
    let mut c = config(&[]);
    c.agents = vec![echo(0, false)];
    c.webhooks.workers = 1;
    let s = TestServer::start(c).await;
    let v = s
        .call_as(
            BOB,
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": dead.url, "events": ["task.completed"]}}),
        )
        .await;
    s.ok(v);
    set(
        &s,
        json!({"config": {"url": live.url, "events": ["task.completed"]}}),
    )
    .await;
    for _ in 0..3 {
        let v = s
            .call_as(
                BOB,
                "echo",
                "message/send",
                send_params("slow receiver", json!({})),
            )
            .await;
        assert_eq!(s.ok(v)["status"]["state"], "completed");
    }
    let started = std::time::Instant::now();
    for _ in 0..3 {
        s.send("echo", "fast receiver", json!({})).await;
    }
    live.wait_for(3).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the live receiver was not held up"
    );
}

#[tokio::test]
async fn shutdown_sends_pending_webhooks_within_the_grace_and_drops_the_rest() {
    let ok = Receiver::ok().await;
    let hung = Receiver::start(Arc::new(|_| Answer {
        status: 200,
        retry_after: None,
        delay: Duration::from_secs(60),
    }))
    .await;
    let mut c = config(&[]);
    c.agents = vec![echo(60_000, false)];
    c.server.shutdown_grace_seconds = 2.0;
    let s = TestServer::start(c).await;
    set(
        &s,
        json!({"config": {"url": ok.url, "events": ["task.canceled"]}}),
    )
    .await;
    let v = s
        .call_as(
            BOB,
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": hung.url, "events": ["task.submitted"]}}),
        )
        .await;
    s.ok(v);
    let t = s
        .send(
            "echo",
            "running",
            json!({"configuration": {"blocking": false}}),
        )
        .await;
    let v = s
        .call_as(
            BOB,
            "echo",
            "message/send",
            send_params("x", json!({"configuration": {"blocking": false}})),
        )
        .await;
    s.ok(v);
    hung.wait_for(1).await;
    let runtime = s.handle.as_ref().expect("handle").runtime().clone();
    let started = std::time::Instant::now();
    s.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "bounded by the grace period"
    );
    let hits = ok.wait_for(1).await;
    let p = hits[0].json();
    assert_eq!(p["event"], "task.canceled");
    assert_eq!(p["taskId"], t["id"]);
    assert_eq!(p["data"]["reason"], "shutdown");
    assert!(
        runtime.webhook_metrics().discarded.load(Relaxed) >= 1,
        "the hung delivery was dropped"
    );
}
