//! Live counters: per agent for the card, and server-wide gauges. Plain atomics, so any
//! thread updates them without a lock or a message.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::model::TaskState;

/// Counters of one agent, reported in its card.
#[derive(Debug, Default)]
pub struct AgentMetrics {
    total_requests: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    canceled: AtomicU64,
    /// Sum of submission-to-terminal times of finished tasks, in microseconds.
    response_micros: AtomicU64,
}

/// A copy of an agent's counters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgentMetricsSnapshot {
    /// JSON-RPC requests for this agent, errors included.
    pub total_requests: u64,
    /// Mean milliseconds from submission to a terminal state (0 before any).
    pub average_response_time: f64,
    /// Completed ÷ terminal tasks × 100 (100 before any).
    pub success_rate: f64,
    /// Tasks that completed.
    pub completed: u64,
    /// Tasks that failed.
    pub failed: u64,
    /// Tasks that were canceled.
    pub canceled: u64,
}

impl AgentMetrics {
    /// Counts `n` JSON-RPC requests.
    pub fn requests(&self, n: u64) {
        self.total_requests.fetch_add(n, Relaxed);
    }

    /// Counts a task that reached `state` after `elapsed`.
    pub fn finished(&self, state: TaskState, elapsed: Duration) {
        let counter = match state {
            TaskState::Completed => &self.completed,
            TaskState::Failed | TaskState::Rejected => &self.failed,
            TaskState::Canceled => &self.canceled,
            _ => return,
        };
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.response_micros.fetch_add(micros, Relaxed);
        counter.fetch_add(1, Relaxed);
    }

    /// The counters as the card shows them.
    pub fn snapshot(&self) -> AgentMetricsSnapshot {
        let completed = self.completed.load(Relaxed);
        let failed = self.failed.load(Relaxed);
        let canceled = self.canceled.load(Relaxed);
        let terminal = completed + failed + canceled;
        let (average, rate) = if terminal == 0 {
            (0.0, 100.0)
        } else {
            let micros = self.response_micros.load(Relaxed) as f64;
            (
                micros / 1000.0 / terminal as f64,
                completed as f64 * 100.0 / terminal as f64,
            )
        };
        AgentMetricsSnapshot {
            total_requests: self.total_requests.load(Relaxed),
            average_response_time: (average * 1000.0).round() / 1000.0,
            success_rate: (rate * 100.0).round() / 100.0,
            completed,
            failed,
            canceled,
        }
    }
}

/// Server-wide gauges and counters.
#[derive(Debug, Default)]
pub struct Metrics {
    /// JSON-RPC requests by method and outcome, with latency histograms.
    pub requests: RequestMetrics,
    /// Tasks in `submitted` now.
    pub tasks_submitted: AtomicI64,
    /// Tasks in `working` now.
    pub tasks_working: AtomicI64,
    /// Task actors alive now.
    pub live_tasks: AtomicI64,
    /// Streams open now.
    pub open_streams: AtomicI64,
    /// Streams closed because their client fell too far behind.
    pub dropped_subscribers: AtomicU64,
    /// Task actors that failed (a bug: logged at error level).
    pub failed_actors: AtomicU64,
    /// Connections.
    pub connections: ConnectionMetrics,
}

/// Connection counters.
#[derive(Debug, Default)]
pub struct ConnectionMetrics {
    /// Connections open now.
    pub open: AtomicI64,
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// `accept` calls that failed (e.g. the process is out of file descriptors).
    pub accept_errors: AtomicU64,
    /// Closed because no first byte arrived in time.
    pub closed_first_byte: AtomicU64,
    /// Closed because they stayed idle with nothing in flight.
    pub closed_idle: AtomicU64,
    /// Closed because a response write made no progress.
    pub closed_write_stalled: AtomicU64,
}

/// Method labels of the request metrics: the dialect's methods (aliases folded in), then
/// `unknown` (no such method) and `invalid` (not a decodable request).
pub fn method_label(index: usize) -> &'static str {
    crate::rpc::seed::METHODS
        .get(index)
        .copied()
        .unwrap_or(if index == METHODS {
            "unknown"
        } else {
            "invalid"
        })
}

const METHODS: usize = crate::rpc::seed::METHODS.len();
const METHOD_SLOTS: usize = METHODS + 2;

/// Outcome labels: `ok` or a JSON-RPC error code.
pub const OUTCOME_CODES: [i64; 16] = [
    -32700, -32600, -32601, -32602, -32603, -32000, -32001, -32002, -32003, -32004, -32005, -32006,
    -32007, -32008, -32009, -32010,
];

/// Upper bounds (seconds) of the latency histogram buckets; `+Inf` is implied.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

const OUTCOMES: usize = OUTCOME_CODES.len() + 1;
const BUCKETS: usize = LATENCY_BUCKETS.len() + 1;

/// Request counters and latency histograms: fixed arrays of atomics, no lock on the hot path.
#[derive(Debug)]
pub struct RequestMetrics {
    counts: [[AtomicU64; OUTCOMES]; METHOD_SLOTS],
    buckets: [[AtomicU64; BUCKETS]; METHOD_SLOTS],
    sum_micros: [AtomicU64; METHOD_SLOTS],
}

impl Default for RequestMetrics {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            buckets: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            sum_micros: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl RequestMetrics {
    /// The label index of a method name (`None`: undecodable request).
    pub fn method_index(method: Option<&str>) -> usize {
        match method {
            None => METHODS + 1,
            Some("agent/getAuthenticatedExtendedCard") => {
                RequestMetrics::method_index(Some("agent/authenticatedExtendedCard"))
            }
            Some(m) => crate::rpc::seed::METHODS
                .iter()
                .position(|l| *l == m)
                .unwrap_or(METHODS),
        }
    }

    /// Counts one request with its outcome (`None` = success) and latency.
    pub fn record(&self, method: usize, error_code: Option<i64>, elapsed: Duration) {
        let outcome = match error_code {
            None => 0,
            Some(c) => OUTCOME_CODES
                .iter()
                .position(|x| *x == c)
                .map_or(0, |i| i + 1),
        };
        let secs = elapsed.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        let m = method.min(METHOD_SLOTS - 1);
        self.counts[m][outcome].fetch_add(1, Relaxed);
        self.buckets[m][bucket].fetch_add(1, Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros[m].fetch_add(micros, Relaxed);
    }

    /// Non-zero (method, outcome label, count) triples.
    pub fn counts(&self) -> Vec<(&'static str, String, u64)> {
        let mut out = Vec::new();
        for (m, row) in self.counts.iter().enumerate() {
            for (o, c) in row.iter().enumerate() {
                let n = c.load(Relaxed);
                if n > 0 {
                    let label = if o == 0 {
                        "ok".to_string()
                    } else {
                        OUTCOME_CODES[o - 1].to_string()
                    };
                    out.push((method_label(m), label, n));
                }
            }
        }
        out
    }

    /// Per method with traffic: (method, per-bucket counts, sum in seconds).
    pub fn histograms(&self) -> Vec<(&'static str, [u64; BUCKETS], f64)> {
        (0..METHOD_SLOTS)
            .filter_map(|m| {
                let b: [u64; BUCKETS] = std::array::from_fn(|i| self.buckets[m][i].load(Relaxed));
                (b.iter().sum::<u64>() > 0).then(|| {
                    (
                        method_label(m),
                        b,
                        self.sum_micros[m].load(Relaxed) as f64 / 1e6,
                    )
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_with_no_finished_task_reports_zero_time_and_full_success() {
        let m = AgentMetrics::default();
        let s = m.snapshot();
        assert_eq!((s.average_response_time, s.success_rate), (0.0, 100.0));
    }

    #[test]
    fn requests_are_counted_by_method_outcome_and_bucket() {
        let r = RequestMetrics::default();
        let send = RequestMetrics::method_index(Some("message/send"));
        r.record(send, None, Duration::from_micros(300));
        r.record(send, Some(-32602), Duration::from_millis(3));
        r.record(
            RequestMetrics::method_index(Some("agent/getAuthenticatedExtendedCard")),
            None,
            Duration::ZERO,
        );
        r.record(
            RequestMetrics::method_index(Some("nope")),
            Some(-32601),
            Duration::ZERO,
        );
        let counts = r.counts();
        assert!(counts.contains(&("message/send", "ok".into(), 1)));
        assert!(counts.contains(&("message/send", "-32602".into(), 1)));
        assert!(counts.contains(&("agent/authenticatedExtendedCard", "ok".into(), 1)));
        assert!(counts.contains(&("unknown", "-32601".into(), 1)));
        let h = r.histograms();
        let (_, buckets, sum) = h.iter().find(|(m, ..)| *m == "message/send").expect("send");
        assert_eq!(buckets[0], 1, "0.3 ms falls in the 0.5 ms bucket");
        assert_eq!(buckets[3], 1, "3 ms falls in the 5 ms bucket");
        assert!((sum - 0.0033).abs() < 1e-9);
    }

    #[test]
    fn success_rate_is_completed_over_terminal() {
        let m = AgentMetrics::default();
        m.finished(TaskState::Completed, Duration::from_millis(10));
        m.finished(TaskState::Completed, Duration::from_millis(20));
        m.finished(TaskState::Failed, Duration::from_millis(30));
        m.finished(TaskState::Canceled, Duration::from_millis(40));
        m.finished(TaskState::Working, Duration::from_millis(999));
        let s = m.snapshot();
        assert_eq!(s.success_rate, 50.0);
        assert_eq!(s.average_response_time, 25.0);
    }
}
