//! The `echo` backend: replies with what it was sent, as CONFIG.md describes.

use std::time::Duration;

use super::{Agent, AgentError, AgentFuture, AgentRequest, Updates};
use crate::config::EchoConfig;
use crate::model::{Extensions, Message, Part};

/// Replies `echo: <text>`, one line per file part, the data parts, the activated
/// extensions, then `turn <n>` (docs/CONFIG.md, docs/PROTOCOL.md §12).
#[derive(Clone, Debug, Default)]
pub struct EchoAgent {
    config: EchoConfig,
}

impl EchoAgent {
    /// An echo agent with these options.
    pub fn new(config: EchoConfig) -> Self {
        Self { config }
    }

    /// The reply to a message in turn `turn` of a request that activated `extensions`.
    pub fn reply(message: &Message, turn: u32, extensions: &Extensions) -> Message {
        // Sized exactly: the reply is kept with its task for the retention.
        let (mut texts, mut text_bytes, mut others) = (0, 0, 0);
        for part in &message.parts {
            match part {
                Part::Text(t) => (texts, text_bytes) = (texts + 1, text_bytes + t.len()),
                Part::File(_) | Part::Url(_) | Part::Data(_) => others += 1,
            }
        }
        let mut parts = Vec::with_capacity(2 + others + usize::from(!extensions.is_empty()));
        let mut echo = String::with_capacity("echo: ".len() + text_bytes + texts.max(1) - 1);
        echo.push_str("echo: ");
        message.push_joined_text(&mut echo);
        parts.push(Part::Text(echo));
        for part in &message.parts {
            match part {
                Part::File(f) => parts.push(Part::Text(format!(
                    "file {} ({}, {} bytes)",
                    f.name, f.mime_type, f.size
                ))),
                Part::Url(u) => parts.push(Part::Text(format!(
                    "file {} ({}, {})",
                    u.name.as_deref().unwrap_or("unnamed"),
                    u.mime_type.as_deref().unwrap_or("application/octet-stream"),
                    u.url
                ))),
                Part::Text(_) | Part::Data(_) => {}
            }
        }
        parts.extend(
            message
                .parts
                .iter()
                .filter(|p| matches!(p, Part::Data(_)))
                .cloned(),
        );
        if !extensions.is_empty() {
            parts.push(Part::Text(format!(
                "extensions: {}",
                extensions.as_slice().join(", ")
            )));
        }
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(turn);
        let mut said = String::with_capacity("turn ".len() + digits.len());
        said.push_str("turn ");
        said.push_str(digits);
        parts.push(Part::Text(said));
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
            Ok(EchoAgent::reply(
                &request.message,
                request.turn,
                &request.extensions,
            ))
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
                    metadata: None,
                })),
                Part::Text("there".into()),
            ],
            message_id: "m".into(),
            extensions: Extensions::default(),
        };
        let r = EchoAgent::reply(&m, 3, &Extensions::default());
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

    #[test]
    fn an_empty_text_part_joins_as_joined_text_joins_it() {
        let m = Message::agent_text(["", "b", "", "c"].map(String::from));
        // Leading empty texts add nothing; after the first text each adds its newline.
        let mut s = String::from("echo: ");
        m.push_joined_text(&mut s);
        assert_eq!(s, "echo: b\n\nc");
        assert_eq!(m.joined_text(), "b\n\nc");
    }
}
