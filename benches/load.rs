//! The headline load benchmark: `cargo bench --bench load`.
//!
//! Starts a2ad (release) on 127.0.0.1:0 with a bench configuration through `a2ad-load`,
//! pinned to CPU 0 with the load on CPU 1 (when the machine has two or more), and runs:
//! `send` at concurrency 1, 64 and 256, `stream` at 64 — each beside the floor server — and
//! `hold` with 10,000 streams. Writes `target/bench-report.md` and `target/bench-report.svg`.
//! `A2AD_BENCH_SECONDS` sets the length of each run (default 10), `A2AD_BENCH_STREAMS` the
//! streams of `hold` (default 10000).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

struct Run {
    label: String,
    results: Vec<Value>,
}

fn main() {
    let load = env!("CARGO_BIN_EXE_a2ad-load");
    let server = env!("CARGO_BIN_EXE_a2ad");
    let seconds: f64 = env_or("A2AD_BENCH_SECONDS", 10.0);
    let streams: usize = env_or("A2AD_BENCH_STREAMS", 10_000);
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

    let plan: Vec<(String, Vec<String>)> = vec![
        (
            "send c=1".into(),
            args(&["--scenario", "send", "-c", "1", "--baseline"], seconds),
        ),
        (
            "send c=64".into(),
            args(&["--scenario", "send", "-c", "64", "--baseline"], seconds),
        ),
        (
            "send c=256".into(),
            args(&["--scenario", "send", "-c", "256", "--baseline"], seconds),
        ),
        (
            "stream c=64".into(),
            args(&["--scenario", "stream", "-c", "64", "--baseline"], seconds),
        ),
        (
            format!("hold {streams}"),
            vec![
                "--scenario".into(),
                "hold".into(),
                "--streams".into(),
                streams.to_string(),
                "--hold-ms".into(),
                "15000".into(),
            ],
        ),
    ];
    let mut runs = Vec::new();
    for (label, mut a) in plan {
        let json = target.join(format!("bench-{}.json", label.replace([' ', '='], "-")));
        a.extend(pin.iter().cloned());
        a.extend([
            "--server-bin".into(),
            server.into(),
            "--json".into(),
            json.display().to_string(),
        ]);
        eprintln!("== {label}");
        let status = Command::new(load).args(&a).status().expect("run a2ad-load");
        assert!(status.success(), "a2ad-load failed for {label}");
        let text = std::fs::read_to_string(&json).expect("results");
        let results: Vec<Value> = serde_json::from_str(&text).expect("JSON results");
        runs.push(Run { label, results });
    }
    let machine = machine();
    let report = markdown(&runs, &machine, seconds, !pin.is_empty());
    std::fs::write(target.join("bench-report.md"), &report).expect("write report");
    std::fs::write(target.join("bench-report.svg"), svg(&runs)).expect("write chart");
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

fn args(a: &[&str], seconds: f64) -> Vec<String> {
    let mut v: Vec<String> = a.iter().map(|s| s.to_string()).collect();
    v.extend(["--duration".to_string(), seconds.to_string()]);
    v
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

fn get<'a>(run: &'a Run, target: &str) -> Option<&'a Value> {
    run.results.iter().find(|r| r["target"] == target)
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

fn markdown(runs: &[Run], machine: &str, seconds: f64, pinned: bool) -> String {
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
        "{} · {machine} · {seconds} s per run · {}\n",
        date.trim(),
        if pinned {
            "server on CPU 0, load on CPU 1"
        } else {
            "unpinned (one CPU)"
        }
    );
    let _ = writeln!(
        out,
        "| run | server | req/s | p50 ms | p90 ms | p99 ms | max ms | errors | peak RSS MiB | CPU s / 1k req | req/s vs floor | p99 vs floor |"
    );
    let _ = writeln!(
        out,
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"
    );
    for run in runs {
        let floor = get(run, "floor");
        for r in &run.results {
            let errors = r["errors"]
                .as_object()
                .map(|e| {
                    if e.is_empty() {
                        "none".to_string()
                    } else {
                        e.iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    }
                })
                .unwrap_or_default();
            let (ratio, p99) = match (floor, r["target"] == "a2ad") {
                (Some(f), true) => (
                    format!("{:.1}%", 100.0 * num(r, "rps") / num(f, "rps").max(1e-9)),
                    format!("{:.2}×", num(r, "p99_ms") / num(f, "p99_ms").max(1e-9)),
                ),
                _ => ("".into(), "".into()),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} |",
                run.label,
                r["target"].as_str().unwrap_or("?"),
                num(r, "rps"),
                num(r, "p50_ms"),
                num(r, "p90_ms"),
                num(r, "p99_ms"),
                num(r, "max_ms"),
                errors,
                r["peak_rss_mib"]
                    .as_f64()
                    .map(|m| format!("{m:.1}"))
                    .unwrap_or_default(),
                r["cpu_seconds_per_1k"]
                    .as_f64()
                    .map(|c| format!("{c:.3}"))
                    .unwrap_or_default(),
                ratio,
                p99
            );
        }
        for r in &run.results {
            if let Some(extra) = r["extra"].as_object().filter(|e| !e.is_empty()) {
                let parts: Vec<String> = extra.iter().map(|(k, v)| format!("{k} {v}")).collect();
                let _ = writeln!(out, "| | | {} |||||||||| ", parts.join(", "));
            }
        }
    }
    if let (Some(a), Some(b)) = (
        runs.iter().find(|r| r.label == "send c=64"),
        runs.iter().find(|r| r.label == "send c=256"),
    ) && let (Some(a), Some(b)) = (get(a, "a2ad"), get(b, "a2ad"))
    {
        let _ = writeln!(
            out,
            "\nsend c=256 / c=64 (no collapse): {:.1}%",
            100.0 * num(b, "rps") / num(a, "rps").max(1e-9)
        );
    }
    let _ = writeln!(
        out,
        "\n![requests/s and p99 against concurrency](bench-report.svg)"
    );
    out
}

/// Two panels: requests/s and p99 against concurrency, a2ad beside the floor.
fn svg(runs: &[Run]) -> String {
    let points = |target: &str, key: &str| -> Vec<(f64, f64)> {
        runs.iter()
            .filter(|r| r.label.starts_with("send c="))
            .filter_map(|r| get(r, target).map(|v| (num(v, "connections"), num(v, key))))
            .collect()
    };
    let mut out = String::from(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="900" height="360" font-family="sans-serif" font-size="12">"#,
    );
    out.push_str(r#"<rect width="900" height="360" fill="white"/>"#);
    for (i, (key, title)) in [
        ("rps", "send: requests/s"),
        ("p99_ms", "send: p99 latency (ms)"),
    ]
    .iter()
    .enumerate()
    {
        let x0 = 60.0 + i as f64 * 450.0;
        let (w, h, y0) = (360.0, 250.0, 50.0);
        let series = [
            ("a2ad", "#1f6feb", points("a2ad", key)),
            ("floor", "#888888", points("floor", key)),
        ];
        let max = series
            .iter()
            .flat_map(|s| s.2.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            .max(1e-9)
            * 1.1;
        let xs = [1.0f64, 64.0, 256.0];
        let xpos = |c: f64| x0 + w * (c.max(1.0).ln() / 256f64.ln());
        let ypos = |v: f64| y0 + h - h * v / max;
        let _ = write!(
            out,
            r#"<text x="{}" y="30" font-size="14" font-weight="bold">{title}</text>"#,
            x0
        );
        let _ = write!(
            out,
            r##"<line x1="{x0}" y1="{}" x2="{}" y2="{}" stroke="#333"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{}" stroke="#333"/>"##,
            y0 + h,
            x0 + w,
            y0 + h,
            y0 + h
        );
        for c in xs {
            let _ = write!(
                out,
                r#"<text x="{}" y="{}" text-anchor="middle">c={c}</text>"#,
                xpos(c),
                y0 + h + 18.0
            );
        }
        for k in 0..=4 {
            let v = max * k as f64 / 4.0;
            let _ = write!(
                out,
                r##"<text x="{}" y="{}" text-anchor="end">{:.0}</text><line x1="{x0}" y1="{}" x2="{}" y2="{}" stroke="#eee"/>"##,
                x0 - 6.0,
                ypos(v) + 4.0,
                v,
                ypos(v),
                x0 + w,
                ypos(v)
            );
        }
        for (j, (name, color, pts)) in series.iter().enumerate() {
            let path: Vec<String> = pts
                .iter()
                .map(|(c, v)| format!("{:.1},{:.1}", xpos(*c), ypos(*v)))
                .collect();
            let _ = write!(
                out,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
                path.join(" ")
            );
            for (c, v) in pts {
                let _ = write!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                    xpos(*c),
                    ypos(*v)
                );
            }
            let _ = write!(
                out,
                r#"<text x="{}" y="{}" fill="{color}">{name}</text>"#,
                x0 + w - 60.0,
                y0 + 14.0 + 16.0 * j as f64
            );
        }
    }
    out.push_str("</svg>\n");
    out
}
