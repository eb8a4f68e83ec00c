//! a2ad's own read paths beside the dialects (docs/PROTOCOL.md §11): the agents a caller
//! may use (`GET /api/v1/agents`) and its recent webhook attempts on an agent
//! (`GET …/{agent}/rest/x-a2ad/deliveries`). Authenticated like every endpoint, scoped to
//! the caller, bounded; errors are the HTTP+JSON binding's `google.rpc.Status`. The
//! inspector (`/ui`) reads them with the user's own key, as any client may.

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use super::admit::{self, Admitted};
use super::rest::{error as rest_error, refusal, response as rest_response, wrong_method};
use super::{App, Body, preflight_official};
use crate::model::AgentId;
use crate::rpc::RpcError;
use crate::rpc::a2a::Version;
use crate::rpc::a2a::errors as a2a_errors;

/// The agents listing.
pub(crate) const AGENTS_PATH: &str = "/api/v1/agents";

/// The recent-deliveries path under an agent's HTTP+JSON binding.
pub(crate) const DELIVERIES_PATH: &str = "x-a2ad/deliveries";

/// Attempts one read returns by default, and at most.
const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 200;

/// `GET /api/v1/agents`: the agents this caller may use, with what a client needs to talk
/// to them (their URLs follow from the id; docs/PROTOCOL.md §11).
pub(crate) async fn agents(app: &App, req: Request<Incoming>) -> Response<Body> {
    match *req.method() {
        Method::OPTIONS => return preflight_official("GET, HEAD, OPTIONS"),
        Method::GET | Method::HEAD => {}
        _ => return wrong_method("GET, HEAD, OPTIONS"),
    }
    let caller = match admit::caller(app, req.headers(), req.extensions()).await {
        Ok(c) => c,
        Err(r) => return refusal(&r),
    };
    let runtime = &app.runtime;
    let agents: Vec<Value> = runtime
        .config()
        .agents
        .iter()
        .filter(|a| admit::may_use(&caller, &AgentId::new(a.id.as_str())))
        .map(|a| {
            let l = &a.limits;
            let upstream = runtime
                .agent(&AgentId::new(a.id.as_str()))
                .and_then(|e| e.backend.upstream())
                .map(|u| upstream_json(&u));
            json!({
                "id": a.id,
                "name": a.name.as_deref().unwrap_or(&a.id),
                "description": a.description(),
                "version": a.version,
                "backend": a.backend,
                "streaming": a.streaming(),
                "webhooks": a.webhooks,
                "publicCard": a.public_card,
                "upstream": upstream,
                "limits": {
                    "maxMessageLength": l.max_message_length,
                    "maxParts": l.max_parts,
                    "maxFileSize": l.max_file_size,
                    "supportedTypes": l.supported_types,
                    "requestsPerMinute": l.requests_per_minute,
                    "concurrentTasks": l.concurrent_tasks,
                },
            })
        })
        .collect();
    let body = json!({ "principal": caller.principal.as_str(), "agents": agents });
    rest_response(super::json(StatusCode::OK, body.to_string().into_bytes()))
}

/// An upstream agent's health for the inspector: its card URL, the card's last fetch, the
/// interface called, and the last error.
fn upstream_json(u: &crate::agent::UpstreamView) -> Value {
    let h = &u.health;
    json!({
        "cardUrl": h.card_url,
        "cardFetchedAt": h.card_fetched_at.as_ref().map(crate::model::iso8601),
        "interface": h.interface.as_ref().map(|(binding, protocol)| json!({
            "binding": binding,
            "protocol": protocol,
        })),
        "lastError": h.last_error.as_ref().map(|(at, message)| json!({
            "at": crate::model::iso8601(at),
            "message": message,
        })),
        "requests": u.metrics.requests.load(std::sync::atomic::Ordering::Relaxed),
        "errors": u.metrics.errors().iter().sum::<u64>(),
    })
}

/// `GET {agent}/rest/x-a2ad/deliveries?taskId=&pageSize=`: the caller's latest webhook
/// attempts on the agent, newest first (the caller is admitted to the agent).
pub(crate) fn deliveries(
    app: &App,
    admitted: &Admitted,
    method: &Method,
    query: Option<&str>,
) -> Response<Body> {
    if method != Method::GET && method != Method::HEAD {
        return wrong_method("GET, HEAD, OPTIONS");
    }
    // Each read takes a token, as every call on the agent does.
    if let Err(r) = admitted.token(app) {
        return rest_error(&a2a_errors::refusal(Version::V10, &r));
    }
    let caller = &admitted.caller;
    let (task, limit) = match page_query(query) {
        Ok(q) => q,
        Err(e) => return rest_error(&a2a_errors::dress(Version::V10, e)),
    };
    let records = app.runtime.recent_deliveries(
        &caller.principal,
        &admitted.agent_id,
        task.as_deref(),
        limit,
    );
    let millis = |d: std::time::Duration| (d.as_secs_f64() * 1000.0 * 10.0).round() / 10.0;
    let time =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let list: Vec<Value> = records
        .iter()
        .map(|r| {
            let mut v = json!({
                "deliveryId": r.delivery.to_string(),
                "taskId": r.task.as_str(),
                "configId": r.config,
                "url": &*r.url,
                "event": r.event,
                "attempt": r.attempt,
                "maxAttempts": r.max_attempts,
                "outcome": r.end.as_str(),
                "latencyMs": millis(r.latency),
                "at": time(r.at),
            });
            if let Some(s) = r.status {
                v["httpStatus"] = json!(s);
            }
            if let Some(e) = &r.error {
                v["error"] = json!(e);
            }
            if let Some(t) = r.next_attempt {
                v["nextAttemptAt"] = json!(time(t));
            }
            v
        })
        .collect();
    let body = json!({ "deliveries": list });
    rest_response(super::json(StatusCode::OK, body.to_string().into_bytes()))
}

/// `taskId` (at most 256 characters) and `pageSize` (1–200, default 50).
fn page_query(query: Option<&str>) -> Result<(Option<String>, usize), RpcError> {
    let mut task = None;
    let mut limit = DEFAULT_PAGE;
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "taskId" if task.is_none() => {
                if v.is_empty() || v.chars().count() > 256 {
                    return Err(RpcError::invalid_params(
                        "taskId",
                        "must be 1 to 256 characters",
                    ));
                }
                task = Some(v.into_owned());
            }
            "pageSize" => {
                limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| {
                        RpcError::invalid_params("pageSize", "must be an integer from 1 to 200")
                    })?;
            }
            _ => {}
        }
    }
    Ok((task, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_query_is_range_checked() {
        assert_eq!(page_query(None).ok(), Some((None, DEFAULT_PAGE)));
        assert_eq!(
            page_query(Some("taskId=t-1&pageSize=3&other=x")).ok(),
            Some((Some("t-1".to_string()), 3))
        );
        assert_eq!(page_query(Some("pageSize=200")).ok(), Some((None, 200)));
        for bad in [
            "pageSize=0",
            "pageSize=201",
            "pageSize=x",
            "pageSize=-1",
            "taskId=",
        ] {
            assert!(page_query(Some(bad)).is_err(), "{bad}");
        }
        let long = format!("taskId={}", "a".repeat(257));
        assert!(page_query(Some(&long)).is_err());
    }
}
