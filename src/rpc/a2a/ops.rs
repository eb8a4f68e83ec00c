//! The official operations, defined once (A2A 1.0 §9.4, and 0.3's subset of them): a typed
//! [`OpRequest`] in, a typed [`OpResponse`] out, [`Error`] for every failure. A binding is a
//! codec around [`execute`]: it names its methods in [`TABLE`], decodes its framing into a
//! request and encodes the response. JSON-RPC 1.0 and 0.3 are that codec today
//! (`dispatch.rs`); the HTTP+JSON and gRPC bindings of 1.0 plug in the same way.

use hyper::Method;

use super::params::SendParams;
use super::{Version, webhook};
use crate::error::Error;
use crate::model::{ContextId, Message, TaskId, TaskSnapshot};
use crate::push::{PushConfig, StoredPushConfig};
use crate::rpc::CallContext;
use crate::runtime::{
    AgentCard, NewPushConfig, Resubscribed, Runtime, Sent, Streamed, SubmitOptions, TaskIdUse,
    TaskStream, task_key,
};
use crate::store::{ListPage, ListQuery};

/// An official operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    SendMessage,
    SendStreamingMessage,
    GetTask,
    ListTasks,
    CancelTask,
    SubscribeToTask,
    CreatePushConfig,
    GetPushConfig,
    ListPushConfigs,
    DeletePushConfig,
    GetExtendedCard,
}

/// One operation's names on every binding.
pub(crate) struct Names {
    pub(crate) op: Op,
    /// Its JSON-RPC method in 1.0 (also its metric label on every binding).
    pub(crate) v10: &'static str,
    /// Its JSON-RPC method in 0.3, where 0.3 has the operation.
    pub(crate) v03: Option<&'static str>,
    /// Its HTTP+JSON route: the HTTP methods and the path under `{agent}/rest` (P10's
    /// `google.api.http`). A `{field}` segment, with an optional literal suffix, is a field
    /// of the request, in the name the operation's params give it.
    pub(crate) rest: (&'static [Method], &'static str),
    /// Its method of the gRPC service `lf.a2a.v1.A2AService`.
    pub(crate) grpc: &'static str,
}

const fn names(
    op: Op,
    v10: &'static str,
    v03: Option<&'static str>,
    rest: (&'static [Method], &'static str),
    grpc: &'static str,
) -> Names {
    Names {
        op,
        v10,
        v03,
        rest,
        grpc,
    }
}

const GET: &[Method] = &[Method::GET];
const POST: &[Method] = &[Method::POST];
const DELETE: &[Method] = &[Method::DELETE];
/// S10 §11.3 says POST, the proto's `google.api.http` says GET: both.
const GET_POST: &[Method] = &[Method::GET, Method::POST];

/// The operation table: every operation once, with its names on every binding (in the 1.0
/// specification's order). The JSON-RPC dispatch, the HTTP+JSON router and the gRPC
/// dispatcher all read it.
#[rustfmt::skip]
pub(crate) const TABLE: [Names; 11] = [
    names(Op::SendMessage, "SendMessage", Some("message/send"),
        (POST, "message:send"), "SendMessage"),
    names(Op::SendStreamingMessage, "SendStreamingMessage", Some("message/stream"),
        (POST, "message:stream"), "SendStreamingMessage"),
    names(Op::GetTask, "GetTask", Some("tasks/get"),
        (GET, "tasks/{id}"), "GetTask"),
    names(Op::ListTasks, "ListTasks", None,
        (GET, "tasks"), "ListTasks"),
    names(Op::CancelTask, "CancelTask", Some("tasks/cancel"),
        (POST, "tasks/{id}:cancel"), "CancelTask"),
    names(Op::SubscribeToTask, "SubscribeToTask", Some("tasks/resubscribe"),
        (GET_POST, "tasks/{id}:subscribe"), "SubscribeToTask"),
    names(Op::CreatePushConfig, "CreateTaskPushNotificationConfig", Some("tasks/pushNotificationConfig/set"),
        (POST, "tasks/{taskId}/pushNotificationConfigs"), "CreateTaskPushNotificationConfig"),
    names(Op::GetPushConfig, "GetTaskPushNotificationConfig", Some("tasks/pushNotificationConfig/get"),
        (GET, "tasks/{taskId}/pushNotificationConfigs/{id}"), "GetTaskPushNotificationConfig"),
    names(Op::ListPushConfigs, "ListTaskPushNotificationConfigs", Some("tasks/pushNotificationConfig/list"),
        (GET, "tasks/{taskId}/pushNotificationConfigs"), "ListTaskPushNotificationConfigs"),
    names(Op::DeletePushConfig, "DeleteTaskPushNotificationConfig", Some("tasks/pushNotificationConfig/delete"),
        (DELETE, "tasks/{taskId}/pushNotificationConfigs/{id}"), "DeleteTaskPushNotificationConfig"),
    names(Op::GetExtendedCard, "GetExtendedAgentCard", Some("agent/getAuthenticatedExtendedCard"),
        (GET, "extendedAgentCard"), "GetExtendedAgentCard"),
];

// The table lists the operations in their declaration order (`Op::names` indexes it).
const _: () = {
    let mut i = 0;
    while i < TABLE.len() {
        assert!(TABLE[i].op as usize == i, "ops::TABLE is in Op's order");
        i += 1;
    }
};

impl Op {
    /// Its names.
    pub(crate) fn names(self) -> &'static Names {
        &TABLE[self as usize]
    }

    /// Its 1.0 method name.
    pub(crate) fn name(self) -> &'static str {
        self.names().v10
    }

    /// The operation a version's method name names.
    pub(crate) fn named(v: Version, method: &str) -> Option<Self> {
        TABLE.iter().find_map(|n| {
            let name = match v {
                Version::V10 => Some(n.v10),
                Version::V03 => n.v03,
            };
            (name == Some(method)).then_some(n.op)
        })
    }

    /// The operation of a gRPC method.
    pub(crate) fn of_grpc(method: &str) -> Option<Self> {
        TABLE
            .iter()
            .find_map(|n| (n.grpc == method).then_some(n.op))
    }

    /// The checks of the agent's capabilities made before the params are read (their
    /// errors win over the params').
    pub(crate) fn admit(self, cx: &CallContext) -> Result<(), Error> {
        match self {
            Self::SendStreamingMessage if !cx.agent.config.streaming() => Err(not_streaming(None)),
            Self::CreatePushConfig
            | Self::GetPushConfig
            | Self::ListPushConfigs
            | Self::DeletePushConfig => push_enabled(cx),
            _ => Ok(()),
        }
    }
}

/// One operation's request, as every binding decodes it.
#[derive(Debug)]
pub(crate) enum OpRequest {
    /// SendMessage (`stream: false`) and SendStreamingMessage.
    Send {
        params: SendParams,
        stream: bool,
    },
    GetTask {
        task: TaskId,
        history_length: Option<usize>,
    },
    ListTasks {
        query: ListQuery,
        history_length: Option<usize>,
        artifacts: bool,
    },
    CancelTask {
        task: TaskId,
        reason: Option<String>,
    },
    SubscribeToTask {
        task: TaskId,
        /// Resume after this event (`Last-Event-ID` on the HTTP+JSON binding); none: from
        /// the task's current state.
        after: Option<u64>,
    },
    CreatePushConfig {
        task: TaskId,
        config: PushConfig,
        config_id: Option<String>,
    },
    /// `config_id`: none asks for the task's first configuration (0.3).
    GetPushConfig {
        task: TaskId,
        config_id: Option<String>,
    },
    ListPushConfigs {
        task: TaskId,
    },
    DeletePushConfig {
        task: TaskId,
        config_id: String,
    },
    GetExtendedCard,
}

/// One operation's result, as every binding encodes it.
#[expect(
    clippy::large_enum_variant,
    reason = "made and consumed once per call; boxing the task would cost a send an allocation"
)]
pub(crate) enum OpResponse {
    /// A task (`artifacts`: whether its artifacts are shown).
    Task {
        task: TaskSnapshot,
        history_length: Option<usize>,
        artifacts: bool,
    },
    /// A bare agent message answered a send (no task was made).
    Message {
        message: Message,
        context: ContextId,
    },
    /// A task's events.
    Stream(TaskStream),
    /// A bare agent message answered a streaming send: a stream of that one message.
    MessageStream {
        message: Message,
        context: ContextId,
    },
    /// A page of the caller's tasks.
    Tasks {
        page: ListPage,
        page_size: usize,
        history_length: Option<usize>,
        artifacts: bool,
    },
    PushConfig(std::sync::Arc<StoredPushConfig>),
    PushConfigs(Vec<std::sync::Arc<StoredPushConfig>>),
    Deleted,
    Card(AgentCard),
}

/// Runs one operation for the caller of `cx`. `v` picks what differs between versions
/// below the framing: the format of the webhooks a push configuration asks for, and the
/// field a refused push target is reported under.
///
/// Not an `async fn`, so that its future holds the request once: it is part of every
/// call's future (docs/decisions/the-floor-of-the-design.md).
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice"
)]
pub(crate) fn execute(
    runtime: &Runtime,
    cx: &CallContext,
    v: Version,
    request: OpRequest,
) -> impl Future<Output = Result<OpResponse, Error>> + Send {
    async move {
        let principal = &cx.caller.principal;
        let agent = &cx.agent_id;
        match request {
            OpRequest::Send { mut params, stream } => {
                params.request.extensions = cx.extensions.clone();
                let context = params.request.context_id.clone();
                let options = submission(runtime, cx, v, params.push)?;
                if stream {
                    return match runtime
                        .stream_with(principal, agent, params.request, options)
                        .await?
                    {
                        Streamed::Task(stream) => {
                            cx.task(&stream.task_id);
                            Ok(OpResponse::Stream(stream))
                        }
                        Streamed::Message(message) => Ok(OpResponse::MessageStream {
                            message,
                            context: context.unwrap_or_else(ContextId::generate),
                        }),
                    };
                }
                let limits = &cx.agent.config.limits;
                let wait = params.blocking.then(|| limits.sync_wait());
                match runtime
                    .send_with(principal, agent, params.request, wait, options)
                    .await?
                {
                    Sent::Task(task) => {
                        cx.task(&task.id);
                        Ok(OpResponse::Task {
                            task,
                            history_length: params.history_length,
                            artifacts: true,
                        })
                    }
                    Sent::Message(message) => Ok(OpResponse::Message {
                        message,
                        context: context.unwrap_or_else(ContextId::generate),
                    }),
                }
            }
            OpRequest::GetTask {
                task,
                history_length,
            } => Ok(OpResponse::Task {
                task: runtime.get(principal, agent, &task).await?,
                history_length,
                artifacts: true,
            }),
            OpRequest::ListTasks {
                query,
                history_length,
                artifacts,
            } => {
                let page_size = query.page_size;
                Ok(OpResponse::Tasks {
                    page: runtime.list(&query).await?,
                    page_size,
                    history_length,
                    artifacts,
                })
            }
            OpRequest::CancelTask { task, reason } => Ok(OpResponse::Task {
                task: runtime.cancel(principal, agent, &task, reason).await?,
                history_length: None,
                artifacts: true,
            }),
            OpRequest::SubscribeToTask { task, after } => {
                if !cx.agent.config.streaming() {
                    return Err(not_streaming(Some(task)));
                }
                // `Last-Event-ID` (gRPC: `a2a-last-event-id`) resumes, on every binding.
                let after =
                    match (after, &cx.last_event_id) {
                        (Some(n), _) => Some(n),
                        (None, Some(last)) => Some(last.trim().parse().map_err(|_| {
                            Error::invalid("Last-Event-ID", "must be an event number")
                        })?),
                        (None, None) => None,
                    };
                let followed = match after {
                    None => runtime.follow(principal, agent, &task).await?,
                    Some(n) => runtime.follow_from(principal, agent, &task, n).await?,
                };
                match followed {
                    Resubscribed::Live(stream) => Ok(OpResponse::Stream(stream)),
                    Resubscribed::Finished(t) => Err(Error::SubscriptionFailed {
                        task: Some(task),
                        reason: format!(
                            "the task is {}; a terminal task has no more events",
                            t.status.state.as_str()
                        ),
                    }),
                }
            }
            OpRequest::CreatePushConfig {
                task,
                config,
                config_id,
            } => {
                check_target(runtime, &config, v)?;
                let key = task_key(principal, agent, &task);
                let stored = StoredPushConfig::named(&key, config_id, config, webhook::format(v));
                runtime.set_push(stored.clone()).await?;
                Ok(OpResponse::PushConfig(stored))
            }
            OpRequest::GetPushConfig { task, config_id } => {
                let configs = runtime.task_push_configs(principal, agent, &task).await?;
                let found = match &config_id {
                    Some(wanted) => configs.into_iter().find(|c| &c.id == wanted),
                    None => configs.into_iter().next(),
                };
                found
                    .map(OpResponse::PushConfig)
                    .ok_or(Error::TaskNotFound { task })
            }
            OpRequest::ListPushConfigs { task } => Ok(OpResponse::PushConfigs(
                runtime.task_push_configs(principal, agent, &task).await?,
            )),
            OpRequest::DeletePushConfig { task, config_id } => {
                runtime
                    .delete_push(principal, agent, &task, &config_id)
                    .await?;
                Ok(OpResponse::Deleted)
            }
            OpRequest::GetExtendedCard => runtime
                .card(agent)
                .map(OpResponse::Card)
                .ok_or(Error::AgentNotFound),
        }
    }
}

/// The options of a send: official task ids continue a task and never create one; an
/// agent may answer with a bare message; an inline push configuration (checked here,
/// before any task exists) is stored for the new task.
fn submission(
    runtime: &Runtime,
    cx: &CallContext,
    v: Version,
    push: Option<(PushConfig, Option<String>)>,
) -> Result<SubmitOptions, Error> {
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
    Ok(SubmitOptions {
        push,
        task_id: TaskIdUse::Continue,
        allow_message: true,
    })
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

fn not_streaming(task: Option<TaskId>) -> Error {
    Error::SubscriptionFailed {
        task,
        reason: "this agent does not support streaming".into(),
    }
}
