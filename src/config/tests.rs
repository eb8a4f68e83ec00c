//! Unit tests of the configuration: parsing, defaults and every kind of rule.

use super::*;

#[test]
fn the_documented_example_file_parses_with_its_defaults() {
    let text = r#"
[server]
listen = "127.0.0.1:8080"
listen_backlog = 4096
ping_interval_seconds = 15
task_retention_seconds = 3600
max_subscribers_per_task = 1000

[webhooks]
allow_private_networks = false
workers = 8

[[api_keys]]
name = "alice"
key = "dev-key-alice"
agents = ["*"]

[[agents]]
id = "echo"
name = "Echo"
description = "Replies with what it was sent"
version = "1.0.0"
backend = "echo"
streaming = true
webhooks = true

[agents.limits]
requests_per_minute = 600
concurrent_tasks = 16
max_queued_tasks = 160
max_message_length = 100000
max_file_size = 10485760
supported_types = ["text/plain", "application/json", "application/pdf", "image/*"]
task_timeout_seconds = 300
sync_wait_seconds = 30

[agents.echo]
delay_ms = 0
progress_steps = 0
fail = false
"#;
    let c = Config::from_toml(text).expect("valid");
    assert_eq!(c.agents[0].limits.max_queued(), 160);
    assert_eq!(c.max_body_bytes(), 10_485_760 * 4 / 3 + 1024 * 1024);
    assert_eq!(c.agents[0].display_name(), "Echo");
}

#[test]
fn only_the_agent_id_is_required_and_queue_defaults_to_ten_times_concurrency() {
    let c = Config::from_toml("[[agents]]\nid = \"a\"\n[agents.limits]\nconcurrent_tasks = 3\n")
        .expect("valid");
    let a = &c.agents[0];
    assert_eq!(a.display_name(), "a");
    assert_eq!(a.version, "1.0.0");
    assert!(a.streaming() && a.webhooks);
    assert_eq!(a.limits.max_queued(), 30);
}

#[test]
fn an_unknown_key_is_named() {
    let e = Config::from_toml("[[agents]]\nid = \"a\"\n[agents.limits]\nrpm = 3\n").unwrap_err();
    assert_eq!(e.key.as_deref(), Some("agents[0].limits.rpm"));
    assert!(e.message.contains("rpm"), "{e}");
}

#[test]
fn a_wrong_type_names_the_key() {
    let e = Config::from_toml("[server]\nping_interval_seconds = \"x\"\n").unwrap_err();
    assert_eq!(e.key.as_deref(), Some("server.ping_interval_seconds"));
}

#[test]
fn a_syntax_error_names_line_and_column() {
    let e = Config::from_toml("[server]\nlisten = \n").unwrap_err();
    assert_eq!(e.position.map(|p| p.0), Some(2), "{e}");
}

#[test]
fn semantic_errors_name_the_key() {
    let cases = [
        (
            "[[agents]]\nid = \"a\"\n[[agents]]\nid = \"a\"\n",
            "agents[1].id",
        ),
        (
            "[[agents]]\nid = \"a\"\nbackend = \"gpt\"\n",
            "agents[0].backend",
        ),
        ("[[agents]]\nid = \"a b\"\n", "agents[0].id"),
        ("[server]\nlisten = \"nowhere\"\n", "server.listen"),
        ("[server]\nlisten = \"127.0.0.1\"\n", "server.listen"),
        (
            "[[api_keys]]\nname = \"n\"\nkey = \"sha256:abc\"\n",
            "api_keys[0].key",
        ),
        (
            "[[api_keys]]\nname = \"n\"\nkey = \"k\"\nagents = [\"zzz\"]\n",
            "api_keys[0].agents[0]",
        ),
        (
            "[[agents]]\nid = \"a\"\n[agents.limits]\nconcurrent_tasks = 0\n",
            "agents[0].limits.concurrent_tasks",
        ),
        ("[webhooks]\nworkers = 0\n", "webhooks.workers"),
        (
            "[[agents]]\nid = \"a\"\n[agents.limits]\ntask_timeout_seconds = 1e300\n",
            "agents[0].limits.task_timeout_seconds",
        ),
        (
            "[server]\nping_interval_seconds = 1e20\n",
            "server.ping_interval_seconds",
        ),
        (
            "[server]\npublic_grpc_url = \"http://a.example.com:443\"\n",
            "server.public_grpc_url",
        ),
        (
            "[server]\npublic_grpc_url = \"a.example.com\"\n",
            "server.public_grpc_url",
        ),
        (
            "[server]\npublic_grpc_url = \"a.example.com:0\"\n",
            "server.public_grpc_url",
        ),
    ];
    for (text, key) in cases {
        let e = Config::from_toml(text).expect_err(text);
        assert_eq!(e.key.as_deref(), Some(key), "{text} -> {e}");
    }
}

#[test]
fn an_openai_agent_needs_its_table_and_a_valid_url() {
    let ok = "[[agents]]\nid = \"llm\"\nbackend = \"openai\"\n[agents.openai]\nbase_url = \"http://127.0.0.1:11434/v1\"\nmodel = \"llama3\"\n";
    let c = Config::from_toml(ok).expect("valid");
    let o = c.agents[0].openai.as_ref().expect("openai");
    assert_eq!(o.request_timeout_seconds, 120.0);
    assert_eq!(o.max_history_turns, 20);
    for (text, key) in [
        (
            "[[agents]]\nid = \"llm\"\nbackend = \"openai\"\n",
            "agents[0].openai",
        ),
        (
            "[[agents]]\nid = \"llm\"\nbackend = \"openai\"\n[agents.openai]\nbase_url = \"nope\"\nmodel = \"m\"\n",
            "agents[0].openai.base_url",
        ),
        (
            "[[agents]]\nid = \"llm\"\nbackend = \"openai\"\n[agents.openai]\nbase_url = \"http://x/v1\"\nmodel = \"m\"\napi_key_env = \"A2AD_SURELY_UNSET_VAR\"\n",
            "agents[0].openai.api_key_env",
        ),
        (
            "[[agents]]\nid = \"e\"\n[agents.openai]\nbase_url = \"http://x/v1\"\nmodel = \"m\"\n",
            "agents[0].openai",
        ),
    ] {
        let e = Config::from_toml(text).expect_err(text);
        assert_eq!(e.key.as_deref(), Some(key), "{e}");
    }
}

#[test]
fn listen_accepts_a_host_name() {
    let c = Config::from_toml("[server]\nlisten = \"localhost:0\"\n").expect("valid");
    assert!(c.listen_addr().expect("resolves").ip().is_loopback());
}

#[test]
fn an_empty_file_is_the_built_in_configuration() {
    let c = Config::from_toml("").expect("valid");
    assert_eq!(c.agents.len(), 1);
    assert_eq!(c.agents[0].id, "echo");
    assert_eq!(c.server.listen, "127.0.0.1:8080");
    assert!(c.api_keys.is_empty());
}

#[test]
fn the_message_names_the_file() {
    let e = ConfigError {
        file: Some("a.toml".into()),
        ..ConfigError::key("server.listen", "bad")
    };
    assert_eq!(
        e.to_string(),
        "configuration error in a.toml: key `server.listen`: bad"
    );
}

#[test]
fn every_number_is_range_checked_and_the_key_is_named() {
    let cases = [
        (
            "[agents.limits]\nmax_file_size = 18446744073709551615\n",
            "agents[0].limits.max_file_size",
        ),
        (
            "[agents.limits]\nmax_parts = 0\n",
            "agents[0].limits.max_parts",
        ),
        (
            "[agents.limits]\nrequests_per_minute = 0\n",
            "agents[0].limits.requests_per_minute",
        ),
        (
            "[agents.limits]\nconcurrent_tasks = 100000000000\n",
            "agents[0].limits.concurrent_tasks",
        ),
        (
            "[agents.limits]\nmax_queued_tasks = 1000000000000\n",
            "agents[0].limits.max_queued_tasks",
        ),
        (
            "[agents.echo]\nprogress_steps = 4000000000\n",
            "agents[0].echo.progress_steps",
        ),
        (
            "[agents.echo]\ndelay_ms = 18446744073709551615\n",
            "agents[0].echo.delay_ms",
        ),
    ];
    for (tail, key) in cases {
        let text = format!("[[agents]]\nid = \"a\"\n{tail}");
        let e = Config::from_toml(&text).expect_err(&text);
        assert_eq!(e.key.as_deref(), Some(key), "{text} -> {e}");
    }
    for (text, key) in [
        (
            "[server]\nmax_body_bytes = 99999999999999\n",
            "server.max_body_bytes",
        ),
        ("[server]\nlisten_backlog = 0\n", "server.listen_backlog"),
        ("[server]\nmax_connections = 0\n", "server.max_connections"),
        (
            "[server]\nglobal_queue_interval = 1025\n",
            "server.global_queue_interval",
        ),
        (
            "[server]\nglobal_queue_interval = -1\n",
            "server.global_queue_interval",
        ),
        (
            "[server]\nstream_buffer = 100000000\n",
            "server.stream_buffer",
        ),
        ("[server]\nmax_batch_size = 0\n", "server.max_batch_size"),
        (
            "[server]\nmax_header_bytes = 10\n",
            "server.max_header_bytes",
        ),
        (
            "[server]\nmax_retained_bytes = 5\n",
            "server.max_retained_bytes",
        ),
        (
            "[server]\nfirst_byte_timeout_seconds = 0\n",
            "server.first_byte_timeout_seconds",
        ),
        (
            "[server]\nidle_timeout_seconds = -1\n",
            "server.idle_timeout_seconds",
        ),
        (
            "[server]\nwrite_timeout_seconds = nan\n",
            "server.write_timeout_seconds",
        ),
        (
            "[server]\nhttp2_max_concurrent_streams = 0\n",
            "server.http2_max_concurrent_streams",
        ),
        ("[webhooks]\nworkers = 100000\n", "webhooks.workers"),
        ("[store]\nsync_spin_us = 100001\n", "store.sync_spin_us"),
        ("[store]\nsync_spin_us = -1\n", "store.sync_spin_us"),
        (
            "[webhooks]\nmax_pending_deliveries = 0\n",
            "webhooks.max_pending_deliveries",
        ),
    ] {
        let e = Config::from_toml(text).expect_err(text);
        assert_eq!(e.key.as_deref(), Some(key), "{text} -> {e}");
    }
}

#[test]
fn the_body_cap_never_exceeds_its_ceiling() {
    let mut c = Config::default();
    c.agents[0].limits.max_file_size = check::MAX_FILE_SIZE;
    assert!(c.max_body_bytes() <= Config::MAX_BODY_BYTES);
    c.server.max_body_bytes = Some(u64::MAX);
    assert_eq!(c.max_body_bytes(), Config::MAX_BODY_BYTES);
    assert!(
        c.validated().is_err(),
        "an out-of-range cap is refused outright"
    );
}

#[test]
fn a_key_that_may_use_no_agent_is_refused() {
    let e = Config::from_toml("[[api_keys]]\nname = \"n\"\nkey = \"k\"\nagents = []\n")
        .expect_err("empty agents");
    assert_eq!(e.key.as_deref(), Some("api_keys[0].agents"));
}

#[test]
fn options_of_another_backend_are_refused() {
    let text = "[[agents]]\nid = \"llm\"\nbackend = \"openai\"\n[agents.openai]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n[agents.echo]\ndelay_ms = 5\n";
    let e = Config::from_toml(text).expect_err("echo options on an openai agent");
    assert_eq!(e.key.as_deref(), Some("agents[0].echo"), "{e}");
    let ok = "[[agents]]\nid = \"e\"\n[agents.echo]\ndelay_ms = 5\n";
    assert!(Config::from_toml(ok).is_ok());
}

#[test]
fn a_file_without_settings_is_refused_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("a2ad-cfg-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("empty.toml");
    std::fs::write(&path, "# nothing here\n\n").expect("write");
    let e = Config::load(&path).expect_err("empty file");
    assert!(
        e.file.as_deref().is_some_and(|f| f.ends_with("empty.toml")),
        "{e}"
    );
    assert!(e.message.contains("no settings"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_cluster_section_is_checked_key_by_key() {
    let base = "[cluster]\nengine = \"postgres\"\nurl = \"postgres://a2ad@127.0.0.1/a2ad\"\n";
    let ok = Config::from_toml(base).expect("a minimal cluster section");
    let c = ok.cluster.expect("cluster");
    assert_eq!(
        (
            c.schema.as_str(),
            c.lease_ttl_ms,
            c.heartbeat_ms,
            c.pool_size,
            c.commit_lanes
        ),
        ("a2ad", 10_000, 1_000, 16, 1)
    );
    assert_eq!(c.on_node_loss, crate::config::NodeLoss::Fail);
    let cases = [
        ("lease_ttl_ms = 10\n", "cluster.lease_ttl_ms"),
        (
            "lease_ttl_ms = 18446744073709551615\n",
            "cluster.lease_ttl_ms",
        ),
        ("heartbeat_ms = 0\n", "cluster.heartbeat_ms"),
        ("heartbeat_ms = 5000\n", "cluster.heartbeat_ms"),
        ("pool_size = 0\n", "cluster.pool_size"),
        ("pool_size = 100000\n", "cluster.pool_size"),
        ("commit_lanes = 0\n", "cluster.commit_lanes"),
        ("commit_lanes = 65\n", "cluster.commit_lanes"),
        ("schema = \"Bad-Name\"\n", "cluster.schema"),
        ("schema = \"x; DROP TABLE t\"\n", "cluster.schema"),
        ("node_id = \"\"\n", "cluster.node_id"),
        ("node_id = \"a b\"\n", "cluster.node_id"),
    ];
    for (tail, key) in cases {
        let e = Config::from_toml(&format!("{base}{tail}")).expect_err(tail);
        assert_eq!(e.key.as_deref(), Some(key), "{tail}: {e}");
    }
    for text in [
        "[cluster]\nurl = \"postgres://x@127.0.0.1/x\"\n",
        "[cluster]\nengine = \"redis\"\nurl = \"redis://x\"\n",
        "[cluster]\nengine = \"postgres\"\nurl = \"\"\n",
        "[cluster]\nengine = \"postgres\"\nurl = \"postgres://x@127.0.0.1/x\"\non_node_loss = \"retry\"\n",
        "[cluster]\nengine = \"postgres\"\nurl = \"postgres://x@127.0.0.1/x\"\nlease = 1\n",
    ] {
        assert!(Config::from_toml(text).is_err(), "{text}");
    }
}
