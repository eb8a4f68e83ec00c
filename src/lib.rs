//! # a2ad: an Agent-to-Agent (A2A) JSON-RPC server
//!
//! One JSON-RPC 2.0 endpoint per agent, `POST /api/v1/a2a/{agent_id}`, for sending
//! messages, streaming task updates over SSE, querying, cancelling and re-subscribing to
//! tasks, push-notification configuration and an agent card with live metrics.
//!
//! ## Request flow (one module per step)
//!
//! ```text
//! TcpListener → server (connection permit, watchdog, first bytes peeked → hyper http1 | http2)
//!   → http::handle: route → dialect | OPTIONS | auth (401) | agent (404) | may use (403)
//!       | 405 | 415 | 413 → rpc::decode (-32700 / -32600, id recovered)
//!       → http::one: span, rate limit (429), metrics → Dialect::dispatch
//!            (rpc/<dialect>: params → neutral model → Runtime → render)
//! Runtime: new task → Scheduler::admit → ContextActor → spawn TaskActor (live index)
//!        | continue → TaskActor::Continue | existing → TaskActor call or the Store's record
//! TaskActor ── every event ─→ Store::append (with its planned webhook deliveries);
//!              once durable → subscribers (try_send) · waiters · WebhookPool
//! driver task ── cast(Started | Progress | Artifact | Finished | Ran | TimedOut) ─→ TaskActor
//! ```
//!
//! The core (model, runtime, actors, streams, store, webhook delivery) speaks no wire
//! dialect, and its imports run one way (runtime → actors → the rest); each dialect is a
//! folder under `rpc/`. See docs/ARCHITECTURE.md.
//!
//! ## Embedding
//! [`Server`] runs the whole HTTP server — on the address of its configuration
//! ([`Server::bind`]), or on a listener you bound, until a future of yours resolves
//! ([`Server::builder`], [`Server::run`]); [`Runtime`] is the actor system alone (submit a
//! message, follow a task, cancel, read a card) with no HTTP. See `examples/embed.rs`.
//! Backends plug in through the [`Agent`] trait.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

mod actors;
pub mod agent;
mod auth;
pub mod config;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod http;
mod limits;
mod metrics;
pub mod model;
mod push;
mod rpc;
mod runtime;
mod server;
mod store;
mod stream;
mod validate;
mod webhook;

pub use actors::AgentEntry;
pub use actors::webhook::WebhookMetrics;
pub use agent::{
    Agent, AgentError, AgentFuture, AgentRequest, EchoAgent, MAX_UPDATES_IN_FLIGHT, OpenAiAgent,
    Outcome, OutcomeFuture, UPDATES_IN_FLIGHT, Updates,
};
pub use config::{ClusterConfig, Config, ConfigError, NodeLoss, StoreBackend, StoreConfig};
pub use error::{Error, Result};
pub use metrics::{AgentMetrics, AgentMetricsSnapshot, Metrics};
pub use model::{
    AgentId, Artifact, ContextId, FileContent, FileUrl, Message, Part, Principal, Role, TaskEvent,
    TaskId, TaskSnapshot, TaskState, TaskStatus,
};
pub use push::{
    Events, PushAuth, PushConfig, PushScope, RetryPolicy, StoredPushConfig, WebhookEvent,
};
pub use runtime::{
    AgentCard, NewPushConfig, Replay, Resubscribed, Runtime, SendRequest, Sent, StreamItem,
    Streamed, SubmitOptions, TaskIdUse, TaskStream,
};
pub use server::{Builder, Server, ServerHandle};
pub use store::{ListPage, ListQuery, PageToken, StoreStats};
pub use webhook::signature;
