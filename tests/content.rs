//! All of A2A's content (DIALECTS §12): data parts and files by URL from clients on every
//! dialect and binding, stored, rendered in every other and delivered by webhook; their
//! bounds refused with the documented codes on every binding; extensions declared in the
//! cards, activated by header or metadata, echoed back, required ones enforced.

use crate::bindings::{B, Out, call, call_as, grpc, grpc_request, stream};
use crate::support;

use std::time::Duration;

use a2ad::config::ExtensionConfig;
use a2ad::proto as pb;
use serde_json::{Value, json};
use support::official::V;
use support::receiver::Receiver;
use support::{ALICE, TestServer, agent, config, new_id, texts};

const EXT_A: &str = "https://ext.example/trace/v1";
const EXT_B: &str = "urn:a2ad:test:payments";
const EXT_REQUIRED: &str = "https://ext.example/must/v1";

fn ext(uri: &str, required: bool) -> ExtensionConfig {
    ExtensionConfig {
        uri: uri.into(),
        description: format!("{uri} for tests"),
        required,
        params: None,
    }
}

/// `echo` (extensions A then B declared), `strict` (a required one), private webhooks.
async fn server() -> TestServer {
    let mut c = config(&["echo"]);
    c.agents[0].extensions = vec![ext(EXT_A, false), ext(EXT_B, false)];
    let mut strict = agent("strict");
    strict.extensions = vec![ext(EXT_REQUIRED, true)];
    c.agents.push(strict);
    c.webhooks.allow_private_networks = true;
    TestServer::start(c).await
}

/// The 1.0 user message of the test: text, a data part, a file by URL.
fn content_10(text: &str) -> Value {
    json!({"messageId": new_id(), "role": "ROLE_USER", "parts": [
        {"text": text},
        {"data": {"form": {"name": "Ada", "tags": ["x", 1.5, null, true]}}, "metadata": {"k": "v"}},
        {"url": "https://files.example/report.pdf", "filename": "report.pdf", "mediaType": "application/pdf"},
        {"url": "http://files.example/raw"},
        {"raw": "aGk=", "filename": "a.txt", "mediaType": "text/plain", "metadata": {"f": "one"}},
    ]})
}

/// The echo's reply to [`content_10`] (turn 1, extensions as given).
fn echo_texts(text: &str, extensions: &[&str]) -> Vec<String> {
    let mut t = vec![
        format!("echo: {text}"),
        "file report.pdf (application/pdf, https://files.example/report.pdf)".to_string(),
        "file unnamed (application/octet-stream, http://files.example/raw)".to_string(),
        "file a.txt (text/plain, 2 bytes)".to_string(),
    ];
    if !extensions.is_empty() {
        t.push(format!("extensions: {}", extensions.join(", ")));
    }
    t.push("turn 1".into());
    t
}

/// The data part as the 1.0 JSON bindings show it (numbers as sent).
fn data_10() -> Value {
    json!({"data": {"form": {"name": "Ada", "tags": ["x", 1.5, null, true]}}, "metadata": {"k": "v"}})
}

fn data_parts(message: &Value) -> Vec<Value> {
    message["parts"]
        .as_array()
        .map(|p| {
            p.iter()
                .filter(|p| p.get("data").is_some())
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn data_parts_and_file_urls_travel_on_every_binding_and_render_in_every_dialect() {
    let s = server().await;
    for b in [B::JsonRpc, B::Rest, B::Grpc] {
        let text = format!("over {b:?}");
        let task = call(
            &s,
            b,
            "echo",
            "SendMessage",
            json!({"message": content_10(&text)}),
        )
        .await
        .ok();
        let task = &task["task"];
        assert_eq!(
            task["status"]["state"], "TASK_STATE_COMPLETED",
            "{b:?}: {task}"
        );
        let reply = &task["status"]["message"];
        assert_eq!(texts(reply), echo_texts(&text, &[]), "{b:?}: {reply}");
        let user = &task["history"][0];
        let data = data_parts(user);
        // gRPC carries numbers as doubles; these are doubles already.
        assert_eq!(
            data,
            vec![data_10()],
            "{b:?}: the user's data part kept: {user}"
        );
        assert_eq!(data_parts(reply), vec![data_10()], "{b:?}: echoed: {reply}");
        assert_eq!(
            user["parts"][2],
            json!({"url": "https://files.example/report.pdf", "filename": "report.pdf", "mediaType": "application/pdf"}),
            "{b:?}"
        );
        let id = task["id"].as_str().expect("id").to_string();

        // The same task on every other binding and dialect.
        for other in [B::JsonRpc, B::Rest, B::Grpc] {
            let got = call(&s, other, "echo", "GetTask", json!({"id": id}))
                .await
                .ok();
            assert_eq!(
                data_parts(&got["history"][0]),
                vec![data_10()],
                "{b:?} → {other:?}"
            );
            assert_eq!(
                got["history"][0]["parts"][3],
                json!({"url": "http://files.example/raw"})
            );
            assert_eq!(
                got["history"][0]["parts"][4]["metadata"],
                json!({"f": "one"}),
                "{b:?} → {other:?}: an inline file's metadata"
            );
        }
        let v03 = s.result(
            s.official("echo", V::V03, "tasks/get", json!({"id": id}))
                .await,
        );
        let parts = &v03["history"][0]["parts"];
        assert_eq!(
            parts[1],
            json!({"kind": "data", "data": {"form": {"name": "Ada", "tags": ["x", 1.5, null, true]}}, "metadata": {"k": "v"}})
        );
        assert_eq!(
            parts[2],
            json!({"kind": "file", "file": {"uri": "https://files.example/report.pdf", "name": "report.pdf", "mimeType": "application/pdf"}})
        );
        let seed = s.ok(s.call("echo", "tasks/get", json!({"id": id})).await);
        assert_eq!(
            seed["history"][0]["parts"][1],
            json!({"type": "data", "data": {"form": {"name": "Ada", "tags": ["x", 1.5, null, true]}}, "metadata": {"k": "v"}})
        );
        assert_eq!(
            seed["history"][0]["parts"][3],
            json!({"type": "file", "file": {"uri": "http://files.example/raw"}})
        );
        assert_eq!(
            seed["history"][0]["parts"][4]["metadata"],
            json!({"f": "one"})
        );
        assert_eq!(parts[4]["metadata"], json!({"f": "one"}), "0.3: {parts}");
    }
    s.stop().await;
}

#[tokio::test]
async fn seed_and_0_3_clients_send_data_and_file_urls_that_1_0_reads_back() {
    let s = server().await;
    // The seed dialect: any JSON value as data; a file by URL with or without name/type.
    let seed = s.ok(
        s.call(
            "echo",
            "message/send",
            json!({"message": {"role": "user", "messageId": new_id(), "parts": [
                {"type": "text", "text": "seed"},
                {"type": "data", "data": [1, "two", {"three": 3}]},
                {"type": "file", "file": {"name": "a.png", "mimeType": "image/png", "uri": "https://img.example/a.png"}},
                {"type": "data", "data": 42},
            ]}}),
        )
        .await,
    );
    let reply = &seed["status"]["message"];
    assert_eq!(
        texts(reply),
        vec![
            "echo: seed",
            "file a.png (image/png, https://img.example/a.png)",
            "turn 1"
        ]
    );
    let echoed: Vec<&Value> = reply["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .filter(|p| p["type"] == "data")
        .collect();
    assert_eq!(
        echoed,
        vec![
            &json!({"type": "data", "data": [1, "two", {"three": 3}]}),
            &json!({"type": "data", "data": 42})
        ],
        "data parts repeated in order, after the file lines: {reply}"
    );
    assert_eq!(
        reply["parts"][2]["type"], "data",
        "after echo and the file line"
    );
    let id = seed["id"].as_str().expect("id");
    let v1 = s.result(
        s.official("echo", V::V10, "GetTask", json!({"id": id}))
            .await,
    );
    assert_eq!(
        v1["history"][0]["parts"][1],
        json!({"data": [1, "two", {"three": 3}]})
    );
    assert_eq!(v1["history"][0]["parts"][3], json!({"data": 42}));
    // 0.3 shows a value that is not an object as {"value": …}.
    let v03 = s.result(
        s.official("echo", V::V03, "tasks/get", json!({"id": id}))
            .await,
    );
    assert_eq!(
        v03["history"][0]["parts"][1],
        json!({"kind": "data", "data": {"value": [1, "two", {"three": 3}]}})
    );

    // 0.3 in, every dialect out; a streamed send carries the same parts.
    let message = json!({"kind": "message", "messageId": new_id(), "role": "user", "parts": [
        {"kind": "text", "text": "v03"},
        {"kind": "data", "data": {"a": {"b": [true]}}},
        {"kind": "file", "file": {"uri": "https://f.example/x.txt", "mimeType": "text/plain"}},
    ]});
    let events = s
        .official_events(
            "echo",
            V::V03,
            "message/stream",
            json!({"message": message}),
        )
        .await;
    let last = events.last().expect("events");
    assert_eq!(last["final"], true, "{last}");
    let reply = &last["status"]["message"];
    assert_eq!(
        texts(reply),
        vec![
            "echo: v03",
            "file unnamed (text/plain, https://f.example/x.txt)",
            "turn 1"
        ]
    );
    assert_eq!(
        data_parts(reply),
        vec![json!({"kind": "data", "data": {"a": {"b": [true]}}})]
    );
    let id = last["taskId"].as_str().expect("task id");
    let v1 = s.result(
        s.official("echo", V::V10, "GetTask", json!({"id": id}))
            .await,
    );
    assert_eq!(
        v1["history"][0]["parts"][1],
        json!({"data": {"a": {"b": [true]}}})
    );
    assert_eq!(
        v1["history"][0]["parts"][2],
        json!({"url": "https://f.example/x.txt", "mediaType": "text/plain"})
    );
    s.stop().await;
}

#[tokio::test]
async fn data_parts_reach_webhooks_in_the_dialect_of_their_config() {
    let s = server().await;
    let hooks = Receiver::ok().await;
    let message = content_10("hook");
    let task = call(
        &s,
        B::JsonRpc,
        "echo",
        "SendMessage",
        json!({"message": message, "configuration": {"taskPushNotificationConfig": {"url": hooks.url}}}),
    )
    .await
    .ok();
    let id = task["task"]["id"].as_str().expect("id").to_string();
    let hits = support::poll_until(Duration::from_secs(30), || {
        let hits = hooks.hits();
        async move {
            hits.iter()
                .any(|h| h.json()["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED")
                .then_some(hits)
        }
    })
    .await;
    let done = hits
        .iter()
        .map(|h| h.json())
        .find(|j| j["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED")
        .expect("completed");
    assert_eq!(done["statusUpdate"]["taskId"], id.as_str());
    assert_eq!(
        data_parts(&done["statusUpdate"]["status"]["message"]),
        vec![data_10()],
        "{done}"
    );
    s.stop().await;
}

#[tokio::test]
async fn content_bounds_are_refused_with_the_documented_codes_on_every_binding() {
    let s = server().await;
    let nested = |n: usize| -> Value {
        serde_json::from_str(&format!("{}1{}", "[".repeat(n), "]".repeat(n))).expect("json")
    };
    let with = |part: Value| json!({"message": {"messageId": new_id(), "role": "ROLE_USER", "parts": [{"text": "a"}, part]}});
    for b in [B::JsonRpc, B::Rest, B::Grpc] {
        // 64 levels pass on every binding, gRPC included.
        let ok = call(
            &s,
            b,
            "echo",
            "SendMessage",
            with(json!({"data": nested(64)})),
        )
        .await
        .ok();
        assert_eq!(
            ok["task"]["status"]["state"], "TASK_STATE_COMPLETED",
            "{b:?}"
        );
        for (part, reason, field) in [
            (
                json!({"data": nested(65)}),
                "INVALID_PARAMS",
                "message.parts[1].data",
            ),
            (
                json!({"url": "ftp://files.example/a"}),
                "INVALID_PARAMS",
                "message.parts[1].url",
            ),
            (
                json!({"url": format!("https://files.example/{}", "a".repeat(2030))}),
                "INVALID_PARAMS",
                "message.parts[1].url",
            ),
            (
                json!({"url": "https://files.example/a.mp4", "mediaType": "video/mp4"}),
                "CONTENT_TYPE_NOT_SUPPORTED",
                "message.parts[1].mediaType",
            ),
        ] {
            let out = call(&s, b, "echo", "SendMessage", with(part.clone())).await;
            assert_eq!(out.reason(), reason, "{b:?} {part}");
            if let Out::Err { body, .. } = &out
                && b != B::Grpc
            {
                assert!(
                    body.to_string().contains(field),
                    "{b:?} names {field}: {body}"
                );
            }
        }
    }
    // The seed's invalid-params code for the same bounds, and both bytes and uri refused.
    for part in [
        json!({"type": "data", "data": nested(65)}),
        json!({"type": "file", "file": {"uri": "javascript:alert(1)"}}),
        json!({"type": "file", "file": {"name": "a", "mimeType": "text/plain", "bytes": "aGk=", "uri": "https://x.example/a"}}),
    ] {
        let out = s
            .call(
                "echo",
                "message/send",
                json!({"message": {"role": "user", "messageId": new_id(), "parts": [part]}}),
            )
            .await;
        assert_eq!(out["error"]["code"], -32602, "{out}");
    }
    s.stop().await;
}

/// A gRPC send as alice with these `a2a-extensions`: the task, and the response's.
async fn grpc_send_with(
    s: &TestServer,
    agent: &str,
    extensions: Option<&str>,
) -> Result<(Value, Option<String>), tonic::Status> {
    let mut c = grpc(s).await;
    let mut req = grpc_request::<pb::SendMessageRequest>(
        ALICE,
        agent,
        &json!({"message": {"messageId": new_id(), "role": "ROLE_USER", "parts": [{"text": "x"}]}}),
        None,
    );
    if let Some(e) = extensions {
        req.metadata_mut()
            .insert("a2a-extensions", e.parse().expect("metadata"));
    }
    let resp = c.send_message(req).await?;
    let header = resp
        .metadata()
        .get("a2a-extensions")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    Ok((
        serde_json::to_value(resp.into_inner()).expect("json"),
        header,
    ))
}

/// A JSON-RPC or REST send with `headers`: the status, the response's `name` header and
/// the body.
async fn http_send_with(
    s: &TestServer,
    b: B,
    agent: &str,
    headers: &[(&str, &str)],
    answer_header: &str,
) -> (u16, Option<String>, Value) {
    let message = json!({"messageId": new_id(), "role": "ROLE_USER", "parts": [{"text": "x"}]});
    let mut req = match b {
        B::JsonRpc => s
            .client
            .post(format!("{}/jsonrpc/v1", s.url(agent)))
            .body(json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}).to_string()),
        B::Rest => s
            .client
            .post(format!("{}/rest/message:send", s.url(agent)))
            .body(json!({"message": message}).to_string()),
        B::Grpc => unreachable!("see grpc_send_with"),
    }
    .header("content-type", "application/json")
    .header("a2a-version", "1.0")
    .header("x-api-key", ALICE);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let header = resp
        .headers()
        .get(answer_header)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body: Value = serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
    (status, header, body)
}

#[tokio::test]
async fn extensions_are_declared_activated_echoed_and_required_on_every_binding() {
    let s = server().await;
    // Declared in every card.
    let card: Value = s
        .client
        .get(format!("{}/.well-known/agent-card.json", s.url("echo")))
        .send()
        .await
        .expect("card")
        .json()
        .await
        .expect("json");
    let declared = &card["capabilities"]["extensions"];
    assert_eq!(declared[0]["uri"], EXT_A, "{card}");
    assert_eq!(declared[1]["uri"], EXT_B);
    assert!(
        declared[0].get("required").is_none(),
        "false is left out, as ProtoJSON does"
    );
    let strict: Value = s
        .client
        .get(format!("{}/.well-known/agent-card.json", s.url("strict")))
        .send()
        .await
        .expect("card")
        .json()
        .await
        .expect("json");
    assert_eq!(
        strict["capabilities"]["extensions"][0]["required"], true,
        "{strict}"
    );
    let seed_card = s.ok(s
        .call("echo", "agent/authenticatedExtendedCard", json!({}))
        .await);
    assert_eq!(
        seed_card["capabilities"]["extensions"][1]["uri"], EXT_B,
        "{seed_card}"
    );

    // Asked in another order, with an unknown one: the declared order, the unknown ignored.
    let asked = format!("urn:unknown, {EXT_B},{EXT_A}");
    let want = format!("{EXT_A}, {EXT_B}");
    for b in [B::JsonRpc, B::Rest] {
        let (status, header, body) = http_send_with(
            &s,
            b,
            "echo",
            &[("a2a-extensions", &asked)],
            "a2a-extensions",
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(header.as_deref(), Some(want.as_str()), "{b:?}");
        let task = if b == B::JsonRpc {
            &body["result"]["task"]
        } else {
            &body["task"]
        };
        let reply = &task["status"]["message"];
        assert_eq!(
            texts(reply),
            vec![
                "echo: x".to_string(),
                format!("extensions: {want}"),
                "turn 1".into()
            ]
        );
        assert_eq!(reply["extensions"], json!([EXT_A, EXT_B]), "{b:?}: {reply}");
    }
    let (task, header) = grpc_send_with(&s, "echo", Some(&asked))
        .await
        .expect("grpc");
    assert_eq!(header.as_deref(), Some(want.as_str()));
    assert_eq!(
        task["task"]["status"]["message"]["extensions"],
        json!([EXT_A, EXT_B])
    );
    // None asked: no header, no extensions line.
    let (_, header, body) = http_send_with(&s, B::JsonRpc, "echo", &[], "a2a-extensions").await;
    assert_eq!(header, None);
    assert!(
        body["result"]["task"]["status"]["message"]
            .get("extensions")
            .is_none()
    );
    // 0.3 answers with X-A2A-Extensions; the seed with A2A-Extensions and its task lists them.
    let (status, headers, out) = s
        .official_raw(
            "echo",
            V::V03,
            &[("content-type", "application/json"), ("a2a-version", "0.3"), ("x-api-key", ALICE), ("x-a2a-extensions", EXT_B)],
            json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {"kind": "message", "messageId": new_id(), "role": "user", "parts": [{"kind": "text", "text": "x"}]}}}).to_string(),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-a2a-extensions"], EXT_B);
    assert_eq!(
        out["result"]["status"]["message"]["extensions"],
        json!([EXT_B])
    );
    let seed = s
        .client
        .post(s.url("echo"))
        .header("x-api-key", ALICE)
        .header("content-type", "application/json")
        .header("a2a-extensions", EXT_A)
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": support::send_params("x", json!({}))}).to_string())
        .send()
        .await
        .expect("seed");
    assert_eq!(seed.headers()["a2a-extensions"], EXT_A);
    let seed: Value = seed.json().await.expect("json");
    assert_eq!(seed["result"]["extensions"], json!([EXT_A]), "{seed}");

    // A required extension not activated: refused on every binding and dialect.
    for b in [B::JsonRpc, B::Rest] {
        let (status, _, body) = http_send_with(&s, b, "strict", &[], "a2a-extensions").await;
        match b {
            B::JsonRpc => {
                assert_eq!(status, 200);
                assert_eq!(body["error"]["code"], -32008, "{body}");
                assert_eq!(
                    body["error"]["data"][0]["reason"],
                    "EXTENSION_SUPPORT_REQUIRED"
                );
            }
            _ => {
                assert_eq!(status, 400, "{body}");
                assert_eq!(
                    body["error"]["details"][0]["reason"],
                    "EXTENSION_SUPPORT_REQUIRED"
                );
            }
        }
        let (status, header, _) = http_send_with(
            &s,
            b,
            "strict",
            &[("a2a-extensions", EXT_REQUIRED)],
            "a2a-extensions",
        )
        .await;
        assert_eq!(
            (status, header.as_deref()),
            (200, Some(EXT_REQUIRED)),
            "{b:?}"
        );
    }
    let refused = grpc_send_with(&s, "strict", None)
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        grpc_send_with(&s, "strict", Some(EXT_REQUIRED))
            .await
            .is_ok()
    );
    let v03 = s
        .official("strict", V::V03, "message/send", json!({"message": {"kind": "message", "messageId": new_id(), "role": "user", "parts": [{"kind": "text", "text": "x"}]}}))
        .await;
    assert_eq!(v03["error"]["code"], -32008, "{v03}");
    let seed = s
        .call(
            "strict",
            "message/send",
            support::send_params("x", json!({})),
        )
        .await;
    assert_eq!(seed["error"]["code"], -32602, "{seed}");
    assert_eq!(seed["error"]["data"]["extension"], EXT_REQUIRED);
    // Reads are not gated.
    let listed = call_as(&s, B::JsonRpc, ALICE, "strict", "ListTasks", json!({})).await;
    assert!(matches!(listed, Out::Ok(_)));
    s.stop().await;
}

#[tokio::test]
async fn a_streamed_send_over_every_binding_carries_the_content() {
    let s = server().await;
    for b in [B::JsonRpc, B::Rest, B::Grpc] {
        let events = stream(
            &s,
            b,
            "echo",
            "SendStreamingMessage",
            json!({"message": content_10("s")}),
            None,
        )
        .await
        .unwrap_or_else(|_| panic!("{b:?} streams"));
        let first = &events[0].1["task"];
        assert_eq!(data_parts(&first["history"][0]), vec![data_10()], "{b:?}");
        let last = &events.last().expect("last").1["statusUpdate"];
        assert_eq!(
            data_parts(&last["status"]["message"]),
            vec![data_10()],
            "{b:?}"
        );
    }
    s.stop().await;
}

/// The server of the replay tests: `slow` works 2 s in 4 progress steps.
async fn slow_server() -> TestServer {
    let mut c = config(&["echo"]);
    let mut slow = agent("slow");
    slow.echo.delay_ms = 2_000;
    slow.echo.progress_steps = 4;
    c.agents.push(slow);
    TestServer::start(c).await
}

/// (id, state, text) of an official stream's event.
fn digest(v: V, id: Option<u64>, data: &Value) -> (u64, String, String) {
    let r = &data["result"];
    let st = match v {
        V::V10 if r.get("task").is_some() => &r["task"]["status"],
        V::V10 => &r["statusUpdate"]["status"],
        V::V03 => &r["status"],
    };
    let state = st["state"].as_str().unwrap_or("").to_string();
    (id.expect("id"), state, texts(&st["message"]).join("|"))
}

/// Starts a task on `slow` with an official stream and reads its first `n` events; the
/// task's id, and the stream (read on, it gives the rest: the truth a resumed stream is
/// held to).
async fn started(
    s: &TestServer,
    v: V,
    n: usize,
) -> (String, support::SseReader, Vec<(u64, String, String)>) {
    let message = support::official::message(v, "resume me", None);
    let resp = s
        .official_stream("slow", v, v.stream(), json!({"message": message}))
        .await;
    let mut r = support::SseReader::new(resp);
    let mut seen = Vec::new();
    let mut task = String::new();
    while seen.len() < n {
        let (id, data) = r.next_event().await.expect("an event");
        if seen.is_empty() {
            let t = match v {
                V::V10 => &data["result"]["task"]["id"],
                V::V03 => &data["result"]["id"],
            };
            task = t.as_str().expect("task id").to_string();
        }
        seen.push(digest(v, id, &data));
    }
    (task, r, seen)
}

/// The rest of a stream.
async fn rest_of(v: V, r: &mut support::SseReader) -> Vec<(u64, String, String)> {
    r.collect()
        .await
        .into_iter()
        .map(|(id, d)| digest(v, id, &d))
        .collect()
}

#[tokio::test]
async fn last_event_id_resumes_every_official_stream_without_gap_or_duplicate() {
    let s = slow_server().await;
    for v in [V::V10, V::V03] {
        let (task, mut first, seen) = started(&s, v, 3).await;
        assert_eq!(
            seen.iter().map(|e| e.0).collect::<Vec<_>>(),
            [1, 2, 3],
            "{v:?}"
        );
        // Resumed after 3, as a client whose stream broke there.
        let resp = s
            .client
            .post(s.official_url("slow", v))
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .header("a2a-version", v.header())
            .header("x-api-key", ALICE)
            .header("last-event-id", "3")
            .body(json!({"jsonrpc": "2.0", "id": "r", "method": v.subscribe(), "params": {"id": task}}).to_string())
            .send()
            .await
            .expect("resubscribe");
        let resumed = support::SseReader::new(resp).collect().await;
        let truth = rest_of(v, &mut first).await;
        let ids: Vec<u64> = resumed.iter().map(|e| e.0.expect("id")).collect();
        let want: Vec<u64> = truth.iter().map(|e| e.0).collect();
        assert_eq!(ids, want, "{v:?}: every later event once, in order");
        assert_eq!(want.first(), Some(&4), "{v:?}");
        // The first frame is the task as event 4 left it; then the events as they were.
        assert!(
            if v == V::V10 {
                resumed[0].1["result"].get("task").is_some()
            } else {
                resumed[0].1["result"]["kind"] == "task"
            },
            "{v:?}: a Task first: {}",
            resumed[0].1
        );
        let got: Vec<(u64, String, String)> =
            resumed.iter().map(|(id, d)| digest(v, *id, d)).collect();
        assert_eq!(got, truth, "{v:?}");
    }
    s.stop().await;
}

#[tokio::test]
async fn http_json_and_grpc_resume_with_the_state_of_the_next_event() {
    let s = slow_server().await;
    for b in [B::Rest, B::Grpc] {
        let (task, mut first, _) = started(&s, V::V10, 2).await;
        let resumed = stream(
            &s,
            b,
            "slow",
            "SubscribeToTask",
            json!({"id": task}),
            Some(2),
        )
        .await
        .unwrap_or_else(|_| panic!("{b:?} resumes"));
        let truth = rest_of(V::V10, &mut first).await;
        let got: Vec<(String, String)> = resumed
            .iter()
            .map(|(_, d)| {
                let d = json!({"result": d});
                let (_, state, text) = digest(V::V10, Some(0), &d);
                (state, text)
            })
            .collect();
        let want: Vec<(String, String)> =
            truth.iter().map(|e| (e.1.clone(), e.2.clone())).collect();
        assert_eq!(
            got, want,
            "{b:?}: the state of event 3 first, then every later event once"
        );
        if b == B::Rest {
            let ids: Vec<u64> = resumed.iter().map(|e| e.0.expect("id")).collect();
            assert_eq!(ids, truth.iter().map(|e| e.0).collect::<Vec<_>>());
        }
    }
    s.stop().await;
}

#[tokio::test]
async fn a_0_3_stream_error_is_one_data_frame_and_http_refusals_stay_http() {
    let s = server().await;
    let resp = s
        .client
        .post(s.official_url("echo", V::V03))
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .header("a2a-version", "0.3")
        .header("x-api-key", ALICE)
        .body(json!({"jsonrpc": "2.0", "id": 9, "method": "tasks/resubscribe", "params": {"id": "no-such-task"}}).to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.expect("body");
    let frame = text.strip_prefix("data: ").expect("a data: frame");
    let frame = frame.strip_suffix("\n\n").expect("one frame, then the end");
    let out: Value = serde_json::from_str(frame).expect("JSON-RPC");
    assert_eq!(
        (out["id"].clone(), out["error"]["code"].clone()),
        (json!(9), json!(-32001))
    );
    // A bad message on message/stream: the same form.
    let (status, headers, out) = s
        .official_raw(
            "echo",
            V::V03,
            &[("content-type", "application/json"), ("a2a-version", "0.3"), ("x-api-key", ALICE)],
            json!({"jsonrpc": "2.0", "id": 2, "method": "message/stream", "params": {"message": {"kind": "message", "role": "user", "messageId": "m", "parts": []}}}).to_string(),
        )
        .await;
    assert_eq!(
        (status, headers["content-type"].to_str().ok()),
        (200, Some("text/event-stream"))
    );
    assert_eq!(out["error"]["code"], -32602);
    // 1.0 keeps a plain JSON answer; a missing key stays 401.
    let (_, headers, out) = s
        .official_raw(
            "echo",
            V::V10,
            &[("content-type", "application/json"), ("a2a-version", "1.0"), ("x-api-key", ALICE)],
            json!({"jsonrpc": "2.0", "id": 2, "method": "SubscribeToTask", "params": {"id": "no-such-task"}}).to_string(),
        )
        .await;
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(out["error"]["code"], -32001);
    let (status, _, _) = s
        .official_raw(
            "echo",
            V::V03,
            &[("content-type", "application/json"), ("a2a-version", "0.3")],
            json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/resubscribe", "params": {"id": "x"}}).to_string(),
        )
        .await;
    assert_eq!(status, 401);
    s.stop().await;
}
