//! Seed params in: loosely typed JSON into the neutral model, with field-level errors.

use std::borrow::Cow;

use super::super::json::{self, Kind, Obj, Raw};
use crate::config::AgentLimits;
use crate::error::Error;
use crate::model::{ContextId, Extensions, Message, Part, TaskId};
use crate::push::{Events, PushConfig, RetryPolicy, WebhookEvent};
use crate::runtime::SendRequest;
use crate::validate;

/// Longest accepted client-chosen task or context id.
pub(crate) const MAX_ID_LEN: usize = 256;

/// Headers of one push configuration at most.
pub(crate) const MAX_WEBHOOK_HEADERS: usize = 32;
/// Bytes of one configured header value at most.
pub(crate) const MAX_WEBHOOK_HEADER_VALUE: usize = 4096;
/// Bytes of all configured headers of one configuration (names and values) at most.
pub(crate) const MAX_WEBHOOK_HEADER_BYTES: usize = 16 * 1024;
/// Entries of a configuration's `events` array at most.
pub(crate) const MAX_EVENT_NAMES: usize = 16;

/// Params as an object: absent (or `null`) means `{}`; the caller decides whether that is
/// allowed. Members are read lazily (see [`Obj`]).
///
/// # Errors
/// -32602 when params is present and not an object.
pub(crate) fn params(raw: Option<Raw<'_>>) -> Result<Obj<'_>, Error> {
    json::params(raw)
}

/// Parsed `message/send` / `message/stream` params.
pub(crate) struct SendParams {
    /// What to submit.
    pub(crate) request: SendRequest,
    /// `configuration.blocking` (default true).
    pub(crate) blocking: bool,
    /// `configuration.historyLength`.
    pub(crate) history_length: Option<usize>,
    /// Evo AI's inline `pushNotificationConfig`: a configuration for the new task. Its
    /// target address is checked by the caller, who knows the server's policy.
    pub(crate) push: Option<PushConfig>,
}

/// Parses `message/send` and `message/stream` params.
///
/// # Errors
/// -32602 naming the field.
pub(crate) fn send_params(p: &Obj<'_>, limits: &AgentLimits) -> Result<SendParams, Error> {
    let message = match p.get("message") {
        None => return Err(Error::invalid("message", "is required")),
        Some(v) => parse_message(v, limits)?,
    };
    let context = opt_id(p, "contextId")?;
    let session = opt_id(p, "sessionId")?;
    let context_id = match (context, session) {
        (Some(c), Some(s)) if c != s => {
            return Err(Error::invalid(
                "contextId",
                "contextId and sessionId differ; send one of them",
            ));
        }
        (Some(c), _) | (None, Some(c)) => Some(ContextId::new(c)),
        (None, None) => None,
    };
    let task_id = task_id_param(p, false)?;
    let (blocking, history_length) = match p.obj("configuration", "configuration")? {
        None => (true, None),
        Some(c) => (
            c.bool("blocking", "configuration.blocking")?
                .unwrap_or(true),
            opt_len(&c, "historyLength", "configuration.historyLength")?,
        ),
    };
    let push = inline_push_config(p)?;
    let metadata = match p.get("metadata") {
        None => None,
        Some(m) if json::kind(m) == Kind::Object => {
            json::check_depth(m, "metadata")?;
            Some(m.to_owned())
        }
        Some(_) => return Err(Error::invalid("metadata", "must be an object")),
    };
    Ok(SendParams {
        request: SendRequest {
            message,
            context_id,
            task_id: task_id.map(TaskId::new),
            metadata,
            extensions: Extensions::default(),
        },
        blocking,
        history_length,
        push,
    })
}

/// The task id of a method: `taskId` or its alias `id` (both present and different is an
/// error). Required unless `optional`.
///
/// # Errors
/// -32602 naming `taskId`.
pub(crate) fn task_id_param(p: &Obj<'_>, required: bool) -> Result<Option<String>, Error> {
    let task_id = opt_id(p, "taskId")?;
    let id = opt_id(p, "id")?;
    match (task_id, id) {
        (Some(a), Some(b)) if a != b => Err(Error::invalid(
            "taskId",
            "taskId and id differ; send one of them",
        )),
        (Some(a), _) | (None, Some(a)) => Ok(Some(a)),
        (None, None) if required => Err(Error::invalid("taskId", "is required")),
        (None, None) => Ok(None),
    }
}

/// An optional non-negative integer such as `historyLength`.
///
/// # Errors
/// -32602 naming `field`.
pub(crate) fn opt_len(p: &Obj<'_>, key: &str, field: &str) -> Result<Option<usize>, Error> {
    Ok(p.u64(key, field)?
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX)))
}

fn opt_id(p: &Obj<'_>, key: &str) -> Result<Option<String>, Error> {
    match p.str(key, key)? {
        None => Ok(None),
        Some(s) if s.is_empty() => Err(Error::invalid(key, "must not be empty")),
        Some(s) if s.chars().count() > MAX_ID_LEN => Err(Error::invalid(
            key,
            format!("must be at most {MAX_ID_LEN} characters"),
        )),
        Some(s) => Ok(Some(s.into_owned())),
    }
}

fn parse_message(raw: Raw<'_>, limits: &AgentLimits) -> Result<Message, Error> {
    let m = Obj::parse(raw, "message")?;
    match m.get("role").map(|r| r.get()) {
        Some(r#""user""#) => {}
        None => return Err(Error::invalid("message.role", "is required")),
        Some(_) => return Err(Error::invalid("message.role", "must be \"user\"")),
    }
    let message_id = match m.get("messageId") {
        None => return Err(Error::invalid("message.messageId", "is required")),
        Some(v) => match json::string(v, "message.messageId") {
            Ok(s) if validate::is_uuid_v4(&s) => s.into_owned(),
            // A string that is not even valid text: say so.
            Err(e) if json::kind(v) == Kind::String => return Err(e),
            _ => {
                return Err(Error::invalid(
                    "message.messageId",
                    "must be a UUID v4 (e.g. 6f1c2a1e-3b4d-4c5e-8f70-1a2b3c4d5e6f)",
                ));
            }
        },
    };
    let parts = json::message_parts(m.get("parts"), limits.max_parts)?;
    let parts = parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| parse_part(i, p, limits))
        .collect::<Result<Vec<_>, _>>()?;
    let extensions = json::message_extensions(m.get("extensions"))?;
    validate::user_message(message_id, parts, extensions, limits)
}

fn parse_part(i: usize, raw: Raw<'_>, limits: &AgentLimits) -> Result<Part, Error> {
    part(raw, limits).map_err(|e| json::at_part(i, e))
}

fn part(raw: Raw<'_>, limits: &AgentLimits) -> Result<Part, Error> {
    let at = json::part_field;
    let p = Obj::parse(raw, &at(""))?;
    let kind = match (p.str("type", &at(".type"))?, p.str("kind", &at(".kind"))?) {
        (Some(t), Some(k)) if t != k => {
            return Err(Error::invalid(at(".type"), "type and kind differ"));
        }
        (Some(t), _) | (None, Some(t)) => t,
        (None, None) => {
            return Err(Error::invalid(
                at(".type"),
                "is required (\"text\", \"file\" or \"data\")",
            ));
        }
    };
    let metadata = p
        .get("metadata")
        .map(|m| validate::part_metadata(&at(""), &m.to_owned()))
        .transpose()?;
    match &*kind {
        "text" => match p.get("text") {
            Some(v) => Ok(Part::Text(json::string(v, &at(".text"))?.into_owned())),
            None => Err(Error::invalid(at(".text"), "is required")),
        },
        "file" => {
            let f = match p.get("file") {
                Some(v) if json::kind(v) == Kind::Object => Obj::parse(v, &at(".file"))?,
                _ => {
                    return Err(Error::invalid(
                        at(".file"),
                        "must be an object with name, mimeType and bytes (or uri)",
                    ));
                }
            };
            let opt = |k: &str| f.str(k, &format!("{}.file.{k}", json::PART));
            let take = |k: &str| match opt(k)? {
                Some(s) => Ok(s.into_owned()),
                None => Err(Error::invalid(
                    format!("{}.file.{k}", json::PART),
                    "is required",
                )),
            };
            // `url` is taken for `uri`, as on 0.3.
            let uri_key = if f.get("uri").is_none() && f.get("url").is_some() {
                "url"
            } else {
                "uri"
            };
            match (f.get("bytes"), f.get(uri_key)) {
                (Some(_), Some(_)) => Err(Error::invalid(
                    at(".file"),
                    "holds both bytes and uri; send one of them",
                )),
                (None, Some(_)) => validate::file_url(
                    &at(".file"),
                    (uri_key, "mimeType"),
                    take(uri_key)?,
                    opt("name")?.map(Cow::into_owned),
                    opt("mimeType")?.map(Cow::into_owned),
                    metadata,
                    limits,
                ),
                _ => {
                    let name = take("name")?;
                    let mime = take("mimeType")?;
                    let bytes = take("bytes")?;
                    validate::file_part(&at(".file"), name, mime, bytes, limits)
                        .map(|f| validate::with_metadata(Part::File(Box::new(f)), metadata))
                }
            }
        }
        "data" => match p.get("data") {
            Some(v) => json::data_part(
                &at(""),
                v,
                p.str("mediaType", &at(".mediaType"))?.map(Cow::into_owned),
                p.get("metadata"),
            ),
            None => Err(Error::invalid(at(".data"), "is required")),
        },
        other => Err(Error::invalid(
            at(".type"),
            format!("unknown part type {other:?}; expected \"text\", \"file\" or \"data\""),
        )),
    }
}

/// Parses `tasks/pushNotificationConfig/set`'s configuration: `config`, or Evo AI's
/// `pushNotificationConfig` (not both).
///
/// # Errors
/// -32602 naming the field.
pub(crate) fn push_config(p: &Obj<'_>, allow_private: bool) -> Result<PushConfig, Error> {
    let config = p.obj("config", "config")?;
    let evo = p.obj("pushNotificationConfig", "pushNotificationConfig")?;
    let (prefix, c) = match (config, evo) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid(
                "config",
                "send config or pushNotificationConfig, not both",
            ));
        }
        (Some(c), None) => ("config", c),
        (None, Some(c)) => ("pushNotificationConfig", c),
        (None, None) => return Err(Error::invalid("config", "is required")),
    };
    let config = config_object(prefix, &c)?;
    crate::push::check_url(&config.url, allow_private)
        .map_err(|e| rename_field(e, "config.url", &format!("{prefix}.url")))?;
    Ok(config)
}

/// Evo AI's `params.pushNotificationConfig` inside `message/send` / `message/stream`.
/// The target address is checked against the server's policy by the caller.
///
/// # Errors
/// -32602 naming the field.
pub(crate) fn inline_push_config(p: &Obj<'_>) -> Result<Option<PushConfig>, Error> {
    p.obj("pushNotificationConfig", "pushNotificationConfig")?
        .map(|c| {
            let config = config_object("pushNotificationConfig", &c)?;
            crate::push::check_shape(&config.url)
                .map_err(|e| rename_field(e, "config.url", "pushNotificationConfig.url"))?;
            Ok(config)
        })
        .transpose()
}

fn rename_field(e: Error, from: &str, to: &str) -> Error {
    match e {
        Error::InvalidParams { field, reason } if field == from => Error::invalid(to, reason),
        other => other,
    }
}

/// One configuration object; `prefix` names it in errors.
fn config_object(prefix: &str, c: &Obj<'_>) -> Result<PushConfig, Error> {
    let at = |k: &str| format!("{prefix}.{k}");
    let url = match (
        c.str("url", &at("url"))?,
        c.str("webhookUrl", &at("webhookUrl"))?,
    ) {
        (Some(a), Some(b)) if a != b => {
            return Err(Error::invalid(
                at("url"),
                "url and webhookUrl differ; send one of them",
            ));
        }
        (Some(u), _) | (None, Some(u)) => u.into_owned(),
        (None, None) => return Err(Error::invalid(at("url"), "is required")),
    };
    let mut headers = match c.get("headers") {
        None => Vec::new(),
        Some(h) if json::kind(h) == Kind::Object => {
            headers(prefix, &Obj::parse(h, &at("headers"))?)?
        }
        Some(_) => {
            return Err(Error::invalid(
                at("headers"),
                "must be an object of strings",
            ));
        }
    };
    if let Some(auth) = c.obj(
        "webhookAuthenticationInfo",
        &at("webhookAuthenticationInfo"),
    )? {
        let field = at("webhookAuthenticationInfo.type");
        match auth.str("type", &field)?.as_deref() {
            Some("none") => {}
            Some("bearer") => {
                let token_field = at("webhookAuthenticationInfo.token");
                let token = match auth.str("token", &token_field)? {
                    Some(t) if !t.is_empty() => format!("Bearer {t}"),
                    _ => {
                        return Err(Error::invalid(
                            token_field,
                            "is required with type \"bearer\"",
                        ));
                    }
                };
                if hyper::header::HeaderValue::from_str(&token).is_err()
                    || token.len() > MAX_WEBHOOK_HEADER_VALUE
                {
                    return Err(Error::invalid(token_field, "is not a valid header value"));
                }
                if headers
                    .iter()
                    .any(|(k, _)| k.eq_ignore_ascii_case("authorization"))
                {
                    return Err(Error::invalid(
                        at("webhookAuthenticationInfo"),
                        "a bearer token and headers.Authorization cannot both be set",
                    ));
                }
                headers.push(("Authorization".to_string(), token));
            }
            Some(other) => {
                return Err(Error::invalid(
                    field,
                    format!("unknown type {other:?}; use \"none\" or \"bearer\" (with token)"),
                ));
            }
            None => {
                return Err(Error::invalid(
                    field,
                    "is required (\"none\" or \"bearer\")",
                ));
            }
        }
    }
    let events = match c.get("events") {
        None => WebhookEvent::ALL.to_vec(),
        Some(v) if json::kind(v) == Kind::Array => {
            let names = json::array(v, &at("events"), MAX_EVENT_NAMES)?;
            let mut events = Vec::new();
            for (i, n) in names.iter().enumerate() {
                let field = format!("{prefix}.events[{i}]");
                let name = json::string(n, &field)?;
                let e = WebhookEvent::parse(&name).ok_or_else(|| {
                    Error::invalid(
                        &field,
                        format!(
                            "unknown event {name:?}; known: {}",
                            WebhookEvent::ALL.map(WebhookEvent::as_str).join(", ")
                        ),
                    )
                })?;
                if !events.contains(&e) {
                    events.push(e);
                }
            }
            if events.is_empty() {
                return Err(Error::invalid(at("events"), "must name at least one event"));
            }
            events
        }
        Some(_) => {
            return Err(Error::invalid(
                at("events"),
                "must be an array of event names",
            ));
        }
    };
    let retry = match c.obj("retryPolicy", &at("retryPolicy"))? {
        None => RetryPolicy::default(),
        Some(r) => retry_policy(prefix, &r)?,
    };
    let secret = match c.str("secret", &at("secret"))? {
        None => None,
        Some(s) if s.chars().count() >= 16 => Some(s.into_owned()),
        Some(_) => {
            return Err(Error::invalid(
                at("secret"),
                "must be at least 16 characters",
            ));
        }
    };
    Ok(PushConfig {
        url,
        headers,
        events: Events::StateChanges(events),
        retry,
        secret,
        token: None,
        authorization: None,
    })
}

/// Configured delivery headers: valid names and values, bounded in count and size.
fn headers(prefix: &str, h: &Obj<'_>) -> Result<Vec<(String, String)>, Error> {
    if h.len() > MAX_WEBHOOK_HEADERS {
        return Err(Error::invalid(
            format!("{prefix}.headers"),
            format!(
                "holds {} headers; at most {MAX_WEBHOOK_HEADERS} are allowed",
                h.len()
            ),
        ));
    }
    let mut total = 0usize;
    let mut out = Vec::with_capacity(h.len());
    for (k, v) in h.members() {
        let field = || format!("{prefix}.headers.{k}");
        let v = json::string(v, &field())?;
        if hyper::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
            return Err(Error::invalid(field(), "is not a valid header name"));
        }
        if v.len() > MAX_WEBHOOK_HEADER_VALUE {
            return Err(Error::invalid(
                field(),
                format!(
                    "is {} bytes long; at most {MAX_WEBHOOK_HEADER_VALUE} are allowed",
                    v.len()
                ),
            ));
        }
        if hyper::header::HeaderValue::from_str(&v).is_err() {
            return Err(Error::invalid(field(), "is not a valid header value"));
        }
        total += k.len() + v.len();
        if total > MAX_WEBHOOK_HEADER_BYTES {
            return Err(Error::invalid(
                format!("{prefix}.headers"),
                format!("hold more than {MAX_WEBHOOK_HEADER_BYTES} bytes of names and values"),
            ));
        }
        out.push((k.to_string(), v.into_owned()));
    }
    Ok(out)
}

fn retry_policy(prefix: &str, r: &Obj<'_>) -> Result<RetryPolicy, Error> {
    let d = RetryPolicy::default();
    let number = |k: &str, (lo, hi): (f64, f64), default: f64| -> Result<f64, Error> {
        let field = format!("{prefix}.retryPolicy.{k}");
        let out_of_range = || Error::invalid(&field, format!("must be a number from {lo} to {hi}"));
        match r.f64(k, &field).map_err(|_| out_of_range())? {
            None => Ok(default),
            Some(x) if x >= lo && x <= hi => Ok(x),
            Some(_) => Err(out_of_range()),
        }
    };
    let max_retries = match r.get("maxRetries") {
        None => d.max_retries,
        Some(v) => match serde_json::from_str::<u64>(v.get()) {
            Ok(n) if n <= u64::from(RetryPolicy::MAX_RETRIES.1) => n as u32,
            _ => {
                return Err(Error::invalid(
                    format!("{prefix}.retryPolicy.maxRetries"),
                    format!(
                        "must be an integer from 0 to {}",
                        RetryPolicy::MAX_RETRIES.1
                    ),
                ));
            }
        },
    };
    Ok(RetryPolicy {
        max_retries,
        backoff_multiplier: number(
            "backoffMultiplier",
            RetryPolicy::BACKOFF_MULTIPLIER,
            d.backoff_multiplier,
        )?,
        initial_delay: number("initialDelay", RetryPolicy::INITIAL_DELAY, d.initial_delay)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;
    use serde_json::{Map, Value, json};

    fn raw(v: Value) -> Box<RawValue> {
        RawValue::from_string(v.to_string()).expect("json")
    }

    fn send(v: Value, l: &AgentLimits) -> Result<SendParams, Error> {
        let r = raw(v);
        send_params(&params(Some((&r).into()))?, l)
    }

    fn push(v: Value) -> Result<PushConfig, Error> {
        let r = raw(v);
        push_config(&params(Some((&r).into()))?, true)
    }

    fn field_of(r: Result<SendParams, Error>) -> String {
        reason_of(r).0
    }

    fn reason_of(r: Result<SendParams, Error>) -> (String, String) {
        match r {
            Err(Error::InvalidParams { field, reason }) => (field, reason),
            Err(e) => panic!("unexpected {e}"),
            Ok(_) => panic!("expected an error"),
        }
    }

    const MID: &str = "6f1c2a1e-3b4d-4c5e-8f70-1a2b3c4d5e6f";

    #[test]
    fn a_typical_send_parses_with_aliases() {
        let p = json!({
            "message": {"role": "user", "messageId": MID, "parts": [{"kind": "text", "text": "hi"}]},
            "sessionId": "ctx-1",
            "taskId": "t-1",
            "configuration": {"blocking": false},
        });
        let s = send(p, &AgentLimits::default()).expect("valid");
        assert_eq!(s.request.context_id, Some(ContextId::new("ctx-1")));
        assert_eq!(s.request.task_id, Some(TaskId::new("t-1")));
        assert!(!s.blocking);
        assert_eq!(s.request.message.parts, vec![Part::Text("hi".into())]);
    }

    #[test]
    fn each_bad_field_is_named() {
        let l = AgentLimits::default();
        let msg = |m: Value| json!({ "message": m });
        let cases = [
            (json!({}), "message"),
            (msg(json!("x")), "message"),
            (
                msg(
                    json!({"role": "agent", "messageId": MID, "parts": [{"type":"text","text":"a"}]}),
                ),
                "message.role",
            ),
            (
                msg(
                    json!({"role": "user", "messageId": "nope", "parts": [{"type":"text","text":"a"}]}),
                ),
                "message.messageId",
            ),
            (
                msg(json!({"role": "user", "messageId": MID, "parts": []})),
                "message.parts",
            ),
            (
                msg(json!({"role": "user", "messageId": MID, "parts": [{"type":"video"}]})),
                "message.parts[0].type",
            ),
            (
                msg(json!({"role": "user", "messageId": MID, "parts": [{"type":"text","text":5}]})),
                "message.parts[0].text",
            ),
            (
                msg(
                    json!({"role": "user", "messageId": MID, "parts": [{"type":"text","kind":"file","text":"a"}]}),
                ),
                "message.parts[0].type",
            ),
            (
                msg(
                    json!({"role": "user", "messageId": MID, "parts": [{"type":"file","file":{"name":"a","mimeType":"text/plain"}}]}),
                ),
                "message.parts[0].file.bytes",
            ),
        ];
        for (p, field) in cases {
            assert_eq!(field_of(send(p, &l)), field);
        }
        let both = json!({
            "message": {"role": "user", "messageId": MID, "parts": [{"type":"text","text":"a"}]},
            "contextId": "a", "sessionId": "b",
        });
        assert_eq!(field_of(send(both, &l)), "contextId");
    }

    #[test]
    fn push_config_defaults_and_bounds() {
        let c = push(json!({"config": {"url": "http://127.0.0.1:1/h"}})).expect("ok");
        assert_eq!(c.events, Events::StateChanges(WebhookEvent::ALL.to_vec()));
        assert_eq!(c.retry, RetryPolicy::default());
        for bad in [
            json!({"config": {"url": "http://x/", "retryPolicy": {"maxRetries": 11}}}),
            json!({"config": {"url": "http://x/", "retryPolicy": {"backoffMultiplier": 0.5}}}),
            json!({"config": {"url": "http://x/", "retryPolicy": {"initialDelay": 0.01}}}),
            json!({"config": {"url": "http://x/", "secret": "short"}}),
            json!({"config": {"url": "http://x/", "events": ["task.done"]}}),
            json!({"config": {"url": "ftp://x/"}}),
            json!({"config": {}}),
        ] {
            assert!(push(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn parts_beyond_the_cap_are_refused_before_any_is_parsed() {
        let l = AgentLimits {
            max_parts: 3,
            ..AgentLimits::default()
        };
        let parts: Vec<Value> = (0..4)
            .map(|_| json!({"type": "text", "text": ""}))
            .collect();
        let p = json!({"message": {"role": "user", "messageId": MID, "parts": parts}});
        let (field, reason) = reason_of(send(p, &l));
        assert_eq!(field, "message.parts");
        assert!(reason.contains("at most 3"), "{reason}");
    }

    #[test]
    fn a_lone_surrogate_or_deep_metadata_is_named_for_what_it_is() {
        let l = AgentLimits::default();
        let body = format!(
            r#"{{"message":{{"role":"user","messageId":"{MID}","parts":[{{"type":"text","text":"\ud800"}}]}}}}"#
        );
        let r = RawValue::from_string(body).expect("json");
        let (field, reason) =
            reason_of(send_params(&params(Some((&r).into())).expect("object"), &l));
        assert_eq!(field, "message.parts[0].text");
        assert!(reason.contains("surrogate"), "{reason}");
        let deep = format!("{}{}", "[".repeat(500), "]".repeat(500));
        let body = format!(
            r#"{{"message":{{"role":"user","messageId":"{MID}","parts":[{{"type":"text","text":"a"}}]}},"metadata":{{"x":{deep}}}}}"#
        );
        let r = RawValue::from_string(body).expect("json");
        let (field, reason) =
            reason_of(send_params(&params(Some((&r).into())).expect("object"), &l));
        assert_eq!(field, "metadata");
        assert!(reason.contains("deeper than"), "{reason}");
    }

    #[test]
    fn webhook_headers_and_events_are_bounded() {
        let many: Map<String, Value> = (0..=MAX_WEBHOOK_HEADERS)
            .map(|i| (format!("x-h{i}"), Value::from("v")))
            .collect();
        for bad in [
            json!({"config": {"url": "http://x/", "headers": many}}),
            json!({"config": {"url": "http://x/", "headers": {"x-big": "v".repeat(5000)}}}),
            json!({"config": {"url": "http://x/", "events": vec!["task.completed"; 17]}}),
        ] {
            assert!(push(bad.clone()).is_err(), "{bad}");
        }
    }
}
