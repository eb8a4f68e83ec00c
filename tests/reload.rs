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

fn reload(server: &TestServer, config: a2ad::Config) {
    let config = config.validated().expect("valid");
    server.handle.as_ref().expect("handle").reload(&config);
}

#[tokio::test]
async fn a_revoked_key_keeps_its_open_stream_and_is_refused_next() {
    let server = TestServer::start(two_agents()).await;
    let resp = server
        .stream(
            ALICE,
            "slow",
            "message/stream",
            send_params("stay", json!({})),
            None,
        )
        .await;
    let mut events = SseReader::new(resp);
    events.next_event().await.expect("the stream opened");
    // Alice's key goes.
    let mut c = two_agents();
    c.api_keys.retain(|k| k.name != "alice");
    reload(&server, c);
    assert_eq!(
        last_state(&mut events).await,
        "completed",
        "the stream ends normally"
    );
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": send_params("again", json!({}))});
    let (status, _, v) = server.post_raw("echo", Some(ALICE), body.to_string()).await;
    assert_eq!(status, 401, "{v}");
    let (status, _, v) = server.post_raw("echo", Some(BOB), body.to_string()).await;
    assert_eq!(status, 200, "{v}");
    server.stop().await;
}

#[tokio::test]
async fn a_removed_agent_finishes_its_task_and_answers_404() {
    let server = TestServer::start(two_agents()).await;
    let resp = server
        .stream(
            ALICE,
            "slow",
            "message/stream",
            send_params("finish", json!({})),
            None,
        )
        .await;
    let mut events = SseReader::new(resp);
    let (_, first) = events.next_event().await.expect("the stream opened");
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
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": send_params("new", json!({}))});
    let (status, _, v) = server.post_raw("slow", Some(ALICE), body.to_string()).await;
    assert_eq!(status, 404, "{v}");
    // The other agent goes on; the listing no longer names the removed one.
    let ok = server.send("echo", "still here", json!({})).await;
    assert_eq!(ok["status"]["state"], "completed");
    let listing: Value = server
        .client
        .get(format!("{}/api/v1/agents", server.base))
        .header("x-api-key", ALICE)
        .send()
        .await
        .expect("agents")
        .json()
        .await
        .expect("json");
    let ids: Vec<&str> = listing["agents"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, vec!["echo"], "{listing}; task {task}");
    server.stop().await;
}

#[tokio::test]
async fn a_changed_rate_limit_applies_to_the_next_requests() {
    let server = TestServer::start(config(&["echo"])).await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": send_params("x", json!({}))});
    for _ in 0..5 {
        let (status, _, v) = server.post_raw("echo", Some(ALICE), body.to_string()).await;
        assert_eq!(status, 200, "{v}");
    }
    let mut c = config(&["echo"]);
    c.agents[0].limits.requests_per_minute = 2;
    reload(&server, c);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let (status, _, _) = server.post_raw("echo", Some(ALICE), body.to_string()).await;
        statuses.push(status);
    }
    assert_eq!(statuses, vec![200, 200, 429]);
    // Bob's bucket is his own.
    let (status, _, v) = server.post_raw("echo", Some(BOB), body.to_string()).await;
    assert_eq!(status, 200, "{v}");
    server.stop().await;
}
