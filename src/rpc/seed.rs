//! The seed dialect (docs/PROTOCOL.md §1–§9) on `POST /api/v1/a2a/{agent_id}`: its
//! method table, params in, results and stream frames out, error codes, webhook payloads.

mod dispatch;
pub(crate) mod errors;
pub(crate) mod params;
pub(crate) mod render;
pub(crate) mod webhook;

pub(crate) use dispatch::dispatch;

/// The eight methods of the spec, in its order (the card's `supportedMethods`): the first
/// eight names of the method table (the ninth is an alias).
pub(crate) const METHODS: [&str; 8] = {
    let mut out = [""; 8];
    let mut i = 0;
    while i < out.len() {
        out[i] = dispatch::TABLE[i].0;
        i += 1;
    }
    out
};

/// The metrics label of a method (aliases folded in).
pub(crate) fn method_label(method: &str) -> Option<&'static str> {
    let method = match method {
        "agent/getAuthenticatedExtendedCard" => "agent/authenticatedExtendedCard",
        m => m,
    };
    METHODS.iter().copied().find(|m| *m == method)
}

/// Whether a method answers with a stream.
pub(crate) fn is_streaming(method: &str) -> bool {
    matches!(method, "message/stream" | "tasks/resubscribe")
}
