//! A client of the official dialects (A2A 1.0 on `…/jsonrpc/v1`, 0.3 on `…/jsonrpc/v0.3`)
//! over real HTTP, sending `A2A-Version` as the SDKs do.

use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use super::{ALICE, SseReader, TestServer, new_id};

/// Which official interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V {
    V10,
    V03,
}

impl V {
    pub fn path(self) -> &'static str {
        match self {
            V::V10 => "jsonrpc/v1",
            V::V03 => "jsonrpc/v0.3",
        }
    }

    pub fn header(self) -> &'static str {
        match self {
            V::V10 => "1.0",
            V::V03 => "0.3",
        }
    }

    pub fn send(self) -> &'static str {
        match self {
            V::V10 => "SendMessage",
            V::V03 => "message/send",
        }
    }

    pub fn stream(self) -> &'static str {
        match self {
            V::V10 => "SendStreamingMessage",
            V::V03 => "message/stream",
        }
    }

    pub fn get(self) -> &'static str {
        match self {
            V::V10 => "GetTask",
            V::V03 => "tasks/get",
        }
    }

    pub fn cancel(self) -> &'static str {
        match self {
            V::V10 => "CancelTask",
            V::V03 => "tasks/cancel",
        }
    }

    pub fn subscribe(self) -> &'static str {
        match self {
            V::V10 => "SubscribeToTask",
            V::V03 => "tasks/resubscribe",
        }
    }

    /// A task state's wire name.
    pub fn state(self, s: &str) -> String {
        match self {
            V::V10 => format!("TASK_STATE_{}", s.replace('-', "_").to_uppercase()),
            V::V03 => s.to_string(),
        }
    }
}

/// A user message with one text part (and a `tck-…` style id when `id` is given).
pub fn message(v: V, text: &str, id: Option<&str>) -> Value {
    let id = id.map_or_else(new_id, |p| format!("{p}-{}", new_id()));
    match v {
        V::V10 => json!({"messageId": id, "role": "ROLE_USER", "parts": [{"text": text}]}),
        V::V03 => json!({"kind": "message", "messageId": id, "role": "user",
                         "parts": [{"kind": "text", "text": text}]}),
    }
}

/// The task of a send result (1.0 wraps it in `task`).
pub fn task_of(v: V, result: &Value) -> Value {
    match v {
        V::V10 => result["task"].clone(),
        V::V03 => result.clone(),
    }
}

impl TestServer {
    /// The URL of an agent's official interface.
    pub fn official_url(&self, agent: &str, v: V) -> String {
        format!("{}/{}", self.url(agent), v.path())
    }

    /// POSTs a raw body to an official path with the given headers (none added).
    pub async fn official_raw(
        &self,
        agent: &str,
        v: V,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> (u16, HeaderMap, Value) {
        let mut req = self.client.post(self.official_url(agent, v)).body(body);
        for (k, val) in headers {
            req = req.header(*k, *val);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.expect("body");
        // A 0.3 stream's error before its first event is one `data:` frame (J03 §7.9).
        let bytes = match headers.get("content-type") {
            Some(ct) if ct == "text/event-stream" => {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let frames: Vec<&str> = text
                    .split("\n\n")
                    .filter(|f| !f.trim().is_empty())
                    .collect();
                assert_eq!(frames.len(), 1, "one error frame: {text}");
                let data = frames[0].strip_prefix("data: ").expect("a data: frame");
                assert!(!data.contains('\n'), "one line: {text}");
                data.as_bytes().to_vec().into()
            }
            _ => bytes,
        };
        let json = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&bytes)));
        (status, headers, json)
    }

    /// One call as `key`, with the interface's version header; the whole envelope.
    pub async fn official_as(
        &self,
        key: &str,
        agent: &str,
        v: V,
        method: &str,
        params: Value,
    ) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
        let (status, _, out) = self
            .official_raw(
                agent,
                v,
                &[
                    ("content-type", "application/json"),
                    ("a2a-version", v.header()),
                    ("x-api-key", key),
                ],
                body.to_string(),
            )
            .await;
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["id"], 7, "{out}");
        out
    }

    /// One call as alice.
    pub async fn official(&self, agent: &str, v: V, method: &str, params: Value) -> Value {
        self.official_as(ALICE, agent, v, method, params).await
    }

    /// The `result` of a call as alice that must succeed.
    #[track_caller]
    pub fn result(&self, v: Value) -> Value {
        assert!(v.get("error").is_none(), "unexpected error: {v}");
        assert!(v.get("result").is_some(), "no result: {v}");
        v["result"].clone()
    }

    /// Sends a message (blocking unless `wait` is false) and returns the task.
    pub async fn official_send(&self, agent: &str, v: V, msg: Value, wait: bool) -> Value {
        let config = match v {
            V::V10 => json!({"returnImmediately": !wait}),
            V::V03 => json!({"blocking": wait}),
        };
        let out = self
            .official(
                agent,
                v,
                v.send(),
                json!({"message": msg, "configuration": config}),
            )
            .await;
        task_of(v, &self.result(out))
    }

    /// Opens a streaming call as alice with request id `"s-1"`.
    pub async fn official_stream(
        &self,
        agent: &str,
        v: V,
        method: &str,
        params: Value,
    ) -> reqwest::Response {
        let body = json!({"jsonrpc": "2.0", "id": "s-1", "method": method, "params": params});
        self.client
            .post(self.official_url(agent, v))
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .header("a2a-version", v.header())
            .header("x-api-key", ALICE)
            .body(body.to_string())
            .send()
            .await
            .expect("stream request")
    }

    /// The `result`s of a whole stream, checking every frame answers `"s-1"`.
    pub async fn official_events(
        &self,
        agent: &str,
        v: V,
        method: &str,
        params: Value,
    ) -> Vec<Value> {
        let resp = self.official_stream(agent, v, method, params).await;
        assert_eq!(
            resp.headers()["content-type"],
            "text/event-stream",
            "not a stream: {:?}",
            resp.headers()
        );
        SseReader::new(resp)
            .collect()
            .await
            .into_iter()
            .map(|(_, data)| {
                assert_eq!(data["id"], "s-1", "{data}");
                assert!(data.get("error").is_none(), "{data}");
                data["result"].clone()
            })
            .collect()
    }
}

/// The 1.0 `ErrorInfo` of an error (its `data[0]`), checking the envelope's shape.
#[track_caller]
pub fn error_info(envelope: &Value) -> Value {
    let data = &envelope["error"]["data"];
    assert!(data.is_array(), "1.0 error data is an array: {envelope}");
    let info = data[0].clone();
    assert_eq!(info["@type"], "type.googleapis.com/google.rpc.ErrorInfo");
    assert_eq!(info["domain"], "a2a-protocol.org");
    info
}
