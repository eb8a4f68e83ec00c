//! The official dialects from the other side: what a2ad sends an upstream A2A agent (the
//! `a2a` backend, docs/CONFIG.md) and how it reads the answers, over JSON-RPC (1.0 and
//! 0.3), HTTP+JSON (1.0) and gRPC (1.0). The operations are [`ops::TABLE`]'s, the messages
//! go out through the renderers the server answers with, and parts come in through the
//! parsers the server reads requests with: one codec, both ways. On gRPC a request is its
//! operation's ProtoJSON params read into the protobuf message (`pb`), and an answer the
//! protobuf message written back as ProtoJSON, which the JSON readers here read.

use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::Version;
use super::errors;
use super::ops::Op;
use super::params::{self, field};
use super::pb;
use super::render::MessageOut;
use crate::config::AgentLimits;
use crate::error::Error;
use crate::model::{Artifact, ContextId, Extensions, Message, Part, Role, TaskId, TaskState};
use crate::rpc::json::{self, Obj, Raw};

/// An upstream interface's binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Binding {
    /// JSON-RPC 2.0 over HTTP POST (1.0 or 0.3).
    JsonRpc,
    /// 1.0's HTTP+JSON (REST) binding.
    HttpJson,
    /// 1.0's gRPC binding.
    Grpc,
}

impl Binding {
    /// The name `[agents.a2a] binding` gives it.
    pub(crate) fn config_name(self) -> &'static str {
        match self {
            Self::JsonRpc => "jsonrpc",
            Self::HttpJson => "http_json",
            Self::Grpc => "grpc",
        }
    }

    /// The binding a card names (`protocolBinding`, 0.3 `transport`).
    fn of_card(name: &str) -> Option<Self> {
        match name.to_ascii_uppercase().as_str() {
            "JSONRPC" => Some(Self::JsonRpc),
            "HTTP+JSON" | "HTTP_JSON" | "REST" => Some(Self::HttpJson),
            "GRPC" => Some(Self::Grpc),
            _ => None,
        }
    }
}

/// Where and how an upstream is called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// The interface's URL (JSON-RPC: the endpoint; HTTP+JSON: the base of its paths;
    /// gRPC: the server's origin).
    pub(crate) url: String,
    pub(crate) binding: Binding,
    pub(crate) version: Version,
    /// The interface's `tenant` (1.0), sent in every request's `tenant` field.
    pub(crate) tenant: Option<String>,
    /// `url` parsed (when it parses): a call to `url` itself is not parsed again.
    pub(crate) parsed: Option<url::Url>,
}

/// What a2ad takes from an upstream's card.
#[derive(Clone, Debug)]
pub(crate) struct UpstreamCard {
    /// The interface a2ad calls.
    pub(crate) endpoint: Endpoint,
    /// `capabilities.streaming`.
    pub(crate) streaming: bool,
    pub(crate) name: Option<String>,
    pub(crate) description: Option<String>,
    /// `skills`, as the card lists them (1.0 shape: `id`, `name`, `description`, `tags`,
    /// and what else each holds).
    pub(crate) skills: Value,
    pub(crate) input_modes: Option<Value>,
    pub(crate) output_modes: Option<Value>,
}

/// An interface a card offers.
struct Offer {
    url: String,
    binding: Option<Binding>,
    version: Option<Version>,
    tenant: Option<String>,
}

fn version_of(text: &str) -> Option<Version> {
    match text.split('.').take(2).collect::<Vec<_>>()[..] {
        ["1", _] => Some(Version::V10),
        ["0", "3"] => Some(Version::V03),
        _ => None,
    }
}

/// Reads a card (1.0 `supportedInterfaces`, or 0.3 `url` + `preferredTransport` +
/// `additionalInterfaces`) and picks the interface to call: the `protocol` asked for, or
/// (`auto`) the newest the card offers; then the `binding` asked for, or (`auto`) the
/// card's first interface of that version a2ad speaks (JSON-RPC, HTTP+JSON, or gRPC in
/// 1.0). A gRPC interface's bare `host:port` (what the official SDKs list) is reached with
/// the scheme of `card_url`, the URL the card came from.
pub(crate) fn read_card(
    body: &[u8],
    card_url: &str,
    binding: &str,
    protocol: &str,
) -> Result<UpstreamCard, String> {
    let card: Value =
        serde_json::from_slice(body).map_err(|e| format!("its card is not JSON ({e})"))?;
    let Some(c) = card.as_object() else {
        return Err("its card is not a JSON object".into());
    };
    let mut offers = Vec::new();
    if let Some(list) = c.get("supportedInterfaces").and_then(Value::as_array) {
        for i in list {
            let Some(url) = i.get("url").and_then(Value::as_str) else {
                continue;
            };
            offers.push(Offer {
                url: url.to_string(),
                binding: i
                    .get("protocolBinding")
                    .and_then(Value::as_str)
                    .and_then(Binding::of_card),
                version: i
                    .get("protocolVersion")
                    .and_then(Value::as_str)
                    .and_then(version_of),
                tenant: i
                    .get("tenant")
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                    .map(str::to_string),
            });
        }
    }
    // The 0.3 fields: the main URL and its transport, then the others.
    let v03 = c
        .get("protocolVersion")
        .and_then(Value::as_str)
        .and_then(version_of)
        .unwrap_or(Version::V03);
    if let Some(url) = c.get("url").and_then(Value::as_str) {
        let transport = c
            .get("preferredTransport")
            .and_then(Value::as_str)
            .unwrap_or("JSONRPC");
        offers.push(Offer {
            url: url.to_string(),
            binding: Binding::of_card(transport),
            version: Some(v03),
            tenant: None,
        });
    }
    if let Some(list) = c.get("additionalInterfaces").and_then(Value::as_array) {
        for i in list {
            let (Some(url), Some(t)) = (
                i.get("url").and_then(Value::as_str),
                i.get("transport").and_then(Value::as_str),
            ) else {
                continue;
            };
            offers.push(Offer {
                url: url.to_string(),
                binding: Binding::of_card(t),
                version: Some(v03),
                tenant: None,
            });
        }
    }
    if offers.is_empty() {
        return Err("its card lists no interface (supportedInterfaces or url)".into());
    }
    let versions: &[Version] = match protocol {
        "1.0" => &[Version::V10],
        "0.3" => &[Version::V03],
        _ => &[Version::V10, Version::V03],
    };
    // gRPC is 1.0's only (0.3's gRPC service is another proto).
    let speaks = |b: Option<Binding>, v: Version| match (binding, b) {
        (_, Some(Binding::Grpc)) if v == Version::V03 => false,
        ("auto", b) => b.is_some(),
        (name, b) => b.is_some_and(|b| b.config_name() == name),
    };
    let chosen = versions.iter().find_map(|&v| {
        offers
            .iter()
            .find(|o| o.version == Some(v) && speaks(o.binding, v))
            .map(|o| (o, v))
    });
    let Some((offer, version)) = chosen else {
        return Err(format!(
            "its card offers no interface a2ad can call (binding {binding}, protocol {protocol})"
        ));
    };
    let binding = offer.binding.unwrap_or(Binding::JsonRpc);
    let url = if binding == Binding::Grpc && !offer.url.contains("://") {
        let scheme = card_url.split_once("://").map_or("http", |(s, _)| s);
        format!("{scheme}://{}", offer.url)
    } else {
        offer.url.clone()
    };
    let endpoint = Endpoint {
        parsed: url::Url::parse(&url).ok(),
        url,
        binding,
        version,
        tenant: offer.tenant.clone(),
    };
    let text = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_string);
    Ok(UpstreamCard {
        endpoint,
        streaming: c
            .get("capabilities")
            .and_then(|c| c.get("streaming"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        name: text("name"),
        description: text("description"),
        skills: c.get("skills").cloned().unwrap_or_else(|| json!([])),
        input_modes: c.get("defaultInputModes").cloned(),
        output_modes: c.get("defaultOutputModes").cloned(),
    })
}

/// One upstream call, as it goes on the wire.
pub(crate) struct Call {
    pub(crate) http_method: hyper::Method,
    pub(crate) url: String,
    /// The body (JSON), if the call has one.
    pub(crate) body: Option<Vec<u8>>,
    /// Whether the answer is an SSE stream.
    pub(crate) stream: bool,
}

/// What is sent upstream for one operation.
pub(crate) enum Request<'a> {
    /// `SendMessage` / `SendStreamingMessage`: the message, in its upstream context and
    /// (continuing an interrupted task) upstream task; `wait`: a blocking send.
    Send {
        message: &'a Message,
        context: &'a str,
        task: Option<&'a str>,
        stream: bool,
        wait: bool,
    },
    /// `GetTask`.
    Get(&'a str),
    /// `CancelTask`.
    Cancel(&'a str),
    /// `SubscribeToTask`.
    Subscribe(&'a str),
}

impl Request<'_> {
    fn op(&self) -> Op {
        match self {
            Self::Send { stream: true, .. } => Op::SendStreamingMessage,
            Self::Send { .. } => Op::SendMessage,
            Self::Get(_) => Op::GetTask,
            Self::Cancel(_) => Op::CancelTask,
            Self::Subscribe(_) => Op::SubscribeToTask,
        }
    }

    /// The operation's params (the HTTP+JSON body of a send; on gRPC, the ProtoJSON of the
    /// request message), with the interface's tenant.
    fn params(&self, v: Version, tenant: Option<&str>) -> Value {
        let mut params = self.bare_params(v);
        if let (Version::V10, Some(tenant), Some(o)) = (v, tenant, params.as_object_mut()) {
            o.insert("tenant".into(), Value::from(tenant));
        }
        params
    }

    fn bare_params(&self, v: Version) -> Value {
        match self {
            Self::Send {
                message,
                context,
                task,
                wait,
                ..
            } => {
                let context = ContextId::new(*context);
                let task = task.map(TaskId::new);
                let m = MessageOut {
                    v,
                    message,
                    task_id: task.as_ref(),
                    context_id: Some(&context),
                    metadata: None,
                };
                let configuration = match v {
                    Version::V10 => json!({"returnImmediately": !wait}),
                    Version::V03 => json!({"blocking": wait}),
                };
                json!({"message": m, "configuration": configuration})
            }
            Self::Get(id) | Self::Cancel(id) | Self::Subscribe(id) => json!({"id": id}),
        }
    }

    /// The call on `endpoint`; `id` numbers a JSON-RPC request.
    pub(crate) fn call(&self, endpoint: &Endpoint, id: u64) -> Result<Call, String> {
        let op = self.op();
        let stream = matches!(op, Op::SendStreamingMessage | Op::SubscribeToTask);
        let v = endpoint.version;
        let tenant = endpoint.tenant.as_deref();
        Ok(match endpoint.binding {
            Binding::Grpc => Call {
                http_method: hyper::Method::POST,
                url: format!(
                    "{}/lf.a2a.v1.A2AService/{}",
                    endpoint.url.trim_end_matches('/'),
                    op.names().grpc
                ),
                body: Some(self.grpc_message(self.params(v, tenant))?),
                stream,
            },
            Binding::HttpJson => {
                let names = op.names();
                let (methods, pattern) = names.rest;
                let task = match self {
                    Self::Get(t) | Self::Cancel(t) | Self::Subscribe(t) => *t,
                    Self::Send { .. } => "",
                };
                let path = pattern.replace("{id}", &percent(task));
                let body = match self {
                    Self::Send { .. } => serde_json::to_vec(&self.params(v, tenant)).ok(),
                    _ if methods[0] == hyper::Method::POST => Some(b"{}".to_vec()),
                    _ => None,
                };
                Call {
                    http_method: methods[0].clone(),
                    url: format!("{}/{path}", endpoint.url.trim_end_matches('/')),
                    body,
                    stream,
                }
            }
            Binding::JsonRpc => {
                let method = match v {
                    Version::V10 => op.name(),
                    Version::V03 => op.names().v03.unwrap_or(op.name()),
                };
                let body = json!({
                    "jsonrpc": "2.0",
                    "id": id,
                    "method": method,
                    "params": self.params(v, tenant),
                });
                Call {
                    http_method: hyper::Method::POST,
                    url: endpoint.url.clone(),
                    body: serde_json::to_vec(&body).ok(),
                    stream,
                }
            }
        })
    }

    /// The gRPC request message (the operation's ProtoJSON params read into it), framed.
    fn grpc_message(&self, params: Value) -> Result<Vec<u8>, String> {
        fn framed<T: prost::Message + serde::de::DeserializeOwned>(
            params: Value,
        ) -> Result<Vec<u8>, String> {
            let m: T = serde_json::from_value(params).map_err(|e| e.to_string())?;
            let len = u32::try_from(m.encoded_len()).map_err(|_| "a message past 4 GiB")?;
            let mut out = Vec::with_capacity(5 + len as usize);
            out.push(0);
            out.extend_from_slice(&len.to_be_bytes());
            m.encode(&mut out).map_err(|e| e.to_string())?;
            Ok(out)
        }
        match self {
            Self::Send { .. } => framed::<pb::SendMessageRequest>(params),
            Self::Get(_) => framed::<pb::GetTaskRequest>(params),
            Self::Cancel(_) => framed::<pb::CancelTaskRequest>(params),
            Self::Subscribe(_) => framed::<pb::SubscribeToTaskRequest>(params),
        }
    }

    /// A gRPC answer's message as the ProtoJSON [`read_answer`] reads: a send's
    /// `SendMessageResponse`, a `Task` (`GetTask`, `CancelTask`), a stream's
    /// `StreamResponse` ([`grpc_event`]).
    pub(crate) fn grpc_answer(&self, message: &[u8]) -> Result<Vec<u8>, Refusal> {
        match self {
            Self::Send { stream: false, .. } => protojson::<pb::SendMessageResponse>(message),
            Self::Get(_) | Self::Cancel(_) => protojson::<pb::Task>(message),
            Self::Send { .. } | Self::Subscribe(_) => protojson::<pb::StreamResponse>(message),
        }
    }
}

/// A protobuf message as its ProtoJSON.
fn protojson<T: prost::Message + Default + serde::Serialize>(
    message: &[u8],
) -> Result<Vec<u8>, Refusal> {
    let m = T::decode(message).map_err(|e| garbage(format!("not protobuf ({e})")))?;
    serde_json::to_vec(&m).map_err(|e| garbage(e.to_string()))
}

/// A gRPC stream's message (`StreamResponse`) as the ProtoJSON [`read_event`] reads.
pub(crate) fn grpc_event(message: &[u8]) -> Result<String, Refusal> {
    String::from_utf8(protojson::<pb::StreamResponse>(message)?).map_err(|e| garbage(e.to_string()))
}

/// A gRPC call's status (`grpc-status`, `grpc-message`, and the `ErrorInfo` of
/// `grpc-status-details-bin`, in trailers or the headers of a trailers-only answer):
/// `None` without one, `Ok` for OK, else the A2A error it stands for — the one its
/// `ErrorInfo.reason` names, or the first of the error table with its gRPC code.
pub(crate) fn grpc_status(headers: &hyper::HeaderMap) -> Option<Result<(), Refusal>> {
    use tonic_types::StatusExt as _;
    let status = tonic::Status::from_header_map(headers)?;
    if status.code() == tonic::Code::Ok {
        return Some(Ok(()));
    }
    let reason = status.get_details_error_info().map(|i| i.reason);
    let row = errors::TABLE
        .iter()
        .find(|r| reason.as_deref() == Some(r.reason))
        .or_else(|| errors::TABLE.iter().find(|r| r.grpc == status.code()));
    let message = format!(
        "gRPC {}: {}",
        errors::code_name(status.code()),
        status.message()
    );
    Some(Err(Refusal::Error(row.map_or(0, |r| r.code), message)))
}

/// A path segment with everything but unreserved characters percent-encoded.
fn percent(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An upstream task as a2ad reads it.
#[derive(Clone, Debug)]
pub(crate) struct UpTask {
    pub(crate) id: String,
    pub(crate) context_id: String,
    pub(crate) state: TaskState,
    /// `status.message`.
    pub(crate) message: Option<Message>,
    pub(crate) artifacts: Vec<Artifact>,
}

/// One thing an upstream says: a result, or a stream event.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    /// A task (a send's result, `GetTask`, a stream's first event).
    Task(UpTask),
    /// A bare message: the agent answered without a task.
    Message(Message),
    /// A task's new status.
    Status {
        task_id: String,
        context_id: String,
        state: TaskState,
        message: Option<Message>,
    },
    /// An artifact, or a chunk of one.
    Artifact {
        task_id: String,
        artifact: Artifact,
        append: bool,
        last_chunk: bool,
    },
}

/// What went wrong in an upstream's answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The answer does not read (not JSON, wrong shape): garbage.
    Garbage(String),
    /// An A2A error: its code and message.
    Error(i64, String),
}

fn garbage(what: impl Into<String>) -> Refusal {
    Refusal::Garbage(what.into())
}

fn bad(e: Error) -> Refusal {
    garbage(e.to_string())
}

/// Reads one answer: a JSON-RPC response (`binding` JSON-RPC), or the HTTP+JSON body,
/// holding a result of `op`.
pub(crate) fn read_answer(
    endpoint: &Endpoint,
    op_is_get: bool,
    body: &[u8],
    limits: &AgentLimits,
) -> Result<Event, Refusal> {
    let raw: Box<RawValue> =
        serde_json::from_slice(body).map_err(|e| garbage(format!("not JSON ({e})")))?;
    let result = match endpoint.binding {
        Binding::JsonRpc => jsonrpc_result(Raw::from(&raw))?,
        Binding::HttpJson | Binding::Grpc => Raw::from(&raw),
    };
    let v = endpoint.version;
    if op_is_get {
        return task(v, result, limits).map(Event::Task);
    }
    event(v, result, limits)
}

/// A JSON-RPC response's `result`, or its `error` as a refusal.
fn jsonrpc_result(raw: Raw<'_>) -> Result<Raw<'_>, Refusal> {
    let o = Obj::parse(raw, "response").map_err(bad)?;
    if let Some(e) = o.get("error") {
        let e = Obj::parse(e, "error").map_err(bad)?;
        let code = e
            .get("code")
            .and_then(|c| c.get().parse::<i64>().ok())
            .unwrap_or(0);
        let message = e
            .get("message")
            .and_then(|m| json::string(m, "message").ok())
            .map(|m| m.into_owned())
            .unwrap_or_default();
        return Err(Refusal::Error(code, message));
    }
    o.get("result")
        .ok_or_else(|| garbage("a JSON-RPC response without result or error"))
}

/// Reads an HTTP+JSON error body (`google.rpc.Status`, or an `{"error": …}` wrapper).
pub(crate) fn read_rest_error(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let e = v.get("error").unwrap_or(&v);
    e.get("message")
        .and_then(Value::as_str)
        .map(|m| m.chars().take(200).collect())
}

/// Reads one SSE `data:` payload of a stream (a JSON-RPC response on JSON-RPC, the bare
/// event on HTTP+JSON), or a gRPC stream's message as [`grpc_event`] writes it.
pub(crate) fn read_event(
    endpoint: &Endpoint,
    data: &str,
    limits: &AgentLimits,
) -> Result<Event, Refusal> {
    read_answer(endpoint, false, data.as_bytes(), limits)
}

/// A send's result or a stream event: 1.0 wraps it in a one-member object (`task`,
/// `message`, `statusUpdate`, `artifactUpdate`), 0.3 names it in `kind`. A 1.0 `GetTask`
/// result is a bare task (read by [`task`]).
fn event(v: Version, raw: Raw<'_>, limits: &AgentLimits) -> Result<Event, Refusal> {
    let o = Obj::parse(raw, "result").map_err(bad)?;
    match v {
        Version::V10 => {
            if let Some(t) = field(&o, "task") {
                return task(v, t, limits).map(Event::Task);
            }
            if let Some(m) = field(&o, "message") {
                return message(v, m, limits).map(Event::Message);
            }
            if let Some(s) = field(&o, "statusUpdate") {
                return status_update(v, s, limits);
            }
            if let Some(a) = field(&o, "artifactUpdate") {
                return artifact_update(v, a, limits);
            }
            // A bare task (what some 1.0 servers answer a send with).
            if field(&o, "status").is_some() && field(&o, "id").is_some() {
                return task(v, raw, limits).map(Event::Task);
            }
            Err(garbage(
                "a result that is none of task, message, statusUpdate, artifactUpdate",
            ))
        }
        Version::V03 => {
            let kind = params::opt_str(&o, "kind", "kind").map_err(bad)?;
            match kind.as_deref() {
                Some("task") => task(v, raw, limits).map(Event::Task),
                Some("message") => message(v, raw, limits).map(Event::Message),
                Some("status-update") => status_update(v, raw, limits),
                Some("artifact-update") => artifact_update(v, raw, limits),
                Some(k) => Err(garbage(format!("a result of unknown kind {k:?}"))),
                None if field(&o, "status").is_some() => task(v, raw, limits).map(Event::Task),
                None => Err(garbage("a result without kind")),
            }
        }
    }
}

fn str_field(o: &Obj<'_>, key: &str) -> Result<String, Refusal> {
    params::opt_str(o, key, key)
        .map_err(bad)?
        .ok_or_else(|| garbage(format!("no {key}")))
}

fn state(v: Version, raw: Raw<'_>) -> Result<TaskState, Refusal> {
    match v {
        Version::V10 => params::state_10(raw, "status.state").map_err(bad),
        Version::V03 => {
            let name = json::string(raw, "status.state").map_err(bad)?;
            let s = match &*name {
                "submitted" => TaskState::Submitted,
                "working" => TaskState::Working,
                "completed" => TaskState::Completed,
                "failed" => TaskState::Failed,
                "canceled" | "cancelled" => TaskState::Canceled,
                "input-required" => TaskState::InputRequired,
                "auth-required" => TaskState::AuthRequired,
                "rejected" => TaskState::Rejected,
                other => return Err(garbage(format!("an unknown task state {other:?}"))),
            };
            Ok(s)
        }
    }
}

/// `status`: its state and message.
fn status(
    v: Version,
    raw: Raw<'_>,
    limits: &AgentLimits,
) -> Result<(TaskState, Option<Message>), Refusal> {
    let o = Obj::parse(raw, "status").map_err(bad)?;
    let Some(s) = field(&o, "state") else {
        return Err(garbage("a status without state"));
    };
    let state = state(v, s)?;
    let message = match field(&o, "message") {
        Some(m) if m.get() != "null" => Some(message(v, m, limits)?),
        _ => None,
    };
    Ok((state, message))
}

fn task(v: Version, raw: Raw<'_>, limits: &AgentLimits) -> Result<UpTask, Refusal> {
    let o = Obj::parse(raw, "task").map_err(bad)?;
    let Some(s) = field(&o, "status") else {
        return Err(garbage("a task without status"));
    };
    let (state, message) = status(v, s, limits)?;
    let mut artifacts = Vec::new();
    if let Some(list) = field(&o, "artifacts") {
        for a in json::array(list, "artifacts", 10_000).map_err(bad)? {
            artifacts.push(artifact(v, a, limits)?);
        }
    }
    Ok(UpTask {
        id: str_field(&o, "id")?,
        context_id: params::opt_str(&o, "contextId", "contextId")
            .map_err(bad)?
            .unwrap_or_default(),
        state,
        message,
        artifacts,
    })
}

/// An agent's message (its role is taken as the agent's whatever it says).
fn message(v: Version, raw: Raw<'_>, limits: &AgentLimits) -> Result<Message, Refusal> {
    let o = Obj::parse(raw, "message").map_err(bad)?;
    let parts = self::parts(v, field(&o, "parts"), limits)?;
    let extensions = json::message_extensions(field(&o, "extensions")).map_err(bad)?;
    Ok(Message {
        role: Role::Agent,
        parts,
        message_id: params::opt_str(&o, "messageId", "messageId")
            .map_err(bad)?
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        extensions,
    })
}

fn parts(v: Version, raw: Option<Raw<'_>>, limits: &AgentLimits) -> Result<Vec<Part>, Refusal> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    json::array(raw, "parts", limits.max_parts)
        .map_err(bad)?
        .into_iter()
        .enumerate()
        .map(|(i, p)| params::part(v, i, p, limits).map_err(bad))
        .collect()
}

fn artifact(v: Version, raw: Raw<'_>, limits: &AgentLimits) -> Result<Artifact, Refusal> {
    let o = Obj::parse(raw, "artifact").map_err(bad)?;
    let opt = |k: &str| params::opt_str(&o, k, k).map_err(bad);
    Ok(Artifact {
        artifact_id: opt("artifactId")?.unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        name: opt("name")?,
        description: opt("description")?,
        parts: parts(v, field(&o, "parts"), limits)?,
        extensions: match field(&o, "extensions") {
            Some(e) => json::message_extensions(Some(e)).map_err(bad)?,
            None => Extensions::default(),
        },
    })
}

fn status_update(v: Version, raw: Raw<'_>, limits: &AgentLimits) -> Result<Event, Refusal> {
    let o = Obj::parse(raw, "statusUpdate").map_err(bad)?;
    let Some(s) = field(&o, "status") else {
        return Err(garbage("a status update without status"));
    };
    let (state, message) = status(v, s, limits)?;
    Ok(Event::Status {
        task_id: str_field(&o, "taskId")?,
        context_id: params::opt_str(&o, "contextId", "contextId")
            .map_err(bad)?
            .unwrap_or_default(),
        state,
        message,
    })
}

fn artifact_update(v: Version, raw: Raw<'_>, limits: &AgentLimits) -> Result<Event, Refusal> {
    let o = Obj::parse(raw, "artifactUpdate").map_err(bad)?;
    let Some(a) = field(&o, "artifact") else {
        return Err(garbage("an artifact update without artifact"));
    };
    let flag = |k: &str| params::opt_bool(&o, k, k).map_err(bad);
    Ok(Event::Artifact {
        task_id: str_field(&o, "taskId")?,
        artifact: artifact(v, a, limits)?,
        append: flag("append")?.unwrap_or(false),
        last_chunk: flag("lastChunk")?.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Part;

    fn limits() -> AgentLimits {
        AgentLimits {
            supported_types: vec!["*/*".into()],
            ..AgentLimits::default()
        }
    }

    #[test]
    fn a_card_names_the_newest_interface_a2ad_speaks() {
        let card = json!({
            "name": "Up", "description": "d", "skills": [{"id": "s"}],
            "capabilities": {"streaming": true},
            "supportedInterfaces": [
                {"url": "h:1", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
                {"url": "http://u/rest", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
                {"url": "http://u/v03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
            ],
        })
        .to_string();
        let c = read_card(card.as_bytes(), "https://u/card", "auto", "auto").expect("card");
        // gRPC first, its bare host:port with the card's scheme.
        assert_eq!(c.endpoint.url, "https://h:1");
        assert_eq!(c.endpoint.binding, Binding::Grpc);
        let c = read_card(card.as_bytes(), "https://u/card", "http_json", "auto").expect("card");
        assert_eq!(c.endpoint.url, "http://u/rest");
        assert_eq!(c.endpoint.binding, Binding::HttpJson);
        assert_eq!(c.endpoint.version, Version::V10);
        assert!(c.streaming);
        let c = read_card(card.as_bytes(), "u", "auto", "0.3").expect("0.3");
        assert_eq!(c.endpoint.url, "http://u/v03");
        assert!(read_card(card.as_bytes(), "u", "jsonrpc", "1.0").is_err());
        // A 0.3 card: url + preferredTransport.
        let old = json!({"name": "Old", "url": "http://o/rpc", "protocolVersion": "0.3.0"});
        let c = read_card(old.to_string().as_bytes(), "u", "auto", "auto").expect("0.3 card");
        assert_eq!(
            (c.endpoint.url.as_str(), c.endpoint.version),
            ("http://o/rpc", Version::V03)
        );
        assert!(!c.streaming);
        assert!(read_card(b"[1]", "u", "auto", "auto").is_err());
        assert!(read_card(b"{}", "u", "auto", "auto").is_err());
    }

    #[test]
    fn results_and_events_read_in_both_versions() {
        let v10 = Endpoint {
            url: "u".into(),
            binding: Binding::JsonRpc,
            version: Version::V10,
            tenant: None,
            parsed: None,
        };
        let body = json!({"jsonrpc": "2.0", "id": 1, "result": {"task": {
            "id": "t", "contextId": "c",
            "status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {
                "messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "more?"}, {"data": {"k": 1}}]}},
            "artifacts": [{"artifactId": "a", "parts": [{"url": "https://x/y", "mediaType": "image/png"}]}],
        }}});
        let Event::Task(t) =
            read_answer(&v10, false, body.to_string().as_bytes(), &limits()).expect("task")
        else {
            panic!("a task");
        };
        assert_eq!((t.id.as_str(), t.state), ("t", TaskState::InputRequired));
        let m = t.message.expect("message");
        assert_eq!(m.role, Role::Agent);
        assert!(matches!(&m.parts[1], Part::Data(d) if d.data.get() == r#"{"k":1}"#));
        assert!(matches!(&t.artifacts[0].parts[0], Part::Url(u) if u.url == "https://x/y"));
        let v03 = Endpoint {
            version: Version::V03,
            ..v10.clone()
        };
        let data = json!({"jsonrpc": "2.0", "id": 1, "result": {"kind": "artifact-update",
            "taskId": "t", "contextId": "c", "append": true, "lastChunk": false,
            "artifact": {"artifactId": "a", "parts": [{"kind": "text", "text": "x"}]}}})
        .to_string();
        let Event::Artifact {
            append,
            last_chunk,
            artifact,
            ..
        } = read_event(&v03, &data, &limits()).expect("artifact")
        else {
            panic!("an artifact");
        };
        assert_eq!(
            (append, last_chunk, artifact.artifact_id.as_str()),
            (true, false, "a")
        );
        let err = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": "Task not found"}});
        assert_eq!(
            read_answer(&v03, true, err.to_string().as_bytes(), &limits()).err(),
            Some(Refusal::Error(-32001, "Task not found".into()))
        );
        assert!(matches!(
            read_answer(&v03, false, b"<html>", &limits()),
            Err(Refusal::Garbage(_))
        ));
    }

    #[test]
    fn calls_follow_the_operation_table() {
        let rest = Endpoint {
            url: "http://u/rest/".into(),
            binding: Binding::HttpJson,
            version: Version::V10,
            tenant: None,
            parsed: None,
        };
        let c = Request::Cancel("a b").call(&rest, 1).expect("call");
        assert_eq!(
            (c.http_method, c.url.as_str()),
            (hyper::Method::POST, "http://u/rest/tasks/a%20b:cancel")
        );
        let g = Request::Get("t").call(&rest, 1).expect("call");
        assert_eq!((g.http_method, g.body), (hyper::Method::GET, None));
        let m = Message::user_text(["hi"]);
        let rpc = Endpoint {
            binding: Binding::JsonRpc,
            version: Version::V03,
            ..rest
        };
        let s = Request::Send {
            message: &m,
            context: "c",
            task: Some("t"),
            stream: true,
            wait: false,
        }
        .call(&rpc, 7)
        .expect("call");
        let body: Value = serde_json::from_slice(&s.body.expect("body")).expect("json");
        assert_eq!(body["method"], "message/stream");
        assert_eq!(body["params"]["message"]["taskId"], "t");
        assert_eq!(body["params"]["message"]["contextId"], "c");
        assert!(s.stream);
    }
}
