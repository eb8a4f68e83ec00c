//! One behaviour, several framings (DIALECTS.md §11; S10 §5.1): the same scenario over
//! A2A 1.0 JSON-RPC (`…/jsonrpc/v1`), the HTTP+JSON binding (`…/rest/…`) and gRPC
//! (`lf.a2a.v1.A2AService` on the same port), each on a server of its own, must give the
//! same results and the same errors. Then what only one framing has: HTTP statuses, paths
//! and methods, content types, `Last-Event-ID` resume, tenants, CORS, metrics, gRPC
//! metadata and codes.

use crate::support;

use std::time::Duration;

use a2ad::proto::{self as pb, a2a_service_client::A2aServiceClient};
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use support::receiver::Receiver;
use support::{ALICE, BOB, CAROL, SseReader, TestServer, agent, config, metric, new_id, texts};

/// How a call is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum B {
    JsonRpc,
    Rest,
    Grpc,
}

/// A call's outcome, framing aside: the result, or the error's `ErrorInfo` (reason and
/// metadata) and status (HTTP, or on gRPC the status code's number).
#[derive(Debug)]
pub(crate) enum Out {
    Ok(Value),
    Err {
        status: u16,
        info: Value,
        body: Value,
    },
}

impl Out {
    #[track_caller]
    pub(crate) fn ok(self) -> Value {
        match self {
            Out::Ok(v) => v,
            Out::Err { body, .. } => panic!("unexpected error: {body}"),
        }
    }

    #[track_caller]
    pub(crate) fn reason(&self) -> &str {
        match self {
            Out::Err { info, .. } => info["reason"].as_str().expect("reason"),
            Out::Ok(v) => panic!("expected an error, got {v}"),
        }
    }

    /// For transcripts: the result, or the reason and metadata of the error.
    fn neutral(&self) -> Value {
        match self {
            Out::Ok(v) => json!({"ok": v}),
            Out::Err { info, .. } => json!({"error": info["reason"], "metadata": info["metadata"]}),
        }
    }
}

/// echo (instant), slow (progress, 1.5 s), quiet (no webhooks, no streaming), tight (one
/// request a minute); bodies capped at 64 KiB.
async fn server() -> TestServer {
    let mut c = config(&["echo"]);
    let mut slow = agent("slow");
    slow.echo.delay_ms = 1_500;
    slow.echo.progress_steps = 2;
    let mut quiet = agent("quiet");
    quiet.webhooks = false;
    quiet.streaming = Some(false);
    let mut tight = agent("tight");
    tight.limits.requests_per_minute = 1;
    c.agents.extend([slow, quiet, tight]);
    c.server.max_body_bytes = Some(64 * 1024);
    TestServer::start(c).await
}

fn rest_url(s: &TestServer, agent: &str) -> String {
    format!("{}/rest", s.url(agent))
}

/// The params fields a REST path carries, by operation: (task id field, config id field).
fn path_fields(op: &str) -> (&'static str, &'static str) {
    match op {
        "GetTask" | "CancelTask" | "SubscribeToTask" => ("id", ""),
        _ => ("taskId", "id"),
    }
}

/// The REST request of an operation given JSON-RPC params: method, path, query, body.
fn rest_request(
    op: &str,
    params: &Value,
) -> (
    reqwest::Method,
    String,
    Vec<(String, String)>,
    Option<Value>,
) {
    use reqwest::Method;
    let (task_field, config_field) = path_fields(op);
    let task = params[task_field].as_str().unwrap_or("").to_string();
    let config = params[config_field].as_str().unwrap_or("").to_string();
    let rest: Vec<(String, String)> = params
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| {
                    *k != task_field && (config_field.is_empty() || *k != config_field)
                })
                .map(|(k, v)| {
                    let text = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    (k.clone(), text)
                })
                .collect()
        })
        .unwrap_or_default();
    let body = || {
        let mut b = params.clone();
        if let Some(o) = b.as_object_mut() {
            o.remove(task_field);
        }
        Some(b)
    };
    match op {
        "SendMessage" => (
            Method::POST,
            "/message:send".into(),
            vec![],
            Some(params.clone()),
        ),
        "SendStreamingMessage" => (
            Method::POST,
            "/message:stream".into(),
            vec![],
            Some(params.clone()),
        ),
        "GetTask" => (Method::GET, format!("/tasks/{task}"), rest, None),
        "ListTasks" => (Method::GET, "/tasks".into(), rest, None),
        "CancelTask" => (
            Method::POST,
            format!("/tasks/{task}:cancel"),
            vec![],
            body(),
        ),
        "SubscribeToTask" => (
            Method::GET,
            format!("/tasks/{task}:subscribe"),
            vec![],
            None,
        ),
        "CreateTaskPushNotificationConfig" => (
            Method::POST,
            format!("/tasks/{task}/pushNotificationConfigs"),
            vec![],
            body(),
        ),
        "GetTaskPushNotificationConfig" => (
            Method::GET,
            format!("/tasks/{task}/pushNotificationConfigs/{config}"),
            rest,
            None,
        ),
        "ListTaskPushNotificationConfigs" => (
            Method::GET,
            format!("/tasks/{task}/pushNotificationConfigs"),
            rest,
            None,
        ),
        "DeleteTaskPushNotificationConfig" => (
            Method::DELETE,
            format!("/tasks/{task}/pushNotificationConfigs/{config}"),
            rest,
            None,
        ),
        "GetExtendedAgentCard" => (Method::GET, "/extendedAgentCard".into(), vec![], None),
        other => panic!("no REST form for {other}"),
    }
}

/// A gRPC client of the server (HTTP/2 on its one port).
pub(crate) async fn grpc(s: &TestServer) -> A2aServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(s.base.clone())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    A2aServiceClient::new(channel)
}

/// A gRPC request: the params as the message (ProtoJSON), the agent as its tenant, the key
/// and version as metadata.
pub(crate) fn grpc_request<T: serde::de::DeserializeOwned>(
    key: &str,
    agent: &str,
    params: &Value,
    last_event_id: Option<u64>,
) -> tonic::Request<T> {
    let mut p = params.clone();
    p["tenant"] = json!(agent);
    let msg: T = serde_json::from_value(p).expect("params fit the message");
    let mut req = tonic::Request::new(msg);
    let md = req.metadata_mut();
    md.insert("x-api-key", key.parse().expect("key"));
    md.insert("a2a-version", "1.0".parse().expect("version"));
    if let Some(n) = last_event_id {
        md.insert("a2a-last-event-id", n.to_string().parse().expect("id"));
    }
    req
}

/// A gRPC error as an outcome: its code's number, its `ErrorInfo`.
pub(crate) fn grpc_error(st: &tonic::Status) -> Out {
    use tonic_types::StatusExt as _;
    let details = st.get_error_details();
    let info = details.error_info().map_or(Value::Null, |i| {
        json!({"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": i.reason,
               "domain": i.domain, "metadata": i.metadata})
    });
    Out::Err {
        status: st.code() as u16,
        info,
        body: json!({"code": st.code() as i32, "message": st.message()}),
    }
}

/// One gRPC call of an operation (unary) as `key`.
async fn grpc_call(s: &TestServer, key: &str, agent: &str, op: &str, params: &Value) -> Out {
    let mut c = grpc(s).await;
    macro_rules! unary {
        ($method:ident) => {
            match c.$method(grpc_request(key, agent, params, None)).await {
                Ok(r) => Out::Ok(serde_json::to_value(r.into_inner()).expect("json")),
                Err(st) => grpc_error(&st),
            }
        };
    }
    match op {
        "SendMessage" => unary!(send_message),
        "GetTask" => unary!(get_task),
        "ListTasks" => unary!(list_tasks),
        "CancelTask" => unary!(cancel_task),
        "CreateTaskPushNotificationConfig" => unary!(create_task_push_notification_config),
        "GetTaskPushNotificationConfig" => unary!(get_task_push_notification_config),
        "ListTaskPushNotificationConfigs" => unary!(list_task_push_notification_configs),
        "DeleteTaskPushNotificationConfig" => unary!(delete_task_push_notification_config),
        "GetExtendedAgentCard" => unary!(get_extended_agent_card),
        other => panic!("no unary gRPC call {other}"),
    }
}

/// One call over a binding as `key`.
pub(crate) async fn call_as(
    s: &TestServer,
    b: B,
    key: &str,
    agent: &str,
    op: &str,
    params: Value,
) -> Out {
    if b == B::Grpc {
        return grpc_call(s, key, agent, op, &params).await;
    }
    let resp = match b {
        B::Grpc => unreachable!("answered above"),
        B::JsonRpc => s
            .client
            .post(format!("{}/jsonrpc/v1", s.url(agent)))
            .header("content-type", "application/json")
            .header("a2a-version", "1.0")
            .header("x-api-key", key)
            .body(json!({"jsonrpc": "2.0", "id": 1, "method": op, "params": params}).to_string())
            .send()
            .await
            .expect("request"),
        B::Rest => {
            let (method, path, query, body) = rest_request(op, &params);
            let query: String = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(&query)
                .finish();
            let sep = if query.is_empty() { "" } else { "?" };
            let mut req = s
                .client
                .request(method, format!("{}{path}{sep}{query}", rest_url(s, agent)))
                .header("a2a-version", "1.0")
                .header("x-api-key", key);
            if let Some(body) = body {
                req = req
                    .header("content-type", "application/json")
                    .body(body.to_string());
            }
            req.send().await.expect("request")
        }
    };
    let status = resp.status().as_u16();
    let ct = resp.headers()["content-type"]
        .to_str()
        .expect("ct")
        .to_string();
    let bytes = resp.bytes().await.expect("body");
    let body: Value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("not JSON ({status}): {}", String::from_utf8_lossy(&bytes)));
    match b {
        B::JsonRpc => {
            assert_eq!(ct, "application/json");
            match body.get("error") {
                None => {
                    assert_eq!(status, 200, "{body}");
                    Out::Ok(body["result"].clone())
                }
                Some(e) => Out::Err {
                    status,
                    info: e["data"][0].clone(),
                    body: body.clone(),
                },
            }
        }
        B::Grpc => unreachable!("answered above"),
        B::Rest => {
            assert_eq!(ct, "application/a2a+json", "{body}");
            if status == 200 {
                assert!(body.get("error").is_none(), "{body}");
                return Out::Ok(body);
            }
            let e = &body["error"];
            assert_eq!(
                e["code"], status,
                "google.rpc.Status code is the HTTP status: {body}"
            );
            assert!(
                e["status"].is_string() && e["message"].is_string(),
                "{body}"
            );
            let info = e["details"][0].clone();
            assert_eq!(
                info["@type"], "type.googleapis.com/google.rpc.ErrorInfo",
                "{body}"
            );
            assert_eq!(info["domain"], "a2a-protocol.org");
            Out::Err { status, info, body }
        }
    }
}

pub(crate) async fn call(s: &TestServer, b: B, agent: &str, op: &str, params: Value) -> Out {
    call_as(s, b, ALICE, agent, op, params).await
}

/// A streaming call's events (the `StreamResponse`s), or its error before the stream.
pub(crate) async fn stream(
    s: &TestServer,
    b: B,
    agent: &str,
    op: &str,
    params: Value,
    last_event_id: Option<u64>,
) -> Result<Vec<(Option<u64>, Value)>, Out> {
    if b == B::Grpc {
        let mut c = grpc(s).await;
        let opened = match op {
            "SendStreamingMessage" => {
                c.send_streaming_message(grpc_request::<pb::SendMessageRequest>(
                    ALICE,
                    agent,
                    &params,
                    last_event_id,
                ))
                .await
            }
            "SubscribeToTask" => {
                c.subscribe_to_task(grpc_request::<pb::SubscribeToTaskRequest>(
                    ALICE,
                    agent,
                    &params,
                    last_event_id,
                ))
                .await
            }
            other => panic!("no streaming gRPC call {other}"),
        };
        let mut stream = opened.map_err(|st| grpc_error(&st))?.into_inner();
        let mut events = Vec::new();
        loop {
            match stream.message().await {
                Ok(Some(e)) => events.push((None, serde_json::to_value(e).expect("json"))),
                Ok(None) => break,
                // An error before the first event is the call's error (as on the others).
                Err(st) if events.is_empty() => return Err(grpc_error(&st)),
                Err(st) => panic!("stream failed mid-way: {st}"),
            }
        }
        return Ok(events);
    }
    let resp = match b {
        B::Grpc => unreachable!("answered above"),
        B::JsonRpc => s
            .client
            .post(format!("{}/jsonrpc/v1", s.url(agent)))
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .header("a2a-version", "1.0")
            .header("x-api-key", ALICE)
            .body(json!({"jsonrpc": "2.0", "id": "s", "method": op, "params": params}).to_string())
            .send()
            .await
            .expect("request"),
        B::Rest => {
            let (method, path, _, body) = rest_request(op, &params);
            let mut req = s
                .client
                .request(method, format!("{}{path}", rest_url(s, agent)))
                .header("accept", "text/event-stream")
                .header("a2a-version", "1.0")
                .header("x-api-key", ALICE);
            if let Some(n) = last_event_id {
                req = req.header("last-event-id", n.to_string());
            }
            if let Some(body) = body {
                req = req
                    .header("content-type", "application/json")
                    .body(body.to_string());
            }
            req.send().await.expect("request")
        }
    };
    if resp.headers()["content-type"] != "text/event-stream" {
        let status = resp.status().as_u16();
        let body: Value = serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
        let info = match b {
            B::JsonRpc => body["error"]["data"][0].clone(),
            B::Rest | B::Grpc => body["error"]["details"][0].clone(),
        };
        return Err(Out::Err { status, info, body });
    }
    let events = SseReader::new(resp).collect().await;
    Ok(events
        .into_iter()
        .map(|(id, data)| match b {
            B::JsonRpc => {
                assert_eq!(data["id"], "s");
                (id, data["result"].clone())
            }
            B::Rest | B::Grpc => {
                assert!(data.get("jsonrpc").is_none(), "no envelope: {data}");
                (id, data)
            }
        })
        .collect())
}

/// Starts a task on the slow agent without waiting; its id.
async fn start_slow(s: &TestServer, b: B, text: &str) -> String {
    let out = call(
        s,
        b,
        "slow",
        "SendMessage",
        json!({"message": msg(text), "configuration": {"returnImmediately": true}}),
    )
    .await;
    out.ok()["task"]["id"].as_str().expect("id").to_string()
}

fn msg(text: &str) -> Value {
    json!({"messageId": new_id(), "role": "ROLE_USER", "parts": [{"text": text}]})
}

/// Ids, times and the addresses of the server and the receiver (`base`, `hook`) made
/// comparable between two runs.
fn normalize(v: &Value, base: &(&str, &str)) -> Value {
    match v {
        Value::String(s) => {
            let is_uuid = s.len() == 36 && s.chars().filter(|c| *c == '-').count() == 4;
            // (A gRPC client's ProtoJSON may write `+00:00` for `Z`.)
            let is_time = (20..=35).contains(&s.len())
                && (s.ends_with('Z') || s.ends_with("+00:00"))
                && s.as_bytes().get(10) == Some(&b'T')
                && s.as_bytes().get(4) == Some(&b'-');
            if is_uuid {
                json!("<id>")
            } else if is_time {
                json!("<time>")
            } else {
                let addr = base.0.trim_start_matches("http://");
                json!(
                    s.replace(base.0, "<base>")
                        .replace(base.1, "<hook>")
                        .replace(addr, "<addr>")
                )
            }
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| normalize(x, base)).collect()),
        // ProtoJSON may omit a field at its default value (a gRPC message decoded and
        // written again does): an empty string or list is the same as none.
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(_, x)| {
                    x.as_str() != Some("") && x.as_array().is_none_or(|a| !a.is_empty())
                })
                .map(|(k, x)| {
                    let x = if k == "nextPageToken" && x.as_str().is_some_and(|t| !t.is_empty()) {
                        json!("<token>")
                    } else {
                        normalize(x, base)
                    };
                    (k.clone(), x)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Waits until a task reaches `state` (its 1.0 name).
async fn until_state(s: &TestServer, b: B, task: &str, state: &str) -> Value {
    support::poll_until(Duration::from_secs(30), || async {
        let t = call(s, b, "slow", "GetTask", json!({"id": task}))
            .await
            .ok();
        (t["status"]["state"] == state).then_some(t)
    })
    .await
}

/// The scenario: every operation and every error kind, as a transcript of neutral outcomes
/// (with the HTTP status of each error beside it).
async fn scenario(b: B) -> Vec<Value> {
    let s = server().await;
    let receiver = Receiver::ok().await;
    let mut log = Vec::new();
    // Expected statuses: (JSON-RPC HTTP, REST HTTP, gRPC code).
    let mut note = |what: &str, out: &Out, status_expected: Option<(u16, u16, tonic::Code)>| {
        if let (Out::Err { status, .. }, Some((rpc, rest, code))) = (out, status_expected) {
            let want = match b {
                B::JsonRpc => rpc,
                B::Rest => rest,
                B::Grpc => code as u16,
            };
            assert_eq!(*status, want, "{what} over {b:?}: {out:?}");
        }
        let addresses = (s.base.as_str(), receiver.url.as_str());
        log.push(json!({"step": what, "out": normalize(&out.neutral(), &addresses)}));
    };

    // send, get (history lengths), list (filters, paging)
    let sent = call(&s, b, "echo", "SendMessage", json!({"message": msg("hi")})).await;
    let task = sent.ok()["task"].clone();
    assert_eq!(texts(&task["status"]["message"]), ["echo: hi", "turn 1"]);
    let id = task["id"].as_str().expect("id").to_string();
    let context = task["contextId"].as_str().expect("ctx").to_string();
    note("send", &Out::Ok(task.clone()), None);
    let second = call(
        &s,
        b,
        "echo",
        "SendMessage",
        json!({"message": {"messageId": new_id(), "role": "ROLE_USER", "contextId": context,
                            "parts": [{"text": "again"}]}}),
    )
    .await;
    note("continue", &second, None);
    for h in [0, 1] {
        let got = call(
            &s,
            b,
            "echo",
            "GetTask",
            json!({"id": id, "historyLength": h}),
        )
        .await;
        note(&format!("get h={h}"), &got, None);
    }
    let all = call(&s, b, "echo", "ListTasks", json!({"contextId": context})).await;
    assert_eq!(all.neutral()["ok"]["totalSize"], 2);
    note("list by context", &all, None);
    let page = call(
        &s,
        b,
        "echo",
        "ListTasks",
        json!({"status": "TASK_STATE_COMPLETED", "pageSize": 1, "includeArtifacts": true}),
    )
    .await
    .ok();
    let token = page["nextPageToken"].as_str().expect("token").to_string();
    assert!(!token.is_empty());
    note("list page 1", &Out::Ok(page), None);
    let next = call(
        &s,
        b,
        "echo",
        "ListTasks",
        json!({"pageSize": 1, "pageToken": token}),
    )
    .await;
    note("list page 2", &next, None);

    // stream; subscribe to a finished task
    let events = stream(
        &s,
        b,
        "echo",
        "SendStreamingMessage",
        json!({"message": msg("yo")}),
        None,
    )
    .await
    .expect("stream");
    let ids: Vec<Option<u64>> = events.iter().map(|(id, _)| *id).collect();
    if b == B::Grpc {
        assert_eq!(ids, [None, None, None], "gRPC events carry no ids");
    } else {
        assert_eq!(ids, [Some(1), Some(2), Some(3)]);
    }
    note(
        "stream",
        &Out::Ok(Value::Array(events.into_iter().map(|(_, e)| e).collect())),
        None,
    );
    let finished = stream(&s, b, "echo", "SubscribeToTask", json!({"id": id}), None)
        .await
        .expect_err("terminal");
    note(
        "subscribe finished",
        &finished,
        Some((200, 400, tonic::Code::FailedPrecondition)),
    );

    // a running task: subscribe, cancel, cancel again
    let slow_id = start_slow(&s, b, "wait").await;
    until_state(&s, b, &slow_id, "TASK_STATE_WORKING").await;
    let followed = stream(
        &s,
        b,
        "slow",
        "SubscribeToTask",
        json!({"id": slow_id}),
        None,
    )
    .await
    .expect("subscribe");
    assert_eq!(
        followed[0].1["task"]["id"],
        slow_id.as_str(),
        "the task first"
    );
    let last = &followed.last().expect("events").1;
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{followed:?}"
    );
    let cancel_me = start_slow(&s, b, "stop me").await;
    let canceled = call(
        &s,
        b,
        "slow",
        "CancelTask",
        json!({"id": cancel_me, "metadata": {"reason": "enough"}}),
    )
    .await;
    assert_eq!(
        canceled.neutral()["ok"]["status"]["state"],
        "TASK_STATE_CANCELED"
    );
    note("cancel", &canceled, None);
    let again = call(&s, b, "slow", "CancelTask", json!({"id": cancel_me})).await;
    note(
        "cancel again",
        &again,
        Some((200, 400, tonic::Code::FailedPrecondition)),
    );

    // push configurations
    let created = call(
        &s,
        b,
        "echo",
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id, "id": "c1", "url": receiver.url, "token": "tok"}),
    )
    .await;
    note("push create", &created, None);
    for (what, op, params) in [
        (
            "push get",
            "GetTaskPushNotificationConfig",
            json!({"taskId": id, "id": "c1"}),
        ),
        (
            "push list",
            "ListTaskPushNotificationConfigs",
            json!({"taskId": id}),
        ),
        (
            "push list paged",
            "ListTaskPushNotificationConfigs",
            json!({"taskId": id, "pageSize": 1}),
        ),
        (
            "push delete",
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": id, "id": "c1"}),
        ),
    ] {
        let out = call(&s, b, "echo", op, params).await;
        note(what, &out, None);
    }
    let gone = call(
        &s,
        b,
        "echo",
        "GetTaskPushNotificationConfig",
        json!({"taskId": id, "id": "c1"}),
    )
    .await;
    note(
        "push get deleted",
        &gone,
        Some((200, 404, tonic::Code::NotFound)),
    );

    // the extended card
    let card = call(&s, b, "echo", "GetExtendedAgentCard", json!({})).await;
    note("card", &card, None);

    // every error kind
    let unknown = call(&s, b, "echo", "GetTask", json!({"id": "no-such-task"})).await;
    note(
        "unknown task",
        &unknown,
        Some((200, 404, tonic::Code::NotFound)),
    );
    let foreign = call_as(&s, b, BOB, "echo", "GetTask", json!({"id": id})).await;
    note(
        "another principal's task",
        &foreign,
        Some((200, 404, tonic::Code::NotFound)),
    );
    let negative = call(
        &s,
        b,
        "echo",
        "GetTask",
        json!({"id": id, "historyLength": -1}),
    )
    .await;
    note(
        "bad params: historyLength",
        &negative,
        Some((200, 400, tonic::Code::InvalidArgument)),
    );
    let no_message = call(&s, b, "echo", "SendMessage", json!({"configuration": {}})).await;
    note(
        "bad params: no message",
        &no_message,
        Some((200, 400, tonic::Code::InvalidArgument)),
    );
    let bad_key = call_as(
        &s,
        b,
        "not-a-key-0123456789",
        "echo",
        "GetTask",
        json!({"id": id}),
    )
    .await;
    note(
        "bad key",
        &bad_key,
        Some((401, 401, tonic::Code::Unauthenticated)),
    );
    let forbidden = call_as(&s, b, CAROL, "slow", "GetTask", json!({"id": id})).await;
    note(
        "agent not allowed",
        &forbidden,
        Some((403, 403, tonic::Code::PermissionDenied)),
    );
    let no_agent = call(&s, b, "nobody", "GetTask", json!({"id": id})).await;
    note(
        "unknown agent",
        &no_agent,
        Some((404, 404, tonic::Code::NotFound)),
    );
    let no_push = call(
        &s,
        b,
        "quiet",
        "ListTaskPushNotificationConfigs",
        json!({"taskId": id}),
    )
    .await;
    note(
        "push not supported",
        &no_push,
        Some((200, 400, tonic::Code::FailedPrecondition)),
    );
    let no_stream = stream(
        &s,
        b,
        "quiet",
        "SendStreamingMessage",
        json!({"message": msg("x")}),
        None,
    )
    .await
    .expect_err("not streaming");
    note(
        "streaming not supported",
        &no_stream,
        Some((200, 400, tonic::Code::FailedPrecondition)),
    );
    let first = call(&s, b, "tight", "GetTask", json!({"id": id})).await;
    note(
        "tight: first",
        &first,
        Some((200, 404, tonic::Code::NotFound)),
    );
    let limited = call(&s, b, "tight", "GetTask", json!({"id": id})).await;
    note(
        "rate limited",
        &limited,
        Some((429, 429, tonic::Code::ResourceExhausted)),
    );
    let big = "x".repeat(80 * 1024);
    let too_large = call(&s, b, "echo", "SendMessage", json!({"message": msg(&big)})).await;
    note(
        "body too large",
        &too_large,
        Some((413, 413, tonic::Code::ResourceExhausted)),
    );

    drop(receiver);
    s.stop().await;
    log
}

#[tokio::test]
async fn json_rpc_http_json_and_grpc_give_the_same_results_and_errors() {
    let (rpc, rest, grpc) =
        tokio::join!(scenario(B::JsonRpc), scenario(B::Rest), scenario(B::Grpc));
    assert_eq!(rpc.len(), rest.len());
    assert_eq!(rpc.len(), grpc.len());
    for ((a, b), c) in rpc.iter().zip(&rest).zip(&grpc) {
        assert_eq!(a, b, "JSON-RPC and HTTP+JSON differ");
        assert_eq!(a, c, "JSON-RPC and gRPC differ");
    }
}

/// A GET, POST or DELETE on the REST binding with headers; status, headers, JSON body.
async fn rest_raw(
    s: &TestServer,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = s.client.request(method, format!("{}{path}", s.url("echo")));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.body(b.to_string());
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.expect("body");
    let json = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&bytes)))
    };
    (status, headers, json)
}

const AUTH: (&str, &str) = ("x-api-key", ALICE);
const VERSION: (&str, &str) = ("a2a-version", "1.0");

#[tokio::test]
async fn rest_paths_methods_content_types_tenants_and_cors() {
    use reqwest::Method;
    let s = server().await;
    let send = json!({"message": msg("hi")}).to_string();
    // Under the agent's own tenant, and bare.
    let (st, h, out) = rest_raw(
        &s,
        Method::POST,
        "/rest/echo/message:send",
        &[AUTH, VERSION, ("content-type", "application/a2a+json")],
        Some(&send),
    )
    .await;
    assert_eq!(st, 200, "{out}");
    assert_eq!(h["content-type"], "application/a2a+json");
    assert_eq!(h["access-control-allow-origin"], "*");
    let id = out["task"]["id"].as_str().expect("id").to_string();
    let (st, _, out) = rest_raw(
        &s,
        Method::GET,
        &format!("/rest/echo/tasks/{id}"),
        &[AUTH, VERSION],
        None,
    )
    .await;
    assert_eq!((st, out["id"].as_str()), (200, Some(id.as_str())));
    // Another tenant: a bad param, not another agent.
    let (st, _, out) = rest_raw(
        &s,
        Method::GET,
        &format!("/rest/slow/tasks/{id}"),
        &[AUTH, VERSION],
        None,
    )
    .await;
    assert_eq!(st, 400, "{out}");
    assert_eq!(out["error"]["details"][0]["reason"], "INVALID_PARAMS");
    assert_eq!(
        out["error"]["details"][1]["fieldViolations"][0]["field"],
        "tenant"
    );
    // Unknown path: 404 with its ErrorInfo; known path, other method: 405 with Allow.
    let (st, _, out) = rest_raw(
        &s,
        Method::GET,
        "/rest/nothing/here/at/all",
        &[AUTH, VERSION],
        None,
    )
    .await;
    assert_eq!(st, 404);
    assert_eq!(out["error"]["details"][0]["reason"], "METHOD_NOT_FOUND");
    let (st, h, out) = rest_raw(
        &s,
        Method::DELETE,
        "/rest/message:send",
        &[AUTH, VERSION],
        None,
    )
    .await;
    assert_eq!(st, 405, "{out}");
    assert_eq!(h["allow"], "POST, OPTIONS");
    assert_eq!(out["error"]["code"], 405);
    // Content types: a declared non-JSON type, or a body with none, is 415.
    for headers in [
        vec![AUTH, VERSION, ("content-type", "text/plain")],
        vec![AUTH, VERSION],
    ] {
        let (st, _, out) = rest_raw(
            &s,
            Method::POST,
            "/rest/message:send",
            &headers,
            Some(&send),
        )
        .await;
        assert_eq!(st, 415, "{out}");
        assert_eq!(
            out["error"]["details"][0]["reason"],
            "CONTENT_TYPE_NOT_SUPPORTED"
        );
    }
    // Malformed JSON: 400 with PARSE_ERROR; a body that is not an object: INVALID_REQUEST.
    let (st, _, out) = rest_raw(
        &s,
        Method::POST,
        &format!("/rest/tasks/{id}:cancel"),
        &[AUTH, VERSION, ("content-type", "application/json")],
        Some("{\"id\":"),
    )
    .await;
    assert_eq!(
        (st, out["error"]["details"][0]["reason"].as_str()),
        (400, Some("PARSE_ERROR"))
    );
    let (st, _, out) = rest_raw(
        &s,
        Method::POST,
        "/rest/message:send",
        &[AUTH, VERSION, ("content-type", "application/json")],
        Some("[1,2]"),
    )
    .await;
    assert_eq!(st, 400, "{out}");
    // An empty cancel body is a cancel (the official JS client sends none).
    let slow =
        json!({"message": msg("x"), "configuration": {"returnImmediately": true}}).to_string();
    let (_, _, out) = rest_raw(
        &s,
        Method::POST,
        "/rest/message:send",
        &[AUTH, VERSION, ("content-type", "application/json")],
        Some(&slow),
    )
    .await;
    let done = out["task"]["id"].as_str().expect("id").to_string();
    let (st, _, out) = rest_raw(
        &s,
        Method::POST,
        &format!("/rest/tasks/{done}:cancel"),
        &[AUTH, VERSION],
        None,
    )
    .await;
    assert!(st == 200 || st == 400, "{out}");
    // The version is checked as on /jsonrpc/v1 (header or query parameter).
    let (st, _, out) = rest_raw(&s, Method::GET, "/rest/tasks", &[AUTH], None).await;
    assert_eq!(st, 400);
    assert_eq!(
        out["error"]["details"][0]["reason"],
        "VERSION_NOT_SUPPORTED"
    );
    let (st, _, _) = rest_raw(
        &s,
        Method::GET,
        "/rest/tasks?A2A-Version=1.0",
        &[AUTH],
        None,
    )
    .await;
    assert_eq!(st, 200);
    // CORS preflight, no key.
    let resp = s
        .client
        .request(
            Method::OPTIONS,
            format!("{}/rest/tasks/x:cancel", s.url("echo")),
        )
        .send()
        .await
        .expect("options");
    assert_eq!(resp.status().as_u16(), 204);
    let allowed = resp.headers()["access-control-allow-methods"]
        .to_str()
        .expect("m")
        .to_string();
    for m in ["GET", "POST", "DELETE"] {
        assert!(allowed.contains(m), "{allowed}");
    }
    // Metrics count the binding.
    let text = s.scrape().await;
    assert!(
        metric(
            &text,
            r#"a2ad_requests_total{dialect="a2a-1.0",binding="rest",method="SendMessage",outcome="ok"}"#
        ) >= 1.0,
        "{text}"
    );
    assert!(
        metric(
            &text,
            r#"a2ad_requests_total{dialect="a2a-1.0",binding="rest",method="invalid",outcome="-32602"}"#
        ) >= 1.0
    );
    s.stop().await;
}

#[tokio::test]
async fn rest_subscribe_resumes_after_last_event_id_without_gap_or_duplicate() {
    let s = server().await;
    let task = start_slow(&s, B::Rest, "wait").await;
    // Read the first two frames of a subscription, then drop it.
    let resp = s
        .client
        .get(format!("{}/tasks/{task}:subscribe", rest_url(&s, "slow")))
        .header("a2a-version", "1.0")
        .header("x-api-key", ALICE)
        .send()
        .await
        .expect("subscribe");
    let mut reader = SseReader::new(resp);
    let (first, _) = reader.next_event().await.expect("first");
    let first = first.expect("numbered");
    drop(reader);
    // Resume after it: every later event once, in order, to the final one.
    let rest = stream(
        &s,
        B::Rest,
        "slow",
        "SubscribeToTask",
        json!({"id": task}),
        Some(first),
    )
    .await
    .expect("resume");
    let seqs: Vec<u64> = rest.iter().map(|(id, _)| id.expect("numbered")).collect();
    assert!(!seqs.is_empty());
    assert_eq!(seqs[0], first + 1, "no gap: {seqs:?}");
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "no duplicate: {seqs:?}"
    );
    let last = &rest.last().expect("events").1;
    assert_eq!(
        last["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    let final_seq = *seqs.last().expect("seq");
    // After the end: what was missed is replayed; nothing missed is an error.
    let replay = stream(
        &s,
        B::Rest,
        "slow",
        "SubscribeToTask",
        json!({"id": task}),
        Some(final_seq - 1),
    )
    .await
    .expect("replay");
    assert_eq!(
        replay.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        [Some(final_seq)]
    );
    let done = stream(
        &s,
        B::Rest,
        "slow",
        "SubscribeToTask",
        json!({"id": task}),
        Some(final_seq),
    )
    .await
    .expect_err("nothing left");
    assert_eq!(done.reason(), "UNSUPPORTED_OPERATION");
    let bad = stream(
        &s,
        B::Rest,
        "slow",
        "SubscribeToTask",
        json!({"id": task}),
        None,
    );
    assert_eq!(
        bad.await.expect_err("terminal").reason(),
        "UNSUPPORTED_OPERATION"
    );
    s.stop().await;
}

#[tokio::test]
async fn the_card_lists_the_http_json_interface_and_tasks_cross_bindings() {
    let s = server().await;
    let card = s
        .client
        .get(format!("{}/.well-known/agent-card.json", s.url("echo")))
        .send()
        .await
        .expect("card")
        .bytes()
        .await
        .expect("body");
    let card: Value = serde_json::from_slice(&card).expect("json");
    let rest = card["supportedInterfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .find(|i| i["protocolBinding"] == "HTTP+JSON")
        .expect("an HTTP+JSON interface")
        .clone();
    assert_eq!(rest["url"], rest_url(&s, "echo"));
    assert_eq!(rest["protocolVersion"], "1.0");
    assert!(
        rest.get("tenant").is_none(),
        "the REST interface carries no tenant"
    );
    // A task made over one binding is the same task over the other.
    let task = call(
        &s,
        B::JsonRpc,
        "echo",
        "SendMessage",
        json!({"message": msg("hi")}),
    )
    .await
    .ok()["task"]
        .clone();
    let via_rest = call(&s, B::Rest, "echo", "GetTask", json!({"id": task["id"]}))
        .await
        .ok();
    assert_eq!(via_rest, task);
    s.stop().await;
}

#[tokio::test]
async fn grpc_resumes_after_a2a_last_event_id_and_a_dropped_stream_leaves_the_task_running() {
    let s = server().await;
    let task = start_slow(&s, B::Grpc, "wait").await;
    // A subscriber that goes away after the first event: the task goes on.
    let mut c = grpc(&s).await;
    let mut sub = c
        .subscribe_to_task(grpc_request::<pb::SubscribeToTaskRequest>(
            ALICE,
            "slow",
            &json!({"id": task}),
            None,
        ))
        .await
        .expect("subscribe")
        .into_inner();
    let first = sub.message().await.expect("event").expect("one");
    assert!(first.payload.is_some());
    drop(sub);
    drop(c);
    until_state(&s, B::Grpc, &task, "TASK_STATE_COMPLETED").await;
    // Resume after event 1: every later event once, to the final one (as REST and SSE).
    let rest = stream(
        &s,
        B::Grpc,
        "slow",
        "SubscribeToTask",
        json!({"id": task}),
        Some(1),
    )
    .await
    .expect("resume");
    let over_rest = stream(
        &s,
        B::Rest,
        "slow",
        "SubscribeToTask",
        json!({"id": task}),
        Some(1),
    )
    .await
    .expect("resume");
    // (A store that keeps no events of finished tasks, memory, gives the final state alone;
    // the durable ones every event after 1: the same over both bindings either way.)
    assert_eq!(rest.len(), over_rest.len(), "{rest:?}");
    let last = &rest.last().expect("events").1;
    let state = if last.get("task").is_some() {
        &last["task"]["status"]["state"]
    } else {
        &last["statusUpdate"]["status"]["state"]
    };
    assert_eq!(state, "TASK_STATE_COMPLETED", "{rest:?}");
    let done = stream(
        &s,
        B::Grpc,
        "slow",
        "SubscribeToTask",
        json!({"id": task}),
        None,
    )
    .await
    .expect_err("terminal");
    assert_eq!(done.reason(), "UNSUPPORTED_OPERATION");
    let text = s.scrape().await;
    assert!(
        metric(
            &text,
            r#"a2ad_requests_total{dialect="a2a-1.0",binding="grpc",method="SubscribeToTask",outcome="ok"}"#
        ) >= 2.0,
        "{text}"
    );
    s.stop().await;
}

/// A raw gRPC call over HTTP/2 (prior knowledge): status, grpc-status, grpc-message.
async fn raw_grpc(s: &TestServer, path: &str, body: Vec<u8>, key: &str) -> (u16, String, String) {
    raw_grpc_as(s, path, "application/grpc", body.into(), key).await
}

/// [`raw_grpc`] with a content type and any body.
async fn raw_grpc_as(
    s: &TestServer,
    path: &str,
    content_type: &str,
    body: reqwest::Body,
    key: &str,
) -> (u16, String, String) {
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    let resp = client
        .post(format!("{}{path}", s.base))
        .header("content-type", content_type)
        .header("te", "trailers")
        .header("x-api-key", key)
        .header("a2a-version", "1.0")
        .body(body)
        .send()
        .await
        .expect("h2 request");
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap_or("").to_string())
            .unwrap_or_default()
    };
    let (code, message) = (header("grpc-status"), header("grpc-message"));
    (status, code, message)
}

/// One gRPC frame: uncompressed, its length, the bytes.
fn frame(bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&u32::try_from(bytes.len()).expect("len").to_be_bytes());
    out.extend_from_slice(bytes);
    out
}

#[tokio::test]
async fn grpc_bad_input_gets_clear_statuses_and_holds_nothing() {
    let s = server().await;
    let get = "/lf.a2a.v1.A2AService/GetTask";
    // Not protobuf, a frame cut short, a compressed frame (none was agreed):
    // INVALID_ARGUMENT (3).
    let (st, code, _) = raw_grpc(&s, get, frame(&[0xff, 0xff, 0xff, 0xff, 0x0f]), ALICE).await;
    assert_eq!((st, code.as_str()), (200, "3"));
    let mut cut = frame(br#"{"id":"x"}"#);
    cut.truncate(8);
    let (_, code, _) = raw_grpc(&s, get, cut, ALICE).await;
    assert_eq!(code, "3");
    let mut compressed = frame(&[0x0a, 0x01, 0x78]);
    compressed[0] = 1;
    let (_, code, _) = raw_grpc(&s, get, compressed, ALICE).await;
    assert_eq!(code, "3");
    // A frame that claims more than the body cap: RESOURCE_EXHAUSTED (8).
    let mut huge = vec![0u8];
    huge.extend_from_slice(&(1u32 << 30).to_be_bytes());
    huge.extend_from_slice(&[0u8; 64]);
    let (_, code, _) = raw_grpc(&s, get, huge, ALICE).await;
    assert_eq!(code, "8");
    // No message, two messages where the method takes one: INVALID_ARGUMENT.
    let (_, code, _) = raw_grpc(&s, get, Vec::new(), ALICE).await;
    assert_eq!(code, "3");
    let mut two = frame(&[0x0a, 0x01, 0x78]);
    two.extend(frame(&[0x0a, 0x01, 0x79]));
    let (_, code, message) = raw_grpc(&s, get, two, ALICE).await;
    assert_eq!(code, "3", "{message}");
    // Content types: `+proto` is protobuf too (the call is read: the task is not found);
    // another codec is refused, not misread.
    let id_x = frame(&[0x0a, 0x01, 0x78]);
    let (_, code, _) = raw_grpc_as(
        &s,
        get,
        "application/grpc+proto",
        id_x.clone().into(),
        ALICE,
    )
    .await;
    assert_eq!(code, "5");
    let (_, code, message) =
        raw_grpc_as(&s, get, "application/grpc+json", id_x.clone().into(), ALICE).await;
    assert_eq!(code, "3", "{message}");
    assert!(message.contains("Content"), "{message}");
    // Metadata over the header cap: the stream is refused whole (431), nothing runs; a
    // header block sent in a flood of CONTINUATION frames loses its connection (GOAWAY).
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    let padded = |size: usize| {
        client
            .post(format!("{}{get}", s.base))
            .header("content-type", "application/grpc")
            .header("x-api-key", ALICE)
            .header("x-padding", "p".repeat(size))
            .body(id_x.clone())
            .send()
    };
    let over = padded(100 * 1024).await.expect("a response");
    assert_eq!(over.status().as_u16(), 431);
    let flood = padded(400 * 1024)
        .await
        .expect_err("the connection is closed");
    assert!(format!("{flood:?}").contains("GoAway"), "{flood:?}");
    // A method the service does not have: UNIMPLEMENTED (12).
    let (_, code, _) = raw_grpc(&s, "/lf.a2a.v1.A2AService/Nope", frame(&[]), ALICE).await;
    assert_eq!(code, "12");
    // No key: UNAUTHENTICATED (16); a tenant that is no agent: NOT_FOUND (5).
    let (_, code, _) = raw_grpc(&s, get, frame(&[]), "not-a-key-0123456789").await;
    assert_eq!(code, "16");
    let mut c = grpc(&s).await;
    let err = c
        .get_task(grpc_request::<pb::GetTaskRequest>(
            ALICE,
            "nobody",
            &json!({"id": "x"}),
            None,
        ))
        .await
        .expect_err("no such agent");
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert_eq!(grpc_error(&err).reason(), "AGENT_NOT_FOUND");
    // An empty tenant is the default agent (the first, echo); a missing version is 0.3.
    let sent = c
        .send_message(grpc_request::<pb::SendMessageRequest>(
            ALICE,
            "",
            &json!({"message": msg("hi")}),
            None,
        ))
        .await
        .expect("default agent");
    assert!(sent.into_inner().payload.is_some());
    let mut no_version = tonic::Request::new(pb::GetTaskRequest {
        id: "x".into(),
        ..Default::default()
    });
    no_version
        .metadata_mut()
        .insert("x-api-key", ALICE.parse().expect("key"));
    let err = c.get_task(no_version).await.expect_err("0.3");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(grpc_error(&err).reason(), "VERSION_NOT_SUPPORTED");
    // The server is fine afterwards.
    still_sends_over_grpc(&s, "still").await;
    s.stop().await;
}

/// A gRPC send completes: nothing the call before held is still held.
async fn still_sends_over_grpc(s: &TestServer, text: &str) {
    let ok = call(
        s,
        B::Grpc,
        "echo",
        "SendMessage",
        json!({"message": msg(text)}),
    )
    .await;
    assert_eq!(ok.ok()["task"]["status"]["state"], "TASK_STATE_COMPLETED");
}

#[tokio::test]
async fn a_grpc_message_too_slow_to_arrive_is_deadline_exceeded_and_holds_nothing() {
    let mut c = config(&["echo"]);
    c.server.body_read_timeout_seconds = 0.5;
    let s = TestServer::start(c).await;
    // Half a frame, then nothing more: the body never completes.
    let first = frame(&[0x0a, 0x01, 0x78]);
    let head: Vec<u8> = first[..4].to_vec();
    let endless = futures_util::stream::once(async move { Ok::<_, std::io::Error>(head) })
        .chain(futures_util::stream::pending());
    let started = std::time::Instant::now();
    let (st, code, message) = raw_grpc_as(
        &s,
        "/lf.a2a.v1.A2AService/GetTask",
        "application/grpc",
        reqwest::Body::wrap_stream(endless),
        ALICE,
    )
    .await;
    assert_eq!((st, code.as_str()), (200, "4"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(30));
    // Nothing is held: the server answers the next call.
    still_sends_over_grpc(&s, "after").await;
    s.stop().await;
}

#[tokio::test]
async fn shutdown_ends_an_open_grpc_stream_with_its_final_canceled_event() {
    let mut c = config(&["echo"]);
    let mut stuck = agent("stuck");
    stuck.echo.delay_ms = 60_000;
    c.agents.push(stuck);
    let s = TestServer::start(c).await;
    let mut client = grpc(&s).await;
    let mut events = client
        .send_streaming_message(grpc_request::<pb::SendMessageRequest>(
            ALICE,
            "stuck",
            &json!({"message": msg("forever")}),
            None,
        ))
        .await
        .expect("stream")
        .into_inner();
    let first = events.message().await.expect("first").expect("an event");
    assert!(matches!(
        first.payload,
        Some(pb::stream_response::Payload::Task(_))
    ));
    s.handle.as_ref().expect("handle").stop();
    let mut last = None;
    let drained = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(e)) = events.message().await {
            last = Some(e);
        }
    })
    .await;
    assert!(drained.is_ok(), "the stream ends on shutdown");
    let Some(pb::stream_response::Payload::StatusUpdate(u)) = last.and_then(|e| e.payload) else {
        panic!("the last event is a status update");
    };
    let state = u.status.expect("status").state;
    assert_eq!(
        state,
        i32::from(pb::TaskState::Canceled),
        "canceled by the shutdown"
    );
    s.stop().await;
}
