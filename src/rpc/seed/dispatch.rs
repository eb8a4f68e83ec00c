//! The seed dialect's method table ([`TABLE`]): method name → its function: params → runtime →
//! result.
//!
//! Auth, agent lookup and body framing happened before (in `http`); this sees one decoded
//! call from an authenticated caller for an existing agent.

use serde_json::json;
use serde_json::value::RawValue;

use super::params::{self, SendParams};
use super::render::{self, TaskOut};
use super::webhook::FORMAT;
use super::{errors, render::event_names};
use crate::actors::AgentEntry;
use crate::error::Error;
use crate::model::{TaskId, TaskSnapshot};
use crate::push::{PushScope, StoredPushConfig};
use crate::rpc::json::Obj;
use crate::rpc::{Call, CallContext, Reply, RpcError};
use crate::runtime::{Replay, Resubscribed, Runtime, Sent, Streamed, SubmitOptions};

/// Runs one call.
pub(crate) async fn dispatch(runtime: &Runtime, cx: &CallContext, call: &Call) -> Reply {
    match run(runtime, cx, call).await {
        Ok(reply) => reply,
        Err(e) => Reply::error(Some(&call.id), &errors::rpc_error(&e)),
    }
}

/// The seed's methods.
#[derive(Clone, Copy)]
pub(super) enum Method {
    Send,
    Stream,
    Get,
    Cancel,
    Resubscribe,
    PushSet,
    PushGet,
    Card,
}

/// Every method name (with the card's alias) and its method, in the spec's order.
pub(super) const TABLE: [(&str, Method); 9] = [
    ("message/send", Method::Send),
    ("message/stream", Method::Stream),
    ("tasks/get", Method::Get),
    ("tasks/cancel", Method::Cancel),
    ("tasks/resubscribe", Method::Resubscribe),
    ("tasks/pushNotificationConfig/set", Method::PushSet),
    ("tasks/pushNotificationConfig/get", Method::PushGet),
    ("agent/authenticatedExtendedCard", Method::Card),
    ("agent/getAuthenticatedExtendedCard", Method::Card),
];

async fn run(runtime: &Runtime, cx: &CallContext, call: &Call) -> Result<Reply, Error> {
    let Some(method) = TABLE
        .iter()
        .find_map(|(name, m)| (*name == call.method).then_some(*m))
    else {
        return Ok(Reply::error(
            Some(&call.id),
            &RpcError::method_not_found(&call.method),
        ));
    };
    match method {
        Method::Send => send(runtime, cx, call).await,
        Method::Stream => stream(runtime, cx, call).await,
        Method::Get => get(runtime, cx, call).await,
        Method::Cancel => cancel(runtime, cx, call).await,
        Method::Resubscribe => resubscribe(runtime, cx, call).await,
        Method::PushSet => push_set(runtime, cx, call).await,
        Method::PushGet => push_get(runtime, cx, call).await,
        Method::Card => card(runtime, cx, call).await,
    }
}

fn params(call: &Call) -> Result<Obj<'_>, Error> {
    params::params(call.params())
}

/// `message/send`: runs a task, answers when it ends (or after `sync_wait_seconds`).
async fn send(runtime: &Runtime, cx: &CallContext, call: &Call) -> Result<Reply, Error> {
    let id = &call.id;
    let principal = &cx.caller.principal;
    let agent = &cx.agent;
    let limits = &agent.config.limits;
    let p = params::send_params(&params(call)?, limits)?;
    let SendParams {
        mut request,
        blocking,
        history_length,
        push,
    } = p;
    request.extensions = cx.extensions.clone();
    let options = inline_push(runtime, agent, push)?;
    let wait = blocking.then(|| limits.sync_wait());
    let task = match runtime
        .send_with(principal, &cx.agent_id, request, wait, options)
        .await?
    {
        Sent::Task(t) => t,
        // Not allowed by the seed's options; kept total.
        Sent::Message(_) => return Err(Error::Internal),
    };
    cx.task(&task.id);
    Ok(task_reply(id, &task, history_length))
}

/// The seed's answer with a task: the task, its history cut to `history_length`.
fn task_reply(id: &RawValue, task: &TaskSnapshot, history_length: Option<usize>) -> Reply {
    Reply::ok(
        id,
        &TaskOut {
            task,
            history_length,
        },
    )
}

/// `message/stream`: runs a task, answers with its events.
async fn stream(runtime: &Runtime, cx: &CallContext, call: &Call) -> Result<Reply, Error> {
    let id = &call.id;
    let principal = &cx.caller.principal;
    let agent = &cx.agent;
    let limits = &agent.config.limits;
    if !agent.config.streaming() {
        return Err(not_streaming(None));
    }
    let mut p = params::send_params(&params(call)?, limits)?;
    p.request.extensions = cx.extensions.clone();
    let options = inline_push(runtime, agent, p.push)?;
    match runtime
        .stream_with(principal, &cx.agent_id, p.request, options)
        .await?
    {
        Streamed::Task(stream) => {
            cx.task(&stream.task_id);
            Ok(Reply::stream(id, stream, render::sse_data))
        }
        Streamed::Message(_) => Err(Error::Internal),
    }
}

/// `tasks/get`.
async fn get(runtime: &Runtime, cx: &CallContext, call: &Call) -> Result<Reply, Error> {
    let id = &call.id;
    let principal = &cx.caller.principal;
    let p = params(call)?;
    let task = required_task(cx, &p)?;
    let history_length = params::opt_len(&p, "historyLength", "historyLength")?;
    let t = runtime.get(principal, &cx.agent_id, &task).await?;
    Ok(task_reply(id, &t, history_length))
}

/// `tasks/cancel`.
async fn cancel(runtime: &Runtime, cx: &CallContext, call: &Call) -> Result<Reply, Error> {
    let id = &call.id;
    let principal = &cx.caller.principal;
    let p = params(call)?;
    let task = required_task(cx, &p)?;
    let reason = p.str("reason", "reason")?.map(|r| r.into_owned());
    let t = runtime
        .cancel(principal, &cx.agent_id, &task, reason)
        .await?;
    Ok(Reply::ok(id, &render::cancel_result(&t)))
}

/// `tasks/resubscribe`: a running task's events, from the client's `Last-Event-ID`; a
/// finished task's final state (as a stream to a client that accepts one).
async fn resubscribe(runtime: &Runtime, cx: &CallContext, call: &Call) -> Result<Reply, Error> {
    let id = &call.id;
    let principal = &cx.caller.principal;
    let agent = &cx.agent;
    let p = params(call)?;
    let task = required_task(cx, &p)?;
    if !agent.config.streaming() {
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
        Resubscribed::Live(stream) => Ok(Reply::stream(id, stream, render::sse_data)),
        Resubscribed::Finished(t) if cx.accepts_sse => {
            let stream = match replay {
                // Pick up where the client's stream broke (across a restart too).
                Replay::After(n) if n < t.seq => {
                    runtime
                        .finished_stream_after(principal, &cx.agent_id, &t, n)
                        .await
                }
                _ => runtime.finished_stream(&t),
            };
            Ok(Reply::stream(id, stream, render::sse_data))
        }
        Resubscribed::Finished(t) => Ok(task_reply(id, &t, None)),
    }
}

/// `tasks/pushNotificationConfig/set`: one configuration per scope (agent, or task).
async fn push_set(runtime: &Runtime, cx: &CallContext, call: &Call) -> Result<Reply, Error> {
    let id = &call.id;
    let principal = &cx.caller.principal;
    let agent = &cx.agent;
    if !agent.config.webhooks {
        return Err(Error::PushNotSupported);
    }
    let p = params(call)?;
    let allow_private = runtime.config().webhooks.allow_private_networks;
    let config = params::push_config(&p, allow_private)?;
    let task = params::task_id_param(&p, false)?.map(TaskId::new);
    let stored = StoredPushConfig::scoped(
        PushScope {
            principal: principal.clone(),
            agent: cx.agent_id.clone(),
            task,
        },
        config,
        FORMAT,
    );
    runtime.set_push(stored.clone()).await?;
    Ok(Reply::ok(
        id,
        &json!({
            "configured": true,
            "configId": stored.id,
            "url": crate::push::redact_url(&stored.config.url),
            "events": event_names(&stored.config.events),
            "taskId": stored.scope.task.as_ref().map(TaskId::as_str),
        }),
    ))
}

/// `tasks/pushNotificationConfig/get`: by id, or the scope's (a task falls back to the
/// agent-wide one).
async fn push_get(runtime: &Runtime, cx: &CallContext, call: &Call) -> Result<Reply, Error> {
    let id = &call.id;
    let principal = &cx.caller.principal;
    let agent = &cx.agent;
    if !agent.config.webhooks {
        return Err(Error::PushNotSupported);
    }
    let p = params(call)?;
    let found = match p.str("configId", "configId")? {
        Some(config_id) => {
            runtime
                .push_by_id(principal, &cx.agent_id, &config_id)
                .await?
        }
        None => {
            let task = params::task_id_param(&p, false)?.map(TaskId::new);
            let mut scope = PushScope {
                principal: principal.clone(),
                agent: cx.agent_id.clone(),
                task,
            };
            match runtime.scoped_push(&scope).await? {
                Some(c) => Some(c),
                // A task without its own configuration gets the agent-wide one.
                None if scope.task.take().is_some() => runtime.scoped_push(&scope).await?,
                None => None,
            }
        }
    };
    Ok(Reply::ok(id, &render::push_config_out(found.as_deref())))
}

/// `agent/authenticatedExtendedCard` (and its alias): the card with live metrics.
async fn card(runtime: &Runtime, cx: &CallContext, call: &Call) -> Result<Reply, Error> {
    let id = &call.id;
    let p = params(call)?;
    let caps = p.bool("includeCapabilities", "includeCapabilities")?;
    let metrics = p.bool("includeMetrics", "includeMetrics")?;
    let card = runtime.card(&cx.agent_id).ok_or(Error::AgentNotFound)?;
    Ok(Reply::ok(
        id,
        &render::card_out(&card, caps.unwrap_or(true), metrics.unwrap_or(true)),
    ))
}

fn required_task(cx: &CallContext, p: &Obj<'_>) -> Result<TaskId, Error> {
    let task = params::task_id_param(p, true)?
        .map(TaskId::new)
        .ok_or_else(|| Error::invalid("taskId", "is required"))?;
    cx.task(&task);
    Ok(task)
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
    Ok(SubmitOptions::with_push(push, FORMAT))
}

fn not_streaming(task: Option<TaskId>) -> Error {
    Error::SubscriptionFailed {
        task,
        reason: "this agent does not support streaming".into(),
    }
}
