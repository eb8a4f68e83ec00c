//! The public agent card (docs/PROTOCOL.md §10.2): the 1.0 `AgentCard`, and the 0.3 card as the
//! 1.0 card plus the 0.3 fields (the hybrid both 1.3 SDK resolvers read).

use serde_json::{Value, json};

use super::Version;
use crate::config::Config;
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
/// it accepts besides keys.
pub(crate) fn card(v: Version, card: &AgentCard, base: &str, grpc: &str, config: &Config) -> Value {
    let c = &card.config;
    let mut input_modes = vec!["text/plain".to_string()];
    for t in &c.limits.supported_types {
        if !input_modes.contains(t) {
            input_modes.push(t.clone());
        }
    }
    let description = if c.description.is_empty() {
        c.display_name().to_string()
    } else {
        c.description.clone()
    };
    let mut out = json!({
        "name": c.display_name(),
        "description": c.description,
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
            "streaming": c.streaming,
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
    out
}
