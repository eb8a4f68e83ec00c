//! Property tests: no bytes and no JSON value can panic the decoder or the seed parser.

use a2ad::fuzzing;
use proptest::prelude::*;
use serde_json::Value;

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[ -~]{0,12}".prop_map(Value::String),
        "\\PC{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("text"),
            Just("file"),
            Just("user"),
            Just("2.0"),
            Just("message/send"),
            Just("6f1c2a1e-3b4d-4c5e-8f70-1a2b3c4d5e6f"),
            Just("aGk="),
            Just("text/plain"),
            Just("data:text/plain;base64,aGk="),
            Just("image/png"),
        ]
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let keys = prop_oneof![
            Just("jsonrpc"),
            Just("id"),
            Just("method"),
            Just("params"),
            Just("message"),
            Just("role"),
            Just("parts"),
            Just("messageId"),
            Just("type"),
            Just("kind"),
            Just("text"),
            Just("file"),
            Just("name"),
            Just("mimeType"),
            Just("bytes"),
            Just("contextId"),
            Just("sessionId"),
            Just("taskId"),
            Just("configuration"),
            Just("blocking"),
            Just("metadata"),
            Just("config"),
            Just("url"),
            Just("events"),
            Just("retryPolicy"),
            Just("secret"),
            Just("headers"),
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((keys, inner), 0..6).prop_map(|kv| Value::Object(
                kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
            )),
        ]
    })
}

/// A message/send whose strings are arbitrary Unicode, in the places validation slices.
fn arb_send() -> impl Strategy<Value = Value> {
    ("\\PC{0,40}", "\\PC{0,20}", "\\PC{0,20}", "\\PC{0,40}").prop_map(|(bytes, mime, name, text)| {
        serde_json::json!({"message": {"role": "user", "messageId": "6f1c2a1e-3b4d-4c5e-8f70-1a2b3c4d5e6f",
            // A supported type first, so validation reaches `bytes` (the first bad part ends it).
            "parts": [{"type": "text", "text": text},
                      {"kind": "file", "file": {"name": "n", "mimeType": "text/plain", "bytes": bytes}},
                      {"type": "file", "file": {"name": name, "mimeType": mime, "bytes": bytes}}]}})
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        fuzzing::decode(&bytes);
    }

    #[test]
    fn arbitrary_json_never_panics_decoder_or_params(v in arb_json()) {
        // Each entry point asserts its own invariants: a rejection is -32700/-32600, a
        // params refusal is -32602 naming a field.
        let text = v.to_string();
        fuzzing::decode(text.as_bytes());
        fuzzing::params(text.as_bytes());
    }

    #[test]
    fn arbitrary_unicode_in_message_fields_never_panics_validation(v in arb_send()) {
        fuzzing::params(v.to_string().as_bytes());
    }

    #[test]
    fn every_request_shaped_document_decodes_to_a_json_rpc_answer(v in arb_json()) {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": v});
        fuzzing::decode(body.to_string().as_bytes());
    }

    #[test]
    fn arbitrary_store_rows_decode_or_are_refused_and_round_trip(
        which in 0u8..8,
        v in arb_json(),
        bytes in prop::collection::vec(any::<u8>(), 0..128),
    ) {
        // JSON documents reach the record decoders' field checks; raw bytes the key parsers.
        let mut doc = vec![which];
        doc.extend_from_slice(v.to_string().as_bytes());
        fuzzing::store_record(&doc);
        let mut raw = vec![which];
        raw.extend_from_slice(&bytes);
        fuzzing::store_record(&raw);
    }
}

/// Runs every checked-in seed (`seed-*`) of a fuzz target's corpus through `check`;
/// returns how many ran.
fn run_corpus(target: &str, check: fn(&[u8])) -> usize {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(dir).expect("the corpus") {
        let path = entry.expect("an entry").path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
        {
            check(&std::fs::read(&path).expect("a seed"));
            n += 1;
        }
    }
    n
}

/// Every checked-in seed of the store_record fuzz target, including its findings (a push
/// configuration whose backoff did not survive a round trip before serde_json parsed
/// floats exactly), passes the target's checks.
#[test]
fn the_store_record_corpus_passes() {
    let n = run_corpus("store_record", fuzzing::store_record);
    assert!(n >= 10, "{n} seeds");
}

/// Every checked-in seed of the grpc fuzz target passes its checks, its finding included
/// (a role of 98, once answered INTERNAL).
#[test]
fn the_grpc_corpus_passes() {
    let n = run_corpus("grpc", fuzzing::grpc);
    assert!(n >= 10, "{n} seeds");
}

/// An entry of `a2ad::fuzzing`: what a fuzz target drives with its input.
type Entry = fn(&[u8]);

/// The fuzz targets, each with the entry of `a2ad::fuzzing` it drives.
const TARGETS: [(&str, Entry); 10] = [
    ("decode", fuzzing::decode),
    ("params", fuzzing::params),
    ("official", fuzzing::official),
    ("file_part", fuzzing::file_part),
    ("config", fuzzing::config),
    ("sse", fuzzing::sse),
    ("webhook_url", fuzzing::webhook_url),
    ("store_record", fuzzing::store_record),
    ("log_frame", fuzzing::log_frame),
    ("grpc", fuzzing::grpc),
];

/// Every fuzz target's seed corpus passes its checks, run here without the fuzzer (CI's
/// default run replays them; the coverage-guided runs are docs/RELIABILITY.md's), and the
/// harness cannot drift from the library: each target in `fuzz/Cargo.toml` is a file of
/// `fuzz/fuzz_targets/` that calls the entry this table names, with a corpus of its own.
#[test]
fn every_fuzz_target_builds_on_an_entry_and_passes_its_seed_corpus() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("fuzz/Cargo.toml");
    let declared: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .filter(|n| *n != "a2ad-fuzz")
        .collect();
    let mut named: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    let mut sorted = declared.clone();
    sorted.sort_unstable();
    named.sort_unstable();
    assert_eq!(sorted, named, "fuzz/Cargo.toml's targets are this table's");
    for (name, check) in TARGETS {
        let source = std::fs::read_to_string(root.join("fuzz_targets").join(format!("{name}.rs")))
            .unwrap_or_else(|e| panic!("fuzz_targets/{name}.rs: {e}"));
        assert!(
            source.contains(&format!("a2ad::fuzzing::{name}(")),
            "fuzz_targets/{name}.rs drives a2ad::fuzzing::{name}"
        );
        let dir = root.join("corpus").join(name);
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("corpus/{name}: {e}")) {
            check(&std::fs::read(entry.expect("an entry").path()).expect("an input"));
            n += 1;
        }
        assert!(n >= 1, "{name}: a corpus of its own");
    }
}
