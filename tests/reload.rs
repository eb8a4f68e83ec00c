//! Reloading the configuration (docs/CONFIG.md, "Reloading the configuration"), through
//! `ServerHandle::reload` as SIGHUP calls it (tests/cli.rs sends the real signal): a key
//! revoked while its stream is open, an agent removed while its task runs, a rate limit
//! changed. What is under way finishes under the settings it started with; what starts
//! next gets the new ones.

use crate::support;

use serde_json::{Value, json};
use support::{ALICE, BOB, SseReader, TestServer, agent, config, send_params};

/// `echo`, and `slow`: an echo that takes 2 s with two progress updates.
fn two_agents() -> a2ad::Config {
    let mut c = config(&["echo"]);
    let mut slow = agent("slow");
    slow.echo.delay_ms = 2_000;
    slow.echo.progress_steps = 2;
    c.agents.push(slow);
    c
}

/// Reads a stream to its end; its last event's status state.
async fn last_state(events: &mut SseReader) -> Value {
    let all = events.collect().await;
    let (_, last) = all.last().cloned().expect("events");
    last["result"]["status"]["state"].clone()
}

/// A `message/stream` to `slow` as alice, open: its first event.
async fn open_slow(server: &TestServer, text: &str) -> (SseReader, Value) {
    let resp = server
        .stream(
            ALICE,
            "slow",
            "message/stream",
            send_params(text, json!({})),
            None,
        )
        .await;
    let mut events = SseReader::new(resp);
    let (_, first) = events.next_event().await.expect("the stream opened");
    (events, first)
}

/// A seed `message/send` body.
fn send_body(text: &str) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": send_params(text, json!({}))})
        .to_string()
}

fn reload(server: &TestServer, config: a2ad::Config) {
    let config = config.validated().expect("valid");
    server.handle.as_ref().expect("handle").reload(&config);
}

#[tokio::test]
async fn a_revoked_key_keeps_its_open_stream_and_is_refused_next() {
    let server = TestServer::start(two_agents()).await;
    let (mut events, _) = open_slow(&server, "stay").await;
    // Alice's key goes.
    let mut c = two_agents();
    c.api_keys.retain(|k| k.name != "alice");
    reload(&server, c);
    assert_eq!(
        last_state(&mut events).await,
        "completed",
        "the stream ends normally"
    );
    let body = send_body("again");
    let (status, _, v) = server.post_raw("echo", Some(ALICE), body.clone()).await;
    assert_eq!(status, 401, "{v}");
    let (status, _, v) = server.post_raw("echo", Some(BOB), body.clone()).await;
    assert_eq!(status, 200, "{v}");
    server.stop().await;
}

#[tokio::test]
async fn a_removed_agent_finishes_its_task_and_answers_404() {
    let server = TestServer::start(two_agents()).await;
    let (mut events, first) = open_slow(&server, "finish").await;
    let task = first["result"]["id"]
        .as_str()
        .or(first["result"]["taskId"].as_str())
        .expect("task id")
        .to_string();
    reload(&server, config(&["echo"]));
    assert_eq!(
        last_state(&mut events).await,
        "completed",
        "its task ends normally"
    );
    let body = send_body("new");
    let (status, _, v) = server.post_raw("slow", Some(ALICE), body.clone()).await;
    assert_eq!(status, 404, "{v}");
    // The other agent goes on; the listing no longer names the removed one.
    let ok = server.send("echo", "still here", json!({})).await;
    assert_eq!(ok["status"]["state"], "completed");
    let listing = server.agents_listing().await;
    let ids: Vec<&String> = listing
        .as_object()
        .map(|m| m.keys().collect())
        .unwrap_or_default();
    assert_eq!(ids, vec!["echo"], "{listing}; task {task}");
    server.stop().await;
}

#[tokio::test]
async fn a_changed_rate_limit_applies_to_the_next_requests() {
    let server = TestServer::start(config(&["echo"])).await;
    let body = send_body("x");
    for _ in 0..5 {
        let (status, _, v) = server.post_raw("echo", Some(ALICE), body.clone()).await;
        assert_eq!(status, 200, "{v}");
    }
    let mut c = config(&["echo"]);
    c.agents[0].limits.requests_per_minute = 2;
    reload(&server, c);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let (status, _, _) = server.post_raw("echo", Some(ALICE), body.clone()).await;
        statuses.push(status);
    }
    assert_eq!(statuses, vec![200, 200, 429]);
    // Bob's bucket is his own.
    let (status, _, v) = server.post_raw("echo", Some(BOB), body.clone()).await;
    assert_eq!(status, 200, "{v}");
    server.stop().await;
}
