//! Admission limits: the per-principal request rate (token bucket) and each agent's task
//! slots with their FIFO queue.
//!
//! Both are plain data behind short `std` mutexes that are never held across an await,
//! so they can be checked at the HTTP edge before any actor sees the request.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio::sync::oneshot;

use crate::auth::Caller;
use crate::error::Error;
use crate::model::Principal;

/// One token bucket per (principal, agent).
pub(crate) struct RateLimiter {
    buckets: Vec<Mutex<Bucket>>,
    agents: usize,
    /// Per agent: (capacity = requests per minute, refill per second).
    rates: Vec<(f64, f64)>,
    /// The buckets of principals not configured in advance (tokens' subjects), made on
    /// their first request. A bucket refills completely in a minute, so one idle for a
    /// minute is full and can be forgotten without changing any answer: that is how the
    /// table stays bounded.
    dynamic: DashMap<Principal, Box<[Mutex<Bucket>]>>,
}

/// Principals with buckets of their own beyond the configured ones, at most; past it
/// (after forgetting the full ones) the newcomers share [`OVERFLOW`]'s buckets.
const MAX_DYNAMIC: usize = 100_000;
const OVERFLOW: &str = "\u{0}overflow";

struct Bucket {
    tokens: f64,
    last: Instant,
    /// Requests let through since start (shared with the other nodes of a cluster).
    accepted: u64,
}

impl RateLimiter {
    /// Buckets for `principals` × the agents' per-minute rates, all full.
    pub(crate) fn new(principals: usize, per_minute: &[u64]) -> Self {
        let rates: Vec<(f64, f64)> = per_minute
            .iter()
            .map(|&n| (n as f64, n as f64 / 60.0))
            .collect();
        let now = Instant::now();
        let buckets = (0..principals * rates.len())
            .map(|i| {
                Mutex::new(Bucket {
                    tokens: rates[i % rates.len()].0,
                    last: now,
                    accepted: 0,
                })
            })
            .collect();
        Self {
            buckets,
            agents: rates.len(),
            rates,
            dynamic: DashMap::new(),
        }
    }

    /// Takes one token from the caller's bucket for the agent, or says how many whole
    /// seconds until one is available.
    ///
    /// # Errors
    /// The `Retry-After` seconds (at least 1) when the bucket is empty.
    pub(crate) fn try_acquire(&self, caller: &Caller, agent: usize) -> Result<(), u64> {
        match caller.principal_index {
            Some(principal) => match self.buckets.get(principal * self.agents + agent) {
                Some(bucket) => self.take(bucket, agent),
                None => Ok(()),
            },
            None => self.try_acquire_dynamic(&caller.principal, agent),
        }
    }

    fn try_acquire_dynamic(&self, principal: &Principal, agent: usize) -> Result<(), u64> {
        if agent >= self.agents {
            return Ok(());
        }
        if let Some(buckets) = self.dynamic.get(principal) {
            return self.take(&buckets[agent], agent);
        }
        let mut key = principal.clone();
        if self.dynamic.len() >= MAX_DYNAMIC {
            let now = Instant::now();
            self.dynamic.retain(|_, buckets| {
                buckets
                    .iter()
                    .any(|b| now.duration_since(lock(b).last) < Duration::from_secs(61))
            });
            if self.dynamic.len() >= MAX_DYNAMIC {
                key = Principal::new(OVERFLOW);
            }
        }
        let buckets = self
            .dynamic
            .entry(key)
            .or_insert_with(|| self.full_buckets());
        self.take(&buckets[agent], agent)
    }

    /// One full bucket per agent.
    fn full_buckets(&self) -> Box<[Mutex<Bucket>]> {
        let now = Instant::now();
        self.rates
            .iter()
            .map(|&(capacity, _)| {
                Mutex::new(Bucket {
                    tokens: capacity,
                    last: now,
                    accepted: 0,
                })
            })
            .collect()
    }

    fn take(&self, bucket: &Mutex<Bucket>, agent: usize) -> Result<(), u64> {
        self.look(bucket, agent, true)
    }

    /// Whether the caller's bucket for the agent holds a token now, without taking it: a
    /// request's body is read only when it does (the token is taken per call, once the
    /// body is decoded).
    ///
    /// # Errors
    /// The `Retry-After` seconds (at least 1) when the bucket is empty.
    pub(crate) fn check(&self, caller: &Caller, agent: usize) -> Result<(), u64> {
        let bucket = match caller.principal_index {
            Some(principal) => self.buckets.get(principal * self.agents + agent),
            None if agent < self.agents => {
                return match self.dynamic.get(&caller.principal) {
                    Some(buckets) => self.look(&buckets[agent], agent, false),
                    None => Ok(()),
                };
            }
            None => None,
        };
        bucket.map_or(Ok(()), |b| self.look(b, agent, false))
    }

    /// Refills a bucket; takes a token from it when `take` (and there is one).
    fn look(&self, bucket: &Mutex<Bucket>, agent: usize, take: bool) -> Result<(), u64> {
        let (capacity, per_second) = self.rates[agent];
        let mut b = lock(bucket);
        if !take && b.tokens >= 1.0 {
            // It holds a token without a refill (which only adds).
            return Ok(());
        }
        let now = Instant::now();
        let refill = now.duration_since(b.last).as_secs_f64() * per_second;
        b.tokens = (b.tokens + refill).min(capacity);
        b.last = now;
        if b.tokens >= 1.0 {
            if take {
                b.tokens -= 1.0;
                b.accepted += 1;
            }
            Ok(())
        } else {
            Err((((1.0 - b.tokens) / per_second).ceil() as u64).max(1))
        }
    }
}

impl RateLimiter {
    /// Requests let through since start, per (principal, agent) with any.
    pub(crate) fn accepted(&self) -> Vec<(usize, usize, u64)> {
        self.buckets
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let n = lock(b).accepted;
                (n > 0).then_some((i / self.agents.max(1), i % self.agents.max(1), n))
            })
            .collect()
    }

    /// Takes `n` tokens the other nodes of a cluster spent on this bucket's key (down to
    /// one minute's worth below empty: a bucket in debt refills before it lets requests
    /// through again).
    pub(crate) fn charge(&self, principal: usize, agent: usize, n: u64) {
        let Some(bucket) = self.buckets.get(principal * self.agents + agent) else {
            return;
        };
        let (capacity, _) = self.rates[agent];
        let mut b = lock(bucket);
        b.tokens = (b.tokens - n as f64).max(-capacity);
    }
}

/// An agent's task slots: at most `limit` tasks run at once; up to `max_queued` more wait
/// in FIFO order.
pub struct Scheduler {
    inner: Mutex<SchedulerState>,
    limit: usize,
    max_queued: usize,
}

struct SchedulerState {
    running: usize,
    queue: VecDeque<(u64, oneshot::Sender<Permit>)>,
    next_ticket: u64,
    /// Set by [`Scheduler::close`]: no slot is granted any more.
    closed: bool,
}

/// The right to run one task. Dropping it hands the slot to the next waiter.
pub struct Permit {
    /// `None` once the slot was handed on (or never held).
    scheduler: Option<Arc<Scheduler>>,
}

/// A place in the queue. Dropping it before the slot arrives leaves the queue.
pub struct Ticket {
    id: u64,
    rx: oneshot::Receiver<Permit>,
    scheduler: Arc<Scheduler>,
}

/// What admission granted.
pub enum Admission {
    /// A slot is free: run now.
    Run(Permit),
    /// Wait for a slot.
    Queued(Ticket),
}

impl Scheduler {
    /// Slots for `limit` running tasks and `max_queued` waiting ones.
    pub fn new(limit: usize, max_queued: usize) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(SchedulerState {
                running: 0,
                queue: VecDeque::new(),
                next_ticket: 0,
                closed: false,
            }),
            limit,
            max_queued,
        })
    }

    /// Admits a task: a slot, a place in the queue, or a refusal.
    ///
    /// # Errors
    /// [`Error::TooManyTasks`] when the queue is full, [`Error::ShuttingDown`] once closed.
    pub fn admit(self: &Arc<Self>) -> Result<Admission, Error> {
        let mut s = lock(&self.inner);
        if s.closed {
            return Err(Error::ShuttingDown);
        }
        if s.running < self.limit && s.queue.is_empty() {
            s.running += 1;
            return Ok(Admission::Run(Permit {
                scheduler: Some(self.clone()),
            }));
        }
        if s.queue.len() >= self.max_queued {
            return Err(Error::TooManyTasks);
        }
        let id = s.next_ticket;
        s.next_ticket += 1;
        let (tx, rx) = oneshot::channel();
        s.queue.push_back((id, tx));
        Ok(Admission::Queued(Ticket {
            id,
            rx,
            scheduler: self.clone(),
        }))
    }

    /// (running, queued) right now.
    pub fn depth(&self) -> (usize, usize) {
        let s = lock(&self.inner);
        (s.running, s.queue.len())
    }

    /// Grants no slot from now on: the tasks that wait are told at once ([`Admission::ready`]
    /// gives `None`), a slot that frees up goes to no one, and new tasks are refused. A
    /// shutting-down runtime closes every agent's scheduler before it tells its tasks, so
    /// that no queued task starts in a slot the shutdown frees (in a cluster, queued tasks
    /// are handed over instead).
    pub fn close(&self) {
        let waiting = {
            let mut s = lock(&self.inner);
            s.closed = true;
            std::mem::take(&mut s.queue)
        };
        // Dropping the senders wakes their waiters (outside the lock: a waiter's ticket
        // takes it when dropped).
        drop(waiting);
    }

    fn release(self: &Arc<Self>) {
        loop {
            let next = {
                let mut s = lock(&self.inner);
                match s.queue.pop_front() {
                    Some((_, tx)) => tx,
                    None => {
                        s.running = s.running.saturating_sub(1);
                        return;
                    }
                }
            };
            let handed = Permit {
                scheduler: Some(self.clone()),
            };
            match next.send(handed) {
                Ok(()) => return,
                // The waiter left between our pop and the send: take the permit back
                // without releasing it again, and try the next waiter.
                Err(mut back) => back.scheduler = None,
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(s) = self.scheduler.take() {
            s.release();
        }
    }
}

impl Admission {
    /// Waits until the task may run.
    pub async fn ready(self) -> Option<Permit> {
        match self {
            Self::Run(p) => Some(p),
            Self::Queued(mut t) => (&mut t.rx).await.ok(),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = lock(&self.scheduler.inner);
        if let Some(pos) = s.queue.iter().position(|(id, _)| *id == self.id) {
            s.queue.remove(pos);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(name: &str, index: Option<usize>) -> Caller {
        Caller {
            principal: Principal::new(name),
            principal_index: index,
            agents: None,
        }
    }

    #[test]
    fn the_bucket_allows_its_burst_then_says_when_to_retry() {
        let r = RateLimiter::new(2, &[3]);
        let (a, b) = (caller("a", Some(0)), caller("b", Some(1)));
        for _ in 0..3 {
            assert!(r.try_acquire(&a, 0).is_ok());
        }
        let retry = r.try_acquire(&a, 0).unwrap_err();
        assert!((1..=20).contains(&retry), "{retry}");
        assert!(
            r.try_acquire(&b, 0).is_ok(),
            "other principal has its own bucket"
        );
    }

    #[test]
    fn principals_not_configured_get_buckets_of_their_own() {
        let r = RateLimiter::new(1, &[2, 5]);
        let (t, u) = (caller("issuer#t", None), caller("issuer#u", None));
        for _ in 0..2 {
            assert!(r.try_acquire(&t, 0).is_ok());
        }
        assert!(
            r.try_acquire(&t, 0).is_err(),
            "t's bucket for agent 0 is empty"
        );
        assert!(r.try_acquire(&t, 1).is_ok(), "each agent has its own");
        assert!(r.try_acquire(&u, 0).is_ok(), "u has its own");
        assert!(
            r.try_acquire(&caller("issuer#t", None), 0).is_err(),
            "by name"
        );
    }

    #[tokio::test]
    async fn slots_are_granted_in_fifo_order_and_the_queue_is_bounded() {
        let s = Scheduler::new(1, 2);
        let first = s.admit().expect("slot");
        let a = s.admit().expect("queued");
        let b = s.admit().expect("queued");
        assert!(matches!(s.admit(), Err(Error::TooManyTasks)));
        assert_eq!(s.depth(), (1, 2));
        assert!(matches!(first, Admission::Run(_)));
        drop(first);
        let pa = a.ready().await.expect("a runs");
        assert_eq!(s.depth(), (1, 1));
        drop(pa);
        let pb = b.ready().await.expect("b runs");
        drop(pb);
        assert_eq!(s.depth(), (0, 0));
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_frees_its_place_and_is_skipped() {
        let s = Scheduler::new(1, 2);
        let first = s.admit().expect("slot");
        let gone = s.admit().expect("queued");
        let next = s.admit().expect("queued");
        drop(gone);
        assert_eq!(s.depth(), (1, 1));
        drop(first);
        let p = next.ready().await.expect("runs");
        drop(p);
        assert_eq!(s.depth(), (0, 0));
    }

    #[tokio::test]
    async fn a_closed_scheduler_hands_a_freed_slot_to_no_waiter() {
        // Defect 12 of the second attack: a slot freed by a shutdown started a queued
        // task instead of leaving it queued for another node.
        let s = Scheduler::new(1, 2);
        let running = s.admit().expect("slot");
        let waiting = s.admit().expect("queued");
        s.close();
        assert!(matches!(s.admit(), Err(Error::ShuttingDown)));
        assert_eq!(s.depth(), (1, 0));
        drop(running);
        assert!(waiting.ready().await.is_none(), "the waiter got the slot");
        assert_eq!(s.depth(), (0, 0));
    }
}
