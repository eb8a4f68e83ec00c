//! The gRPC binding of A2A 1.0 (docs/PROTOCOL.md §10.13; S10 §10): `lf.a2a.v1.A2AService` on
//! the same listener (HTTP/2; a request whose content type is `application/grpc` comes
//! here). Each call is admitted as the other bindings' calls are — key (`x-api-key` or
//! `authorization` metadata, before a byte of the body is read), agent (the request's
//! `tenant`, empty: `server.default_agent`), the key's agents, `a2a-version`, rate — then
//! its message is turned into the ProtoJSON the
//! JSON-RPC binding decodes and run by the same operations ([`rest::execute_with`]). Sends,
//! task reads and stream events are written as protobuf straight from the model (`pbout`);
//! the other results are read back from their JSON. Errors are `google.rpc.Status` with the
//! code of S10 §5.4 and the same `ErrorInfo` (in `grpc-status-details-bin`), as
//! trailers-only responses.
//!
//! The framing is a2ad's own, not a generated server's: the one message of a call is read
//! whole within the body cap and the body budgets (`super::budget`), and the response is
//! its message then `grpc-status: 0` —
//! a unary call's headers, message and trailers leave in one write.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use hyper::Request;
use hyper::body::Incoming;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use super::{App, Body, observed, refused_by, version_refusal};
use crate::auth::{Caller, PeerCertificate};
use crate::model::{AgentId, TaskSnapshot};
use crate::rpc::a2a::errors::{
    self, AGENT_NOT_FOUND, CONTENT_TYPE_NOT_SUPPORTED, PUSH_NOT_SUPPORTED, RATE_LIMITED,
    TASK_NOT_CANCELABLE, TASK_NOT_FOUND, UNAUTHENTICATED, UNAUTHORIZED, UNSUPPORTED_OPERATION,
    VERSION_NOT_SUPPORTED,
};
use crate::rpc::a2a::ops::{Op, OpResponse};
use crate::rpc::a2a::pb;
use crate::rpc::a2a::pbout;
use crate::rpc::a2a::{Version, rest};
use crate::rpc::error::{
    INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, RpcError,
};
use crate::rpc::{Binding, CallContext, Dialect, Refusal, Reply};

const DIALECT: Dialect = Dialect::A2a(Version::V10);

/// Whether a request is a gRPC call (`content-type: application/grpc[+proto]`).
pub(crate) fn is_grpc(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"))
}

/// The service's path prefix: `/lf.a2a.v1.A2AService/{Method}`.
const SERVICE: &str = "/lf.a2a.v1.A2AService/";

/// The operation of each of the service's methods.
const METHODS: [(&str, Op); 11] = [
    ("SendMessage", Op::SendMessage),
    ("SendStreamingMessage", Op::SendStreamingMessage),
    ("GetTask", Op::GetTask),
    ("ListTasks", Op::ListTasks),
    ("CancelTask", Op::CancelTask),
    ("SubscribeToTask", Op::SubscribeToTask),
    ("CreateTaskPushNotificationConfig", Op::CreatePushConfig),
    ("GetTaskPushNotificationConfig", Op::GetPushConfig),
    ("ListTaskPushNotificationConfigs", Op::ListPushConfigs),
    ("GetExtendedAgentCard", Op::GetExtendedCard),
    ("DeleteTaskPushNotificationConfig", Op::DeletePushConfig),
];

/// Serves one gRPC call: its one length-prefixed message read whole, decoded, admitted and
/// run as the other bindings' calls are; the response message and `grpc-status: 0` in the
/// trailers, or the error's status alone (a trailers-only response).
pub(crate) async fn serve(app: Arc<App>, req: Request<Incoming>) -> hyper::Response<Body> {
    let Some(op) = req.uri().path().strip_prefix(SERVICE).and_then(|m| {
        METHODS
            .iter()
            .find_map(|(name, op)| (*name == m).then_some(*op))
    }) else {
        let method = req.uri().path().to_string();
        crate::telemetry::refused(METHOD_NOT_FOUND);
        return trailers_only(Status::unimplemented(format!(
            "{method} is not a method of lf.a2a.v1.A2AService"
        )));
    };
    // Protobuf only: `application/grpc`, `application/grpc+proto` (a `+json` call, say, is
    // refused, not misread).
    let proto = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .map(|v| v.as_bytes())
        .and_then(|ct| ct.strip_prefix(b"application/grpc"))
        .map(|rest| rest.strip_prefix(b"+proto").unwrap_or(rest))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(b";"));
    if !proto {
        return trailers_only(refusal(&Refusal::UnsupportedMediaType));
    }
    // The key (metadata) is checked before a byte of the body is read: a caller without
    // one holds nothing (docs/RELIABILITY.md).
    let (parts, body) = req.into_parts();
    let peer = PeerCertificate::of(&parts.extensions).cloned();
    let caller = match app.keys.authenticate(&parts.headers, peer.as_ref()).await {
        Ok(c) => c,
        Err(e) => return trailers_only(refusal(&Refusal::Unauthorized(e.message()))),
    };
    // Every method takes one message: the body is read whole, within the body cap (plus
    // the 5 bytes of gRPC framing), the body budgets and
    // `server.body_read_timeout_seconds`, so a slow or endless sender holds nothing longer
    // than a JSON-RPC one could. `_held`: its bytes count until the call is answered.
    let (bytes, _held) =
        match super::read_limited(&app, &parts, body, app.max_body.saturating_add(5)).await {
            Ok(b) => b,
            Err(r) => return trailers_only(refusal(&r)),
        };
    let message = match unframe(&bytes, app.max_body) {
        Ok(m) => m,
        Err(Unframed::TooLarge) => return trailers_only(refusal(&Refusal::TooLarge(app.max_body))),
        Err(Unframed::Invalid(why)) => return trailers_only(parse_error(why)),
    };
    let mut grpc = Grpc {
        app,
        caller: Some(caller),
    };
    let h = &parts.headers;
    macro_rules! unary {
        ($request:ty => $response:ty) => {
            grpc.unary::<$request, $response>(op, h, message).await
        };
    }
    macro_rules! streaming {
        ($request:ty) => {
            grpc.streaming::<$request>(op, h, message).await
        };
    }
    let result = match op {
        Op::SendMessage => unary!(pb::SendMessageRequest => pb::SendMessageResponse),
        Op::SendStreamingMessage => streaming!(pb::SendMessageRequest),
        Op::GetTask => unary!(pb::GetTaskRequest => pb::Task),
        Op::ListTasks => unary!(pb::ListTasksRequest => pb::ListTasksResponse),
        Op::CancelTask => unary!(pb::CancelTaskRequest => pb::Task),
        Op::SubscribeToTask => streaming!(pb::SubscribeToTaskRequest),
        Op::CreatePushConfig => {
            unary!(pb::TaskPushNotificationConfig => pb::TaskPushNotificationConfig)
        }
        Op::GetPushConfig => {
            unary!(pb::GetTaskPushNotificationConfigRequest => pb::TaskPushNotificationConfig)
        }
        Op::ListPushConfigs => unary!(
            pb::ListTaskPushNotificationConfigsRequest
                => pb::ListTaskPushNotificationConfigsResponse
        ),
        Op::GetExtendedCard => unary!(pb::GetExtendedAgentCardRequest => pb::AgentCard),
        Op::DeletePushConfig => {
            unary!(pb::DeleteTaskPushNotificationConfigRequest => pbjson_types::Empty)
        }
    };
    match result {
        Ok(body) => {
            let mut response = hyper::Response::new(body);
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
            response
        }
        Err(status) => trailers_only(status),
    }
}

const GRPC_CONTENT_TYPE: hyper::header::HeaderValue =
    hyper::header::HeaderValue::from_static("application/grpc");

/// Why a request body is not one gRPC message.
enum Unframed {
    TooLarge,
    Invalid(&'static str),
}

/// The message of a unary request body: a flag byte (0: not compressed), its length (4
/// bytes, big-endian), the message; nothing after it.
fn unframe(body: &[u8], max: u64) -> Result<&[u8], Unframed> {
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

/// What the fuzz target `grpc` drives (`crate::fuzzing::grpc`): a request body of method
/// `METHODS[method % 11]` unframed within `max`, its message decoded and its tenant taken
/// out as [`Grpc::call`] does, and the ProtoJSON the shared params decoders then read.
/// `Err` names why the call would be refused before any operation ran.
pub(crate) fn fuzz_decode(
    method: u8,
    body: &[u8],
    max: u64,
) -> Result<(Op, String, Box<serde_json::value::RawValue>), &'static str> {
    fn decoded<M: prost::Message + Default + Serialize + Tenant>(
        op: Op,
        message: &[u8],
    ) -> Result<(String, Box<serde_json::value::RawValue>), &'static str> {
        let mut msg = M::decode(message).map_err(|_| "not a message of the call")?;
        let tenant = msg.take_tenant();
        let params = protojson(op, &msg).map_err(|_| "a value A2A does not define")?;
        Ok((tenant, params))
    }
    let (_, op) = METHODS[usize::from(method) % METHODS.len()];
    let message = match unframe(body, max) {
        Ok(m) => m,
        Err(Unframed::TooLarge) => return Err("too large"),
        Err(Unframed::Invalid(why)) => return Err(why),
    };
    let (tenant, params) = match op {
        Op::SendMessage | Op::SendStreamingMessage => {
            decoded::<pb::SendMessageRequest>(op, message)
        }
        Op::GetTask => decoded::<pb::GetTaskRequest>(op, message),
        Op::ListTasks => decoded::<pb::ListTasksRequest>(op, message),
        Op::CancelTask => decoded::<pb::CancelTaskRequest>(op, message),
        Op::SubscribeToTask => decoded::<pb::SubscribeToTaskRequest>(op, message),
        Op::CreatePushConfig => decoded::<pb::TaskPushNotificationConfig>(op, message),
        Op::GetPushConfig => decoded::<pb::GetTaskPushNotificationConfigRequest>(op, message),
        Op::ListPushConfigs => decoded::<pb::ListTaskPushNotificationConfigsRequest>(op, message),
        Op::GetExtendedCard => decoded::<pb::GetExtendedAgentCardRequest>(op, message),
        Op::DeletePushConfig => decoded::<pb::DeleteTaskPushNotificationConfigRequest>(op, message),
    }?;
    Ok((op, tenant, params))
}

/// A request message as the ProtoJSON the shared params decoders read. Protobuf carries an
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

/// The status of a refusal every binding shares (no key, no agent, too large, …).
fn refusal(r: &Refusal) -> Status {
    refused(&errors::refusal(Version::V10, r))
}

/// The status of an error that refused the call before any operation ran: the request's
/// span, when traced, is marked as an error with its code.
fn refused(e: &RpcError) -> Status {
    crate::telemetry::refused(e.code);
    status(e)
}

/// INVALID_ARGUMENT with a PARSE_ERROR: the body is not a message of the call, as a body
/// that is not JSON is on the other bindings.
fn parse_error(why: &str) -> Status {
    refused(&errors::dress(
        Version::V10,
        RpcError::parse_error(why.to_string()),
    ))
}

/// A response that is the status alone (its code, message and details in the headers).
fn trailers_only(status: Status) -> hyper::Response<Body> {
    status.into_http::<Body>()
}

/// One message as a gRPC frame (not compressed).
fn frame(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut out = Vec::with_capacity(len + 5);
    out.push(0);
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    message.encode_raw(&mut out);
    Bytes::from(out)
}

struct Grpc {
    app: Arc<App>,
    /// The authenticated caller (taken by the call).
    caller: Option<Arc<Caller>>,
}

/// A request message's `tenant` (the agent it names).
trait Tenant {
    /// Takes the tenant out (the operations' params carry none).
    fn take_tenant(&mut self) -> String;
}

macro_rules! tenant {
    ($($t:ty),* $(,)?) => {
        $(impl Tenant for $t {
            fn take_tenant(&mut self) -> String {
                std::mem::take(&mut self.tenant)
            }
        })*
    };
}

tenant!(
    pb::SendMessageRequest,
    pb::GetTaskRequest,
    pb::ListTasksRequest,
    pb::CancelTaskRequest,
    pb::SubscribeToTaskRequest,
    pb::TaskPushNotificationConfig,
    pb::GetTaskPushNotificationConfigRequest,
    pb::ListTaskPushNotificationConfigsRequest,
    pb::GetExtendedAgentCardRequest,
    pb::DeleteTaskPushNotificationConfigRequest,
);

/// A stream's framed messages.
pub(crate) type Frames = Pin<Box<dyn Stream<Item = Bytes> + Send>>;

impl Grpc {
    /// Admits and runs one call: its result in the response's form (`direct`) or framed as
    /// ProtoJSON, or its error as a status.
    async fn call<M: prost::Message + Default + Serialize + Tenant, T>(
        &mut self,
        op: Op,
        headers: &hyper::HeaderMap,
        message: &[u8],
        direct: impl FnOnce(OpResponse) -> Result<T, OpResponse>,
    ) -> Result<Result<T, Reply>, Status> {
        let app = &*self.app;
        let mut msg = M::decode(message)
            .map_err(|_| parse_error("the message is not a protobuf message of this call"))?;
        let tenant = msg.take_tenant();
        let caller = self
            .caller
            .take()
            .ok_or_else(|| Status::internal("the call was run twice"))?;
        let agent_id = AgentId::new(if tenant.is_empty() {
            default_agent(app)
        } else {
            tenant
        });
        let Some(agent) = app.runtime.agent(&agent_id).cloned() else {
            return Err(refusal(&Refusal::AgentNotFound(agent_id)));
        };
        if !caller.may_use(&agent_id) {
            return Err(refusal(&Refusal::Forbidden(agent_id)));
        }
        let base_url = super::base_url(app, headers);
        let version = headers
            .get("a2a-version")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        if let Some(e) = version_refusal(Version::V10, version.as_deref(), &base_url, &agent_id) {
            refused_by(app, DIALECT, Binding::Grpc, &agent, e.code);
            return Err(refused(&e));
        }
        // The message, its tenant taken out, as the ProtoJSON the shared decoder reads.
        let params =
            protojson(op, &msg).map_err(|e| refused(&errors::rpc_error(Version::V10, &e)))?;
        let cx = CallContext {
            caller,
            agent,
            agent_id,
            accepts_sse: true,
            last_event_id: headers
                .get("a2a-last-event-id")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
            in_batch: false,
            base_url,
            host: headers.get(hyper::header::HOST).cloned(),
            local_addr: app.local_addr,
            card_signer: app.card_signer.clone(),
        };
        let work = async {
            match app.rate.try_acquire(&cx.caller, cx.agent.index) {
                Err(retry_after) => Err(errors::refusal(
                    Version::V10,
                    &Refusal::RateLimited(retry_after),
                )),
                // Boxed: the operations' futures are large (~12 KB); inline, every call's
                // future would be that large, copied each time it moves.
                Ok(()) => {
                    Box::pin(rest::execute_with(&app.runtime, &cx, op, &params, direct)).await
                }
            }
        };
        observed(app, DIALECT, Binding::Grpc, &cx, Some(op.name()), work)
            .await
            .map_err(|e| status(&e))
    }

    /// A unary call: the response message, framed.
    async fn unary<M: prost::Message + Default + Serialize + Tenant, R: Response>(
        &mut self,
        op: Op,
        headers: &hyper::HeaderMap,
        message: &[u8],
    ) -> Result<Body, Status> {
        let framed = match self.call::<M, _>(op, headers, message, R::direct).await? {
            Ok(framed) => framed,
            Err(Reply::Json { body, .. }) => frame(&json_message::<R>(&body)?),
            Err(Reply::Stream { .. } | Reply::Events { .. }) => {
                return Err(Status::internal("a stream answered a unary call"));
            }
        };
        Ok(Body::grpc_one(framed))
    }

    /// A streaming call: each event's `StreamResponse`, framed, as it comes.
    async fn streaming<M: prost::Message + Default + Serialize + Tenant>(
        &mut self,
        op: Op,
        headers: &hyper::HeaderMap,
        message: &[u8],
    ) -> Result<Body, Status> {
        match self.call::<M, _>(op, headers, message, events).await? {
            Ok(events) => Ok(Body::grpc_stream(events)),
            Err(_) => Err(Status::internal(
                "a single result answered a streaming call",
            )),
        }
    }
}

/// A streaming call's events, written straight from the model (`pbout`).
#[expect(
    clippy::result_large_err,
    reason = "the result given back is moved once, to be encoded as JSON; boxing it would cost every call an allocation"
)]
fn events(response: OpResponse) -> Result<Frames, OpResponse> {
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

/// A unary call's response message: written straight from the model (`pbout`) for the
/// results of sends and task reads, read from the result's ProtoJSON for the others.
trait Response: prost::Message + DeserializeOwned {
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

impl Response for pb::ListTasksResponse {}
impl Response for pb::TaskPushNotificationConfig {}
impl Response for pb::ListTaskPushNotificationConfigsResponse {}
impl Response for pb::AgentCard {}
impl Response for pbjson_types::Empty {}

/// The agent of an empty `tenant`.
fn default_agent(app: &App) -> String {
    let config = app.runtime.config();
    config
        .server
        .default_agent
        .clone()
        .or_else(|| config.agents.first().map(|a| a.id.clone()))
        .unwrap_or_default()
}

/// A JSON result as a message (ProtoJSON, unknown fields ignored).
fn json_message<R: DeserializeOwned>(json: &[u8]) -> Result<R, Status> {
    serde_json::from_slice(json)
        .map_err(|e| Status::internal(format!("the result did not fit its message: {e}")))
}

/// The gRPC status of a 1.0 error (S10 v1.0.1 §5.4), its `ErrorInfo`, `BadRequest` and
/// `RetryInfo` in the details.
pub(crate) fn status(e: &RpcError) -> Status {
    let code = match e.code {
        TASK_NOT_FOUND | AGENT_NOT_FOUND => Code::NotFound,
        TASK_NOT_CANCELABLE
        | PUSH_NOT_SUPPORTED
        | UNSUPPORTED_OPERATION
        | VERSION_NOT_SUPPORTED => Code::FailedPrecondition,
        CONTENT_TYPE_NOT_SUPPORTED | PARSE_ERROR | INVALID_PARAMS => Code::InvalidArgument,
        INVALID_REQUEST if e.status == hyper::StatusCode::PAYLOAD_TOO_LARGE => {
            Code::ResourceExhausted
        }
        INVALID_REQUEST if e.status == hyper::StatusCode::REQUEST_TIMEOUT => Code::DeadlineExceeded,
        INVALID_REQUEST => Code::InvalidArgument,
        UNAUTHENTICATED => Code::Unauthenticated,
        UNAUTHORIZED => Code::PermissionDenied,
        RATE_LIMITED => Code::ResourceExhausted,
        METHOD_NOT_FOUND => Code::Unimplemented,
        INTERNAL_ERROR => Code::Internal,
        _ => Code::Unknown,
    };
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
