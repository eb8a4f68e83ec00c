//! The JSON-RPC binding of every dialect on the edge (docs/PROTOCOL.md §10.1): the seed on
//! `POST /api/v1/a2a/{agent}`, A2A 0.3 and 1.0 on `…/jsonrpc/v0.3` and `…/jsonrpc/v1`.
//!
//! Order: OPTIONS (no key) → admission (`admit`: credentials 401, agent 404, key may use
//! agent 403) → HTTP method (405) → content type (415) → body cap (413; the body budgets
//! of `budget`; 64 KiB, else 429 unread, for a caller whose rate bucket is empty) → the A2A
//! version (official paths, -32009) → JSON-RPC (each call's rate, 429 with its id).

use futures_util::future::join_all;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use super::admit::{self, Facts};
use super::respond::{self, preflight};
use super::{
    App, Body, ENDPOINT_PREFIX, base_url, error_response, json, observed, preflight_official,
    read_limited, reply_response,
};
use crate::rpc::a2a::Version;
use crate::rpc::error::{INVALID_REQUEST, METHOD_NOT_FOUND};
use crate::rpc::{self, Binding, CallContext, Dialect, Refusal, Reply, RpcError};

/// How much of a body is read from a caller whose rate bucket is empty: enough to name the
/// requests of any ordinary call or batch, so that each gets its 429 with its id.
const RATE_LIMITED_READ: u64 = 64 * 1024;

/// Serves one request on an agent's JSON-RPC endpoint in a dialect.
pub(super) async fn endpoint(
    app: &App,
    target: admit::Target,
    dialect: Dialect,
    req: Request<Incoming>,
) -> Response<Body> {
    if req.method() == Method::OPTIONS {
        return match dialect {
            Dialect::Seed => preflight(),
            Dialect::A2a(_) => preflight_official("POST, OPTIONS"),
        };
    }
    let admitted = match admit::admit(app, &req, target, dialect, Binding::JsonRpc).await {
        Ok(a) => a,
        Err(r) => return refusal(dialect, &r),
    };
    let refuse = |r: &Refusal| {
        let e = dialect.refusal(r);
        admitted.count_refused(app, e.code);
        e
    };
    if req.method() != Method::POST {
        let mut r = error_response(&refuse(&Refusal::MethodNotAllowed));
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST, OPTIONS"));
        return r;
    }
    if !is_json(req.headers().get(header::CONTENT_TYPE), dialect) {
        return error_response(&refuse(&Refusal::UnsupportedMediaType));
    }
    let accepts_sse = req
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|s| s.contains("text/event-stream")));
    // A caller over its rate gets its body read only as far as naming the requests takes
    // (`RATE_LIMITED_READ`), so that each is answered 429 with its id; a larger body is
    // refused 429 unread, `id: null`.
    let over_rate = admitted.over_rate(app);
    let limit = match over_rate {
        Some(_) => RATE_LIMITED_READ.min(app.max_body),
        None => app.max_body,
    };
    let facts = Facts::http(app, &req);
    // `_held`: the body's bytes count against the budgets until the call is answered.
    let (parts, body) = req.into_parts();
    let (body, _held) = match read_limited(app, &parts, body, limit).await {
        Ok(b) => b,
        Err(refusal) => {
            let refusal = match (refusal, over_rate) {
                (Refusal::TooLarge(_), Some(retry_after)) => Refusal::RateLimited(retry_after),
                (refusal, _) => refusal,
            };
            return error_response(&refuse(&refusal));
        }
    };
    // The headers are read: freed here, on the thread that made them, rather than after
    // the answer (a durable store answers from whichever worker its commit wakes). So is
    // the body once decoded (the calls own their params; `_held` still counts it).
    drop(parts);
    if let Err(r) = admitted.version(&facts) {
        return error_response(&refuse(&r));
    }
    let max_batch = app.runtime.config().server.max_batch_size;
    let decoded = match rpc::decode_as(&body, max_batch, dialect.answers_null_ids()) {
        Ok(d) => d,
        Err(e) => {
            admitted.count_refused(app, e.code);
            return error_response(&dialect.dress(e));
        }
    };
    drop(body);
    let mut cx = admitted.context(app, facts, accepts_sse);
    cx.in_batch = matches!(decoded, rpc::Body::Batch(_));
    let cx = cx;
    let mut response =
        match decoded {
            rpc::Body::Single(call) => {
                let streams = dialect == Dialect::A2a(Version::V03)
                    && call.as_ref().is_ok_and(|c| {
                        matches!(c.method.as_str(), "message/stream" | "tasks/resubscribe")
                    });
                let reply = one(app, dialect, &cx, call).await;
                let reply = if streams {
                    error_as_event(reply)
                } else {
                    reply
                };
                reply_response(app, reply).await
            }
            rpc::Body::Batch(calls) => {
                // The items run concurrently, but each answer is weighed as soon as it is
                // rendered (one poll at a time): what the batch holds stays within the budget
                // plus one item's answer.
                let budget = Budget::new(app.runtime.config().server.max_batch_response_bytes);
                let replies =
                    join_all(calls.into_iter().map(|c| {
                        let id = match &c {
                            Ok(call) => Some(call.id.clone()),
                            Err(r) => r.id.clone(),
                        };
                        let (budget, cx) = (&budget, &cx);
                        async move {
                            budget.weigh(one(app, dialect, cx, c).await, id.as_deref(), dialect)
                        }
                    }))
                    .await;
                let mut out = Vec::with_capacity(replies.len() * 128 + 2);
                out.push(b'[');
                for (i, reply) in replies.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    match reply {
                        Reply::Json { body, .. } => out.extend_from_slice(&body),
                        // Refused by dispatch inside a batch; kept total for safety.
                        Reply::Stream { id, .. } => out.extend_from_slice(&rpc::failure(
                            Some(&id),
                            &dialect.dress(RpcError::invalid_request(
                                "streaming methods cannot be used inside a batch",
                            )),
                        )),
                        Reply::Events { .. } => out.extend_from_slice(&rpc::failure(
                            None,
                            &dialect.dress(RpcError::invalid_request(
                                "streaming methods cannot be used inside a batch",
                            )),
                        )),
                    }
                }
                out.push(b']');
                json(StatusCode::OK, out)
            }
        };
    admit::extensions_header(&cx, dialect, response.headers_mut());
    response
}

/// A 0.3 stream's JSON-RPC error before its first event, as J03 §7.9 has it (and a2a-sdk's
/// 0.3 server sends it; its 0.3 client reads no other form): HTTP 200, `text/event-stream`,
/// one `data:` frame holding the error response, then the end. An error with an HTTP status
/// of its own (429) stays an HTTP answer.
fn error_as_event(reply: Reply) -> Reply {
    match reply {
        Reply::Json {
            body,
            code: Some(_),
            status: StatusCode::OK,
            ..
        } => {
            let mut frame = Vec::with_capacity(body.len() + 8);
            frame.extend_from_slice(b"data: ");
            frame.extend_from_slice(&body);
            frame.extend_from_slice(b"\n\n");
            Reply::Events { body: frame.into() }
        }
        other => other,
    }
}

/// A refusal by admission, in the dialect's framing (401 with its challenge).
fn refusal(dialect: Dialect, r: &Refusal) -> Response<Body> {
    let mut response = error_response(&dialect.refusal(r));
    if matches!(r, Refusal::Unauthorized(_)) {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(respond::WWW_AUTHENTICATE),
        );
    }
    response
}

/// 404 for a path under an agent that no dialect serves, in the official format, naming
/// the JSON-RPC URLs that serve the agent.
pub(super) fn not_served(app: &App, agent: &str, req: &Request<Incoming>) -> Response<Body> {
    let base = base_url(app, req.headers());
    let url = format!("{base}{ENDPOINT_PREFIX}{agent}/{}", Version::V10.path());
    let e = RpcError::new(METHOD_NOT_FOUND, "Not found")
        .with_data(serde_json::json!({
            "url": url,
            "reason": format!(
                "only JSON-RPC is served: POST to {url} (A2A 1.0), \
                 {base}{ENDPOINT_PREFIX}{agent}/{} (A2A 0.3) or {base}{ENDPOINT_PREFIX}{agent} (seed)",
                Version::V03.path()
            ),
        }))
        .with_status(StatusCode::NOT_FOUND);
    error_response(&Dialect::A2a(Version::V10).dress(e))
}

/// Whether a `Content-Type` is JSON: `application/json`, and on the official paths also
/// `application/a2a+json` (S10 §4.3.3).
pub(super) fn is_json(value: Option<&HeaderValue>, dialect: Dialect) -> bool {
    let Some(value) = value else {
        return false;
    };
    if value.as_bytes() == b"application/json" {
        // What nearly every client sends, exactly.
        return true;
    }
    let Ok(v) = value.to_str() else {
        return false;
    };
    let essence = v.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || (matches!(dialect, Dialect::A2a(_))
            && essence.eq_ignore_ascii_case("application/a2a+json"))
}

/// The bytes a batch's answer may still take (`server.max_batch_response_bytes`).
struct Budget {
    limit: usize,
    used: std::sync::atomic::AtomicUsize,
}

impl Budget {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            used: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Lets an item's answer through while the batch stays within its budget; past it, the
    /// item is answered -32600 with `data.limit` (its answer is dropped at once), telling
    /// the client to ask for it on its own.
    fn weigh(
        &self,
        reply: Reply,
        id: Option<&serde_json::value::RawValue>,
        dialect: Dialect,
    ) -> Reply {
        use std::sync::atomic::Ordering::Relaxed;
        let Reply::Json { body, .. } = &reply else {
            return reply;
        };
        let size = body.len();
        let fits = self
            .used
            .fetch_update(Relaxed, Relaxed, |used| {
                used.checked_add(size).filter(|total| *total <= self.limit)
            })
            .is_ok();
        if fits {
            return reply;
        }
        drop(reply);
        Reply::error(
            id,
            &dialect.dress(RpcError::new(INVALID_REQUEST, "Invalid Request").with_data(
                serde_json::json!({
                    "reason": "the batch's answer would be too large; send this request on its own",
                    "limit": self.limit,
                }),
            )),
        )
    }
}

/// Counts, rate-limits and dispatches one call.
async fn one(
    app: &App,
    dialect: Dialect,
    cx: &CallContext,
    call: Result<rpc::Call, rpc::Rejected>,
) -> Reply {
    let method = call.as_ref().ok().map(|c| c.method.as_str());
    let work = async {
        match &call {
            Err(r) => Reply::error(r.id.as_deref(), &dialect.dress(r.error.clone())),
            Ok(call) => match admit::token(app, cx) {
                Err(r) => Reply::error(Some(&call.id), &dialect.refusal(&r)),
                // Boxed: the operations' futures are large (~3 KB); inline they would make
                // every request's future that large, copied each time it moves. Made in
                // the box, not copied into it (crate::boxed).
                Ok(()) => {
                    crate::boxed::made_in_place(|| dialect.dispatch(&app.runtime, cx, call)).await
                }
            },
        }
    };
    observed(app, dialect, Binding::JsonRpc, cx, method, work).await
}
