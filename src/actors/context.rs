//! `ContextActor`: the multi-turn history of every conversation.
//!
//! One actor serves all contexts (measure before sharding it: see docs/ARCHITECTURE.md).
//! New conversations are created by a cast, so a fresh `message/send` never waits on it;
//! continuing one is a bounded `call` that returns the turn number and earlier turns.
//! Idle conversations with no task in flight are evicted after the task retention.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::ContextKey;
use crate::model::Message;

/// Messages of the [`ContextActor`].
pub(crate) enum ContextMsg {
    /// A new conversation whose first turn begins now.
    Create {
        /// The conversation.
        key: ContextKey,
    },
    /// A further turn begins: its number and the earlier turns, or `None` if unknown.
    Open {
        /// The conversation.
        key: ContextKey,
        /// The turn, or `None`.
        reply: RpcReplyPort<Option<Turn>>,
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
    /// Evict idle conversations.
    Sweep,
}

/// A turn handed to a new task.
pub(crate) struct Turn {
    /// The turn's number, from 1.
    pub(crate) number: u32,
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
}

/// State of the context actor.
pub(crate) struct ContextState {
    conversations: HashMap<ContextKey, Conversation, foldhash::fast::RandomState>,
    retention: Duration,
    max_turns: usize,
    /// Aborted in `post_stop`.
    sweeper: Option<tokio::task::JoinHandle<()>>,
}

struct Conversation {
    turns_begun: u32,
    in_flight: u32,
    turns: VecDeque<(Arc<Message>, Option<Arc<Message>>)>,
    last_active: Instant,
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
        Ok(ContextState {
            conversations: HashMap::default(),
            retention: args.retention,
            max_turns: args.max_turns,
            sweeper: Some(sweeper),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ContextMsg>,
        msg: ContextMsg,
        state: &mut ContextState,
    ) -> Result<(), ActorProcessingErr> {
        let now = Instant::now();
        match msg {
            ContextMsg::Create { key } => {
                state.conversations.insert(
                    key,
                    Conversation {
                        turns_begun: 1,
                        in_flight: 1,
                        turns: VecDeque::new(),
                        last_active: now,
                    },
                );
            }
            ContextMsg::Open { key, reply } => {
                let turn = state.conversations.get_mut(&key).map(|c| {
                    c.turns_begun = c.turns_begun.saturating_add(1);
                    c.in_flight += 1;
                    c.last_active = now;
                    Turn {
                        number: c.turns_begun,
                        history: c
                            .turns
                            .iter()
                            .flat_map(|(user, reply)| std::iter::once(user).chain(reply))
                            .cloned()
                            .collect(),
                    }
                });
                let _ = reply.send(turn);
            }
            ContextMsg::Abandon { key } => {
                if let Some(c) = state.conversations.get_mut(&key) {
                    c.in_flight = c.in_flight.saturating_sub(1);
                    c.turns_begun = c.turns_begun.saturating_sub(1);
                }
            }
            ContextMsg::Record { key, user, reply } => {
                if let Some(c) = state.conversations.get_mut(&key) {
                    c.in_flight = c.in_flight.saturating_sub(1);
                    c.last_active = now;
                    c.turns.push_back((user, reply));
                    while c.turns.len() > state.max_turns {
                        c.turns.pop_front();
                    }
                }
            }
            ContextMsg::Sweep => {
                let retention = state.retention;
                state.conversations.retain(|_, c| {
                    c.in_flight > 0 || now.duration_since(c.last_active) < retention
                });
                if state.conversations.capacity() > 1024
                    && state.conversations.len() < state.conversations.capacity() / 4
                {
                    state.conversations.shrink_to_fit();
                }
            }
        }
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
