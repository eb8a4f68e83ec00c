//! The inspector's server side (docs/PROTOCOL.md §11): the static files at `/ui` with their
//! security headers, `[ui] enabled = false`, the agents listing and the recent-deliveries
//! read (authenticated, owner-scoped, bounded). The pages themselves run in a real
//! browser in `tests/browser/run`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::receiver::{Answer, Receiver};
use crate::support::{self, ALICE, BOB, CAROL, TestServer, poll_until};

async fn get(s: &TestServer, path: &str, key: Option<&str>) -> reqwest::Response {
    let mut req = s.client.get(format!("{}{path}", s.base));
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    req.send().await.expect("request")
}

/// Whether a page, script or style refers to a resource by an absolute URL (a CDN, a font
/// service): the inspector works offline, from this origin alone.
fn loads_elsewhere(text: &str) -> bool {
    [
        "src=\"http",
        "href=\"http",
        "from 'http",
        "from \"http",
        "import('http",
        "fetch('http",
        "url(http",
        "url(\"http",
        "@import",
    ]
    .iter()
    .any(|p| text.contains(p))
}

async fn json_of(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

#[tokio::test]
async fn the_inspector_is_served_with_a_strict_policy_and_no_privilege() {
    let s = TestServer::start(support::config(&["echo"])).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");

    let r = client
        .get(format!("{}/ui", s.base))
        .send()
        .await
        .expect("ui");
    assert_eq!(r.status(), 308);
    assert_eq!(r.headers()["location"], "/ui/");

    let r = get(&s, "/ui/", None).await;
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    let csp = h["content-security-policy"].to_str().expect("csp");
    for rule in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(rule), "{csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["x-frame-options"], "DENY");
    let html = r.text().await.expect("html");
    assert!(html.contains(r#"<script type="module" src="app.js"></script>"#));
    // No inline script, no inline style, nothing fetched from elsewhere.
    assert_eq!(html.matches("<script").count(), 1);
    assert!(!html.contains("style=") && !html.contains("<style"));
    assert!(
        !loads_elsewhere(&html),
        "the page loads nothing from another origin"
    );

    // Every file the page names is served, and the whole inspector stays small.
    let mut total = html.len();
    for (file, kind) in [
        ("app.js", "text/javascript; charset=utf-8"),
        ("wire.js", "text/javascript; charset=utf-8"),
        ("agents.js", "text/javascript; charset=utf-8"),
        ("chat.js", "text/javascript; charset=utf-8"),
        ("tasks.js", "text/javascript; charset=utf-8"),
        ("hooks.js", "text/javascript; charset=utf-8"),
        ("pulse.js", "text/javascript; charset=utf-8"),
        ("comply.js", "text/javascript; charset=utf-8"),
        ("style.css", "text/css; charset=utf-8"),
        ("icon.svg", "image/svg+xml"),
    ] {
        let r = get(&s, &format!("/ui/{file}"), None).await;
        assert_eq!(r.status(), 200, "{file}");
        assert_eq!(r.headers()["content-type"], kind, "{file}");
        let tag = r.headers()["etag"].to_str().expect("etag").to_string();
        let body = r.text().await.expect("body");
        assert!(
            !loads_elsewhere(&body),
            "{file} loads nothing from another origin"
        );
        total += body.len();
        // Revalidation: the same tag answers 304 without a body.
        let again = s
            .client
            .get(format!("{}/ui/{file}", s.base))
            .header("if-none-match", &tag)
            .send()
            .await
            .expect("again");
        assert_eq!(again.status(), 304, "{file}");
        assert!(again.bytes().await.expect("body").is_empty());
    }
    assert!(total < 200 * 1024, "the inspector is {total} bytes");

    let head = client
        .head(format!("{}/ui/app.js", s.base))
        .send()
        .await
        .expect("head");
    assert_eq!(head.status(), 200);
    let post = client
        .post(format!("{}/ui/app.js", s.base))
        .send()
        .await
        .expect("post");
    assert_eq!(post.status(), 405);
    for missing in [
        "/ui/nope.js",
        "/ui/app.js/x",
        "/ui/..%2Fmetrics",
        "/ui/%2e%2e%2Fapp.js",
    ] {
        let r = get(&s, missing, None).await;
        assert_eq!(r.status(), 404, "{missing}");
    }
    s.stop().await;
}

#[tokio::test]
async fn the_inspector_can_be_turned_off() {
    let mut c = support::config(&["echo"]);
    c.ui.enabled = false;
    let s = TestServer::start(c).await;
    for path in ["/ui", "/ui/", "/ui/app.js"] {
        assert_eq!(get(&s, path, None).await.status(), 404, "{path}");
    }
    // The agents listing and the rest are not the inspector's: still served.
    assert_eq!(get(&s, "/api/v1/agents", Some(ALICE)).await.status(), 200);
    s.stop().await;
}

#[tokio::test]
async fn the_agents_listing_names_what_the_key_may_use() {
    let mut c = support::config(&["echo", "secret"]);
    c.agents[0].description = Some("Says back".into());
    c.agents[1].streaming = Some(false);
    let s = TestServer::start(c).await;

    let (status, body) = json_of(get(&s, "/api/v1/agents", Some(ALICE)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["principal"], "alice");
    let ids: Vec<&str> = body["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .filter_map(|a| a["id"].as_str())
        .collect();
    assert_eq!(ids, ["echo", "secret"]);
    let echo = &body["agents"][0];
    assert_eq!(echo["description"], "Says back");
    assert_eq!(echo["streaming"], true);
    assert_eq!(body["agents"][1]["streaming"], false);
    assert!(
        echo["limits"]["maxFileSize"]
            .as_u64()
            .is_some_and(|n| n > 0)
    );
    assert!(
        echo["limits"]["supportedTypes"]
            .as_array()
            .is_some_and(|t| !t.is_empty())
    );

    // Carol may use echo only: she is told of nothing else.
    let (_, body) = json_of(get(&s, "/api/v1/agents", Some(CAROL)).await).await;
    assert_eq!(body["agents"].as_array().map(Vec::len), Some(1));
    assert_eq!(body["agents"][0]["id"], "echo");

    // No key, a wrong key: 401 with the challenge, and no agent named.
    for key in [None, Some("not-a-key-0123456789")] {
        let r = get(&s, "/api/v1/agents", key).await;
        assert_eq!(r.status(), 401);
        assert!(r.headers().contains_key("www-authenticate"));
        let text = r.text().await.expect("text");
        assert!(
            text.contains("UNAUTHENTICATED") && !text.contains("echo"),
            "{text}"
        );
    }
    let r = s
        .client
        .post(format!("{}/api/v1/agents", s.base))
        .header("x-api-key", ALICE)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET, HEAD, OPTIONS");
    s.stop().await;
}

async fn deliveries(s: &TestServer, key: &str, query: &str) -> (u16, Value) {
    json_of(
        get(
            s,
            &format!("/api/v1/a2a/echo/rest/x-a2ad/deliveries{query}"),
            Some(key),
        )
        .await,
    )
    .await
}

#[tokio::test]
async fn recent_deliveries_are_the_owners_own_with_each_attempt() {
    // The first attempt of each delivery fails with 500, the retry succeeds.
    let receiver = Receiver::watching(Arc::new(|hits: &[crate::support::receiver::Hit]| {
        let last = hits
            .last()
            .map(|h| h.header("x-webhook-delivery").to_string());
        let tries = hits
            .iter()
            .filter(|h| Some(h.header("x-webhook-delivery").to_string()) == last)
            .count();
        if tries == 1 {
            Answer::status(500)
        } else {
            Answer::status(200)
        }
    }))
    .await;
    let s = TestServer::start(support::config(&["echo"])).await;

    let set = s
        .call_as(
            ALICE,
            "echo",
            "tasks/pushNotificationConfig/set",
            json!({"config": {"url": receiver.url, "events": ["task.completed"],
                   "retryPolicy": {"maxRetries": 3, "initialDelay": 0.05}}}),
        )
        .await;
    assert!(set["result"]["configId"].is_string(), "{set}");
    let task = s.send("echo", "hello", json!({})).await;
    let task_id = task["id"].as_str().expect("id").to_string();

    let list = poll_until(Duration::from_secs(30), || async {
        let (status, body) = deliveries(&s, ALICE, "").await;
        assert_eq!(status, 200, "{body}");
        let list = body["deliveries"].as_array().cloned().unwrap_or_default();
        (list.len() >= 2).then_some(list)
    })
    .await;
    // Newest first: the retry that was delivered, then the first attempt's 500.
    let (ok, failed) = (&list[0], &list[1]);
    assert_eq!(ok["outcome"], "delivered", "{ok}");
    assert_eq!(ok["httpStatus"], 200);
    assert_eq!(ok["attempt"], 2);
    assert_eq!(ok["maxAttempts"], 4);
    assert_eq!(failed["outcome"], "retrying", "{failed}");
    assert_eq!(failed["httpStatus"], 500);
    assert_eq!(failed["attempt"], 1);
    assert!(failed["nextAttemptAt"].is_string(), "{failed}");
    assert!(ok.get("nextAttemptAt").is_none());
    for d in [ok, failed] {
        assert_eq!(d["taskId"], task_id.as_str());
        assert_eq!(d["event"], "task.completed");
        assert_eq!(d["url"], receiver.url.as_str());
        assert!(d["latencyMs"].as_f64().is_some_and(|ms| ms >= 0.0));
        assert!(d["at"].is_string());
    }
    assert_eq!(
        ok["deliveryId"], failed["deliveryId"],
        "one delivery, two attempts"
    );
    let hits = receiver.wait_for(2).await;
    assert_eq!(
        hits[1].header("x-webhook-delivery"),
        ok["deliveryId"].as_str().unwrap_or("?")
    );

    // Bob, on the same agent, sees none of alice's.
    let (status, body) = deliveries(&s, BOB, "").await;
    assert_eq!(status, 200);
    assert_eq!(body["deliveries"], json!([]));
    // Filtered by task, and paged.
    let (_, body) = deliveries(&s, ALICE, &format!("?taskId={task_id}&pageSize=1")).await;
    assert_eq!(body["deliveries"].as_array().map(Vec::len), Some(1));
    let (_, body) = deliveries(&s, ALICE, "?taskId=another-task").await;
    assert_eq!(body["deliveries"], json!([]));

    // Bad paging, no key, another agent's key, a wrong method.
    for q in ["?pageSize=0", "?pageSize=201", "?pageSize=ten"] {
        let (status, body) = deliveries(&s, ALICE, q).await;
        assert_eq!(status, 400, "{q}");
        assert_eq!(body["error"]["status"], "INVALID_ARGUMENT", "{body}");
    }
    let r = get(&s, "/api/v1/a2a/echo/rest/x-a2ad/deliveries", None).await;
    assert_eq!(r.status(), 401);
    let (status, _) =
        json_of(get(&s, "/api/v1/a2a/nope/rest/x-a2ad/deliveries", Some(ALICE)).await).await;
    assert_eq!(status, 404);
    let r = s
        .client
        .delete(format!("{}/api/v1/a2a/echo/rest/x-a2ad/deliveries", s.base))
        .header("x-api-key", ALICE)
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET, HEAD, OPTIONS");
    s.stop().await;
}

#[tokio::test]
async fn recent_deliveries_reads_take_the_agents_rate() {
    let mut c = support::config(&["echo"]);
    c.agents[0].limits.requests_per_minute = 2;
    let s = TestServer::start(c).await;
    for _ in 0..2 {
        assert_eq!(deliveries(&s, ALICE, "").await.0, 200);
    }
    let r = get(&s, "/api/v1/a2a/echo/rest/x-a2ad/deliveries", Some(ALICE)).await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED", "{body}");
    // Another principal has its own bucket.
    assert_eq!(deliveries(&s, BOB, "").await.0, 200);
    s.stop().await;
}

#[tokio::test]
async fn the_store_reports_its_commit_time() {
    let s = TestServer::start(support::config(&["echo"])).await;
    s.ok(s.send("echo", "one", json!({})).await);
    let text = s.scrape().await;
    let seconds = support::metric(&text, "a2ad_store_commit_seconds_total");
    let commits = support::metric(&text, "a2ad_store_commits_total");
    if commits > 0.0 {
        assert!(seconds > 0.0, "{commits} commits took {seconds} s");
    } else {
        assert_eq!(seconds, 0.0, "memory: no commit, no time");
    }
    s.stop().await;
}
