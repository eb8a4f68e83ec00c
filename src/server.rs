//! The server: bind, accept, serve connections, drain on shutdown.
//!
//! `Server::bind` validates nothing itself (the configuration is already validated) and
//! never panics on input; `ServerHandle::stop` starts the documented shutdown: stop
//! accepting, cancel running tasks with reason `shutdown` (their streams end with a final
//! event), let in-flight requests finish within the grace period, then close everything.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use futures_util::future::Either;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tracing::Instrument as _;

use crate::auth::KeyStore;
use crate::config::{Config, ServerConfig};
use crate::error::Result;
use crate::http::{self, App};
use crate::limits::RateLimiter;
use crate::runtime::Runtime;

pub(crate) mod conn;

use conn::{Activity, Closed, InFlight, Pressure, Timeouts, Tracked};

/// A bound server, not yet serving.
///
/// ```
/// # async fn run() -> a2ad::Result<()> {
/// let mut config = a2ad::Config::default();
/// config.server.listen = "127.0.0.1:0".into(); // any free port
/// let server = a2ad::Server::bind(config.validated()?).await?;
/// let handle = server.serve()?;
/// println!("listening on http://{}", handle.local_addr());
/// handle.stop(); // graceful: running tasks end `canceled` (reason "shutdown")
/// handle.stopped().await;
/// # Ok(())
/// # }
/// # tokio::runtime::Runtime::new().expect("runtime").block_on(run()).expect("serves");
/// ```
pub struct Server {
    listener: TcpListener,
    app: Arc<App>,
    dev_key: Option<String>,
}

/// A running server.
pub struct ServerHandle {
    addr: SocketAddr,
    /// Sending `true` starts the shutdown; dropped with the handle, which also stops.
    stop: watch::Sender<bool>,
    /// Resolves when the accept loop and the drain are done.
    done: tokio::task::JoinHandle<u64>,
    runtime: Runtime,
}

impl Server {
    /// Starts the actor system and binds the listener of `config.server.listen`.
    ///
    /// # Errors
    /// [`crate::Error::Io`] when the address cannot be bound.
    pub async fn bind(config: Config) -> Result<Self> {
        Self::bind_with(config, Default::default()).await
    }

    /// Like [`Server::bind`], with some agents served by the given backends.
    ///
    /// # Errors
    /// [`crate::Error::Io`] when the address cannot be bound.
    pub async fn bind_with(
        config: Config,
        backends: std::collections::HashMap<crate::AgentId, Arc<dyn crate::Agent>>,
    ) -> Result<Self> {
        let addr = config.listen_addr()?;
        let listener = listen(addr, config.server.listen_backlog)?;
        Self::start(listener, config, backends).await
    }

    /// A server to build: its agents' backends and, if the caller binds it, its listener.
    ///
    /// ```
    /// # async fn run() -> a2ad::Result<()> {
    /// use a2ad::{Agent, AgentFuture, AgentRequest, Message, Updates};
    ///
    /// struct Shout;
    /// impl Agent for Shout {
    ///     fn kind(&self) -> &str {
    ///         "shout"
    ///     }
    ///     fn run(&self, request: AgentRequest, _updates: Updates) -> AgentFuture {
    ///         let text = request.message.joined_text().to_uppercase();
    ///         Box::pin(async move { Ok(Message::agent_text([text])) })
    ///     }
    /// }
    ///
    /// let mut config = a2ad::Config::default();
    /// config.store = a2ad::StoreConfig::memory();
    /// config.agents = vec![a2ad::config::AgentConfig::new("shout")];
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let server = a2ad::Server::builder(config.validated()?)
    ///     .agent("shout", Shout)
    ///     .listener(listener)
    ///     .build()
    ///     .await?;
    /// println!("listening on http://{}", server.local_addr()?);
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// let serving = tokio::spawn(server.run(async move {
    ///     let _ = stopped.await;
    /// }));
    /// let _ = stop.send(()); // when your program decides to stop
    /// let unwritten = serving.await.expect("joined")?;
    /// assert_eq!(unwritten, 0);
    /// # Ok(())
    /// # }
    /// # tokio::runtime::Runtime::new().expect("runtime").block_on(run()).expect("serves");
    /// ```
    pub fn builder(config: Config) -> Builder {
        Builder {
            config,
            backends: std::collections::HashMap::new(),
            listener: None,
        }
    }

    async fn start(
        listener: TcpListener,
        config: Config,
        backends: std::collections::HashMap<crate::AgentId, Arc<dyn crate::Agent>>,
    ) -> Result<Self> {
        let config = Arc::new(config);
        let (keys, dev_key) = KeyStore::from_config(&config);
        let per_minute: Vec<u64> = config
            .agents
            .iter()
            .map(|a| a.limits.requests_per_minute)
            .collect();
        let rate = RateLimiter::new(keys.principals(), &per_minute);
        let runtime =
            Runtime::start_full(config.clone(), backends, crate::rpc::payload_renderers()).await?;
        let s = &config.server;
        let local_addr = listener.local_addr()?;
        let app = Arc::new(App {
            runtime,
            keys,
            rate,
            requests: Default::default(),
            max_body: config.max_body_bytes(),
            body_timeout: s.body_read_timeout(),
            ping_every: s.ping_interval(),
            local_addr,
            started: chrono::Utc::now(),
        });
        Ok(Self {
            listener,
            app,
            dev_key,
        })
    }

    /// The bound address (with the real port when port 0 was asked).
    ///
    /// # Errors
    /// When the socket cannot report its address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// The generated development key, when no key is configured.
    pub fn dev_key(&self) -> Option<&str> {
        self.dev_key.as_deref()
    }

    /// The actor system behind the server.
    pub fn runtime(&self) -> &Runtime {
        &self.app.runtime
    }

    /// Starts serving on the current tokio runtime.
    ///
    /// # Errors
    /// When the socket cannot report its address.
    pub fn serve(self) -> Result<ServerHandle> {
        let addr = self.listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let runtime = self.app.runtime.clone();
        if runtime.is_clustered() {
            tokio::spawn(share_loop(self.app.clone()));
        }
        let done = tokio::spawn(accept_loop(self.listener, self.app, stopped));
        Ok(ServerHandle {
            addr,
            stop,
            done,
            runtime,
        })
    }
}

impl Server {
    /// Serves until `shutdown` resolves, then stops gracefully (as [`ServerHandle::stop`])
    /// and returns what [`ServerHandle::stopped`] returns: the writes that never became
    /// durable.
    ///
    /// # Errors
    /// When the socket cannot report its address.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<u64> {
        let handle = self.serve()?;
        shutdown.await;
        handle.stop();
        Ok(handle.stopped().await)
    }
}

/// Builds a [`Server`]: see [`Server::builder`].
pub struct Builder {
    config: Config,
    backends: std::collections::HashMap<crate::AgentId, Arc<dyn crate::Agent>>,
    listener: Option<TcpListener>,
}

impl Builder {
    /// Serves the agent `id` (one of the configuration's agents) with this backend instead
    /// of the one its configuration names.
    #[must_use]
    pub fn agent(mut self, id: &str, backend: impl crate::Agent) -> Self {
        self.backends
            .insert(crate::AgentId::new(id), Arc::new(backend));
        self
    }

    /// Serves on this listener (bound by the caller) instead of binding
    /// `server.listen`; `server.listen_backlog` is then the caller's business too.
    #[must_use]
    pub fn listener(mut self, listener: TcpListener) -> Self {
        self.listener = Some(listener);
        self
    }

    /// Starts the actor system (and binds `server.listen` unless a listener was given).
    ///
    /// # Errors
    /// [`crate::Error::Io`] when the address cannot be bound; a store or actor that
    /// cannot start.
    pub async fn build(self) -> Result<Server> {
        match self.listener {
            Some(listener) => Server::start(listener, self.config, self.backends).await,
            None => Server::bind_with(self.config, self.backends).await,
        }
    }
}

impl ServerHandle {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The actor system behind the server.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Starts the graceful shutdown; returns at once.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits until the server has stopped (after [`ServerHandle::stop`]). Returns the
    /// writes that never became durable: 0 unless the store kept failing (a full disk, a
    /// lost database) until the shutdown grace ran out.
    pub async fn stopped(self) -> u64 {
        self.done.await.unwrap_or(0)
    }
}

fn listen(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let socket = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    socket.set_nonblocking(true)?;
    TcpListener::from_std(socket.into())
}

/// `max_connections`, lowered so that open connections can never use up the process's
/// file descriptors (the store, webhooks and upstreams need some too).
fn connection_cap(configured: usize) -> usize {
    let Some(limit) = open_file_limit() else {
        return configured;
    };
    let reserve = (limit / 8).clamp(64, 4096);
    let fit = usize::try_from(limit.saturating_sub(reserve).max(16)).unwrap_or(usize::MAX);
    if configured > fit {
        tracing::warn!(
            configured,
            allowed = fit,
            open_file_limit = limit,
            "server.max_connections lowered to fit the open-file limit; raise `ulimit -n` to allow more"
        );
        return fit;
    }
    configured
}

#[cfg(unix)]
fn open_file_limit() -> Option<u64> {
    rlimit::getrlimit(rlimit::Resource::NOFILE)
        .ok()
        .map(|(soft, _)| soft)
        .filter(|&soft| soft != rlimit::INFINITY)
}

#[cfg(not(unix))]
fn open_file_limit() -> Option<u64> {
    None
}

/// hyper's connection settings: HTTP/1.1 and HTTP/2 (prior knowledge), each with its
/// bounds. A connection's first bytes pick one ([`choose_protocol`]).
pub(crate) struct Protocols {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    /// The bound on a request head, which bounds choosing the protocol too.
    header_read: Duration,
}

fn http_builder(s: &ServerConfig) -> Protocols {
    let header_read = s.header_read_timeout();
    let mut h1 = http1::Builder::new();
    h1.timer(TokioTimer::new())
        .header_read_timeout(header_read)
        .keep_alive(true)
        // A request head larger than this is 431, wherever the reads happen to split it
        // (the read buffer's cap alone is not exact: a read may complete a larger head).
        .max_header_size(s.max_header_bytes)
        .max_buf_size(s.max_header_bytes.max(8192));
    let keep_alive = s.http2_keep_alive();
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new())
        .max_concurrent_streams(s.http2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(s.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(keep_alive)
        .keep_alive_timeout(keep_alive)
        // What a stream may buffer beyond the peer's flow-control window: with the stream
        // cap, this bounds what a client that grants no credit can make the server hold.
        .max_send_buf_size(64 * 1024)
        // Rapid-reset guard: streams reset before they are accepted, and streams the
        // server had to reset for protocol errors, are bounded (then GOAWAY).
        .max_pending_accept_reset_streams(20)
        .max_local_error_reset_streams(1024);
    Protocols {
        h1,
        h2,
        header_read,
    }
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How a connection's protocol choice ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    Http1,
    Http2,
    /// The peer closed (or the socket failed) before a protocol could be chosen.
    Closed,
    /// The first bytes were a proper prefix of the HTTP/2 preface, and the rest did not
    /// come within the header read time-out.
    TimedOut,
}

/// Whether a connection speaks HTTP/2 (prior knowledge: it opens with the 24-byte preface
/// `PRI * HTTP/2.0…`), from its first bytes, *peeked*: hyper then reads the request from
/// the socket itself. (hyper-util's version sniffing reads 24 bytes and hands them back
/// first, which made hyper's HTTP/1 read buffer grow from 8 to 16 KiB on every
/// connection.) An HTTP/1 request never starts with `PRI`. While the bytes seen are a
/// proper prefix of the preface (`P`, `PR`, `PRI * HT`…) the choice waits for more — but
/// no longer than `header_read` from the first byte, the bound an HTTP/1 request head
/// gets from hyper; the first byte itself is bounded by the watchdog.
async fn choose_protocol(tcp: &TcpStream, activity: &Activity, header_read: Duration) -> Choice {
    let mut first = [0u8; PREFACE.len()];
    let mut seen = 0;
    let mut deadline = None;
    let mut pause = Duration::from_millis(2);
    loop {
        let n = match tcp.peek(&mut first).await {
            Ok(0) | Err(_) => return Choice::Closed,
            Ok(n) => n,
        };
        if n > seen {
            // Bytes came: from now on the idle timeout applies, not the first byte's.
            activity.read();
            seen = n;
        }
        let deadline = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + header_read);
        if !PREFACE.starts_with(&first[..n]) {
            // Not the preface: HTTP/1 — unless it starts like it (hyper's HTTP/2 side
            // then refuses the rest of it).
            return if first[..n].starts_with(b"PRI") {
                Choice::Http2
            } else {
                Choice::Http1
            };
        }
        if n == PREFACE.len() {
            return Choice::Http2;
        }
        // A proper prefix so far. The data is still there, so waiting for readiness would
        // return at once: look again shortly, backing off to 100 ms between looks.
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Choice::TimedOut;
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Connection slots: the permits, and whether they run short (see `conn::Pressure`).
struct Slots {
    permits: Arc<Semaphore>,
    max: usize,
    pressure: Pressure,
}

impl Slots {
    /// Pressure turns on below 10% free slots and off above 20% (hysteresis).
    fn update(&self) {
        let free = self.permits.available_permits();
        if free.saturating_mul(10) < self.max {
            self.pressure.set(true);
        } else if free.saturating_mul(5) > self.max {
            self.pressure.set(false);
        }
    }
}

/// What connections are told once the listener is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Serve,
    /// Finish what is in flight, take nothing new.
    Drain,
    /// The grace period is over: close now.
    Abort,
}

/// Accepts until told to stop, then shuts down; returns the writes that never became
/// durable (see [`Runtime::shutdown`]).
async fn accept_loop(listener: TcpListener, app: Arc<App>, mut stop: watch::Receiver<bool>) -> u64 {
    let config = app.runtime.config().clone();
    let s = &config.server;
    let max = connection_cap(s.max_connections);
    let slots = Arc::new(Slots {
        permits: Arc::new(Semaphore::new(max)),
        max,
        pressure: Pressure::default(),
    });
    let builder = Arc::new(http_builder(s));
    let limits = Timeouts {
        first_byte: s.first_byte_timeout(),
        idle: s.idle_timeout(),
        write: s.write_timeout(),
    };
    let (phase, phase_rx) = watch::channel(Phase::Serve);
    let metrics = &app.runtime.metrics().connections;
    const MIN_BACKOFF: Duration = Duration::from_millis(10);
    let mut backoff = MIN_BACKOFF;

    loop {
        // One permit per open connection; further connections wait in the kernel backlog.
        let permit = tokio::select! {
            () = stop_requested(&mut stop) => break,
            p = slots.permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (tcp, peer) = tokio::select! {
            () = stop_requested(&mut stop) => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => {
                    backoff = MIN_BACKOFF;
                    a
                }
                Err(e) => {
                    // EMFILE and friends: back off (up to 1 s) instead of spinning; the
                    // connection waits in the backlog. Logged once per streak.
                    metrics.accept_errors.fetch_add(1, Relaxed);
                    if backoff == MIN_BACKOFF {
                        tracing::warn!(error = %e, "accept failed; backing off");
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
        };
        slots.update();
        let _ = tcp.set_nodelay(true);
        tokio::spawn(
            serve_connection(
                tcp,
                app.clone(),
                builder.clone(),
                limits,
                slots.clone(),
                phase_rx.clone(),
                permit,
            )
            .instrument(tracing::debug_span!("conn", %peer)),
        );
    }
    drop(listener);

    let grace = s.shutdown_grace();
    tracing::info!(
        ?grace,
        "shutting down: canceling running tasks and draining connections"
    );
    let deadline = tokio::time::Instant::now() + grace;
    let unwritten = app.runtime.shutdown(grace).await;
    let _ = phase.send(Phase::Drain);
    let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let drained = tokio::time::timeout(
        remaining.max(Duration::from_millis(100)),
        slots.permits.acquire_many(all),
    )
    .await;
    if drained.is_err() {
        tracing::warn!("grace period over; closing remaining connections");
        let _ = phase.send(Phase::Abort);
        // Each connection closes as soon as it sees the phase; wait for them briefly.
        let _ = tokio::time::timeout(Duration::from_secs(1), slots.permits.acquire_many(all)).await;
    }
    unwritten
}

/// Serves one connection until it ends, its watchdog closes it, or shutdown does.
/// A cluster's nodes share their counters every heartbeat: the requests each let through
/// per (principal, agent) — every node charges the others' to its own token bucket, so
/// `requestsPerMinute` holds across the cluster within what the nodes accept during one
/// heartbeat before they hear of each other (docs/CLUSTER.md) — and each agent's card
/// counters, so every node's card shows the whole service.
async fn share_loop(app: Arc<App>) {
    const SEP: char = '\u{1}';
    let mut seen: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    let mut first = true;
    let agents: Vec<_> = app
        .runtime
        .agents
        .values()
        .map(|a| (a.index, a.config.id.clone()))
        .collect();
    let mut by_index: Vec<String> = vec![String::new(); agents.len()];
    for (i, id) in &agents {
        if let Some(slot) = by_index.get_mut(*i) {
            slot.clone_from(id);
        }
    }
    loop {
        let Some(tick) = app.runtime.cluster_tick() else {
            return;
        };
        tokio::time::sleep(tick).await;
        if app.runtime.is_shutting_down() {
            return;
        }
        let mut mine: Vec<(String, i64)> = Vec::new();
        let accepted = app.rate.accepted();
        for &(p, a, n) in &accepted {
            let key = format!("r{SEP}{}{SEP}{}", app.keys.principal_name(p), by_index[a]);
            mine.push((key, i64::try_from(n).unwrap_or(i64::MAX)));
        }
        for entry in app.runtime.agents.values() {
            for (i, v) in entry.metrics.raw().into_iter().enumerate() {
                let key = format!("c{SEP}{}{SEP}{i}", entry.config.id);
                mine.push((key, i64::try_from(v).unwrap_or(i64::MAX)));
            }
        }
        let Ok(others) = app.runtime.share(mine).await else {
            continue;
        };
        // Requests the other nodes let through since the last share: spent here too.
        for p in 0..app.keys.principals() {
            for (a, agent) in by_index.iter().enumerate() {
                let key = format!("r{SEP}{}{SEP}{agent}", app.keys.principal_name(p));
                let now = others.get(&key).copied().unwrap_or(0);
                let before = seen.insert(key, now).unwrap_or(0);
                if !first && now > before {
                    app.rate
                        .charge(p, a, u64::try_from(now - before).unwrap_or(0));
                }
            }
        }
        first = false;
        for entry in app.runtime.agents.values() {
            let mut sums = [0u64; 5];
            for (i, slot) in sums.iter_mut().enumerate() {
                let key = format!("c{SEP}{}{SEP}{i}", entry.config.id);
                *slot = u64::try_from(others.get(&key).copied().unwrap_or(0)).unwrap_or(0);
            }
            entry.metrics.set_others(sums);
        }
    }
}

async fn serve_connection(
    tcp: TcpStream,
    app: Arc<App>,
    builder: Arc<Protocols>,
    limits: Timeouts,
    slots: Arc<Slots>,
    mut phase: watch::Receiver<Phase>,
    permit: OwnedSemaphorePermit,
) {
    let metrics = &app.runtime.metrics().connections;
    metrics.accepted.fetch_add(1, Relaxed);
    metrics.open.fetch_add(1, Relaxed);
    let activity = Activity::new();
    let watchdog = conn::watchdog(&activity, limits, &slots.pressure);
    tokio::pin!(watchdog);
    let h2 = tokio::select! {
        choice = choose_protocol(&tcp, &activity, builder.header_read) => match choice {
            Choice::Http1 => Some(false),
            Choice::Http2 => Some(true),
            Choice::Closed => None,
            Choice::TimedOut => {
                metrics.closed_header.fetch_add(1, Relaxed);
                tracing::debug!("connection closed: an unfinished HTTP/2 preface");
                None
            }
        },
        why = watchdog.as_mut() => {
            let counter = match why {
                Closed::FirstByte => &metrics.closed_first_byte,
                Closed::WriteStalled => &metrics.closed_write_stalled,
                Closed::Idle => &metrics.closed_idle,
            };
            counter.fetch_add(1, Relaxed);
            None
        }
        _ = phase.wait_for(|p| *p >= Phase::Drain) => None,
    };
    if let Some(h2) = h2 {
        serve_protocol(tcp, h2, app.clone(), &builder, &activity, watchdog, phase).await;
    }
    metrics.open.fetch_sub(1, Relaxed);
    drop(permit);
    slots.update();
}

/// Serves a connection in the protocol it opened with until it ends, the watchdog closes
/// it, or the server drains.
async fn serve_protocol(
    tcp: TcpStream,
    h2: bool,
    app: Arc<App>,
    builder: &Protocols,
    activity: &Arc<Activity>,
    mut watchdog: Pin<&mut impl Future<Output = Closed>>,
    mut phase: watch::Receiver<Phase>,
) {
    let metrics = &app.runtime.metrics().connections;
    let io = TokioIo::new(Tracked::new(tcp, activity.clone()));
    let service = {
        let app = app.clone();
        let activity = activity.clone();
        service_fn(move |req| {
            // Counted from the request's start to the end of its response body.
            let guard = InFlight::new(&activity);
            let app = app.clone();
            async move {
                // Boxed: hyper keeps room for this future for the connection's whole
                // life, so it must stay small; the request's own state lives in the box
                // only while the request is handled (7.7 KB per held stream otherwise).
                let response = match Box::pin(http::handle(app, req)).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                };
                Ok::<_, Infallible>(response.map(|body| body.guarded(guard)))
            }
        })
    };
    let conn = if h2 {
        Either::Right(builder.h2.serve_connection(io, service))
    } else {
        Either::Left(builder.h1.serve_connection(io, service))
    };
    tokio::pin!(conn);
    macro_rules! graceful_shutdown {
        ($conn:expr) => {
            match $conn.as_pin_mut() {
                Either::Left(h1) => h1.graceful_shutdown(),
                Either::Right(h2) => h2.graceful_shutdown(),
            }
        };
    }
    enum Stop {
        Ended,
        Watchdog(Closed),
        Draining,
    }
    let stop = tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            Stop::Ended
        }
        why = watchdog.as_mut() => Stop::Watchdog(why),
        _ = phase.wait_for(|p| *p >= Phase::Drain) => Stop::Draining,
    };
    match stop {
        Stop::Ended => {}
        // A peer that does not read would not read a GOAWAY either: close at once.
        Stop::Watchdog(Closed::WriteStalled) => {
            metrics.closed_write_stalled.fetch_add(1, Relaxed);
            tracing::debug!("connection closed: a response write made no progress");
        }
        Stop::Watchdog(why) => {
            let counter = match why {
                Closed::FirstByte => &metrics.closed_first_byte,
                _ => &metrics.closed_idle,
            };
            counter.fetch_add(1, Relaxed);
            tracing::debug!(reason = why.label(), "connection closed");
            // Nothing is in flight: an HTTP/2 peer gets its GOAWAY, then the socket closes.
            graceful_shutdown!(conn.as_mut());
            let _ = tokio::time::timeout(Duration::from_secs(1), conn.as_mut()).await;
        }
        Stop::Draining => {
            graceful_shutdown!(conn.as_mut());
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = phase.wait_for(|p| *p >= Phase::Abort) => {}
            }
        }
    }
}

/// Resolves once `true` was sent (or the handle was dropped).
async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
