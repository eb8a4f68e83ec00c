//! The headline load benchmark: `cargo bench --bench load`.
//!
//! Runs the project's load tool (`a2ad-load`) against fresh release servers, a2ad pinned to
//! CPU 0 and the load to CPU 1 (when the machine has two or more CPUs), and measures every
//! target of docs/PERFORMANCE.md in one run: `send` at c=1, c=32 and c=256 in the seed
//! dialect and `SendMessage` (A2A 1.0) at c=32, `stream` at c=64 — each with `memory` and
//! with the default store (the log, durable), each beside the floor server measured right
//! after it — then `hold` (10,000 streams on a slow echo agent: 3 s, 2 progress updates)
//! and `webhooks` (signed deliveries per second, none lost) on both stores, and the disk
//! alone (`a2ad-load --scenario disk`: what one durable commit costs there, which bounds
//! the log at one connection). Every run is repeated `A2AD_BENCH_ROUNDS` times (default 3)
//! and reported as medians, with a verdict per target. Writes `target/bench-report.md`,
//! `target/bench-report.svg` and the raw results, `target/bench-*.json`.
//!
//! `A2AD_BENCH_SECONDS` (default 6) sets each timed run's length, `A2AD_BENCH_STREAMS`
//! (default 10000) the streams of `hold`, `A2AD_BENCH_ROUNDS` the rounds.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The stores measured: everything in RAM, and the default (the log, durable).
const STORES: [&str; 2] = ["memory", "log"];

/// One line of the plan, run once per round.
struct Item {
    label: String,
    args: Vec<String>,
    /// One result list (a2ad, then the floor when measured) per round.
    rounds: Vec<Vec<Value>>,
}

fn main() {
    let load = env!("CARGO_BIN_EXE_a2ad-load");
    let server = env!("CARGO_BIN_EXE_a2ad");
    let seconds: f64 = env_or("A2AD_BENCH_SECONDS", 6.0);
    let streams: usize = env_or("A2AD_BENCH_STREAMS", 10_000);
    let rounds: usize = env_or("A2AD_BENCH_ROUNDS", 3).clamp(1, 20);
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let pin: Vec<String> = if cpus >= 2 {
        ["--server-cpus", "0", "--load-cpus", "1"]
            .map(String::from)
            .to_vec()
    } else {
        Vec::new()
    };
    let target = target_dir();
    std::fs::create_dir_all(&target).expect("target dir");

    let mut plan: Vec<Item> = Vec::new();
    let mut add = |label: String, a: &[&str], timed: bool| {
        let mut args: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        if timed {
            args.extend(["--duration".into(), seconds.to_string()]);
        }
        plan.push(Item {
            label,
            args,
            rounds: Vec::new(),
        });
    };
    // Each run on memory and on the log back to back, so that their ratio is taken a
    // few seconds apart.
    for (name, scenario, c, dialect) in [
        ("send", "send", "1", "seed"),
        ("send", "send", "32", "seed"),
        ("send", "send", "256", "seed"),
        ("SendMessage", "send", "32", "v1"),
        ("stream", "stream", "64", "seed"),
    ] {
        for store in STORES {
            add(
                format!("{name} c={c} {store}"),
                &[
                    "--scenario",
                    scenario,
                    "-c",
                    c,
                    "--dialect",
                    dialect,
                    "--store",
                    store,
                    "--baseline",
                ],
                true,
            );
        }
    }
    for store in STORES {
        add(
            format!("webhooks c=64 {store}"),
            &["--scenario", "webhooks", "-c", "64", "--store", store],
            true,
        );
    }
    for store in STORES {
        add(
            format!("hold {streams} {store}"),
            &[
                "--scenario",
                "hold",
                "--streams",
                &streams.to_string(),
                "--hold-ms",
                "3000",
                "--hold-steps",
                "2",
                "--store",
                store,
            ],
            false,
        );
    }
    // Seconds, not the timed runs' length: a commit takes well under a millisecond.
    add(
        "disk".into(),
        &["--scenario", "disk", "--duration", "3"],
        false,
    );

    for round in 1..=rounds {
        for item in &mut plan {
            let json = target.join(format!(
                "bench-{}-{round}.json",
                item.label.replace([' ', '='], "-")
            ));
            let mut a = item.args.clone();
            a.extend(pin.iter().cloned());
            a.extend([
                "--server-bin".into(),
                server.into(),
                "--json".into(),
                json.display().to_string(),
            ]);
            eprintln!("== round {round}/{rounds}: {}", item.label);
            let status = Command::new(load).args(&a).status().expect("run a2ad-load");
            assert!(status.success(), "a2ad-load failed for {}", item.label);
            let text = std::fs::read_to_string(&json).expect("results");
            item.rounds
                .push(serde_json::from_str(&text).expect("JSON results"));
        }
    }
    let report = markdown(&plan, &machine(), seconds, rounds, !pin.is_empty());
    std::fs::write(target.join("bench-report.md"), &report).expect("write report");
    std::fs::write(target.join("bench-report.svg"), svg(&plan)).expect("write chart");
    println!("{report}");
    println!(
        "written: {}/bench-report.md and bench-report.svg",
        target.display()
    );
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    format!("{cpus} × {cpu}")
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The medians of one item over its rounds.
#[derive(Default)]
struct Summary {
    rps: f64,
    floor_rps: f64,
    /// a2ad / floor, the median of each round's ratio.
    ratio: f64,
    p50_ms: f64,
    p99: f64,
    p99_ratio: f64,
    peak_rss: f64,
    cpu_per_1k: f64,
    errors: u64,
    /// `webhooks`: deliveries per second; `hold`: streams that finished.
    extra: f64,
    /// `webhooks`: deliveries lost; `hold`: streams dropped (the worst round).
    lost: u64,
}

/// The median over an item's rounds of what `f` reads from each round's results.
fn over_rounds(item: &Item, f: &dyn Fn(&[Value]) -> Option<f64>) -> f64 {
    median(item.rounds.iter().filter_map(|r| f(r)).collect())
}

fn summary(item: &Item) -> Summary {
    let of = |f: &dyn Fn(&[Value]) -> Option<f64>| over_rounds(item, f);
    let a2ad = |r: &[Value]| r.iter().find(|v| v["target"] == "a2ad").cloned();
    let floor = |r: &[Value]| r.iter().find(|v| v["target"] == "floor").cloned();
    let errors = item
        .rounds
        .iter()
        .filter_map(|r| a2ad(r))
        .map(|v| {
            v["errors"]
                .as_object()
                .map(|e| e.values().filter_map(Value::as_u64).sum::<u64>())
                .unwrap_or(0)
        })
        .sum();
    let worst = |k: &str| {
        item.rounds
            .iter()
            .filter_map(|r| a2ad(r))
            .filter_map(|v| v["extra"][k].as_u64())
            .max()
            .unwrap_or(0)
    };
    Summary {
        rps: of(&|r| a2ad(r).map(|v| num(&v, "rps"))),
        floor_rps: of(&|r| floor(r).map(|v| num(&v, "rps"))),
        ratio: of(&|r| Some(num(&a2ad(r)?, "rps") / num(&floor(r)?, "rps").max(1e-9))),
        p50_ms: of(&|r| a2ad(r).map(|v| num(&v, "p50_ms"))),
        p99: of(&|r| a2ad(r).map(|v| num(&v, "p99_ms"))),
        p99_ratio: of(&|r| Some(num(&a2ad(r)?, "p99_ms") / num(&floor(r)?, "p99_ms").max(1e-9))),
        peak_rss: of(&|r| a2ad(r).and_then(|v| v["peak_rss_mib"].as_f64())),
        cpu_per_1k: of(&|r| a2ad(r).and_then(|v| v["cpu_seconds_per_1k"].as_f64())),
        errors,
        extra: of(&|r| {
            let v = a2ad(r)?;
            v["extra"]["deliveries_per_second"]
                .as_f64()
                .or_else(|| v["extra"]["finished_with_final_event"].as_f64())
        }),
        lost: worst("lost").max(worst("dropped")),
    }
}

/// The disk alone (`--scenario disk`), medians over the rounds.
struct Disk {
    /// A commit's time, write and flush.
    p50_ms: f64,
    /// CPU of the tool's process per commit (the kernel's own threads not counted).
    cpu_us: f64,
}

fn disk(item: &Item) -> Disk {
    let of = |f: &dyn Fn(&Value) -> Option<f64>| {
        over_rounds(item, &|r| f(r.iter().find(|v| v["target"] == "disk")?))
    };
    Disk {
        p50_ms: of(&|v| v["p50_ms"].as_f64()),
        cpu_us: of(&|v| v["extra"]["cpu_us_per_commit"].as_f64()),
    }
}

/// The median over the rounds of `f(memory's a2ad result, the log's)` for one run.
fn paired(plan: &[Item], run: &str, f: &dyn Fn(&Value, &Value) -> Option<f64>) -> f64 {
    let a2ad = |item: Option<&Item>, round: usize| -> Option<Value> {
        item?
            .rounds
            .get(round)?
            .iter()
            .find(|v| v["target"] == "a2ad")
            .cloned()
    };
    let (m, l) = (
        find(plan, &format!("{run} memory")),
        find(plan, &format!("{run} log")),
    );
    let rounds = m.map_or(0, |i| i.rounds.len());
    median(
        (0..rounds)
            .filter_map(|i| f(&a2ad(m, i)?, &a2ad(l, i)?))
            .collect(),
    )
}

fn find<'a>(plan: &'a [Item], label: &str) -> Option<&'a Item> {
    plan.iter().find(|i| i.label == label)
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1}%", 100.0 * x)
    } else {
        "—".into()
    }
}

fn markdown(plan: &[Item], machine: &str, seconds: f64, rounds: usize, pinned: bool) -> String {
    let mut out = String::new();
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_default();
    let _ = writeln!(out, "# a2ad load benchmark\n");
    let _ = writeln!(
        out,
        "{} · {machine} · {seconds} s per timed run · medians of {rounds} round(s) · {}\n",
        date.trim(),
        if pinned {
            "server on CPU 0, load on CPU 1"
        } else {
            "unpinned (one CPU)"
        }
    );
    let _ = writeln!(
        out,
        "| run | a2ad req/s | floor req/s | vs floor | p99 ms | p99 vs floor | peak RSS MiB | CPU s / 1k req | errors |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for item in plan
        .iter()
        .filter(|i| i.args.contains(&"--baseline".into()))
    {
        let s = summary(item);
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {} | {:.2} | {:.2}× | {:.1} | {:.3} | {} |",
            item.label,
            s.rps,
            s.floor_rps,
            pct(s.ratio),
            s.p99,
            s.p99_ratio,
            s.peak_rss,
            s.cpu_per_1k,
            s.errors
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| run | result | peak RSS MiB | lost / dropped | errors |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|");
    for item in plan
        .iter()
        .filter(|i| !i.args.contains(&"--baseline".into()))
    {
        let s = summary(item);
        let result = if item.label.starts_with("webhooks") {
            format!("{:.0} deliveries/s", s.extra)
        } else if item.label == "disk" {
            let d = disk(item);
            format!(
                "one 4 KiB direct write + fdatasync: p50 {:.3} ms, {:.0} µs of CPU each",
                d.p50_ms, d.cpu_us
            )
        } else {
            format!("{:.0} streams finished with their final event", s.extra)
        };
        let rss = if s.peak_rss.is_finite() {
            format!("{:.1}", s.peak_rss)
        } else {
            "—".into()
        };
        let _ = writeln!(
            out,
            "| {} | {result} | {rss} | {} | {} |",
            item.label, s.lost, s.errors
        );
    }

    // The targets of docs/PERFORMANCE.md, each with what this run measured.
    let get = |label: &str| find(plan, label).map(summary).unwrap_or_default();
    let streams = plan
        .iter()
        .find(|i| i.label.starts_with("hold") && i.label.ends_with("log"))
        .map(|i| i.label.clone())
        .unwrap_or_default();
    let mut targets: Vec<(String, String, bool)> = Vec::new();
    // The default store against memory: the median of each round's ratio, the two runs
    // taken back to back.
    let of_memory = |run: &str, key: &str| {
        paired(plan, run, &|m, l| {
            let (m, l) = (m[key].as_f64()?, l[key].as_f64()?);
            Some(l / m.max(1e-9))
        })
    };
    for c in ["32", "256"] {
        let s = get(&format!("send c={c} memory"));
        targets.push((
            format!("send c={c}, memory: ≥ 60% of the floor"),
            pct(s.ratio),
            s.ratio >= 0.60,
        ));
    }
    for (run, at_least) in [
        ("send c=32", 0.80),
        ("send c=256", 0.80),
        ("stream c=64", 0.80),
        ("send c=1", 0.50),
    ] {
        let x = of_memory(run, "rps");
        targets.push((
            format!("{run}, log: ≥ {:.0}% of memory's req/s", at_least * 100.0),
            pct(x),
            x >= at_least,
        ));
    }
    // What the disk leaves at one connection: memory's request plus one bare commit.
    let (m1, d) = (get("send c=1 memory"), find(plan, "disk").map(disk));
    if let Some(d) = d {
        let ceiling = m1.p50_ms / (m1.p50_ms + d.p50_ms);
        targets.push((
            "send c=1, log: what the disk allows (memory's p50 ÷ (that + a bare commit's))".into(),
            pct(ceiling),
            ceiling >= 0.50,
        ));
    }
    for run in ["send c=32", "send c=256", "stream c=64"] {
        let p99 = of_memory(run, "p99_ms");
        targets.push((
            format!("{run}, log: p99 ≤ 1.5× memory's"),
            format!("{p99:.2}×"),
            p99 <= 1.5,
        ));
    }
    for store in STORES {
        let s = get(&format!("send c=32 {store}"));
        targets.push((
            format!("send c=32, {store}: p99 ≤ 2.5× the floor's"),
            format!("{:.2}×", s.p99_ratio),
            s.p99_ratio <= 2.5,
        ));
    }
    let (a, b) = (get("send c=32 memory"), get("send c=256 memory"));
    targets.push((
        "send, memory: ratio at c=256 ≥ ratio at c=32".into(),
        format!("{} vs {}", pct(b.ratio), pct(a.ratio)),
        b.ratio >= a.ratio,
    ));
    let s = get("stream c=64 memory");
    targets.push((
        "stream c=64, memory: ≥ 50% of the floor".into(),
        pct(s.ratio),
        s.ratio >= 0.50,
    ));
    let h = get(&streams);
    targets.push((
        format!("{streams}: all finish, peak RSS < 250 MiB"),
        format!("{:.0} finished, {:.1} MiB", h.extra, h.peak_rss),
        h.lost == 0 && h.errors == 0 && h.peak_rss < 250.0,
    ));
    for store in STORES {
        let w = get(&format!("webhooks c=64 {store}"));
        targets.push((
            format!("webhooks, {store}: ≥ 10,000 deliveries/s, none lost"),
            format!("{:.0}/s, {} lost", w.extra, w.lost),
            w.extra >= 10_000.0 && w.lost == 0,
        ));
    }
    let x = paired(plan, "webhooks c=64", &|m, l| {
        let of = |v: &Value| v["extra"]["deliveries_per_second"].as_f64();
        Some(of(l)? / of(m)?.max(1e-9))
    });
    targets.push((
        "webhooks, log: ≥ 80% of memory's deliveries/s".into(),
        pct(x),
        x >= 0.80,
    ));
    for store in STORES {
        let (seed, v1) = (
            get(&format!("send c=32 {store}")),
            get(&format!("SendMessage c=32 {store}")),
        );
        let x = v1.ratio / seed.ratio;
        targets.push((
            format!("1.0 SendMessage within 10% of seed send, {store} (c=32)"),
            pct(x),
            x >= 0.90,
        ));
    }
    let _ = writeln!(out, "\n| target | measured | |\n|---|---:|---|");
    for (what, measured, met) in targets {
        let _ = writeln!(
            out,
            "| {what} | {measured} | {} |",
            if met { "met" } else { "**missed**" }
        );
    }
    let _ = writeln!(out, "\n![a2ad as a share of the floor](bench-report.svg)");
    out
}

/// Bars: each floor-paired run as a share of the floor (median), memory beside the log, with
/// the targets' lines.
fn svg(plan: &[Item]) -> String {
    let rows: Vec<(String, f64)> = plan
        .iter()
        .filter(|i| i.args.contains(&"--baseline".into()))
        .map(|i| (i.label.clone(), summary(i).ratio))
        .collect();
    let (left, width, bar, gap) = (190.0, 560.0, 18.0, 8.0);
    let height = 60.0 + rows.len() as f64 * (bar + gap) + 30.0;
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="800" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        out,
        r#"<rect width="800" height="{height}" fill="white"/><text x="10" y="24" font-size="14" font-weight="bold">a2ad requests/s as a share of the floor (median of rounds)</text>"#
    );
    let x = |r: f64| left + width * r.clamp(0.0, 1.0);
    for k in 0..=10 {
        let r = k as f64 / 10.0;
        let _ = write!(
            out,
            r##"<line x1="{0:.1}" y1="40" x2="{0:.1}" y2="{1:.1}" stroke="#eee"/><text x="{0:.1}" y="{2:.1}" text-anchor="middle">{3}%</text>"##,
            x(r),
            height - 30.0,
            height - 14.0,
            k * 10
        );
    }
    for (r, name) in [(0.5, "stream target"), (0.6, "send target")] {
        let _ = write!(
            out,
            r##"<line x1="{0:.1}" y1="40" x2="{0:.1}" y2="{1:.1}" stroke="#d73a49" stroke-dasharray="4 3"/><text x="{0:.1}" y="38" fill="#d73a49" text-anchor="middle">{name}</text>"##,
            x(r),
            height - 30.0
        );
    }
    for (i, (label, ratio)) in rows.iter().enumerate() {
        let y = 50.0 + i as f64 * (bar + gap);
        let color = if label.ends_with("log") {
            "#8250df"
        } else {
            "#1f6feb"
        };
        let r = if ratio.is_finite() { *ratio } else { 0.0 };
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text><rect x="{left}" y="{y:.1}" width="{:.1}" height="{bar}" fill="{color}"/><text x="{:.1}" y="{:.1}">{:.1}%</text>"#,
            left - 8.0,
            y + 13.0,
            width * r.clamp(0.0, 1.0),
            x(r) + 4.0,
            y + 13.0,
            100.0 * r
        );
    }
    out.push_str("</svg>\n");
    out
}
