//! The model pieces the official dialects need, through the runtime's public API (no
//! HTTP): interrupted states and continuing a task, artifacts and artifact events,
//! rejected tasks, direct replies, several push configurations per task, and ListTasks.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use a2ad::config::AgentConfig;
use a2ad::model::Artifact;
use a2ad::push::{PushConfig, StoredPushConfig};
use a2ad::runtime::{ListQuery, Sent, Streamed, SubmitOptions, TaskIdUse};
use a2ad::{
    Agent, AgentError, AgentFuture, AgentId, AgentRequest, Config, Error, Message, Outcome,
    OutcomeFuture, Part, Runtime, SendRequest, TaskId, TaskState, Updates,
};

/// Asks a question first; answers once it is continued. Texts steer it: `reject`,
/// `artifacts` (one whole artifact and one in two chunks), `direct` (a direct reply).
struct Interviewer;

impl Agent for Interviewer {
    fn kind(&self) -> &str {
        "interviewer"
    }

    fn run(&self, _request: AgentRequest, _updates: Updates) -> AgentFuture {
        Box::pin(async { Err(AgentError::new("run_task is used")) })
    }

    fn run_task(&self, request: AgentRequest, updates: Updates) -> OutcomeFuture {
        Box::pin(async move {
            let text = request.message.joined_text();
            if text == "reject" {
                return Ok(Outcome::Rejected(Some(Message::agent_text(["no"]))));
            }
            if text == "artifacts" {
                updates.artifact(
                    Artifact::new(Some("whole"), vec![Part::Text("all of it".into())]),
                    false,
                    true,
                );
                let mut chunk = Artifact::new(Some("chunked"), vec![Part::Text("part 1".into())]);
                chunk.artifact_id = "chunked-1".into();
                updates.artifact(chunk.clone(), false, false);
                chunk.parts = vec![Part::Text("part 2".into())];
                updates.artifact(chunk, true, true);
                return Ok(Outcome::Completed(Some(Message::agent_text(["done"]))));
            }
            if request.task_history.is_empty() {
                return Ok(Outcome::InputRequired(Some(Message::agent_text([
                    "your name?",
                ]))));
            }
            if request.cancel.is_cancelled() {
                // A continued run gets a token of its own, not the ended run's.
                return Err(AgentError::new(
                    "the continued run's token is already cancelled",
                ));
            }
            let asked = request.task_history.len();
            Ok(Outcome::Completed(Some(Message::agent_text([format!(
                "hello {text} (after {asked} earlier messages)"
            )]))))
        })
    }

    fn direct_reply(&self, message: &Message) -> Option<Message> {
        (message.joined_text() == "direct").then(|| Message::agent_text(["direct answer"]))
    }
}

async fn runtime() -> Runtime {
    let mut agent = AgentConfig::new("iv");
    agent.limits.requests_per_minute = 1_000_000;
    let config = Config {
        agents: vec![agent],
        store: support::test_store(),
        cluster: support::test_cluster(),
        ..Config::default()
    }
    .validated()
    .expect("valid");
    Runtime::builder(Arc::new(config))
        .agent("iv", Interviewer)
        .start()
        .await
        .expect("runtime")
}

fn request(text: &str, task: Option<&TaskId>) -> SendRequest {
    SendRequest {
        message: Message {
            role: a2ad::Role::User,
            parts: vec![Part::Text(text.into())],
            message_id: uuid::Uuid::new_v4().to_string(),
            extensions: Default::default(),
        },
        context_id: None,
        task_id: task.cloned(),
        metadata: None,
        extensions: Default::default(),
    }
}

fn continuing() -> SubmitOptions {
    let mut o = SubmitOptions::default();
    o.task_id = TaskIdUse::Continue;
    o
}

fn task(sent: Sent) -> a2ad::TaskSnapshot {
    match sent {
        Sent::Task(t) => t,
        Sent::Message(m) => panic!("a task was expected, got {m:?}"),
    }
}

const WAIT: Option<Duration> = Some(Duration::from_secs(20));

#[tokio::test]
async fn an_input_required_task_waits_and_a_message_naming_it_completes_it() {
    let rt = runtime().await;
    let (alice, agent) = ("alice".into(), AgentId::new("iv"));
    let asked = task(
        rt.send_with(
            &alice,
            &agent,
            request("hi", None),
            WAIT,
            SubmitOptions::default(),
        )
        .await
        .expect("send"),
    );
    assert_eq!(
        asked.status.state,
        TaskState::InputRequired,
        "the blocking send returns at the interruption"
    );
    assert!(!asked.status.state.is_terminal() && asked.status.state.ends_stream());
    // Still a live task: another principal cannot see or continue it.
    let other = rt
        .send_with(
            &"bob".into(),
            &agent,
            request("Ann", Some(&asked.id)),
            WAIT,
            continuing(),
        )
        .await;
    assert!(
        matches!(other, Err(Error::TaskNotFound { .. })),
        "{other:?}"
    );
    let done = task(
        rt.send_with(
            &alice,
            &agent,
            request("Ann", Some(&asked.id)),
            WAIT,
            continuing(),
        )
        .await
        .expect("continue"),
    );
    assert_eq!(done.id, asked.id);
    assert_eq!(done.status.state, TaskState::Completed);
    let reply = done.status.message.as_ref().expect("reply").joined_text();
    assert_eq!(reply, "hello Ann (after 2 earlier messages)");
    assert_eq!(done.history.len(), 4, "hi, the question, Ann, the answer");
    // A finished task cannot be continued, nor one that does not exist.
    let again = rt
        .send_with(
            &alice,
            &agent,
            request("more", Some(&asked.id)),
            WAIT,
            continuing(),
        )
        .await;
    assert!(
        matches!(
            again,
            Err(Error::TaskNotContinuable {
                state: TaskState::Completed,
                ..
            })
        ),
        "{again:?}"
    );
    let nowhere = rt
        .send_with(
            &alice,
            &agent,
            request("x", Some(&TaskId::new("nope"))),
            WAIT,
            continuing(),
        )
        .await;
    assert!(matches!(nowhere, Err(Error::TaskNotFound { .. })));
}

#[tokio::test]
async fn a_stream_ends_at_the_interruption_and_a_continued_stream_follows_the_new_run() {
    let rt = runtime().await;
    let (alice, agent) = ("alice".into(), AgentId::new("iv"));
    let Streamed::Task(mut first) = rt
        .stream_with(
            &alice,
            &agent,
            request("hi", None),
            SubmitOptions::default(),
        )
        .await
        .expect("stream")
    else {
        panic!("a task stream")
    };
    let mut states = Vec::new();
    while let Some(item) = first.next().await {
        states.push(item.status.state);
    }
    assert_eq!(
        states,
        [
            TaskState::Submitted,
            TaskState::Working,
            TaskState::InputRequired
        ]
    );
    let id = first.task_id.clone();
    let Streamed::Task(mut second) = rt
        .stream_with(&alice, &agent, request("Bo", Some(&id)), continuing())
        .await
        .expect("continue")
    else {
        panic!("a task stream")
    };
    let mut seqs = Vec::new();
    let mut last = None;
    while let Some(item) = second.next().await {
        seqs.push(item.seq);
        last = Some(item.status.state);
    }
    assert_eq!(seqs, [4, 5], "numbering goes on: working, completed");
    assert_eq!(last, Some(TaskState::Completed));
}

#[tokio::test]
async fn artifacts_are_events_and_chunks_are_merged_in_the_task() {
    let rt = runtime().await;
    let (alice, agent) = ("alice".into(), AgentId::new("iv"));
    let Streamed::Task(mut s) = rt
        .stream_with(
            &alice,
            &agent,
            request("artifacts", None),
            SubmitOptions::default(),
        )
        .await
        .expect("stream")
    else {
        panic!("a task stream")
    };
    let mut updates = Vec::new();
    let mut final_task = None;
    while let Some(item) = s.next().await {
        if let Some(a) = &item.artifact {
            updates.push((a.artifact.artifact_id.clone(), a.append, a.last_chunk));
        }
        final_task = Some(item.task.clone());
    }
    assert_eq!(updates.len(), 3);
    assert_eq!(updates[1], ("chunked-1".to_string(), false, false));
    assert_eq!(updates[2], ("chunked-1".to_string(), true, true));
    let t = final_task.expect("events");
    assert_eq!(t.status.state, TaskState::Completed);
    assert_eq!(t.artifacts.len(), 2);
    let chunked = t
        .artifacts
        .iter()
        .find(|a| a.artifact_id == "chunked-1")
        .expect("merged");
    assert_eq!(
        chunked.parts,
        vec![Part::Text("part 1".into()), Part::Text("part 2".into())]
    );
    let got = rt.get(&alice, &agent, &t.id).await.expect("get");
    assert_eq!(got.artifacts.len(), 2, "kept in the finished record");
}

#[tokio::test]
async fn a_rejected_task_is_terminal_and_a_direct_reply_makes_no_task() {
    let rt = runtime().await;
    let (alice, agent) = ("alice".into(), AgentId::new("iv"));
    let t = task(
        rt.send_with(
            &alice,
            &agent,
            request("reject", None),
            WAIT,
            SubmitOptions::default(),
        )
        .await
        .expect("send"),
    );
    assert_eq!(t.status.state, TaskState::Rejected);
    assert!(t.status.state.is_terminal());
    let mut allowed = SubmitOptions::default();
    allowed.allow_message = true;
    match rt
        .send_with(&alice, &agent, request("direct", None), WAIT, allowed)
        .await
        .expect("send")
    {
        Sent::Message(m) => assert_eq!(m.joined_text(), "direct answer"),
        Sent::Task(t) => panic!("no task expected: {t:?}"),
    }
    let page = rt.list(&list_query()).await.expect("list");
    assert_eq!(page.total, 1, "the direct reply created no task");
}

fn list_query() -> ListQuery {
    ListQuery {
        principal: "alice".into(),
        agent: AgentId::new("iv"),
        context: None,
        state: None,
        status_after: None,
        page_size: 50,
        after: None,
    }
}

#[tokio::test]
async fn list_tasks_pages_newest_first_filters_and_never_shows_another_principals() {
    let rt = runtime().await;
    let (alice, agent) = ("alice".into(), AgentId::new("iv"));
    let mut ids = Vec::new();
    for i in 0..5 {
        let text = if i % 2 == 0 { "reject" } else { "hi" };
        let t = task(
            rt.send_with(
                &alice,
                &agent,
                request(text, None),
                WAIT,
                SubmitOptions::default(),
            )
            .await
            .expect("send"),
        );
        ids.push(t.id);
    }
    rt.send_with(
        &"bob".into(),
        &agent,
        request("hi", None),
        WAIT,
        SubmitOptions::default(),
    )
    .await
    .expect("bob");
    let mut q = list_query();
    q.page_size = 2;
    let mut seen = Vec::new();
    loop {
        let page = rt.list(&q).await.expect("list");
        assert_eq!(page.total, 5);
        seen.extend(page.tasks.iter().map(|t| t.id.clone()));
        match page.next {
            Some(next) => q.after = Some(next),
            None => break,
        }
    }
    ids.reverse();
    assert_eq!(seen, ids, "newest status first, every task once");
    let mut only = list_query();
    only.state = Some(TaskState::InputRequired);
    assert_eq!(rt.list(&only).await.expect("list").total, 2);
}

#[tokio::test]
async fn a_task_holds_several_named_push_configurations_within_the_cap() {
    let rt = runtime().await;
    let (alice, agent) = ("alice".into(), AgentId::new("iv"));
    let t = task(
        rt.send_with(
            &alice,
            &agent,
            request("hi", None),
            WAIT,
            SubmitOptions::default(),
        )
        .await
        .expect("send"),
    );
    let key = a2ad::model::TaskKey {
        principal: alice.clone(),
        agent: agent.clone(),
        task: t.id.clone(),
    };
    let cap = rt.config().webhooks.max_configs_per_task;
    for i in 0..cap {
        let c = StoredPushConfig::named(
            &key,
            Some(format!("c{i}")),
            PushConfig::new("http://127.0.0.1:9/h"),
            "test",
        );
        rt.set_push(c).await.expect("within the cap");
    }
    let over = StoredPushConfig::named(
        &key,
        Some("one-more".into()),
        PushConfig::new("http://127.0.0.1:9/h"),
        "test",
    );
    assert!(matches!(
        rt.set_push(over).await,
        Err(Error::InvalidParams { .. })
    ));
    let same = StoredPushConfig::named(
        &key,
        Some("c0".into()),
        PushConfig::new("http://127.0.0.1:9/other"),
        "test",
    );
    rt.set_push(same).await.expect("the same id replaces");
    let configs = rt
        .task_push_configs(&alice, &agent, &t.id)
        .await
        .expect("list");
    assert_eq!(configs.len(), cap);
    assert!(
        configs
            .iter()
            .any(|c| c.id == "c0" && c.config.url.ends_with("/other"))
    );
    rt.delete_push(&alice, &agent, &t.id, "c1")
        .await
        .expect("delete");
    rt.delete_push(&alice, &agent, &t.id, "c1")
        .await
        .expect("idempotent");
    assert_eq!(
        rt.task_push_configs(&alice, &agent, &t.id)
            .await
            .expect("list")
            .len(),
        cap - 1
    );
    let foreign = rt.task_push_configs(&"bob".into(), &agent, &t.id).await;
    assert!(matches!(foreign, Err(Error::TaskNotFound { .. })));
}
