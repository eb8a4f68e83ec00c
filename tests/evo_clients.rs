//! Evo AI's own clients against a2ad, with exactly the request shapes they send and reading
//! the answers the way they read them: the CRM agent-bot client (its own conversation id
//! on the first message, the reply from `result.artifacts[0].parts`) and the "A2A Lab" page
//! (webhooks as `pushNotificationConfig: {webhookUrl, webhookAuthenticationInfo}`, inline
//! in `message/send` / `message/stream` and through `tasks/pushNotificationConfig/set`).

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use a2ad::{Agent, AgentFuture, AgentId, AgentRequest, Message, Updates};
use serde_json::{Value, json};
use support::receiver::Receiver;
use support::{ALICE, BOB, SseReader, TestServer, agent, config, new_id, poll_until, texts};

/// What the CRM's `response_processor.rb` does: the first `type: "text"` part of the first
/// artifact.
fn crm_reply(result: &Value) -> String {
    result["artifacts"][0]["parts"]
        .as_array()
        .and_then(|parts| parts.iter().find(|p| p["type"] == "text"))
        .and_then(|p| p["text"].as_str())
        .unwrap_or_else(|| panic!("no reply in artifacts: {result}"))
        .to_string()
}

/// The body `http_request_service.rb` builds for an incoming CRM message.
fn crm_body(conversation: &str, text: &str) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": format!("req-{}", &new_id()[..8]),
        "method": "message/send",
        "params": {
            "contextId": conversation,
            "userId": "4711",
            "message": {"role": "user", "parts": [{"type": "text", "text": text}], "messageId": new_id()},
            "metadata": {
                "evoai_crm_event": "message_created",
                "evoai_crm_data": {"event": "message_created", "message_type": "incoming", "content": text,
                                   "conversation": {"id": conversation, "display_id": 12}, "sender": {"id": 4711, "name": "Ana"}},
                "agent_bot_id": 7,
                "agent_bot_name": "Support bot",
                "contactId": "4711",
                "contactName": "Ana",
                "inboxId": "3",
                "contact": {"id": "4711", "name": "Ana", "labels": ["vip"], "pipelines": []}
            }
        }
    })
    .to_string()
}

/// POSTs like the CRM (`X-API-Key`, Ruby's header spelling) and returns the envelope.
async fn crm_post(s: &TestServer, key: &str, body: String) -> Value {
    let resp = s
        .client
        .post(s.url("echo"))
        .header("Content-Type", "application/json")
        .header("X-API-Key", key)
        .body(body)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json")
}

#[tokio::test]
async fn a_crm_client_names_its_conversation_and_reads_the_reply_from_artifacts() {
    let s = TestServer::start(config(&["echo"])).await;
    let conversation = new_id();
    let first = crm_post(&s, ALICE, crm_body(&conversation, "hello")).await;
    let result = &first["result"];
    assert_eq!(result["contextId"], conversation.as_str(), "{first}");
    assert_eq!(crm_reply(result), "echo: hello");
    assert_eq!(result["artifacts"][0]["name"], "reply");
    assert_eq!(
        result["artifacts"][0]["parts"],
        result["status"]["message"]["parts"]
    );
    assert_eq!(
        result["artifacts"][0]["parts"]
            .as_array()
            .and_then(|p| p.last())
            .map(|p| p["text"].clone()),
        Some(json!("turn 1"))
    );
    let second = crm_post(&s, ALICE, crm_body(&conversation, "and again")).await;
    assert_eq!(crm_reply(&second["result"]), "echo: and again");
    assert_eq!(
        second["result"]["artifacts"][0]["parts"][1]["text"],
        "turn 2"
    );

    // The same artifact, with the same id, in every view of the task.
    let id = result["id"].clone();
    let artifact = result["artifacts"][0].clone();
    let got = s.ok(s.call("echo", "tasks/get", json!({"taskId": id})).await);
    assert_eq!(got["artifacts"][0], artifact);
    let plain = s.ok(s
        .call("echo", "tasks/resubscribe", json!({"taskId": id}))
        .await);
    assert_eq!(plain["artifacts"][0], artifact);
    let mut sse = SseReader::new(
        s.stream(
            ALICE,
            "echo",
            "tasks/resubscribe",
            json!({"taskId": id}),
            None,
        )
        .await,
    );
    let (_, last) = sse.collect().await.pop().expect("one event");
    // SSE events never carry `artifacts` (DECISIONS.md §3): the reply is in status.message.
    assert!(last["result"].get("artifacts").is_none(), "{last}");
    assert_eq!(
        last["result"]["status"]["message"]["parts"],
        artifact["parts"]
    );
}

#[tokio::test]
async fn only_a_completed_task_carries_artifacts_and_no_stream_event_does() {
    let mut slow = agent("slow");
    slow.echo.delay_ms = 100;
    let mut failing = agent("failing");
    failing.echo.fail = true;
    let mut c = config(&["echo"]);
    c.agents.extend([slow, failing]);
    let s = TestServer::start(c).await;
    let mut sse = SseReader::new(
        s.stream_message("slow", support::send_params("streamed", json!({})))
            .await,
    );
    let events = sse.collect().await;
    let (last, earlier) = events.split_last().expect("events");
    for (_, e) in earlier.iter().chain([last]) {
        assert!(e["result"].get("artifacts").is_none(), "{e}");
    }
    // Evo AI's Stream Lab shows every text it finds: the reply appears once, in
    // status.message.
    assert_eq!(last.1["result"]["status"]["state"], "completed");
    assert_eq!(
        texts(&last.1["result"]["status"]["message"]),
        ["echo: streamed", "turn 1"]
    );
    let all = last.1.to_string();
    assert_eq!(all.matches("echo: streamed").count(), 1, "{all}");
    let queued = s.ok(s
        .call(
            "slow",
            "message/send",
            support::send_params("x", json!({"configuration": {"blocking": false}})),
        )
        .await);
    assert!(queued.get("artifacts").is_none(), "{queued}");
    let failed = s.send("failing", "x", json!({})).await;
    assert_eq!(failed["status"]["state"], "failed");
    assert!(failed.get("artifacts").is_none(), "{failed}");
}

/// Replies with the texts of every earlier turn it was shown.
struct Recall;

impl Agent for Recall {
    fn kind(&self) -> &str {
        "recall"
    }

    fn run(&self, request: AgentRequest, _updates: Updates) -> AgentFuture {
        Box::pin(async move {
            let seen: Vec<String> = request.history.iter().map(|m| m.joined_text()).collect();
            Ok(Message::agent_text([format!("seen: {}", seen.join(" | "))]))
        })
    }
}

#[tokio::test]
async fn another_key_naming_the_same_conversation_gets_its_own_never_the_first_ones_history() {
    let backends: HashMap<AgentId, Arc<dyn Agent>> =
        HashMap::from([(AgentId::new("echo"), Arc::new(Recall) as Arc<dyn Agent>)]);
    let s = TestServer::start_with(config(&["echo"]), backends).await;
    let conversation = new_id();
    crm_post(&s, ALICE, crm_body(&conversation, "alice-secret-1")).await;
    let alice = crm_post(&s, ALICE, crm_body(&conversation, "alice-2")).await;
    assert!(
        crm_reply(&alice["result"]).contains("alice-secret-1"),
        "{alice}"
    );
    let bob = crm_post(&s, BOB, crm_body(&conversation, "bob-1")).await;
    assert_eq!(bob["result"]["contextId"], conversation.as_str());
    assert_eq!(
        crm_reply(&bob["result"]),
        "seen: ",
        "bob starts his own conversation"
    );
    let bob = crm_post(&s, BOB, crm_body(&conversation, "bob-2")).await;
    let bob_reply = crm_reply(&bob["result"]);
    assert!(
        bob_reply.contains("bob-1") && !bob_reply.contains("alice"),
        "{bob_reply}"
    );
    let alice = crm_post(&s, ALICE, crm_body(&conversation, "alice-3")).await;
    assert!(!crm_reply(&alice["result"]).contains("bob"), "{alice}");
}

/// The Lab page's push configuration.
fn lab_push(url: &str) -> Value {
    json!({"webhookUrl": url, "webhookAuthenticationInfo": {"type": "none"}})
}

fn lab_message(text: &str) -> Value {
    json!({"role": "user", "parts": [{"type": "text", "text": text}], "messageId": new_id()})
}

fn events_of(hits: &[support::receiver::Hit], task: &Value) -> Vec<String> {
    hits.iter()
        .map(|h| h.json())
        .filter(|p| p["taskId"] == *task)
        .map(|p| p["event"].as_str().expect("event").to_string())
        .collect()
}

#[tokio::test]
async fn a_lab_client_gets_webhooks_from_an_inline_config_on_send_and_stream() {
    let rx = Receiver::ok().await;
    let s = TestServer::start(config(&["echo"])).await;
    let sent = s
        .ok(s
            .call(
                "echo",
                "message/send",
                json!({"message": lab_message("with hooks"), "pushNotificationConfig": lab_push(&rx.url)}),
            )
            .await);
    let hits = rx.wait_for(3).await;
    assert_eq!(
        events_of(&hits, &sent["id"]),
        ["task.submitted", "task.working", "task.completed"]
    );
    let mut sse = SseReader::new(
        s.stream_message(
            "echo",
            json!({"message": lab_message("streamed hooks"), "pushNotificationConfig": lab_push(&rx.url)}),
        )
        .await,
    );
    let events = sse.collect().await;
    let task = events[0].1["result"]["id"].clone();
    let hits = rx.wait_for(6).await;
    assert_eq!(
        events_of(&hits, &task),
        ["task.submitted", "task.working", "task.completed"]
    );
    // The configuration belongs to that task: another task sends nothing.
    s.send("echo", "no hooks", json!({})).await;
    let got = s.ok(s
        .call(
            "echo",
            "tasks/pushNotificationConfig/get",
            json!({"taskId": task}),
        )
        .await);
    assert_eq!(got["config"]["url"], rx.url.as_str());
    assert_eq!(got["config"]["taskId"], task);
    assert_eq!(rx.hits().len(), 6);
}

#[tokio::test]
async fn a_lab_client_sets_webhooks_for_a_task_with_its_own_shape() {
    let rx = Receiver::ok().await;
    let mut slow = agent("echo");
    slow.echo.delay_ms = 300;
    let mut c = config(&[]);
    c.agents = vec![slow];
    let s = TestServer::start(c).await;
    let task = s.ok(s
        .call(
            "echo",
            "message/send",
            json!({"message": lab_message("later"), "configuration": {"blocking": false}}),
        )
        .await);
    let set = s.ok(s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"taskId": task["id"], "pushNotificationConfig": {"webhookUrl": rx.url, "webhookAuthenticationInfo": {"type": "bearer", "token": "lab-token-123"}}}),
        )
        .await);
    assert_eq!(set["configured"], true);
    assert_eq!(set["taskId"], task["id"]);
    let hits = rx.wait_for(1).await;
    poll_until(Duration::from_secs(20), || async {
        events_of(&rx.hits(), &task["id"])
            .contains(&"task.completed".to_string())
            .then_some(())
    })
    .await;
    assert_eq!(hits[0].header("authorization"), "Bearer lab-token-123");
    let got = s.ok(s
        .call(
            "echo",
            "tasks/pushNotificationConfig/get",
            json!({"taskId": task["id"]}),
        )
        .await);
    assert_eq!(got["config"]["headers"]["Authorization"], "***");
    // Webhooks switched off in the Lab send `pushNotificationConfig: null`.
    let v = s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"taskId": task["id"], "pushNotificationConfig": null}),
        )
        .await;
    assert_eq!(v["error"]["code"], -32602);
    assert_eq!(v["error"]["data"]["field"], "config");
}

#[tokio::test]
async fn an_invalid_inline_config_fails_the_send_and_creates_no_task() {
    let mut no_hooks = agent("nohooks");
    no_hooks.webhooks = false;
    let mut c = config(&["echo"]);
    c.agents.push(no_hooks);
    c.webhooks.allow_private_networks = false;
    let s = TestServer::start(c).await;
    for (agent_id, push, code, field) in [
        (
            "echo",
            json!({"webhookUrl": "http://127.0.0.1:9/h", "webhookAuthenticationInfo": {"type": "oauth2"}}),
            -32602,
            "pushNotificationConfig.webhookAuthenticationInfo.type",
        ),
        (
            "echo",
            json!({"webhookUrl": "http://127.0.0.1:9/h", "webhookAuthenticationInfo": {"type": "bearer"}}),
            -32602,
            "pushNotificationConfig.webhookAuthenticationInfo.token",
        ),
        (
            "echo",
            json!({"webhookAuthenticationInfo": {"type": "none"}}),
            -32602,
            "pushNotificationConfig.url",
        ),
        (
            "echo",
            json!({"webhookUrl": "ftp://example.com/h"}),
            -32602,
            "pushNotificationConfig.url",
        ),
        (
            "echo",
            json!({"webhookUrl": "http://169.254.169.254/"}),
            -32602,
            "pushNotificationConfig.url",
        ),
        (
            "echo",
            json!({"webhookUrl": "http://127.0.0.1:9/h"}),
            -32602,
            "pushNotificationConfig.url",
        ),
        (
            "echo",
            json!({"url": "https://a.example/h", "webhookUrl": "https://b.example/h"}),
            -32602,
            "pushNotificationConfig.url",
        ),
        (
            "nohooks",
            lab_push("https://hooks.example.com/h"),
            -32010,
            "",
        ),
    ] {
        let task_id = format!("t-{}", new_id());
        let v = s
            .call(
                agent_id,
                "message/send",
                json!({"id": task_id, "message": lab_message("x"), "pushNotificationConfig": push}),
            )
            .await;
        assert_eq!(v["error"]["code"], code, "{push}: {v}");
        if !field.is_empty() {
            assert_eq!(v["error"]["data"]["field"], field, "{push}: {v}");
        }
        let get = s
            .call(agent_id, "tasks/get", json!({"taskId": task_id}))
            .await;
        assert_eq!(get["error"]["code"], -32000, "no task was created: {get}");
    }
    let both = s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": "https://a.example/h"}, "pushNotificationConfig": lab_push("https://a.example/h")}),
        )
        .await;
    assert_eq!(both["error"]["code"], -32602);
}

#[tokio::test]
async fn a_browser_file_without_a_type_is_refused_with_how_to_fix_it() {
    let s = TestServer::start(config(&["echo"])).await;
    let v = s
        .call(
            "echo",
            "message/send",
            json!({"message": {"role": "user", "messageId": new_id(), "parts": [
                {"type": "text", "text": "see attached"},
                {"type": "file", "file": {"name": "notes.xyz", "mimeType": "", "bytes": "aGk="}}
            ]}}),
        )
        .await;
    assert_eq!(v["error"]["code"], -32602);
    assert_eq!(
        v["error"]["data"]["field"],
        "message.parts[1].file.mimeType"
    );
    let reason = v["error"]["data"]["reason"].as_str().expect("reason");
    assert!(
        reason.contains("is empty") && reason.contains("text/plain"),
        "{reason}"
    );
}
