//! Lazy, bounded reading of JSON params, shared by every dialect.
//!
//! An object is read as a list of (key, raw value) pairs and an array as a list of raw
//! values, each with a cap; a value is decoded only when a dialect asks for it. So no
//! request builds a tree of the whole body before it is checked: an array over its cap is
//! refused as soon as the reader reaches the element past the cap, and a field that is
//! never asked for costs one scan. Every failure is -32602 naming the field and what is
//! wrong with it.
//!
//! The text read here was checked to be JSON once, where it came in (`serde_json` made a
//! [`RawValue`] of it): a [`Raw`] is a slice of such text, so splitting an object into its
//! members or an array into its elements only finds where each ends (strings skipped by
//! their quotes, brackets counted), without checking it again. Before this, each level
//! was parsed by `serde_json` afresh, and a message's text was read once per level above
//! it (five times).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::words::{equal, word};
use crate::error::Error;
use crate::model::Extensions;

/// Members of one object at most (params carry a handful; unknown ones are ignored).
pub(crate) const MAX_MEMBERS: usize = 1024;

/// Nesting depth of free-form JSON kept as is (`metadata`, data parts) at most.
pub(crate) use crate::validate::MAX_DEPTH;

/// A JSON value's text, known to be JSON: made from a [`RawValue`] or cut from one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Raw<'a>(&'a str);

impl<'a> From<&'a RawValue> for Raw<'a> {
    fn from(raw: &'a RawValue) -> Self {
        Raw(raw.get())
    }
}

impl<'a> From<&'a Box<RawValue>> for Raw<'a> {
    fn from(raw: &'a Box<RawValue>) -> Self {
        Raw(raw.get())
    }
}

impl<'a> From<&Raw<'a>> for Raw<'a> {
    fn from(raw: &Raw<'a>) -> Self {
        *raw
    }
}

impl<'a> Raw<'a> {
    /// The text.
    pub(crate) fn get(self) -> &'a str {
        self.0
    }

    /// An owned [`RawValue`] of the same text.
    pub(crate) fn to_owned(self) -> Box<RawValue> {
        // JSON already; checked again only here, for what is kept (metadata, data).
        RawValue::from_string(self.0.to_owned()).unwrap_or_else(|_| null())
    }

    /// An owned copy.
    pub(crate) fn to_text(self) -> Text {
        Text(self.0.into())
    }

    /// `serde_json` decoding of the text as `T`.
    ///
    /// # Errors
    /// When it is not a `T`.
    pub(crate) fn decode<T: serde::de::Deserialize<'a>>(self) -> serde_json::Result<T> {
        serde_json::from_str(self.0)
    }
}

/// JSON text, owned (a request's params).
#[derive(Clone, Debug)]
pub(crate) struct Text(Box<str>);

impl Text {
    /// The text, to read.
    pub(crate) fn raw(&self) -> Raw<'_> {
        Raw(&self.0)
    }
}

fn null() -> Box<RawValue> {
    RawValue::from_string("null".into()).unwrap_or_default()
}

/// An object read member by member.
#[derive(Debug, Default)]
pub(crate) struct Obj<'a> {
    members: Vec<(Cow<'a, str>, Raw<'a>)>,
}

/// What a raw JSON value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `{…}`
    Object,
    /// `[…]`
    Array,
    /// `"…"`
    String,
    /// A number.
    Number,
    /// `true` / `false`.
    Bool,
    /// `null`.
    Null,
}

/// The kind of a raw value (it is valid JSON, so its first byte tells).
pub(crate) fn kind<'a>(raw: impl Into<Raw<'a>>) -> Kind {
    match raw.into().0.as_bytes().first() {
        Some(b'{') => Kind::Object,
        Some(b'[') => Kind::Array,
        Some(b'"') => Kind::String,
        Some(b't' | b'f') => Kind::Bool,
        Some(b'n') => Kind::Null,
        _ => Kind::Number,
    }
}

/// A call's params as an object: absent or `null` params are an empty object.
///
/// # Errors
/// -32602 when they are something else than an object.
pub(crate) fn params(raw: Option<Raw<'_>>) -> Result<Obj<'_>, Error> {
    match raw {
        None => Ok(Obj::default()),
        Some(r) if kind(r) == Kind::Null => Ok(Obj::default()),
        Some(r) => Obj::parse(r, "params"),
    }
}

impl<'a> Obj<'a> {
    /// Reads `raw` as an object; `field` names it in errors.
    ///
    /// # Errors
    /// -32602 when it is not an object, has more than [`MAX_MEMBERS`] members, or a key
    /// is not valid Unicode text.
    pub(crate) fn parse(raw: impl Into<Raw<'a>>, field: &str) -> Result<Self, Error> {
        let raw = raw.into();
        if kind(raw) != Kind::Object {
            return Err(Error::invalid(field, "must be an object"));
        }
        // Room for the members of a request's objects (params, a message, a part) at once.
        let mut members = Vec::with_capacity(8);
        let mut scan = Scan::after_open(raw.0);
        while let Some(key) = scan.next_key() {
            if members.len() == MAX_MEMBERS {
                return Err(Error::invalid(
                    field,
                    format!("has more than {MAX_MEMBERS} members"),
                ));
            }
            let key = match key.get(1..key.len().saturating_sub(1)) {
                Some(plain) if !plain.contains('\\') => Cow::Borrowed(plain),
                _ => Cow::Owned(
                    serde_json::from_str::<String>(key)
                        .map_err(|e| invalid_json(field, &e, "an object"))?,
                ),
            };
            members.push((key, scan.next_value()));
        }
        Ok(Self { members })
    }

    /// The raw value of `key` (the last one if it repeats); `None` when absent or `null`.
    pub(crate) fn get(&self, key: &str) -> Option<Raw<'a>> {
        self.get_where(|k| k == key)
    }

    /// The raw value of the last key `is` takes; `None` when absent or `null`.
    pub(crate) fn get_where(&self, is: impl Fn(&str) -> bool) -> Option<Raw<'a>> {
        self.members
            .iter()
            .rev()
            .find(|(k, _)| is(k))
            .map(|(_, v)| *v)
            .filter(|v| kind(*v) != Kind::Null)
    }

    /// An optional string.
    ///
    /// # Errors
    /// -32602 naming `field` when present and not a valid string.
    pub(crate) fn str(&self, key: &str, field: &str) -> Result<Option<Cow<'a, str>>, Error> {
        self.get(key).map(|v| string(v, field)).transpose()
    }

    /// An optional boolean.
    ///
    /// # Errors
    /// -32602 naming `field` when present and not a boolean.
    pub(crate) fn bool(&self, key: &str, field: &str) -> Result<Option<bool>, Error> {
        self.get(key)
            .map(|v| match v.get() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(Error::invalid(field, "must be a boolean")),
            })
            .transpose()
    }

    /// An optional non-negative integer.
    ///
    /// # Errors
    /// -32602 naming `field` when present and not a non-negative integer.
    pub(crate) fn u64(&self, key: &str, field: &str) -> Result<Option<u64>, Error> {
        self.get(key)
            .map(|v| {
                serde_json::from_str::<u64>(v.get())
                    .map_err(|_| Error::invalid(field, "must be a non-negative integer"))
            })
            .transpose()
    }

    /// An optional number.
    ///
    /// # Errors
    /// -32602 naming `field` when present and not a number.
    pub(crate) fn f64(&self, key: &str, field: &str) -> Result<Option<f64>, Error> {
        self.get(key)
            .map(|v| match kind(v) {
                Kind::Number => v
                    .decode::<f64>()
                    .map_err(|_| Error::invalid(field, "must be a number")),
                _ => Err(Error::invalid(field, "must be a number")),
            })
            .transpose()
    }

    /// An optional object.
    ///
    /// # Errors
    /// -32602 naming `field` when present and not an object.
    pub(crate) fn obj(&self, key: &str, field: &str) -> Result<Option<Obj<'a>>, Error> {
        self.get(key).map(|v| Obj::parse(v, field)).transpose()
    }

    /// An optional array of at most `max` elements.
    #[cfg_attr(not(test), allow(dead_code))] // the official dialects' params use it
    ///
    /// # Errors
    /// -32602 naming `field` when present and not an array, or longer than `max`.
    pub(crate) fn array(
        &self,
        key: &str,
        field: &str,
        max: usize,
    ) -> Result<Option<Vec<Raw<'a>>>, Error> {
        self.get(key).map(|v| array(v, field, max)).transpose()
    }

    /// The members, in order (for objects of free-form keys such as `headers`).
    pub(crate) fn members(&self) -> impl Iterator<Item = (&str, Raw<'a>)> {
        self.members.iter().map(|(k, v)| (k.as_ref(), *v))
    }

    /// How many members.
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }
}

/// A string value.
///
/// # Errors
/// -32602 naming `field` when `raw` is not a string, or not valid text (a lone surrogate).
pub(crate) fn string<'a>(raw: impl Into<Raw<'a>>, field: &str) -> Result<Cow<'a, str>, Error> {
    let raw = raw.into();
    if kind(raw) != Kind::String {
        return Err(Error::invalid(field, "must be a string"));
    }
    if let Some(plain) = raw.0.get(1..raw.0.len().saturating_sub(1))
        && !plain.contains('\\')
    {
        // No escapes: the text between the quotes is the string.
        return Ok(Cow::Borrowed(plain));
    }
    let mut de = serde_json::Deserializer::from_str(raw.0);
    de.deserialize_str(CowStr)
        .map_err(|e| invalid_json(field, &e, "a string"))
}

/// An array of at most `max` elements, refused as soon as the parser passes the cap.
///
/// # Errors
/// -32602 naming `field` when `raw` is not an array or is longer than `max`.
pub(crate) fn array<'a>(
    raw: impl Into<Raw<'a>>,
    field: &str,
    max: usize,
) -> Result<Vec<Raw<'a>>, Error> {
    let raw = raw.into();
    if kind(raw) != Kind::Array {
        return Err(Error::invalid(field, "must be an array"));
    }
    elements(raw, max)
        .ok_or_else(|| Error::invalid(field, format!("must hold at most {max} elements")))
}

/// The elements of an array (`raw` is one), or `None` when there are more than `max`.
fn elements(raw: Raw<'_>, max: usize) -> Option<Vec<Raw<'_>>> {
    let mut items = Vec::with_capacity(max.min(4));
    let mut scan = Scan::after_open(raw.0);
    while let Some(item) = scan.next_element() {
        if items.len() == max {
            return None;
        }
        items.push(item);
    }
    Some(items)
}

/// A message's `extensions`: an array of URI strings (absent: none), every dialect.
///
/// # Errors
/// -32602 on `message.extensions`.
pub(crate) fn message_extensions(raw: Option<Raw<'_>>) -> Result<Extensions, Error> {
    const FIELD: &str = "message.extensions";
    let Some(raw) = raw else {
        return Ok(Extensions::default());
    };
    let uris = array(raw, FIELD, crate::validate::MAX_EXTENSIONS)?
        .into_iter()
        .map(|v| string(v, FIELD).map(Cow::into_owned))
        .collect::<Result<Vec<_>, _>>()?;
    crate::validate::message_extensions(uris)
}

/// How a message part's fields are named while the part is parsed: `message.parts[#]…`.
/// Only an error gets the real index ([`at_part`]), so a valid part formats no names.
pub(crate) const PART: &str = "message.parts[#]";

/// The name of field `k` (`""`, `".text"`, …) of the part being parsed.
pub(crate) fn part_field(k: &'static str) -> std::borrow::Cow<'static, str> {
    use std::borrow::Cow;
    match k {
        "" => Cow::Borrowed(PART),
        ".text" => Cow::Borrowed("message.parts[#].text"),
        ".type" => Cow::Borrowed("message.parts[#].type"),
        ".kind" => Cow::Borrowed("message.parts[#].kind"),
        other => Cow::Owned(format!("{PART}{other}")),
    }
}

/// An error of part `i`, its field named with the real index.
pub(crate) fn at_part(i: usize, mut e: Error) -> Error {
    if let Error::InvalidParams { field, .. } | Error::UnsupportedContentType { field, .. } = &mut e
        && let Some(rest) = field.strip_prefix(PART)
    {
        *field = format!("message.parts[{i}]{rest}");
    }
    e
}

/// `message.parts`: a non-empty array of at most `max` parts (refused as soon as the parser
/// reaches the part past the cap), for every dialect.
///
/// # Errors
/// -32602 on `message.parts`.
pub(crate) fn message_parts(raw: Option<Raw<'_>>, max: usize) -> Result<Vec<Raw<'_>>, Error> {
    let field = "message.parts";
    let Some(raw) = raw else {
        return Err(Error::invalid(field, "is required"));
    };
    if kind(raw) != Kind::Array {
        return Err(Error::invalid(field, "must be an array"));
    }
    let parts = elements(raw, max).ok_or_else(|| too_many_parts(max))?;
    if parts.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    Ok(parts)
}

/// `message.parts` over the agent's `max_parts`.
pub(crate) fn too_many_parts(max: usize) -> Error {
    Error::invalid(
        "message.parts",
        format!("holds more than {max} parts; this agent accepts at most {max} per message"),
    )
}

/// Why [`seq`] failed.
#[derive(Debug)]
pub(crate) enum SeqError {
    /// More elements than allowed.
    TooMany,
    /// Not a JSON array.
    Json(serde_json::Error),
}

/// The elements of the JSON array `text`, refused as soon as there are more than `max`.
///
/// # Errors
/// [`SeqError`].
pub(crate) fn seq(text: &str, max: usize) -> Result<Vec<&RawValue>, SeqError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let items = de.deserialize_seq(Bounded { max }).map_err(|e| {
        if e.to_string().starts_with(TOO_MANY) {
            SeqError::TooMany
        } else {
            SeqError::Json(e)
        }
    })?;
    de.end().map_err(SeqError::Json)?;
    Ok(items)
}

/// Checks that free-form JSON kept as is nests no deeper than [`MAX_DEPTH`].
///
/// # Errors
/// -32602 naming `field`.
/// [`crate::validate::data_part`] on values read here.
///
/// # Errors
/// As that.
pub(crate) fn data_part(
    field: &str,
    data: Raw<'_>,
    media_type: Option<String>,
    metadata: Option<Raw<'_>>,
) -> Result<crate::model::Part, Error> {
    let metadata = metadata.map(Raw::to_owned);
    crate::validate::data_part(field, &data.to_owned(), media_type, metadata.as_deref())
}

pub(crate) fn check_depth<'a>(raw: impl Into<Raw<'a>>, field: &str) -> Result<(), Error> {
    crate::validate::scan(raw.into().0, field).map(drop)
}

/// -32602 for a value that did not decode: says what is wrong in words, without the
/// parser's line and column (they count from the value, not the body).
fn invalid_json(field: &str, e: &serde_json::Error, expected: &str) -> Error {
    let text = e.to_string();
    let detail = text.split(" at line ").next().unwrap_or(&text);
    let reason = if detail.contains("surrogate") || detail.contains("hex escape") {
        "is not valid Unicode text: it holds a lone or broken UTF-16 surrogate escape (\\ud800–\\udfff)".to_string()
    } else if detail.contains("recursion limit") {
        "nests too deeply".to_string()
    } else if detail.starts_with(TOO_MANY) {
        detail.trim_start_matches(TOO_MANY).trim().to_string()
    } else {
        format!("must be {expected} ({detail})")
    };
    Error::invalid(field, reason)
}

/// Marks the custom "too many" errors of the visitors below.
const TOO_MANY: &str = "a2ad:";

struct CowStr;

impl<'de> Visitor<'de> for CowStr {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

struct Bounded {
    max: usize,
}

impl<'de> Visitor<'de> for Bounded {
    type Value = Vec<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(self.max.min(16));
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            if items.len() == self.max {
                return Err(de::Error::custom(TOO_MANY));
            }
            items.push(item);
        }
        Ok(items)
    }
}

/// Finds where the members of an object, or the elements of an array, begin and end in
/// text that is JSON (`Raw`): one pass, strings skipped by their quotes, brackets counted.
/// On text that is not JSON it cannot panic; it stops (or cuts a value short) instead.
struct Scan<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scan<'a> {
    /// Inside the object or array `text` is, after its opening bracket.
    fn after_open(text: &'a str) -> Self {
        Scan { text, at: 1 }
    }

    fn byte(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while matches!(self.byte(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// Past a separating comma; `false` at the closing bracket (or the end).
    fn more(&mut self) -> bool {
        self.skip_space();
        if self.byte() == Some(b',') {
            self.at += 1;
            self.skip_space();
        }
        !matches!(self.byte(), Some(b'}' | b']') | None)
    }

    /// The next member's key, quotes included, and past its colon.
    fn next_key(&mut self) -> Option<&'a str> {
        if !self.more() {
            return None;
        }
        let key = self.value();
        self.skip_space();
        if self.byte() == Some(b':') {
            self.at += 1;
        }
        Some(key)
    }

    /// The value that follows (a member's, after [`Scan::next_key`]).
    fn next_value(&mut self) -> Raw<'a> {
        self.skip_space();
        Raw(self.value())
    }

    /// The next element of an array.
    fn next_element(&mut self) -> Option<Raw<'a>> {
        self.more().then(|| Raw(self.value()))
    }

    /// The value that starts here, and past it.
    fn value(&mut self) -> &'a str {
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut depth = 0usize;
        while let Some(&b) = bytes.get(self.at) {
            match b {
                b'"' => {
                    self.skip_string();
                    if depth == 0 {
                        break;
                    }
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth == 0 => break,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        self.at += 1;
                        break;
                    }
                }
                b',' | b' ' | b'\t' | b'\n' | b'\r' if depth == 0 => break,
                _ => {}
            }
            self.at += 1;
        }
        self.text.get(start..self.at).unwrap_or_default()
    }

    /// Past the string that starts here (at its quote).
    fn skip_string(&mut self) {
        let bytes = self.text.as_bytes();
        self.at += 1;
        while let Some(i) = bytes.get(self.at..).and_then(quote_or_backslash) {
            self.at += i;
            if bytes[self.at] == b'"' {
                self.at += 1;
                return;
            }
            // A backslash and the character it escapes.
            self.at += 2;
        }
        self.at = bytes.len();
    }
}

/// Where the first quote or backslash of `bytes` is, eight bytes at a time: most strings
/// are keys and ids of a few dozen bytes, which a vector search costs more to set up for.
fn quote_or_backslash(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let w = word(chunk);
        let found = equal(w, b'"') | equal(w, b'\\');
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    bytes[at..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\')
        .map(|p| at + p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> &RawValue {
        serde_json::from_str(s).expect("valid JSON")
    }

    fn reason(e: Error) -> (String, String) {
        match e {
            Error::InvalidParams { field, reason } => (field, reason),
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn members_are_read_lazily_and_null_is_absent() {
        let r = raw(r#"{"a":"x","b":null,"c":{"d":[1,2]},"a":"y"}"#);
        let o = Obj::parse(r, "params").expect("object");
        assert_eq!(o.str("a", "a").expect("ok").as_deref(), Some("y"));
        assert!(o.get("b").is_none());
        let c = o.obj("c", "c").expect("ok").expect("present");
        assert_eq!(
            c.array("d", "c.d", 2).expect("ok").map(|v| v.len()),
            Some(2)
        );
        assert_eq!(
            reason(c.array("d", "c.d", 1).unwrap_err()).1,
            "must hold at most 1 elements"
        );
    }

    #[test]
    fn the_reason_names_what_is_wrong() {
        let o = Obj::parse(raw(r#"{"t":"\ud800","n":5,"s":"x"}"#), "p").expect("object");
        let (field, why) = reason(o.str("t", "p.t").unwrap_err());
        assert_eq!(field, "p.t");
        assert!(why.contains("surrogate"), "{why}");
        assert_eq!(reason(o.str("n", "p.n").unwrap_err()).1, "must be a string");
        assert_eq!(
            reason(o.bool("s", "p.s").unwrap_err()).1,
            "must be a boolean"
        );
        assert_eq!(
            reason(Obj::parse(raw("[1]"), "params").unwrap_err()).1,
            "must be an object"
        );
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        let (field, why) = reason(check_depth(raw(&deep), "metadata").unwrap_err());
        assert_eq!(field, "metadata");
        assert!(why.contains("deeper than 64"), "{why}");
        assert!(
            check_depth(raw(r#"{"a":"[[[[[[[[[["}"#), "m").is_ok(),
            "brackets in strings"
        );
    }

    #[test]
    fn objects_with_too_many_members_are_refused() {
        let body = format!(
            "{{{}}}",
            (0..=MAX_MEMBERS)
                .map(|i| format!("\"k{i}\":0"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let (_, why) = reason(Obj::parse(raw(&body), "params").unwrap_err());
        assert!(why.contains("more than 1024 members"), "{why}");
    }

    /// Any JSON value, up to a few levels deep, with strings that need escapes.
    fn any_json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "[a-z\\\\\"\\[\\]{},: \\u{1}\\u{e9}\\u{1f980}]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                proptest::collection::vec(("[a-z\\\\\"]{0,4}", inner), 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn the_first_quote_or_backslash_is_found_wherever_it_is() {
        for len in 0..40 {
            let clean = vec![b'y'; len];
            assert_eq!(quote_or_backslash(&clean), None);
            for at in 0..len {
                for mark in [b'"', b'\\'] {
                    let mut b = clean.clone();
                    b[at] = mark;
                    // Another after it changes nothing; bytes next to the marks' values
                    // are no marks.
                    if at + 3 < len {
                        b[at + 3] = b'"';
                    }
                    assert_eq!(quote_or_backslash(&b), Some(at), "{mark} at {at} of {len}");
                }
                let mut b = clean.clone();
                b[at] = if at % 2 == 0 { b'"' + 1 } else { b'\\' - 1 };
                b[0] = 0x80 | b'"';
                assert_eq!(quote_or_backslash(&b), None, "{at} of {len}");
            }
        }
    }

    #[test]
    fn strings_with_escapes_at_every_place_are_skipped_whole() {
        // An escaped quote or backslash at each place of strings of every short length, in
        // keys and in values.
        for len in 0..40 {
            for at in 0..=len {
                for escape in [r#"\""#, r"\\", r"\n", r"\u0022"] {
                    let mut s = "y".repeat(len);
                    s.insert_str(at, escape);
                    let text = format!(r#"{{"{s}":"{s}","after":["{s}",1]}}"#);
                    let map: std::collections::BTreeMap<String, &RawValue> =
                        serde_json::from_str(&text).expect("map");
                    let ours = Obj::parse(raw(&text), "p").expect("object");
                    assert_eq!(ours.len(), 2, "{text}");
                    for (k, v) in ours.members() {
                        assert_eq!(Some(v.get()), map.get(k).map(|r| r.get()), "{text}");
                    }
                }
            }
        }
    }

    proptest::proptest! {
        /// Members and elements are cut exactly where `serde_json` cuts them, compact or
        /// pretty-printed.
        #[test]
        fn members_and_elements_are_cut_as_serde_json_cuts_them(v in any_json(), pretty: bool) {
            let text = if pretty {
                serde_json::to_string_pretty(&v).expect("json")
            } else {
                serde_json::to_string(&v).expect("json")
            };
            let r = raw(&text);
            match kind(r) {
                Kind::Object => {
                    let map: std::collections::BTreeMap<String, &RawValue> =
                        serde_json::from_str(&text).expect("map");
                    let ours = Obj::parse(r, "p").expect("object");
                    proptest::prop_assert_eq!(ours.len(), map.len());
                    for (k, v) in ours.members() {
                        proptest::prop_assert_eq!(Some(v.get()), map.get(k).map(|r| r.get()));
                    }
                }
                Kind::Array => {
                    let theirs: Vec<&RawValue> = serde_json::from_str(&text).expect("array");
                    let ours = array(r, "p", usize::MAX).expect("array");
                    proptest::prop_assert_eq!(
                        ours.iter().map(|v| v.get()).collect::<Vec<_>>(),
                        theirs.iter().map(|v| v.get()).collect::<Vec<_>>()
                    );
                }
                Kind::String => {
                    let theirs: String = serde_json::from_str(&text).expect("string");
                    proptest::prop_assert_eq!(string(r, "p").expect("string"), theirs);
                }
                _ => {}
            }
        }
    }
}
