//! The HTTP+JSON binding of A2A 1.0 on the edge (docs/PROTOCOL.md §10.11): the JSON-RPC
//! paths' checks in the same order — admission (`admit`: credentials 401, agent 404, key
//! may use agent 403), then the path and HTTP method (404, 405; the routes of the operation
//! table), content type (415), rate (429, before the body is read), body cap (413) and
//! version — and the same operations (the codec, `rpc::a2a::bindings::rest`), answered bare
//! or as a `google.rpc.Status`.

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response};

use super::admit::{self, Facts};
use super::jsonrpc::is_json;
use super::{App, Body, budget, ext, json_reply, observed, preflight_official, read_limited};
use super::{reply_response, respond};
use crate::rpc::a2a::Version;
use crate::rpc::a2a::bindings::rest::{self, RestRoute};
use crate::rpc::a2a::errors;
use crate::rpc::error::{INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND};
use crate::rpc::{Binding, Dialect, Refusal, RpcError};

const DIALECT: Dialect = Dialect::A2a(Version::V10);

/// Serves one request under an agent's `rest` path (`sub`: the path after it).
pub(super) async fn endpoint(
    app: &App,
    target: admit::Target,
    sub: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    if req.method() == Method::OPTIONS {
        return preflight_official("GET, POST, DELETE, OPTIONS");
    }
    let admitted = match admit::admit(app, &req, target, DIALECT, Binding::Rest).await {
        Ok(a) => a,
        Err(r) => return refusal(&r),
    };
    if sub == ext::DELIVERIES_PATH {
        // a2ad's own read (docs/PROTOCOL.md §11.2).
        let (method, query) = (req.method(), req.uri().query());
        return ext::deliveries(app, &admitted, method, query);
    }
    let call = match rest::route(req.method(), sub, admitted.agent_id.as_str()) {
        RestRoute::Call(call) => call,
        RestRoute::WrongMethod(allow) => {
            admitted.count_refused(app, INVALID_REQUEST);
            return wrong_method(allow);
        }
        RestRoute::WrongTenant(tenant) => {
            admitted.count_refused(app, INVALID_PARAMS);
            crate::telemetry::refused(INVALID_PARAMS);
            return response(json_reply(rest::wrong_tenant(&tenant)));
        }
        RestRoute::NotFound => {
            admitted.count_refused(app, METHOD_NOT_FOUND);
            crate::telemetry::refused(METHOD_NOT_FOUND);
            return response(json_reply(rest::not_found(req.uri().path())));
        }
    };
    let refuse = |r: &Refusal| {
        let e = errors::refusal(Version::V10, r);
        admitted.count_refused(app, e.code);
        error(&e)
    };
    // Only POST carries a body; one that declares a type must declare JSON.
    let posts = req.method() == Method::POST;
    // Only whether it is there is kept: a copy of the value would be a slice of the
    // connection's read buffer, kept for as long as the call runs (`http::unpinned`).
    let content_type = req.headers().get(header::CONTENT_TYPE);
    let typed = content_type.is_some();
    if posts && typed && !is_json(content_type, DIALECT) {
        return refuse(&Refusal::UnsupportedMediaType);
    }
    // Over its rate, the caller is refused before its body is read.
    if let Some(retry_after) = admitted.over_rate(app) {
        return refuse(&Refusal::RateLimited(retry_after));
    }
    let facts = Facts::http(app, &req);
    let query = req.uri().query().map(str::to_owned);
    let (body, _held) = if posts {
        let (parts, body) = req.into_parts();
        match read_limited(app, &parts, body, app.max_body).await {
            Ok(b) => b,
            Err(r) => return refuse(&r),
        }
    } else {
        (Bytes::new(), budget::Held::default())
    };
    if !typed && !body.is_empty() {
        return refuse(&Refusal::UnsupportedMediaType);
    }
    if let Err(r) = admitted.version(&facts) {
        return refuse(&r);
    }
    let cx = admitted.context(app, facts, true);
    let work = async {
        match admit::token(app, &cx) {
            Err(r) => rest::status_reply(&errors::refusal(Version::V10, &r)),
            Ok(()) => {
                Box::pin(rest::dispatch(
                    &app.runtime,
                    &cx,
                    &call,
                    query.as_deref(),
                    &body,
                ))
                .await
            }
        }
    };
    let reply = observed(app, DIALECT, Binding::Rest, &cx, Some(call.method()), work).await;
    let mut out = response(reply_response(app, reply).await);
    admit::extensions_header(&cx, DIALECT, out.headers_mut());
    out
}

/// A response of the HTTP+JSON binding: JSON as `application/a2a+json` (S10 §11.1).
pub(super) fn response(mut r: Response<Body>) -> Response<Body> {
    if r.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v == "application/json")
    {
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/a2a+json"),
        );
    }
    r
}

/// An error of the HTTP+JSON binding: its `google.rpc.Status` response.
pub(super) fn error(e: &RpcError) -> Response<Body> {
    crate::telemetry::refused(e.code);
    response(json_reply(rest::status_reply(e)))
}

/// A refusal by admission as the binding's error (401 with its challenge).
pub(super) fn refusal(r: &Refusal) -> Response<Body> {
    let mut response = error(&errors::refusal(Version::V10, r));
    if matches!(r, Refusal::Unauthorized(_)) {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(respond::WWW_AUTHENTICATE),
        );
    }
    response
}

/// The binding's 405, naming what is allowed.
pub(super) fn wrong_method(allow: &'static str) -> Response<Body> {
    let e = RpcError::invalid_request(&format!("HTTP method not allowed here; use {allow}"))
        .with_status(hyper::StatusCode::METHOD_NOT_ALLOWED);
    let mut r = error(&errors::dress(Version::V10, e));
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}
