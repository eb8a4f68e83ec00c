//! The ListTasks page token: opaque to clients, base64url of `<micros>:<task id>` of the
//! last task of a page — a position in the list's order, so it stays valid while tasks
//! change (docs/PROTOCOL.md §10.6).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::error::Error;
use crate::model::TaskId;
use crate::store::PageToken;

/// The token of a position.
pub(crate) fn encode(t: &PageToken) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}:{}", t.timestamp_micros, t.task))
}

/// Reads a token [`encode`] made.
///
/// # Errors
/// -32602 on `pageToken` for anything else.
pub(crate) fn decode(token: &str) -> Result<PageToken, Error> {
    let bad = || Error::invalid("pageToken", "is not a token this server issued");
    let bytes = URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (micros, task) = text.split_once(':').ok_or_else(bad)?;
    let timestamp_micros = micros.parse::<i64>().map_err(|_| bad())?;
    if task.is_empty() {
        return Err(bad());
    }
    Ok(PageToken {
        timestamp_micros,
        task: TaskId::new(task),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_strangers_are_refused() {
        let t = PageToken {
            timestamp_micros: 1_700_000_000_123_456,
            task: TaskId::new("b1c2"),
        };
        assert_eq!(decode(&encode(&t)).expect("decodes"), t);
        for bad in ["", "!!", "bm9jb2xvbg", "MTIzOg"] {
            assert!(decode(bad).is_err(), "{bad}");
        }
    }
}
