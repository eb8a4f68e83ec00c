//! The committer thread: batches of writes, one durable commit (one fdatasync) per batch,
//! the indexes and continuations after; retries (reopening the file) while the disk fails.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use super::carriers::Carriers;
use super::policy::{Policy, set_policy};
use super::{Counters, Disk, FORGET_CHUNK, Job};
use crate::store::codec;
use crate::store::index::{Evicted, Indexes};
use crate::store::{CarriedTurn, Committed, Then, TurnId, Write};

/// Past this many waiting appends the request path never yields to the committer.
const MAX_YIELD_AT: u64 = 1024;

pub(super) struct Committer {
    pub(super) disk: Arc<dyn Disk>,
    pub(super) indexes: Arc<Indexes>,
    pub(super) rx: Receiver<Job>,
    pub(super) counters: Arc<Counters>,
    pub(super) max_batch: usize,
    /// Evicted tasks whose rows are still to delete, in chunks between batches (taken
    /// from the front: a mass eviction costs what it deletes, not a move of the rest per
    /// chunk).
    pub(super) forget: VecDeque<Evicted>,
    /// The disk has upkeep left to do between batches.
    pub(super) more: bool,
    /// Tombstones of forgotten conversations, dropped in time between batches.
    pub(super) tombstones: Tombstones,
    /// Where the continuations of a durable batch run.
    pub(super) handoff: Handoff,
    /// Keeps this thread's core awake while a commit waits on the disk (`None`: off).
    pub(super) spinner: Option<super::spin::Spinner>,
    /// An empty batch whose vectors keep the room the last one needed.
    pub(super) spare: Batch,
}

/// The continuations of one durable batch, in append order.
type Ready = Vec<(Then, Committed)>;

/// Where a durable batch's continuations run. A continuation casts to a task actor; cast
/// from this thread, each wakes its actor through the runtime's shared queue (a lock, and
/// an unpark when the runtime idles). Handed to one task of the request runtime a batch at
/// a time, they wake their actors through that worker's own queue: one cross-thread wake
/// per batch instead of one per append (docs/decisions/one-wake-per-batch.md).
pub(super) enum Handoff {
    /// Run here, on the committer thread: no multi-threaded tokio runtime was running when
    /// the store opened (unit tests, an embedder's own threads).
    Here,
    /// One task of the runtime that opened the store runs them, batch after batch in
    /// commit order (so a task's deliveries stay in event order). The channel's bound
    /// holds the committer back when that task falls behind.
    Runtime(tokio::sync::mpsc::Sender<Ready>),
}

impl Handoff {
    /// Batches the committer may hand over before it waits for the runtime.
    const BOUND: usize = 64;

    /// The runtime of the calling thread, when it is a multi-threaded tokio runtime (a
    /// current-thread runtime runs the task only while its one thread awaits, which a
    /// caller blocked on its store would never do); else [`Handoff::Here`].
    pub(super) fn current() -> Self {
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current() {
            Ok(rt) if rt.runtime_flavor() == RuntimeFlavor::MultiThread => {
                let (tx, mut rx) = tokio::sync::mpsc::channel::<Ready>(Self::BOUND);
                rt.spawn(async move {
                    while let Some(ready) = rx.recv().await {
                        run_here(ready);
                    }
                });
                Self::Runtime(tx)
            }
            _ => Self::Here,
        }
    }

    /// Runs `ready` where this handoff says: here when the runtime's task is gone (the
    /// runtime shut down — the actors they would wake are gone with it).
    fn run(&self, ready: Ready) {
        match self {
            Self::Here => run_here(ready),
            Self::Runtime(tx) => {
                if let Err(back) = tx.blocking_send(ready) {
                    run_here(back.0);
                }
            }
        }
    }
}

/// Runs a batch's continuations on the calling thread, in order.
fn run_here(ready: Ready) {
    for (then, committed) in ready {
        then(committed);
    }
}

/// The tombstones of forgotten conversations (`tables::apply`), oldest first, with when
/// each may go. One is wanted while a task's record that carries a turn of its
/// conversation is still in the file: the committer counts those ([`Carriers`]), and a
/// tombstone whose conversation has none left may go. Whatever the count says, none is
/// kept past twice the retention and a minute (the conversation was forgotten after all
/// its tasks had finished, so its records are evicted within the retention; the rest is
/// room for an eviction that runs late). At most `max` are kept (the retained records
/// that could need them), the oldest going first past that. Those that may go go
/// [`FORGET_CHUNK`] to a frame, or once the oldest has waited [`Tombstones::GRACE`] for
/// company: dropping them costs a commit, not one per tombstone.
pub(super) struct Tombstones {
    queue: VecDeque<Tombstone>,
    life: Duration,
    max: usize,
    /// The records in the file that carry a turn, by conversation.
    pub(super) carriers: Carriers,
}

struct Tombstone {
    /// When it goes whatever its conversation's records.
    expires: Instant,
    key: Vec<u8>,
    /// Its conversation's hash ([`Carriers`]); `None`: it goes only in time.
    conversation: Option<u64>,
}

impl Tombstones {
    /// How long a tombstone that may go waits for others to go with it.
    const GRACE: Duration = Duration::from_secs(10);

    /// None yet; each lives at most twice `retention` and a minute more, at most `max` of
    /// them.
    pub(super) fn new(retention: Duration, max: usize, carriers: Carriers) -> Self {
        Self {
            queue: VecDeque::new(),
            life: Self::life(retention),
            max: max.max(1),
            carriers,
        }
    }

    /// How long a tombstone is kept at most.
    pub(super) fn life(retention: Duration) -> Duration {
        retention
            .saturating_mul(2)
            .saturating_add(Duration::from_secs(60))
    }

    /// A tombstone written `age` ago.
    pub(super) fn add(&mut self, key: Vec<u8>, age: Duration) {
        let now = Instant::now();
        let expires = now
            .checked_add(self.life.saturating_sub(age))
            .unwrap_or(now + Duration::from_secs(1 << 30));
        let conversation = codec::parse_turn_key(&key).map(|(principal, context, turn)| {
            self.carriers.conversation(&principal, &context, turn.since)
        });
        self.queue.push_back(Tombstone {
            expires,
            key,
            conversation,
        });
    }

    /// Tombstones whose removal failed: tried again in a second.
    fn retry(&mut self, keys: Vec<Vec<u8>>) {
        let at = Instant::now() + Duration::from_secs(1);
        for key in keys.into_iter().rev() {
            self.queue.push_front(Tombstone {
                expires: at,
                key,
                conversation: None,
            });
        }
    }

    /// Whether no record of `t`'s conversation is left in the file.
    fn released(&self, t: &Tombstone) -> bool {
        t.conversation.is_some_and(|c| !self.carriers.holds(c))
    }

    /// Whether `t` is no longer wanted: past its time, or released.
    fn ripe(&self, t: &Tombstone, now: Instant) -> bool {
        t.expires <= now || self.released(t)
    }

    /// When `t` goes, if no others go with it first: its grace after its time, or after
    /// it was written once it is released.
    fn goes(&self, t: &Tombstone) -> Instant {
        let from = if self.released(t) {
            t.expires.checked_sub(self.life).unwrap_or(t.expires)
        } else {
            t.expires
        };
        from + Self::GRACE
    }

    /// When the oldest goes, if nothing else comes first.
    fn next(&self) -> Option<Instant> {
        self.queue.front().map(|t| self.goes(t))
    }

    /// Up to `n` that may go now (no longer wanted, or over the cap) — if there are `n`
    /// of them, the oldest has waited its grace, or the cap is exceeded; else none.
    fn due(&mut self, now: Instant, n: usize) -> Vec<Vec<u8>> {
        let ripe = |i: usize| self.queue.get(i).is_some_and(|t| self.ripe(t, now));
        let waited = self
            .queue
            .front()
            .is_some_and(|t| self.ripe(t, now) && self.goes(t) <= now);
        if !(self.queue.len() > self.max || waited || ripe(n.saturating_sub(1))) {
            return Vec::new();
        }
        let mut out = Vec::new();
        while out.len() < n {
            match self.queue.front() {
                Some(t) if self.ripe(t, now) || self.queue.len() > self.max => {}
                _ => break,
            }
            if let Some(t) = self.queue.pop_front() {
                out.push(t.key);
            }
        }
        if self.queue.capacity() > 1024 && self.queue.len() < self.queue.capacity() / 4 {
            self.queue.shrink_to_fit();
        }
        out
    }
}

/// What one batch writes, collected before the transaction so repeated records of one
/// task are written once.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) appends: Vec<(usize, Option<Then>)>,
    pub(super) writes: Vec<Write>,
    pub(super) writes_count: u64,
}

impl Batch {
    /// The most writes whose room a batch keeps for the next.
    const KEPT: usize = 1024;
}

impl Committer {
    pub(super) fn run(mut self) {
        let adapt = set_policy(Policy::YieldToRequests);
        // The policy this thread is at, when it may change it (`adapt`).
        let mut at = Policy::YieldToRequests;
        let mut switch = |to: Policy| {
            if adapt && at != to {
                set_policy(to);
                at = to;
            }
        };
        loop {
            if self.counters.abandon.load(Relaxed) {
                return;
            }
            let idle = self.forget.is_empty() && !self.more;
            let first = if let (true, Some(at)) = (idle, self.tombstones.next()) {
                // Nothing else to do: wait for work until the oldest tombstone may go.
                match self
                    .rx
                    .recv_timeout(at.saturating_duration_since(Instant::now()))
                {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => {
                        self.between();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else if idle {
                match self.rx.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            } else {
                match self.rx.recv_timeout(Duration::from_millis(1)) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => {
                        self.between();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            };
            // The vectors of the last batch, kept for their room.
            let mut batch = std::mem::take(&mut self.spare);
            let mut tasks = 0usize;
            let mut next = Some(first);
            while let Some(job) = next.take() {
                self.counters.queued.fetch_sub(1, Relaxed);
                match job {
                    Job::Append(writes, then) => {
                        tasks += writes
                            .iter()
                            .filter(|w| matches!(w, Write::Task { .. }))
                            .count();
                        batch.writes_count += writes.len() as u64;
                        batch.appends.push((writes.len(), then));
                        batch.writes.extend(writes);
                    }
                    Job::Forget(keys) => self.forget.extend(keys),
                }
                if tasks < self.max_batch {
                    match self.rx.try_recv() {
                        Ok(job) => next = Some(job),
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
                    }
                }
            }
            if !batch.appends.is_empty() {
                // A small batch waits on its disk at the normal policy (see `Policy`).
                let appends = batch.appends.len();
                switch(commit_policy(appends));
                let committed = self.commit(&mut batch);
                self.spare = batch;
                switch(waiting_policy(appends, self.counters.queued.load(Relaxed)));
                if !committed {
                    return;
                }
            }
            self.between();
        }
        // Disconnected: everything queued has been committed above.
        while !self.forget.is_empty() && !self.counters.abandon.load(Relaxed) {
            self.forget_chunk();
        }
    }

    /// Writes one batch, retrying until the file takes it; then publishes it. A failed
    /// commit leaves redb's handle unusable (it latches the I/O error), so each retry
    /// reopens the file first: once the disk has room again, the same writes go in.
    /// Returns false when shutdown gave up on it (nothing of the batch was acknowledged).
    pub(super) fn commit(&mut self, batch: &mut Batch) -> bool {
        let mut pause = Duration::from_millis(100);
        let mut failure: Option<Failure> = None;
        let parks = super::PARKS.load(Relaxed);
        let started = std::time::Instant::now();
        let applied = loop {
            let waiting = self.spinner.as_ref().map(super::spin::Spinner::waiting);
            let carriers = &self.tombstones.carriers;
            let carried =
                |principal: &_, context: &_, since| carriers.carried(principal, context, since);
            let result = self.disk.commit(&batch.writes, &self.indexes, &carried);
            drop(waiting);
            match result {
                Ok(a) => break a,
                Err(e) => {
                    self.counters.failing.store(true, Relaxed);
                    Failure::note(
                        &mut failure,
                        &e.to_string(),
                        self.counters.pending.load(Relaxed),
                    );
                    if !self.pause(pause) {
                        return false;
                    }
                    pause = (pause * 2).min(Duration::from_secs(5));
                    if let Err(e) = self.disk.reopen() {
                        Failure::note(
                            &mut failure,
                            &format!("reopening the file: {e}"),
                            self.counters.pending.load(Relaxed),
                        );
                    }
                }
            }
        };
        if let Some(f) = failure {
            tracing::warn!(
                failing_for_s = f.since.elapsed().as_secs(),
                "store commits succeed again"
            );
        }
        self.pace(
            batch.appends.len() as u64,
            super::PARKS.load(Relaxed) != parks,
        );
        self.counters.failing.store(false, Relaxed);
        self.counters.commits.fetch_add(1, Relaxed);
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.counters.commit_micros.fetch_add(took, Relaxed);
        self.counters
            .committed
            .fetch_add(batch.writes_count, Relaxed);
        self.counters.pending.fetch_sub(batch.writes_count, Relaxed);
        // Visible to readers only now that it is durable; a task's earlier records in the
        // batch were never visible, and are not put only to be replaced.
        for ((w, last), carries) in batch.writes.iter().zip(&applied.last).zip(&applied.carries) {
            if let (
                Write::Task {
                    key, task, turn, ..
                },
                true,
            ) = (w, last)
            {
                // The turn the record carries, which its eviction writes as a row.
                let carried = if *carries { *turn } else { TurnId::default() };
                if CarriedTurn::carries(carried, task) {
                    let carriers = &mut self.tombstones.carriers;
                    carriers.add(&key.principal, &task.context_id, carried.since);
                }
                let evicted = self.indexes.put_task(key, task.clone(), carried);
                self.forget.extend(evicted);
            }
        }
        batch.writes.clear();
        batch.writes_count = 0;
        if batch.writes.capacity() > Batch::KEPT {
            // A burst's room is not kept.
            batch.writes = Vec::new();
        }
        for key in applied.tombstones {
            self.tombstones.add(key, Duration::ZERO);
        }
        let mut deliveries = applied.planned.into_iter().peekable();
        let mut end = 0;
        let mut ready = Ready::with_capacity(batch.appends.len());
        for (count, then) in batch.appends.drain(..) {
            end += count;
            let mut mine = Vec::new();
            while let Some((_, d)) = deliveries.next_if(|(i, _)| *i < end) {
                mine.push(d);
            }
            if let Some(then) = then {
                ready.push((then, Committed { deliveries: mine }));
            }
        }
        if batch.appends.capacity() > Batch::KEPT {
            batch.appends = Vec::new();
        }
        if !ready.is_empty() {
            self.handoff.run(ready);
        }
        true
    }

    /// Paces the request path after a commit of `appends` (see [`next_yield_at`]).
    fn pace(&self, appends: u64, dry: bool) {
        let at = &self.counters.yield_at;
        at.store(next_yield_at(at.load(Relaxed), appends, dry), Relaxed);
    }

    /// Sleeps `d`, waking early (false) when shutdown gives up on the committer.
    pub(super) fn pause(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        while Instant::now() < until {
            if self.counters.abandon.load(Relaxed) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
        }
        !self.counters.abandon.load(Relaxed)
    }

    /// Between batches: one chunk of retention deletes, then one step of the disk's own
    /// upkeep (the log's compaction).
    fn between(&mut self) {
        if !self.forget.is_empty() {
            self.forget_chunk();
        }
        let due = self.tombstones.due(Instant::now(), FORGET_CHUNK);
        if !due.is_empty() {
            let removed = self.disk.write(&mut |t| {
                for key in &due {
                    t.remove(super::tables::Table::Turns, key)?;
                }
                Ok(())
            });
            if let Err(e) = removed {
                tracing::error!(error = %e, "store: dropping tombstones failed; retried later");
                self.tombstones.retry(due);
            }
        }
        self.more = match self.disk.maintain() {
            Ok(more) => more,
            Err(e) => {
                tracing::error!(error = %e, "store: compaction failed; retried later");
                false
            }
        };
    }

    /// Deletes one chunk of evicted tasks.
    pub(super) fn forget_chunk(&mut self) {
        let n = self.forget.len().min(FORGET_CHUNK);
        let chunk: Vec<Evicted> = self.forget.drain(..n).collect();
        match self.disk.forget(&chunk) {
            Ok(()) => self.tombstones.carriers.deleted(&chunk),
            Err(e) => {
                tracing::error!(error = %e, tasks = chunk.len(), "store: deleting expired tasks failed; retried later");
                self.forget.extend(chunk);
            }
        }
        // A burst's evictions leave no room behind once deleted.
        if self.forget.capacity() > 4 * FORGET_CHUNK
            && self.forget.len() < self.forget.capacity() / 4
        {
            self.forget.shrink_to_fit();
        }
    }
}

/// The policy a batch of `appends` appends is written and synced at: a small batch at the
/// normal policy (see [`Policy`]).
fn commit_policy(appends: usize) -> Policy {
    if appends <= Policy::LIGHT {
        Policy::Normal
    } else {
        Policy::YieldToRequests
    }
}

/// The policy the committer waits for work at, after a batch of `appends` appends that
/// left `queued` jobs waiting. It yields to requests, so that batches form — unless the
/// batch was one append and nothing came while it was written and synced: one client at a
/// time, whose next append has no batch to join; it then waits at the normal policy, and
/// such a request costs no switch (two system calls each way). A batch of several that
/// left nothing waiting (every client in it, waiting for its answer) still waits to
/// yield, or the next append would start a batch alone (measured: c=4 −4%).
fn waiting_policy(appends: usize, queued: u64) -> Policy {
    if appends == 1 && queued == 0 {
        Policy::Normal
    } else {
        Policy::YieldToRequests
    }
}

/// How many waiting appends make the request path yield the core to the committer (the
/// append that brings the queue to it, and to each multiple of it), after
/// a commit of `appends` that the request runtime ran dry during (`dry`: one of its threads
/// parked while the commit was written and synced) or not. The committer starts a batch
/// when the request path pauses (below), so a batch carries nearly every client, and
/// while it syncs nothing is left to run: at 32 connections on one core, 14% of the core
/// idle. After a dry commit the next starts once half as many appends wait — the rest
/// still to run while it syncs; after one that was not dry the threshold doubles, and past
/// [`MAX_YIELD_AT`] it is off (large batches are cheaper per task, and where the core
/// stays busy they cost no idle). `u64::MAX`: off, as at the start and for an embedder
/// whose runtime does not report its parks ([`runtime_parked`](super::runtime_parked)).
fn next_yield_at(now: u64, appends: u64, dry: bool) -> u64 {
    if dry {
        (appends / 2).max(2)
    } else if now == u64::MAX || now.saturating_mul(2) > MAX_YIELD_AT {
        u64::MAX
    } else {
        now * 2
    }
}

/// Whether the append that brings the queue to `queued` yields the core, under the
/// threshold `at` ([`next_yield_at`]; never 0): at `at` and at each multiple of it.
pub(super) fn yields(queued: u64, at: u64) -> bool {
    queued >= at && queued.is_multiple_of(at)
}

/// A streak of failed commits, for the log: an error is logged when it first appears, when
/// it changes, and every [`Failure::EVERY`] while it lasts.
pub(super) struct Failure {
    pub(super) since: Instant,
    pub(super) logged: Instant,
    pub(super) last: String,
}

impl Failure {
    const EVERY: Duration = Duration::from_secs(30);

    pub(super) fn note(streak: &mut Option<Self>, error: &str, waiting: u64) {
        let now = Instant::now();
        match streak {
            None => {
                tracing::error!(
                    error,
                    waiting_writes = waiting,
                    "store commit failed; retrying (nothing is acknowledged until it succeeds)"
                );
                *streak = Some(Self {
                    since: now,
                    logged: now,
                    last: error.to_string(),
                });
            }
            Some(f) if f.last != error || now.duration_since(f.logged) >= Self::EVERY => {
                tracing::error!(
                    error,
                    waiting_writes = waiting,
                    failing_for_s = f.since.elapsed().as_secs(),
                    "store commits still failing; retrying"
                );
                f.logged = now;
                error.clone_into(&mut f.last);
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use std::sync::Arc;

    use super::{
        Carriers, Policy, Tombstones, commit_policy, next_yield_at, waiting_policy, yields,
    };
    use crate::model::{AgentId, ContextId, Message, Principal, TaskId, TaskKey};
    use crate::store::codec;
    use crate::store::index::Evicted;
    use crate::store::{CarriedTurn, TurnId};

    #[test]
    fn the_committer_waits_at_the_normal_policy_only_after_a_lone_append() {
        assert!(
            commit_policy(1) == Policy::Normal && commit_policy(Policy::LIGHT) == Policy::Normal
        );
        assert!(commit_policy(Policy::LIGHT + 1) == Policy::YieldToRequests);
        // One client at a time: its next append finds the committer ready.
        assert!(waiting_policy(1, 0) == Policy::Normal);
        // Others waiting, or a batch of several: batches are to form.
        assert!(waiting_policy(1, 1) == Policy::YieldToRequests);
        assert!(waiting_policy(2, 0) == Policy::YieldToRequests);
        assert!(waiting_policy(Policy::LIGHT + 1, 0) == Policy::YieldToRequests);
    }

    #[test]
    fn an_append_yields_where_the_queue_reaches_the_threshold_or_a_multiple_of_it() {
        let at = 4;
        let yielding: Vec<u64> = (1..=13).filter(|&q| yields(q, at)).collect();
        assert_eq!(yielding, vec![4, 8, 12]);
        assert!(!yields(u64::MAX - 1, u64::MAX), "off");
        assert!(yields(2, 2) && !yields(3, 2));
    }

    #[test]
    fn tombstones_go_oldest_first_when_their_time_is_up_or_past_the_cap() {
        let retention = Duration::from_secs(10);
        let life = Tombstones::life(retention);
        assert_eq!(
            life,
            Duration::from_secs(80),
            "twice the retention and a minute"
        );
        let mut t = Tombstones::new(retention, 3, Carriers::default());
        // Written 70 s ago, 5 s ago, now.
        t.add(b"a".to_vec(), Duration::from_secs(70));
        t.add(b"b".to_vec(), Duration::from_secs(5));
        t.add(b"c".to_vec(), Duration::ZERO);
        let now = Instant::now();
        assert!(t.due(now, 10).is_empty(), "none is due yet");
        let grace = Tombstones::GRACE;
        assert!(
            t.due(now + Duration::from_secs(11), 10).is_empty(),
            "one past its time waits for company"
        );
        assert_eq!(
            t.due(now + Duration::from_secs(11), 1),
            vec![b"a".to_vec()],
            "a chunk's worth goes at once"
        );
        // Past the cap, the oldest goes at once, at most `n` at a time.
        t.add(b"d".to_vec(), Duration::ZERO);
        t.add(b"e".to_vec(), Duration::ZERO);
        assert_eq!(t.due(now, 1), vec![b"b".to_vec()]);
        assert!(t.due(now, 10).is_empty(), "three left: at the cap");
        assert_eq!(t.next(), Some(t.queue[0].expires + grace));
        // Past their time and past the grace: all that are due, at most `n` at a time.
        let late = now + life + grace + Duration::from_secs(1);
        assert_eq!(t.due(late, 2), vec![b"c".to_vec(), b"d".to_vec()]);
        assert_eq!(t.due(late, 10), vec![b"e".to_vec()]);
        // A removal that failed is tried again a second later (and its grace), before
        // the rest.
        t.retry(vec![b"f".to_vec()]);
        assert!(t.due(Instant::now(), 10).is_empty());
        assert_eq!(
            t.due(Instant::now() + grace + Duration::from_secs(2), 10),
            vec![b"f".to_vec()]
        );
    }

    #[test]
    fn a_tombstone_goes_once_no_record_carrying_its_conversation_is_left_in_the_file() {
        // An hour's retention: by time alone, none would go for two hours.
        let mut t = Tombstones::new(Duration::from_secs(3600), 100, Carriers::default());
        let p = Principal::new("p");
        let key = |c: &str| codec::tombstone_key(&p, &ContextId::new(c), 7);
        let a = t.carriers.conversation(&p, &ContextId::new("a"), 7);
        // Two records carry turns of "a"; none carries one of "b".
        t.carriers.add(&p, &ContextId::new("a"), 7);
        t.carriers.add(&p, &ContextId::new("a"), 7);
        t.add(key("a"), Duration::ZERO);
        t.add(key("b"), Duration::ZERO);
        let now = Instant::now();
        let after_grace = now + Tombstones::GRACE + Duration::from_secs(1);
        assert!(
            t.due(after_grace, 10).is_empty(),
            "a's records are in the file; b, no longer wanted, goes in order behind it"
        );
        let evicted = |task: &str| Evicted {
            key: TaskKey {
                principal: p.clone(),
                agent: AgentId::new("echo"),
                task: TaskId::new(task),
            },
            created: 1,
            turn: Some(CarriedTurn {
                turn: TurnId {
                    number: 1,
                    since: 7,
                },
                context: ContextId::new("a"),
                user: Arc::new(Message::user_text(["hi"])),
                reply: None,
            }),
        };
        t.carriers.deleted(&[evicted("1")]);
        assert!(
            t.due(after_grace, 10).is_empty(),
            "one record of a is still in the file"
        );
        t.carriers.deleted(&[evicted("2")]);
        assert!(!t.carriers.holds(a));
        assert!(
            t.due(now, 10).is_empty(),
            "ten may go at once; two wait their grace for company"
        );
        assert!(t.next().is_some_and(|at| at <= after_grace));
        assert_eq!(t.due(after_grace, 10), vec![key("a"), key("b")]);
        assert_eq!(t.next(), None);
    }

    #[test]
    fn a_dry_commit_starts_the_next_earlier_and_busy_ones_let_batches_grow_until_off() {
        // Off until a commit finds the request path idle.
        assert_eq!(next_yield_at(u64::MAX, 30, false), u64::MAX);
        assert_eq!(next_yield_at(u64::MAX, 30, true), 15);
        // Never below two: one waiting append is the committer's ordinary wake-up.
        assert_eq!(next_yield_at(15, 1, true), 2);
        // Busy commits double it, and past the ceiling it is off again.
        let mut at = 2;
        let mut steps = 0;
        while at != u64::MAX {
            at = next_yield_at(at, 100, false);
            steps += 1;
            assert!(steps < 20, "it ends");
        }
        assert_eq!(steps, 10, "2 → 1024 in nine doublings, then off");
    }
}
