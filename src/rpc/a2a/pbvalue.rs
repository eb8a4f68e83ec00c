//! `google.protobuf.Value` as the gRPC binding keeps it: the JSON text it stands for.
//!
//! A data part (`Part.data`) is the one `Value` of `lf.a2a.v1`; `src/build.rs` maps the
//! type here instead of to `pbjson_types::Value`. Why: prost decodes nested messages
//! under a fixed recursion limit of 100, and a `Value` spends two or three message levels
//! per JSON level (`Value` → `Struct` → map entry → `Value`), so prost would refuse a data
//! part well short of the 64 JSON levels every other binding accepts
//! (docs/PROTOCOL.md §12). This type reads the `Value`'s bytes itself, straight into
//! compact JSON text, under its own bound of 64 (`MAX_DEPTH`) JSON levels (the value itself
//! is level 1): a deeper one is kept as [`JsonValue::too_deep`], and the request decoder
//! refuses it with the JSON bindings' words. Object members keep their wire order (a
//! repeated key keeps its last value). A number is a double on this wire: `2` comes back
//! as `2.0`; NaN and the infinities, which JSON lacks, read as `null`.

use std::fmt::Write as _;

use prost::DecodeError;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{
    DecodeContext, WireType, check_wire_type, decode_key, encode_key, encode_varint,
    encoded_len_varint, skip_field,
};
use serde_json::value::RawValue;

use crate::rpc::json::MAX_DEPTH;

/// A `google.protobuf.Value`, kept as compact JSON text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JsonValue {
    /// The JSON text; empty for a `Value` with no kind set (`null`).
    json: String,
    /// It nests deeper than 64 (`MAX_DEPTH`) levels: `json` is empty.
    too_deep: bool,
}

impl JsonValue {
    /// The value of this JSON text (what a client or `pbout` writes).
    pub fn from_json(json: &str) -> Self {
        Self {
            json: json.to_string(),
            too_deep: false,
        }
    }

    /// The JSON text (`null` for a `Value` with no kind).
    pub fn json(&self) -> &str {
        if self.json.is_empty() {
            "null"
        } else {
            &self.json
        }
    }

    /// It nested deeper than 64 (`MAX_DEPTH`) levels and was not kept.
    pub fn too_deep(&self) -> bool {
        self.too_deep
    }
}

impl prost::Message for JsonValue {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        let mut body = Vec::new();
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(self.json()) {
            value_body(&v, &mut body);
        }
        buf.put_slice(&body);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let mut out = String::new();
        // A oneof: the last kind on the wire is the value.
        match read_kind(tag, wire_type, buf, 1, &mut out) {
            Ok(true) => {
                self.json = out;
                self.too_deep = false;
            }
            Ok(false) => skip_field(wire_type, tag, buf, ctx)?,
            Err(Read::TooDeep) => {
                self.json.clear();
                self.too_deep = true;
            }
            Err(Read::Bad(e)) => return Err(e),
        }
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        let mut body = Vec::new();
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(self.json()) {
            value_body(&v, &mut body);
        }
        body.len()
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// ProtoJSON: the JSON the value stands for. One that was too deep to keep is written as
/// empty arrays nested one level past the bound, so a JSON reader refuses it as the
/// protobuf reader did.
impl serde::Serialize for JsonValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let json = if self.too_deep {
            format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1))
        } else {
            self.json().to_string()
        };
        match RawValue::from_string(json) {
            Ok(raw) => raw.serialize(s),
            Err(_) => s.serialize_unit(),
        }
    }
}

/// ProtoJSON in: the value as the protobuf wire would carry it (numbers as doubles), so a
/// message read from JSON equals the one read from its bytes.
impl<'de> serde::Deserialize<'de> for JsonValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use prost::Message as _;
        let v = Self::from_json(&serde_json::Value::deserialize(d)?.to_string());
        let read = Self::decode(&v.encode_to_vec()[..]).map_err(serde::de::Error::custom)?;
        // One too deep to read is sent as it is: the reader refuses it.
        Ok(if read.too_deep { v } else { read })
    }
}

enum Read {
    TooDeep,
    Bad(DecodeError),
}

impl From<DecodeError> for Read {
    fn from(e: DecodeError) -> Self {
        Self::Bad(e)
    }
}

/// One field of a `Value` at JSON level `depth`, written to `out`: `Ok(false)` for a field
/// a `Value` does not have (skipped by the caller).
fn read_kind(
    tag: u32,
    wire_type: WireType,
    buf: &mut impl Buf,
    depth: usize,
    out: &mut String,
) -> Result<bool, Read> {
    // prost's own field decoders: they check the wire type, lengths and UTF-8.
    let cx = DecodeContext::default;
    match tag {
        1 => {
            let mut null = 0i32;
            prost::encoding::int32::merge(wire_type, &mut null, buf, cx())?;
            out.push_str("null");
        }
        2 => {
            let mut n = 0f64;
            prost::encoding::double::merge(wire_type, &mut n, buf, cx())?;
            number(n, out);
        }
        3 => {
            let mut s = String::new();
            prost::encoding::string::merge(wire_type, &mut s, buf, cx())?;
            // Writing JSON to a String cannot fail.
            let _ = serde_json::to_string(&s).map(|q| out.push_str(&q));
        }
        4 => {
            let mut b = false;
            prost::encoding::bool::merge(wire_type, &mut b, buf, cx())?;
            out.push_str(if b { "true" } else { "false" });
        }
        5 | 6 => {
            check_wire_type(WireType::LengthDelimited, wire_type)?;
            if depth > MAX_DEPTH {
                return Err(Read::TooDeep);
            }
            let bytes = delimited(buf)?;
            if tag == 5 {
                object(&bytes, depth, out)?;
            } else {
                list(&bytes, depth, out)?;
            }
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// A length-delimited field's bytes.
fn delimited(buf: &mut impl Buf) -> Result<Vec<u8>, Read> {
    let mut bytes = Vec::new();
    prost::encoding::bytes::merge(
        WireType::LengthDelimited,
        &mut bytes,
        buf,
        DecodeContext::default(),
    )?;
    Ok(bytes)
}

/// A `Value` message's body at level `depth`.
fn value(mut buf: &[u8], depth: usize, out: &mut String) -> Result<(), Read> {
    let mut last = String::new();
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        let mut kind = String::new();
        if read_kind(tag, wire_type, &mut buf, depth, &mut kind)? {
            last = kind;
        } else {
            skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
        }
    }
    out.push_str(if last.is_empty() { "null" } else { &last });
    Ok(())
}

/// A `Struct`'s body (its members are JSON level `depth`).
fn object(mut buf: &[u8], depth: usize, out: &mut String) -> Result<(), Read> {
    let mut members: Vec<(String, String)> = Vec::new();
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        if tag != 1 || wire_type != WireType::LengthDelimited {
            skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
            continue;
        }
        let mut entry = &delimited(&mut buf)?[..];
        let (mut key, mut val) = (String::new(), String::from("null"));
        while entry.has_remaining() {
            let (tag, wire_type) = decode_key(&mut entry)?;
            match (tag, wire_type) {
                (1, _) => {
                    prost::encoding::string::merge(
                        wire_type,
                        &mut key,
                        &mut entry,
                        DecodeContext::default(),
                    )?;
                }
                (2, WireType::LengthDelimited) => {
                    val.clear();
                    value(&delimited(&mut entry)?, depth + 1, &mut val)?;
                }
                _ => skip_field(wire_type, tag, &mut entry, DecodeContext::default())?,
            }
        }
        match members.iter_mut().find(|(k, _)| *k == key) {
            Some(m) => m.1 = val,
            None => members.push((key, val)),
        }
    }
    out.push('{');
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = serde_json::to_string(k).map(|q| out.push_str(&q));
        out.push(':');
        out.push_str(v);
    }
    out.push('}');
    Ok(())
}

/// A `ListValue`'s body (its elements are JSON level `depth`).
fn list(mut buf: &[u8], depth: usize, out: &mut String) -> Result<(), Read> {
    out.push('[');
    let mut first = true;
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        if tag != 1 || wire_type != WireType::LengthDelimited {
            skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        value(&delimited(&mut buf)?, depth + 1, out)?;
    }
    out.push(']');
    Ok(())
}

/// A double as JSON: as serde_json writes an `f64` (`2.0`), `null` for what JSON lacks.
fn number(n: f64, out: &mut String) {
    if n.is_finite() {
        let _ = write!(out, "{}", serde_json::Value::from(n));
    } else {
        out.push_str("null");
    }
}

/// The body of the `Value` message that stands for `v`.
fn value_body(v: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value as J;
    match v {
        J::Null => {
            encode_key(1, WireType::Varint, out);
            encode_varint(0, out);
        }
        J::Number(n) => {
            encode_key(2, WireType::SixtyFourBit, out);
            out.put_f64_le(n.as_f64().unwrap_or(0.0));
        }
        J::String(s) => delimited_field(3, s.as_bytes(), out),
        J::Bool(b) => {
            encode_key(4, WireType::Varint, out);
            encode_varint(u64::from(*b), out);
        }
        J::Object(members) => {
            let mut body = Vec::new();
            for (k, v) in members {
                let mut entry = Vec::new();
                delimited_field(1, k.as_bytes(), &mut entry);
                let mut val = Vec::new();
                value_body(v, &mut val);
                delimited_field(2, &val, &mut entry);
                delimited_field(1, &entry, &mut body);
            }
            delimited_field(5, &body, out);
        }
        J::Array(items) => {
            let mut body = Vec::new();
            for v in items {
                let mut val = Vec::new();
                value_body(v, &mut val);
                delimited_field(1, &val, &mut body);
            }
            delimited_field(6, &body, out);
        }
    }
}

fn delimited_field(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    out.reserve(encoded_len_varint(bytes.len() as u64) + bytes.len());
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    fn round_trip(json: &str) -> JsonValue {
        let bytes = JsonValue::from_json(json).encode_to_vec();
        JsonValue::decode(&bytes[..]).expect("decodes")
    }

    #[test]
    fn json_goes_through_the_protobuf_value_and_back() {
        for (json, back) in [
            (
                r#"{"a":[1,"x",null,true,{"b":{}}],"c":2.5}"#,
                Some(r#"{"a":[1.0,"x",null,true,{"b":{}}],"c":2.5}"#),
            ),
            ("2", Some("2.0")),
            (r#""é\"\n""#, None),
            ("[]", None),
            ("null", None),
        ] {
            assert_eq!(round_trip(json).json(), back.unwrap_or(json), "{json}");
        }
    }

    #[test]
    fn it_reads_what_pbjson_types_writes_and_pbjson_types_reads_what_it_writes() {
        let json = r#"{"k":[1.5,"s",false,null,{"z":[]}]}"#;
        let theirs: pbjson_types::Value = serde_json::from_str(json).expect("json");
        let ours = JsonValue::decode(&theirs.encode_to_vec()[..]).expect("decodes");
        assert_eq!(ours.json(), json);
        let back = pbjson_types::Value::decode(&JsonValue::from_json(json).encode_to_vec()[..])
            .expect("decodes");
        assert_eq!(serde_json::to_string(&back).expect("json"), json);
    }

    #[test]
    fn sixty_four_levels_are_kept_and_sixty_five_are_too_deep() {
        let deep = |n: usize| format!("{}1.0{}", "[".repeat(n), "]".repeat(n));
        let kept = round_trip(&deep(MAX_DEPTH));
        assert!(!kept.too_deep());
        assert_eq!(kept.json(), deep(MAX_DEPTH));
        let objects =
            (0..MAX_DEPTH).fold("1.0".to_string(), |inner, _| format!(r#"{{"a":{inner}}}"#));
        assert_eq!(round_trip(&objects).json(), objects);
        let refused = round_trip(&deep(MAX_DEPTH + 1));
        assert!(refused.too_deep());
        // Far deeper than prost's own limit: bounded here, never a stack overflow.
        let mut bytes = Vec::new();
        for _ in 0..2_000 {
            let mut outer = Vec::new();
            delimited_field(1, &bytes, &mut outer);
            let mut v = Vec::new();
            delimited_field(6, &outer, &mut v);
            bytes = v;
        }
        let _ = JsonValue::decode(&bytes[..]);
    }

    #[test]
    fn damaged_bytes_are_an_error_never_a_panic() {
        let good = JsonValue::from_json(r#"{"a":[1,"b"]}"#).encode_to_vec();
        for cut in 0..good.len() {
            let _ = JsonValue::decode(&good[..cut]);
        }
        for at in 0..good.len() {
            for b in [0u8, 0xff, 0x80, 0x0a] {
                let mut bad = good.clone();
                bad[at] = b;
                let _ = JsonValue::decode(&bad[..]);
            }
        }
    }
}
