//! The bindings of the official operations ([`super::ops`]), each a codec: it decodes its
//! framing into an operation's typed request and encodes the typed response. JSON-RPC
//! (0.3 and 1.0), HTTP+JSON and gRPC (1.0) read their names from the one operation table
//! ([`super::ops::TABLE`]) and their errors from the one error table
//! ([`super::errors::TABLE`]). Admission happened before, at the edge (`http::admit`).

pub(crate) mod grpc;
pub(crate) mod jsonrpc;
pub(crate) mod rest;

#[cfg(test)]
mod tests {
    use serde_json::Value;
    use tonic_types::StatusExt as _;

    use super::{grpc, rest};
    use crate::error::Error;
    use crate::model::{AgentId, TaskId, TaskState};
    use crate::rpc::a2a::Version;
    use crate::rpc::a2a::errors::{self, TABLE, code_name};
    use crate::rpc::{Refusal, Reply, RpcError};

    /// Every error a call can end in, and every refusal before one.
    fn every_error() -> Vec<RpcError> {
        let t = || TaskId::new("t1");
        let library = [
            Error::invalid("message.role", "is required"),
            Error::UnsupportedContentType {
                field: "message.parts[0]".into(),
                reason: "image/png is not accepted".into(),
            },
            Error::TaskNotFound { task: t() },
            Error::TaskFinished {
                task: t(),
                state: TaskState::Completed,
            },
            Error::TaskCanceled { task: t() },
            Error::CancelFailed {
                task: t(),
                state: TaskState::Failed,
            },
            Error::SubscriptionFailed {
                task: Some(t()),
                reason: "finished".into(),
            },
            Error::TaskInProgress { task: t() },
            Error::TaskNotContinuable {
                task: t(),
                state: TaskState::Working,
            },
            Error::ContextMismatch { task: t() },
            Error::TooManyTasks,
            Error::PushNotSupported,
            Error::AgentNotFound,
            Error::Busy,
            Error::ShuttingDown,
            Error::Internal,
        ];
        let agent = || AgentId::new("echo");
        let refusals = [
            Refusal::Unauthorized("no key"),
            Refusal::AgentNotFound(agent()),
            Refusal::Forbidden(agent()),
            Refusal::RateLimited(3),
            Refusal::MethodNotAllowed,
            Refusal::UnsupportedMediaType,
            Refusal::TooLarge(1024),
            Refusal::BodyTimeout,
            Refusal::BodyUnreadable,
            Refusal::VersionNotSupported {
                served: Version::V10,
                requested: Some("0.3".into()),
                agent_url: "http://h/api/v1/a2a/echo".into(),
            },
        ];
        let mut out: Vec<RpcError> = library
            .iter()
            .map(|e| errors::rpc_error(Version::V10, e))
            .collect();
        out.extend(refusals.iter().map(|r| errors::refusal(Version::V10, r)));
        // Every row of the table, bare, as the framing's own errors are.
        out.extend(
            TABLE
                .iter()
                .map(|row| errors::dress(Version::V10, RpcError::new(row.code, "m"))),
        );
        out
    }

    /// The one error table holds on every binding: JSON-RPC answers the code with the row's
    /// reason, HTTP+JSON the row's (or the carried) HTTP status with the row's `google.rpc`
    /// name, gRPC the same `google.rpc.Code`; all three carry the same `ErrorInfo.reason`.
    #[test]
    fn every_error_has_one_code_status_and_reason_on_every_binding() {
        let all = every_error();
        assert!(all.len() > 40);
        for e in &all {
            let row = errors::row_of(e.code);
            assert_eq!(row.code, e.code, "{} is in the error table", e.code);
            let (http, code) = errors::statuses(e);
            // JSON-RPC: the code, and the reason of its row (TOO_MANY_TASKS is the queue's
            // variant of RATE_LIMITED).
            let Reply::Json { body, status, .. } = Reply::error(None, e) else {
                panic!("json");
            };
            let v: Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(v["error"]["code"], e.code);
            assert_eq!(status, e.status);
            let reason = v["error"]["data"][0]["reason"].as_str().expect("reason");
            let queue = e.code == errors::RATE_LIMITED && reason == "TOO_MANY_TASKS";
            assert!(reason == row.reason || queue, "{reason} vs {}", row.reason);
            // HTTP+JSON.
            let Reply::Json {
                body, status: rs, ..
            } = rest::status_reply(e)
            else {
                panic!("json");
            };
            let r: Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(rs, http, "{}", e.code);
            if e.status == hyper::StatusCode::OK {
                assert_eq!(rs, row.http, "{}: the row's HTTP status", e.code);
            }
            assert_eq!(r["error"]["code"], http.as_u16());
            assert_eq!(r["error"]["status"], code_name(code));
            assert_eq!(r["error"]["details"][0]["reason"], reason);
            // gRPC.
            let s = grpc::status(e);
            assert_eq!(s.code(), code, "{}", e.code);
            let details = s.get_error_details();
            let info = details.error_info().expect("ErrorInfo");
            assert_eq!(info.reason, reason);
            assert_eq!(info.domain, "a2a-protocol.org");
        }
    }
}
