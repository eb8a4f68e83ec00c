//! Request counters and latency histograms per dialect, binding and method: fixed tables of
//! atomics built from each dialect's method table at start-up, no lock on the hot path.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::rpc::{Binding, Dialect};

/// Upper bounds (seconds) of the latency histogram buckets; `+Inf` is implied.
pub(crate) const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const BUCKETS: usize = LATENCY_BUCKETS.len() + 1;

/// The codes of JSON-RPC itself, which every dialect answers with.
const JSON_RPC_CODES: [i64; 5] = [-32700, -32600, -32601, -32602, -32603];

/// Every (dialect, binding) pair a request can come by, one table each.
const CHANNELS: [(Dialect, Binding); 5] = [
    (Dialect::Seed, Binding::JsonRpc),
    (
        Dialect::A2a(crate::rpc::a2a::Version::V10),
        Binding::JsonRpc,
    ),
    (
        Dialect::A2a(crate::rpc::a2a::Version::V03),
        Binding::JsonRpc,
    ),
    (Dialect::A2a(crate::rpc::a2a::Version::V10), Binding::Rest),
    (Dialect::A2a(crate::rpc::a2a::Version::V10), Binding::Grpc),
];

/// Where a request goes in the tables: its dialect and binding, and its method.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    dialect: usize,
    method: usize,
}

struct Table {
    dialect: Dialect,
    binding: Binding,
    /// The method labels: the dialect's methods, then `unknown`, then `invalid`.
    methods: Vec<&'static str>,
    /// The outcome labels: `ok`, JSON-RPC's codes, the dialect's codes, then `other`.
    outcomes: Vec<String>,
    codes: Vec<i64>,
    counts: Vec<AtomicU64>,
    buckets: Vec<AtomicU64>,
    sums: Vec<AtomicU64>,
}

/// Request metrics of every dialect.
pub(crate) struct RequestMetrics {
    tables: Vec<Table>,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        let tables = CHANNELS
            .iter()
            .map(|&(dialect, binding)| {
                let mut methods: Vec<&'static str> = dialect.methods().to_vec();
                methods.extend(["unknown", "invalid"]);
                let mut codes: Vec<i64> = JSON_RPC_CODES.to_vec();
                codes.extend(
                    dialect
                        .codes()
                        .iter()
                        .filter(|c| !JSON_RPC_CODES.contains(c)),
                );
                let mut outcomes = vec!["ok".to_string()];
                outcomes.extend(codes.iter().map(i64::to_string));
                outcomes.push("other".into());
                let n = methods.len();
                Table {
                    dialect,
                    binding,
                    counts: (0..n * outcomes.len()).map(|_| AtomicU64::new(0)).collect(),
                    buckets: (0..n * BUCKETS).map(|_| AtomicU64::new(0)).collect(),
                    sums: (0..n).map(|_| AtomicU64::new(0)).collect(),
                    methods,
                    outcomes,
                    codes,
                }
            })
            .collect();
        Self { tables }
    }
}

impl RequestMetrics {
    /// The slot of a method of a dialect over a binding (`None`: the request could not be
    /// decoded).
    pub(crate) fn slot(&self, dialect: Dialect, binding: Binding, method: Option<&str>) -> Slot {
        let d = CHANNELS
            .iter()
            .position(|x| *x == (dialect, binding))
            .unwrap_or(0);
        let t = &self.tables[d];
        let known = t.methods.len() - 2;
        let method = match method {
            None => known + 1,
            Some(m) => dialect
                .method_label(m)
                .and_then(|label| t.methods.iter().position(|x| *x == label))
                .unwrap_or(known),
        };
        Slot { dialect: d, method }
    }

    /// Counts one request with its outcome (`None` = success) and latency. A code the
    /// tables do not know counts as `other`, never as `ok`.
    pub(crate) fn record(&self, slot: Slot, error_code: Option<i64>, elapsed: Duration) {
        let t = &self.tables[slot.dialect];
        let outcome = match error_code {
            None => 0,
            Some(c) => t
                .codes
                .iter()
                .position(|x| *x == c)
                .map_or(t.outcomes.len() - 1, |i| i + 1),
        };
        let secs = elapsed.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        t.counts[slot.method * t.outcomes.len() + outcome].fetch_add(1, Relaxed);
        t.buckets[slot.method * BUCKETS + bucket].fetch_add(1, Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        t.sums[slot.method].fetch_add(micros, Relaxed);
    }

    /// Non-zero (dialect, binding, method, outcome label, count).
    pub(crate) fn counts(&self) -> Vec<(&'static str, &'static str, &'static str, &str, u64)> {
        let mut out = Vec::new();
        for t in &self.tables {
            for (m, method) in t.methods.iter().enumerate() {
                for (o, outcome) in t.outcomes.iter().enumerate() {
                    let n = t.counts[m * t.outcomes.len() + o].load(Relaxed);
                    if n > 0 {
                        out.push((
                            t.dialect.name(),
                            t.binding.name(),
                            *method,
                            outcome.as_str(),
                            n,
                        ));
                    }
                }
            }
        }
        out
    }

    /// Per (dialect, binding, method) with traffic: per-bucket counts and the sum in seconds.
    #[allow(clippy::type_complexity)]
    pub(crate) fn histograms(
        &self,
    ) -> Vec<(
        &'static str,
        &'static str,
        &'static str,
        [u64; BUCKETS],
        f64,
    )> {
        let mut out = Vec::new();
        for t in &self.tables {
            for (m, method) in t.methods.iter().enumerate() {
                let b: [u64; BUCKETS] =
                    std::array::from_fn(|i| t.buckets[m * BUCKETS + i].load(Relaxed));
                if b.iter().sum::<u64>() > 0 {
                    let sum = t.sums[m].load(Relaxed) as f64 / 1e6;
                    out.push((t.dialect.name(), t.binding.name(), *method, b, sum));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_dialect_method_outcome_and_bucket() {
        let r = RequestMetrics::default();
        let send = r.slot(Dialect::Seed, Binding::JsonRpc, Some("message/send"));
        r.record(send, None, Duration::from_micros(300));
        r.record(send, Some(-32602), Duration::from_millis(3));
        r.record(send, Some(-31999), Duration::ZERO);
        let card = r.slot(
            Dialect::Seed,
            Binding::JsonRpc,
            Some("agent/getAuthenticatedExtendedCard"),
        );
        r.record(card, None, Duration::ZERO);
        let unknown = r.slot(Dialect::Seed, Binding::JsonRpc, Some("nope"));
        r.record(unknown, Some(-32601), Duration::ZERO);
        let counts = r.counts();
        assert!(counts.contains(&("seed", "jsonrpc", "message/send", "ok", 1)));
        assert!(counts.contains(&("seed", "jsonrpc", "message/send", "-32602", 1)));
        assert!(
            counts.contains(&("seed", "jsonrpc", "message/send", "other", 1)),
            "not ok"
        );
        assert!(counts.contains(&(
            "seed",
            "jsonrpc",
            "agent/authenticatedExtendedCard",
            "ok",
            1
        )));
        assert!(counts.contains(&("seed", "jsonrpc", "unknown", "-32601", 1)));
        let h = r.histograms();
        let (_, _, _, buckets, sum) = h
            .iter()
            .find(|(_, _, m, ..)| *m == "message/send")
            .expect("send");
        assert_eq!(buckets[0], 2, "0.3 ms and 0 fall in the 0.5 ms bucket");
        assert_eq!(buckets[3], 1, "3 ms falls in the 5 ms bucket");
        assert!((sum - 0.0033).abs() < 1e-9);
    }
}
