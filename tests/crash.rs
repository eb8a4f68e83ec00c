//! Crash tests of the durable store with the real binary: a mixed load (blocking and
//! non-blocking sends, streams, cancels, webhooks to a real receiver), `kill -9` at
//! varied moments, restart on the same file — then everything any client or receiver was
//! told must still hold (docs/ARCHITECTURE.md, "The durability invariant").

use crate::support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::binary::{Binary, TempDir};
use support::receiver::Receiver;

const KEY: &str = "key-crash-0123456789";
const ROUNDS: u64 = 6;

fn config(store: &std::path::Path) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"

[store]
path = "{}"

[webhooks]
allow_private_networks = true

[[api_keys]]
name = "crash"
key = "{KEY}"

[[agents]]
id = "echo"
[agents.limits]
requests_per_minute = 100000000

[[agents]]
id = "slow"
[agents.limits]
requests_per_minute = 100000000
concurrent_tasks = 4
max_queued_tasks = 10000
[agents.echo]
delay_ms = 200
progress_steps = 2
"#,
        store.display()
    )
}

/// How far a state is along a task's life (terminal states must match exactly).
fn rank(state: &str) -> u8 {
    match state {
        "submitted" => 0,
        "working" => 1,
        _ => 2,
    }
}

#[derive(Default)]
struct Told {
    /// Task → (agent, the most advanced state a client was told).
    tasks: HashMap<String, (String, String)>,
    /// Streams cut by a crash: task → (agent, last event number seen, its state).
    streams: HashMap<String, (String, u64, String)>,
}

impl Told {
    fn tell(&mut self, agent: &str, task: &str, state: &str) {
        let entry = self
            .tasks
            .entry(task.to_string())
            .or_insert_with(|| (agent.to_string(), state.to_string()));
        if rank(state) >= rank(&entry.1) {
            entry.1 = state.to_string();
        }
    }
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    fn new(base: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
            base: base.to_string(),
        }
    }

    async fn call(&self, agent: &str, method: &str, params: Value) -> Option<Value> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let resp = self
            .http
            .post(format!("{}/api/v1/a2a/{agent}", self.base))
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .ok()?;
        let bytes = resp.bytes().await.ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    fn message(text: &str) -> Value {
        json!({"message": {"role": "user", "messageId": uuid::Uuid::new_v4().to_string(),
                           "parts": [{"type": "text", "text": text}]}})
    }

    async fn stream(
        &self,
        agent: &str,
        method: &str,
        params: Value,
        last_event_id: Option<u64>,
    ) -> Option<reqwest::Response> {
        let body = json!({"jsonrpc": "2.0", "id": "s", "method": method, "params": params});
        let mut req = self
            .http
            .post(format!("{}/api/v1/a2a/{agent}", self.base))
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .timeout(Duration::from_secs(120))
            .body(body.to_string());
        if let Some(n) = last_event_id {
            req = req.header("last-event-id", n.to_string());
        }
        req.send().await.ok()
    }
}

/// Reads SSE frames from a response: (id, result) per event, until the body ends or breaks.
async fn frames(resp: reqwest::Response, mut each: impl FnMut(u64, &Value)) {
    let mut resp = resp;
    let mut buf: Vec<u8> = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.windows(2).position(|w| w == b"\n\n") {
            let frame: Vec<u8> = buf.drain(..pos + 2).collect();
            let text = String::from_utf8_lossy(&frame[..pos]).into_owned();
            let mut id = None;
            let mut data = None;
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.trim().parse::<u64>().ok();
                }
                if let Some(v) = line.strip_prefix("data: ") {
                    data = serde_json::from_str::<Value>(v).ok();
                }
            }
            if let (Some(id), Some(data)) = (id, data) {
                each(id, &data["result"]);
            }
        }
    }
}

/// A small deterministic generator (the rounds differ, the test is repeatable).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below.max(1)
    }
}

/// Records the task a `message/send` answer reported, in the state it reported.
fn tell_result(told: &Mutex<Told>, agent: &str, answer: Option<Value>) {
    if let Some(r) = answer.as_ref().and_then(|v| v.get("result")) {
        let id = r["id"].as_str().unwrap_or_default();
        let state = r["status"]["state"].as_str().unwrap_or_default();
        told.lock().expect("lock").tell(agent, id, state);
    }
}

/// Runs the load until `until`: clients that record what they were told.
async fn load(client: Arc<Client>, told: Arc<Mutex<Told>>, seed: u64, until: Instant) {
    let mut rng = Lcg(seed);
    while Instant::now() < until {
        match rng.next(100) {
            0..=49 => {
                let v = client
                    .call("echo", "message/send", Client::message("hi"))
                    .await;
                tell_result(&told, "echo", v);
            }
            50..=74 => {
                let mut params = Client::message("later");
                params["configuration"] = json!({"blocking": false});
                let v = client.call("slow", "message/send", params).await;
                tell_result(&told, "slow", v);
            }
            75..=89 => {
                let told = told.clone();
                if let Some(resp) = client
                    .stream("slow", "message/stream", Client::message("watch"), None)
                    .await
                {
                    // Read in the background: the crash cuts it.
                    tokio::spawn(async move {
                        frames(resp, |id, r| {
                            let task = r["id"].as_str().unwrap_or_default().to_string();
                            let state = r["status"]["state"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string();
                            let mut t = told.lock().expect("lock");
                            t.tell("slow", &task, &state);
                            if r["final"] == true {
                                t.streams.remove(&task);
                            } else {
                                t.streams.insert(task, ("slow".into(), id, state));
                            }
                        })
                        .await;
                    });
                }
            }
            _ => {
                let candidate = {
                    let t = told.lock().expect("lock");
                    t.tasks
                        .iter()
                        .filter(|(_, (agent, state))| agent == "slow" && rank(state) < 2)
                        .map(|(id, _)| id.clone())
                        .next()
                };
                if let Some(task) = candidate
                    && let Some(v) = client
                        .call("slow", "tasks/cancel", json!({"taskId": task}))
                        .await
                    && let Some(r) = v.get("result")
                {
                    let state = r["status"]["state"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    told.lock().expect("lock").tell("slow", &task, &state);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
}

/// Every task a client was told about is there, at least as far as it was told.
async fn check_told(client: &Client, told: &Told) {
    for (task, (agent, state)) in &told.tasks {
        let v = client
            .call(agent, "tasks/get", json!({"taskId": task}))
            .await
            .expect("tasks/get answers after a restart");
        let now = v["result"]["status"]["state"]
            .as_str()
            .unwrap_or_else(|| panic!("task {task} (told {state}) is gone: {v}"))
            .to_string();
        if rank(state) == 2 {
            assert_eq!(&now, state, "task {task} was told {state}");
        } else {
            assert!(
                rank(&now) >= rank(state),
                "task {task} was told {state}, is {now}"
            );
        }
    }
}

/// Every stream the crash cut continues after a restart from its Last-Event-ID, without a
/// gap or a duplicate, to the end.
async fn check_streams(client: &Client, told: &Told) -> usize {
    for (task, (agent, last, _)) in &told.streams {
        let resp = client
            .stream(
                agent,
                "tasks/resubscribe",
                json!({"taskId": task}),
                Some(*last),
            )
            .await
            .expect("resubscribe");
        let mut ids = Vec::new();
        let mut ended = false;
        frames(resp, |id, r| {
            ids.push(id);
            ended |= r["final"] == true;
        })
        .await;
        assert!(
            ended,
            "the resubscribed stream of {task} reached its end: {ids:?}"
        );
        let expected: Vec<u64> = (last + 1..=last + ids.len() as u64).collect();
        assert_eq!(
            ids, expected,
            "task {task} continued after {last} without gaps"
        );
    }
    told.streams.len()
}

async fn wait_all_finished(client: &Client, told: &Told) -> BTreeMap<String, String> {
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let mut states = BTreeMap::new();
        for (task, (agent, _)) in &told.tasks {
            if let Some(v) = client
                .call(agent, "tasks/get", json!({"taskId": task}))
                .await
            {
                let s = v["result"]["status"]["state"]
                    .as_str()
                    .unwrap_or("?")
                    .to_string();
                let error = v["result"]["status"]["error"]["message"].clone();
                if s == "failed" {
                    assert_eq!(
                        error, "interrupted by a server restart",
                        "the only failure here is a restart's"
                    );
                }
                states.insert(task.clone(), s);
            }
        }
        if states.len() == told.tasks.len() && states.values().all(|s| rank(s) == 2) {
            return states;
        }
        assert!(
            Instant::now() < end,
            "tasks still unfinished after the last restart: {:?}",
            states
                .iter()
                .filter(|(_, s)| rank(s) < 2)
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every state change of every task reached the receiver, and repeats carry the same
/// delivery id.
async fn check_webhooks(client: &Client, told: &Told, rx: &Receiver) {
    let mut expected: Vec<(String, String)> = Vec::new();
    for (task, (agent, _)) in &told.tasks {
        let resp = client
            .stream(agent, "tasks/resubscribe", json!({"taskId": task}), Some(0))
            .await
            .expect("replay");
        let mut previous = String::new();
        frames(resp, |_, r| {
            let state = r["status"]["state"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if state != previous {
                expected.push((task.clone(), format!("task.{state}")));
            }
            previous = state;
        })
        .await;
    }
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let hits = rx.hits();
        let mut ids: HashMap<(String, String), HashSet<String>> = HashMap::new();
        for h in &hits {
            let body = h.json();
            let key = (
                body["taskId"].as_str().unwrap_or_default().to_string(),
                body["event"].as_str().unwrap_or_default().to_string(),
            );
            ids.entry(key)
                .or_default()
                .insert(h.header("x-webhook-delivery").to_string());
        }
        for (key, set) in &ids {
            assert_eq!(
                set.len(),
                1,
                "{key:?} was delivered under several ids: {set:?}"
            );
        }
        let missing: Vec<_> = expected.iter().filter(|k| !ids.contains_key(*k)).collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < end,
            "deliveries never arrived: {missing:?} ({} hits)",
            hits.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_any_moment_loses_nothing_anyone_was_told() {
    let dir = TempDir::new();
    let store = dir.path.join("data").join("log");
    let text = config(&store);
    let rx = Receiver::ok().await;
    let told = Arc::new(Mutex::new(Told::default()));
    let mut rng = Lcg(42);
    let mut resumed_streams = 0;
    for round in 0..ROUNDS {
        let server = Binary::start(&text, &[], &[]);
        let client = Arc::new(Client::new(&server.base));
        if round == 0 {
            // An agent-wide webhook for each agent: durable before `set` answers.
            for agent in ["echo", "slow"] {
                let v = client
                    .call(
                        agent,
                        "tasks/pushNotificationConfig/set",
                        json!({"config": {"url": rx.url}}),
                    )
                    .await
                    .expect("set");
                assert_eq!(v["result"]["configured"], true, "{v}");
            }
        } else {
            let snapshot = {
                let t = told.lock().expect("lock");
                Told {
                    tasks: t.tasks.clone(),
                    streams: t.streams.clone(),
                }
            };
            check_told(&client, &snapshot).await;
            resumed_streams += check_streams(&client, &snapshot).await;
            told.lock().expect("lock").streams.clear();
        }
        let until = Instant::now() + Duration::from_millis(300 + rng.next(1200));
        let loads: Vec<_> = (0..3)
            .map(|i| tokio::spawn(load(client.clone(), told.clone(), round * 10 + i, until)))
            .collect();
        // Crash in the middle of the load.
        tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await;
        let _ = server.kill9();
        for l in loads {
            let _ = l.await;
        }
    }
    // The last restart: everything finishes, every delivery arrives.
    let server = Binary::start(&text, &[], &[]);
    let client = Client::new(&server.base);
    let snapshot = {
        let t = told.lock().expect("lock");
        Told {
            tasks: t.tasks.clone(),
            streams: t.streams.clone(),
        }
    };
    assert!(
        snapshot.tasks.len() > 20,
        "the load made tasks: {}",
        snapshot.tasks.len()
    );
    check_told(&client, &snapshot).await;
    resumed_streams += check_streams(&client, &snapshot).await;
    assert!(
        resumed_streams > 0,
        "some streams were cut by a crash and resumed"
    );
    let states = wait_all_finished(&client, &snapshot).await;
    check_webhooks(&client, &snapshot, &rx).await;
    let (code, _) = server.stop();
    assert_eq!(code, 0);
    let failed = states.values().filter(|s| *s == "failed").count();
    eprintln!(
        "{} tasks over {ROUNDS} crashes: {} completed, {} canceled, {failed} failed by a restart; {} deliveries; {resumed_streams} streams resumed",
        states.len(),
        states.values().filter(|s| *s == "completed").count(),
        states.values().filter(|s| *s == "canceled").count(),
        rx.hits().len()
    );
}
