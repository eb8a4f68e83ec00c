//! Method dispatch for the seed dialect: method name → typed params → runtime → reply.
//!
//! Auth, agent lookup and body framing happened before (in `http`); this module sees one
//! decoded call from an authenticated caller for an existing agent.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::error::RpcError;
use super::json::Obj;
use super::seed;
use super::{Call, failure, success};
use crate::actors::{AgentEntry, Replay, Resubscribed, Runtime, SubmitOptions, TaskStream};
use crate::auth::Caller;
use crate::error::Error;
use crate::model::{AgentId, TaskId};
use crate::push::{PushScope, StoredPushConfig};

/// Everything a call needs to know about its request.
pub struct CallContext {
    /// Who calls.
    pub caller: Arc<Caller>,
    /// The agent.
    pub agent: Arc<AgentEntry>,
    /// Its id.
    pub agent_id: AgentId,
    /// The client accepts `text/event-stream`.
    pub accepts_sse: bool,
    /// `Last-Event-ID`, if sent.
    pub last_event_id: Option<String>,
    /// Inside a batch (streams are refused there).
    pub in_batch: bool,
}

/// The outcome of one call.
pub enum Reply {
    /// A complete JSON-RPC response (success or error).
    Json {
        /// The encoded envelope.
        body: Vec<u8>,
        /// The error code, for metrics (`None`: success).
        code: Option<i64>,
        /// HTTP status when this is the whole response.
        status: hyper::StatusCode,
        /// `Retry-After` seconds.
        retry_after: Option<u64>,
    },
    /// An SSE stream; each event is a response carrying `id`.
    Stream {
        /// The request id, echoed in every event.
        id: Box<serde_json::value::RawValue>,
        /// The task's events.
        stream: TaskStream,
    },
}

impl Reply {
    /// An error reply.
    pub fn error(id: Option<&serde_json::value::RawValue>, e: &RpcError) -> Self {
        Self::Json {
            body: failure(id, e),
            code: Some(e.code),
            status: e.status,
            retry_after: e.retry_after,
        }
    }

    fn ok<T: serde::Serialize + ?Sized>(id: &serde_json::value::RawValue, result: &T) -> Self {
        Self::Json {
            body: success(id, result),
            code: None,
            status: hyper::StatusCode::OK,
            retry_after: None,
        }
    }
}

/// Runs one call.
pub async fn dispatch(runtime: &Runtime, cx: &CallContext, call: Call) -> Reply {
    let streaming = matches!(call.method.as_str(), "message/stream" | "tasks/resubscribe");
    if streaming && cx.in_batch {
        return Reply::error(
            Some(&call.id),
            &RpcError::invalid_request("streaming methods cannot be used inside a batch"),
        );
    }
    match run(runtime, cx, &call).await {
        Ok(reply) => reply,
        Err(e) => Reply::error(Some(&call.id), &RpcError::from(&e)),
    }
}

async fn run(runtime: &Runtime, cx: &CallContext, call: &Call) -> Result<Reply, Error> {
    let id = &call.id;
    let principal = &cx.caller.principal;
    let agent = &cx.agent;
    let limits = &agent.config.limits;
    let params = || seed::params(call.params.as_deref());
    match call.method.as_str() {
        "message/send" => {
            let p = seed::send_params(&params()?, limits)?;
            let options = inline_push(runtime, agent, p.push)?;
            let wait = p
                .blocking
                .then(|| Duration::from_secs_f64(limits.sync_wait_seconds));
            let task = runtime
                .send_with(principal, &cx.agent_id, p.request, wait, options)
                .await?;
            Ok(Reply::ok(
                id,
                &seed::TaskOut {
                    task: &task,
                    history_length: p.history_length,
                },
            ))
        }
        "message/stream" => {
            if !agent.config.streaming {
                return Err(not_streaming(None));
            }
            let p = seed::send_params(&params()?, limits)?;
            let options = inline_push(runtime, agent, p.push)?;
            let stream = runtime
                .stream_with(principal, &cx.agent_id, p.request, options)
                .await?;
            Ok(Reply::Stream {
                id: id.clone(),
                stream,
            })
        }
        "tasks/get" => {
            let p = params()?;
            let task = required_task(&p)?;
            let history_length = seed::opt_len(&p, "historyLength", "historyLength")?;
            let t = runtime.get(principal, &cx.agent_id, &task).await?;
            Ok(Reply::ok(
                id,
                &seed::TaskOut {
                    task: &t,
                    history_length,
                },
            ))
        }
        "tasks/cancel" => {
            let p = params()?;
            let task = required_task(&p)?;
            let reason = p.str("reason", "reason")?.map(|r| r.into_owned());
            let t = runtime
                .cancel(principal, &cx.agent_id, &task, reason)
                .await?;
            Ok(Reply::ok(id, &seed::cancel_result(&t)))
        }
        "tasks/resubscribe" => {
            let p = params()?;
            let task = required_task(&p)?;
            if !agent.config.streaming {
                return Err(not_streaming(Some(task)));
            }
            let include_history = p.bool("includeHistory", "includeHistory")?;
            let replay = match &cx.last_event_id {
                Some(raw) => Replay::After(
                    raw.trim()
                        .parse()
                        .map_err(|_| Error::invalid("Last-Event-ID", "must be an event number"))?,
                ),
                None if include_history == Some(true) => Replay::All,
                None => Replay::Current,
            };
            match runtime
                .resubscribe(principal, &cx.agent_id, &task, replay)
                .await?
            {
                Resubscribed::Live(stream) => Ok(Reply::Stream {
                    id: id.clone(),
                    stream,
                }),
                Resubscribed::Finished(t) if cx.accepts_sse => Ok(Reply::Stream {
                    id: id.clone(),
                    stream: runtime.finished_stream(&t),
                }),
                Resubscribed::Finished(t) => Ok(Reply::ok(
                    id,
                    &seed::TaskOut {
                        task: &t,
                        history_length: None,
                    },
                )),
            }
        }
        "tasks/pushNotificationConfig/set" => {
            if !agent.config.webhooks {
                return Err(Error::PushNotSupported);
            }
            let p = params()?;
            let allow_private = runtime.config().webhooks.allow_private_networks;
            let config = seed::push_config(&p, allow_private)?;
            let task = seed::task_id_param(&p, false)?.map(TaskId::new);
            if let Some(task) = &task {
                // Scoping to a task requires that this caller owns it.
                runtime.get(principal, &cx.agent_id, task).await?;
            }
            let stored = StoredPushConfig::new(
                PushScope {
                    principal: principal.clone(),
                    agent: cx.agent_id.clone(),
                    task,
                },
                config,
            );
            runtime.push_store().set(stored.clone());
            Ok(Reply::ok(
                id,
                &json!({
                    "configured": true,
                    "configId": stored.id,
                    "url": crate::push::redact_url(&stored.config.url),
                    "events": stored.config.events.iter().map(|e| e.as_str()).collect::<Vec<_>>(),
                    "taskId": stored.scope.task.as_ref().map(TaskId::as_str),
                }),
            ))
        }
        "tasks/pushNotificationConfig/get" => {
            if !agent.config.webhooks {
                return Err(Error::PushNotSupported);
            }
            let p = params()?;
            let store = runtime.push_store();
            let found = match p.str("configId", "configId")? {
                Some(config_id) => store.get_id(principal, &cx.agent_id, &config_id),
                None => {
                    let task = seed::task_id_param(&p, false)?.map(TaskId::new);
                    let mut scope = PushScope {
                        principal: principal.clone(),
                        agent: cx.agent_id.clone(),
                        task,
                    };
                    store.get_scope(&scope).or_else(|| {
                        // A task without its own configuration gets the agent-wide one.
                        scope.task.take()?;
                        store.get_scope(&scope)
                    })
                }
            };
            Ok(Reply::ok(id, &seed::push_config_out(found.as_deref())))
        }
        "agent/authenticatedExtendedCard" | "agent/getAuthenticatedExtendedCard" => {
            let p = params()?;
            let caps = p.bool("includeCapabilities", "includeCapabilities")?;
            let metrics = p.bool("includeMetrics", "includeMetrics")?;
            let card = runtime.card(&cx.agent_id).ok_or(Error::AgentNotFound)?;
            Ok(Reply::ok(
                id,
                &seed::card_out(&card, caps.unwrap_or(true), metrics.unwrap_or(true)),
            ))
        }
        other => Ok(Reply::error(Some(id), &RpcError::method_not_found(other))),
    }
}

fn required_task(p: &Obj<'_>) -> Result<TaskId, Error> {
    seed::task_id_param(p, true)?
        .map(TaskId::new)
        .ok_or_else(|| Error::invalid("taskId", "is required"))
}

/// Evo AI's inline push configuration: refused like `set` on an agent without webhooks,
/// and its target checked against the server's policy, before any task exists.
fn inline_push(
    runtime: &Runtime,
    agent: &AgentEntry,
    push: Option<crate::push::PushConfig>,
) -> Result<SubmitOptions, Error> {
    if let Some(config) = &push {
        if !agent.config.webhooks {
            return Err(Error::PushNotSupported);
        }
        let allow_private = runtime.config().webhooks.allow_private_networks;
        crate::push::check_url(&config.url, allow_private).map_err(|e| match e {
            Error::InvalidParams { reason, .. } => {
                Error::invalid("pushNotificationConfig.url", reason)
            }
            other => other,
        })?;
    }
    Ok(SubmitOptions::with_push(push))
}

fn not_streaming(task: Option<TaskId>) -> Error {
    Error::SubscriptionFailed {
        task,
        reason: "this agent does not support streaming".into(),
    }
}
