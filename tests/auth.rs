//! Authentication, authorization and ownership (DECISIONS §2, §9).

use crate::support;

use serde_json::{Value, json};
use support::*;

fn card() -> String {
    json!({"jsonrpc": "2.0", "id": 9, "method": "agent/authenticatedExtendedCard"}).to_string()
}

async fn post(
    s: &TestServer,
    agent: &str,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = s
        .client
        .post(s.url(agent))
        .header("content-type", "application/json")
        .body(card());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.expect("send");
    let status = r.status().as_u16();
    let h = r.headers().clone();
    (
        status,
        h,
        serde_json::from_slice(&r.bytes().await.expect("body")).expect("json"),
    )
}

#[tokio::test]
async fn missing_unknown_and_conflicting_credentials_are_401_with_www_authenticate() {
    let s = TestServer::start(config(&["echo"])).await;
    let cases: [&[(&str, &str)]; 4] = [
        &[],
        &[("x-api-key", "wrong")],
        &[("authorization", "Bearer wrong")],
        &[
            ("x-api-key", ALICE),
            ("authorization", &*format!("Bearer {BOB}")),
        ],
    ];
    for headers in cases {
        let (status, h, v) = post(&s, "echo", headers).await;
        assert_eq!(status, 401, "{headers:?}");
        assert!(h.contains_key("www-authenticate"));
        assert_eq!(h["access-control-allow-origin"], "*");
        assert_eq!(v["error"]["code"], -32005);
        assert_eq!(v["jsonrpc"], "2.0");
    }
}

#[tokio::test]
async fn a_bearer_token_is_the_same_key_store() {
    let s = TestServer::start(config(&["echo"])).await;
    let bearer = format!("Bearer {ALICE}");
    let (status, _, v) = post(&s, "echo", &[("authorization", &bearer)]).await;
    assert_eq!(status, 200, "{v}");
    let (status, _, _) = post(
        &s,
        "echo",
        &[("authorization", &bearer), ("x-api-key", ALICE)],
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn credentials_are_checked_before_the_agent_and_the_agent_before_permission() {
    let s = TestServer::start(config(&["echo", "other"])).await;
    let (status, _, v) = post(&s, "missing", &[]).await;
    assert_eq!((status, v["error"]["code"].clone()), (401, json!(-32005)));
    let (status, _, v) = post(&s, "missing", &[("x-api-key", CAROL)]).await;
    assert_eq!((status, v["error"]["code"].clone()), (404, json!(-32007)));
    let (status, _, v) = post(&s, "other", &[("x-api-key", CAROL)]).await;
    assert_eq!((status, v["error"]["code"].clone()), (403, json!(-32006)));
    let (status, _, _) = post(&s, "echo", &[("x-api-key", CAROL)]).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn hashed_keys_in_the_configuration_work() {
    use sha2::Digest as _;
    let hex: String = sha2::Sha256::digest(b"s3cret-key-value")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let digest = format!("sha256:{hex}");
    let mut c = config(&["echo"]);
    c.api_keys
        .push(a2ad::config::ApiKeyConfig::new("hashed", &digest));
    let s = TestServer::start(c).await;
    let (status, _, _) = post(&s, "echo", &[("x-api-key", "s3cret-key-value")]).await;
    assert_eq!(status, 200);
    let (status, _, _) = post(&s, "echo", &[("x-api-key", &digest)]).await;
    assert_eq!(status, 401, "the digest itself is not a key");
}

#[tokio::test]
async fn another_principal_never_sees_a_task_context_or_config() {
    let s = TestServer::start(config(&["echo"])).await;
    let task = s.send("echo", "private", json!({})).await;
    let id = task["id"].as_str().expect("id");
    let ctx = task["contextId"].as_str().expect("ctx");

    for (method, params) in [
        ("tasks/get", json!({"taskId": id})),
        ("tasks/cancel", json!({"taskId": id})),
        ("tasks/resubscribe", json!({"taskId": id})),
    ] {
        let v = s.call_as(BOB, "echo", method, params).await;
        assert_eq!(v["error"]["code"], -32000, "{method}: {v}");
        assert_eq!(v["error"]["data"]["taskId"], id);
        assert!(!v.to_string().contains("private"));
    }
    // Naming alice's context starts bob's own conversation under that id (DECISIONS §3).
    let v = s
        .call_as(
            BOB,
            "echo",
            "message/send",
            send_params("x", json!({"contextId": ctx})),
        )
        .await;
    let bobs = s.ok(v);
    assert_eq!(bobs["contextId"], ctx);
    assert_eq!(
        support::texts(&bobs["status"]["message"])
            .last()
            .map(String::as_str),
        Some("turn 1")
    );
    assert!(!bobs.to_string().contains("private"));
    let alices = s.send("echo", "again", json!({"contextId": ctx})).await;
    assert_eq!(
        support::texts(&alices["status"]["message"])
            .last()
            .map(String::as_str),
        Some("turn 2"),
        "bob's turn is not alice's"
    );

    let v = s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": "http://127.0.0.1:9/hook"}}),
        )
        .await;
    let config_id = s.ok(v)["configId"].as_str().expect("id").to_string();
    let v = s
        .call_as(BOB, "echo", "tasks/pushNotificationConfig/get", json!({}))
        .await;
    assert_eq!(s.ok(v)["configId"], Value::Null);
    let v = s
        .call_as(
            BOB,
            "echo",
            "tasks/pushNotificationConfig/get",
            json!({"configId": config_id}),
        )
        .await;
    assert_eq!(s.ok(v)["config"], Value::Null);
    let v = s
        .call_as(
            BOB,
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"taskId": id, "config": {"url": "http://127.0.0.1:9/x"}}),
        )
        .await;
    assert_eq!(v["error"]["code"], -32000);
}

#[tokio::test]
async fn task_ids_are_scoped_per_principal() {
    let s = TestServer::start(config(&["echo"])).await;
    let a = s
        .send("echo", "from alice", json!({"id": "shared-id"}))
        .await;
    let v = s
        .call_as(
            BOB,
            "echo",
            "message/send",
            send_params("from bob", json!({"id": "shared-id"})),
        )
        .await;
    let b = s.ok(v);
    assert_eq!(a["id"], "shared-id");
    assert_eq!(b["id"], "shared-id");
    let ga = s.ok(s
        .call("echo", "tasks/get", json!({"taskId": "shared-id"}))
        .await);
    let gb = s.ok(s
        .call_as(BOB, "echo", "tasks/get", json!({"taskId": "shared-id"}))
        .await);
    assert_eq!(texts(&ga["status"]["message"])[0], "echo: from alice");
    assert_eq!(texts(&gb["status"]["message"])[0], "echo: from bob");
}
