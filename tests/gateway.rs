//! The `a2a` backend (docs/CONFIG.md, "The `a2a` backend"): a2ad in front of another a2ad
//! on loopback, over each interface the upstream offers — send, stream, multi-turn,
//! input-required continued on the same upstream task, cancel reaching upstream, artifacts
//! streamed in order, cards taken from the upstream, failures naming the upstream, and a
//! task taken up again after the front restarts.

use crate::support;

use std::time::Duration;

use a2ad::config::{A2aConfig, Config};
use serde_json::{Value, json};
use support::official::V;
use support::{ALICE, TestServer, agent, config, new_id, poll_until, texts};

/// The upstream: `echo`, the conformance backend `tck`, and echoes that take their time:
/// `slow` (a minute), `steps` (3 s, with progress) and `long` (8 s).
async fn upstream() -> TestServer {
    let mut c = config(&["echo", "tck"]);
    c.agents[1].backend = "tck".into();
    let mut slow = agent("slow");
    slow.echo.delay_ms = 60_000;
    c.agents.push(slow);
    let mut steps = agent("steps");
    steps.echo.delay_ms = 3_000;
    steps.echo.progress_steps = 3;
    c.agents.push(steps);
    // Long enough that a restart of the front falls inside it on a busy machine.
    let mut long = agent("long");
    long.echo.delay_ms = 8_000;
    c.agents.push(long);
    TestServer::start(c).await
}

/// An `a2a` agent `id` fronting `target` of `up`.
fn front_agent(id: &str, up: &TestServer, target: &str) -> a2ad::config::AgentConfig {
    let mut a = agent(id);
    a.backend = "a2a".into();
    let mut u = A2aConfig::new(&format!("{}/.well-known/agent-card.json", up.url(target)));
    u.allow_private_networks = true;
    u.headers.insert("x-api-key".into(), ALICE.into());
    a.a2a = Some(u);
    a
}

fn up_of(a: &mut a2ad::config::AgentConfig) -> &mut A2aConfig {
    a.a2a.as_mut().expect("an a2a agent")
}

/// Alice and Bob may use the front's agents (Carol's key names `echo` only).
fn front_config(agents: Vec<a2ad::config::AgentConfig>) -> Config {
    let mut c = config(&[]);
    c.api_keys.truncate(2);
    c.agents = agents;
    c
}

/// Waits until task `id` of `agent` has its third event (submitted, working, and the
/// `working` event that holds the backend's note) durable: a replay from event 0 shows it.
async fn noted(server: &TestServer, agent: &str, id: &str) {
    let resp = server
        .stream(
            ALICE,
            agent,
            "tasks/resubscribe",
            json!({"taskId": id}),
            Some("0"),
        )
        .await;
    let mut events = support::SseReader::new(resp);
    for _ in 0..3 {
        events.next_event().await.expect("an event");
    }
}

/// The upstream tasks of `agent` (1.0 ListTasks as alice, newest first).
async fn upstream_tasks(up: &TestServer, agent: &str) -> Vec<Value> {
    let r = up.official(agent, V::V10, "ListTasks", json!({})).await;
    up.result(r)["tasks"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_fronted_a2ad_answers_every_dialect_and_keeps_the_conversation() {
    let up = upstream().await;
    let mut agents = vec![front_agent("front", &up, "echo")];
    let mut old = front_agent("front03", &up, "echo");
    up_of(&mut old).protocol = "0.3".into();
    agents.push(old);
    let mut rest = front_agent("frontrest", &up, "echo");
    up_of(&mut rest).binding = "http_json".into();
    agents.push(rest);
    let mut grpc = front_agent("frontgrpc", &up, "echo");
    up_of(&mut grpc).binding = "grpc".into();
    agents.push(grpc);
    let front = TestServer::start(front_config(agents)).await;
    for id in ["front", "front03", "frontrest", "frontgrpc"] {
        // The seed dialect, blocking: the upstream's reply is the task's.
        let first = front.send(id, "hello", json!({})).await;
        assert_eq!(first["status"]["state"], "completed", "{id}: {first}");
        assert_eq!(
            texts(&first["status"]["message"]),
            vec!["echo: hello", "turn 1"],
            "{id}"
        );
        // The same a2ad context: the same upstream conversation.
        let ctx = first["contextId"].as_str().expect("context");
        let second = front.send(id, "again", json!({"contextId": ctx})).await;
        assert_eq!(
            texts(&second["status"]["message"]),
            vec!["echo: again", "turn 2"],
            "{id}"
        );
        // A 1.0 stream: the front streams its own task to its end.
        let events = front
            .official_events(
                id,
                V::V10,
                "SendStreamingMessage",
                json!({"message": support::official::message(V::V10, "streamed", None)}),
            )
            .await;
        let last = events.last().expect("events");
        assert_eq!(
            last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
            "{id}: {events:?}"
        );
    }
    // Another principal's context of the same name is another upstream conversation.
    let ctx = format!("shared-{}", new_id());
    let a = front.send("front", "a", json!({"contextId": ctx})).await;
    let b: Value = {
        let v = front
            .call_as(
                support::BOB,
                "front",
                "message/send",
                support::send_params("b", json!({"contextId": ctx})),
            )
            .await;
        front.ok(v)
    };
    assert_eq!(texts(&a["status"]["message"])[1], "turn 1");
    assert_eq!(
        texts(&b["status"]["message"])[1],
        "turn 1",
        "bob's own conversation"
    );
    // The card: the upstream's description and skills behind a2ad's own interfaces.
    let card: Value = front
        .client
        .get(format!(
            "{}/.well-known/agent-card.json",
            front.url("front")
        ))
        .send()
        .await
        .expect("card")
        .json()
        .await
        .expect("json");
    assert_eq!(card["skills"][0]["id"], "echo", "{card}");
    assert!(
        card["supportedInterfaces"][0]["url"]
            .as_str()
            .is_some_and(|u| u.contains("/api/v1/a2a/front/")),
        "{card}"
    );
    let metrics = front.scrape().await;
    assert!(
        support::metric(&metrics, "a2ad_upstream_requests_total{agent=\"front\"}") >= 3.0,
        "{metrics}"
    );
    let listing = front.agents_listing().await;
    let upstream = &listing["front03"]["upstream"];
    assert!(upstream["cardFetchedAt"].is_string(), "{upstream}");
    assert_eq!(upstream["interface"]["protocol"], "0.3", "{upstream}");
    assert_eq!(
        listing["frontrest"]["upstream"]["interface"]["binding"],
        "http_json"
    );
    assert_eq!(
        listing["frontgrpc"]["upstream"]["interface"]["binding"],
        "grpc"
    );
    // The gRPC agent's three tasks went to the (streaming) upstream as gRPC streams.
    let up_metrics = up.scrape().await;
    assert_eq!(
        support::metric(
            &up_metrics,
            "a2ad_requests_total{dialect=\"a2a-1.0\",binding=\"grpc\",method=\"SendStreamingMessage\",outcome=\"ok\"}"
        ),
        3.0,
        "{up_metrics}"
    );
    assert!(
        listing["front"]["upstream"]["lastError"].is_null(),
        "{listing}"
    );
    front.stop().await;
    up.stop().await;
}

#[tokio::test]
async fn input_required_continues_the_same_upstream_task_and_cancel_reaches_it() {
    let up = upstream().await;
    let front = TestServer::start(front_config(vec![front_agent("front", &up, "tck")])).await;
    // The conformance backend asks for more input on a plain message.
    let first = front
        .official_send(
            "front",
            V::V10,
            support::official::message(V::V10, "first", None),
            true,
        )
        .await;
    let task = first.clone();
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{first}"
    );
    let id = task["id"].as_str().expect("id").to_string();
    let ups = upstream_tasks(&up, "tck").await;
    assert_eq!(ups.len(), 1, "one upstream task: {ups:?}");
    let up_id = ups[0]["id"].as_str().expect("upstream id").to_string();
    // The next message of the task continues the upstream task.
    let mut more = support::official::message(V::V10, "second", None);
    more["taskId"] = json!(id);
    let second = front.official_send("front", V::V10, more, true).await;
    let task = second.clone();
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{second}"
    );
    let said = texts(&task["status"]["message"]).join(" ");
    assert!(said.contains("'second'"), "{said}");
    let ups = upstream_tasks(&up, "tck").await;
    assert_eq!(ups.len(), 1, "still one upstream task: {ups:?}");
    // Cancel: here at once, and upstream too.
    let canceled = front
        .official("front", V::V10, "CancelTask", json!({"id": id}))
        .await;
    assert_eq!(
        front.result(canceled)["status"]["state"],
        "TASK_STATE_CANCELED"
    );
    poll_until(Duration::from_secs(20), || async {
        let r = up
            .official("tck", V::V10, "GetTask", json!({"id": up_id}))
            .await;
        (up.result(r)["status"]["state"] == "TASK_STATE_CANCELED").then_some(())
    })
    .await;
    front.stop().await;
    up.stop().await;
}

#[tokio::test]
async fn a_slow_upstream_task_is_canceled_there_and_artifacts_stream_in_order() {
    slow_tasks_canceled_and_streamed("auto").await;
}

#[tokio::test]
async fn over_grpc_a_slow_upstream_task_is_canceled_there_and_artifacts_stream_in_order() {
    slow_tasks_canceled_and_streamed("grpc").await;
}

/// Cancels (after and before the upstream names its task), chunked artifacts and
/// progress, with the upstream called over `binding`.
async fn slow_tasks_canceled_and_streamed(binding: &str) {
    let up = upstream().await;
    let mut agents = vec![
        front_agent("slowfront", &up, "slow"),
        front_agent("tckfront", &up, "tck"),
        front_agent("stepsfront", &up, "steps"),
    ];
    for a in &mut agents {
        up_of(a).binding = binding.into();
    }
    let front = TestServer::start(front_config(agents)).await;
    let sent = front
        .official_send(
            "slowfront",
            V::V10,
            support::official::message(V::V10, "take your time", None),
            false,
        )
        .await;
    let id = sent["id"].as_str().expect("id").to_string();
    // Once the upstream has the task and the front noted it, cancel here.
    let up_task = poll_until(Duration::from_secs(20), || async {
        upstream_tasks(&up, "slow").await.first().cloned()
    })
    .await;
    noted(&front, "slowfront", &id).await;
    let canceled = front
        .official("slowfront", V::V10, "CancelTask", json!({"id": id}))
        .await;
    assert_eq!(
        front.result(canceled)["status"]["state"],
        "TASK_STATE_CANCELED"
    );
    poll_until(Duration::from_secs(20), || async {
        let r = up
            .official("slow", V::V10, "GetTask", json!({"id": up_task["id"]}))
            .await;
        (up.result(r)["status"]["state"] == "TASK_STATE_CANCELED").then_some(())
    })
    .await;
    // Canceled at once, before the upstream named its task: it is canceled there all the
    // same, once named.
    let sent = front
        .official_send(
            "slowfront",
            V::V10,
            support::official::message(V::V10, "never mind", None),
            false,
        )
        .await;
    let canceled = front
        .official("slowfront", V::V10, "CancelTask", json!({"id": sent["id"]}))
        .await;
    assert_eq!(
        front.result(canceled)["status"]["state"],
        "TASK_STATE_CANCELED"
    );
    poll_until(Duration::from_secs(20), || async {
        let tasks = upstream_tasks(&up, "slow").await;
        (tasks.len() == 2
            && tasks
                .iter()
                .all(|t| t["status"]["state"] == "TASK_STATE_CANCELED"))
        .then_some(())
    })
    .await;
    // Chunked artifacts: appended in order, one artifact in the end.
    let msg = support::official::message(V::V10, "chunks", Some("tck-stream-artifact-chunked-1"));
    let events = front
        .official_events(
            "tckfront",
            V::V10,
            "SendStreamingMessage",
            json!({"message": msg}),
        )
        .await;
    let chunks: Vec<&Value> = events
        .iter()
        .filter_map(|e| e.get("artifactUpdate"))
        .collect();
    assert_eq!(chunks.len(), 2, "{events:?}");
    assert_eq!(chunks[1]["append"], true);
    let task_id = events
        .iter()
        .find_map(|e| {
            e["statusUpdate"]["taskId"]
                .as_str()
                .or(e["task"]["id"].as_str())
        })
        .expect("task id")
        .to_string();
    let got = front
        .official("tckfront", V::V10, "GetTask", json!({"id": task_id}))
        .await;
    let got = front.result(got);
    assert_eq!(got["artifacts"].as_array().map(Vec::len), Some(1), "{got}");
    assert_eq!(
        texts(&got["artifacts"][0]),
        vec!["chunk-1 ", "chunk-2"],
        "{got}"
    );
    // Upstream progress messages become the front's progress updates.
    let events = front
        .official_events(
            "stepsfront",
            V::V10,
            "SendStreamingMessage",
            json!({"message": support::official::message(V::V10, "step", None)}),
        )
        .await;
    let progress: Vec<String> = events
        .iter()
        .filter_map(|e| {
            e["statusUpdate"]["status"]["message"]
                .as_object()
                .map(|_| e)
        })
        .flat_map(|e| texts(&e["statusUpdate"]["status"]["message"]))
        .filter(|t| t.starts_with("progress"))
        .collect();
    assert_eq!(
        progress,
        vec!["progress 1/3", "progress 2/3", "progress 3/3"],
        "{events:?}"
    );
    front.stop().await;
    up.stop().await;
}

#[tokio::test]
async fn an_unreachable_or_garbage_upstream_fails_the_task_naming_it() {
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let mut down = agent("down");
    down.backend = "a2a".into();
    let mut u = A2aConfig::new(&format!(
        "http://127.0.0.1:{port}/.well-known/agent-card.json"
    ));
    u.allow_private_networks = true;
    down.a2a = Some(u);
    let front = TestServer::start(front_config(vec![down])).await;
    let r = front.send("down", "anyone?", json!({})).await;
    assert_eq!(r["status"]["state"], "failed", "{r}");
    let error = r["status"]["error"]["message"].as_str().unwrap_or("");
    assert!(error.contains(&format!("127.0.0.1:{port}")), "{error}");
    let metrics = front.scrape().await;
    assert!(
        support::metric(
            &metrics,
            "a2ad_upstream_errors_total{agent=\"down\",kind=\"connect\"}"
        ) >= 1.0,
        "{metrics}"
    );
    // What the inspector's Agents view shows: never fetched, and why.
    let upstream = &front.agents_listing().await["down"]["upstream"];
    assert!(upstream["cardFetchedAt"].is_null(), "{upstream}");
    assert!(
        upstream["lastError"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("127.0.0.1:{port}"))),
        "{upstream}"
    );
    front.stop().await;
}

#[tokio::test]
async fn a_private_upstream_is_refused_unless_allowed() {
    let mut a = agent("front");
    a.backend = "a2a".into();
    a.a2a = Some(A2aConfig::new(
        "http://127.0.0.1:9/.well-known/agent-card.json",
    ));
    let err = front_config(vec![a.clone()])
        .validated()
        .expect_err("a loopback upstream is refused");
    assert!(err.to_string().contains("\"front\""), "{err}");
    up_of(&mut a).allow_private_networks = true;
    assert!(front_config(vec![a.clone()]).validated().is_ok());
    // An unset variable in a header.
    up_of(&mut a)
        .headers
        .insert("authorization".into(), "env:A2AD_TEST_SURELY_UNSET".into());
    let err = front_config(vec![a])
        .validated()
        .expect_err("unset variable");
    assert!(err.to_string().contains("A2AD_TEST_SURELY_UNSET"), "{err}");
}

#[tokio::test]
async fn a_task_working_upstream_is_taken_up_after_the_front_restarts() {
    let up = upstream().await;
    // The front's own durable store, kept across its restart.
    let dir = std::env::temp_dir().join(format!("a2ad-gateway-{}", new_id()));
    let mut c = front_config(vec![front_agent("front", &up, "long")]);
    c.cluster = None;
    c.store = a2ad::config::StoreConfig::log(dir.join("log").to_string_lossy().into_owned());
    let front = TestServer::start(c.clone()).await;
    let sent = front
        .official_send(
            "front",
            V::V10,
            support::official::message(V::V10, "outlive me", None),
            false,
        )
        .await;
    let id = sent["id"].as_str().expect("id").to_string();
    // Once the upstream has it and the front noted it (its third event: submitted,
    // working, the note's working), the front stops, and comes back on the same store.
    let up_task = poll_until(Duration::from_secs(20), || async {
        upstream_tasks(&up, "long").await.first().cloned()
    })
    .await;
    noted(&front, "front", &id).await;
    front.stop().await;
    // It was still working upstream when the front went away.
    let r = up
        .official("long", V::V10, "GetTask", json!({"id": up_task["id"]}))
        .await;
    assert_eq!(up.result(r)["status"]["state"], "TASK_STATE_WORKING");
    let front = TestServer::start(c).await;
    let done = poll_until(Duration::from_secs(30), || async {
        let r = front
            .official("front", V::V10, "GetTask", json!({"id": id}))
            .await;
        let t = front.result(r);
        (t["status"]["state"] != "TASK_STATE_WORKING"
            && t["status"]["state"] != "TASK_STATE_SUBMITTED")
            .then_some(t)
    })
    .await;
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert_eq!(texts(&done["status"]["message"])[0], "echo: outlive me");
    front.stop().await;
    up.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A hostile "A2A agent" on loopback. `/{mode}/card` is its card (whose interface is
/// `/{mode}/rpc`); the mode says how it misbehaves.
struct Hostile {
    base: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Hostile {
    async fn start() -> Self {
        use hyper::service::service_fn;
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let me = base.clone();
        // Connections live in the accept loop's set: aborting the loop kills them all, as
        // a killed process would.
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let me = me.clone();
                connections.spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let me = me.clone();
                        async move { Ok::<_, std::convert::Infallible>(hostile(&me, req.uri().path())) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Self { base, task }
    }

    fn agent(&self, mode: &str) -> a2ad::config::AgentConfig {
        let mut a = agent(mode);
        a.backend = "a2a".into();
        let mut u = A2aConfig::new(&format!("{}/{mode}/card", self.base));
        u.allow_private_networks = true;
        u.max_response_bytes = 64 << 10;
        u.timeout_seconds = 20.0;
        a.a2a = Some(u);
        a
    }
}

fn hostile(base: &str, path: &str) -> hyper::Response<support::upstream::Body> {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    let full = |status: u16, ct: &str, body: String| {
        let mut r = hyper::Response::new(Full::new(Bytes::from(body)).boxed());
        *r.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
        r.headers_mut()
            .insert("content-type", ct.parse().expect("ct"));
        r
    };
    let mut segments = path.trim_start_matches('/').split('/');
    let (mode, what) = (segments.next().unwrap_or(""), segments.next().unwrap_or(""));
    if what == "card" {
        return match mode {
            "hugecard" => support::upstream::endless(
                "application/json",
                Bytes::from_static(b"{\"name\": \""),
                Bytes::from(vec![b'a'; 64 << 10]),
            ),
            "redirect" => {
                let mut r = full(302, "text/plain", String::new());
                r.headers_mut().insert(
                    "location",
                    "http://169.254.169.254/latest/meta-data"
                        .parse()
                        .expect("loc"),
                );
                r
            }
            _ => {
                // The gRPC modes offer gRPC: its path follows the URL.
                let (url, binding) = match mode.starts_with("grpc") {
                    true => (format!("{base}/{mode}"), "GRPC"),
                    false => (format!("{base}/{mode}/rpc"), "JSONRPC"),
                };
                full(
                    200,
                    "application/json",
                    json!({
                        "name": mode,
                        "capabilities": {"streaming":
                            matches!(mode, "endlessstream" | "dies" | "grpcendless")},
                        "supportedInterfaces": [{"url": url,
                            "protocolBinding": binding, "protocolVersion": "1.0"}],
                    })
                    .to_string(),
                )
            }
        };
    }
    match mode {
        "endlessbody" => support::upstream::endless(
            "application/json",
            Bytes::from_static(b"{\"jsonrpc\": \"2.0\", \"id\": 1, \"result\": {\"message\": \""),
            Bytes::from(vec![b'a'; 16 << 10]),
        ),
        "endlessstream" => {
            let event = json!({"jsonrpc": "2.0", "id": 1, "result": {"statusUpdate": {
                "taskId": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_WORKING"}}}});
            support::upstream::endless(
                "text/event-stream",
                Bytes::new(),
                Bytes::from(format!("data: {event}\n\n")),
            )
        }
        // A gRPC message that says it is 1 GiB long.
        "grpcbig" => support::upstream::endless(
            "application/grpc",
            Bytes::from_static(&[0, 0x40, 0, 0, 0]),
            Bytes::from(vec![0u8; 16 << 10]),
        ),
        // `working` status updates, without end.
        "grpcendless" => {
            use a2ad::proto;
            let event = proto::StreamResponse {
                payload: Some(proto::stream_response::Payload::StatusUpdate(
                    proto::TaskStatusUpdateEvent {
                        task_id: "t1".into(),
                        context_id: "c1".into(),
                        status: Some(proto::TaskStatus {
                            state: proto::TaskState::Working.into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                )),
            };
            let message = prost::Message::encode_to_vec(&event);
            let mut frame = vec![0u8];
            frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
            frame.extend_from_slice(&message);
            support::upstream::endless("application/grpc", Bytes::new(), Bytes::from(frame))
        }
        "dies" => {
            // One `working` event, then silence until the process is killed.
            let event = json!({"jsonrpc": "2.0", "id": 1, "result": {"task": {
                "id": "t-dies", "contextId": "c1", "status": {"state": "TASK_STATE_WORKING"}}}});
            let first = Bytes::from(format!("data: {event}\n\n"));
            let stream = futures_util::stream::unfold(Some(first), |next| async move {
                match next {
                    Some(b) => Some((
                        Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(b)),
                        None,
                    )),
                    None => std::future::pending().await,
                }
            });
            let mut r =
                hyper::Response::new(BodyExt::boxed(http_body_util::StreamBody::new(stream)));
            r.headers_mut()
                .insert("content-type", "text/event-stream".parse().expect("ct"));
            r
        }
        _ => full(200, "text/html", "<html>not an agent</html>".into()),
    }
}

#[tokio::test]
async fn hostile_upstreams_are_bounded_and_named() {
    let h = Hostile::start().await;
    let modes = [
        "hugecard",
        "redirect",
        "endlessbody",
        "endlessstream",
        "garbage",
        "grpcbig",
        "grpcendless",
    ];
    let front = TestServer::start(front_config(modes.iter().map(|m| h.agent(m)).collect())).await;
    let host = h.base.trim_start_matches("http://").to_string();
    for (mode, says) in [
        ("hugecard", "passed"),
        ("redirect", "redirect"),
        ("endlessbody", "passed 65536 bytes"),
        ("endlessstream", "passed 65536 bytes"),
        ("garbage", "garbage"),
        ("grpcbig", "passed 65536 bytes"),
        ("grpcendless", "passed 65536 bytes"),
    ] {
        let r = front.send(mode, "hello", json!({})).await;
        assert_eq!(r["status"]["state"], "failed", "{mode}: {r}");
        let error = r["status"]["error"]["message"].as_str().unwrap_or("");
        assert!(
            error.contains(&host) && error.contains(says),
            "{mode}: {error}"
        );
    }
    // The front is well, and says what went wrong.
    let metrics = front.scrape().await;
    assert!(
        support::metric(
            &metrics,
            "a2ad_upstream_errors_total{agent=\"endlessbody\",kind=\"too_large\"}"
        ) >= 1.0,
        "{metrics}"
    );
    front.stop().await;
}

#[tokio::test]
async fn an_upstream_that_goes_away_mid_task_ends_the_task_naming_it() {
    // Killed: its connections reset, then nothing listens.
    let h = Hostile::start().await;
    let host = h.base.trim_start_matches("http://").to_string();
    let front = TestServer::start(front_config(vec![h.agent("dies")])).await;
    let sent = front
        .official_send(
            "dies",
            V::V10,
            support::official::message(V::V10, "never finished", None),
            false,
        )
        .await;
    let id = sent["id"].as_str().expect("id").to_string();
    let get = |id: String| {
        let front = &front;
        async move {
            let r = front
                .official("dies", V::V10, "GetTask", json!({"id": id}))
                .await;
            front.result(r)
        }
    };
    poll_until(Duration::from_secs(20), || async {
        (get(id.clone()).await["status"]["state"] == "TASK_STATE_WORKING").then_some(())
    })
    .await;
    drop(h);
    let done = poll_until(Duration::from_secs(30), || async {
        let t = get(id.clone()).await;
        (t["status"]["state"] == "TASK_STATE_FAILED").then_some(t)
    })
    .await;
    assert!(done["status"].to_string().contains(&host), "{done}");
    front.stop().await;

    // Stopped gracefully: the upstream cancels its task, and says so.
    let up = upstream().await;
    let front = TestServer::start(front_config(vec![front_agent("front", &up, "slow")])).await;
    let sent = front
        .official_send(
            "front",
            V::V10,
            support::official::message(V::V10, "never finished", None),
            false,
        )
        .await;
    let id = sent["id"].as_str().expect("id").to_string();
    poll_until(Duration::from_secs(20), || async {
        upstream_tasks(&up, "slow").await.first().cloned()
    })
    .await;
    up.stop().await;
    let done = poll_until(Duration::from_secs(30), || async {
        let r = front
            .official("front", V::V10, "GetTask", json!({"id": id}))
            .await;
        let t = front.result(r);
        let state = t["status"]["state"].clone();
        (state != "TASK_STATE_WORKING" && state != "TASK_STATE_SUBMITTED").then_some(t)
    })
    .await;
    assert_eq!(done["status"]["state"], "TASK_STATE_CANCELED", "{done}");
    front.stop().await;
}

/// The front as the real binary: killed with SIGKILL while its task works upstream, then
/// started again on the same store — the task completes, and its webhooks arrive once each.
#[tokio::test]
async fn a_front_killed_with_sigkill_takes_its_upstream_task_up_again() {
    use support::binary::{Binary, TempDir};
    let up = upstream().await;
    let rx = support::receiver::Receiver::ok().await;
    let dir = TempDir::new();
    let text = format!(
        r#"[server]
listen = "127.0.0.1:0"

[store]
path = "{store}"

[webhooks]
allow_private_networks = true

[[api_keys]]
name = "alice"
key = "{ALICE}"

[[agents]]
id = "front"
backend = "a2a"

[agents.limits]
requests_per_minute = 1000000

[agents.a2a]
card_url = "{card}/.well-known/agent-card.json"
allow_private_networks = true
headers = {{ x-api-key = "env:A2AD_TEST_UPSTREAM_KEY" }}
"#,
        store = dir.path.join("log").display(),
        card = up.url("long"),
    );
    let envs = [("A2AD_TEST_UPSTREAM_KEY", ALICE)];
    let front = Binary::start(&text, &envs, &[]);
    let client = reqwest::Client::new();
    let call = |base: String, method: &'static str, params: Value| {
        let client = client.clone();
        async move {
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
            let v: Value = client
                .post(format!("{base}/api/v1/a2a/front"))
                .header("x-api-key", ALICE)
                .json(&body)
                .send()
                .await
                .expect("call")
                .json()
                .await
                .expect("json");
            assert!(v.get("error").is_none(), "{v}");
            v["result"].clone()
        }
    };
    call(
        front.base.clone(),
        "tasks/pushNotificationConfig/set",
        json!({"config": {"url": rx.url}}),
    )
    .await;
    let sent = call(
        front.base.clone(),
        "message/send",
        support::send_params("survive", json!({"configuration": {"blocking": false}})),
    )
    .await;
    let id = sent["id"].as_str().expect("id").to_string();
    // Working upstream, and the front knows which upstream task it is.
    poll_until(Duration::from_secs(20), || async {
        upstream_tasks(&up, "long").await.first().cloned()
    })
    .await;
    // The upstream task is noted: its event (the third: submitted, working, the note's
    // working) is durable.
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/resubscribe",
        "params": {"taskId": id}});
    let resp = client
        .post(format!("{}/api/v1/a2a/front", front.base))
        .header("x-api-key", ALICE)
        .header("accept", "text/event-stream")
        .header("last-event-id", "0")
        .json(&body)
        .send()
        .await
        .expect("resubscribe");
    let mut events = support::SseReader::new(resp);
    for _ in 0..3 {
        events.next_event().await.expect("an event");
    }
    drop(events);
    let _ = front.kill9();
    // The upstream task was still working then.
    let r = up.official("long", V::V10, "ListTasks", json!({})).await;
    assert_eq!(
        up.result(r)["tasks"][0]["status"]["state"],
        "TASK_STATE_WORKING"
    );
    let front = Binary::start(&text, &envs, &[]);
    let base = front.base.clone();
    let done = poll_until(Duration::from_secs(30), || async {
        let t = call(base.clone(), "tasks/get", json!({"taskId": id})).await;
        (t["status"]["state"] != "working" && t["status"]["state"] != "submitted").then_some(t)
    })
    .await;
    assert_eq!(done["status"]["state"], "completed", "{done}");
    assert_eq!(texts(&done["status"]["message"])[0], "echo: survive");
    // `task.completed` arrives, once.
    poll_until(Duration::from_secs(30), || async {
        let hits: Vec<Value> = rx
            .hits()
            .iter()
            .map(|h| h.json())
            .filter(|b| b["taskId"] == id.as_str() && b["event"] == "task.completed")
            .collect();
        (!hits.is_empty()).then_some(())
    })
    .await;
    // Give a duplicate the time to show, then count.
    let _ = front.stop();
    let completed = rx
        .hits()
        .iter()
        .map(|h| h.json())
        .filter(|b| b["taskId"] == id.as_str() && b["event"] == "task.completed")
        .count();
    assert_eq!(completed, 1);
    up.stop().await;
}

#[tokio::test]
async fn a_reload_changes_an_upstream_agent_and_adds_one() {
    let up = upstream().await;
    let front = TestServer::start(front_config(vec![front_agent("front", &up, "echo")])).await;
    let first = front.send("front", "before", json!({})).await;
    assert_eq!(first["status"]["state"], "completed", "{first}");
    assert_eq!(
        front.agents_listing().await["front"]["upstream"]["interface"]["binding"],
        "jsonrpc"
    );
    // The same agent now over gRPC, and a second one fronting the slow-stepping echo.
    let mut grpc = front_agent("front", &up, "echo");
    up_of(&mut grpc).binding = "grpc".into();
    let config = front_config(vec![grpc, front_agent("stepper", &up, "steps")])
        .validated()
        .expect("valid");
    front.handle.as_ref().expect("handle").reload(&config);
    let again = front.send("front", "after", json!({})).await;
    assert_eq!(again["status"]["state"], "completed", "{again}");
    assert_eq!(texts(&again["status"]["message"])[0], "echo: after");
    let listing = front.agents_listing().await;
    assert_eq!(
        listing["front"]["upstream"]["interface"]["binding"], "grpc",
        "{listing}"
    );
    let stepped = front.send("stepper", "step", json!({})).await;
    assert_eq!(stepped["status"]["state"], "completed", "{stepped}");
    let up_metrics = up.scrape().await;
    assert!(
        support::metric(
            &up_metrics,
            "a2ad_requests_total{dialect=\"a2a-1.0\",binding=\"grpc\",method=\"SendStreamingMessage\",outcome=\"ok\"}"
        ) >= 1.0,
        "{up_metrics}"
    );
    front.stop().await;
    up.stop().await;
}
