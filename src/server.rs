//! The server: bind, accept, serve connections, drain on shutdown.
//!
//! `Server::bind` validates nothing itself (the configuration is already validated) and
//! never panics on input; `ServerHandle::stop` starts the documented shutdown: stop
//! accepting, cancel running tasks with reason `shutdown` (their streams end with a final
//! event), let in-flight requests finish within the grace period, then close everything.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Config;
use crate::error::Result;
use crate::http::{Access, App};
use crate::runtime::{Runtime, RuntimeBuilder};

pub(crate) mod conn;
mod recycle;
mod serve;
mod tls;

use serve::accept_loop;
use tls::Tls;

/// A bound server, not yet serving.
///
/// ```
/// # async fn run() -> a2ad::Result<()> {
/// let mut config = a2ad::Config::default();
/// config.server.listen = "127.0.0.1:0".into(); // any free port
/// config.store = a2ad::config::StoreConfig::memory(); // the default keeps ./a2ad-data
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
    tls: Option<Arc<Tls>>,
}

/// A running server.
pub struct ServerHandle {
    addr: SocketAddr,
    /// Sending `true` starts the shutdown; dropped with the handle, which also stops.
    stop: watch::Sender<bool>,
    /// Resolves when the accept loop and the drain are done.
    done: tokio::task::JoinHandle<u64>,
    runtime: Runtime,
    tls: Option<Arc<Tls>>,
    /// What a reload swaps its callers in.
    app: Arc<App>,
    /// The development key printed at start, kept by a reload that configures no key.
    dev_key: Option<String>,
}

impl Server {
    /// Starts the actor system and binds the listener of `config.server.listen`
    /// (`Server::builder(config).build()`).
    ///
    /// # Errors
    /// As [`ServerBuilder::build`].
    pub async fn bind(config: Config) -> Result<Self> {
        Self::builder(config).build().await
    }

    /// What a start checks beyond [`Config::validated`] before it opens anything, without
    /// opening anything (`a2ad --check-config`): the TLS certificate, key and client CA
    /// files and the card-signing key are read and checked; the store's path is checked for
    /// access (an existing directory or file a2ad may read and write, or a place it may
    /// create one) — no store is opened and no lock taken, so it runs beside a server on
    /// the same file. `config` must be validated.
    ///
    /// # Errors
    /// [`crate::Error::Config`] naming the key, as a start would.
    pub fn check(config: &Config) -> Result<()> {
        if let Some(settings) = &config.server.tls {
            Tls::load(settings)?;
        }
        if let Some(settings) = &config.cards.signing {
            crate::rpc::a2a::card::CardSigner::load(settings)?;
        }
        if config.cluster.is_none() && config.store.backend != crate::config::StoreBackend::Memory {
            store_path_usable(std::path::Path::new(config.store.path()))
                .map_err(|m| crate::config::ConfigError::key("store.path", m))?;
        }
        Ok(())
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
    /// config.store = a2ad::config::StoreConfig::memory();
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
    pub fn builder(config: Config) -> ServerBuilder {
        ServerBuilder {
            runtime: Runtime::builder(Arc::new(config)),
            listener: None,
        }
    }

    async fn start(listener: TcpListener, runtime: RuntimeBuilder) -> Result<Self> {
        let config = runtime.config().clone();
        // The certificate files first: a bad one refuses the start before anything runs.
        let tls = match &config.server.tls {
            Some(settings) => Some(Arc::new(Tls::load(settings)?)),
            None => None,
        };
        let card_signer = match &config.cards.signing {
            Some(settings) => Some(Arc::new(crate::rpc::a2a::card::CardSigner::load(settings)?)),
            None => None,
        };
        let (access, dev_key) = Access::from_config(&config, None);
        let runtime = runtime.start().await?;
        // Said once the store is open (a store that refuses the start says only that).
        let durable =
            config.cluster.is_some() || config.store.backend != crate::config::StoreBackend::Memory;
        // A note for a configured, durable deployment; nothing on the built-in development
        // configuration (no keys configured), whose newcomer has nothing to act on.
        let configured = !config.api_keys.is_empty() || !config.auth.oidc.is_empty();
        if durable && configured && config.secrets.resolve().is_ok_and(|k| k.current.is_none()) {
            tracing::info!(
                "note: no [secrets] key (or A2AD_SECRETS_KEY): push-configuration secrets, tokens and header values are stored in clear (docs/CONFIG.md, [secrets])"
            );
        }
        let s = &config.server;
        let local_addr = listener.local_addr()?;
        let app = Arc::new(App {
            runtime,
            access: crate::swap::Swap::new(access),
            reloads: Default::default(),
            requests: Default::default(),
            max_body: config.max_body_bytes(),
            bodies: crate::http::budget::BodyBudget::new(config.max_buffered_body_bytes()),
            connection_bodies: config.max_buffered_body_bytes_per_connection(),
            body_timeout: s.body_read_timeout(),
            ping_every: s.ping_interval(),
            local_addr,
            https: tls.is_some(),
            card_signer,
            started: chrono::Utc::now(),
            ui: config.ui.enabled,
        });
        Ok(Self {
            listener,
            app,
            dev_key,
            tls,
        })
    }

    /// The bound address (with the real port when port 0 was asked).
    ///
    /// # Errors
    /// When the socket cannot report its address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// `https` when the listener speaks TLS (`[server.tls]`), else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// Whether the inspector is served at `/ui/` (`[ui] enabled` and a build with the `ui`
    /// feature).
    pub fn serves_ui(&self) -> bool {
        self.app.ui && crate::http::UI_BUILT
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
        if let Some(tls) = &self.tls {
            tokio::spawn(reload_loop(tls.clone(), stopped.clone()));
        }
        prefetch_issuers(&self.app);
        let done = tokio::spawn(accept_loop(
            self.listener,
            self.app.clone(),
            self.tls.clone(),
            stopped,
        ));
        Ok(ServerHandle {
            addr,
            stop,
            done,
            runtime,
            tls: self.tls,
            app: self.app,
            dev_key: self.dev_key,
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
pub struct ServerBuilder {
    runtime: RuntimeBuilder,
    listener: Option<TcpListener>,
}

impl ServerBuilder {
    /// Serves the agent `id` (one of the configuration's agents) with this backend instead
    /// of the one its configuration names.
    #[must_use]
    pub fn agent(mut self, id: &str, backend: impl crate::Agent) -> Self {
        self.runtime = self.runtime.agent(id, backend);
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
        let listener = match self.listener {
            Some(listener) => listener,
            None => {
                let config = self.runtime.config();
                listen(config.listen_addr()?, config.server.listen_backlog)?
            }
        };
        Server::start(listener, self.runtime).await
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

    /// Checks the TLS certificate, key and client CA files now (as SIGHUP does) instead of
    /// at the next `server.tls.reload_check_seconds`: changed files that load are served to
    /// new connections. Nothing happens without `[server.tls]`.
    pub async fn reload_tls(&self) {
        if let Some(tls) = self.tls.clone() {
            let _ = tokio::task::spawn_blocking(move || tls.reload_logged()).await;
        }
    }

    /// Puts the reloadable sections of `config` (a checked one: [`Config::validated`]) in
    /// force, as SIGHUP does (docs/CONFIG.md, "Reloading the configuration"): its
    /// `[[agents]]` and `[webhooks]` ([`Runtime::reload`]; a new or changed `a2a` agent gets
    /// a new upstream client), then its callers ([`ServerHandle::reload_access`]). Every
    /// other setting keeps its running value.
    pub fn reload(&self, config: &Config) {
        let backends = crate::rpc::a2a_backends(config, |id, agent| {
            self.runtime
                .agent(&crate::model::AgentId::new(id))
                .is_none_or(|running| running.config != *agent)
        });
        self.runtime.reload(config, backends);
        self.reload_access(config);
    }

    /// Puts the callers of `config` — `[[api_keys]]` and `[auth]` (client certificates,
    /// OIDC issuers) — in force for the requests that start from now on (a request under
    /// way keeps the ones it started with). The rate buckets start full. Without a key
    /// or certificate configured, the development key printed at start stays.
    pub fn reload_access(&self, config: &Config) {
        let (access, _) = Access::from_config(config, self.dev_key.as_deref());
        self.app.access.set(access);
        prefetch_issuers(&self.app);
    }

    /// Counts a configuration reload in `a2ad_config_reloads_total`: applied (`ok`) or
    /// refused (`error`).
    pub fn count_reload(&self, ok: bool) {
        self.app.reloads[usize::from(!ok)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

/// Fetches the OIDC issuers' keys in the background, before the first token needs them.
fn prefetch_issuers(app: &Arc<App>) {
    let access = app.access.now();
    if access.keys.oidc().is_some() {
        tokio::spawn(async move {
            if let Some(oidc) = access.keys.oidc() {
                oidc.prefetch().await;
            }
        });
    }
}

/// Checks the TLS files every `reload_check_seconds` until the server stops (the files
/// are read on a blocking thread: the check is file I/O).
async fn reload_loop(tls: Arc<Tls>, mut stop: watch::Receiver<bool>) {
    let every = tls.reload_check();
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = serve::stop_requested(&mut stop) => return,
        }
        let tls = tls.clone();
        let _ = tokio::task::spawn_blocking(move || tls.reload_logged()).await;
    }
}

/// Whether a2ad may use `path` for its store: read and write it when it exists, else
/// create it in its nearest existing directory.
fn store_path_usable(path: &std::path::Path) -> std::result::Result<(), String> {
    use rustix::fs::Access;
    let shown = path.display();
    if path.exists() {
        let need = if path.is_dir() {
            Access::READ_OK | Access::WRITE_OK | Access::EXEC_OK
        } else {
            Access::READ_OK | Access::WRITE_OK
        };
        return rustix::fs::access(path, need)
            .map_err(|e| format!("{shown} cannot be read and written by this user ({e})"));
    }
    let mut dir = path.parent();
    while let Some(d) = dir {
        let d = if d.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            d
        };
        if d.exists() {
            if !d.is_dir() {
                return Err(format!("{} is not a directory", d.display()));
            }
            return rustix::fs::access(d, Access::WRITE_OK | Access::EXEC_OK).map_err(|e| {
                format!(
                    "{shown} does not exist and cannot be created in {} ({e})",
                    d.display()
                )
            });
        }
        dir = d.parent();
    }
    Err(format!("{shown} has no existing directory above it"))
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
        // A note: only connections actually held up by it are a warning (`accept_loop`).
        tracing::info!(
            configured,
            allowed = fit,
            open_file_limit = limit,
            "server.max_connections lowered to fit the open-file limit (raise `ulimit -n` to allow more)"
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
    loop {
        let Some(tick) = app.runtime.cluster_tick() else {
            return;
        };
        // The agents in force this round (a reload may change them), by index.
        let agents = app.runtime.agents.now();
        let mut by_index: Vec<String> = vec![String::new(); agents.len()];
        for a in agents.values() {
            if let Some(slot) = by_index.get_mut(a.index) {
                slot.clone_from(&a.config.id);
            }
        }
        tokio::time::sleep(tick).await;
        if app.runtime.is_shutting_down() {
            return;
        }
        let mut mine: Vec<(String, i64)> = Vec::new();
        let access = app.access.now();
        let accepted = access.rate.accepted();
        for &(p, a, n) in &accepted {
            let key = format!(
                "r{SEP}{}{SEP}{}",
                access.keys.principal_name(p),
                by_index[a]
            );
            mine.push((key, i64::try_from(n).unwrap_or(i64::MAX)));
        }
        for entry in agents.values() {
            for (i, v) in entry.metrics.raw().into_iter().enumerate() {
                let key = format!("c{SEP}{}{SEP}{i}", entry.config.id);
                mine.push((key, i64::try_from(v).unwrap_or(i64::MAX)));
            }
        }
        let Ok(others) = app.runtime.share(mine).await else {
            continue;
        };
        // Requests the other nodes let through since the last share: spent here too.
        for p in 0..access.keys.principals() {
            for (a, agent) in by_index.iter().enumerate() {
                let key = format!("r{SEP}{}{SEP}{agent}", access.keys.principal_name(p));
                let now = others.get(&key).copied().unwrap_or(0);
                let before = seen.insert(key, now).unwrap_or(0);
                if !first && now > before {
                    access
                        .rate
                        .charge(p, a, u64::try_from(now - before).unwrap_or(0));
                }
            }
        }
        first = false;
        for entry in agents.values() {
            let mut sums = [0u64; 5];
            for (i, slot) in sums.iter_mut().enumerate() {
                let key = format!("c{SEP}{}{SEP}{i}", entry.config.id);
                *slot = u64::try_from(others.get(&key).copied().unwrap_or(0)).unwrap_or(0);
            }
            entry.metrics.set_others(sums);
        }
    }
}
