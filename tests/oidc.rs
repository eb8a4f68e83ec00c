//! OpenID Connect bearer tokens beside API keys: a local provider (support/idp.rs) serves
//! its discovery document and keys; tokens are signed in the test. Valid tokens of each
//! algorithm, every refusal (expired, not yet valid, wrong audience or issuer, unknown
//! `kid`, `alg: none`, HS256 keyed with the public key, a tampered payload), key rotation,
//! a provider that is down or too slow, ownership between token and key principals, and
//! the same rules on every dialect and binding.

use crate::support;

use std::time::Duration;

use a2ad::config::OidcConfig;
use a2ad::proto::a2a_service_client::A2aServiceClient;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};
use support::idp::{Idp, Mode, SigningKey};
use support::{ALICE, TestServer, config, poll_until, send_params};

const AUDIENCE: &str = "a2ad-test";

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Claims of a valid token for `sub`, allowed `scope`.
fn claims(idp: &Idp, sub: &str, scope: &str) -> Value {
    json!({"iss": idp.issuer, "sub": sub, "aud": AUDIENCE, "exp": now() + 600,
           "iat": now(), "scope": scope})
}

/// The test configuration with `idp` as issuer: agents listed in `scope` as `a2ad:<id>`,
/// keys fetched within 1 s and again at most once a second.
fn oidc_config(idp: &Idp, agents: &[&str]) -> a2ad::Config {
    let mut c = config(agents);
    let mut o = OidcConfig::new(&idp.issuer, AUDIENCE);
    o.agents_claim = Some("scope".into());
    o.agents_prefix = "a2ad:".into();
    o.fetch_timeout_seconds = 1.0;
    o.jwks_refresh_min_seconds = 1.0;
    o.algorithms = vec!["ES256".into(), "EdDSA".into(), "RS256".into()];
    c.auth.oidc = vec![o];
    c
}

/// A seed `message/send` with `Authorization: Bearer <token>` (and an `x-api-key` if
/// given): the HTTP status and body.
async fn send_with(s: &TestServer, agent: &str, token: &str, key: Option<&str>) -> (u16, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "message/send",
                      "params": send_params("hello", json!({}))});
    post(s, &format!("/api/v1/a2a/{agent}"), token, key, &body).await
}

async fn post(
    s: &TestServer,
    path: &str,
    token: &str,
    key: Option<&str>,
    body: &Value,
) -> (u16, Value) {
    let mut req = s
        .client
        .post(format!("{}{path}", s.base))
        .header("content-type", "application/json")
        .header("a2a-version", "1.0")
        .header("authorization", format!("Bearer {token}"))
        .body(body.to_string());
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.expect("body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// What a refusal says (the seed dialect puts the reason in `data.reason`).
fn refusal(body: &Value) -> String {
    format!(
        "{} {}",
        body["error"]["message"], body["error"]["data"]["reason"]
    )
}

#[tokio::test]
async fn tokens_of_a_configured_issuer_are_principals_and_bad_ones_are_refused() {
    let es = SigningKey::new("es-1", Algorithm::ES256);
    let ed = SigningKey::new("ed-1", Algorithm::EdDSA);
    let rsa = SigningKey::new("rsa-1", Algorithm::RS256);
    let idp = Idp::start(&[&es, &ed, &rsa]).await;
    let s = TestServer::start(oidc_config(&idp, &["echo", "other"])).await;

    // Valid tokens of each algorithm; the scope lists the agents.
    for key in [&es, &ed, &rsa] {
        let token = key.sign(&claims(&idp, "user-1", "openid a2ad:echo"));
        let (status, body) = send_with(&s, "echo", &token, None).await;
        assert_eq!(status, 200, "{:?}: {body}", key.alg);
        assert_eq!(body["result"]["status"]["state"], "completed", "{body}");
    }
    let token = es.sign(&claims(&idp, "user-1", "openid a2ad:echo"));
    let (status, body) = send_with(&s, "other", &token, None).await;
    assert_eq!(status, 403, "not in the scope: {body}");
    let all = es.sign(&claims(&idp, "user-1", "a2ad:*"));
    assert_eq!(send_with(&s, "other", &all, None).await.0, 200);

    // Each refusal is a 401 saying why.
    let base = claims(&idp, "user-1", "a2ad:echo");
    let with = |patch: Value| {
        let mut c = base.clone();
        if let (Some(c), Value::Object(p)) = (c.as_object_mut(), patch) {
            c.extend(p);
        }
        c
    };
    let tampered = {
        let good = es.sign(&base);
        let parts: Vec<&str> = good.split('.').collect();
        let forged = B64.encode(with(json!({"sub": "admin"})).to_string());
        format!("{}.{forged}.{}", parts[0], parts[2])
    };
    let none = format!(
        "{}.{}.",
        B64.encode(r#"{"alg":"none","typ":"JWT"}"#),
        B64.encode(base.to_string())
    );
    // HS256 keyed with the issuer's public key (the classic confusion attack).
    let confused = {
        let mut header = jsonwebtoken::Header::new(Algorithm::HS256);
        header.kid = Some(es.kid.clone());
        let key = jsonwebtoken::EncodingKey::from_secret(es.public_pem().as_bytes());
        jsonwebtoken::encode(&header, &base, &key).expect("token")
    };
    let unknown_kid = SigningKey::new("es-unknown", Algorithm::ES256).sign(&base);
    let cases = [
        (es.sign(&with(json!({"exp": now() - 3600}))), "expired"),
        (
            es.sign(&with(json!({"nbf": now() + 3600}))),
            "not yet valid",
        ),
        (es.sign(&with(json!({"aud": "someone-else"}))), "aud"),
        (
            es.sign(&with(json!({"iss": "https://idp.example.com"}))),
            "unknown issuer",
        ),
        (
            es.sign(&json!({"iss": idp.issuer, "sub": "u", "aud": AUDIENCE})),
            "claim",
        ),
        (tampered, "signature"),
        (none, "not a valid JWT"),
        (confused, "algorithm"),
        (unknown_kid, "unknown key"),
    ];
    for (token, why) in cases {
        let (status, body) = send_with(&s, "echo", &token, None).await;
        assert_eq!(status, 401, "{why}: {body}");
        assert!(refusal(&body).contains(why), "{why}: {body}");
    }

    // An unknown kid fetches the keys again — at most once per jwks_refresh_min_seconds.
    let before = idp.fetches();
    let stranger = SigningKey::new("es-other", Algorithm::ES256);
    let burst: Vec<_> = (0..5).map(|_| stranger.sign(&base)).collect();
    for token in &burst {
        assert_eq!(send_with(&s, "echo", token, None).await.0, 401);
    }
    let fetched = idp.fetches() - before;
    assert!(
        fetched <= 2,
        "{fetched} fetches for 5 tokens within a second or two"
    );

    // A key and a token together are two credentials: they must not disagree.
    let (status, body) = send_with(&s, "echo", &token, Some(ALICE)).await;
    assert_eq!(status, 401, "{body}");
    assert!(refusal(&body).contains("different credentials"), "{body}");
    s.stop().await;
}

#[tokio::test]
async fn token_principals_own_their_tasks_on_every_dialect_and_binding() {
    let es = SigningKey::new("es-1", Algorithm::ES256);
    let idp = Idp::start(&[&es]).await;
    let s = TestServer::start(oidc_config(&idp, &["echo"])).await;
    let user1 = es.sign(&claims(&idp, "user-1", "a2ad:echo"));
    let user2 = es.sign(&claims(&idp, "user-2", "a2ad:echo"));

    let (status, body) = send_with(&s, "echo", &user1, None).await;
    assert_eq!(status, 200, "{body}");
    let task = body["result"]["id"].as_str().expect("id").to_string();
    let get = json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task}});
    let (_, mine) = post(&s, "/api/v1/a2a/echo", &user1, None, &get).await;
    assert_eq!(mine["result"]["id"], task.as_str(), "{mine}");
    let (_, theirs) = post(&s, "/api/v1/a2a/echo", &user2, None, &get).await;
    assert_eq!(theirs["error"]["code"], -32000, "another subject: {theirs}");
    let by_key = s
        .call_as(ALICE, "echo", "tasks/get", json!({"id": task}))
        .await;
    assert_eq!(
        by_key["error"]["code"], -32000,
        "a key's principal: {by_key}"
    );

    // A2A 1.0 over JSON-RPC.
    let v1 = json!({"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": task}});
    let (status, body) = post(&s, "/api/v1/a2a/echo/jsonrpc/v1", &user1, None, &v1).await;
    assert_eq!(
        (status, &body["result"]["id"]),
        (200, &json!(task)),
        "{body}"
    );
    let (status, body) = post(&s, "/api/v1/a2a/echo/jsonrpc/v1", &user2, None, &v1).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["error"].is_object(), "another subject: {body}");

    // HTTP+JSON.
    let rest = |token: &str| {
        s.client
            .get(format!("{}/api/v1/a2a/echo/rest/tasks/{task}", s.base))
            .header("a2a-version", "1.0")
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    assert_eq!(rest(&user1).await.expect("rest").status().as_u16(), 200);
    assert_eq!(rest(&user2).await.expect("rest").status().as_u16(), 404);
    let expired = es.sign(&json!({"iss": idp.issuer, "sub": "user-1", "aud": AUDIENCE,
                                  "exp": now() - 3600, "scope": "a2ad:echo"}));
    assert_eq!(rest(&expired).await.expect("rest").status().as_u16(), 401);

    // gRPC: the token in `authorization` metadata.
    let channel = tonic::transport::Channel::from_shared(s.base.clone())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut g = A2aServiceClient::new(channel);
    let request = |token: &str| {
        let msg =
            serde_json::from_value(json!({"tenant": "echo", "id": task})).expect("GetTaskRequest");
        let mut req = tonic::Request::new(msg);
        req.metadata_mut()
            .insert("a2a-version", "1.0".parse().expect("version"));
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("token"),
        );
        req
    };
    let got = g
        .get_task(request(&user1))
        .await
        .expect("GetTask")
        .into_inner();
    assert_eq!(got.id, task);
    let err = g
        .get_task(request(&user2))
        .await
        .expect_err("another subject");
    assert_eq!(err.code(), tonic::Code::NotFound);
    let err = g.get_task(request(&expired)).await.expect_err("expired");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);

    // The card declares the issuer, with the scope that names the agent.
    let card: Value = s
        .client
        .get(format!("{}/.well-known/agent-card.json", s.base))
        .send()
        .await
        .expect("card")
        .bytes()
        .await
        .map(|b| serde_json::from_slice(&b).expect("json"))
        .expect("body");
    assert_eq!(
        card["securitySchemes"]["oidc"]["openIdConnectSecurityScheme"]["openIdConnectUrl"],
        format!("{}/.well-known/openid-configuration", idp.issuer),
        "{card}"
    );
    assert!(
        card["securityRequirements"]
            .as_array()
            .is_some_and(|r| r.contains(&json!({"schemes": {"oidc": {"list": ["a2ad:echo"]}}}))),
        "{card}"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_rotated_key_is_fetched_and_a_provider_down_or_slow_is_a_bounded_401() {
    let first = SigningKey::new("k1", Algorithm::ES256);
    let idp = Idp::start(&[&first]).await;
    let s = TestServer::start(oidc_config(&idp, &["echo"])).await;
    let token = |key: &SigningKey| key.sign(&claims(&idp, "user-1", "a2ad:echo"));
    assert_eq!(send_with(&s, "echo", &token(&first), None).await.0, 200);

    // Rotation: the provider now signs with k2 only; a k2 token makes a2ad fetch again
    // (once the refetch bound of a second has passed).
    let second = SigningKey::new("k2", Algorithm::EdDSA);
    idp.rotate(&[&second]);
    let rotated = token(&second);
    poll_until(Duration::from_secs(30), || async {
        (send_with(&s, "echo", &rotated, None).await.0 == 200).then_some(())
    })
    .await;

    // The provider goes down: keys already fetched still verify; a new kid is a 401, also
    // once a2ad has tried the provider again (polled until it has).
    idp.set_mode(Mode::Down);
    assert_eq!(send_with(&s, "echo", &rotated, None).await.0, 200);
    let third = token(&SigningKey::new("k3", Algorithm::ES256));
    let tried_down = |before: usize| {
        let (s, third, idp) = (&s, &third, &idp);
        async move {
            let (status, body) = send_with(s, "echo", third, None).await;
            assert_eq!(status, 401, "{body}");
            (idp.requests() > before).then_some(())
        }
    };
    let before = idp.requests();
    poll_until(Duration::from_secs(30), || tried_down(before)).await;

    // Too slow: the fetch gives up within its time-out; the request is a 401, not a hang
    // (the test client would give up after 60 s; the provider sleeps for 600).
    idp.set_mode(Mode::Slow);
    let before = idp.requests();
    poll_until(Duration::from_secs(30), || tried_down(before)).await;
    // Meanwhile keys and other clients are served.
    assert_eq!(send_with(&s, "echo", &rotated, None).await.0, 200);
    assert_eq!(
        s.ok(s
            .call("echo", "message/send", send_params("by key", json!({})))
            .await)["status"]["state"],
        "completed"
    );
    s.stop().await;

    // A provider that is down from the start: a clear 401.
    let idp = Idp::start(&[&first]).await;
    idp.set_mode(Mode::Down);
    let s = TestServer::start(oidc_config(&idp, &["echo"])).await;
    let token = first.sign(&claims(&idp, "user-1", "a2ad:echo"));
    let (status, body) = send_with(&s, "echo", &token, None).await;
    assert_eq!(status, 401, "{body}");
    assert!(refusal(&body).contains("cannot be fetched"), "{body}");
    s.stop().await;
}

#[test]
fn oidc_settings_are_checked() {
    let base = "[[agents]]\nid = \"echo\"\n";
    let issuer = "[[auth.oidc]]\nissuer = \"https://idp.example.com\"\naudiences = [\"a\"]\n";
    let cases = [
        (
            format!("{issuer}algorithms = [\"none\"]\n"),
            "auth.oidc[0].algorithms[0]",
        ),
        (
            format!("{issuer}algorithms = [\"HS256\"]\n"),
            "auth.oidc[0].algorithms[0]",
        ),
        (
            "[[auth.oidc]]\nissuer = \"http://idp.example.com\"\naudiences = [\"a\"]\n".to_string(),
            "auth.oidc[0].issuer",
        ),
        (
            "[[auth.oidc]]\nissuer = \"https://idp.example.com\"\naudiences = []\n".to_string(),
            "auth.oidc[0].audiences",
        ),
        (
            format!("{issuer}leeway_seconds = 3600\n"),
            "auth.oidc[0].leeway_seconds",
        ),
        (format!("{issuer}name = \"apiKey\"\n"), "auth.oidc[0].name"),
        (
            format!("{issuer}[[api_keys]]\nname = \"a\"\nkey = \"eyJhbGciOi.eyJzdWIi.c2ln\"\n"),
            "api_keys[0].key",
        ),
        (format!("{issuer}{issuer}"), "auth.oidc[1].name"),
    ];
    for (text, key) in cases {
        let e = a2ad::Config::from_toml(&format!("{base}{text}")).expect_err(&text);
        assert_eq!(e.key.as_deref(), Some(key), "{text}: {e}");
    }
    let ok = format!("{base}{issuer}");
    assert!(a2ad::Config::from_toml(&ok).is_ok());
}

/// The inspector signs in with whatever is pasted, sent as `Authorization: Bearer`: a token
/// lists the agents its scope names and the recent-deliveries read is the token
/// principal's (docs/PROTOCOL.md §11).
#[tokio::test]
async fn a_token_signs_in_to_the_inspectors_reads() {
    let es = SigningKey::new("es-1", Algorithm::ES256);
    let idp = Idp::start(&[&es]).await;
    let s = TestServer::start(oidc_config(&idp, &["echo", "other"])).await;
    let token = es.sign(&claims(&idp, "user-1", "openid a2ad:echo"));
    let get = |path: &'static str, credential: String| {
        let req = s
            .client
            .get(format!("{}{path}", s.base))
            .header("authorization", format!("Bearer {credential}"));
        async move {
            let r = req.send().await.expect("request");
            (r.status().as_u16(), r.json::<Value>().await.expect("json"))
        }
    };
    let (status, body) = get("/api/v1/agents", token.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["principal"]
            .as_str()
            .is_some_and(|p| p.ends_with("#user-1")),
        "{body}"
    );
    assert_eq!(body["agents"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(body["agents"][0]["id"], "echo");
    let (status, body) = get("/api/v1/a2a/echo/rest/x-a2ad/deliveries", token.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["deliveries"], json!([]));
    let (status, _) = get("/api/v1/a2a/other/rest/x-a2ad/deliveries", token.clone()).await;
    assert_eq!(status, 403, "the token's scope does not name `other`");
    let expired = es.sign(&json!({"iss": idp.issuer, "sub": "user-1", "aud": AUDIENCE,
                                  "exp": now() - 3600, "scope": "a2ad:echo"}));
    let (status, body) = get("/api/v1/agents", expired).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.to_string().contains("expired"), "{body}");
    // A key pasted into the same field works the same way.
    let (status, body) = get("/api/v1/agents", ALICE.to_string()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["principal"], "alice");
    s.stop().await;
}
