//! The scenarios beyond plain request load: following streams, holding connections,
//! webhook delivery and the soak run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::client::{self, Conn, Kind, Stats, Target};
use crate::report::{Report, progress_line, report};
use crate::{Cli, Scenario, WEBHOOK_SECRET, drive, measured, procs, receiver};

/// The `follow` scenario: `-c` workers, each streaming a task on one node and following it
/// from another until its end, for `-d` seconds. Latency per event seen by the follower:
/// its arrival minus the event's timestamp (set by the runner as it made the event; one
/// clock, this machine's) — the runner's append, the hint and the follower's read.
pub(crate) async fn follow(cli: &Cli, base: &str, key: &str) -> Result<Report, String> {
    let other = cli
        .follow_url
        .clone()
        .ok_or("--follow-url is required for follow")?;
    let other = other.trim_end_matches('/').to_string();
    let http = reqwest::Client::new();
    let end = Instant::now() + Duration::from_secs_f64(cli.duration);
    let t0 = Instant::now();
    let workers: Vec<_> = (0..cli.connections)
        .map(|_| {
            let (http, base, other, key) = (
                http.clone(),
                base.to_string(),
                other.clone(),
                key.to_string(),
            );
            let agent = cli.slow_agent.clone();
            tokio::spawn(async move {
                let mut stats = client::Stats::default();
                while Instant::now() < end {
                    if let Err(e) = follow_one(&http, &base, &other, &key, &agent, &mut stats).await
                    {
                        stats.error(e);
                    }
                }
                stats
            })
        })
        .collect();
    let mut stats = client::Stats::default();
    for w in workers {
        if let Ok(s) = w.await {
            stats.merge(s);
        }
    }
    let mut r = report(
        Scenario::Follow,
        "a2ad",
        cli.connections,
        t0.elapsed().as_secs_f64(),
        stats,
        None,
        None,
    );
    r.extra.insert(
        "measures",
        json!("events followed across nodes; latency = arrival at the follower - event time"),
    );
    Ok(r)
}

pub(crate) async fn follow_one(
    http: &reqwest::Client,
    base: &str,
    other: &str,
    key: &str,
    agent: &str,
    stats: &mut client::Stats,
) -> Result<(), String> {
    let post = |url: String, body: String| {
        http.post(url)
            .header("x-api-key", key)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .timeout(Duration::from_secs(120))
            .body(body)
            .send()
    };
    let body = client::send_body("message/stream", "follow me", "");
    let mut runner = post(format!("{base}/api/v1/a2a/{agent}"), body)
        .await
        .map_err(|e| format!("stream: {e}"))?;
    let mut seen = Vec::new();
    let id = loop {
        let chunk = runner.chunk().await.map_err(|e| e.to_string())?;
        let Some(chunk) = chunk else {
            return Err("stream ended early".into());
        };
        seen.extend_from_slice(&chunk);
        // The first SSE event's data carries the task.
        let text = String::from_utf8_lossy(&seen).into_owned();
        if let Some(id) = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .find_map(|d| client::task_id(d.trim().as_bytes()))
        {
            break id;
        }
    };
    // The runner's stream is drained in the background (its client keeps reading).
    tokio::spawn(async move { while let Ok(Some(_)) = runner.chunk().await {} });
    let since = chrono::Utc::now();
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tasks/resubscribe","params":{{"id":"{id}"}}}}"#
    );
    let mut follower = post(format!("{other}/api/v1/a2a/{agent}"), body)
        .await
        .map_err(|e| format!("resubscribe: {e}"))?;
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = follower.chunk().await.map_err(|e| e.to_string())? {
        let now = chrono::Utc::now();
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.windows(2).position(|w| w == b"\n\n") {
            let frame: Vec<u8> = buf.drain(..pos + 2).collect();
            let text = String::from_utf8_lossy(&frame);
            let Some(data) = text.lines().find_map(|l| l.strip_prefix("data:")) else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data.trim()) else {
                continue;
            };
            let status = &v["result"]["status"];
            if let Some(at) = status["timestamp"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            {
                let at = at.with_timezone(&chrono::Utc);
                if at >= since {
                    let us = (now - at).num_microseconds().unwrap_or(0).max(0);
                    stats.latencies.push(u32::try_from(us).unwrap_or(u32::MAX));
                }
            }
            if v["result"]["final"] == true {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Opens `streams` streams at once on the slow agent and holds each to its final event.
pub(crate) async fn hold(
    cli: &Cli,
    target: Arc<Target>,
    pid: Option<u32>,
) -> Result<Report, String> {
    let n = cli.streams;
    let opened = Arc::new(AtomicU64::new(0));
    let connects = Arc::new(tokio::sync::Semaphore::new(256));
    let t0 = Instant::now();
    let progress = progress_line(
        format!("hold {n} streams"),
        (cli.hold_ms as f64 / 1000.0) + 5.0,
    );
    // Over HTTP/2, the connections first; each stream takes one of them.
    let mut shared = Vec::new();
    if cli.h2_streams > 0 {
        for _ in 0..n.div_ceil(cli.h2_streams) {
            shared.push(Conn::open_h2(target.clone()).await?);
        }
    }
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (target, opened, connects) = (target.clone(), opened.clone(), connects.clone());
            let h2 = shared.get(i % shared.len().max(1)).and_then(Conn::stream);
            tokio::spawn(async move {
                let body = client::send_body("message/stream", "hold", "");
                let t;
                let (status, body) = if let Some(mut h2) = h2 {
                    opened.fetch_add(1, Relaxed);
                    t = Instant::now();
                    h2.post(body, true).await?
                } else {
                    let conn = {
                        let _permit = connects.acquire().await;
                        Conn::open(target).await
                    };
                    let mut conn = conn?;
                    opened.fetch_add(1, Relaxed);
                    t = Instant::now();
                    conn.post(body, true).await?
                };
                client::DONE.fetch_add(1, Relaxed);
                if status != 200 {
                    return Err(format!("http-{status}"));
                }
                if !client::contains(&body, b"\"final\":true") {
                    return Err("no-final-event".to_string());
                }
                Ok(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX))
            })
        })
        .collect();
    let mut stats = Stats::default();
    for t in tasks {
        match t.await {
            Ok(Ok(micros)) => stats.latencies.push(micros),
            Ok(Err(e)) => stats.error(e),
            Err(_) => stats.error("worker-panic"),
        }
    }
    progress.store(true, Relaxed);
    let seconds = t0.elapsed().as_secs_f64();
    let finished = stats.latencies.len();
    let mut r = report(Scenario::Hold, "a2ad", n, seconds, stats, pid, None);
    r.extra.insert("streams", json!(n));
    r.extra.insert(
        "protocol",
        json!(if shared.is_empty() { "http/1.1" } else { "h2c" }),
    );
    let connections = if shared.is_empty() { n } else { shared.len() };
    r.extra.insert("http_connections", json!(connections));
    r.extra.insert("finished_with_final_event", json!(finished));
    r.extra.insert("dropped", json!(n - finished));
    Ok(r)
}

/// Deliveries per second to a local receiver, every signature checked, none lost.
pub(crate) async fn webhooks(
    cli: &Cli,
    target: Arc<Target>,
    pid: Option<u32>,
) -> Result<Report, String> {
    let (addr, tally) = receiver::start(WEBHOOK_SECRET)
        .await
        .map_err(|e| e.to_string())?;
    let mut conn = Conn::open(target.clone()).await?;
    let set = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tasks/pushNotificationConfig/set","params":{{"config":{{"url":"http://{addr}/hook","secret":"{WEBHOOK_SECRET}","events":["task.completed"],"retryPolicy":{{"maxRetries":3,"initialDelay":0.1}}}}}}}}"#
    );
    let (status, body) = conn.post(set, false).await?;
    if let Some(e) = client::rpc_error(status, &body) {
        return Err(format!("setting the push configuration failed: {e}"));
    }
    let mut r = measured(cli, target, Kind::Send, pid, "a2ad").await?;
    let expected = r.requests;
    // Wait (bounded) for the deliveries to catch up with the completed tasks.
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let got = tally.lock().unwrap_or_else(|e| e.into_inner()).ids.len() as u64;
        if got >= expected || Instant::now() > end {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t = tally.lock().unwrap_or_else(|e| e.into_inner());
    let unique = t.ids.len() as u64;
    let span = match (t.first, t.last) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    r.extra.insert("deliveries", json!(unique));
    r.extra.insert(
        "deliveries_per_second",
        json!((unique as f64 / span.max(1e-9)).round()),
    );
    r.extra.insert("expected_deliveries", json!(expected));
    r.extra
        .insert("lost", json!(expected.saturating_sub(unique)));
    r.extra.insert("bad_signatures", json!(t.bad_signatures));
    r.extra
        .insert("duplicates_received", json!(t.received - unique));
    Ok(r)
}

/// `a2ad_finished_tasks_retained` from the server's /metrics.
pub(crate) async fn retained_tasks(target: &Arc<Target>) -> Option<u64> {
    let mut conn = Conn::open(target.clone()).await.ok()?;
    let (_, body) = conn.get("/metrics").await.ok()?;
    let text = String::from_utf8_lossy(&body);
    text.lines()
        .find_map(|l| l.strip_prefix("a2ad_finished_tasks_retained "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// `tasks` tasks through the server; RSS sampled every second; then the retention expires.
pub(crate) async fn soak(
    cli: &Cli,
    target: Arc<Target>,
    pid: Option<u32>,
) -> Result<Report, String> {
    let pid =
        pid.ok_or("soak needs the server's pid (start it with the tool, or give --server-pid)")?;
    // Warm-up, then the starting RSS.
    drive(
        cli.connections,
        target.clone(),
        Kind::Send,
        Instant::now() + Duration::from_secs(1),
        None,
    )
    .await;
    tokio::time::sleep(Duration::from_secs_f64(cli.retention + 1.5)).await;
    let start_rss = procs::rss(pid).map(|r| r.0).unwrap_or(0);
    let budget = Arc::new(AtomicU64::new(cli.tasks));
    let timeline = Arc::new(std::sync::Mutex::new(Vec::<(f64, u64)>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let sampler = {
        let (timeline, stop) = (timeline.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Relaxed) {
                if let Some((rss, _)) = procs::rss(pid) {
                    timeline
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((t0.elapsed().as_secs_f64(), rss));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let progress = progress_line(
        format!("soak {} tasks", cli.tasks),
        cli.tasks as f64 / 20_000.0,
    );
    let cpu0 = procs::cpu_seconds(pid);
    let far = Instant::now() + Duration::from_secs(24 * 3600);
    let stats = drive(
        cli.connections,
        target.clone(),
        Kind::Send,
        far,
        Some(budget),
    )
    .await;
    progress.store(true, Relaxed);
    let seconds = t0.elapsed().as_secs_f64();
    let peak_during = procs::rss(pid).map(|r| r.0).unwrap_or(0);
    // The cost of a retained task: RSS with the records held and no load, minus RSS once
    // they expired, divided by the records /metrics reports.
    let retained_now = retained_tasks(&target).await;
    let rss_retained = procs::rss(pid).map(|r| r.0).unwrap_or(0);
    // Let the retention expire and the sweeps run.
    tokio::time::sleep(Duration::from_secs_f64(cli.retention * 2.0 + 2.0)).await;
    let end_rss = procs::rss(pid).map(|r| r.0).unwrap_or(0);
    stop.store(true, Relaxed);
    let _ = sampler.await;
    let mut r = report(
        Scenario::Soak,
        "a2ad",
        cli.connections,
        seconds,
        stats,
        Some(pid),
        cpu0,
    );
    let rate = r.rps();
    let retained = retained_now.map_or(rate * cli.retention, |n| n as f64);
    let mib = |b: u64| (b as f64 / 1048576.0 * 10.0).round() / 10.0;
    r.extra.insert("rss_start_mib", json!(mib(start_rss)));
    r.extra
        .insert("rss_at_end_of_load_mib", json!(mib(peak_during)));
    r.extra
        .insert("rss_after_retention_mib", json!(mib(end_rss)));
    r.extra.insert(
        "rss_after_retention_vs_start",
        json!(format!(
            "{:+.1}%",
            (end_rss as f64 / start_rss.max(1) as f64 - 1.0) * 100.0
        )),
    );
    r.extra
        .insert("retained_tasks_after_load", json!(retained.round()));
    r.extra
        .insert("rss_with_retained_tasks_mib", json!(mib(rss_retained)));
    r.extra.insert(
        "bytes_per_retained_task",
        json!(((rss_retained.saturating_sub(end_rss)) as f64 / retained.max(1.0)).round()),
    );
    let tl = timeline.lock().unwrap_or_else(|e| e.into_inner());
    r.extra.insert(
        "rss_timeline_mib",
        json!(
            tl.iter()
                .map(|(t, b)| json!([(*t * 10.0).round() / 10.0, mib(*b)]))
                .collect::<Vec<_>>()
        ),
    );
    Ok(r)
}
