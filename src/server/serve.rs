//! Serving connections: the HTTP/1.1 and HTTP/2 builders, the protocol a connection
//! chooses by its first bytes, the accept loop with its connection slots, and the drain.

use std::convert::Infallible;
use std::future::Future;
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

use crate::auth::PeerCertificate;
use crate::config::ServerConfig;
use crate::http::{self, App};

use super::conn::{self, Activity, Closed, Guarded, InFlight, Pressure, Timeouts, Tracked};
use super::connection_cap;
use super::recycle;
use super::tls::Tls;

/// hyper's connection settings: HTTP/1.1 and HTTP/2 (prior knowledge), each with its
/// bounds. A connection's first bytes pick one ([`choose_protocol`]).
pub(crate) struct Protocols {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    /// The bound on a request head, which bounds choosing the protocol too.
    header_read: Duration,
}

pub(super) fn http_builder(s: &ServerConfig) -> Protocols {
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
pub(super) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How a connection's protocol choice ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Choice {
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
pub(super) async fn choose_protocol(
    tcp: &TcpStream,
    activity: &Activity,
    header_read: Duration,
) -> Choice {
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
pub(super) struct Slots {
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

/// What every connection of a listener shares.
pub(super) struct Listener {
    app: Arc<App>,
    protocols: Protocols,
    tls: Option<Arc<Tls>>,
    limits: Timeouts,
    slots: Slots,
}

/// What connections are told once the listener is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Phase {
    Serve,
    /// Finish what is in flight, take nothing new.
    Drain,
    /// The grace period is over: close now.
    Abort,
}

/// Accepts until told to stop, then shuts down; returns the writes that never became
/// durable (see [`Runtime::shutdown`]).
pub(super) async fn accept_loop(
    listener: TcpListener,
    app: Arc<App>,
    tls: Option<Arc<Tls>>,
    mut stop: watch::Receiver<bool>,
) -> u64 {
    let config = app.runtime.config().clone();
    let s = &config.server;
    let max = connection_cap(s.max_connections);
    let shared = Arc::new(Listener {
        app: app.clone(),
        protocols: http_builder(s),
        tls,
        limits: Timeouts {
            first_byte: s.first_byte_timeout(),
            idle: s.idle_timeout(),
            write: s.write_timeout(),
        },
        slots: Slots {
            permits: Arc::new(Semaphore::new(max)),
            max,
            pressure: Pressure::default(),
        },
    });
    let slots = &shared.slots;
    let (phase, phase_rx) = watch::channel(Phase::Serve);
    let metrics = &app.runtime.metrics().connections;
    const MIN_BACKOFF: Duration = Duration::from_millis(10);
    let mut backoff = MIN_BACKOFF;
    // `max_connections` lowered to fit the open-file limit: warned when it holds
    // connections up (every permit taken), once per streak.
    let lowered = max < s.max_connections;
    let mut full = false;

    loop {
        if lowered {
            let now_full = slots.permits.available_permits() == 0;
            if now_full && !full {
                tracing::warn!(
                    connections = max,
                    configured = s.max_connections,
                    "every connection slot is in use; new connections wait: server.max_connections was lowered to fit the open-file limit — raise `ulimit -n` to allow more"
                );
            }
            full = now_full;
        }
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
            serve_connection(tcp, shared.clone(), phase_rx.clone(), permit)
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

pub(super) async fn serve_connection(
    tcp: TcpStream,
    shared: Arc<Listener>,
    mut phase: watch::Receiver<Phase>,
    permit: OwnedSemaphorePermit,
) {
    let Listener {
        app,
        protocols: builder,
        tls,
        limits,
        slots,
    } = &*shared;
    let limits = *limits;
    let metrics = &app.runtime.metrics().connections;
    metrics.accepted.fetch_add(1, Relaxed);
    metrics.open.fetch_add(1, Relaxed);
    let activity = Activity::new();
    let watchdog = conn::watchdog(&activity, limits, &slots.pressure);
    tokio::pin!(watchdog);
    // Each branch awaits a future of its own type, and this future keeps room for the
    // largest: the TLS branch (the handshake's and the TLS stream's state) is boxed, so that
    // a plain connection does not carry its room for its whole life (see `serve_protocol`).
    if let Some(tls) = tls {
        Box::pin(async {
            // The handshake as a whole is bounded like a request head after its first byte
            // (the watchdog bounds the wait for that byte).
            let handshake = tokio::time::timeout(
                limits.first_byte + builder.header_read,
                tls.acceptor()
                    .accept(Tracked::new(tcp, activity.clone(), true)),
            );
            let handshake = async {
                match handshake.await {
                    Ok(Ok(stream)) => Some(stream),
                    Ok(Err(e)) => {
                        metrics.closed_tls_handshake.fetch_add(1, Relaxed);
                        tracing::debug!(error = %e, "connection closed: TLS handshake failed");
                        None
                    }
                    Err(_) => {
                        metrics.closed_tls_handshake.fetch_add(1, Relaxed);
                        tracing::debug!("connection closed: TLS handshake too slow");
                        None
                    }
                }
            };
            let stream = opening(handshake, watchdog.as_mut(), &mut phase, metrics).await;
            if let Some(stream) = stream {
                let session = stream.get_ref().1;
                // ALPN decides; a client that offers none speaks HTTP/1.1.
                let h2 = session.alpn_protocol() == Some(b"h2");
                let peer = session
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(|leaf| app.access.now().keys.certificate_caller(leaf))
                    .map(PeerCertificate);
                let io = TokioIo::new(stream);
                serve_protocol(io, h2, peer, &shared, &activity, watchdog, phase).await;
            }
        })
        .await;
    } else {
        let choice = async {
            match choose_protocol(&tcp, &activity, builder.header_read).await {
                Choice::Http1 => Some(false),
                Choice::Http2 => Some(true),
                Choice::Closed => None,
                Choice::TimedOut => {
                    metrics.closed_header.fetch_add(1, Relaxed);
                    tracing::debug!("connection closed: an unfinished HTTP/2 preface");
                    None
                }
            }
        };
        let h2 = opening(choice, watchdog.as_mut(), &mut phase, metrics).await;
        if let Some(h2) = h2 {
            let io = TokioIo::new(Tracked::new(tcp, activity.clone(), !h2));
            serve_protocol(io, h2, None, &shared, &activity, watchdog, phase).await;
        }
    }
    metrics.open.fetch_sub(1, Relaxed);
    drop(permit);
    slots.update();
}

/// A connection's opening (the TLS handshake, the protocol choice), unless the watchdog
/// closes the connection (counted by its reason) or the server drains first.
async fn opening<T>(
    open: impl Future<Output = Option<T>>,
    watchdog: Pin<&mut impl Future<Output = Closed>>,
    phase: &mut watch::Receiver<Phase>,
    metrics: &crate::metrics::ConnectionMetrics,
) -> Option<T> {
    tokio::select! {
        opened = open => opened,
        why = watchdog => {
            let counter = match why {
                Closed::FirstByte => &metrics.closed_first_byte,
                Closed::WriteStalled => &metrics.closed_write_stalled,
                Closed::Idle => &metrics.closed_idle,
            };
            counter.fetch_add(1, Relaxed);
            None
        }
        _ = phase.wait_for(|p| *p >= Phase::Drain) => None,
    }
}

/// Serves a connection in the protocol it opened with until it ends, the watchdog closes
/// it, or the server drains. `peer`: the connection's client certificate, when it is a
/// principal, handed to each request.
pub(super) async fn serve_protocol<I>(
    io: TokioIo<I>,
    h2: bool,
    peer: Option<PeerCertificate>,
    shared: &Listener,
    activity: &Arc<Activity>,
    mut watchdog: Pin<&mut impl Future<Output = Closed>>,
    mut phase: watch::Receiver<Phase>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (app, builder) = (&shared.app, &shared.protocols);
    let metrics = &app.runtime.metrics().connections;
    // An HTTP/2 connection's streams share a bound on the body bytes they hold
    // (http/budget.rs); an HTTP/1 connection reads one body at a time.
    let bodies = h2.then(|| http::budget::BodyBudget::new(app.connection_bodies));
    let service = {
        let app = app.clone();
        let activity = activity.clone();
        service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            // Counted from the request's start to the end of its response body.
            let guard = InFlight::new(&activity);
            if let Some(peer) = &peer {
                req.extensions_mut().insert(peer.clone());
            }
            if let Some(bodies) = &bodies {
                req.extensions_mut().insert(bodies.clone());
            }
            let app = app.clone();
            async move {
                // Boxed: hyper keeps room for this future for the connection's whole
                // life, so it must stay small; the request's own state lives in the box
                // only while the request is handled (7.7 KB per held stream otherwise).
                // The box is the worker's to reuse for its next request (recycle.rs).
                let response = match recycle::boxed(|| http::handle(app, req)).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                };
                Ok::<_, Infallible>(response.map(|body| Guarded::new(body, guard)))
            }
        })
    };
    // HTTP/2's connection is boxed: inline, every HTTP/1 connection (a held stream each)
    // would keep room for its state for its whole life.
    let conn = if h2 {
        Either::Right(Box::pin(builder.h2.serve_connection(io, service)))
    } else {
        Either::Left(builder.h1.serve_connection(io, service))
    };
    tokio::pin!(conn);
    macro_rules! graceful_shutdown {
        ($conn:expr) => {
            match $conn.as_pin_mut() {
                Either::Left(h1) => h1.graceful_shutdown(),
                Either::Right(h2) => h2.get_mut().as_mut().graceful_shutdown(),
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
pub(super) async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
