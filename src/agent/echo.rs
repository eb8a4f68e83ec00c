//! The `echo` backend: replies with what it was sent, as CONFIG.md describes.

use std::time::Duration;

use super::{Agent, AgentError, AgentFuture, AgentRequest, Updates};
use crate::config::EchoConfig;
use crate::model::{Message, Part};

/// Replies `echo: <text>`, one line per file part, then `turn <n>`.
#[derive(Clone, Debug, Default)]
pub struct EchoAgent {
    config: EchoConfig,
}

impl EchoAgent {
    /// An echo agent with these options.
    pub fn new(config: EchoConfig) -> Self {
        Self { config }
    }

    /// The reply to a message in turn `turn`.
    pub fn reply(message: &Message, turn: u32) -> Message {
        let mut parts = Vec::with_capacity(message.parts.len() + 2);
        parts.push(Part::Text(format!("echo: {}", message.joined_text())));
        for part in &message.parts {
            if let Part::File(f) = part {
                parts.push(Part::Text(format!(
                    "file {} ({}, {} bytes)",
                    f.name, f.mime_type, f.size
                )));
            }
        }
        parts.push(Part::Text(format!("turn {turn}")));
        let mut reply = Message::agent_text(std::iter::empty::<String>());
        reply.parts = parts;
        reply
    }
}

impl Agent for EchoAgent {
    fn kind(&self) -> &str {
        "echo"
    }

    /// The echo has no side effects: running a task again gives the same result.
    fn resumable(&self) -> bool {
        true
    }

    fn run(&self, request: AgentRequest, updates: Updates) -> AgentFuture {
        let config = self.config.clone();
        Box::pin(async move {
            let steps = config.progress_steps;
            let delay = Duration::from_millis(config.delay_ms);
            // N progress updates spread over delay_ms: one every delay/(N+1), the reply at delay.
            let pause = delay / (steps + 1);
            for k in 1..=steps {
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
                updates.ready().await;
                updates.progress(Message::agent_text([format!("progress {k}/{steps}")]));
            }
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            if config.fail {
                return Err(AgentError::new("echo backend is configured to fail"));
            }
            Ok(EchoAgent::reply(&request.message, request.turn))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FileContent, Role};

    #[test]
    fn the_reply_lists_echo_then_files_then_turn() {
        let m = Message {
            role: Role::User,
            parts: vec![
                Part::Text("hi".into()),
                Part::File(Box::new(FileContent {
                    name: "a.txt".into(),
                    mime_type: "text/plain".into(),
                    bytes: "aGk=".into(),
                    size: 2,
                })),
                Part::Text("there".into()),
            ],
            message_id: "m".into(),
        };
        let r = EchoAgent::reply(&m, 3);
        let texts: Vec<_> = r.parts.iter().filter_map(Part::as_text).collect();
        assert_eq!(
            texts,
            [
                "echo: hi\nthere",
                "file a.txt (text/plain, 2 bytes)",
                "turn 3"
            ]
        );
        assert_eq!(r.role, Role::Agent);
    }
}
