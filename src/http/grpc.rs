//! The gRPC binding of A2A 1.0 (docs/PROTOCOL.md §10.13; S10 §10): `lf.a2a.v1.A2AService` on
//! the same listener (HTTP/2; a request whose content type is `application/grpc` comes
//! here). Each call is admitted as the other bindings' calls are — key (`x-api-key` or
//! `authorization` metadata), agent (the request's `tenant`, empty: `server.default_agent`),
//! the key's agents, `a2a-version`, rate — then its message is turned into the ProtoJSON the
//! JSON-RPC binding decodes, run by the same operations ([`rest::execute_json`]), and the
//! JSON result turned back into the response message. Errors are `google.rpc.Status` with
//! the code of S10 §5.4 and the same `ErrorInfo` (in `grpc-status-details-bin`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::Stream;
use hyper::Request;
use hyper::body::Incoming;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use super::{App, Body, observed, refused_by, version_refusal};
use crate::model::AgentId;
use crate::rpc::a2a::errors::{
    self, AGENT_NOT_FOUND, CONTENT_TYPE_NOT_SUPPORTED, PUSH_NOT_SUPPORTED, RATE_LIMITED,
    TASK_NOT_CANCELABLE, TASK_NOT_FOUND, UNAUTHENTICATED, UNAUTHORIZED, UNSUPPORTED_OPERATION,
    VERSION_NOT_SUPPORTED,
};
use crate::rpc::a2a::ops::Op;
use crate::rpc::a2a::pb::{self, a2a_service_server};
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

/// Serves one gRPC call.
pub(crate) async fn serve(app: Arc<App>, mut req: Request<Incoming>) -> hyper::Response<Body> {
    // The `:authority` becomes `host` metadata: the card's interfaces are built from it.
    if !req.headers().contains_key(hyper::header::HOST)
        && let Some(authority) = req.uri().authority()
        && let Ok(v) = hyper::header::HeaderValue::from_str(authority.as_str())
    {
        req.headers_mut().insert(hyper::header::HOST, v);
    }
    let app_limit = app.max_body;
    let limit = usize::try_from(app_limit).unwrap_or(usize::MAX);
    // Every RPC of the service takes one message: the body is read whole first, within the
    // body cap (plus the 5 bytes of gRPC framing) and `server.body_read_timeout_seconds`, so
    // a slow or endless sender holds nothing longer than a JSON-RPC one could.
    let (parts, body) = req.into_parts();
    let bytes =
        match super::read_limited(&app, &parts.headers, body, app_limit.saturating_add(5)).await {
            Ok(b) => b,
            Err(r) => {
                let e = errors::refusal(Version::V10, &r);
                let (p, b) = status(&e).into_http::<tonic::body::Body>().into_parts();
                return hyper::Response::from_parts(p, Body::grpc(b));
            }
        };
    let req = Request::from_parts(parts, http_body_util::Full::new(bytes));
    let mut svc = a2a_service_server::A2aServiceServer::new(Grpc { app })
        .max_decoding_message_size(limit)
        .max_encoding_message_size(usize::MAX);
    let response = match tonic::codegen::Service::call(&mut svc, req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    // A message over the size bound is refused by tonic before any handler runs, as
    // OUT_OF_RANGE without details; it gets the bound's own error instead, as on the other
    // bindings (RESOURCE_EXHAUSTED, INVALID_REQUEST with the limit).
    // Likewise a message that is not protobuf (INTERNAL from tonic): INVALID_ARGUMENT with
    // a PARSE_ERROR, as a body that is not JSON is on the others.
    let code = response.headers().get("grpc-status").map(|v| v.as_bytes());
    let undecodable = code == Some(b"13")
        && response.headers().get("grpc-message").is_some_and(|m| {
            // tonic's messages for a frame it cannot read (percent-encoded on the wire).
            let m = String::from_utf8_lossy(m.as_bytes()).replace("%20", " ");
            [
                "failed to decode",
                "Unexpected EOF",
                "protocol error",
                "Message compressed",
            ]
            .iter()
            .any(|p| m.starts_with(p))
        });
    let response = if code == Some(b"11") {
        let e = errors::refusal(Version::V10, &Refusal::TooLarge(app_limit));
        status(&e).into_http::<tonic::body::Body>()
    } else if undecodable {
        let e = errors::dress(
            Version::V10,
            RpcError::parse_error("the message is not a protobuf message of this call".into()),
        );
        status(&e).into_http::<tonic::body::Body>()
    } else {
        response
    };
    let (parts, body) = response.into_parts();
    hyper::Response::from_parts(parts, Body::grpc(body))
}

struct Grpc {
    app: Arc<App>,
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

type Events = Pin<Box<dyn Stream<Item = Result<pb::StreamResponse, Status>> + Send>>;

impl Grpc {
    /// Admits and runs one call: the reply of the operation, or its error as a status.
    async fn call<M: Serialize + Tenant>(
        &self,
        op: Op,
        req: tonic::Request<M>,
    ) -> Result<Reply, Status> {
        let app = &*self.app;
        let headers = req.metadata().clone().into_headers();
        let mut msg = req.into_inner();
        let tenant = msg.take_tenant();
        let refusal = |r: &Refusal| status(&errors::refusal(Version::V10, r));
        let caller = app
            .keys
            .authenticate(&headers)
            .map_err(|e| refusal(&Refusal::Unauthorized(e.message())))?;
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
        let base_url = super::base_url(app, &headers);
        let version = headers
            .get("a2a-version")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        if let Some(e) = version_refusal(Version::V10, version.as_deref(), &base_url, &agent_id) {
            refused_by(app, DIALECT, Binding::Grpc, &agent, e.code);
            return Err(status(&e));
        }
        // The message, its tenant taken out, as the ProtoJSON the shared decoder reads.
        let params =
            serde_json::value::to_raw_value(&msg).map_err(|_| Status::internal("encoding"))?;
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
        };
        let work = async {
            match app
                .rate
                .try_acquire(cx.caller.principal_index, cx.agent.index)
            {
                Err(retry_after) => Err(errors::refusal(
                    Version::V10,
                    &Refusal::RateLimited(retry_after),
                )),
                // Boxed: tonic moves the handler's future as it goes.
                Ok(()) => Box::pin(rest::execute_json(&app.runtime, &cx, op, &params)).await,
            }
        };
        observed(app, DIALECT, Binding::Grpc, &cx, Some(op.name()), work)
            .await
            .map_err(|e| status(&e))
    }

    /// A unary call: the JSON result as the response message.
    async fn unary<M: Serialize + Tenant, R: DeserializeOwned>(
        &self,
        op: Op,
        req: tonic::Request<M>,
    ) -> Result<tonic::Response<R>, Status> {
        match self.call(op, req).await? {
            Reply::Json { body, .. } => message(&body).map(tonic::Response::new),
            Reply::Stream { .. } | Reply::Events { .. } => Err(Status::internal("not unary")),
        }
    }

    /// A streaming call: each event's `StreamResponse`.
    async fn streaming<M: Serialize + Tenant>(
        &self,
        op: Op,
        req: tonic::Request<M>,
    ) -> Result<tonic::Response<Events>, Status> {
        let events: Events = match self.call(op, req).await? {
            Reply::Stream {
                id,
                mut stream,
                frames,
            } => {
                let mut first = true;
                Box::pin(futures_util::stream::poll_fn(move |cx| {
                    match stream.poll_next(cx) {
                        Poll::Ready(Some(item)) => {
                            let json = frames(&id, &item, first);
                            first = false;
                            Poll::Ready(Some(message(&json)))
                        }
                        Poll::Ready(None) => Poll::Ready(None),
                        Poll::Pending => Poll::Pending,
                    }
                }))
            }
            // One agent message answering a streaming call: a one-item stream.
            Reply::Events { body } => {
                let one = sse_data(&body).map_or_else(
                    || Err(Status::internal("event")),
                    message::<pb::StreamResponse>,
                );
                Box::pin(futures_util::stream::iter([one]))
            }
            Reply::Json { body, .. } => {
                let one = message::<pb::StreamResponse>(&body);
                Box::pin(futures_util::stream::iter([one]))
            }
        };
        Ok(tonic::Response::new(events))
    }
}

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
fn message<R: DeserializeOwned>(json: &[u8]) -> Result<R, Status> {
    serde_json::from_slice(json)
        .map_err(|e| Status::internal(format!("the result did not fit its message: {e}")))
}

/// The `data:` of a one-frame SSE body.
fn sse_data(frame: &[u8]) -> Option<&[u8]> {
    let text = std::str::from_utf8(frame).ok()?;
    let at = text.find("data: ")? + "data: ".len();
    Some(text[at..].trim_end().as_bytes())
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

#[tonic::async_trait]
impl a2a_service_server::A2aService for Grpc {
    async fn send_message(
        &self,
        request: tonic::Request<pb::SendMessageRequest>,
    ) -> Result<tonic::Response<pb::SendMessageResponse>, Status> {
        self.unary(Op::SendMessage, request).await
    }

    type SendStreamingMessageStream = Events;

    async fn send_streaming_message(
        &self,
        request: tonic::Request<pb::SendMessageRequest>,
    ) -> Result<tonic::Response<Events>, Status> {
        self.streaming(Op::SendStreamingMessage, request).await
    }

    async fn get_task(
        &self,
        request: tonic::Request<pb::GetTaskRequest>,
    ) -> Result<tonic::Response<pb::Task>, Status> {
        self.unary(Op::GetTask, request).await
    }

    async fn list_tasks(
        &self,
        request: tonic::Request<pb::ListTasksRequest>,
    ) -> Result<tonic::Response<pb::ListTasksResponse>, Status> {
        self.unary(Op::ListTasks, request).await
    }

    async fn cancel_task(
        &self,
        request: tonic::Request<pb::CancelTaskRequest>,
    ) -> Result<tonic::Response<pb::Task>, Status> {
        self.unary(Op::CancelTask, request).await
    }

    type SubscribeToTaskStream = Events;

    async fn subscribe_to_task(
        &self,
        request: tonic::Request<pb::SubscribeToTaskRequest>,
    ) -> Result<tonic::Response<Events>, Status> {
        self.streaming(Op::SubscribeToTask, request).await
    }

    async fn create_task_push_notification_config(
        &self,
        request: tonic::Request<pb::TaskPushNotificationConfig>,
    ) -> Result<tonic::Response<pb::TaskPushNotificationConfig>, Status> {
        self.unary(Op::CreatePushConfig, request).await
    }

    async fn get_task_push_notification_config(
        &self,
        request: tonic::Request<pb::GetTaskPushNotificationConfigRequest>,
    ) -> Result<tonic::Response<pb::TaskPushNotificationConfig>, Status> {
        self.unary(Op::GetPushConfig, request).await
    }

    async fn list_task_push_notification_configs(
        &self,
        request: tonic::Request<pb::ListTaskPushNotificationConfigsRequest>,
    ) -> Result<tonic::Response<pb::ListTaskPushNotificationConfigsResponse>, Status> {
        self.unary(Op::ListPushConfigs, request).await
    }

    async fn get_extended_agent_card(
        &self,
        request: tonic::Request<pb::GetExtendedAgentCardRequest>,
    ) -> Result<tonic::Response<pb::AgentCard>, Status> {
        self.unary(Op::GetExtendedCard, request).await
    }

    async fn delete_task_push_notification_config(
        &self,
        request: tonic::Request<pb::DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<tonic::Response<pbjson_types::Empty>, Status> {
        self.unary(Op::DeletePushConfig, request).await
    }
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
