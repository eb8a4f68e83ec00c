//! `[[api_keys]]` and `[[agents]]`: who may call, and the agents they call with their limits.

use std::time::Duration;

use serde::Deserialize;

use super::seconds;

/// `[[api_keys]]`
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The principal that owns what this key creates.
    pub name: String,
    /// Plaintext, or `sha256:<64 hex digits>`.
    pub key: String,
    /// Agent ids this key may use; `*` means all.
    #[serde(default = "default_key_agents")]
    pub agents: Vec<String>,
}

/// `[[agents]]`
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The `{agent_id}` in the URL.
    pub id: String,
    /// Display name; defaults to the id.
    pub name: Option<String>,
    /// Description (`""` when unset; an `a2a` agent takes its upstream's).
    #[serde(default)]
    pub description: Option<String>,
    /// Agent version.
    #[serde(default = "default_version")]
    pub version: String,
    /// Backend kind: `echo`.
    #[serde(default = "default_backend")]
    pub backend: String,
    /// Whether `message/stream` and `tasks/resubscribe` are served (unset: they are; an
    /// `a2a` agent's cards then say what its upstream's says).
    #[serde(default)]
    pub streaming: Option<bool>,
    /// Whether push notifications can be configured.
    #[serde(default = "yes")]
    pub webhooks: bool,
    /// Whether the public agent card is served (else only the authenticated methods).
    #[serde(default = "yes")]
    pub public_card: bool,
    /// `[agents.limits]`
    #[serde(default)]
    pub limits: AgentLimits,
    /// `[agents.echo]`
    #[serde(default)]
    pub echo: EchoConfig,
    /// `[agents.openai]`: required with `backend = "openai"`.
    #[serde(default)]
    pub openai: Option<OpenAiConfig>,
    /// `[agents.tck]`
    #[serde(default)]
    pub tck: TckConfig,
    /// `[agents.a2a]`: required with `backend = "a2a"` (any A2A agent behind a2ad).
    #[serde(default)]
    pub a2a: Option<A2aConfig>,
    /// `[[agents.extensions]]`: the A2A extensions this agent supports, declared in its
    /// cards and activated per request (docs/PROTOCOL.md §12).
    #[serde(default)]
    pub extensions: Vec<ExtensionConfig>,
}

/// `[[agents.extensions]]`: one A2A extension an agent supports (S10 `AgentExtension`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtensionConfig {
    /// The extension's URI: what clients name to activate it.
    pub uri: String,
    /// What it does.
    #[serde(default)]
    pub description: String,
    /// Requests that do not activate it are refused (ExtensionSupportRequiredError).
    #[serde(default)]
    pub required: bool,
    /// Extension-specific parameters, shown in the cards (a TOML table, as JSON).
    #[serde(default)]
    pub params: Option<toml::Table>,
}

impl AgentConfig {
    /// The declared extensions that `requested` names (URIs, in any order, unknown ones
    /// ignored), in the order the agent declares them: the request's activated set.
    pub fn activated<'a>(&self, requested: impl Iterator<Item = &'a str> + Clone) -> Vec<String> {
        self.extensions
            .iter()
            .filter(|e| requested.clone().any(|r| r == e.uri))
            .map(|e| e.uri.clone())
            .collect()
    }

    /// The declared extensions as a card shows them (`AgentExtension`: `uri`,
    /// `description`, `required`, `params`), in the order declared. As ProtoJSON does, a
    /// field at its default (`required: false`, no description) is left out: a signed card's
    /// canonical form is the one the official verifiers rebuild from their parsed card.
    pub fn extensions_json(&self) -> serde_json::Value {
        self.extensions
            .iter()
            .map(|e| {
                let mut x = serde_json::json!({"uri": e.uri});
                if e.required {
                    x["required"] = serde_json::json!(true);
                }
                if !e.description.is_empty() {
                    x["description"] = serde_json::json!(e.description);
                }
                if let Some(p) = &e.params {
                    x["params"] = serde_json::to_value(p).unwrap_or_default();
                }
                x
            })
            .collect()
    }

    /// The first declared `required` extension that `activated` lacks.
    pub fn missing_required<'a>(&'a self, activated: &[String]) -> Option<&'a str> {
        self.extensions
            .iter()
            .find(|e| e.required && !activated.contains(&e.uri))
            .map(|e| e.uri.as_str())
    }
}

/// `[agents.tck]`: the conformance backend (docs/PROTOCOL.md §10; docs/CONFIG.md).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TckConfig {
    /// How long a `test-resubscribe-message-id…` task stays `working`.
    pub long_running_ms: u64,
}

impl TckConfig {
    /// Default time a long-running conformance task works.
    pub const DEFAULT_LONG_RUNNING_MS: u64 = 10_000;
}

impl Default for TckConfig {
    fn default() -> Self {
        Self {
            long_running_ms: Self::DEFAULT_LONG_RUNNING_MS,
        }
    }
}

/// `[agents.openai]`: an OpenAI-compatible Chat Completions upstream.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// The API base, e.g. `http://127.0.0.1:11434/v1` (`/chat/completions` is appended).
    pub base_url: String,
    /// The model name.
    pub model: String,
    /// The environment variable holding the upstream API key (none: no `Authorization`).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// A system message sent first.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Sampling temperature (0–2).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Upper bound on generated tokens.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Bound on one upstream call, from request to the last chunk.
    #[serde(default = "OpenAiConfig::default_timeout")]
    pub request_timeout_seconds: f64,
    /// Earlier turns of the conversation sent as chat history (oldest dropped first).
    #[serde(default = "OpenAiConfig::default_history_turns")]
    pub max_history_turns: usize,
    /// Bytes of one upstream answer at most (a JSON body, or a whole stream); past it the
    /// task fails "upstream answer too large".
    #[serde(default = "OpenAiConfig::default_max_response_bytes")]
    pub max_response_bytes: usize,
}

/// `[agents.a2a]`: the upstream A2A agent a2ad fronts (docs/CONFIG.md, "The `a2a`
/// backend").
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct A2aConfig {
    /// The upstream's public agent card.
    pub card_url: String,
    /// `auto`, `jsonrpc`, `http_json` or `grpc`.
    #[serde(default = "auto")]
    pub binding: String,
    /// `auto`, `"1.0"` or `"0.3"`.
    #[serde(default = "auto")]
    pub protocol: String,
    /// Sent on every upstream call (card fetches included), as HTTP headers or gRPC
    /// metadata; a value `env:NAME` is read from the environment at start.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// One upstream task at most, from its first upstream call.
    #[serde(default = "A2aConfig::default_timeout")]
    pub timeout_seconds: f64,
    /// Bound on opening a connection to the upstream.
    #[serde(default = "A2aConfig::default_connect_timeout")]
    pub connect_timeout_seconds: f64,
    /// How often the upstream's card is fetched again (10–86400).
    #[serde(default = "A2aConfig::default_card_refresh")]
    pub card_refresh_seconds: u64,
    /// Upstream calls (streams included) open at once at most.
    #[serde(default = "A2aConfig::default_max_connections")]
    pub max_connections: usize,
    /// Loopback and private upstreams are allowed (as `[webhooks]`).
    #[serde(default)]
    pub allow_private_networks: bool,
    /// Bytes of one upstream answer at most (a body, or a whole stream).
    #[serde(default = "A2aConfig::default_max_response_bytes")]
    pub max_response_bytes: usize,
}

impl A2aConfig {
    /// Default bound on one upstream task.
    pub const DEFAULT_TIMEOUT_SECONDS: f64 = 300.0;
    /// Default connect time-out.
    pub const DEFAULT_CONNECT_TIMEOUT_SECONDS: f64 = 5.0;
    /// Default card refresh period.
    pub const DEFAULT_CARD_REFRESH_SECONDS: u64 = 300;
    /// Default connections per upstream.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

    /// An upstream whose card is at `card_url`, every other option at its default.
    pub fn new(card_url: &str) -> Self {
        Self {
            card_url: card_url.to_string(),
            binding: auto(),
            protocol: auto(),
            headers: Default::default(),
            timeout_seconds: Self::DEFAULT_TIMEOUT_SECONDS,
            connect_timeout_seconds: Self::DEFAULT_CONNECT_TIMEOUT_SECONDS,
            card_refresh_seconds: Self::DEFAULT_CARD_REFRESH_SECONDS,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            allow_private_networks: false,
            max_response_bytes: OpenAiConfig::DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// `timeout_seconds` as a [`Duration`].
    pub fn timeout(&self) -> Duration {
        seconds(self.timeout_seconds)
    }

    /// `connect_timeout_seconds` as a [`Duration`].
    pub fn connect_timeout(&self) -> Duration {
        seconds(self.connect_timeout_seconds)
    }

    fn default_timeout() -> f64 {
        Self::DEFAULT_TIMEOUT_SECONDS
    }

    fn default_connect_timeout() -> f64 {
        Self::DEFAULT_CONNECT_TIMEOUT_SECONDS
    }

    fn default_card_refresh() -> u64 {
        Self::DEFAULT_CARD_REFRESH_SECONDS
    }

    fn default_max_connections() -> usize {
        Self::DEFAULT_MAX_CONNECTIONS
    }

    fn default_max_response_bytes() -> usize {
        OpenAiConfig::DEFAULT_MAX_RESPONSE_BYTES
    }
}

fn auto() -> String {
    "auto".to_string()
}

/// `[agents.limits]`
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentLimits {
    /// Token bucket per principal per agent; the burst is the same figure.
    pub requests_per_minute: u64,
    /// Tasks `working` at once.
    pub concurrent_tasks: usize,
    /// Tasks waiting in `submitted`; default 10 × `concurrent_tasks`.
    pub max_queued_tasks: Option<usize>,
    /// Unicode scalar values over all text parts of a message.
    pub max_message_length: usize,
    /// Parts of one message at most.
    pub max_parts: usize,
    /// Decoded bytes of one file part.
    pub max_file_size: u64,
    /// Accepted MIME types of file parts; `type/*` entries allowed.
    pub supported_types: Vec<String>,
    /// A task still running after this becomes `canceled` with reason `timeout`.
    pub task_timeout_seconds: f64,
    /// How long `message/send` waits for a terminal state.
    pub sync_wait_seconds: f64,
}

/// `[agents.echo]`
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EchoConfig {
    /// Time before the reply.
    pub delay_ms: u64,
    /// `working` updates with progress, spread over `delay_ms`.
    pub progress_steps: u32,
    /// Every task ends `failed`.
    pub fail: bool,
}

/// The settings given in seconds, as [`Duration`]s.
impl AgentLimits {
    /// `task_timeout_seconds` as a [`Duration`].
    pub fn task_timeout(&self) -> Duration {
        seconds(self.task_timeout_seconds)
    }

    /// `sync_wait_seconds` as a [`Duration`].
    pub fn sync_wait(&self) -> Duration {
        seconds(self.sync_wait_seconds)
    }
}

impl AgentConfig {
    /// Backends this build knows.
    pub const BACKENDS: &'static [&'static str] = &["echo", "openai", "tck", "a2a"];

    /// An agent with every default and the given id.
    pub fn new(id: &str) -> Self {
        Self {
            id: id.to_string(),
            name: None,
            description: None,
            version: default_version(),
            backend: default_backend(),
            streaming: None,
            webhooks: true,
            public_card: true,
            limits: AgentLimits::default(),
            echo: EchoConfig::default(),
            openai: None,
            tck: TckConfig::default(),
            a2a: None,
            extensions: Vec::new(),
        }
    }

    /// The display name (the id when none is set).
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }

    /// The description (`""` when none is set).
    pub fn description(&self) -> &str {
        self.description.as_deref().unwrap_or("")
    }

    /// Whether streams are served: unless `streaming = false`.
    pub fn streaming(&self) -> bool {
        self.streaming != Some(false)
    }
}

impl OpenAiConfig {
    /// Default upstream time-out.
    pub const DEFAULT_REQUEST_TIMEOUT_SECONDS: f64 = 120.0;
    /// Default history turns.
    pub const DEFAULT_MAX_HISTORY_TURNS: usize = 20;
    /// Default bound on one upstream answer (16 MiB).
    pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 << 20;

    /// An upstream at `base_url` serving `model`, every other option at its default.
    pub fn new(base_url: &str, model: &str) -> Self {
        Self {
            base_url: base_url.to_string(),
            model: model.to_string(),
            api_key_env: None,
            system_prompt: None,
            temperature: None,
            max_tokens: None,
            request_timeout_seconds: Self::DEFAULT_REQUEST_TIMEOUT_SECONDS,
            max_history_turns: Self::DEFAULT_MAX_HISTORY_TURNS,
            max_response_bytes: Self::DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    fn default_max_response_bytes() -> usize {
        Self::DEFAULT_MAX_RESPONSE_BYTES
    }

    fn default_timeout() -> f64 {
        Self::DEFAULT_REQUEST_TIMEOUT_SECONDS
    }

    fn default_history_turns() -> usize {
        Self::DEFAULT_MAX_HISTORY_TURNS
    }
}

impl AgentLimits {
    /// Default requests per minute.
    pub const DEFAULT_REQUESTS_PER_MINUTE: u64 = 600;
    /// Default concurrent tasks.
    pub const DEFAULT_CONCURRENT_TASKS: usize = 16;
    /// Default message length.
    pub const DEFAULT_MAX_MESSAGE_LENGTH: usize = 100_000;
    /// Default parts per message.
    pub const DEFAULT_MAX_PARTS: usize = 100;
    /// Default file size (10 MiB).
    pub const DEFAULT_MAX_FILE_SIZE: u64 = 10_485_760;
    /// Default task time-out.
    pub const DEFAULT_TASK_TIMEOUT_SECONDS: f64 = 300.0;
    /// Default wait of `message/send`.
    pub const DEFAULT_SYNC_WAIT_SECONDS: f64 = 30.0;

    /// `max_queued_tasks`, with its default resolved.
    pub fn max_queued(&self) -> usize {
        self.max_queued_tasks
            .unwrap_or(self.concurrent_tasks.saturating_mul(10))
    }
}

impl Default for AgentLimits {
    fn default() -> Self {
        Self {
            requests_per_minute: Self::DEFAULT_REQUESTS_PER_MINUTE,
            concurrent_tasks: Self::DEFAULT_CONCURRENT_TASKS,
            max_queued_tasks: None,
            max_message_length: Self::DEFAULT_MAX_MESSAGE_LENGTH,
            max_parts: Self::DEFAULT_MAX_PARTS,
            max_file_size: Self::DEFAULT_MAX_FILE_SIZE,
            supported_types: [
                "text/plain",
                "application/json",
                "application/pdf",
                "image/*",
            ]
            .map(String::from)
            .to_vec(),
            task_timeout_seconds: Self::DEFAULT_TASK_TIMEOUT_SECONDS,
            sync_wait_seconds: Self::DEFAULT_SYNC_WAIT_SECONDS,
        }
    }
}

impl ApiKeyConfig {
    /// A key for `name` that may use every agent.
    pub fn new(name: &str, key: &str) -> Self {
        Self {
            name: name.to_string(),
            key: key.to_string(),
            agents: default_key_agents(),
        }
    }
}

pub(super) fn default_key_agents() -> Vec<String> {
    vec!["*".to_string()]
}

fn default_version() -> String {
    "1.0.0".to_string()
}

fn default_backend() -> String {
    "echo".to_string()
}

fn yes() -> bool {
    true
}
