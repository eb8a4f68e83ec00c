//! `[server]` and `[webhooks]`: the listener, its bounds and timeouts, and webhook delivery.

use std::time::Duration;

use serde::Deserialize;

use super::{Config, seconds};

/// `[server]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on; port 0 picks a free port.
    pub listen: String,
    /// The public base URL (`https://host[:port][/prefix]`) used in agent cards; unset:
    /// `http://` + the request's `Host`.
    pub public_url: Option<String>,
    /// The gRPC interface's `host:port` announced in agent cards; unset: the request's
    /// `Host`.
    pub public_grpc_url: Option<String>,
    /// The agent the host-level `/.well-known/agent-card.json` describes (default: the
    /// first agent).
    pub default_agent: Option<String>,
    /// The card shape for a request that names no A2A version: `"1.0"` or `"0.3"`.
    pub card_default_version: String,
    /// Pending connections the kernel queues.
    pub listen_backlog: u32,
    /// Request body cap; default: largest `max_file_size` × 4/3 + 1 MiB.
    pub max_body_bytes: Option<u64>,
    /// Request body bytes all requests together may hold while they are read and handled
    /// ([`crate::Config::max_buffered_body_bytes`]); beyond it a body's reading waits
    /// (within `body_read_timeout_seconds`). Default: 256 MiB, or 4 × the body cap if
    /// larger.
    pub max_buffered_body_bytes: Option<u64>,
    /// The same bound for the requests of one connection (HTTP/2 multiplexes many);
    /// default: 2 × the body cap.
    pub max_buffered_body_bytes_per_connection: Option<u64>,
    /// Idle time before a `: ping` comment on a stream.
    pub ping_interval_seconds: f64,
    /// How long finished tasks stay queryable.
    pub task_retention_seconds: f64,
    /// Streams per task at most.
    pub max_subscribers_per_task: usize,
    /// Events buffered per stream; a client that falls further behind is dropped.
    pub stream_buffer: usize,
    /// Finished tasks kept at most, whatever their age (oldest evicted first).
    pub max_finished_tasks: usize,
    /// Bytes all retained finished tasks may hold together (oldest evicted first).
    pub max_retained_bytes: u64,
    /// Messages one task's history keeps at most; later progress updates are streamed
    /// but not kept (the reply always is).
    pub max_task_history: usize,
    /// Tasks not yet finished, across all agents, at most (admission control).
    pub max_live_tasks: usize,
    /// Open connections at most; further connections wait in the backlog. Lowered at
    /// start-up to what the process's file-descriptor limit allows.
    pub max_connections: usize,
    /// Time a new connection has to send its first byte.
    pub first_byte_timeout_seconds: f64,
    /// Time an open connection with no request in flight may stay silent (keep-alive).
    pub idle_timeout_seconds: f64,
    /// Time a response write may make no progress before the connection is closed.
    pub write_timeout_seconds: f64,
    /// Time allowed to send request headers once the first byte arrived (Slowloris guard).
    pub header_read_timeout_seconds: f64,
    /// Size of a request's header block at most (HTTP/1.1 and HTTP/2).
    pub max_header_bytes: usize,
    /// Time allowed to send the request body once headers arrived.
    pub body_read_timeout_seconds: f64,
    /// Requests in one JSON-RPC batch at most.
    pub max_batch_size: usize,
    /// Bytes of a batch's answer at most: items whose answers would take it past this are
    /// answered with -32600 instead.
    pub max_batch_response_bytes: usize,
    /// Bytes of the tasks of one ListTasks page at most: a page stops early (with a
    /// `nextPageToken`) rather than pass it; a page always holds at least one task.
    pub max_list_page_bytes: usize,
    /// Concurrent HTTP/2 streams per connection.
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2 keep-alive: a PING after this much silence; no answer within it closes.
    pub http2_keep_alive_seconds: f64,
    /// Bound on every internal actor call.
    pub actor_call_timeout_seconds: f64,
    /// Grace period on shutdown for in-flight requests and streams.
    pub shutdown_grace_seconds: f64,
    /// Turns of a conversation kept for the agent (oldest dropped first).
    pub max_context_turns: usize,
    /// Conversations kept at most, whatever their age (the oldest idle ones go first).
    pub max_contexts: usize,
    /// About how many bytes the turns of all conversations may hold together; beyond it
    /// the least recently used idle conversations are forgotten (as past `max_contexts`).
    pub max_context_bytes: u64,
    /// How often, in polls, a worker of the request runtime takes a task from the runtime's
    /// shared queue, where tasks go once more are runnable than a worker's local queue
    /// holds (256); 0 keeps tokio's adaptive interval (about every 200 µs of polling).
    /// A small value serves those tasks sooner — a shorter tail at hundreds of
    /// connections — for fewer requests per second (docs/CONFIG.md).
    pub global_queue_interval: u32,
    /// `[server.tls]`: serve HTTPS (and gRPC over TLS) instead of plain HTTP.
    pub tls: Option<TlsConfig>,
}

/// `[server.tls]`: the listener speaks TLS 1.2 or 1.3 (rustls), offering `h2` and
/// `http/1.1` by ALPN.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file with the certificate chain, the server's certificate first.
    pub cert_file: String,
    /// PEM file with the private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: String,
    /// How often the files are checked for a change (modification time or size); a
    /// changed pair is loaded and served to new connections without a restart. SIGHUP
    /// checks at once.
    #[serde(default = "TlsConfig::default_reload_check_seconds")]
    pub reload_check_seconds: f64,
    /// mTLS: PEM file with the certificate authorities that client certificates must
    /// chain to. Unset: clients are not asked for a certificate.
    pub client_ca_file: Option<String>,
    /// mTLS: refuse a connection without a client certificate at the handshake. Without
    /// this a client may present none and authenticate with a key or token instead.
    #[serde(default)]
    pub client_cert_required: bool,
}

impl TlsConfig {
    /// Default interval between checks of the certificate and key files.
    pub const DEFAULT_RELOAD_CHECK_SECONDS: f64 = 10.0;

    fn default_reload_check_seconds() -> f64 {
        Self::DEFAULT_RELOAD_CHECK_SECONDS
    }

    /// A listener serving this certificate chain and key, every other option at its
    /// default.
    pub fn new(cert_file: impl Into<String>, key_file: impl Into<String>) -> Self {
        Self {
            cert_file: cert_file.into(),
            key_file: key_file.into(),
            reload_check_seconds: Self::DEFAULT_RELOAD_CHECK_SECONDS,
            client_ca_file: None,
            client_cert_required: false,
        }
    }

    /// `reload_check_seconds` as a [`Duration`].
    pub fn reload_check(&self) -> Duration {
        seconds(self.reload_check_seconds)
    }
}

/// `[webhooks]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// Allow loopback and private-range targets; link-local is always refused.
    pub allow_private_networks: bool,
    /// Webhook actors in the pool.
    pub workers: usize,
    /// Deliveries accepted and not finished, at most; beyond it new ones are discarded
    /// (logged and counted).
    pub max_pending_deliveries: usize,
    /// Push configurations addressed by id that one task may hold (official dialects).
    pub max_configs_per_task: usize,
}

/// `[log]`: how the binary writes its log to stderr (docs/CONFIG.md).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` (human lines; colour only on a terminal) or `json` (one object per line).
    pub format: LogFormat,
    /// What is logged, as `RUST_LOG` says it (`info`, `a2ad=debug,info`, ...); `RUST_LOG`,
    /// when set, wins. Default `info`.
    pub level: Option<String>,
}

/// `[log] format`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (with the
    /// `message`), the current span's fields (a request's `trace_id` when traced).
    Json,
}

/// `[ui]`: the inspector served at `/ui` (docs/CONFIG.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UiConfig {
    /// Serve the inspector (static files; every call it makes goes through the normal
    /// authenticated endpoints). Ignored when the crate is built without its `ui` feature.
    pub enabled: bool,
}

impl Default for UiConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// The settings given in seconds, as [`Duration`]s: each converted here, in one place.
impl ServerConfig {
    /// `body_read_timeout_seconds` as a [`Duration`].
    pub fn body_read_timeout(&self) -> Duration {
        seconds(self.body_read_timeout_seconds)
    }

    /// `ping_interval_seconds` as a [`Duration`].
    pub fn ping_interval(&self) -> Duration {
        seconds(self.ping_interval_seconds)
    }

    /// `header_read_timeout_seconds` as a [`Duration`].
    pub fn header_read_timeout(&self) -> Duration {
        seconds(self.header_read_timeout_seconds)
    }

    /// `http2_keep_alive_seconds` as a [`Duration`].
    pub fn http2_keep_alive(&self) -> Duration {
        seconds(self.http2_keep_alive_seconds)
    }

    /// `first_byte_timeout_seconds` as a [`Duration`].
    pub fn first_byte_timeout(&self) -> Duration {
        seconds(self.first_byte_timeout_seconds)
    }

    /// `idle_timeout_seconds` as a [`Duration`].
    pub fn idle_timeout(&self) -> Duration {
        seconds(self.idle_timeout_seconds)
    }

    /// `write_timeout_seconds` as a [`Duration`].
    pub fn write_timeout(&self) -> Duration {
        seconds(self.write_timeout_seconds)
    }

    /// `shutdown_grace_seconds` as a [`Duration`].
    pub fn shutdown_grace(&self) -> Duration {
        seconds(self.shutdown_grace_seconds)
    }

    /// `task_retention_seconds` as a [`Duration`].
    pub fn task_retention(&self) -> Duration {
        seconds(self.task_retention_seconds)
    }

    /// `actor_call_timeout_seconds` as a [`Duration`].
    pub fn actor_call_timeout(&self) -> Duration {
        seconds(self.actor_call_timeout_seconds)
    }
}

impl ServerConfig {
    /// Default kernel backlog.
    pub const DEFAULT_LISTEN_BACKLOG: u32 = 4096;
    /// Default card shape for requests that name no version.
    pub const DEFAULT_CARD_VERSION: &'static str = "1.0";
    /// Default idle time before a `: ping`.
    pub const DEFAULT_PING_INTERVAL_SECONDS: f64 = 15.0;
    /// Default retention of finished tasks.
    pub const DEFAULT_TASK_RETENTION_SECONDS: f64 = 3600.0;
    /// Default stream limit per task.
    pub const DEFAULT_MAX_SUBSCRIBERS_PER_TASK: usize = 1000;
    /// Default per-stream event buffer.
    pub const DEFAULT_STREAM_BUFFER: usize = 1024;
    /// Default cap on retained finished tasks.
    pub const DEFAULT_MAX_FINISHED_TASKS: usize = 2_000_000;
    /// Default byte budget of retained finished tasks (1 GiB).
    pub const DEFAULT_MAX_RETAINED_BYTES: u64 = 1 << 30;
    /// Default cap on a task's kept messages.
    pub const DEFAULT_MAX_TASK_HISTORY: usize = 1000;
    /// Default cap on unfinished tasks.
    pub const DEFAULT_MAX_LIVE_TASKS: usize = 100_000;
    /// Default cap on open connections (lowered to the file-descriptor limit at start-up).
    pub const DEFAULT_MAX_CONNECTIONS: usize = 50_000;
    /// Default time a new connection has to send its first byte.
    pub const DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS: f64 = 10.0;
    /// Default keep-alive idle time.
    pub const DEFAULT_IDLE_TIMEOUT_SECONDS: f64 = 60.0;
    /// Default stalled-write time.
    pub const DEFAULT_WRITE_TIMEOUT_SECONDS: f64 = 30.0;
    /// Default header read time-out.
    pub const DEFAULT_HEADER_READ_TIMEOUT_SECONDS: f64 = 30.0;
    /// Default header block cap (64 KiB).
    pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
    /// Default body read time-out.
    pub const DEFAULT_BODY_READ_TIMEOUT_SECONDS: f64 = 60.0;
    /// Default batch cap.
    pub const DEFAULT_MAX_BATCH_SIZE: usize = 100;
    /// Default HTTP/2 streams per connection.
    pub const DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS: u32 = 256;
    /// Default HTTP/2 keep-alive.
    pub const DEFAULT_HTTP2_KEEP_ALIVE_SECONDS: f64 = 20.0;
    /// Default internal call bound.
    pub const DEFAULT_ACTOR_CALL_TIMEOUT_SECONDS: f64 = 10.0;
    /// Default byte budget of a batch's answer (16 MiB).
    pub const DEFAULT_MAX_BATCH_RESPONSE_BYTES: usize = 16 << 20;
    /// Default byte bound of a ListTasks page (4 MiB).
    pub const DEFAULT_MAX_LIST_PAGE_BYTES: usize = 4 << 20;
    /// Default shutdown grace.
    pub const DEFAULT_SHUTDOWN_GRACE_SECONDS: f64 = 10.0;
    /// Default conversation turns kept.
    pub const DEFAULT_MAX_CONTEXT_TURNS: usize = 100;
    /// Default cap on conversations.
    pub const DEFAULT_MAX_CONTEXTS: usize = 2_000_000;
    /// Default byte bound on the conversations' turns (1 GiB).
    pub const DEFAULT_MAX_CONTEXT_BYTES: u64 = 1 << 30;
    /// Default: tokio's adaptive interval.
    pub const DEFAULT_GLOBAL_QUEUE_INTERVAL: u32 = 0;
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: Config::DEFAULT_LISTEN.to_string(),
            public_url: None,
            public_grpc_url: None,
            default_agent: None,
            card_default_version: Self::DEFAULT_CARD_VERSION.to_string(),
            listen_backlog: Self::DEFAULT_LISTEN_BACKLOG,
            max_body_bytes: None,
            max_buffered_body_bytes: None,
            max_buffered_body_bytes_per_connection: None,
            ping_interval_seconds: Self::DEFAULT_PING_INTERVAL_SECONDS,
            task_retention_seconds: Self::DEFAULT_TASK_RETENTION_SECONDS,
            max_subscribers_per_task: Self::DEFAULT_MAX_SUBSCRIBERS_PER_TASK,
            stream_buffer: Self::DEFAULT_STREAM_BUFFER,
            max_finished_tasks: Self::DEFAULT_MAX_FINISHED_TASKS,
            max_retained_bytes: Self::DEFAULT_MAX_RETAINED_BYTES,
            max_task_history: Self::DEFAULT_MAX_TASK_HISTORY,
            max_live_tasks: Self::DEFAULT_MAX_LIVE_TASKS,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            first_byte_timeout_seconds: Self::DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS,
            idle_timeout_seconds: Self::DEFAULT_IDLE_TIMEOUT_SECONDS,
            write_timeout_seconds: Self::DEFAULT_WRITE_TIMEOUT_SECONDS,
            header_read_timeout_seconds: Self::DEFAULT_HEADER_READ_TIMEOUT_SECONDS,
            max_header_bytes: Self::DEFAULT_MAX_HEADER_BYTES,
            body_read_timeout_seconds: Self::DEFAULT_BODY_READ_TIMEOUT_SECONDS,
            max_batch_size: Self::DEFAULT_MAX_BATCH_SIZE,
            max_batch_response_bytes: Self::DEFAULT_MAX_BATCH_RESPONSE_BYTES,
            max_list_page_bytes: Self::DEFAULT_MAX_LIST_PAGE_BYTES,
            http2_max_concurrent_streams: Self::DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
            http2_keep_alive_seconds: Self::DEFAULT_HTTP2_KEEP_ALIVE_SECONDS,
            actor_call_timeout_seconds: Self::DEFAULT_ACTOR_CALL_TIMEOUT_SECONDS,
            shutdown_grace_seconds: Self::DEFAULT_SHUTDOWN_GRACE_SECONDS,
            max_context_turns: Self::DEFAULT_MAX_CONTEXT_TURNS,
            max_contexts: Self::DEFAULT_MAX_CONTEXTS,
            max_context_bytes: Self::DEFAULT_MAX_CONTEXT_BYTES,
            global_queue_interval: Self::DEFAULT_GLOBAL_QUEUE_INTERVAL,
            tls: None,
        }
    }
}

impl WebhooksConfig {
    /// Default pool size.
    pub const DEFAULT_WORKERS: usize = 8;
    /// Default cap on pending deliveries.
    pub const DEFAULT_MAX_PENDING_DELIVERIES: usize = 100_000;
    /// Default cap on a task's named configurations.
    pub const DEFAULT_MAX_CONFIGS_PER_TASK: usize = 10;
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        Self {
            allow_private_networks: false,
            workers: Self::DEFAULT_WORKERS,
            max_pending_deliveries: Self::DEFAULT_MAX_PENDING_DELIVERIES,
            max_configs_per_task: Self::DEFAULT_MAX_CONFIGS_PER_TASK,
        }
    }
}
