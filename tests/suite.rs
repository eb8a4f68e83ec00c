//! Every integration test, in one binary: one link instead of one per file, and one pool
//! of test threads across them. Each file is a module; `cargo test --test suite <module>::`
//! runs one file's tests. The tests that do not depend on the store under test (see
//! `A2AD_TEST_STORE` in support/mod.rs) are named in .ci/run, which skips them in the
//! durable and shared-store passes.

mod support;

mod a2a_cards;
mod a2a_v03;
mod a2a_v10;
mod architecture;
mod attacks;
mod auth;
mod binary_guards;
mod bindings;
mod bounds;
mod cli;
mod cluster;
mod content;
mod crash;
mod decoder_props;
mod embed;
mod evo_clients;
mod faults;
mod gateway;
mod hostile;
mod http_framing;
mod inspector;
mod metrics;
mod oidc;
mod openai;
mod reload;
mod runtime_model;
mod sealed;
mod store_damage;
mod store_restart;
mod streaming;
mod tasks;
mod telemetry;
mod tls;
mod webhooks;
