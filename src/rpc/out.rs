//! JSON out: a serde [`Serializer`] that writes exactly the bytes of `serde_json`'s compact
//! one, with strings checked eight bytes at a time.
//!
//! Every reply, event and webhook body is mostly strings that need no escaping (ids,
//! timestamps, state names, text); `serde_json` looks each byte up in its escape table,
//! which made strings ~9k of a `message/send`'s instructions. Here a word of eight bytes is
//! tested at once for a quote, a backslash or a control character, and copied whole when
//! it has none. Everything else — numbers, maps, sequences, `serde_json`'s own `Value` and
//! `RawValue` (written verbatim) — comes out as `serde_json` writes it; the tests hold the
//! two to the same bytes.

use super::words::{below, equal, word};
use serde::Serialize;
use serde::ser::{self, Impossible, Serializer};

/// `serde_json`'s error type, so that callers keep theirs.
pub(crate) type Error = serde_json::Error;

/// The name under which `serde_json`'s `RawValue` serializes itself (a struct of one field
/// of that name, whose value is the raw text): written verbatim, as `serde_json` does.
const RAW_VALUE: &str = "$serde_json::private::RawValue";

/// The name a renderer gives the objects it writes as structs (`serialize_struct` and
/// `serialize_field`, not a map's entries): their keys are the program's own literals, so
/// this writer copies them without the escape check a map's keys get. The length given
/// with it must not be 0 when fields follow: `serde_json` closes an object of no fields
/// at once.
pub(crate) const OBJECT: &str = "object";

/// `value` as compact JSON.
///
/// # Errors
/// When `value`'s `Serialize` fails, or a map key is not a string, number or boolean.
pub(crate) fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(256);
    write(&mut out, value)?;
    Ok(out)
}

/// JSON text already written (by [`to_vec`]), written again as it is: serialized the way
/// `serde_json`'s `RawValue` serializes itself, so `serde_json`'s writer and this one
/// both copy it verbatim. For a value a reply holds twice (a completed task's reply is its
/// `status.message` and the last of its `history`).
pub(crate) struct Verbatim<'a>(pub(crate) &'a str);

impl Serialize for Verbatim<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut raw = s.serialize_struct(RAW_VALUE, 1)?;
        raw.serialize_field(RAW_VALUE, self.0)?;
        raw.end()
    }
}

/// A completed task's reply, written once: its `status.message` when that is the last of
/// the `history` shown (the same `Arc`, as the task actor leaves it), rendered by `render`;
/// the caller writes it in both places as [`Verbatim`].
pub(crate) fn reply_written_once<'a, T: Serialize>(
    status_message: Option<&'a std::sync::Arc<crate::model::Message>>,
    history: &[std::sync::Arc<crate::model::Message>],
    render: impl FnOnce(&'a crate::model::Message) -> T,
) -> Option<String> {
    let m =
        status_message.filter(|m| history.last().is_some_and(|h| std::sync::Arc::ptr_eq(h, m)))?;
    String::from_utf8(to_vec(&render(m)).ok()?).ok()
}

/// Appends `value` as compact JSON to `out`.
///
/// # Errors
/// As [`to_vec`]; what was written before the failure stays in `out`.
pub(crate) fn write<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> Result<(), Error> {
    value.serialize(&mut Writer { out })
}

/// Appends `s` as a JSON string.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    if any_escaped(bytes) {
        write_escaped(out, bytes);
    } else {
        // The usual case (keys, ids, timestamps, most text): copied whole.
        out.extend_from_slice(bytes);
    }
    out.push(b'"');
}

/// Appends `rest`, escaping what JSON escapes.
fn write_escaped(out: &mut Vec<u8>, mut rest: &[u8]) {
    while let Some(at) = first_escaped(rest) {
        out.extend_from_slice(&rest[..at]);
        let byte = rest[at];
        match byte {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let (high, low) = (HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 0xf)]);
                out.extend_from_slice(&[b'\\', b'u', b'0', b'0', high, low]);
            }
        }
        rest = &rest[at + 1..];
    }
    out.extend_from_slice(rest);
}

/// Whether any byte of `bytes` is one JSON escapes, eight at a time: the last few read as
/// the word that ends with them (overlapping the one before), and a string of four to seven
/// bytes as its first four and last four — no byte-by-byte tail.
fn any_escaped(bytes: &[u8]) -> bool {
    let n = bytes.len();
    if n >= 8 {
        let mut words = bytes.chunks_exact(8);
        if words.by_ref().any(|w| needs_escape(word(w))) {
            return true;
        }
        !words.remainder().is_empty() && needs_escape(word(&bytes[n - 8..]))
    } else if n >= 4 {
        let (mut low, mut high) = ([0; 4], [0; 4]);
        low.copy_from_slice(&bytes[..4]);
        high.copy_from_slice(&bytes[n - 4..]);
        needs_escape(u64::from(u32::from_le_bytes(low)) | u64::from(u32::from_le_bytes(high)) << 32)
    } else {
        bytes.iter().any(|&b| ESCAPED[usize::from(b)])
    }
}

/// Where the first byte of `bytes` that JSON escapes is: eight bytes at a time, then the
/// last few one by one.
fn first_escaped(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    for w in bytes.chunks_exact(8) {
        if needs_escape(word(w)) {
            break;
        }
        at += 8;
    }
    bytes[at..]
        .iter()
        .position(|&b| ESCAPED[usize::from(b)])
        .map(|p| at + p)
}

/// The bytes JSON escapes in a string: controls, the quote, the backslash.
static ESCAPED: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// Whether any of the eight bytes of `w` is below 0x20, a quote or a backslash.
const fn needs_escape(w: u64) -> bool {
    below(w, 0x20) | equal(w, b'"') | equal(w, b'\\') != 0
}

/// The integer methods of a serializer, each `$body` on the value.
macro_rules! integers {
    (|$w:ident: Self, $v:ident| $body:expr) => {
        integers!(@ $w $v $body; serialize_i8(i8), serialize_i16(i16), serialize_i32(i32),
            serialize_i64(i64), serialize_i128(i128), serialize_u8(u8), serialize_u16(u16),
            serialize_u32(u32), serialize_u64(u64), serialize_u128(u128));
    };
    (@ $w:ident $v:ident $body:expr; $($method:ident($t:ty)),*) => {
        $(fn $method(self, $v: $t) -> Result<(), Error> {
            let $w = self;
            $body
        })*
    };
}

/// Generates the methods of a serializer that refuses every value but those it defines.
macro_rules! refuse {
    ($err:expr; $($method:ident($($arg:ty),*)),* $(,)?) => {
        $(fn $method(self, $(_: $arg),*) -> Result<(), Error> { Err($err) })*
    };
}

/// The serializer: appends to a vector.
struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    fn int(&mut self, v: impl itoa::Integer) {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
    }

    /// What `serde_json` writes for `value` (floats, bytes: rare here, and their exact
    /// digits are `serde_json`'s own).
    fn like_serde_json<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        value.serialize(&mut serde_json::Serializer::new(&mut *self.out))
    }
}

/// A compound value being written: whether a separator goes before the next item.
pub(crate) struct Compound<'w, 'a> {
    w: &'w mut Writer<'a>,
    first: bool,
    /// `RawValue`'s struct: its one field is written verbatim.
    raw: bool,
    /// How the compound ends (`]`, `}`, or `]}` / `}}` for a variant).
    close: &'static [u8],
}

impl<'w, 'a> Compound<'w, 'a> {
    fn open(w: &'w mut Writer<'a>, open: &[u8], close: &'static [u8]) -> Self {
        w.out.extend_from_slice(open);
        Compound {
            w,
            first: true,
            raw: false,
            close,
        }
    }

    fn comma(&mut self) {
        if !std::mem::take(&mut self.first) {
            self.w.out.push(b',');
        }
    }

    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.comma();
        value.serialize(&mut *self.w)
    }

    /// A struct's field: its name is the program's own text (a field or its `rename`),
    /// written as it is, without the escape check a map's keys get.
    fn field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Error> {
        debug_assert!(
            !any_escaped(key.as_bytes()),
            "a field name to escape: {key}"
        );
        self.comma();
        let out = &mut *self.w.out;
        out.reserve(key.len() + 3);
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b"\":");
        value.serialize(&mut *self.w)
    }

    fn close(self) -> Result<(), Error> {
        self.w.out.extend_from_slice(self.close);
        Ok(())
    }
}

impl<'w, 'a> Serializer for &'w mut Writer<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'w, 'a>;
    type SerializeTuple = Compound<'w, 'a>;
    type SerializeTupleStruct = Compound<'w, 'a>;
    type SerializeTupleVariant = Compound<'w, 'a>;
    type SerializeMap = Compound<'w, 'a>;
    type SerializeStruct = Compound<'w, 'a>;
    type SerializeStructVariant = Compound<'w, 'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    integers!(|w: Self, v| {
        w.int(v);
        Ok(())
    });
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        self.like_serde_json(&v)
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        self.like_serde_json(&v)
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        write_str(self.out, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        write_str(self.out, v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        // An array of numbers.
        self.like_serde_json(v)
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        let mut c = Compound::open(self, b"{", b"}");
        c.field(variant, value)?;
        c.close()
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Compound<'w, 'a>, Error> {
        Ok(Compound::open(self, b"[", b"]"))
    }
    fn serialize_tuple(self, _: usize) -> Result<Compound<'w, 'a>, Error> {
        Ok(Compound::open(self, b"[", b"]"))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Compound<'w, 'a>, Error> {
        Ok(Compound::open(self, b"[", b"]"))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Compound<'w, 'a>, Error> {
        self.out.push(b'{');
        write_str(self.out, variant);
        Ok(Compound::open(self, b":[", b"]}"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Compound<'w, 'a>, Error> {
        Ok(Compound::open(self, b"{", b"}"))
    }
    fn serialize_struct(self, name: &'static str, _: usize) -> Result<Compound<'w, 'a>, Error> {
        if name == RAW_VALUE {
            return Ok(Compound {
                w: self,
                first: true,
                raw: true,
                close: b"",
            });
        }
        Ok(Compound::open(self, b"{", b"}"))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Compound<'w, 'a>, Error> {
        self.out.push(b'{');
        write_str(self.out, variant);
        Ok(Compound::open(self, b":{", b"}}"))
    }
}

impl ser::SerializeSeq for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeTuple for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeTupleStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeTupleVariant for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeMap for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.comma();
        key.serialize(KeyWriter(self.w.out))
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.w.out.push(b':');
        value.serialize(&mut *self.w)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        if self.raw {
            return value.serialize(RawWriter(self.w.out));
        }
        self.field(key, value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeStructVariant for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.field(key, value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

fn key_must_be_a_string() -> Error {
    ser::Error::custom("key must be a string")
}

/// A map key: strings as they are; numbers, booleans and characters quoted (as
/// `serde_json` writes them); anything else refused.
struct KeyWriter<'a>(&'a mut Vec<u8>);

impl KeyWriter<'_> {
    fn quoted(self, text: &str) -> Result<(), Error> {
        write_str(self.0, text);
        Ok(())
    }
}

impl Serializer for KeyWriter<'_> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Impossible<(), Error>;
    type SerializeTuple = Impossible<(), Error>;
    type SerializeTupleStruct = Impossible<(), Error>;
    type SerializeTupleVariant = Impossible<(), Error>;
    type SerializeMap = Impossible<(), Error>;
    type SerializeStruct = Impossible<(), Error>;
    type SerializeStructVariant = Impossible<(), Error>;

    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.quoted(v)
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.quoted(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.quoted(if v { "true" } else { "false" })
    }
    integers!(|w: Self, v| w.quoted(itoa::Buffer::new().format(v)));
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.quoted(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    refuse!(key_must_be_a_string();
        serialize_f32(f32), serialize_f64(f64), serialize_bytes(&[u8]), serialize_none(),
        serialize_unit(), serialize_unit_struct(&'static str));
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(key_must_be_a_string())
    }
}

fn not_raw() -> Error {
    ser::Error::custom("expected RawValue")
}

/// `RawValue`'s text, written as it is (it was valid JSON when the `RawValue` was made).
struct RawWriter<'a>(&'a mut Vec<u8>);

impl Serializer for RawWriter<'_> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Impossible<(), Error>;
    type SerializeTuple = Impossible<(), Error>;
    type SerializeTupleStruct = Impossible<(), Error>;
    type SerializeTupleVariant = Impossible<(), Error>;
    type SerializeMap = Impossible<(), Error>;
    type SerializeStruct = Impossible<(), Error>;
    type SerializeStructVariant = Impossible<(), Error>;

    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.0.extend_from_slice(v.as_bytes());
        Ok(())
    }
    refuse!(not_raw();
        serialize_bool(bool), serialize_i8(i8), serialize_i16(i16), serialize_i32(i32),
        serialize_i64(i64), serialize_u8(u8), serialize_u16(u16), serialize_u32(u32),
        serialize_u64(u64), serialize_f32(f32), serialize_f64(f64), serialize_char(char),
        serialize_bytes(&[u8]), serialize_none(), serialize_unit(),
        serialize_unit_struct(&'static str));
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<(), Error> {
        Err(not_raw())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<(), Error> {
        Err(not_raw())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<(), Error> {
        Err(not_raw())
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), Error> {
        Err(not_raw())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(not_raw())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        Err(not_raw())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(not_raw())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(not_raw())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(not_raw())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Error> {
        Err(not_raw())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(not_raw())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::value::RawValue;
    use serde_json::{Value, json};

    fn same<T: Serialize + ?Sized>(v: &T) {
        assert_eq!(
            String::from_utf8(to_vec(v).expect("writes")).expect("utf-8"),
            String::from_utf8(serde_json::to_vec(v).expect("serde_json writes")).expect("utf-8"),
        );
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        for s in [
            "",
            "a",
            "plain ascii text long enough for several words",
            "\"",
            "\\",
            "ab\"cdefgh\\ijklmnop\"",
            "tab\there\nnewline\r\u{8}\u{c}\u{0}\u{1f}\u{7f}",
            "ünïcödé — 🦀 and \u{2028}\u{2029}",
            "12345678\"",
            "1234567\"8",
            "\u{1}\u{2}\u{3}\u{4}\u{5}\u{6}\u{7}\u{8}\u{9}\u{a}",
            "</script>",
        ] {
            same(s);
        }
    }

    #[test]
    fn every_escaped_byte_is_found_at_every_position_of_every_short_length() {
        // The word-at-a-time check reads lengths 4-7 as two overlapping halves and the
        // tail of longer strings as an overlapping word: each position of each length.
        for len in 0..=24 {
            let clean = "x".repeat(len);
            assert!(!any_escaped(clean.as_bytes()), "{len} clean bytes");
            same(clean.as_str());
            for at in 0..len {
                for bad in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
                    let mut b = clean.clone().into_bytes();
                    b[at] = bad;
                    assert!(any_escaped(&b), "{bad:#x} at {at} of {len}");
                    same(std::str::from_utf8(&b).expect("ascii"));
                }
                let mut b = clean.clone().into_bytes();
                b[at] = b' ';
                assert!(!any_escaped(&b), "a space at {at} of {len}");
            }
        }
    }

    #[test]
    fn values_of_every_kind_come_out_as_serde_json_writes_them() {
        let raw = RawValue::from_string(r#"{"a": [1, 2.50, "x"]}"#.to_string()).expect("raw");
        same(&json!({
            "null": null, "t": true, "f": false, "n": -12, "u": u64::MAX, "i": i64::MIN,
            "float": 1.5, "tiny": 1e-300, "big": 1.7976931348623157e308, "third": 1.0/3.0,
            "empty": {}, "list": [], "nested": [[{"k": ["v", 1, null]}]],
            "esc\"key": "v\u{1}"
        }));
        same(&raw);
        same(&vec![Some(&*raw), None]);
        same(&(1u8, 'c', "s", 2.0f32, f64::NAN, f64::INFINITY));
        same(&std::collections::BTreeMap::from([(1, "a"), (2, "b")]));
        same(&std::collections::BTreeMap::from([(true, 1)]));
        same(&std::collections::BTreeMap::from([('k', 1)]));
        #[derive(Serialize)]
        enum E {
            Unit,
            New(u8),
            Tuple(u8, &'static str),
            Struct { a: u8, b: Option<bool> },
        }
        #[derive(Serialize)]
        struct S<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            e: Vec<E>,
            raw: &'a RawValue,
            #[serde(skip_serializing_if = "Option::is_none")]
            skipped: Option<u8>,
            unit: (),
        }
        same(&S {
            kind: "k",
            e: vec![
                E::Unit,
                E::New(1),
                E::Tuple(2, "t"),
                E::Struct { a: 3, b: None },
            ],
            raw: &raw,
            skipped: None,
            unit: (),
        });
    }

    #[test]
    fn a_map_key_that_is_no_string_is_refused() {
        let bad = std::collections::BTreeMap::from([(vec![1], 2)]);
        assert!(to_vec(&bad).is_err());
        assert!(serde_json::to_vec(&bad).is_err());
    }

    proptest! {
        #[test]
        fn any_string_comes_out_as_serde_json_writes_it(s in any::<String>()) {
            prop_assert_eq!(to_vec(&s).expect("writes"), serde_json::to_vec(&s).expect("writes"));
        }

        #[test]
        fn any_ascii_bytes_come_out_as_serde_json_writes_them(b in proptest::collection::vec(0u8..0x80, 0..64)) {
            let s = String::from_utf8(b).expect("ascii");
            let v: Value = json!({ s.clone(): [s.clone(), {"k": s}] });
            prop_assert_eq!(to_vec(&v).expect("writes"), serde_json::to_vec(&v).expect("writes"));
        }
    }
}
