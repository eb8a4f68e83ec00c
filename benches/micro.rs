//! Criterion micro-benchmarks: the CPU cost of the pieces of a request, without sockets.
//! `cargo bench --bench micro`. See docs/PERFORMANCE.md.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use a2ad::config::{AgentConfig, AgentLimits};
use a2ad::model::{ContextId, TaskEvent, TaskId, TaskState, TaskStatus};
use a2ad::rpc::{self, seed};
use a2ad::{AgentId, Config, Message, Part, Principal, Role, Runtime, SendRequest};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::value::RawValue;

const SEND: &str = r#"{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"role":"user","messageId":"6f1c2a1e-3b4d-4c5e-8f70-1a2b3c4d5e6f","parts":[{"type":"text","text":"Summarise the quarterly report in three bullet points."}]},"metadata":{"client":"bench"}}}"#;

fn decode_and_validate(c: &mut Criterion) {
    let limits = AgentLimits::default();
    c.bench_function("decode + validate message/send", |b| {
        b.iter(|| {
            let body = rpc::decode(std::hint::black_box(SEND.as_bytes())).expect("decodes");
            let rpc::Body::Single(Ok(call)) = body else {
                panic!("a call")
            };
            let params = seed::params(call.params.as_deref()).expect("params");
            seed::send_params(&params, &limits).expect("valid")
        })
    });
}

fn task_life(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut config = Config {
        agents: vec![AgentConfig::new("echo")],
        ..Config::default()
    };
    config.server.task_retention_seconds = 1.0;
    config.agents[0].limits.concurrent_tasks = 100_000;
    let config = Arc::new(config.validated().expect("valid"));
    let runtime = rt
        .block_on(Runtime::start_with(config, HashMap::new()))
        .expect("start");
    let me = Principal::new("bench");
    let echo = AgentId::new("echo");
    c.bench_function(
        "task life through the actors (send, wait for completed)",
        |b| {
            b.to_async(&rt).iter(|| {
                let (runtime, me, echo) = (&runtime, &me, &echo);
                async move {
                    let request = SendRequest {
                        message: Message {
                            role: Role::User,
                            parts: vec![Part::Text("hello".into())],
                            message_id: uuid::Uuid::new_v4().to_string(),
                        },
                        context_id: None,
                        task_id: None,
                        metadata: None,
                    };
                    let t = runtime
                        .send(me, echo, request, Some(Duration::from_secs(10)))
                        .await
                        .expect("send");
                    assert_eq!(t.status.state, TaskState::Completed);
                }
            })
        },
    );
    rt.block_on(runtime.shutdown(Duration::from_secs(5)));
}

fn sse_encoding(c: &mut Criterion) {
    let id = RawValue::from_string("\"req-1\"".into()).expect("json");
    let mut status = TaskStatus::new(TaskState::Completed);
    status.message = Some(Arc::new(Message::agent_text(["echo: hello", "turn 1"])));
    let event = TaskEvent { seq: 3, status };
    let (task, ctx) = (TaskId::generate(), ContextId::generate());
    c.bench_function("SSE event encoding (final event with reply)", |b| {
        b.iter(|| a2ad::http::sse::encode_event(&id, &task, &ctx, std::hint::black_box(&event)))
    });
}

fn webhook_signing(c: &mut Criterion) {
    let body = a2ad::webhook::payload(
        a2ad::push::WebhookEvent::Completed,
        "2026-11-22T08:00:00.000Z",
        "echo",
        "6f1c2a1e-3b4d-4c5e-8f70-1a2b3c4d5e6f",
        &serde_json::json!({"taskId": "t", "status": {"state": "completed"}, "duration": 3}),
        1,
        4,
    );
    c.bench_function("webhook signing (HMAC-SHA256 of a delivery body)", |b| {
        b.iter(|| {
            a2ad::webhook::signature(b"bench-webhook-secret-0123", std::hint::black_box(&body))
        })
    });
}

criterion_group!(
    benches,
    decode_and_validate,
    task_life,
    sse_encoding,
    webhook_signing
);
criterion_main!(benches);
