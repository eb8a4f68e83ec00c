//! Public agent cards and the official paths around them (DIALECTS.md §1, §2): both card
//! URLs, the shape chosen by `A2A-Version`, caching (ETag, 304), hidden and unknown agents,
//! base URLs from `public_url` or `Host`, preflight, trailing slashes and unserved paths.

use crate::support;

use serde_json::Value;
use support::{ALICE, TestServer, agent, config};

async fn server(edit: impl FnOnce(&mut a2ad::config::Config)) -> TestServer {
    let mut c = config(&["echo"]);
    let mut hidden = agent("hidden");
    hidden.public_card = false;
    let mut main = agent("main");
    main.name = Some("Main agent".into());
    main.description = Some("the default one".into());
    c.agents.extend([hidden, main]);
    c.server.default_agent = Some("main".into());
    edit(&mut c);
    TestServer::start(c).await
}

async fn get(s: &TestServer, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = s.client.get(format!("{}{path}", s.base));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("get")
}

async fn json_of(resp: reqwest::Response) -> Value {
    serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json")
}

#[tokio::test]
async fn the_root_card_is_the_default_agent_in_the_1_0_shape() {
    let s = server(|_| {}).await;
    let resp = get(&s, "/.well-known/agent-card.json", &[]).await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    assert_eq!(h["content-type"], "application/json");
    assert_eq!(h["cache-control"], "public, max-age=300");
    assert_eq!(h["vary"], "A2A-Version");
    assert!(h["etag"].to_str().expect("etag").starts_with("W/\""));
    assert!(h["last-modified"].to_str().expect("lm").ends_with(" GMT"));
    assert_eq!(h["access-control-allow-origin"], "*");
    let card = json_of(resp).await;
    assert_eq!(card["name"], "Main agent");
    assert_eq!(card["description"], "the default one");
    let interfaces = card["supportedInterfaces"].as_array().expect("interfaces");
    assert_eq!(interfaces.len(), 4);
    assert_eq!(interfaces[0]["protocolVersion"], "1.0");
    assert_eq!(interfaces[0]["protocolBinding"], "JSONRPC");
    assert_eq!(
        interfaces[0]["url"],
        format!("{}/jsonrpc/v1", s.url("main"))
    );
    assert_eq!(interfaces[1]["protocolVersion"], "1.0");
    assert_eq!(interfaces[1]["protocolBinding"], "HTTP+JSON");
    assert_eq!(interfaces[1]["url"], format!("{}/rest", s.url("main")));
    assert_eq!(interfaces[2]["protocolBinding"], "GRPC");
    assert_eq!(interfaces[2]["url"], s.addr());
    assert_eq!(interfaces[2]["tenant"], "main");
    assert_eq!(interfaces[3]["protocolVersion"], "0.3");
    assert_eq!(
        interfaces[3]["url"],
        format!("{}/jsonrpc/v0.3", s.url("main"))
    );
    assert_eq!(
        card["securitySchemes"]["apiKey"]["apiKeySecurityScheme"]["name"],
        "x-api-key"
    );
    assert_eq!(card["skills"][0]["id"], "main");
    assert_eq!(card["defaultInputModes"][0], "text/plain");
    for field in ["url", "preferredTransport", "protocolVersion", "security"] {
        assert!(
            card.get(field).is_none(),
            "no 0.3 field {field} on the 1.0 card"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn the_version_header_picks_the_0_3_hybrid_and_the_default_is_configurable() {
    let s = server(|_| {}).await;
    let v03 = json_of(
        get(
            &s,
            "/api/v1/a2a/echo/.well-known/agent-card.json",
            &[("a2a-version", "0.3")],
        )
        .await,
    )
    .await;
    assert_eq!(v03["protocolVersion"], "0.3");
    assert_eq!(v03["preferredTransport"], "JSONRPC");
    assert_eq!(v03["url"], format!("{}/jsonrpc/v0.3", s.url("echo")));
    assert_eq!(v03["supportsAuthenticatedExtendedCard"], true);
    assert_eq!(v03["securitySchemes"]["apiKey"]["type"], "apiKey");
    assert_eq!(v03["securitySchemes"]["apiKey"]["in"], "header");
    assert_eq!(v03["securitySchemes"]["bearer"]["type"], "http");
    assert!(v03.get("additionalInterfaces").is_none());
    let by_query =
        json_of(get(&s, "/.well-known/agent-card.json?A2A-Version=0.3", &[]).await).await;
    assert_eq!(by_query["protocolVersion"], "0.3");
    s.stop().await;
    let s = server(|c| c.server.card_default_version = "0.3".into()).await;
    let card = json_of(get(&s, "/.well-known/agent-card.json", &[]).await).await;
    assert_eq!(card["protocolVersion"], "0.3");
    let asked = json_of(
        get(
            &s,
            "/.well-known/agent-card.json",
            &[("a2a-version", "1.0")],
        )
        .await,
    )
    .await;
    assert!(asked.get("protocolVersion").is_none());
    s.stop().await;
}

#[tokio::test]
async fn a_matching_etag_is_304_and_hidden_or_unknown_agents_are_404() {
    let s = server(|_| {}).await;
    let first = get(&s, "/api/v1/a2a/echo/.well-known/agent-card.json", &[]).await;
    let etag = first.headers()["etag"].to_str().expect("etag").to_string();
    let again = get(
        &s,
        "/api/v1/a2a/echo/.well-known/agent-card.json",
        &[("if-none-match", &etag)],
    )
    .await;
    assert_eq!(again.status(), 304);
    assert_eq!(again.headers()["etag"], etag.as_str());
    assert!(again.bytes().await.expect("body").is_empty());
    let other = get(
        &s,
        "/api/v1/a2a/echo/.well-known/agent-card.json",
        &[("if-none-match", "W/\"something-else\"")],
    )
    .await;
    assert_eq!(other.status(), 200);
    let v03 = get(
        &s,
        "/api/v1/a2a/echo/.well-known/agent-card.json",
        &[("a2a-version", "0.3")],
    )
    .await;
    assert_ne!(
        v03.headers()["etag"],
        etag.as_str(),
        "each shape has its own tag"
    );
    for path in [
        "/api/v1/a2a/hidden/.well-known/agent-card.json",
        "/api/v1/a2a/ghost/.well-known/agent-card.json",
    ] {
        let resp = get(&s, path, &[]).await;
        assert_eq!(resp.status(), 404, "{path}");
        let body = json_of(resp).await;
        assert_eq!(body["error"]["code"], -31404);
    }
    // The hidden agent still answers its extended card to a key.
    let card = s
        .official(
            "hidden",
            support::official::V::V10,
            "GetExtendedAgentCard",
            serde_json::json!({}),
        )
        .await;
    assert_eq!(s.result(card)["name"], "hidden");
    let post = s
        .client
        .post(format!("{}/.well-known/agent-card.json", s.base))
        .send()
        .await
        .expect("post");
    assert_eq!(post.status(), 405);
    s.stop().await;
}

#[tokio::test]
async fn interface_urls_follow_public_url_else_the_host_header() {
    let s = server(|c| {
        c.server.public_url = Some("https://a2a.example.com/".into());
        c.server.public_grpc_url = Some("grpc.example.com:443".into());
    })
    .await;
    let card = json_of(get(&s, "/.well-known/agent-card.json", &[]).await).await;
    assert_eq!(
        card["supportedInterfaces"][0]["url"],
        "https://a2a.example.com/api/v1/a2a/main/jsonrpc/v1"
    );
    assert_eq!(
        card["supportedInterfaces"][2]["url"],
        "grpc.example.com:443"
    );
    assert_eq!(card["supportedInterfaces"][2]["tenant"], "main");
    s.stop().await;
    let s = server(|_| {}).await;
    let card = json_of(
        get(
            &s,
            "/.well-known/agent-card.json",
            &[("host", "proxy.internal:9000")],
        )
        .await,
    )
    .await;
    assert_eq!(
        card["supportedInterfaces"][0]["url"],
        "http://proxy.internal:9000/api/v1/a2a/main/jsonrpc/v1"
    );
    assert_eq!(
        card["supportedInterfaces"][2]["url"], "proxy.internal:9000",
        "gRPC: a bare host:port"
    );
    s.stop().await;
}

#[tokio::test]
async fn preflight_trailing_slashes_and_unserved_paths() {
    let s = server(|_| {}).await;
    for path in [
        "/api/v1/a2a/echo/jsonrpc/v1",
        "/api/v1/a2a/echo/jsonrpc/v0.3/",
        "/.well-known/agent-card.json",
    ] {
        let resp = s
            .client
            .request(reqwest::Method::OPTIONS, format!("{}{path}", s.base))
            .send()
            .await
            .expect("options");
        assert_eq!(resp.status(), 204, "{path}");
        let allowed = resp.headers()["access-control-allow-headers"]
            .to_str()
            .expect("headers")
            .to_string();
        for h in [
            "A2A-Version",
            "A2A-Extensions",
            "X-A2A-Extensions",
            "x-api-key",
        ] {
            assert!(allowed.contains(h), "{path}: {allowed}");
        }
    }
    // The seed path's preflight is unchanged.
    let seed = s
        .client
        .request(reqwest::Method::OPTIONS, s.url("echo"))
        .send()
        .await
        .expect("options");
    let allowed = seed.headers()["access-control-allow-headers"]
        .to_str()
        .expect("h")
        .to_string();
    assert!(!allowed.contains("A2A-Version"), "{allowed}");
    // A trailing slash is the same resource, not a redirect.
    let resp = s
        .client
        .post(format!("{}/jsonrpc/v1/", s.url("echo")))
        .header("content-type", "application/json")
        .header("a2a-version", "1.0")
        .header("x-api-key", ALICE)
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{}}"#)
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 200);
    assert_eq!(json_of(resp).await["result"]["totalSize"], 0);
    // REST-style paths: 404 with -32601 naming the JSON-RPC URL.
    for path in [
        "/api/v1/a2a/echo/message:send",
        "/api/v1/a2a/echo/tasks/abc",
    ] {
        let resp = s
            .client
            .post(format!("{}{path}", s.base))
            .header("x-api-key", ALICE)
            .send()
            .await
            .expect("post");
        assert_eq!(resp.status(), 404, "{path}");
        let body = json_of(resp).await;
        assert_eq!(body["error"]["code"], -32601);
        let info = &body["error"]["data"][0];
        assert_eq!(info["reason"], "METHOD_NOT_FOUND");
        assert!(
            info["metadata"]["url"]
                .as_str()
                .is_some_and(|u| u.ends_with("/api/v1/a2a/echo/jsonrpc/v1")),
            "{body}"
        );
    }
    s.stop().await;
}

/// Verifies a card's first signature: the JWS (detached payload) over the canonical form of
/// the card's 1.0 content — without `signatures`, without the 0.3 fields, empty values
/// removed, RFC 8785 — with `public` (the raw public key of `alg`).
fn verify_card(card: &Value, public: &[u8]) -> Result<Value, String> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let sig = &card["signatures"][0];
    let protected = sig["protected"].as_str().ok_or("no protected header")?;
    let header: Value = serde_json::from_slice(&b64.decode(protected).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let mut content = card.clone();
    if let Some(o) = content.as_object_mut() {
        for field in [
            "signatures",
            "url",
            "preferredTransport",
            "protocolVersion",
            "supportsAuthenticatedExtendedCard",
            "security",
        ] {
            o.remove(field);
        }
    }
    if let Some(schemes) = content["securitySchemes"].as_object_mut() {
        for scheme in schemes.values_mut() {
            if let Some(s) = scheme.as_object_mut() {
                s.retain(|k, _| k.ends_with("SecurityScheme"));
            }
        }
    }
    fn clean(v: &Value) -> Option<Value> {
        match v {
            Value::Null => None,
            Value::String(s) if s.is_empty() => None,
            Value::Array(a) => {
                let a: Vec<Value> = a.iter().filter_map(clean).collect();
                (!a.is_empty()).then_some(Value::Array(a))
            }
            Value::Object(m) => {
                let m: serde_json::Map<String, Value> = m
                    .iter()
                    .filter_map(|(k, v)| clean(v).map(|v| (k.clone(), v)))
                    .collect();
                (!m.is_empty()).then_some(Value::Object(m))
            }
            other => Some(other.clone()),
        }
    }
    let canonical = serde_json_canonicalizer::to_vec(&clean(&content).ok_or("empty")?)
        .map_err(|e| e.to_string())?;
    let message = format!("{protected}.{}", b64.encode(canonical));
    let (alg, key) = match header["alg"].as_str() {
        Some("EdDSA") => (
            jsonwebtoken::Algorithm::EdDSA,
            jsonwebtoken::DecodingKey::from_ed_der(public),
        ),
        Some("ES256") => (
            jsonwebtoken::Algorithm::ES256,
            jsonwebtoken::DecodingKey::from_ec_der(public),
        ),
        other => return Err(format!("alg {other:?}")),
    };
    let signature = sig["signature"].as_str().ok_or("no signature")?;
    match jsonwebtoken::crypto::verify(signature, message.as_bytes(), &key, alg) {
        Ok(true) => Ok(header),
        Ok(false) => Err("the signature does not verify".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test]
async fn signed_cards_verify_and_a_tampered_card_does_not() {
    let dir = std::env::temp_dir().join(format!("a2ad-card-key-{}", support::new_id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for (alg, kind) in [
        ("EdDSA", &rcgen::PKCS_ED25519),
        ("ES256", &rcgen::PKCS_ECDSA_P256_SHA256),
    ] {
        let key = rcgen::KeyPair::generate_for(kind).expect("key");
        let path = dir.join(format!("{alg}.pem"));
        std::fs::write(&path, key.serialize_pem()).expect("write");
        let s = server(|c| {
            c.server.public_url = Some("https://agents.example.com".into());
            c.server.public_grpc_url = Some("agents.example.com:443".into());
            c.cards.signing = Some(a2ad::config::CardSigningConfig {
                key_file: path.display().to_string(),
                kid: "card-key-1".into(),
                jku: Some("https://agents.example.com/keys.json".into()),
            });
        })
        .await;
        let public = key.public_key_raw().to_vec();
        let card: Value = get(&s, "/.well-known/agent-card.json", &[])
            .await
            .json()
            .await
            .expect("json");
        let header = verify_card(&card, &public).unwrap_or_else(|e| panic!("{alg}: {e}: {card}"));
        assert_eq!(header["alg"], alg);
        assert_eq!(header["typ"], "JOSE");
        assert_eq!(header["kid"], "card-key-1");
        assert_eq!(header["jku"], "https://agents.example.com/keys.json");

        // Tampered: a changed name, a changed URL, an added scheme.
        for edit in [
            |c: &mut Value| c["name"] = "Evil agent".into(),
            |c: &mut Value| c["supportedInterfaces"][0]["url"] = "https://evil.example.com".into(),
            |c: &mut Value| {
                c["securitySchemes"]["open"] =
                    serde_json::json!({"httpAuthSecurityScheme": {"scheme": "None"}})
            },
        ] {
            let mut forged = card.clone();
            edit(&mut forged);
            assert!(
                verify_card(&forged, &public).is_err(),
                "{alg}: forged card verified"
            );
        }

        // The 0.3 shape carries a signature over the same 1.0 content.
        let v03: Value = get(
            &s,
            "/.well-known/agent-card.json",
            &[("A2A-Version", "0.3")],
        )
        .await
        .json()
        .await
        .expect("json");
        assert_eq!(v03["protocolVersion"], "0.3");
        verify_card(&v03, &public).unwrap_or_else(|e| panic!("{alg} 0.3: {e}: {v03}"));

        // The extended card too.
        let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "GetExtendedAgentCard", "params": {}});
        let extended: Value = s
            .client
            .post(format!("{}/api/v1/a2a/main/jsonrpc/v1", s.base))
            .header("content-type", "application/json")
            .header("a2a-version", "1.0")
            .header("x-api-key", ALICE)
            .body(body.to_string())
            .send()
            .await
            .expect("extended")
            .json()
            .await
            .expect("json");
        verify_card(&extended["result"], &public)
            .unwrap_or_else(|e| panic!("{alg} extended: {e}: {extended}"));
        s.stop().await;
    }

    // Signing needs the operator's URLs, and a key that is one.
    let mut c = config(&["echo"]);
    c.cards.signing = Some(a2ad::config::CardSigningConfig {
        key_file: dir.join("EdDSA.pem").display().to_string(),
        kid: "k".into(),
        jku: None,
    });
    let e = c.clone().validated().expect_err("no public_url");
    assert_eq!(e.key.as_deref(), Some("server.public_url"));
    c.server.public_url = Some("https://agents.example.com".into());
    c.server.public_grpc_url = Some("agents.example.com:443".into());
    let not_a_key = dir.join("cert.pem");
    std::fs::write(
        &not_a_key,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .expect("write");
    if let Some(s) = &mut c.cards.signing {
        s.key_file = not_a_key.display().to_string();
    }
    match a2ad::Server::bind(c.validated().expect("valid")).await {
        Err(a2ad::Error::Config(e)) => {
            assert_eq!(e.key.as_deref(), Some("cards.signing.key_file"), "{e}");
            assert!(e.message.contains("cert.pem"), "{e}");
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("started with no signing key"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
