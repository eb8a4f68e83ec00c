//! Keeping the committer's core awake while a commit waits on its disk.
//!
//! A commit is a write and a flush, and the committer sleeps in the kernel through both.
//! When nothing else is left to run, its core goes idle — and on a virtual machine an
//! idle core is handed back to the hypervisor, which must schedule it again before the
//! disk's completion can wake the committer. On the reference machine (a Firecracker VM)
//! that costs ~20–25 µs per wait, twice a commit: the bare disk loop of `a2ad-load
//! --scenario disk` takes 0.20–0.21 ms a commit on an idle core and 0.15–0.16 ms beside a
//! thread that keeps the core busy (docs/PERFORMANCE.md, eleventh slice). The guest
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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::policy::{Policy, set_policy};

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
