//! Several real `a2ad` processes as one service on a real PostgreSQL: any node answers for
//! any task, a follower on another node gets every event in order, a cancel elsewhere stops
//! the runner, `kill -9` of the runner loses no event and no webhook delivery, a PostgreSQL
//! restart is ridden out.
//!
//! PostgreSQL: `A2AD_TEST_PG_URL` (default: the local server of this project's machines).
//! When it cannot be reached these tests say so and pass — unless `A2AD_REQUIRE_PG` is set
//! (CI sets it), which turns the skip into a failure. Each test owns its schema (dropped at
//! the end) and its nodes; the tests take turns (three processes each on two cores).

use crate::support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use hmac::{KeyInit, Mac};
use serde_json::{Value, json};
use support::binary::Binary;
use support::receiver::{Answer, Receiver};
use support::{SseReader, new_id, poll_until};

const KEY: &str = "key-cluster-0123456789";
const SECRET: &str = "cluster-webhook-secret";
/// The nodes' lease: short, so a dead node is noticed quickly in tests.
const TTL_MS: u64 = 3000;
const HEARTBEAT_MS: u64 = 250;

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The PostgreSQL of the tests, or `None` (skip) when it cannot be reached. These tests
/// start their own nodes: they run once, in the suite's plain run (CI runs the suite again
/// on other stores with `A2AD_TEST_STORE`).
fn pg_url() -> Option<String> {
    if std::env::var_os("A2AD_TEST_STORE").is_some() {
        eprintln!("SKIPPED: the cluster tests run in the plain run (A2AD_TEST_STORE is set)");
        return None;
    }
    let url = std::env::var("A2AD_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let addr = url.parse::<tokio_postgres::Config>().ok().and_then(|c| {
        let host = match c.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "127.0.0.1".into(),
        };
        let port = c.get_ports().first().copied().unwrap_or(5432);
        std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
            .ok()?
            .next()
    });
    if addr
        .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok())
    {
        return Some(url);
    }
    assert!(
        std::env::var_os("A2AD_REQUIRE_PG").is_none(),
        "A2AD_REQUIRE_PG is set but PostgreSQL at {url} cannot be reached"
    );
    eprintln!(
        "SKIPPED: no PostgreSQL at {url} (set A2AD_TEST_PG_URL, or A2AD_REQUIRE_PG=1 to fail)"
    );
    None
}

/// A test's cluster: its schema and its nodes.
struct Cluster {
    url: String,
    schema: String,
    nodes: Vec<Option<Binary>>,
    http: reqwest::Client,
    /// More `[[agents]]`, appended to every node's file.
    agents: String,
}

impl Cluster {
    /// `n` nodes on a fresh schema.
    async fn start(url: String, n: usize, extra: &str) -> Self {
        Self::start_with_agents(url, n, extra, "").await
    }

    /// `n` nodes on a fresh schema, with these `[[agents]]` besides the usual ones.
    async fn start_with_agents(url: String, n: usize, extra: &str, agents: &str) -> Self {
        let schema = format!(
            "a2ad_cl_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let mut c = Self {
            url,
            schema,
            nodes: Vec::new(),
            http: reqwest::Client::new(),
            agents: agents.to_string(),
        };
        for i in 0..n {
            let node = c.spawn(i, extra);
            c.nodes.push(Some(node));
        }
        c
    }

    fn spawn(&self, i: usize, extra: &str) -> Binary {
        Binary::start(&self.text(i, extra), &[("RUST_LOG", "info")], &[])
    }

    /// Node `i`'s configuration file.
    fn text(&self, i: usize, extra: &str) -> String {
        format!(
            r#"[server]
listen = "127.0.0.1:0"

[webhooks]
allow_private_networks = true

[cluster]
engine = "postgres"
url = "{url}"
schema = "{schema}"
node_id = "n{i}"
lease_ttl_ms = {TTL_MS}
heartbeat_ms = {HEARTBEAT_MS}
{extra}

[[api_keys]]
name = "cl"
key = "{KEY}"

[[agents]]
id = "echo"

[[agents]]
id = "slow"
[agents.echo]
delay_ms = 3000
progress_steps = 6

[[agents]]
id = "many"
[agents.echo]
delay_ms = 2000
progress_steps = 700

[[agents]]
id = "long"
[agents.echo]
delay_ms = 60000
progress_steps = 30

[[agents]]
id = "limited"
[agents.limits]
requests_per_minute = 30

[[agents]]
id = "wide"
[agents.echo]
delay_ms = 8000
[agents.limits]
concurrent_tasks = 32
{agents}
"#,
            url = self.url,
            schema = self.schema,
            agents = self.agents,
        )
    }

    fn base(&self, i: usize) -> &str {
        &self.nodes[i].as_ref().expect("node running").base
    }

    fn kill9(&mut self, i: usize) -> String {
        self.nodes[i].take().expect("node running").kill9()
    }

    async fn call(&self, i: usize, agent: &str, method: &str, params: Value) -> Value {
        self.call_path(i, agent, method, params, "").await
    }

    async fn call_path(
        &self,
        i: usize,
        agent: &str,
        method: &str,
        params: Value,
        tail: &str,
    ) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let mut req = self
            .http
            .post(format!("{}/api/v1/a2a/{agent}{tail}", self.base(i)))
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .timeout(Duration::from_secs(30))
            .body(body.to_string());
        if !tail.is_empty() {
            req = req.header("a2a-version", "1.0");
        }
        let resp = req.send().await.expect("request");
        serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json")
    }

    async fn stream(
        &self,
        i: usize,
        agent: &str,
        method: &str,
        params: Value,
        last_event_id: Option<u64>,
    ) -> SseReader {
        let body = json!({"jsonrpc": "2.0", "id": "s", "method": method, "params": params});
        let mut req = self
            .http
            .post(format!("{}/api/v1/a2a/{agent}", self.base(i)))
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body.to_string());
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id.to_string());
        }
        let resp = req.send().await.expect("stream request");
        assert_eq!(resp.status(), 200);
        SseReader::new(resp)
    }

    /// Stops every node and drops the schema.
    async fn finish(mut self) {
        for node in self.nodes.drain(..).flatten() {
            let _ = node.kill9();
        }
        if let Ok((client, conn)) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await
        {
            tokio::spawn(conn);
            let _ = client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
                .await;
        }
    }
}

fn message(text: &str) -> Value {
    json!({"message": {"role": "user", "messageId": new_id(), "parts": [{"type": "text", "text": text}]}})
}

fn result(v: &Value) -> &Value {
    assert!(v.get("error").is_none(), "unexpected error: {v}");
    &v["result"]
}

/// Reads events until `n` have arrived; returns them.
async fn take(s: &mut SseReader, n: usize) -> Vec<(u64, Value)> {
    let mut out = Vec::new();
    while out.len() < n {
        let (id, data) = s.next_event().await.expect("an event");
        out.push((id.expect("an id"), data));
    }
    out
}

/// The id of the task a stream's first event shows.
fn task_id(events: &[(u64, Value)]) -> String {
    events[0].1["result"]["id"]
        .as_str()
        .expect("task id")
        .to_string()
}

/// Reads events to the end of the stream.
async fn rest(s: &mut SseReader) -> Vec<(u64, Value)> {
    s.collect()
        .await
        .into_iter()
        .map(|(id, data)| (id.expect("an id"), data))
        .collect()
}

fn state(event: &Value) -> String {
    event["result"]["status"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Asserts ids run on by one from `from`, and only the last event is final (none when
/// the stream goes on: `ends` false).
fn consecutive(events: &[(u64, Value)], from: u64, ends: bool) {
    for (i, (id, data)) in events.iter().enumerate() {
        assert_eq!(*id, from + i as u64, "no gap, no duplicate: {events:?}");
        let last = ends && i + 1 == events.len();
        assert_eq!(
            data["result"]["final"].as_bool().unwrap_or(false),
            last,
            "only the last event is final: {data}"
        );
    }
}

#[tokio::test]
async fn any_node_answers_for_any_task_in_every_dialect() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let c = Cluster::start(url, 3, "").await;

    // Seed dialect: tasks sent to each node in turn, read from every node.
    let mut tasks = Vec::new();
    for i in 0..6 {
        let v = c
            .call(
                i % 3,
                "echo",
                "message/send",
                message(&format!("hello {i}")),
            )
            .await;
        let t = result(&v).clone();
        assert_eq!(t["status"]["state"], "completed", "{t}");
        tasks.push(t);
    }
    for t in &tasks {
        for node in 0..3 {
            let v = c
                .call(node, "echo", "tasks/get", json!({"id": t["id"]}))
                .await;
            let got = result(&v);
            assert_eq!(got["status"], t["status"], "node {node}");
            assert_eq!(got["history"], t["history"], "node {node}");
        }
    }
    // Unknown everywhere alike.
    let v = c
        .call(1, "echo", "tasks/get", json!({"id": new_id()}))
        .await;
    assert_eq!(v["error"]["message"], "Task not found", "{v}");

    // Official 1.0 dialect: SendMessage on one node, GetTask and ListTasks on others.
    let send = json!({"message": {"role": "ROLE_USER", "messageId": new_id(),
                      "parts": [{"text": "official"}]}});
    let v = c
        .call_path(0, "echo", "SendMessage", send, "/jsonrpc/v1")
        .await;
    let id = result(&v)["task"]["id"]
        .as_str()
        .expect("task id")
        .to_string();
    for node in 0..3 {
        let v = c
            .call_path(node, "echo", "GetTask", json!({"id": id}), "/jsonrpc/v1")
            .await;
        assert_eq!(
            result(&v)["status"]["state"],
            "TASK_STATE_COMPLETED",
            "node {node}: {v}"
        );
    }
    let v = c
        .call_path(
            2,
            "echo",
            "ListTasks",
            json!({"pageSize": 50}),
            "/jsonrpc/v1",
        )
        .await;
    let listed: Vec<&str> = result(&v)["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert!(listed.contains(&id.as_str()), "{v}");
    assert_eq!(listed.len(), 7, "six seed tasks and the official one: {v}");

    // Push configurations: set on one node, read on another.
    let t = &tasks[0]["id"];
    let v = c
        .call(
            0,
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"taskId": t, "pushNotificationConfig": {"url": "https://hooks.example.com/x"}}),
        )
        .await;
    result(&v);
    let v = c
        .call(
            2,
            "echo",
            "tasks/pushNotificationConfig/get",
            json!({"taskId": t}),
        )
        .await;
    assert_eq!(
        result(&v)["config"]["url"],
        "https://hooks.example.com/x",
        "{v}"
    );
    c.finish().await;
}

#[tokio::test]
async fn a_follower_on_another_node_resumes_after_last_event_id_without_gap_or_duplicate() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let c = Cluster::start(url, 2, "").await;
    let mut a = c
        .stream(0, "slow", "message/stream", message("follow me"), None)
        .await;
    let first = take(&mut a, 3).await;
    consecutive(&first, 1, false);
    let id = task_id(&first);

    let mut b = c
        .stream(1, "slow", "tasks/resubscribe", json!({"id": id}), Some(3))
        .await;
    let followed = rest(&mut b).await;
    let mut on_a = first.clone();
    on_a.extend(rest(&mut a).await);
    consecutive(&on_a, 1, true);
    consecutive(&followed, 4, true);
    assert_eq!(
        followed.last().map(|(id, _)| *id),
        on_a.last().map(|(id, _)| *id),
        "both end with the same event"
    );
    for (id, data) in &followed {
        let same = &on_a[(*id - 1) as usize].1;
        assert_eq!(
            data["result"]["status"], same["result"]["status"],
            "event {id}"
        );
    }
    assert_eq!(state(&followed[followed.len() - 1].1), "completed");

    // Without the header, on the other node, after the end: the final state.
    let mut again = c
        .stream(1, "slow", "tasks/resubscribe", json!({"id": id}), None)
        .await;
    let end = rest(&mut again).await;
    assert_eq!(end.len(), 1, "{end:?}");
    assert_eq!(state(&end[0].1), "completed");
    c.finish().await;
}

#[tokio::test]
async fn a_follower_reads_a_long_backlog_page_by_page_without_gap_or_duplicate() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let c = Cluster::start(url, 2, "").await;
    let mut a = c
        .stream(0, "many", "message/stream", message("many"), None)
        .await;
    // Well past one page of a follower's read behind.
    let first = take(&mut a, 400).await;
    let id = task_id(&first);
    let mut b = c
        .stream(1, "many", "tasks/resubscribe", json!({"id": id}), Some(1))
        .await;
    let followed = rest(&mut b).await;
    let mut on_a = first;
    on_a.extend(rest(&mut a).await);
    consecutive(&on_a, 1, true);
    consecutive(&followed, 2, true);
    assert_eq!(
        followed.len() + 1,
        on_a.len(),
        "every event after the first"
    );
    assert_eq!(state(&followed[followed.len() - 1].1), "completed");
    c.finish().await;
}

/// Defect 11 of the second outside review: on the node that took a task over, a read
/// must never show an older state than a follower on that node was already sent. Ten
/// tasks are taken over at once (their runner is killed); as each follower on the survivor
/// receives the final `failed`, a read there is made at once.
#[tokio::test]
async fn a_read_on_the_node_that_took_a_task_over_is_never_behind_its_followers() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let mut c = Cluster::start(url, 2, "").await;
    let mut followers = Vec::new();
    let mut runners = Vec::new();
    for i in 0..10 {
        let mut a = c
            .stream(0, "long", "message/stream", message(&format!("t{i}")), None)
            .await;
        let first = take(&mut a, 2).await;
        let id = task_id(&first);
        let b = c
            .stream(1, "long", "tasks/resubscribe", json!({"id": id}), Some(2))
            .await;
        runners.push(a);
        followers.push((id, b));
    }
    c.kill9(0);
    drop(runners);
    let nodes = &c;
    let checks = followers.into_iter().map(|(id, mut b)| async move {
        let mut last = None;
        while let Some((_, e)) = b.next_event().await {
            if state(&e) == "failed" {
                let v = nodes.call(1, "long", "tasks/get", json!({"id": id})).await;
                assert_eq!(
                    state(&json!({"result": result(&v)})),
                    "failed",
                    "a follower on node 1 saw {id} fail; a read there then said {v}"
                );
            }
            last = Some(state(&e));
        }
        assert_eq!(
            last.as_deref(),
            Some("failed"),
            "{id} ends failed (node lost)"
        );
    });
    futures_util::future::join_all(checks).await;
    c.finish().await;
}

#[tokio::test]
async fn a_node_holds_at_most_max_followers_and_frees_one_when_its_stream_goes() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let c = Cluster::start(url, 2, "max_followers = 1").await;
    let mut a = c
        .stream(0, "long", "message/stream", message("follow me"), None)
        .await;
    let first = take(&mut a, 2).await;
    let id = task_id(&first);
    let resubscribe = || async {
        let body = json!({"jsonrpc": "2.0", "id": "s", "method": "tasks/resubscribe",
                          "params": {"id": id}});
        let resp = c
            .http
            .post(format!("{}/api/v1/a2a/long", c.base(1)))
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body.to_string())
            .send()
            .await
            .expect("request");
        let sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        (sse, resp)
    };

    // The one follower node 1 may hold.
    let (sse, held) = resubscribe().await;
    assert!(sse, "the first follower is admitted");
    let mut held = SseReader::new(held);
    take(&mut held, 1).await;
    // A second one is refused at once, as busy.
    let (sse, refused) = resubscribe().await;
    assert!(!sse, "a second follower is refused");
    let text = refused.text().await.expect("body");
    assert!(text.contains("Server busy"), "{text}");
    // The follower goes with its stream: then there is room again.
    drop(held);
    let mut again = poll_until(Duration::from_secs(20), || async {
        let (sse, resp) = resubscribe().await;
        sse.then(|| SseReader::new(resp))
    })
    .await;
    take(&mut again, 1).await;
    let v = c.call(0, "long", "tasks/cancel", json!({"id": id})).await;
    assert_eq!(result(&v)["status"]["state"], "canceled", "{v}");
    let end = rest(&mut again).await;
    assert_eq!(
        end.last().map(|(_, e)| state(e)).as_deref(),
        Some("canceled")
    );
    c.finish().await;
}

#[tokio::test]
async fn a_cancel_on_another_node_stops_the_runner_and_every_stream_ends_with_it() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let c = Cluster::start(url, 3, "").await;
    let mut a = c
        .stream(0, "long", "message/stream", message("cancel me"), None)
        .await;
    let first = take(&mut a, 3).await;
    let id = task_id(&first);
    let mut b = c
        .stream(1, "long", "tasks/resubscribe", json!({"id": id}), Some(3))
        .await;

    let v = c.call(2, "long", "tasks/cancel", json!({"id": id})).await;
    assert_eq!(result(&v)["status"]["state"], "canceled", "{v}");
    let on_a = rest(&mut a).await;
    let on_b = rest(&mut b).await;
    let last_a = on_a.last().expect("the runner's stream ends with an event");
    let last_b = on_b
        .last()
        .expect("the follower's stream ends with an event");
    assert_eq!(state(&last_a.1), "canceled");
    assert_eq!(last_a.0, last_b.0, "the same canceled event on both");
    let seq = last_a.0;
    let mut all = first.clone();
    all.extend(on_a.iter().cloned());
    consecutive(&all, 1, true);

    // The runner's agent stopped: nothing is appended after the cancel.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for node in 0..3 {
        let v = c.call(node, "long", "tasks/get", json!({"id": id})).await;
        assert_eq!(result(&v)["status"]["state"], "canceled");
    }
    let mut after = c
        .stream(0, "long", "tasks/resubscribe", json!({"id": id}), Some(seq))
        .await;
    let tail = rest(&mut after).await;
    assert!(
        tail.iter().all(|(id, _)| *id == seq),
        "no event after the cancel: {tail:?}"
    );
    // Canceling again anywhere: the task is canceled.
    let v = c.call(0, "long", "tasks/cancel", json!({"id": id})).await;
    assert!(v["error"].is_object(), "{v}");
    c.finish().await;
}

#[tokio::test]
async fn kill_9_of_the_runner_mid_stream_loses_no_event_and_the_task_fails_node_lost() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let mut c = Cluster::start(url, 3, "").await;
    let mut a = c
        .stream(0, "long", "message/stream", message("kill my node"), None)
        .await;
    let first = take(&mut a, 4).await;
    consecutive(&first, 1, false);
    let id = task_id(&first);
    let k = first.last().map(|(id, _)| *id).expect("k");
    let killed_at = Instant::now();
    c.kill9(0);
    drop(a);

    // The client reconnects to a survivor with Last-Event-ID.
    let mut b = c
        .stream(1, "long", "tasks/resubscribe", json!({"id": id}), Some(k))
        .await;
    let followed = rest(&mut b).await;
    let took = killed_at.elapsed();
    consecutive(&followed, k + 1, true);
    let (_, last) = followed.last().expect("a final event");
    assert_eq!(state(last), "failed", "{last}");
    assert!(
        last.to_string().contains("node lost"),
        "the failure says why: {last}"
    );
    assert!(
        took < Duration::from_millis(TTL_MS + 10 * HEARTBEAT_MS + 5000),
        "failed within the lease TTL plus a tick (and slack for a busy machine): {took:?}"
    );
    let a = result(&c.call(1, "long", "tasks/get", json!({"id": id})).await).clone();
    let b = result(&c.call(2, "long", "tasks/get", json!({"id": id})).await).clone();
    assert_eq!(a["status"], b["status"]);
    assert_eq!(a["status"]["state"], "failed");

    // The killed node comes back: nothing changes for that task.
    let back = c.spawn(0, "");
    c.nodes[0] = Some(back);
    tokio::time::sleep(Duration::from_millis(2 * HEARTBEAT_MS)).await;
    let again = result(&c.call(0, "long", "tasks/get", json!({"id": id})).await).clone();
    assert_eq!(again["status"], a["status"]);
    c.finish().await;
}

fn verify(hit: &support::receiver::Hit) {
    let sig = hit.header("x-webhook-signature");
    let hex = sig.strip_prefix("sha256=").expect("sha256= prefix");
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    let mut mac =
        <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(SECRET.as_bytes()).expect("key");
    mac.update(&hit.body);
    mac.verify_slice(&bytes).expect("a valid signature");
}

#[tokio::test]
async fn webhooks_survive_a_kill_9_with_the_same_delivery_ids_in_order() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    // The receiver answers slowly: deliveries are in flight when the runner dies.
    let rx = Receiver::start(std::sync::Arc::new(|_| {
        Answer::after(200, Duration::from_millis(700))
    }))
    .await;
    let mut c = Cluster::start(url, 3, "").await;
    let v = c
        .call(
            0,
            "slow",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": rx.url, "secret": SECRET}}),
        )
        .await;
    result(&v);
    let mut a = c
        .stream(0, "slow", "message/stream", message("hooked"), None)
        .await;
    let first = take(&mut a, 3).await;
    let id = task_id(&first);
    c.kill9(0);
    drop(a);

    // The task ends (failed: node lost) on a survivor; every event reaches the receiver.
    let end = poll_until(Duration::from_secs(40), || async {
        let v = c.call(1, "slow", "tasks/get", json!({"id": id})).await;
        let s = v["result"]["status"]["state"]
            .as_str()
            .unwrap_or("")
            .to_string();
        (s == "failed" || s == "completed").then_some(v)
    })
    .await;
    let events = {
        let mut s = c
            .stream(1, "slow", "tasks/resubscribe", json!({"id": id}), Some(0))
            .await;
        rest(&mut s).await
    };
    assert_eq!(
        state(&events[events.len() - 1].1),
        state(&json!({"result": end["result"]}))
    );
    // The configuration selects state changes (the seed dialect's default): one delivery
    // per event that changed the task's state.
    let mut previous = String::new();
    let mut last_seq = 0u64;
    for (_, e) in &events {
        let now = state(e);
        if now != previous {
            last_seq += 1;
            previous = now;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let hits = loop {
        let hits = rx.hits();
        let ids: HashSet<String> = hits
            .iter()
            .map(|h| h.header("x-webhook-delivery").to_string())
            .collect();
        if ids.len() as u64 >= last_seq {
            break hits;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {last_seq} deliveries within 60 s (events {:?}): {:?}; survivors' logs: {}",
            ids.len(),
            events
                .iter()
                .map(|(i, e)| (*i, state(e)))
                .collect::<Vec<_>>(),
            hits.iter()
                .map(|h| (
                    h.header("x-webhook-event").to_string(),
                    h.header("x-webhook-delivery").to_string(),
                    h.json()["delivery"].clone(),
                    h.json()["data"].to_string()
                ))
                .collect::<Vec<_>>(),
            c.nodes
                .iter()
                .flatten()
                .map(|n| n.stderr())
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut by_id: HashMap<String, Vec<&support::receiver::Hit>> = HashMap::new();
    for h in &hits {
        verify(h);
        by_id
            .entry(h.header("x-webhook-delivery").to_string())
            .or_default()
            .push(h);
    }
    assert_eq!(
        by_id.len() as u64,
        last_seq,
        "one delivery id per state change (one configuration)"
    );
    for (id, repeats) in &by_id {
        let events: HashSet<String> = repeats
            .iter()
            .map(|h| h.header("x-webhook-event").to_string())
            .collect();
        assert_eq!(events.len(), 1, "repeats of {id} carry the same event");
    }
    // Per task, the first receipt of each delivery follows event order.
    let mut seen = HashSet::new();
    let order: Vec<String> = hits
        .iter()
        .filter(|h| seen.insert(h.header("x-webhook-delivery").to_string()))
        .map(|h| h.header("x-webhook-event").to_string())
        .collect();
    let mut expected: Vec<String> = Vec::new();
    for (_, e) in &events {
        let name = format!("task.{}", state(e));
        if expected.last() != Some(&name) {
            expected.push(name);
        }
    }
    assert_eq!(order, expected, "first receipts in event order");
    c.finish().await;
}

/// Defect 10 of the second outside review: a dead node's pending retries must go out
/// before the survivor's own later deliveries of the same task.
#[tokio::test]
async fn webhook_order_holds_across_a_takeover_when_every_first_try_fails() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    // The first try of each delivery fails; its retry (1.5 s later) succeeds. So when the
    // runner dies, its deliveries are waiting to be retried.
    let rx = Receiver::watching(std::sync::Arc::new(first_try_fails)).await;
    let mut c = Cluster::start(url, 3, "").await;
    let v = c
        .call(
            0,
            "slow",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": rx.url, "secret": SECRET,
                              "retryPolicy": {"maxRetries": 5, "initialDelay": 1.5}}}),
        )
        .await;
    result(&v);
    let mut a = c
        .stream(0, "slow", "message/stream", message("hooked"), None)
        .await;
    let first = take(&mut a, 3).await;
    let id = task_id(&first);
    // A lane has one delivery in flight: `submitted` fails, is retried 1.5 s later and
    // succeeds, then `working` fails. Its retry is pending on node 0 when node 0 dies.
    let hits = rx.wait_for(3).await;
    assert_eq!(hits[2].header("x-webhook-event"), "task.working");
    c.kill9(0);
    drop(a);

    poll_until(Duration::from_secs(40), || async {
        let v = c.call(1, "slow", "tasks/get", json!({"id": id})).await;
        let s = state(&json!({"result": v["result"]}));
        (s == "failed" || s == "completed").then_some(())
    })
    .await;
    let events = {
        let mut s = c
            .stream(1, "slow", "tasks/resubscribe", json!({"id": id}), Some(0))
            .await;
        rest(&mut s).await
    };
    let mut expected: Vec<String> = Vec::new();
    for (_, e) in &events {
        let name = format!("task.{}", state(e));
        if expected.last() != Some(&name) {
            expected.push(name);
        }
    }
    // Every delivery succeeds in the end (its second try).
    let hits = poll_until(Duration::from_secs(60), || async {
        let hits = rx.hits();
        let mut tries: HashMap<String, usize> = HashMap::new();
        for h in &hits {
            *tries
                .entry(h.header("x-webhook-delivery").to_string())
                .or_default() += 1;
        }
        (tries.len() == expected.len() && tries.values().all(|&n| n >= 2)).then_some(hits)
    })
    .await;
    let (first_tries, successes) = tries_in_order(&hits);
    assert_eq!(first_tries, expected, "first tries in event order");
    assert_eq!(successes, expected, "successful tries in event order");
    c.finish().await;
}

/// A cancel on another node takes the task over while the runner still holds a delivery
/// of it waiting to be retried: the cancel's own delivery goes out after that one.
#[tokio::test]
async fn webhook_order_holds_when_a_cancel_elsewhere_takes_a_task_with_a_retry_pending() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let rx = Receiver::watching(std::sync::Arc::new(first_try_fails)).await;
    let c = Cluster::start(url, 2, "").await;
    let v = c
        .call(
            0,
            "long",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": rx.url, "secret": SECRET,
                              "retryPolicy": {"maxRetries": 5, "initialDelay": 2.5}}}),
        )
        .await;
    result(&v);
    let mut a = c
        .stream(0, "long", "message/stream", message("hooked"), None)
        .await;
    let id = task_id(&take(&mut a, 2).await);
    // submitted: fails, then succeeds 2.5 s later; working: fails. Its retry waits on node 0.
    let hits = rx.wait_for(3).await;
    assert_eq!(hits[2].header("x-webhook-event"), "task.working");
    let v = c.call(1, "long", "tasks/cancel", json!({"id": id})).await;
    assert_eq!(result(&v)["status"]["state"], "canceled", "{v}");
    let expected = ["task.submitted", "task.working", "task.canceled"];
    let hits = poll_until(Duration::from_secs(60), || async {
        let hits = rx.hits();
        (hits.len() >= 2 * expected.len()).then_some(hits)
    })
    .await;
    let (first_tries, successes) = tries_in_order(&hits);
    assert_eq!(first_tries, expected, "first tries in event order");
    assert_eq!(successes, expected, "successful tries in event order");
    c.finish().await;
}

/// A receiver's script: the first try of each delivery fails (500), later ones succeed.
fn first_try_fails(hits: &[support::receiver::Hit]) -> Answer {
    let last = hits.last().expect("this request");
    let id = last.header("x-webhook-delivery");
    let tries = hits
        .iter()
        .filter(|h| h.header("x-webhook-delivery") == id)
        .count();
    Answer::status(if tries == 1 { 500 } else { 200 })
}

/// The events of the first tries and of the second (successful) tries, in arrival order.
/// Checks every hit's signature, and that the lane had one delivery in flight: a
/// delivery's first try came only after the previous delivery succeeded.
fn tries_in_order(hits: &[support::receiver::Hit]) -> (Vec<String>, Vec<String>) {
    let mut tries: HashMap<String, usize> = HashMap::new();
    let mut first_tries = Vec::new();
    let mut successes = Vec::new();
    let mut open: Option<String> = None;
    for h in hits {
        verify(h);
        let n = tries
            .entry(h.header("x-webhook-delivery").to_string())
            .or_default();
        *n += 1;
        let event = h.header("x-webhook-event").to_string();
        match *n {
            1 => {
                assert!(
                    open.is_none(),
                    "{event} was sent while {open:?} still waited for its retry"
                );
                open = Some(event.clone());
                first_tries.push(event);
            }
            2 => {
                open = None;
                successes.push(event);
            }
            _ => {}
        }
    }
    (first_tries, successes)
}

#[tokio::test]
async fn a_postgresql_restart_during_a_stream_is_ridden_out() {
    let Some(url) = pg_url() else { return };
    if std::env::var_os("A2AD_TEST_PG_RESTART").is_none() {
        eprintln!(
            "SKIPPED: set A2AD_TEST_PG_RESTART to a command that restarts PostgreSQL (CI: `pg_ctlcluster 15 main restart`)"
        );
        return;
    }
    let _turn = TURN.lock().await;
    let c = Cluster::start(url, 2, "").await;
    let mut a = c
        .stream(0, "long", "message/stream", message("ride it out"), None)
        .await;
    let first = take(&mut a, 3).await;
    let id = task_id(&first);
    let command = std::env::var("A2AD_TEST_PG_RESTART").unwrap_or_default();
    let status = std::process::Command::new("sh")
        .args(["-c", &command])
        .status()
        .expect("restart command");
    assert!(status.success(), "{command} failed");
    // The stream goes on (events may pause while the engine is down), without a gap. A
    // restart shorter than half a lease is ridden out: the task still runs on its node. A
    // longer one (on a loaded machine) self-fences the node; when the engine is back it
    // joins again under a new incarnation and its task is taken up as a lost node's: the
    // stream ends with `failed` "node lost" — never silent (it once waited forever).
    let mut all = first;
    let deadline = Instant::now() + Duration::from_secs(90);
    while all.len() < 7 {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, a.next_event()).await {
            Ok(Some((seq, data))) => all.push((seq.expect("an id"), data)),
            Ok(None) => break,
            Err(_) => panic!("the stream stalled after the restart: {all:?}"),
        }
        if all
            .last()
            .is_some_and(|(_, d)| d["result"]["final"] == true)
        {
            break;
        }
    }
    for (i, (seq, _)) in all.iter().enumerate() {
        assert_eq!(*seq, i as u64 + 1, "no gap across the restart");
    }
    if self_fences(&c, 0).await > 0 {
        let (_, last) = all.last().expect("events");
        assert_eq!(state(last), "failed", "{last}");
        assert!(last.to_string().contains("node lost"), "{last}");
    } else {
        assert_eq!(all.len(), 7, "{all:?}");
        // Nobody took the task over: it still runs on its node, and cancels there.
        let v = c.call(1, "long", "tasks/cancel", json!({"id": id})).await;
        assert_eq!(result(&v)["status"]["state"], "canceled", "{v}");
        let tail = rest(&mut a).await;
        assert_eq!(tail.last().map(|(_, d)| state(d)), Some("canceled".into()));
    }
    c.finish().await;
}

/// How many times node `i` self-fenced (its `/metrics`).
async fn self_fences(c: &Cluster, i: usize) -> u64 {
    let text = c
        .http
        .get(format!("{}/metrics", c.base(i)))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .find(|l| l.starts_with("a2ad_cluster_self_fences_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .expect("the self-fence counter") as u64
}

#[tokio::test]
async fn requests_per_minute_holds_across_nodes_within_the_documented_bound() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let c = Cluster::start(url, 3, "").await;
    // Let the nodes share counters once (the first share only sets the baseline).
    tokio::time::sleep(Duration::from_millis(3 * HEARTBEAT_MS)).await;
    // 60 requests over about 6 s, spread over the three nodes (alone, each node would let
    // 30 through: 90 for the cluster). The documented bound: the limit, plus what refills
    // meanwhile (30/min × 6 s = 3), plus what the other nodes let through during one
    // heartbeat before hearing of it (2 nodes × about 1 request per 250 ms here).
    let started = Instant::now();
    let mut accepted = 0u32;
    let mut limited = 0u32;
    for i in 0..60 {
        let v = c
            .call(i % 3, "limited", "tasks/get", json!({"id": new_id()}))
            .await;
        match v["error"]["message"].as_str() {
            Some("Task not found") => accepted += 1,
            _ if v["error"]["code"] == -32008 => limited += 1,
            _ => panic!("unexpected answer: {v}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let refill = (30.0 * seconds / 60.0).ceil() as u32;
    assert_eq!(accepted + limited, 60);
    assert!(accepted >= 30, "the limit itself is reachable: {accepted}");
    assert!(
        accepted <= 30 + refill + 6,
        "at most the limit + refill ({refill}) + one heartbeat's worth per other node (+ slack): {accepted} accepted"
    );
    c.finish().await;
}

#[tokio::test]
async fn card_metrics_count_the_whole_cluster() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let c = Cluster::start(url, 2, "").await;
    for i in 0..4 {
        let v = c
            .call(i % 2, "echo", "message/send", message("count me"))
            .await;
        result(&v);
    }
    // Node 1 ran two of the four tasks; its card counts the other node's two as well (and
    // each card request itself, on node 1).
    let mut asked = 0u64;
    let deadline = Instant::now() + Duration::from_secs(20);
    let last = loop {
        let v = c
            .call(1, "echo", "agent/authenticatedExtendedCard", json!({}))
            .await;
        asked += 1;
        let card = result(&v).clone();
        let total = card["metrics"]["totalRequests"].as_u64().unwrap_or(0);
        if total >= 4 + asked {
            break card;
        }
        assert!(
            Instant::now() < deadline,
            "the card counts only this node: {card}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(last["metrics"]["successRate"], 100.0, "{last}");
    c.finish().await;
}

#[tokio::test]
async fn a_conversation_continues_on_another_node() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let c = Cluster::start(url, 2, "").await;
    let first = result(&c.call(0, "echo", "message/send", message("one")).await).clone();
    let context = first["contextId"].clone();
    let mut second = message("two");
    second["contextId"] = context.clone();
    let t = result(&c.call(1, "echo", "message/send", second).await).clone();
    assert_eq!(t["contextId"], context);
    assert_eq!(
        support::texts(&t["status"]["message"]),
        ["echo: two", "turn 2"],
        "the second node knows the first turn: {t}"
    );
    // And back on the first node: turn 3.
    let mut third = message("three");
    third["contextId"] = context;
    let t = result(&c.call(0, "echo", "message/send", third).await).clone();
    assert_eq!(
        support::texts(&t["status"]["message"]),
        ["echo: three", "turn 3"]
    );
    c.finish().await;
}

#[tokio::test]
async fn a_graceful_shutdown_hands_queued_tasks_to_the_other_nodes() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let mut c = Cluster::start(url, 2, "").await;
    // Every slot of node 0 works and as many tasks wait for one. Each slot the shutdown
    // frees (by cancelling the task that works there) is a chance for a queued task to
    // start in it instead of being handed over (defect 12). From outside that race is
    // rarely lost (1 run in ~9 with one slot); the scheduler's own test
    // (`a_closed_scheduler_hands_a_freed_slot_to_no_waiter`) shows the fix every time.
    const SLOTS: usize = 32;
    let mut working = Vec::new();
    for i in 0..SLOTS {
        let mut s = c
            .stream(
                0,
                "wide",
                "message/stream",
                message(&format!("working {i}")),
                None,
            )
            .await;
        let r = take(&mut s, 2).await;
        assert_eq!(state(&r[1].1), "working");
        working.push(s);
    }
    let mut queued = Vec::new();
    for i in 0..SLOTS {
        let mut q = c
            .stream(
                0,
                "wide",
                "message/stream",
                message(&format!("queued {i}")),
                None,
            )
            .await;
        let first = take(&mut q, 1).await;
        assert_eq!(state(&first[0].1), "submitted");
        queued.push((i, task_id(&first), q));
    }

    let (code, _) = c.nodes[0].take().expect("node 0").stop();
    assert_eq!(code, 0);
    // The queued tasks run on node 1 and complete there.
    for (i, id, _) in &queued {
        let done = poll_until(Duration::from_secs(90), || async {
            let v = c.call(1, "wide", "tasks/get", json!({"id": id})).await;
            let s = v["result"]["status"]["state"]
                .as_str()
                .unwrap_or("")
                .to_string();
            assert!(
                s != "canceled" && s != "failed",
                "queued task {i} ended {s} instead of being handed over: {v}"
            );
            (s == "completed").then_some(v)
        })
        .await;
        assert_eq!(
            support::texts(&done["result"]["status"]["message"]),
            [format!("echo: queued {i}"), "turn 1".to_string()]
        );
    }
    c.finish().await;
}

/// A TCP relay to PostgreSQL that a test can cut: every connection through it is dropped
/// and new ones are refused until it is opened again.
struct Relay {
    port: u16,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: std::sync::Arc<tokio::sync::Notify>,
}

impl Relay {
    async fn start(target: std::net::SocketAddr) -> Self {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind relay");
        let port = listener.local_addr().expect("addr").port();
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let cut = std::sync::Arc::new(tokio::sync::Notify::new());
        let (o, c) = (open.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !o.load(SeqCst) {
                    continue;
                }
                let c = c.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        () = c.notified() => {}
                    }
                });
            }
        });
        Self { port, open, cut }
    }

    fn close(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        self.cut.notify_waiters();
    }

    fn reopen(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Cluster {
    /// `n` nodes on a fresh schema, node 0 reaching PostgreSQL through a relay the test can
    /// cut, the others directly. Needs a multi-threaded test runtime: the relay must run
    /// while a node starts (`Binary::start` blocks).
    async fn relayed(url: String, n: usize) -> (Self, Relay) {
        let pg: tokio_postgres::Config = url.parse().expect("url");
        let target = match (pg.get_hosts().first(), pg.get_ports().first()) {
            (Some(tokio_postgres::config::Host::Tcp(h)), Some(p)) => {
                std::net::ToSocketAddrs::to_socket_addrs(&(h.as_str(), *p))
                    .expect("resolve")
                    .next()
                    .expect("an address")
            }
            _ => "127.0.0.1:5432".parse().expect("addr"),
        };
        let relay = Relay::start(target).await;
        let relayed = format!(
            "postgres://{}@127.0.0.1:{}/{}",
            pg.get_user().unwrap_or("postgres"),
            relay.port,
            pg.get_dbname().unwrap_or("postgres")
        );
        let mut c = Cluster::start(url, 0, "").await;
        let direct = std::mem::replace(&mut c.url, relayed);
        let first = c.spawn(0, "");
        c.url = direct;
        c.nodes = vec![Some(first)];
        for i in 1..n {
            let node = c.spawn(i, "");
            c.nodes.push(Some(node));
        }
        (c, relay)
    }
}

// Several threads: the relay must run while a node starts (`Binary::start` blocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_postgresql_fences_itself_and_its_task_moves() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    // Node 0 reaches PostgreSQL through the relay, node 1 directly.
    let (c, relay) = Cluster::relayed(url, 2).await;

    let mut a = c
        .stream(0, "long", "message/stream", message("cut me off"), None)
        .await;
    let first = take(&mut a, 3).await;
    let id = task_id(&first);
    let health = |i: usize| {
        let url = format!("{}/healthz", c.base(i));
        let http = c.http.clone();
        async move {
            match http.get(url).send().await {
                Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
                Err(_) => (0, String::new()),
            }
        }
    };
    assert_eq!(health(0).await.0, 200);
    relay.close();
    // Within half a lease (plus a heartbeat and slack) node 0 stops serving, and says so
    // (its commits fail too, but "not serving" is what a balancer reads)...
    poll_until(Duration::from_millis(TTL_MS + 5000), || async {
        (health(0).await == (503, r#"{"status":"not serving"}"#.to_string())).then_some(())
    })
    .await;
    // ...and within a lease, node 1 takes the task over: it ends "node lost".
    let end = poll_until(Duration::from_secs(30), || async {
        let v = c.call(1, "long", "tasks/get", json!({"id": id})).await;
        (v["result"]["status"]["state"] == "failed").then_some(v)
    })
    .await;
    assert!(end.to_string().contains("node lost"), "{end}");
    // Back in touch: node 0 serves again and agrees.
    relay.reopen();
    poll_until(Duration::from_secs(30), || async {
        (health(0).await.0 == 200).then_some(())
    })
    .await;
    let v = c.call(0, "long", "tasks/get", json!({"id": id})).await;
    assert_eq!(result(&v)["status"]["state"], "failed");
    c.finish().await;
}

/// A node whose engine comes back before its lease runs out (an outage longer than half a
/// lease, shorter than a lease) has stopped its agents all the same: it joins again under a
/// new incarnation and takes its own stopped tasks up as a lost node's. Alone in its
/// cluster, nobody else could: before, such a task stayed `working` forever and its stream
/// waited in silence.
// Several threads: the relay must run while a node starts (`Binary::start` blocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_within_its_lease_after_a_self_fence_takes_its_tasks_up_again() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let (c, relay) = Cluster::relayed(url, 1).await;

    let mut a = c
        .stream(0, "long", "message/stream", message("hold on"), None)
        .await;
    let first = take(&mut a, 3).await;
    let id = task_id(&first);
    let health = || {
        let url = format!("{}/healthz", c.base(0));
        let http = c.http.clone();
        async move {
            match http.get(url).send().await {
                Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
                Err(_) => (0, String::new()),
            }
        }
    };
    relay.close();
    poll_until(Duration::from_millis(TTL_MS + 5000), || async {
        (health().await == (503, r#"{"status":"not serving"}"#.to_string())).then_some(())
    })
    .await;
    // Back at once: within the lease, most of the time (and if not, the same must follow).
    relay.reopen();
    let end = poll_until(Duration::from_secs(60), || async {
        let v = c.call(0, "long", "tasks/get", json!({"id": id})).await;
        (v["result"]["status"]["state"] == "failed").then_some(v)
    })
    .await;
    assert!(end.to_string().contains("node lost"), "{end}");
    assert!(self_fences(&c, 0).await >= 1);
    // The stream that was open when the node self-fenced ends with it, without a gap.
    let mut all = first;
    let tail = tokio::time::timeout(Duration::from_secs(60), rest(&mut a))
        .await
        .expect("the stream ends");
    all.extend(tail);
    for (i, (seq, _)) in all.iter().enumerate() {
        assert_eq!(*seq, i as u64 + 1, "no gap: {all:?}");
    }
    assert_eq!(all.last().map(|(_, d)| state(d)), Some("failed".into()));
    c.finish().await;
}

/// A node reaches PostgreSQL over TLS when its URL says `sslmode=require`, verifying the
/// server's certificate against `cluster.ca_file` (here the local server's own,
/// self-signed certificate) and refusing a server its CA did not sign.
#[tokio::test]
async fn a_node_speaks_tls_to_postgresql_verified_against_a_ca_file() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let setting = |name: &'static str| {
        let client = &client;
        async move {
            client
                .query_one(&format!("SHOW {name}"), &[])
                .await
                .map(|r| r.get::<_, String>(0))
                .unwrap_or_default()
        }
    };
    let cert_file = setting("ssl_cert_file").await;
    let Ok(cert) = std::fs::read_to_string(&cert_file) else {
        eprintln!("SKIPPED: PostgreSQL's certificate ({cert_file:?}) cannot be read here");
        return;
    };
    if setting("ssl").await != "on" {
        eprintln!("SKIPPED: PostgreSQL at {url} does not serve TLS (ssl = off)");
        return;
    }
    let dir = support::binary::TempDir::new();
    let ca_file = dir.path.join("pg-ca.pem");
    std::fs::write(&ca_file, &cert).expect("write");
    let pg: tokio_postgres::Config = url.parse().expect("url");
    let user = pg.get_user().unwrap_or("postgres");
    let db = pg.get_dbname().unwrap_or("test");
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    // By the name the local server's certificate carries (Debian's: localhost).
    let tls_url = format!("postgres://{user}@localhost:{port}/{db}?sslmode=require");
    let schema = format!(
        "a2ad_tls_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let config = |ca: &std::path::Path| {
        let mut c = support::config(&["echo"]);
        let mut cluster = a2ad::config::ClusterConfig::postgres(&tls_url);
        cluster.schema = schema.clone();
        cluster.ca_file = Some(ca.display().to_string());
        c.cluster = Some(cluster);
        c
    };

    let s = support::TestServer::start(config(&ca_file)).await;
    let done = s.send("echo", "over TLS to PostgreSQL", json!({})).await;
    assert_eq!(done["status"]["state"], "completed", "{done}");
    let tls_sessions: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE s.ssl AND a.application_name = 'a2ad'",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0);
    assert!(tls_sessions > 0, "a2ad's sessions use TLS");
    s.stop().await;

    // A CA that did not sign the server's certificate: the node does not start.
    let other = dir.path.join("other-ca.pem");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    std::fs::write(&other, params.self_signed(&key).expect("ca").pem()).expect("write");
    match a2ad::Server::bind(config(&other).validated().expect("valid")).await {
        Err(e @ a2ad::Error::Store { .. }) => {
            assert!(e.to_string().contains("cannot connect"), "{e}");
        }
        Err(other) => panic!("not a store error: {other}"),
        Ok(_) => panic!("trusted a server its CA did not sign"),
    }
    let _ = client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await;
}

/// An `a2a` agent's task working upstream when its node is killed: the node that takes it
/// over takes the upstream task up again (it does not fail "node lost"), and the task ends
/// as the upstream's does.
#[tokio::test]
async fn a_forwarded_task_is_taken_up_by_the_node_that_takes_it_over() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let mut up = support::config(&["echo", "long"]);
    up.cluster = None;
    up.store = a2ad::config::StoreConfig::memory();
    up.agents[1].echo.delay_ms = 10_000;
    let up = support::TestServer::start(up).await;
    let agents = format!(
        r#"
[[agents]]
id = "gw"
backend = "a2a"
[agents.a2a]
card_url = "{}/.well-known/agent-card.json"
allow_private_networks = true
headers = {{ x-api-key = "{}" }}
"#,
        up.url("long"),
        support::ALICE
    );
    let mut c = Cluster::start_with_agents(url, 2, "", &agents).await;
    let sent = c
        .call(
            0,
            "gw",
            "message/send",
            json!({"message": {"role": "user", "messageId": new_id(),
                "parts": [{"type": "text", "text": "carry on"}]},
                "configuration": {"blocking": false}}),
        )
        .await;
    let id = result(&sent)["id"].as_str().expect("id").to_string();
    // Working upstream, with the upstream task noted: its event (the third: submitted,
    // working, the note's working) is durable.
    let mut events = c
        .stream(0, "gw", "tasks/resubscribe", json!({"id": id}), Some(0))
        .await;
    take(&mut events, 3).await;
    drop(events);
    let ups = up
        .official("long", support::official::V::V10, "ListTasks", json!({}))
        .await;
    assert_eq!(up.result(ups)["tasks"].as_array().map(Vec::len), Some(1));
    c.kill9(0);
    let done = poll_until(Duration::from_secs(40), || async {
        let t = result(&c.call(1, "gw", "tasks/get", json!({"id": id})).await).clone();
        (t["status"]["state"] != "working" && t["status"]["state"] != "submitted").then_some(t)
    })
    .await;
    assert_eq!(done["status"]["state"], "completed", "{done}");
    assert!(done.to_string().contains("echo: carry on"), "{done}");
    c.finish().await;
    up.stop().await;
}

#[tokio::test]
async fn a_node_reloads_its_own_file_while_the_others_serve() {
    let Some(url) = pg_url() else { return };
    let _turn = TURN.lock().await;
    let c = Cluster::start(url, 2, "").await;
    // A task under way on node 1 while node 0 reloads with an agent more.
    let slow = c
        .call(1, "slow", "message/send", json!({"message": {"role": "user", "messageId": uuid::Uuid::new_v4().to_string(), "parts": [{"type": "text", "text": "meanwhile"}]}, "configuration": {"blocking": false}}))
        .await;
    let slow_id = slow["result"]["id"].as_str().expect("task id").to_string();
    let text = c.text(0, "") + "\n[[agents]]\nid = \"added\"\n";
    c.nodes[0].as_ref().expect("node 0").reload(&text);
    let send = |i: usize, agent: &'static str| {
        c.call(i, agent, "message/send", json!({"message": {"role": "user", "messageId": uuid::Uuid::new_v4().to_string(), "parts": [{"type": "text", "text": "hi"}]}}))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = send(0, "added").await;
        if v["result"]["status"]["state"] == "completed" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 0 never served the added agent: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Node 1 reloaded nothing: it serves what it served, and not the new agent.
    let v = send(1, "echo").await;
    assert_eq!(v["result"]["status"]["state"], "completed", "{v}");
    let v = send(1, "added").await;
    assert!(v["error"].is_object(), "{v}");
    // The task under way on node 1 ends as it would have.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = c.call(0, "slow", "tasks/get", json!({"id": slow_id})).await;
        if v["result"]["status"]["state"] == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "the slow task never ended: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        c.nodes[0]
            .as_ref()
            .expect("node 0")
            .stderr()
            .contains("configuration reloaded"),
        "the reload is logged"
    );
}
