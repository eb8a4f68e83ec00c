//! The `openai` backend: any OpenAI-compatible Chat Completions endpoint (OpenAI, Ollama,
//! vLLM, llama.cpp server, LM Studio).
//!
//! It always asks for a streamed answer and turns each content chunk into a transient
//! `working` update, so `message/stream` clients see tokens arrive; the final reply holds
//! the whole text. Cancellation drops this future, which drops the upstream response and
//! closes its connection at once. Errors name what happened upstream and never carry the
//! key, headers or the upstream's own error text.

use std::time::Duration;

use serde_json::{Value, json};

use super::{Agent, AgentError, AgentFuture, AgentRequest, Updates};
use crate::config::OpenAiConfig;
use crate::model::{Message, Part, Role};

/// A chat model behind an OpenAI-compatible API.
#[derive(Clone)]
pub struct OpenAiAgent {
    config: OpenAiConfig,
    endpoint: String,
    /// The upstream key, read once from `api_key_env` at start-up.
    key: Option<String>,
    client: reqwest::Client,
    /// The longest reply, in Unicode scalar values (the agent's `max_message_length`).
    max_reply_chars: usize,
}

impl std::fmt::Debug for OpenAiAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiAgent")
            .field("endpoint", &self.endpoint)
            .field("model", &self.config.model)
            .field("key", &self.key.as_ref().map(|_| "***"))
            .finish()
    }
}

impl OpenAiAgent {
    /// A backend for this configuration, whose replies are capped at the default
    /// `max_message_length`. The key is read from `api_key_env` now.
    pub fn new(config: OpenAiConfig) -> Self {
        Self::with_reply_limit(
            config,
            crate::config::AgentLimits::DEFAULT_MAX_MESSAGE_LENGTH,
        )
    }

    /// A backend whose replies may hold at most `max_reply_chars` Unicode scalar values
    /// (past that the task fails "reply too large").
    pub fn with_reply_limit(config: OpenAiConfig, max_reply_chars: usize) -> Self {
        let key = config
            .api_key_env
            .as_ref()
            .and_then(|var| std::env::var(var).ok())
            .filter(|k| !k.is_empty());
        let endpoint = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10).min(timeout(&config)))
            .build()
            .unwrap_or_default();
        Self {
            config,
            endpoint,
            key,
            client,
            max_reply_chars,
        }
    }

    /// The request body for a task: system prompt, bounded history, this message.
    pub fn request_body(config: &OpenAiConfig, request: &AgentRequest) -> Value {
        let mut messages = Vec::new();
        if let Some(system) = &config.system_prompt {
            messages.push(json!({"role": "system", "content": system}));
        }
        // Earlier turns come as user/agent pairs; keep the last `max_history_turns` turns.
        let keep = config.max_history_turns.saturating_mul(2);
        let history = &request.history[request.history.len().saturating_sub(keep)..];
        for m in history {
            messages.push(chat_message(m));
        }
        messages.push(chat_message(&request.message));
        let mut body = json!({
            "model": config.model,
            "messages": messages,
            "stream": true,
        });
        if let Some(t) = config.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(n) = config.max_tokens {
            body["max_tokens"] = json!(n);
        }
        body
    }

    async fn complete(
        &self,
        request: AgentRequest,
        updates: Updates,
    ) -> Result<Message, AgentError> {
        let body = Self::request_body(&self.config, &request);
        let mut req = self
            .client
            .post(&self.endpoint)
            .header("accept", "text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(key) = &self.key {
            req = req.bearer_auth(key);
        }
        if crate::telemetry::on() {
            // The run's span (`a2a.agent.run`) travels with the upstream call.
            let mut headers = hyper::HeaderMap::new();
            crate::telemetry::inject_current(&mut headers);
            req = req.headers(headers);
        }
        let mut resp = req.send().await.map_err(|e| {
            if e.is_connect() {
                AgentError::new("upstream connection failed: the model server is unreachable")
            } else {
                AgentError::new("upstream request failed before an answer arrived")
            }
        })?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(AgentError::new(match status {
                401 | 403 => format!("upstream rejected the credentials (HTTP {status})"),
                429 => "upstream rate limited the request (HTTP 429)".to_string(),
                s if s >= 500 => format!("upstream server error (HTTP {s})"),
                s => format!("upstream refused the request (HTTP {s})"),
            }));
        }
        let is_stream = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let limit = self.config.max_response_bytes;
        let mut received = 0usize;
        let mut next_chunk =
            async |resp: &mut reqwest::Response| -> Result<Option<bytes::Bytes>, AgentError> {
                let chunk = resp.chunk().await.map_err(|_| broken())?;
                if let Some(c) = &chunk {
                    received = received.saturating_add(c.len());
                    if received > limit {
                        return Err(AgentError::new(format!(
                            "upstream answer too large (over {limit} bytes)"
                        )));
                    }
                }
                Ok(chunk)
            };
        if !is_stream {
            // Some servers ignore `stream: true` and answer with one JSON object.
            let mut bytes = Vec::new();
            while let Some(chunk) = next_chunk(&mut resp).await? {
                bytes.extend_from_slice(&chunk);
            }
            let v: Value = serde_json::from_slice(&bytes).map_err(|_| malformed())?;
            let text = v["choices"][0]["message"]["content"]
                .as_str()
                .ok_or_else(malformed)?;
            if text.chars().count() > self.max_reply_chars {
                return Err(self.too_large());
            }
            return Ok(Message::agent_text([text]));
        }
        let mut parser = SseLines::default();
        let mut text = String::new();
        let mut chars = 0usize;
        let mut finished = false;
        loop {
            // A store that falls behind holds the upstream up (its socket stops being read)
            // rather than letting its chunks pile up.
            updates.ready().await;
            let Some(chunk) = next_chunk(&mut resp).await? else {
                break;
            };
            for data in parser.push(&chunk)? {
                if data == "[DONE]" {
                    finished = true;
                    break;
                }
                let v: Value = serde_json::from_str(&data).map_err(|_| malformed())?;
                if v.get("error").is_some() {
                    return Err(AgentError::new("upstream reported an error mid-stream"));
                }
                let choice = &v["choices"][0];
                if let Some(delta) = choice["delta"]["content"].as_str()
                    && !delta.is_empty()
                {
                    chars = chars.saturating_add(delta.chars().count());
                    if chars > self.max_reply_chars {
                        return Err(self.too_large());
                    }
                    text.push_str(delta);
                    updates.partial(Message::agent_text([delta]));
                }
                if !choice["finish_reason"].is_null() {
                    finished = true;
                }
            }
            if finished && parser.done {
                break;
            }
        }
        if !finished {
            return Err(AgentError::new(
                "upstream stream ended before the answer was complete",
            ));
        }
        Ok(Message::agent_text([text]))
    }

    fn too_large(&self) -> AgentError {
        AgentError::new(format!(
            "reply too large: the model's answer passed {} characters (the agent's max_message_length)",
            self.max_reply_chars
        ))
    }
}

impl Agent for OpenAiAgent {
    fn kind(&self) -> &str {
        "llm"
    }

    fn run(&self, request: AgentRequest, updates: Updates) -> AgentFuture {
        let this = self.clone();
        Box::pin(async move {
            let limit = timeout(&this.config);
            match tokio::time::timeout(limit, this.complete(request, updates)).await {
                Ok(result) => result,
                Err(_) => Err(AgentError::new(format!(
                    "upstream did not finish within {} s",
                    limit.as_secs_f64()
                ))),
            }
        })
    }
}

fn timeout(config: &OpenAiConfig) -> Duration {
    Duration::try_from_secs_f64(config.request_timeout_seconds).unwrap_or(Duration::from_secs(120))
}

fn malformed() -> AgentError {
    AgentError::new("upstream sent a malformed response")
}

fn broken() -> AgentError {
    AgentError::new("upstream connection broke during the answer")
}

/// One chat message: text parts as text, `image/*` files as image parts (data URLs),
/// other files described by name, type and size.
fn chat_message(m: &Message) -> Value {
    let role = match m.role {
        Role::User => "user",
        Role::Agent => "assistant",
    };
    let has_image = m
        .parts
        .iter()
        .any(|p| matches!(p, Part::File(f) if is_image(&f.mime_type)));
    if !has_image || m.role == Role::Agent {
        let text: Vec<String> = m
            .parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.clone(),
                Part::File(f) => describe_file(f),
                Part::Data(d) => d.data.get().to_string(),
                Part::Url(u) => format!("[file at {}]", u.url),
            })
            .collect();
        return json!({"role": role, "content": text.join("\n")});
    }
    let content: Vec<Value> = m
        .parts
        .iter()
        .map(|p| match p {
            Part::Text(t) => json!({"type": "text", "text": t}),
            Part::File(f) if is_image(&f.mime_type) => json!({
                "type": "image_url",
                "image_url": {"url": format!("data:{};base64,{}", essence(&f.mime_type), f.bytes)},
            }),
            Part::File(f) => json!({"type": "text", "text": describe_file(f)}),
            Part::Data(d) => json!({"type": "text", "text": d.data.get()}),
            Part::Url(u) => json!({"type": "text", "text": format!("[file at {}]", u.url)}),
        })
        .collect();
    json!({"role": role, "content": content})
}

fn is_image(mime: &str) -> bool {
    essence(mime).starts_with("image/")
}

fn essence(mime: &str) -> String {
    mime.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn describe_file(f: &crate::model::FileContent) -> String {
    format!("[file {} ({}, {} bytes)]", f.name, f.mime_type, f.size)
}

/// The longest SSE line an upstream may send (one chunk of a chat stream is far smaller).
const MAX_LINE: usize = 1 << 20;

/// Splits an SSE byte stream into the payloads of its `data:` fields. Each byte is looked
/// at once: a partial line is kept with how far it was already searched for its end.
#[derive(Default)]
struct SseLines {
    buf: Vec<u8>,
    /// Bytes of `buf` known to hold no newline.
    scanned: usize,
    done: bool,
}

impl SseLines {
    /// Feeds bytes; returns the complete `data:` payloads they finish, or an error once a
    /// line passes [`MAX_LINE`] without ending.
    fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, AgentError> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        // Where the current line starts, and where its end is still to be looked for.
        let (mut start, mut from) = (0, self.scanned);
        while let Some(end) = self.buf[from..]
            .iter()
            .position(|&b| b == b'\n')
            .map(|p| p + from)
        {
            let line = String::from_utf8_lossy(&self.buf[start..end]);
            let line = line.trim_end_matches('\r');
            if let Some(data) = line.strip_prefix("data:") {
                let data = data.trim_start().to_string();
                if data == "[DONE]" {
                    self.done = true;
                }
                out.push(data);
            }
            start = end + 1;
            from = start;
        }
        self.buf.drain(..start);
        self.scanned = self.buf.len();
        if self.buf.len() > MAX_LINE {
            return Err(AgentError::new(format!(
                "upstream sent a line longer than {MAX_LINE} bytes"
            )));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::FileContent;
    use std::sync::Arc;

    fn text(role: Role, t: &str) -> Arc<Message> {
        Arc::new(Message {
            role,
            parts: vec![Part::Text(t.into())],
            message_id: "m".into(),
            extensions: Default::default(),
        })
    }

    #[test]
    fn the_body_has_system_prompt_bounded_history_and_the_message() {
        let mut c = OpenAiConfig::new("http://x/v1", "m1");
        c.system_prompt = Some("be brief".into());
        c.max_history_turns = 1;
        c.temperature = Some(0.2);
        let request = AgentRequest {
            task_history: Vec::new(),
            task_id: "t".into(),
            context_id: crate::model::ContextId::new("c"),
            message: text(Role::User, "third"),
            history: vec![
                text(Role::User, "first"),
                text(Role::Agent, "one"),
                text(Role::User, "second"),
                text(Role::Agent, "two"),
            ],
            turn: 3,
            cancel: Default::default(),
            extensions: Default::default(),
            principal: crate::model::Principal::new("alice"),
            note: None,
            taken_up: false,
            artifacts: Vec::new(),
        };
        let body = OpenAiAgent::request_body(&c, &request);
        assert_eq!(body["model"], "m1");
        assert_eq!(body["stream"], true);
        assert_eq!(body["temperature"], 0.2);
        assert_eq!(
            body["messages"],
            json!([
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "second"},
                {"role": "assistant", "content": "two"},
                {"role": "user", "content": "third"},
            ])
        );
    }

    #[test]
    fn images_become_data_urls_and_other_files_are_described() {
        let m = Message {
            role: Role::User,
            parts: vec![
                Part::Text("look".into()),
                Part::File(Box::new(FileContent {
                    name: "p.png".into(),
                    mime_type: "image/png".into(),
                    bytes: "iVBORw0KGgo=".into(),
                    size: 8,
                    metadata: None,
                })),
                Part::File(Box::new(FileContent {
                    name: "d.pdf".into(),
                    mime_type: "application/pdf".into(),
                    bytes: "JVBERi0=".into(),
                    size: 5,
                    metadata: None,
                })),
            ],
            message_id: "m".into(),
            extensions: Default::default(),
        };
        let v = chat_message(&m);
        assert_eq!(v["content"][0], json!({"type": "text", "text": "look"}));
        assert_eq!(
            v["content"][1]["image_url"]["url"],
            "data:image/png;base64,iVBORw0KGgo="
        );
        assert_eq!(
            v["content"][2]["text"],
            "[file d.pdf (application/pdf, 5 bytes)]"
        );
    }

    #[test]
    fn sse_lines_split_across_chunks() {
        let mut p = SseLines::default();
        assert!(p.push(b"data: {\"a\"").expect("line").is_empty());
        assert_eq!(
            p.push(b":1}\n\n: keep-alive\ndata: [DONE]\n")
                .expect("lines"),
            ["{\"a\":1}", "[DONE]"]
        );
        assert!(p.done);
    }

    #[test]
    fn an_endless_line_fails_once_it_passes_the_cap() {
        let mut p = SseLines::default();
        let chunk = vec![b'x'; 64 << 10];
        let mut pushed = 0;
        let err = loop {
            match p.push(&chunk) {
                Ok(lines) => assert!(lines.is_empty()),
                Err(e) => break e,
            }
            pushed += chunk.len();
            assert!(pushed <= MAX_LINE, "no error past the cap");
        };
        assert!(err.message.contains("longer than"), "{}", err.message);
    }
}
