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
    /// The other nodes' counters, in [`AgentMetrics::raw`]'s order (a cluster: the card
    /// shows the whole service).
    others: [AtomicU64; 5],
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

    /// This node's own counters: requests, completed, failed, canceled, response µs.
    pub fn raw(&self) -> [u64; 5] {
        [
            self.total_requests.load(Relaxed),
            self.completed.load(Relaxed),
            self.failed.load(Relaxed),
            self.canceled.load(Relaxed),
            self.response_micros.load(Relaxed),
        ]
    }

    /// Sets the other nodes' counters (in [`AgentMetrics::raw`]'s order).
    pub fn set_others(&self, others: [u64; 5]) {
        for (slot, v) in self.others.iter().zip(others) {
            slot.store(v, Relaxed);
        }
    }

    /// The counters as the card shows them.
    pub fn snapshot(&self) -> AgentMetricsSnapshot {
        let other = |i: usize| self.others[i].load(Relaxed);
        let completed = self.completed.load(Relaxed) + other(1);
        let failed = self.failed.load(Relaxed) + other(2);
        let canceled = self.canceled.load(Relaxed) + other(3);
        let terminal = completed + failed + canceled;
        let (average, rate) = if terminal == 0 {
            (0.0, 100.0)
        } else {
            let micros = (self.response_micros.load(Relaxed) + other(4)) as f64;
            (
                micros / 1000.0 / terminal as f64,
                completed as f64 * 100.0 / terminal as f64,
            )
        };
        AgentMetricsSnapshot {
            total_requests: self.total_requests.load(Relaxed) + other(0),
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
    /// Streams and waiters following a task that runs on another node (cluster).
    pub remote_followers: AtomicI64,
    /// Connections.
    pub connections: ConnectionMetrics,
    /// Conversations kept (shared with the context actor, which sets them).
    pub conversations: std::sync::Arc<ConversationMetrics>,
}

/// The conversations kept now.
#[derive(Debug, Default)]
pub struct ConversationMetrics {
    /// Conversations kept.
    pub kept: AtomicU64,
    /// About how many bytes their turns hold (bounded by `server.max_context_bytes`).
    pub bytes: AtomicU64,
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
    /// Closed because their first bytes began the HTTP/2 preface and the rest of it did not
    /// come within the header read time-out.
    pub closed_header: AtomicU64,
    /// Closed because they stayed idle with nothing in flight.
    pub closed_idle: AtomicU64,
    /// Closed because a response write made no progress.
    pub closed_write_stalled: AtomicU64,
    /// Closed because the TLS handshake failed (a client certificate refused, no common
    /// protocol version or cipher, not TLS at all) or did not finish in time.
    pub closed_tls_handshake: AtomicU64,
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

/// Webhook counters.
#[derive(Debug, Default)]
pub struct WebhookMetrics {
    /// Deliveries a receiver accepted (2xx).
    pub delivered: AtomicU64,
    /// Retry attempts made.
    pub retries: AtomicU64,
    /// Deliveries that finally failed (retries exhausted, or a non-retryable answer).
    pub failed: AtomicU64,
    /// Deliveries dropped without an outcome (pool full, shutdown).
    pub discarded: AtomicU64,
    /// Events not sent because their configuration is inactive (deactivated after too many
    /// failures), when their turn in the lane came.
    pub skipped: AtomicU64,
    /// Deliveries accepted and not finished yet.
    pub pending: AtomicI64,
}

/// The kinds of upstream failure counted by `a2ad_upstream_errors_total{kind}`.
pub const UPSTREAM_ERROR_KINDS: [&str; 10] = [
    "connect",
    "timeout",
    "refused",
    "redirect",
    "http",
    "auth",
    "garbage",
    "error",
    "too_large",
    "failed",
];

/// The upper bounds of `a2ad_upstream_request_duration_seconds`' buckets.
pub const UPSTREAM_LATENCY_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Counters of one upstream A2A agent (the `a2a` backend): calls, failures by kind, and
/// the time to each call's answer (to its first byte of a stream).
#[derive(Debug, Default)]
pub struct UpstreamMetrics {
    /// Calls made.
    pub requests: AtomicU64,
    errors: [AtomicU64; UPSTREAM_ERROR_KINDS.len()],
    buckets: [AtomicU64; UPSTREAM_LATENCY_BUCKETS.len() + 1],
    latency_micros: AtomicU64,
}

impl UpstreamMetrics {
    /// Counts a failure of `kind` (one of [`UPSTREAM_ERROR_KINDS`]; another counts as
    /// `error`).
    pub fn error(&self, kind: &str) {
        let i = UPSTREAM_ERROR_KINDS
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(7);
        self.errors[i].fetch_add(1, Relaxed);
    }

    /// Records one call's time to its answer.
    pub fn latency(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let i = UPSTREAM_LATENCY_BUCKETS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(UPSTREAM_LATENCY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.latency_micros
            .fetch_add(u64::try_from(took.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }

    /// Failures by kind, in [`UPSTREAM_ERROR_KINDS`]' order.
    pub fn errors(&self) -> [u64; UPSTREAM_ERROR_KINDS.len()] {
        std::array::from_fn(|i| self.errors[i].load(Relaxed))
    }

    /// The latency histogram: calls per bucket (the last past every bound), and the sum
    /// in seconds.
    pub fn histogram(&self) -> ([u64; UPSTREAM_LATENCY_BUCKETS.len() + 1], f64) {
        (
            std::array::from_fn(|i| self.buckets[i].load(Relaxed)),
            self.latency_micros.load(Relaxed) as f64 / 1e6,
        )
    }
}
