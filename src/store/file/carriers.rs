//! The conversations a store's records carry turns of: how a load and the committer hash
//! a conversation, and how many records in the file carry a turn of each — what tells the
//! committer whether a forgotten conversation's tombstone is wanted.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::BuildHasher;

use crate::model::{ContextId, Principal};
use crate::store::index::Evicted;

/// How a load hashes a conversation (owner, id, start), the same on each of its threads;
/// and the committer after it ([`Carriers`]).
#[derive(Default, Clone)]
pub(super) struct Conversations(foldhash::fast::RandomState);

impl Conversations {
    pub(super) fn hash(&self, principal: &Principal, context: &ContextId, since: i64) -> u64 {
        self.0.hash_one((principal, context, since))
    }
}

/// Records carrying turns, counted per conversation (by its hash).
pub(super) type Counts = HashMap<u64, u32, foldhash::fast::RandomState>;

/// Per conversation (by its hash): how many records that carry one of its turns are still
/// in the file. A conversation's tombstone is wanted only while it has some
/// (`committer::Tombstones`): once the last is deleted, no eviction and no restart can
/// meet a turn of it. Counted from the load on: up as the committer puts a finished record
/// carrying a turn, down once an evicted task's rows are deleted. Two conversations of one
/// hash share a count, which only keeps a tombstone longer.
#[derive(Default)]
pub(super) struct Carriers {
    hasher: Conversations,
    counts: Counts,
}

impl Carriers {
    /// Counts a load made with `hasher`.
    pub(super) fn new(hasher: Conversations, counts: Counts) -> Self {
        Self { hasher, counts }
    }

    /// Its conversation's hash.
    pub(super) fn conversation(
        &self,
        principal: &Principal,
        context: &ContextId,
        since: i64,
    ) -> u64 {
        self.hasher.hash(principal, context, since)
    }

    /// A record carrying a turn of the conversation was written.
    pub(super) fn add(&mut self, principal: &Principal, context: &ContextId, since: i64) {
        let hash = self.conversation(principal, context, since);
        *self.counts.entry(hash).or_default() += 1;
    }

    /// Those evicted tasks' rows were deleted, with the turns their records carried.
    pub(super) fn deleted(&mut self, evicted: &[Evicted]) {
        for e in evicted {
            if let Some(c) = &e.turn {
                let hash = self.conversation(&e.key.principal, &c.context, c.turn.since);
                if let Entry::Occupied(mut n) = self.counts.entry(hash) {
                    *n.get_mut() -= 1;
                    if *n.get() == 0 {
                        n.remove();
                    }
                }
            }
        }
        if self.counts.capacity() > 1024 && self.counts.len() < self.counts.capacity() / 4 {
            self.counts.shrink_to_fit();
        }
    }

    /// Whether a record carrying a turn of conversation `hash` may still be in the file.
    pub(super) fn holds(&self, hash: u64) -> bool {
        self.counts.contains_key(&hash)
    }

    /// [`Carriers::holds`], of the conversation.
    pub(super) fn carried(&self, principal: &Principal, context: &ContextId, since: i64) -> bool {
        self.holds(self.conversation(principal, context, since))
    }
}
