//! HTTP and JSON-RPC framing (DECISIONS §1, §9): every error code, status and header.

use crate::support;

use serde_json::{Value, json};
use support::*;

async fn server() -> TestServer {
    let mut c = config(&["echo", "other"]);
    c.server.max_body_bytes = Some(4096);
    TestServer::start(c).await
}

#[tokio::test]
async fn invalid_json_is_a_parse_error_with_null_id() {
    let s = server().await;
    let (status, headers, v) = s.post_raw("echo", Some(ALICE), "{not json").await;
    assert_eq!(status, 200);
    assert_eq!(v["error"]["code"], -32700);
    assert_eq!(v["id"], Value::Null);
    assert_eq!(v["jsonrpc"], "2.0");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["access-control-allow-origin"], "*");
}

#[tokio::test]
async fn invalid_requests_are_32600_with_the_id_when_readable() {
    let s = server().await;
    let cases = [
        (
            json!({"jsonrpc": "1.0", "id": "a", "method": "tasks/get"}),
            json!("a"),
        ),
        (json!({"id": 5, "method": "tasks/get"}), json!(5)),
        (json!({"jsonrpc": "2.0", "id": 6, "method": 42}), json!(6)),
        (json!({"jsonrpc": "2.0", "id": 7}), json!(7)),
        (
            json!({"jsonrpc": "2.0", "method": "tasks/get", "params": {}}),
            Value::Null,
        ),
        (
            json!({"jsonrpc": "2.0", "id": null, "method": "tasks/get"}),
            Value::Null,
        ),
        (
            json!({"jsonrpc": "2.0", "id": [1], "method": "tasks/get"}),
            Value::Null,
        ),
        (json!(42), Value::Null),
    ];
    for (body, id) in cases {
        let (status, _, v) = s.post_raw("echo", Some(ALICE), body.to_string()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(v["error"]["code"], -32600, "{body} -> {v}");
        assert_eq!(v["id"], id, "{body}");
    }
}

#[tokio::test]
async fn ids_are_echoed_unchanged_strings_and_numbers() {
    let s = server().await;
    for id in [json!("abc"), json!(17), json!(-3), json!(1.5)] {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "agent/authenticatedExtendedCard"});
        let (_, _, v) = s.post_raw("echo", Some(ALICE), body.to_string()).await;
        assert_eq!(v["id"], id);
        assert!(v["result"].is_object());
    }
}

#[tokio::test]
async fn unknown_method_is_32601() {
    let s = server().await;
    let v = s.call("echo", "tasks/list", json!({})).await;
    assert_eq!(v["error"]["code"], -32601);
    assert_eq!(v["id"], 1);
}

#[tokio::test]
async fn params_that_are_not_an_object_or_missing_when_required_are_32602() {
    let s = server().await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": [1, 2]});
    let (_, _, v) = s.post_raw("echo", Some(ALICE), body.to_string()).await;
    assert_eq!(v["error"]["code"], -32602);
    assert_eq!(v["error"]["data"]["field"], "params");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get"});
    let (_, _, v) = s.post_raw("echo", Some(ALICE), body.to_string()).await;
    assert_eq!(v["error"]["code"], -32602);
    assert_eq!(v["error"]["data"]["field"], "taskId");
    // All-optional params may be omitted.
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "agent/authenticatedExtendedCard"});
    let (_, _, v) = s.post_raw("echo", Some(ALICE), body.to_string()).await;
    assert!(v["result"]["agent"].is_object(), "{v}");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/pushNotificationConfig/get"});
    let (_, _, v) = s.post_raw("echo", Some(ALICE), body.to_string()).await;
    assert_eq!(v["result"]["active"], false, "{v}");
}

#[tokio::test]
async fn batches_answer_in_order_and_refuse_streams_per_slot() {
    let s = server().await;
    let body = json!([
        {"jsonrpc": "2.0", "id": "a", "method": "agent/authenticatedExtendedCard"},
        {"jsonrpc": "2.0", "id": "b", "method": "message/stream", "params": send_params("x", json!({}))},
        {"jsonrpc": "2.0", "id": "c", "method": "nope"},
        {"jsonrpc": "2.0", "id": "d", "method": "message/send", "params": send_params("hi", json!({}))},
        {"id": "e"},
        {"jsonrpc": "2.0", "id": "f", "method": "tasks/resubscribe", "params": {"taskId": "x"}},
    ]);
    let (status, _, v) = s.post_raw("echo", Some(ALICE), body.to_string()).await;
    assert_eq!(status, 200);
    let items = v.as_array().expect("array");
    assert_eq!(items.len(), 6);
    let ids: Vec<_> = items.iter().map(|i| i["id"].clone()).collect();
    assert_eq!(
        ids,
        [
            json!("a"),
            json!("b"),
            json!("c"),
            json!("d"),
            json!("e"),
            json!("f")
        ]
    );
    assert!(items[0]["result"]["agent"].is_object());
    assert_eq!(items[1]["error"]["code"], -32600);
    assert_eq!(items[2]["error"]["code"], -32601);
    assert_eq!(items[3]["result"]["status"]["state"], "completed");
    assert_eq!(items[4]["error"]["code"], -32600);
    assert_eq!(items[5]["error"]["code"], -32600);
}

#[tokio::test]
async fn an_empty_batch_is_one_error_object() {
    let s = server().await;
    let (status, _, v) = s.post_raw("echo", Some(ALICE), "[]").await;
    assert_eq!(status, 200);
    assert!(v.is_object(), "{v}");
    assert_eq!(v["error"]["code"], -32600);
    assert_eq!(v["id"], Value::Null);
}

#[tokio::test]
async fn an_oversized_body_is_413_with_the_limit_and_the_server_keeps_serving() {
    let s = server().await;
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{{"taskId":"{}"}}}}"#,
        "x".repeat(5000)
    );
    let (status, _, v) = s.post_raw("echo", Some(ALICE), big).await;
    assert_eq!(status, 413);
    assert_eq!(v["error"]["code"], -32600);
    assert_eq!(v["error"]["data"]["limit"], 4096);
    // A chunked body (no Content-Length) is cut off while reading.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|_| Ok(vec![b' '; 1000])).collect();
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let (status, _, v) = s.post_raw("echo", Some(ALICE), body).await;
    assert_eq!(status, 413);
    assert_eq!(v["error"]["data"]["limit"], 4096);
    let v = s
        .call("echo", "agent/authenticatedExtendedCard", json!({}))
        .await;
    assert!(v["result"].is_object());
}

#[tokio::test]
async fn a_wrong_content_type_is_415_and_charset_is_allowed() {
    let s = server().await;
    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "agent/authenticatedExtendedCard"}).to_string();
    for ct in [Some("text/plain"), None] {
        let mut req = s
            .client
            .post(s.url("echo"))
            .header("x-api-key", ALICE)
            .body(body.clone());
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        let r = req.send().await.expect("send");
        assert_eq!(r.status().as_u16(), 415);
        let v: Value = serde_json::from_slice(&r.bytes().await.expect("body")).expect("json");
        assert_eq!(v["error"]["code"], -32600);
    }
    let r = s
        .client
        .post(s.url("echo"))
        .header("x-api-key", ALICE)
        .header("content-type", "application/json; charset=utf-8")
        .body(body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test]
async fn other_http_methods_are_405_with_allow() {
    let s = server().await;
    for method in [
        reqwest::Method::GET,
        reqwest::Method::PUT,
        reqwest::Method::DELETE,
    ] {
        let r = s
            .client
            .request(method.clone(), s.url("echo"))
            .header("x-api-key", ALICE)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status().as_u16(), 405, "{method}");
        assert_eq!(r.headers()["allow"], "POST, OPTIONS");
        assert_eq!(r.headers()["access-control-allow-origin"], "*");
        let v: Value = serde_json::from_slice(&r.bytes().await.expect("body")).expect("json");
        assert_eq!(v["error"]["code"], -32600);
    }
}

#[tokio::test]
async fn options_preflight_needs_no_key() {
    let s = server().await;
    let r = s
        .client
        .request(reqwest::Method::OPTIONS, s.url("echo"))
        .header("origin", "http://example.com")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 204);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "*");
    assert_eq!(h["access-control-allow-methods"], "POST, OPTIONS");
    assert_eq!(
        h["access-control-allow-headers"],
        "Content-Type, x-api-key, Authorization, Accept, Last-Event-ID, A2A-Extensions, X-A2A-Extensions"
    );
    assert!(h.contains_key("access-control-max-age"));
}

#[tokio::test]
async fn healthz_answers_without_a_key() {
    let s = server().await;
    let r = s
        .client
        .get(format!("{}/healthz", s.base))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
}

#[tokio::test]
async fn an_unknown_path_is_404() {
    let s = server().await;
    let r = s
        .client
        .post(format!("{}/api/v2/x", s.base))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 404);
    let v: Value = serde_json::from_slice(&r.bytes().await.expect("body")).expect("json");
    assert_eq!(v["jsonrpc"], "2.0");
    assert!(v["error"]["code"].is_i64());
}

#[tokio::test]
async fn a_trailing_slash_is_the_same_endpoint() {
    let s = server().await;
    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "agent/authenticatedExtendedCard"}).to_string();
    let r = s
        .client
        .post(format!("{}/", s.url("echo")))
        .header("x-api-key", ALICE)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
}
