//! Push notification (webhook) configurations: the neutral model, its rules, and the
//! target-address policy shared by `set` (literal addresses) and delivery (resolved ones).

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use chrono::{DateTime, Utc};

use crate::error::Error;
use crate::model::{AgentId, Principal, TaskId, TaskKey, TaskState};
pub(crate) use crate::net::address_allowed;

/// A webhook event name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WebhookEvent {
    /// `task.submitted`
    Submitted,
    /// `task.working`
    Working,
    /// `task.completed`
    Completed,
    /// `task.failed`
    Failed,
    /// `task.canceled`
    Canceled,
}

impl WebhookEvent {
    /// Every event, in lifecycle order (the default selection).
    pub const ALL: [Self; 5] = [
        Self::Submitted,
        Self::Working,
        Self::Completed,
        Self::Failed,
        Self::Canceled,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submitted => "task.submitted",
            Self::Working => "task.working",
            Self::Completed => "task.completed",
            Self::Failed => "task.failed",
            Self::Canceled => "task.canceled",
        }
    }

    /// Parses a wire name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == name)
    }

    /// The event a state change produces, if any.
    pub fn for_state(state: TaskState) -> Option<Self> {
        match state {
            TaskState::Submitted => Some(Self::Submitted),
            TaskState::Working => Some(Self::Working),
            TaskState::Completed => Some(Self::Completed),
            TaskState::Failed => Some(Self::Failed),
            TaskState::Canceled => Some(Self::Canceled),
            _ => None,
        }
    }
}

/// How failed deliveries are retried.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (0–10).
    pub max_retries: u32,
    /// Factor between successive delays (1.0–10.0).
    pub backoff_multiplier: f64,
    /// Seconds before the first retry (0.05–60).
    pub initial_delay: f64,
}

impl RetryPolicy {
    /// Bounds of `maxRetries`.
    pub const MAX_RETRIES: (u32, u32) = (0, 10);
    /// Bounds of `backoffMultiplier`.
    pub const BACKOFF_MULTIPLIER: (f64, f64) = (1.0, 10.0);
    /// Bounds of `initialDelay` in seconds.
    pub const INITIAL_DELAY: (f64, f64) = (0.05, 60.0);
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            backoff_multiplier: 2.0,
            initial_delay: 1.0,
        }
    }
}

/// The built-in payload formats of deliveries ([`StoredPushConfig::format`]): every
/// runtime renders these (`Runtime::builder`), whatever dialect, if any, it is served in.
pub mod format {
    /// The seed dialect's payload (docs/PROTOCOL.md §7).
    pub const SEED: &str = "seed";
    /// A2A 0.3's: the whole task after the event.
    pub const A2A_03: &str = "a2a/0.3";
    /// A2A 1.0's: the event's `StreamResponse`.
    pub const A2A_10: &str = "a2a/1.0";
}

/// A validated configuration as the client set it.
#[derive(Clone, Debug, PartialEq)]
pub struct PushConfig {
    /// Target URL (http or https).
    pub url: String,
    /// Extra headers sent with each delivery.
    pub headers: Vec<(String, String)>,
    /// Which events are delivered.
    pub events: Events,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// HMAC key: deliveries carry `X-Webhook-Signature`; never returned.
    pub secret: Option<String>,
    /// Sent as `X-A2A-Notification-Token` with each delivery.
    pub token: Option<String>,
    /// Sent as `Authorization: {scheme} {credentials}` with each delivery.
    pub authorization: Option<PushAuth>,
}

impl PushConfig {
    /// A configuration for `url` with every other setting at its default: every event,
    /// the default retry policy, no secret.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            headers: Vec::new(),
            events: Events::All,
            retry: RetryPolicy::default(),
            secret: None,
            token: None,
            authorization: None,
        }
    }
}

/// Which events of a task a configuration receives.
#[derive(Clone, Debug, PartialEq)]
pub enum Events {
    /// Every event: state changes, progress updates, artifacts.
    All,
    /// Only changes into these states.
    StateChanges(Vec<WebhookEvent>),
}

impl Events {
    /// Whether an event is delivered; `changed` says whether it changed the state.
    pub fn selects(&self, event: &crate::model::TaskEvent, changed: bool) -> bool {
        match self {
            Self::All => true,
            Self::StateChanges(names) => {
                changed
                    && event.artifact.is_none()
                    && WebhookEvent::for_state(event.status.state)
                        .is_some_and(|e| names.contains(&e))
            }
        }
    }
}

/// An `Authorization` header for deliveries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushAuth {
    /// The scheme, e.g. `Bearer`.
    pub scheme: String,
    /// The credentials, if any.
    pub credentials: Option<String>,
}

/// What a configuration applies to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PushScope {
    /// Its owner.
    pub principal: Principal,
    /// The agent.
    pub agent: AgentId,
    /// One task, or every task of the principal on the agent.
    pub task: Option<TaskId>,
}

/// How configurations are addressed, which decides what replaces what.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Namespace {
    /// One configuration per scope: setting it again replaces it, with a new id.
    Scoped,
    /// Several per task, each with its own id: the same id replaces.
    Named,
}

/// A stored configuration with its delivery bookkeeping.
#[derive(Debug)]
pub struct StoredPushConfig {
    /// Its id: generated (UUID v4), or chosen by the client for a named configuration.
    pub id: String,
    /// What it applies to.
    pub scope: PushScope,
    /// How it is addressed.
    pub namespace: Namespace,
    /// The payload format of its deliveries: the name of a registered
    /// payload renderer (the dialect that created it: e.g. `a2a/1.0`).
    pub format: Arc<str>,
    /// The configuration.
    pub config: PushConfig,
    /// When it was set.
    pub created_at: DateTime<Utc>,
    /// Time of the last delivery attempt.
    pub last_used: Mutex<Option<DateTime<Utc>>>,
    /// False after too many deliveries in a row failed.
    pub active: AtomicBool,
    /// Deliveries in a row that finally failed.
    pub consecutive_failures: AtomicU32,
    /// The URL as reads show it (masked, at most 512 characters), made at first use.
    shown_url: std::sync::OnceLock<Arc<str>>,
}

impl StoredPushConfig {
    /// Deliveries in a row that must finally fail before a configuration is deactivated.
    pub const DEACTIVATE_AFTER: u32 = 10;

    /// A fresh, active configuration for a scope, with a new id.
    pub fn scoped(scope: PushScope, config: PushConfig, format: &str) -> Arc<Self> {
        Self::build(
            uuid::Uuid::new_v4().to_string(),
            scope,
            Namespace::Scoped,
            config,
            format,
        )
    }

    /// A fresh, active configuration of one task, with the client's id or a new one.
    pub fn named(
        task: &TaskKey,
        id: Option<String>,
        config: PushConfig,
        format: &str,
    ) -> Arc<Self> {
        let scope = PushScope {
            principal: task.principal.clone(),
            agent: task.agent.clone(),
            task: Some(task.task.clone()),
        };
        let id = id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        Self::build(id, scope, Namespace::Named, config, format)
    }

    /// A configuration as a store kept it, with its delivery bookkeeping.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn restore(
        id: String,
        scope: PushScope,
        namespace: Namespace,
        format: &str,
        config: PushConfig,
        created_at: DateTime<Utc>,
        last_used: Option<DateTime<Utc>>,
        active: bool,
        consecutive_failures: u32,
    ) -> Arc<Self> {
        Arc::new(Self {
            id,
            scope,
            namespace,
            format: format.into(),
            config,
            created_at,
            last_used: Mutex::new(last_used),
            active: AtomicBool::new(active),
            consecutive_failures: AtomicU32::new(consecutive_failures),
            shown_url: std::sync::OnceLock::new(),
        })
    }

    fn build(
        id: String,
        scope: PushScope,
        namespace: Namespace,
        config: PushConfig,
        format: &str,
    ) -> Arc<Self> {
        Self::restore(
            id,
            scope,
            namespace,
            format,
            config,
            Utc::now(),
            None,
            true,
            0,
        )
    }

    /// Whether deliveries still go out.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// The URL as reads and logs show it ([`redact_url`]), cut to 512 characters: made
    /// once per configuration, shared by every record of its deliveries.
    pub(crate) fn shown_url(&self) -> Arc<str> {
        self.shown_url
            .get_or_init(|| {
                let url = redact_url(&self.config.url);
                match url.char_indices().nth(512) {
                    Some((cut, _)) => format!("{}…", &url[..cut]).into(),
                    None => url.into(),
                }
            })
            .clone()
    }

    /// The time of the last delivery attempt.
    pub fn last_used(&self) -> Option<DateTime<Utc>> {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether a URL carries what may be a credential: userinfo, or a query.
pub(crate) fn url_has_credentials(raw: &str) -> bool {
    url::Url::parse(raw)
        .is_ok_and(|u| !u.username().is_empty() || u.password().is_some() || u.query().is_some())
}

/// A URL safe to log or show: the password in its userinfo and its query values become
/// `***` (they often carry tokens); an unparsable URL is not shown at all.
pub(crate) fn redact_url(raw: &str) -> String {
    let Ok(mut url) = url::Url::parse(raw) else {
        return "<invalid url>".to_string();
    };
    if url.password().is_some() {
        let _ = url.set_password(Some("***"));
    }
    if let Some(query) = url.query() {
        // Works on the raw segments: a key is kept exactly as written (re-encoding a decoded
        // key could turn `%3D` into a real `=`), a non-empty value becomes `***`.
        let masked = query
            .split('&')
            .map(|segment| match segment.split_once('=') {
                Some((key, value)) if !value.is_empty() => format!("{key}=***"),
                _ => segment.to_string(),
            })
            .collect::<Vec<_>>()
            .join("&");
        url.set_query(Some(&masked));
    }
    url.to_string()
}

/// Checks a target URL: http or https, a host, and (for a literal IP) the address policy.
///
/// # Errors
/// [`Error::InvalidParams`] on `config.url`.
pub(crate) fn check_url(raw: &str, allow_private: bool) -> Result<(), Error> {
    let url = parse(raw)?;
    let refused = |r: &str| Error::invalid("config.url", r);
    match url.host() {
        Some(url::Host::Ipv4(v4)) => {
            address_allowed(IpAddr::V4(v4), allow_private).map_err(refused)
        }
        Some(url::Host::Ipv6(v6)) => {
            address_allowed(IpAddr::V6(v6), allow_private).map_err(refused)
        }
        _ => Ok(()),
    }
}

/// Checks only the shape of a target URL: http or https, with a host. The address
/// policy is checked with [`check_url`] where the server's policy is known.
///
/// # Errors
/// [`Error::InvalidParams`] on `config.url`.
pub(crate) fn check_shape(raw: &str) -> Result<(), Error> {
    parse(raw).map(|_| ())
}

fn parse(raw: &str) -> Result<url::Url, Error> {
    let field = "config.url";
    let url =
        url::Url::parse(raw).map_err(|e| Error::invalid(field, format!("not a valid URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Error::invalid(
            field,
            "only http and https URLs are allowed",
        ));
    }
    if url.host().is_none() {
        return Err(Error::invalid(field, "the URL has no host"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_unspecified_and_multicast_are_always_refused() {
        for ip in [
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "fe80::1",
            "::",
            "ff02::1",
            "::ffff:169.254.1.1",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(address_allowed(ip, true).is_err(), "{ip}");
        }
    }

    #[test]
    fn loopback_and_private_need_the_switch() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.1.1",
            "172.16.0.1",
            "::1",
            "fd00::1",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(address_allowed(ip, false).is_err(), "{ip}");
            assert!(address_allowed(ip, true).is_ok(), "{ip}");
        }
        assert!(address_allowed("93.184.216.34".parse().expect("ip"), false).is_ok());
    }

    #[test]
    fn ipv6_forms_that_carry_an_ipv4_address_are_judged_by_it() {
        for ip in [
            "64:ff9b::a9fe:a9fe",             // NAT64 of 169.254.169.254
            "64:ff9b:1::a9fe:a9fe",           // local-use NAT64
            "2002:a9fe:a9fe::",               // 6to4
            "::169.254.169.254",              // IPv4-compatible
            "::ffff:0:169.254.169.254",       // IPv4-translated
            "::ffff:169.254.169.254",         // IPv4-mapped
            "2001:0:a9fe:a9fe::",             // Teredo server
            "2001:0:5ef5:79fd:0:0:5601:5601", // Teredo client !0xa9fea9fe
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(address_allowed(ip, true).is_err(), "{ip}");
        }
        for ip in [
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "2002:a00:1::",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(address_allowed(ip, false).is_err(), "{ip}");
            assert!(address_allowed(ip, true).is_ok(), "{ip}");
        }
        for ip in ["64:ff9b::5db8:d822", "2002:5db8:d822::1", "2606:4700::1111"] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(address_allowed(ip, false).is_ok(), "{ip}");
        }
        assert!(check_url("http://[64:ff9b::a9fe:a9fe]/", true).is_err());
        assert!(check_url("http://[::127.0.0.1]/", false).is_err());
    }

    #[test]
    fn urls_are_redacted_for_logs_and_reads() {
        assert_eq!(
            redact_url("https://user:pa55word@hooks.example.com/x?token=abc&v=1&flag"),
            "https://user:***@hooks.example.com/x?token=***&v=***&flag"
        );
        assert_eq!(redact_url("http://h/p"), "http://h/p");
        assert_eq!(redact_url("nonsense"), "<invalid url>");
        // Found by fuzzing: a key holding an encoded `=` must not leak the value behind it.
        let masked = redact_url("http://h/?u+%3Dx&%7=x&a=b=c");
        assert_eq!(masked, "http://h/?u+%3Dx&%7=***&a=***");
        let parsed = url::Url::parse(&masked).expect("parses");
        assert!(
            parsed
                .query_pairs()
                .all(|(_, v)| v.is_empty() || v == "***")
        );
    }

    #[test]
    fn urls_must_be_http_with_a_host() {
        assert!(check_url("ftp://example.com/", true).is_err());
        assert!(check_url("not a url", true).is_err());
        assert!(check_url("http://169.254.169.254/latest", true).is_err());
        assert!(check_url("http://127.0.0.1:9/x", false).is_err());
        assert!(check_url("http://127.0.0.1:9/x", true).is_ok());
        assert!(check_url("https://hooks.example.com/x", false).is_ok());
    }
}
