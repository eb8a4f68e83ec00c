//! The A2A 1.0 protobuf messages and the `lf.a2a.v1.A2AService` client, generated at build
//! time from the vendored proto (`src/proto/lf/a2a/v1/a2a.proto`, v1.0.1; `src/build.rs`),
//! with their ProtoJSON (serde) forms: the gRPC binding decodes each request straight into its
//! operation's request (`pbin`), writes the results of sends, task reads and streams straight
//! from the model (`pbout`), and reads the others back from their JSON.

#![allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    rustdoc::all
)]

include!(concat!(env!("OUT_DIR"), "/lf.a2a.v1.rs"));
include!(concat!(env!("OUT_DIR"), "/lf.a2a.v1.serde.rs"));
