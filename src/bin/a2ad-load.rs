//! `a2ad-load`: drives an a2ad server over real HTTP and reports requests/s, latency
//! percentiles, errors by kind and (for a server it started, or one given by `--server-pid`)
//! peak RSS and CPU seconds per 1,000 requests. `--baseline` measures a minimal hyper
//! server (the floor) with the same client and settings, and prints a2ad as a ratio of it.
//! See docs/PERFORMANCE.md.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use serde_json::{Value, json};

#[path = "a2ad-load/client.rs"]
mod client;
#[path = "a2ad-load/disk.rs"]
mod disk;
#[path = "a2ad-load/floor.rs"]
mod floor;
#[path = "a2ad-load/procs.rs"]
mod procs;
#[path = "a2ad-load/receiver.rs"]
mod receiver;
#[path = "a2ad-load/report.rs"]
mod report;
#[path = "a2ad-load/scenarios.rs"]
mod scenarios;

use client::{Dialect, Kind, Stats, Target};
use procs::ServerProc;
use report::{Report, progress_line, report};
use scenarios::{follow, hold, soak, webhooks};

const BENCH_KEY: &str = "bench-key-0123456789";
const WEBHOOK_SECRET: &str = "bench-webhook-secret-0123";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// message/send to an echo agent.
    Send,
    /// message/stream, each read to its final event.
    Stream,
    /// N concurrent streams on a slow echo agent, held to the end.
    Hold,
    /// send, get, cancel and card calls (12:5:1:2).
    Mixed,
    /// Webhook deliveries per second to a receiver this tool runs, signatures checked.
    Webhooks,
    /// Many tasks through a server with a short retention; RSS over time.
    Soak,
    /// Cluster: tasks streamed on `--url` (`--slow-agent`, one with progress updates),
    /// followed on `--follow-url`; latency = arrival at the follower − the event's time.
    Follow,
    /// The store's disk alone, no server: a 4 KiB direct write and an fdatasync into a file
    /// written in advance, back to back — the least a durable commit costs on this disk
    /// (`--store-dir` names the disk; `--requests` caps the commits).
    Disk,
}

/// The store of a server the tool starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    /// The default: the log (in a fresh temporary directory, removed afterwards).
    Log,
    /// A redb file (in a fresh temporary directory, removed afterwards).
    Redb,
    /// Everything in RAM.
    Memory,
    /// A one-node cluster on PostgreSQL (`--pg-url`; a fresh schema, dropped afterwards).
    Postgres,
}

/// Load-test an a2ad server (or start one) over real HTTP.
#[derive(Parser, Debug)]
#[command(name = "a2ad-load", version)]
struct Cli {
    /// The scenario.
    #[arg(long, value_enum, default_value = "send")]
    scenario: Scenario,
    /// Base URL of a running a2ad (e.g. http://127.0.0.1:8080); omit to start one.
    #[arg(long)]
    url: Option<String>,
    /// Agent id for send/stream/mixed/webhooks (`--url` only; a started server has `echo`).
    #[arg(long, default_value = "echo")]
    agent: String,
    /// Another node of the same cluster, for `follow`.
    #[arg(long)]
    follow_url: Option<String>,
    /// Agent id for `hold` (`--url` only; a started server has `slow`).
    #[arg(long, default_value = "slow")]
    slow_agent: String,
    /// API key (`--url` only; a started server accepts the tool's own key).
    #[arg(long)]
    key: Option<String>,
    /// Pid of the server behind `--url`, for RSS and CPU figures.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Concurrent keep-alive connections.
    #[arg(long, short = 'c', default_value_t = 64)]
    connections: usize,
    /// The dialect of `send` and `stream`.
    #[arg(long, value_enum, default_value = "seed")]
    dialect: Dialect,
    /// With `--dialect grpc`: the HTTP/2 connections the workers share (0: one per worker).
    #[arg(long, default_value_t = 0)]
    grpc_channels: usize,
    /// Stop `send`/`stream` after this many requests instead of after `--duration`
    /// (no warm-up; for instruction counts: see benches/instructions.sh); `disk` after
    /// this many commits.
    #[arg(long)]
    requests: Option<u64>,
    /// Seconds to run (send, stream, mixed, webhooks, disk).
    #[arg(long, short = 'd', default_value_t = 10.0)]
    duration: f64,
    /// Concurrent streams for `hold`.
    #[arg(long, default_value_t = 10_000)]
    streams: usize,
    /// `hold` over HTTP/2 (cleartext, prior knowledge): this many streams share each
    /// connection (0: HTTP/1.1, a connection per stream).
    #[arg(long, default_value_t = 0)]
    h2_streams: usize,
    /// `send`, `stream` and `mixed` over cleartext HTTP/2 (prior knowledge), a connection
    /// per worker: what HTTP/2 itself costs a call, beside HTTP/1.1 and gRPC.
    #[arg(long)]
    h2: bool,
    /// How long the slow agent of a started server takes, in ms (`hold`).
    #[arg(long, default_value_t = 3_000)]
    hold_ms: u64,
    /// Progress updates the slow agent of a started server sends on the way (`hold`).
    #[arg(long, default_value_t = 2)]
    hold_steps: u32,
    /// Tasks for `soak`.
    #[arg(long, default_value_t = 1_000_000)]
    tasks: u64,
    /// Retention of a started server for `soak`, in seconds.
    #[arg(long, default_value_t = 5.0)]
    retention: f64,
    /// The store of a started server (`--url` only: whatever that server uses).
    #[arg(long, value_enum, default_value = "log")]
    store: StoreKind,
    /// PostgreSQL for `--store postgres`.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pg_url: String,
    /// Directory for a started server's store (default: a fresh one under the system's
    /// temporary directory). Put it on the disk you want to measure.
    #[arg(long)]
    store_dir: Option<String>,
    /// Also measure the floor server with the same client and settings.
    #[arg(long)]
    baseline: bool,
    /// A started server keeps at most this many finished tasks and conversations
    /// (`max_finished_tasks`, `max_contexts`; default: the server's own caps, so a run
    /// keeps every task it makes). What keeping every task costs:
    /// docs/decisions/what-keeping-tasks-costs.md.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000_000))]
    keep: Option<u32>,
    /// CPUs for the server(s) the tool starts (taskset list, e.g. `0`).
    #[arg(long)]
    server_cpus: Option<String>,
    /// CPUs for this tool (taskset list, e.g. `1`).
    #[arg(long)]
    load_cpus: Option<String>,
    /// The a2ad binary to start (default: next to this one).
    #[arg(long)]
    server_bin: Option<String>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<String>,
    /// With `--baseline`, also measure the actor floor: the floor plus a ractor actor per
    /// request, linked to a supervisor, that answers and stops (the design's own price).
    /// With `--floor-server`, be that server.
    #[arg(long)]
    floor_actor: bool,
    /// Run as the floor server on this address (internal; used by --baseline).
    #[arg(long, value_name = "ADDR")]
    floor_server: Option<String>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Some(cpus) = &cli.load_cpus
        && let Err(e) = procs::pin_self(cpus)
    {
        eprintln!("a2ad-load: {e}");
        return std::process::ExitCode::from(2);
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(cpus) = cli
        .load_cpus
        .as_deref()
        .filter(|_| cli.floor_server.is_none())
    {
        rt.worker_threads(procs::cpu_count(cpus));
    }
    let rt = match rt.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("a2ad-load: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    if let Some(addr) = &cli.floor_server {
        return match rt.block_on(floor::serve(addr, cli.floor_actor)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("a2ad-load floor: {e}");
                std::process::ExitCode::from(1)
            }
        };
    }
    match rt.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("a2ad-load: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    for (name, v) in [("--duration", cli.duration), ("--retention", cli.retention)] {
        if !(v.is_finite() && v > 0.0 && v <= 1e6) {
            return Err(format!("{name} must be a number of seconds greater than 0"));
        }
    }
    if cli.keep.is_some() && cli.url.is_some() {
        return Err(
            "--keep sets the caps of a server this tool starts, not of one at --url".into(),
        );
    }
    let mut reports = Vec::new();
    if cli.scenario == Scenario::Disk {
        let dir = cli
            .store_dir
            .as_ref()
            .map_or_else(std::env::temp_dir, std::path::PathBuf::from);
        let (duration, max) = (cli.duration, cli.requests);
        let r = tokio::task::spawn_blocking(move || disk::run(&dir, duration, max))
            .await
            .map_err(|e| e.to_string())??;
        r.print();
        reports.push(r);
        return write_json(&cli, &reports);
    }
    let a2ad = measure_a2ad(&cli).await?;
    a2ad.print();
    if cli.baseline
        && matches!(
            cli.scenario,
            Scenario::Send | Scenario::Stream | Scenario::Mixed
        )
    {
        let floor = measure_floor(&cli, false).await?;
        floor.print();
        println!(
            "ratio    a2ad/floor  req/s {:.1}%  p99 {:.2}x",
            100.0 * a2ad.rps() / floor.rps().max(1e-9),
            a2ad.latencies_ms[2] / floor.latencies_ms[2].max(1e-9)
        );
        if cli.floor_actor {
            let actor = measure_floor(&cli, true).await?;
            actor.print();
            println!(
                "ratio    actor floor/floor  req/s {:.1}%   a2ad/actor floor  req/s {:.1}%",
                100.0 * actor.rps() / floor.rps().max(1e-9),
                100.0 * a2ad.rps() / actor.rps().max(1e-9),
            );
            reports.push(floor);
            reports.push(actor);
        } else {
            reports.push(floor);
        }
    }
    reports.insert(0, a2ad);
    write_json(&cli, &reports)
}

/// Writes the reports as JSON where `--json` says.
fn write_json(cli: &Cli, reports: &[Report]) -> Result<(), String> {
    if let Some(path) = &cli.json {
        let out: Vec<Value> = reports.iter().map(Report::json).collect();
        std::fs::write(path, serde_json::to_vec_pretty(&out).unwrap_or_default())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn server_bin(cli: &Cli) -> Result<String, String> {
    if let Some(b) = &cli.server_bin {
        return Ok(b.clone());
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    Ok(me.with_file_name("a2ad").display().to_string())
}

/// A server's /metrics page (`base`: `http://HOST:PORT`), within five seconds.
async fn metrics_page(base: &str) -> Option<String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .ok()?;
    let response = client.get(format!("{base}/metrics")).send().await.ok()?;
    response.text().await.ok()
}

/// The value of the series `name` on a /metrics page (its first, whatever its labels).
fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The cluster's append figures from a node's /metrics.
async fn cluster_metrics(base: &str) -> Option<Value> {
    let text = metrics_page(base).await?;
    let value = |name: &str| metric(&text, name);
    Some(json!({
        "batches": value("a2ad_cluster_appends_total"),
        "p50_ms": value("a2ad_cluster_append_seconds_p50").map(|s| s * 1e3),
        "p99_ms": value("a2ad_cluster_append_seconds_p99").map(|s| s * 1e3),
        "writes": value("a2ad_store_writes_total"),
    }))
}

/// The PostgreSQL schema of a started server: fresh for each run of the tool.
fn pg_schema() -> String {
    format!("a2ad_load_{}", std::process::id())
}

/// Drops the started server's schema.
async fn drop_pg_schema(url: &str) {
    if let Ok((client, conn)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await {
        tokio::spawn(conn);
        let _ = client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", pg_schema()))
            .await;
    }
}

/// The store (redb file or log directory) of a started server: fresh for each run of the
/// tool.
fn store_file(cli: &Cli) -> std::path::PathBuf {
    let dir = match &cli.store_dir {
        Some(d) => std::path::PathBuf::from(d),
        None => std::env::temp_dir(),
    };
    dir.join(format!("a2ad-load-{}", std::process::id()))
        .join(if cli.store == StoreKind::Redb {
            "a2ad.redb"
        } else {
            "log"
        })
}

/// Bytes under a file or directory.
fn bytes_under(path: &std::path::Path) -> u64 {
    match std::fs::read_dir(path) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| bytes_under(&e.path()))
            .sum(),
        Err(_) => std::fs::metadata(path).map_or(0, |m| m.len()),
    }
}

fn bench_config(cli: &Cli) -> String {
    let retention = if cli.scenario == Scenario::Soak {
        cli.retention
    } else {
        120.0
    };
    let store = match cli.store {
        StoreKind::Memory => "[store]\nbackend = \"memory\"\n\n".to_string(),
        StoreKind::Redb | StoreKind::Log => format!(
            "[store]\nbackend = \"{}\"\npath = \"{}\"\n\n",
            if cli.store == StoreKind::Redb {
                "redb"
            } else {
                "log"
            },
            store_file(cli).display().to_string().replace('\\', "\\\\")
        ),
        StoreKind::Postgres => format!(
            "[cluster]\nengine = \"postgres\"\nurl = \"{}\"\nschema = \"{}\"\nnode_id = \"load\"\n\n",
            cli.pg_url,
            pg_schema()
        ),
    };
    let keep = cli.keep.map_or(String::new(), |n| {
        format!("max_finished_tasks = {n}\nmax_contexts = {n}\n")
    });
    let limits = "[agents.limits]\nrequests_per_minute = 1000000000\nconcurrent_tasks = 1000000\nmax_queued_tasks = 1000000\ntask_timeout_seconds = 600\nsync_wait_seconds = 600\n";
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nlisten_backlog = 16384\ntask_retention_seconds = {retention}\nmax_live_tasks = 1000000\nmax_subscribers_per_task = 100000\n{keep}\n{store}\
         [webhooks]\nallow_private_networks = true\nworkers = 8\nmax_pending_deliveries = 1000000\n\n\
         [[api_keys]]\nname = \"bench\"\nkey = \"{BENCH_KEY}\"\n\n\
         [[agents]]\nid = \"echo\"\n{limits}\n\
         [[agents]]\nid = \"slow\"\n{limits}[agents.echo]\ndelay_ms = {}\nprogress_steps = {}\n",
        cli.hold_ms, cli.hold_steps
    )
}

async fn measure_a2ad(cli: &Cli) -> Result<Report, String> {
    let (server, base, key, pid) = match &cli.url {
        Some(url) => {
            let key = cli.key.clone().ok_or("--key is required with --url")?;
            (
                None,
                url.trim_end_matches('/').to_string(),
                key,
                cli.server_pid,
            )
        }
        None => {
            let bin = server_bin(cli)?;
            let path = std::env::temp_dir().join(format!("a2ad-load-{}.toml", std::process::id()));
            std::fs::write(&path, bench_config(cli)).map_err(|e| e.to_string())?;
            let args = vec!["--config".to_string(), path.display().to_string()];
            let started = ServerProc::start(&bin, &args, cli.server_cpus.as_deref());
            // Read once it listens; not left behind in the temporary directory.
            let _ = std::fs::remove_file(&path);
            let s = started?;
            let base = format!("http://{}", s.addr);
            let pid = s.pid();
            (Some(s), base, BENCH_KEY.to_string(), Some(pid))
        }
    };
    let started_server = server.is_some();
    let agent = if started_server {
        "echo"
    } else {
        cli.agent.as_str()
    };
    let slow = if started_server {
        "slow"
    } else {
        cli.slow_agent.as_str()
    };
    let addr = base
        .strip_prefix("http://")
        .ok_or("only http:// URLs")?
        .parse()
        .map_err(|_| format!("{base}: expected http://IP:PORT"))?;
    let target = |agent: &str| {
        Arc::new(Target {
            addr,
            path: cli.dialect.path(agent),
            key: key.clone(),
            dialect: cli.dialect,
            grpc_channels: cli.grpc_channels,
            h2: cli.h2,
        })
    };
    let result = match cli.scenario {
        Scenario::Send => timed(cli, target(agent), Kind::Send, pid, "a2ad").await,
        Scenario::Stream => timed(cli, target(agent), Kind::Stream, pid, "a2ad").await,
        Scenario::Mixed => timed(cli, target(agent), Kind::Mixed, pid, "a2ad").await,
        Scenario::Hold => hold(cli, target(slow), pid).await,
        Scenario::Webhooks => webhooks(cli, target(agent), pid).await,
        Scenario::Soak => soak(cli, target(agent), pid).await,
        Scenario::Follow => follow(cli, &base, &key).await,
        Scenario::Disk => Err("the disk scenario starts no server".into()),
    };
    let mut append = None;
    if server.is_some() && cli.store == StoreKind::Postgres {
        append = cluster_metrics(&base).await;
    }
    if let Some(s) = server {
        s.stop();
        if matches!(cli.store, StoreKind::Redb | StoreKind::Log) {
            let file = store_file(cli);
            let bytes = bytes_under(&file);
            if let Some(dir) = file.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
            let name = if cli.store == StoreKind::Redb {
                "redb"
            } else {
                "log"
            };
            return result.map(|mut r| {
                r.extra.insert("store", json!(name));
                r.extra.insert(
                    "store_file_mib",
                    json!((bytes as f64 / 1048576.0 * 10.0).round() / 10.0),
                );
                r
            });
        }
        if cli.store == StoreKind::Postgres {
            drop_pg_schema(&cli.pg_url).await;
        }
        let kind = match cli.store {
            StoreKind::Postgres => "postgres",
            _ => "memory",
        };
        return result.map(|mut r| {
            r.extra.insert("store", json!(kind));
            if let Some(a) = append {
                r.extra.insert("append", a);
            }
            r
        });
    }
    result
}

/// The floor, or with `actor` the actor floor (src/bin/a2ad-load/floor.rs).
async fn measure_floor(cli: &Cli, actor: bool) -> Result<Report, String> {
    let me = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .display()
        .to_string();
    let mut args = vec!["--floor-server".to_string(), "127.0.0.1:0".to_string()];
    if actor {
        args.push("--floor-actor".into());
    }
    let s = ServerProc::start(&me, &args, cli.server_cpus.as_deref())?;
    let target = Arc::new(Target {
        addr: s.addr,
        path: "/api/v1/a2a/echo".into(),
        key: BENCH_KEY.into(),
        dialect: Dialect::Seed,
        grpc_channels: 0,
        h2: false,
    });
    // The floor answers every call with one JSON result, so `send` is its workload.
    let name = if actor { "actor floor" } else { "floor" };
    let r = timed(cli, target, Kind::Send, Some(s.pid()), name).await;
    s.stop();
    r
}

/// Runs `connections` request loops for `duration` seconds after a short warm-up.
async fn timed(
    cli: &Cli,
    target: Arc<Target>,
    kind: Kind,
    pid: Option<u32>,
    name: &'static str,
) -> Result<Report, String> {
    if cli.requests.is_none() {
        warm_up(cli, &target, kind).await;
    }
    measured(cli, target, kind, pid, name).await
}

/// Opens the connections and lets the server's allocator settle.
async fn warm_up(cli: &Cli, target: &Arc<Target>, kind: Kind) {
    let warm = Instant::now() + Duration::from_secs_f64((cli.duration * 0.1).clamp(0.2, 2.0));
    drive(cli.connections, target.clone(), kind, warm, None).await;
}

/// One measured run of `duration` seconds.
async fn measured(
    cli: &Cli,
    target: Arc<Target>,
    kind: Kind,
    pid: Option<u32>,
    name: &'static str,
) -> Result<Report, String> {
    let cpu0 = pid.and_then(procs::cpu_seconds);
    // Not with `--requests`: benches/instructions.sh counts the server's instructions
    // around such a run, and reading /metrics would add to them.
    let commits0 = if name == "a2ad" && cli.requests.is_none() {
        store_commits(target.addr).await
    } else {
        None
    };
    let addr = target.addr;
    let t0 = Instant::now();
    let (deadline, budget) = match cli.requests {
        // A fixed number of requests: bounded by an hour in case the server stalls.
        Some(n) => (
            t0 + Duration::from_secs(3600),
            Some(Arc::new(AtomicU64::new(n))),
        ),
        None => (t0 + Duration::from_secs_f64(cli.duration), None),
    };
    let progress = progress_line(
        format!("{:?} c={}", cli.scenario, cli.connections).to_lowercase(),
        cli.duration,
    );
    let stats = drive(cli.connections, target, kind, deadline, budget).await;
    progress.store(true, Relaxed);
    let seconds = t0.elapsed().as_secs_f64();
    let mut r = report(
        cli.scenario,
        name,
        cli.connections,
        seconds,
        stats,
        pid,
        cpu0,
    );
    if let (Some(before), Some(after)) = (commits0, store_commits(addr).await)
        && let Some(figures) = commit_figures(before, after, r.requests, seconds)
    {
        r.extra.insert("commits", figures);
    }
    Ok(r)
}

/// The store's commits so far and the seconds they took (`a2ad_store_commits_total`,
/// `a2ad_store_commit_seconds_total` of the server's /metrics), when it shows them.
async fn store_commits(addr: std::net::SocketAddr) -> Option<(f64, f64)> {
    let text = metrics_page(&format!("http://{addr}")).await?;
    Some((
        metric(&text, "a2ad_store_commits_total")?,
        metric(&text, "a2ad_store_commit_seconds_total")?,
    ))
}

/// What a run's commits were: per second, requests per commit, and a commit's mean time
/// from its start to durable — none for a store that commits nothing (memory).
fn commit_figures(
    before: (f64, f64),
    after: (f64, f64),
    requests: u64,
    seconds: f64,
) -> Option<Value> {
    let commits = after.0 - before.0;
    if commits < 1.0 || seconds <= 0.0 {
        return None;
    }
    let round = |v: f64, places: i32| (v * 10f64.powi(places)).round() / 10f64.powi(places);
    Some(json!({
        "per_s": round(commits / seconds, 0),
        "requests_per_commit": round(requests as f64 / commits, 1),
        "mean_ms": round((after.1 - before.1) / commits * 1e3, 3),
    }))
}

async fn drive(
    connections: usize,
    target: Arc<Target>,
    kind: Kind,
    deadline: Instant,
    budget: Option<Arc<AtomicU64>>,
) -> Stats {
    let workers: Vec<_> = if target.dialect == Dialect::Grpc {
        let n = match target.grpc_channels {
            0 => connections,
            n => n.min(connections),
        };
        let channels: Vec<tonic::transport::Channel> = (0..n)
            .filter_map(|_| {
                tonic::transport::Channel::from_shared(format!("http://{}", target.addr))
                    .ok()
                    .map(|e| e.connect_lazy())
            })
            .collect();
        (0..connections)
            .filter_map(|i| channels.get(i % channels.len().max(1)).cloned())
            .map(|channel| {
                tokio::spawn(client::run_grpc_loop(
                    target.clone(),
                    channel,
                    kind,
                    deadline,
                    budget.clone(),
                ))
            })
            .collect()
    } else {
        (0..connections)
            .map(|_| {
                tokio::spawn(client::run_loop(
                    target.clone(),
                    kind,
                    deadline,
                    budget.clone(),
                ))
            })
            .collect()
    };
    let mut stats = Stats::default();
    for w in workers {
        match w.await {
            Ok(s) => stats.merge(s),
            Err(_) => stats.error("worker-panic"),
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_read_by_its_whole_name() {
        let page = "# HELP a2ad_store_commits_total Commits.\n\
                    a2ad_store_commits_total_extra 9\n\
                    a2ad_store_commits_total 1234\n\
                    a2ad_store_commit_seconds_total 0.5\n\
                    a2ad_cluster_appends_total{node=\"n1\"} 77\n";
        assert_eq!(metric(page, "a2ad_store_commits_total"), Some(1234.0));
        assert_eq!(metric(page, "a2ad_store_commit_seconds_total"), Some(0.5));
        assert_eq!(metric(page, "a2ad_cluster_appends_total"), Some(77.0));
        assert_eq!(metric(page, "a2ad_store_commit"), None);
        assert_eq!(metric(page, "a2ad_cluster_appends"), None);
    }

    #[test]
    fn commit_figures_come_from_the_difference_of_two_readings() {
        let f = commit_figures((100.0, 0.5), (1100.0, 1.0), 20_000, 2.0).expect("commits");
        assert_eq!(f["per_s"], json!(500.0));
        assert_eq!(f["requests_per_commit"], json!(20.0));
        assert_eq!(f["mean_ms"], json!(0.5));
        // A store that committed nothing (memory) has no figures, nor does an empty run.
        assert!(commit_figures((7.0, 1.0), (7.0, 1.0), 1_000, 2.0).is_none());
        assert!(commit_figures((0.0, 0.0), (10.0, 1.0), 1_000, 0.0).is_none());
    }
}
