//! OpenTelemetry traces end to end: the real binary with `[telemetry] otlp_endpoint` set to
//! a local OTLP/HTTP receiver (decoded with the OTLP protobuf types), a client that sends a
//! `traceparent`, an OpenAI-compatible upstream and a webhook receiver. One trace must run
//! from the client's span through the request, the task, a store commit, the agent's run
//! (whose upstream call carries the trace) and a webhook delivery (whose request carries
//! it too).

use crate::support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;
use serde_json::json;
use support::binary::Binary;
use support::receiver::Receiver;
use support::upstream::{Mode, Upstream};

/// One exported span: name, trace id, span id, parent span id (hex), attributes.
#[derive(Clone, Debug)]
struct Exported {
    name: String,
    trace: String,
    id: String,
    parent: String,
    attributes: Vec<(String, String)>,
    /// The spans it links to: (trace id, span id).
    links: Vec<(String, String)>,
    /// Its status code: 0 unset, 1 OK, 2 ERROR.
    status: i32,
}

impl Exported {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A local OTLP/HTTP receiver: decodes every `POST /v1/traces` it gets.
async fn otlp_receiver() -> (String, Arc<Mutex<Vec<Exported>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let spans: Arc<Mutex<Vec<Exported>>> = Arc::default();
    let kept = spans.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let kept = kept.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let kept = kept.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        if path == "/v1/traces"
                            && let Ok(body) = body
                            && let Ok(export) = ExportTraceServiceRequest::decode(body)
                        {
                            let mut kept = kept.lock().expect("lock");
                            for rs in export.resource_spans {
                                for ss in rs.scope_spans {
                                    for s in ss.spans {
                                        let attributes = s
                                            .attributes
                                            .iter()
                                            .map(|kv| {
                                                let v = kv
                                                    .value
                                                    .as_ref()
                                                    .and_then(|v| v.value.as_ref())
                                                    .map(|v| {
                                                        use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
                                                        match v {
                                                            V::StringValue(s) => s.clone(),
                                                            V::IntValue(i) => i.to_string(),
                                                            V::BoolValue(b) => b.to_string(),
                                                            other => format!("{other:?}"),
                                                        }
                                                    })
                                                    .unwrap_or_default();
                                                (kv.key.clone(), v)
                                            })
                                            .collect();
                                        let links = s
                                            .links
                                            .iter()
                                            .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                                            .collect();
                                        kept.push(Exported {
                                            links,
                                            status: s.status.as_ref().map_or(0, |st| st.code),
                                            name: s.name,
                                            trace: hex(&s.trace_id),
                                            id: hex(&s.span_id),
                                            parent: hex(&s.parent_span_id),
                                            attributes,
                                        });
                                    }
                                }
                            }
                        }
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (url, spans)
}

#[tokio::test]
async fn one_trace_runs_from_the_client_through_task_store_webhook_and_upstream() {
    let (otlp, spans) = otlp_receiver().await;
    let upstream = Upstream::start(Mode::Json("traced reply".into())).await;
    let hooks = Receiver::ok().await;
    let key = "key-telemetry-0123456789";
    let config = format!(
        "[telemetry]\notlp_endpoint = \"{otlp}\"\nservice_name = \"a2ad-test\"\n\
         [webhooks]\nallow_private_networks = true\n\
         [[api_keys]]\nname = \"alice\"\nkey = \"{key}\"\n\
         [[agents]]\nid = \"llm\"\nbackend = \"openai\"\n\
         [agents.openai]\nbase_url = \"{}\"\nmodel = \"m\"\n",
        upstream.base_url
    );
    let bin = Binary::start(&config, &[], &[]);
    let client = reqwest::Client::new();
    let post = |body: serde_json::Value, traceparent: Option<&str>| {
        let mut req = client
            .post(format!("{}/api/v1/a2a/llm", bin.base))
            .header("x-api-key", key)
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(tp) = traceparent {
            req = req.header("traceparent", tp);
        }
        req.send()
    };
    let set = post(
        json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/pushNotificationConfig/set",
               "params": {"config": {"url": hooks.url}}}),
        None,
    )
    .await
    .expect("set");
    assert_eq!(set.status(), 200);

    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let sent: serde_json::Value = post(
        json!({"jsonrpc": "2.0", "id": 2, "method": "message/send",
               "params": support::send_params("trace me", json!({}))}),
        Some(&format!("00-{trace}-{client_span}-01")),
    )
    .await
    .expect("send")
    .json()
    .await
    .expect("json");
    assert_eq!(sent["result"]["status"]["state"], "completed", "{sent}");
    let task = sent["result"]["id"].as_str().expect("id").to_string();
    let deliveries = hooks.wait_for(3).await;
    // A later request about the task, in a trace of its own: linked to the task's span.
    let later = "0af7651916cd43dd8448eb211c80319c";
    let got = post(
        json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"id": task}}),
        Some(&format!("00-{later}-b7ad6b7169203331-01")),
    )
    .await
    .expect("get");
    assert_eq!(got.status(), 200);
    let (code, _log) = bin.stop();
    assert_eq!(code, 0);

    // The upstream call and every webhook delivery carried the trace.
    let upstream_seen = upstream.requests.lock().expect("lock").clone();
    assert!(
        upstream_seen.iter().any(|(h, _)| h
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains(trace))),
        "the upstream call carries the trace"
    );
    for d in &deliveries {
        assert!(
            d.header("traceparent").contains(trace),
            "a delivery carries the trace"
        );
    }

    // The exporter flushed at exit; the receiver may still be decoding the last batch.
    let spans = support::poll_until(Duration::from_secs(30), || {
        let spans = spans.clone();
        async move {
            let all = spans.lock().expect("lock").clone();
            let names: Vec<&str> = all
                .iter()
                .filter(|s| s.trace == trace)
                .map(|s| s.name.as_str())
                .collect();
            let later_seen = all.iter().any(|s| s.trace == later);
            ([
                "a2a.request",
                "a2a.task",
                "a2a.store.commit",
                "a2a.agent.run",
                "a2a.webhook.delivery",
            ]
            .iter()
            .all(|n| names.contains(n))
                && later_seen)
                .then_some(all)
        }
    })
    .await;
    let ours: Vec<&Exported> = spans.iter().filter(|s| s.trace == trace).collect();
    let one = |name: &str| {
        *ours
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span: {ours:?}"))
    };
    let request = one("a2a.request");
    assert_eq!(
        request.parent, client_span,
        "the request's parent is the client's span"
    );
    assert_eq!(request.attribute("rpc.method"), Some("message/send"));
    assert_eq!(request.attribute("a2a.agent.id"), Some("llm"));
    assert_eq!(request.attribute("rpc.response.status_code"), Some("OK"));
    let task_span = one("a2a.task");
    assert_eq!(
        task_span.parent, request.id,
        "the task is a child of the request"
    );
    assert_eq!(task_span.attribute("a2a.task.id"), Some(task.as_str()));
    assert_eq!(task_span.attribute("a2a.task.state"), Some("completed"));
    for name in ["a2a.store.commit", "a2a.agent.run", "a2a.webhook.delivery"] {
        assert!(
            ours.iter()
                .any(|s| s.name == name && s.parent == task_span.id),
            "a {name} span under the task: {ours:?}"
        );
    }
    let get = spans
        .iter()
        .find(|s| s.trace == later && s.name == "a2a.request")
        .expect("the later request's span");
    assert_eq!(get.attribute("a2a.task.id"), Some(task.as_str()));
    assert!(
        get.links
            .contains(&(trace.to_string(), task_span.id.clone())),
        "the later request links to the task's span: {get:?}"
    );
    // The configuration's own request (no traceparent) is a trace of its own.
    assert!(
        spans
            .iter()
            .any(|s| s.name == "a2a.request" && s.trace != trace && s.parent.is_empty()),
        "a request without traceparent starts its own trace"
    );
}

/// Issue 53, defect 7: requests refused before any operation ran — a bad key (401), an
/// agent the key may not use (403), an unknown agent (404) — on every binding export an
/// error span carrying the refusal's code.
#[tokio::test]
async fn refused_requests_export_error_spans_with_their_codes_on_every_binding() {
    use a2ad::proto::{self as pb, a2a_service_client::A2aServiceClient};
    let (otlp, spans) = otlp_receiver().await;
    let key = "key-telemetry-0123456789";
    let other = "key-telemetry-other-0123";
    let config = format!(
        "[telemetry]\notlp_endpoint = \"{otlp}\"\n\
         [[api_keys]]\nname = \"alice\"\nkey = \"{key}\"\n\
         [[api_keys]]\nname = \"bob\"\nkey = \"{other}\"\nagents = [\"other\"]\n\
         [[agents]]\nid = \"echo\"\n[[agents]]\nid = \"other\"\n"
    );
    let bin = Binary::start(&config, &[], &[]);
    let client = reqwest::Client::new();
    // Each refusal in a trace of its own: (trace id, what it was).
    let mut refusals = Vec::new();
    let mut n = 0u32;
    let mut trace = || {
        n += 1;
        format!("{n:032x}")
    };
    for (key, agent, what) in [
        ("not-a-key-0123456789", "echo", "401"),
        (other, "echo", "403"),
        (key, "nobody", "404"),
    ] {
        let t = trace();
        let rpc = client
            .post(format!("{}/api/v1/a2a/{agent}/jsonrpc/v1", bin.base))
            .header("x-api-key", key)
            .header("a2a-version", "1.0")
            .header("content-type", "application/json")
            .header("traceparent", format!("00-{t}-00f067aa0ba902b7-01"))
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}"#)
            .send()
            .await
            .expect("json-rpc");
        assert_eq!(rpc.status().as_str(), what);
        refusals.push((t, format!("JSON-RPC {what}")));
        let t = trace();
        let rest = client
            .get(format!("{}/api/v1/a2a/{agent}/rest/tasks/x", bin.base))
            .header("x-api-key", key)
            .header("a2a-version", "1.0")
            .header("traceparent", format!("00-{t}-00f067aa0ba902b7-01"))
            .send()
            .await
            .expect("rest");
        assert_eq!(rest.status().as_str(), what);
        refusals.push((t, format!("HTTP+JSON {what}")));
        let t = trace();
        let channel = tonic::transport::Channel::from_shared(bin.base.clone())
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        let mut grpc = A2aServiceClient::new(channel);
        let mut req = tonic::Request::new(pb::GetTaskRequest {
            id: "x".into(),
            tenant: agent.into(),
            ..Default::default()
        });
        let md = req.metadata_mut();
        md.insert("x-api-key", key.parse().expect("key"));
        md.insert("a2a-version", "1.0".parse().expect("version"));
        md.insert(
            "traceparent",
            format!("00-{t}-00f067aa0ba902b7-01").parse().expect("tp"),
        );
        let err = grpc.get_task(req).await.expect_err("refused");
        assert_ne!(err.code(), tonic::Code::Ok);
        refusals.push((t, format!("gRPC {what}")));
    }
    let (code, _) = bin.stop();
    assert_eq!(code, 0);
    let all = support::poll_until(Duration::from_secs(30), || {
        let spans = spans.clone();
        let wanted: Vec<String> = refusals.iter().map(|(t, _)| t.clone()).collect();
        async move {
            let all = spans.lock().expect("lock").clone();
            wanted
                .iter()
                .all(|t| all.iter().any(|s| &s.trace == t && s.name == "a2a.request"))
                .then_some(all)
        }
    })
    .await;
    for (t, what) in &refusals {
        let span = all
            .iter()
            .find(|s| &s.trace == t && s.name == "a2a.request")
            .expect("the refused request's span");
        assert_eq!(span.status, 2, "{what}: an error span: {span:?}");
        let code = span
            .attribute("rpc.response.status_code")
            .unwrap_or_else(|| panic!("{what}: no code: {span:?}"));
        assert!(
            code.parse::<i64>().is_ok_and(|c| c < 0),
            "{what}: the refusal's code, not {code}"
        );
    }
}

/// Issue 53, defect 6: a collector that accepts and never answers cannot hold the exit
/// past the shutdown grace (the exporter's own time-out is 10 s).
#[test]
fn a_collector_that_never_answers_does_not_hold_the_shutdown() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let otlp = format!("http://{}", listener.local_addr().expect("addr"));
    // Accepts, reads, never answers.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    let key = "key-telemetry-0123456789";
    let config = format!(
        "[server]\nshutdown_grace_seconds = 1\n\
         [telemetry]\notlp_endpoint = \"{otlp}\"\n\
         [[api_keys]]\nname = \"alice\"\nkey = \"{key}\"\n"
    );
    let bin = Binary::start(&config, &[], &[]);
    // A request, so that there is a span to export.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let status = runtime.block_on(async {
        reqwest::Client::new()
            .post(format!("{}/api/v1/a2a/echo", bin.base))
            .header("x-api-key", key)
            .header("content-type", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"id":"x"}}"#)
            .send()
            .await
            .expect("request")
            .status()
    });
    assert_eq!(status, 200);
    // Within the grace (1 s) and the time a busy machine needs, well short of the
    // exporter's 10 s.
    let started = std::time::Instant::now();
    let (code, log) = bin.stop_within(Duration::from_secs(30));
    assert_eq!(code, 0, "{log}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "exited after {:?}: {log}",
        started.elapsed()
    );
}
