//! `GET /metrics`: the server's counters in the Prometheus text format (0.0.4).
//! Served without a key: it holds only aggregate counts, never a principal's data.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;

use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

use super::{App, Body, LATENCY_BUCKETS};

/// The /metrics response.
pub(crate) fn response(app: &App) -> Response<Body> {
    let mut r = Response::new(Body::full(render(app)));
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    r
}

/// Renders every metric.
pub(crate) fn render(app: &App) -> String {
    let runtime = &app.runtime;
    let m = runtime.metrics();
    let mut out = String::with_capacity(4096);
    let counts: Vec<(String, f64)> = app
        .requests
        .counts()
        .into_iter()
        .map(|(dialect, binding, method, outcome, n)| {
            (
                format!(
                    "dialect=\"{dialect}\",binding=\"{binding}\",method=\"{method}\",outcome=\"{outcome}\""
                ),
                n as f64,
            )
        })
        .collect();
    counter(
        &mut out,
        "a2ad_config_reloads_total",
        "Configuration reloads (SIGHUP): applied (ok) or refused, the running configuration kept (error).",
        &[
            ("outcome=\"ok\"", app.reloads[0].load(Relaxed) as f64),
            ("outcome=\"error\"", app.reloads[1].load(Relaxed) as f64),
        ],
    );
    counter(
        &mut out,
        "a2ad_requests_total",
        "Requests by dialect, binding, method and outcome (ok, the error code, or other).",
        &refs(&counts),
    );
    let _ = writeln!(
        out,
        "# HELP a2ad_request_duration_seconds Time from decoding a request to its response (to the start of the stream for streams).\n# TYPE a2ad_request_duration_seconds histogram"
    );
    for (dialect, binding, method, buckets, sum) in app.requests.histograms() {
        let labels = format!("dialect=\"{dialect}\",binding=\"{binding}\",method=\"{method}\"");
        let mut cumulative = 0;
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += buckets[i];
            let _ = writeln!(
                out,
                "a2ad_request_duration_seconds_bucket{{{labels},le=\"{le}\"}} {cumulative}"
            );
        }
        cumulative += buckets[LATENCY_BUCKETS.len()];
        let _ = writeln!(
            out,
            "a2ad_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {cumulative}"
        );
        let _ = writeln!(out, "a2ad_request_duration_seconds_sum{{{labels}}} {sum}");
        let _ = writeln!(
            out,
            "a2ad_request_duration_seconds_count{{{labels}}} {cumulative}"
        );
    }

    gauge(
        &mut out,
        "a2ad_tasks",
        "Unfinished tasks by state.",
        &[
            (
                "state=\"submitted\"",
                m.tasks_submitted.load(Relaxed).max(0) as f64,
            ),
            (
                "state=\"working\"",
                m.tasks_working.load(Relaxed).max(0) as f64,
            ),
        ],
    );
    let mut finished = Vec::new();
    let mut running = Vec::new();
    let mut queued = Vec::new();
    let mut ids: Vec<_> = runtime
        .config()
        .agents
        .iter()
        .map(|a| a.id.clone())
        .collect();
    ids.sort();
    for id in &ids {
        let Some(agent) = runtime.agent(&crate::AgentId::new(id.as_str())) else {
            continue;
        };
        let s = agent.metrics.snapshot();
        for (state, n) in [
            ("completed", s.completed),
            ("failed", s.failed),
            ("canceled", s.canceled),
        ] {
            finished.push((format!("agent=\"{id}\",state=\"{state}\""), n as f64));
        }
        let (r, q) = agent.scheduler.depth();
        running.push((format!("agent=\"{id}\""), r as f64));
        queued.push((format!("agent=\"{id}\""), q as f64));
    }
    upstreams(&mut out, runtime, &ids);
    counter(
        &mut out,
        "a2ad_tasks_finished_total",
        "Tasks that reached a terminal state, by agent and state.",
        &refs(&finished),
    );
    gauge(
        &mut out,
        "a2ad_agent_tasks_running",
        "Tasks holding one of the agent's concurrency slots.",
        &refs(&running),
    );
    gauge(
        &mut out,
        "a2ad_agent_queue_depth",
        "Tasks waiting in the agent's queue.",
        &refs(&queued),
    );
    gauge(
        &mut out,
        "a2ad_request_body_bytes_held",
        "Request body bytes held now by requests being read or handled (at most server.max_buffered_body_bytes).",
        &[("", app.bodies.held() as f64)],
    );
    gauge(
        &mut out,
        "a2ad_conversations",
        "Conversations kept (at most server.max_contexts).",
        &[("", m.conversations.kept.load(Relaxed) as f64)],
    );
    gauge(
        &mut out,
        "a2ad_conversation_bytes",
        "About how many bytes the kept conversations' turns hold (at most server.max_context_bytes, beyond a conversation with a task in flight).",
        &[("", m.conversations.bytes.load(Relaxed) as f64)],
    );
    gauge(
        &mut out,
        "a2ad_task_actors",
        "Live task actors.",
        &[("", m.live_tasks.load(Relaxed).max(0) as f64)],
    );
    let store = runtime.store_stats();
    gauge(
        &mut out,
        "a2ad_finished_tasks_retained",
        "Finished tasks kept for the retention period.",
        &[("", store.finished_tasks as f64)],
    );
    gauge(
        &mut out,
        "a2ad_finished_tasks_retained_bytes",
        "About how many bytes the retained finished tasks hold (budget: server.max_retained_bytes).",
        &[("", store.finished_bytes as f64)],
    );
    gauge(
        &mut out,
        "a2ad_store_pending_writes",
        "Writes handed to the store and not yet durable (bound: store.max_pending_writes).",
        &[("", store.pending_writes as f64)],
    );
    counter(
        &mut out,
        "a2ad_store_commits_total",
        "Store transactions committed (one fdatasync each).",
        &[("", store.commits as f64)],
    );
    counter(
        &mut out,
        "a2ad_store_commit_seconds_total",
        "Time spent in committed store transactions, from a batch's start to durable (divide by a2ad_store_commits_total for the mean).",
        &[("", store.commit_micros as f64 / 1e6)],
    );
    counter(
        &mut out,
        "a2ad_store_writes_total",
        "Writes made durable.",
        &[("", store.committed_writes as f64)],
    );
    gauge(
        &mut out,
        "a2ad_store_file_bytes",
        "Size of the store file (0 in memory).",
        &[("", store.file_bytes as f64)],
    );
    gauge(
        &mut out,
        "a2ad_store_failing",
        "1 while store commits fail (nothing is acknowledged until they succeed again).",
        &[("", if store.failing { 1.0 } else { 0.0 })],
    );
    gauge(
        &mut out,
        "a2ad_streams_open",
        "Open SSE streams.",
        &[("", m.open_streams.load(Relaxed).max(0) as f64)],
    );
    counter(
        &mut out,
        "a2ad_stream_subscribers_dropped_total",
        "Streams closed because their client fell too far behind.",
        &[("", m.dropped_subscribers.load(Relaxed) as f64)],
    );
    gauge(
        &mut out,
        "a2ad_remote_followers",
        "Streams and waiting callers following a task another node runs (cluster).",
        &[("", m.remote_followers.load(Relaxed).max(0) as f64)],
    );
    cluster(&mut out, runtime);
    counter(
        &mut out,
        "a2ad_task_actor_failures_total",
        "Task actors that failed (a bug; logged).",
        &[("", m.failed_actors.load(Relaxed) as f64)],
    );
    let c = &m.connections;
    gauge(
        &mut out,
        "a2ad_connections_open",
        "Open client connections.",
        &[("", c.open.load(Relaxed).max(0) as f64)],
    );
    counter(
        &mut out,
        "a2ad_connections_accepted_total",
        "Client connections accepted.",
        &[("", c.accepted.load(Relaxed) as f64)],
    );
    counter(
        &mut out,
        "a2ad_accept_errors_total",
        "Failed accept calls (e.g. out of file descriptors); the listener backs off.",
        &[("", c.accept_errors.load(Relaxed) as f64)],
    );
    counter(
        &mut out,
        "a2ad_connections_closed_total",
        "Connections the server closed, by reason.",
        &[
            (
                "reason=\"first_byte_timeout\"",
                c.closed_first_byte.load(Relaxed) as f64,
            ),
            (
                "reason=\"header_timeout\"",
                c.closed_header.load(Relaxed) as f64,
            ),
            (
                "reason=\"idle_timeout\"",
                c.closed_idle.load(Relaxed) as f64,
            ),
            (
                "reason=\"write_stalled\"",
                c.closed_write_stalled.load(Relaxed) as f64,
            ),
            (
                "reason=\"tls_handshake\"",
                c.closed_tls_handshake.load(Relaxed) as f64,
            ),
        ],
    );
    let w = runtime.webhook_metrics();
    counter(
        &mut out,
        "a2ad_webhook_deliveries_total",
        "Webhook deliveries a receiver accepted.",
        &[("", w.delivered.load(Relaxed) as f64)],
    );
    counter(
        &mut out,
        "a2ad_webhook_retries_total",
        "Webhook retry attempts.",
        &[("", w.retries.load(Relaxed) as f64)],
    );
    counter(
        &mut out,
        "a2ad_webhook_failures_total",
        "Webhook deliveries that finally failed.",
        &[("", w.failed.load(Relaxed) as f64)],
    );
    counter(
        &mut out,
        "a2ad_webhook_discards_total",
        "Webhook deliveries dropped without an outcome (pool full, shutdown).",
        &[("", w.discarded.load(Relaxed) as f64)],
    );
    counter(
        &mut out,
        "a2ad_webhook_skipped_total",
        "Webhook events not sent because their configuration is inactive (deactivated).",
        &[("", w.skipped.load(Relaxed) as f64)],
    );
    gauge(
        &mut out,
        "a2ad_webhook_pending",
        "Webhook deliveries accepted and not finished.",
        &[("", w.pending.load(Relaxed).max(0) as f64)],
    );
    out
}

fn refs(v: &[(String, f64)]) -> Vec<(&str, f64)> {
    v.iter().map(|(l, n)| (l.as_str(), *n)).collect()
}

/// The cluster family: one series per metric, labelled with this node's id.
fn cluster(out: &mut String, runtime: &crate::Runtime) {
    let Some((node, c)) = runtime.cluster_stats() else {
        return;
    };
    let label = format!("node=\"{node}\"");
    let l = label.as_str();
    let average = if c.appends == 0 {
        0.0
    } else {
        c.append_micros_sum as f64 / c.appends as f64 / 1e6
    };
    gauge(
        out,
        "a2ad_cluster_lease_age_seconds",
        "Seconds since this node last renewed its lease.",
        &[(l, c.lease_age_ms as f64 / 1e3)],
    );
    gauge(
        out,
        "a2ad_cluster_live_nodes",
        "Nodes holding a fresh lease, this one included.",
        &[(l, c.live_nodes as f64)],
    );
    gauge(
        out,
        "a2ad_cluster_self_fenced",
        "1 while this node cannot hold its lease (agents stopped, /healthz 503).",
        &[(l, if c.self_fenced { 1.0 } else { 0.0 })],
    );
    counter(
        out,
        "a2ad_cluster_self_fences_total",
        "Times this node self-fenced (each ends its incarnation: its tasks are taken up again).",
        &[(l, c.self_fences as f64)],
    );
    counter(
        out,
        "a2ad_cluster_takeovers_total",
        "Tasks this node took over from dead nodes.",
        &[(l, c.takeovers as f64)],
    );
    counter(
        out,
        "a2ad_cluster_fenced_total",
        "Tasks taken from this node by another (stopped here).",
        &[(l, c.fenced as f64)],
    );
    counter(
        out,
        "a2ad_cluster_claimed_deliveries_total",
        "Webhook deliveries this node claimed from other nodes.",
        &[(l, c.claimed_deliveries as f64)],
    );
    gauge(
        out,
        "a2ad_cluster_outbox_depth",
        "Webhook deliveries waiting in the shared outbox (all nodes; refreshed every 5 s).",
        &[(l, c.outbox_depth as f64)],
    );
    counter(
        out,
        "a2ad_cluster_appends_total",
        "Batches of appends committed to PostgreSQL.",
        &[(l, c.appends as f64)],
    );
    gauge(
        out,
        "a2ad_cluster_append_seconds_avg",
        "Average time of a committed batch (transaction round trips and commit).",
        &[(l, average)],
    );
    gauge(
        out,
        "a2ad_cluster_append_seconds_max",
        "Slowest committed batch since start.",
        &[(l, c.append_micros_max as f64 / 1e6)],
    );
    gauge(
        out,
        "a2ad_cluster_append_seconds_p50",
        "Median commit time of the latest 4096 batches.",
        &[(l, c.append_micros_p50 as f64 / 1e6)],
    );
    gauge(
        out,
        "a2ad_cluster_append_seconds_p99",
        "99th percentile commit time of the latest 4096 batches.",
        &[(l, c.append_micros_p99 as f64 / 1e6)],
    );
    counter(
        out,
        "a2ad_cluster_hints_total",
        "Wake-ups of followers of tasks run by other nodes.",
        &[(l, c.hints as f64)],
    );
}

/// The `a2a` backends' upstreams: calls, failures by kind, time to answer.
fn upstreams(out: &mut String, runtime: &crate::Runtime, ids: &[String]) {
    use crate::metrics::{UPSTREAM_ERROR_KINDS, UPSTREAM_LATENCY_BUCKETS};
    let views: Vec<_> = ids
        .iter()
        .filter_map(|id| {
            let agent = runtime.agent(&crate::AgentId::new(id.as_str()))?;
            Some((id, agent.backend.upstream()?))
        })
        .collect();
    if views.is_empty() {
        return;
    }
    let mut requests = Vec::new();
    let mut errors = Vec::new();
    for (id, v) in &views {
        requests.push((
            format!("agent=\"{id}\""),
            v.metrics.requests.load(Relaxed) as f64,
        ));
        for (kind, n) in UPSTREAM_ERROR_KINDS.iter().zip(v.metrics.errors()) {
            errors.push((format!("agent=\"{id}\",kind=\"{kind}\""), n as f64));
        }
    }
    counter(
        out,
        "a2ad_upstream_requests_total",
        "Calls to upstream A2A agents (the a2a backend), by agent.",
        &refs(&requests),
    );
    counter(
        out,
        "a2ad_upstream_errors_total",
        "Upstream failures by agent and kind (connect, timeout, refused, redirect, http, auth, garbage, error, too_large, failed).",
        &refs(&errors),
    );
    let _ = writeln!(
        out,
        "# HELP a2ad_upstream_request_duration_seconds Time from an upstream call to its answer (to the start of a stream).\n# TYPE a2ad_upstream_request_duration_seconds histogram"
    );
    for (id, v) in &views {
        let (buckets, sum) = v.metrics.histogram();
        let mut cumulative = 0;
        for (i, le) in UPSTREAM_LATENCY_BUCKETS.iter().enumerate() {
            cumulative += buckets[i];
            let _ = writeln!(
                out,
                "a2ad_upstream_request_duration_seconds_bucket{{agent=\"{id}\",le=\"{le}\"}} {cumulative}"
            );
        }
        cumulative += buckets[UPSTREAM_LATENCY_BUCKETS.len()];
        let _ = writeln!(
            out,
            "a2ad_upstream_request_duration_seconds_bucket{{agent=\"{id}\",le=\"+Inf\"}} {cumulative}\na2ad_upstream_request_duration_seconds_sum{{agent=\"{id}\"}} {sum}\na2ad_upstream_request_duration_seconds_count{{agent=\"{id}\"}} {cumulative}"
        );
    }
}

fn gauge(out: &mut String, name: &str, help: &str, samples: &[(&str, f64)]) {
    series(out, name, "gauge", help, samples);
}

fn counter(out: &mut String, name: &str, help: &str, samples: &[(&str, f64)]) {
    series(out, name, "counter", help, samples);
}

fn series(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(&str, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in samples {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {value}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
}
