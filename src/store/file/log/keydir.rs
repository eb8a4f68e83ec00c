//! Where each row of the log lives: per table, an ordered map from the row's key to the
//! place of its newest value in a segment, and the live bytes each segment holds (what
//! compaction weighs). Values stay on disk; the keys are in memory.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use foldhash::fast::RandomState;

use super::super::tables::Table;
use super::frame;

/// The place of a value: segment, offset in the segment file, length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    /// The segment's number.
    pub seg: u32,
    /// Where the value starts in the segment file.
    pub at: u64,
    /// Its length.
    pub len: u32,
}

/// The bytes a row keeps alive in its segment: key, value and the op's framing.
fn weight(key: &[u8], loc: &Loc) -> u64 {
    key.len() as u64 + u64::from(loc.len) + 10
}

/// A key as the maps hold it: its first 8 bytes as a big-endian number (zero-padded), how
/// many of those 8 it has, and the rest. Ordered exactly as the bytes are, but a
/// comparison is mostly one integer compare: every row key of the store begins with a
/// time (a task's or a conversation's creation) that nearly always tells two keys apart.
type Key = (u64, u8, Box<[u8]>);

fn head(key: &[u8]) -> (u64, u8, &[u8]) {
    let n = key.len().min(8);
    let mut first = [0u8; 8];
    first[..n].copy_from_slice(&key[..n]);
    (u64::from_be_bytes(first), n as u8, &key[n..])
}

fn key_of(key: &[u8]) -> Key {
    let (h, n, rest) = head(key);
    (h, n, rest.into())
}

fn bytes_of(key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(usize::from(key.1) + key.2.len());
    out.extend_from_slice(&key.0.to_be_bytes()[..usize::from(key.1)]);
    out.extend_from_slice(&key.2);
    out
}

/// Every row's place.
#[derive(Default)]
pub(crate) struct Keydir {
    tables: [BTreeMap<Key, Loc>; 5],
    live: HashMap<u32, u64, RandomState>,
}

impl Keydir {
    fn table(&self, t: Table) -> &BTreeMap<Key, Loc> {
        &self.tables[usize::from(t.code())]
    }

    fn unlive(live: &mut HashMap<u32, u64, RandomState>, key: &[u8], loc: &Loc) {
        if let Some(n) = live.get_mut(&loc.seg) {
            *n = n.saturating_sub(weight(key, loc));
        }
    }

    /// Sets a row's place.
    pub(crate) fn put(&mut self, t: Table, key: &[u8], loc: Loc) {
        *self.live.entry(loc.seg).or_default() += weight(key, &loc);
        match self.tables[usize::from(t.code())].entry(key_of(key)) {
            Entry::Occupied(mut old) => {
                let was = std::mem::replace(old.get_mut(), loc);
                Self::unlive(&mut self.live, key, &was);
            }
            Entry::Vacant(slot) => {
                slot.insert(loc);
            }
        }
    }

    /// Forgets a row.
    pub(crate) fn remove(&mut self, t: Table, key: &[u8]) {
        if let Some(was) = self.tables[usize::from(t.code())].remove(&key_of(key)) {
            Self::unlive(&mut self.live, key, &was);
        }
    }

    /// Forgets the rows of `start..end`.
    pub(crate) fn remove_range(&mut self, t: Table, start: &[u8], end: &[u8]) {
        if start >= end {
            return;
        }
        let table = &mut self.tables[usize::from(t.code())];
        let keys: Vec<Key> = table
            .range((Bound::Included(key_of(start)), Bound::Excluded(key_of(end))))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            if let Some(was) = table.remove(&k) {
                Self::unlive(&mut self.live, &bytes_of(&k), &was);
            }
        }
    }

    /// Applies one decoded operation of a frame whose payload starts at `payload_at` in
    /// segment `seg`.
    pub(crate) fn apply(&mut self, seg: u32, payload_at: u64, op: &frame::Op<'_>) {
        match *op {
            frame::Op::Put {
                table,
                key,
                value,
                at,
            } => self.put(
                table,
                key,
                Loc {
                    seg,
                    at: payload_at + at as u64,
                    len: u32::try_from(value.len()).unwrap_or(u32::MAX),
                },
            ),
            frame::Op::Remove { table, key } => self.remove(table, key),
            frame::Op::RemoveRange { table, start, end } => self.remove_range(table, start, end),
        }
    }

    /// A row's place.
    pub(crate) fn get(&self, t: Table, key: &[u8]) -> Option<Loc> {
        self.table(t).get(&key_of(key)).copied()
    }

    /// The rows of `start..end` (`None`: to the end), in key order.
    pub(crate) fn range(
        &self,
        t: Table,
        start: &[u8],
        end: Option<&[u8]>,
    ) -> impl Iterator<Item = (Vec<u8>, Loc)> + '_ {
        // An empty range (a start at or past the end: `Last-Event-ID` beyond the last
        // number, say) holds nothing; the map would refuse it.
        let empty = end.is_some_and(|e| start >= e);
        let (start, end) = if empty {
            (
                Bound::Excluded(key_of(start)),
                Bound::Excluded(key_of(start)),
            )
        } else {
            (
                Bound::Included(key_of(start)),
                end.map_or(Bound::Unbounded, |e| Bound::Excluded(key_of(e))),
            )
        };
        let rows = if empty {
            None
        } else {
            Some(self.table(t).range((start, end)))
        };
        rows.into_iter().flatten().map(|(k, l)| (bytes_of(k), *l))
    }

    /// The bytes live in a segment.
    #[cfg(test)]
    pub(crate) fn live_in(&self, seg: u32) -> u64 {
        self.live.get(&seg).copied().unwrap_or(0)
    }

    /// The bytes live in all segments.
    pub(crate) fn live(&self) -> u64 {
        self.live.values().sum()
    }

    /// A segment is gone: it must hold nothing live.
    pub(crate) fn drop_segment(&mut self, seg: u32) {
        self.live.remove(&seg);
    }

    /// Rows, over all tables.
    #[cfg(test)]
    pub(crate) fn rows(&self) -> usize {
        self.tables.iter().map(BTreeMap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(seg: u32, at: u64) -> Loc {
        Loc { seg, at, len: 5 }
    }

    #[test]
    fn live_bytes_follow_puts_overwrites_and_removes() {
        let mut k = Keydir::default();
        k.put(Table::Events, b"a1", loc(1, 0));
        k.put(Table::Events, b"a2", loc(1, 10));
        k.put(Table::Events, b"b1", loc(1, 20));
        assert_eq!(k.live_in(1), 3 * 17);
        k.put(Table::Events, b"a1", loc(2, 0));
        assert_eq!((k.live_in(1), k.live_in(2)), (2 * 17, 17));
        k.remove_range(Table::Events, b"a", b"b");
        assert_eq!((k.live_in(1), k.live_in(2)), (17, 0));
        assert_eq!(k.get(Table::Events, b"b1"), Some(loc(1, 20)));
        assert_eq!(k.get(Table::Tasks, b"b1"), None, "tables are apart");
        assert_eq!(
            k.range(Table::Events, b"b2", Some(b"b")).count(),
            0,
            "an empty range"
        );
        assert_eq!(k.range(Table::Events, b"b", Some(b"b")).count(), 0);
        assert_eq!(
            k.range(Table::Events, b"b", Some(b"c")).collect::<Vec<_>>(),
            vec![(b"b1".to_vec(), loc(1, 20))]
        );
        k.remove(Table::Events, b"b1");
        assert_eq!((k.live(), k.rows()), (0, 0));
    }
}
