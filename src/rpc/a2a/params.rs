//! Official params in (docs/PROTOCOL.md §10.3–§10.7): 0.3 (JSON schema) and 1.0 (ProtoJSON) shapes
//! into the neutral model. ProtoJSON parsers accept a field's camelCase JSON name and its
//! proto name (snake_case) alike, and so does this; unknown fields are ignored.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use serde_json::value::RawValue;

use super::Version;
use crate::config::AgentLimits;
use crate::error::Error;
use crate::model::{ContextId, Extensions, Message, Part, TaskId, TaskState};
use crate::push::{Events, PushAuth, PushConfig, RetryPolicy};
use crate::rpc::json::{self, Kind, Obj, PART, Raw};
use crate::runtime::SendRequest;
use crate::validate;

/// Longest id (message, task, context, push configuration) accepted.
pub(crate) const MAX_ID_LEN: usize = 256;

/// The raw value of a field by its JSON (camelCase) name or its proto (snake_case) name.
pub(crate) fn field<'a>(o: &Obj<'a>, camel: &str) -> Option<Raw<'a>> {
    o.get(camel).or_else(|| {
        // A one-word name is its own snake_case: no second look.
        if !camel.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        o.get_where(|key| is_snake_case_of(key, camel))
    })
}

/// Whether `key` is `camel` in snake_case (`contextId`: `context_id`), compared in place
/// (an absent field is looked for under both names on every request: no name is made).
fn is_snake_case_of(key: &str, camel: &str) -> bool {
    let mut key = key.bytes();
    camel.bytes().all(|c| {
        if c.is_ascii_uppercase() {
            key.next() == Some(b'_') && key.next() == Some(c.to_ascii_lowercase())
        } else {
            key.next() == Some(c)
        }
    }) && key.next().is_none()
}

/// An optional string field.
pub(crate) fn opt_str(o: &Obj<'_>, camel: &str, path: &str) -> Result<Option<String>, Error> {
    field(o, camel)
        .map(|v| json::string(v, path).map(|s| s.into_owned()))
        .transpose()
}

/// An optional id: non-empty, at most [`MAX_ID_LEN`] characters.
pub(crate) fn opt_id(o: &Obj<'_>, camel: &str, path: &str) -> Result<Option<String>, Error> {
    match opt_str(o, camel, path)? {
        None => Ok(None),
        Some(s) if s.is_empty() => Err(Error::invalid(path, "must not be empty")),
        Some(s) if s.chars().count() > MAX_ID_LEN => Err(Error::invalid(
            path,
            format!("must be at most {MAX_ID_LEN} characters"),
        )),
        Some(s) => Ok(Some(s)),
    }
}

/// A required id.
pub(crate) fn id(o: &Obj<'_>, camel: &str, path: &str) -> Result<String, Error> {
    opt_id(o, camel, path)?.ok_or_else(|| Error::invalid(path, "is required"))
}

/// An optional boolean.
pub(crate) fn opt_bool(o: &Obj<'_>, camel: &str, path: &str) -> Result<Option<bool>, Error> {
    field(o, camel)
        .map(|v| match v.get() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(Error::invalid(path, "must be a boolean")),
        })
        .transpose()
}

/// An optional integer (ProtoJSON also writes integers as strings).
pub(crate) fn opt_int(o: &Obj<'_>, camel: &str, path: &str) -> Result<Option<i64>, Error> {
    field(o, camel)
        .map(|v| {
            let text = match json::kind(v) {
                Kind::String => json::string(v, path)?.into_owned(),
                Kind::Number => v.get().to_string(),
                _ => return Err(Error::invalid(path, "must be an integer")),
            };
            text.parse::<i64>()
                .map_err(|_| Error::invalid(path, "must be an integer"))
        })
        .transpose()
}

/// `historyLength`: a non-negative integer.
pub(crate) fn history_length(o: &Obj<'_>, path: &str) -> Result<Option<usize>, Error> {
    match opt_int(o, "historyLength", path)? {
        None => Ok(None),
        Some(n) if n < 0 => Err(Error::invalid(path, "must not be negative")),
        Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
    }
}

/// `tenant` must be absent or empty: the card declares none.
pub(crate) fn no_tenant(o: &Obj<'_>) -> Result<(), Error> {
    match opt_str(o, "tenant", "tenant")? {
        Some(t) if !t.is_empty() => Err(Error::invalid(
            "tenant",
            "this server declares no tenant; send none",
        )),
        _ => Ok(()),
    }
}

/// Parsed `SendMessage` / `message/send` params.
#[derive(Debug)]
pub(crate) struct SendParams {
    pub(crate) request: SendRequest,
    /// Wait for the end of the run (1.0 `!returnImmediately`, 0.3 `blocking`).
    pub(crate) blocking: bool,
    pub(crate) history_length: Option<usize>,
    /// An inline push configuration, and its id.
    pub(crate) push: Option<(PushConfig, Option<String>)>,
}

/// Parses send params. The push configuration's target is checked by the caller.
pub(crate) fn send_params(
    v: Version,
    p: &Obj<'_>,
    limits: &AgentLimits,
) -> Result<SendParams, Error> {
    no_tenant(p)?;
    let Some(raw) = field(p, "message") else {
        return Err(Error::invalid("message", "is required"));
    };
    let m = Obj::parse(raw, "message")?;
    let message = message(v, &m, limits)?;
    let context_id = opt_id(&m, "contextId", "message.contextId")?.map(ContextId::new);
    let task_id = opt_id(&m, "taskId", "message.taskId")?.map(TaskId::new);
    let (mut blocking, mut history, mut push) = (true, None, None);
    if let Some(c) = field(p, "configuration") {
        let c = Obj::parse(c, "configuration")?;
        history = history_length(&c, "configuration.historyLength")?;
        match v {
            Version::V10 => {
                let now = opt_bool(&c, "returnImmediately", "configuration.returnImmediately")?;
                blocking = !now.unwrap_or(false);
                if let Some(raw) = field(&c, "taskPushNotificationConfig") {
                    let o = Obj::parse(raw, "configuration.taskPushNotificationConfig")?;
                    push = Some(push_config_10(
                        &o,
                        "configuration.taskPushNotificationConfig",
                    )?);
                }
            }
            Version::V03 => {
                blocking = opt_bool(&c, "blocking", "configuration.blocking")?.unwrap_or(true);
                if let Some(raw) = field(&c, "pushNotificationConfig") {
                    let o = Obj::parse(raw, "configuration.pushNotificationConfig")?;
                    push = Some(push_config_03(&o, "configuration.pushNotificationConfig")?);
                }
            }
        }
    }
    let metadata = metadata(p)?;
    Ok(SendParams {
        request: SendRequest {
            message,
            context_id,
            task_id,
            metadata,
            extensions: Extensions::default(),
        },
        blocking,
        history_length: history,
        push,
    })
}

/// `metadata`: an object, kept as its text.
pub(crate) fn metadata(p: &Obj<'_>) -> Result<Option<Box<RawValue>>, Error> {
    match field(p, "metadata") {
        None => Ok(None),
        Some(m) if json::kind(m) == Kind::Object => {
            json::check_depth(m, "metadata")?;
            Ok(Some(m.to_owned()))
        }
        Some(_) => Err(Error::invalid("metadata", "must be an object")),
    }
}

fn message(v: Version, m: &Obj<'_>, limits: &AgentLimits) -> Result<Message, Error> {
    let user = match (v, field(m, "role").map(|r| r.get())) {
        (_, None) => return Err(Error::invalid("message.role", "is required")),
        (Version::V10, Some(r#""ROLE_USER""# | "1" | r#""user""#)) => true,
        (Version::V03, Some(r#""user""#)) => true,
        _ => false,
    };
    if !user {
        let expected = match v {
            Version::V10 => "must be \"ROLE_USER\"",
            Version::V03 => "must be \"user\"",
        };
        return Err(Error::invalid("message.role", expected));
    }
    let message_id = id(m, "messageId", "message.messageId")?;
    let parts = json::message_parts(field(m, "parts"), limits.max_parts)?;
    let parts = parts
        .into_iter()
        .enumerate()
        .map(|(i, raw)| part(v, i, raw, limits))
        .collect::<Result<Vec<_>, _>>()?;
    let extensions = json::message_extensions(field(m, "extensions"))?;
    validate::user_message(message_id, parts, extensions, limits)
}

/// A 1.0 part that holds more than one of text, raw, url and data.
pub(crate) fn several_kinds() -> Error {
    Error::invalid(PART, "must hold exactly one of text, raw, url or data")
}

pub(crate) fn part(
    v: Version,
    i: usize,
    raw: Raw<'_>,
    limits: &AgentLimits,
) -> Result<Part, Error> {
    part_of(v, raw, limits).map_err(|e| json::at_part(i, e))
}

fn part_of(v: Version, raw: Raw<'_>, limits: &AgentLimits) -> Result<Part, Error> {
    let at = json::part_field;
    let p = Obj::parse(raw, &at(""))?;
    match v {
        Version::V10 => {
            // The part's content: one of four one-word members (their own snake_case),
            // found in one pass over the members.
            let mut kinds = 0u8;
            for (name, _) in p.members() {
                kinds |= match name {
                    "text" => 1,
                    "raw" => 2,
                    "url" => 4,
                    "data" => 8,
                    _ => 0,
                };
            }
            if kinds.count_ones() > 1 {
                return Err(several_kinds());
            }
            let metadata = || {
                field(&p, "metadata")
                    .map(|m| validate::part_metadata(PART, &m.to_owned()))
                    .transpose()
            };
            if kinds & 1 != 0
                && let Some(t) = field(&p, "text")
            {
                return Ok(Part::Text(json::string(t, &at(".text"))?.into_owned()));
            }
            if kinds & 4 != 0
                && let Some(url) = field(&p, "url")
            {
                return validate::file_url(
                    PART,
                    ("url", "mediaType"),
                    json::string(url, &at(".url"))?.into_owned(),
                    opt_str(&p, "filename", &at(".filename"))?,
                    opt_str(&p, "mediaType", &at(".mediaType"))?,
                    metadata()?,
                    limits,
                );
            }
            if kinds & 8 != 0
                && let Some(data) = field(&p, "data")
            {
                let media = opt_str(&p, "mediaType", &at(".mediaType"))?;
                return json::data_part(PART, data, media, field(&p, "metadata"));
            }
            if kinds & 2 != 0
                && let Some(raw) = field(&p, "raw")
            {
                let bytes = base64_field(raw, &at(".raw"))?;
                let name =
                    opt_str(&p, "filename", &at(".filename"))?.unwrap_or_else(|| "unnamed".into());
                let mime = opt_str(&p, "mediaType", &at(".mediaType"))?
                    .unwrap_or_else(|| "application/octet-stream".into());
                let metadata = metadata()?;
                return file(&at(""), name, mime, bytes, limits, "raw", "mediaType")
                    .map(|part| validate::with_metadata(part, metadata));
            }
            Err(Error::invalid(
                at(""),
                "must hold one of text, raw, url or data",
            ))
        }
        Version::V03 => {
            let kind = opt_str(&p, "kind", &at(".kind"))?;
            match kind.as_deref() {
                Some("text") => match field(&p, "text") {
                    Some(t) => Ok(Part::Text(json::string(t, &at(".text"))?.into_owned())),
                    None => Err(Error::invalid(at(".text"), "is required")),
                },
                Some("file") => {
                    let Some(f) = field(&p, "file") else {
                        return Err(Error::invalid(at(".file"), "is required"));
                    };
                    let f = Obj::parse(f, &at(".file"))?;
                    // `url` is taken for `uri` (the 0.3 conformance kit sends it).
                    if let Some(uri) = field(&f, "uri").or_else(|| field(&f, "url")) {
                        if field(&f, "bytes").is_some() {
                            return Err(Error::invalid(
                                at(".file"),
                                "holds both bytes and uri; send one of them",
                            ));
                        }
                        let metadata = field(&p, "metadata")
                            .map(|m| validate::part_metadata(PART, &m.to_owned()))
                            .transpose()?;
                        return validate::file_url(
                            &at(".file"),
                            ("uri", "mimeType"),
                            json::string(uri, &at(".file.uri"))?.into_owned(),
                            opt_str(&f, "name", &at(".file.name"))?,
                            opt_str(&f, "mimeType", &at(".file.mimeType"))?,
                            metadata,
                            limits,
                        );
                    }
                    let Some(raw) = field(&f, "bytes") else {
                        return Err(Error::invalid(at(".file"), "must hold bytes or uri"));
                    };
                    let bytes = base64_field(raw, &at(".file.bytes"))?;
                    let name =
                        opt_str(&f, "name", &at(".file.name"))?.unwrap_or_else(|| "unnamed".into());
                    let mime = opt_str(&f, "mimeType", &at(".file.mimeType"))?
                        .unwrap_or_else(|| "application/octet-stream".into());
                    let metadata = field(&p, "metadata")
                        .map(|m| validate::part_metadata(PART, &m.to_owned()))
                        .transpose()?;
                    file(&at(".file"), name, mime, bytes, limits, "bytes", "mimeType")
                        .map(|part| validate::with_metadata(part, metadata))
                }
                // J03's DataPart holds an object; any JSON value is taken (the 0.3
                // conformance kit sends arrays), and shown back as `{"value": …}`.
                Some("data") => match field(&p, "data") {
                    Some(d) => json::data_part(PART, d, None, field(&p, "metadata")),
                    None => Err(Error::invalid(at(".data"), "is required")),
                },
                Some(other) => Err(Error::invalid(
                    at(".kind"),
                    format!("unknown part kind {other:?}; expected \"text\", \"file\" or \"data\""),
                )),
                None => Err(Error::invalid(
                    at(".kind"),
                    "is required (\"text\", \"file\" or \"data\")",
                )),
            }
        }
    }
}

/// A file part's checks, with the field names of its dialect.
pub(crate) fn file(
    at: &str,
    name: String,
    mime: String,
    bytes: String,
    limits: &AgentLimits,
    bytes_key: &str,
    mime_key: &str,
) -> Result<Part, Error> {
    let rename = |field: String| {
        field
            .replace(&format!("{at}.bytes"), &format!("{at}.{bytes_key}"))
            .replace(&format!("{at}.mimeType"), &format!("{at}.{mime_key}"))
    };
    validate::file_part(at, name, mime, bytes, limits)
        .map(|f| Part::File(Box::new(f)))
        .map_err(|e| match e {
            Error::InvalidParams { field, reason } => Error::invalid(rename(field), reason),
            Error::UnsupportedContentType { field, reason } => Error::UnsupportedContentType {
                field: rename(field),
                reason,
            },
            other => other,
        })
}

/// Base64 as ProtoJSON accepts it (standard or URL-safe, padding optional), returned as
/// standard padded Base64 — the one form the model keeps. A `data:` prefix is refused.
fn base64_field(raw: Raw<'_>, path: &str) -> Result<String, Error> {
    let text = json::string(raw, path)?;
    if text
        .as_bytes()
        .get(..5)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"data:"))
    {
        return Err(Error::invalid(
            path,
            "must be Base64 without a \"data:<mime>;base64,\" prefix",
        ));
    }
    let decoded = [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(text.as_bytes()).ok())
        .ok_or_else(|| Error::invalid(path, "must be Base64 (standard or URL-safe)"))?;
    Ok(STANDARD.encode(decoded))
}

/// A 1.0 `TaskPushNotificationConfig` (`{id?, taskId?, url, token?, authentication?}`).
pub(crate) fn push_config_10(o: &Obj<'_>, at: &str) -> Result<(PushConfig, Option<String>), Error> {
    no_tenant(o)?;
    push_config(o, at, |a, path| {
        opt_str(a, "scheme", &path("authentication.scheme"))?
            .ok_or_else(|| Error::invalid(path("authentication.scheme"), "is required"))
    })
}

/// A 0.3 `PushNotificationConfig` (`{id?, url, token?, authentication?{schemes, credentials}}`).
pub(crate) fn push_config_03(o: &Obj<'_>, at: &str) -> Result<(PushConfig, Option<String>), Error> {
    push_config(o, at, |a, path| {
        let schemes = match field(a, "schemes") {
            Some(s) => json::array(s, &path("authentication.schemes"), 16)?,
            None => Vec::new(),
        };
        match schemes.first() {
            Some(s) => Ok(json::string(s, &path("authentication.schemes[0]"))?.into_owned()),
            None => Err(Error::invalid(
                path("authentication.schemes"),
                "must name a scheme",
            )),
        }
    })
}

/// The fields both versions share; `scheme` reads the version's authentication scheme.
fn push_config(
    o: &Obj<'_>,
    at: &str,
    scheme: impl Fn(&Obj<'_>, &dyn Fn(&str) -> String) -> Result<String, Error>,
) -> Result<(PushConfig, Option<String>), Error> {
    let path = |k: &str| format!("{at}.{k}");
    let id = opt_id(o, "id", &path("id"))?;
    let url = opt_str(o, "url", &path("url"))?
        .ok_or_else(|| Error::invalid(path("url"), "is required"))?;
    let token = opt_str(o, "token", &path("token"))?;
    let auth = match field(o, "authentication") {
        None => None,
        Some(raw) => {
            let a = Obj::parse(raw, &path("authentication"))?;
            let scheme = scheme(&a, &path)?;
            let credentials = opt_str(&a, "credentials", &path("authentication.credentials"))?;
            Some((scheme, credentials))
        }
    };
    Ok((config(url, token, auth, &path("authentication"))?, id))
}

/// The neutral configuration: every event, the default retry policy, the token, and the
/// authentication as a header — or, for `HMAC-SHA256`, as the signing secret (which then
/// never travels).
pub(crate) fn config(
    url: String,
    token: Option<String>,
    auth: Option<(String, Option<String>)>,
    at: &str,
) -> Result<PushConfig, Error> {
    crate::push::check_shape(&url).map_err(|e| match e {
        Error::InvalidParams { reason, .. } => {
            Error::invalid(at.replace(".authentication", ".url"), reason)
        }
        other => other,
    })?;
    let mut out = PushConfig::new(url);
    out.events = Events::All;
    out.retry = RetryPolicy::default();
    if let Some(t) = &token
        && hyper::header::HeaderValue::from_str(t).is_err()
    {
        return Err(Error::invalid(
            at.replace(".authentication", ".token"),
            "is not a valid header value",
        ));
    }
    out.token = token;
    match auth {
        None => {}
        Some((scheme, credentials)) if scheme.eq_ignore_ascii_case("HMAC-SHA256") => {
            match credentials {
                Some(secret) if secret.chars().count() >= 16 => out.secret = Some(secret),
                _ => {
                    return Err(Error::invalid(
                        format!("{at}.credentials"),
                        "must be a secret of at least 16 characters with scheme HMAC-SHA256",
                    ));
                }
            }
        }
        Some((scheme, credentials)) => {
            let value = match &credentials {
                Some(c) => format!("{scheme} {c}"),
                None => scheme.clone(),
            };
            if scheme.is_empty() || hyper::header::HeaderValue::from_str(&value).is_err() {
                return Err(Error::invalid(
                    format!("{at}.scheme"),
                    "is not a valid Authorization scheme",
                ));
            }
            out.authorization = Some(PushAuth {
                scheme,
                credentials,
            });
        }
    }
    Ok(out)
}

/// A 1.0 task state by name (`TASK_STATE_WORKING`) or number.
pub(crate) fn state_10(raw: Raw<'_>, path: &str) -> Result<TaskState, Error> {
    let name = match json::kind(raw) {
        Kind::Number => raw.get().to_string(),
        _ => json::string(raw, path)?.into_owned(),
    };
    let state = match name.as_str() {
        "TASK_STATE_SUBMITTED" | "1" => TaskState::Submitted,
        "TASK_STATE_WORKING" | "2" => TaskState::Working,
        "TASK_STATE_COMPLETED" | "3" => TaskState::Completed,
        "TASK_STATE_FAILED" | "4" => TaskState::Failed,
        "TASK_STATE_CANCELED" | "5" => TaskState::Canceled,
        "TASK_STATE_INPUT_REQUIRED" | "6" => TaskState::InputRequired,
        "TASK_STATE_REJECTED" | "7" => TaskState::Rejected,
        "TASK_STATE_AUTH_REQUIRED" | "8" => TaskState::AuthRequired,
        _ => {
            return Err(Error::invalid(
                path,
                format!(
                    "{name:?} is not a task state such as \"TASK_STATE_WORKING\" \
                     (TASK_STATE_UNSPECIFIED, or no field, filters nothing)"
                ),
            ));
        }
    };
    Ok(state)
}

/// The widest ListTasks page.
const MAX_PAGE_SIZE: i64 = 100;
/// The ListTasks page size when none is asked.
const DEFAULT_PAGE_SIZE: usize = 50;

/// ListTasks `pageSize`: 1–100, 50 when none is asked.
pub(crate) fn list_page_size(asked: Option<i64>) -> Result<usize, Error> {
    match asked {
        None => Ok(DEFAULT_PAGE_SIZE),
        Some(n) if (1..=MAX_PAGE_SIZE).contains(&n) => Ok(usize::try_from(n).unwrap_or(1)),
        Some(_) => Err(Error::invalid(
            "pageSize",
            format!("must be between 1 and {MAX_PAGE_SIZE}"),
        )),
    }
}

/// ListTasks `pageToken`: empty is none; else a token this server issued.
pub(crate) fn list_after(token: Option<&str>) -> Result<Option<crate::store::PageToken>, Error> {
    match token {
        None | Some("") => Ok(None),
        Some(t) => super::token::decode(t).map(Some),
    }
}

/// ListTasks `statusTimestampAfter`, an RFC 3339 time.
pub(crate) fn list_status_after(text: &str) -> Result<chrono::DateTime<chrono::Utc>, Error> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|_| {
            Error::invalid(
                "statusTimestampAfter",
                "must be an ISO 8601 time such as 2026-01-01T00:00:00Z",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_snake_case_name_is_matched_in_place() {
        assert!(is_snake_case_of("context_id", "contextId"));
        assert!(is_snake_case_of("reference_task_ids", "referenceTaskIds"));
        for other in [
            "contextid",
            "context_i",
            "context_idx",
            "_context_id",
            "context__id",
            "",
        ] {
            assert!(!is_snake_case_of(other, "contextId"), "{other}");
        }
    }

    fn send(v: Version, p: serde_json::Value) -> Result<SendParams, Error> {
        let raw = RawValue::from_string(p.to_string()).expect("json");
        let o = Obj::parse(&raw, "params").expect("object");
        send_params(v, &o, &AgentLimits::default())
    }

    fn field_of<T>(r: Result<T, Error>) -> String {
        match r {
            Err(Error::InvalidParams { field, .. })
            | Err(Error::UnsupportedContentType { field, .. }) => field,
            Err(e) => panic!("unexpected {e}"),
            Ok(_) => panic!("expected an error"),
        }
    }

    #[test]
    fn a_1_0_message_with_snake_case_names_and_url_safe_base64_parses() {
        let p = send(
            Version::V10,
            json!({"message": {"message_id": "tck-x", "role": "ROLE_USER", "context_id": "c1",
                   "parts": [{"text": "hi"}, {"raw": "aGk", "media_type": "text/plain"}]},
                   "configuration": {"return_immediately": true, "history_length": "2"}}),
        )
        .expect("valid");
        assert!(!p.blocking);
        assert_eq!(p.history_length, Some(2));
        assert_eq!(p.request.context_id, Some(ContextId::new("c1")));
        match &p.request.message.parts[1] {
            Part::File(f) => {
                assert_eq!((f.bytes.as_str(), f.name.as_str()), ("aGk=", "unnamed"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn data_parts_files_by_url_and_extensions_are_read_on_both_versions() {
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let data = |v: &str| serde_json::from_str::<serde_json::Value>(v).expect("json");
        let p = send(
            Version::V10,
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "extensions": ["urn:x"], "parts": [
                {"data": data(&deep(64)), "mediaType": "application/vnd.a+json", "metadata": {"k": 1}},
                {"data": "a string"},
                {"url": "https://files.example/a.pdf", "filename": "a.pdf", "mediaType": "application/pdf"},
                {"url": "http://files.example/b"}]}}),
        )
        .expect("valid");
        let parts = &p.request.message.parts;
        assert_eq!(p.request.message.extensions.as_slice(), ["urn:x"]);
        match (&parts[0], &parts[1], &parts[2], &parts[3]) {
            (Part::Data(a), Part::Data(b), Part::Url(c), Part::Url(d)) => {
                assert_eq!(a.data.get(), deep(64));
                assert_eq!(a.media_type.as_deref(), Some("application/vnd.a+json"));
                assert_eq!(a.metadata.as_ref().map(|m| m.get()), Some(r#"{"k":1}"#));
                assert_eq!(b.data.get(), r#""a string""#);
                assert_eq!(
                    (c.url.as_str(), c.name.as_deref(), c.mime_type.as_deref()),
                    (
                        "https://files.example/a.pdf",
                        Some("a.pdf"),
                        Some("application/pdf")
                    )
                );
                assert_eq!((d.name.as_deref(), d.mime_type.as_deref()), (None, None));
            }
            other => panic!("{other:?}"),
        }
        let too_deep = send(
            Version::V10,
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"data": data(&deep(65))}]}}),
        );
        assert_eq!(field_of(too_deep), "message.parts[0].data");
        let p = send(
            Version::V03,
            json!({"message": {"kind": "message", "messageId": "m", "role": "user", "parts": [
                {"kind": "data", "data": {"a": [1, 2]}, "metadata": {"z": true}},
                {"kind": "file", "file": {"uri": "https://x.example/f", "name": "f", "mimeType": "text/plain"}}]}}),
        )
        .expect("valid");
        match &p.request.message.parts[..] {
            [Part::Data(a), Part::Url(b)] => {
                assert_eq!(a.data.get(), r#"{"a":[1,2]}"#);
                assert_eq!(a.metadata.as_ref().map(|m| m.get()), Some(r#"{"z":true}"#));
                assert_eq!(b.name.as_deref(), Some("f"));
            }
            other => panic!("{other:?}"),
        }
        // As the 0.3 conformance kit sends them: an array as data, `file.url` for `uri`.
        let p = send(
            Version::V03,
            json!({"message": {"kind": "message", "messageId": "m", "role": "user", "parts": [
                {"kind": "data", "data": [{"name": "Alice"}, 2]},
                {"kind": "file", "file": {"url": "https://x.example/t.txt", "mimeType": "text/plain", "sizeInBytes": 3}}]}}),
        )
        .expect("valid");
        match &p.request.message.parts[..] {
            [Part::Data(a), Part::Url(b)] => {
                assert_eq!(a.data.get(), r#"[{"name":"Alice"},2]"#);
                assert_eq!(b.url, "https://x.example/t.txt");
            }
            other => panic!("{other:?}"),
        }
        // The data's compact text counts against `max_message_length`.
        let raw = RawValue::from_string(
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"data": {"abc": "defg"}}]}})
                .to_string(),
        )
        .expect("json");
        let o = Obj::parse(&raw, "params").expect("object");
        let limits = |n| AgentLimits {
            max_message_length: n,
            ..AgentLimits::default()
        };
        assert!(send_params(Version::V10, &o, &limits(14)).is_ok());
        assert_eq!(
            field_of(send_params(Version::V10, &o, &limits(13))),
            "message.parts"
        );
    }

    #[test]
    fn refusals_name_their_field() {
        for (v, p, field) in [
            (
                Version::V10,
                json!({"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "a"}]}}),
                "message.role",
            ),
            (
                Version::V10,
                json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"url": "ftp://x/y"}]}}),
                "message.parts[0].url",
            ),
            (
                Version::V10,
                json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "a"}, {"url": format!("https://x/{}", "a".repeat(2040))}]}}),
                "message.parts[1].url",
            ),
            (
                Version::V10,
                json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"url": "https://x/y", "mediaType": "video/mp4"}]}}),
                "message.parts[0].mediaType",
            ),
            (
                Version::V10,
                json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"data": {}, "text": "a"}]}}),
                "message.parts[0]",
            ),
            (
                Version::V10,
                json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"data": {}, "metadata": 5}]}}),
                "message.parts[0].metadata",
            ),
            (
                Version::V10,
                json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "a"}], "extensions": [""]}}),
                "message.extensions",
            ),
            (
                Version::V03,
                json!({"message": {"kind": "message", "messageId": "m", "role": "user", "parts": [{"kind": "file", "file": {"uri": "https://x/y", "bytes": "aGk="}}]}}),
                "message.parts[0].file",
            ),
            (
                Version::V03,
                json!({"message": {"kind": "message", "messageId": "m", "role": "user", "parts": [{"kind": "file", "file": {"name": "a"}}]}}),
                "message.parts[0].file",
            ),
            (
                Version::V10,
                json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "a"}]}, "tenant": "t"}),
                "tenant",
            ),
            (
                Version::V10,
                json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "a"}]}, "configuration": {"historyLength": -1}}),
                "configuration.historyLength",
            ),
            (
                Version::V10,
                json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"raw": "aGk=", "mediaType": "video/mp4"}]}}),
                "message.parts[0].mediaType",
            ),
            (
                Version::V03,
                json!({"message": {"kind": "message", "messageId": "m", "role": "user", "parts": [{"kind": "file", "file": {"uri": "javascript:alert(1)"}}]}}),
                "message.parts[0].file.uri",
            ),
            (
                Version::V03,
                json!({"message": {"messageId": "", "role": "user", "parts": [{"kind": "text", "text": "a"}]}}),
                "message.messageId",
            ),
        ] {
            assert_eq!(field_of(send(v, p.clone())), field, "{p}");
        }
    }

    #[test]
    fn push_configurations_become_headers_or_a_signing_secret() {
        let raw = RawValue::from_string(
            json!({"url": "https://h.example/x", "token": "tok", "authentication": {"scheme": "Bearer", "credentials": "abc"}})
                .to_string(),
        )
        .expect("json");
        let (c, id) = push_config_10(&Obj::parse(&raw, "p").expect("o"), "p").expect("valid");
        assert_eq!(id, None);
        assert_eq!(c.token.as_deref(), Some("tok"));
        assert_eq!(
            c.authorization.as_ref().map(|a| a.scheme.as_str()),
            Some("Bearer")
        );
        let raw = RawValue::from_string(
            json!({"id": "c1", "url": "https://h.example/x", "authentication": {"schemes": ["hmac-sha256"], "credentials": "0123456789abcdef"}})
                .to_string(),
        )
        .expect("json");
        let (c, id) = push_config_03(&Obj::parse(&raw, "p").expect("o"), "p").expect("valid");
        assert_eq!(id.as_deref(), Some("c1"));
        assert!(c.authorization.is_none() && c.secret.is_some());
    }
}
