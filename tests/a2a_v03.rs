//! A2A 0.3 on `POST /api/v1/a2a/{agent}/jsonrpc/v0.3` (DIALECTS.md): the J03 shapes
//! (`kind` discriminators, `final` flags), the version rule (absent, empty or 0.3), error
//! data as objects, push configurations with whole-task deliveries — over real HTTP.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::official::{V, message};
use support::receiver::Receiver;
use support::{ALICE, TestServer, agent, config, poll_until, texts};

const V3: V = V::V03;

async fn server() -> TestServer {
    let mut c = config(&["echo"]);
    let mut slow = agent("slow");
    slow.echo.delay_ms = 2_000;
    let mut stuck = agent("stuck");
    stuck.echo.delay_ms = 60_000;
    let mut quiet = agent("quiet");
    quiet.webhooks = false;
    let mut tck = agent("tck");
    tck.backend = "tck".into();
    c.agents.extend([slow, stuck, quiet, tck]);
    TestServer::start(c).await
}

#[tokio::test]
async fn send_returns_a_task_of_kind_task() {
    let s = server().await;
    let out = s
        .official(
            "echo",
            V3,
            "message/send",
            json!({"message": message(V3, "hi", None)}),
        )
        .await;
    let task = s.result(out);
    assert_eq!(task["kind"], "task");
    assert_eq!(task["status"]["state"], "completed");
    let reply = &task["status"]["message"];
    assert_eq!(
        (reply["kind"].clone(), reply["role"].clone()),
        (json!("message"), json!("agent"))
    );
    assert_eq!(
        reply["parts"][0],
        json!({"kind": "text", "text": "echo: hi"})
    );
    assert_eq!(task["history"][0]["role"], "user");
    assert!(task.get("final").is_none() && task.get("createdAt").is_none());
    // historyLength on get.
    let got = s.result(
        s.official(
            "echo",
            V3,
            "tasks/get",
            json!({"id": task["id"], "historyLength": 1}),
        )
        .await,
    );
    assert_eq!(got["history"].as_array().map(Vec::len), Some(1));
    s.stop().await;
}

#[tokio::test]
async fn the_stream_is_task_then_status_updates_with_final_on_the_last() {
    let s = server().await;
    let events = s
        .official_events(
            "slow",
            V3,
            "message/stream",
            json!({"message": message(V3, "go", None)}),
        )
        .await;
    assert_eq!(events[0]["kind"], "task");
    assert_eq!(events[0]["status"]["state"], "submitted");
    let updates = &events[1..];
    assert!(updates.iter().all(|u| u["kind"] == "status-update"));
    let finals: Vec<bool> = updates
        .iter()
        .map(|u| u["final"].as_bool().expect("final"))
        .collect();
    assert_eq!(finals.last(), Some(&true));
    assert!(finals[..finals.len() - 1].iter().all(|f| !f));
    assert_eq!(
        updates.last().expect("last")["status"]["state"],
        "completed"
    );
    // Resubscribe to a running task.
    let task = s
        .official_send("slow", V3, message(V3, "x", None), false)
        .await;
    let events = s
        .official_events("slow", V3, "tasks/resubscribe", json!({"id": task["id"]}))
        .await;
    assert_eq!(events[0]["kind"], "task");
    assert_eq!(events.last().expect("last")["final"], true);
    // And to a finished one: -32004.
    let out = s
        .official("slow", V3, "tasks/resubscribe", json!({"id": task["id"]}))
        .await;
    assert_eq!(out["error"]["code"], -32004);
    s.stop().await;
}

#[tokio::test]
async fn version_headers_absent_empty_or_0_3_are_served() {
    let s = server().await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "x"}})
        .to_string();
    let ct = ("content-type", "application/json");
    let key = ("x-api-key", ALICE);
    for (headers, code) in [
        (vec![ct, key], -32001),
        (vec![ct, key, ("a2a-version", "")], -32001),
        (vec![ct, key, ("a2a-version", "0.3")], -32001),
        (vec![ct, key, ("a2a-version", "0.3.0")], -32001),
        (vec![ct, key, ("a2a-version", "1.0")], -32009),
        (vec![ct, key, ("a2a-version", "9")], -32009),
    ] {
        let (status, _, out) = s.official_raw("echo", V3, &headers, body.clone()).await;
        assert_eq!(status, 200);
        assert_eq!(out["error"]["code"], code, "{headers:?}: {out}");
        assert!(
            out["error"]["data"].is_object(),
            "0.3 error data is an object: {out}"
        );
    }
    let (_, _, out) = s
        .official_raw("echo", V3, &[ct, key, ("a2a-version", "1.0")], body)
        .await;
    let url = out["error"]["data"]["url"]
        .as_str()
        .expect("url")
        .to_string();
    assert!(url.ends_with("/api/v1/a2a/echo/jsonrpc/v1"), "{out}");
    s.stop().await;
}

#[tokio::test]
async fn parts_need_a_kind_and_data_and_file_urls_keep_their_bounds() {
    let s = server().await;
    let with_parts = |parts: Value| {
        json!({"message": {"kind": "message", "messageId": support::new_id(), "role": "user",
                            "parts": parts}})
    };
    for (parts, field) in [
        (json!([{"text": "no kind"}]), "message.parts[0].kind"),
        (json!([{"kind": "data"}]), "message.parts[0].data"),
        (
            json!([{"kind": "file", "file": {"uri": "file:///etc/passwd", "mimeType": "text/plain"}}]),
            "message.parts[0].file.uri",
        ),
        (
            json!([{"kind": "file", "file": {"uri": "https://x/y", "bytes": "aGk="}}]),
            "message.parts[0].file",
        ),
        (
            json!([{"kind": "video", "text": "x"}]),
            "message.parts[0].kind",
        ),
        (json!([]), "message.parts"),
    ] {
        let out = s
            .official("echo", V3, "message/send", with_parts(parts.clone()))
            .await;
        assert_eq!(out["error"]["code"], -32602, "{parts}: {out}");
        assert_eq!(out["error"]["data"]["field"], field, "{parts}: {out}");
    }
    let out = s
        .official(
            "echo",
            V3,
            "message/send",
            with_parts(json!([{"kind": "file",
                               "file": {"bytes": "aGVsbG8=", "name": "a.txt", "mimeType": "text/plain"}}])),
        )
        .await;
    let task = s.result(out);
    assert_eq!(
        task["history"][0]["parts"][0],
        json!({"kind": "file", "file": {"bytes": "aGVsbG8=", "name": "a.txt", "mimeType": "text/plain"}})
    );
    assert!(
        texts(&task["status"]["message"])
            .iter()
            .any(|t| t.contains("a.txt"))
    );
    let out = s
        .official(
            "echo",
            V3,
            "message/send",
            with_parts(json!([{"kind": "file",
                               "file": {"bytes": "AAAA", "name": "v.mp4", "mimeType": "video/mp4"}}])),
        )
        .await;
    assert_eq!(out["error"]["code"], -32005);
    s.stop().await;
}

#[tokio::test]
async fn cancel_and_methods_that_0_3_does_not_have() {
    let s = server().await;
    let task = s
        .official_send("stuck", V3, message(V3, "x", None), false)
        .await;
    let canceled = s.result(
        s.official("stuck", V3, "tasks/cancel", json!({"id": task["id"]}))
            .await,
    );
    assert_eq!(canceled["status"]["state"], "canceled");
    assert_eq!(texts(&canceled["status"]["message"]), ["Canceled by user"]);
    let again = s
        .official("stuck", V3, "tasks/cancel", json!({"id": task["id"]}))
        .await;
    assert_eq!(again["error"]["code"], -32002);
    let list = s.official("stuck", V3, "tasks/list", json!({})).await;
    assert_eq!(list["error"]["code"], -32601);
    // A 1.0 method names the 1.0 URL; a seed-only method names the seed URL.
    let out = s.official("echo", V3, "ListTasks", json!({})).await;
    assert_eq!(out["error"]["code"], -32601);
    assert!(
        out["error"]["data"]["url"]
            .as_str()
            .is_some_and(|u| u.ends_with("/jsonrpc/v1"))
    );
    let out = s
        .official("echo", V3, "agent/authenticatedExtendedCard", json!({}))
        .await;
    assert_eq!(out["error"]["data"]["url"], s.url("echo"));
    // The 0.3 card method.
    let card = s.result(
        s.official("echo", V3, "agent/getAuthenticatedExtendedCard", json!({}))
            .await,
    );
    assert_eq!(card["protocolVersion"], "0.3");
    assert_eq!(card["url"], s.official_url("echo", V3));
    s.stop().await;
}

#[tokio::test]
async fn push_configurations_take_the_0_3_shapes_and_deliver_whole_tasks() {
    let s = server().await;
    let rx = Receiver::ok().await;
    let task = s
        .official_send("slow", V3, message(V3, "x", None), false)
        .await;
    let id = task["id"].clone();
    let set = s.result(
        s.official(
            "slow",
            V3,
            "tasks/pushNotificationConfig/set",
            json!({"taskId": id, "pushNotificationConfig": {
                "url": rx.url, "token": "t-03",
                "authentication": {"schemes": ["Bearer"], "credentials": "c-03"}}}),
        )
        .await,
    );
    assert_eq!(set["taskId"], id);
    let config_id = set["pushNotificationConfig"]["id"].clone();
    assert!(config_id.as_str().is_some_and(|c| !c.is_empty()));
    assert_eq!(
        set["pushNotificationConfig"]["authentication"]["schemes"],
        json!(["Bearer"])
    );
    // get without a config id: the first one; with one: that one.
    for params in [
        json!({"id": id}),
        json!({"id": id, "pushNotificationConfigId": config_id}),
    ] {
        let got = s.result(
            s.official("slow", V3, "tasks/pushNotificationConfig/get", params)
                .await,
        );
        assert_eq!(got["pushNotificationConfig"]["id"], config_id);
    }
    let listed = s.result(
        s.official(
            "slow",
            V3,
            "tasks/pushNotificationConfig/list",
            json!({"id": id}),
        )
        .await,
    );
    assert_eq!(listed.as_array().map(Vec::len), Some(1));
    let hits = poll_until(Duration::from_secs(30), || async {
        let hits = rx.hits();
        hits.iter()
            .any(|h| h.json()["status"]["state"] == "completed")
            .then_some(hits)
    })
    .await;
    for h in &hits {
        let body = h.json();
        assert_eq!(body["kind"], "task");
        assert_eq!(body["id"], id);
        assert_eq!(h.header("content-type"), "application/json");
        assert_eq!(h.header("authorization"), "Bearer c-03");
        assert_eq!(h.header("x-a2a-notification-token"), "t-03");
    }
    let deleted = s
        .official(
            "slow",
            V3,
            "tasks/pushNotificationConfig/delete",
            json!({"id": id, "pushNotificationConfigId": config_id}),
        )
        .await;
    assert_eq!(s.result(deleted), Value::Null);
    let none = s
        .official(
            "slow",
            V3,
            "tasks/pushNotificationConfig/get",
            json!({"id": id}),
        )
        .await;
    assert_eq!(none["error"]["code"], -32001);
    let quiet = s
        .official(
            "quiet",
            V3,
            "tasks/pushNotificationConfig/set",
            json!({"taskId": id, "pushNotificationConfig": {"url": rx.url}}),
        )
        .await;
    assert_eq!(quiet["error"]["code"], -32003);
    s.stop().await;
}

#[tokio::test]
async fn artifacts_stream_as_artifact_updates_and_tasks_cross_to_1_0() {
    let s = server().await;
    let events = s
        .official_events(
            "tck",
            V3,
            "message/stream",
            json!({"message": message(V3, "x", Some("tck-stream-artifact-chunked"))}),
        )
        .await;
    let chunks: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "artifact-update")
        .collect();
    assert_eq!(chunks.len(), 2, "{events:?}");
    assert_eq!(
        chunks[0]["artifact"]["parts"],
        json!([{"kind": "text", "text": "chunk-1 "}])
    );
    assert_eq!(
        (chunks[0]["append"].clone(), chunks[0]["lastChunk"].clone()),
        (json!(false), json!(false))
    );
    assert_eq!(
        (chunks[1]["append"].clone(), chunks[1]["lastChunk"].clone()),
        (json!(true), json!(true))
    );
    let task = s
        .official_send("tck", V3, message(V3, "x", Some("tck-artifact-data")), true)
        .await;
    assert_eq!(
        task["artifacts"][0]["parts"][0],
        json!({"kind": "data", "data": {"key": "value", "count": 42}})
    );
    let waiting = s
        .official_send(
            "tck",
            V3,
            message(V3, "x", Some("tck-input-required")),
            true,
        )
        .await;
    assert_eq!(waiting["status"]["state"], "input-required");
    // Made on 0.3, read on 1.0 and on the seed path.
    let on_v1 = s.result(
        s.official("tck", V::V10, "GetTask", json!({"id": task["id"]}))
            .await,
    );
    assert_eq!(on_v1["artifacts"][0]["parts"][0]["data"]["count"], 42);
    let on_seed = s.ok(s
        .call("tck", "tasks/get", json!({"taskId": task["id"]}))
        .await);
    assert_eq!(on_seed["status"]["state"], "completed");
    s.stop().await;
}
