//! Compiles the vendored `lf.a2a.v1` proto (A2A v1.0.1, `src/proto`) for the gRPC binding:
//! protox (a protobuf compiler in Rust: no `protoc` to install) reads it, tonic's prost
//! generator writes the messages and the service's client (for `a2ad-load` and embedders;
//! the server side is a2ad's own, `src/http/grpc.rs`), pbjson-build their ProtoJSON (serde)
//! forms, through which the binding shares the JSON-RPC binding's request decoding.
//! `google.protobuf.Value` (a data part) is a2ad's own `JsonValue` (src/rpc/a2a/pbvalue.rs).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=src/proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let fds = protox::compile(["lf/a2a/v1/a2a.proto"], ["src/proto"])?;
    let descriptors = out.join("a2a_descriptors.bin");
    std::fs::write(&descriptors, prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        .build_transport(false)
        .build_server(false)
        // The well-known types (Struct, Timestamp, Empty) from pbjson-types: they have
        // ProtoJSON forms too.
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        // A data part's `Value`: read under a2ad's own depth bound, kept as JSON text
        // (src/rpc/a2a/pbvalue.rs says why).
        .extern_path(
            ".google.protobuf.Value",
            "crate::rpc::a2a::pbvalue::JsonValue",
        )
        .compile_fds(fds)?;
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptors)?)?
        .extern_path(".google.protobuf", "::pbjson_types")
        .extern_path(
            ".google.protobuf.Value",
            "crate::rpc::a2a::pbvalue::JsonValue",
        )
        .ignore_unknown_fields()
        .build(&[".lf.a2a.v1"])?;
    Ok(())
}
