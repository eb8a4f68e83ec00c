//! JSON-RPC 2.0 framing: decoding single and batch requests in one pass (recovering the
//! `id` of a malformed request where it can be read) and encoding responses.

use serde::Serialize;
use serde_json::value::RawValue;

use super::error::RpcError;
use super::json::{self, Raw, Text};

/// One decoded request.
#[derive(Debug)]
pub(crate) struct Call {
    /// The request id, exactly as sent (a string or a number), echoed unchanged.
    pub id: Box<RawValue>,
    /// The method name.
    pub method: String,
    /// Raw params, if present.
    pub params: Option<Text>,
}

impl Call {
    /// The params, if present.
    pub(crate) fn params(&self) -> Option<Raw<'_>> {
        self.params.as_ref().map(Text::raw)
    }
}

/// A request that could not be decoded, with the id when it could be read.
#[derive(Debug)]
pub(crate) struct Rejected {
    /// The id, when readable.
    pub id: Option<Box<RawValue>>,
    /// Why.
    pub error: RpcError,
}

/// A decoded body.
#[derive(Debug)]
pub(crate) enum Body {
    /// One request (or its rejection).
    Single(Result<Call, Rejected>),
    /// A batch, in order; never empty.
    Batch(Vec<Result<Call, Rejected>>),
}

#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<&'a RawValue>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
}

/// Decodes a request body in one pass over it, with the default batch cap.
///
/// # Errors
/// As [`decode_with`].
pub(crate) fn decode(body: &[u8]) -> Result<Body, RpcError> {
    decode_with(body, crate::config::ServerConfig::DEFAULT_MAX_BATCH_SIZE)
}

/// Decodes a request body in one pass over it. A batch of more than `max_batch` requests
/// is refused as soon as the parser reaches the one past the cap.
///
/// # Errors
/// -32700 when the body is not JSON; -32600 for an empty or oversized batch or a
/// non-object body.
pub(crate) fn decode_with(body: &[u8], max_batch: usize) -> Result<Body, RpcError> {
    decode_as(body, max_batch, false)
}

/// [`decode_with`], where `null_ids` says whether a request without an `id` (or with
/// `"id": null`) is a call answered with `"id": null` instead of a refusal.
///
/// # Errors
/// As [`decode_with`].
pub(crate) fn decode_as(body: &[u8], max_batch: usize, null_ids: bool) -> Result<Body, RpcError> {
    use serde_json::error::Category;
    let parse_error = |e: serde_json::Error| {
        RpcError::parse_error(format!(
            "invalid JSON at line {}, column {}",
            e.line(),
            e.column()
        ))
    };
    let utf8 = |body| {
        std::str::from_utf8(body).map_err(|e| {
            RpcError::parse_error(format!(
                "the body is not UTF-8 (at byte {})",
                e.valid_up_to()
            ))
        })
    };
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        // Checked as UTF-8 once, whole: `serde_json` then reads the text without checking
        // each string, and the params' raw text, again.
        Some(b'{') => match serde_json::from_str::<Envelope<'_>>(utf8(body)?) {
            Ok(env) => Ok(Body::Single(decode_envelope(env, null_ids))),
            Err(e)
                if matches!(
                    e.classify(),
                    Category::Syntax | Category::Eof | Category::Io
                ) =>
            {
                Err(parse_error(e))
            }
            // Valid JSON of the wrong shape (e.g. a duplicate member).
            Err(_) => Ok(Body::Single(Err(Rejected {
                id: None,
                error: RpcError::invalid_request("malformed request object (duplicate member?)"),
            }))),
        },
        Some(b'[') => {
            let text = utf8(body)?;
            let items = json::seq(text, max_batch).map_err(|e| match e {
                json::SeqError::TooMany => RpcError::invalid_request(&format!(
                    "a batch may hold at most {max_batch} requests"
                )),
                json::SeqError::Json(e) => parse_error(e),
            })?;
            if items.is_empty() {
                return Err(RpcError::invalid_request("empty batch"));
            }
            Ok(Body::Batch(
                items
                    .into_iter()
                    .map(|raw| decode_one(raw, null_ids))
                    .collect(),
            ))
        }
        _ => {
            serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(parse_error)?;
            Ok(Body::Single(Err(Rejected {
                id: None,
                error: RpcError::invalid_request("a request must be a JSON object"),
            })))
        }
    }
}

fn decode_one(raw: &RawValue, null_ids: bool) -> Result<Call, Rejected> {
    let reject = |id: Option<&RawValue>, reason: &str| Rejected {
        id: id.map(RawValue::to_owned),
        error: RpcError::invalid_request(reason),
    };
    if !raw.get().starts_with('{') {
        return Err(reject(None, "a request must be a JSON object"));
    }
    let env: Envelope<'_> = serde_json::from_str(raw.get())
        .map_err(|_| reject(None, "malformed request object (duplicate member?)"))?;
    decode_envelope(env, null_ids)
}

fn decode_envelope(env: Envelope<'_>, null_ids: bool) -> Result<Call, Rejected> {
    let reject = |id: Option<Box<RawValue>>, reason: &str| Rejected {
        id,
        error: RpcError::invalid_request(reason),
    };
    // (`"id": null` reads as `None`: serde takes a JSON null for an absent `Option`.)
    // The id copied as it was read (checked JSON already: not parsed again).
    let id = match env.id {
        Some(id) if is_valid_id(Raw::from(id)) => id.to_owned(),
        None if null_ids => null_id(),
        Some(_) if null_ids => {
            return Err(reject(None, "`id` must be a string, a number or null"));
        }
        Some(_) => return Err(reject(None, "`id` must be a string or a number")),
        None => return Err(reject(None, "`id` is required")),
    };
    match env.jsonrpc.map(|v| json::string(v, "jsonrpc")) {
        Some(Ok(v)) if v == "2.0" => {}
        _ => return Err(reject(Some(id), "`jsonrpc` must be \"2.0\"")),
    }
    let method = match env.method.map(|m| json::string(m, "method")) {
        Some(Ok(m)) => m.into_owned(),
        Some(Err(_)) => return Err(reject(Some(id), "`method` must be a string")),
        None => return Err(reject(Some(id), "`method` is required")),
    };
    Ok(Call {
        id,
        method,
        params: env.params.map(|p| Raw::from(p).to_text()),
    })
}

fn is_valid_id(id: Raw<'_>) -> bool {
    matches!(id.get().as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9'))
}

/// The `null` id of responses to unreadable requests.
pub(crate) fn null_id() -> Box<RawValue> {
    // `serde_json`'s default raw value is `null`, made without parsing it.
    Box::<RawValue>::default()
}

/// Encodes a success response.
pub(crate) fn success<T: Serialize + ?Sized>(id: &RawValue, result: &T) -> Vec<u8> {
    // A completed task with its two-message history is 0.6-1 KB: written without growing.
    let mut out = Vec::with_capacity(1024);
    response_head(&mut out, id, b"result");
    match super::out::write(&mut out, result) {
        Ok(()) => {
            out.push(b'}');
            out
        }
        Err(e) => {
            tracing::error!(error = %e, "response serialization failed");
            failure(Some(id), &RpcError::internal())
        }
    }
}

/// Encodes an error response.
pub(crate) fn failure(id: Option<&RawValue>, error: &RpcError) -> Vec<u8> {
    let null = null_id();
    let mut out = Vec::with_capacity(160);
    response_head(&mut out, id.unwrap_or(&null), b"error");
    if super::out::write(&mut out, error).is_err() {
        // Cannot happen for these types; never send a half-written body.
        return br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Internal error"}}"#
            .to_vec();
    }
    out.push(b'}');
    out
}

/// `{"jsonrpc":"2.0","id":<id>,"<member>":` — a response up to its result or error.
fn response_head(out: &mut Vec<u8>, id: &RawValue, member: &[u8]) {
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    out.extend_from_slice(id.get().as_bytes());
    out.extend_from_slice(b",\"");
    out.extend_from_slice(member);
    out.extend_from_slice(b"\":");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::error;

    fn single(body: &str) -> Result<Call, Rejected> {
        match decode(body.as_bytes()).expect("decodes") {
            Body::Single(r) => r,
            Body::Batch(_) => panic!("not a batch"),
        }
    }

    #[test]
    fn a_valid_request_keeps_its_id_text_unchanged() {
        let c =
            single(r#"{"jsonrpc":"2.0","id":1.50,"method":"tasks/get","params":{"taskId":"x"}}"#)
                .expect("valid");
        assert_eq!(c.id.get(), "1.50");
        assert_eq!(c.method, "tasks/get");
        assert_eq!(c.params().expect("params").get(), r#"{"taskId":"x"}"#);
    }

    #[test]
    fn invalid_json_is_a_parse_error() {
        assert_eq!(decode(b"{nope").unwrap_err().code, error::PARSE_ERROR);
        assert_eq!(decode(b"").unwrap_err().code, error::PARSE_ERROR);
        assert_eq!(decode(b"\xff\xfe").unwrap_err().code, error::PARSE_ERROR);
        // A request object that is not UTF-8, in a member's value, in the raw params, or
        // after its end: the body is checked once, whole.
        for body in [
            &b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\xff\"}"[..],
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":{\"a\":\"\xc3\"}}",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\"} \xff",
        ] {
            let e = decode(body).unwrap_err();
            assert_eq!(e.code, error::PARSE_ERROR);
            let reason = e.data.as_ref().and_then(|d| d["reason"].as_str());
            assert!(
                reason.is_some_and(|r| r.contains("not UTF-8")),
                "{reason:?}"
            );
        }
        // Text that is: read as before.
        let c = single("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":{\"a\":\"é\"}}")
            .expect("call");
        assert_eq!(c.params().expect("params").get(), "{\"a\":\"é\"}");
    }

    #[test]
    fn invalid_requests_echo_the_id_when_readable() {
        let r = single(r#"{"jsonrpc":"1.0","id":"a","method":"m"}"#).unwrap_err();
        assert_eq!(r.error.code, error::INVALID_REQUEST);
        assert_eq!(r.id.expect("id").get(), r#""a""#);
        let r = single(r#"{"jsonrpc":"2.0","id":7,"method":5}"#).unwrap_err();
        assert_eq!(r.id.expect("id").get(), "7");
        let r = single(r#"{"jsonrpc":"2.0","method":"m"}"#).unwrap_err();
        assert!(r.id.is_none());
        let r = single(r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#).unwrap_err();
        assert!(r.id.is_none());
        let r = single(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"m"}"#).unwrap_err();
        assert!(r.id.is_none());
        let r = single("42").unwrap_err();
        assert_eq!(r.error.code, error::INVALID_REQUEST);
    }

    #[test]
    fn batches_keep_order_and_an_empty_batch_is_invalid() {
        match decode(br#"[{"jsonrpc":"2.0","id":1,"method":"a"}, 3]"#).expect("ok") {
            Body::Batch(items) => {
                assert_eq!(items.len(), 2);
                assert!(items[0].is_ok() && items[1].is_err());
            }
            Body::Single(_) => panic!("batch expected"),
        }
        assert_eq!(decode(b" [ ] ").unwrap_err().code, error::INVALID_REQUEST);
    }

    /// The official paths (`null_ids`): a request without an id, or with `id: null`, is a
    /// call answered with `id: null`; an id of another kind is still refused. Elsewhere the
    /// same requests are refused.
    #[test]
    fn null_ids_are_calls_only_where_the_dialect_answers_them() {
        let as_official = |body: &str| match decode_as(body.as_bytes(), 4, true).expect("decodes") {
            Body::Single(r) => r,
            Body::Batch(_) => panic!("not a batch"),
        };
        for body in [
            r#"{"jsonrpc":"2.0","method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#,
        ] {
            let call = as_official(body).expect("a call");
            assert_eq!(call.id.get(), "null", "{body}");
            assert_eq!(call.method, "m");
            let refused = single(body).expect_err("refused on the seed path");
            assert_eq!(refused.error.code, error::INVALID_REQUEST);
        }
        // The seed path's reason does not offer null.
        let seed = single(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"m"}"#).expect_err("refused");
        assert_eq!(
            seed.error.data.as_ref().map(|d| d["reason"].clone()),
            Some(serde_json::json!("`id` must be a string or a number"))
        );
        let kept = as_official(r#"{"jsonrpc":"2.0","id":"k","method":"m"}"#).expect("a call");
        assert_eq!(kept.id.get(), r#""k""#);
        for body in [
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":true,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":nullx,"method":"m"}"#,
        ] {
            match decode_as(body.as_bytes(), 4, true) {
                Ok(Body::Single(Err(r))) => {
                    assert_eq!(r.error.code, error::INVALID_REQUEST, "{body}");
                    assert!(r.id.is_none(), "{body}");
                    // The reason names what this path accepts: null too.
                    assert_eq!(
                        r.error.data.as_ref().map(|d| d["reason"].clone()),
                        Some(serde_json::json!("`id` must be a string, a number or null")),
                        "{body}"
                    );
                }
                Err(e) => assert_eq!(e.code, error::PARSE_ERROR, "{body}"),
                Ok(_) => panic!("{body} was taken as a call"),
            }
        }
        // In a batch too.
        match decode_as(
            br#"[{"jsonrpc":"2.0","method":"a"},{"jsonrpc":"2.0","id":2,"method":"b"}]"#,
            4,
            true,
        )
        .expect("decodes")
        {
            Body::Batch(items) => {
                assert_eq!(items[0].as_ref().expect("a call").id.get(), "null");
                assert_eq!(items[1].as_ref().expect("a call").id.get(), "2");
            }
            Body::Single(_) => panic!("batch expected"),
        }
    }

    #[test]
    fn ids_are_strings_or_numbers() {
        for (id, ok) in [
            (r#""a""#, true),
            ("0", true),
            ("-1", true),
            ("9", true),
            ("true", false),
            ("[1]", false),
            (r#"{"a":1}"#, false),
        ] {
            let raw = RawValue::from_string(id.to_string()).expect("json");
            assert_eq!(is_valid_id((&raw).into()), ok, "{id}");
        }
    }

    #[test]
    fn a_request_needs_jsonrpc_2_and_a_string_method() {
        for body in [
            r#"{"id":1,"method":"m"}"#,
            r#"{"jsonrpc":2.0,"id":1,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":1}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":["m"]}"#,
        ] {
            let r = single(body).expect_err(body);
            assert_eq!(r.error.code, error::INVALID_REQUEST, "{body}");
            assert_eq!(r.id.expect("the id is echoed").get(), "1", "{body}");
        }
        // Leading white space, and no params at all.
        let c = single(" \n\t{\"jsonrpc\":\"2.0\",\"id\":\"w\",\"method\":\"m\"}").expect("valid");
        assert!(c.params.is_none());
    }

    #[test]
    fn valid_json_of_the_wrong_shape_is_an_invalid_request_not_a_parse_error() {
        // A duplicate member: JSON, but not one request object.
        let r = single(r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"m"}"#).expect_err("refused");
        assert_eq!(r.error.code, error::INVALID_REQUEST);
        assert!(r.id.is_none());
        // A string, null, a number: -32600; garbage after them: -32700.
        for body in [r#""text""#, "null", "12"] {
            let r = single(body).expect_err(body);
            assert_eq!(r.error.code, error::INVALID_REQUEST, "{body}");
        }
        assert_eq!(decode(b"12 x").unwrap_err().code, error::PARSE_ERROR);
        // Cut short: -32700.
        assert_eq!(
            decode(br#"{"jsonrpc":"2.0","id":1"#).unwrap_err().code,
            error::PARSE_ERROR
        );
    }

    #[test]
    fn a_batch_is_capped_and_its_items_are_checked_one_by_one() {
        let item = r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#;
        let three = format!("[{item},{item},{item}]");
        assert!(matches!(decode_with(three.as_bytes(), 3), Ok(Body::Batch(b)) if b.len() == 3));
        let e = decode_with(three.as_bytes(), 2).expect_err("over the cap");
        assert_eq!(e.code, error::INVALID_REQUEST);
        // Not UTF-8, not JSON: -32700.
        assert_eq!(decode(b"[\xff]").unwrap_err().code, error::PARSE_ERROR);
        assert_eq!(decode(b"[1,").unwrap_err().code, error::PARSE_ERROR);
        // Items that are not request objects are refused each on its own.
        match decode(br#"[1, {"jsonrpc":"2.0","id":1,"id":2,"method":"m"}, {"jsonrpc":"2.0","id":"z","method":"m"}]"#)
            .expect("decodes")
        {
            Body::Batch(items) => {
                assert_eq!(items.len(), 3);
                for refused in &items[..2] {
                    let r = refused.as_ref().expect_err("refused");
                    assert_eq!(r.error.code, error::INVALID_REQUEST);
                    assert!(r.id.is_none());
                }
                assert_eq!(items[2].as_ref().expect("valid").id.get(), r#""z""#);
            }
            Body::Single(_) => panic!("batch expected"),
        }
    }

    #[test]
    fn responses_are_full_envelopes() {
        let id = RawValue::from_string("\"x\"".into()).expect("json");
        let ok: serde_json::Value =
            serde_json::from_slice(&success(&id, &serde_json::json!({"a": 1}))).expect("json");
        assert_eq!(
            ok,
            serde_json::json!({"jsonrpc":"2.0","id":"x","result":{"a":1}})
        );
        let err: serde_json::Value =
            serde_json::from_slice(&failure(None, &RpcError::method_not_found("m"))).expect("json");
        assert_eq!(err["id"], serde_json::Value::Null);
        assert_eq!(err["error"]["code"], -32601);
        assert_eq!(err["jsonrpc"], "2.0");
        let with_id: serde_json::Value =
            serde_json::from_slice(&failure(Some(&*id), &RpcError::method_not_found("m")))
                .expect("json");
        assert_eq!(with_id["id"], "x");
        assert_eq!(null_id().get(), "null");
    }
}
