//! Webhook delivery rules, free of I/O: the signature, the retry schedule, which answers
//! are retried, and the seam through which dialects render payloads. The delivering
//! actors live in `actors::webhook`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use hmac::{KeyInit, Mac};
use sha2::Sha256;

use crate::model::{AgentId, TaskEvent, TaskSnapshot};
use crate::push::RetryPolicy;

/// The `User-Agent` of every delivery.
pub(crate) const USER_AGENT: &str = "a2ad-webhook/1.0";

/// How long a receiver has to answer one attempt.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest `Retry-After` honoured.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Headers the service sets itself; configured headers cannot replace them.
pub(crate) const RESERVED_HEADERS: [&str; 9] = [
    "content-type",
    "content-length",
    "host",
    "user-agent",
    "x-webhook-event",
    "x-webhook-signature",
    "x-webhook-delivery",
    "transfer-encoding",
    "connection",
];

/// `sha256=` + lowercase hex HMAC-SHA256 of `body` keyed with `secret`: the value of a
/// webhook's `X-Webhook-Signature` header. A receiver recomputes it over the raw body
/// and compares (docs/PROTOCOL.md, "Webhooks").
///
/// ```
/// let body = br#"{"event":"task.completed"}"#;
/// let header = a2ad::signature(b"my-webhook-secret", body);
/// assert!(header.starts_with("sha256=") && header.len() == 7 + 64);
/// assert_eq!(header, a2ad::signature(b"my-webhook-secret", body));
/// assert_ne!(header, a2ad::signature(b"another-secret", body));
/// ```
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .expect("HMAC accepts keys of any length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    for b in digest {
        out.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
    }
    out
}

/// Attempts in all: the first one plus the retries.
pub(crate) fn max_attempts(policy: &RetryPolicy) -> u32 {
    policy.max_retries + 1
}

/// The wait after attempt `k` (from 1) failed: `initialDelay × backoffMultiplier^(k-1)`.
pub(crate) fn backoff(policy: &RetryPolicy, failed_attempt: u32) -> Duration {
    let exp = i32::try_from(failed_attempt.saturating_sub(1)).unwrap_or(i32::MAX);
    let secs = policy.initial_delay * policy.backoff_multiplier.powi(exp);
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

/// What one attempt came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The receiver answered with this status (and `Retry-After` seconds, if any).
    Status(u16, Option<u64>),
    /// No answer within [`ATTEMPT_TIMEOUT`].
    Timeout,
    /// The connection failed (refused, reset, TLS, DNS).
    Connect(String),
    /// The target address is not allowed (SSRF guard); never retried.
    Refused(String),
}

/// What to do after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Delivered.
    Delivered,
    /// Try again, after this wait if the receiver asked for one.
    Retry(Option<Duration>),
    /// Give up now.
    Fail,
}

/// Connection errors, time-outs, 408, 429 and 5xx are retried; 2xx is success; anything
/// else (other 4xx, 3xx: redirects are not followed) fails at once.
pub(crate) fn verdict(outcome: &Outcome) -> Verdict {
    match outcome {
        Outcome::Status(s, _) if (200..300).contains(s) => Verdict::Delivered,
        Outcome::Status(429, retry_after) => {
            Verdict::Retry(retry_after.map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER)))
        }
        Outcome::Status(s, _) if *s == 408 || (500..600).contains(s) => Verdict::Retry(None),
        Outcome::Status(..) | Outcome::Refused(_) => Verdict::Fail,
        Outcome::Timeout | Outcome::Connect(_) => Verdict::Retry(None),
    }
}

/// Everything a delivery's payload may be made of.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PayloadInput<'a> {
    /// The agent.
    pub agent_id: &'a AgentId,
    /// The event delivered.
    pub event: &'a TaskEvent,
    /// The task as that event left it.
    pub task: &'a TaskSnapshot,
    /// The agent's mean response time in milliseconds (0 before any task finished).
    pub estimated_ms: u64,
    /// This attempt, from 1.
    pub attempt: u32,
    /// Attempts in all.
    pub max_attempts: u32,
}

/// One attempt's body and the headers that describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Payload {
    /// `Content-Type`.
    pub content_type: &'static str,
    /// `X-Webhook-Event`.
    pub event: String,
    /// The exact bytes sent (and signed).
    pub body: Vec<u8>,
}

/// Renders deliveries in one payload format. Each dialect registers its own under a name
/// that push configurations carry (`StoredPushConfig::format`), so the delivering core
/// never needs to know a dialect.
pub(crate) trait PayloadRenderer: Send + Sync + 'static {
    /// The body of one attempt.
    fn render(&self, input: &PayloadInput<'_>) -> Payload;
}

/// How one attempt ended, as the recent-deliveries read shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttemptEnd {
    /// The receiver took it (2xx).
    Delivered,
    /// It failed and will be tried again.
    Retrying,
    /// It failed for good (no attempts left, or not worth retrying).
    Failed,
    /// Not attempted: the configuration was deactivated.
    Skipped,
}

impl AttemptEnd {
    /// Its name on the wire.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Retrying => "retrying",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
        }
    }
}

/// One delivery attempt, kept for its owner's recent-deliveries read.
#[derive(Clone, Debug)]
pub(crate) struct AttemptRecord {
    /// When the attempt ended.
    pub at: chrono::DateTime<chrono::Utc>,
    /// `X-Webhook-Delivery`: the same on every attempt of one delivery.
    pub delivery: uuid::Uuid,
    /// The task, as its owner names it.
    pub task: crate::model::TaskId,
    /// The push configuration's id.
    pub config: String,
    /// The target, masked as reads show it (shared with the configuration).
    pub url: Arc<str>,
    /// `X-Webhook-Event`.
    pub event: &'static str,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// Attempts in all.
    pub max_attempts: u32,
    /// How it ended.
    pub end: AttemptEnd,
    /// The receiver's HTTP status, when it answered.
    pub status: Option<u16>,
    /// Why it failed without an answer (time-out, connection, refused address).
    pub error: Option<String>,
    /// From the request's start to its answer (or failure).
    pub latency: Duration,
    /// When the next attempt is due (`Retrying` only).
    pub next_attempt: Option<chrono::DateTime<chrono::Utc>>,
}

impl AttemptRecord {
    /// The status and error of an outcome.
    pub(crate) fn outcome_fields(outcome: &Outcome) -> (Option<u16>, Option<String>) {
        match outcome {
            Outcome::Status(s, _) => (Some(*s), None),
            Outcome::Timeout => (None, Some("timeout".into())),
            Outcome::Connect(e) => (None, Some(format!("connection failed: {e}"))),
            Outcome::Refused(e) => (None, Some(format!("address refused: {e}"))),
        }
    }
}

/// The latest delivery attempts of each owner (principal and agent), in memory, bounded:
/// at most [`RecentDeliveries::PER_OWNER`] attempts an owner (the oldest go first) and
/// [`RecentDeliveries::OWNERS`] owners (the one whose latest attempt is oldest goes
/// first). Written by the webhook actors (a short lock, no I/O), read by the owner's
/// recent-deliveries request. Not kept across restarts; on a cluster, each node keeps the
/// attempts it made.
#[derive(Default)]
pub(crate) struct RecentDeliveries {
    owners: std::sync::Mutex<std::collections::HashMap<Owner, VecDeque<Arc<AttemptRecord>>>>,
}

/// Whose attempts: a principal on an agent.
type Owner = (crate::model::Principal, AgentId);

impl RecentDeliveries {
    /// Attempts kept per owner.
    pub(crate) const PER_OWNER: usize = 200;
    /// Owners kept.
    pub(crate) const OWNERS: usize = 1024;

    /// Keeps one attempt of `owner`.
    pub(crate) fn record(&self, owner: (crate::model::Principal, AgentId), record: AttemptRecord) {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        if !owners.contains_key(&owner) && owners.len() >= Self::OWNERS {
            let stalest = owners
                .iter()
                .min_by_key(|(_, q)| q.back().map(|r| r.at))
                .map(|(k, _)| k.clone());
            if let Some(k) = stalest {
                owners.remove(&k);
            }
        }
        let q = owners.entry(owner).or_default();
        if q.len() >= Self::PER_OWNER {
            q.pop_front();
        }
        q.push_back(Arc::new(record));
    }

    /// `owner`'s attempts, newest first, at most `limit`, only of `task` when given.
    pub(crate) fn of(
        &self,
        owner: &Owner,
        task: Option<&str>,
        limit: usize,
    ) -> Vec<Arc<AttemptRecord>> {
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        owners.get(owner).map_or_else(Vec::new, |q| {
            q.iter()
                .rev()
                .filter(|r| task.is_none_or(|t| r.task.as_str() == t))
                .take(limit)
                .cloned()
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(task: &str, n: u32) -> AttemptRecord {
        AttemptRecord {
            at: chrono::Utc::now(),
            delivery: uuid::Uuid::new_v4(),
            task: task.into(),
            config: "c".into(),
            url: "http://example.com/hook".into(),
            event: "task.completed",
            attempt: n,
            max_attempts: 4,
            end: AttemptEnd::Delivered,
            status: Some(200),
            error: None,
            latency: Duration::from_millis(1),
            next_attempt: None,
        }
    }

    fn owner(p: &str) -> (crate::model::Principal, AgentId) {
        (crate::model::Principal::new(p), AgentId::new("echo"))
    }

    #[test]
    fn recent_deliveries_are_kept_per_owner_newest_first_and_bounded() {
        let recent = RecentDeliveries::default();
        for n in 0..(RecentDeliveries::PER_OWNER as u32 + 10) {
            recent.record(
                owner("alice"),
                attempt(if n % 2 == 0 { "even" } else { "odd" }, n),
            );
        }
        recent.record(owner("bob"), attempt("bobs", 1));
        let all = recent.of(&owner("alice"), None, usize::MAX);
        assert_eq!(
            all.len(),
            RecentDeliveries::PER_OWNER,
            "the oldest went first"
        );
        assert_eq!(
            all[0].attempt,
            RecentDeliveries::PER_OWNER as u32 + 9,
            "newest first"
        );
        assert!(
            all.iter().all(|r| r.task.as_str() != "bobs"),
            "only the owner's"
        );
        let odd = recent.of(&owner("alice"), Some("odd"), 3);
        assert_eq!(odd.len(), 3);
        assert!(odd.iter().all(|r| r.task.as_str() == "odd"));
        assert!(recent.of(&owner("carol"), None, 10).is_empty());

        // Past the owner bound, the owner whose latest attempt is oldest is forgotten.
        // (Their times are later than alice's and bob's, and distinct.)
        let later = chrono::Utc::now() + chrono::Duration::seconds(60);
        for i in 0..RecentDeliveries::OWNERS {
            let mut a = attempt("t", 1);
            a.at = later + chrono::Duration::milliseconds(i as i64);
            recent.record(owner(&format!("p{i}")), a);
        }
        assert!(
            recent.of(&owner("alice"), None, 1).is_empty(),
            "alice was the stalest"
        );
        assert_eq!(recent.of(&owner("p0"), None, 1).len(), 1);
        let owners = recent.owners.lock().map(|o| o.len()).unwrap_or(0);
        assert_eq!(owners, RecentDeliveries::OWNERS);
    }

    #[test]
    fn the_signature_is_lowercase_hex_hmac_sha256() {
        // RFC 4231 test case 2.
        let sig = signature(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn backoff_grows_geometrically_from_the_initial_delay() {
        let p = RetryPolicy {
            max_retries: 3,
            backoff_multiplier: 2.0,
            initial_delay: 0.1,
        };
        assert_eq!(max_attempts(&p), 4);
        let waits: Vec<_> = (1..=3).map(|k| backoff(&p, k).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400]);
    }

    #[test]
    fn which_answers_are_retried() {
        assert_eq!(verdict(&Outcome::Status(200, None)), Verdict::Delivered);
        assert_eq!(verdict(&Outcome::Status(204, None)), Verdict::Delivered);
        for s in [408, 500, 502, 503] {
            assert_eq!(
                verdict(&Outcome::Status(s, None)),
                Verdict::Retry(None),
                "{s}"
            );
        }
        assert_eq!(
            verdict(&Outcome::Status(429, Some(3))),
            Verdict::Retry(Some(Duration::from_secs(3)))
        );
        assert_eq!(
            verdict(&Outcome::Status(429, Some(600))),
            Verdict::Retry(Some(MAX_RETRY_AFTER))
        );
        for s in [301, 302, 400, 401, 404, 410] {
            assert_eq!(verdict(&Outcome::Status(s, None)), Verdict::Fail, "{s}");
        }
        assert_eq!(verdict(&Outcome::Timeout), Verdict::Retry(None));
        assert_eq!(
            verdict(&Outcome::Connect("refused".into())),
            Verdict::Retry(None)
        );
        assert_eq!(
            verdict(&Outcome::Refused("link-local".into())),
            Verdict::Fail
        );
    }
}
