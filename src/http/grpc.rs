//! The gRPC binding of A2A 1.0 on the edge (docs/PROTOCOL.md §10.13; S10 §10):
//! `lf.a2a.v1.A2AService` on the same listener (HTTP/2; a request whose content type is
//! `application/grpc` comes here). A call is admitted as every binding's is (`admit`): the
//! key (`x-api-key` or `authorization` metadata) before a byte of the body is read; the
//! agent (the request's `tenant`, empty: `server.default_agent`), the key's agents,
//! `a2a-version` and the rate after its one message is decoded (the codec,
//! `rpc::a2a::bindings::grpc`). Errors are trailers-only responses.
//!
//! The framing is a2ad's own, not a generated server's: the one message of a call is read
//! whole within the body cap and the body budgets (`super::budget`), and the response is
//! its message then `grpc-status: 0` — a unary call's headers, message and trailers leave
//! in one write.

use std::sync::Arc;

use hyper::Request;
use hyper::body::Incoming;
use tonic::Status;

use super::admit::{self, Facts};
use super::{App, Body, observed};
use crate::rpc::a2a::Version;
use crate::rpc::a2a::bindings::grpc::{self as codec, Decoded, Unframed};
use crate::rpc::a2a::errors;
use crate::rpc::a2a::ops::{Op, OpResponse};
use crate::rpc::error::{METHOD_NOT_FOUND, RpcError};
use crate::rpc::{Binding, Dialect, Refusal, Reply};

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

/// Serves one gRPC call: its one length-prefixed message read whole, decoded, admitted and
/// run as the other bindings' calls are; the response message and `grpc-status: 0` in the
/// trailers, or the error's status alone (a trailers-only response).
pub(crate) async fn serve(app: Arc<App>, req: Request<Incoming>) -> hyper::Response<Body> {
    let mut headers = hyper::HeaderMap::new();
    match call(&app, req, &mut headers).await {
        Ok(body) => {
            let mut response = hyper::Response::new(body);
            *response.headers_mut() = headers;
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
            response
        }
        Err(status) => status.into_http::<Body>(),
    }
}

const GRPC_CONTENT_TYPE: hyper::header::HeaderValue =
    hyper::header::HeaderValue::from_static("application/grpc");

/// Serves a call; `headers`: the response's metadata beside its content type (the
/// activated extensions).
async fn call(
    app: &App,
    req: Request<Incoming>,
    headers: &mut hyper::HeaderMap,
) -> Result<Body, Status> {
    let Some(op) = req.uri().path().strip_prefix(SERVICE).and_then(Op::of_grpc) else {
        crate::telemetry::refused(METHOD_NOT_FOUND);
        return Err(Status::unimplemented(format!(
            "{} is not a method of lf.a2a.v1.A2AService",
            req.uri().path()
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
        return Err(refusal(&Refusal::UnsupportedMediaType));
    }
    // The key (metadata) is checked before a byte of the body is read: a caller without
    // one holds nothing (docs/RELIABILITY.md).
    let (parts, body) = req.into_parts();
    let caller = admit::caller(app, &parts.headers, &parts.extensions)
        .await
        .map_err(|r| refusal(&r))?;
    // Every method takes one message: the body is read whole, within the body cap (plus
    // the 5 bytes of gRPC framing), the body budgets and
    // `server.body_read_timeout_seconds`, so a slow or endless sender holds nothing longer
    // than a JSON-RPC one could. `_held`: its bytes count until the call is answered.
    let (bytes, _held) = super::read_limited(app, &parts, body, app.max_body.saturating_add(5))
        .await
        .map_err(|r| refusal(&r))?;
    let message = match codec::unframe(&bytes, app.max_body) {
        Ok(m) => m,
        Err(Unframed::TooLarge) => return Err(refusal(&Refusal::TooLarge(app.max_body))),
        Err(Unframed::Invalid(why)) => {
            return Err(refused(&errors::dress(
                Version::V10,
                RpcError::parse_error(why.to_string()),
            )));
        }
    };
    let mut decoded = Decoded::decode(op, message).map_err(|e| refused(&e))?;
    let tenant = decoded.take_tenant();
    let agent_id = if tenant.is_empty() {
        default_agent(app)
    } else {
        tenant
    };
    let admitted = admit::agent(
        caller,
        admit::Target::named(app, &agent_id),
        DIALECT,
        Binding::Grpc,
    )
    .map_err(|r| refusal(&r))?;
    let facts = Facts::grpc(app, &parts.headers);
    // Freed on the thread that made them (see `jsonrpc::endpoint`).
    drop(parts);
    if let Err(r) = admitted.version(&facts) {
        let e = errors::refusal(Version::V10, &r);
        admitted.count_refused(app, e.code);
        return Err(refused(&e));
    }
    decoded
        .check()
        .map_err(|e| refused(&errors::rpc_error(Version::V10, &e)))?;
    let cx = admitted.context(app, facts, true);
    admit::extensions_header(&cx, DIALECT, headers);
    if codec::streams(op) {
        return match run(app, &cx, op, decoded, codec::events).await {
            Ok(Ok(events)) => Ok(Body::grpc_stream(events)),
            Ok(Err(_)) => Err(Status::internal(
                "a single result answered a streaming call",
            )),
            Err(e) => Err(codec::status(&e)),
        };
    }
    let framed = match run(app, &cx, op, decoded, codec::direct(op)).await {
        Ok(Ok(framed)) => framed,
        Ok(Err(Reply::Json { body, .. })) => codec::unary_from_json(op, &body)?,
        Ok(Err(Reply::Stream { .. } | Reply::Events { .. })) => {
            return Err(Status::internal("a stream answered a unary call"));
        }
        Err(e) => return Err(codec::status(&e)),
    };
    Ok(Body::grpc_one(framed))
}

/// Runs an admitted call: its rate token, then the operation (`direct` writes the results
/// the codec writes itself), counted and traced as every binding's calls are.
async fn run<T>(
    app: &App,
    cx: &crate::rpc::CallContext,
    op: Op,
    decoded: Decoded,
    direct: impl FnOnce(OpResponse) -> Result<T, OpResponse>,
) -> Result<Result<T, Reply>, RpcError> {
    let work = async {
        match admit::token(app, cx) {
            Err(r) => Err(errors::refusal(Version::V10, &r)),
            // Boxed: the operations' futures are large (~12 KB); inline, every call's
            // future would be that large, copied each time it moves.
            Ok(()) => Box::pin(codec::execute(&app.runtime, cx, op, decoded, direct)).await,
        }
    };
    observed(app, DIALECT, Binding::Grpc, cx, Some(op.name()), work).await
}

/// The status of a refusal every binding shares (no key, no agent, too large, …).
fn refusal(r: &Refusal) -> Status {
    refused(&errors::refusal(Version::V10, r))
}

/// The status of an error that refused the call before any operation ran: the request's
/// span, when traced, is marked as an error with its code.
fn refused(e: &RpcError) -> Status {
    crate::telemetry::refused(e.code);
    codec::status(e)
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
