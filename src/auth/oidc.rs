//! OpenID Connect bearer tokens (`[[auth.oidc]]`): a JWT signed by a configured issuer's
//! key names a principal and the agents it may use.
//!
//! The checks, in order: the header's `alg` is one the issuer allows (never `none`, never a
//! shared-secret algorithm: the configuration admits asymmetric ones only); the token's
//! `iss` names a configured issuer; its `kid` is among that issuer's keys — fetched from the
//! JWK Set (or found through the discovery document), cached, fetched again when older
//! than `jwks_max_age_seconds` or when a token names an unknown `kid`, but at most once per
//! `jwks_refresh_min_seconds` and each fetch within `fetch_timeout_seconds`; then
//! jsonwebtoken verifies the signature and `exp`, `nbf` (with `leeway_seconds`), `iss`
//! and `aud`. The signature checks are jsonwebtoken's (aws-lc-rs); nothing here is
//! hand-written cryptography.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::Caller;
use crate::config::OidcConfig;
use crate::model::Principal;

/// Why a token is refused (the message goes to the client: it names no key and no
/// claim's value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenError {
    /// Not a JWT, or its header or claims do not parse.
    Malformed,
    /// Its `alg` is not one the issuer allows.
    Algorithm,
    /// Its `iss` is not a configured issuer.
    Issuer,
    /// No key of the issuer has its `kid` (after fetching them again, if allowed).
    UnknownKey,
    /// The issuer's keys could not be fetched (down, slow, not a JWK Set).
    KeysUnavailable,
    /// The signature does not verify.
    Signature,
    /// Past `exp` (beyond the leeway).
    Expired,
    /// Before `nbf` (beyond the leeway).
    NotYetValid,
    /// `aud` names none of the configured audiences.
    Audience,
    /// A required claim (`exp`, `iss`, `aud`, the principal claim) is missing or not a
    /// string.
    Claims,
}

impl TokenError {
    pub(crate) fn message(self) -> &'static str {
        match self {
            Self::Malformed => "invalid bearer token: not a valid JWT",
            Self::Algorithm => "invalid bearer token: its signature algorithm is not accepted",
            Self::Issuer => "invalid bearer token: unknown issuer",
            Self::UnknownKey => "invalid bearer token: signed with an unknown key",
            Self::KeysUnavailable => {
                "invalid bearer token: the issuer's signing keys cannot be fetched now"
            }
            Self::Signature => "invalid bearer token: the signature does not verify",
            Self::Expired => "invalid bearer token: expired",
            Self::NotYetValid => "invalid bearer token: not yet valid",
            Self::Audience => "invalid bearer token: not issued for this server (aud)",
            Self::Claims => "invalid bearer token: a required claim is missing",
        }
    }
}

/// The configured issuers.
pub(crate) struct Oidc {
    issuers: Vec<Issuer>,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.issuers.iter().map(|i| &i.config.issuer))
            .finish()
    }
}

struct Issuer {
    config: OidcConfig,
    algorithms: Vec<Algorithm>,
    prefix: String,
    /// Agents every token may use (`None`: all), when no claim lists them.
    agents: Option<HashSet<String>>,
    keys: RwLock<Arc<Keys>>,
    /// Serializes fetches; holds when the last one started.
    fetching: Mutex<Option<Instant>>,
    /// The JWK Set's URL once known (configured, or from the discovery document).
    jwks_url: RwLock<Option<String>>,
    http: reqwest::Client,
}

/// An issuer's keys as fetched last.
#[derive(Default)]
struct Keys {
    by_kid: HashMap<String, Arc<DecodingKey>>,
    /// Keys without a `kid`: used for a token without one.
    anonymous: Vec<Arc<DecodingKey>>,
    fetched: Option<Instant>,
}

/// A JWK Set or discovery document is never larger than this.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;

impl Oidc {
    /// The issuers of the configuration; `None` when there are none.
    pub(crate) fn from_config(configs: &[OidcConfig]) -> Option<Self> {
        if configs.is_empty() {
            return None;
        }
        let issuers = configs
            .iter()
            .map(|c| Issuer {
                algorithms: c
                    .algorithms
                    .iter()
                    .filter_map(|a| a.parse::<Algorithm>().ok())
                    .collect(),
                prefix: c.prefix(),
                agents: (!c.agents.iter().any(|a| a == "*"))
                    .then(|| c.agents.iter().cloned().collect()),
                keys: RwLock::new(Arc::default()),
                fetching: Mutex::new(None),
                jwks_url: RwLock::new(c.jwks_url.clone()),
                http: reqwest::Client::builder()
                    .timeout(c.fetch_timeout())
                    .connect_timeout(c.fetch_timeout())
                    .redirect(reqwest::redirect::Policy::limited(3))
                    .build()
                    .unwrap_or_default(),
                config: c.clone(),
            })
            .collect();
        Some(Self { issuers })
    }

    /// Fetches every issuer's keys once, so the first token does not wait for them.
    pub(crate) async fn prefetch(&self) {
        for issuer in &self.issuers {
            if let Err(e) = issuer.refresh(true).await {
                tracing::warn!(issuer = %issuer.config.name, error = %e, "cannot fetch the OpenID Connect signing keys yet");
            }
        }
    }

    /// Verifies a token; the caller it names.
    ///
    /// # Errors
    /// [`TokenError`] saying why it is refused.
    pub(crate) async fn verify(&self, token: &[u8]) -> Result<Arc<Caller>, TokenError> {
        let token = std::str::from_utf8(token).map_err(|_| TokenError::Malformed)?;
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        #[derive(serde::Deserialize)]
        struct Iss {
            iss: Option<String>,
        }
        // The issuer picks the keys; the signature (checked below) then vouches for it.
        let claimed: Iss = jsonwebtoken::dangerous::insecure_decode_claims(token)
            .map_err(|_| TokenError::Malformed)?;
        let issuer = claimed
            .iss
            .and_then(|iss| self.issuers.iter().find(|i| i.config.issuer == iss))
            .ok_or(TokenError::Issuer)?;
        if !issuer.algorithms.contains(&header.alg) {
            return Err(TokenError::Algorithm);
        }
        let key = issuer.key(header.kid.as_deref()).await?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = issuer.config.leeway_seconds as u64;
        validation.validate_nbf = true;
        validation.set_issuer(&[&issuer.config.issuer]);
        validation.set_audience(&issuer.config.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key, &validation)
            .map_err(|e| {
                use jsonwebtoken::errors::ErrorKind as K;
                match e.kind() {
                    K::ExpiredSignature => TokenError::Expired,
                    K::ImmatureSignature => TokenError::NotYetValid,
                    K::InvalidAudience => TokenError::Audience,
                    K::InvalidIssuer => TokenError::Issuer,
                    K::InvalidSignature => TokenError::Signature,
                    K::InvalidAlgorithm | K::InvalidAlgorithmName => TokenError::Algorithm,
                    K::MissingRequiredClaim(_) => TokenError::Claims,
                    _ => TokenError::Malformed,
                }
            })?;
        issuer.caller(&data.claims)
    }
}

impl Issuer {
    /// The caller a verified token's claims name.
    fn caller(&self, claims: &serde_json::Map<String, Value>) -> Result<Arc<Caller>, TokenError> {
        let subject = claims
            .get(&self.config.principal_claim)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty() && s.len() <= 1024)
            .ok_or(TokenError::Claims)?;
        let agents = match &self.config.agents_claim {
            None => self.agents.clone(),
            Some(claim) => {
                let entries: Vec<&str> = match claims.get(claim) {
                    Some(Value::String(s)) => s.split_ascii_whitespace().collect(),
                    Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
                    _ => Vec::new(),
                };
                let named: Vec<&str> = entries
                    .into_iter()
                    .filter_map(|e| e.strip_prefix(self.config.agents_prefix.as_str()))
                    .collect();
                if named.contains(&"*") {
                    None
                } else {
                    Some(named.into_iter().map(String::from).collect())
                }
            }
        };
        Ok(Arc::new(Caller {
            principal: Principal::new(format!("{}{subject}", self.prefix)),
            principal_index: None,
            agents,
        }))
    }

    /// The key for a token's `kid`: from the cache, or after fetching the keys again when
    /// they are stale or the `kid` is unknown (at most once per `jwks_refresh_min`).
    async fn key(&self, kid: Option<&str>) -> Result<Arc<DecodingKey>, TokenError> {
        let max_age = self.config.jwks_max_age();
        let cached = self.cached();
        let fresh = cached.fetched.is_some_and(|at| at.elapsed() < max_age);
        if fresh && let Some(key) = cached.find(kid) {
            return Ok(key);
        }
        if let Err(e) = self.refresh(false).await {
            tracing::warn!(issuer = %self.config.name, error = %e, "cannot fetch the OpenID Connect signing keys");
        }
        let keys = self.cached();
        if let Some(key) = keys.find(kid) {
            return Ok(key);
        }
        if keys.fetched.is_none() {
            // Never fetched: the token may be fine, the keys are what is missing.
            return Err(TokenError::KeysUnavailable);
        }
        Err(TokenError::UnknownKey)
    }

    fn cached(&self) -> Arc<Keys> {
        self.keys.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Fetches the keys unless another fetch started within `jwks_refresh_min` (`force`
    /// ignores that, for the first fetch at start-up). Concurrent callers wait for one
    /// fetch instead of each making their own.
    async fn refresh(&self, force: bool) -> Result<(), String> {
        let bound = self.config.fetch_timeout() * 3;
        let Ok(mut last) = tokio::time::timeout(bound, self.fetching.lock()).await else {
            return Err("another fetch is still running".into());
        };
        // A fetch that started within the bound (perhaps the one this caller waited for)
        // is as fresh as the keys may be.
        if !force && last.is_some_and(|at| at.elapsed() < self.config.jwks_refresh_min()) {
            return Ok(());
        }
        *last = Some(Instant::now());
        let url = self.jwks_url().await?;
        let set: JwkSet = serde_json::from_slice(&self.fetch(&url).await?)
            .map_err(|e| format!("{url}: not a JWK Set: {e}"))?;
        let mut keys = Keys {
            fetched: Some(Instant::now()),
            ..Keys::default()
        };
        for jwk in &set.keys {
            // Only keys for signatures (no `use`, or `use: sig`) of an asymmetric kind.
            if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_))
                || jwk
                    .common
                    .public_key_use
                    .as_ref()
                    .is_some_and(|u| *u != jsonwebtoken::jwk::PublicKeyUse::Signature)
            {
                continue;
            }
            let Ok(key) = DecodingKey::from_jwk(jwk) else {
                continue;
            };
            let key = Arc::new(key);
            match &jwk.common.key_id {
                Some(kid) => {
                    keys.by_kid.insert(kid.clone(), key);
                }
                None => keys.anonymous.push(key),
            }
        }
        tracing::debug!(issuer = %self.config.name, keys = keys.by_kid.len() + keys.anonymous.len(), "OpenID Connect signing keys fetched");
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(keys);
        Ok(())
    }

    /// The JWK Set's URL: configured, or the discovery document's `jwks_uri` (whose
    /// `issuer` must be the configured one).
    async fn jwks_url(&self) -> Result<String, String> {
        if let Some(url) = self
            .jwks_url
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(url);
        }
        let discovery = self.config.discovery();
        let doc: Value = serde_json::from_slice(&self.fetch(&discovery).await?)
            .map_err(|e| format!("{discovery}: not JSON: {e}"))?;
        if doc.get("issuer").and_then(Value::as_str) != Some(self.config.issuer.as_str()) {
            return Err(format!(
                "{discovery}: its issuer is not {:?}",
                self.config.issuer
            ));
        }
        let url = doc
            .get("jwks_uri")
            .and_then(Value::as_str)
            .filter(|u| u.starts_with("https://") || u.starts_with("http://"))
            .ok_or_else(|| format!("{discovery}: no jwks_uri"))?
            .to_string();
        *self.jwks_url.write().unwrap_or_else(|p| p.into_inner()) = Some(url.clone());
        Ok(url)
    }

    /// A document of at most [`MAX_DOCUMENT_BYTES`], within the fetch time-out.
    async fn fetch(&self, url: &str) -> Result<Vec<u8>, String> {
        let mut resp = self
            .http
            .get(url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("{url}: HTTP {}", resp.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| format!("{url}: {e}"))? {
            if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
                return Err(format!("{url}: larger than {MAX_DOCUMENT_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

impl Keys {
    fn find(&self, kid: Option<&str>) -> Option<Arc<DecodingKey>> {
        match kid {
            Some(kid) => self.by_kid.get(kid).cloned(),
            // No `kid`: only when the set leaves no choice.
            None => match (self.anonymous.as_slice(), self.by_kid.len()) {
                ([only], 0) => Some(only.clone()),
                ([], 1) => self.by_kid.values().next().cloned(),
                _ => None,
            },
        }
    }
}
