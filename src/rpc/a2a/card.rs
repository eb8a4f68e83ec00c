//! The public agent card (docs/PROTOCOL.md §10.2): the 1.0 `AgentCard`, and the 0.3 card as the
//! 1.0 card plus the 0.3 fields (the hybrid both 1.3 SDK resolvers read).

use serde_json::{Value, json};

use super::Version;
use crate::config::{CardSigningConfig, Config, ConfigError};
use crate::runtime::AgentCard;

/// The JSON-RPC URL of an agent's interface of a version.
pub(crate) fn interface_url(base: &str, agent: &str, v: Version) -> String {
    format!("{base}/api/v1/a2a/{agent}/{}", v.path())
}

/// The base URL of an agent's HTTP+JSON interface (A2A 1.0).
pub(crate) fn rest_url(base: &str, agent: &str) -> String {
    format!("{base}/api/v1/a2a/{agent}/rest")
}

/// An agent's card in a version's shape; `base` is the public base URL (no trailing `/`),
/// `grpc` the gRPC interface's `host:port`; the server's `config` says which credentials
/// it accepts besides keys; `signer`, when cards are signed, adds `signatures`.
pub(crate) fn card(
    v: Version,
    card: &AgentCard,
    base: &str,
    grpc: &str,
    config: &Config,
    signer: Option<&CardSigner>,
) -> Value {
    let c = &card.config;
    let mut input_modes = vec!["text/plain".to_string()];
    for t in &c.limits.supported_types {
        if !input_modes.contains(t) {
            input_modes.push(t.clone());
        }
    }
    let description = if c.description().is_empty() {
        c.display_name().to_string()
    } else {
        c.description().to_string()
    };
    let mut out = json!({
        "name": c.display_name(),
        "description": c.description(),
        "version": c.version,
        // 1.0 over JSON-RPC first (what a client without a preference takes), then 1.0
        // over HTTP+JSON and gRPC, then 0.3 (docs/PROTOCOL.md §10.2).
        "supportedInterfaces": [
            json!({
                "url": interface_url(base, &c.id, Version::V10),
                "protocolBinding": "JSONRPC",
                "protocolVersion": "1.0",
            }),
            json!({
                "url": rest_url(base, &c.id),
                "protocolBinding": "HTTP+JSON",
                "protocolVersion": "1.0",
            }),
            // A bare host:port (both official clients hand it to their channel as is); the
            // tenant names the agent (both echo it in every request).
            json!({
                "url": grpc,
                "protocolBinding": "GRPC",
                "protocolVersion": "1.0",
                "tenant": c.id,
            }),
            json!({
                "url": interface_url(base, &c.id, Version::V03),
                "protocolBinding": "JSONRPC",
                "protocolVersion": "0.3",
            }),
        ],
        "capabilities": {
            "streaming": c.streaming(),
            "pushNotifications": c.webhooks,
            "extendedAgentCard": true,
        },
        "securitySchemes": {
            "apiKey": {"apiKeySecurityScheme": {"location": "header", "name": "x-api-key"}},
            "bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}},
        },
        "securityRequirements": [
            {"schemes": {"apiKey": {"list": []}}},
            {"schemes": {"bearer": {"list": []}}},
        ],
        "defaultInputModes": input_modes,
        "defaultOutputModes": ["text/plain"],
        "skills": [{
            "id": c.id,
            "name": c.display_name(),
            "description": description,
            "tags": [c.backend],
        }],
    });
    // A fronted agent shows its upstream's skills and modes.
    if let Some(u) = &card.upstream {
        let fields = [
            ("skills", &u.skills),
            ("defaultInputModes", &u.input_modes),
            ("defaultOutputModes", &u.output_modes),
        ];
        for (key, value) in fields {
            if let Some(v) = value.as_ref().filter(|v| v.is_array()) {
                out[key] = v.clone();
            }
        }
    }
    if !c.extensions.is_empty() {
        out["capabilities"]["extensions"] = c.extensions_json();
    }
    // Client certificates that are principals: one more way in.
    let mtls = config
        .server
        .tls
        .as_ref()
        .is_some_and(|t| t.client_ca_file.is_some())
        && !config.auth.certificates.is_empty();
    if mtls {
        out["securitySchemes"]["mtls"] = json!({"mtlsSecurityScheme": {
            "description": "a client certificate issued by the server's client CA",
        }});
        if let Some(list) = out["securityRequirements"].as_array_mut() {
            list.push(json!({"schemes": {"mtls": {"list": []}}}));
        }
    }
    // OpenID Connect issuers: each a scheme; when tokens list their agents in `scope`,
    // the scope naming this agent is the requirement's.
    let scopes = |o: &crate::config::OidcConfig| -> Vec<String> {
        if o.agents_claim.as_deref() == Some("scope") {
            vec![format!("{}{}", o.agents_prefix, c.id)]
        } else {
            Vec::new()
        }
    };
    for o in &config.auth.oidc {
        out["securitySchemes"][o.name.as_str()] = json!({"openIdConnectSecurityScheme": {
            "openIdConnectUrl": o.discovery(),
        }});
        if let Some(list) = out["securityRequirements"].as_array_mut() {
            list.push(json!({"schemes": {o.name.as_str(): {"list": scopes(o)}}}));
        }
    }
    // Signed over the 1.0 card; the 0.3 shape carries the same signature (its own fields
    // repeat what the 1.0 ones say, and a 1.0 reader of the hybrid drops them) — and a
    // second one over the 1.0 content as 0.3-aware readers rebuild it from the hybrid
    // (a2a-sdk 1.3 takes the 0.3 `scheme: "bearer"` over the 1.0 `"Bearer"`).
    let mut signatures: Vec<Value> = signer.and_then(|s| s.sign(&out)).into_iter().collect();
    let content = (v == Version::V03 && signer.is_some()).then(|| out.clone());
    if v == Version::V03 {
        out["url"] = json!(interface_url(base, &c.id, Version::V03));
        out["preferredTransport"] = json!("JSONRPC");
        out["protocolVersion"] = json!("0.3");
        out["supportsAuthenticatedExtendedCard"] = json!(true);
        out["security"] = json!([{"apiKey": []}, {"bearer": []}]);
        let schemes = &mut out["securitySchemes"];
        schemes["apiKey"]["type"] = json!("apiKey");
        schemes["apiKey"]["in"] = json!("header");
        schemes["apiKey"]["name"] = json!("x-api-key");
        schemes["bearer"]["type"] = json!("http");
        schemes["bearer"]["scheme"] = json!("bearer");
        if mtls {
            schemes["mtls"]["type"] = json!("mutualTLS");
        }
        for o in &config.auth.oidc {
            schemes[o.name.as_str()]["type"] = json!("openIdConnect");
            schemes[o.name.as_str()]["openIdConnectUrl"] = json!(o.discovery());
        }
        let security = out["security"].as_array_mut();
        if let Some(list) = security {
            if mtls {
                list.push(json!({"mtls": []}));
            }
            for o in &config.auth.oidc {
                list.push(json!({o.name.as_str(): scopes(o)}));
            }
        }
    }
    if let (Some(signer), Some(mut converted)) = (signer, content) {
        let mut changed = false;
        if let (Some(schemes), Some(hybrid)) = (
            converted["securitySchemes"].as_object_mut(),
            out["securitySchemes"].as_object(),
        ) {
            for (name, scheme) in schemes.iter_mut() {
                let old = hybrid.get(name).and_then(|h| h.get("scheme"));
                if let (Some(http), Some(old)) = (scheme.get_mut("httpAuthSecurityScheme"), old)
                    && http.get("scheme") != Some(old)
                {
                    http["scheme"] = old.clone();
                    changed = true;
                }
            }
        }
        if changed {
            signatures.extend(signer.sign(&converted));
        }
    }
    if !signatures.is_empty() {
        out["signatures"] = Value::Array(signatures);
    }
    out
}

/// Signs cards (`[cards.signing]`, A2A 1.0 §8.4): a JWS (RFC 7515) with a detached
/// payload, the card's canonical form: the card without `signatures`, its empty strings,
/// arrays and objects removed (as the official SDKs do before they canonicalize, so that
/// their verifiers and ours see the same bytes), in RFC 8785 (JCS) form. The protected
/// header holds `alg` (`EdDSA` for an Ed25519 key, `ES256` for a P-256 one), `typ: JOSE`,
/// `kid` and, if set, `jku`.
pub(crate) struct CardSigner {
    key: jsonwebtoken::EncodingKey,
    alg: jsonwebtoken::Algorithm,
    /// The protected header, base64url.
    protected: String,
}

impl CardSigner {
    /// Loads the key.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file when it holds no Ed25519 or P-256 private key.
    pub(crate) fn load(settings: &CardSigningConfig) -> Result<Self, ConfigError> {
        use base64::Engine as _;
        use jsonwebtoken::{Algorithm, EncodingKey};
        let refuse = |why: &str| {
            ConfigError::key(
                "cards.signing.key_file",
                format!("{}: {why}", settings.key_file),
            )
        };
        let pem = std::fs::read(&settings.key_file).map_err(|e| refuse(&e.to_string()))?;
        // Whatever the PEM holds, a key is what signs a test message with its algorithm.
        let found = [
            (Algorithm::EdDSA, EncodingKey::from_ed_pem(&pem)),
            (Algorithm::ES256, EncodingKey::from_ec_pem(&pem)),
        ]
        .into_iter()
        .find_map(|(alg, key)| {
            let key = key.ok()?;
            jsonwebtoken::crypto::sign(b"a2ad", &key, alg)
                .ok()
                .map(|_| (alg, key))
        });
        let Some((alg, key)) = found else {
            return Err(refuse(
                "no Ed25519 or P-256 (ES256) private key in PKCS#8 PEM form could be read",
            ));
        };
        let mut header = json!({
            "alg": if alg == Algorithm::EdDSA { "EdDSA" } else { "ES256" },
            "typ": "JOSE",
            "kid": settings.kid,
        });
        if let Some(jku) = &settings.jku {
            header["jku"] = json!(jku);
        }
        let protected = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&header).unwrap_or_default());
        Ok(Self {
            key,
            alg,
            protected,
        })
    }

    /// The `AgentCardSignature` of a card (which has no `signatures` yet).
    fn sign(&self, card: &Value) -> Option<Value> {
        use base64::Engine as _;
        let canonical = serde_json_canonicalizer::to_vec(&without_empty(card)?).ok()?;
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(canonical);
        let input = format!("{}.{payload}", self.protected);
        let signature = jsonwebtoken::crypto::sign(input.as_bytes(), &self.key, self.alg).ok()?;
        Some(json!({"protected": self.protected, "signature": signature}))
    }
}

/// A card with its empty strings, arrays and objects (and `null`s) removed, recursively;
/// `None` when nothing is left.
pub(crate) fn without_empty(v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::Array(items) => {
            let kept: Vec<Value> = items.iter().filter_map(without_empty).collect();
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        Value::Object(map) => {
            let kept: serde_json::Map<String, Value> = map
                .iter()
                .filter_map(|(k, v)| without_empty(v).map(|v| (k.clone(), v)))
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        other => Some(other.clone()),
    }
}
