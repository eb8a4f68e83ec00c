//! `ContextActor`: the multi-turn history of every conversation.
//!
//! One actor serves all contexts (measure before sharding it: see docs/ARCHITECTURE.md).
//! New conversations are created by a cast, so a fresh `message/send` never waits on it;
//! continuing one — or starting one under a name the client chose — is a bounded `call`
//! that returns the turn number and earlier turns.
//! Idle conversations with no task in flight are evicted after the task retention, and the
//! least recently used idle ones as soon as the conversations are more than
//! `server.max_contexts` or their turns hold more than `server.max_context_bytes`
//! (checked whenever a conversation begins or a turn is recorded, not only by the sweep).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::ContextKey;
use crate::metrics::ConversationMetrics;
use crate::model::Message;
use crate::piecewise::{ChunkedQueue, ShardedMap};
use crate::store::{RecoveredContext, Store, TurnId, TurnMessages, Write};

/// Messages of the [`ContextActor`].
pub(crate) enum ContextMsg {
    /// A new conversation whose first turn begins now.
    Create {
        /// The conversation.
        key: ContextKey,
        /// When it begins (µs since the epoch).
        since: i64,
    },
    /// A turn begins in a conversation the client named: its number and the earlier
    /// turns. A name this principal has not used yet starts a new conversation (turn 1).
    Open {
        /// The conversation.
        key: ContextKey,
        /// The conversation as a shared store holds it (cluster: other nodes may have
        /// recorded turns since this node last saw it).
        stored: Option<RecoveredContext>,
        /// The turn.
        reply: RpcReplyPort<Turn>,
    },
    /// A begun turn that never ran (its task was refused).
    Abandon {
        /// The conversation.
        key: ContextKey,
    },
    /// A turn ended: the user message and, if the task completed, the agent's reply.
    Record {
        /// The conversation.
        key: ContextKey,
        /// The user message.
        user: Arc<Message>,
        /// The agent reply, if any.
        reply: Option<Arc<Message>>,
    },
    /// A task read back from the store at start-up is in this conversation's turn
    /// `number`, still in flight.
    Resume {
        /// The conversation.
        key: ContextKey,
        /// The task's turn.
        turn: TurnId,
    },
    /// Evict idle conversations.
    Sweep,
}

/// A turn handed to a new task.
pub(crate) struct Turn {
    /// The turn: its number, from 1, and when the conversation began.
    pub(crate) id: TurnId,
    /// Earlier turns, oldest first: user and agent messages.
    pub(crate) history: Vec<Arc<Message>>,
}

/// The context actor.
pub(crate) struct ContextActor;

/// Arguments of the context actor.
pub(crate) struct ContextArgs {
    /// Idle conversations are evicted after this.
    pub(crate) retention: Duration,
    /// Turns kept per conversation.
    pub(crate) max_turns: usize,
    /// Conversations kept at most (the oldest idle ones go first).
    pub(crate) max_contexts: usize,
    /// Bytes all conversations' turns may hold (the oldest idle ones go first).
    pub(crate) max_bytes: u64,
    /// Where evictions are recorded.
    pub(crate) store: Arc<dyn Store>,
    /// Where the conversations kept are counted.
    pub(crate) gauges: Arc<ConversationMetrics>,
    /// Conversations the store held at start-up.
    pub(crate) restored: Vec<RecoveredContext>,
}

/// State of the context actor.
pub(crate) struct ContextState {
    /// In shards, each growing on its own: a million conversations' map doubling at once
    /// held the worker for tens of milliseconds (`crate::piecewise`).
    conversations: ShardedMap<ContextKey, Conversation>,
    /// When each conversation was last touched, oldest first. An entry is stale when its
    /// conversation was touched again later; eviction checks the conversation itself, so
    /// a sweep costs what it evicts, never a scan of every conversation.
    touched: ChunkedQueue<(Instant, ContextKey)>,
    retention: Duration,
    max_turns: usize,
    max_contexts: usize,
    max_bytes: u64,
    /// About how many bytes the kept turns hold ([`turn_bytes`]).
    bytes: u64,
    store: Arc<dyn Store>,
    gauges: Arc<ConversationMetrics>,
    /// Aborted in `post_stop`.
    sweeper: Option<tokio::task::JoinHandle<()>>,
    /// Conversations the store held at start-up, taken in `post_start`.
    restoring: Vec<RecoveredContext>,
}

impl ContextState {
    /// Takes a conversation's turns from the shared store when it knows more of them than
    /// this node (another node recorded turns of it, or this node never saw it).
    fn merge(&mut self, key: &ContextKey, stored: RecoveredContext, now: Instant) {
        let newest = stored.turns.iter().map(|(n, _)| *n).max().unwrap_or(0);
        let known = self.conversations.get(key).map_or(0, |c| {
            if c.since == stored.since {
                c.turns_begun
            } else {
                0
            }
        });
        if newest <= known && self.conversations.contains_key(key) {
            return;
        }
        let mut c = Conversation {
            since: stored.since,
            turns_begun: newest,
            in_flight: self.conversations.get(key).map_or(0, |c| c.in_flight),
            turns: Turns::default(),
            last_active: now,
        };
        for (_, turn) in stored.turns {
            c.push(turn, self.max_turns, &mut self.bytes);
        }
        self.touched.push_back((now, key.clone()));
        if let Some(old) = self.conversations.insert(key.clone(), c) {
            self.bytes -= old.bytes();
        }
    }

    /// Whether the conversations are past one of their bounds (count, bytes).
    fn over_bounds(&self) -> bool {
        self.conversations.len() > self.max_contexts || self.bytes > self.max_bytes
    }

    /// Evicts idle conversations past the retention, and the oldest idle ones beyond the
    /// cap. Conversations with a task in flight stay.
    fn sweep(&mut self, now: Instant) {
        let mut examined = 0usize;
        while let Some((stamp, _)) = self.touched.front() {
            if now.duration_since(*stamp) < self.retention && !self.over_bounds() {
                break;
            }
            let Some((stamp, key)) = self.touched.pop_front() else {
                break;
            };
            examined += 1;
            let evict = self
                .conversations
                .get(&key)
                .is_some_and(|c| c.in_flight == 0 && c.last_active <= stamp);
            if evict && let Some(gone) = self.conversations.remove(&key) {
                self.bytes -= gone.bytes();
                let _ = self.store.append(
                    vec![Write::ForgetContext {
                        principal: key.principal,
                        context: key.context,
                        since: gone.since,
                    }],
                    None,
                );
            }
            // Bound one sweep's work so the actor stays responsive; the next tick goes on.
            if examined >= 100_000 {
                break;
            }
        }
    }

    /// Gives back the room of tables and queues that use under a quarter of it (on the
    /// periodic sweep: what is held shrinks only when conversations are evicted).
    fn give_back_room(&mut self) {
        self.conversations.shrink_sparse();
        self.touched.shrink_sparse();
    }
}

struct Conversation {
    /// When it began (µs since the epoch): where the store files its turns.
    since: i64,
    turns_begun: u32,
    in_flight: u32,
    /// The kept turns, oldest first, each with the bytes it was counted as (their sum is
    /// the conversation's share of every conversation's bytes: [`Conversation::bytes`]).
    turns: Turns,
    last_active: Instant,
}

impl Conversation {
    /// A new conversation with no turn kept yet.
    fn new(since: i64, turns_begun: u32, in_flight: u32, now: Instant) -> Self {
        Self {
            since,
            turns_begun,
            in_flight,
            turns: Turns::default(),
            last_active: now,
        }
    }

    /// The bytes its kept turns were counted as: summed when it goes (a field kept up to
    /// date would make every conversation's entry in the map 8 bytes larger).
    fn bytes(&self) -> u64 {
        self.turns.iter().map(|(size, _)| size).sum()
    }

    /// Keeps a turn, dropping the oldest beyond `max_turns`; `total` (every
    /// conversation's bytes) follows.
    fn push(&mut self, turn: TurnMessages, max_turns: usize, total: &mut u64) {
        let size = turn_bytes(&turn);
        self.turns.push_back((size, turn));
        *total += size;
        while self.turns.len() > max_turns {
            if let Some((size, _)) = self.turns.pop_front() {
                *total -= size;
            }
        }
    }
}

/// A turn kept, with the bytes it was counted as.
type KeptTurn = (u64, TurnMessages);

/// A conversation's kept turns, oldest first. Most conversations are one turn: that one is
/// kept in the conversation itself, and a queue is made only for a second (a queue of one
/// would be an allocation, and 32 bytes, for each conversation kept).
enum Turns {
    /// None or one.
    One(Option<KeptTurn>),
    /// Two or more, or fewer after some were dropped.
    Many(VecDeque<KeptTurn>),
}

impl Default for Turns {
    fn default() -> Self {
        Self::One(None)
    }
}

impl Turns {
    fn len(&self) -> usize {
        match self {
            Self::One(one) => usize::from(one.is_some()),
            Self::Many(many) => many.len(),
        }
    }

    fn push_back(&mut self, turn: KeptTurn) {
        match self {
            Self::One(None) => *self = Self::One(Some(turn)),
            Self::One(Some(_)) => {
                let mut many = VecDeque::with_capacity(4);
                if let Self::One(Some(first)) = std::mem::take(self) {
                    many.push_back(first);
                }
                many.push_back(turn);
                *self = Self::Many(many);
            }
            Self::Many(many) => many.push_back(turn),
        }
    }

    fn pop_front(&mut self) -> Option<KeptTurn> {
        match self {
            Self::One(one) => one.take(),
            Self::Many(many) => many.pop_front(),
        }
    }

    /// Room for `n` turns in all.
    fn reserve(&mut self, n: usize) {
        match self {
            Self::One(_) if n <= 1 => {}
            Self::One(one) => {
                let mut many = VecDeque::with_capacity(n);
                many.extend(one.take());
                *self = Self::Many(many);
            }
            Self::Many(many) => many.reserve(n.saturating_sub(many.len())),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &KeptTurn> {
        let (one, many) = match self {
            Self::One(one) => (one.as_ref(), None),
            Self::Many(many) => (None, Some(many.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut KeptTurn> {
        let (one, many) = match self {
            Self::One(one) => (one.as_mut(), None),
            Self::Many(many) => (None, Some(many.iter_mut())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

/// About how many bytes a turn holds: its messages, or the bytes a restart kept them as.
fn turn_bytes(turn: &TurnMessages) -> u64 {
    const TURN: u64 = 64;
    let held = match turn {
        TurnMessages::Shared(user, reply) => {
            user.approx_bytes() + reply.as_ref().map_or(0, |r| r.approx_bytes())
        }
        TurnMessages::Stored(bytes) => bytes.len(),
    };
    held as u64 + TURN
}

impl Actor for ContextActor {
    type Msg = ContextMsg;
    type State = ContextState;
    type Arguments = ContextArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ContextMsg>,
        args: ContextArgs,
    ) -> Result<ContextState, ActorProcessingErr> {
        let period =
            (args.retention / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
        let sweeper = myself.send_interval(period, || ContextMsg::Sweep);
        let state = ContextState {
            // Sized once: a million restored conversations would otherwise be rehashed
            // some twenty times on the way.
            conversations: ShardedMap::with_capacity(args.restored.len()),
            touched: ChunkedQueue::default(),
            retention: args.retention,
            max_turns: args.max_turns,
            max_contexts: args.max_contexts,
            max_bytes: args.max_bytes,
            bytes: 0,
            store: args.store,
            gauges: args.gauges,
            sweeper: Some(sweeper),
            restoring: args.restored,
        };
        Ok(state)
    }

    /// Takes the restored conversations: after `spawn` has returned, so the server starts
    /// listening meanwhile (a million take ~0.6 s); every message waits behind this.
    async fn post_start(
        &self,
        _myself: ActorRef<ContextMsg>,
        state: &mut ContextState,
    ) -> Result<(), ActorProcessingErr> {
        let now = Instant::now();
        for c in std::mem::take(&mut state.restoring) {
            let key = ContextKey {
                principal: c.principal,
                context: c.context,
            };
            let turns_begun = c.turns.iter().map(|(n, _)| *n).max().unwrap_or(0);
            let mut conversation = Conversation::new(c.since, turns_begun, 0, now);
            // Room for what it holds at once (a push comes before the oldest goes), not
            // grown a step at a time.
            let held = c.turns.len().min(state.max_turns.saturating_add(1));
            conversation.turns.reserve(held);
            for (_, turn) in c.turns {
                conversation.push(turn, state.max_turns, &mut state.bytes);
            }
            state.touched.push_back((now, key.clone()));
            state.conversations.insert(key, conversation);
        }
        // Bounds lowered since the last run take effect now.
        state.sweep(now);
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<ContextMsg>,
        msg: ContextMsg,
        state: &mut ContextState,
    ) -> Result<(), ActorProcessingErr> {
        let now = Instant::now();
        match msg {
            ContextMsg::Create { key, since } => {
                // No stamp yet: a conversation with a task in flight is never evicted, and
                // its `Record` stamps it when that task ends.
                let new = Conversation::new(since, 1, 1, now);
                if let Some(old) = state.conversations.insert(key, new) {
                    state.bytes -= old.bytes();
                }
                state.sweep(now);
            }
            ContextMsg::Open { key, stored, reply } => {
                if let Some(stored) = stored {
                    state.merge(&key, stored, now);
                }
                let mut begins = false;
                let c = state.conversations.get_or_insert_with(key, || {
                    begins = true;
                    Conversation::new(chrono::Utc::now().timestamp_micros(), 0, 0, now)
                });
                c.turns_begun = c.turns_begun.saturating_add(1);
                c.in_flight += 1;
                c.last_active = now;
                let turn = Turn {
                    id: TurnId {
                        number: c.turns_begun,
                        since: c.since,
                    },
                    history: c
                        .turns
                        .iter_mut()
                        .filter_map(|(_, turn)| turn.messages())
                        .flat_map(|(user, reply)| std::iter::once(user).chain(reply))
                        .cloned()
                        .collect(),
                };
                let _ = reply.send(turn);
                if begins {
                    state.sweep(now);
                }
            }
            ContextMsg::Abandon { key } => {
                if let Some(c) = state.conversations.get_mut(&key) {
                    c.in_flight = c.in_flight.saturating_sub(1);
                    c.turns_begun = c.turns_begun.saturating_sub(1);
                    c.last_active = now;
                    state.touched.push_back((now, key));
                }
            }
            ContextMsg::Record { key, user, reply } => {
                if let Some(c) = state.conversations.get_mut(&key) {
                    state.touched.push_back((now, key));
                    c.in_flight = c.in_flight.saturating_sub(1);
                    c.last_active = now;
                    c.push(
                        TurnMessages::Shared(user, reply),
                        state.max_turns,
                        &mut state.bytes,
                    );
                    state.sweep(now);
                }
            }
            ContextMsg::Resume { key, turn } => {
                let number = turn.number;
                let c = state
                    .conversations
                    .get_or_insert_with(key, || Conversation::new(turn.since, 0, 0, now));
                c.turns_begun = c.turns_begun.max(number);
                c.in_flight += 1;
                c.last_active = now;
            }
            ContextMsg::Sweep => {
                state.sweep(now);
                state.give_back_room();
            }
        }
        state
            .gauges
            .kept
            .store(state.conversations.len() as u64, Relaxed);
        state.gauges.bytes.store(state.bytes, Relaxed);
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ContextMsg>,
        state: &mut ContextState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(s) = state.sweeper.take() {
            s.abort();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(n: u64) -> KeptTurn {
        (n, TurnMessages::Stored(vec![n as u8].into_boxed_slice()))
    }

    fn sizes(turns: &mut Turns) -> Vec<u64> {
        turns.iter_mut().map(|(n, _)| *n).collect()
    }

    #[test]
    fn one_turn_is_kept_inline_and_more_in_a_queue_oldest_first() {
        let mut turns = Turns::default();
        assert_eq!(turns.len(), 0);
        assert!(turns.pop_front().is_none());
        turns.push_back(turn(1));
        assert!(matches!(turns, Turns::One(Some(_))), "one turn, no queue");
        assert_eq!((turns.len(), sizes(&mut turns)), (1, vec![1]));
        turns.push_back(turn(2));
        turns.push_back(turn(3));
        assert!(matches!(turns, Turns::Many(_)));
        assert_eq!((turns.len(), sizes(&mut turns)), (3, vec![1, 2, 3]));
        assert_eq!(turns.pop_front().map(|(n, _)| n), Some(1));
        assert_eq!(sizes(&mut turns), vec![2, 3]);

        let mut once = Turns::default();
        once.push_back(turn(1));
        assert_eq!(once.pop_front().map(|(n, _)| n), Some(1));
        assert_eq!(once.len(), 0);
        once.push_back(turn(2));
        assert_eq!(sizes(&mut once), vec![2], "a turn after the only one went");
    }

    #[test]
    fn room_made_ahead_keeps_the_turn_already_held() {
        let mut turns = Turns::default();
        turns.reserve(1);
        assert!(
            matches!(turns, Turns::One(None)),
            "room for one is the inline one"
        );
        turns.push_back(turn(1));
        turns.reserve(5);
        assert!(matches!(turns, Turns::Many(ref q) if q.capacity() >= 5));
        turns.push_back(turn(2));
        assert_eq!(sizes(&mut turns), vec![1, 2]);
    }

    #[test]
    fn a_conversation_beyond_its_turns_drops_the_oldest_and_counts_what_it_keeps() {
        let mut total = 0;
        let mut c = Conversation::new(0, 0, 0, Instant::now());
        for n in 1..=4u8 {
            c.push(
                TurnMessages::Stored(vec![n; 10].into_boxed_slice()),
                2,
                &mut total,
            );
        }
        assert_eq!(c.turns.len(), 2);
        let kept: Vec<_> = c
            .turns
            .iter_mut()
            .map(|(_, t)| match t {
                TurnMessages::Stored(b) => b[0],
                TurnMessages::Shared(..) => 0,
            })
            .collect();
        assert_eq!(kept, vec![3, 4], "the newest two");
        assert_eq!(c.bytes(), 2 * (10 + 64));
        assert_eq!(total, c.bytes());
    }
}
