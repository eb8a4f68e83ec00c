//! Keeping the committer's core awake while a commit waits on its disk.
//!
//! A commit is a write and a flush, and the committer sleeps in the kernel through both.
//! When nothing else is left to run, its core goes idle — and on a virtual machine an
//! idle core is handed back to the hypervisor, which must schedule it again before the
//! disk's completion can wake the committer. On the reference machine (a Firecracker VM)
//! that costs ~20–25 µs per wait, twice a commit: the bare disk loop of `a2ad-load
//! --scenario disk` takes 0.20–0.21 ms a commit on an idle core and 0.15–0.16 ms beside a
//! thread that keeps the core busy (docs/decisions/a-core-kept-awake-during-a-commit.md). The guest
//! kernel's `cpuidle-haltpoll` does the same for every idle period; it is off here, so
//! the store does it for its own waits.
//!
//! The spinner is a thread under `SCHED_IDLE` that calls `sched_yield` in a loop: it runs
//! only when nothing else on its core wants to (a thread that wakes takes the core from it
//! at once, and one already runnable gets it at the next yield — a spin without yields,
//! picked by the fair scheduler for the sliver of the core `SCHED_IDLE` still gets, held it
//! for a time slice: send at 256 connections −4 to −16%). It spins only while a commit
//! waits, at most `store.sync_spin_us` per commit, and sleeps between commits. Where the
//! system refuses `SCHED_IDLE`, it does not spin at all: at the normal policy it would
//! compete with the request path for the core.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::policy::{Policy, set_policy};

/// The spin per commit: `store.sync_spin_us` when set; else the default, or none when the
/// process runs under a CPU quota (said once, at start-up). Under a quota — a container
/// with a CPU limit — the spinner's time is charged to the quota like any other, and the
/// throttling it brings stalls the request path far longer than the ~20 µs it saves a
/// commit.
pub(super) fn per_commit(configured: Option<u64>) -> Duration {
    if let Some(us) = configured {
        return Duration::from_micros(us);
    }
    match cpu_quota(Path::new("/")) {
        Some(quota) => {
            tracing::info!(
                quota = %quota,
                "store: the process runs under a CPU quota, so the committer does not spin while a commit waits (store.sync_spin_us = 0; set it to override)"
            );
            Duration::ZERO
        }
        None => Duration::from_micros(crate::config::StoreConfig::DEFAULT_SYNC_SPIN_US),
    }
}

/// The CPU quota this process runs under, as its cgroup file says it (`cpu.max` of cgroup
/// v2, `cpu.cfs_quota_us`/`cpu.cfs_period_us` of v1), on its cgroup or any above it;
/// `None` when there is none or it cannot be read. `root` is `/` (a test's directory in
/// the tests).
pub(super) fn cpu_quota(root: &Path) -> Option<String> {
    let listed = std::fs::read_to_string(root.join("proc/self/cgroup")).ok()?;
    let fs = root.join("sys/fs/cgroup");
    for line in listed.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            // v2: every controller under one hierarchy.
            if let Some(q) = up_from(&fs, path, |dir| v2_quota(&dir.join("cpu.max"))) {
                return Some(q);
            }
        } else if controllers.split(',').any(|c| c == "cpu") {
            // v1: the hierarchy is mounted under the controllers' names.
            for mount in [controllers.to_string(), "cpu".to_string()] {
                if let Some(q) = up_from(&fs.join(&mount), path, v1_quota) {
                    return Some(q);
                }
            }
        }
    }
    None
}

/// The first quota found from `base/path` up to `base` (inside a container, the cgroup
/// named may be mounted as `base` itself: that is looked at last).
fn up_from(base: &Path, path: &str, quota: impl Fn(&Path) -> Option<String>) -> Option<String> {
    let mut dir = base.join(path);
    loop {
        if let Some(q) = quota(&dir) {
            return Some(q);
        }
        if dir == base || !dir.pop() || !dir.starts_with(base) {
            return None;
        }
    }
}

/// `cpu.max`: `max 100000` is no quota; `50000 100000` is half a core.
fn v2_quota(file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    let mut fields = text.split_whitespace();
    let quota = fields.next()?;
    let period = fields.next().unwrap_or("100000");
    (quota != "max" && quota.parse::<u64>().is_ok()).then(|| format!("{quota}/{period} µs"))
}

/// `cpu.cfs_quota_us`: `-1` is no quota.
fn v1_quota(dir: &Path) -> Option<String> {
    let quota = std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).ok()?;
    let quota = quota.trim().parse::<i64>().ok().filter(|q| *q > 0)?;
    let period = std::fs::read_to_string(dir.join("cpu.cfs_period_us"))
        .ok()
        .and_then(|p| p.trim().parse::<u64>().ok())
        .unwrap_or(100_000);
    Some(format!("{quota}/{period} µs"))
}

/// The spinner of one committer.
pub(super) struct Spinner {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    /// Odd while a commit waits on the disk; each start and end adds one.
    wait: AtomicU64,
    /// Spinning now, and spins begun (for the tests).
    spinning: AtomicBool,
    spins: AtomicU64,
    stop: AtomicBool,
    most: Duration,
}

/// A commit waiting on the disk; the spinner stops when it is dropped.
pub(super) struct Waiting<'a>(&'a Spinner);

impl Spinner {
    /// Yields between two looks at the clock.
    const CHECK_EVERY: u32 = 8;

    /// A spinner that keeps the core awake at most `most` per commit (`None` for zero, or
    /// where no thread can be started: the committer then just waits, as before).
    pub(super) fn start(most: Duration) -> Option<Self> {
        Self::with_policy(most, true)
    }

    /// As [`Spinner::start`]; `idle`: under `SCHED_IDLE` (the tests spin at the normal
    /// policy, so that a busy test machine cannot starve them).
    fn with_policy(most: Duration, idle: bool) -> Option<Self> {
        if most.is_zero() {
            return None;
        }
        let shared = Arc::new(Shared {
            wait: AtomicU64::new(0),
            spinning: AtomicBool::new(false),
            spins: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            most,
        });
        let run = shared.clone();
        let thread = std::thread::Builder::new()
            .name("a2ad-store-spin".into())
            .spawn(move || {
                if !idle || set_policy(Policy::Idle) {
                    run.spin();
                }
            })
            .ok()?;
        Some(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// A commit begins to wait on the disk.
    pub(super) fn waiting(&self) -> Waiting<'_> {
        self.shared.wait.fetch_add(1, Ordering::Release);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
        Waiting(self)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.shared.wait.fetch_add(1, Ordering::Release);
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// The spinner's loop: asleep between waits, spinning through each (at most `most`).
    fn spin(&self) {
        while !self.stopped() {
            let wait = self.wait.load(Ordering::Acquire);
            if wait.is_multiple_of(2) {
                // No commit waits: sleep until one does (an unpark before this park makes
                // it return at once).
                std::thread::park();
                continue;
            }
            self.spinning.store(true, Ordering::Relaxed);
            self.spins.fetch_add(1, Ordering::Relaxed);
            let until = Instant::now() + self.most;
            let mut n = 0u32;
            while self.wait.load(Ordering::Relaxed) == wait && !self.stopped() {
                // Whatever else is runnable here runs first: `SCHED_IDLE` threads still get
                // a sliver of the core under the fair scheduler, and without the yield a
                // spinner picked for one would hold the core for a whole time slice.
                std::thread::yield_now();
                n = n.wrapping_add(1);
                if n.is_multiple_of(Spinner::CHECK_EVERY) && Instant::now() >= until {
                    break;
                }
            }
            self.spinning.store(false, Ordering::Relaxed);
            // This wait is over, or has taken longer than a spin is worth: sleep until the
            // next one begins.
            while self.wait.load(Ordering::Acquire) == wait && !self.stopped() {
                std::thread::park();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `f` up to a generous deadline.
    fn eventually(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A fake root: `/proc/self/cgroup` and the cgroup files given.
    fn root(name: &str, cgroup: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!(
            "a2ad-quota-{name}-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        std::fs::create_dir_all(root.join("proc/self")).expect("dir");
        std::fs::write(root.join("proc/self/cgroup"), cgroup).expect("write");
        for (path, text) in files {
            let path = root.join("sys/fs/cgroup").join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
            std::fs::write(path, text).expect("write");
        }
        root
    }

    #[test]
    fn a_cpu_quota_is_read_from_cgroup_v2_on_the_cgroup_or_above_it() {
        let r = root(
            "v2",
            "0::/kubepods/pod1/c1\n",
            &[
                ("kubepods/pod1/c1/cpu.max", "max 100000\n"),
                ("kubepods/pod1/cpu.max", "50000 100000\n"),
                ("cpu.max", "max 100000\n"),
            ],
        );
        assert_eq!(cpu_quota(&r).as_deref(), Some("50000/100000 µs"));
        let none = root(
            "v2none",
            "0::/user.slice\n",
            &[("user.slice/cpu.max", "max 100000\n")],
        );
        assert_eq!(cpu_quota(&none), None);
        // Inside a container the cgroup is mounted as the root itself.
        let inside = root("v2ns", "0::/\n", &[("cpu.max", "200000 100000\n")]);
        assert_eq!(cpu_quota(&inside).as_deref(), Some("200000/100000 µs"));
        for dir in [r, none, inside] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn a_cpu_quota_is_read_from_cgroup_v1() {
        let r = root(
            "v1",
            "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n",
            &[
                ("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "150000\n"),
                ("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n"),
            ],
        );
        assert_eq!(cpu_quota(&r).as_deref(), Some("150000/100000 µs"));
        let unlimited = root(
            "v1none",
            "4:cpu,cpuacct:/\n",
            &[("cpu,cpuacct/cpu.cfs_quota_us", "-1\n")],
        );
        assert_eq!(cpu_quota(&unlimited), None);
        for dir in [r, unlimited] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn a_configured_spin_is_kept_whatever_the_quota() {
        assert_eq!(per_commit(Some(0)), Duration::ZERO);
        assert_eq!(per_commit(Some(250)), Duration::from_micros(250));
        // Unset: the default, or none under this machine's own quota.
        let expected = if cpu_quota(Path::new("/")).is_some() {
            0
        } else {
            1000
        };
        assert_eq!(per_commit(None), Duration::from_micros(expected));
    }

    #[test]
    fn zero_means_no_spinner() {
        assert!(Spinner::start(Duration::ZERO).is_none());
    }

    #[test]
    fn it_spins_while_a_commit_waits_and_stops_when_the_wait_ends() {
        let s = Spinner::with_policy(Duration::from_secs(60), false).expect("started");
        let shared = s.shared.clone();
        assert!(!shared.spinning.load(Ordering::Relaxed));
        let w = s.waiting();
        eventually("spinning during the wait", || {
            shared.spinning.load(Ordering::Relaxed)
        });
        drop(w);
        eventually("asleep after it", || {
            !shared.spinning.load(Ordering::Relaxed)
        });
        // The next wait wakes it again.
        let w = s.waiting();
        eventually("spinning during the next wait", || {
            shared.spinning.load(Ordering::Relaxed)
        });
        drop(w);
        drop(s);
        assert!(!shared.spinning.load(Ordering::Relaxed), "joined");
    }

    #[test]
    fn a_wait_longer_than_the_bound_ends_the_spin_before_the_wait_ends() {
        let s = Spinner::with_policy(Duration::from_millis(20), false).expect("started");
        let shared = s.shared.clone();
        let spins = || shared.spins.load(Ordering::Relaxed);
        let w = s.waiting();
        // Begun, and past the bound ended, while the wait goes on.
        eventually("a spin ended at the bound", || {
            spins() == 1 && !shared.spinning.load(Ordering::Relaxed)
        });
        assert!(
            shared.wait.load(Ordering::Relaxed) % 2 == 1,
            "the wait goes on"
        );
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(spins(), 1, "no second spin within the same wait");
        drop(w);
        // A new wait spins again.
        let _w = s.waiting();
        eventually("a spin for the next wait", || spins() == 2);
    }

    #[test]
    fn dropping_it_mid_wait_stops_the_thread() {
        let s = Spinner::with_policy(Duration::from_secs(60), false).expect("started");
        let shared = s.shared.clone();
        let w = s.waiting();
        eventually("spinning", || shared.spinning.load(Ordering::Relaxed));
        // `Waiting` borrows the spinner; end the wait's borrow without ending the wait.
        std::mem::forget(w);
        drop(s);
        assert!(!shared.spinning.load(Ordering::Relaxed));
        assert!(shared.stopped());
    }
}
