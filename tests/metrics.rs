//! GET /metrics: Prometheus text with requests, latency, tasks, streams, queues, webhooks.

use crate::support;

use std::time::Duration;

use serde_json::json;
use support::*;

async fn scrape(s: &TestServer) -> String {
    let r = s
        .client
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .expect("scrape");
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("text/plain; version=0.0.4")
    );
    r.text().await.expect("text")
}

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn metrics_count_requests_latency_tasks_and_queues() {
    let mut slow = agent("slow");
    slow.echo.delay_ms = 60_000;
    slow.limits.concurrent_tasks = 1;
    let mut c = config(&[]);
    c.agents = vec![agent("echo"), slow];
    let s = TestServer::start(c).await;
    s.send("echo", "a", json!({})).await;
    s.send("echo", "b", json!({})).await;
    s.call("echo", "tasks/get", json!({"taskId": "missing"}))
        .await;
    s.call("echo", "agent/getAuthenticatedExtendedCard", json!({}))
        .await;
    s.post_raw("echo", Some(ALICE), "{oops").await;
    for _ in 0..2 {
        let v = s
            .call(
                "slow",
                "message/send",
                send_params("x", json!({"configuration": {"blocking": false}})),
            )
            .await;
        s.ok(v);
    }
    let text = poll_until(Duration::from_secs(20), || async {
        let t = scrape(&s).await;
        (value(&t, "a2ad_tasks{state=\"working\"}") == Some(1.0)).then_some(t)
    })
    .await;
    assert_eq!(
        value(
            &text,
            r#"a2ad_requests_total{dialect="seed",binding="jsonrpc",method="message/send",outcome="ok"}"#
        ),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"a2ad_requests_total{dialect="seed",binding="jsonrpc",method="tasks/get",outcome="-32000"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"a2ad_requests_total{dialect="seed",binding="jsonrpc",method="agent/authenticatedExtendedCard",outcome="ok"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"a2ad_requests_total{dialect="seed",binding="jsonrpc",method="invalid",outcome="-32700"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            r#"a2ad_request_duration_seconds_count{dialect="seed",binding="jsonrpc",method="message/send"}"#
        ),
        Some(4.0)
    );
    assert_eq!(
        value(
            &text,
            r#"a2ad_request_duration_seconds_bucket{dialect="seed",binding="jsonrpc",method="message/send",le="+Inf"}"#
        ),
        Some(4.0)
    );
    assert!(text.contains("# TYPE a2ad_request_duration_seconds histogram"));
    assert_eq!(value(&text, r#"a2ad_tasks{state="submitted"}"#), Some(1.0));
    assert_eq!(
        value(
            &text,
            r#"a2ad_tasks_finished_total{agent="echo",state="completed"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        value(&text, r#"a2ad_agent_tasks_running{agent="slow"}"#),
        Some(1.0)
    );
    assert_eq!(
        value(&text, r#"a2ad_agent_queue_depth{agent="slow"}"#),
        Some(1.0)
    );
    assert_eq!(value(&text, "a2ad_task_actors"), Some(2.0));
    if !support::on_postgres() {
        // The shared store counts its finished tasks every 5 s, across the cluster.
        assert_eq!(value(&text, "a2ad_finished_tasks_retained"), Some(2.0));
    }
    for name in [
        "a2ad_streams_open",
        "a2ad_stream_subscribers_dropped_total",
        "a2ad_webhook_deliveries_total",
        "a2ad_webhook_retries_total",
        "a2ad_webhook_failures_total",
        "a2ad_webhook_discards_total",
        "a2ad_webhook_pending",
    ] {
        assert_eq!(value(&text, name), Some(0.0), "{name}");
    }
    // A stream is counted while it is open.
    let resp = s.stream_message("slow", send_params("x", json!({}))).await;
    let mut r = SseReader::new(resp);
    r.next_event().await.expect("first event");
    let text = scrape(&s).await;
    assert_eq!(value(&text, "a2ad_streams_open"), Some(1.0));
}

/// On the log, a task whose agent answers at once is one commit: its three events, its
/// record and its conversation turn go to the disk together (docs/ARCHITECTURE.md, "Task
/// lifecycle"). A slow agent's task is committed as `submitted` first, on its own.
#[tokio::test]
async fn a_task_answered_at_once_is_one_commit_on_the_log() {
    let dir = support::binary::TempDir::new();
    let mut slow = agent("slow");
    slow.echo.delay_ms = 60_000;
    let mut c = config(&[]);
    c.agents = vec![agent("echo"), slow];
    c.store = a2ad::config::StoreConfig::log(dir.path.join("log").to_string_lossy().into_owned());
    let s = TestServer::start(c).await;
    let counts = |text: &str| {
        (
            metric(text, "a2ad_store_commits_total"),
            metric(text, "a2ad_store_writes_total"),
        )
    };
    let (commits0, writes0) = counts(&s.scrape().await);
    for i in 0..5 {
        let r = s.send("echo", &format!("one batch {i}"), json!({})).await;
        assert_eq!(r["status"]["state"], "completed", "{r}");
    }
    let (commits, writes) = counts(&s.scrape().await);
    assert_eq!(commits - commits0, 5.0, "one commit per task");
    assert_eq!(writes - writes0, 20.0, "three events and a turn per task");

    // Non-blocking, to an agent that takes its time: `submitted` is durable (and answered)
    // before the agent's answer, in a commit of its own.
    let r = s
        .send(
            "slow",
            "later",
            json!({"configuration": {"blocking": false}}),
        )
        .await;
    assert_eq!(r["status"]["state"], "submitted", "{r}");
    let after = counts(&s.scrape().await);
    assert!(after.0 > commits, "submitted was committed: {after:?}");
    s.stop().await;
}
