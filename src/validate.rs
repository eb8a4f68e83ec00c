//! Content checks on incoming messages: Base64, file size, MIME types and magic bytes,
//! message length. Dialect-neutral: a dialect parses its JSON shape, then calls these.
//!
//! Every failure names the offending field (relative to `params`) and a reason a client
//! can act on; nothing here panics on any input.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use serde_json::value::RawValue;

use crate::config::AgentLimits;
use crate::error::Error;
use crate::model::{DataPart, Extensions, FileContent, FileUrl, Message, Part, RawJson};

/// Nesting depth of free-form JSON kept as is (`metadata`, a data part's value, which is
/// level 1) at most.
pub(crate) const MAX_DEPTH: usize = 64;

/// The longest file URL a client may send (docs/PROTOCOL.md §12).
pub(crate) const MAX_URL_LEN: usize = 2048;

/// The most extension URIs a message may list, and the longest one.
pub(crate) const MAX_EXTENSIONS: usize = 32;

/// Checks a file part and returns its validated content.
///
/// `field` is the path of the part's `file` object, e.g. `message.parts[1].file`.
///
/// # Errors
/// [`Error::InvalidParams`] naming `file.bytes` or `file.mimeType`.
pub(crate) fn file_part(
    field: &str,
    name: String,
    mime_type: String,
    bytes: String,
    limits: &AgentLimits,
) -> Result<FileContent, Error> {
    let bytes_field = || format!("{field}.bytes");
    let mime_field = || format!("{field}.mimeType");
    let essence = mime_essence(&mime_type);
    if essence.is_empty() {
        return Err(Error::invalid(
            mime_field(),
            format!(
                "is empty (browsers send an empty type for files they do not recognise): set it to the file's real type, e.g. \"application/pdf\"; this agent accepts {}",
                limits.supported_types.join(", ")
            ),
        ));
    }
    accepted_type(&mime_field(), &mime_type, &essence, limits)?;
    if bytes
        .as_bytes()
        .get(..5)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"data:"))
    {
        return Err(Error::invalid(
            bytes_field(),
            "must be pure Base64 without a \"data:<mime>;base64,\" prefix",
        ));
    }
    let declared = decoded_len(&bytes);
    if declared as u64 > limits.max_file_size {
        return Err(too_large(bytes_field(), declared, limits.max_file_size));
    }
    let decoded = STANDARD.decode(bytes.as_bytes()).map_err(|_| {
        Error::invalid(
            bytes_field(),
            "must be standard Base64 with padding and no whitespace",
        )
    })?;
    if decoded.len() as u64 > limits.max_file_size {
        return Err(too_large(
            bytes_field(),
            decoded.len(),
            limits.max_file_size,
        ));
    }
    if let Some(reason) = sniff_mismatch(&essence, &decoded) {
        return Err(Error::invalid(bytes_field(), reason));
    }
    Ok(FileContent {
        name,
        mime_type,
        size: decoded.len(),
        bytes,
        metadata: None,
    })
}

/// Checks a data part: `data` nests no deeper than [`MAX_DEPTH`] levels (the value itself
/// is level 1) and is kept as its compact text; `metadata`, when given, is an object.
/// `field` is the part's path, e.g. `message.parts[0]`.
///
/// # Errors
/// [`Error::InvalidParams`] naming `{field}.data` or `{field}.metadata`.
pub(crate) fn data_part(
    field: &str,
    data: &RawValue,
    media_type: Option<String>,
    metadata: Option<&RawValue>,
) -> Result<Part, Error> {
    let data = compact(data, &format!("{field}.data"))?;
    let metadata = metadata.map(|m| part_metadata(field, m)).transpose()?;
    Ok(Part::Data(Box::new(DataPart {
        data,
        media_type: media_type.filter(|m| !m.is_empty()),
        metadata,
    })))
}

/// `part` with its `metadata` (a file's or a data part's; a text part keeps none).
pub(crate) fn with_metadata(mut part: Part, metadata: Option<RawJson>) -> Part {
    if metadata.is_some() {
        match &mut part {
            Part::File(f) => f.metadata = metadata,
            Part::Url(u) => u.metadata = metadata,
            Part::Data(d) => d.metadata = metadata,
            Part::Text(_) => {}
        }
    }
    part
}

/// A part's `metadata`: an object within the nesting bound.
pub(crate) fn part_metadata(field: &str, m: &RawValue) -> Result<RawJson, Error> {
    let at = format!("{field}.metadata");
    if !m.get().starts_with('{') {
        return Err(Error::invalid(at, "must be an object"));
    }
    compact(m, &at)
}

/// Walks JSON text outside its strings: refused past [`MAX_DEPTH`] nested arrays and objects
/// (naming `field`); whether whitespace lies between its tokens.
///
/// # Errors
/// [`Error::InvalidParams`] on `field`.
pub(crate) fn scan(text: &str, field: &str) -> Result<bool, Error> {
    let (mut depth, mut in_string, mut escaped, mut spaces) = (0usize, false, false, false);
    for &b in text.as_bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(Error::invalid(
                        field,
                        format!("nests deeper than {MAX_DEPTH} levels"),
                    ));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b' ' | b'\t' | b'\n' | b'\r' => spaces = true,
            _ => {}
        }
    }
    Ok(spaces)
}

/// The JSON text without the whitespace between its tokens (strings and numbers kept byte
/// for byte), refused when it nests deeper than [`MAX_DEPTH`].
///
/// # Errors
/// [`Error::InvalidParams`] on `field`.
pub(crate) fn compact(raw: &RawValue, field: &str) -> Result<RawJson, Error> {
    let text = raw.get();
    if !scan(text, field)? {
        return Ok(RawJson::from_raw(raw.to_owned()));
    }
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            out.push(c);
            continue;
        }
        match c {
            ' ' | '\t' | '\n' | '\r' => {}
            '"' => {
                in_string = true;
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    RawValue::from_string(out)
        .map(RawJson::from_raw)
        .map_err(|_| Error::invalid(field, "is not JSON"))
}

/// Checks a file by URL: `http` or `https`, at most [`MAX_URL_LEN`] characters, a MIME
/// type (when given) that the agent accepts, as inline files'. a2ad never fetches it.
/// `field` is the path of the file object (`message.parts[0].file`, or the part itself
/// on 1.0); `url_key` and `mime_key` name its fields in the dialect.
///
/// # Errors
/// [`Error::InvalidParams`] naming the URL or the MIME type;
/// [`Error::UnsupportedContentType`] for a type outside `supported_types`.
pub(crate) fn file_url(
    field: &str,
    keys: (&str, &str),
    url: String,
    name: Option<String>,
    mime_type: Option<String>,
    metadata: Option<RawJson>,
    limits: &AgentLimits,
) -> Result<Part, Error> {
    let (url_key, mime_key) = keys;
    let url_field = || format!("{field}.{url_key}");
    if url.chars().count() > MAX_URL_LEN {
        return Err(Error::invalid(
            url_field(),
            format!("is longer than {MAX_URL_LEN} characters"),
        ));
    }
    match url::Url::parse(&url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
        Ok(u) => {
            return Err(Error::invalid(
                url_field(),
                format!(
                    "must be an http or https URL (not {:?}); a2ad passes it on and never fetches it",
                    u.scheme()
                ),
            ));
        }
        Err(e) => {
            return Err(Error::invalid(
                url_field(),
                format!("is not a URL ({e}); send an absolute http or https URL"),
            ));
        }
    }
    let mime_type = mime_type.filter(|m| !m.is_empty());
    if let Some(mime) = &mime_type {
        accepted_type(
            &format!("{field}.{mime_key}"),
            mime,
            &mime_essence(mime),
            limits,
        )?;
    }
    Ok(Part::Url(Box::new(FileUrl {
        url,
        name: name.filter(|n| !n.is_empty()),
        mime_type,
        metadata,
    })))
}

/// A message's own `extensions`: at most [`MAX_EXTENSIONS`] non-empty URIs of at most
/// [`MAX_URL_LEN`] characters.
///
/// # Errors
/// [`Error::InvalidParams`] on `message.extensions`.
pub(crate) fn message_extensions(uris: Vec<String>) -> Result<Extensions, Error> {
    const FIELD: &str = "message.extensions";
    if uris.len() > MAX_EXTENSIONS {
        // As `json::array` words it.
        return Err(Error::invalid(
            FIELD,
            format!("must hold at most {MAX_EXTENSIONS} elements"),
        ));
    }
    if let Some(bad) = uris
        .iter()
        .find(|u| u.is_empty() || u.chars().count() > MAX_URL_LEN)
    {
        return Err(Error::invalid(
            FIELD,
            format!(
                "holds {:?}: each must be a URI of 1 to {MAX_URL_LEN} characters",
                bad.chars().take(64).collect::<String>()
            ),
        ));
    }
    Ok(Extensions::new(uris))
}

/// A user message of these parts, within the agent's `max_message_length` (what every
/// dialect's params decoder makes of a message it has read).
///
/// # Errors
/// As [`message_length`].
pub(crate) fn user_message(
    message_id: String,
    parts: Vec<Part>,
    extensions: Extensions,
    limits: &AgentLimits,
) -> Result<Message, Error> {
    let message = Message {
        role: crate::model::Role::User,
        parts,
        message_id,
        extensions,
    };
    message_length(&message, limits)?;
    Ok(message)
}

/// Checks the total length of the text parts and the data parts' compact JSON.
///
/// # Errors
/// [`Error::InvalidParams`] on `message.parts` when over `max_message_length`.
pub(crate) fn message_length(message: &Message, limits: &AgentLimits) -> Result<(), Error> {
    let mut total = 0usize;
    let mut data = false;
    for part in &message.parts {
        let n = match part {
            Part::Text(t) => t.chars().count(),
            Part::Data(d) => {
                data = true;
                d.data.get().chars().count()
            }
            Part::File(_) | Part::Url(_) => 0,
        };
        total = total.saturating_add(n);
    }
    if total > limits.max_message_length {
        let what = if data { "text and data are" } else { "text is" };
        return Err(Error::invalid(
            "message.parts",
            format!(
                "{what} {total} characters long; this agent accepts at most {}",
                limits.max_message_length
            ),
        ));
    }
    Ok(())
}

/// True for a UUID v4 in canonical hyphenated form (version nibble 4, RFC 4122 variant).
pub(crate) fn is_uuid_v4(s: &str) -> bool {
    let b = s.as_bytes();
    // The groups' digits, the version (`4`) and variant (`8`–`b`) digits checked apart.
    b.len() == 36
        && [b[8], b[13], b[18], b[23]] == [b'-'; 4]
        && b[14] == b'4'
        && matches!(b[19], b'8' | b'9' | b'a' | b'b' | b'A' | b'B')
        && [&b[..8], &b[9..13], &b[15..18], &b[20..23], &b[24..]]
            .iter()
            .all(|group| group.iter().all(u8::is_ascii_hexdigit))
}

fn too_large(field: String, size: usize, max: u64) -> Error {
    Error::invalid(
        field,
        format!("file is {size} bytes; this agent accepts at most {max} bytes"),
    )
}

/// The size the Base64 text would decode to, without decoding it.
fn decoded_len(b64: &str) -> usize {
    let padding = b64.bytes().rev().take(2).filter(|&b| b == b'=').count();
    (b64.len() / 4 * 3).saturating_sub(padding)
}

/// A file's MIME type (`essence`: [`mime_essence`] of `mime`) is one, and one the agent
/// accepts: inline files and files by URL alike.
fn accepted_type(
    field: &str,
    mime: &str,
    essence: &str,
    limits: &AgentLimits,
) -> Result<(), Error> {
    if !is_mime_type(essence) {
        return Err(Error::invalid(
            field,
            format!("{mime:?} is not a MIME type such as \"text/plain\""),
        ));
    }
    if !type_supported(essence, &limits.supported_types) {
        return Err(Error::UnsupportedContentType {
            field: field.to_string(),
            reason: format!(
                "MIME type {essence:?} is not supported by this agent (supported: {})",
                limits.supported_types.join(", ")
            ),
        });
    }
    Ok(())
}

/// `type/subtype` lowercased, without parameters.
fn mime_essence(mime: &str) -> String {
    mime.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn is_mime_type(essence: &str) -> bool {
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    matches!(essence.split_once('/'), Some((t, s)) if token(t) && token(s))
}

fn type_supported(essence: &str, supported: &[String]) -> bool {
    supported.iter().any(|pattern| {
        let pattern = pattern.to_ascii_lowercase();
        if pattern == "*/*" {
            return true;
        }
        match pattern.strip_suffix("/*") {
            Some(prefix) => essence.split_once('/').is_some_and(|(ty, _)| ty == prefix),
            None => pattern == essence,
        }
    })
}

/// Why `content` contradicts the declared type, if it does.
fn sniff_mismatch(essence: &str, content: &[u8]) -> Option<String> {
    let signatures: &[&[u8]] = match essence {
        "image/png" => &[b"\x89PNG\r\n\x1a\n"],
        "image/jpeg" | "image/jpg" => &[b"\xff\xd8\xff"],
        "image/gif" => &[b"GIF87a", b"GIF89a"],
        "application/pdf" => &[b"%PDF-"],
        "application/zip" => &[b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08"],
        "image/webp" => {
            let ok = content.len() >= 12 && &content[..4] == b"RIFF" && &content[8..12] == b"WEBP";
            return (!ok).then(|| format!("content is not {essence} (bad signature)"));
        }
        "application/json" => {
            return serde_json::from_slice::<serde::de::IgnoredAny>(content)
                .is_err()
                .then(|| {
                    "content is not valid JSON, but the declared type is application/json"
                        .to_string()
                });
        }
        t if t.starts_with("text/") => {
            return std::str::from_utf8(content)
                .is_err()
                .then(|| format!("content is not UTF-8 text, but the declared type is {t}"));
        }
        _ => return None,
    };
    (!signatures.iter().any(|sig| content.starts_with(sig)))
        .then(|| format!("content is not {essence} (bad signature)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> AgentLimits {
        AgentLimits {
            max_file_size: 16,
            ..AgentLimits::default()
        }
    }

    fn check(mime: &str, content: &[u8]) -> Result<FileContent, Error> {
        file_part(
            "f",
            "n".into(),
            mime.into(),
            STANDARD.encode(content),
            &limits(),
        )
    }

    fn reason(r: Result<FileContent, Error>) -> (String, String) {
        match r {
            Err(Error::InvalidParams { field, reason })
            | Err(Error::UnsupportedContentType { field, reason }) => (field, reason),
            other => panic!("expected invalid params, got {other:?}"),
        }
    }

    #[test]
    fn uuid_v4_requires_version_and_variant() {
        assert!(is_uuid_v4("6f1c2a1e-3b4d-4c5e-8f70-1a2b3c4d5e6f"));
        assert!(is_uuid_v4("6F1C2A1E-3B4D-4C5E-BF70-1A2B3C4D5E6F"));
        assert!(!is_uuid_v4("6f1c2a1e-3b4d-1c5e-8f70-1a2b3c4d5e6f"), "v1");
        assert!(
            !is_uuid_v4("6f1c2a1e-3b4d-4c5e-cf70-1a2b3c4d5e6f"),
            "variant"
        );
        assert!(
            !is_uuid_v4("6f1c2a1e3b4d4c5e8f701a2b3c4d5e6f"),
            "no hyphens"
        );
        assert!(!is_uuid_v4("not-a-uuid"));
        assert!(!is_uuid_v4("6f1c2a1e-3b4d-4c5e-8f70-1a2b3c4d5e6g"));
    }

    #[test]
    fn uuid_v4_checks_every_position() {
        for _ in 0..50 {
            let id = uuid::Uuid::new_v4().to_string();
            assert!(is_uuid_v4(&id), "{id}");
            for at in 0..36 {
                let mut bytes = id.clone().into_bytes();
                bytes[at] = if matches!(at, 8 | 13 | 18 | 23) {
                    b'0'
                } else {
                    b'g'
                };
                let broken = String::from_utf8(bytes).expect("ASCII");
                assert!(!is_uuid_v4(&broken), "{broken}");
            }
        }
    }

    #[test]
    fn valid_files_pass_and_report_their_decoded_size() {
        assert_eq!(check("text/plain", b"hello").expect("ok").size, 5);
        assert_eq!(
            check("image/png", b"\x89PNG\r\n\x1a\nxx").expect("ok").size,
            10
        );
        assert!(check("image/gif", b"GIF89a...").is_ok());
        assert!(check("image/webp", b"RIFF\0\0\0\0WEBPVP8 ").is_ok());
        assert!(check("application/pdf", b"%PDF-1.7").is_ok());
        assert!(check("application/json", b"{\"a\":1}").is_ok());
        assert!(check("text/plain; charset=utf-8", b"ok").is_ok());
    }

    #[test]
    fn content_that_contradicts_its_type_is_rejected() {
        for (mime, content) in [
            ("image/png", &b"GIF89a"[..]),
            ("image/jpeg", b"hello"),
            ("image/webp", b"RIFF"),
            ("application/pdf", b"PK\x03\x04"),
            ("application/json", b"{nope"),
            ("text/plain", b"\xff\xfe"),
            ("image/png", b""),
        ] {
            let (field, _) = reason(check(mime, content));
            assert_eq!(field, "f.bytes", "{mime}");
        }
    }

    #[test]
    fn unsupported_and_malformed_types_are_rejected_on_mime_type() {
        assert_eq!(
            reason(check("application/zip", b"PK\x03\x04")).0,
            "f.mimeType"
        );
        assert_eq!(reason(check("png", b"x")).0, "f.mimeType");
        let (field, why) = reason(check("", b"x"));
        assert_eq!(field, "f.mimeType");
        assert!(why.contains("is empty") && why.contains("e.g."), "{why}");
    }

    #[test]
    fn data_url_prefix_padding_whitespace_and_size_are_rejected() {
        let l = limits();
        let r = file_part(
            "f",
            "n".into(),
            "text/plain".into(),
            "data:text/plain;base64,aGk=".into(),
            &l,
        );
        assert!(reason(r).1.contains("data:"));
        let r = file_part("f", "n".into(), "text/plain".into(), "aGk".into(), &l);
        assert!(reason(r).1.contains("padding"));
        let r = file_part("f", "n".into(), "text/plain".into(), "aG k=".into(), &l);
        assert_eq!(reason(r).0, "f.bytes");
        // Not Base64, and not ASCII: refused, never a panic on slicing.
        let r = file_part("f", "n".into(), "text/plain".into(), "ééé".into(), &l);
        assert_eq!(reason(r).0, "f.bytes");
        let r = check("text/plain", &[b'a'; 17]);
        assert!(reason(r).1.contains("at most 16"));
        assert!(check("text/plain", &[b'a'; 16]).is_ok());
    }

    #[test]
    fn wildcard_types_match_their_family_only() {
        let s = vec!["image/*".to_string(), "text/plain".to_string()];
        assert!(type_supported("image/png", &s));
        assert!(type_supported("text/plain", &s));
        assert!(!type_supported("text/html", &s));
        assert!(!type_supported("imagex/png", &s));
    }

    #[test]
    fn message_length_counts_unicode_scalar_values() {
        let l = AgentLimits {
            max_message_length: 3,
            ..AgentLimits::default()
        };
        let m = |t: &str| Message {
            role: crate::model::Role::User,
            parts: vec![Part::Text(t.into())],
            message_id: String::new(),
            extensions: Extensions::default(),
        };
        assert!(message_length(&m("ééé"), &l).is_ok());
        assert!(message_length(&m("éééé"), &l).is_err());
    }
}
