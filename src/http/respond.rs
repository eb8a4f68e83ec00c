//! Response helpers: every response carries CORS, every JSON response its content type.

use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

use super::Body;
use crate::rpc::error::METHOD_NOT_FOUND;
use crate::rpc::{self, RpcError};

/// A JSON response with CORS.
pub(crate) fn json(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Body::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    cors(r.headers_mut());
    r
}

/// A refusal's response (the error alone, no id); the request's span, when traced, is
/// marked as an error with its code.
pub(crate) fn error_response(e: &RpcError) -> Response<Body> {
    crate::telemetry::refused(e.code);
    let mut r = json(e.status, rpc::failure(None, e));
    if let Some(secs) = e.retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    r
}

/// The challenge of a 401: either credential.
pub(super) const WWW_AUTHENTICATE: &str =
    r#"Bearer realm="a2ad", ApiKey realm="a2ad" header="x-api-key""#;

pub(crate) fn method_not_allowed(allow: &'static str) -> Response<Body> {
    let mut r = error_response(
        &RpcError::invalid_request("HTTP method not allowed; use POST")
            .with_status(StatusCode::METHOD_NOT_ALLOWED),
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

pub(super) fn not_found_path() -> Response<Body> {
    error_response(
        &RpcError::new(METHOD_NOT_FOUND, "Not found")
            .with_data(serde_json::json!({ "reason": "no such endpoint; POST JSON-RPC to /api/v1/a2a/{agent_id}" }))
            .with_status(StatusCode::NOT_FOUND),
    )
}

pub(super) fn preflight() -> Response<Body> {
    preflight_with(
        "POST, OPTIONS",
        "Content-Type, x-api-key, Authorization, Accept, Last-Event-ID, A2A-Extensions, \
         X-A2A-Extensions",
    )
}

/// The preflight of the official paths: the seed's headers plus the A2A ones.
pub(crate) fn preflight_official(methods: &'static str) -> Response<Body> {
    preflight_with(
        methods,
        "Content-Type, x-api-key, Authorization, Accept, Last-Event-ID, A2A-Version, \
         A2A-Extensions, X-A2A-Extensions, If-None-Match",
    )
}

fn preflight_with(methods: &'static str, headers: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::NO_CONTENT;
    let h = r.headers_mut();
    cors(h);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(methods),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(headers),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    r
}

pub(crate) fn cors(h: &mut hyper::HeaderMap) {
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("Retry-After, WWW-Authenticate, A2A-Extensions, X-A2A-Extensions"),
    );
}
