//! The official method tables (docs/PROTOCOL.md §10.3, §10.5–§10.7): method name → params → runtime →
//! result, for 0.3 and 1.0 alike; [`Version`] picks names and shapes.
//!
//! Auth, agent lookup, body framing and the version check happened before (in `http`).

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use super::params::{self, field};
use super::render::{self, SendResultOut, TaskOut};
use super::{Version, card, errors, token, webhook};
use crate::error::Error;
use crate::model::{ContextId, TaskId};
use crate::push::{PushConfig, StoredPushConfig};
use crate::rpc::json::{self, Obj};
use crate::rpc::{Call, CallContext, Reply, RpcError};
use crate::runtime::{
    NewPushConfig, Resubscribed, Runtime, Sent, Streamed, SubmitOptions, TaskIdUse, task_key,
};
use crate::store::ListQuery;

/// Runs one call.
pub(crate) async fn dispatch(
    runtime: &Runtime,
    cx: &CallContext,
    call: &Call,
    v: Version,
) -> Reply {
    match run(runtime, cx, call, v).await {
        Ok(reply) => reply,
        Err(e) => Reply::error(Some(&call.id), &errors::rpc_error(v, &e)),
    }
}

/// The frame renderer of a version's streams.
fn frames(v: Version) -> crate::rpc::FrameFn {
    match v {
        Version::V10 => render::sse_data_10,
        Version::V03 => render::sse_data_03,
    }
}

async fn run(runtime: &Runtime, cx: &CallContext, call: &Call, v: Version) -> Result<Reply, Error> {
    use Version::{V03, V10};
    let id = &call.id;
    let principal = &cx.caller.principal;
    let agent = &cx.agent;
    let limits = &agent.config.limits;
    let p = json::params(call.params.as_deref())?;
    match (v, call.method.as_str()) {
        (V10, "SendMessage") | (V03, "message/send") => {
            let p = params::send_params(v, &p, limits)?;
            let (request, options) = submission(runtime, cx, v, p.push, p.request)?;
            let context = request.context_id.clone();
            let wait = p
                .blocking
                .then(|| Duration::from_secs_f64(limits.sync_wait_seconds));
            match runtime
                .send_with(principal, &cx.agent_id, request, wait, options)
                .await?
            {
                Sent::Task(task) => {
                    cx.task(&task.id);
                    Ok(Reply::ok(
                        id,
                        &SendResultOut(TaskOut {
                            v,
                            task: &task,
                            history_length: p.history_length,
                            artifacts: true,
                        }),
                    ))
                }
                Sent::Message(m) => {
                    let context = context.unwrap_or_else(ContextId::generate);
                    Ok(Reply::ok(
                        id,
                        &render::message_result(v, &m, Some(&context)),
                    ))
                }
            }
        }
        (V10, "SendStreamingMessage") | (V03, "message/stream") => {
            if !agent.config.streaming {
                return Err(not_streaming(None));
            }
            let p = params::send_params(v, &p, limits)?;
            let (request, options) = submission(runtime, cx, v, p.push, p.request)?;
            let context = request.context_id.clone();
            match runtime
                .stream_with(principal, &cx.agent_id, request, options)
                .await?
            {
                Streamed::Task(stream) => {
                    cx.task(&stream.task_id);
                    Ok(Reply::stream(id, stream, frames(v)))
                }
                Streamed::Message(m) => {
                    let context = context.unwrap_or_else(ContextId::generate);
                    let result = render::message_result(v, &m, Some(&context));
                    Ok(Reply::events(id, &result))
                }
            }
        }
        (V10, "GetTask") | (V03, "tasks/get") => {
            params::no_tenant(&p)?;
            let task = task_param(cx, &p, "id")?;
            let history_length = params::history_length(&p, "historyLength")?;
            let t = runtime.get(principal, &cx.agent_id, &task).await?;
            Ok(Reply::ok(
                id,
                &TaskOut {
                    v,
                    task: &t,
                    history_length,
                    artifacts: true,
                },
            ))
        }
        (V10, "ListTasks") => list_tasks(runtime, cx, id, &p).await,
        (V10, "CancelTask") | (V03, "tasks/cancel") => {
            params::no_tenant(&p)?;
            let task = task_param(cx, &p, "id")?;
            let reason = match params::metadata(&p)? {
                Some(m) => {
                    let m = Obj::parse(&m, "metadata")?;
                    params::opt_str(&m, "reason", "metadata.reason")?
                }
                None => None,
            };
            let t = runtime
                .cancel(principal, &cx.agent_id, &task, reason)
                .await?;
            Ok(Reply::ok(id, &TaskOut::full(v, &t)))
        }
        (V10, "SubscribeToTask") | (V03, "tasks/resubscribe") => {
            params::no_tenant(&p)?;
            let task = task_param(cx, &p, "id")?;
            if !agent.config.streaming {
                return Err(not_streaming(Some(task)));
            }
            match runtime.follow(principal, &cx.agent_id, &task).await? {
                Resubscribed::Live(stream) => Ok(Reply::stream(id, stream, frames(v))),
                Resubscribed::Finished(t) => Err(Error::SubscriptionFailed {
                    task: Some(task),
                    reason: format!(
                        "the task is {}; a terminal task has no more events",
                        t.status.state.as_str()
                    ),
                }),
            }
        }
        (V10, "CreateTaskPushNotificationConfig") | (V03, "tasks/pushNotificationConfig/set") => {
            push_enabled(cx)?;
            let (task, config, config_id) = match v {
                V10 => {
                    let task = task_param(cx, &p, "taskId")?;
                    let (config, config_id) =
                        params::push_config_10(&p, "params").map_err(|e| unprefix(e, "params."))?;
                    (task, config, config_id)
                }
                V03 => {
                    let task = task_param(cx, &p, "taskId")?;
                    let Some(raw) = field(&p, "pushNotificationConfig") else {
                        return Err(Error::invalid("pushNotificationConfig", "is required"));
                    };
                    let o = Obj::parse(raw, "pushNotificationConfig")?;
                    let (config, config_id) = params::push_config_03(&o, "pushNotificationConfig")?;
                    (task, config, config_id)
                }
            };
            check_target(runtime, &config, v)?;
            let key = task_key(principal, &cx.agent_id, &task);
            let stored = StoredPushConfig::named(&key, config_id, config, webhook::format(v));
            runtime.set_push(stored.clone()).await?;
            Ok(Reply::ok(id, &render::push_config(v, &stored)))
        }
        (V10, "GetTaskPushNotificationConfig") | (V03, "tasks/pushNotificationConfig/get") => {
            push_enabled(cx)?;
            let (task, config_id) = match v {
                V10 => (
                    task_param(cx, &p, "taskId")?,
                    Some(params::id(&p, "id", "id")?),
                ),
                V03 => (
                    task_param(cx, &p, "id")?,
                    params::opt_id(&p, "pushNotificationConfigId", "pushNotificationConfigId")?,
                ),
            };
            let configs = runtime
                .task_push_configs(principal, &cx.agent_id, &task)
                .await?;
            let found = match &config_id {
                Some(wanted) => configs.iter().find(|c| &c.id == wanted),
                None => configs.first(),
            };
            match found {
                Some(c) => Ok(Reply::ok(id, &render::push_config(v, c))),
                None => Err(Error::TaskNotFound { task }),
            }
        }
        (V10, "ListTaskPushNotificationConfigs") | (V03, "tasks/pushNotificationConfig/list") => {
            push_enabled(cx)?;
            let task = match v {
                V10 => task_param(cx, &p, "taskId")?,
                V03 => task_param(cx, &p, "id")?,
            };
            let configs = runtime
                .task_push_configs(principal, &cx.agent_id, &task)
                .await?;
            let rendered: Vec<Value> = configs.iter().map(|c| render::push_config(v, c)).collect();
            match v {
                V03 => Ok(Reply::ok(id, &rendered)),
                V10 => {
                    let (page, next) = config_page(&p, rendered)?;
                    Ok(Reply::ok(
                        id,
                        &json!({"configs": page, "nextPageToken": next}),
                    ))
                }
            }
        }
        (V10, "DeleteTaskPushNotificationConfig")
        | (V03, "tasks/pushNotificationConfig/delete") => {
            push_enabled(cx)?;
            let (task, config_id) = match v {
                V10 => (task_param(cx, &p, "taskId")?, params::id(&p, "id", "id")?),
                V03 => (
                    task_param(cx, &p, "id")?,
                    params::id(&p, "pushNotificationConfigId", "pushNotificationConfigId")?,
                ),
            };
            runtime
                .delete_push(principal, &cx.agent_id, &task, &config_id)
                .await?;
            match v {
                V10 => Ok(Reply::ok(id, &json!({}))),
                V03 => Ok(Reply::ok(id, &Value::Null)),
            }
        }
        (V10, "GetExtendedAgentCard") | (V03, "agent/getAuthenticatedExtendedCard") => {
            params::no_tenant(&p)?;
            let c = runtime.card(&cx.agent_id).ok_or(Error::AgentNotFound)?;
            Ok(Reply::ok(id, &card::card(v, &c, &cx.base_url)))
        }
        (_, other) => Ok(Reply::error(
            Some(id),
            &errors::dress(v, RpcError::method_not_found(other)),
        )),
    }
}

/// The required task id param (`id` or `taskId`), named in the request's span.
fn task_param(cx: &CallContext, p: &Obj<'_>, name: &str) -> Result<TaskId, Error> {
    let task = TaskId::new(params::id(p, name, name)?);
    cx.task(&task);
    Ok(task)
}

/// The request and options of a send: official task ids continue a task and never create
/// one; an agent may answer with a bare message; an inline push configuration (checked
/// here, before any task exists) is stored for the new task.
fn submission(
    runtime: &Runtime,
    cx: &CallContext,
    v: Version,
    push: Option<(PushConfig, Option<String>)>,
    request: crate::runtime::SendRequest,
) -> Result<(crate::runtime::SendRequest, SubmitOptions), Error> {
    let push = match push {
        None => None,
        Some((config, config_id)) => {
            push_enabled(cx)?;
            check_target(runtime, &config, v)?;
            Some(NewPushConfig {
                config,
                format: webhook::format(v).into(),
                named: Some(config_id),
            })
        }
    };
    let options = SubmitOptions {
        push,
        task_id: TaskIdUse::Continue,
        allow_message: true,
    };
    Ok((request, options))
}

fn push_enabled(cx: &CallContext) -> Result<(), Error> {
    if cx.agent.config.webhooks {
        Ok(())
    } else {
        Err(Error::PushNotSupported)
    }
}

/// The target of a push configuration against the server's address policy.
fn check_target(runtime: &Runtime, config: &PushConfig, v: Version) -> Result<(), Error> {
    let allow_private = runtime.config().webhooks.allow_private_networks;
    crate::push::check_url(&config.url, allow_private).map_err(|e| match e {
        Error::InvalidParams { reason, .. } => {
            let at = match v {
                Version::V10 => "url",
                Version::V03 => "pushNotificationConfig.url",
            };
            Error::invalid(at, reason)
        }
        other => other,
    })
}

/// A field path without the prefix a nested parser gave it.
fn unprefix(e: Error, prefix: &str) -> Error {
    match e {
        Error::InvalidParams { field, reason } => Error::InvalidParams {
            field: field.strip_prefix(prefix).unwrap_or(&field).to_string(),
            reason,
        },
        other => other,
    }
}

fn not_streaming(task: Option<TaskId>) -> Error {
    Error::SubscriptionFailed {
        task,
        reason: "this agent does not support streaming".into(),
    }
}

/// The widest ListTasks page.
const MAX_PAGE_SIZE: i64 = 100;
/// The ListTasks page size when none is asked.
const DEFAULT_PAGE_SIZE: i64 = 50;

async fn list_tasks(
    runtime: &Runtime,
    cx: &CallContext,
    id: &serde_json::value::RawValue,
    p: &Obj<'_>,
) -> Result<Reply, Error> {
    params::no_tenant(p)?;
    let context = params::opt_id(p, "contextId", "contextId")?.map(ContextId::new);
    // TASK_STATE_UNSPECIFIED (0), ProtoJSON's default, filters nothing.
    let state = match field(p, "status").map(|raw| raw.get()) {
        None | Some(r#""TASK_STATE_UNSPECIFIED""# | "0") => None,
        Some(_) => field(p, "status")
            .map(|raw| params::state_10(raw, "status"))
            .transpose()?,
    };
    let page_size = match params::opt_int(p, "pageSize", "pageSize")? {
        None => DEFAULT_PAGE_SIZE,
        Some(n) if (1..=MAX_PAGE_SIZE).contains(&n) => n,
        Some(_) => {
            return Err(Error::invalid(
                "pageSize",
                format!("must be between 1 and {MAX_PAGE_SIZE}"),
            ));
        }
    };
    let page_size = usize::try_from(page_size).unwrap_or(1);
    let after = match params::opt_str(p, "pageToken", "pageToken")? {
        None => None,
        Some(t) if t.is_empty() => None,
        Some(t) => Some(token::decode(&t)?),
    };
    let history_length = params::history_length(p, "historyLength")?;
    let status_after = match params::opt_str(p, "statusTimestampAfter", "statusTimestampAfter")? {
        None => None,
        Some(t) => Some(
            chrono::DateTime::parse_from_rfc3339(&t)
                .map_err(|_| {
                    Error::invalid(
                        "statusTimestampAfter",
                        "must be an ISO 8601 time such as 2026-01-01T00:00:00Z",
                    )
                })?
                .with_timezone(&chrono::Utc),
        ),
    };
    let artifacts = params::opt_bool(p, "includeArtifacts", "includeArtifacts")?.unwrap_or(false);
    let page = runtime
        .list(&ListQuery {
            principal: cx.caller.principal.clone(),
            agent: cx.agent_id.clone(),
            context,
            state,
            status_after,
            page_size,
            after,
        })
        .await?;
    let max_bytes = runtime.config().server.max_list_page_bytes;
    Ok(Reply::ok(
        id,
        &render::list_result(&page, page_size, history_length, artifacts, max_bytes),
    ))
}

/// One page of a task's push configurations (1.0): `pageSize` (absent: all), `pageToken`
/// (the offset of the page, as issued).
fn config_page(p: &Obj<'_>, all: Vec<Value>) -> Result<(Vec<Value>, String), Error> {
    let size = match params::opt_int(p, "pageSize", "pageSize")? {
        // 0 is ProtoJSON's default: no page size asked.
        None | Some(0) => all.len().max(1),
        Some(n) if (1..=1000).contains(&n) => usize::try_from(n).unwrap_or(1),
        Some(_) => return Err(Error::invalid("pageSize", "must be between 1 and 1000")),
    };
    let start = match params::opt_str(p, "pageToken", "pageToken")? {
        None => 0,
        Some(t) if t.is_empty() => 0,
        Some(t) => URL_SAFE_NO_PAD
            .decode(t.trim_end_matches('='))
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| {
                s.strip_prefix("offset:")
                    .and_then(|n| n.parse::<usize>().ok())
            })
            .filter(|n| *n <= all.len())
            .ok_or_else(|| Error::invalid("pageToken", "is not a token this server issued"))?,
    };
    let end = start.saturating_add(size).min(all.len());
    let next = if end < all.len() {
        URL_SAFE_NO_PAD.encode(format!("offset:{end}"))
    } else {
        String::new()
    };
    let page = all.into_iter().skip(start).take(end - start).collect();
    Ok((page, next))
}
