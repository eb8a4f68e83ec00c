//! The scheduling policies of the store's threads: the committer's (batch, or normal
//! around a small batch) and the spinner's (idle).

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
    /// (docs/decisions/the-committer-paces-the-request-path.md). Held while the committer waits for work.
    YieldToRequests,
    /// The normal policy, while a small batch (a light load) is written and synced: woken
    /// by the completion of its write or its flush, the committer runs at once, where under
    /// `SCHED_BATCH` it waited for the running thread's slice to end — beside a CPU-bound
    /// process on its core, a scheduler tick each time (one connection: 86 → ~2,900
    /// requests/s). Not for large batches: there the later wake-up lets the next batch
    /// grow, and taking the core at once cost 5–19% at 32–256 connections; and not while
    /// waiting for work, so that batches form as before — except after a batch of one
    /// append that left nothing waiting (one client at a time: no batch to form, and two
    /// switches a request saved; docs/decisions/the-committer-paces-the-request-path.md).
    Normal,
    /// `SCHED_IDLE`: only the time no other thread wants — the store's spinner
    /// (`spin.rs`), which keeps the core awake while a commit waits.
    Idle,
}

impl Policy {
    /// Batches of at most this many appends are a light load.
    pub(super) const LIGHT: usize = 4;
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
