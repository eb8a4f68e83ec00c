//! The log on real files: a torn last write is dropped, damage before it refuses the
//! start (the files left as they were), compaction bounds the segments, one process at a
//! time.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{SEGMENT_BYTES, segment_name};
use crate::config::{Config, StoreConfig};
use crate::model::TaskState;
use crate::store::contract::{block, key, run_to_completion};
use crate::store::{LocalStore, Store, Write};

thread_local! {
    /// The segment size of stores this thread opens.
    pub(super) static SEGMENT: Cell<u64> = const { Cell::new(SEGMENT_BYTES) };
    /// Stores this thread opens write through the page cache, as on a file system that
    /// refuses direct I/O.
    pub(super) static BUFFERED: Cell<bool> = const { Cell::new(false) };
}

struct Dir(PathBuf);

impl Dir {
    fn new() -> Self {
        Self(std::env::temp_dir().join(format!("a2ad-log-{}", uuid::Uuid::new_v4())))
    }

    fn config(&self) -> Config {
        Config {
            store: StoreConfig::log(self.0.join("log").display().to_string()),
            ..Config::default()
        }
    }

    fn segments(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(self.0.join("log"))
            .expect("the directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "a2l"))
            .collect();
        out.sort();
        out
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(config: &Config) -> LocalStore {
    LocalStore::open(config).expect("the store opens")
}

fn close(store: LocalStore) {
    assert_eq!(
        store.close(Duration::from_secs(30)),
        0,
        "everything became durable"
    );
}

fn refusal(config: &Config) -> String {
    match LocalStore::open(config) {
        Ok(_) => panic!("the store opened"),
        Err(e) => e.to_string(),
    }
}

/// A store of one finished task (alice's t-1), closed: its newest segment.
fn one_task(dir: &Dir) -> PathBuf {
    let store = open(&dir.config());
    run_to_completion(&store, &key("alice", "t-1"), "ctx");
    close(store);
    dir.segments().pop().expect("a segment")
}

/// Writes `bytes` where the segment's log ends, as the next write would.
fn append(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::FileExt as _;
    let end = log_end(&std::fs::read(path).expect("segment"));
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("segment")
        .write_all_at(bytes, end as u64)
        .expect("append");
}

/// Appends a whole frame (its checksum holds) whose task record (alice's `bad`) is no
/// record: written by a build with a bug, say.
fn append_undecodable_task(segment: &Path) {
    let mut frame = super::frame::FrameBuf::default();
    let task_key = crate::store::codec::task_key(&key("alice", "bad"), 1);
    frame.put(super::Table::Tasks, &task_key, b"\x01 not a task record");
    append(segment, frame.seal());
}

/// Where a segment's log ends: after its last whole frame (zeros may follow: a direct
/// write's last block, or a segment written in advance).
fn log_end(bytes: &[u8]) -> usize {
    let mut at = super::frame::HEADER;
    while let super::frame::Next::Frame { next, .. } = super::frame::next(bytes, at) {
        at = next;
    }
    at
}

#[test]
fn a_torn_last_write_is_dropped_and_everything_before_it_kept() {
    let dir = Dir::new();
    let config = dir.config();
    let segment = one_task(&dir);
    let clean = log_end(&std::fs::read(&segment).expect("segment")) as u64;
    // Half of a frame: a length that runs past the end, then some of its payload.
    append(&segment, &[200, 0, 0, 0, 1, 2, 3, 4, 9, 9, 9]);
    let store = open(&config);
    let back = store.task_now(&key("alice", "t-1")).expect("kept");
    assert_eq!(back.status.state, TaskState::Completed);
    let events = block(store.events(&key("alice", "t-1"), 0)).expect("events");
    assert_eq!(events.len(), 3);
    // Past the last number, or at the very end of the numbers: nothing, and no panic.
    for after in [3, 1000, u64::MAX - 1, u64::MAX] {
        assert!(
            block(store.events(&key("alice", "t-1"), after))
                .expect("events")
                .is_empty()
        );
    }
    assert_eq!(
        std::fs::metadata(&segment).expect("meta").len(),
        clean,
        "the torn tail was cut off"
    );
    run_to_completion(&store, &key("alice", "t-2"), "ctx");
    close(store);
    let store = open(&config);
    assert!(
        store.task_now(&key("alice", "t-2")).is_some(),
        "writes after the cut are kept"
    );
    close(store);
}

#[test]
fn direct_and_page_cache_writes_keep_the_same_log_across_restarts_and_a_torn_write() {
    for buffered in [false, true] {
        BUFFERED.with(|b| b.set(buffered));
        let dir = Dir::new();
        let config = dir.config();
        let store = open(&config);
        for n in 0..5 {
            run_to_completion(&store, &key("alice", &format!("t-{n}")), "ctx");
        }
        close(store);
        let segment = dir.segments().pop().expect("a segment");
        let bytes = std::fs::read(&segment).expect("segment");
        let end = log_end(&bytes);
        if buffered {
            assert_eq!(
                bytes.len(),
                end,
                "the page cache path ends the file at its log"
            );
        } else {
            // Direct writes move whole blocks (where the file system takes them).
            assert!(bytes.len() == end || bytes.len().is_multiple_of(super::direct::BLOCK));
            assert!(bytes[end..].iter().all(|b| *b == 0));
        }
        append(&segment, &[90, 0, 0, 0, 1, 2, 3]);
        let store = open(&config);
        for n in 0..5 {
            let k = key("alice", &format!("t-{n}"));
            assert_eq!(block(store.events(&k, 0)).expect("events").len(), 3);
        }
        run_to_completion(&store, &key("alice", "after"), "ctx");
        close(store);
        let store = open(&config);
        assert!(
            store.task_now(&key("alice", "after")).is_some(),
            "buffered: {buffered}"
        );
        close(store);
    }
    BUFFERED.with(|b| b.set(false));
}

#[test]
fn damage_before_the_last_write_refuses_the_start_and_touches_nothing() {
    let dir = Dir::new();
    let config = dir.config();
    let store = open(&config);
    run_to_completion(&store, &key("alice", "t-1"), "ctx");
    run_to_completion(&store, &key("alice", "t-2"), "ctx");
    close(store);
    let segment = dir.segments().pop().expect("a segment");
    let mut bytes = std::fs::read(&segment).expect("read");
    // A byte of the first frame's payload (header 16, frame header 8).
    bytes[16 + 8 + 3] ^= 0x20;
    std::fs::write(&segment, &bytes).expect("write");
    let message = refusal(&config);
    assert!(message.contains("is damaged"), "{message}");
    assert!(message.contains("offset 16"), "{message}");
    assert_eq!(
        std::fs::read(&segment).expect("read"),
        bytes,
        "left as it was"
    );
}

#[test]
fn files_that_are_not_a_log_are_refused() {
    let dir = Dir::new();
    let config = dir.config();
    // A directory of someone else's files.
    std::fs::create_dir_all(dir.0.join("log")).expect("dir");
    std::fs::write(dir.0.join("log/notes.txt"), "mine").expect("write");
    let message = refusal(&config);
    assert!(message.contains("did not write (notes.txt)"), "{message}");
    std::fs::remove_file(dir.0.join("log/notes.txt")).expect("remove");
    // A segment of another format, and one of a newer a2ad.
    std::fs::write(
        dir.0.join("log").join(segment_name(1)),
        b"SQLite format 3\0...",
    )
    .expect("w");
    assert!(refusal(&config).contains("not an a2ad log segment"));
    let mut newer = super::frame::header();
    newer[8] = 7;
    std::fs::write(dir.0.join("log").join(segment_name(1)), newer).expect("w");
    let message = refusal(&config);
    assert!(message.contains("newer a2ad (log format 7"), "{message}");
    // A file where the directory should be (a redb store, say).
    let file = Config {
        store: StoreConfig::log(
            dir.0
                .join("log")
                .join(segment_name(1))
                .display()
                .to_string(),
        ),
        ..Config::default()
    };
    assert!(refusal(&file).contains("is a file, not the log store's directory"));
}

#[test]
fn one_process_at_a_time() {
    let dir = Dir::new();
    let config = dir.config();
    let store = open(&config);
    let message = refusal(&config);
    assert!(message.contains("in use by another a2ad"), "{message}");
    close(store);
    drop(store_reopens(&config));
}

fn store_reopens(config: &Config) -> LocalStore {
    open(config)
}

#[test]
fn compaction_keeps_the_segments_bounded_and_the_retained_tasks_whole() {
    SEGMENT.with(|s| s.set(16 << 10));
    let dir = Dir::new();
    let mut config = dir.config();
    config.server.max_finished_tasks = 20;
    let store = open(&config);
    let mut most = 0;
    for n in 0..600 {
        run_to_completion(&store, &key("alice", &format!("t-{n}")), &format!("c-{n}"));
        most = most.max(dir.segments().len());
    }
    // The committer compacts between batches: give it a moment with nothing else to do.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while dir.segments().len() > 8 && std::time::Instant::now() < deadline {
        run_to_completion(&store, &key("bob", "idle"), "idle");
        std::thread::sleep(Duration::from_millis(20));
    }
    let written = 600 * 3 * 700;
    let on_disk: u64 = dir
        .segments()
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    assert!(
        on_disk < written / 4,
        "{on_disk} bytes on disk after writing about {written}"
    );
    assert!(most < 40, "at most {most} segments at once");
    close(store);
    let store = open(&config);
    for n in 590..600 {
        let k = key("alice", &format!("t-{n}"));
        assert!(store.task_now(&k).is_some(), "t-{n} is retained");
        assert_eq!(
            block(store.events(&k, 0)).expect("events").len(),
            3,
            "t-{n}"
        );
    }
    assert!(
        store.task_now(&key("alice", "t-3")).is_none(),
        "an evicted task stays gone"
    );
    close(store);
    SEGMENT.with(|s| s.set(SEGMENT_BYTES));
}

#[test]
fn a_redb_store_beside_the_log_is_carried_over_once() {
    let dir = Dir::new();
    let redb = Config {
        store: StoreConfig::redb(dir.0.join("a2ad.redb").display().to_string()),
        ..Config::default()
    };
    let store = open(&redb);
    for n in 0..30 {
        run_to_completion(&store, &key("alice", &format!("t-{n}")), "ctx");
    }
    // One left unfinished: the log must hand it back to run.
    crate::store::contract::commit(
        &store,
        vec![crate::store::contract::event(
            &key("alice", "live"),
            "ctx",
            1,
            TaskState::Submitted,
        )],
    );
    close(store);

    let config = dir.config();
    let store = open(&config);
    for n in 0..30 {
        let k = key("alice", &format!("t-{n}"));
        assert_eq!(
            store.task_now(&k).map(|t| t.status.state),
            Some(TaskState::Completed),
            "t-{n}"
        );
        assert_eq!(block(store.events(&k, 0)).expect("events").len(), 3);
    }
    let recovered = store.recovered();
    assert_eq!(recovered.tasks.len(), 1);
    assert_eq!(recovered.tasks[0].key.task.as_str(), "live");
    assert!(
        !dir.0.join("a2ad.redb").exists(),
        "renamed once carried over"
    );
    assert!(dir.0.join("a2ad.redb.carried-over").exists(), "and kept");
    assert!(!dir.0.join("log.carrying").exists(), "no staging left");
    run_to_completion(&store, &key("alice", "after"), "ctx");
    close(store);

    // The next start reads the log alone.
    let store = open(&config);
    assert!(store.task_now(&key("alice", "t-7")).is_some());
    assert!(store.task_now(&key("alice", "after")).is_some());
    close(store);

    // A damaged redb file is refused like the redb backend refuses it, the log untouched.
    let dir = Dir::new();
    std::fs::create_dir_all(&dir.0).expect("dir");
    std::fs::write(
        dir.0.join("a2ad.redb"),
        b"not a database at all, just words",
    )
    .expect("w");
    let message = refusal(&dir.config());
    assert!(message.contains("a2ad.redb"), "{message}");
    assert!(message.contains("not an a2ad store"), "{message}");
    assert!(dir.0.join("a2ad.redb").exists());
}

#[test]
fn a_record_that_does_not_decode_refuses_the_start_unless_set_aside() {
    let dir = Dir::new();
    let mut config = dir.config();
    let segment = one_task(&dir);
    // A whole frame (its checksum holds) whose task record is no record: written by a
    // build with a bug, say.
    append_undecodable_task(&segment);
    let message = refusal(&config);
    assert!(
        message.contains("1 damaged record(s) (tasks: 1)"),
        "{message}"
    );

    config.store.set_aside_damaged = true;
    let store = open(&config);
    assert!(
        store.task_now(&key("alice", "t-1")).is_some(),
        "the rest is served"
    );
    close(store);
    let aside: Vec<_> = std::fs::read_dir(&dir.0)
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("log.damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "one set-aside file beside the log");
    config.store.set_aside_damaged = false;
    let store = open(&config);
    assert!(
        store.task_now(&key("alice", "bad")).is_none(),
        "removed from the log"
    );
    close(store);
}

/// Events are checked as the segments are replayed: an event that does not decode refuses
/// the start while the keydir still points at it, and not once its task's rows are gone.
#[test]
fn an_event_that_does_not_decode_refuses_the_start_while_it_is_live() {
    use crate::store::codec::{event_key, prefix_end, task_key};
    let dir = Dir::new();
    let mut config = dir.config();
    let segment = one_task(&dir);
    let mut frame = super::frame::FrameBuf::default();
    frame.put(
        super::Table::Events,
        &event_key(&key("alice", "bad"), 1, 1),
        b"\x01 not an event",
    );
    // Another task's damaged event, deleted with its task in a later write.
    let gone = task_key(&key("alice", "gone"), 1);
    frame.put(
        super::Table::Events,
        &event_key(&key("alice", "gone"), 1, 1),
        b"\x01 not an event either",
    );
    append(&segment, frame.seal());
    let mut frame = super::frame::FrameBuf::default();
    frame.remove_range(super::Table::Events, &gone, &prefix_end(&gone));
    append(&segment, frame.seal());
    let message = refusal(&config);
    assert!(
        message.contains("1 damaged record(s) (events: 1)"),
        "{message}"
    );

    config.store.set_aside_damaged = true;
    let store = open(&config);
    assert!(store.task_now(&key("alice", "t-1")).is_some());
    close(store);
    config.store.set_aside_damaged = false;
    let store = open(&config);
    assert!(
        store.task_now(&key("alice", "t-1")).is_some(),
        "set aside once, the next start needs nothing special"
    );
    close(store);
}

#[test]
fn a_compaction_steps_rows_ride_the_next_frame_where_a_newer_write_wins() {
    use super::Table::Push;
    use crate::store::file::Disk as _;
    use crate::store::file::tables::TableRead as _;

    SEGMENT.with(|s| s.set(16 << 10));
    let dir = Dir::new();
    let config = dir.config();
    let indexes = crate::store::index::Indexes::for_config(&config);
    let (disk, _) = super::LogDisk::open(&config, &indexes).expect("the log opens");
    let put = |k: &str, v: &[u8]| {
        disk.write(&mut |t| t.put(Push, k.as_bytes(), v))
            .expect("written");
    };
    for n in 0..4 {
        put(&format!("keep-{n}"), &[b'k'; 1000]);
    }
    // In one frame, so that one step reads both whatever the segments' boundaries (the
    // spare segment, prepared by a thread of its own, is taken as soon as it is ready:
    // written apart, the two rows were split between segments one run in three).
    disk.write(&mut |t| {
        t.put(Push, b"moved", b"old")?;
        t.put(Push, b"gone", b"old")
    })
    .expect("written");
    // One row written over and over: the segments come to hold far more than is live.
    for n in 0..200u8 {
        put("churn", &[n; 1000]);
    }
    // Steps (each with nothing to carry it, so alone) until one has read both rows.
    let holds = |key: &[u8]| {
        let w = disk.writer.lock().expect("the writer");
        w.copies.as_ref().is_some_and(|c| c.holds(Push, key))
    };
    let mut steps = 0;
    loop {
        let bytes = disk.bytes();
        let waiting = disk.writer.lock().expect("the writer").copies.is_some();
        assert!(disk.maintain().expect("a step"), "compaction is wanted");
        if !waiting {
            assert_eq!(disk.bytes(), bytes, "a step writes no frame of its own");
        }
        if holds(b"moved") && holds(b"gone") {
            break;
        }
        steps += 1;
        assert!(steps < 100, "a step reads moved and gone");
    }
    let segment = disk
        .writer
        .lock()
        .expect("the writer")
        .compacting
        .map(|c| c.0);
    let oldest = dir
        .0
        .join("log")
        .join(segment_name(segment.expect("compacting")));
    // The next frame carries the step's rows ahead of its own operations.
    disk.write(&mut |t| {
        t.put(Push, b"moved", b"newer")?;
        t.remove(Push, b"gone")
    })
    .expect("written");
    assert!(
        !dir.segments().contains(&oldest),
        "the oldest segment went once the frame carrying its rows was durable"
    );
    // Nothing more written: each step's rows then go in a frame alone.
    let mut steps = 0;
    while disk.maintain().expect("a step") {
        steps += 1;
        assert!(steps < 1000, "compaction ends");
    }
    assert!(
        dir.segments().len() <= 4,
        "{} segments left",
        dir.segments().len()
    );
    let live = super::Live(&disk);
    let rows = table_rows(&dir, Push);
    for (key, value) in [
        ("moved", Some(&b"newer"[..])),
        ("gone", None),
        ("churn", Some(&[199u8; 1000][..])),
        ("keep-3", Some(&[b'k'; 1000][..])),
    ] {
        assert_eq!(
            rows.get(key.as_bytes()).map(Vec::as_slice),
            value,
            "{key} on disk"
        );
        assert_eq!(
            live.get(Push, key.as_bytes()).expect("read").as_deref(),
            value,
            "{key} read"
        );
    }
    assert_eq!(rows.len(), 6, "keep-0..3, moved, churn");
    SEGMENT.with(|s| s.set(SEGMENT_BYTES));
}

#[test]
fn a_batch_knows_what_it_did_to_a_row_newest_first() {
    use super::Table::{Outbox, Push};
    let mut frame = super::frame::FrameBuf::default();
    let mut mine = super::Mine::default();
    assert_eq!(
        mine.leaves(frame.payload(), Outbox, b"k1"),
        None,
        "untouched"
    );
    frame.put(Outbox, b"k1", b"v");
    assert_eq!(mine.leaves(frame.payload(), Outbox, b"k1"), Some(true));
    assert_eq!(
        mine.leaves(frame.payload(), Push, b"k1"),
        None,
        "another table"
    );
    frame.remove(Outbox, b"k1");
    assert_eq!(mine.leaves(frame.payload(), Outbox, b"k1"), Some(false));
    frame.put(Outbox, b"k1", b"v");
    frame.put(Outbox, b"k2", b"v");
    frame.remove_range(Outbox, b"k", b"k2");
    assert_eq!(
        mine.leaves(frame.payload(), Outbox, b"k1"),
        Some(false),
        "a later range"
    );
    assert_eq!(
        mine.leaves(frame.payload(), Outbox, b"k2"),
        Some(true),
        "past its end"
    );
    assert_eq!(
        mine.leaves(frame.payload(), Outbox, b"k0"),
        Some(false),
        "in the range"
    );
    frame.put(Outbox, b"k1", b"again");
    assert_eq!(
        mine.leaves(frame.payload(), Outbox, b"k1"),
        Some(true),
        "after the range"
    );
}

/// The newest segment's file, whole.
fn newest_bytes(dir: &Dir) -> Vec<u8> {
    std::fs::read(dir.segments().pop().expect("a segment")).expect("read")
}

#[test]
fn the_next_segment_is_written_in_advance_and_its_zeros_end_the_log() {
    const SIZE: u64 = 64 << 10;
    SEGMENT.with(|s| s.set(SIZE));
    let dir = Dir::new();
    let config = dir.config();
    let store = open(&config);
    // Write until the newest segment is one written in advance: its file is the whole
    // segment, and it runs on in zeros after its frames.
    let ahead = |dir: &Dir| {
        let bytes = newest_bytes(dir);
        dir.segments().len() > 1
            && bytes.len() as u64 == SIZE
            && super::frame::zeros_from(&bytes, bytes.len() - 1024)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut n = 0;
    while !ahead(&dir) {
        assert!(
            std::time::Instant::now() < deadline,
            "no segment written in advance after {n} tasks"
        );
        run_to_completion(&store, &key("alice", &format!("t-{n}")), "ctx");
        n += 1;
    }
    close(store);
    // The zeros are the end of the log, not a torn write: nothing is cut, all is there.
    let before = newest_bytes(&dir);
    let store = open(&config);
    assert!(
        !dir.0.join("log").join(super::prealloc::SPARE).exists(),
        "no spare survives an open"
    );
    for i in 0..n {
        let k = key("alice", &format!("t-{i}"));
        assert!(store.task_now(&k).is_some(), "t-{i} is kept");
        assert_eq!(block(store.events(&k, 0)).expect("events").len(), 3);
    }
    assert_eq!(
        newest_bytes(&dir).len(),
        before.len(),
        "nothing was cut off"
    );
    // Writing goes on into the zeros, and survives another restart.
    run_to_completion(&store, &key("bob", "after"), "ctx");
    close(store);
    assert_eq!(newest_bytes(&dir).len() as u64, SIZE, "written in place");
    let store = open(&config);
    assert!(store.task_now(&key("bob", "after")).is_some());
    close(store);
    // Zeros after the frames of an older segment are not an end: damage.
    let oldest = dir.segments().first().cloned().expect("a segment");
    append(&oldest, &[0; 4096]);
    assert!(refusal(&config).contains("is damaged"), "refused");
    SEGMENT.with(|s| s.set(SEGMENT_BYTES));
}

#[test]
fn a_configurations_bookkeeping_is_written_once_per_batch_with_its_newest_state() {
    use std::sync::atomic::Ordering::Relaxed;

    use crate::push::{PushConfig, PushScope, StoredPushConfig};
    use crate::store::contract::commit;

    let dir = Dir::new();
    let config = dir.config();
    let store = open(&config);
    let scope = PushScope {
        principal: "alice".into(),
        agent: "echo".into(),
        task: None,
    };
    let c = StoredPushConfig::scoped(
        scope.clone(),
        PushConfig::new("https://hooks.example.com/a"),
        "seed",
    );
    store.push_reserve(&c, 10).expect("reserved");
    commit(&store, vec![Write::PushSet(c.clone())]);
    let bytes = || store.stats().file_bytes;
    let before = bytes();
    commit(&store, vec![Write::PushStats(c.clone())]);
    let one = bytes() - before;
    // Three deliveries of one agent-wide configuration ended in the same batch.
    c.consecutive_failures.store(4, Relaxed);
    let before = bytes();
    let stats = || Write::PushStats(c.clone());
    commit(&store, vec![stats(), stats(), stats()]);
    assert_eq!(bytes() - before, one, "one row, not three");
    close(store);
    let store = open(&config);
    let kept = block(store.push_scope(&scope))
        .expect("read")
        .expect("kept");
    assert_eq!(
        kept.consecutive_failures.load(Relaxed),
        4,
        "the newest state"
    );
    close(store);
}

/// A task of `key` finishing in one append, as the task actor writes it: its completed
/// event, then its conversation turn (the record's own user message and reply).
fn finish(key: &crate::model::TaskKey, context: &str, turn: crate::store::TurnId) -> Vec<Write> {
    let Write::Task {
        task,
        event,
        changed,
        ..
    } = crate::store::contract::event(key, context, 3, TaskState::Completed)
    else {
        panic!("a task's write");
    };
    let (user, reply) = (task.history[0].clone(), task.status.message.clone());
    vec![
        Write::Task {
            key: key.clone(),
            task,
            event,
            changed,
            turn,
        },
        Write::Turn {
            principal: key.principal.clone(),
            context: crate::model::ContextId::new(context),
            turn,
            user,
            reply,
        },
    ]
}

/// Polls `f` until it holds, up to a generous deadline (the committer works on its own
/// thread, between batches).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 120 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The turns table as the segments leave it, their operations replayed in order.
fn turn_rows(dir: &Dir) -> BTreeMap<Vec<u8>, Vec<u8>> {
    table_rows(dir, crate::store::file::tables::Table::Turns)
}

/// A table as the segments leave it, their operations replayed in order.
fn table_rows(dir: &Dir, table: crate::store::file::tables::Table) -> BTreeMap<Vec<u8>, Vec<u8>> {
    use super::frame::{self, Op};
    let mut rows = BTreeMap::new();
    for segment in dir.segments() {
        let bytes = std::fs::read(&segment).expect("segment");
        let mut at = frame::HEADER;
        while let frame::Next::Frame { payload, next } = frame::next(&bytes, at) {
            frame::each_op(payload, |op| match op {
                Op::Put {
                    table: t,
                    key,
                    value,
                    ..
                } if t == table => {
                    rows.insert(key.to_vec(), value.to_vec());
                }
                Op::Remove { table: t, key } if t == table => {
                    rows.remove(key);
                }
                Op::RemoveRange {
                    table: t,
                    start,
                    end,
                } if t == table => rows.retain(|k: &Vec<u8>, _| !(start <= &k[..] && &k[..] < end)),
                _ => {}
            });
            at = next;
        }
    }
    rows
}

/// A conversation read back: context, since, [(turn, user text, a reply)].
type Conversation = (String, i64, Vec<(u32, String, bool)>);

/// The conversations a store read back, in context order.
fn conversations(store: &LocalStore) -> Vec<Conversation> {
    let text = |m: &crate::model::Message| match m.parts.first() {
        Some(crate::model::Part::Text(t)) => t.clone(),
        _ => String::new(),
    };
    let mut out: Vec<_> = store
        .recovered()
        .contexts
        .into_iter()
        .map(|mut c| {
            let turns = c
                .turns
                .iter_mut()
                .map(|(n, t)| {
                    let (user, reply) = t.messages().expect("the turn reads");
                    (*n, text(user), reply.is_some())
                })
                .collect();
            (c.context.to_string(), c.since, turns)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_finished_tasks_record_carries_its_turn_and_its_eviction_writes_it_unless_the_conversation_was_forgotten()
 {
    use crate::model::ContextId;
    use crate::store::contract::commit;
    use crate::store::{TurnId, codec};

    let dir = Dir::new();
    let mut config = dir.config();
    config.server.max_finished_tasks = 3;
    let turn = |number, since| TurnId { number, since };
    let store = open(&config);
    // Two turns of one conversation, one of another: each task finishes in one append.
    commit(&store, finish(&key("alice", "t-1"), "kept", turn(1, 10)));
    commit(&store, finish(&key("alice", "t-2"), "kept", turn(2, 10)));
    commit(&store, finish(&key("alice", "t-3"), "gone", turn(1, 20)));
    assert!(turn_rows(&dir).is_empty(), "the records carry the turns");
    close(store);

    // A restart reads them back from the records.
    let store = open(&config);
    let turns = |tasks: &[(u32, &str)]| {
        tasks
            .iter()
            .map(|(n, t)| (*n, format!("hello from {t}"), true))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        conversations(&store),
        vec![
            ("gone".to_string(), 20, turns(&[(1, "t-3")])),
            ("kept".to_string(), 10, turns(&[(1, "t-1"), (2, "t-2")])),
        ]
    );
    // "gone" is forgotten while its task is retained; three more tasks then evict the
    // first three (at most 3 finished tasks are retained).
    commit(
        &store,
        vec![Write::ForgetContext {
            principal: "alice".into(),
            context: ContextId::new("gone"),
            since: 20,
        }],
    );
    for n in 4..=6 {
        let task = format!("t-{n}");
        commit(&store, finish(&key("alice", &task), &task, turn(1, 30 + n)));
    }
    close(store);
    let rows = turn_rows(&dir);
    let alice = crate::model::Principal::new("alice");
    let row = |context: &str, t: TurnId| codec::turn_key(&alice, &ContextId::new(context), t);
    assert_eq!(
        rows.keys().cloned().collect::<Vec<_>>(),
        vec![
            row("kept", turn(1, 10)),
            row("kept", turn(2, 10)),
            codec::tombstone_key(&alice, &ContextId::new("gone"), 20),
        ],
        "the evicted tasks' turns became rows, but not the forgotten conversation's"
    );

    // And a restart brings back every conversation but the forgotten one.
    let store = open(&config);
    assert_eq!(
        conversations(&store),
        vec![
            ("kept".to_string(), 10, turns(&[(1, "t-1"), (2, "t-2")])),
            ("t-4".to_string(), 34, turns(&[(1, "t-4")])),
            ("t-5".to_string(), 35, turns(&[(1, "t-5")])),
            ("t-6".to_string(), 36, turns(&[(1, "t-6")])),
        ]
    );
    // A turn that is not the record's own messages is written as a row of its own.
    let mut writes = finish(&key("alice", "t-7"), "apart", turn(1, 40));
    if let Some(Write::Turn { reply, .. }) = writes.last_mut() {
        *reply = Some(std::sync::Arc::new(crate::model::Message::agent_text([
            "another reply",
        ])));
    }
    commit(&store, writes);
    close(store);
    assert!(turn_rows(&dir).contains_key(&row("apart", turn(1, 40))));
}

#[test]
fn a_delivery_ending_after_its_task_was_evicted_writes_nothing_back() {
    use crate::push::{PushConfig, PushScope, StoredPushConfig};
    use crate::store::contract::commit;
    use crate::store::file::tables::Table;
    use crate::store::{TurnId, codec};

    let dir = Dir::new();
    let mut config = dir.config();
    config.server.max_finished_tasks = 1;
    let store = open(&config);
    let c = StoredPushConfig::scoped(
        PushScope {
            principal: "alice".into(),
            agent: "echo".into(),
            task: None,
        },
        PushConfig::new("https://hooks.example.com/a"),
        "seed",
    );
    store.push_reserve(&c, 10).expect("reserved");
    commit(&store, vec![Write::PushSet(c)]);
    let turn = TurnId {
        number: 1,
        since: 20,
    };
    let (one, two) = (key("alice", "t-1"), key("alice", "t-2"));
    let working = commit(
        &store,
        vec![crate::store::contract::event(
            &one,
            "c1",
            2,
            TaskState::Working,
        )],
    );
    let finished = commit(&store, finish(&one, "c1", turn));
    let (retried, done) = (&working.deliveries[0].key, &finished.deliveries[0].key);
    let outbox = || table_rows(&dir, Table::Outbox);
    assert_eq!(
        outbox().into_keys().collect::<Vec<_>>(),
        vec![codec::outbox_key(retried), codec::outbox_key(done)],
        "both of t-1's deliveries are pending"
    );
    // t-2 finishing evicts t-1 (one finished task at most), its outbox entries with it.
    let later = commit(&store, finish(&two, "c2", turn));
    let pending = vec![codec::outbox_key(&later.deliveries[0].key)];
    eventually("t-1 is evicted", || {
        outbox().into_keys().eq(pending.clone())
    });
    // Then t-1's deliveries end: one is to be retried, the other is done.
    commit(
        &store,
        vec![
            Write::OutboxRetry {
                key: retried.clone(),
                attempt: 2,
                due: chrono::Utc::now(),
            },
            Write::OutboxDone(done.clone()),
        ],
    );
    close(store);
    assert_eq!(
        outbox().into_keys().collect::<Vec<_>>(),
        pending,
        "no entry of the evicted task comes back"
    );
    let store = open(&config);
    let recovered: Vec<_> = store
        .recovered()
        .deliveries
        .iter()
        .map(|d| d.key.clone())
        .collect();
    assert_eq!(recovered, vec![later.deliveries[0].key.clone()]);
    close(store);
}

#[test]
fn a_tombstone_goes_once_no_record_carrying_a_turn_of_its_conversation_is_left() {
    use crate::model::ContextId;
    use crate::store::contract::commit;
    use crate::store::{TurnId, codec};

    let dir = Dir::new();
    let mut config = dir.config();
    config.server.max_finished_tasks = 1;
    // An hour's retention: by time alone the tombstone would stay two hours.
    config.server.task_retention_seconds = 3600.0;
    let turn = |number, since| TurnId { number, since };
    let alice = crate::model::Principal::new("alice");
    let tombstone = codec::tombstone_key(&alice, &ContextId::new("gone"), 20);
    let store = open(&config);
    commit(&store, finish(&key("alice", "t-1"), "gone", turn(1, 20)));
    // Forgotten while t-1's record, which carries its turn, is retained.
    commit(
        &store,
        vec![Write::ForgetContext {
            principal: "alice".into(),
            context: ContextId::new("gone"),
            since: 20,
        }],
    );
    close(store);
    assert!(turn_rows(&dir).contains_key(&tombstone));

    // A restart counts the records that carry turns: t-1 keeps the tombstone wanted.
    let store = open(&config);
    assert!(
        conversations(&store).is_empty(),
        "no turn of the forgotten conversation"
    );
    // t-2 finishing evicts t-1 (one finished task at most): nothing needs the tombstone
    // any more, and it goes after its grace, not two hours later.
    commit(&store, finish(&key("alice", "t-2"), "next", turn(1, 30)));
    eventually("the tombstone goes", || {
        !turn_rows(&dir).contains_key(&tombstone)
    });
    close(store);
    assert!(
        turn_rows(&dir).is_empty(),
        "t-1's turn was not written as a row either: its conversation was forgotten"
    );
    let store = open(&config);
    let got: Vec<String> = conversations(&store).into_iter().map(|c| c.0).collect();
    assert_eq!(
        got,
        vec!["next".to_string()],
        "and a restart brings back only t-2's"
    );
    close(store);
}

#[test]
fn a_conversation_forgotten_once_no_record_carries_its_turns_leaves_no_tombstone() {
    use crate::model::ContextId;
    use crate::store::contract::commit;
    use crate::store::{TurnId, codec};

    let dir = Dir::new();
    let mut config = dir.config();
    config.server.max_finished_tasks = 1;
    let turn = |number, since| TurnId { number, since };
    let alice = crate::model::Principal::new("alice");
    let forget = |context: &str, since| Write::ForgetContext {
        principal: "alice".into(),
        context: ContextId::new(context),
        since,
    };
    let store = open(&config);
    commit(&store, finish(&key("alice", "t-1"), "early", turn(1, 20)));
    // t-2 evicts t-1, whose turn becomes a row of its own once its rows are deleted.
    commit(&store, finish(&key("alice", "t-2"), "other", turn(1, 30)));
    let row = codec::turn_key(&alice, &ContextId::new("early"), turn(1, 20));
    eventually("t-1's rows are deleted", || {
        turn_rows(&dir).contains_key(&row)
    });
    // Forgotten now, nothing in the file carries a turn of it: its row goes, and no
    // tombstone is written.
    commit(&store, vec![forget("early", 20)]);
    // A conversation forgotten in the batch that carries its turn keeps its tombstone.
    let mut same = finish(&key("alice", "t-3"), "same", turn(1, 40));
    same.push(forget("same", 40));
    commit(&store, same);
    close(store);
    assert_eq!(
        turn_rows(&dir).into_keys().collect::<Vec<_>>(),
        vec![
            // t-2's, evicted by t-3.
            codec::turn_key(&alice, &ContextId::new("other"), turn(1, 30)),
            codec::tombstone_key(&alice, &ContextId::new("same"), 40),
        ],
        "neither early's row nor a tombstone of it"
    );
}

#[test]
fn a_tombstone_past_its_time_is_dropped_at_the_start_and_a_recent_one_kept() {
    use crate::model::ContextId;
    use crate::store::codec;
    use crate::store::file::tables::Table;

    let dir = Dir::new();
    let config = dir.config();
    close(open(&config));
    let alice = crate::model::Principal::new("alice");
    let old = codec::tombstone_key(&alice, &ContextId::new("old"), 5);
    let recent = codec::tombstone_key(&alice, &ContextId::new("recent"), 6);
    // Two tombstones, written in 1970 and now, as a batch of the store would write them.
    let mut frame = super::frame::FrameBuf::default();
    frame.put(Table::Turns, &old, &codec::encode_tombstone(0));
    let now = chrono::Utc::now().timestamp_micros();
    frame.put(Table::Turns, &recent, &codec::encode_tombstone(now));
    let segment = dir.segments().pop().expect("a segment");
    append(&segment, frame.seal());
    assert_eq!(turn_rows(&dir).len(), 2);
    let store = open(&config);
    assert!(store.recovered().contexts.is_empty(), "no turns of either");
    close(store);
    assert_eq!(
        turn_rows(&dir).into_keys().collect::<Vec<_>>(),
        vec![recent],
        "the old one went"
    );
}

#[test]
fn an_older_formats_newest_segment_goes_on_in_this_one() {
    let dir = Dir::new();
    let config = dir.config();
    let segment = one_task(&dir);
    let mut bytes = std::fs::read(&segment).expect("segment");
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    std::fs::write(&segment, &bytes).expect("format 1");
    let store = open(&config);
    assert!(
        store.task_now(&key("alice", "t-1")).is_some(),
        "read as it was"
    );
    close(store);
    let header = std::fs::read(&segment).expect("segment");
    assert_eq!(header[..super::frame::HEADER], super::frame::header());
}

/// What a continuation saw where it ran: its append's number, and whether it ran on a
/// thread of a tokio runtime.
fn where_they_ran(store: &LocalStore, n: usize) -> Vec<(usize, bool)> {
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..n {
        let tx = tx.clone();
        let then = Box::new(move |_| {
            let _ = tx.send((i, tokio::runtime::Handle::try_current().is_ok()));
        });
        let write = crate::store::contract::event(
            &key("alice", &format!("t-{i}")),
            "ctx",
            1,
            TaskState::Submitted,
        );
        assert!(matches!(
            store.append(vec![write], Some(then)),
            crate::store::Durable::Later
        ));
    }
    (0..n)
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(60))
                .expect("every append became durable")
        })
        .collect()
}

#[test]
fn a_durable_batchs_continuations_run_in_append_order_on_the_runtime_that_opened_the_store() {
    let dir = Dir::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("a runtime");
    // Opened inside a multi-threaded runtime: the committer hands each batch to it.
    let store = runtime.block_on(async { open(&dir.config()) });
    let ran = where_they_ran(&store, 200);
    assert_eq!(
        ran.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..200).collect::<Vec<_>>(),
        "in append order"
    );
    assert!(ran.iter().all(|r| r.1), "on the runtime's threads");
    close(store);
    drop(runtime);

    // Opened outside any runtime (an embedder's own thread): on the committer, in order.
    let dir = Dir::new();
    let store = open(&dir.config());
    let ran = where_they_ran(&store, 50);
    assert_eq!(
        ran.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..50).collect::<Vec<_>>()
    );
    assert!(ran.iter().all(|r| !r.1), "on the committer thread");
    close(store);
}

/// A listing of a directory: every entry's name and bytes (files) or `/` (directories).
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(|e| e.ok())
        .map(|e| {
            let bytes = if e.path().is_dir() {
                b"/".to_vec()
            } else {
                std::fs::read(e.path()).expect("read")
            };
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect()
}

/// Issue 53, defect 5: a start refused for damage leaves everything as it was, the torn
/// last write included (it is cut only by a start that goes on); a foreign directory is
/// refused before a lock file is made in it.
#[test]
fn a_refused_start_writes_nothing_not_even_the_lock_file() {
    let dir = Dir::new();
    let mut config = dir.config();
    let segment = one_task(&dir);
    // A record that does not decode, then a torn last write after it.
    append_undecodable_task(&segment);
    append(&segment, &[200, 0, 0, 0, 1, 2, 3, 4, 9, 9, 9]);
    // And a spare segment a crash left.
    std::fs::write(dir.0.join("log").join(super::prealloc::SPARE), b"spare").expect("spare");
    let before = snapshot(&dir.0.join("log"));
    let message = refusal(&config);
    assert!(message.contains("damaged record"), "{message}");
    assert_eq!(
        snapshot(&dir.0.join("log")),
        before,
        "every file left exactly as it was"
    );
    // Set aside on the operator's word, the start goes on: then the torn write and the
    // spare go.
    config.store.set_aside_damaged = true;
    let store = open(&config);
    close(store);
    assert!(!dir.0.join("log").join(super::prealloc::SPARE).exists());
    let bytes = std::fs::read(&segment).expect("segment");
    assert!(
        bytes[log_end(&bytes)..].iter().all(|b| *b == 0),
        "the torn write was cut off once the start went on"
    );

    // Someone else's directory: refused, and no LOCK left in it.
    let foreign = Dir::new();
    std::fs::create_dir_all(foreign.0.join("log")).expect("dir");
    std::fs::write(foreign.0.join("log/notes.txt"), "mine").expect("write");
    let before = snapshot(&foreign.0.join("log"));
    let message = refusal(&foreign.config());
    assert!(message.contains("did not write (notes.txt)"), "{message}");
    assert_eq!(snapshot(&foreign.0.join("log")), before, "no LOCK made");
}

/// Issue 53, defect 4: every file the log writes is private (0600), every directory it
/// makes 0700 — also inside a directory a service manager made 0755 — and an older
/// store's readable files are made private at the next start.
#[test]
fn the_logs_files_are_private_in_a_directory_open_to_all() {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    let dir = Dir::new();
    // Made by someone else, 0755: left so, its contents private.
    std::fs::create_dir_all(dir.0.join("log")).expect("dir");
    std::fs::set_permissions(dir.0.join("log"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let mut config = dir.config();
    // Small segments: the next ones are written in advance (the spare) and renamed.
    SEGMENT.with(|s| s.set(64 << 10));
    let store = open(&config);
    let mut n = 0;
    while dir.segments().len() < 3 {
        assert!(n < 10_000, "no third segment after {n} tasks");
        run_to_completion(&store, &key("alice", &format!("t-{n}")), "ctx");
        n += 1;
    }
    close(store);
    SEGMENT.with(|s| s.set(SEGMENT_BYTES));
    let files: Vec<PathBuf> = std::fs::read_dir(dir.0.join("log"))
        .expect("dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert!(files.len() >= 2, "LOCK and a segment: {files:?}");
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    assert_eq!(mode(&dir.0.join("log")), 0o755, "not ours to change");
    // A set-aside file of damaged records is private too.
    let segment = dir.segments().pop().expect("a segment");
    let older = dir.segments().first().cloned().expect("a segment");
    append_undecodable_task(&segment);
    config.store.set_aside_damaged = true;
    close(open(&config));
    let aside: Vec<PathBuf> = std::fs::read_dir(&dir.0)
        .expect("dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().contains("log.damaged-"))
        .collect();
    assert_eq!(aside.len(), 1);
    assert_eq!(mode(&aside[0]), 0o600);
    // Files an older a2ad left readable are made private by the next start.
    config.store.set_aside_damaged = false;
    std::fs::set_permissions(&older, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    close(open(&config));
    assert_eq!(mode(&older), 0o600);

    // Directories a2ad makes itself are 0700, each of them.
    let made = Dir::new();
    let nested = Config {
        store: StoreConfig::log(made.0.join("a/b/log").display().to_string()),
        ..Config::default()
    };
    close(open(&nested));
    for d in ["", "a", "a/b", "a/b/log"] {
        assert_eq!(mode(&made.0.join(d)), 0o700, "{d}");
    }
}

/// Issue 53, defect 2: churn through new conversations keeps the log bounded on disk. Each
/// finished task evicted from memory (`max_retained_bytes`) writes its conversation's turn
/// as a row of its own; the conversations are bounded in bytes (`max_context_bytes`), and
/// those forgotten take their rows with them, which compaction then reclaims. Before the
/// bound, every such row stayed for the retention (an hour): here 24 MB of them.
#[test]
fn churn_through_new_conversations_keeps_the_log_bounded_on_disk() {
    use crate::{AgentId, Message, Principal, Runtime, SendRequest};
    SEGMENT.with(|s| s.set(256 << 10));
    let dir = Dir::new();
    let mut config = dir.config();
    config.server.max_retained_bytes = 1 << 20;
    config.server.max_context_bytes = 1 << 20;
    let config = std::sync::Arc::new(config.validated().expect("valid"));
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let size = |dir: &Dir| -> u64 {
        std::fs::read_dir(dir.0.join("log"))
            .expect("dir")
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum()
    };
    let most = tokio.block_on(async {
        let runtime = Runtime::builder(config).start().await.expect("start");
        let (me, echo) = (Principal::new("alice"), AgentId::new("echo"));
        let text = "x".repeat(30_000);
        let mut most = 0;
        for i in 0..400 {
            let send = SendRequest::new(Message::user_text([text.as_str()]));
            let task = runtime
                .send(&me, &echo, send, Some(Duration::from_secs(30)))
                .await
                .expect("send");
            assert!(task.status.state.is_terminal(), "{i}");
            if i % 20 == 0 {
                most = most.max(size(&dir));
            }
        }
        runtime.shutdown(Duration::from_secs(10)).await;
        most
    });
    SEGMENT.with(|s| s.set(SEGMENT_BYTES));
    // Live: about 1 MiB of finished tasks and 1 MiB of conversations; the segments may
    // hold half as much again before compaction, plus the one being written and the
    // spare written in advance.
    assert!(
        most < 8 << 20,
        "the log grew to {most} bytes for 24 MB of churn"
    );
}

#[test]
fn each_tasks_last_write_in_a_batch_is_its_record_however_the_writes_interleave() {
    use crate::store::contract::{commit, event};
    let dir = Dir::new();
    let (a, b) = (key("alice", "a"), key("alice", "b"));
    let store = open(&dir.config());
    // One append: a's writes broken by b's, and a run of a's own at the end.
    commit(
        &store,
        vec![
            event(&a, "ctx", 1, TaskState::Submitted),
            event(&b, "ctx", 1, TaskState::Submitted),
            event(&a, "ctx", 2, TaskState::Working),
            event(&b, "ctx", 2, TaskState::Completed),
            event(&a, "ctx", 3, TaskState::Working),
            event(&a, "ctx", 4, TaskState::Completed),
        ],
    );
    let state = |s: &LocalStore, k| {
        block(s.task(k))
            .expect("read")
            .map(|t| (t.seq, t.status.state))
    };
    assert_eq!(state(&store, &a), Some((4, TaskState::Completed)));
    assert_eq!(state(&store, &b), Some((2, TaskState::Completed)));
    close(store);
    // And from the file, as a restart reads them.
    let store = open(&dir.config());
    assert_eq!(state(&store, &a), Some((4, TaskState::Completed)));
    assert_eq!(state(&store, &b), Some((2, TaskState::Completed)));
    let events = |k| block(store.events(k, 0)).expect("events").len();
    assert_eq!((events(&a), events(&b)), (4, 2), "every event kept");
    close(store);
}
