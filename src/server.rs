//! The server: bind, accept, serve connections, drain on shutdown.
//!
//! `Server::bind` validates nothing itself (the configuration is already validated) and
//! never panics on input; `ServerHandle::stop` starts the documented shutdown: stop
//! accepting, cancel running tasks with reason `shutdown` (their streams end with a final
//! event), let in-flight requests finish within the grace period, then close everything.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tracing::Instrument as _;

use crate::actors::Runtime;
use crate::auth::KeyStore;
use crate::config::Config;
use crate::error::Result;
use crate::http::{self, App};
use crate::limits::RateLimiter;

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
    done: tokio::task::JoinHandle<()>,
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
        let config = Arc::new(config);
        let (keys, dev_key) = KeyStore::from_config(&config);
        let per_minute: Vec<u64> = config
            .agents
            .iter()
            .map(|a| a.limits.requests_per_minute)
            .collect();
        let rate = RateLimiter::new(keys.principals(), &per_minute);
        let runtime = Runtime::start_with(config.clone(), backends).await?;
        let s = &config.server;
        let app = Arc::new(App {
            runtime,
            keys,
            rate,
            max_body: config.max_body_bytes(),
            body_timeout: Duration::from_secs_f64(s.body_read_timeout_seconds),
            ping_every: Duration::from_secs_f64(s.ping_interval_seconds),
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
        let done = tokio::spawn(accept_loop(self.listener, self.app, stopped));
        Ok(ServerHandle {
            addr,
            stop,
            done,
            runtime,
        })
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

    /// Waits until the server has stopped (after [`ServerHandle::stop`]).
    pub async fn stopped(self) {
        let _ = self.done.await;
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

async fn accept_loop(listener: TcpListener, app: Arc<App>, mut stop: watch::Receiver<bool>) {
    let config = app.runtime.config().clone();
    let s = &config.server;
    // One permit per open connection; further connections wait in the kernel backlog.
    let permits = Arc::new(Semaphore::new(s.max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs_f64(s.header_read_timeout_seconds))
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());

    loop {
        let permit = tokio::select! {
            () = stop_requested(&mut stop) => break,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (tcp, peer) = tokio::select! {
            () = stop_requested(&mut stop) => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let service = service_fn(move |req| http::handle(app.clone(), req));
        let conn = builder.serve_connection(TokioIo::new(tcp), service);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(
            async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                drop(permit);
            }
            .instrument(tracing::debug_span!("conn", %peer)),
        );
    }
    drop(listener);

    let grace = Duration::from_secs_f64(s.shutdown_grace_seconds);
    tracing::info!(
        ?grace,
        "shutting down: canceling running tasks and draining connections"
    );
    let deadline = tokio::time::Instant::now() + grace;
    app.runtime.shutdown(grace).await;
    let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
    if tokio::time::timeout(
        remaining.max(Duration::from_millis(100)),
        graceful.shutdown(),
    )
    .await
    .is_err()
    {
        tracing::warn!("grace period over; closing remaining connections");
    }
}

/// Resolves once `true` was sent (or the handle was dropped).
async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
