//! Containers that grow a piece at a time.
//!
//! A `HashMap` or a `VecDeque` grows by moving everything it holds into a table twice the
//! size: at a million entries that is one call that runs for tens of milliseconds (with
//! the new table's page faults), and on the runtime's worker every request waits behind it
//! (docs/decisions/growing-without-a-stall.md). The conversations, the finished tasks'
//! expiry queue and the conversations' touch queue are that large on a busy server, so
//! they are kept here: a map in 128 shards, each growing on its own, and a queue of
//! fixed-size chunks, which never moves what it holds.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash};

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

/// Shards of a [`ShardedMap`]: its largest growth moves 1/128 of what it holds.
const SHARDS: usize = 128;

/// A hash map kept as [`SHARDS`] tables, each growing on its own. The key is hashed once:
/// bits 40–46 of the hash pick the table (`hashbrown` takes a table's slot from the low
/// bits and its tag from the top seven). Each entry keeps its hash, so that a table grows
/// without reading a key again (a key's text is elsewhere in memory: a cache miss each).
pub(crate) struct ShardedMap<K, V> {
    shards: Box<[HashTable<(u64, K, V)>]>,
    hasher: RandomState,
    len: usize,
}

impl<K: Hash + Eq, V> ShardedMap<K, V> {
    /// An empty map with room for about `n` entries.
    pub(crate) fn with_capacity(n: usize) -> Self {
        let each = n.div_ceil(SHARDS);
        Self {
            shards: (0..SHARDS)
                .map(|_| HashTable::with_capacity(each))
                .collect(),
            hasher: RandomState::default(),
            len: 0,
        }
    }

    fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard(hash: u64) -> usize {
        (hash >> 40) as usize % SHARDS
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The value under `key`.
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        let hash = self.hash(key);
        self.shards[Self::shard(hash)]
            .find(hash, |(h, k, _)| *h == hash && k == key)
            .map(|(_, _, v)| v)
    }

    /// The value under `key`, to change.
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let hash = self.hash(key);
        self.shards[Self::shard(hash)]
            .find_mut(hash, |(h, k, _)| *h == hash && k == key)
            .map(|(_, _, v)| v)
    }

    /// Whether `key` has a value.
    pub(crate) fn contains_key(&self, key: &K) -> bool {
        self.get(key).is_some()
    }

    /// Puts `value` under `key`; returns the value it replaced.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        let hash = self.hash(&key);
        match self.shards[Self::shard(hash)].entry(
            hash,
            |(h, k, _)| *h == hash && *k == key,
            |(h, ..)| *h,
        ) {
            Entry::Occupied(mut e) => Some(std::mem::replace(&mut e.get_mut().2, value)),
            Entry::Vacant(e) => {
                e.insert((hash, key, value));
                self.len += 1;
                None
            }
        }
    }

    /// The value under `key`, made by `make` first when there is none.
    pub(crate) fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let hash = self.hash(&key);
        let Self { shards, len, .. } = self;
        match shards[Self::shard(hash)].entry(
            hash,
            |(h, k, _)| *h == hash && *k == key,
            |(h, ..)| *h,
        ) {
            Entry::Occupied(e) => &mut e.into_mut().2,
            Entry::Vacant(e) => {
                *len += 1;
                &mut e.insert((hash, key, make())).into_mut().2
            }
        }
    }

    /// Takes the value under `key` out.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let hash = self.hash(key);
        let (_, _, v) = self.shards[Self::shard(hash)]
            .find_entry(hash, |(h, k, _)| *h == hash && k == key)
            .ok()?
            .remove()
            .0;
        self.len -= 1;
        Some(v)
    }

    /// Gives back the room of tables that use under a quarter of it.
    pub(crate) fn shrink_sparse(&mut self) {
        for shard in &mut self.shards {
            if shard.capacity() > 64 && shard.len() < shard.capacity() / 4 {
                shard.shrink_to_fit(|(h, ..)| *h);
            }
        }
    }
}

/// Items a chunk of a [`ChunkedQueue`] holds: the largest growth, once the queue holds more,
/// is one chunk's allocation.
const CHUNK: usize = 4096;

/// A first-in, first-out queue kept in chunks of [`CHUNK`] items. The first chunk grows
/// as a `VecDeque` does (a small queue stays small); past it every chunk is allocated
/// whole, and each is freed once emptied, so nothing held is ever moved.
pub(crate) struct ChunkedQueue<T> {
    chunks: VecDeque<VecDeque<T>>,
}

impl<T> Default for ChunkedQueue<T> {
    fn default() -> Self {
        Self {
            chunks: VecDeque::new(),
        }
    }
}

impl<T> ChunkedQueue<T> {
    /// Items held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.chunks.iter().map(VecDeque::len).sum()
    }

    /// Whether it holds nothing.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.front().is_none()
    }

    /// Adds an item at the back.
    pub(crate) fn push_back(&mut self, item: T) {
        match self.chunks.back_mut() {
            Some(last) if last.len() < CHUNK => last.push_back(item),
            last => {
                let mut chunk = match last {
                    None => VecDeque::new(),
                    Some(_) => VecDeque::with_capacity(CHUNK),
                };
                chunk.push_back(item);
                self.chunks.push_back(chunk);
            }
        }
    }

    /// The item at the front.
    pub(crate) fn front(&self) -> Option<&T> {
        self.chunks.front().and_then(VecDeque::front)
    }

    /// The item at the back.
    #[cfg(test)]
    pub(crate) fn back(&self) -> Option<&T> {
        self.chunks.back().and_then(VecDeque::back)
    }

    /// Takes the item at the front; a chunk emptied is freed (the last one is kept).
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        let first = self.chunks.front_mut()?;
        let item = first.pop_front()?;
        if first.is_empty() && self.chunks.len() > 1 {
            self.chunks.pop_front();
        }
        Some(item)
    }

    /// The items, front to back.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    /// Gives back the room of a queue that emptied from many chunks to one.
    pub(crate) fn shrink_sparse(&mut self) {
        if self.chunks.capacity() > 64 && self.chunks.len() < self.chunks.capacity() / 4 {
            self.chunks.shrink_to_fit();
        }
        if self.chunks.len() == 1
            && let Some(only) = self.chunks.front_mut()
            && only.capacity() > 1024
            && only.len() < only.capacity() / 4
        {
            only.shrink_to_fit();
        }
    }
}

impl<T> Extend<T> for ChunkedQueue<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, items: I) {
        for item in items {
            self.push_back(item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_keeps_what_a_hash_map_keeps() {
        let mut map = ShardedMap::with_capacity(0);
        let mut model = std::collections::HashMap::new();
        // Inserts, replacements, removals and misses, over more keys than one shard's
        // first growth.
        for i in 0u64..20_000 {
            let key = (i * 7919) % 5_003;
            match i % 5 {
                0 | 1 => assert_eq!(map.insert(key, i), model.insert(key, i)),
                2 => assert_eq!(map.remove(&key), model.remove(&key)),
                3 => {
                    *map.get_or_insert_with(key, || 0) += 1;
                    *model.entry(key).or_insert(0) += 1;
                }
                _ => {
                    if let Some(v) = map.get_mut(&key) {
                        *v += 2;
                    }
                    if let Some(v) = model.get_mut(&key) {
                        *v += 2;
                    }
                }
            }
            assert_eq!(map.len(), model.len());
        }
        for key in 0..5_003 {
            assert_eq!(map.get(&key), model.get(&key), "key {key}");
            assert_eq!(map.contains_key(&key), model.contains_key(&key));
        }
    }

    #[test]
    fn the_map_spreads_its_keys_and_gives_room_back() {
        let mut map = ShardedMap::with_capacity(0);
        for i in 0..100_000u32 {
            map.insert(i, ());
        }
        let largest = map.shards.iter().map(HashTable::len).max().unwrap_or(0);
        // An even spread puts 781 in each; no table holds more than twice that.
        assert!(largest < 2 * 100_000 / SHARDS, "largest shard {largest}");
        let room: usize = map.shards.iter().map(HashTable::capacity).sum();
        for i in 0..99_000u32 {
            assert_eq!(map.remove(&i), Some(()));
        }
        map.shrink_sparse();
        let after: usize = map.shards.iter().map(HashTable::capacity).sum();
        assert!(after < room / 8, "room {room} → {after}");
        assert_eq!(map.len(), 1_000);
        assert!((99_000..100_000).all(|i| map.contains_key(&i)));
    }

    #[test]
    fn the_queue_is_first_in_first_out_across_chunks() {
        let mut q = ChunkedQueue::default();
        let mut model = VecDeque::new();
        let mut next = 0u32;
        // Grows over several chunks, drains most of them, grows again.
        for round in 0..3 {
            for _ in 0..(3 * CHUNK + 17) {
                q.push_back(next);
                model.push_back(next);
                next += 1;
            }
            let take = if round == 2 {
                model.len()
            } else {
                2 * CHUNK + 5
            };
            for _ in 0..take {
                assert_eq!(q.pop_front(), model.pop_front());
            }
            assert_eq!(q.len(), model.len());
            assert_eq!(q.front(), model.front());
            assert_eq!(q.back(), model.back());
            assert!(q.iter().eq(model.iter()));
        }
        assert!(q.is_empty());
        assert_eq!(q.pop_front(), None);
        // Emptied, it holds one chunk.
        assert_eq!(q.chunks.len(), 1);
        q.shrink_sparse();
        assert!(
            q.chunks.front().is_some_and(|c| c.capacity() < CHUNK),
            "room given back"
        );
        q.extend([1, 2, 3]);
        assert!(q.iter().copied().eq([1, 2, 3]));
    }

    #[test]
    fn past_its_first_chunk_the_queue_never_moves_an_item() {
        let mut q = ChunkedQueue::default();
        for i in 0..CHUNK {
            q.push_back(i);
        }
        let first = q.front().map_or(std::ptr::null(), |x| x as *const usize);
        for i in CHUNK..10 * CHUNK {
            q.push_back(i);
        }
        let still = q.front().map_or(std::ptr::null(), |x| x as *const usize);
        assert_eq!(first, still);
        assert_eq!(q.chunks.len(), 10);
        assert!(q.chunks.iter().all(|c| c.len() == CHUNK));
    }
}
