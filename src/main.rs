//! The `a2ad` binary: parse the command line, load and validate the configuration
//! (exit 2 on a bad one, before anything binds), serve, and drain on SIGINT/SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;

use a2ad::{Config, Server};
use clap::Parser;

/// mimalloc: faster than glibc's allocator for this many small, short-lived allocations,
/// and it returns freed memory to the system (docs/decisions/the-allocator.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// An Agent-to-Agent (A2A) JSON-RPC server.
///
/// With no arguments it serves the built-in configuration: one agent `echo` (the echo
/// backend) on 127.0.0.1:8080, with a random development API key printed once at
/// start-up. It prints `listening on http://HOST:PORT` (`https://` with `[server.tls]`)
/// with the real bound port; SIGHUP checks the TLS files at once.
/// SIGINT or SIGTERM stops accepting, cancels running tasks (reason "shutdown"), lets
/// in-flight requests finish within `server.shutdown_grace_seconds`, and exits 0.
/// A bad configuration file prints what is wrong (file, key) and exits 2.
#[derive(Parser, Debug)]
#[command(name = "a2ad", version)]
struct Cli {
    /// Serve the configuration in this TOML file (see docs/CONFIG.md).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Override `server.listen`, e.g. 127.0.0.1:0 (port 0 picks a free port).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Load and check FILE as a start would (TLS, key and certificate files read, the store
    /// path's access), print `ok` (exit 0) or the error (exit 2), and start nothing: no
    /// store is opened, no port bound. Safe beside a server running on the same file.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
    /// Start even though some records of the store file cannot be read: copy them to
    /// `<store>.damaged-<time>.jsonl` beside it, remove them from the store, and serve the
    /// rest (without this, such a file refuses the start with exit status 2).
    #[arg(long)]
    set_aside_damaged: bool,
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    if let Some(file) = &cli.check_config {
        return match checked(file).map(drop) {
            Ok(()) => {
                println!("ok");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("a2ad: {e}");
                ExitCode::from(2)
            }
        };
    }
    let config_path = cli.config.clone();
    let config = match load(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("a2ad: {e}");
            return ExitCode::from(2);
        }
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .enable_all()
        .on_thread_park(a2ad::store_runtime_parked);
    // 0 keeps tokio's adaptive interval (docs/CONFIG.md, `server.global_queue_interval`).
    if config.server.global_queue_interval > 0 {
        builder.global_queue_interval(config.server.global_queue_interval);
    }
    let runtime = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("a2ad: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(serve(config, config_path))
}

/// mimalloc reads its options from the environment once, at start-up. Two differ from its
/// defaults (docs/decisions/the-allocator.md):
///
/// - `MIMALLOC_PURGE_DELAY=0`: freed memory goes back to the system at once rather than on
///   some later allocation, so that RSS falls back after a burst;
/// - `MIMALLOC_ALLOW_THP=0`: no transparent huge pages. mimalloc asks for them on its arenas,
///   and the first touch of each 2 MiB page then clears all of it inside one request's
///   turn on a worker — ~4.4 ms on the reference machine, which was the whole of the
///   bimodal tail (p99 5.4 ms against p50 0.8 at 32 connections; 1.3–1.8 ms without).
///
/// Setting a variable for our own process would need `unsafe` (`std::env::set_var`), so the
/// process replaces itself once with the variables set: same pid, arguments and
/// descriptors. An operator's own setting wins; if the exec fails, a2ad simply runs with
/// mimalloc's defaults.
fn tune_allocator() {
    const OPTIONS: [(&str, &str); 2] = [("MIMALLOC_PURGE_DELAY", "0"), ("MIMALLOC_ALLOW_THP", "0")];
    #[cfg(unix)]
    {
        let unset: Vec<_> = OPTIONS
            .iter()
            .filter(|(name, _)| std::env::var_os(name).is_none())
            .collect();
        if unset.is_empty() {
            return;
        }
        if let Ok(exe) = std::env::current_exe() {
            use std::os::unix::process::CommandExt as _;
            let mut command = std::process::Command::new(exe);
            command.args(std::env::args_os().skip(1));
            for (name, value) in unset {
                command.env(name, value);
            }
            let err = command.exec();
            eprintln!("a2ad: note: running with mimalloc's default options ({err})");
        }
    }
}

/// The command line and the configuration it names, checked — before the runtime, which
/// the configuration shapes.
fn load(cli: Cli) -> Result<Config, a2ad::config::ConfigError> {
    let loaded = match &cli.config {
        Some(path) => Config::load(path),
        None => Ok(Config::default()),
    };
    loaded.and_then(|mut c| {
        if let Some(listen) = cli.listen {
            c.server.listen = listen;
        }
        c.store.set_aside_damaged = cli.set_aside_damaged;
        c.validated().map_err(|mut e| {
            e.file = cli.config.as_ref().map(|p| p.display().to_string());
            e
        })
    })
}

async fn serve(config: Config, config_path: Option<PathBuf>) -> ExitCode {
    // Logs to stderr (`RUST_LOG`), and — with `[telemetry] otlp_endpoint` — the trace
    // spans to the collector (docs/CONFIG.md): each layer with its own filter.
    let telemetry = match a2ad::telemetry::Telemetry::start(&config.telemetry) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("a2ad: configuration error: key `telemetry.otlp_endpoint`: {e}");
            return ExitCode::from(2);
        }
    };
    {
        use std::io::IsTerminal as _;
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        // `RUST_LOG` wins over `[log] level` (checked with the configuration), else `info`.
        let filter = std::env::var("RUST_LOG")
            .ok()
            .and_then(|spec| a2ad::telemetry::log_filter(&spec).ok())
            .or_else(|| {
                a2ad::telemetry::log_filter(config.log.level.as_deref().unwrap_or("info")).ok()
            })
            .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"));
        // Colour only on a terminal, and never with `NO_COLOR` set (no-color.org).
        let colour = std::io::stderr().is_terminal()
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        let logs = match config.log.format {
            a2ad::config::LogFormat::Text => tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(colour)
                .with_filter(filter)
                .boxed(),
            a2ad::config::LogFormat::Json => tracing_subscriber::fmt::layer()
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .with_writer(std::io::stderr)
                .with_filter(filter)
                .boxed(),
        };
        // No `Option` layer for telemetry that is off: a `None` layer answers every
        // callsite "always", so that every span the log filter's level lets through would
        // be made, and entered at each poll, for no one (+5.6k instructions a request at
        // `info`; docs/decisions/the-default-log-filter.md).
        let registry = tracing_subscriber::registry().with(logs);
        match telemetry.as_ref() {
            Some(t) => registry.with(t.layer()).init(),
            None => registry.init(),
        }
    }
    let grace = config.server.shutdown_grace();
    let (code, signalled) = run(config, config_path).await;
    if let Some(t) = telemetry {
        // The last spans go out before the process ends, within what is left of the
        // grace: a collector that never answers does not hold the exit (the exporter's
        // thread is left behind, and ends with the process).
        let left = signalled.map_or(grace, |at| grace.saturating_sub(at.elapsed()));
        if !t.shutdown_within(left) {
            tracing::warn!(
                waited_ms = left.as_millis() as u64,
                "the last trace spans were not sent within the shutdown grace; exiting without them"
            );
        }
    }
    code
}

/// Serves until a signal; the exit code and when the signal came (`None`: the start
/// failed).
async fn run(
    config: a2ad::Config,
    config_path: Option<PathBuf>,
) -> (ExitCode, Option<std::time::Instant>) {
    // The file as the server starts with it: what a setting that needs a restart stays.
    let reloader = config_path.and_then(Reloader::new);
    raise_open_file_limit();
    let store = match (&config.cluster, config.store.backend) {
        (Some(c), _) => format!(
            "postgres schema {} (cluster node {})",
            c.schema,
            c.node_id.as_deref().unwrap_or("with a generated id")
        ),
        (None, a2ad::config::StoreBackend::Redb) => format!("{} (redb)", config.store.path()),
        (None, a2ad::config::StoreBackend::Log) => format!("{} (log)", config.store.path()),
        (None, a2ad::config::StoreBackend::Memory) => {
            "memory (nothing is kept across restarts)".to_string()
        }
    };
    let server = match Server::bind(config).await {
        Ok(s) => s,
        Err(e @ (a2ad::Error::Store { .. } | a2ad::Error::Config(_))) => {
            eprintln!("a2ad: {e}");
            return (ExitCode::from(2), None);
        }
        Err(e) => {
            eprintln!("a2ad: cannot start: {e}");
            return (ExitCode::from(1), None);
        }
    };
    let addr = match server.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("a2ad: {e}");
            return (ExitCode::from(1), None);
        }
    };
    // The signals are ours before the address is printed: a script that stops the server
    // as soon as it reads the address must not kill it before it can drain.
    let signals = Signals::install();
    if let Some(key) = server.dev_key() {
        println!("development API key (principal \"dev\", all agents): {key}");
    }
    println!("store: {store}");
    println!("listening on {}://{addr}", server.scheme());
    if server.serves_ui() {
        println!("inspector: {}://{addr}/ui/", server.scheme());
    }
    let handle = match server.serve() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("a2ad: {e}");
            return (ExitCode::from(1), None);
        }
    };
    signals.shutdown(&handle, reloader.as_ref()).await;
    let signalled = Some(std::time::Instant::now());
    tracing::info!("signal received; shutting down");
    handle.stop();
    let unwritten = handle.stopped().await;
    if unwritten > 0 {
        tracing::error!(
            writes = unwritten,
            "stopped with writes that never became durable (the store kept failing until the shutdown grace ran out); clients were never told about them"
        );
        eprintln!(
            "a2ad: {unwritten} write(s) never became durable: the store kept failing until the shutdown grace ran out"
        );
        return (ExitCode::from(1), signalled);
    }
    (ExitCode::SUCCESS, signalled)
}

/// Raises the soft open-file limit to the hard one, as servers do: every connection is a
/// descriptor. `server.max_connections` is then lowered to what the limit allows.
fn raise_open_file_limit() {
    #[cfg(unix)]
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::warn!(error = %e, "cannot raise the open-file limit");
    }
}

/// SIGINT, SIGTERM and SIGHUP, handled from the moment they are installed.
struct Signals {
    #[cfg(unix)]
    unix: Option<(
        tokio::signal::unix::Signal,
        tokio::signal::unix::Signal,
        Option<tokio::signal::unix::Signal>,
    )>,
}

impl Signals {
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let unix = match (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) {
                (Ok(int), Ok(term)) => Some((int, term, signal(SignalKind::hangup()).ok())),
                _ => None,
            };
            Self { unix }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Waits for SIGINT or SIGTERM; meanwhile each SIGHUP checks the TLS files at once and
    /// reloads the `--config` file.
    async fn shutdown(self, handle: &a2ad::ServerHandle, reloader: Option<&Reloader>) {
        #[cfg(unix)]
        if let Some((mut int, mut term, mut hup)) = self.unix {
            loop {
                tokio::select! {
                    _ = int.recv() => return,
                    _ = term.recv() => return,
                    Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => {
                        tracing::info!("SIGHUP: checking the TLS files");
                        handle.reload_tls().await;
                        if let Some(r) = reloader {
                            r.reload(handle);
                        }
                    }
                }
            }
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `file` loaded and checked as a start would (`--check-config`, a reload): every key,
/// then the files it names (`Server::check`); an error names the file.
fn checked(file: &std::path::Path) -> Result<Config, a2ad::Error> {
    let name = || file.display().to_string();
    Config::load(file)
        .and_then(|c| c.validated())
        .map_err(a2ad::Error::Config)
        .and_then(|c| Server::check(&c).map(|()| c))
        .map_err(|e| match e {
            a2ad::Error::Config(mut ce) => {
                ce.file.get_or_insert_with(name);
                a2ad::Error::Config(ce)
            }
            other => other,
        })
}

/// SIGHUP's re-reading of `--config` (docs/CONFIG.md, "Reloading the configuration").
struct Reloader {
    path: PathBuf,
    /// The file as the server started with it: the running value of every setting that
    /// needs a restart.
    running: toml::Table,
}

/// The settings a reload puts in force (with everything under them), but
/// [`NOT_RELOADED`].
const RELOADED: [&str; 4] = ["api_keys", "auth", "agents", "webhooks"];
/// The settings under [`RELOADED`] that still need a restart.
const NOT_RELOADED: [&str; 1] = ["webhooks.workers"];

impl Reloader {
    fn new(path: PathBuf) -> Option<Self> {
        let running = std::fs::read_to_string(&path).ok()?.parse().ok()?;
        Some(Self { path, running })
    }

    /// Reads and checks the file; a file that does not load or check changes nothing
    /// (logged naming the file and the key, counted `error`). Otherwise its callers are
    /// put in force, and every other setting that changed is logged as needing a restart.
    fn reload(&self, handle: &a2ad::ServerHandle) {
        let file = self.path.display().to_string();
        let config = match checked(&self.path) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(file = %file, error = %e, "the configuration was not reloaded; the running one stays");
                handle.count_reload(false);
                return;
            }
        };
        // The file as it checked (read again: what it says, setting by setting).
        let table: toml::Table = std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or_default();
        let mut changed = Vec::new();
        changed_keys("", &self.running, &table, &mut changed);
        for setting in changed.iter().filter(|k| !reloaded(k)) {
            tracing::warn!(setting = %setting, "needs a restart: the running value stays");
        }
        handle.reload(&config);
        handle.count_reload(true);
        tracing::info!(file = %file, agents = config.agents.len(), "configuration reloaded");
    }
}

/// Whether a reload puts `key` (a dotted path) in force.
fn reloaded(key: &str) -> bool {
    let under = |r: &str| {
        key == r
            || key
                .strip_prefix(r)
                .is_some_and(|rest| rest.starts_with('.'))
    };
    RELOADED.iter().any(|r| under(r)) && !NOT_RELOADED.iter().any(|r| under(r))
}

/// The dotted paths of the settings that differ between `old` and `new` (a table
/// compared key by key, anything else whole).
fn changed_keys(prefix: &str, old: &toml::Table, new: &toml::Table, out: &mut Vec<String>) {
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for k in keys {
        let name = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match (old.get(k), new.get(k)) {
            (Some(toml::Value::Table(a)), Some(toml::Value::Table(b))) => {
                changed_keys(&name, a, b, out);
            }
            (a, b) if a != b => out.push(name),
            _ => {}
        }
    }
}
