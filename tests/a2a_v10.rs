//! A2A 1.0 on `POST /api/v1/a2a/{agent}/jsonrpc/v1` (DIALECTS.md): every method, the
//! version check, the official error shapes, ownership across dialects, push configurations
//! and their deliveries, interrupted tasks and direct replies — over real HTTP.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::official::{V, error_info, message, task_of};
use support::receiver::Receiver;
use support::{ALICE, BOB, CAROL, SseReader, TestServer, agent, config, poll_until, texts};

const V1: V = V::V10;

/// echo (instant), slow (2 s), stuck (60 s), quiet (no webhooks, no streaming), tck.
async fn server() -> TestServer {
    let mut c = config(&["echo"]);
    let mut slow = agent("slow");
    slow.echo.delay_ms = 2_000;
    slow.echo.progress_steps = 1;
    let mut stuck = agent("stuck");
    stuck.echo.delay_ms = 60_000;
    let mut quiet = agent("quiet");
    quiet.webhooks = false;
    quiet.streaming = Some(false);
    let mut tck = agent("tck");
    tck.backend = "tck".into();
    c.agents.extend([slow, stuck, quiet, tck]);
    TestServer::start(c).await
}

fn is_timestamp(v: &Value) -> bool {
    let s = v.as_str().unwrap_or("");
    s.len() == 24 && s.ends_with('Z') && s.as_bytes()[10] == b'T' && s.as_bytes()[19] == b'.'
}

#[tokio::test]
async fn send_returns_the_task_in_proto_json() {
    let s = server().await;
    let out = s
        .official(
            "echo",
            V1,
            "SendMessage",
            json!({"message": message(V1, "hi", None)}),
        )
        .await;
    let task = task_of(V1, &s.result(out));
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    assert!(is_timestamp(&task["status"]["timestamp"]), "{task}");
    let reply = &task["status"]["message"];
    assert_eq!(reply["role"], "ROLE_AGENT");
    assert_eq!(texts(reply), ["echo: hi", "turn 1"]);
    assert_eq!(reply["taskId"], task["id"]);
    assert_eq!(reply["contextId"], task["contextId"]);
    let history = task["history"].as_array().expect("history");
    assert_eq!(history.len(), 2);
    assert_eq!(history[0]["role"], "ROLE_USER");
    assert_eq!(history[1]["messageId"], reply["messageId"]);
    for seed_only in ["final", "createdAt", "updatedAt", "kind"] {
        assert!(task.get(seed_only).is_none(), "{seed_only} in {task}");
    }
    assert!(task.get("artifacts").is_none(), "echo makes no artifacts");
    assert!(task.get("metadata").is_none());
    // The request's metadata is the task's; an empty object is none.
    for (metadata, shown) in [(json!({"trace": "t-1"}), true), (json!({}), false)] {
        let out = s
            .official(
                "echo",
                V1,
                "SendMessage",
                json!({"message": message(V1, "hi", None), "metadata": metadata}),
            )
            .await;
        let task = task_of(V1, &s.result(out));
        assert_eq!(task.get("metadata").is_some(), shown, "{task}");
        if shown {
            assert_eq!(task["metadata"], metadata);
        }
    }
    s.stop().await;
}

#[tokio::test]
async fn get_task_honours_history_length() {
    let s = server().await;
    let task = s
        .official_send("echo", V1, message(V1, "a", None), true)
        .await;
    let id = task["id"].clone();
    let get = |h: Value| {
        let mut p = json!({"id": id});
        if !h.is_null() {
            p["historyLength"] = h;
        }
        s.official("echo", V1, "GetTask", p)
    };
    let full = s.result(get(Value::Null).await);
    assert_eq!(full["history"].as_array().map(Vec::len), Some(2));
    let none = s.result(get(json!(0)).await);
    assert!(none.get("history").is_none(), "{none}");
    let last = s.result(get(json!("1")).await);
    assert_eq!(last["history"][0]["role"], "ROLE_AGENT");
    let bad = get(json!(-1)).await;
    assert_eq!(bad["error"]["code"], -32602);
    let info = error_info(&bad);
    assert_eq!(info["reason"], "INVALID_PARAMS");
    assert_eq!(
        bad["error"]["data"][1]["fieldViolations"][0]["field"],
        "historyLength"
    );
    // Unknown, and another principal's: the same -32001.
    let unknown = s
        .official("echo", V1, "GetTask", json!({"id": "no-such-task"}))
        .await;
    assert_eq!(unknown["error"]["code"], -32001);
    assert_eq!(error_info(&unknown)["reason"], "TASK_NOT_FOUND");
    let other = s
        .official_as(BOB, "echo", V1, "GetTask", json!({"id": id}))
        .await;
    assert_eq!(other["error"]["code"], -32001);
    s.stop().await;
}

#[tokio::test]
async fn list_tasks_pages_newest_first_with_stable_tokens() {
    let s = server().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let t = s
            .official_send("echo", V1, message(V1, &format!("m{i}"), None), true)
            .await;
        ids.push(t["id"].as_str().expect("id").to_string());
    }
    // Bob's task is never listed for alice.
    s.official_as(
        BOB,
        "echo",
        V1,
        "SendMessage",
        json!({"message": message(V1, "bob", None)}),
    )
    .await;
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let mut p = json!({"pageSize": 2});
        if !token.is_empty() {
            p["pageToken"] = json!(token);
        }
        let page = s.result(s.official("echo", V1, "ListTasks", p).await);
        assert_eq!(page["totalSize"], 5);
        assert_eq!(page["pageSize"], 2);
        for t in page["tasks"].as_array().expect("tasks") {
            assert!(t.get("artifacts").is_none());
            seen.push(t["id"].as_str().expect("id").to_string());
        }
        token = page["nextPageToken"].as_str().expect("token").to_string();
        if token.is_empty() {
            break;
        }
    }
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(seen, newest_first, "every task once, newest status first");
    // Status timestamps never increase along the pages.
    let page = s.result(s.official("echo", V1, "ListTasks", json!({})).await);
    let stamps: Vec<String> = page["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["status"]["timestamp"].as_str().expect("ts").to_string())
        .collect();
    assert!(stamps.windows(2).all(|w| w[0] >= w[1]), "{stamps:?}");
    assert_eq!(page["pageSize"], 50);
    // Filters.
    let done = s.result(
        s.official(
            "echo",
            V1,
            "ListTasks",
            json!({"status": "TASK_STATE_COMPLETED", "historyLength": 0}),
        )
        .await,
    );
    assert_eq!(done["totalSize"], 5);
    assert!(done["tasks"][0].get("history").is_none());
    let none = s.result(
        s.official(
            "echo",
            V1,
            "ListTasks",
            json!({"status": "TASK_STATE_WORKING"}),
        )
        .await,
    );
    assert_eq!(none["totalSize"], 0);
    assert_eq!(none["nextPageToken"], "");
    let unspecified = s.result(
        s.official(
            "echo",
            V1,
            "ListTasks",
            json!({"status": "TASK_STATE_UNSPECIFIED"}),
        )
        .await,
    );
    assert_eq!(unspecified["totalSize"], 5);
    let later = s.result(
        s.official(
            "echo",
            V1,
            "ListTasks",
            json!({"statusTimestampAfter": "2999-01-01T00:00:00Z"}),
        )
        .await,
    );
    assert_eq!(later["totalSize"], 0);
    for bad in [
        json!({"pageSize": 0}),
        json!({"pageSize": 101}),
        json!({"pageToken": "not-a-token"}),
        json!({"status": "DONE"}),
        json!({"statusTimestampAfter": "yesterday"}),
        json!({"tenant": "t1"}),
    ] {
        let out = s.official("echo", V1, "ListTasks", bad.clone()).await;
        assert_eq!(out["error"]["code"], -32602, "{bad}: {out}");
    }
    s.stop().await;
}

#[tokio::test]
async fn streaming_send_starts_with_the_task_and_ends_at_the_terminal_update() {
    let s = server().await;
    let events = s
        .official_events(
            "slow",
            V1,
            "SendStreamingMessage",
            json!({"message": message(V1, "go", None)}),
        )
        .await;
    let first = &events[0]["task"];
    assert_eq!(first["status"]["state"], "TASK_STATE_SUBMITTED");
    assert_eq!(first["history"].as_array().map(Vec::len), Some(1));
    let updates: Vec<&Value> = events[1..].iter().map(|e| &e["statusUpdate"]).collect();
    assert!(updates.iter().all(|u| u["taskId"] == first["id"]));
    let states: Vec<&str> = updates
        .iter()
        .map(|u| u["status"]["state"].as_str().expect("state"))
        .collect();
    assert_eq!(states.first(), Some(&"TASK_STATE_WORKING"));
    assert_eq!(states.last(), Some(&"TASK_STATE_COMPLETED"));
    assert!(updates.iter().all(|u| u.get("final").is_none()));
    s.stop().await;
}

#[tokio::test]
async fn subscribe_sends_the_current_task_then_live_updates() {
    let s = server().await;
    let task = s
        .official_send("slow", V1, message(V1, "x", None), false)
        .await;
    let events = s
        .official_events("slow", V1, "SubscribeToTask", json!({"id": task["id"]}))
        .await;
    assert_eq!(events[0]["task"]["id"], task["id"]);
    let last = events.last().expect("events");
    assert_eq!(
        last["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    // A terminal task: -32004 as a plain JSON response, not a stream.
    let resp = s
        .official_stream("slow", V1, "SubscribeToTask", json!({"id": task["id"]}))
        .await;
    assert_eq!(resp.headers()["content-type"], "application/json");
    let out: Value = serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
    assert_eq!(out["error"]["code"], -32004);
    assert_eq!(error_info(&out)["reason"], "UNSUPPORTED_OPERATION");
    let unknown = s
        .official("slow", V1, "SubscribeToTask", json!({"id": "nope"}))
        .await;
    assert_eq!(unknown["error"]["code"], -32001);
    // Streaming off: -32004 for both streaming methods.
    for (method, params) in [
        (
            "SendStreamingMessage",
            json!({"message": message(V1, "q", None)}),
        ),
        ("SubscribeToTask", json!({"id": task["id"]})),
    ] {
        let out = s.official("quiet", V1, method, params).await;
        assert_eq!(out["error"]["code"], -32004, "{method}: {out}");
    }
    s.stop().await;
}

#[tokio::test]
async fn cancel_ends_the_task_with_its_reason_and_only_once() {
    let s = server().await;
    let task = s
        .official_send("stuck", V1, message(V1, "x", None), false)
        .await;
    assert!(
        ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"]
            .contains(&task["status"]["state"].as_str().expect("state"))
    );
    let out = s
        .official(
            "stuck",
            V1,
            "CancelTask",
            json!({"id": task["id"], "metadata": {"reason": "no longer needed"}}),
        )
        .await;
    let canceled = s.result(out);
    assert_eq!(canceled["status"]["state"], "TASK_STATE_CANCELED");
    assert_eq!(texts(&canceled["status"]["message"]), ["no longer needed"]);
    assert_eq!(canceled["status"]["message"]["role"], "ROLE_AGENT");
    let again = s
        .official("stuck", V1, "CancelTask", json!({"id": task["id"]}))
        .await;
    assert_eq!(again["error"]["code"], -32002);
    assert_eq!(error_info(&again)["reason"], "TASK_NOT_CANCELABLE");
    let done = s
        .official_send("echo", V1, message(V1, "y", None), true)
        .await;
    let out = s
        .official("echo", V1, "CancelTask", json!({"id": done["id"]}))
        .await;
    assert_eq!(out["error"]["code"], -32002);
    s.stop().await;
}

#[tokio::test]
async fn the_version_header_or_query_must_name_1_0() {
    let s = server().await;
    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}).to_string();
    let ct = ("content-type", "application/json");
    let key = ("x-api-key", ALICE);
    for (headers, ok) in [
        (vec![ct, key, ("a2a-version", "1.0")], true),
        (vec![ct, key, ("a2a-version", "1.0.1")], true),
        (vec![ct, key], false),
        (vec![ct, key, ("a2a-version", "")], false),
        (vec![ct, key, ("a2a-version", "0.3")], false),
        (vec![ct, key, ("a2a-version", "2.0")], false),
    ] {
        let (status, _, out) = s.official_raw("echo", V1, &headers, body.clone()).await;
        assert_eq!(status, 200);
        let code = out["error"]["code"].as_i64();
        if ok {
            assert_eq!(code, Some(-32001), "{headers:?}: {out}");
        } else {
            assert_eq!(code, Some(-32009), "{headers:?}: {out}");
            let info = error_info(&out);
            assert_eq!(info["reason"], "VERSION_NOT_SUPPORTED");
            assert_eq!(info["metadata"]["supportedVersions"], "1.0");
        }
    }
    // 0.3 named: the URL that serves it.
    let (_, _, out) = s
        .official_raw("echo", V1, &[ct, key, ("a2a-version", "0.3")], body.clone())
        .await;
    let url = error_info(&out)["metadata"]["url"].clone();
    assert!(
        url.as_str()
            .is_some_and(|u| u.ends_with("/api/v1/a2a/echo/jsonrpc/v0.3")),
        "{out}"
    );
    // The query parameter works as the header does.
    let resp = s
        .client
        .post(format!("{}?A2A-Version=1.0", s.official_url("echo", V1)))
        .header("content-type", "application/a2a+json")
        .header("x-api-key", ALICE)
        .body(body)
        .send()
        .await
        .expect("request");
    let out: Value = serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
    assert_eq!(out["error"]["code"], -32001, "{out}");
    s.stop().await;
}

#[tokio::test]
async fn refusals_come_in_the_official_shape_and_order() {
    let s = server().await;
    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}).to_string();
    let v = ("a2a-version", "1.0");
    let json_ct = ("content-type", "application/json");
    let (status, headers, out) = s
        .official_raw("echo", V1, &[json_ct, v], body.clone())
        .await;
    assert_eq!((status, out["error"]["code"].as_i64()), (401, Some(-31401)));
    assert!(headers.contains_key("www-authenticate"));
    assert_eq!(error_info(&out)["reason"], "UNAUTHENTICATED");
    let (status, _, out) = s
        .official_raw(
            "ghost",
            V1,
            &[json_ct, v, ("x-api-key", ALICE)],
            body.clone(),
        )
        .await;
    assert_eq!((status, out["error"]["code"].as_i64()), (404, Some(-31404)));
    let (status, _, out) = s
        .official_raw(
            "slow",
            V1,
            &[json_ct, v, ("x-api-key", CAROL)],
            body.clone(),
        )
        .await;
    assert_eq!((status, out["error"]["code"].as_i64()), (403, Some(-31403)));
    let (status, _, out) = s
        .official_raw(
            "echo",
            V1,
            &[("content-type", "text/plain"), v, ("x-api-key", ALICE)],
            body.clone(),
        )
        .await;
    assert_eq!((status, out["error"]["code"].as_i64()), (415, Some(-32005)));
    assert_eq!(error_info(&out)["reason"], "CONTENT_TYPE_NOT_SUPPORTED");
    let resp = s
        .client
        .get(s.official_url("echo", V1))
        .header("x-api-key", ALICE)
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 405);
    // Framing errors carry ErrorInfo too.
    let auth = [json_ct, v, ("x-api-key", ALICE)];
    let (_, _, out) = s.official_raw("echo", V1, &auth, "{nope").await;
    assert_eq!(out["error"]["code"], -32700);
    assert_eq!(error_info(&out)["reason"], "PARSE_ERROR");
    // No id: answered, with id null.
    let (_, _, out) = s
        .official_raw("echo", V1, &auth, r#"{"jsonrpc":"2.0","method":"Nope"}"#)
        .await;
    assert_eq!(out["id"], Value::Null);
    assert_eq!(out["error"]["code"], -32601);
    let (_, _, out) = s
        .official_raw(
            "echo",
            V1,
            &auth,
            r#"{"jsonrpc":"2.0","method":"GetTask","params":{}}"#,
        )
        .await;
    assert_eq!(
        (out["id"].clone(), out["error"]["code"].clone()),
        (Value::Null, json!(-32602))
    );
    let (_, _, out) = s
        .official_raw(
            "echo",
            V1,
            &auth,
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"GetTask"}"#,
        )
        .await;
    assert_eq!(out["error"]["code"], -32600);
    // A method of another dialect names the URL that serves it.
    let out = s
        .official(
            "echo",
            V1,
            "tasks/pushNotificationConfig/list",
            json!({"id": "x"}),
        )
        .await;
    assert_eq!(out["error"]["code"], -32601);
    let url = error_info(&out)["metadata"]["url"].clone();
    assert!(
        url.as_str().is_some_and(|u| u.ends_with("/jsonrpc/v0.3")),
        "{out}"
    );
    s.stop().await;
}

#[tokio::test]
async fn bad_messages_are_refused_before_any_task_exists() {
    let s = server().await;
    let with = |m: Value| json!({"message": m});
    for (params, code, field) in [
        (
            with(
                json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"url": "data:text/plain,hi"}]}),
            ),
            -32602,
            "message.parts[0].url",
        ),
        (
            with(
                json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"url": "https://x/y", "mediaType": "video/mp4"}]}),
            ),
            -32005,
            "message.parts[0].mediaType",
        ),
        (
            with(
                json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"data": {"a": 1}, "url": "https://x/y"}]}),
            ),
            -32602,
            "message.parts[0]",
        ),
        (
            with(json!({"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "a"}]})),
            -32602,
            "message.role",
        ),
        (
            with(json!({"messageId": "", "role": "ROLE_USER", "parts": [{"text": "a"}]})),
            -32602,
            "message.messageId",
        ),
        (
            with(json!({"messageId": "m", "role": "ROLE_USER",
                        "parts": [{"raw": "AAAA", "mediaType": "video/mp4"}]})),
            -32005,
            "message.parts[0].mediaType",
        ),
        (
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "a"}]},
                   "tenant": "acme"}),
            -32602,
            "tenant",
        ),
        (
            with(
                json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "a"}],
                        "taskId": "no-such-task"}),
            ),
            -32001,
            "",
        ),
    ] {
        let out = s.official("echo", V1, "SendMessage", params.clone()).await;
        assert_eq!(out["error"]["code"], code, "{params}: {out}");
        if !field.is_empty() {
            let violations = &out["error"]["data"][1]["fieldViolations"][0];
            let info = error_info(&out);
            assert_eq!(
                info["metadata"]["field"], field,
                "{params}: {out} ({violations})"
            );
        }
    }
    let list = s.result(s.official("echo", V1, "ListTasks", json!({})).await);
    assert_eq!(list["totalSize"], 0, "nothing was created");
    // A file part in raw (URL-safe, unpadded) Base64 is accepted.
    let out = s
        .official(
            "echo",
            V1,
            "SendMessage",
            with(json!({"messageId": "m", "role": "ROLE_USER",
                        "parts": [{"raw": "aGVsbG8", "filename": "a.txt", "mediaType": "text/plain"}]})),
        )
        .await;
    let task = task_of(V1, &s.result(out));
    assert_eq!(task["history"][0]["parts"][0]["raw"], "aGVsbG8=");
    assert_eq!(task["history"][0]["parts"][0]["filename"], "a.txt");
    s.stop().await;
}

#[tokio::test]
async fn one_store_serves_every_dialect() {
    let s = server().await;
    let seed = s.send("echo", "from the seed", json!({})).await;
    let id = seed["id"].clone();
    let on_v1 = s.result(s.official("echo", V1, "GetTask", json!({"id": id})).await);
    assert_eq!(on_v1["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(on_v1["history"][0]["role"], "ROLE_USER");
    let on_v03 = s.result(
        s.official("echo", V::V03, "tasks/get", json!({"id": id}))
            .await,
    );
    assert_eq!(on_v03["kind"], "task");
    assert_eq!(on_v03["status"]["state"], "completed");
    // Made on 1.0, read on the seed path.
    let t = s
        .official_send("echo", V1, message(V1, "from 1.0", None), true)
        .await;
    let on_seed = s.ok(s
        .call("echo", "tasks/get", json!({"taskId": t["id"]}))
        .await);
    assert_eq!(on_seed["status"]["state"], "completed");
    let listed = s.result(s.official("echo", V1, "ListTasks", json!({})).await);
    assert_eq!(listed["totalSize"], 2);
    s.stop().await;
}

#[tokio::test]
async fn push_configurations_are_managed_and_delivered_as_stream_responses() {
    let s = server().await;
    let rx = Receiver::ok().await;
    let task = s
        .official_send("slow", V1, message(V1, "x", None), false)
        .await;
    let id = task["id"].clone();
    let created = s.result(
        s.official(
            "slow",
            V1,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "url": rx.url, "token": "tok-1",
                   "authentication": {"scheme": "Bearer", "credentials": "sekrit"}}),
        )
        .await,
    );
    let config_id = created["id"].as_str().expect("id").to_string();
    assert!(!config_id.is_empty());
    assert_eq!(created["taskId"], id);
    assert_eq!(created["url"], rx.url);
    let got = s.result(
        s.official(
            "slow",
            V1,
            "GetTaskPushNotificationConfig",
            json!({"taskId": id, "id": config_id}),
        )
        .await,
    );
    assert_eq!(got["id"], config_id);
    // The same id replaces; a second id adds.
    s.result(
        s.official(
            "slow",
            V1,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "id": "second", "url": format!("{}?n=2", rx.url)}),
        )
        .await,
    );
    let listed = s.result(
        s.official(
            "slow",
            V1,
            "ListTaskPushNotificationConfigs",
            json!({"taskId": id}),
        )
        .await,
    );
    assert_eq!(listed["configs"].as_array().map(Vec::len), Some(2));
    assert_eq!(listed["nextPageToken"], "");
    let paged = s.result(
        s.official(
            "slow",
            V1,
            "ListTaskPushNotificationConfigs",
            json!({"taskId": id, "pageSize": 1}),
        )
        .await,
    );
    assert_eq!(paged["configs"].as_array().map(Vec::len), Some(1));
    assert_ne!(paged["nextPageToken"], "");
    // Deliveries: Authorization and the token on every one, StreamResponse bodies.
    let hits = poll_until(Duration::from_secs(30), || async {
        let hits: Vec<_> = rx
            .hits()
            .into_iter()
            .filter(|h| h.headers.get("authorization").is_some())
            .collect();
        hits.iter()
            .any(|h| h.json()["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED")
            .then_some(hits)
    })
    .await;
    for h in &hits {
        assert_eq!(h.header("authorization"), "Bearer sekrit");
        assert_eq!(h.header("x-a2a-notification-token"), "tok-1");
        assert_eq!(h.header("content-type"), "application/a2a+json");
        assert_eq!(h.header("user-agent"), "a2ad-webhook/1.0");
        assert!(!h.header("x-webhook-delivery").is_empty());
    }
    let deleted = s
        .official(
            "slow",
            V1,
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": id, "id": config_id}),
        )
        .await;
    assert_eq!(s.result(deleted), json!({}));
    let again = s
        .official(
            "slow",
            V1,
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": id, "id": config_id}),
        )
        .await;
    assert!(again.get("error").is_none(), "idempotent: {again}");
    let gone = s
        .official(
            "slow",
            V1,
            "GetTaskPushNotificationConfig",
            json!({"taskId": id, "id": config_id}),
        )
        .await;
    assert_eq!(gone["error"]["code"], -32001);
    // Another principal's task, and an agent without webhooks.
    let other = s
        .official_as(
            BOB,
            "slow",
            V1,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "url": rx.url}),
        )
        .await;
    assert_eq!(other["error"]["code"], -32001);
    let quiet = s
        .official(
            "quiet",
            V1,
            "ListTaskPushNotificationConfigs",
            json!({"taskId": id}),
        )
        .await;
    assert_eq!(quiet["error"]["code"], -32003);
    assert_eq!(
        error_info(&quiet)["reason"],
        "PUSH_NOTIFICATION_NOT_SUPPORTED"
    );
    s.stop().await;
}

#[tokio::test]
async fn an_inline_config_gets_the_task_first_and_hmac_signs_without_authorization() {
    let s = server().await;
    let rx = Receiver::ok().await;
    let secret = "0123456789abcdef-secret";
    let out = s
        .official(
            "echo",
            V1,
            "SendMessage",
            json!({"message": message(V1, "hi", None),
                   "configuration": {"taskPushNotificationConfig": {
                       "url": rx.url,
                       "authentication": {"scheme": "HMAC-SHA256", "credentials": secret}}}}),
        )
        .await;
    let task = task_of(V1, &s.result(out));
    let hits = poll_until(Duration::from_secs(30), || async {
        let hits = rx.hits();
        hits.iter()
            .any(|h| h.json()["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED")
            .then_some(hits)
    })
    .await;
    let first = hits[0].json();
    assert_eq!(
        first["task"]["id"], task["id"],
        "the first delivery is the task"
    );
    for h in &hits {
        assert!(
            h.headers.get("authorization").is_none(),
            "the secret never travels"
        );
        let sig = h.header("x-webhook-signature");
        assert_eq!(sig, a2ad::signature(secret.as_bytes(), &h.body));
    }
    // Inline configs on an agent without webhooks: -32003, and no task.
    let out = s
        .official(
            "quiet",
            V1,
            "SendMessage",
            json!({"message": message(V1, "hi", None),
                   "configuration": {"taskPushNotificationConfig": {"url": rx.url}}}),
        )
        .await;
    assert_eq!(out["error"]["code"], -32003);
    s.stop().await;
}

#[tokio::test]
async fn an_interrupted_task_continues_and_a_subscriber_follows_its_next_run() {
    let s = server().await;
    let task = s
        .official_send(
            "tck",
            V1,
            message(V1, "need input", Some("tck-input-required")),
            true,
        )
        .await;
    assert_eq!(task["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    let id = task["id"].as_str().expect("id").to_string();
    let context = task["contextId"].clone();
    // Follow it while it waits.
    let resp = s
        .official_stream("tck", V1, "SubscribeToTask", json!({"id": id}))
        .await;
    let mut reader = SseReader::new(resp);
    let (_, first) = reader.next_event().await.expect("the current task");
    assert_eq!(
        first["result"]["task"]["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    // A different context is refused; the right one continues the task.
    let mut wrong = message(V1, "more", Some("tck-complete-task"));
    wrong["taskId"] = json!(id);
    wrong["contextId"] = json!("another-context");
    let out = s
        .official("tck", V1, "SendMessage", json!({"message": wrong}))
        .await;
    assert_eq!(out["error"]["code"], -32602);
    let mut more = message(V1, "more", Some("tck-complete-task"));
    more["taskId"] = json!(id);
    more["contextId"] = context;
    let done = task_of(
        V1,
        &s.result(
            s.official("tck", V1, "SendMessage", json!({"message": more.clone()}))
                .await,
        ),
    );
    assert_eq!(done["id"], json!(id));
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(texts(&done["status"]["message"]), ["Hello from TCK"]);
    let rest = reader.collect().await;
    let last = &rest.last().expect("events").1["result"];
    assert_eq!(
        last["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    // A terminal task takes no more messages.
    more["messageId"] = json!(support::new_id());
    let out = s
        .official("tck", V1, "SendMessage", json!({"message": more}))
        .await;
    assert_eq!(out["error"]["code"], -32004);
    s.stop().await;
}

#[tokio::test]
async fn a_direct_reply_is_a_message_on_send_and_a_one_frame_stream() {
    let s = server().await;
    let out = s
        .official(
            "tck",
            V1,
            "SendMessage",
            json!({"message": message(V1, "hi", Some("tck-message-response"))}),
        )
        .await;
    let result = s.result(out);
    let m = &result["message"];
    assert_eq!(m["role"], "ROLE_AGENT");
    assert_eq!(texts(m), ["Direct message response"]);
    assert!(m["contextId"].as_str().is_some_and(|c| !c.is_empty()));
    let events = s
        .official_events(
            "tck",
            V1,
            "SendStreamingMessage",
            json!({"message": message(V1, "hi", Some("tck-message-response"))}),
        )
        .await;
    assert_eq!(events.len(), 1);
    assert_eq!(texts(&events[0]["message"]), ["Direct message response"]);
    let list = s.result(s.official("tck", V1, "ListTasks", json!({})).await);
    assert_eq!(list["totalSize"], 0, "no task was made");
    s.stop().await;
}

#[tokio::test]
async fn the_extended_card_needs_a_key_and_has_the_1_0_shape() {
    let s = server().await;
    let card = s.result(
        s.official("echo", V1, "GetExtendedAgentCard", json!({}))
            .await,
    );
    assert_eq!(card["name"], "echo");
    assert_eq!(card["capabilities"]["extendedAgentCard"], true);
    let urls: Vec<&str> = card["supportedInterfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .map(|i| i["url"].as_str().expect("url"))
        .collect();
    assert_eq!(
        urls,
        [
            s.official_url("echo", V1),
            format!("{}/rest", s.url("echo")),
            s.addr(),
            s.official_url("echo", V::V03)
        ]
    );
    assert!(card.get("url").is_none(), "no 0.3 fields on the 1.0 card");
    s.stop().await;
}

#[tokio::test]
async fn artifacts_show_in_tasks_and_stream_as_chunked_updates() {
    let s = server().await;
    let task = s
        .official_send("tck", V1, message(V1, "x", Some("tck-artifact-text")), true)
        .await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    let artifact = &task["artifacts"][0];
    assert!(
        artifact["artifactId"]
            .as_str()
            .is_some_and(|a| !a.is_empty())
    );
    assert_eq!(
        artifact["parts"],
        json!([{"text": "Generated text content"}])
    );
    let file = s
        .official_send("tck", V1, message(V1, "x", Some("tck-artifact-file")), true)
        .await;
    assert_eq!(
        file["artifacts"][0]["parts"][0],
        json!({"raw": "dGNr", "filename": "output.txt", "mediaType": "text/plain"})
    );
    let data = s
        .official_send("tck", V1, message(V1, "x", Some("tck-artifact-data")), true)
        .await;
    assert_eq!(
        data["artifacts"][0]["parts"][0]["data"],
        json!({"key": "value", "count": 42})
    );
    // ListTasks shows artifacts only when asked.
    let listed = s.result(
        s.official("tck", V1, "ListTasks", json!({"includeArtifacts": true}))
            .await,
    );
    assert!(
        listed["tasks"]
            .as_array()
            .expect("tasks")
            .iter()
            .all(|t| t.get("artifacts").is_some())
    );
    // A chunked artifact streams as two updates of the same artifact.
    let events = s
        .official_events(
            "tck",
            V1,
            "SendStreamingMessage",
            json!({"message": message(V1, "x", Some("tck-stream-artifact-chunked"))}),
        )
        .await;
    let chunks: Vec<&Value> = events
        .iter()
        .filter_map(|e| e.get("artifactUpdate"))
        .collect();
    assert_eq!(chunks.len(), 2, "{events:?}");
    assert_eq!(
        chunks[0]["artifact"]["artifactId"],
        chunks[1]["artifact"]["artifactId"]
    );
    assert_eq!(
        chunks[0]["artifact"]["parts"],
        json!([{"text": "chunk-1 "}])
    );
    assert!(chunks[0].get("append").is_none());
    assert_eq!(
        (chunks[1]["append"].clone(), chunks[1]["lastChunk"].clone()),
        (json!(true), json!(true))
    );
    let last = events.last().expect("events");
    assert_eq!(
        last["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    // The rejected scenario ends rejected, with the agent's message.
    let rejected = s
        .official_send("tck", V1, message(V1, "x", Some("tck-reject-task")), true)
        .await;
    assert_eq!(rejected["status"]["state"], "TASK_STATE_REJECTED");
    assert_eq!(texts(&rejected["status"]["message"]), ["rejected"]);
    s.stop().await;
}

#[tokio::test]
async fn another_key_finds_none_of_alices_tasks_on_any_official_method() {
    let s = server().await;
    let rx = Receiver::ok().await;
    for v in [V::V10, V::V03] {
        let task = s
            .official_send("stuck", v, message(v, "mine", None), false)
            .await;
        let id = task["id"].clone();
        let mut continuing = message(v, "yours?", None);
        continuing["taskId"] = id.clone();
        let calls: Vec<(&str, Value)> = match v {
            V::V10 => vec![
                ("SendMessage", json!({"message": continuing})),
                ("GetTask", json!({"id": id})),
                ("CancelTask", json!({"id": id})),
                ("SubscribeToTask", json!({"id": id})),
                (
                    "CreateTaskPushNotificationConfig",
                    json!({"taskId": id, "url": rx.url}),
                ),
                (
                    "GetTaskPushNotificationConfig",
                    json!({"taskId": id, "id": "x"}),
                ),
                ("ListTaskPushNotificationConfigs", json!({"taskId": id})),
                (
                    "DeleteTaskPushNotificationConfig",
                    json!({"taskId": id, "id": "x"}),
                ),
            ],
            V::V03 => vec![
                ("message/send", json!({"message": continuing})),
                ("tasks/get", json!({"id": id})),
                ("tasks/cancel", json!({"id": id})),
                ("tasks/resubscribe", json!({"id": id})),
                (
                    "tasks/pushNotificationConfig/set",
                    json!({"taskId": id, "pushNotificationConfig": {"url": rx.url}}),
                ),
                ("tasks/pushNotificationConfig/get", json!({"id": id})),
                ("tasks/pushNotificationConfig/list", json!({"id": id})),
                (
                    "tasks/pushNotificationConfig/delete",
                    json!({"id": id, "pushNotificationConfigId": "x"}),
                ),
            ],
        };
        for (method, params) in calls {
            let out = s.official_as(BOB, "stuck", v, method, params).await;
            assert_eq!(out["error"]["code"], -32001, "{v:?} {method}: {out}");
        }
        if v == V::V10 {
            let listed = s.result(s.official_as(BOB, "stuck", v, "ListTasks", json!({})).await);
            assert_eq!(listed["totalSize"], 0);
        }
        // Alice's task is untouched.
        let mine = s.result(s.official("stuck", v, v.get(), json!({"id": id})).await);
        assert_ne!(mine["status"]["state"], v.state("canceled"));
    }
    s.stop().await;
}
