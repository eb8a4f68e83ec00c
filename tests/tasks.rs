//! Tasks over real HTTP: send, get, cancel, time-out, failure, idempotent ids,
//! multi-turn contexts, file parts, validation and limits (DECISIONS §3, §4, §6, §8).

use crate::support;

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use support::*;

/// An agent whose echo takes `delay_ms`.
fn slow(id: &str, delay_ms: u64) -> a2ad::config::AgentConfig {
    let mut a = agent(id);
    a.echo.delay_ms = delay_ms;
    a
}

async fn server_with(agents: Vec<a2ad::config::AgentConfig>) -> TestServer {
    let mut c = config(&[]);
    c.agents = agents;
    TestServer::start(c).await
}

#[tokio::test]
async fn send_returns_the_completed_task_with_echo_and_turn() {
    let s = server_with(vec![agent("echo")]).await;
    let t = s.send("echo", "hello", json!({})).await;
    assert_eq!(t["status"]["state"], "completed");
    assert_eq!(t["final"], true);
    assert!(t["id"].as_str().is_some_and(|id| !id.is_empty()));
    assert!(t["contextId"].as_str().is_some_and(|id| !id.is_empty()));
    let reply = &t["status"]["message"];
    assert_eq!(reply["role"], "agent");
    assert_eq!(texts(reply), ["echo: hello", "turn 1"]);
    assert!(reply["parts"][0]["type"] == "text" && reply["parts"][0].get("kind").is_none());
}

#[tokio::test]
async fn get_returns_timestamps_history_and_metadata() {
    let s = server_with(vec![agent("echo")]).await;
    let t = s.send("echo", "hi", json!({"metadata": {"k": "v"}})).await;
    let id = t["id"].as_str().expect("id");
    let g = s.ok(s.call("echo", "tasks/get", json!({"taskId": id})).await);
    assert_eq!(g["id"], id);
    assert_eq!(g["contextId"], t["contextId"]);
    assert_eq!(g["final"], true);
    for k in ["createdAt", "updatedAt"] {
        let ts = g[k].as_str().expect(k);
        assert!(
            chrono::DateTime::parse_from_rfc3339(ts).is_ok() && ts.ends_with('Z'),
            "{ts}"
        );
    }
    assert_eq!(g["metadata"], json!({"k": "v"}));
    let history = g["history"].as_array().expect("history");
    assert_eq!(history.len(), 2);
    assert_eq!(history[0]["role"], "user");
    assert_eq!(texts(&history[0]), ["hi"]);
    assert_eq!(history[1]["role"], "agent");
    // `id` is an alias of `taskId`; historyLength keeps the last N.
    let g = s.ok(s
        .call("echo", "tasks/get", json!({"id": id, "historyLength": 1}))
        .await);
    assert_eq!(g["history"].as_array().map(Vec::len), Some(1));
    assert_eq!(g["history"][0]["role"], "agent");
    let g = s.ok(s
        .call("echo", "tasks/get", json!({"id": id, "historyLength": 0}))
        .await);
    assert_eq!(g["history"], json!([]));
    let v = s
        .call("echo", "tasks/get", json!({"id": id, "historyLength": -1}))
        .await;
    assert_eq!(v["error"]["code"], -32602);
    let v = s
        .call("echo", "tasks/get", json!({"id": id, "taskId": "other"}))
        .await;
    assert_eq!(v["error"]["code"], -32602);
}

#[tokio::test]
async fn unknown_tasks_are_32000_with_task_id() {
    let s = server_with(vec![agent("echo")]).await;
    for method in ["tasks/get", "tasks/cancel", "tasks/resubscribe"] {
        let v = s.call("echo", method, json!({"taskId": "nope"})).await;
        assert_eq!(v["error"]["code"], -32000, "{method}");
        assert_eq!(v["error"]["data"]["taskId"], "nope");
    }
}

#[tokio::test]
async fn non_blocking_send_returns_at_once_and_the_task_completes() {
    let s = server_with(vec![slow("echo", 2000)]).await;
    let t = s
        .send(
            "echo",
            "later",
            json!({"configuration": {"blocking": false}}),
        )
        .await;
    assert_eq!(t["final"], false);
    assert!(
        matches!(t["status"]["state"].as_str(), Some("submitted" | "working")),
        "{t}"
    );
    let id = t["id"].as_str().expect("id").to_string();
    let done = poll_until(Duration::from_secs(20), || async {
        let g = s.ok(s.call("echo", "tasks/get", json!({"taskId": id})).await);
        (g["status"]["state"] == "completed").then_some(g)
    })
    .await;
    assert_eq!(done["final"], true);
}

#[tokio::test]
async fn send_returns_the_task_as_it_stands_after_sync_wait() {
    let mut a = slow("echo", 60_000);
    a.limits.sync_wait_seconds = 0.2;
    let s = server_with(vec![a]).await;
    let t = s.send("echo", "slow", json!({})).await;
    assert_eq!(t["final"], false);
    assert_eq!(t["status"]["state"], "working");
}

#[tokio::test]
async fn cancel_of_a_working_task_records_the_reason_and_stops_it() {
    let s = server_with(vec![slow("echo", 60_000)]).await;
    let t = s
        .send("echo", "x", json!({"configuration": {"blocking": false}}))
        .await;
    let id = t["id"].as_str().expect("id");
    let c = s.ok(s
        .call(
            "echo",
            "tasks/cancel",
            json!({"taskId": id, "reason": "changed my mind"}),
        )
        .await);
    assert_eq!(c["id"], id);
    assert_eq!(c["canceled"], true);
    assert_eq!(c["status"]["state"], "canceled");
    assert_eq!(c["status"]["reason"], "changed my mind");
    let g = s.ok(s.call("echo", "tasks/get", json!({"taskId": id})).await);
    assert_eq!(g["status"]["state"], "canceled");
    assert_eq!(g["status"]["reason"], "changed my mind");
    assert_eq!(g["final"], true);

    let v = s.call("echo", "tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(v["error"]["code"], -32002);
    assert_eq!(v["error"]["data"]["taskId"], id);

    let t = s
        .send("echo", "y", json!({"configuration": {"blocking": false}}))
        .await;
    let c = s.ok(s
        .call("echo", "tasks/cancel", json!({"taskId": t["id"]}))
        .await);
    assert_eq!(c["status"]["reason"], "Canceled by user");
}

#[tokio::test]
async fn cancel_of_a_completed_or_failed_task_is_32001() {
    let mut failing = agent("failing");
    failing.echo.fail = true;
    let s = server_with(vec![agent("echo"), failing]).await;
    let t = s.send("echo", "x", json!({})).await;
    let v = s
        .call("echo", "tasks/cancel", json!({"taskId": t["id"]}))
        .await;
    assert_eq!(v["error"]["code"], -32001);
    assert_eq!(v["error"]["data"]["taskId"], t["id"]);
    assert!(v["error"]["data"]["suggestion"].is_string());
    let t = s.send("failing", "x", json!({})).await;
    assert_eq!(t["status"]["state"], "failed");
    let v = s
        .call("failing", "tasks/cancel", json!({"taskId": t["id"]}))
        .await;
    assert_eq!(v["error"]["code"], -32001);
}

#[tokio::test]
async fn cancel_racing_completion_never_leaves_an_inconsistent_task() {
    let s = server_with(vec![slow("echo", 5)]).await;
    for _ in 0..30 {
        let t = s
            .send(
                "echo",
                "race",
                json!({"configuration": {"blocking": false}}),
            )
            .await;
        let id = t["id"].as_str().expect("id").to_string();
        let v = s.call("echo", "tasks/cancel", json!({"taskId": id})).await;
        let g = s.ok(s.call("echo", "tasks/get", json!({"taskId": id})).await);
        match v["error"]["code"].as_i64() {
            None => assert_eq!(g["status"]["state"], "canceled"),
            Some(-32001) | Some(-32003) => {
                assert_eq!(g["status"]["state"], "completed");
                if v["error"]["code"] == -32003 {
                    assert_eq!(v["error"]["data"]["state"], "completed");
                }
            }
            other => panic!("unexpected cancel outcome {other:?}: {v}"),
        }
    }
}

#[tokio::test]
async fn a_task_past_its_timeout_is_canceled_with_reason_timeout() {
    let mut a = slow("echo", 60_000);
    a.limits.task_timeout_seconds = 0.3;
    let s = server_with(vec![a]).await;
    let t = s.send("echo", "x", json!({})).await;
    assert_eq!(t["status"]["state"], "canceled");
    assert_eq!(t["status"]["reason"], "timeout");
    assert_eq!(t["final"], true);
}

#[tokio::test]
async fn a_failing_agent_fails_the_task_with_status_error() {
    let mut a = agent("echo");
    a.echo.fail = true;
    let s = server_with(vec![a]).await;
    let t = s.send("echo", "x", json!({})).await;
    assert_eq!(t["status"]["state"], "failed");
    assert_eq!(t["final"], true);
    assert!(t["status"]["error"]["code"].is_i64());
    assert!(t["status"]["error"]["message"].is_string());
    let card = s.ok(s
        .call("echo", "agent/authenticatedExtendedCard", json!({}))
        .await);
    assert_eq!(card["metrics"]["successRate"], 0.0);
}

#[tokio::test]
async fn the_same_client_id_and_message_is_an_idempotent_replay() {
    let s = server_with(vec![agent("echo")]).await;
    let params = send_params("once", json!({"id": "my-task"}));
    let a = s.ok(s.call("echo", "message/send", params.clone()).await);
    let b = s.ok(s.call("echo", "message/send", params).await);
    assert_eq!(a["id"], "my-task");
    assert_eq!(a, b);
    // A different message under the same id of a completed task.
    let v = s
        .call(
            "echo",
            "message/send",
            send_params("other", json!({"id": "my-task"})),
        )
        .await;
    assert_eq!(v["error"]["code"], -32001);
    assert_eq!(v["error"]["data"]["taskId"], "my-task");
}

#[tokio::test]
async fn a_taken_id_of_a_running_or_canceled_task_is_refused() {
    let s = server_with(vec![slow("echo", 60_000)]).await;
    let first = send_params(
        "a",
        json!({"taskId": "t1", "configuration": {"blocking": false}}),
    );
    s.ok(s.call("echo", "message/send", first.clone()).await);
    let v = s
        .call(
            "echo",
            "message/send",
            send_params("b", json!({"id": "t1"})),
        )
        .await;
    assert_eq!(v["error"]["code"], -32602);
    assert_eq!(v["error"]["data"]["reason"], "task is still in progress");
    // The same message again follows the running task.
    let again = s.ok(s.call("echo", "message/send", first).await);
    assert_eq!(again["id"], "t1");
    assert_eq!(again["final"], false);
    s.ok(s
        .call("echo", "tasks/cancel", json!({"taskId": "t1"}))
        .await);
    let v = s
        .call(
            "echo",
            "message/send",
            send_params("c", json!({"id": "t1"})),
        )
        .await;
    assert_eq!(v["error"]["code"], -32002);
}

#[tokio::test]
async fn concurrent_sends_with_one_client_id_create_one_task() {
    let s = server_with(vec![slow("echo", 200)]).await;
    let params = send_params("once", json!({"id": "dup"}));
    let calls = (0..8).map(|_| s.call("echo", "message/send", params.clone()));
    let results = futures_util::future::join_all(calls).await;
    for r in &results {
        assert_eq!(r["result"]["id"], "dup", "{r}");
        assert_eq!(r["result"]["status"]["state"], "completed");
    }
    let first = &results[0]["result"];
    assert!(
        results
            .iter()
            .all(|r| r["result"]["contextId"] == first["contextId"])
    );
}

#[tokio::test]
async fn a_context_carries_turns_and_earlier_messages() {
    let s = server_with(vec![agent("echo")]).await;
    let first = s.send("echo", "one", json!({})).await;
    let ctx = first["contextId"].as_str().expect("ctx");
    let second = s.send("echo", "two", json!({"contextId": ctx})).await;
    assert_eq!(second["contextId"], ctx);
    assert_eq!(texts(&second["status"]["message"]), ["echo: two", "turn 2"]);
    // sessionId is an alias of contextId.
    let third = s.send("echo", "three", json!({"sessionId": ctx})).await;
    assert_eq!(
        texts(&third["status"]["message"])
            .last()
            .map(String::as_str),
        Some("turn 3")
    );
    let fresh = s.send("echo", "new", json!({})).await;
    assert_ne!(fresh["contextId"], ctx);
    assert_eq!(
        texts(&fresh["status"]["message"])
            .last()
            .map(String::as_str),
        Some("turn 1")
    );
    // A context id this principal has not used starts a conversation under that name.
    let named = s
        .send("echo", "x", json!({"contextId": "my-own-ctx"}))
        .await;
    assert_eq!(named["contextId"], "my-own-ctx");
    assert_eq!(
        texts(&named["status"]["message"])
            .last()
            .map(String::as_str),
        Some("turn 1")
    );
    let again = s
        .send("echo", "y", json!({"contextId": "my-own-ctx"}))
        .await;
    assert_eq!(
        texts(&again["status"]["message"])
            .last()
            .map(String::as_str),
        Some("turn 2")
    );
    for bad in [json!(""), json!("c".repeat(257)), json!(5)] {
        let v = s
            .call(
                "echo",
                "message/send",
                send_params("x", json!({"contextId": bad})),
            )
            .await;
        assert_eq!(v["error"]["code"], -32602, "{bad}");
        assert_eq!(v["error"]["data"]["field"], "contextId");
    }
}

#[tokio::test]
async fn file_parts_are_listed_in_the_reply() {
    let s = server_with(vec![agent("echo")]).await;
    let png = [b"\x89PNG\r\n\x1a\n".as_slice(), &[0u8; 8]].concat();
    let params = json!({"message": {"role": "user", "messageId": new_id(), "parts": [
        {"type": "text", "text": "see"},
        {"kind": "file", "file": {"name": "a.png", "mimeType": "image/png", "bytes": STANDARD.encode(&png)}},
        {"type": "file", "file": {"name": "n.json", "mimeType": "application/json", "bytes": STANDARD.encode(b"{\"a\":1}")}},
    ]}});
    let t = s.ok(s.call("echo", "message/send", params).await);
    assert_eq!(
        texts(&t["status"]["message"]),
        [
            "echo: see",
            "file a.png (image/png, 16 bytes)",
            "file n.json (application/json, 7 bytes)",
            "turn 1"
        ]
    );
    // The user's file part is returned in history with `type`, not `kind`.
    let g = s.ok(s
        .call("echo", "tasks/get", json!({"taskId": t["id"]}))
        .await);
    assert_eq!(g["history"][0]["parts"][1]["type"], "file");
    assert_eq!(g["history"][0]["parts"][1]["file"]["mimeType"], "image/png");
}

#[tokio::test]
async fn invalid_messages_are_32602_naming_field_and_reason() {
    let mut a = agent("echo");
    a.limits.max_file_size = 10;
    a.limits.max_message_length = 5;
    let s = server_with(vec![a]).await;
    let msg =
        |parts: Value| json!({"message": {"role": "user", "messageId": new_id(), "parts": parts}});
    let file = |mime: &str, bytes: &str| json!([{"type": "file", "file": {"name": "f", "mimeType": mime, "bytes": bytes}}]);
    let cases = [
        (
            json!({"message": {"role": "user", "messageId": "1234", "parts": [{"type": "text", "text": "a"}]}}),
            "message.messageId",
        ),
        (
            json!({"message": {"role": "user", "messageId": "6f1c2a1e-3b4d-1c5e-8f70-1a2b3c4d5e6f", "parts": [{"type": "text", "text": "a"}]}}),
            "message.messageId",
        ),
        (
            json!({"message": {"role": "agent", "messageId": new_id(), "parts": [{"type": "text", "text": "a"}]}}),
            "message.role",
        ),
        (msg(json!([])), "message.parts"),
        (
            msg(json!([{"type": "image", "url": "x"}])),
            "message.parts[0].type",
        ),
        (
            msg(json!([{"type": "text", "text": "too long"}])),
            "message.parts",
        ),
        (
            msg(file("text/plain", "data:text/plain;base64,aGk=")),
            "message.parts[0].file.bytes",
        ),
        (
            msg(file("text/plain", "aGk")),
            "message.parts[0].file.bytes",
        ),
        (
            msg(file("text/plain", "ééééé")),
            "message.parts[0].file.bytes",
        ),
        (
            msg(file("text/plain", &STANDARD.encode(b"01234567890"))),
            "message.parts[0].file.bytes",
        ),
        (
            msg(file("application/zip", &STANDARD.encode(b"PK\x03\x04"))),
            "message.parts[0].file.mimeType",
        ),
        (
            msg(file("image/png", &STANDARD.encode(b"GIF89a"))),
            "message.parts[0].file.bytes",
        ),
        (
            msg(file("text/plain", &STANDARD.encode(b"\xff\xfe"))),
            "message.parts[0].file.bytes",
        ),
        (
            msg(file("application/json", &STANDARD.encode(b"{x"))),
            "message.parts[0].file.bytes",
        ),
        (json!({"message": "hi"}), "message"),
        (json!({}), "message"),
    ];
    for (params, field) in cases {
        let v = s.call("echo", "message/send", params.clone()).await;
        assert_eq!(v["error"]["code"], -32602, "{params} -> {v}");
        assert_eq!(v["error"]["data"]["field"], field, "{params} -> {v}");
        assert!(
            v["error"]["data"]["reason"]
                .as_str()
                .is_some_and(|r| !r.is_empty())
        );
    }
    let v = s
        .call(
            "echo",
            "message/send",
            msg(file("text/plain", "data:text/plain;base64,aGk=")),
        )
        .await;
    assert!(
        v["error"]["data"]["reason"]
            .as_str()
            .expect("reason")
            .contains("data:")
    );
    // Exactly at the limits is fine ("ééééé" is five characters).
    let ok = s
        .call(
            "echo",
            "message/send",
            msg(json!([{"type": "text", "text": "ééééé"}])),
        )
        .await;
    assert_eq!(s.ok(ok)["status"]["state"], "completed");
}

#[tokio::test]
async fn the_rate_limit_is_429_with_retry_after() {
    let mut a = agent("echo");
    a.limits.requests_per_minute = 3;
    let s = server_with(vec![a]).await;
    for _ in 0..3 {
        let v = s
            .call("echo", "agent/authenticatedExtendedCard", json!({}))
            .await;
        assert!(v["result"].is_object());
    }
    let body = json!({"jsonrpc": "2.0", "id": "r", "method": "agent/authenticatedExtendedCard"});
    let (status, headers, v) = s.post_raw("echo", Some(ALICE), body.to_string()).await;
    assert_eq!(status, 429);
    assert_eq!(v["error"]["code"], -32008);
    assert_eq!(v["id"], "r");
    let retry: u64 = headers["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!(retry >= 1);
    assert_eq!(v["error"]["data"]["retryAfter"], retry);
    // Another principal has its own bucket.
    let v = s
        .call_as(BOB, "echo", "agent/authenticatedExtendedCard", json!({}))
        .await;
    assert!(v["result"].is_object());
}

#[tokio::test]
async fn a_full_queue_is_429_too_many_tasks_and_queued_tasks_run_in_order() {
    let mut a = slow("echo", 60_000);
    a.limits.concurrent_tasks = 1;
    a.limits.max_queued_tasks = Some(1);
    let s = server_with(vec![a]).await;
    let nb = json!({"configuration": {"blocking": false}});
    let running = s.send("echo", "1", nb.clone()).await;
    let queued = s.send("echo", "2", nb.clone()).await;
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": "message/send", "params": send_params("3", nb.clone())});
    let (status, _, v) = s.post_raw("echo", Some(ALICE), body.to_string()).await;
    assert_eq!(status, 429);
    assert_eq!(v["error"]["code"], -32009);
    let g = s.ok(s
        .call("echo", "tasks/get", json!({"taskId": queued["id"]}))
        .await);
    assert_eq!(g["status"]["state"], "submitted");
    // Canceling the running task frees its slot for the queued one.
    s.ok(s
        .call("echo", "tasks/cancel", json!({"taskId": running["id"]}))
        .await);
    let qid = queued["id"].clone();
    poll_until(Duration::from_secs(20), || async {
        let g = s.ok(s.call("echo", "tasks/get", json!({"taskId": qid})).await);
        (g["status"]["state"] == "working").then_some(())
    })
    .await;
    // A queued task can be canceled before it starts.
    let third = s.send("echo", "3", nb).await;
    let c = s.ok(s
        .call("echo", "tasks/cancel", json!({"taskId": third["id"]}))
        .await);
    assert_eq!(c["status"]["state"], "canceled");
}

#[tokio::test]
async fn the_card_reports_identity_capabilities_limits_and_live_metrics() {
    let mut a = agent("echo");
    a.name = Some("Echo".into());
    a.description = Some("Replies".into());
    a.version = "2.1.0".into();
    a.limits.requests_per_minute = 1000;
    let s = server_with(vec![a]).await;
    let card = s.ok(s
        .call("echo", "agent/authenticatedExtendedCard", json!({}))
        .await);
    assert_eq!(
        card["agent"],
        json!({"id": "echo", "name": "Echo", "description": "Replies", "version": "2.1.0", "type": "echo", "status": "active"})
    );
    let caps = &card["capabilities"];
    assert_eq!(caps["supportedMethods"].as_array().map(Vec::len), Some(8));
    assert_eq!(caps["streaming"], true);
    assert_eq!(caps["multiTurn"], true);
    assert_eq!(caps["webhooks"], true);
    assert_eq!(caps["fileUpload"]["supported"], true);
    assert_eq!(caps["fileUpload"]["maxFileSize"], 10_485_760);
    assert_eq!(
        card["limits"],
        json!({"requestsPerMinute": 1000, "concurrentTasks": 16, "maxMessageLength": 100000})
    );
    assert_eq!(card["metrics"]["averageResponseTime"], 0.0);
    assert_eq!(card["metrics"]["successRate"], 100.0);
    let before = card["metrics"]["totalRequests"].as_u64().expect("count");
    s.send("echo", "x", json!({})).await;
    s.call("echo", "nope/method", json!({})).await;
    let card = s.ok(s
        .call(
            "echo",
            "agent/getAuthenticatedExtendedCard",
            json!({"includeCapabilities": false}),
        )
        .await);
    assert!(card.get("capabilities").is_none());
    assert_eq!(card["metrics"]["totalRequests"].as_u64(), Some(before + 3));
    assert_eq!(card["metrics"]["successRate"], 100.0);
    let card = s.ok(s
        .call(
            "echo",
            "agent/authenticatedExtendedCard",
            json!({"includeMetrics": false}),
        )
        .await);
    assert!(card.get("metrics").is_none());
}

#[tokio::test]
async fn finished_tasks_are_evicted_after_retention() {
    let mut c = config(&["echo"]);
    c.server.task_retention_seconds = 0.3;
    let s = TestServer::start(c).await;
    let t = s.send("echo", "x", json!({})).await;
    let id = t["id"].clone();
    poll_until(Duration::from_secs(20), || async {
        let v = s.call("echo", "tasks/get", json!({"taskId": id})).await;
        (v["error"]["code"] == -32000).then_some(())
    })
    .await;
}

#[tokio::test]
async fn many_concurrent_sends_all_complete() {
    // 200 at once: more than 16 running + 160 queued, so widen the limits for this load.
    let mut a = agent("echo");
    a.limits.concurrent_tasks = 64;
    a.limits.max_queued_tasks = Some(1000);
    let s = server_with(vec![a]).await;
    let calls = (0..200).map(|i| {
        let s = &s;
        async move { s.send("echo", &format!("n{i}"), json!({})).await }
    });
    let results = futures_util::future::join_all(calls).await;
    for (i, t) in results.iter().enumerate() {
        assert_eq!(t["status"]["state"], "completed");
        assert_eq!(texts(&t["status"]["message"])[0], format!("echo: n{i}"));
    }
}

#[tokio::test]
async fn push_configurations_are_stored_and_returned_masked() {
    let s = server_with(vec![agent("echo")]).await;
    let v = s
        .call("echo", "tasks/pushNotificationConfig/get", json!({}))
        .await;
    assert_eq!(
        s.ok(v),
        json!({"config": null, "configId": null, "active": false})
    );
    let set = s.ok(s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"config": {
                "url": "http://127.0.0.1:9/hook",
                "headers": {"Authorization": "Bearer receiver-token"},
                "events": ["task.completed", "task.failed"],
                "retryPolicy": {"maxRetries": 2, "backoffMultiplier": 1.5, "initialDelay": 0.1},
                "secret": "0123456789abcdef",
            }}),
        )
        .await);
    assert_eq!(set["configured"], true);
    assert_eq!(set["url"], "http://127.0.0.1:9/hook");
    assert_eq!(set["events"], json!(["task.completed", "task.failed"]));
    let id = set["configId"].as_str().expect("id").to_string();
    let got = s.ok(s
        .call("echo", "tasks/pushNotificationConfig/get", json!({}))
        .await);
    assert_eq!(got["configId"], id);
    assert_eq!(got["active"], true);
    assert_eq!(got["config"]["headers"], json!({"Authorization": "***"}));
    assert_eq!(
        got["config"]["retryPolicy"],
        json!({"maxRetries": 2, "backoffMultiplier": 1.5, "initialDelay": 0.1})
    );
    assert_eq!(got["config"]["lastUsed"], Value::Null);
    assert!(got["config"]["createdAt"].is_string());
    assert!(
        !got.to_string().contains("0123456789abcdef"),
        "secret never returned"
    );
    assert!(!got.to_string().contains("receiver-token"));
    // Setting again replaces it with a new id; by configId finds it.
    let again = s.ok(s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": "http://127.0.0.1:9/b"}}),
        )
        .await);
    assert_ne!(again["configId"], id);
    assert_eq!(again["events"].as_array().map(Vec::len), Some(5));
    let by_id = s.ok(s
        .call(
            "echo",
            "tasks/pushNotificationConfig/get",
            json!({"configId": again["configId"]}),
        )
        .await);
    assert_eq!(by_id["config"]["url"], "http://127.0.0.1:9/b");
    // A task-scoped configuration.
    let t = s.send("echo", "x", json!({})).await;
    let scoped = s.ok(s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"taskId": t["id"], "config": {"url": "http://127.0.0.1:9/t"}}),
        )
        .await);
    let got = s.ok(s
        .call(
            "echo",
            "tasks/pushNotificationConfig/get",
            json!({"taskId": t["id"]}),
        )
        .await);
    assert_eq!(got["configId"], scoped["configId"]);
}

#[tokio::test]
async fn push_configuration_errors() {
    let mut no_hooks = agent("nohooks");
    no_hooks.webhooks = false;
    let mut c = config(&[]);
    c.agents = vec![agent("echo"), no_hooks];
    c.webhooks.allow_private_networks = false;
    let s = TestServer::start(c).await;
    let set = |url: &str| json!({"config": {"url": url}});
    for (params, field) in [
        (set("ftp://example.com/x"), "config.url"),
        (set("http://169.254.169.254/latest"), "config.url"),
        (set("http://[fe80::1]/x"), "config.url"),
        (set("http://127.0.0.1:9/x"), "config.url"),
        (set("http://10.0.0.1/x"), "config.url"),
        (
            json!({"config": {"url": "https://hooks.example.com/x", "events": ["task.exploded"]}}),
            "config.events[0]",
        ),
        (
            json!({"config": {"url": "https://hooks.example.com/x", "secret": "short"}}),
            "config.secret",
        ),
        (
            json!({"config": {"url": "https://hooks.example.com/x", "retryPolicy": {"maxRetries": 99}}}),
            "config.retryPolicy.maxRetries",
        ),
        (json!({}), "config"),
    ] {
        let v = s
            .call("echo", "tasks/pushNotificationConfig/set", params.clone())
            .await;
        assert_eq!(v["error"]["code"], -32602, "{params}: {v}");
        assert_eq!(v["error"]["data"]["field"], field, "{params}: {v}");
    }
    let ok = s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            set("https://hooks.example.com/x"),
        )
        .await;
    assert_eq!(s.ok(ok)["configured"], true);
    let v = s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"taskId": "nope", "config": {"url": "https://hooks.example.com/x"}}),
        )
        .await;
    assert_eq!(v["error"]["code"], -32000);
    for method in [
        "tasks/pushNotificationConfig/set",
        "tasks/pushNotificationConfig/get",
    ] {
        let v = s
            .call("nohooks", method, set("https://hooks.example.com/x"))
            .await;
        assert_eq!(v["error"]["code"], -32010, "{method}");
    }
}

#[tokio::test]
async fn shutdown_answers_a_blocking_send_in_flight_with_canceled() {
    let s = server_with(vec![slow("echo", 60_000)]).await;
    let pending = s.call(
        "echo",
        "message/send",
        send_params("wait", json!({"id": "inflight"})),
    );
    let stopper = async {
        poll_until(Duration::from_secs(20), || async {
            let v = s
                .call("echo", "tasks/get", json!({"taskId": "inflight"}))
                .await;
            (v["result"]["status"]["state"] == "working").then_some(())
        })
        .await;
        s.handle.as_ref().expect("handle").stop();
    };
    let (v, ()) = tokio::join!(pending, stopper);
    let t = s.ok(v);
    assert_eq!(t["status"]["state"], "canceled");
    assert_eq!(t["status"]["reason"], "shutdown");
    s.stop().await;
}

#[tokio::test]
async fn an_idle_conversation_is_forgotten_after_retention() {
    let mut c = config(&["echo"]);
    c.server.task_retention_seconds = 0.3;
    let s = TestServer::start(c).await;
    let first = s.send("echo", "one", json!({})).await;
    let ctx = first["contextId"].clone();
    // Still known right away.
    let second = s.send("echo", "two", json!({"contextId": ctx})).await;
    assert_eq!(
        texts(&second["status"]["message"])
            .last()
            .map(String::as_str),
        Some("turn 2")
    );
    // Each probe that finds the conversation continues it (and keeps it alive), so a probe
    // is only made once the last turn's task has itself been evicted: by then the
    // conversation has been idle for the whole retention.
    let mut last = second["id"].clone();
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        poll_until(Duration::from_secs(20), || async {
            let v = s.call("echo", "tasks/get", json!({"taskId": last})).await;
            (v["error"]["code"] == -32000).then_some(())
        })
        .await;
        let v = s
            .call(
                "echo",
                "message/send",
                send_params("later", json!({"contextId": ctx})),
            )
            .await;
        let v = s.ok(v);
        // Forgotten: the same name now starts a new conversation.
        if texts(&v["status"]["message"]).last().map(String::as_str) == Some("turn 1") {
            break;
        }
        last = v["id"].clone();
        assert!(
            tokio::time::Instant::now() < end,
            "the conversation was never forgotten"
        );
    }
}
