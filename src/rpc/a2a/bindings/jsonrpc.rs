//! The JSON-RPC binding of the official operations (docs/PROTOCOL.md §10.3, §10.5–§10.7), 0.3
//! and 1.0 alike: the method names the operation ([`ops::TABLE`]), its params decode into an
//! [`OpRequest`], [`ops::execute`] runs it, and its [`OpResponse`] encodes in the version's
//! shapes ([`Version`] picks names and shapes).
//!
//! Auth, agent lookup, body framing and the version check happened before (in `http`).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::error::Error;
use crate::model::{ContextId, TaskId};
use crate::rpc::a2a::ops::{self, Op, OpRequest, OpResponse};
use crate::rpc::a2a::params::{self, field};
use crate::rpc::a2a::render::{self, SendResultOut, TaskOut};
use crate::rpc::a2a::{Version, card, errors};
use crate::rpc::json::{self, Obj};
use crate::rpc::{Call, CallContext, Reply, RpcError};
use crate::runtime::Runtime;
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

/// Params → [`OpRequest`] → [`ops::execute`] → result, for the operation the method names.
async fn run(runtime: &Runtime, cx: &CallContext, call: &Call, v: Version) -> Result<Reply, Error> {
    let p = json::params(call.params())?;
    let Some(op) = Op::named(v, &call.method) else {
        return Ok(Reply::error(
            Some(&call.id),
            &errors::dress(v, RpcError::method_not_found(&call.method)),
        ));
    };
    op.admit(cx)?;
    let request = decode(op, v, cx, &p)?;
    let response = ops::execute(runtime, cx, v, request).await?;
    encode(
        op,
        v,
        runtime,
        cx,
        Framing::JsonRpc(&call.id),
        PageAsk::Params(&p),
        response,
    )
}

/// How an operation's answer is framed: as a JSON-RPC response echoing the request's id,
/// or bare (the HTTP+JSON binding: the result object itself, each stream event's
/// `StreamResponse` on its own).
#[derive(Clone, Copy)]
pub(crate) enum Framing<'a> {
    JsonRpc(&'a RawValue),
    Bare,
}

impl Framing<'_> {
    fn ok<T: serde::Serialize + ?Sized>(self, result: &T) -> Reply {
        match self {
            Self::JsonRpc(id) => Reply::ok(id, result),
            Self::Bare => Reply::Json {
                body: crate::rpc::out::to_vec(result).unwrap_or_default(),
                code: None,
                status: hyper::StatusCode::OK,
                retry_after: None,
            },
        }
    }

    fn events<T: serde::Serialize + ?Sized>(self, result: &T) -> Reply {
        match self {
            Self::JsonRpc(id) => Reply::events(id, result),
            Self::Bare => Reply::Events {
                body: crate::rpc::sse_frame(
                    1,
                    &crate::rpc::out::to_vec(result).unwrap_or_default(),
                ),
            },
        }
    }

    fn stream(self, v: Version, stream: crate::runtime::TaskStream) -> Reply {
        match self {
            Self::JsonRpc(id) => Reply::stream(id, stream, frames(v)),
            Self::Bare => Reply::stream(&crate::rpc::null_id(), stream, render::sse_data_bare),
        }
    }
}

/// A version's params of an operation.
pub(crate) fn decode(
    op: Op,
    v: Version,
    cx: &CallContext,
    p: &Obj<'_>,
) -> Result<OpRequest, Error> {
    use Version::{V03, V10};
    Ok(match op {
        Op::SendMessage | Op::SendStreamingMessage => OpRequest::Send {
            params: params::send_params(v, p, &cx.agent.config.limits)?,
            stream: op == Op::SendStreamingMessage,
        },
        Op::GetTask => {
            params::no_tenant(p)?;
            let task = task_param(cx, p, "id")?;
            OpRequest::GetTask {
                task,
                history_length: params::history_length(p, "historyLength")?,
            }
        }
        Op::ListTasks => list_tasks(cx, p)?,
        Op::CancelTask => {
            params::no_tenant(p)?;
            let task = task_param(cx, p, "id")?;
            let reason = match params::metadata(p)? {
                Some(m) => {
                    let m = Obj::parse(&m, "metadata")?;
                    params::opt_str(&m, "reason", "metadata.reason")?
                }
                None => None,
            };
            OpRequest::CancelTask { task, reason }
        }
        Op::SubscribeToTask => {
            params::no_tenant(p)?;
            OpRequest::SubscribeToTask {
                task: task_param(cx, p, "id")?,
                after: None,
            }
        }
        Op::CreatePushConfig => {
            let task = task_param(cx, p, "taskId")?;
            let (config, config_id) = match v {
                V10 => params::push_config_10(p, "params").map_err(|e| unprefix(e, "params."))?,
                V03 => {
                    let Some(raw) = field(p, "pushNotificationConfig") else {
                        return Err(Error::invalid("pushNotificationConfig", "is required"));
                    };
                    let o = Obj::parse(raw, "pushNotificationConfig")?;
                    params::push_config_03(&o, "pushNotificationConfig")?
                }
            };
            OpRequest::CreatePushConfig {
                task,
                config,
                config_id,
            }
        }
        Op::GetPushConfig => match v {
            V10 => OpRequest::GetPushConfig {
                task: task_param(cx, p, "taskId")?,
                config_id: Some(params::id(p, "id", "id")?),
            },
            V03 => OpRequest::GetPushConfig {
                task: task_param(cx, p, "id")?,
                config_id: params::opt_id(
                    p,
                    "pushNotificationConfigId",
                    "pushNotificationConfigId",
                )?,
            },
        },
        Op::ListPushConfigs => OpRequest::ListPushConfigs {
            task: match v {
                V10 => task_param(cx, p, "taskId")?,
                V03 => task_param(cx, p, "id")?,
            },
        },
        Op::DeletePushConfig => match v {
            V10 => OpRequest::DeletePushConfig {
                task: task_param(cx, p, "taskId")?,
                config_id: params::id(p, "id", "id")?,
            },
            V03 => OpRequest::DeletePushConfig {
                task: task_param(cx, p, "id")?,
                config_id: params::id(p, "pushNotificationConfigId", "pushNotificationConfigId")?,
            },
        },
        Op::GetExtendedCard => {
            params::no_tenant(p)?;
            OpRequest::GetExtendedCard
        }
    })
}

/// An operation's result in a version's shapes. Fails only on a 1.0 push configuration
/// page the params ask for and the list cannot give (a token this server did not issue).
pub(crate) fn encode(
    op: Op,
    v: Version,
    runtime: &Runtime,
    cx: &CallContext,
    framing: Framing<'_>,
    page: PageAsk<'_>,
    response: OpResponse,
) -> Result<Reply, Error> {
    Ok(match response {
        OpResponse::Task {
            task,
            history_length,
            artifacts,
        } => {
            let out = TaskOut {
                v,
                task: &task,
                history_length,
                artifacts,
            };
            if op == Op::SendMessage {
                framing.ok(&SendResultOut(out))
            } else {
                framing.ok(&out)
            }
        }
        OpResponse::Message { message, context } => {
            framing.ok(&render::message_result(v, &message, Some(&context)))
        }
        OpResponse::Stream(stream) => framing.stream(v, stream),
        OpResponse::MessageStream { message, context } => {
            framing.events(&render::message_result(v, &message, Some(&context)))
        }
        OpResponse::Tasks {
            page,
            page_size,
            history_length,
            artifacts,
        } => {
            let max_bytes = runtime.config().server.max_list_page_bytes;
            framing.ok(&render::list_result(
                &page,
                page_size,
                history_length,
                artifacts,
                max_bytes,
            ))
        }
        OpResponse::PushConfig(c) => framing.ok(&render::push_config(v, &c)),
        OpResponse::PushConfigs(configs) => {
            let rendered: Vec<Value> = configs.iter().map(|c| render::push_config(v, c)).collect();
            match v {
                Version::V03 => framing.ok(&rendered),
                Version::V10 => {
                    let (page, next) = config_page(page, rendered)?;
                    framing.ok(&json!({"configs": page, "nextPageToken": next}))
                }
            }
        }
        OpResponse::Deleted => match v {
            Version::V10 => framing.ok(&json!({})),
            Version::V03 => framing.ok(&Value::Null),
        },
        OpResponse::Card(c) => {
            let grpc = cx.grpc_url(runtime.config().server.public_grpc_url.as_deref());
            framing.ok(&card::card(
                v,
                &c,
                &cx.base_url(),
                &grpc,
                &runtime.config(),
                cx.card_signer.as_deref(),
            ))
        }
    })
}

/// The required task id param (`id` or `taskId`), named in the request's span.
fn task_param(cx: &CallContext, p: &Obj<'_>, name: &str) -> Result<TaskId, Error> {
    let task = TaskId::new(params::id(p, name, name)?);
    cx.task(&task);
    Ok(task)
}

/// A field path without the prefix a nested parser gave it.
pub(crate) fn unprefix(e: Error, prefix: &str) -> Error {
    match e {
        Error::InvalidParams { field, reason } => Error::InvalidParams {
            field: field.strip_prefix(prefix).unwrap_or(&field).to_string(),
            reason,
        },
        other => other,
    }
}

/// ListTasks params (1.0 only).
fn list_tasks(cx: &CallContext, p: &Obj<'_>) -> Result<OpRequest, Error> {
    params::no_tenant(p)?;
    let context = params::opt_id(p, "contextId", "contextId")?.map(ContextId::new);
    // TASK_STATE_UNSPECIFIED (0), ProtoJSON's default, filters nothing.
    let state = match field(p, "status").map(|raw| raw.get()) {
        None | Some(r#""TASK_STATE_UNSPECIFIED""# | "0") => None,
        Some(_) => field(p, "status")
            .map(|raw| params::state_10(raw, "status"))
            .transpose()?,
    };
    let page_size = params::list_page_size(params::opt_int(p, "pageSize", "pageSize")?)?;
    let after = params::list_after(params::opt_str(p, "pageToken", "pageToken")?.as_deref())?;
    let history_length = params::history_length(p, "historyLength")?;
    let status_after = params::opt_str(p, "statusTimestampAfter", "statusTimestampAfter")?
        .map(|t| params::list_status_after(&t))
        .transpose()?;
    let artifacts = params::opt_bool(p, "includeArtifacts", "includeArtifacts")?.unwrap_or(false);
    Ok(OpRequest::ListTasks {
        query: ListQuery {
            principal: cx.caller.principal.clone(),
            agent: cx.agent_id.clone(),
            context,
            state,
            status_after,
            page_size,
            after,
        },
        history_length,
        artifacts,
    })
}

/// What a ListTaskPushNotificationConfigs call asks of its page, read when the page is made
/// (after the operation ran, so that an unknown task answers first).
#[derive(Clone, Copy)]
pub(crate) enum PageAsk<'a> {
    /// In the call's JSON params (`pageSize`, `pageToken`).
    Params(&'a Obj<'a>),
    /// Given by a binding that decoded them itself (gRPC).
    Given {
        size: Option<i64>,
        token: Option<&'a str>,
    },
}

impl PageAsk<'_> {
    fn size(self) -> Result<Option<i64>, Error> {
        match self {
            Self::Params(p) => params::opt_int(p, "pageSize", "pageSize"),
            Self::Given { size, .. } => Ok(size),
        }
    }

    fn token(self) -> Result<Option<String>, Error> {
        match self {
            Self::Params(p) => params::opt_str(p, "pageToken", "pageToken"),
            Self::Given { token, .. } => Ok(token.map(str::to_owned)),
        }
    }
}

/// One page of a task's push configurations (1.0): `pageSize` (absent: all), `pageToken`
/// (the offset of the page, as issued).
fn config_page(ask: PageAsk<'_>, all: Vec<Value>) -> Result<(Vec<Value>, String), Error> {
    let (start, end) = page_bounds(ask, all.len())?;
    let next = if end < all.len() {
        URL_SAFE_NO_PAD.encode(format!("offset:{end}"))
    } else {
        String::new()
    };
    let page = all.into_iter().skip(start).take(end - start).collect();
    Ok((page, next))
}

/// The range of a page of `len` configurations that `ask` names.
pub(crate) fn page_bounds(ask: PageAsk<'_>, len: usize) -> Result<(usize, usize), Error> {
    let size = match ask.size()? {
        // 0 is ProtoJSON's default: no page size asked.
        None | Some(0) => len.max(1),
        Some(n) if (1..=1000).contains(&n) => usize::try_from(n).unwrap_or(1),
        Some(_) => return Err(Error::invalid("pageSize", "must be between 1 and 1000")),
    };
    let start = match ask.token()? {
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
            .filter(|n| *n <= len)
            .ok_or_else(|| Error::invalid("pageToken", "is not a token this server issued"))?,
    };
    let end = start.saturating_add(size).min(len);
    Ok((start, end))
}
