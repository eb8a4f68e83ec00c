//! The scheduling policies of the store's threads: the committer's (batch, or normal
//! around a small batch) and the spinner's (idle).

use std::time::{Duration, Instant};

/// The scheduling policy of the store's threads (Linux; elsewhere nothing changes).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Policy {
    /// `SCHED_BATCH`: the same share of the CPU, but no wake-up preemption. Woken by the
    /// first append of a burst, a normal thread preempts the request path on a shared core
    /// and commits a batch of one or two tasks, and every commit costs an fdatasync (~100 µs
    /// of system CPU on the reference machine); under `SCHED_BATCH` it starts the batch
    /// once the request path pauses or its time slice ends, so batches grow with the load.
    /// Measured: send at 256 connections on one core, 16.1k → 22.6k requests/s, 8 → 126
    /// tasks per commit, p99 24.7 → 18.6 ms; at 32 connections unchanged
    /// (docs/PERFORMANCE.md). Held while the committer waits for work.
    YieldToRequests,
    /// The normal policy, while a small batch (a light load) is written and synced on a
    /// core shared with CPU-bound work ([`LightCommits`]): woken by the completion of its
    /// write or its flush, the committer runs at once, where under `SCHED_BATCH` it waited
    /// for the running thread's slice to end — beside a CPU-bound process on its core, a
    /// scheduler tick each time (one connection: 86 → ~2,900 requests/s). Not for large
    /// batches: there the later wake-up lets the next batch grow, and taking the core at
    /// once cost 5–19% at 32–256 connections; and not while waiting for work, so that
    /// batches form as before (docs/PERFORMANCE.md, fifth slice).
    Normal,
    /// `SCHED_IDLE`: only the time no other thread wants — the store's spinner
    /// (`spin.rs`), which keeps the core awake while a commit waits.
    Idle,
}

impl Policy {
    /// Batches of at most this many appends are a light load.
    pub(super) const LIGHT: usize = 4;
}

/// Whether a light batch is written and synced at the normal policy: only while its core
/// is seen shared with CPU-bound work. With nothing else to run there (the request path
/// parked, the spinner under `SCHED_IDLE`), a `SCHED_BATCH` committer is woken by its disk
/// as soon as a normal one is, and the two switches cost four system calls a commit — a
/// seventh of the committer's time at one connection (docs/PERFORMANCE.md, fifteenth
/// slice). A light commit that took [`LightCommits::SLOW`] under `SCHED_BATCH` is the sign:
/// its wake-ups waited for another thread's time slice. Light commits then switch for
/// [`LightCommits::HOLD`], after which one is tried at `SCHED_BATCH` again.
#[derive(Default)]
pub(super) struct LightCommits {
    /// Light commits switch to the normal policy until then.
    normal_until: Option<Instant>,
}

impl LightCommits {
    /// Far longer than a light commit takes on its disk (0.1–0.2 ms here; ~1.1 ms with a
    /// millisecond's flush), and shorter than the scheduler tick (4 ms here) a wake-up
    /// under `SCHED_BATCH` waits for beside a CPU-bound thread.
    pub(super) const SLOW: Duration = Duration::from_millis(2);
    /// How long light commits switch once one was slow.
    pub(super) const HOLD: Duration = Duration::from_secs(1);

    /// Whether a light commit starting `now` switches to the normal policy.
    pub(super) fn normal(&self, now: Instant) -> bool {
        self.normal_until.is_some_and(|until| now < until)
    }

    /// A light commit (at the normal policy or not) ended `now`, having taken `took`.
    pub(super) fn took(&mut self, took: Duration, normal: bool, now: Instant) {
        if !normal && took >= Self::SLOW {
            self.normal_until = Some(now + Self::HOLD);
        }
    }
}

/// Sets the calling thread's policy; false where the system refused (logged at its first
/// setting: the committer then keeps the policy it has, and the spinner does not spin).
pub(super) fn set_policy(policy: Policy) -> bool {
    #[cfg(target_os = "linux")]
    {
        use thread_priority::{
            NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
            set_thread_priority_and_policy, thread_native_id,
        };
        let normal = match policy {
            Policy::YieldToRequests => NormalThreadSchedulePolicy::Batch,
            Policy::Normal => NormalThreadSchedulePolicy::Other,
            Policy::Idle => NormalThreadSchedulePolicy::Idle,
        };
        match set_thread_priority_and_policy(
            thread_native_id(),
            // Niceness 0: the share of the CPU stays what it was.
            ThreadPriority::Os(Default::default()),
            ThreadSchedulePolicy::Normal(normal),
        ) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = ?e, "a store thread keeps its scheduling policy");
                false
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = policy;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn light_commits_switch_only_for_a_while_after_one_was_slow_at_the_batch_policy() {
        let t0 = Instant::now();
        let mut light = LightCommits::default();
        assert!(!light.normal(t0), "at first they stay at the batch policy");
        let fast = LightCommits::SLOW - Duration::from_micros(1);
        light.took(fast, false, t0);
        assert!(
            !light.normal(t0),
            "a commit as fast as a disk changes nothing"
        );
        light.took(LightCommits::SLOW, false, t0);
        assert!(light.normal(t0), "a slow one: the next switch");
        let before_end = t0 + LightCommits::HOLD - Duration::from_millis(1);
        assert!(light.normal(before_end));
        // A slow commit at the normal policy is the disk's own time: the hold is not
        // extended by it.
        light.took(Duration::from_millis(50), true, before_end);
        assert!(
            !light.normal(t0 + LightCommits::HOLD),
            "then tried at the batch policy"
        );
        light.took(
            Duration::from_millis(8),
            false,
            t0 + LightCommits::HOLD + Duration::from_millis(8),
        );
        assert!(
            light.normal(t0 + LightCommits::HOLD + Duration::from_millis(9)),
            "still shared: switching again"
        );
    }
}
