//! Official webhook payloads (docs/PROTOCOL.md §10.7): 1.0 sends the event's `StreamResponse`
//! (`application/a2a+json`, S10 §4.3.3), 0.3 the whole task after the event
//! (`application/json`, S03 §9.5).

use super::Version;
use super::render::{EventOut, TaskOut};
use crate::webhook::{Payload, PayloadInput, PayloadRenderer};

/// The payload format name of configurations made on the 1.0 path.
pub(crate) const FORMAT_10: &str = crate::push::format::A2A_10;
/// The payload format name of configurations made on the 0.3 path.
pub(crate) const FORMAT_03: &str = crate::push::format::A2A_03;

/// The format name of a version.
pub(crate) fn format(v: Version) -> &'static str {
    match v {
        Version::V10 => FORMAT_10,
        Version::V03 => FORMAT_03,
    }
}

/// Renders official deliveries of one version.
pub(crate) struct A2aPayload(pub(crate) Version);

impl PayloadRenderer for A2aPayload {
    fn render(&self, input: &PayloadInput<'_>) -> Payload {
        let (body, content_type) = match self.0 {
            Version::V10 => (
                crate::rpc::out::to_vec(&EventOut {
                    v: Version::V10,
                    event: input.event,
                    task: input.task,
                    // The task's first event is delivered as the task itself, as the
                    // first frame of a stream is.
                    first: input.event.seq == 1,
                }),
                "application/a2a+json",
            ),
            Version::V03 => (
                crate::rpc::out::to_vec(&TaskOut::full(Version::V03, input.task)),
                "application/json",
            ),
        };
        Payload {
            content_type,
            event: input.event.name(),
            body: body.unwrap_or_default(),
        }
    }
}
