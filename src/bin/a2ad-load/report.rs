//! What a run reports: the numbers, the printed table, and the progress line.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::client::{self, Stats};
use crate::{Scenario, procs};

/// One measured run.
pub(crate) struct Report {
    scenario: Scenario,
    target: &'static str,
    connections: usize,
    seconds: f64,
    pub(crate) requests: u64,
    pub(crate) latencies_ms: [f64; 4],
    errors: BTreeMap<String, u64>,
    peak_rss_mib: Option<f64>,
    cpu_per_1k: Option<f64>,
    pub(crate) extra: BTreeMap<&'static str, Value>,
}

impl Report {
    pub(crate) fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds.max(1e-9)
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "scenario": format!("{:?}", self.scenario).to_lowercase(),
            "target": self.target,
            "connections": self.connections,
            "seconds": self.seconds,
            "requests": self.requests,
            "rps": self.rps(),
            "p50_ms": self.latencies_ms[0], "p90_ms": self.latencies_ms[1],
            "p99_ms": self.latencies_ms[2], "max_ms": self.latencies_ms[3],
            "errors": self.errors,
            "peak_rss_mib": self.peak_rss_mib,
            "cpu_seconds_per_1k": self.cpu_per_1k,
            "extra": self.extra,
        })
    }

    pub(crate) fn print(&self) {
        let errors = if self.errors.is_empty() {
            "none".to_string()
        } else {
            self.errors
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "{:<8} {:<5} c={:<5} {:>10.0} req/s  p50 {:>7.2} ms  p90 {:>7.2} ms  p99 {:>7.2} ms  max {:>8.2} ms  errors: {errors}{}{}",
            format!("{:?}", self.scenario).to_lowercase(),
            self.target,
            self.connections,
            self.rps(),
            self.latencies_ms[0],
            self.latencies_ms[1],
            self.latencies_ms[2],
            self.latencies_ms[3],
            self.peak_rss_mib
                .map(|m| format!("  peak RSS {m:.1} MiB"))
                .unwrap_or_default(),
            self.cpu_per_1k
                .map(|c| format!("  CPU {c:.3} s/1k req"))
                .unwrap_or_default(),
        );
        for (k, v) in &self.extra {
            println!("         {k}: {v}");
        }
    }
}

pub(crate) fn report(
    scenario: Scenario,
    target: &'static str,
    connections: usize,
    seconds: f64,
    mut stats: Stats,
    pid: Option<u32>,
    cpu0: Option<f64>,
) -> Report {
    stats.latencies.sort_unstable();
    let l = &stats.latencies;
    let requests = l.len() as u64;
    let cpu_per_1k = match (cpu0, pid.and_then(procs::cpu_seconds)) {
        (Some(a), Some(b)) if requests > 0 => Some((b - a) / requests as f64 * 1000.0),
        _ => None,
    };
    Report {
        scenario,
        target,
        connections,
        seconds,
        requests,
        latencies_ms: [
            client::percentile(l, 0.50),
            client::percentile(l, 0.90),
            client::percentile(l, 0.99),
            client::percentile(l, 1.0),
        ],
        errors: stats.errors,
        peak_rss_mib: pid
            .and_then(procs::rss)
            .map(|(_, peak)| peak as f64 / 1048576.0),
        cpu_per_1k,
        extra: BTreeMap::new(),
    }
}

/// A status line on stderr while a run lasts, only when stderr is a terminal.
pub(crate) fn progress_line(label: String, seconds: f64) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    if !std::io::stderr().is_terminal() {
        return done;
    }
    let d = done.clone();
    let start = Instant::now();
    let base = client::DONE.load(Relaxed);
    tokio::spawn(async move {
        while !d.load(Relaxed) {
            let n = client::DONE.load(Relaxed) - base;
            let t = start.elapsed().as_secs_f64();
            eprint!(
                "\r{label}: {t:5.1}/{seconds:.0} s  {n:>10} requests  {:>9.0} req/s ",
                n as f64 / t.max(1e-3)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        eprint!("\r{:80}\r", "");
    });
    done
}
