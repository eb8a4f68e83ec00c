//! Secrets sealed at rest (`[secrets]`): a push configuration's secret, token, credentials
//! and header values never sit in clear in the store's files (or PostgreSQL rows, on the
//! cluster pass); a restart with the key reads them back and deliveries carry them; an
//! old key listed beside the new one still opens them; a wrong key refuses the start.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use a2ad::config::{Config, StoreConfig};
use serde_json::json;
use support::official::{V, message};
use support::receiver::Receiver;
use support::{TestServer, config, new_id, poll_until};

const K1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const K2: &str = "HxwdHBsaGRgXFhUUExIREA8ODQwLCgkIBwYFBAMCAQA=";
const SECRET: &str = "seal-me-hmac-secret-1234";
const HEADER: &str = "header-secret-5678";
const TOKEN: &str = "token-secret-3456";
const CREDENTIALS: &str = "credentials-secret-9012";

/// Every file under `dir`, concatenated.
fn all_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(b) = std::fs::read(&p) {
                out.extend(b);
            }
        }
    }
    out
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

struct Setup {
    dir: PathBuf,
    cluster: Option<a2ad::config::ClusterConfig>,
}

impl Setup {
    fn new() -> Self {
        let dir =
            std::env::temp_dir().join(format!("a2ad-sealed-{}-{}", std::process::id(), new_id()));
        std::fs::create_dir_all(&dir).expect("dir");
        Self {
            dir,
            cluster: support::test_cluster(),
        }
    }

    /// The same store (file, or the cluster's schema) with `key` and `old` keys.
    fn config(&self, key: Option<&str>, old: &[&str]) -> Config {
        let mut c = config(&["echo"]);
        c.store = StoreConfig::log(self.dir.join("a2ad.log").display().to_string());
        c.cluster = self.cluster.clone();
        c.secrets.key = key.map(String::from);
        c.secrets.old_keys = old.iter().map(|k| (*k).to_string()).collect();
        c
    }

    /// What the store holds at rest: its files, or the cluster's push rows.
    async fn at_rest(&self) -> Vec<u8> {
        match &self.cluster {
            None => all_bytes(&self.dir),
            Some(c) => {
                let (client, conn) = tokio_postgres::connect(&c.url, tokio_postgres::NoTls)
                    .await
                    .expect("connect");
                tokio::spawn(conn);
                let rows = client
                    .query(&format!("SELECT body FROM {}.push", c.schema), &[])
                    .await
                    .expect("push rows");
                assert!(!rows.is_empty(), "the configurations are in PostgreSQL");
                rows.iter().flat_map(|r| r.get::<_, Vec<u8>>(0)).collect()
            }
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A seed configuration (secret, a header) and an official one on a task (token,
/// credentials), both to `rx`; returns the official task's id.
async fn configure(s: &TestServer, rx: &Receiver) -> String {
    let seed = s
        .call(
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": rx.url, "secret": SECRET,
                              "headers": {"X-Receiver-Key": HEADER}}}),
        )
        .await;
    s.ok(seed);
    let sent = s
        .official(
            "echo",
            V::V10,
            "SendMessage",
            json!({"message": message(V::V10, "hi", None)}),
        )
        .await;
    let task = s.result(sent)["task"]["id"]
        .as_str()
        .expect("task")
        .to_string();
    let created = s
        .official(
            "echo",
            V::V10,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": task, "id": "official", "url": rx.url, "token": TOKEN,
                   "authentication": {"scheme": "Bearer", "credentials": CREDENTIALS}}),
        )
        .await;
    s.result(created);
    task
}

#[tokio::test]
async fn secrets_are_sealed_at_rest_and_read_back_with_the_key() {
    let setup = Setup::new();
    let rx = Receiver::ok().await;

    let s = TestServer::start(setup.config(Some(K1), &[])).await;
    let task = configure(&s, &rx).await;
    s.stop().await;
    let rest = setup.at_rest().await;
    for secret in [SECRET, HEADER, TOKEN, CREDENTIALS] {
        assert!(!contains(&rest, secret), "{secret} is in clear at rest");
    }
    assert!(
        contains(&rest, "a2ad-sealed:v1:"),
        "sealed values are there"
    );

    // Restart with the key: the seed configuration signs and sends its header; the official
    // one is shown back with its token.
    let s = TestServer::start(setup.config(Some(K1), &[])).await;
    s.send("echo", "hook me", json!({})).await;
    let hits = rx.wait_for(1).await;
    let seeded = hits
        .iter()
        .find(|h| h.header("x-receiver-key") == HEADER)
        .expect("a delivery of the seed configuration carries its header");
    assert!(seeded.header("x-webhook-signature").starts_with("sha256="));
    let got = s
        .official(
            "echo",
            V::V10,
            "GetTaskPushNotificationConfig",
            json!({"taskId": task, "id": "official"}),
        )
        .await;
    let got = s.result(got);
    assert_eq!(got["token"], TOKEN, "{got}");
    s.stop().await;

    // Rotation: K2 new, K1 listed as old — still read, and sealed with K2 from the next write.
    let s = TestServer::start(setup.config(Some(K2), &[K1])).await;
    let before = rx.hits().len();
    s.send("echo", "after rotation", json!({})).await;
    poll_until(Duration::from_secs(30), || async {
        (rx.hits().len() > before).then_some(())
    })
    .await;
    s.stop().await;

    // A wrong key: the start is refused, naming the key id.
    let wrong = a2ad::Server::bind(setup.config(Some(K2), &[]).validated().expect("valid")).await;
    match wrong {
        Err(e @ a2ad::Error::Store { .. }) => {
            assert!(e.to_string().contains("not configured"), "{e}");
        }
        Err(other) => panic!("not a store error: {other}"),
        Ok(_) => panic!("started with a wrong key"),
    }
    let none = a2ad::Server::bind(setup.config(None, &[]).validated().expect("valid")).await;
    assert!(
        none.is_err(),
        "no key at all cannot read sealed secrets either"
    );
}

#[test]
fn secrets_keys_are_checked() {
    let base = "[[agents]]\nid = \"echo\"\n";
    for (text, key) in [
        ("[secrets]\nkey = \"c2hvcnQ=\"\n", "secrets.key"),
        (
            "[secrets]\nkey = \"env:A2AD_SURELY_UNSET_SECRETS_KEY\"\n",
            "secrets.key",
        ),
        (
            "[secrets]\nkey = \"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"\nold_keys = [\"nope\"]\n",
            "secrets.old_keys[0]",
        ),
    ] {
        let e = Config::from_toml(&format!("{base}{text}")).expect_err(text);
        assert_eq!(e.key.as_deref(), Some(key), "{text}: {e}");
        assert!(
            !e.to_string().contains("AAECAwQF"),
            "a key is never shown: {e}"
        );
    }
}

/// Issue 53, defect 9: credentials inside a webhook URL (userinfo, a token in the query)
/// are sealed at rest like the other secrets, in the log, redb and PostgreSQL stores; a
/// restart reads the URL back whole and deliveries go to it; reads show it masked.
#[tokio::test]
async fn credentials_in_a_webhook_url_are_sealed_at_rest_in_every_store() {
    const USER: &str = "url-user-4242";
    const PASSWORD: &str = "url-password-7777";
    const QUERY: &str = "url-query-token-8888";
    let backends: &[Option<&str>] = if support::test_cluster().is_some() {
        &[None]
    } else {
        &[Some("log"), Some("redb")]
    };
    for backend in backends {
        let setup = Setup::new();
        let rx = Receiver::ok().await;
        let store = |c: &mut Config| {
            if *backend == Some("redb") {
                c.store = StoreConfig::redb(setup.dir.join("a2ad.redb").display().to_string());
            }
        };
        let url = rx
            .url
            .replacen("http://", &format!("http://{USER}:{PASSWORD}@"), 1)
            + &format!("/hook?token={QUERY}");
        let mut c = setup.config(Some(K1), &[]);
        store(&mut c);
        let s = TestServer::start(c).await;
        let set = s
            .call(
                "echo",
                "tasks/pushNotificationConfig/set",
                json!({"config": {"url": url}}),
            )
            .await;
        let shown = s.ok(set)["config"]["url"].to_string();
        assert!(
            !shown.contains(PASSWORD) && !shown.contains(QUERY),
            "{backend:?}: shown masked: {shown}"
        );
        s.stop().await;
        let rest = setup.at_rest().await;
        for secret in [USER, PASSWORD, QUERY] {
            assert!(
                !contains(&rest, secret),
                "{backend:?}: {secret} is in clear at rest"
            );
        }
        // A restart reads the whole URL back: the delivery goes to it, query and all.
        let mut c = setup.config(Some(K1), &[]);
        store(&mut c);
        let s = TestServer::start(c).await;
        s.send("echo", "hook me", json!({})).await;
        rx.wait_for(1).await;
        let hit = &rx.hits()[0];
        assert!(
            hit.uri.ends_with(&format!("/hook?token={QUERY}")),
            "{backend:?}: delivered to {}",
            hit.uri
        );
        s.stop().await;
    }
}
