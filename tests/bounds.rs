//! Regression tests for the third outside attack (issue "Break it before users do, round
//! 3"), over real sockets: request bodies are read only once their caller is admitted, and
//! the body bytes held at once stay within their documented bounds.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use support::{ALICE, TestServer, config, metric, poll_until};

/// Starts a request whose body never ends: `sent` bytes of it, then nothing.
async fn endless(
    client: &mut h2::client::SendRequest<Bytes>,
    req: http::Request<()>,
    sent: usize,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let ready = client.clone().ready().await.expect("ready");
    *client = ready;
    let (response, mut body) = client.send_request(req, false).expect("send");
    // Queued beyond the window as the server grants credit.
    body.send_data(Bytes::from(vec![b' '; sent]), false)
        .expect("data");
    (response, body)
}

fn grpc(s: &TestServer, key: Option<&str>) -> http::Request<()> {
    let mut b = http::Request::builder()
        .method("POST")
        .uri(format!("{}/lf.a2a.v1.A2AService/SendMessage", s.base))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("a2a-version", "1.0");
    if let Some(key) = key {
        b = b.header("x-api-key", key);
    }
    b.body(()).expect("request")
}

fn jsonrpc(s: &TestServer, key: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(s.url("echo"))
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(())
        .expect("request")
}

async fn held(s: &TestServer) -> f64 {
    metric(&s.scrape().await, "a2ad_request_body_bytes_held")
}

/// Defect 1: a gRPC call's key is checked before its body is read. Calls without a key
/// whose bodies never end are answered UNAUTHENTICATED at once, and hold nothing; before,
/// each body was read whole (up to the cap) before the key was looked at.
#[tokio::test]
async fn a_grpc_call_without_a_key_is_refused_before_its_body_is_read() {
    let mut c = config(&["echo"]);
    // Far past the test's deadline: only a refusal before the body can answer in time.
    c.server.body_read_timeout_seconds = 600.0;
    let s = TestServer::start(c).await;
    let mut client = s.h2().await;
    let mut open = Vec::new();
    for key in [None, Some("not-a-key-0123456789")] {
        for _ in 0..12 {
            open.push(endless(&mut client, grpc(&s, key), 512 << 10).await);
        }
    }
    for (response, _body) in open.iter_mut() {
        let resp = tokio::time::timeout(Duration::from_secs(60), response)
            .await
            .expect("answered before the body ended")
            .expect("response");
        assert_eq!(
            resp.headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok()),
            Some("16"),
            "UNAUTHENTICATED"
        );
    }
    assert_eq!(held(&s).await, 0.0, "no body bytes are held for them");
}

/// Defect 1: with a key, the body bytes held at once stay within the bound of one
/// connection and the bound of all, whatever the clients send; they are given back when
/// the requests end.
#[tokio::test]
async fn body_bytes_held_stay_within_the_bounds_of_a_connection_and_of_all() {
    const MIB: u64 = 1 << 20;
    let mut c = config(&["echo"]);
    c.server.max_body_bytes = Some(MIB);
    c.server.max_buffered_body_bytes_per_connection = Some(2 * MIB);
    c.server.max_buffered_body_bytes = Some(3 * MIB);
    c.server.body_read_timeout_seconds = 600.0;
    let s = TestServer::start(c).await;
    // Four bodies of 900 KiB on one connection, none ending: the connection's bound.
    let mut first = s.h2().await;
    let mut open = Vec::new();
    for i in 0..4 {
        let req = if i % 2 == 0 {
            jsonrpc(&s, ALICE)
        } else {
            grpc(&s, Some(ALICE))
        };
        open.push(endless(&mut first, req, 900 << 10).await);
    }
    let at_bound = poll_until(Duration::from_secs(60), || async {
        let n = held(&s).await;
        (n >= (2 * MIB - (64 << 10)) as f64).then_some(n)
    })
    .await;
    assert!(at_bound <= (2 * MIB) as f64, "one connection: {at_bound}");
    // Four more on a second connection: the bound of all.
    let mut second = s.h2().await;
    for _ in 0..4 {
        open.push(endless(&mut second, jsonrpc(&s, ALICE), 900 << 10).await);
    }
    let at_bound = poll_until(Duration::from_secs(60), || async {
        let n = held(&s).await;
        (n >= (3 * MIB - (64 << 10)) as f64).then_some(n)
    })
    .await;
    assert!(at_bound <= (3 * MIB) as f64, "all connections: {at_bound}");
    // Once the clients give up, every byte is given back.
    for (_, mut body) in open {
        body.send_reset(h2::Reason::CANCEL);
    }
    drop((first, second));
    poll_until(Duration::from_secs(60), || async {
        (held(&s).await == 0.0).then_some(())
    })
    .await;
    // And the server goes on serving.
    let ok = s.send("echo", "after", serde_json::json!({})).await;
    assert_eq!(ok["status"]["state"], "completed");
}

/// Defect 1: a caller over its rate is refused (429) without its body being read: at most
/// 64 KiB of a JSON-RPC body (to answer each request with its id), none of an HTTP+JSON
/// one.
#[tokio::test]
async fn a_caller_over_its_rate_is_refused_before_its_body_is_read() {
    let mut c = config(&["echo"]);
    c.agents[0].limits.requests_per_minute = 1;
    c.server.body_read_timeout_seconds = 600.0;
    let s = TestServer::start(c).await;
    let spent = s.send("echo", "the one token", serde_json::json!({})).await;
    assert_eq!(spent["status"]["state"], "completed");
    let mut client = s.h2().await;
    let mut rest = http::Request::builder()
        .method("POST")
        .uri(format!("{}/rest/message:send", s.url("echo")))
        .header("x-api-key", ALICE)
        .header("a2a-version", "1.0")
        .header("content-type", "application/json")
        .body(())
        .expect("request");
    let mut seed = jsonrpc(&s, ALICE);
    for req in [&mut seed, &mut rest] {
        let req = std::mem::replace(req, http::Request::new(()));
        // Past the 64 KiB a rate-limited caller may have read (to name its requests).
        let (response, _body) = endless(&mut client, req, 128 << 10).await;
        let resp = tokio::time::timeout(Duration::from_secs(60), response)
            .await
            .expect("answered before the body ended")
            .expect("response");
        assert_eq!(resp.status(), 429);
        assert!(resp.headers().contains_key("retry-after"));
    }
}

/// The `turn <n>` line of an echo reply.
fn turn(task: &serde_json::Value) -> String {
    support::texts(&task["status"]["message"])
        .into_iter()
        .find(|t| t.starts_with("turn "))
        .unwrap_or_else(|| panic!("no turn line: {task}"))
}

/// Defect 3: `max_contexts` holds when a conversation begins, not only at the next sweep
/// (every min(60 s, retention / 4)): past it the least recently used idle one is gone.
#[tokio::test]
async fn max_contexts_holds_as_soon_as_a_conversation_begins() {
    let mut c = config(&["echo"]);
    c.server.max_contexts = 10;
    let s = TestServer::start(c).await;
    let first = s
        .send("echo", "first", serde_json::json!({"contextId": "first"}))
        .await;
    assert_eq!(turn(&first), "turn 1");
    for i in 0..200 {
        s.send("echo", &format!("newer {i}"), serde_json::json!({}))
            .await;
    }
    let again = s
        .send("echo", "again", serde_json::json!({"contextId": "first"}))
        .await;
    assert_eq!(
        turn(&again),
        "turn 1",
        "the first conversation was forgotten"
    );
    let kept = metric(&s.scrape().await, "a2ad_conversations");
    assert!(kept <= 10.0, "{kept} conversations kept");
}

/// Defect 2: the conversations' turns are bounded in bytes (`max_context_bytes`): past it
/// the least recently used idle conversations are forgotten, so churn through new
/// conversations holds a bounded amount however long it runs; a recent conversation goes
/// on.
#[tokio::test]
async fn conversations_are_bounded_in_bytes() {
    const MIB: f64 = 1048576.0;
    let mut c = config(&["echo"]);
    c.server.max_context_bytes = 1 << 20;
    // Finished tasks are bounded on their own (and let go of their messages here).
    c.server.max_retained_bytes = 1 << 20;
    let s = TestServer::start(c).await;
    let text = "x".repeat(30_000);
    let mut contexts = Vec::new();
    for _ in 0..150 {
        let t = s.send("echo", &text, serde_json::json!({})).await;
        contexts.push(t["contextId"].as_str().expect("context").to_string());
    }
    let m = s.scrape().await;
    let bytes = metric(&m, "a2ad_conversation_bytes");
    assert!(bytes <= MIB, "{bytes} bytes of conversations kept");
    assert!(bytes > 0.0, "the recent ones are kept");
    // ~60 KB a turn: about 16 conversations fit, the first went long ago.
    let first = s
        .send(
            "echo",
            "again",
            serde_json::json!({"contextId": contexts[0]}),
        )
        .await;
    assert_eq!(turn(&first), "turn 1", "the oldest was forgotten");
    let last = s
        .send(
            "echo",
            "again",
            serde_json::json!({"contextId": contexts.last()}),
        )
        .await;
    assert_eq!(turn(&last), "turn 2", "the newest goes on");
}

/// Found by the fuzz target `grpc`: a message whose enum holds a number A2A does not define
/// (a `role` of 98) has no ProtoJSON form, and the call was answered INTERNAL. It is an
/// invalid param of that field.
#[tokio::test]
async fn a_grpc_enum_value_a2a_does_not_define_is_an_invalid_param() {
    use a2ad::proto::{self as pb, a2a_service_client::A2aServiceClient};
    use tonic_types::StatusExt as _;
    let s = TestServer::start(config(&["echo"])).await;
    let channel = tonic::transport::Channel::from_shared(s.base.clone())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut client = A2aServiceClient::new(channel);
    let mut req = tonic::Request::new(pb::SendMessageRequest {
        tenant: "echo".into(),
        message: Some(pb::Message {
            message_id: "m-1".into(),
            role: 98,
            parts: vec![pb::Part {
                content: Some(pb::part::Content::Text("hello".into())),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("x-api-key", ALICE.parse().expect("key"));
    req.metadata_mut()
        .insert("a2a-version", "1.0".parse().expect("version"));
    let err = client.send_message(req).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    let details = err.get_error_details();
    assert_eq!(
        details.error_info().map(|i| i.reason.as_str()),
        Some("INVALID_PARAMS")
    );
    let violations = &details.bad_request().expect("BadRequest").field_violations;
    assert_eq!(violations[0].field, "message.role");
}
