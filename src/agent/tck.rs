//! The `tck` backend: behaves as the official conformance kit (a2aproject/a2a-tck)
//! expects of its system under test, keyed on the prefix of each message's `messageId`
//! (the kit's `scenarios/*.feature`). See docs/CONFIG.md.

use std::time::Duration;

use super::{Agent, AgentError, AgentFuture, AgentRequest, Outcome, OutcomeFuture, Updates};
use crate::config::TckConfig;
use crate::model::{Artifact, DataPart, FileContent, FileUrl, Message, Part, RawJson};

/// The conformance backend.
#[derive(Clone, Debug, Default)]
pub struct TckAgent {
    config: TckConfig,
}

impl TckAgent {
    /// A conformance backend with these options.
    pub fn new(config: TckConfig) -> Self {
        Self { config }
    }
}

fn text(t: &str) -> Part {
    Part::Text(t.to_string())
}

fn file() -> Part {
    Part::File(Box::new(FileContent {
        name: "output.txt".into(),
        mime_type: "text/plain".into(),
        bytes: "dGNr".into(), // "tck"
        size: 3,
        metadata: None,
    }))
}

fn artifact(updates: &Updates, parts: Vec<Part>) {
    updates.artifact(Artifact::new(None, parts), false, true);
}

fn done() -> Result<Outcome, AgentError> {
    Ok(Outcome::Completed(None))
}

impl Agent for TckAgent {
    fn kind(&self) -> &str {
        "tck"
    }

    fn run(&self, _request: AgentRequest, _updates: Updates) -> AgentFuture {
        Box::pin(async { Err(AgentError::new("the tck backend runs tasks with run_task")) })
    }

    fn run_task(&self, request: AgentRequest, updates: Updates) -> OutcomeFuture {
        let long = Duration::from_millis(self.config.long_running_ms);
        Box::pin(async move {
            let id = request.message.message_id.as_str();
            let starts = |p: &str| id.starts_with(p);
            if starts("tck-stream-artifact-chunked") {
                let mut chunk = Artifact::new(None, vec![text("chunk-1 ")]);
                updates.artifact(chunk.clone(), false, false);
                chunk.parts = vec![text("chunk-2")];
                updates.artifact(chunk, true, true);
                return done();
            }
            if starts("test-resubscribe-message-id") {
                tokio::time::sleep(long).await;
                return done();
            }
            let artifact_text = [
                ("tck-stream-artifact-text", "Streamed text content"),
                ("tck-stream-ordering-001", "Ordered output"),
                ("tck-stream-001", "Stream hello from TCK"),
                ("tck-stream-003", "Stream task lifecycle"),
            ];
            if let Some((_, t)) = artifact_text.iter().find(|(p, _)| starts(p)) {
                artifact(&updates, vec![text(t)]);
                return done();
            }
            if starts("tck-stream-artifact-file") || starts("tck-artifact-file") {
                if starts("tck-artifact-file-url") {
                    artifact(
                        &updates,
                        vec![Part::Url(Box::new(FileUrl {
                            url: "https://example.com/output.txt".into(),
                            name: Some("output.txt".into()),
                            mime_type: Some("text/plain".into()),
                            metadata: None,
                        }))],
                    );
                } else {
                    artifact(&updates, vec![file()]);
                }
                return done();
            }
            if starts("tck-stream-002") {
                return done();
            }
            if starts("tck-artifact-text") {
                artifact(&updates, vec![text("Generated text content")]);
                return done();
            }
            if starts("tck-artifact-data") {
                let data = serde_json::value::RawValue::from_string(
                    r#"{"key":"value","count":42}"#.to_string(),
                )
                .map_err(|_| AgentError::new("data"))?;
                let data = DataPart::new(RawJson::from_raw(data));
                artifact(&updates, vec![Part::Data(Box::new(data))]);
                return done();
            }
            if starts("tck-stream-") {
                // Any other streaming scenario: working, one text artifact, completed.
                artifact(&updates, vec![text("Streamed output")]);
                return done();
            }
            if starts("tck-input-required") {
                return Ok(Outcome::InputRequired(None));
            }
            if starts("tck-reject-task") {
                return Ok(Outcome::Rejected(Some(Message::agent_text(["rejected"]))));
            }
            if starts("tck-complete-task") {
                return Ok(Outcome::Completed(Some(Message::agent_text([
                    "Hello from TCK",
                ]))));
            }
            if !starts("tck-") {
                // The 0.3 kit's generic messages: a conversation that waits for more input,
                // so its tests can continue and cancel the task after a blocking send.
                let said = request
                    .message
                    .parts
                    .iter()
                    .find_map(|p| match p {
                        Part::Text(t) => Some(t.as_str()),
                        _ => None,
                    })
                    .unwrap_or("");
                return Ok(Outcome::InputRequired(Some(Message::agent_text([
                    format!("Hello World! You said: '{said}'. Send more, or cancel the task."),
                ]))));
            }
            Ok(Outcome::Completed(Some(Message::agent_text([format!(
                "Unhandled messageId prefix: {id}"
            )]))))
        })
    }

    fn direct_reply(&self, message: &Message) -> Option<Message> {
        message
            .message_id
            .starts_with("tck-message-response")
            .then(|| Message::agent_text(["Direct message response"]))
    }
}
