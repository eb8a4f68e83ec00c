//! `[auth]`: credentials besides `[[api_keys]]` — client certificates (mTLS) and OpenID
//! Connect bearer tokens; and the other production settings: `[cards]` (signing),
//! `[secrets]` (sealing at rest), `[telemetry]` (OpenTelemetry).

use std::time::Duration;

use serde::Deserialize;

use super::agents::default_key_agents;
use super::seconds;

/// `[auth]`: credentials besides `[[api_keys]]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// `[[auth.certificates]]`: client certificates (mTLS) that are principals.
    pub certificates: Vec<CertificateConfig>,
    /// `[[auth.oidc]]`: OpenID Connect issuers whose signed tokens (JWT) are accepted as
    /// `Authorization: Bearer`.
    pub oidc: Vec<OidcConfig>,
}

/// `[[auth.certificates]]`: a client certificate, verified against
/// `server.tls.client_ca_file`, whose identity names a principal.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateConfig {
    /// The principal that owns what this certificate's requests create.
    pub name: String,
    /// Matched against the certificate's subject alternative names (DNS name, e-mail
    /// address, URI) and, when it has none of those, its subject's common name.
    pub identity: String,
    /// Agent ids this certificate may use; `*` means all.
    #[serde(default = "default_key_agents")]
    pub agents: Vec<String>,
}

impl CertificateConfig {
    /// The certificate with this identity is principal `name`, allowed every agent.
    pub fn new(name: &str, identity: &str) -> Self {
        Self {
            name: name.to_string(),
            identity: identity.to_string(),
            agents: default_key_agents(),
        }
    }
}

/// `[[auth.oidc]]`: an OpenID Connect issuer whose bearer tokens (JWT) name principals.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcConfig {
    /// The security scheme's name on the cards, and this issuer's name in logs.
    #[serde(default = "OidcConfig::default_name")]
    pub name: String,
    /// The `iss` a token must carry, exactly.
    pub issuer: String,
    /// Where the signing keys are (a JWK Set). Unset: the `jwks_uri` of the issuer's
    /// discovery document.
    pub jwks_url: Option<String>,
    /// The discovery document (announced on the cards). Unset:
    /// `{issuer}/.well-known/openid-configuration`.
    pub discovery_url: Option<String>,
    /// A token's `aud` must name at least one of these.
    pub audiences: Vec<String>,
    /// Signature algorithms accepted: of RS256, RS384, RS512, PS256, PS384, PS512, ES256,
    /// ES384, EdDSA. Never `none` or a shared-secret (HS*) algorithm.
    #[serde(default = "OidcConfig::default_algorithms")]
    pub algorithms: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default = "OidcConfig::default_leeway_seconds")]
    pub leeway_seconds: f64,
    /// The claim naming the principal.
    #[serde(default = "OidcConfig::default_principal_claim")]
    pub principal_claim: String,
    /// Put before the claim's value to make the principal's name. Unset: the issuer and
    /// `#` (so a token's subject never names a key's principal by accident).
    pub principal_prefix: Option<String>,
    /// Agent ids every token of this issuer may use (`*`: all), when `agents_claim` is
    /// unset.
    #[serde(default = "default_key_agents")]
    pub agents: Vec<String>,
    /// A claim listing the agents a token may use: a space-separated string (as `scope`)
    /// or an array of strings. Entries that start with `agents_prefix` name an agent id
    /// (or `*`) after it; others are ignored.
    pub agents_claim: Option<String>,
    /// See `agents_claim`.
    #[serde(default)]
    pub agents_prefix: String,
    /// A token whose `kid` is not among the cached keys makes the keys be fetched again,
    /// at most once per this many seconds.
    #[serde(default = "OidcConfig::default_jwks_refresh_min_seconds")]
    pub jwks_refresh_min_seconds: f64,
    /// Keys are fetched again when they are older than this.
    #[serde(default = "OidcConfig::default_jwks_max_age_seconds")]
    pub jwks_max_age_seconds: f64,
    /// Bound on fetching the discovery document or the keys.
    #[serde(default = "OidcConfig::default_fetch_timeout_seconds")]
    pub fetch_timeout_seconds: f64,
}

impl OidcConfig {
    /// The algorithms a token may be signed with.
    pub const ALGORITHMS: [&'static str; 9] = [
        "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
    ];

    fn default_name() -> String {
        "oidc".to_string()
    }

    fn default_algorithms() -> Vec<String> {
        ["RS256", "ES256", "EdDSA"].map(String::from).to_vec()
    }

    fn default_leeway_seconds() -> f64 {
        60.0
    }

    fn default_principal_claim() -> String {
        "sub".to_string()
    }

    fn default_jwks_refresh_min_seconds() -> f64 {
        30.0
    }

    fn default_jwks_max_age_seconds() -> f64 {
        3600.0
    }

    fn default_fetch_timeout_seconds() -> f64 {
        5.0
    }

    /// Tokens of `issuer` for `audience`, every other option at its default.
    pub fn new(issuer: &str, audience: &str) -> Self {
        Self {
            name: Self::default_name(),
            issuer: issuer.to_string(),
            jwks_url: None,
            discovery_url: None,
            audiences: vec![audience.to_string()],
            algorithms: Self::default_algorithms(),
            leeway_seconds: Self::default_leeway_seconds(),
            principal_claim: Self::default_principal_claim(),
            principal_prefix: None,
            agents: default_key_agents(),
            agents_claim: None,
            agents_prefix: String::new(),
            jwks_refresh_min_seconds: Self::default_jwks_refresh_min_seconds(),
            jwks_max_age_seconds: Self::default_jwks_max_age_seconds(),
            fetch_timeout_seconds: Self::default_fetch_timeout_seconds(),
        }
    }

    /// The discovery document's URL.
    pub fn discovery(&self) -> String {
        self.discovery_url.clone().unwrap_or_else(|| {
            format!(
                "{}/.well-known/openid-configuration",
                self.issuer.trim_end_matches('/')
            )
        })
    }

    /// The prefix of principals' names.
    pub fn prefix(&self) -> String {
        self.principal_prefix
            .clone()
            .unwrap_or_else(|| format!("{}#", self.issuer))
    }

    /// `jwks_refresh_min_seconds` as a [`Duration`].
    pub fn jwks_refresh_min(&self) -> Duration {
        seconds(self.jwks_refresh_min_seconds)
    }

    /// `jwks_max_age_seconds` as a [`Duration`].
    pub fn jwks_max_age(&self) -> Duration {
        seconds(self.jwks_max_age_seconds)
    }

    /// `fetch_timeout_seconds` as a [`Duration`].
    pub fn fetch_timeout(&self) -> Duration {
        seconds(self.fetch_timeout_seconds)
    }
}

/// `[cards]`: how agent cards are presented.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CardsConfig {
    /// `[cards.signing]`: sign the cards (A2A 1.0 `AgentCard.signatures`).
    pub signing: Option<CardSigningConfig>,
}

/// `[cards.signing]`: the key the public and extended cards are signed with (JWS, RFC 7515,
/// over the card's RFC 8785 canonical form).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CardSigningConfig {
    /// PEM file with the private key: Ed25519 (signs `EdDSA`) or P-256 (signs `ES256`),
    /// PKCS#8.
    pub key_file: String,
    /// The key's id, in each signature's protected header (`kid`).
    pub kid: String,
    /// Where verifiers find the public key (a JWK Set URL), in the protected header (`jku`).
    pub jku: Option<String>,
}

/// `[secrets]`: the key that seals push-configuration secrets, tokens and header values in
/// the store (AES-256-GCM). Without it (and without `A2AD_SECRETS_KEY` in the
/// environment) they are stored in clear, and the server says so once at start-up.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsConfig {
    /// The key new values are sealed with: 32 bytes in standard Base64, or `env:NAME` to
    /// read that from the environment variable `NAME`. Unset: `env:A2AD_SECRETS_KEY` if
    /// that variable is set.
    pub key: Option<String>,
    /// Earlier keys, the same way: values sealed with them are still read (rotation).
    pub old_keys: Vec<String>,
}

impl std::fmt::Debug for SecretsConfig {
    /// Keys may be written inline: never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsConfig")
            .field("key", &self.key.as_ref().map(|_| "…"))
            .field("old_keys", &self.old_keys.len())
            .finish()
    }
}

impl SecretsConfig {
    /// The environment variable read when no key is configured.
    pub const DEFAULT_ENV: &'static str = "A2AD_SECRETS_KEY";

    /// The keys as bytes.
    ///
    /// # Errors
    /// A [`ConfigError`](super::ConfigError) naming the key (`secrets.key`, `secrets.old_keys[1]`) and what is
    /// wrong with it — never its value.
    pub fn resolve(&self) -> Result<SecretKeys, super::ConfigError> {
        self.resolved()
            .map_err(|(key, message)| super::ConfigError::key(key, message))
    }

    fn resolved(&self) -> Result<SecretKeys, (String, String)> {
        let current = match &self.key {
            Some(k) => Some(resolve_key("secrets.key", k)?),
            None => match std::env::var(Self::DEFAULT_ENV) {
                Ok(v) if !v.is_empty() => Some(decode_key("secrets.key", &v, Self::DEFAULT_ENV)?),
                _ => None,
            },
        };
        let old = self
            .old_keys
            .iter()
            .enumerate()
            .map(|(i, k)| resolve_key(&format!("secrets.old_keys[{i}]"), k))
            .collect::<Result<Vec<_>, _>>()?;
        if current.is_none() && !old.is_empty() {
            return Err((
                "secrets.key".into(),
                "old_keys without a current key: set key too".into(),
            ));
        }
        Ok(SecretKeys { current, old })
    }
}

/// The keys of `[secrets]` as bytes (never printed).
pub struct SecretKeys {
    /// The key new values are sealed with.
    pub current: Option<[u8; 32]>,
    /// Earlier keys, still read.
    pub old: Vec<[u8; 32]>,
}

impl std::fmt::Debug for SecretKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretKeys")
            .field("current", &self.current.is_some())
            .field("old", &self.old.len())
            .finish()
    }
}

fn resolve_key(name: &str, value: &str) -> Result<[u8; 32], (String, String)> {
    match value.strip_prefix("env:") {
        Some(var) => match std::env::var(var) {
            Ok(v) if !v.is_empty() => decode_key(name, &v, var),
            _ => Err((
                name.to_string(),
                format!("the environment variable {var} is not set"),
            )),
        },
        None => decode_key(name, value, "the configuration"),
    }
}

fn decode_key(name: &str, text: &str, from: &str) -> Result<[u8; 32], (String, String)> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
        .ok_or_else(|| {
            (
                name.to_string(),
                format!(
                    "the key from {from} is not 32 bytes in standard Base64 (make one with `openssl rand -base64 32`)"
                ),
            )
        })
}

/// `[telemetry]`: OpenTelemetry traces exported over OTLP. Off (and free) unless
/// `otlp_endpoint` is set.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL (`http://host:4318`); traces go to
    /// `{otlp_endpoint}/v1/traces` as protobuf.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// The share of traces started here that are sampled (0 to 1); a request that carries
    /// a `traceparent` follows its caller's decision.
    pub sampling_ratio: f64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "a2ad".to_string(),
            sampling_ratio: 1.0,
        }
    }
}

/// Whether a credential is shaped like a JWT (compact JWS): `eyJ` (a JSON object's first
/// bytes in base64url), three base64url segments separated by two dots.
pub(crate) fn looks_like_jwt(value: &[u8]) -> bool {
    value.starts_with(b"eyJ")
        && value.iter().filter(|&&b| b == b'.').count() == 2
        && value
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}
