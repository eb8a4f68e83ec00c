//! The public agent card over HTTP (docs/PROTOCOL.md §10.2): `GET` (or `HEAD`) of
//! `/.well-known/agent-card.json` (the default agent) and of
//! `/api/v1/a2a/{agent}/.well-known/agent-card.json`, no key. The shape follows the
//! requested `A2A-Version` (else `server.card_default_version`); responses are cacheable
//! and revalidated by a weak `ETag`.

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use sha2::{Digest, Sha256};

use super::{
    App, Body, base_url, error_response, grpc_url, method_not_allowed, preflight_official,
};
use crate::model::AgentId;
use crate::rpc::a2a::{Version, card};
use crate::rpc::{Dialect, Refusal};

/// The well-known path at the root.
pub(crate) const WELL_KNOWN: &str = "/.well-known/agent-card.json";
/// The same with a trailing `/`.
pub(crate) const WELL_KNOWN_SLASH: &str = "/.well-known/agent-card.json/";

/// Serves a card request; `agent` `None` is the default agent.
pub(crate) fn response(
    app: &App,
    agent: Option<AgentId>,
    req: &Request<Incoming>,
) -> Response<Body> {
    match *req.method() {
        Method::GET | Method::HEAD => {}
        Method::OPTIONS => return preflight_official("GET, HEAD, OPTIONS"),
        _ => return method_not_allowed("GET, HEAD, OPTIONS"),
    }
    let config = app.runtime.config();
    let agent = agent.unwrap_or_else(|| {
        AgentId::new(
            config
                .server
                .default_agent
                .clone()
                .or_else(|| config.agents.first().map(|a| a.id.clone()))
                .unwrap_or_default(),
        )
    });
    let found = app.runtime.card(&agent).filter(|c| c.config.public_card);
    let Some(found) = found else {
        let v = Dialect::A2a(Version::V10);
        return error_response(&v.refusal(&Refusal::AgentNotFound(agent)));
    };
    let version = match super::requested_version(req).as_deref().map(str::trim) {
        Some(v) if !v.is_empty() => Version::of_header(Some(v)),
        _ => None,
    }
    .unwrap_or_else(|| default_version(&config.server.card_default_version));
    let (base, grpc) = (base_url(app, req.headers()), grpc_url(app, req.headers()));
    let body = serde_json::to_vec(&card::card(
        version,
        &found,
        &base,
        &grpc,
        &config,
        app.card_signer.as_deref(),
    ))
    .unwrap_or_default();
    let etag = format!("W/\"{}\"", hex_prefix(&Sha256::digest(&body)));
    let fresh = req
        .headers()
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|tag| tag == "*" || tag.trim_start_matches("W/") == etag.trim_start_matches("W/"));
    let mut r = if fresh {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        super::cors(r.headers_mut());
        r
    } else {
        super::json(StatusCode::OK, body)
    };
    let h = r.headers_mut();
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    h.insert(header::VARY, HeaderValue::from_static("A2A-Version"));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    let modified = app.started.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
    if let Ok(v) = HeaderValue::from_str(&modified) {
        h.insert(header::LAST_MODIFIED, v);
    }
    r
}

fn default_version(configured: &str) -> Version {
    match configured {
        "0.3" => Version::V03,
        _ => Version::V10,
    }
}

fn hex_prefix(digest: &[u8]) -> String {
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}
