//! The gRPC binding of A2A 1.0 as a codec (docs/PROTOCOL.md §10.13; S10 §10): a unary
//! request body unframed into the protobuf message of its method ([`Decoded`]; the method
//! names its operation in the operation table), the message's `tenant` (the agent it names)
//! taken out, and the operation's request decoded straight from it (`pbin`: no JSON on the
//! way in, the same checks as the JSON-RPC params decoders); results written as protobuf
//! straight from the model for sends, task reads and stream events (`pbout`), read back
//! from their ProtoJSON for the others; errors as `google.rpc.Status` from the error table
//! ([`errors::statuses`]) with the same `ErrorInfo`. The HTTP/2 side — admission, the body
//! budgets, trailers — is the edge's (`http::grpc`).

use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::value::RawValue;
use tonic::Status;
use tonic_types::{ErrorDetails, StatusExt as _};

use super::jsonrpc::PageAsk;
use super::rest;
use crate::model::TaskSnapshot;
use crate::rpc::a2a::errors;
use crate::rpc::a2a::ops::{Op, OpRequest, OpResponse};
use crate::rpc::a2a::{Version, pb, pbin, pbout};
use crate::rpc::{CallContext, Frames, Reply, RpcError};
use crate::runtime::Runtime;

/// Why a request body is not one gRPC message.
pub(crate) enum Unframed {
    TooLarge,
    Invalid(&'static str),
}

/// The message of a unary request body: a flag byte (0: not compressed), its length (4
/// bytes, big-endian), the message; nothing after it.
pub(crate) fn unframe(body: &[u8], max: u64) -> Result<&[u8], Unframed> {
    let Some((head, message)) = body.split_first_chunk::<5>() else {
        return Err(Unframed::Invalid(if body.is_empty() {
            "the call carries no message"
        } else {
            "the message's frame is cut short"
        }));
    };
    let [flag, len @ ..] = *head;
    let len = u32::from_be_bytes(len);
    if u64::from(len) > max {
        return Err(Unframed::TooLarge);
    }
    if flag != 0 {
        // No `grpc-encoding` is accepted: a compressed message was sent without agreement.
        return Err(Unframed::Invalid(
            "the message is compressed, and this server accepts none",
        ));
    }
    match usize::try_from(len).ok().map(|n| message.len().cmp(&n)) {
        Some(std::cmp::Ordering::Equal) => Ok(message),
        Some(std::cmp::Ordering::Less) | None => {
            Err(Unframed::Invalid("the message's frame is cut short"))
        }
        Some(std::cmp::Ordering::Greater) => Err(Unframed::Invalid(
            "a call of this method carries one message",
        )),
    }
}

/// A request's message, decoded as its method's protobuf message.
#[expect(
    clippy::large_enum_variant,
    reason = "one per call, on its stack while it is admitted; boxing a send would cost it an allocation"
)]
pub(crate) enum Decoded {
    Send(pb::SendMessageRequest),
    GetTask(pb::GetTaskRequest),
    ListTasks(pb::ListTasksRequest),
    CancelTask(pb::CancelTaskRequest),
    Subscribe(pb::SubscribeToTaskRequest),
    CreatePushConfig(pb::TaskPushNotificationConfig),
    GetPushConfig(pb::GetTaskPushNotificationConfigRequest),
    ListPushConfigs(pb::ListTaskPushNotificationConfigsRequest),
    GetExtendedCard(pb::GetExtendedAgentCardRequest),
    DeletePushConfig(pb::DeleteTaskPushNotificationConfigRequest),
}

/// Runs `$body` with `$m` bound to the message of any [`Decoded`].
macro_rules! each {
    ($d:expr, $m:ident => $body:expr) => {
        match $d {
            Decoded::Send($m) => $body,
            Decoded::GetTask($m) => $body,
            Decoded::ListTasks($m) => $body,
            Decoded::CancelTask($m) => $body,
            Decoded::Subscribe($m) => $body,
            Decoded::CreatePushConfig($m) => $body,
            Decoded::GetPushConfig($m) => $body,
            Decoded::ListPushConfigs($m) => $body,
            Decoded::GetExtendedCard($m) => $body,
            Decoded::DeletePushConfig($m) => $body,
        }
    };
}

impl Decoded {
    /// The message of an operation's request (a body that is not one: PARSE_ERROR, as a
    /// body that is not JSON is on the other bindings).
    pub(crate) fn decode(op: Op, message: &[u8]) -> Result<Self, RpcError> {
        fn de<M: prost::Message + Default>(message: &[u8]) -> Result<M, RpcError> {
            M::decode(message).map_err(|_| {
                errors::dress(
                    Version::V10,
                    RpcError::parse_error(
                        "the message is not a protobuf message of this call".to_string(),
                    ),
                )
            })
        }
        Ok(match op {
            Op::SendMessage | Op::SendStreamingMessage => Self::Send(de(message)?),
            Op::GetTask => Self::GetTask(de(message)?),
            Op::ListTasks => Self::ListTasks(de(message)?),
            Op::CancelTask => Self::CancelTask(de(message)?),
            Op::SubscribeToTask => Self::Subscribe(de(message)?),
            Op::CreatePushConfig => Self::CreatePushConfig(de(message)?),
            Op::GetPushConfig => Self::GetPushConfig(de(message)?),
            Op::ListPushConfigs => Self::ListPushConfigs(de(message)?),
            Op::GetExtendedCard => Self::GetExtendedCard(de(message)?),
            Op::DeletePushConfig => Self::DeletePushConfig(de(message)?),
        })
    }

    /// Takes the `tenant` out (the agent the request names; the operations' params carry
    /// none).
    pub(crate) fn take_tenant(&mut self) -> String {
        each!(self, m => std::mem::take(&mut m.tenant))
    }

    /// The values protobuf can carry and A2A does not define (an enum's number, a time out of
    /// range): refused before the call is counted, as the ProtoJSON decoder refused them.
    pub(crate) fn check(&self) -> Result<(), crate::Error> {
        match self {
            Self::Send(m) => pbin::check_role(m),
            Self::ListTasks(m) => pbin::check_list(m),
            _ => Ok(()),
        }
    }

    /// The message as ProtoJSON, for the JSON-RPC params decoders: what the fuzz target
    /// `grpc` and the tests compare [`execute`]'s decoding with (no call takes this way).
    pub(crate) fn protojson(&self, op: Op) -> Result<Box<RawValue>, crate::Error> {
        each!(self, m => protojson(op, m))
    }

    /// The operation's request, decoded straight from the message, and what a
    /// ListTaskPushNotificationConfigs call asks of its page.
    pub(crate) fn request(
        self,
        op: Op,
        cx: &CallContext,
    ) -> Result<(OpRequest, Option<(i32, String)>), crate::Error> {
        let limits = &cx.agent.config.limits;
        Ok(match self {
            Self::Send(m) => (pbin::send(m, limits, op == Op::SendStreamingMessage)?, None),
            Self::GetTask(m) => (pbin::get_task(cx, m)?, None),
            Self::ListTasks(m) => (pbin::list_tasks(cx, m)?, None),
            Self::CancelTask(m) => (pbin::cancel_task(cx, m)?, None),
            Self::Subscribe(m) => (pbin::subscribe(cx, m)?, None),
            Self::CreatePushConfig(m) => (pbin::create_push_config(cx, m)?, None),
            Self::GetPushConfig(m) => (pbin::get_push_config(cx, m)?, None),
            Self::ListPushConfigs(m) => {
                let request = pbin::list_push_configs(cx, &m)?;
                (request, Some((m.page_size, m.page_token)))
            }
            Self::GetExtendedCard(_) => (OpRequest::GetExtendedCard, None),
            Self::DeletePushConfig(m) => (pbin::delete_push_config(cx, m)?, None),
        })
    }
}

/// What a ListTaskPushNotificationConfigs message asks of its page (0 and empty: nothing).
pub(crate) fn page_ask(page: Option<&(i32, String)>) -> PageAsk<'_> {
    match page {
        Some((size, token)) => PageAsk::Given {
            size: (*size != 0).then_some(i64::from(*size)),
            token: (!token.is_empty()).then_some(token.as_str()),
        },
        None => PageAsk::Given {
            size: None,
            token: None,
        },
    }
}

/// Runs a 1.0 operation on a decoded message: the agent's capabilities, the request decoded
/// straight from protobuf (`pbin`), then as every binding ([`rest::finish`]).
pub(crate) async fn execute<T>(
    runtime: &Runtime,
    cx: &CallContext,
    op: Op,
    decoded: Decoded,
    direct: impl FnOnce(OpResponse) -> Result<T, OpResponse>,
) -> Result<Result<T, Reply>, RpcError> {
    let run = async {
        op.admit(cx)?;
        let (request, page) = decoded.request(op, cx)?;
        rest::finish(runtime, cx, op, request, page_ask(page.as_ref()), direct).await
    };
    run.await
        .map_err(|e: crate::Error| errors::rpc_error(Version::V10, &e))
}

/// What the fuzz target `grpc` drives (`crate::fuzzing::grpc`): a request body of the
/// `method % 11`th operation unframed within `max`, its message decoded and its tenant taken
/// out as the edge does, its values checked, and its ProtoJSON (for the params decoders the
/// target compares `pbin` with). `Err` names why the call would be refused before any
/// operation ran.
pub(crate) fn fuzz_decode(
    method: u8,
    body: &[u8],
    max: u64,
) -> Result<(Op, String, Box<RawValue>), &'static str> {
    let op =
        crate::rpc::a2a::ops::TABLE[usize::from(method) % crate::rpc::a2a::ops::TABLE.len()].op;
    let message = match unframe(body, max) {
        Ok(m) => m,
        Err(Unframed::TooLarge) => return Err("too large"),
        Err(Unframed::Invalid(why)) => return Err(why),
    };
    let mut decoded = Decoded::decode(op, message).map_err(|_| "not a message of the call")?;
    let tenant = decoded.take_tenant();
    decoded.check().map_err(|_| "a value A2A does not define")?;
    let params = decoded
        .protojson(op)
        .map_err(|_| "a value A2A does not define")?;
    Ok((op, tenant, params))
}

/// A request message as ProtoJSON (what the fuzz target compares `pbin` with). Protobuf carries an
/// enum as any number, ProtoJSON only as one of its names: a number the protocol does not
/// define (a `role` of 98, a `status` of 40) cannot be written, and is an invalid param of
/// the field that holds it (found by the fuzz target `grpc`: it was INTERNAL).
fn protojson(
    op: Op,
    msg: &impl Serialize,
) -> Result<Box<serde_json::value::RawValue>, crate::Error> {
    serde_json::value::to_raw_value(msg).map_err(|e| {
        let field = match op {
            Op::SendMessage | Op::SendStreamingMessage => "message.role",
            Op::ListTasks => "status",
            _ => "params",
        };
        crate::Error::invalid(field, format!("is not a value A2A defines ({e})"))
    })
}

/// One message as a gRPC frame (not compressed).
pub(crate) fn frame(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut out = Vec::with_capacity(len + 5);
    out.push(0);
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    message.encode_raw(&mut out);
    Bytes::from(out)
}

/// A unary call's result as its response message, framed: written straight from the
/// model where `direct` can, else read from the result's ProtoJSON (`json`).
pub(crate) fn unary_from_json(op: Op, json: &[u8]) -> Result<Bytes, Status> {
    Ok(match op {
        Op::SendMessage => frame(&json_message::<pb::SendMessageResponse>(json)?),
        Op::GetTask | Op::CancelTask => frame(&json_message::<pb::Task>(json)?),
        Op::ListTasks => frame(&json_message::<pb::ListTasksResponse>(json)?),
        Op::CreatePushConfig | Op::GetPushConfig => {
            frame(&json_message::<pb::TaskPushNotificationConfig>(json)?)
        }
        Op::ListPushConfigs => {
            frame(&json_message::<pb::ListTaskPushNotificationConfigsResponse>(json)?)
        }
        Op::GetExtendedCard => frame(&json_message::<pb::AgentCard>(json)?),
        Op::DeletePushConfig => frame(&json_message::<pbjson_types::Empty>(json)?),
        Op::SendStreamingMessage | Op::SubscribeToTask => {
            return Err(Status::internal(
                "a single result answered a streaming call",
            ));
        }
    })
}

/// The encoder of a unary operation's results that are written straight from the model
/// (sends and task reads); any other result is given back, to be read from its ProtoJSON.
pub(crate) fn direct(op: Op) -> fn(OpResponse) -> Result<Bytes, OpResponse> {
    match op {
        Op::SendMessage => pb::SendMessageResponse::direct,
        Op::GetTask | Op::CancelTask => pb::Task::direct,
        _ => given_back,
    }
}

/// A result no binding writes straight from the model.
#[expect(
    clippy::result_large_err,
    reason = "as `events`: the result given back is moved once"
)]
fn given_back(response: OpResponse) -> Result<Bytes, OpResponse> {
    Err(response)
}

/// Whether an operation answers with a stream of messages.
pub(crate) fn streams(op: Op) -> bool {
    matches!(op, Op::SendStreamingMessage | Op::SubscribeToTask)
}

/// A streaming call's events, written straight from the model (`pbout`).
#[expect(
    clippy::result_large_err,
    reason = "the result given back is moved once, to be encoded as JSON; boxing it would cost every call an allocation"
)]
pub(crate) fn events(response: OpResponse) -> Result<Frames, OpResponse> {
    match response {
        OpResponse::Stream(mut stream) => {
            let mut first = true;
            Ok(Box::pin(futures_util::stream::poll_fn(move |cx| {
                stream.poll_next(cx).map(|item| {
                    item.map(|item| {
                        let event = pbout::event(&item, first);
                        first = false;
                        event
                    })
                })
            })))
        }
        // One agent message answering a streaming call: a one-item stream.
        OpResponse::MessageStream { message, context } => {
            let one = pbout::stream_message(&message, &context);
            Ok(Box::pin(futures_util::stream::iter([one])))
        }
        other => Err(other),
    }
}

/// A response message written straight from the model (`pbout`).
trait Response {
    /// The response's frame, or the result given back.
    #[expect(
        clippy::result_large_err,
        reason = "as `events`: the result given back is moved once"
    )]
    fn direct(response: OpResponse) -> Result<Bytes, OpResponse> {
        Err(response)
    }
}

impl Response for pb::SendMessageResponse {
    fn direct(response: OpResponse) -> Result<Bytes, OpResponse> {
        match response {
            OpResponse::Message { message, context } => Ok(pbout::send_message(&message, &context)),
            other => task_frame(other, pbout::send_task),
        }
    }
}

impl Response for pb::Task {
    fn direct(response: OpResponse) -> Result<Bytes, OpResponse> {
        task_frame(response, pbout::task_alone)
    }
}

/// A task result written by `write`; any other result given back.
#[expect(
    clippy::result_large_err,
    reason = "as `events`: the result given back is moved once"
)]
fn task_frame(
    response: OpResponse,
    write: fn(&TaskSnapshot, Option<usize>, bool) -> Bytes,
) -> Result<Bytes, OpResponse> {
    match response {
        OpResponse::Task {
            task,
            history_length,
            artifacts,
        } => Ok(write(&task, history_length, artifacts)),
        other => Err(other),
    }
}

/// A JSON result as a message (ProtoJSON, unknown fields ignored).
fn json_message<R: DeserializeOwned>(json: &[u8]) -> Result<R, Status> {
    serde_json::from_slice(json)
        .map_err(|e| Status::internal(format!("the result did not fit its message: {e}")))
}

/// The gRPC status of a 1.0 error (S10 v1.0.1 §5.4), its `ErrorInfo`, `BadRequest` and
/// `RetryInfo` in the details.
pub(crate) fn status(e: &RpcError) -> Status {
    let (_, code) = errors::statuses(e);
    let mut details = ErrorDetails::new();
    if let Some(Value::Array(items)) = &e.data {
        for item in items {
            match item["@type"].as_str() {
                Some("type.googleapis.com/google.rpc.ErrorInfo") => {
                    let metadata: std::collections::HashMap<String, String> = item["metadata"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| {
                                    (k.clone(), v.as_str().unwrap_or_default().to_string())
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    details.set_error_info(
                        item["reason"].as_str().unwrap_or_default(),
                        item["domain"].as_str().unwrap_or_default(),
                        metadata,
                    );
                }
                Some("type.googleapis.com/google.rpc.BadRequest") => {
                    for v in item["fieldViolations"].as_array().into_iter().flatten() {
                        details.add_bad_request_violation(
                            v["field"].as_str().unwrap_or_default(),
                            v["description"].as_str().unwrap_or_default(),
                        );
                    }
                }
                _ => {}
            }
        }
    }
    if let Some(secs) = e.retry_after {
        details.set_retry_info(Some(Duration::from_secs(secs)));
    }
    Status::with_error_details(code, e.message.to_string(), details)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::a2a::Version;
    use tonic::Code;

    #[test]
    fn errors_carry_the_specifications_codes_and_their_error_info() {
        use crate::error::Error;
        use crate::model::TaskId;
        for (e, code, reason) in [
            (
                Error::TaskNotFound {
                    task: TaskId::new("t"),
                },
                Code::NotFound,
                "TASK_NOT_FOUND",
            ),
            (
                Error::TaskCanceled {
                    task: TaskId::new("t"),
                },
                Code::FailedPrecondition,
                "TASK_NOT_CANCELABLE",
            ),
            (
                Error::invalid("message", "is required"),
                Code::InvalidArgument,
                "INVALID_PARAMS",
            ),
            (
                Error::TooManyTasks,
                Code::ResourceExhausted,
                "TOO_MANY_TASKS",
            ),
        ] {
            let s = status(&errors::rpc_error(Version::V10, &e));
            assert_eq!(s.code(), code, "{e}");
            let d = s.get_error_details();
            let info = d.error_info().expect("ErrorInfo");
            assert_eq!(info.reason, reason);
            assert_eq!(info.domain, "a2a-protocol.org");
        }
        let bad = status(&errors::rpc_error(
            Version::V10,
            &Error::invalid("message.role", "is required"),
        ));
        let details = bad.get_error_details();
        let violations = &details.bad_request().expect("BadRequest").field_violations;
        assert_eq!(violations[0].field, "message.role");
    }
}
