//! The `a2a` backend: any A2A agent behind a2ad (docs/CONFIG.md, "The `a2a` backend").
//! It speaks the official dialects as a client, so it lives beside them; the core knows
//! it only as an [`Agent`] ([`crate::Runtime::builder`] plugs it in).
//!
//! Each a2ad task becomes one upstream task. Its message goes upstream over the interface
//! the upstream's card offers (`crate::rpc::a2a::client`); the upstream's status and
//! artifact events become the task's updates, in order, and its terminal or interrupted
//! state the task's. As soon as the upstream names its task, the backend leaves a note on
//! the a2ad task (the upstream task and context): a continuing message goes to the same
//! upstream task, a cancel reaches it, and after a restart or a node loss the task is
//! taken up again from it (re-subscribed, else polled) instead of failing.
//!
//! The a2ad conversation maps to an upstream `contextId` derived from (agent, principal,
//! context): the same on every node and after every restart, and never shared between
//! two principals whose contexts have the same name.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use chrono::Utc;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use super::Version;
use super::client::{self, Binding, Endpoint, Event, Refusal, Request, UpTask, UpstreamCard};
use super::errors;
use crate::agent::{
    Agent, AgentError, AgentFuture, AgentRequest, Outcome, OutcomeFuture, Updates, UpstreamFacts,
    UpstreamHealth, UpstreamView,
};
use crate::config::{A2aConfig, AgentLimits};
use crate::metrics::UpstreamMetrics;
use crate::model::{Artifact, Message, TaskId, TaskState};

/// The largest card read (a card is a few KiB; a bigger one is refused).
const MAX_CARD_BYTES: usize = 1 << 20;

/// Bound on a call that answers at once (`GetTask`, `CancelTask`, a card fetch).
const SHORT_CALL: Duration = Duration::from_secs(30);

/// The first and the longest wait between two polls of an upstream task.
const POLL_FIRST: Duration = Duration::from_millis(200);
const POLL_MAX: Duration = Duration::from_secs(5);

/// Upstream contexts learned that differ from the derived ones, at most.
const MAX_RENAMED_CONTEXTS: usize = 10_000;

/// A card fetch that failed is tried again after this long (or at the next task).
const CARD_RETRY: Duration = Duration::from_secs(10);

/// An A2A agent elsewhere, fronted by a2ad.
#[derive(Clone)]
pub struct A2aAgent {
    up: Arc<Upstream>,
}

impl std::fmt::Debug for A2aAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aAgent")
            .field("card_url", &self.up.config.card_url)
            .finish_non_exhaustive()
    }
}

/// The note left on a task: the upstream task and its context.
#[derive(serde::Serialize, serde::Deserialize)]
struct Note {
    t: String,
    c: String,
}

/// One upstream: its HTTP client, its card, its bounds.
struct Upstream {
    /// The fronting agent's id.
    agent: String,
    config: A2aConfig,
    /// `host:port` of the card URL: how failures name the upstream.
    label: String,
    client: reqwest::Client,
    /// The same, speaking HTTP/2 from the first byte (gRPC over cleartext too).
    grpc: reqwest::Client,
    headers: HeaderMap,
    /// Calls open at once (streams included).
    slots: Arc<Semaphore>,
    /// How the upstream's replies are read: the fronting agent's size bounds, any type.
    limits: AgentLimits,
    card: Mutex<CardState>,
    /// One card fetch at a time.
    fetching: tokio::sync::Mutex<()>,
    next_id: AtomicU64,
    /// The runs under way, by a2ad task: where a cancel finds a run that has not named
    /// its upstream task yet.
    runs: Mutex<std::collections::HashMap<TaskId, Arc<Shared>>>,
    /// Derived context → the context the upstream chose instead, when it did.
    renamed: Mutex<std::collections::HashMap<String, String>>,
    metrics: Arc<UpstreamMetrics>,
}

#[derive(Default)]
struct CardState {
    card: Option<Arc<UpstreamCard>>,
    fetched: Option<Instant>,
    health: UpstreamHealth,
}

/// A failed upstream call: its kind (the `kind` label of `a2ad_upstream_errors_total`)
/// and what happened.
struct CallError {
    kind: &'static str,
    what: String,
    /// The A2A error code, when the upstream answered one.
    code: Option<i64>,
}

impl CallError {
    fn new(kind: &'static str, what: impl Into<String>) -> Self {
        Self {
            kind,
            what: what.into(),
            code: None,
        }
    }
}

/// An answer: a body (JSON; on gRPC the message as ProtoJSON), or a stream of events.
enum Answer {
    Body(Vec<u8>),
    Stream(Events),
}

impl A2aAgent {
    /// A backend for this configuration; `agent` is the fronting agent's id, `limits` its
    /// limits (the upstream's replies are held to its sizes). Headers with `env:NAME` are
    /// read now (`Config::validated` checked they are set).
    pub fn new(agent: &str, config: A2aConfig, limits: &AgentLimits) -> Self {
        let label = url::Url::parse(&config.card_url)
            .ok()
            .and_then(|u| {
                let host = u.host_str()?.to_string();
                Some(match u.port_or_known_default() {
                    Some(p) => format!("{host}:{p}"),
                    None => host,
                })
            })
            .unwrap_or_else(|| config.card_url.clone());
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let value = match value.strip_prefix("env:") {
                Some(var) => std::env::var(var).unwrap_or_default(),
                None => value.clone(),
            };
            if let (Ok(n), Ok(mut v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                v.set_sensitive(true);
                headers.insert(n, v);
            }
        }
        let builder = || {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .connect_timeout(config.connect_timeout())
                .pool_max_idle_per_host(config.max_connections)
                .pool_idle_timeout(Duration::from_secs(60))
                .dns_resolver(crate::net::GuardedResolver {
                    allow_private: Arc::new(config.allow_private_networks.into()),
                    timeout: config.connect_timeout(),
                    what: "upstream",
                })
        };
        let client = builder().build().unwrap_or_default();
        let grpc = builder()
            .http2_prior_knowledge()
            .build()
            .unwrap_or_default();
        let limits = AgentLimits {
            supported_types: vec!["*/*".into()],
            max_parts: limits.max_parts.max(1000),
            ..limits.clone()
        };
        let metrics = Arc::new(UpstreamMetrics::default());
        let up = Arc::new(Upstream {
            agent: agent.to_string(),
            slots: Arc::new(Semaphore::new(config.max_connections)),
            label,
            client,
            grpc,
            headers,
            limits,
            card: Mutex::new(CardState {
                health: UpstreamHealth {
                    card_url: crate::push::redact_url(&config.card_url),
                    ..UpstreamHealth::default()
                },
                ..CardState::default()
            }),
            fetching: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
            renamed: Mutex::default(),
            runs: Mutex::default(),
            metrics,
            config,
        });
        tracing::debug!(agent, upstream = %up.label, "a2a backend");
        // The card is fetched now and kept fresh while the backend lives.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(refresh(Arc::downgrade(&up)));
        }
        Self { up }
    }
}

/// Fetches the card now, then every `card_refresh_seconds` (sooner after a failure),
/// until the backend is dropped.
async fn refresh(up: Weak<Upstream>) {
    loop {
        let Some(u) = up.upgrade() else {
            return;
        };
        let ok = u.fetch_card().await.is_ok();
        let period = Duration::from_secs(u.config.card_refresh_seconds);
        drop(u);
        tokio::time::sleep(if ok { period } else { CARD_RETRY.min(period) }).await;
    }
}

impl Upstream {
    fn state(&self) -> std::sync::MutexGuard<'_, CardState> {
        self.card.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn failed(&self, e: &CallError) -> AgentError {
        self.metrics.error(e.kind);
        let message = format!("upstream {}: {}", self.label, e.what);
        self.state().health.last_error = Some((Utc::now(), message.clone()));
        AgentError::new(message)
    }

    /// The card: the one held while it is fresh, else fetched (a task waits for it).
    async fn card(&self) -> Result<Arc<UpstreamCard>, CallError> {
        {
            let s = self.state();
            let fresh = s.fetched.is_some_and(|t| {
                t.elapsed() < Duration::from_secs(self.config.card_refresh_seconds)
            });
            if let Some(card) = &s.card
                && fresh
            {
                return Ok(card.clone());
            }
        }
        match self.fetch_card().await {
            Ok(card) => Ok(card),
            // A stale card still serves while the fetch fails.
            Err(e) => self.state().card.clone().ok_or(e),
        }
    }

    async fn fetch_card(&self) -> Result<Arc<UpstreamCard>, CallError> {
        let _one = self.fetching.lock().await;
        let result = self.fetch_card_once().await;
        let mut s = self.state();
        match &result {
            Ok(card) => {
                s.card = Some(card.clone());
                s.fetched = Some(Instant::now());
                s.health.card_fetched_at = Some(Utc::now());
                let e = &card.endpoint;
                s.health.interface = Some((
                    e.binding.config_name().to_string(),
                    match e.version {
                        Version::V10 => "1.0",
                        Version::V03 => "0.3",
                    }
                    .to_string(),
                ));
            }
            Err(e) => {
                let message = format!("upstream {}: {}", self.label, e.what);
                tracing::warn!(upstream = %self.label, error = %e.what, "the upstream's card could not be read");
                s.health.last_error = Some((Utc::now(), message));
            }
        }
        result
    }

    async fn fetch_card_once(&self) -> Result<Arc<UpstreamCard>, CallError> {
        let url = &self.config.card_url;
        self.check_target(url)?;
        let req = self
            .client
            .get(url)
            .headers(self.headers.clone())
            .header("accept", "application/json")
            .timeout(SHORT_CALL);
        let resp = req
            .send()
            .await
            .map_err(|e| self.transport("card fetch", &e))?;
        let status = resp.status();
        if status.is_redirection() {
            return Err(redirected("its card", status));
        }
        if !status.is_success() {
            return Err(CallError::new(
                "http",
                format!("its card answered HTTP {}", status.as_u16()),
            ));
        }
        let body = read_capped(resp, MAX_CARD_BYTES.min(self.config.max_response_bytes)).await?;
        let card = client::read_card(
            &body,
            &self.config.card_url,
            &self.config.binding,
            &self.config.protocol,
        )
        .map_err(|e| CallError::new("garbage", e))?;
        // Every call goes to the interface's origin (its URL, or a path under it).
        self.check_target(&card.endpoint.url)?;
        Ok(Arc::new(card))
    }

    /// A URL whose host is a literal address is checked here — the card's before it is
    /// fetched, the interface's whenever the card is read (every call goes to that origin;
    /// names are checked by the resolver, at every connection): a card may point anywhere.
    fn check_target(&self, url: &str) -> Result<(), CallError> {
        let parsed = url::Url::parse(url)
            .map_err(|_| CallError::new("garbage", format!("{url:?} is not a URL")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(CallError::new(
                "garbage",
                format!("its interface URL {url:?} is not http(s)"),
            ));
        }
        if let Some(ip) = crate::net::literal_ip(&parsed)
            && let Err(why) = crate::net::address_allowed(ip, self.config.allow_private_networks)
        {
            return Err(CallError::new(
                "refused",
                format!("the address {ip} is refused ({why})"),
            ));
        }
        Ok(())
    }

    fn transport(&self, during: &str, e: &reqwest::Error) -> CallError {
        if let Some(refused) = crate::net::refusal(e) {
            return CallError::new("refused", format!("{during}: {refused}"));
        }
        if e.is_timeout() {
            CallError::new("timeout", format!("{during} timed out"))
        } else if e.is_connect() {
            CallError::new(
                "connect",
                format!("{during}: could not connect (the upstream is down or unreachable)"),
            )
        } else {
            CallError::new("connect", format!("{during}: the connection failed"))
        }
    }

    /// One call: a body, or (for a stream that the upstream opens) its events. A stream
    /// holds its slot until it is dropped.
    async fn call(
        self: &Arc<Self>,
        endpoint: &Endpoint,
        request: &Request<'_>,
        bound: Option<Duration>,
    ) -> Result<Answer, CallError> {
        let call = request
            .call(endpoint, self.next_id.fetch_add(1, Ordering::Relaxed))
            .map_err(|e| {
                CallError::new("error", format!("its request could not be written ({e})"))
            })?;
        // The interface's URL itself was parsed with the card; a path under it is parsed.
        let url = match &endpoint.parsed {
            Some(u) if call.url == endpoint.url => u.clone(),
            _ => url::Url::parse(&call.url)
                .map_err(|_| CallError::new("garbage", format!("{:?} is not a URL", call.url)))?,
        };
        let permit = match bound {
            // Cancels and polls do not queue behind open streams.
            Some(_) => None,
            None => Some(
                self.slots
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| CallError::new("connect", "the backend is closing"))?,
            ),
        };
        self.metrics.requests.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let grpc = endpoint.binding == Binding::Grpc;
        let client = if grpc { &self.grpc } else { &self.client };
        let mut req = client
            .request(call.http_method.clone(), url)
            .headers(self.headers.clone());
        req = if grpc {
            req.header("content-type", "application/grpc")
                .header("te", "trailers")
        } else {
            req.header(
                "accept",
                if call.stream {
                    "text/event-stream"
                } else {
                    "application/json"
                },
            )
        };
        if endpoint.version == Version::V10 {
            req = req.header("a2a-version", "1.0");
        }
        if let Some(body) = call.body {
            if !grpc {
                req = req.header("content-type", "application/json");
            }
            req = req.body(body);
        }
        if let Some(b) = bound {
            req = req.timeout(b);
        }
        if crate::telemetry::on() {
            let mut headers = HeaderMap::new();
            crate::telemetry::inject_current(&mut headers);
            req = req.headers(headers);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| self.transport("the call", &e))?;
        let status = resp.status();
        if status.is_redirection() {
            return Err(redirected("it", status));
        }
        if grpc && status.is_success() {
            return self.grpc_answer(request, resp, started, permit).await;
        }
        let is_sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if status.is_success() && is_sse {
            self.metrics.latency(started.elapsed());
            return Ok(Answer::Stream(Events::Sse(Sse {
                resp,
                buf: Vec::new(),
                data: String::new(),
                received: 0,
                limit: self.config.max_response_bytes,
                _permit: permit,
            })));
        }
        let body = read_capped(resp, self.config.max_response_bytes).await?;
        self.metrics.latency(started.elapsed());
        if !status.is_success() {
            let detail = client::read_rest_error(&body)
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            let kind = if status.as_u16() == 401 || status.as_u16() == 403 {
                "auth"
            } else {
                "http"
            };
            return Err(CallError::new(
                kind,
                format!("answered HTTP {}{detail}", status.as_u16()),
            ));
        }
        Ok(Answer::Body(body))
    }

    /// A gRPC answer: its status when it has no message (a trailers-only answer), else
    /// its one message, or its stream of them.
    async fn grpc_answer(
        &self,
        request: &Request<'_>,
        resp: reqwest::Response,
        started: Instant,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Result<Answer, CallError> {
        if let Some(Err(e)) = client::grpc_status(resp.headers()) {
            self.metrics.latency(started.elapsed());
            return Err(refused(e));
        }
        let response: hyper::Response<reqwest::Body> = resp.into();
        let mut frames = GrpcFrames {
            body: response.into_body(),
            buf: Vec::new(),
            received: 0,
            limit: self.config.max_response_bytes,
            _permit: permit,
        };
        if matches!(
            request,
            Request::Subscribe(_) | Request::Send { stream: true, .. }
        ) {
            self.metrics.latency(started.elapsed());
            return Ok(Answer::Stream(Events::Grpc(frames)));
        }
        let message = frames.next().await?;
        // The status after the message: an error there is the answer.
        if frames.next().await?.is_some() {
            return Err(CallError::new(
                "garbage",
                "answered garbage: two messages to a unary call",
            ));
        }
        self.metrics.latency(started.elapsed());
        let Some(message) = message else {
            return Err(CallError::new("garbage", "answered garbage: no message"));
        };
        request
            .grpc_answer(&message)
            .map(Answer::Body)
            .map_err(refused)
    }

    /// Reads an answer that is one result.
    fn read(&self, endpoint: &Endpoint, get: bool, body: &[u8]) -> Result<Event, CallError> {
        client::read_answer(endpoint, get, body, &self.limits).map_err(refused)
    }

    /// The upstream context for an a2ad conversation.
    fn context_for(&self, request: &AgentRequest) -> String {
        let mut h = Sha256::new();
        for part in [
            "a2ad-upstream-context",
            self.agent.as_str(),
            request.principal.as_str(),
            request.context_id.as_str(),
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        let digest = h.finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        let derived = uuid::Builder::from_custom_bytes(bytes)
            .into_uuid()
            .to_string();
        let renamed = self.renamed.lock().unwrap_or_else(|e| e.into_inner());
        renamed.get(&derived).cloned().unwrap_or(derived)
    }

    fn learn_context(&self, derived: &str, actual: &str) {
        if derived != actual && !actual.is_empty() {
            let mut renamed = self.renamed.lock().unwrap_or_else(|e| e.into_inner());
            if renamed.len() >= MAX_RENAMED_CONTEXTS {
                renamed.clear();
            }
            renamed.insert(derived.to_string(), actual.to_string());
        }
    }

    /// Cancels an upstream task, best effort, within `connect_timeout_seconds` + 5 s.
    async fn cancel(self: &Arc<Self>, task: &str) -> Result<(), CallError> {
        let card = self.card().await?;
        let bound = self.config.connect_timeout() + Duration::from_secs(5);
        let answer = tokio::time::timeout(
            bound,
            self.call(&card.endpoint, &Request::Cancel(task), Some(bound)),
        )
        .await
        .map_err(|_| CallError::new("timeout", "the cancel timed out"))?;
        match answer {
            Ok(Answer::Body(b)) => {
                match client::read_answer(&card.endpoint, true, &b, &self.limits) {
                    Ok(_) => Ok(()),
                    Err(e) => Err(refused(e)),
                }
            }
            Ok(Answer::Stream(_)) => Ok(()),
            Err(e) => Err(e),
        }
        .or_else(|e| match e.code {
            // Ended already: nothing to stop.
            Some(errors::TASK_NOT_CANCELABLE) => Ok(()),
            _ => Err(e),
        })
    }
}

/// A redirect, which is never followed (its target was not checked by the policy).
fn redirected(who: &str, status: reqwest::StatusCode) -> CallError {
    CallError::new(
        "redirect",
        format!(
            "{who} answered with a redirect (HTTP {}), which a2ad does not follow",
            status.as_u16()
        ),
    )
}

fn refused(e: Refusal) -> CallError {
    match e {
        Refusal::Garbage(what) => CallError::new("garbage", format!("answered garbage: {what}")),
        Refusal::Error(code, message) => {
            let message: String = message.chars().take(200).collect();
            CallError {
                code: Some(code),
                ..CallError::new("error", format!("answered an error ({code}: {message})"))
            }
        }
    }
}

/// Reads a body up to `limit` bytes.
async fn read_capped(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, CallError> {
    let mut body = Vec::new();
    loop {
        let chunk = resp
            .chunk()
            .await
            .map_err(|_| CallError::new("connect", "the connection broke during the answer"))?;
        let Some(chunk) = chunk else {
            return Ok(body);
        };
        if body.len() + chunk.len() > limit {
            return Err(too_large(limit));
        }
        body.extend_from_slice(&chunk);
    }
}

/// An upstream's stream of events.
enum Events {
    Sse(Sse),
    Grpc(GrpcFrames),
}

impl Events {
    /// The next event, as [`client::read_event`] reads it; `None` when the stream ends.
    async fn next(&mut self) -> Result<Option<String>, CallError> {
        match self {
            Self::Sse(sse) => sse.next().await,
            Self::Grpc(frames) => match frames.next().await? {
                Some(m) => client::grpc_event(&m).map(Some).map_err(refused),
                None => Ok(None),
            },
        }
    }
}

/// A gRPC answer's length-prefixed messages, at most `limit` bytes in all, then its
/// status (trailers).
struct GrpcFrames {
    body: reqwest::Body,
    /// Bytes received and not yet read as a message.
    buf: Vec<u8>,
    received: usize,
    limit: usize,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl GrpcFrames {
    /// The next message; `None` at the end of an answer whose status is OK (another
    /// status is the error it stands for).
    async fn next(&mut self) -> Result<Option<Vec<u8>>, CallError> {
        use http_body_util::BodyExt as _;
        let garbage = |what: &str| CallError::new("garbage", format!("answered garbage: {what}"));
        loop {
            if let [flag, a, b, c, d, ..] = self.buf[..] {
                if flag != 0 {
                    return Err(garbage("a compressed gRPC message (none was asked for)"));
                }
                let len = u32::from_be_bytes([a, b, c, d]) as usize;
                if len > self.limit {
                    return Err(too_large(self.limit));
                }
                if self.buf.len() >= 5 + len {
                    let message = self.buf[5..5 + len].to_vec();
                    self.buf.drain(..5 + len);
                    return Ok(Some(message));
                }
            }
            let frame = match self.body.frame().await {
                None => return Err(garbage("a gRPC answer without grpc-status")),
                Some(Err(_)) => {
                    return Err(CallError::new(
                        "connect",
                        "the connection broke during the answer",
                    ));
                }
                Some(Ok(frame)) => frame,
            };
            match frame.into_data() {
                Ok(data) => {
                    self.received = self.received.saturating_add(data.len());
                    if self.received > self.limit {
                        return Err(too_large(self.limit));
                    }
                    self.buf.extend_from_slice(&data);
                }
                Err(frame) => {
                    let Ok(trailers) = frame.into_trailers() else {
                        continue;
                    };
                    if !self.buf.is_empty() {
                        return Err(garbage("a gRPC answer that ends inside a message"));
                    }
                    return match client::grpc_status(&trailers) {
                        Some(Ok(())) => Ok(None),
                        Some(Err(e)) => Err(refused(e)),
                        None => Err(garbage("a gRPC answer without grpc-status")),
                    };
                }
            }
        }
    }
}

fn too_large(limit: usize) -> CallError {
    CallError::new(
        "too_large",
        format!("its answer passed {limit} bytes (max_response_bytes)"),
    )
}

/// An upstream's SSE stream: its events' `data`, at most `limit` bytes in all.
struct Sse {
    resp: reqwest::Response,
    /// Bytes of the current line not ended yet.
    buf: Vec<u8>,
    /// The `data:` lines of the current event.
    data: String,
    received: usize,
    limit: usize,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Sse {
    /// The next event's data; `None` when the stream ends.
    async fn next(&mut self) -> Result<Option<String>, CallError> {
        loop {
            // Complete lines already held.
            while let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line[..end]);
                let line = line.trim_end_matches('\r');
                if line.is_empty() {
                    if !self.data.is_empty() {
                        return Ok(Some(std::mem::take(&mut self.data)));
                    }
                } else if let Some(d) = line.strip_prefix("data:") {
                    if !self.data.is_empty() {
                        self.data.push('\n');
                    }
                    self.data.push_str(d.strip_prefix(' ').unwrap_or(d));
                }
            }
            let chunk =
                self.resp.chunk().await.map_err(|_| {
                    CallError::new("connect", "the connection broke during the stream")
                })?;
            let Some(chunk) = chunk else {
                return Ok((!self.data.is_empty()).then(|| std::mem::take(&mut self.data)));
            };
            self.received = self.received.saturating_add(chunk.len());
            if self.received > self.limit {
                return Err(CallError::new(
                    "too_large",
                    format!(
                        "its stream passed {} bytes (max_response_bytes)",
                        self.limit
                    ),
                ));
            }
            self.buf.extend_from_slice(&chunk);
        }
    }
}

/// One run's view of the upstream task: what is known of it and what was passed on.
struct Run<'a> {
    up: &'a Arc<Upstream>,
    card: Arc<UpstreamCard>,
    updates: &'a Updates,
    /// The upstream task and context, once known.
    task: Option<(String, String)>,
    /// Whether the note holds `task`.
    noted: bool,
    /// The context this run derived (to learn the upstream's own, if it differs).
    derived: Option<String>,
    /// Artifacts passed on (ids), so a task read again does not repeat them.
    seen: std::collections::HashSet<String>,
    /// The last status message passed on while working.
    last_progress: Option<String>,
    /// Where a time-out finds the task, to cancel it.
    shared: &'a Shared,
}

impl Run<'_> {
    /// Learns the upstream task (and leaves the note, once).
    fn learn(&mut self, id: &str, context: &str) {
        if id.is_empty() {
            return;
        }
        let context = if context.is_empty() {
            self.task.as_ref().map(|t| t.1.clone()).unwrap_or_default()
        } else {
            context.to_string()
        };
        if let Some(derived) = &self.derived {
            self.up.learn_context(derived, &context);
        }
        let known = self
            .task
            .as_ref()
            .is_some_and(|(t, c)| t == id && *c == context);
        if !known {
            self.task = Some((id.to_string(), context.clone()));
            self.noted = false;
            *self.shared.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(id.to_string());
        }
        if !self.noted {
            let note = Note {
                t: id.to_string(),
                c: context,
            };
            if let Ok(text) = serde_json::to_string(&note) {
                self.noted = self.updates.note(&text);
            }
        }
    }

    fn artifact(&mut self, artifact: Artifact, append: bool, last_chunk: bool) {
        self.seen.insert(artifact.artifact_id.clone());
        self.updates.artifact(artifact, append, last_chunk);
    }

    /// Passes a working status's message on (once per distinct message).
    fn progress(&mut self, message: Option<Message>) {
        if let Some(m) = message
            && self.last_progress.as_deref() != Some(m.message_id.as_str())
        {
            self.last_progress = Some(m.message_id.clone());
            self.updates.progress(m);
        }
    }

    /// Applies one event; `Some` once the task ended its run upstream (or the run was
    /// abandoned: the upstream task it names is canceled).
    async fn apply(&mut self, event: Event) -> Option<Result<Outcome, AgentError>> {
        let end = self.apply_event(event).await;
        if self.shared.cancel_wanted.load(Ordering::Acquire) {
            let task = self.task.as_ref().map(|t| t.0.clone());
            if let Some(task) = task
                && end.is_none()
            {
                spawn_cancel(self.up.clone(), task);
            }
            return Some(Err(AgentError::new("canceled")));
        }
        if self.shared.abandoned.load(Ordering::Acquire) {
            // Moved elsewhere (a restart that keeps it, another node): left running there.
            return Some(Err(AgentError::new("abandoned")));
        }
        end
    }

    async fn apply_event(&mut self, event: Event) -> Option<Result<Outcome, AgentError>> {
        self.updates.ready().await;
        match event {
            Event::Task(t) => self.task_seen(t),
            Event::Message(m) => {
                if self.task.is_none() {
                    // Answered without a task: the reply.
                    return Some(Ok(Outcome::Completed(Some(m))));
                }
                self.progress(Some(m));
                None
            }
            Event::Status {
                task_id,
                context_id,
                state,
                message,
            } => {
                self.learn(&task_id, &context_id);
                self.state(state, message)
            }
            Event::Artifact {
                task_id,
                artifact,
                append,
                last_chunk,
            } => {
                let context = self.task.as_ref().map(|t| t.1.clone()).unwrap_or_default();
                self.learn(&task_id, &context);
                self.artifact(artifact, append, last_chunk);
                None
            }
        }
    }

    /// A whole task (a send's result, a poll, a stream's first frame): its artifacts not
    /// passed on yet, then its state.
    fn task_seen(&mut self, t: UpTask) -> Option<Result<Outcome, AgentError>> {
        self.learn(&t.id, &t.context_id);
        for a in t.artifacts {
            if !self.seen.contains(&a.artifact_id) {
                self.artifact(a, false, true);
            }
        }
        self.state(t.state, t.message)
    }

    fn state(
        &mut self,
        state: TaskState,
        message: Option<Message>,
    ) -> Option<Result<Outcome, AgentError>> {
        let label = &self.up.label;
        Some(match state {
            TaskState::Submitted | TaskState::Working => {
                self.progress(message);
                return None;
            }
            TaskState::Completed => Ok(Outcome::Completed(message)),
            TaskState::InputRequired => Ok(Outcome::InputRequired(message)),
            TaskState::AuthRequired => Ok(Outcome::AuthRequired(message)),
            TaskState::Rejected => Ok(Outcome::Rejected(message)),
            TaskState::Canceled => Ok(Outcome::Canceled(format!(
                "canceled by the upstream {label}"
            ))),
            TaskState::Failed => {
                let said = message.map(|m| m.joined_text()).unwrap_or_default();
                let said: String = said.chars().take(500).collect();
                self.up.metrics.error("failed");
                Err(AgentError::new(if said.is_empty() {
                    format!("upstream {label}: the task failed")
                } else {
                    format!("upstream {label}: the task failed: {said}")
                }))
            }
        })
    }

    /// Follows a stream to the task's end; `None` when it ended before (the caller polls).
    async fn follow(&mut self, mut events: Events) -> Result<Option<Outcome>, AgentError> {
        loop {
            let data = match events.next().await {
                Ok(Some(d)) => d,
                Ok(None) => return Ok(None),
                Err(e) if self.task.is_some() && e.kind == "connect" => {
                    // The stream broke: the task goes on upstream; it is polled.
                    tracing::debug!(upstream = %self.up.label, error = %e.what, "stream broke; polling");
                    return Ok(None);
                }
                Err(e) => return Err(self.up.failed(&e)),
            };
            let event = client::read_event(&self.card.endpoint, &data, &self.up.limits)
                .map_err(|e| self.up.failed(&refused(e)))?;
            if let Some(end) = self.apply(event).await {
                return end.map(Some);
            }
        }
    }

    /// Polls the upstream task until it ends its run, with a backoff from 0.2 s to 5 s.
    async fn poll(&mut self) -> Result<Outcome, AgentError> {
        let Some((task, _)) = self.task.clone() else {
            return Err(self.up.failed(&CallError::new(
                "garbage",
                "its answer named no task to follow",
            )));
        };
        let mut wait = POLL_FIRST;
        loop {
            tokio::time::sleep(wait).await;
            wait = (wait.mul_f64(1.5)).min(POLL_MAX);
            let answer = self
                .up
                .call(&self.card.endpoint, &Request::Get(&task), Some(SHORT_CALL))
                .await
                .map_err(|e| self.up.failed(&e))?;
            let Answer::Body(body) = answer else {
                return Err(self
                    .up
                    .failed(&CallError::new("garbage", "answered GetTask with a stream")));
            };
            let event = self
                .up
                .read(&self.card.endpoint, true, &body)
                .map_err(|e| self.up.failed(&e))?;
            if let Some(end) = self.apply(event).await {
                return end;
            }
        }
    }
}

impl Agent for A2aAgent {
    fn kind(&self) -> &str {
        "a2a"
    }

    fn run(&self, request: AgentRequest, updates: Updates) -> AgentFuture {
        let run = self.run_task(request, updates);
        Box::pin(async move {
            match run.await? {
                Outcome::Completed(m)
                | Outcome::InputRequired(m)
                | Outcome::AuthRequired(m)
                | Outcome::Rejected(m) => Ok(m.unwrap_or_else(|| Message::agent_text([""]))),
                Outcome::Canceled(reason) => Err(AgentError::new(reason)),
            }
        })
    }

    fn run_task(&self, request: AgentRequest, updates: Updates) -> OutcomeFuture {
        // The run goes on its own tokio task: a cancel that drops this future while the
        // upstream has not named its task yet must not lose that task (it would run on
        // upstream, unsupervised). The cancel is told first (`canceled`), so the run,
        // abandoned then, carries on until the upstream names its task, cancels it there,
        // and stops; abandoned once the task is named, it is aborted at once.
        let up = self.up.clone();
        let shared = Arc::new(Shared::default());
        let task = request.task_id.clone();
        let request_task = task.clone();
        up.runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(task.clone(), shared.clone());
        let run = tokio::spawn({
            let up = up.clone();
            let shared = shared.clone();
            async move {
                let result = bounded(up.clone(), request, updates, shared).await;
                up.runs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&task);
                result
            }
        });
        let guard = Abandon {
            shared,
            run: run.abort_handle(),
            up,
            task: request_task,
        };
        Box::pin(async move {
            let result = run.await;
            drop(guard);
            result.unwrap_or_else(|_| Err(AgentError::new("the upstream call ended unexpectedly")))
        })
    }

    fn takes_up(&self) -> bool {
        true
    }

    fn upstream(&self) -> Option<UpstreamView> {
        let s = self.up.state();
        Some(UpstreamView {
            health: s.health.clone(),
            metrics: self.up.metrics.clone(),
            card: s.card.as_ref().map(|c| UpstreamFacts {
                name: c.name.clone(),
                description: c.description.clone(),
                skills: Some(c.skills.clone()),
                input_modes: c.input_modes.clone(),
                output_modes: c.output_modes.clone(),
                streaming: c.streaming,
            }),
        })
    }

    fn canceled(&self, task: &TaskId, note: Option<&str>) {
        let noted = note.and_then(|n| serde_json::from_str::<Note>(n).ok());
        let run = self
            .up
            .runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(task)
            .cloned();
        // A run not told its upstream task yet cancels it once it is named.
        if let Some(run) = &run {
            run.cancel_wanted.store(true, Ordering::Release);
        }
        let named = run.and_then(|r| r.task.lock().unwrap_or_else(|e| e.into_inner()).clone());
        if let Some(upstream_task) = noted.map(|n| n.t).or(named) {
            spawn_cancel(self.up.clone(), upstream_task);
        }
    }
}

/// What a run, the future that awaits it and the cancel hook share.
#[derive(Default)]
struct Shared {
    /// The upstream task, once named.
    task: Mutex<Option<String>>,
    /// The future was dropped (the a2ad task ended, moved to another node, or the server
    /// stops).
    abandoned: AtomicBool,
    /// The a2ad task is being canceled: so is the upstream task.
    cancel_wanted: AtomicBool,
}

/// Marks a run abandoned when the future awaiting it is dropped; aborts it unless the
/// upstream task is still to be named.
struct Abandon {
    shared: Arc<Shared>,
    run: tokio::task::AbortHandle,
    up: Arc<Upstream>,
    task: TaskId,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if self.run.is_finished() {
            return;
        }
        self.shared.abandoned.store(true, Ordering::Release);
        let named = self
            .shared
            .task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if named {
            self.run.abort();
            self.up
                .runs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&self.task);
        }
    }
}

/// A run within `timeout_seconds`: on expiry the upstream task is canceled.
async fn bounded(
    up: Arc<Upstream>,
    request: AgentRequest,
    updates: Updates,
    shared: Arc<Shared>,
) -> Result<Outcome, AgentError> {
    let limit = up.config.timeout();
    match tokio::time::timeout(limit, work(&up, request, &updates, &shared)).await {
        Ok(result) => result,
        Err(_) => {
            let task = shared.task.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(task) = task {
                spawn_cancel(up.clone(), task);
            }
            Err(up.failed(&CallError::new(
                "timeout",
                format!(
                    "the task did not finish within {} s (timeout_seconds)",
                    limit.as_secs_f64()
                ),
            )))
        }
    }
}

/// Cancels the upstream task in the background (a cancel here never waits for it).
fn spawn_cancel(up: Arc<Upstream>, task: String) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        if let Err(e) = up.cancel(&task).await {
            let e = up.failed(&e);
            tracing::warn!(upstream = %up.label, task = %task, error = %e.message, "the upstream task could not be canceled");
        }
    });
}

/// One run: a new upstream task, the continuation of one, or the take-up of one.
async fn work(
    up: &Arc<Upstream>,
    request: AgentRequest,
    updates: &Updates,
    shared: &Shared,
) -> Result<Outcome, AgentError> {
    let card = up.card().await.map_err(|e| up.failed(&e))?;
    let note = request
        .note
        .as_deref()
        .and_then(|n| serde_json::from_str::<Note>(n).ok());
    let mut run = Run {
        up,
        card: card.clone(),
        updates,
        task: note.as_ref().map(|n| (n.t.clone(), n.c.clone())),
        noted: note.is_some(),
        derived: None,
        seen: request
            .artifacts
            .iter()
            .map(|a| a.artifact_id.clone())
            .collect(),
        // The task's last agent message: a task read again does not repeat it.
        last_progress: request
            .task_history
            .iter()
            .rev()
            .find(|m| m.role == crate::model::Role::Agent)
            .map(|m| m.message_id.clone()),
        shared,
    };
    if let Some(n) = &note {
        *shared.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(n.t.clone());
    }
    let endpoint = &card.endpoint;
    if request.taken_up {
        let Some(n) = note else {
            return Err(AgentError::new("taken up without a note"));
        };
        tracing::info!(upstream = %up.label, task = %request.task_id, upstream_task = %n.t, "taking up an upstream task");
        if card.streaming
            && let Ok(Answer::Stream(sse)) =
                up.call(endpoint, &Request::Subscribe(&n.t), None).await
            && let Some(outcome) = run.follow(sse).await?
        {
            return Ok(outcome);
        }
        return run.poll().await;
    }
    let context = match &note {
        Some(n) => n.c.clone(),
        None => {
            let c = up.context_for(&request);
            run.derived = Some(c.clone());
            c
        }
    };
    let upstream_task = note.as_ref().map(|n| n.t.clone());
    let send = Request::Send {
        message: &request.message,
        context: &context,
        task: upstream_task.as_deref(),
        stream: card.streaming,
        wait: false,
    };
    match up
        .call(endpoint, &send, None)
        .await
        .map_err(|e| up.failed(&e))?
    {
        Answer::Stream(sse) => {
            if let Some(outcome) = run.follow(sse).await? {
                return Ok(outcome);
            }
        }
        Answer::Body(body) => {
            let event = up.read(endpoint, false, &body).map_err(|e| up.failed(&e))?;
            if let Some(end) = run.apply(event).await {
                return end;
            }
        }
    }
    run.poll().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_reads_back() {
        let text = serde_json::to_string(&Note {
            t: "t1".into(),
            c: "c1".into(),
        })
        .expect("note");
        let n: Note = serde_json::from_str(&text).expect("reads");
        assert_eq!((n.t.as_str(), n.c.as_str()), ("t1", "c1"));
        assert!(text.len() < crate::agent::MAX_NOTE_BYTES);
    }

    #[test]
    fn upstream_contexts_differ_by_principal_and_stay_put() {
        let agent = A2aAgent::new(
            "front",
            A2aConfig::new("http://127.0.0.1:9/.well-known/agent-card.json"),
            &AgentLimits::default(),
        );
        let request = |principal: &str, context: &str| AgentRequest {
            task_id: crate::model::TaskId::new("t"),
            context_id: crate::model::ContextId::new(context),
            principal: crate::model::Principal::new(principal),
            message: Arc::new(Message::user_text(["hi"])),
            history: Vec::new(),
            task_history: Vec::new(),
            turn: 1,
            extensions: Default::default(),
            cancel: Default::default(),
            note: None,
            taken_up: false,
            artifacts: Vec::new(),
        };
        let a = agent.up.context_for(&request("alice", "c"));
        assert_eq!(a, agent.up.context_for(&request("alice", "c")));
        assert_ne!(a, agent.up.context_for(&request("bob", "c")));
        assert_ne!(a, agent.up.context_for(&request("alice", "d")));
        assert!(uuid::Uuid::parse_str(&a).is_ok(), "{a}");
        assert_eq!(agent.up.label, "127.0.0.1:9");
    }
}
