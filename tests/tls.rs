//! TLS on the listener and client certificates (mTLS): HTTP/1.1, HTTP/2 and gRPC clients
//! over TLS, certificate files swapped on disk and served without a restart, bad files
//! refused at start-up, and client certificates as principals beside keys. Every
//! certificate is made here (rcgen), in a folder of the test's own.

use crate::support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use a2ad::config::{CertificateConfig, Config, TlsConfig};
use a2ad::proto::{self as pb, a2a_service_client::A2aServiceClient};
use a2ad::{Server, ServerHandle};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use serde_json::{Value, json};
use support::{ALICE, config, metric, new_id, poll_until, send_params};

/// A certificate authority of the test's own.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM.
struct Leaf {
    cert: String,
    key: String,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("key");
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA"),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `localhost` and 127.0.0.1, valid now unless `period` says
    /// otherwise.
    fn server(&self, period: Option<(i32, i32)>) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("params");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if let Some((from, to)) = period {
            params.not_before = rcgen::date_time_ymd(from, 1, 1);
            params.not_after = rcgen::date_time_ymd(to, 1, 1);
        }
        self.sign(params)
    }

    /// A client certificate: common name `cn`, and `san` as its DNS name if given.
    fn client(&self, cn: &str, san: Option<&str>) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        if let Some(san) = san {
            params.subject_alt_names = vec![SanType::DnsName(san.try_into().expect("a DNS name"))];
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Leaf {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// A folder of the test's own, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Self {
        let dir =
            std::env::temp_dir().join(format!("a2ad-tls-{}-{}", std::process::id(), new_id()));
        std::fs::create_dir_all(&dir).expect("dir");
        Self(dir)
    }

    /// Writes a file; returns its path.
    fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }

    /// Writes a server certificate and key as `cert.pem` and `key.pem`.
    fn serve(&self, leaf: &Leaf) {
        self.write("cert.pem", &leaf.cert);
        self.write("key.pem", &leaf.key);
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The test configuration (keys of alice, bob, carol; the given agents) served over TLS with
/// `cert.pem` and `key.pem` of `dir`.
fn tls_config(dir: &Dir, agents: &[&str]) -> Config {
    let mut c = config(agents);
    c.server.tls = Some(TlsConfig::new(dir.path("cert.pem"), dir.path("key.pem")));
    c
}

async fn start(c: Config) -> (ServerHandle, u16) {
    let server = Server::bind(c.validated().expect("valid"))
        .await
        .expect("bind");
    assert_eq!(server.scheme(), "https");
    let handle = server.serve().expect("serve");
    let port = handle.local_addr().port();
    (handle, port)
}

/// A client that trusts only `ca`, with a client certificate if given.
fn client(ca: &str, identity: Option<&Leaf>, http1: bool) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca.as_bytes()).expect("CA")])
        .tls_info(true)
        .timeout(Duration::from_secs(30));
    if let Some(leaf) = identity {
        let pem = format!("{}{}", leaf.cert, leaf.key);
        b = b.identity(reqwest::Identity::from_pem(pem.as_bytes()).expect("identity"));
    }
    if http1 {
        b = b.http1_only();
    }
    b.build().expect("client")
}

/// A JSON-RPC 1.0-seed `message/send` over `client`, with a key if given: the HTTP
/// status, the version spoken and the body — or the transport's error.
async fn send(
    client: &reqwest::Client,
    port: u16,
    agent: &str,
    key: Option<&str>,
) -> Result<(u16, reqwest::Version, Value), reqwest::Error> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "message/send",
                      "params": send_params("over TLS", json!({}))});
    call(client, port, agent, key, &body).await
}

async fn call(
    client: &reqwest::Client,
    port: u16,
    agent: &str,
    key: Option<&str>,
    body: &Value,
) -> Result<(u16, reqwest::Version, Value), reqwest::Error> {
    let mut req = client
        .post(format!("https://localhost:{port}/api/v1/a2a/{agent}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let version = resp.version();
    let bytes = resp.bytes().await?;
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok((status, version, json))
}

/// The certificate the server presented on a response's connection (DER).
async fn served_certificate(client: &reqwest::Client, port: u16) -> Option<Vec<u8>> {
    let resp = client
        .get(format!(
            "https://localhost:{port}/.well-known/agent-card.json"
        ))
        .send()
        .await
        .ok()?;
    resp.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate().map(<[u8]>::to_vec))
}

fn der_of(pem: &str) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject as _;
    rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("PEM")
        .to_vec()
}

/// A gRPC client (tonic's own TLS) trusting `ca`, with a client certificate if given.
async fn grpc(
    ca: &str,
    identity: Option<&Leaf>,
    port: u16,
) -> Result<A2aServiceClient<tonic::transport::Channel>, tonic::transport::Error> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert, &leaf.key));
    }
    let channel = tonic::transport::Channel::from_shared(format!("https://localhost:{port}"))
        .expect("uri")
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(A2aServiceClient::new(channel))
}

fn grpc_send(key: Option<&str>, agent: &str) -> tonic::Request<pb::SendMessageRequest> {
    let params = json!({
        "tenant": agent,
        "message": {"role": "ROLE_USER", "messageId": new_id(),
                    "parts": [{"text": "over gRPC and TLS"}]},
    });
    let mut req = tonic::Request::new(serde_json::from_value(params).expect("message"));
    req.metadata_mut()
        .insert("a2a-version", "1.0".parse().expect("version"));
    if let Some(k) = key {
        req.metadata_mut()
            .insert("x-api-key", k.parse().expect("key"));
    }
    req
}

/// The TLS version a rustls client limited to `versions` gets from the server.
async fn negotiated(
    ca: &str,
    port: u16,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Option<rustls::ProtocolVersion> {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from_pem_slice(ca.as_bytes()).expect("CA"))
        .expect("root");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let stream = connector.connect(name, tcp).await.ok()?;
    stream.get_ref().1.protocol_version()
}

#[tokio::test]
async fn tls_serves_http1_http2_and_grpc_and_cards_name_https() {
    let dir = Dir::new();
    let ca = Ca::new("a2ad test CA");
    dir.serve(&ca.server(None));
    let (handle, port) = start(tls_config(&dir, &["echo"])).await;

    // HTTP/1.1 and HTTP/2, chosen by ALPN.
    for (http1, version) in [
        (true, reqwest::Version::HTTP_11),
        (false, reqwest::Version::HTTP_2),
    ] {
        let (status, spoken, body) =
            send(&client(&ca.pem(), None, http1), port, "echo", Some(ALICE))
                .await
                .expect("send over TLS");
        assert_eq!((status, spoken), (200, version), "{body}");
        assert_eq!(body["result"]["status"]["state"], "completed", "{body}");
    }

    // gRPC over TLS (HTTP/2 by ALPN), with tonic's TLS client.
    let mut g = grpc(&ca.pem(), None, port).await.expect("gRPC over TLS");
    let reply = g
        .send_message(grpc_send(Some(ALICE), "echo"))
        .await
        .expect("SendMessage over TLS")
        .into_inner();
    let reply = serde_json::to_value(reply).expect("json");
    assert_eq!(
        reply["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{reply}"
    );
    let err = g
        .send_message(grpc_send(None, "echo"))
        .await
        .expect_err("no key");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);

    // The cards' URLs are https.
    let card: Value = client(&ca.pem(), None, false)
        .get(format!(
            "https://localhost:{port}/.well-known/agent-card.json"
        ))
        .send()
        .await
        .expect("card")
        .bytes()
        .await
        .map(|b| serde_json::from_slice(&b).expect("json"))
        .expect("body");
    let url = card["supportedInterfaces"][0]["url"].as_str().unwrap_or("");
    assert!(
        url.starts_with(&format!("https://localhost:{port}/")),
        "{card}"
    );
    assert!(
        card["securitySchemes"].get("mtls").is_none(),
        "no mTLS: {card}"
    );

    // TLS 1.3 preferred, TLS 1.2 accepted.
    assert_eq!(
        negotiated(&ca.pem(), port, rustls::ALL_VERSIONS).await,
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    assert_eq!(
        negotiated(&ca.pem(), port, &[&rustls::version::TLS12]).await,
        Some(rustls::ProtocolVersion::TLSv1_2)
    );

    // Plain HTTP on the TLS port: refused at the handshake, and counted.
    let plain = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/api/v1/a2a/echo"))
        .header("x-api-key", ALICE)
        .body("{}")
        .send()
        .await;
    assert!(
        plain.is_err() || plain.is_ok_and(|r| !r.status().is_success()),
        "plain HTTP is not served on a TLS port"
    );
    let c = client(&ca.pem(), None, false);
    poll_until(Duration::from_secs(30), || async {
        let text = c
            .get(format!("https://localhost:{port}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        (metric(
            &text,
            "a2ad_connections_closed_total{reason=\"tls_handshake\"}",
        ) >= 1.0)
            .then_some(())
    })
    .await;
    handle.stop();
    handle.stopped().await;
}

#[tokio::test]
async fn a_certificate_swapped_on_disk_is_served_without_a_restart() {
    let dir = Dir::new();
    let first = Ca::new("first CA");
    let first_leaf = first.server(None);
    dir.serve(&first_leaf);
    let mut c = tls_config(&dir, &["echo"]);
    if let Some(tls) = &mut c.server.tls {
        tls.reload_check_seconds = 1.0;
    }
    let (handle, port) = start(c).await;
    assert_eq!(
        served_certificate(&client(&first.pem(), None, false), port).await,
        Some(der_of(&first_leaf.cert))
    );

    // A file that does not load (half copied, say) is not served: the old pair stays.
    dir.write("cert.pem", "-----BEGIN CERTIFICATE-----\nnot base64\n");
    handle.reload_tls().await;
    assert_eq!(
        served_certificate(&client(&first.pem(), None, false), port).await,
        Some(der_of(&first_leaf.cert)),
        "a bad file keeps the previous certificate"
    );

    // A new pair, checked at once (as SIGHUP does): new connections get it.
    let second = Ca::new("second CA");
    let second_leaf = second.server(None);
    dir.serve(&second_leaf);
    handle.reload_tls().await;
    assert_eq!(
        served_certificate(&client(&second.pem(), None, false), port).await,
        Some(der_of(&second_leaf.cert))
    );
    assert!(
        send(
            &client(&first.pem(), None, false),
            port,
            "echo",
            Some(ALICE)
        )
        .await
        .is_err(),
        "the old certificate is no longer served"
    );

    // And without being told: the periodic check finds the change.
    let third = Ca::new("third CA");
    let third_leaf = third.server(None);
    dir.serve(&third_leaf);
    let third_client = client(&third.pem(), None, false);
    poll_until(Duration::from_secs(30), || async {
        (served_certificate(&third_client, port).await == Some(der_of(&third_leaf.cert)))
            .then_some(())
    })
    .await;
    let (status, _, body) = send(&third_client, port, "echo", Some(ALICE))
        .await
        .expect("send");
    assert_eq!(status, 200, "{body}");
    handle.stop();
    handle.stopped().await;
}

#[tokio::test]
async fn bad_tls_files_refuse_the_start_naming_key_and_file() {
    let dir = Dir::new();
    let ca = Ca::new("a2ad test CA");
    let good = ca.server(None);
    let other = ca.server(None);
    let expired = ca.server(Some((2000, 2001)));
    let future = ca.server(Some((2090, 2091)));
    let cert = dir.write("good.pem", &good.cert);
    let key = dir.write("good.key", &good.key);
    let other_key = dir.write("other.key", &other.key);
    let expired_cert = dir.write("expired.pem", &expired.cert);
    let expired_key = dir.write("expired.key", &expired.key);
    let future_cert = dir.write("future.pem", &future.cert);
    let future_key = dir.write("future.key", &future.key);
    let garbage = dir.write("garbage.pem", "hello\n");
    let missing = dir.path("missing.pem");
    let cases: Vec<(TlsConfig, &str, &str, &str)> = vec![
        (
            TlsConfig::new(&missing, &key),
            "server.tls.cert_file",
            &missing,
            "cannot read",
        ),
        (
            TlsConfig::new(&garbage, &key),
            "server.tls.cert_file",
            &garbage,
            "no PEM certificate",
        ),
        (
            TlsConfig::new(&cert, &garbage),
            "server.tls.key_file",
            &garbage,
            "private key",
        ),
        (
            TlsConfig::new(&cert, &other_key),
            "server.tls.key_file",
            &other_key,
            "does not belong",
        ),
        (
            TlsConfig::new(&expired_cert, &expired_key),
            "server.tls.cert_file",
            &expired_cert,
            "not now",
        ),
        (
            TlsConfig::new(&future_cert, &future_key),
            "server.tls.cert_file",
            &future_cert,
            "not now",
        ),
        (
            TlsConfig {
                client_ca_file: Some(garbage.clone()),
                ..TlsConfig::new(&cert, &key)
            },
            "server.tls.client_ca_file",
            &garbage,
            "no PEM certificate",
        ),
    ];
    for (tls, key_name, file, why) in cases {
        let mut c = config(&["echo"]);
        c.server.tls = Some(tls);
        match Server::bind(c.validated().expect("valid")).await {
            Err(a2ad::Error::Config(e)) => {
                assert_eq!(e.key.as_deref(), Some(key_name), "{e}");
                assert!(e.message.contains(file), "names {file}: {e}");
                assert!(e.message.contains(why), "says {why}: {e}");
            }
            Err(other) => panic!("{key_name} {file}: not a configuration error: {other}"),
            Ok(_) => panic!("{key_name} {file}: started"),
        }
    }

    // The binary: exit 2, naming the file, nothing served.
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[server.tls]\ncert_file = {expired_cert:?}\nkey_file = {expired_key:?}\n[store]\nbackend = \"memory\"\n"
    );
    let config_file = dir.write("a2ad.toml", &text);
    let out = std::process::Command::new(support::binary::BIN)
        .args(["--config", &config_file])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&expired_cert) && err.contains("server.tls.cert_file"),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A server asking for client certificates from `client_ca`: `svc-a.example.com` (a DNS
/// name) is principal `svc-a` on every agent, common name `svc-b` is principal `svc-b` on
/// `echo` only.
async fn mtls_server(
    dir: &Dir,
    server_ca: &Ca,
    client_ca: &Ca,
    required: bool,
) -> (ServerHandle, u16) {
    dir.serve(&server_ca.server(None));
    let mut c = tls_config(dir, &["echo", "other"]);
    if let Some(tls) = &mut c.server.tls {
        tls.client_ca_file = Some(dir.write("clients.pem", &client_ca.pem()));
        tls.client_cert_required = required;
    }
    c.auth.certificates = vec![
        CertificateConfig::new("svc-a", "svc-a.example.com"),
        CertificateConfig {
            agents: vec!["echo".into()],
            ..CertificateConfig::new("svc-b", "svc-b")
        },
    ];
    start(c).await
}

#[tokio::test]
async fn client_certificates_are_principals_beside_keys() {
    let dir = Dir::new();
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let stranger_ca = Ca::new("another CA");
    let (handle, port) = mtls_server(&dir, &server_ca, &client_ca, false).await;
    let ca = server_ca.pem();
    let svc_a = client_ca.client("service A", Some("svc-a.example.com"));
    let svc_b = client_ca.client("svc-b", None);
    let unlisted = client_ca.client("svc-c", Some("svc-c.example.com"));
    let forged = stranger_ca.client("service A", Some("svc-a.example.com"));

    // A certificate that names a principal needs no key.
    let a = client(&ca, Some(&svc_a), false);
    let (status, _, body) = send(&a, port, "other", None).await.expect("send");
    assert_eq!(status, 200, "{body}");
    let task = body["result"]["id"].as_str().expect("task id").to_string();
    let get = json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task}});
    let (_, _, got) = call(&a, port, "other", None, &get).await.expect("get");
    assert_eq!(got["result"]["id"], task.as_str(), "{got}");

    // Ownership: a key's principal does not see the certificate's tasks.
    let keyed = client(&ca, None, false);
    let (_, _, theirs) = call(&keyed, port, "other", Some(ALICE), &get)
        .await
        .expect("get");
    assert_eq!(theirs["error"]["code"], -32000, "{theirs}");

    // The certificate's agent allow-list: svc-b may use echo only.
    let b = client(&ca, Some(&svc_b), true);
    assert_eq!(send(&b, port, "echo", None).await.expect("send").0, 200);
    assert_eq!(send(&b, port, "other", None).await.expect("send").0, 403);

    // A certificate no identity matches is no credential; with a key it is fine.
    let c = client(&ca, Some(&unlisted), false);
    assert_eq!(send(&c, port, "echo", None).await.expect("send").0, 401);
    assert_eq!(
        send(&c, port, "echo", Some(ALICE)).await.expect("send").0,
        200
    );

    // A key of another principal beside a certificate: two credentials disagree.
    let (status, _, body) = send(&a, port, "echo", Some(ALICE)).await.expect("send");
    assert_eq!(status, 401, "{body}");

    // No certificate: keys as ever.
    assert_eq!(
        send(&keyed, port, "echo", Some(ALICE))
            .await
            .expect("send")
            .0,
        200
    );
    assert_eq!(send(&keyed, port, "echo", None).await.expect("send").0, 401);

    // A certificate from another CA is refused at the handshake.
    assert!(
        send(&client(&ca, Some(&forged), false), port, "echo", None)
            .await
            .is_err()
    );

    // gRPC with a client certificate.
    let mut g = grpc(&ca, Some(&svc_a), port).await.expect("gRPC over mTLS");
    let reply = g
        .send_message(grpc_send(None, "other"))
        .await
        .expect("SendMessage with a certificate")
        .into_inner();
    let reply = serde_json::to_value(reply).expect("json");
    assert_eq!(
        reply["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{reply}"
    );

    // The card declares the scheme.
    let card: Value = keyed
        .get(format!(
            "https://localhost:{port}/.well-known/agent-card.json"
        ))
        .send()
        .await
        .expect("card")
        .bytes()
        .await
        .map(|b| serde_json::from_slice(&b).expect("json"))
        .expect("body");
    assert!(
        card["securitySchemes"]["mtls"]["mtlsSecurityScheme"].is_object(),
        "{card}"
    );
    let requirements = card["securityRequirements"].to_string();
    assert!(requirements.contains("\"mtls\""), "{card}");
    handle.stop();
    handle.stopped().await;
}

#[tokio::test]
async fn a_required_client_certificate_is_asked_for_at_the_handshake() {
    let dir = Dir::new();
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let (handle, port) = mtls_server(&dir, &server_ca, &client_ca, true).await;
    let ca = server_ca.pem();
    assert!(
        send(&client(&ca, None, false), port, "echo", Some(ALICE))
            .await
            .is_err(),
        "no certificate, no connection"
    );
    let svc_a = client_ca.client("service A", Some("svc-a.example.com"));
    let (status, _, body) = send(&client(&ca, Some(&svc_a), false), port, "echo", None)
        .await
        .expect("send");
    assert_eq!(status, 200, "{body}");
    handle.stop();
    handle.stopped().await;
}

#[test]
fn tls_settings_are_checked() {
    let base = "[[agents]]\nid = \"echo\"\n";
    let cases = [
        (
            "[server.tls]\ncert_file = \"c\"\nkey_file = \"k\"\nreload_check_seconds = 0\n",
            "server.tls.reload_check_seconds",
        ),
        (
            "[server.tls]\ncert_file = \"\"\nkey_file = \"k\"\n",
            "server.tls.cert_file",
        ),
        (
            "[server.tls]\ncert_file = \"c\"\nkey_file = \"k\"\nclient_cert_required = true\n",
            "server.tls.client_cert_required",
        ),
        (
            "[[auth.certificates]]\nname = \"svc\"\nidentity = \"svc.example.com\"\n",
            "auth.certificates[0].identity",
        ),
    ];
    for (text, key) in cases {
        let e = Config::from_toml(&format!("{base}{text}")).expect_err(text);
        assert_eq!(e.key.as_deref(), Some(key), "{e}");
    }
}
