//! The `openai` backend through a2ad over HTTP, against a fake OpenAI-compatible upstream.

use crate::support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use a2ad::config::{AgentConfig, OpenAiConfig};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;
use support::upstream::{Mode, Upstream};
use support::*;

fn words(ws: &[&str], gap_ms: u64) -> Mode {
    Mode::Stream {
        words: ws.iter().map(|w| w.to_string()).collect(),
        gap: Duration::from_millis(gap_ms),
    }
}

fn llm(upstream: &Upstream, tweak: impl FnOnce(&mut OpenAiConfig)) -> AgentConfig {
    let mut a = agent("llm");
    a.backend = "openai".into();
    let mut o = OpenAiConfig::new(&upstream.base_url, "test-model");
    tweak(&mut o);
    a.openai = Some(o);
    a
}

async fn server(agent: AgentConfig) -> TestServer {
    let mut c = config(&[]);
    c.agents = vec![agent, support::agent("echo")];
    TestServer::start(c).await
}

#[tokio::test]
async fn send_returns_the_whole_reply_and_the_card_says_llm() {
    let up = Upstream::start(words(&["Hello", ", ", "world"], 10)).await;
    let s = server(llm(&up, |o| {
        o.system_prompt = Some("You are terse.".into())
    }))
    .await;
    let t = s.send("llm", "hi", json!({})).await;
    assert_eq!(t["status"]["state"], "completed");
    assert_eq!(texts(&t["status"]["message"]), ["Hello, world"]);
    // History keeps the conversation, not the streamed chunks.
    let g = s.ok(s.call("llm", "tasks/get", json!({"taskId": t["id"]})).await);
    assert_eq!(g["history"].as_array().map(Vec::len), Some(2));
    let (headers, body) = &up.requests()[0];
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["stream"], true);
    assert_eq!(
        body["messages"],
        json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}])
    );
    assert!(
        headers.get("authorization").is_none(),
        "no api_key_env, no key"
    );
    let card = s.ok(s
        .call("llm", "agent/authenticatedExtendedCard", json!({}))
        .await);
    assert_eq!(card["agent"]["type"], "llm");
}

#[tokio::test]
async fn a_stream_shows_each_chunk_as_its_own_event() {
    let up = Upstream::start(words(&["one ", "two ", "three"], 100)).await;
    let s = server(llm(&up, |_| {})).await;
    let resp = s
        .stream_message("llm", send_params("count", json!({})))
        .await;
    let events = SseReader::new(resp).collect().await;
    let partials: Vec<Vec<String>> = events
        .iter()
        .filter(|(_, d)| {
            d["result"]["status"]["state"] == "working"
                && d["result"]["status"].get("message").is_some()
        })
        .map(|(_, d)| texts(&d["result"]["status"]["message"]))
        .collect();
    assert_eq!(partials, [["one "], ["two "], ["three"]]);
    let (_, last) = events.last().expect("final");
    assert_eq!(last["result"]["final"], true);
    assert_eq!(
        texts(&last["result"]["status"]["message"]),
        ["one two three"]
    );
}

#[tokio::test]
async fn earlier_turns_are_sent_as_chat_history() {
    let up = Upstream::start(words(&["ok"], 0)).await;
    let s = server(llm(&up, |o| o.max_history_turns = 1)).await;
    let first = s.send("llm", "first", json!({})).await;
    let ctx = first["contextId"].clone();
    s.send("llm", "second", json!({"contextId": ctx})).await;
    s.send("llm", "third", json!({"contextId": ctx})).await;
    let reqs = up.requests();
    assert_eq!(
        reqs[1].1["messages"],
        json!([
            {"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "second"},
        ])
    );
    // max_history_turns = 1 keeps only the last earlier turn.
    assert_eq!(
        reqs[2].1["messages"],
        json!([
            {"role": "user", "content": "second"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "third"},
        ])
    );
}

#[tokio::test]
async fn image_parts_become_data_urls_and_other_files_are_described() {
    let up = Upstream::start(Mode::Json("seen".into())).await;
    let s = server(llm(&up, |_| {})).await;
    let png = [b"\x89PNG\r\n\x1a\n".as_slice(), &[7u8; 4]].concat();
    let params = json!({"message": {"role": "user", "messageId": new_id(), "parts": [
        {"type": "text", "text": "what is this?"},
        {"type": "file", "file": {"name": "pic.png", "mimeType": "image/png", "bytes": STANDARD.encode(&png)}},
        {"type": "file", "file": {"name": "doc.pdf", "mimeType": "application/pdf", "bytes": STANDARD.encode(b"%PDF-1.4")}},
    ]}});
    let t = s.ok(s.call("llm", "message/send", params).await);
    assert_eq!(
        texts(&t["status"]["message"]),
        ["seen"],
        "a non-streamed answer is accepted too"
    );
    let content = &up.requests()[0].1["messages"][0]["content"];
    assert_eq!(content[0], json!({"type": "text", "text": "what is this?"}));
    assert_eq!(content[1]["type"], "image_url");
    let url = content[1]["image_url"]["url"].as_str().expect("url");
    let b64 = url
        .strip_prefix("data:image/png;base64,")
        .expect("data URL");
    assert_eq!(STANDARD.decode(b64).expect("base64"), png);
    assert_eq!(
        content[2],
        json!({"type": "text", "text": "[file doc.pdf (application/pdf, 8 bytes)]"})
    );
}

#[tokio::test]
async fn cancel_closes_the_upstream_connection() {
    let many: Vec<String> = (0..100).map(|i| format!("w{i} ")).collect();
    let up = Upstream::start(Mode::Stream {
        words: many,
        gap: Duration::from_millis(200),
    })
    .await;
    let s = server(llm(&up, |_| {})).await;
    let t = s
        .send("llm", "long", json!({"configuration": {"blocking": false}}))
        .await;
    let id = t["id"].clone();
    poll_until(Duration::from_secs(20), || async {
        let g = s.ok(s.call("llm", "tasks/get", json!({"taskId": id})).await);
        (g["status"].get("message").is_some()).then_some(())
    })
    .await;
    let c = s.ok(s.call("llm", "tasks/cancel", json!({"taskId": id})).await);
    assert_eq!(c["status"]["state"], "canceled");
    poll_until(Duration::from_secs(20), || async {
        up.closed_early.load(Ordering::SeqCst).then_some(())
    })
    .await;
}

#[tokio::test]
async fn upstream_failures_fail_the_task_naming_what_happened_without_the_key() {
    let key = std::env::var("PATH").expect("PATH is set");
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let cases: Vec<(Mode, &str)> = vec![
        (Mode::Status(401), "credentials"),
        (Mode::Status(429), "rate limited"),
        (Mode::Status(503), "server error"),
        (Mode::Malformed, "malformed"),
        (Mode::Hang, "did not finish"),
    ];
    for (mode, needle) in cases {
        let up = Upstream::start(mode.clone()).await;
        let s = server(llm(&up, |o| {
            o.api_key_env = Some("PATH".into());
            o.request_timeout_seconds = 0.5;
        }))
        .await;
        let t = s.send("llm", "x", json!({})).await;
        assert_eq!(t["status"]["state"], "failed", "{mode:?}");
        let message = t["status"]["error"]["message"].as_str().expect("message");
        assert!(message.contains(needle), "{mode:?}: {message}");
        assert!(!t.to_string().contains(&key), "the key never leaks");
        assert!(
            !t.to_string().contains("sk-fake-secret-key"),
            "upstream text is not relayed"
        );
        let (headers, _) = &up.requests()[0];
        assert_eq!(headers["authorization"], format!("Bearer {key}").as_str());
        let card = s.ok(s
            .call("llm", "agent/authenticatedExtendedCard", json!({}))
            .await);
        assert_eq!(card["metrics"]["successRate"], 0.0);
    }
    let mut a = agent("llm");
    a.backend = "openai".into();
    a.openai = Some(OpenAiConfig::new(
        &format!("http://127.0.0.1:{closed_port}/v1"),
        "m",
    ));
    let s = server(a).await;
    let t = s.send("llm", "x", json!({})).await;
    assert_eq!(t["status"]["state"], "failed");
    let message = t["status"]["error"]["message"].as_str().expect("message");
    assert!(message.contains("unreachable"), "{message}");
}
