//! Entry points for the fuzz targets in `fuzz/` and the property tests: each takes
//! arbitrary bytes, drives one parser of the server the way a request would, and checks
//! the invariants that must hold whatever the input (it panics when one does not, which is
//! what a fuzzer reports). Not part of the public API: it moves with the code it drives.

use std::sync::Arc;

use serde_json::value::RawValue;

use crate::config::{AgentLimits, Config};
use crate::model::{ContextId, Message, TaskEvent, TaskId, TaskSnapshot, TaskState, TaskStatus};
use crate::rpc::a2a::{self, Version};
use crate::rpc::{self, seed::params as seed};
use crate::runtime::StreamItem;

/// The JSON-RPC decoder, then the seed params parsers on whatever decodes: a rejection is
/// always -32700 or -32600, never a panic.
pub fn decode(data: &[u8]) {
    match rpc::decode_with(data, 16) {
        Err(e) => assert!(
            e.code == rpc::error::PARSE_ERROR || e.code == rpc::error::INVALID_REQUEST,
            "unexpected code {}",
            e.code
        ),
        Ok(rpc::Body::Single(call)) => call_params(call),
        Ok(rpc::Body::Batch(calls)) => {
            assert!(!calls.is_empty() && calls.len() <= 16, "batch bounds");
            calls.into_iter().for_each(call_params);
        }
    }
}

fn call_params(call: Result<rpc::Call, rpc::Rejected>) {
    match call {
        Err(r) => assert_eq!(r.error.code, rpc::error::INVALID_REQUEST),
        Ok(call) => {
            if let Ok(p) = seed::params(call.params()) {
                let _ = seed::send_params(&p, &limits());
                let _ = seed::push_config(&p, false);
                let _ = seed::task_id_param(&p, true);
            }
        }
    }
}

/// The seed params parsers on an arbitrary JSON document: message, parts (Base64, MIME
/// sniffing, UUIDs), push configurations. Every refusal names a field and is -32602 on the
/// seed path.
pub fn params(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(raw) = serde_json::from_str::<&RawValue>(text) else {
        return;
    };
    let Ok(p) = seed::params(Some(raw.into())) else {
        return;
    };
    for result in [
        seed::send_params(&p, &limits()).map(|_| ()),
        seed::push_config(&p, true).map(|_| ()),
        seed::task_id_param(&p, false).map(|_| ()),
    ] {
        if let Err(e) = result {
            // (An unsupported MIME type is its own error in the model; the seed answers it
            // with -32602 like every other refusal.)
            assert_eq!(
                rpc::seed::errors::rpc_error(&e).code,
                rpc::error::INVALID_PARAMS
            );
            names_a_field(Err(e));
        }
    }
}

/// The official decoders: JSON-RPC framing as the official paths read it (a request
/// without an id is answered, with id null), then the 0.3 and 1.0 params parsers (messages,
/// parts, Base64 in every ProtoJSON form, push configurations, task states), the
/// `A2A-Version` parser and the ListTasks page-token decoder. A rejection is -32700 or
/// -32600; a refused param is -32602 or -32005 naming a field; nothing panics.
pub fn official(data: &[u8]) {
    match rpc::decode_as(data, 16, true) {
        Err(e) => assert!(
            e.code == rpc::error::PARSE_ERROR || e.code == rpc::error::INVALID_REQUEST,
            "unexpected code {}",
            e.code
        ),
        Ok(rpc::Body::Single(call)) => official_call(call),
        Ok(rpc::Body::Batch(calls)) => {
            assert!(!calls.is_empty() && calls.len() <= 16, "batch bounds");
            calls.into_iter().for_each(official_call);
        }
    }
    let text = String::from_utf8_lossy(data);
    if let Some(v) = Version::of_header(Some(&text)) {
        let t = text.trim();
        assert!(
            t.is_empty() || t.bytes().all(|b| b.is_ascii_digit() || b == b'.'),
            "{t:?} read as {v:?}"
        );
    }
    if let Ok(token) = a2a::token::decode(&text) {
        let again = a2a::token::decode(&a2a::token::encode(&token));
        assert_eq!(again.ok(), Some(token), "a page token round-trips");
    }
}

fn official_call(call: Result<rpc::Call, rpc::Rejected>) {
    let call = match call {
        Err(r) => {
            assert_eq!(r.error.code, rpc::error::INVALID_REQUEST);
            return;
        }
        Ok(call) => call,
    };
    let Ok(p) = rpc::json::params(call.params()) else {
        return;
    };
    let refused = names_a_field;
    for v in Version::ALL {
        refused(a2a::params::send_params(v, &p, &limits()).map(|_| ()));
    }
    refused(a2a::params::push_config_10(&p, "params").map(|_| ()));
    refused(a2a::params::push_config_03(&p, "params").map(|_| ()));
    refused(a2a::params::history_length(&p, "historyLength").map(|_| ()));
    refused(a2a::params::metadata(&p).map(|_| ()));
    if let Some(raw) = a2a::params::field(&p, "status") {
        refused(a2a::params::state_10(raw, "status").map(|_| ()));
    }
}

/// The gRPC binding's request path up to the operation: the body's framing (one
/// uncompressed length-prefixed message, nothing after it, within the cap), the method's
/// protobuf message, its tenant taken out, and the operation's request decoded straight from
/// it (`pbin`) — which must be what the JSON-RPC params decoders make of the message's
/// ProtoJSON, value for value and error for error (the gRPC binding's promise to answer as
/// the others do). The first byte picks the method. A body that unframes is exactly its
/// 5-byte prefix and the message; a refused param names a field.
pub fn grpc(data: &[u8]) {
    const MAX: u64 = 1 << 20;
    let Some((&method, body)) = data.split_first() else {
        return;
    };
    let (op, _tenant, raw) = match a2a::bindings::grpc::fuzz_decode(method, body, MAX) {
        Ok(decoded) => decoded,
        Err(_) => return,
    };
    let declared = body
        .get(1..5)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_be_bytes);
    assert_eq!(
        declared.map(|n| n as usize + 5),
        Some(body.len()),
        "an unframed body is its prefix and one message"
    );
    let Ok(p) = rpc::json::params(Some((&raw).into())) else {
        panic!("ProtoJSON of a message is an object: {raw}");
    };
    let (direct, through_json) = grpc_decoders(method, body, MAX);
    assert_eq!(direct, through_json, "the two decoders of {op:?} disagree");
    let refused = names_a_field;
    use crate::rpc::a2a::ops::Op;
    match op {
        Op::SendMessage | Op::SendStreamingMessage => {
            refused(a2a::params::send_params(Version::V10, &p, &limits()).map(|_| ()));
        }
        Op::CreatePushConfig => refused(a2a::params::push_config_10(&p, "params").map(|_| ())),
        _ => {
            refused(a2a::params::history_length(&p, "historyLength").map(|_| ()));
            refused(a2a::params::metadata(&p).map(|_| ()));
        }
    }
}

/// A gRPC request body decoded both ways — straight from protobuf, as the binding does, and
/// through the message's ProtoJSON and the JSON-RPC params decoders — each as the text of
/// its outcome (the request and, for a ListTaskPushNotificationConfigs call, the page it
/// asks for; or the error). The property tests and the fuzz target `grpc` compare them.
pub(crate) fn grpc_decoders(method: u8, body: &[u8], max: u64) -> (String, String) {
    use a2a::bindings::grpc::{Decoded, page_ask, unframe};
    use a2a::ops::{Op, TABLE};
    let op = TABLE[usize::from(method) % TABLE.len()].op;
    let Ok(message) = unframe(body, max) else {
        return (String::new(), String::new());
    };
    let Ok(mut decoded) = Decoded::decode(op, message) else {
        return (String::new(), String::new());
    };
    decoded.take_tenant();
    let cx = rpc::CallContext::detached(limits());
    // The JSON way: ProtoJSON (refused where a value is undefined), the agent's
    // capabilities, then the params decoders; a ListTaskPushNotificationConfigs page read
    // from the params.
    let json_way = match decoded.protojson(op) {
        Err(e) => format!("{e:?}"),
        Ok(raw) => match rpc::json::params(Some((&raw).into())) {
            Err(e) => format!("{e:?}"),
            Ok(p) => match a2a::bindings::jsonrpc::decode(op, Version::V10, &cx, &p) {
                Err(e) => format!("{e:?}"),
                Ok(request) => {
                    let page = (op == Op::ListPushConfigs).then(|| {
                        a2a::bindings::jsonrpc::page_bounds(
                            a2a::bindings::jsonrpc::PageAsk::Params(&p),
                            5,
                        )
                    });
                    format!("{request:?} {page:?}")
                }
            },
        },
    };
    let direct_way = match decoded.check() {
        Err(e) => format!("{e:?}"),
        Ok(()) => match decoded.request(op, &cx) {
            Err(e) => format!("{e:?}"),
            Ok((request, page)) => {
                let page = (op == Op::ListPushConfigs)
                    .then(|| a2a::bindings::jsonrpc::page_bounds(page_ask(page.as_ref()), 5));
                format!("{request:?} {page:?}")
            }
        },
    };
    (direct_way, json_way)
}

/// A refused param is an invalid param (or an unsupported type) that names its field.
fn names_a_field(r: Result<(), crate::Error>) {
    if let Err(e) = r {
        assert!(
            matches!(
                e,
                crate::Error::InvalidParams { ref field, .. }
                    | crate::Error::UnsupportedContentType { ref field, .. }
                    if !field.is_empty()
            ),
            "{e}"
        );
    }
}

/// File-part validation on raw pieces: `data` is split into a MIME type and Base64 text.
pub fn file_part(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (mime, bytes) = text.split_once('\n').unwrap_or(("text/plain", &text));
    let _ = crate::validate::file_part("f", "n".into(), mime.into(), bytes.into(), &limits());
    let _ = crate::validate::is_uuid_v4(&text);
}

/// The TOML configuration loader: never a panic, and an error always says what is wrong.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = Config::from_toml(text) {
        assert!(!e.message.is_empty());
        let _ = e.to_string();
    }
}

/// The SSE writer: whatever an agent says, a frame is `id: n`, one `data:` line of valid
/// JSON echoing the request id, and a blank line.
pub fn sse(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    let seq = data.len() as u64 + 1;
    let mut status = TaskStatus::new(TaskState::Working);
    status.message = Some(Arc::new(Message::agent_text([text.clone()])));
    status.reason = Some(text.as_str().into());
    let event = TaskEvent::status(seq, status.clone());
    let id = RawValue::from_string(serde_json::to_string(&text).unwrap_or_default())
        .unwrap_or_else(|_| rpc::null_id());
    let task = TaskSnapshot {
        id: TaskId::new(text.as_str()),
        context_id: ContextId::new(text.as_str()),
        status,
        seq,
        created_at: chrono::Utc::now(),
        updated_at: chrono::Utc::now(),
        history: Vec::new(),
        artifacts: Vec::new(),
        metadata: None,
        extensions: Default::default(),
        note: None,
    };
    let item = StreamItem {
        event: Arc::new(event),
        task: Arc::new(task),
    };
    let frame = sse_frame(&id, &item);
    let frame = std::str::from_utf8(&frame).expect("a frame is UTF-8");
    let body = frame
        .strip_suffix("\n\n")
        .expect("a frame ends with a blank line");
    let mut lines = body.split('\n');
    assert_eq!(lines.next(), Some(format!("id: {seq}").as_str()));
    let data_line = lines.next().expect("a data line");
    assert!(lines.next().is_none(), "one data line per frame");
    let json = data_line.strip_prefix("data: ").expect("data: prefix");
    let v: serde_json::Value = serde_json::from_str(json).expect("data is JSON");
    assert_eq!(
        v["id"].as_str(),
        Some(text.as_str()),
        "the request id is echoed"
    );
    for first in [true, false] {
        for json in [
            a2a::render::sse_data_10(&id, &item, first),
            a2a::render::sse_data_03(&id, &item, first),
        ] {
            let v: serde_json::Value =
                serde_json::from_slice(&json).expect("an official frame is JSON");
            assert_eq!(
                v["id"].as_str(),
                Some(text.as_str()),
                "the request id is echoed"
            );
            assert!(
                v["result"].is_object(),
                "an official frame carries a result"
            );
            assert!(!json.contains(&b'\n'), "one line");
        }
    }
}

/// The webhook URL and address checks: never a panic; an accepted URL is http(s) with a
/// host, and its redacted form holds neither its password nor its query values.
pub fn webhook_url(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for allow_private in [false, true] {
        if crate::push::check_url(&text, allow_private).is_ok() {
            let url = url::Url::parse(&text).expect("accepted URLs parse");
            assert!(matches!(url.scheme(), "http" | "https"));
            assert!(url.host().is_some());
            let redacted =
                url::Url::parse(&crate::push::redact_url(&text)).expect("a redacted URL parses");
            assert!(matches!(redacted.password(), None | Some("***")));
            assert!(
                redacted
                    .query_pairs()
                    .all(|(_, v)| v.is_empty() || v == "***")
            );
        }
    }
    if data.len() == 16 {
        let ip = std::net::IpAddr::from(<[u8; 16]>::try_from(data).expect("16 bytes"));
        let _ = crate::push::address_allowed(ip, false);
    }
    if data.len() == 4 {
        let ip = std::net::IpAddr::from(<[u8; 4]>::try_from(data).expect("4 bytes"));
        let _ = crate::push::address_allowed(ip, false);
    }
}

/// The store's record and key decoders on arbitrary bytes, as a damaged file or row would
/// present them: the first byte picks the decoder. A record that does not decode is
/// `None`, never a panic; one that does survives a round trip unchanged (decode, encode,
/// decode gives the same), so what the store writes back is what it read.
pub fn store_record(data: &[u8]) {
    use crate::store::codec;
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let key = crate::model::TaskKey {
        principal: crate::model::Principal::new("p"),
        agent: crate::model::AgentId::new("a"),
        task: TaskId::new("t"),
    };
    match which % 8 {
        0 => {
            if let Some((task, turn, carries)) = codec::decode_record(&key, bytes) {
                let once = codec::encode_record(&task, turn, carries);
                let (again, turn_again, carries_again) =
                    codec::decode_record(&key, &once).expect("re-decodes");
                assert_eq!((turn, carries), (turn_again, carries_again));
                assert_eq!(
                    once,
                    codec::encode_record(&again, turn_again, carries_again),
                    "a task round trip"
                );
            }
        }
        1 => {
            let history = [Arc::new(Message::agent_text(["h"]))];
            let decoded = codec::decode_event(7, bytes, &history);
            assert_eq!(
                codec::event_is_valid(bytes),
                decoded.is_some(),
                "the check at open and the decoder agree"
            );
            if let Some(event) = decoded {
                let once = codec::encode_event(&event);
                let again = codec::decode_event(7, &once, &history).expect("re-decodes");
                assert_eq!(once, codec::encode_event(&again), "an event round trip");
            }
        }
        2 => {
            // No key: sealing draws a fresh nonce each time, so only clear text round-trips
            // byte for byte (the sealer's own tests cover sealed values).
            let clear = crate::store::seal::Sealer::default();
            if let Some(config) = codec::decode_push(bytes, &clear) {
                let once = codec::encode_push(&config, &clear);
                let again = codec::decode_push(&once, &clear).expect("re-decodes");
                assert_eq!(
                    once,
                    codec::encode_push(&again, &clear),
                    "a push round trip"
                );
            }
        }
        3 => {
            if let Some((attempt, due)) = codec::decode_outbox(bytes) {
                let once = codec::encode_outbox(attempt, due);
                assert_eq!(codec::decode_outbox(&once), Some((attempt, due)));
            }
        }
        4 => {
            if let Some((user, reply)) = codec::decode_turn(bytes) {
                let once = codec::encode_turn(&user, reply.as_deref());
                let (u, r) = codec::decode_turn(&once).expect("re-decodes");
                assert_eq!(
                    once,
                    codec::encode_turn(&u, r.as_deref()),
                    "a turn round trip"
                );
            }
        }
        5 => {
            if let Some((created, key)) = codec::parse_task_key(bytes) {
                assert_eq!(
                    codec::task_key(&key, created),
                    bytes,
                    "a task key round trip"
                );
            }
        }
        6 => {
            if let Some(key) = codec::parse_outbox_key(bytes) {
                assert_eq!(codec::outbox_key(&key), bytes, "an outbox key round trip");
            }
        }
        _ => {
            if let Some((principal, context, turn)) = codec::parse_turn_key(bytes) {
                assert_eq!(
                    codec::turn_key(&principal, &context, turn),
                    bytes,
                    "a turn key round trip"
                );
            }
            // Whatever the bytes, the check at open answers.
            let (k, v) = bytes.split_at(bytes.len() / 2);
            let _ = codec::event_row_is_valid(k, v);
        }
    }
}

/// One seed SSE frame for a stream item (benches and fuzzing).
pub fn sse_frame(id: &RawValue, item: &StreamItem) -> bytes::Bytes {
    let json = rpc::seed::render::sse_data(id, item, false);
    rpc::sse_frame(item.seq, &json)
}

/// Decodes a `message/send` body and parses its params the seed's way (benches).
///
/// # Panics
/// When `body` is not a valid `message/send` request.
pub fn decode_send(body: &[u8]) -> crate::runtime::SendRequest {
    let Ok(rpc::Body::Single(Ok(call))) = rpc::decode(body) else {
        panic!("not a single request");
    };
    let params = seed::params(call.params()).expect("params");
    seed::send_params(&params, &AgentLimits::default())
        .expect("valid")
        .request
}

/// A seed webhook body for a completed task (benches).
pub fn seed_payload(task: &TaskSnapshot) -> Vec<u8> {
    use crate::webhook::PayloadRenderer as _;
    rpc::seed::webhook::SeedPayload
        .render(&crate::webhook::PayloadInput {
            agent_id: &crate::model::AgentId::new("bench"),
            event: &task.current_event(),
            task,
            estimated_ms: 12,
            attempt: 1,
            max_attempts: 4,
        })
        .body
}

fn limits() -> AgentLimits {
    AgentLimits {
        max_file_size: 4096,
        max_parts: 16,
        ..AgentLimits::default()
    }
}

/// The log store's frame reader on arbitrary bytes, as a restart reads a segment: no
/// panic, frames within the bytes, every payload that decodes encodes back to itself.
pub fn log_frame(data: &[u8]) {
    crate::store::check_log_bytes(data);
}
