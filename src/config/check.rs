//! Every rule of the configuration in one place: the range of each number, the shape of
//! each string, and the rules that tie keys together. Each failure names its key.
//!
//! The ranges are documented in docs/CONFIG.md; keep the two together.

use std::collections::HashSet;
use std::fmt::Display;
use std::net::SocketAddr;

use super::{
    A2aConfig, AgentConfig, AgentLimits, ApiKeyConfig, CertificateConfig, ClusterConfig, Config,
    ConfigError, EchoConfig, MAX_SECONDS, OidcConfig, OpenAiConfig, ServerConfig, StoreConfig,
    TlsConfig, WebhooksConfig,
};

/// The largest `max_file_size` (512 MiB): its Base64 body still fits the body ceiling.
pub(super) const MAX_FILE_SIZE: u64 = 512 << 20;

pub(super) fn config(c: &mut Config) -> Result<(), ConfigError> {
    server(&mut c.server)?;
    if let Some(level) = &c.log.level
        && let Err(e) = tracing_subscriber::EnvFilter::builder().parse(level)
    {
        return Err(ConfigError::key(
            "log.level",
            format!("{level:?} is not a log filter such as \"info\" or \"a2ad=debug,info\" ({e})"),
        ));
    }
    webhooks(&c.webhooks)?;
    store(&c.store)?;
    if let Some(cluster) = &c.cluster {
        self::cluster(cluster)?;
    }
    let mut ids = HashSet::new();
    for (i, agent) in c.agents.iter_mut().enumerate() {
        agent_config(agent, i)?;
        if !ids.insert(agent.id.clone()) {
            return Err(ConfigError::key(
                format!("agents[{i}].id"),
                format!("duplicate agent id {:?}", agent.id),
            ));
        }
    }
    buffered_bodies(c)?;
    if let Some(default) = &c.server.default_agent
        && !ids.contains(default)
    {
        return Err(ConfigError::key(
            "server.default_agent",
            format!("no agent with id {default:?} is configured"),
        ));
    }
    let mut keys = HashSet::new();
    for (i, key) in c.api_keys.iter().enumerate() {
        api_key(key, i, &ids)?;
        if !keys.insert(key.key.to_ascii_lowercase()) {
            return Err(ConfigError::key(
                format!("api_keys[{i}].key"),
                "the same key is configured twice",
            ));
        }
    }
    let mut names = HashSet::new();
    let mut issuers = HashSet::new();
    for (i, o) in c.auth.oidc.iter().enumerate() {
        oidc(o, i, &ids)?;
        if !names.insert(o.name.as_str()) {
            return Err(ConfigError::key(
                format!("auth.oidc[{i}].name"),
                "the same name is configured twice",
            ));
        }
        if !issuers.insert(o.issuer.as_str()) {
            return Err(ConfigError::key(
                format!("auth.oidc[{i}].issuer"),
                "the same issuer is configured twice",
            ));
        }
    }
    if !c.auth.oidc.is_empty() {
        // A bearer value shaped like a JWT is taken for a token: no key may look like one.
        for (i, k) in c.api_keys.iter().enumerate() {
            if super::looks_like_jwt(k.key.as_bytes()) {
                return Err(ConfigError::key(
                    format!("api_keys[{i}].key"),
                    "with [[auth.oidc]] configured a key must not look like a JWT (\"eyJ…\" with two dots): it would be taken for a token",
                ));
            }
        }
    }
    c.secrets.resolve()?;
    let t = &c.telemetry;
    if let Some(endpoint) = &t.otlp_endpoint
        && !url::Url::parse(endpoint)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
    {
        return Err(ConfigError::key(
            "telemetry.otlp_endpoint",
            format!("{endpoint:?} is not an http(s) URL such as \"http://127.0.0.1:4318\""),
        ));
    }
    if t.service_name.is_empty() || t.service_name.len() > 256 {
        return Err(ConfigError::key(
            "telemetry.service_name",
            "must be 1 to 256 bytes",
        ));
    }
    if !(t.sampling_ratio.is_finite() && (0.0..=1.0).contains(&t.sampling_ratio)) {
        return Err(ConfigError::key(
            "telemetry.sampling_ratio",
            "must be a number from 0 to 1",
        ));
    }
    if let Some(signing) = &c.cards.signing {
        let k = |name: &str| format!("cards.signing.{name}");
        if signing.key_file.trim().is_empty() {
            return Err(ConfigError::key(k("key_file"), "must name a file"));
        }
        if signing.kid.is_empty() || signing.kid.len() > 256 {
            return Err(ConfigError::key(k("kid"), "must be 1 to 256 bytes"));
        }
        if let Some(jku) = &signing.jku
            && !url::Url::parse(jku).is_ok_and(|u| u.scheme() == "https")
        {
            return Err(ConfigError::key(k("jku"), "must be an https:// URL"));
        }
        // A signed card vouches for its URLs: they must be the operator's, never built from
        // a request's Host header.
        for (key, set) in [
            ("server.public_url", c.server.public_url.is_some()),
            ("server.public_grpc_url", c.server.public_grpc_url.is_some()),
        ] {
            if !set {
                return Err(ConfigError::key(
                    key,
                    "must be set when [cards.signing] is: a signed card's URLs are not taken from the request's Host",
                ));
            }
        }
    }
    let mut identities = HashSet::new();
    for (i, cert) in c.auth.certificates.iter().enumerate() {
        certificate(cert, i, &ids, c.server.tls.as_ref())?;
        if !identities.insert(cert.identity.as_str()) {
            return Err(ConfigError::key(
                format!("auth.certificates[{i}].identity"),
                "the same identity is configured twice",
            ));
        }
    }
    Ok(())
}

fn server(s: &mut ServerConfig) -> Result<(), ConfigError> {
    let k = |name: &str| format!("server.{name}");
    resolve_listen(&s.listen)?;
    if let Some(public) = &s.public_url {
        let trimmed = public.trim_end_matches('/').to_string();
        match url::Url::parse(&trimmed) {
            Ok(u)
                if matches!(u.scheme(), "http" | "https")
                    && u.host().is_some()
                    && u.query().is_none()
                    && u.fragment().is_none() => {}
            _ => {
                return Err(ConfigError::key(
                    k("public_url"),
                    format!("{public:?} is not a base URL such as \"https://agents.example.com\""),
                ));
            }
        }
        s.public_url = Some(trimmed);
    }
    if let Some(grpc) = &s.public_grpc_url {
        let trimmed = grpc.trim();
        let valid = trimmed.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty()
                && port.parse::<u16>().is_ok_and(|p| p > 0)
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._[]:".contains(&b))
        });
        if !valid {
            return Err(ConfigError::key(
                k("public_grpc_url"),
                format!(
                    "{grpc:?} is not a host:port such as \"agents.example.com:443\" (no scheme: \
                     gRPC clients take the address as it is)"
                ),
            ));
        }
        s.public_grpc_url = Some(trimmed.to_string());
    }
    if !matches!(s.card_default_version.as_str(), "1.0" | "0.3") {
        return Err(ConfigError::key(
            k("card_default_version"),
            format!(
                "must be \"1.0\" or \"0.3\", not {:?}",
                s.card_default_version
            ),
        ));
    }
    int(&k("listen_backlog"), s.listen_backlog, 1, 65_535)?;
    if let Some(n) = s.max_body_bytes {
        int(&k("max_body_bytes"), n, 1, Config::MAX_BODY_BYTES)?;
    }
    seconds(&k("ping_interval_seconds"), s.ping_interval_seconds)?;
    seconds_or_zero(&k("task_retention_seconds"), s.task_retention_seconds)?;
    int(
        &k("max_subscribers_per_task"),
        s.max_subscribers_per_task,
        1,
        1_000_000,
    )?;
    int(&k("stream_buffer"), s.stream_buffer, 1, 1_000_000)?;
    int(
        &k("max_finished_tasks"),
        s.max_finished_tasks,
        0,
        1_000_000_000,
    )?;
    int(
        &k("max_retained_bytes"),
        s.max_retained_bytes,
        1 << 20,
        1 << 40,
    )?;
    int(&k("max_task_history"), s.max_task_history, 2, 100_000)?;
    int(&k("max_live_tasks"), s.max_live_tasks, 1, 100_000_000)?;
    int(&k("max_connections"), s.max_connections, 1, 10_000_000)?;
    seconds(
        &k("first_byte_timeout_seconds"),
        s.first_byte_timeout_seconds,
    )?;
    seconds(&k("idle_timeout_seconds"), s.idle_timeout_seconds)?;
    seconds(&k("write_timeout_seconds"), s.write_timeout_seconds)?;
    seconds(
        &k("header_read_timeout_seconds"),
        s.header_read_timeout_seconds,
    )?;
    int(&k("max_header_bytes"), s.max_header_bytes, 4096, 1 << 20)?;
    seconds(&k("body_read_timeout_seconds"), s.body_read_timeout_seconds)?;
    int(&k("max_batch_size"), s.max_batch_size, 1, 10_000)?;
    int(
        &k("max_batch_response_bytes"),
        s.max_batch_response_bytes,
        64 << 10,
        1 << 30,
    )?;
    int(
        &k("max_list_page_bytes"),
        s.max_list_page_bytes,
        64 << 10,
        1 << 30,
    )?;
    int(
        &k("http2_max_concurrent_streams"),
        s.http2_max_concurrent_streams,
        1,
        10_000,
    )?;
    seconds(&k("http2_keep_alive_seconds"), s.http2_keep_alive_seconds)?;
    seconds(
        &k("actor_call_timeout_seconds"),
        s.actor_call_timeout_seconds,
    )?;
    seconds_or_zero(&k("shutdown_grace_seconds"), s.shutdown_grace_seconds)?;
    int(&k("max_context_turns"), s.max_context_turns, 0, 100_000)?;
    int(&k("max_contexts"), s.max_contexts, 1, 1_000_000_000)?;
    int(
        &k("max_context_bytes"),
        s.max_context_bytes,
        1 << 20,
        1 << 40,
    )?;
    int(
        &k("global_queue_interval"),
        s.global_queue_interval,
        0,
        1024,
    )?;
    if let Some(tls) = &s.tls {
        self::tls(tls)?;
    }
    Ok(())
}

/// The bounds on body bytes held at once: each at least one body of the cap, the
/// connection's no more than the one for all.
fn buffered_bodies(c: &Config) -> Result<(), ConfigError> {
    let body = c.max_body_bytes();
    let all = c.server.max_buffered_body_bytes;
    if let Some(n) = all {
        int("server.max_buffered_body_bytes", n, body, 1 << 40)?;
    }
    if let Some(n) = c.server.max_buffered_body_bytes_per_connection {
        int(
            "server.max_buffered_body_bytes_per_connection",
            n,
            body,
            c.max_buffered_body_bytes(),
        )?;
    }
    Ok(())
}

fn tls(t: &TlsConfig) -> Result<(), ConfigError> {
    let k = |name: &str| format!("server.tls.{name}");
    for (name, path) in [
        ("cert_file", Some(&t.cert_file)),
        ("key_file", Some(&t.key_file)),
        ("client_ca_file", t.client_ca_file.as_ref()),
    ] {
        if path.is_some_and(|p| p.trim().is_empty()) {
            return Err(ConfigError::key(k(name), "must name a file"));
        }
    }
    // At least a second apart: each check reads two or three small files.
    if !(t.reload_check_seconds.is_finite() && (1.0..=86_400.0).contains(&t.reload_check_seconds)) {
        return Err(ConfigError::key(
            k("reload_check_seconds"),
            "must be a number from 1 to 86400",
        ));
    }
    if t.client_cert_required && t.client_ca_file.is_none() {
        return Err(ConfigError::key(
            k("client_cert_required"),
            "needs server.tls.client_ca_file (the authorities client certificates chain to)",
        ));
    }
    Ok(())
}

fn certificate(
    c: &CertificateConfig,
    i: usize,
    agent_ids: &HashSet<String>,
    tls: Option<&TlsConfig>,
) -> Result<(), ConfigError> {
    let at = |name: &str| format!("auth.certificates[{i}].{name}");
    if tls.is_none_or(|t| t.client_ca_file.is_none()) {
        return Err(ConfigError::key(
            at("identity"),
            "client certificates need server.tls with a client_ca_file to be verified against",
        ));
    }
    if c.name.is_empty() {
        return Err(ConfigError::key(at("name"), "must not be empty"));
    }
    if c.identity.trim().is_empty() || c.identity.len() > 1024 {
        return Err(ConfigError::key(
            at("identity"),
            "must be a DNS name, e-mail address, URI or common name (1 to 1024 bytes)",
        ));
    }
    allowed_agents(&c.agents, &at, agent_ids)
}

fn webhooks(w: &WebhooksConfig) -> Result<(), ConfigError> {
    int("webhooks.workers", w.workers, 1, 1024)?;
    int(
        "webhooks.max_pending_deliveries",
        w.max_pending_deliveries,
        1,
        100_000_000,
    )?;
    int(
        "webhooks.max_configs_per_task",
        w.max_configs_per_task,
        1,
        1000,
    )
}

fn store(s: &StoreConfig) -> Result<(), ConfigError> {
    if s.path().trim().is_empty() {
        return Err(ConfigError::key("store.path", "must not be empty"));
    }
    if s.path().contains('\0') {
        return Err(ConfigError::key(
            "store.path",
            "must not contain a NUL byte",
        ));
    }
    int("store.max_batch", s.max_batch, 1, 65_536)?;
    int("store.cache_mib", s.cache_mib, 1, 65_536)?;
    int(
        "store.max_pending_writes",
        s.max_pending_writes,
        1_000,
        100_000_000,
    )?;
    int(
        "store.sync_spin_us",
        s.sync_spin_us.unwrap_or(StoreConfig::DEFAULT_SYNC_SPIN_US),
        0,
        100_000,
    )
}

fn cluster(c: &ClusterConfig) -> Result<(), ConfigError> {
    if c.url.trim().is_empty() {
        return Err(ConfigError::key("cluster.url", "must not be empty"));
    }
    if c.url.parse::<tokio_postgres::Config>().is_err() {
        return Err(ConfigError::key(
            "cluster.url",
            "is not a PostgreSQL connection string (postgres://user@host:port/database)",
        ));
    }
    let schema_ok = !c.schema.is_empty()
        && c.schema.len() <= 50
        && c.schema
            .starts_with(|ch: char| ch.is_ascii_lowercase() || ch == '_')
        && c.schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !schema_ok {
        return Err(ConfigError::key(
            "cluster.schema",
            format!(
                "{:?} must be 1–50 lowercase letters, digits or '_', not starting with a digit",
                c.schema
            ),
        ));
    }
    if let Some(id) = &c.node_id
        && (id.is_empty()
            || id.len() > 64
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)))
    {
        return Err(ConfigError::key(
            "cluster.node_id",
            format!("{id:?} must be 1–64 letters, digits, '-', '.' or '_'"),
        ));
    }
    int("cluster.lease_ttl_ms", c.lease_ttl_ms, 500, 600_000)?;
    int("cluster.heartbeat_ms", c.heartbeat_ms, 50, 60_000)?;
    if c.heartbeat_ms.saturating_mul(3) > c.lease_ttl_ms {
        return Err(ConfigError::key(
            "cluster.heartbeat_ms",
            format!(
                "must be at most a third of cluster.lease_ttl_ms ({}), so one late heartbeat does not lose the lease",
                c.lease_ttl_ms
            ),
        ));
    }
    int("cluster.pool_size", c.pool_size, 2, 1024)?;
    int("cluster.commit_lanes", c.commit_lanes, 1, 64)?;
    int("cluster.max_followers", c.max_followers, 1, 1_000_000)
}

fn agent_config(a: &mut AgentConfig, i: usize) -> Result<(), ConfigError> {
    let at = |k: &str| format!("agents[{i}].{k}");
    if a.id.is_empty() {
        return Err(ConfigError::key(at("id"), "must not be empty"));
    }
    if !a
        .id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
    {
        return Err(ConfigError::key(
            at("id"),
            format!(
                "{:?} must use only letters, digits, '-', '.', '_' and '~' (it is a URL path segment)",
                a.id
            ),
        ));
    }
    if !AgentConfig::BACKENDS.contains(&a.backend.as_str()) {
        return Err(ConfigError::key(
            at("backend"),
            format!(
                "unknown backend {:?}; known: {}",
                a.backend,
                AgentConfig::BACKENDS.join(", ")
            ),
        ));
    }
    match (&a.backend[..], &a.openai) {
        ("openai", None) => {
            return Err(ConfigError::key(
                at("openai"),
                "backend \"openai\" needs an [agents.openai] table with base_url and model",
            ));
        }
        ("openai", Some(o)) => openai(o, &at)?,
        (_, Some(_)) => {
            return Err(ConfigError::key(
                at("openai"),
                "[agents.openai] is only used with backend = \"openai\"",
            ));
        }
        _ => {}
    }
    match (&a.backend[..], &a.a2a) {
        ("a2a", None) => {
            return Err(ConfigError::key(
                at("a2a"),
                "backend \"a2a\" needs an [agents.a2a] table with card_url",
            ));
        }
        ("a2a", Some(u)) => a2a(&a.id, u, &at)?,
        (_, Some(_)) => {
            return Err(ConfigError::key(
                at("a2a"),
                "[agents.a2a] is only used with backend = \"a2a\"",
            ));
        }
        _ => {}
    }
    limits(&mut a.limits, &at)?;
    echo(&a.echo, &at)?;
    extensions(&a.extensions, &at)?;
    int(
        &at("tck.long_running_ms"),
        a.tck.long_running_ms,
        0,
        (MAX_SECONDS * 1000.0) as u64,
    )
}

/// The most extensions an agent may declare.
const MAX_EXTENSIONS: usize = 32;

fn extensions(
    list: &[crate::config::ExtensionConfig],
    at: &dyn Fn(&str) -> String,
) -> Result<(), ConfigError> {
    if list.len() > MAX_EXTENSIONS {
        return Err(ConfigError::key(
            at("extensions"),
            format!(
                "declares {} extensions; at most {MAX_EXTENSIONS}",
                list.len()
            ),
        ));
    }
    for (j, e) in list.iter().enumerate() {
        let key = at(&format!("extensions[{j}].uri"));
        let uri = e.uri.trim();
        if uri.is_empty() || uri.len() > 2048 || uri != e.uri {
            return Err(ConfigError::key(
                key,
                "must be a URI of 1 to 2048 characters without surrounding spaces",
            ));
        }
        if uri.contains(',') || uri.chars().any(char::is_whitespace) {
            return Err(ConfigError::key(
                key,
                format!(
                    "{uri:?} holds a comma or a space: clients list extensions comma-separated in a header"
                ),
            ));
        }
        if list[..j].iter().any(|o| o.uri == e.uri) {
            return Err(ConfigError::key(key, format!("{uri:?} is declared twice")));
        }
    }
    Ok(())
}

fn limits(l: &mut AgentLimits, at: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
    let k = |name: &str| at(&format!("limits.{name}"));
    int(
        &k("requests_per_minute"),
        l.requests_per_minute,
        1,
        1_000_000_000_000,
    )?;
    int(&k("concurrent_tasks"), l.concurrent_tasks, 1, 10_000_000)?;
    if let Some(n) = l.max_queued_tasks {
        int(&k("max_queued_tasks"), n, 0, 100_000_000)?;
    }
    int(&k("max_message_length"), l.max_message_length, 1, 1 << 30)?;
    int(&k("max_parts"), l.max_parts, 1, 100_000)?;
    int(&k("max_file_size"), l.max_file_size, 0, MAX_FILE_SIZE)?;
    seconds(&k("task_timeout_seconds"), l.task_timeout_seconds)?;
    seconds_or_zero(&k("sync_wait_seconds"), l.sync_wait_seconds)?;
    for (j, t) in l.supported_types.iter().enumerate() {
        if !is_mime_pattern(t) {
            return Err(ConfigError::key(
                k(&format!("supported_types[{j}]")),
                format!("{t:?} is not a MIME type such as \"text/plain\" or \"image/*\""),
            ));
        }
    }
    if l.max_queued_tasks.is_none() {
        l.max_queued_tasks = Some(l.concurrent_tasks.saturating_mul(10));
    }
    Ok(())
}

fn echo(e: &EchoConfig, at: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
    int(
        &at("echo.delay_ms"),
        e.delay_ms,
        0,
        (MAX_SECONDS * 1000.0) as u64,
    )?;
    int(&at("echo.progress_steps"), e.progress_steps, 0, 100_000)
}

/// `[agents.a2a]` (docs/CONFIG.md): a card URL a2ad may reach, known names, bounds, and
/// headers whose `env:` variables are set.
fn a2a(agent: &str, u: &A2aConfig, at: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
    let url = match url::Url::parse(&u.card_url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => url,
        _ => {
            return Err(ConfigError::key(
                at("a2a.card_url"),
                format!(
                    "{:?} is not an http(s) URL such as \"http://127.0.0.1:9000/.well-known/agent-card.json\"",
                    u.card_url
                ),
            ));
        }
    };
    if let Some(ip) = crate::net::literal_ip(&url)
        && let Err(why) = crate::net::address_allowed(ip, u.allow_private_networks)
    {
        return Err(ConfigError::key(
            at("a2a.card_url"),
            format!(
                "agent {agent:?}: the upstream {ip} is refused ({why}); set allow_private_networks = true in [agents.a2a] to front a loopback or private agent"
            ),
        ));
    }
    if !["auto", "jsonrpc", "http_json", "grpc"].contains(&u.binding.as_str()) {
        return Err(ConfigError::key(
            at("a2a.binding"),
            format!(
                "unknown binding {:?}; one of auto, jsonrpc, http_json, grpc",
                u.binding
            ),
        ));
    }
    if !["auto", "1.0", "0.3"].contains(&u.protocol.as_str()) {
        return Err(ConfigError::key(
            at("a2a.protocol"),
            format!(
                "unknown protocol {:?}; one of \"auto\", \"1.0\", \"0.3\"",
                u.protocol
            ),
        ));
    }
    for (name, value) in &u.headers {
        let key = at(&format!("a2a.headers.{name}"));
        if hyper::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(ConfigError::key(key, "is not a valid header name"));
        }
        let value = match value.strip_prefix("env:") {
            Some(var) => std::env::var(var).map_err(|_| {
                ConfigError::key(
                    key.clone(),
                    format!("the environment variable {var:?} is not set"),
                )
            })?,
            None => value.clone(),
        };
        if hyper::header::HeaderValue::from_str(&value).is_err() {
            return Err(ConfigError::key(
                key,
                "is not a valid header value (control characters or non-ASCII)",
            ));
        }
    }
    seconds(&at("a2a.timeout_seconds"), u.timeout_seconds)?;
    if !(u.connect_timeout_seconds.is_finite()
        && u.connect_timeout_seconds > 0.0
        && u.connect_timeout_seconds <= 300.0)
    {
        return Err(ConfigError::key(
            at("a2a.connect_timeout_seconds"),
            "must be a number greater than 0 and at most 300",
        ));
    }
    int(
        &at("a2a.card_refresh_seconds"),
        u.card_refresh_seconds,
        10,
        86_400,
    )?;
    int(&at("a2a.max_connections"), u.max_connections, 1, 10_000)?;
    int(
        &at("a2a.max_response_bytes"),
        u.max_response_bytes,
        1024,
        1 << 30,
    )
}

fn openai(o: &OpenAiConfig, at: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
    match url::Url::parse(&o.base_url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
        _ => {
            return Err(ConfigError::key(
                at("openai.base_url"),
                format!(
                    "{:?} is not an http(s) URL such as \"http://127.0.0.1:11434/v1\"",
                    o.base_url
                ),
            ));
        }
    }
    if o.model.is_empty() {
        return Err(ConfigError::key(at("openai.model"), "must not be empty"));
    }
    if let Some(var) = &o.api_key_env
        && std::env::var_os(var).is_none()
    {
        return Err(ConfigError::key(
            at("openai.api_key_env"),
            format!("the environment variable {var:?} is not set"),
        ));
    }
    if let Some(t) = o.temperature
        && !(t.is_finite() && (0.0..=2.0).contains(&t))
    {
        return Err(ConfigError::key(
            at("openai.temperature"),
            "must be from 0 to 2",
        ));
    }
    if let Some(n) = o.max_tokens {
        int(&at("openai.max_tokens"), n, 1, 100_000_000)?;
    }
    int(
        &at("openai.max_history_turns"),
        o.max_history_turns,
        0,
        100_000,
    )?;
    int(
        &at("openai.max_response_bytes"),
        o.max_response_bytes,
        1024,
        1 << 30,
    )?;
    seconds(
        &at("openai.request_timeout_seconds"),
        o.request_timeout_seconds,
    )
}

fn api_key(k: &ApiKeyConfig, i: usize, agent_ids: &HashSet<String>) -> Result<(), ConfigError> {
    let at = |name: &str| format!("api_keys[{i}].{name}");
    if k.name.is_empty() {
        return Err(ConfigError::key(at("name"), "must not be empty"));
    }
    if k.key.is_empty() {
        return Err(ConfigError::key(at("key"), "must not be empty"));
    }
    if let Some(hex) = k.key.strip_prefix("sha256:")
        && (hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(ConfigError::key(
            at("key"),
            "a hashed key is \"sha256:\" followed by 64 hex digits",
        ));
    }
    allowed_agents(&k.agents, &at, agent_ids)
}

fn oidc(o: &OidcConfig, i: usize, agent_ids: &HashSet<String>) -> Result<(), ConfigError> {
    let at = |name: &str| format!("auth.oidc[{i}].{name}");
    let valid_name = !o.name.is_empty()
        && o.name.len() <= 64
        && o.name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !matches!(o.name.as_str(), "apiKey" | "bearer" | "mtls");
    if !valid_name {
        return Err(ConfigError::key(
            at("name"),
            "must be 1 to 64 letters, digits, - or _, and not apiKey, bearer or mtls (the other schemes' names)",
        ));
    }
    if o.issuer.trim().is_empty() {
        return Err(ConfigError::key(at("issuer"), "must not be empty"));
    }
    fetchable_url(&at("issuer"), &o.issuer)?;
    if let Some(url) = &o.jwks_url {
        fetchable_url(&at("jwks_url"), url)?;
    }
    if let Some(url) = &o.discovery_url {
        fetchable_url(&at("discovery_url"), url)?;
    }
    if o.audiences.is_empty() || o.audiences.iter().any(String::is_empty) {
        return Err(ConfigError::key(
            at("audiences"),
            "list the audiences a token must be for (its aud), at least one",
        ));
    }
    if o.algorithms.is_empty() {
        return Err(ConfigError::key(at("algorithms"), "must not be empty"));
    }
    for (j, alg) in o.algorithms.iter().enumerate() {
        if !OidcConfig::ALGORITHMS.contains(&alg.as_str()) {
            return Err(ConfigError::key(
                at(&format!("algorithms[{j}]")),
                format!(
                    "{alg:?} is not accepted; one of {} (never none or a shared-secret HS* algorithm)",
                    OidcConfig::ALGORITHMS.join(", ")
                ),
            ));
        }
    }
    if !(o.leeway_seconds.is_finite() && (0.0..=600.0).contains(&o.leeway_seconds)) {
        return Err(ConfigError::key(
            at("leeway_seconds"),
            "must be a number from 0 to 600",
        ));
    }
    if o.principal_claim.is_empty() {
        return Err(ConfigError::key(at("principal_claim"), "must not be empty"));
    }
    if o.agents_claim.as_deref().is_some_and(str::is_empty) {
        return Err(ConfigError::key(at("agents_claim"), "must not be empty"));
    }
    allowed_agents(&o.agents, &at, agent_ids)?;
    let range = |key: &str, v: f64, lo: f64, hi: f64| {
        if v.is_finite() && (lo..=hi).contains(&v) {
            Ok(())
        } else {
            Err(ConfigError::key(
                at(key),
                format!("must be a number from {lo} to {hi}"),
            ))
        }
    };
    range(
        "jwks_refresh_min_seconds",
        o.jwks_refresh_min_seconds,
        1.0,
        3600.0,
    )?;
    range(
        "jwks_max_age_seconds",
        o.jwks_max_age_seconds,
        60.0,
        86_400.0,
    )?;
    range("fetch_timeout_seconds", o.fetch_timeout_seconds, 0.1, 60.0)?;
    Ok(())
}

/// A URL the server fetches keys from: `https://`, or `http://` to a loopback host only
/// (a local identity provider in development).
fn fetchable_url(key: &str, text: &str) -> Result<(), ConfigError> {
    let ok = url::Url::parse(text).is_ok_and(|u| match u.scheme() {
        "https" => u.host().is_some(),
        "http" => match u.host() {
            Some(url::Host::Domain(d)) => d == "localhost",
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        },
        _ => false,
    });
    if ok {
        Ok(())
    } else {
        Err(ConfigError::key(
            key,
            format!("{text:?} is not an https:// URL (http:// is allowed for localhost only)"),
        ))
    }
}

/// A credential's agent allow-list: configured agents, or `*`.
fn allowed_agents(
    agents: &[String],
    at: &dyn Fn(&str) -> String,
    agent_ids: &HashSet<String>,
) -> Result<(), ConfigError> {
    if agents.is_empty() {
        return Err(ConfigError::key(
            at("agents"),
            "a credential that may use no agent is useless: list agent ids, or \"*\" for all",
        ));
    }
    for (j, agent) in agents.iter().enumerate() {
        if agent != "*" && !agent_ids.contains(agent) {
            return Err(ConfigError::key(
                at(&format!("agents[{j}]")),
                format!("no agent with id {agent:?} is configured"),
            ));
        }
    }
    Ok(())
}

/// A backend's option table (`[agents.echo]`, `[agents.openai]`) on an agent of another
/// backend is refused: its options would silently do nothing.
pub(super) fn backend_tables(table: &toml::Table, c: &Config) -> Result<(), ConfigError> {
    let Some(toml::Value::Array(agents)) = table.get("agents") else {
        return Ok(());
    };
    for (i, (raw, agent)) in agents.iter().zip(&c.agents).enumerate() {
        let Some(raw) = raw.as_table() else { continue };
        for backend in AgentConfig::BACKENDS {
            if raw.contains_key(*backend) && agent.backend != *backend {
                return Err(ConfigError::key(
                    format!("agents[{i}].{backend}"),
                    format!(
                        "[agents.{backend}] is only used with backend = \"{backend}\" (this agent's backend is {:?})",
                        agent.backend
                    ),
                ));
            }
        }
    }
    Ok(())
}

pub(super) fn resolve_listen(listen: &str) -> Result<SocketAddr, ConfigError> {
    use std::net::ToSocketAddrs as _;
    if let Ok(addr) = listen.parse() {
        return Ok(addr);
    }
    listen
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| {
            ConfigError::key(
                "server.listen",
                format!("expected HOST:PORT (e.g. 127.0.0.1:8080), got {listen:?}"),
            )
        })
}

fn is_mime_pattern(t: &str) -> bool {
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    match t.split_once('/') {
        Some((ty, sub)) => token(ty) && (sub == "*" || token(sub)),
        None => false,
    }
}

/// An integer from `lo` to `hi`.
fn int<T>(key: &str, v: T, lo: T, hi: T) -> Result<(), ConfigError>
where
    T: PartialOrd + Display + Copy,
{
    if v >= lo && v <= hi {
        Ok(())
    } else {
        Err(ConfigError::key(
            key,
            format!("must be an integer from {lo} to {hi} (got {v})"),
        ))
    }
}

/// Seconds greater than 0 and at most [`MAX_SECONDS`].
fn seconds(key: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 && v <= MAX_SECONDS {
        Ok(())
    } else {
        Err(ConfigError::key(
            key,
            format!("must be a number greater than 0 and at most {MAX_SECONDS}"),
        ))
    }
}

/// Seconds from 0 to [`MAX_SECONDS`].
fn seconds_or_zero(key: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && (0.0..=MAX_SECONDS).contains(&v) {
        Ok(())
    } else {
        Err(ConfigError::key(
            key,
            format!("must be a number from 0 to {MAX_SECONDS}"),
        ))
    }
}
