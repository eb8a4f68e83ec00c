//! A local OpenID Connect provider on 127.0.0.1:0: a discovery document, a JWK Set that the
//! test swaps (key rotation), and modes in which it is down or too slow; it counts the
//! key fetches. Signing keys are made in the test (rcgen) and tokens signed with
//! jsonwebtoken.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::{KeyPair, PublicKeyData as _};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// How the provider answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Up,
    /// 503 to everything.
    Down,
    /// Accepts, then answers nothing for minutes.
    Slow,
}

struct State {
    keys: Vec<Value>,
    mode: Mode,
    fetches: usize,
    requests: usize,
}

pub struct Idp {
    pub issuer: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

/// A signing key with its public JWK.
pub struct SigningKey {
    pub kid: String,
    pub alg: Algorithm,
    pub pem: String,
    pub jwk: Value,
}

impl SigningKey {
    /// A new key of `alg` (ES256, EdDSA or RS256).
    pub fn new(kid: &str, alg: Algorithm) -> Self {
        let (kind, name) = match alg {
            Algorithm::ES256 => (&rcgen::PKCS_ECDSA_P256_SHA256, "ES256"),
            Algorithm::EdDSA => (&rcgen::PKCS_ED25519, "EdDSA"),
            Algorithm::RS256 => (&rcgen::PKCS_RSA_SHA256, "RS256"),
            other => panic!("no test key for {other:?}"),
        };
        let key = if alg == Algorithm::RS256 {
            use aws_lc_rs::encoding::AsDer as _;
            let rsa = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048)
                .expect("RSA key");
            let der = rsa.as_der().expect("PKCS#8");
            KeyPair::try_from(der.as_ref()).expect("key")
        } else {
            KeyPair::generate_for(kind).expect("key")
        };
        let raw = key.public_key_raw();
        let mut jwk = match alg {
            Algorithm::ES256 => json!({"kty": "EC", "crv": "P-256",
                "x": B64.encode(&raw[1..33]), "y": B64.encode(&raw[33..65])}),
            Algorithm::EdDSA => json!({"kty": "OKP", "crv": "Ed25519", "x": B64.encode(raw)}),
            _ => {
                let spki = key.subject_public_key_info();
                use x509_parser::prelude::FromDer as _;
                let (_, info) =
                    x509_parser::x509::SubjectPublicKeyInfo::from_der(&spki).expect("spki");
                let Ok(x509_parser::public_key::PublicKey::RSA(rsa)) = info.parsed() else {
                    panic!("not RSA");
                };
                let trim = |b: &[u8]| {
                    let start = b.iter().position(|&x| x != 0).unwrap_or(b.len());
                    B64.encode(&b[start..])
                };
                json!({"kty": "RSA", "n": trim(rsa.modulus), "e": trim(rsa.exponent)})
            }
        };
        jwk["kid"] = json!(kid);
        jwk["alg"] = json!(name);
        jwk["use"] = json!("sig");
        Self {
            kid: kid.to_string(),
            alg,
            pem: key.serialize_pem(),
            jwk,
        }
    }

    /// A token with these claims, signed by this key, its `kid` in the header.
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        let key = match self.alg {
            Algorithm::ES256 => EncodingKey::from_ec_pem(self.pem.as_bytes()),
            Algorithm::EdDSA => EncodingKey::from_ed_pem(self.pem.as_bytes()),
            _ => EncodingKey::from_rsa_pem(self.pem.as_bytes()),
        }
        .expect("encoding key");
        jsonwebtoken::encode(&header, claims, &key).expect("token")
    }

    /// This key's public half as PEM (what an attacker would use as an HMAC secret).
    pub fn public_pem(&self) -> String {
        let der = KeyPair::from_pem(&self.pem)
            .expect("key")
            .subject_public_key_info();
        let body = base64::engine::general_purpose::STANDARD.encode(der);
        format!("-----BEGIN PUBLIC KEY-----\n{body}\n-----END PUBLIC KEY-----\n")
    }
}

impl Idp {
    pub async fn start(keys: &[&SigningKey]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind idp");
        let issuer = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(State {
            keys: keys.iter().map(|k| k.jwk.clone()).collect(),
            mode: Mode::Up,
            fetches: 0,
            requests: 0,
        }));
        let task = {
            let (state, issuer) = (state.clone(), issuer.clone());
            tokio::spawn(async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        return;
                    };
                    let (state, issuer) = (state.clone(), issuer.clone());
                    tokio::spawn(async move {
                        let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                            let (state, issuer) = (state.clone(), issuer.clone());
                            async move { Ok::<_, Infallible>(answer(&state, &issuer, &req).await) }
                        });
                        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(tcp), svc)
                            .await;
                    });
                }
            })
        };
        Self {
            issuer,
            state,
            task,
        }
    }

    /// Serves these keys from now on.
    pub fn rotate(&self, keys: &[&SigningKey]) {
        self.state.lock().expect("lock").keys = keys.iter().map(|k| k.jwk.clone()).collect();
    }

    pub fn set_mode(&self, mode: Mode) {
        self.state.lock().expect("lock").mode = mode;
    }

    /// Requests of any kind so far (answered or not).
    pub fn requests(&self) -> usize {
        self.state.lock().expect("lock").requests
    }

    /// Requests for the JWK Set so far, answered.
    pub fn fetches(&self) -> usize {
        self.state.lock().expect("lock").fetches
    }
}

impl Drop for Idp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    state: &Mutex<State>,
    issuer: &str,
    req: &Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let mode = {
        let mut s = state.lock().expect("lock");
        s.requests += 1;
        s.mode
    };
    match mode {
        Mode::Down => return status(503, "down"),
        Mode::Slow => {
            tokio::time::sleep(Duration::from_secs(600)).await;
            return status(503, "late");
        }
        Mode::Up => {}
    }
    let body = match req.uri().path() {
        "/.well-known/openid-configuration" => json!({
            "issuer": issuer,
            "jwks_uri": format!("{issuer}/jwks.json"),
        }),
        "/jwks.json" => {
            let mut s = state.lock().expect("lock");
            s.fetches += 1;
            json!({"keys": s.keys})
        }
        _ => return status(404, "not found"),
    };
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("response")
}

fn status(code: u16, text: &'static str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .body(Full::new(Bytes::from_static(text.as_bytes())))
        .expect("response")
}
