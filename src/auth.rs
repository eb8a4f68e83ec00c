//! API keys and client certificates: who is calling, and which agents they may use.
//!
//! Keys are stored as SHA-256 digests and looked up by the digest of the presented key,
//! so no plaintext key needs to sit in memory or a file and the lookup leaks no timing
//! about how much of a key matched.
//!
//! A client certificate (mTLS) is verified by the TLS handshake against
//! `server.tls.client_ca_file`; here its names are matched against
//! `[[auth.certificates]]` once per connection ([`KeyStore::certificate_caller`]). A
//! request on such a connection needs no key; if it carries one anyway, the key must
//! name the same principal (two credentials never disagree silently).
//!
//! An `Authorization: Bearer` value shaped like a JWT, when `[[auth.oidc]]` issuers are
//! configured, is a token, verified in `auth/oidc.rs`; any other value is a key. The
//! configuration refuses keys shaped like a JWT then, so the two never mix up.

mod oidc;

pub(crate) use crate::config::looks_like_jwt;
pub(crate) use oidc::{Oidc, TokenError};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use hyper::HeaderMap;
use sha2::{Digest, Sha256};

use crate::config::{ApiKeyConfig, Config};
use crate::model::{AgentId, Principal};

/// What a valid key grants.
#[derive(Debug)]
pub(crate) struct Caller {
    /// The owner of everything this key creates.
    pub principal: Principal,
    /// Dense index of a configured principal (for per-principal tables); `None` for a
    /// token's principal, which is not known in advance.
    pub principal_index: Option<usize>,
    pub(crate) agents: Option<HashSet<String>>,
}

impl Caller {
    /// Whether this caller may use the agent.
    pub(crate) fn may_use(&self, agent: &AgentId) -> bool {
        self.agents
            .as_ref()
            .is_none_or(|set| set.contains(agent.as_str()))
    }
}

/// The principal of the connection's verified client certificate, carried in each of its
/// requests' extensions.
#[derive(Clone, Debug)]
pub(crate) struct PeerCertificate(pub(crate) Arc<Caller>);

impl PeerCertificate {
    /// The certificate's caller, from a request's extensions.
    pub(crate) fn of(extensions: &hyper::http::Extensions) -> Option<&Arc<Caller>> {
        extensions.get::<Self>().map(|p| &p.0)
    }
}

/// Why a request is not authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AuthError {
    /// Neither `x-api-key` nor `Authorization: Bearer` was sent.
    Missing,
    /// The key is not configured (or the Authorization header is not Bearer).
    Unknown,
    /// Two credentials differ: `x-api-key` and the Bearer token, two values of one of
    /// those headers, or a key and the client certificate.
    Conflict,
    /// A bearer token (JWT) that does not verify.
    Token(TokenError),
}

impl AuthError {
    /// A message for the client.
    pub(crate) fn message(self) -> &'static str {
        match self {
            Self::Missing => "missing credentials: send x-api-key or Authorization: Bearer",
            Self::Unknown => "invalid API key or token",
            Self::Conflict => {
                "the request carries different credentials (x-api-key, Authorization, client certificate); send one"
            }
            Self::Token(e) => e.message(),
        }
    }
}

/// The configured keys.
#[derive(Debug)]
pub(crate) struct KeyStore {
    by_digest: HashMap<[u8; 32], Arc<Caller>, foldhash::fast::RandomState>,
    /// Client certificates by identity (a subject alternative name or common name).
    by_identity: HashMap<String, Arc<Caller>>,
    /// OpenID Connect issuers, when configured.
    oidc: Option<Oidc>,
    principals: usize,
    /// Principal names by index.
    names: Vec<String>,
}

impl KeyStore {
    /// Builds the store. With no key configured, a random development key is generated
    /// and returned so the binary can print it once: the server never runs open.
    /// `dev_key`, when given, is that key (a reload keeps the one printed at start).
    pub(crate) fn from_config(config: &Config, dev_key: Option<&str>) -> (Self, Option<String>) {
        let (keys, dev_key) = if config.api_keys.is_empty() && config.auth.certificates.is_empty() {
            let key = dev_key.map_or_else(
                || format!("a2ad-dev-{}", uuid::Uuid::new_v4().simple()),
                str::to_string,
            );
            (vec![ApiKeyConfig::new("dev", &key)], Some(key))
        } else {
            (config.api_keys.clone(), None)
        };
        let mut principal_ids: HashMap<String, usize> = HashMap::new();
        let mut caller = |name: &str, agents: &[String]| {
            let next = principal_ids.len();
            let index = *principal_ids.entry(name.to_string()).or_insert(next);
            Arc::new(Caller {
                principal: Principal::new(name),
                principal_index: Some(index),
                agents: (!agents.iter().any(|a| a == "*"))
                    .then(|| agents.iter().cloned().collect()),
            })
        };
        let by_digest = keys
            .iter()
            .map(|k| (digest_of_configured(&k.key), caller(&k.name, &k.agents)))
            .collect();
        let by_identity = config
            .auth
            .certificates
            .iter()
            .map(|c| (c.identity.clone(), caller(&c.name, &c.agents)))
            .collect();
        let principals = principal_ids.len();
        let mut names = vec![String::new(); principals];
        for (name, i) in principal_ids {
            names[i] = name;
        }
        (
            Self {
                by_digest,
                by_identity,
                oidc: Oidc::from_config(&config.auth.oidc),
                principals,
                names,
            },
            dev_key,
        )
    }

    /// A principal's name by index.
    pub(crate) fn principal_name(&self, index: usize) -> &str {
        self.names.get(index).map_or("", String::as_str)
    }

    /// Distinct principals.
    pub(crate) fn principals(&self) -> usize {
        self.principals
    }

    /// Authenticates a request by `x-api-key` or `Authorization: Bearer`, or by the
    /// connection's client certificate (`peer`, from [`KeyStore::certificate_caller`]).
    ///
    /// # Errors
    /// [`AuthError`] when no usable credential is present, or when a key and the
    /// certificate name different principals.
    pub(crate) async fn authenticate(
        &self,
        headers: &HeaderMap,
        peer: Option<&Arc<Caller>>,
    ) -> Result<Arc<Caller>, AuthError> {
        let (api_key, authorization) = credentials(headers)?;
        let bearer = match authorization {
            None => None,
            Some(v) => Some(bearer_token(v).ok_or(AuthError::Unknown)?),
        };
        if let (Some(oidc), Some(token)) = (&self.oidc, bearer)
            && looks_like_jwt(token)
        {
            if api_key.is_some_and(|k| k != token) {
                return Err(AuthError::Conflict);
            }
            // Boxed: a verification may wait for the issuer's keys, and its state must
            // not make every request's future (keys included) that large.
            let caller = Box::pin(oidc.verify(token)).await.map_err(|e| {
                tracing::debug!(reason = e.message(), "bearer token refused");
                AuthError::Token(e)
            })?;
            return match peer {
                Some(peer) if peer.principal != caller.principal => Err(AuthError::Conflict),
                _ => Ok(caller),
            };
        }
        let key = match (api_key, bearer, peer) {
            (None, None, Some(peer)) => return Ok(peer.clone()),
            (None, None, None) => return Err(AuthError::Missing),
            (Some(a), Some(b), _) if a != b => return Err(AuthError::Conflict),
            (Some(k), _, _) | (None, Some(k), _) => k,
        };
        let digest: [u8; 32] = Sha256::digest(key).into();
        let caller = self.by_digest.get(&digest).ok_or(AuthError::Unknown)?;
        match peer {
            Some(peer) if peer.principal != caller.principal => Err(AuthError::Conflict),
            _ => Ok(caller.clone()),
        }
    }

    /// The principal a verified client certificate (DER) stands for: the first of its
    /// subject alternative names (DNS names, e-mail addresses, URIs) that is a configured
    /// identity, or — when it has none of those names — its subject's common name.
    pub(crate) fn certificate_caller(&self, leaf: &[u8]) -> Option<Arc<Caller>> {
        if self.by_identity.is_empty() {
            return None;
        }
        let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
        let mut sans = Vec::new();
        if let Ok(Some(ext)) = cert.subject_alternative_name() {
            use x509_parser::extensions::GeneralName;
            for name in &ext.value.general_names {
                match name {
                    GeneralName::DNSName(n) | GeneralName::RFC822Name(n) | GeneralName::URI(n) => {
                        sans.push(*n);
                    }
                    _ => {}
                }
            }
        }
        if sans.is_empty() {
            return cert
                .subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok())
                .find_map(|cn| self.by_identity.get(cn).cloned());
        }
        sans.into_iter()
            .find_map(|n| self.by_identity.get(n).cloned())
    }
}

impl KeyStore {
    /// The OpenID Connect issuers, when configured.
    pub(crate) fn oidc(&self) -> Option<&Oidc> {
        self.oidc.as_ref()
    }
}

/// `x-api-key`, as a constant: a lookup by `&str` parses and lower-cases the name each time.
const X_API_KEY: hyper::header::HeaderName = hyper::header::HeaderName::from_static("x-api-key");

/// The request's `x-api-key` and `Authorization` values, each of which may repeat only
/// with the same value: two different credentials in one request are refused, never
/// resolved by picking one. One pass over the headers: a lookup of `x-api-key`, a name
/// outside HTTP's standard table, would hash it, and two lookups cost more than a pass
/// over the handful of headers a request carries.
type Credentials<'h> = (Option<&'h [u8]>, Option<&'h [u8]>);

fn credentials(headers: &HeaderMap) -> Result<Credentials<'_>, AuthError> {
    let (mut api_key, mut authorization) = (None, None);
    for (name, value) in headers {
        let slot = if *name == X_API_KEY {
            &mut api_key
        } else if name == hyper::header::AUTHORIZATION {
            &mut authorization
        } else {
            continue;
        };
        match slot {
            Some(first) if *first != value.as_bytes() => return Err(AuthError::Conflict),
            Some(_) => {}
            None => *slot = Some(value.as_bytes()),
        }
    }
    Ok((api_key, authorization))
}

fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ")).then(|| rest.trim_ascii())
}

fn digest_of_configured(key: &str) -> [u8; 32] {
    if let Some(hex) = key.strip_prefix("sha256:") {
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            // Validated as 64 hex digits by `Config::validated`.
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0);
        }
        return out;
    }
    Sha256::digest(key.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn store() -> KeyStore {
        let c = Config {
            api_keys: vec![
                ApiKeyConfig::new("alice", "key-a"),
                ApiKeyConfig {
                    name: "bob".into(),
                    // sha256("key-b")
                    key: format!("sha256:{}", hex(&Sha256::digest(b"key-b"))),
                    agents: vec!["echo".into()],
                },
            ],
            ..Config::default()
        };
        KeyStore::from_config(&c, None).0
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[tokio::test]
    async fn keys_are_accepted_from_either_header_and_hashed_keys_work() {
        let s = store();
        assert_eq!(
            s.authenticate(&headers(&[("x-api-key", "key-a")]), None)
                .await
                .expect("ok")
                .principal
                .as_str(),
            "alice"
        );
        let bob = s
            .authenticate(&headers(&[("authorization", "Bearer key-b")]), None)
            .await
            .expect("ok");
        assert_eq!(bob.principal.as_str(), "bob");
        assert!(bob.may_use(&"echo".into()) && !bob.may_use(&"other".into()));
        assert!(
            s.authenticate(
                &headers(&[("x-api-key", "key-a"), ("authorization", "bearer key-a")]),
                None
            )
            .await
            .is_ok()
        );
    }

    #[tokio::test]
    async fn missing_unknown_and_conflicting_credentials_are_refused() {
        let s = store();
        assert_eq!(
            s.authenticate(&headers(&[]), None).await.unwrap_err(),
            AuthError::Missing
        );
        assert_eq!(
            s.authenticate(&headers(&[("x-api-key", "nope")]), None)
                .await
                .unwrap_err(),
            AuthError::Unknown
        );
        assert_eq!(
            s.authenticate(&headers(&[("authorization", "Basic a2V5LWE=")]), None)
                .await
                .unwrap_err(),
            AuthError::Unknown
        );
        assert_eq!(
            s.authenticate(
                &headers(&[("x-api-key", "key-a"), ("authorization", "Bearer key-b")]),
                None
            )
            .await
            .unwrap_err(),
            AuthError::Conflict
        );
    }

    #[tokio::test]
    async fn repeated_credential_headers_must_agree() {
        let s = store();
        let mut h = HeaderMap::new();
        h.append("x-api-key", HeaderValue::from_static("key-a"));
        h.append("x-api-key", HeaderValue::from_static("key-a"));
        assert!(
            s.authenticate(&h, None).await.is_ok(),
            "the same value twice is one key"
        );
        h.append("x-api-key", HeaderValue::from_static("key-b"));
        assert_eq!(
            s.authenticate(&h, None).await.unwrap_err(),
            AuthError::Conflict
        );
        let mut h = HeaderMap::new();
        h.append("authorization", HeaderValue::from_static("Bearer key-a"));
        h.append("authorization", HeaderValue::from_static("Bearer key-b"));
        assert_eq!(
            s.authenticate(&h, None).await.unwrap_err(),
            AuthError::Conflict
        );
    }

    #[tokio::test]
    async fn no_configured_key_means_a_generated_development_key() {
        let (s, key) = KeyStore::from_config(&Config::default(), None);
        let key = key.expect("a dev key");
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_str(&key).expect("ascii"));
        assert!(s.authenticate(&h, None).await.is_ok());
    }
}
