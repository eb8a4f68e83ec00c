//! Test helpers: a real server on 127.0.0.1:0 per test, a JSON-RPC client over real HTTP,
//! a byte-level SSE reader, and polling with a deadline instead of sleeps.
#![allow(dead_code, unreachable_pub)]

pub mod binary;
pub mod idp;
pub mod official;
pub mod receiver;
pub mod upstream;

use std::future::Future;
use std::time::Duration;

use a2ad::config::{AgentConfig, ApiKeyConfig, Config, StoreConfig};
use a2ad::{Server, ServerHandle};
use serde_json::{Value, json};

pub const ALICE: &str = "key-alice-0123456789";
pub const BOB: &str = "key-bob-0123456789";
/// A key that may use only the agent `echo`.
pub const CAROL: &str = "key-carol-0123456789";

/// The store of a test's server or runtime: memory, or — with `A2AD_TEST_STORE=log` (the
/// default store) or `redb`, as CI runs the suite again — a fresh store of its own
/// (removed when the `TestServer` stops, or left in the system temp folder by a
/// runtime-level test).
pub fn test_store() -> StoreConfig {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let which = std::env::var("A2AD_TEST_STORE");
    if !matches!(which.as_deref(), Ok("redb" | "log")) {
        return StoreConfig::memory();
    }
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let root = std::env::temp_dir().join("a2ad-tests");
    if n == 0 {
        remove_stale_stores(&root);
    }
    let dir = root.join(format!("{}-{n}", std::process::id()));
    match which.as_deref() {
        Ok("redb") => StoreConfig::redb(dir.join("a2ad.redb").to_string_lossy().into_owned()),
        _ => StoreConfig::log(dir.join("log").to_string_lossy().into_owned()),
    }
}

/// The suite runs on the shared PostgreSQL store (`A2AD_TEST_STORE=postgres`).
pub fn on_postgres() -> bool {
    std::env::var("A2AD_TEST_STORE").as_deref() == Ok("postgres")
}

/// With `A2AD_TEST_STORE=postgres` (CI runs the suite a third time so), a one-node cluster
/// on the tests' PostgreSQL, on a schema of its own: the whole suite then drives the
/// shared store. `None` otherwise.
pub fn test_cluster() -> Option<a2ad::config::ClusterConfig> {
    if std::env::var("A2AD_TEST_STORE").as_deref() != Ok("postgres") {
        return None;
    }
    let url = std::env::var("A2AD_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    // The schemas of earlier test processes go first (others wait for this).
    static CLEAN: std::sync::Once = std::sync::Once::new();
    CLEAN.call_once(|| {
        let url = url.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let Ok((client, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                else {
                    return;
                };
                tokio::spawn(conn);
                let Ok(rows) = client
                    .query(
                        "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'a2ad_suite_%'",
                        &[],
                    )
                    .await
                else {
                    return;
                };
                for r in rows {
                    let name: String = r.get(0);
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                        .await;
                }
            });
        })
        .join();
    });
    let mut c = a2ad::config::ClusterConfig::postgres(url);
    c.schema = format!(
        "a2ad_suite_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..16]
    );
    c.heartbeat_ms = 200;
    c.lease_ttl_ms = 3000;
    c.pool_size = 4;
    Some(c)
}

/// Removes the store folders of test processes that are gone (runtime-level tests leave
/// theirs behind: nothing stops them).
fn remove_stale_stores(root: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.split('-').next() else {
            continue;
        };
        if !std::path::Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A configuration with keys for alice, bob and carol and one agent per id given, each
/// with permissive limits so tests don't trip them by accident.
pub fn config(agents: &[&str]) -> Config {
    let mut c = Config {
        store: test_store(),
        cluster: test_cluster(),
        ..Config::default()
    };
    c.server.listen = "127.0.0.1:0".into();
    c.server.ping_interval_seconds = 15.0;
    c.webhooks.allow_private_networks = true;
    c.api_keys = vec![
        ApiKeyConfig::new("alice", ALICE),
        ApiKeyConfig::new("bob", BOB),
        ApiKeyConfig {
            name: "carol".into(),
            key: CAROL.into(),
            agents: vec!["echo".into()],
        },
    ];
    c.agents = agents.iter().map(|id| agent(id)).collect();
    c
}

/// An echo agent with a generous rate limit.
pub fn agent(id: &str) -> AgentConfig {
    let mut a = AgentConfig::new(id);
    a.limits.requests_per_minute = 1_000_000;
    a
}

pub struct TestServer {
    pub base: String,
    pub handle: Option<ServerHandle>,
    pub client: reqwest::Client,
    /// A test store's folder, removed when the server stops.
    store_dir: Option<std::path::PathBuf>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // (An open file may be unlinked: the server still holds it until it stops.)
        if let Some(dir) = self.store_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl TestServer {
    pub async fn start(config: Config) -> TestServer {
        Self::start_with(config, Default::default()).await
    }

    /// A server with some agents served by the given backends.
    pub async fn start_with(
        config: Config,
        backends: std::collections::HashMap<a2ad::AgentId, std::sync::Arc<dyn a2ad::Agent>>,
    ) -> TestServer {
        let config = config.validated().expect("valid test config");
        let store_dir = (config.store.backend != a2ad::config::StoreBackend::Memory)
            .then(|| {
                std::path::Path::new(config.store.path())
                    .parent()
                    .map(|p| p.to_path_buf())
            })
            .flatten()
            .filter(|d| d.starts_with(std::env::temp_dir().join("a2ad-tests")));
        let server = backends
            .into_iter()
            .fold(Server::builder(config), |b, (id, backend)| {
                b.agent(id.as_str(), backend)
            })
            .build()
            .await
            .expect("bind");
        let handle = server.serve().expect("serve");
        let base = format!("http://{}", handle.local_addr());
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        TestServer {
            base,
            handle: Some(handle),
            client,
            store_dir,
        }
    }

    pub fn url(&self, agent: &str) -> String {
        format!("{}/api/v1/a2a/{agent}", self.base)
    }

    /// `HOST:PORT`, for raw TCP clients.
    pub fn addr(&self) -> String {
        self.base.trim_start_matches("http://").to_string()
    }

    /// An HTTP/2 (prior knowledge) connection with the `h2` crate, for frame-level tests.
    pub async fn h2(&self) -> h2::client::SendRequest<bytes::Bytes> {
        let tcp = tokio::net::TcpStream::connect(self.addr())
            .await
            .expect("connect");
        let (client, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }

    /// The text of `/metrics`.
    pub async fn scrape(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    }

    /// POSTs a raw body with a key; returns status, headers and the parsed JSON body.
    pub async fn post_raw(
        &self,
        agent: &str,
        key: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut req = self
            .client
            .post(self.url(agent))
            .header("content-type", "application/json")
            .body(body);
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.expect("body");
        let json = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&bytes)));
        (status, headers, json)
    }

    /// One JSON-RPC call as alice on `echo`-style agents; returns the whole envelope.
    pub async fn call_as(&self, key: &str, agent: &str, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let (status, _, v) = self.post_raw(agent, Some(key), body.to_string()).await;
        assert!(status == 200 || status == 429, "HTTP {status}: {v}");
        v
    }

    pub async fn call(&self, agent: &str, method: &str, params: Value) -> Value {
        self.call_as(ALICE, agent, method, params).await
    }

    /// `result` of a call that must succeed.
    #[track_caller]
    pub fn ok(&self, v: Value) -> Value {
        assert!(v.get("error").is_none(), "unexpected error: {v}");
        v["result"].clone()
    }

    /// Sends a text message and returns the result.
    pub async fn send(&self, agent: &str, text: &str, extra: Value) -> Value {
        let v = self
            .call(agent, "message/send", send_params(text, extra))
            .await;
        self.ok(v)
    }

    /// Opens an SSE stream for a streaming method.
    pub async fn stream(
        &self,
        key: &str,
        agent: &str,
        method: &str,
        params: Value,
        last_event_id: Option<&str>,
    ) -> reqwest::Response {
        let body = json!({"jsonrpc": "2.0", "id": "s-1", "method": method, "params": params});
        let mut req = self
            .client
            .post(self.url(agent))
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .header("x-api-key", key)
            .body(body.to_string());
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        req.send().await.expect("stream request")
    }

    /// `GET /api/v1/agents` as alice, by agent id.
    pub async fn agents_listing(&self) -> Value {
        let v: Value = self
            .client
            .get(format!("{}/api/v1/agents", self.base))
            .header("x-api-key", ALICE)
            .send()
            .await
            .expect("agents")
            .json()
            .await
            .expect("json");
        let mut by_id = serde_json::Map::new();
        for a in v["agents"].as_array().cloned().unwrap_or_default() {
            by_id.insert(a["id"].as_str().unwrap_or_default().to_string(), a);
        }
        Value::Object(by_id)
    }

    /// Opens a `message/stream` as alice.
    pub async fn stream_message(&self, agent: &str, params: Value) -> reqwest::Response {
        self.stream(ALICE, agent, "message/stream", params, None)
            .await
    }

    pub async fn stop(mut self) {
        if let Some(h) = self.handle.take() {
            h.stop();
            tokio::time::timeout(Duration::from_secs(30), h.stopped())
                .await
                .expect("server stopped within 30s");
        }
    }
}

pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// `message/send` params with one text part and a fresh messageId, merged with `extra`.
pub fn send_params(text: &str, extra: Value) -> Value {
    let mut p = json!({
        "message": {"role": "user", "messageId": new_id(), "parts": [{"type": "text", "text": text}]}
    });
    if let (Some(p), Value::Object(extra)) = (p.as_object_mut(), extra) {
        p.extend(extra);
    }
    p
}

/// The text parts of a message, in order.
pub fn texts(message: &Value) -> Vec<String> {
    message["parts"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p["text"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A turn for a test that keeps the CPU busy for seconds (a flood of events, a hostile
/// upstream, thousands of streams): such tests take turns, one at a time per test binary,
/// so that on a 2-core machine running the suite many tests at a time each still finishes
/// well within its deadlines. The others run beside it.
pub async fn heavy() -> tokio::sync::SemaphorePermit<'static> {
    static HEAVY: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
    HEAVY
        .acquire()
        .await
        .expect("the semaphore is never closed")
}

/// Polls `check` until it returns `Some`, up to `deadline`.
#[track_caller]
pub fn poll_until<T, F, Fut>(deadline: Duration, mut check: F) -> impl Future<Output = T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let caller = std::panic::Location::caller();
    async move {
        let end = tokio::time::Instant::now() + deadline;
        loop {
            if let Some(v) = check().await {
                return v;
            }
            if tokio::time::Instant::now() > end {
                panic!("condition not met within {deadline:?} (polled from {caller})");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One SSE item.
#[derive(Debug, Clone, PartialEq)]
pub enum SseItem {
    /// `id:` and the parsed `data:` JSON.
    Event { id: Option<u64>, data: Value },
    /// A `: ping` comment.
    Ping,
}

/// Reads an SSE body chunk by chunk and splits it into items on blank lines, checking the
/// framing byte by byte.
pub struct SseReader {
    resp: reqwest::Response,
    buf: Vec<u8>,
    pub raw: Vec<u8>,
}

impl SseReader {
    pub fn new(resp: reqwest::Response) -> Self {
        Self {
            resp,
            buf: Vec::new(),
            raw: Vec::new(),
        }
    }

    /// The next item, or `None` at the end of the body. Panics after 30 s of silence.
    pub async fn next(&mut self) -> Option<SseItem> {
        loop {
            if let Some(pos) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let frame: Vec<u8> = self.buf.drain(..pos + 2).collect();
                return Some(parse_frame(&frame[..pos]));
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.resp.chunk())
                .await
                .expect("SSE chunk within 30s")
                .expect("SSE read");
            match chunk {
                Some(c) => {
                    self.raw.extend_from_slice(&c);
                    self.buf.extend_from_slice(&c);
                }
                None => {
                    assert!(
                        self.buf.is_empty(),
                        "stream ended mid-frame: {:?}",
                        String::from_utf8_lossy(&self.buf)
                    );
                    return None;
                }
            }
        }
    }

    /// The next event (skipping pings).
    pub async fn next_event(&mut self) -> Option<(Option<u64>, Value)> {
        loop {
            match self.next().await? {
                SseItem::Event { id, data } => return Some((id, data)),
                SseItem::Ping => {}
            }
        }
    }

    /// All events until the end of the body.
    pub async fn collect(&mut self) -> Vec<(Option<u64>, Value)> {
        let mut out = Vec::new();
        while let Some(e) = self.next_event().await {
            out.push(e);
        }
        out
    }
}

fn parse_frame(frame: &[u8]) -> SseItem {
    let text = std::str::from_utf8(frame).expect("SSE frame is UTF-8");
    if text == ": ping" {
        return SseItem::Ping;
    }
    let mut id = None;
    let mut data = None;
    for line in text.split('\n') {
        if let Some(v) = line.strip_prefix("id: ") {
            id = Some(v.parse().expect("numeric id"));
        } else if let Some(v) = line.strip_prefix("data: ") {
            assert!(data.is_none(), "one data line per event: {text:?}");
            data = Some(serde_json::from_str(v).expect("data is JSON"));
        } else {
            panic!("unexpected SSE line {line:?} in {text:?}");
        }
    }
    SseItem::Event {
        id,
        data: data.expect("an event has a data line"),
    }
}

/// The value of one series (`name{labels}` and a space, or `name `) in a `/metrics` text; 0
/// when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}
