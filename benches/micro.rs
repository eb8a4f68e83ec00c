//! Criterion micro-benchmarks: the CPU cost of the pieces of a request, without sockets.
//! `cargo bench --bench micro`. See docs/PERFORMANCE.md.

use std::sync::Arc;
use std::time::Duration;

use a2ad::StreamItem;
use a2ad::config::AgentConfig;
use a2ad::model::{ContextId, TaskEvent, TaskId, TaskSnapshot, TaskState, TaskStatus};
use a2ad::{AgentId, Config, Message, Part, Principal, Role, Runtime, SendRequest};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::value::RawValue;

const SEND: &str = r#"{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"role":"user","messageId":"6f1c2a1e-3b4d-4c5e-8f70-1a2b3c4d5e6f","parts":[{"type":"text","text":"Summarise the quarterly report in three bullet points."}]},"metadata":{"client":"bench"}}}"#;

fn decode_and_validate(c: &mut Criterion) {
    c.bench_function("decode + validate message/send", |b| {
        b.iter(|| a2ad::fuzzing::decode_send(std::hint::black_box(SEND.as_bytes())))
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
        store: a2ad::config::StoreConfig::memory(),
        ..Config::default()
    };
    config.server.task_retention_seconds = 1.0;
    config.agents[0].limits.concurrent_tasks = 100_000;
    let config = Arc::new(config.validated().expect("valid"));
    let runtime = rt.block_on(Runtime::start(config)).expect("start");
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
                            extensions: Default::default(),
                        },
                        context_id: None,
                        task_id: None,
                        metadata: None,
                        extensions: Default::default(),
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
    let task = Arc::new(snapshot(status.clone()));
    let item = StreamItem {
        event: Arc::new(TaskEvent::status(3, status)),
        task,
    };
    c.bench_function("SSE event encoding (final event with reply)", |b| {
        b.iter(|| a2ad::fuzzing::sse_frame(&id, std::hint::black_box(&item)))
    });
}

fn webhook_signing(c: &mut Criterion) {
    let mut status = TaskStatus::new(TaskState::Completed);
    status.message = Some(Arc::new(Message::agent_text(["echo: hello", "turn 1"])));
    let body = a2ad::fuzzing::seed_payload(&snapshot(status));
    c.bench_function("webhook signing (HMAC-SHA256 of a delivery body)", |b| {
        b.iter(|| a2ad::signature(b"bench-webhook-secret-0123", std::hint::black_box(&body)))
    });
}

fn snapshot(status: TaskStatus) -> TaskSnapshot {
    TaskSnapshot {
        id: TaskId::generate(),
        context_id: ContextId::generate(),
        seq: 3,
        created_at: status.timestamp,
        updated_at: status.timestamp,
        history: status.message.iter().cloned().collect(),
        artifacts: Vec::new(),
        metadata: None,
        status,
        extensions: Default::default(),
        note: None,
    }
}

criterion_group!(
    benches,
    decode_and_validate,
    task_life,
    sse_encoding,
    webhook_signing
);
criterion_main!(benches);
