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
//! message, follow a task, cancel, read a card) with no HTTP ([`Runtime::builder`]).
//! Backends plug in through the [`Agent`] trait. See `examples/embed.rs`.
//!
//! The crate root holds what most embedders name; the rest is one module away:
//! [`runtime`] (the Runtime's builder, requests and answers), [`model`], [`config`],
//! [`agent`], [`push`], [`metrics`].

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

mod actors;
pub mod agent;
mod auth;
mod boxed;
pub mod config;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod http;
mod limits;
pub mod metrics;
pub mod model;
mod net;
mod piecewise;
pub mod push;
mod rpc;
pub mod runtime;
/// The A2A 1.0 protobuf messages and the `lf.a2a.v1.A2AService` client, generated from the
/// vendored proto (v1.0.1) with their ProtoJSON forms: for gRPC clients of a2ad
/// (`a2a_service_client::A2aServiceClient` over a `tonic::transport::Channel`).
pub mod proto {
    pub use crate::rpc::a2a::pb::*;
    /// `google.protobuf.Value` (a data part's `data`), kept as its JSON text.
    pub use crate::rpc::a2a::pbvalue::JsonValue;
}
mod server;
mod store;
mod stream;
mod swap;
pub mod telemetry;
mod validate;
mod webhook;

// The front door: what most embedders name. The rest is one module away (`a2ad::runtime`
// for the Runtime's requests and answers, `a2ad::model`, `a2ad::config`, `a2ad::agent`,
// `a2ad::push`, `a2ad::metrics`).
pub use agent::{Agent, AgentError, AgentFuture, AgentRequest, Outcome, OutcomeFuture, Updates};
pub use config::Config;
pub use error::{Error, Result};
pub use model::{
    AgentId, Artifact, ContextId, DataPart, Extensions, FileContent, FileUrl, Message, Part,
    Principal, RawJson, Role, TaskId, TaskSnapshot, TaskState,
};
pub use rpc::a2a::upstream::A2aAgent;
pub use runtime::{Runtime, SendRequest, StreamItem, TaskStream};
pub use server::{Server, ServerBuilder, ServerHandle};
pub use store::runtime_parked as store_runtime_parked;
pub use webhook::signature;
