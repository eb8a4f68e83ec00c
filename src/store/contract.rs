//! The contract every [`Store`] keeps, as one suite run against each implementation:
//! `memory` and the redb file here; a shared database runs the same checks. What differs by
//! design is said where it is checked: memory keeps no events of finished tasks and nothing
//! across a reopen.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use super::{Committed, Durable, ListQuery, LocalStore, Store, TurnId, Write, delivery_id};
use crate::config::{Config, StoreConfig};
use crate::error::Error;
use crate::model::{
    ContextId, Message, Part, Role, TaskEvent, TaskId, TaskKey, TaskSnapshot, TaskState, TaskStatus,
};
use crate::push::{PushConfig, PushScope, StoredPushConfig};

/// Appends and waits until the writes are durable; returns what they planned.
pub(crate) fn commit(store: &dyn Store, writes: Vec<Write>) -> Committed {
    let (tx, rx) = std::sync::mpsc::channel();
    let then = Box::new(move |c: Committed| {
        let _ = tx.send(c);
    });
    match store.append(writes, Some(then)) {
        Durable::Now(c) => c,
        Durable::Later => rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the writes became durable"),
    }
}

pub(crate) fn key(principal: &str, task: &str) -> TaskKey {
    TaskKey {
        principal: principal.into(),
        agent: "echo".into(),
        task: TaskId::new(task),
    }
}

/// When the task of `key` was created: fixed per task, distinct between tasks.
fn created_at(key: &TaskKey) -> chrono::DateTime<Utc> {
    let n: i64 = key.task.as_str().bytes().map(i64::from).sum();
    chrono::DateTime::from_timestamp_micros(1_700_000_000_000_000 + n).unwrap_or_default()
}

/// A task of `key` after `seq` events, the last one in `state`.
fn snapshot(key: &TaskKey, context: &str, seq: u64, state: TaskState) -> Arc<TaskSnapshot> {
    let user = Arc::new(Message {
        role: Role::User,
        parts: vec![Part::Text(format!("hello from {}", key.task))],
        message_id: format!("m-{}", key.task),
        extensions: Default::default(),
    });
    let mut history = vec![user];
    let mut status = TaskStatus::new(state);
    if state == TaskState::Completed {
        let reply = Arc::new(Message::agent_text(["echo"]));
        status.message = Some(reply.clone());
        history.push(reply);
    }
    Arc::new(TaskSnapshot {
        id: key.task.clone(),
        context_id: ContextId::new(context),
        seq,
        // A task's creation time never changes (the file keys its rows by it).
        created_at: created_at(key),
        updated_at: status.timestamp,
        status,
        history,
        artifacts: Vec::new(),
        metadata: None,
        extensions: Default::default(),
        note: None,
    })
}

/// The write of event `seq` of a task.
pub(crate) fn event(key: &TaskKey, context: &str, seq: u64, state: TaskState) -> Write {
    let task = snapshot(key, context, seq, state);
    Write::Task {
        key: key.clone(),
        event: Arc::new(TaskEvent::status(seq, task.status.clone())),
        task,
        changed: true,
        turn: TurnId {
            number: 1,
            since: 0,
        },
    }
}

/// A task through submitted, working and completed, in three appends.
pub(crate) fn run_to_completion(store: &dyn Store, key: &TaskKey, context: &str) -> Vec<Committed> {
    [
        TaskState::Submitted,
        TaskState::Working,
        TaskState::Completed,
    ]
    .into_iter()
    .zip(1..)
    .map(|(state, seq)| commit(store, vec![event(key, context, seq, state)]))
    .collect()
}

/// Checks and reserves a configuration, as the runtime does (a cap of 2 per task).
fn reserve(store: &dyn Store, config: &Arc<StoredPushConfig>) -> crate::error::Result<()> {
    block(store.push_check(config, 2))?;
    store.push_reserve(config, 2)
}

pub(crate) fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// The checks every store passes, whatever it keeps across a reopen. A shared store
/// (`shared`) answers `task_now` with `None`: uniqueness is its own.
fn contract(store: &dyn Store, keeps_events: bool, shared: bool) {
    let a = key("alice", "t-1");
    // A task's record is readable once its event is durable, and it is the latest.
    commit(store, vec![event(&a, "c1", 1, TaskState::Submitted)]);
    let got = block(store.task(&a)).expect("read").expect("the task");
    assert_eq!((got.seq, got.status.state), (1, TaskState::Submitted));
    let now = store.task_now(&a).map(|t| t.seq);
    assert_eq!(now, (!shared).then_some(1));
    commit(store, vec![event(&a, "c1", 2, TaskState::Working)]);
    commit(store, vec![event(&a, "c1", 3, TaskState::Completed)]);
    let got = block(store.task(&a)).expect("read").expect("the task");
    assert_eq!((got.seq, got.status.state), (3, TaskState::Completed));
    assert_eq!(got.history.len(), 2, "the user message and the reply");

    // Events: all after `after`, in order — or none, where finished tasks keep no events.
    let events = block(store.events(&a, 1)).expect("events");
    if keeps_events {
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(events[1].status.state, TaskState::Completed);
    } else {
        assert!(events.is_empty());
    }
    // After the last number, up to the largest a client can send: none.
    for after in [3, u64::MAX - 1, u64::MAX] {
        assert!(block(store.events(&a, after)).expect("events").is_empty());
    }

    // Ownership: another principal's key with the same task id is another task.
    assert!(
        block(store.task(&key("mallory", "t-1")))
            .expect("read")
            .is_none()
    );

    // ListTasks: newest status first, paged with a token, filtered by state and context.
    let b = key("alice", "t-2");
    run_to_completion(store, &b, "c2");
    let c = key("alice", "t-3");
    commit(store, vec![event(&c, "c2", 1, TaskState::Submitted)]);
    let query = |page_size, after| ListQuery {
        principal: "alice".into(),
        agent: "echo".into(),
        context: None,
        state: None,
        status_after: None,
        page_size,
        after,
    };
    let first = block(store.list(&query(2, None))).expect("list");
    assert_eq!(first.total, 3);
    assert_eq!(
        first
            .tasks
            .iter()
            .map(|t| t.id.as_str())
            .collect::<Vec<_>>(),
        vec!["t-3", "t-2"]
    );
    let second = block(store.list(&query(2, first.next.clone()))).expect("list");
    assert_eq!(
        second
            .tasks
            .iter()
            .map(|t| t.id.as_str())
            .collect::<Vec<_>>(),
        vec!["t-1"]
    );
    assert!(second.next.is_none());
    let mut q = query(10, None);
    q.state = Some(TaskState::Completed);
    q.context = Some(ContextId::new("c2"));
    let filtered = block(store.list(&q)).expect("list");
    assert_eq!(
        filtered
            .tasks
            .iter()
            .map(|t| t.id.as_str())
            .collect::<Vec<_>>(),
        vec!["t-2"]
    );
    let mut q = query(10, None);
    q.principal = "mallory".into();
    assert_eq!(block(store.list(&q)).expect("list").total, 0);

    // Push configurations: scoped by exact scope, named per task with a cap, removable.
    let scope = PushScope {
        principal: "alice".into(),
        agent: "echo".into(),
        task: Some(c.task.clone()),
    };
    let scoped = StoredPushConfig::scoped(
        scope.clone(),
        PushConfig::new("https://hooks.example.com/a"),
        "seed",
    );
    reserve(store, &scoped).expect("reserve");
    commit(store, vec![Write::PushSet(scoped.clone())]);
    let got = block(store.push_scope(&scope))
        .expect("read")
        .expect("scoped");
    assert_eq!(got.id, scoped.id);
    let by_id = block(store.push_by_id(&"alice".into(), &"echo".into(), &scoped.id));
    assert!(by_id.expect("read").is_some());
    let named: Vec<_> = ["n1", "n2", "n3"]
        .into_iter()
        .map(|id| {
            StoredPushConfig::named(
                &c,
                Some(id.into()),
                PushConfig::new("https://hooks.example.com/n"),
                "a2a/1.0",
            )
        })
        .collect();
    for n in &named[..2] {
        reserve(store, n).expect("reserve");
        commit(store, vec![Write::PushSet(n.clone())]);
    }
    assert!(matches!(
        reserve(store, &named[2]),
        Err(Error::InvalidParams { .. })
    ));
    let listed = block(store.push_named(&c)).expect("named");
    assert_eq!(
        listed.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
        vec!["n1", "n2"]
    );
    commit(
        store,
        vec![Write::PushRemoveNamed {
            task: c.clone(),
            id: "n1".into(),
        }],
    );
    let listed = block(store.push_named(&c)).expect("named");
    assert_eq!(
        listed.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
        vec!["n2"]
    );

    // Deliveries are planned with the event that causes them, with a stable id.
    let committed = commit(store, vec![event(&c, "c2", 2, TaskState::Working)]);
    assert_eq!(
        committed.deliveries.len(),
        2,
        "the scoped and the named configuration"
    );
    for d in &committed.deliveries {
        assert_eq!(
            (d.key.task.clone(), d.key.seq, d.attempt),
            (c.clone(), 2, 1)
        );
        assert_eq!(d.id, delivery_id(&d.key));
    }
    commit(store, vec![Write::PushRemove(scope.clone())]);
    assert!(block(store.push_scope(&scope)).expect("read").is_none());
}

fn open(config: &Config) -> LocalStore {
    LocalStore::open(config).expect("the store opens")
}

#[test]
fn memory_keeps_the_contract() {
    let config = Config {
        store: StoreConfig::memory(),
        ..Config::default()
    };
    let store = open(&config);
    contract(&store, false, false);
    store.close(std::time::Duration::from_secs(30));
    // Nothing across a reopen, by design.
    let store = open(&config);
    assert!(store.task_now(&key("alice", "t-1")).is_none());
}

#[test]
fn the_redb_file_keeps_the_contract_and_everything_across_a_reopen() {
    let dir = std::env::temp_dir().join(format!("a2ad-contract-{}", uuid::Uuid::new_v4()));
    durable_contract(
        &dir,
        StoreConfig::redb(dir.join("a2ad.redb").display().to_string()),
    );
}

#[test]
fn the_log_keeps_the_contract_and_everything_across_a_reopen() {
    let dir = std::env::temp_dir().join(format!("a2ad-contract-{}", uuid::Uuid::new_v4()));
    durable_contract(
        &dir,
        StoreConfig::log(dir.join("log").display().to_string()),
    );
}

fn durable_contract(dir: &std::path::Path, store: StoreConfig) {
    let config = Config {
        store,
        ..Config::default()
    };
    let store = open(&config);
    contract(&store, true, false);
    store.close(std::time::Duration::from_secs(30));
    drop(store);

    let store = open(&config);
    let done = store
        .task_now(&key("alice", "t-2"))
        .expect("finished tasks come back");
    assert_eq!(done.status.state, TaskState::Completed);
    let events = block(store.events(&key("alice", "t-2"), 0)).expect("events");
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let recovered = store.recovered();
    let live: Vec<_> = recovered
        .tasks
        .iter()
        .map(|t| t.key.task.as_str())
        .collect();
    assert_eq!(
        live,
        vec!["t-3"],
        "the unfinished task is handed back to run"
    );
    assert_eq!(recovered.tasks[0].events.len(), 2);
    // Its delivery to the named configuration is pending; the scoped one was removed
    // (and its outbox entry is dropped with it).
    let pending: Vec<_> = recovered
        .deliveries
        .iter()
        .map(|d| (d.key.seq, d.config.id.as_str(), d.id == delivery_id(&d.key)))
        .collect();
    assert_eq!(pending, vec![(2, "n2", true)]);
    let key = recovered.deliveries[0].key.clone();
    commit(&store, vec![Write::OutboxDone(key)]);
    store.close(std::time::Duration::from_secs(30));
    drop(store);

    let store = open(&config);
    assert!(
        store.recovered().deliveries.is_empty(),
        "a done delivery is gone"
    );
    store.close(std::time::Duration::from_secs(30));
    let _ = std::fs::remove_dir_all(dir);
}

/// The PostgreSQL of the tests: `A2AD_TEST_PG_URL`, by default the local server of this
/// project's machines. `None` (the test says it skips) when it cannot be reached — unless
/// `A2AD_REQUIRE_PG` is set (CI), which turns the skip into a failure.
pub(crate) fn test_pg_url() -> Option<String> {
    let url = std::env::var("A2AD_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let reachable = url
        .parse::<tokio_postgres::Config>()
        .ok()
        .and_then(|c| {
            let host = match c.get_hosts().first() {
                Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
                _ => "127.0.0.1".into(),
            };
            let port = c.get_ports().first().copied().unwrap_or(5432);
            std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
                .ok()?
                .next()
        })
        .is_some_and(|addr| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
        });
    if reachable {
        return Some(url);
    }
    assert!(
        std::env::var_os("A2AD_REQUIRE_PG").is_none(),
        "A2AD_REQUIRE_PG is set but PostgreSQL at {url} cannot be reached"
    );
    eprintln!(
        "SKIPPED: no PostgreSQL at {url} (set A2AD_TEST_PG_URL, or A2AD_REQUIRE_PG=1 to fail)"
    );
    None
}

/// A runtime, PostgreSQL's URL and a fresh schema name (`prefix_` and 12 hex digits) for a
/// test on PostgreSQL; `None` (the test skips) without a reachable one.
pub(crate) fn pg_test_setup(prefix: &str) -> Option<(tokio::runtime::Runtime, String, String)> {
    let url = test_pg_url()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let schema = format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    Some((rt, url, schema))
}

#[test]
fn postgres_keeps_the_contract_and_a_second_node_takes_over_what_the_first_left() {
    use super::pg::PgStore;
    use crate::config::ClusterConfig;
    use crate::store::cluster::{Cluster as _, Signal};

    let Some((rt, url, schema)) = pg_test_setup("a2ad_contract") else {
        return;
    };
    let node = |id: &str| {
        let mut cluster = ClusterConfig::postgres(url.clone());
        cluster.schema = schema.clone();
        cluster.node_id = Some(id.into());
        cluster.heartbeat_ms = 100;
        cluster.lease_ttl_ms = 600;
        let config = Config {
            cluster: Some(cluster.clone()),
            ..Config::default()
        };
        rt.block_on(PgStore::open(&config, &cluster, Default::default()))
            .expect("the store opens")
    };
    let first = node("n1");
    let mut first_signals = first.signals().expect("signals");
    contract(&first, true, true);

    // Another node reads what the first wrote.
    let second = node("n2");
    let done = block(second.task(&key("alice", "t-2")))
        .expect("read")
        .expect("a finished task is shared");
    assert_eq!(done.status.state, TaskState::Completed);
    let events = block(second.events(&key("alice", "t-2"), 0)).expect("events");
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );

    // The first node stops renewing its lease (as if killed): after the TTL, the second
    // node's lease loop takes its unfinished task (with its events) and its pending
    // delivery, and tells its runtime.
    let mut second_signals = second.signals().expect("signals");
    first.halt();
    let (mut taken, mut claimed) = (Vec::new(), Vec::new());
    while taken.is_empty() || claimed.is_empty() {
        let signal = rt
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(20), second_signals.recv()).await
            })
            .expect("the second node takes over within 20 s")
            .expect("the channel is open");
        match signal {
            Signal::Adopted(t) => taken.push(t),
            Signal::Deliver(d) => claimed.extend(d),
            _ => {}
        }
    }
    let names: Vec<_> = taken.iter().map(|t| t.key.task.as_str()).collect();
    assert_eq!(names, vec!["t-3"], "the unfinished task is taken over");
    assert_eq!(taken[0].events.len(), 2);
    assert_eq!(
        taken[0].why,
        crate::store::Orphan::NodeLost { rerun: false }
    );
    let pending: Vec<_> = claimed
        .iter()
        .map(|d| (d.key.seq, d.config.id.as_str(), d.id == delivery_id(&d.key)))
        .collect();
    assert_eq!(
        pending,
        vec![(2, "n2", true)],
        "same delivery id on the new node"
    );

    // The first node's next append to the task it lost is fenced: acknowledged to nobody,
    // and the runtime is told to stop the task there.
    let c = key("alice", "t-3");
    let (tx, rx) = std::sync::mpsc::channel();
    let then = Box::new(move |_: Committed| {
        let _ = tx.send(());
    });
    let _ = first.append(vec![event(&c, "c2", 3, TaskState::Completed)], Some(then));
    let signal = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(20), first_signals.recv()).await
        })
        .expect("a signal")
        .expect("the channel is open");
    assert!(matches!(signal, Signal::Fenced(k) if k == c));
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "never acknowledged"
    );
    // The new runner's append goes through.
    commit(&second, vec![event(&c, "c2", 3, TaskState::Completed)]);
    let got = block(first.task(&c)).expect("read").expect("task");
    assert_eq!((got.seq, got.status.state), (3, TaskState::Completed));

    rt.block_on(second.drop_schema()).expect("drop the schema");
}
