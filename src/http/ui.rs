//! The inspector at `/ui` (docs/PROTOCOL.md §11, README "The inspector"): static files
//! embedded in the binary — plain HTML, CSS and JavaScript modules, no build step, no
//! network fetch — served under a strict Content-Security-Policy. It has no privilege of
//! its own: every call it makes goes through the normal endpoints with the key (or token)
//! the user pastes into it. `[ui] enabled = false`, or a build without the `ui` feature,
//! serves none of it (404).

use std::sync::OnceLock;

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use sha2::{Digest, Sha256};

use super::{App, Body, method_not_allowed, respond::not_found_path};

/// The inspector's address; `/ui` itself redirects here.
pub(crate) const PREFIX: &str = "/ui/";
/// `/ui` without its slash.
pub(crate) const PATH: &str = "/ui";

/// Scripts and styles from this origin only, no inline code, no framing, no plugins;
/// calls to this origin only (the endpoints, `/metrics`); images from here or `data:`.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   img-src 'self' data: blob:; connect-src 'self'; font-src 'self'; \
                   base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The files: name under `/ui/`, content type, bytes.
#[cfg(feature = "ui")]
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("ui/index.html"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_bytes!("ui/style.css"),
    ),
    ("app.js", JS, include_bytes!("ui/app.js")),
    ("wire.js", JS, include_bytes!("ui/wire.js")),
    ("agents.js", JS, include_bytes!("ui/agents.js")),
    ("chat.js", JS, include_bytes!("ui/chat.js")),
    ("tasks.js", JS, include_bytes!("ui/tasks.js")),
    ("hooks.js", JS, include_bytes!("ui/hooks.js")),
    ("pulse.js", JS, include_bytes!("ui/pulse.js")),
    ("comply.js", JS, include_bytes!("ui/comply.js")),
    ("icon.svg", "image/svg+xml", include_bytes!("ui/icon.svg")),
];
#[cfg(not(feature = "ui"))]
const ASSETS: &[(&str, &str, &[u8])] = &[];

#[cfg(feature = "ui")]
const JS: &str = "text/javascript; charset=utf-8";

/// Whether this build carries the inspector.
pub(crate) const BUILT: bool = !ASSETS.is_empty();

/// Each file's `ETag` (a strong tag: a hash of its bytes), made once.
fn etags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|(_, _, bytes)| {
                let digest = Sha256::digest(bytes);
                let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
                format!("\"{hex}\"")
            })
            .collect()
    })
}

/// A request under `/ui`.
pub(crate) fn response(app: &App, req: &Request<Incoming>) -> Response<Body> {
    if !app.ui || !BUILT {
        return not_found_path();
    }
    let path = req.uri().path();
    if path == PATH {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::PERMANENT_REDIRECT;
        r.headers_mut()
            .insert(header::LOCATION, HeaderValue::from_static(PREFIX));
        return r;
    }
    let name = match &path[PREFIX.len()..] {
        "" => "index.html",
        name => name,
    };
    let Some(i) = ASSETS.iter().position(|(n, ..)| *n == name) else {
        return not_found_path();
    };
    let head = match *req.method() {
        Method::GET => false,
        Method::HEAD => true,
        _ => return method_not_allowed("GET, HEAD"),
    };
    let (_, content_type, bytes) = ASSETS[i];
    let tag = &etags()[i];
    let fresh = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag || t.trim() == "*"));
    let mut r = if fresh {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else if head {
        Response::new(Body::empty())
    } else {
        Response::new(Body::full(bytes::Bytes::from_static(bytes)))
    };
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(v) = HeaderValue::from_str(tag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    r
}
