//! JSON-RPC error objects and the codes of JSON-RPC itself. Each dialect maps the
//! library's errors onto its own codes (`rpc/seed/errors.rs`, ...).

use std::borrow::Cow;

use hyper::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};

/// -32700: the body is not valid JSON.
pub(crate) const PARSE_ERROR: i64 = -32700;
/// -32600: not a valid request object.
pub(crate) const INVALID_REQUEST: i64 = -32600;
/// -32601: unknown method.
pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
/// -32602: missing, ill-typed or invalid params.
pub(crate) const INVALID_PARAMS: i64 = -32602;
/// -32603: a fault inside the server.
pub(crate) const INTERNAL_ERROR: i64 = -32603;
/// A JSON-RPC error object, plus how it travels when it is the whole response.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RpcError {
    /// The code.
    pub code: i64,
    /// A short message.
    pub message: Cow<'static, str>,
    /// Details (`taskId`, `field`, `reason`, `suggestion`, `retryAfter`, `limit`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// HTTP status when this error is the whole response (batches are always 200).
    #[serde(skip)]
    pub status: StatusCode,
    /// `Retry-After` seconds, for 429.
    #[serde(skip)]
    pub retry_after: Option<u64>,
}

impl RpcError {
    /// An error with code and message, HTTP 200, no data.
    pub(crate) fn new(code: i64, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
            status: StatusCode::OK,
            retry_after: None,
        }
    }

    /// Adds `data`.
    pub(crate) fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// Sets the HTTP status.
    pub(crate) fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// -32700 with a detail.
    pub(crate) fn parse_error(detail: String) -> Self {
        Self::new(PARSE_ERROR, "Parse error").with_data(json!({ "reason": detail }))
    }

    /// -32600 with a reason.
    pub(crate) fn invalid_request(reason: &str) -> Self {
        Self::new(INVALID_REQUEST, "Invalid Request").with_data(json!({ "reason": reason }))
    }

    /// -32601 naming the method.
    pub(crate) fn method_not_found(method: &str) -> Self {
        Self::new(METHOD_NOT_FOUND, "Method not found").with_data(json!({ "method": method }))
    }

    /// -32602 with `data: {field, reason}`.
    pub(crate) fn invalid_params(field: &str, reason: &str) -> Self {
        Self::new(INVALID_PARAMS, "Invalid params")
            .with_data(json!({ "field": field, "reason": reason }))
    }

    /// -32603 without internals.
    pub(crate) fn internal() -> Self {
        Self::new(INTERNAL_ERROR, "Internal error")
    }

    /// A rate-limit error (the code is the dialect's) with `Retry-After`.
    pub(crate) fn rate_limited(code: i64, retry_after: u64) -> Self {
        let mut e = Self::new(code, "Rate limit exceeded")
            .with_data(json!({
                "retryAfter": retry_after,
                "suggestion": "retry after the given number of seconds, with exponential backoff",
            }))
            .with_status(StatusCode::TOO_MANY_REQUESTS);
        e.retry_after = Some(retry_after);
        e
    }
}
