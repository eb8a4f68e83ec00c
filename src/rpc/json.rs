//! Lazy, bounded reading of JSON params, shared by every dialect.
//!
//! An object is read as a list of (key, raw value) pairs and an array as a list of raw
//! values, each with a cap; a value is decoded only when a dialect asks for it. So no
//! request builds a tree of the whole body before it is checked: an array over its cap is
//! refused as soon as the parser reaches the element past the cap, and a field that is
//! never asked for costs one scan. Every failure is -32602 naming the field and what is
//! wrong with it.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::Error;
use crate::model::Extensions;

/// Members of one object at most (params carry a handful; unknown ones are ignored).
pub(crate) const MAX_MEMBERS: usize = 1024;

/// Nesting depth of free-form JSON kept as is (`metadata`, data parts) at most.
pub(crate) use crate::validate::MAX_DEPTH;

/// An object read member by member.
#[derive(Debug, Default)]
pub(crate) struct Obj<'a> {
    members: Vec<(Cow<'a, str>, &'a RawValue)>,
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
pub(crate) fn kind(raw: &RawValue) -> Kind {
    match raw.get().as_bytes().first() {
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
pub(crate) fn params(raw: Option<&RawValue>) -> Result<Obj<'_>, Error> {
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
    /// -32602 when it is not an object or has more than [`MAX_MEMBERS`] members.
    pub(crate) fn parse(raw: &'a RawValue, field: &str) -> Result<Self, Error> {
        if kind(raw) != Kind::Object {
            return Err(Error::invalid(field, "must be an object"));
        }
        let mut de = serde_json::Deserializer::from_str(raw.get());
        de.deserialize_map(ObjVisitor)
            .map_err(|e| invalid_json(field, &e, "an object"))
    }

    /// The raw value of `key` (the last one if it repeats); `None` when absent or `null`.
    pub(crate) fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.members
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
            .filter(|v| kind(v) != Kind::Null)
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
                Kind::Number => serde_json::from_str::<f64>(v.get())
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
    ) -> Result<Option<Vec<&'a RawValue>>, Error> {
        self.get(key).map(|v| array(v, field, max)).transpose()
    }

    /// The members, in order (for objects of free-form keys such as `headers`).
    pub(crate) fn members(&self) -> impl Iterator<Item = (&str, &'a RawValue)> {
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
pub(crate) fn string<'a>(raw: &'a RawValue, field: &str) -> Result<Cow<'a, str>, Error> {
    if kind(raw) != Kind::String {
        return Err(Error::invalid(field, "must be a string"));
    }
    let mut de = serde_json::Deserializer::from_str(raw.get());
    de.deserialize_str(CowStr)
        .map_err(|e| invalid_json(field, &e, "a string"))
}

/// An array of at most `max` elements, refused as soon as the parser passes the cap.
///
/// # Errors
/// -32602 naming `field` when `raw` is not an array or is longer than `max`.
pub(crate) fn array<'a>(
    raw: &'a RawValue,
    field: &str,
    max: usize,
) -> Result<Vec<&'a RawValue>, Error> {
    if kind(raw) != Kind::Array {
        return Err(Error::invalid(field, "must be an array"));
    }
    seq(raw.get(), max).map_err(|e| match e {
        SeqError::TooMany => Error::invalid(field, format!("must hold at most {max} elements")),
        SeqError::Json(e) => invalid_json(field, &e, "an array"),
    })
}

/// A message's `extensions`: an array of URI strings (absent: none), every dialect.
///
/// # Errors
/// -32602 on `message.extensions`.
pub(crate) fn message_extensions(raw: Option<&RawValue>) -> Result<Extensions, Error> {
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
pub(crate) fn message_parts(raw: Option<&RawValue>, max: usize) -> Result<Vec<&RawValue>, Error> {
    let field = "message.parts";
    let Some(raw) = raw else {
        return Err(Error::invalid(field, "is required"));
    };
    if kind(raw) != Kind::Array {
        return Err(Error::invalid(field, "must be an array"));
    }
    let parts = seq(raw.get(), max).map_err(|e| match e {
        SeqError::TooMany => too_many_parts(max),
        SeqError::Json(e) => invalid_json(field, &e, "an array"),
    })?;
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
pub(crate) fn check_depth(raw: &RawValue, field: &str) -> Result<(), Error> {
    crate::validate::scan(raw.get(), field).map(drop)
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

struct ObjVisitor;

impl<'de> Visitor<'de> for ObjVisitor {
    type Value = Obj<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Obj<'de>, A::Error> {
        let mut members = Vec::new();
        while let Some(key) = map.next_key_seed(CowKey)? {
            if members.len() == MAX_MEMBERS {
                return Err(de::Error::custom(format_args!(
                    "{TOO_MANY} has more than {MAX_MEMBERS} members"
                )));
            }
            let value: &'de RawValue = map.next_value()?;
            members.push((key, value));
        }
        Ok(Obj { members })
    }
}

struct CowKey;

impl<'de> de::DeserializeSeed<'de> for CowKey {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(CowStr)
    }
}

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
}
