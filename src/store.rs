//! Storage: one interface, [`Store`], for everything a2ad keeps — tasks and their numbered
//! events, conversations, push configurations and the webhook outbox — implemented in
//! memory (`backend = "memory"`) and in one redb file (`backend = "redb"`, the default),
//! and shaped for a shared database too (reads are futures).
//!
//! **The durability invariant.** Every change goes through [`Store::append`], in order. An
//! event reaches a stream, a JSON-RPC reply or a webhook only after the store says it is
//! durable; a push configuration is durable before `set` answers. So a crash loses only
//! what nobody had been told. The writer never waits: `append` hands the writes to the
//! store's committer and returns; the committer makes them durable in batches (one
//! fdatasync per batch) and then runs each append's continuation. A task actor's mailbox
//! therefore never waits on the disk — its *replies* do.
//!
//! Reads come from what the store has made durable: a task's record is visible once its
//! event is durable, never before.

use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use futures_util::future::{BoxFuture, FutureExt as _};

use crate::error::{Error, Result};
use crate::model::{
    AgentId, ContextId, Message, Principal, TaskEvent, TaskId, TaskKey, TaskSnapshot, TaskState,
};
use crate::push::{PushScope, StoredPushConfig};

pub(crate) mod cluster;
pub(crate) mod codec;
#[cfg(test)]
pub(crate) mod contract;
mod damage;
mod file;
mod index;
mod local;
pub(crate) mod pg;
mod private;
pub(crate) mod seal;

pub(crate) use file::log::check_any as check_log_bytes;
pub use file::runtime_parked;
pub(crate) use local::LocalStore;

/// Where everything a2ad keeps is kept. See the module documentation for the durability
/// invariant every implementation keeps.
pub(crate) trait Store: Send + Sync + 'static {
    /// Hands `writes` to the store, after every earlier append. They become durable
    /// together and in order. When they already are (memory), the answer is
    /// [`Durable::Now`] and `then` is dropped unused; otherwise [`Durable::Later`], and
    /// `then` runs — on the store's committer or a task it hands the batch to, so it must
    /// only hand things on — once they are, in append order. A write the store cannot make
    /// durable is logged and never acknowledged.
    fn append(&self, writes: Vec<Write>, then: Option<Then>) -> Durable;

    /// A task's durable record.
    fn task(&self, key: &TaskKey) -> BoxFuture<'_, Result<Option<Arc<TaskSnapshot>>>>;

    /// A task's durable record as this node holds it, without waiting: exact for the
    /// embedded stores; a shared store may answer `None` and enforce uniqueness itself.
    fn task_now(&self, key: &TaskKey) -> Option<Arc<TaskSnapshot>>;

    /// A task's durable events numbered above `after`, in order. Empty when the store keeps
    /// no events of finished tasks (memory).
    fn events(&self, key: &TaskKey, after: u64) -> BoxFuture<'_, Result<Vec<TaskEvent>>>;

    /// One page of an owner's tasks (docs/PROTOCOL.md §10.6).
    fn list(&self, query: &ListQuery) -> BoxFuture<'_, Result<ListPage>>;

    /// Push configurations: the scoped one of exactly this scope.
    fn push_scope(&self, scope: &PushScope)
    -> BoxFuture<'_, Result<Option<Arc<StoredPushConfig>>>>;

    /// A scoped configuration of this principal and agent by id.
    fn push_by_id(
        &self,
        principal: &Principal,
        agent: &AgentId,
        id: &str,
    ) -> BoxFuture<'_, Result<Option<Arc<StoredPushConfig>>>>;

    /// A task's named configurations, oldest first.
    fn push_named(&self, task: &TaskKey) -> BoxFuture<'_, Result<Vec<Arc<StoredPushConfig>>>>;

    /// Checks that a configuration may be added (the per-task cap) and, in the embedded
    /// stores, makes it visible to the planning of deliveries at once; the caller then
    /// appends [`Write::PushSet`] and answers once that is durable (a shared store plans
    /// from what is durable and from the changes of the batch being committed, and checks
    /// the cap in [`Store::push_check`]).
    ///
    /// # Errors
    /// [`Error::InvalidParams`] over `max_per_task` named configurations on one task.
    fn push_reserve(&self, config: &Arc<StoredPushConfig>, max_per_task: usize) -> Result<()>;

    /// Checks the per-task cap against what is durable, for stores whose
    /// [`Store::push_reserve`] cannot (a shared store; the embedded ones check there and
    /// answer `Ok` here). Called before `push_reserve`.
    fn push_check(
        &self,
        _config: &Arc<StoredPushConfig>,
        _max_per_task: usize,
    ) -> BoxFuture<'_, Result<()>> {
        futures_util::future::ready(Ok(())).boxed()
    }

    /// A conversation's recorded turns as the store holds them — for a shared store, whose
    /// other nodes may have recorded turns this node has not seen. The embedded stores
    /// answer `None`: their conversations live in the context actor.
    fn conversation(
        &self,
        _principal: &Principal,
        _context: &ContextId,
    ) -> BoxFuture<'_, Result<Option<RecoveredContext>>> {
        futures_util::future::ready(Ok(None)).boxed()
    }

    /// What the store held when it opened: the work a restart resumes. Taken once.
    fn recovered(&self) -> Recovered;

    /// Evicts what outlived the retention (and what is over the caps), now.
    fn sweep(&self, now: Instant);

    /// Counters for `/metrics`.
    fn stats(&self) -> StoreStats;

    /// Commits are failing (cheap: `/healthz` asks on every probe).
    fn failing(&self) -> bool {
        self.stats().failing
    }

    /// Writes appended and not yet durable (cheap: admission reads it per task).
    fn backlog(&self) -> u64;

    /// Whether appending a task's events may plan webhook deliveries, each with the task
    /// as its event left it (cheap: a task actor asks at its events). `false` only when
    /// the store knows there is no push configuration at all: the events of a turn then
    /// need no copy of the task each (the task actor's `emit`).
    fn may_deliver(&self) -> bool {
        true
    }

    /// `append` answers [`Durable::Later`]: the store commits on a thread of its own (the
    /// embedded log and redb, PostgreSQL), and its continuation is how an append's caller
    /// hears of durability. `false`: durable on append (memory), the continuation unused.
    fn commits_later(&self) -> bool {
        true
    }

    /// Makes everything appended so far durable and stops the committer (shutdown),
    /// waiting at most `within`; returns the writes that never became durable.
    fn close(&self, within: std::time::Duration) -> u64;
}

/// A continuation of [`Store::append`], run once its writes are durable.
pub(crate) type Then = Box<dyn FnOnce(Committed) + Send>;

/// What [`Store::append`] says.
pub(crate) enum Durable {
    /// The writes are durable already; here is what they planned.
    Now(Committed),
    /// They will be; the continuation runs then.
    Later,
}

/// What a batch of writes planned, once durable: the webhook deliveries of its task
/// events (its outbox entries).
#[derive(Default)]
pub(crate) struct Committed {
    /// One per (event, push configuration that selects it), in event order.
    pub deliveries: Vec<Delivery>,
}

/// One change to what a2ad keeps.
#[derive(Clone, Debug)]
pub(crate) enum Write {
    /// A task event, and the task as it left it. Webhook deliveries for the event are
    /// planned (and kept in the outbox) in the same batch. A task's `created_at` is the
    /// same in all its writes (the embedded store files the task's rows under it).
    Task {
        /// The task.
        key: TaskKey,
        /// The task as the event left it.
        task: Arc<TaskSnapshot>,
        /// The event.
        event: Arc<TaskEvent>,
        /// The event changed the task's state (for state-change subscriptions).
        changed: bool,
        /// The conversation turn the task is (kept with the record for a restart).
        turn: TurnId,
    },
    /// A conversation turn ended: the user message and, if the task completed, the reply.
    Turn {
        /// The owner.
        principal: Principal,
        /// The conversation.
        context: ContextId,
        /// The turn.
        turn: TurnId,
        /// The user message.
        user: Arc<Message>,
        /// The agent reply, if any.
        reply: Option<Arc<Message>>,
    },
    /// Forget a conversation (evicted after the retention).
    ForgetContext {
        /// The owner.
        principal: Principal,
        /// The conversation.
        context: ContextId,
        /// When it began ([`TurnId::since`]).
        since: i64,
    },
    /// Store a push configuration (after [`Store::push_reserve`]).
    PushSet(Arc<StoredPushConfig>),
    /// Its delivery bookkeeping changed (`lastUsed`, `active`, failures in a row).
    PushStats(Arc<StoredPushConfig>),
    /// Remove a scoped configuration.
    PushRemove(PushScope),
    /// Remove a named configuration of a task.
    PushRemoveNamed {
        /// The task.
        task: TaskKey,
        /// Its id.
        id: String,
    },
    /// A delivery finished (delivered, or finally failed): out of the outbox.
    OutboxDone(OutboxKey),
    /// A delivery's attempt failed and will be retried.
    OutboxRetry {
        /// The delivery.
        key: OutboxKey,
        /// The next attempt's number.
        attempt: u32,
        /// When it is due.
        due: DateTime<Utc>,
    },
}

impl Write {
    /// Whether `writes[i]` is a task's write whose record can carry the conversation turn
    /// that `writes[i + 1]` records: the turn of the task's end (a task's terminal event is
    /// followed by its turn in the same append), with exactly the messages the record
    /// holds ([`record_turn`]). The embedded store then writes no row of its own for the
    /// turn: the record is read back as the turn, and the task's eviction writes the row.
    pub(crate) fn carries_turn(writes: &[Write], i: usize) -> bool {
        let (
            Some(Write::Task {
                key,
                task,
                turn: id,
                ..
            }),
            Some(Write::Turn {
                principal,
                context,
                turn,
                user,
                reply,
            }),
        ) = (writes.get(i), writes.get(i + 1))
        else {
            return false;
        };
        let same = |a: Option<&Arc<Message>>, b: Option<&Arc<Message>>| match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        id.number > 0
            && id == turn
            && key.principal == *principal
            && task.context_id == *context
            && record_turn(task)
                .is_some_and(|(u, r)| Arc::ptr_eq(u, user) && same(r, reply.as_ref()))
    }
}

/// The conversation turn a finished task's record holds: its user message (the first of
/// its history) and, if it completed, the reply (its status message) — what the task's
/// end recorded as the turn.
fn record_turn(task: &TaskSnapshot) -> Option<(&Arc<Message>, Option<&Arc<Message>>)> {
    if !task.status.state.is_terminal() {
        return None;
    }
    let user = task.history.first()?;
    let reply = match task.status.state {
        crate::model::TaskState::Completed => task.status.message.as_ref(),
        _ => None,
    };
    Some((user, reply))
}

/// The conversation turn a finished task's record carries, taken from the record: what
/// its eviction writes as a row of its own, and what a restart gives its conversation —
/// the record's own messages, not the rest of it.
#[derive(Clone, Debug)]
pub(crate) struct CarriedTurn {
    /// The turn.
    pub turn: TurnId,
    /// Its conversation.
    pub context: ContextId,
    /// The user message.
    pub user: Arc<Message>,
    /// The reply, if the task completed.
    pub reply: Option<Arc<Message>>,
}

impl CarriedTurn {
    /// Whether [`CarriedTurn::of`] finds a turn.
    pub(crate) fn carries(turn: TurnId, task: &TaskSnapshot) -> bool {
        turn.number != 0 && record_turn(task).is_some()
    }

    /// Turn `turn` as the finished record `task` holds it (`None`: no turn — number 0 — or
    /// not a finished record).
    pub(crate) fn of(turn: TurnId, task: &TaskSnapshot) -> Option<Self> {
        if turn.number == 0 {
            return None;
        }
        let (user, reply) = record_turn(task)?;
        Some(Self {
            turn,
            context: task.context_id.clone(),
            user: user.clone(),
            reply: reply.cloned(),
        })
    }
}

/// A task's place in its conversation: the turn's number, and when the conversation began
/// (µs since the epoch) — the embedded store files a conversation's turns under that time,
/// so the turns of new conversations are appended at the end of their table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct TurnId {
    /// The turn's number, from 1 (0: none).
    pub number: u32,
    /// When the conversation began, in µs since the epoch.
    pub since: i64,
}

/// Where a delivery sits in the outbox: a task's event for one configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct OutboxKey {
    /// The task.
    pub task: TaskKey,
    /// The task's creation time in µs since the epoch (`created_at`): the embedded store
    /// files a task's rows under it, so a delivery's bookkeeping finds its entry without
    /// looking the task up.
    pub created: i64,
    /// The event.
    pub seq: u64,
    /// The configuration.
    pub config: String,
}

/// One webhook delivery: an event for one configuration, with its stable id.
#[derive(Clone, Debug)]
pub(crate) struct Delivery {
    /// `X-Webhook-Delivery`: the same on every attempt, and after a restart.
    pub id: uuid::Uuid,
    /// Its place in the outbox.
    pub key: OutboxKey,
    /// The configuration.
    pub config: Arc<StoredPushConfig>,
    /// The event.
    pub event: Arc<TaskEvent>,
    /// The task as the event left it (after a restart: as it stands).
    pub task: Arc<TaskSnapshot>,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// Not before (a retry's due time; `None`: now).
    pub due: Option<DateTime<Utc>>,
}

/// What a store held when it opened.
#[derive(Default)]
pub(crate) struct Recovered {
    /// Tasks that had not ended, with their events, oldest first.
    pub tasks: Vec<RecoveredTask>,
    /// Conversations: their recorded turns, oldest first.
    pub contexts: Vec<RecoveredContext>,
    /// Pending webhook deliveries, in per-task event order.
    pub deliveries: Vec<Delivery>,
}

/// A task that had not ended when the store was last closed (or the process died).
pub(crate) struct RecoveredTask {
    /// Where it lives.
    pub key: TaskKey,
    /// Its last durable record.
    pub task: Arc<TaskSnapshot>,
    /// Its durable events, in order.
    pub events: Vec<Arc<TaskEvent>>,
    /// Its conversation turn.
    pub turn: TurnId,
    /// Why it is taken up again.
    pub why: Orphan,
}

/// Why a task is taken up again, which decides what it becomes if it was working.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Orphan {
    /// This node restarted: `failed`, "interrupted by a server restart".
    Restart,
    /// The node that ran it died: `failed`, "node lost" — or, when `rerun`, its agent
    /// runs it again from its first message here.
    NodeLost {
        /// Run it again (`on_node_loss = "resume"` and a backend that can be resumed).
        rerun: bool,
    },
    /// Taken here to be canceled or continued: it waits for that.
    Held,
}

/// A conversation as the store kept it.
pub(crate) struct RecoveredContext {
    /// The owner.
    pub principal: Principal,
    /// The conversation.
    pub context: ContextId,
    /// When it began ([`TurnId::since`]).
    pub since: i64,
    /// Its recorded turns (number, user message and reply), oldest first.
    pub turns: Vec<(u32, TurnMessages)>,
}

/// A recorded turn's user message and reply.
#[derive(Clone, Debug)]
pub(crate) enum TurnMessages {
    /// In memory, shared (with the tasks' records, while the server that ran them runs).
    Shared(Arc<Message>, Option<Arc<Message>>),
    /// As the store keeps them, checked when loaded: a restart does not decode a
    /// conversation's turns before it goes on. Decoded, each would be a copy of messages
    /// the tasks' restored records hold too (a million echo turns: 0.8 GB); kept as they
    /// were written, about a sixth of that (docs/decisions/restored-turns-stay-encoded.md).
    Stored(Box<[u8]>),
}

impl TurnMessages {
    /// The messages, decoding them in place the first time (`None`: the stored bytes do
    /// not decode, which a load refuses, so only a bug could leave one).
    pub(crate) fn messages(&mut self) -> Option<(&Arc<Message>, Option<&Arc<Message>>)> {
        if let Self::Stored(bytes) = self {
            let (user, reply) = codec::decode_turn(bytes)?;
            *self = Self::Shared(user, reply);
        }
        match self {
            Self::Shared(user, reply) => Some((user, reply.as_ref())),
            Self::Stored(_) => None,
        }
    }
}

/// Store counters.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StoreStats {
    /// Finished task records retained.
    pub finished_tasks: usize,
    /// About how many bytes the retained finished records take in memory.
    pub finished_bytes: u64,
    /// Writes appended and not yet durable.
    pub pending_writes: u64,
    /// Batches committed.
    pub commits: u64,
    /// Writes committed.
    pub committed_writes: u64,
    /// Time spent in committed batches (from the commit's start to durable), microseconds.
    pub commit_micros: u64,
    /// The store file's size in bytes (0 in memory).
    pub file_bytes: u64,
    /// Commits are failing (and being retried); nothing new is acknowledged meanwhile.
    pub failing: bool,
}

/// A ListTasks query: one owner's tasks on one agent, newest status first.
#[derive(Clone, Debug)]
pub struct ListQuery {
    /// The owner.
    pub principal: Principal,
    /// The agent.
    pub agent: AgentId,
    /// Only tasks of this conversation.
    pub context: Option<ContextId>,
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// Only tasks whose status changed at or after this time.
    pub status_after: Option<DateTime<Utc>>,
    /// Tasks per page (at least 1).
    pub page_size: usize,
    /// Continue after this task (the last one of the previous page).
    pub after: Option<PageToken>,
}

/// A position in the order of ListTasks: status time descending, then task id descending.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageToken {
    /// The status time in microseconds since the epoch.
    pub timestamp_micros: i64,
    /// The task id.
    pub task: TaskId,
}

impl PageToken {
    /// The position of a task.
    pub fn of(task: &TaskSnapshot) -> Self {
        Self {
            timestamp_micros: task.status.timestamp.timestamp_micros(),
            task: task.id.clone(),
        }
    }
}

/// A configuration's delivery bookkeeping is written once per batch: walked from the
/// batch's end, [`superseded`](Self::superseded) says of each write whether a later one
/// in the batch writes the same configuration (the same object, so the later write
/// stores its newest state, and the result is the same as writing both). Every delivery
/// of an agent-wide configuration ends with a `PushStats` of it; a batch at 64
/// connections carries dozens.
#[derive(Default)]
pub(crate) struct StatsOnce(std::collections::HashSet<usize, foldhash::fast::RandomState>);

impl StatsOnce {
    /// Call with a batch's writes from the last to the first.
    pub(crate) fn superseded(&mut self, w: &Write) -> bool {
        match w {
            Write::PushStats(c) => !self.0.insert(Arc::as_ptr(c).addr()),
            Write::PushSet(c) => {
                self.0.insert(Arc::as_ptr(c).addr());
                false
            }
            _ => false,
        }
    }
}

/// One page of tasks.
#[derive(Clone, Debug, Default)]
pub struct ListPage {
    /// The tasks, in order.
    pub tasks: Vec<Arc<TaskSnapshot>>,
    /// Where the next page starts, when there is one.
    pub next: Option<PageToken>,
    /// How many tasks match the query, over all pages.
    pub total: usize,
}

/// The deliveries of a task's event: one per push configuration that covers the task (its
/// owner's: agent-wide, or the task's own) and selects the event. Every store plans with
/// this, from the configurations it holds.
pub(crate) fn deliveries_for<'a>(
    key: &TaskKey,
    task: &Arc<TaskSnapshot>,
    event: &Arc<TaskEvent>,
    changed: bool,
    configs: impl IntoIterator<Item = &'a Arc<StoredPushConfig>>,
) -> Vec<Delivery> {
    configs
        .into_iter()
        .filter(|c| {
            c.scope.principal == key.principal
                && c.scope.agent == key.agent
                && c.scope.task.as_ref().is_none_or(|t| *t == key.task)
                && c.config.events.selects(event, changed)
        })
        .map(|config| {
            let outbox = OutboxKey {
                task: key.clone(),
                created: task.created_at.timestamp_micros(),
                seq: event.seq,
                config: config.id.clone(),
            };
            Delivery {
                id: delivery_id(&outbox),
                key: outbox,
                config: config.clone(),
                event: event.clone(),
                task: task.clone(),
                attempt: 1,
                due: None,
            }
        })
        .collect()
}

/// A stable delivery id for an outbox entry: the same whenever it is planned or recovered.
pub(crate) fn delivery_id(key: &OutboxKey) -> uuid::Uuid {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x5b1e_2a2d_9c1e_4e0b_8a6f_a2ad_0000_0003);
    let mut seed = Vec::with_capacity(96);
    for part in [
        key.task.principal.as_str(),
        key.task.agent.as_str(),
        key.task.task.as_str(),
        &key.config,
    ] {
        seed.extend_from_slice(&(part.len() as u32).to_be_bytes());
        seed.extend_from_slice(part.as_bytes());
    }
    seed.extend_from_slice(&key.seq.to_be_bytes());
    uuid::Uuid::new_v5(&NAMESPACE, &seed)
}

/// An error of the store's own (I/O, a corrupt value), for callers that must answer.
pub(crate) fn failed(what: impl std::fmt::Display) -> Error {
    tracing::error!(error = %what, "store failure");
    Error::Internal
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Part, Role};

    #[test]
    fn a_stored_turn_decodes_once_into_shared_messages_and_bad_bytes_into_none() {
        let user = Message {
            role: Role::User,
            parts: vec![Part::Text("hi".into())],
            message_id: "m1".into(),
            extensions: Default::default(),
        };
        let reply = Message::agent_text(["echo: hi"]);
        let mut turn = TurnMessages::Stored(codec::encode_turn(&user, Some(&reply)).into());
        let (u, r) = turn.messages().expect("decodes");
        assert_eq!((&**u, r.map(|r| &**r)), (&user, Some(&reply)));
        assert!(
            matches!(turn, TurnMessages::Shared(..)),
            "decoded in place, once"
        );
        let mut without = TurnMessages::Stored(codec::encode_turn(&user, None).into());
        assert!(without.messages().expect("decodes").1.is_none());
        let mut bad = TurnMessages::Stored(b"\x01 not a turn".to_vec().into());
        assert!(bad.messages().is_none());
    }
}
