//! One admission for every binding: from a request's head (path, headers or gRPC metadata)
//! to an admitted call, or a [`Refusal`] each binding renders in its own framing.
//!
//! The rules, in their documented order (DIALECTS §9): the credential (401), the agent
//! (404), whether the key may use it (403) — all before a byte of the body is read — then,
//! after the binding's own framing checks (405, 413, 415), the `A2A-Version` the request
//! names (-32009) and one rate token per call (429). JSON-RPC (every dialect), HTTP+JSON,
//! gRPC and a2ad's own read paths all come through here, and every [`CallContext`] is made
//! here: a rule added here holds on every binding.

use std::sync::Arc;

use hyper::header::{self, HeaderValue};
use hyper::{HeaderMap, Request};

use super::{App, ENDPOINT_PREFIX};
use crate::actors::AgentEntry;
use crate::auth::{Caller, PeerCertificate};
use crate::model::{AgentId, Extensions};
use crate::rpc::{Binding, CallContext, Dialect, Origin, Refusal};

/// 401 unless the request carries a usable credential: an API key (`x-api-key` or
/// `Authorization: Bearer`; gRPC: the same metadata), an OIDC token or a client
/// certificate.
pub(crate) async fn caller(
    app: &App,
    headers: &HeaderMap,
    extensions: &hyper::http::Extensions,
) -> Result<Arc<Caller>, Refusal> {
    app.access
        .now()
        .keys
        .authenticate(headers, PeerCertificate::of(extensions))
        .await
        .map_err(|e| Refusal::Unauthorized(e.message()))
}

/// The agent a request's path (or gRPC `tenant`) names, looked up as the request arrives:
/// the configured agent's id is shared, not made again from the path on every request.
pub(crate) struct Target {
    id: AgentId,
    entry: Option<Arc<AgentEntry>>,
}

impl Target {
    /// The agent named `name`, or a name no agent has (refused 404 once the caller is
    /// known: the credential is checked first).
    pub(crate) fn named(app: &App, name: &str) -> Self {
        match app.runtime.agent_named(name) {
            Some((id, entry)) => Self {
                id,
                entry: Some(entry),
            },
            None => Self {
                id: AgentId::new(name),
                entry: None,
            },
        }
    }
}

/// 404 for an agent this server does not have, 403 for one the caller may not use.
pub(crate) fn agent(
    caller: Arc<Caller>,
    target: Target,
    dialect: Dialect,
    binding: Binding,
) -> Result<Admitted, Refusal> {
    let Target { id, entry } = target;
    let Some(agent) = entry else {
        return Err(Refusal::AgentNotFound(id));
    };
    if !may_use(&caller, &id) {
        return Err(Refusal::Forbidden(id));
    }
    Ok(Admitted {
        caller,
        agent,
        agent_id: id,
        dialect,
        binding,
    })
}

/// Whether the caller's key may use an agent (what the agents listing shows).
pub(crate) fn may_use(caller: &Caller, agent: &AgentId) -> bool {
    caller.may_use(agent)
}

/// [`caller`] then [`agent`]: what every binding whose path names the agent checks first.
pub(crate) async fn admit<B>(
    app: &App,
    req: &Request<B>,
    target: Target,
    dialect: Dialect,
    binding: Binding,
) -> Result<Admitted, Refusal> {
    // The credential awaited here, not through [`caller`]: one future fewer to move on
    // every request.
    let caller = app
        .access
        .now()
        .keys
        .authenticate(req.headers(), PeerCertificate::of(req.extensions()))
        .await
        .map_err(|e| Refusal::Unauthorized(e.message()))?;
    agent(caller, target, dialect, binding)
}

/// A caller admitted to an agent, on a dialect and binding.
pub(crate) struct Admitted {
    pub(crate) caller: Arc<Caller>,
    pub(crate) agent: Arc<AgentEntry>,
    pub(crate) agent_id: AgentId,
    pub(crate) dialect: Dialect,
    pub(crate) binding: Binding,
}

impl Admitted {
    /// Counts a request refused after admission (its agent is known) with its error code,
    /// for the agent's and the endpoint's request metrics.
    pub(crate) fn count_refused(&self, app: &App, code: i64) {
        self.agent.metrics.requests(1);
        app.requests.record(
            app.requests.slot(self.dialect, self.binding, None),
            Some(code),
            std::time::Duration::ZERO,
        );
    }

    /// Seconds until the caller's next rate token, when its bucket is empty now (a look,
    /// taking nothing: each call takes its own token, [`token`]).
    pub(crate) fn over_rate(&self, app: &App) -> Option<u64> {
        app.access
            .now()
            .rate
            .check(&self.caller, self.agent.index)
            .err()
    }

    /// The rate token of a request that is not a call of an operation (a2ad's own reads).
    pub(crate) fn token(&self, app: &App) -> Result<(), Refusal> {
        take(app, &self.caller, &self.agent)
    }

    /// -32009 when the request names an A2A version this URL does not serve (the official
    /// dialects; on their paths an absent or empty value means 0.3).
    pub(crate) fn version(&self, facts: &Facts) -> Result<(), Refusal> {
        let Dialect::A2a(served) = self.dialect else {
            return Ok(());
        };
        let requested = facts.version.as_deref();
        if crate::rpc::a2a::Version::of_header(requested) == Some(served) {
            return Ok(());
        }
        Err(Refusal::VersionNotSupported {
            served,
            requested: facts.version.clone(),
            agent_url: format!(
                "{}{ENDPOINT_PREFIX}{}",
                facts.origin.base_url(),
                self.agent_id
            ),
        })
    }

    /// The context every operation runs in.
    pub(crate) fn context(self, app: &App, facts: Facts, accepts_sse: bool) -> CallContext {
        let extensions = activated(&self.agent.config, facts.extensions.as_deref());
        CallContext {
            caller: self.caller,
            agent: self.agent,
            agent_id: self.agent_id,
            accepts_sse,
            last_event_id: facts.last_event_id,
            in_batch: false,
            origin: facts.origin,
            card_signer: app.card_signer.clone(),
            extensions,
        }
    }
}

/// The extensions a request activates (docs/PROTOCOL.md §12): the URIs of its
/// `A2A-Extensions` / `X-A2A-Extensions` headers (gRPC: `a2a-extensions` metadata),
/// comma-separated, that the agent declares — in the agent's order; unknown ones ignored.
fn activated(agent: &crate::config::AgentConfig, requested: Option<&str>) -> Extensions {
    match requested {
        Some(list) if !agent.extensions.is_empty() => Extensions::new(
            agent.activated(list.split(',').map(str::trim).filter(|u| !u.is_empty())),
        ),
        _ => Extensions::default(),
    }
}

/// The header that names a response's activated extensions: `X-A2A-Extensions` on A2A
/// 0.3, `A2A-Extensions` elsewhere (gRPC: `a2a-extensions` metadata).
pub(crate) fn extensions_header(cx: &CallContext, dialect: Dialect, headers: &mut HeaderMap) {
    if cx.extensions.is_empty() {
        return;
    }
    let name = match dialect {
        Dialect::A2a(crate::rpc::a2a::Version::V03) => "x-a2a-extensions",
        _ => "a2a-extensions",
    };
    if let Ok(v) = HeaderValue::from_str(&cx.extensions.as_slice().join(", ")) {
        headers.insert(name, v);
    }
}

/// One call's rate token (each call of a batch takes its own): 429 when the caller's
/// bucket for the agent is empty.
pub(crate) fn token(app: &App, cx: &CallContext) -> Result<(), Refusal> {
    take(app, &cx.caller, &cx.agent)
}

fn take(app: &App, caller: &Caller, agent: &AgentEntry) -> Result<(), Refusal> {
    app.access
        .now()
        .rate
        .try_acquire(caller, agent.index)
        .map_err(Refusal::RateLimited)
}

/// What a call takes from its request's head: `Last-Event-ID`, the public base URL, the
/// `Host` (for the gRPC interface's address, made only for a card) and the `A2A-Version`.
pub(crate) struct Facts {
    last_event_id: Option<String>,
    origin: Origin,
    version: Option<String>,
    /// The extension URIs asked for, comma-separated (every header that names them).
    extensions: Option<String>,
}

impl Facts {
    /// An HTTP request's: `Last-Event-ID`, and `A2A-Version` from the header or else the
    /// query parameter.
    pub(crate) fn http<B>(app: &App, req: &Request<B>) -> Self {
        let headers = req.headers();
        let named = Named::read(
            headers,
            &LAST_EVENT_ID,
            &A2A_VERSION,
            &[A2A_EXTENSIONS, X_A2A_EXTENSIONS],
        );
        Self {
            last_event_id: named.last_event_id,
            origin: Origin {
                public_url: app.runtime.config().server.public_url.clone(),
                https: app.https,
                // A copy: a clone would be a slice of the connection's read buffer, and
                // keep it (8 KiB) alive for as long as the call runs (`http::unpinned`).
                host: headers
                    .get(header::HOST)
                    .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok()),
                local_addr: app.local_addr,
            },
            version: named.version.or_else(|| super::version_in_query(req.uri())),
            extensions: named.extensions,
        }
    }

    /// A gRPC call's metadata: `a2a-last-event-id` and `a2a-version`.
    pub(crate) fn grpc(app: &App, headers: &HeaderMap) -> Self {
        let named = Named::read(headers, &A2A_LAST_EVENT_ID, &A2A_VERSION, &[A2A_EXTENSIONS]);
        Self {
            last_event_id: named.last_event_id,
            origin: Origin {
                public_url: app.runtime.config().server.public_url.clone(),
                https: app.https,
                host: headers.get(header::HOST).cloned(),
                local_addr: app.local_addr,
            },
            version: named.version,
            extensions: named.extensions,
        }
    }
}

/// `A2A-Extensions` (and gRPC's `a2a-extensions` metadata).
// Names as constants: a lookup by `&str` parses and lower-cases the name each time.
const LAST_EVENT_ID: header::HeaderName = header::HeaderName::from_static("last-event-id");
const A2A_LAST_EVENT_ID: header::HeaderName = header::HeaderName::from_static("a2a-last-event-id");
pub(crate) const A2A_VERSION: header::HeaderName = header::HeaderName::from_static("a2a-version");
const A2A_EXTENSIONS: header::HeaderName = header::HeaderName::from_static("a2a-extensions");
/// `X-A2A-Extensions` (A2A 0.3).
const X_A2A_EXTENSIONS: header::HeaderName = header::HeaderName::from_static("x-a2a-extensions");

/// The headers a call takes besides its credentials, read in one pass over the map: a
/// lookup by a name outside HTTP's standard table hashes the name, and four of them cost
/// more than a pass over the handful of headers a request carries.
#[derive(Default)]
struct Named {
    /// The first value of the last-event-id header.
    last_event_id: Option<String>,
    /// The first value of the version header.
    version: Option<String>,
    /// Every value of the extension headers, joined by commas (`None`: none sent).
    extensions: Option<String>,
}

impl Named {
    fn read(
        headers: &HeaderMap,
        last_event_id: &header::HeaderName,
        version: &header::HeaderName,
        extensions: &[header::HeaderName],
    ) -> Self {
        let mut named = Self::default();
        let text = |v: &HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
        for (name, value) in headers {
            if name == last_event_id {
                named.last_event_id.get_or_insert_with(|| text(value));
            } else if name == version {
                named.version.get_or_insert_with(|| text(value));
            } else if extensions.contains(name) {
                let v = String::from_utf8_lossy(value.as_bytes());
                match &mut named.extensions {
                    Some(o) => {
                        o.push(',');
                        o.push_str(&v);
                    }
                    None => named.extensions = Some(v.into_owned()),
                }
            }
        }
        named
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_reads_what_lookups_by_name_would() {
        let mut headers = HeaderMap::new();
        headers.append(header::HOST, HeaderValue::from_static("h"));
        headers.append(&X_A2A_EXTENSIONS, HeaderValue::from_static("urn:x"));
        headers.append(&LAST_EVENT_ID, HeaderValue::from_static("7"));
        headers.append(&A2A_EXTENSIONS, HeaderValue::from_static("urn:a, urn:b"));
        headers.append(&LAST_EVENT_ID, HeaderValue::from_static("9"));
        headers.append(&A2A_EXTENSIONS, HeaderValue::from_static("urn:c"));
        let named = Named::read(
            &headers,
            &LAST_EVENT_ID,
            &A2A_VERSION,
            &[A2A_EXTENSIONS, X_A2A_EXTENSIONS],
        );
        // The first value, as `HeaderMap::get` gives it.
        assert_eq!(named.last_event_id.as_deref(), Some("7"));
        assert_eq!(named.version, None);
        let mut uris: Vec<&str> = named
            .extensions
            .as_deref()
            .expect("extensions")
            .split(',')
            .map(str::trim)
            .collect();
        uris.sort_unstable();
        assert_eq!(uris, ["urn:a", "urn:b", "urn:c", "urn:x"]);
        // gRPC reads only `a2a-extensions`.
        let grpc = Named::read(
            &headers,
            &A2A_LAST_EVENT_ID,
            &A2A_VERSION,
            &[A2A_EXTENSIONS],
        );
        assert_eq!(grpc.last_event_id, None);
        assert_eq!(grpc.extensions.as_deref(), Some("urn:a, urn:b,urn:c"));
    }
}
