//! SSE streams over real HTTP (DECISIONS §5, §9): framing, numbering, resubscribe with
//! history and Last-Event-ID, pings, limits, disconnects and shutdown.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

fn echo(delay_ms: u64, steps: u32) -> a2ad::config::AgentConfig {
    let mut a = agent("echo");
    a.echo.delay_ms = delay_ms;
    a.echo.progress_steps = steps;
    a
}

async fn server(agents: Vec<a2ad::config::AgentConfig>) -> TestServer {
    let mut c = config(&[]);
    c.agents = agents;
    TestServer::start(c).await
}

fn state(data: &Value) -> &str {
    data["result"]["status"]["state"].as_str().unwrap_or("?")
}

#[tokio::test]
async fn a_stream_carries_every_state_change_numbered_from_one_then_closes() {
    let s = server(vec![echo(200, 3)]).await;
    let resp = s.stream_message("echo", send_params("hi", json!({}))).await;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert_eq!(resp.headers()["cache-control"], "no-cache");
    assert_eq!(resp.headers()["access-control-allow-origin"], "*");
    let mut r = SseReader::new(resp);
    let events = r.collect().await;
    let ids: Vec<_> = events
        .iter()
        .map(|(id, _)| id.expect("every event has an id"))
        .collect();
    assert_eq!(ids, (1..=events.len() as u64).collect::<Vec<_>>());
    let states: Vec<_> = events.iter().map(|(_, d)| state(d).to_string()).collect();
    assert_eq!(
        states,
        [
            "submitted",
            "working",
            "working",
            "working",
            "working",
            "completed"
        ]
    );
    for (k, (_, d)) in events.iter().enumerate() {
        assert_eq!(d["jsonrpc"], "2.0");
        assert_eq!(d["id"], "s-1", "the request id is echoed in every event");
        let res = &d["result"];
        assert!(res["id"].is_string() && res["contextId"].is_string());
        assert_eq!(res["final"], k == events.len() - 1);
    }
    for (k, (_, d)) in events[2..5].iter().enumerate() {
        assert_eq!(
            texts(&d["result"]["status"]["message"]),
            [format!("progress {}/3", k + 1)]
        );
    }
    let last = &events.last().expect("final").1["result"];
    assert_eq!(texts(&last["status"]["message"]), ["echo: hi", "turn 1"]);
    // The framing is exactly `id: n\ndata: json\n\n` per event.
    let raw = String::from_utf8(r.raw.clone()).expect("utf8");
    assert!(raw.starts_with("id: 1\ndata: {"), "{raw}");
    assert!(raw.ends_with("}\n\n"));
}

#[tokio::test]
async fn errors_before_the_stream_are_plain_json() {
    let mut off = agent("off");
    off.streaming = Some(false);
    let s = server(vec![echo(0, 0), off]).await;
    let resp = s
        .stream(
            ALICE,
            "echo",
            "message/stream",
            json!({"message": {"role": "user"}}),
            None,
        )
        .await;
    assert_eq!(resp.headers()["content-type"], "application/json");
    let v: Value = serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
    assert_eq!(v["error"]["code"], -32602);
    let resp = s
        .stream(
            BOB.trim_end_matches('9'),
            "echo",
            "message/stream",
            send_params("x", json!({})),
            None,
        )
        .await;
    assert_eq!(resp.status().as_u16(), 401);
    for (method, params) in [
        ("message/stream", send_params("x", json!({}))),
        ("tasks/resubscribe", json!({"taskId": "x"})),
    ] {
        let resp = s.stream(ALICE, "off", method, params, None).await;
        let v: Value = serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
        assert_eq!(v["error"]["code"], -32004, "{method}: {v}");
        assert!(
            v["error"]["data"]
                .as_object()
                .is_some_and(|d| d.contains_key("taskId"))
        );
    }
    let resp = s
        .stream(
            ALICE,
            "echo",
            "tasks/resubscribe",
            json!({"taskId": "missing"}),
            None,
        )
        .await;
    let v: Value = serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
    assert_eq!(v["error"]["code"], -32000);
}

/// Starts a slow streamed task and returns its id once it is working.
async fn running_task(s: &TestServer) -> String {
    let t = s
        .send(
            "echo",
            "slow",
            json!({"configuration": {"blocking": false}}),
        )
        .await;
    let id = t["id"].as_str().expect("id").to_string();
    poll_until(Duration::from_secs(20), || async {
        let g = s.ok(s.call("echo", "tasks/get", json!({"taskId": id})).await);
        (g["status"]["state"] == "working").then_some(())
    })
    .await;
    id
}

#[tokio::test]
async fn resubscribe_sends_the_current_state_then_live_events() {
    let s = server(vec![echo(4000, 2)]).await;
    let id = running_task(&s).await;
    let resp = s
        .stream(
            ALICE,
            "echo",
            "tasks/resubscribe",
            json!({"taskId": id}),
            None,
        )
        .await;
    let events = SseReader::new(resp).collect().await;
    let (first_id, first) = &events[0];
    assert_eq!(state(first), "working");
    assert!(
        first_id.expect("id") >= 2,
        "the current state keeps its event number"
    );
    let (last_id, last) = events.last().expect("final");
    assert_eq!(state(last), "completed");
    assert_eq!(last["result"]["final"], true);
    assert_eq!(
        *last_id,
        Some(5),
        "submitted, working, 2 progress, completed"
    );
    let ids: Vec<u64> = events.iter().map(|(i, _)| i.expect("id")).collect();
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "consecutive: {ids:?}"
    );
}

#[tokio::test]
async fn resubscribe_with_history_replays_from_event_one() {
    let s = server(vec![echo(4000, 2)]).await;
    let id = running_task(&s).await;
    let resp = s
        .stream(
            ALICE,
            "echo",
            "tasks/resubscribe",
            json!({"taskId": id, "includeHistory": true}),
            None,
        )
        .await;
    let events = SseReader::new(resp).collect().await;
    let ids: Vec<u64> = events.iter().map(|(i, _)| i.expect("id")).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5]);
    assert_eq!(state(&events[0].1), "submitted");
    assert_eq!(state(&events[4].1), "completed");
}

#[tokio::test]
async fn last_event_id_replays_what_came_after_it_and_wins_over_include_history() {
    let s = server(vec![echo(4000, 2)]).await;
    let id = running_task(&s).await;
    let resp = s
        .stream(
            ALICE,
            "echo",
            "tasks/resubscribe",
            json!({"taskId": id, "includeHistory": true}),
            Some("1"),
        )
        .await;
    let events = SseReader::new(resp).collect().await;
    let ids: Vec<u64> = events.iter().map(|(i, _)| i.expect("id")).collect();
    assert_eq!(ids, [2, 3, 4, 5]);
    let resp = s
        .stream(
            ALICE,
            "echo",
            "tasks/resubscribe",
            json!({"taskId": id}),
            Some("abc"),
        )
        .await;
    let v: Value = serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
    assert_eq!(v["error"]["code"], -32602);
}

#[tokio::test]
async fn resubscribe_to_a_finished_task_is_one_event_or_plain_json() {
    let s = server(vec![echo(0, 0)]).await;
    let t = s.send("echo", "done", json!({})).await;
    let resp = s
        .stream(
            ALICE,
            "echo",
            "tasks/resubscribe",
            json!({"taskId": t["id"]}),
            None,
        )
        .await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let events = SseReader::new(resp).collect().await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, Some(3));
    assert_eq!(state(&events[0].1), "completed");
    assert_eq!(events[0].1["result"]["final"], true);
    // Without Accept: text/event-stream, a JSON response with the task.
    let v = s
        .call("echo", "tasks/resubscribe", json!({"taskId": t["id"]}))
        .await;
    let task = s.ok(v);
    assert_eq!(task["final"], true);
    assert_eq!(task["status"]["state"], "completed");
}

#[tokio::test]
async fn an_idle_stream_gets_pings() {
    let mut c = config(&[]);
    c.agents = vec![echo(1200, 0)];
    c.server.ping_interval_seconds = 0.2;
    let s = TestServer::start(c).await;
    let resp = s.stream_message("echo", send_params("x", json!({}))).await;
    let mut r = SseReader::new(resp);
    let mut pings = 0;
    let mut last = None;
    while let Some(item) = r.next().await {
        match item {
            SseItem::Ping => pings += 1,
            SseItem::Event { data, .. } => last = Some(data),
        }
    }
    assert!(
        pings >= 1,
        "no ping in a 1.2 s idle stream with a 0.2 s interval"
    );
    assert_eq!(state(&last.expect("events")), "completed");
    assert!(String::from_utf8_lossy(&r.raw).contains("\n\n: ping\n\n"));
}

#[tokio::test]
async fn the_subscriber_limit_is_32004() {
    let mut c = config(&[]);
    c.agents = vec![echo(60_000, 0)];
    c.server.max_subscribers_per_task = 2;
    let s = TestServer::start(c).await;
    let resp = s.stream_message("echo", send_params("x", json!({}))).await;
    let mut first = SseReader::new(resp);
    let (_, e) = first.next_event().await.expect("event");
    let id = e["result"]["id"].as_str().expect("id").to_string();
    let second = s
        .stream(
            ALICE,
            "echo",
            "tasks/resubscribe",
            json!({"taskId": id}),
            None,
        )
        .await;
    assert_eq!(second.headers()["content-type"], "text/event-stream");
    let third = s
        .stream(
            ALICE,
            "echo",
            "tasks/resubscribe",
            json!({"taskId": id}),
            None,
        )
        .await;
    let v: Value = serde_json::from_slice(&third.bytes().await.expect("body")).expect("json");
    assert_eq!(v["error"]["code"], -32004);
    assert_eq!(v["error"]["data"]["taskId"], id.as_str());
    drop(second);
    // The dropped stream frees its place.
    poll_until(Duration::from_secs(20), || async {
        let r = s
            .stream(
                ALICE,
                "echo",
                "tasks/resubscribe",
                json!({"taskId": id}),
                None,
            )
            .await;
        (r.headers()["content-type"] == "text/event-stream").then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_client_that_disconnects_does_not_break_the_task() {
    let s = server(vec![echo(500, 3)]).await;
    let resp = s
        .stream_message("echo", send_params("bye", json!({})))
        .await;
    let mut r = SseReader::new(resp);
    let (_, first) = r.next_event().await.expect("event");
    let id = first["result"]["id"].as_str().expect("id").to_string();
    drop(r);
    let done = poll_until(Duration::from_secs(20), || async {
        let g = s.ok(s.call("echo", "tasks/get", json!({"taskId": id})).await);
        (g["status"]["state"] == "completed").then_some(g)
    })
    .await;
    assert_eq!(texts(&done["status"]["message"])[0], "echo: bye");
}

#[tokio::test]
async fn an_idempotent_stream_replay_follows_the_same_task() {
    let s = server(vec![echo(300, 0)]).await;
    let params = send_params("same", json!({"id": "stream-1"}));
    let a = s.stream_message("echo", params.clone()).await;
    let b = s.stream_message("echo", params).await;
    let (mut ra, mut rb) = (SseReader::new(a), SseReader::new(b));
    let (ea, eb) = tokio::join!(ra.collect(), rb.collect());
    for events in [&ea, &eb] {
        assert_eq!(events[0].0, Some(1));
        assert_eq!(events.last().map(|(_, d)| state(d)), Some("completed"));
        assert!(events.iter().all(|(_, d)| d["result"]["id"] == "stream-1"));
    }
}

#[tokio::test]
async fn shutdown_ends_open_streams_with_a_final_canceled_event() {
    let s = server(vec![echo(60_000, 0)]).await;
    let resp = s.stream_message("echo", send_params("x", json!({}))).await;
    let mut r = SseReader::new(resp);
    let (_, first) = r.next_event().await.expect("first event");
    assert_eq!(state(&first), "submitted");
    let handle = s.handle.as_ref().expect("handle");
    handle.stop();
    let rest = tokio::time::timeout(Duration::from_secs(20), r.collect())
        .await
        .expect("the stream ends on shutdown");
    let (_, last) = rest.last().expect("a final event");
    assert_eq!(state(last), "canceled");
    assert_eq!(last["result"]["status"]["reason"], "shutdown");
    assert_eq!(last["result"]["final"], true);
    s.stop().await;
}
