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

impl Loc {
    /// The place of a value that starts `at` bytes into a frame's payload, which starts at
    /// `payload_at` in segment `seg`.
    pub(crate) fn in_payload(seg: u32, payload_at: u64, at: usize, value: &[u8]) -> Self {
        Loc {
            seg,
            at: payload_at + at as u64,
            len: u32::try_from(value.len()).unwrap_or(u32::MAX),
        }
    }
}

/// A put's table, key, value and the place of its value, for an operation of a frame whose
/// payload starts at `payload_at` in segment `seg`; `None` for a removal.
pub(crate) fn put_at<'a>(
    op: &frame::Op<'a>,
    seg: u32,
    payload_at: u64,
) -> Option<(Table, &'a [u8], &'a [u8], Loc)> {
    match *op {
        frame::Op::Put {
            table,
            key,
            value,
            at,
        } => Some((
            table,
            key,
            value,
            Loc::in_payload(seg, payload_at, at, value),
        )),
        _ => None,
    }
}

/// The bytes a row keeps alive in its segment: key, value and the op's framing.
fn weight(key_len: usize, loc: &Loc) -> u64 {
    key_len as u64 + u64::from(loc.len) + 10
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

/// The length of the bytes a key stands for.
fn key_len(key: &Key) -> usize {
    usize::from(key.1) + key.2.len()
}

fn bytes_of(key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(key_len(key));
    out.extend_from_slice(&key.0.to_be_bytes()[..usize::from(key.1)]);
    out.extend_from_slice(&key.2);
    out
}

/// A task's rows: its record and its events (by number), under the task's key — one key
/// in memory for all of them (an event's key is its task's key and its number).
#[derive(Default, PartialEq)]
struct TaskRows {
    record: Option<Loc>,
    /// Ordered by number.
    events: Vec<(u64, Loc)>,
}

impl TaskRows {
    fn is_empty(&self) -> bool {
        self.record.is_none() && self.events.is_empty()
    }
}

/// An event's key split into its task's key and its number (`None`: shorter than a
/// number, so not an event's key of this store; kept as a plain row).
fn split_event(key: &[u8]) -> Option<(&[u8], u64)> {
    key.split_last_chunk::<8>()
        .map(|(task, seq)| (task, u64::from_be_bytes(*seq)))
}

/// Sets event `seq`'s place among a task's events; the place it replaces, if any.
fn put_event(events: &mut Vec<(u64, Loc)>, seq: u64, loc: Loc) -> Option<Loc> {
    match events.binary_search_by_key(&seq, |(n, _)| *n) {
        Ok(i) => Some(std::mem::replace(&mut events[i].1, loc)),
        Err(i) => {
            events.insert(i, (seq, loc));
            None
        }
    }
}

/// Whether the key of event `seq` of `task` (the task's key, then the number) is in
/// `start..end`, without building it.
fn in_range(task: &[u8], seq: u64, start: &[u8], end: Option<&[u8]>) -> bool {
    fn cmp(task: &[u8], seq: &[u8; 8], other: &[u8]) -> std::cmp::Ordering {
        let n = task.len().min(other.len());
        task.cmp(&other[..n])
            .then_with(|| seq.as_slice().cmp(&other[n..]))
    }
    let seq = seq.to_be_bytes();
    cmp(task, &seq, start).is_ge() && end.is_none_or(|e| cmp(task, &seq, e).is_lt())
}

/// Every row's place.
#[derive(Default, PartialEq)]
pub(crate) struct Keydir {
    /// Outbox, push configurations, turns (and event keys too short to be one).
    tables: [BTreeMap<Key, Loc>; 5],
    /// Task records and events.
    tasks: BTreeMap<Key, TaskRows>,
    live: HashMap<u32, u64, RandomState>,
}

impl Keydir {
    fn table(&self, t: Table) -> &BTreeMap<Key, Loc> {
        &self.tables[usize::from(t.code())]
    }

    fn unlive(live: &mut HashMap<u32, u64, RandomState>, key_len: usize, loc: &Loc) {
        if let Some(n) = live.get_mut(&loc.seg) {
            *n = n.saturating_sub(weight(key_len, loc));
        }
    }

    /// Sets a row's place.
    pub(crate) fn put(&mut self, t: Table, key: &[u8], loc: Loc) {
        *self.live.entry(loc.seg).or_default() += weight(key.len(), &loc);
        let was = match (t, split_event(key)) {
            (Table::Tasks, _) => self
                .tasks
                .entry(key_of(key))
                .or_default()
                .record
                .replace(loc),
            (Table::Events, Some((task, seq))) => put_event(
                &mut self.tasks.entry(key_of(task)).or_default().events,
                seq,
                loc,
            ),
            _ => self.tables[usize::from(t.code())].insert(key_of(key), loc),
        };
        if let Some(was) = was {
            Self::unlive(&mut self.live, key.len(), &was);
        }
    }

    /// Forgets a row.
    pub(crate) fn remove(&mut self, t: Table, key: &[u8]) {
        let (task, seq) = match (t, split_event(key)) {
            (Table::Tasks, _) => (key, None),
            (Table::Events, Some((task, seq))) => (task, Some(seq)),
            _ => {
                if let Some(was) = self.tables[usize::from(t.code())].remove(&key_of(key)) {
                    Self::unlive(&mut self.live, key.len(), &was);
                }
                return;
            }
        };
        let Entry::Occupied(mut rows) = self.tasks.entry(key_of(task)) else {
            return;
        };
        let was = match seq {
            None => rows.get_mut().record.take(),
            Some(seq) => {
                let events = &mut rows.get_mut().events;
                events
                    .binary_search_by_key(&seq, |(n, _)| *n)
                    .ok()
                    .map(|i| events.remove(i).1)
            }
        };
        if rows.get().is_empty() {
            rows.remove();
        }
        if let Some(was) = was {
            Self::unlive(&mut self.live, key.len(), &was);
        }
    }

    /// Forgets the rows of `start..end`.
    pub(crate) fn remove_range(&mut self, t: Table, start: &[u8], end: &[u8]) {
        if start >= end {
            return;
        }
        match t {
            Table::Tasks => {
                let range = (Bound::Included(key_of(start)), Bound::Excluded(key_of(end)));
                self.remove_task_rows(range, |k, rows, live| {
                    if let Some(was) = rows.record.take() {
                        Self::unlive(live, key_len(k), &was);
                    }
                });
            }
            Table::Events => {
                let lower = key_of(&start[..start.len().saturating_sub(8)]);
                let range = (Bound::Included(lower), Bound::Excluded(key_of(end)));
                self.remove_task_rows(range, |k, rows, live| {
                    if rows.events.is_empty() {
                        return;
                    }
                    let task = bytes_of(k);
                    rows.events.retain(|(seq, loc)| {
                        let inside = in_range(&task, *seq, start, Some(end));
                        if inside {
                            Self::unlive(live, task.len() + 8, loc);
                        }
                        !inside
                    });
                });
                self.remove_plain_range(t, start, end);
            }
            _ => self.remove_plain_range(t, start, end),
        }
    }

    /// Lets `f` take rows from each task in `range` (in place), then forgets the tasks
    /// left with none.
    fn remove_task_rows(
        &mut self,
        range: (Bound<Key>, Bound<Key>),
        mut f: impl FnMut(&Key, &mut TaskRows, &mut HashMap<u32, u64, RandomState>),
    ) {
        let mut emptied = Vec::new();
        for (k, rows) in self.tasks.range_mut(range) {
            f(k, rows, &mut self.live);
            if rows.is_empty() {
                emptied.push(k.clone());
            }
        }
        for k in emptied {
            self.tasks.remove(&k);
        }
    }

    /// Forgets the rows of `start..end` of a table of plain rows.
    fn remove_plain_range(&mut self, t: Table, start: &[u8], end: &[u8]) {
        let table = &mut self.tables[usize::from(t.code())];
        let keys: Vec<Key> = table
            .range((Bound::Included(key_of(start)), Bound::Excluded(key_of(end))))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            if let Some(was) = table.remove(&k) {
                Self::unlive(&mut self.live, key_len(&k), &was);
            }
        }
    }

    /// Applies the operations of a frame whose payload starts at `payload_at` in segment
    /// `seg`, as [`apply`](Self::apply) would one by one, but with one lookup of the task
    /// map for each run of puts of one task's rows (an echo task's record and three events:
    /// one lookup and one key instead of four). Puts of the other tables are in maps of
    /// their own, so they do not end a run; anything else does. False when some of the
    /// payload is malformed (the operations before that were applied).
    pub(crate) fn apply_frame(&mut self, seg: u32, payload_at: u64, payload: &[u8]) -> bool {
        let mut run: Option<&[u8]> = None;
        let mut rows: Vec<(Option<u64>, Loc)> = Vec::new();
        let whole = frame::each_op(payload, |op| {
            if let Some((table, key, _, loc)) = put_at(&op, seg, payload_at) {
                let row = match table {
                    Table::Tasks => Some((key, None)),
                    Table::Events => split_event(key).map(|(task, seq)| (task, Some(seq))),
                    _ => None,
                };
                let Some((task, seq)) = row else {
                    self.put(table, key, loc);
                    return;
                };
                if let Some(other) = run.filter(|r| *r != task) {
                    self.put_rows(other, &mut rows);
                }
                run = Some(task);
                rows.push((seq, loc));
                return;
            }
            if let Some(task) = run.take() {
                self.put_rows(task, &mut rows);
            }
            self.apply(seg, payload_at, &op);
        });
        if let Some(task) = run {
            self.put_rows(task, &mut rows);
        }
        whole
    }

    /// Puts a run of one task's rows (`None`: its record; else an event's number), in
    /// order, with one lookup.
    fn put_rows(&mut self, task: &[u8], rows: &mut Vec<(Option<u64>, Loc)>) {
        let Self { tasks, live, .. } = self;
        let entry = tasks.entry(key_of(task)).or_default();
        let key_len = |seq: &Option<u64>| task.len() + if seq.is_some() { 8 } else { 0 };
        // The run's rows are in one frame, so one segment: their live bytes are added at
        // once, before those of the rows they replace are taken off.
        if let Some((_, first)) = rows.first() {
            let added: u64 = rows
                .iter()
                .map(|(seq, loc)| weight(key_len(seq), loc))
                .sum();
            *live.entry(first.seg).or_default() += added;
        }
        for (seq, loc) in rows.drain(..) {
            let was = match seq {
                None => entry.record.replace(loc),
                Some(seq) => put_event(&mut entry.events, seq, loc),
            };
            if let Some(was) = was {
                Self::unlive(live, key_len(&seq), &was);
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
            } => self.put(table, key, Loc::in_payload(seg, payload_at, at, value)),
            frame::Op::Remove { table, key } => self.remove(table, key),
            frame::Op::RemoveRange { table, start, end } => self.remove_range(table, start, end),
        }
    }

    /// A row's place.
    pub(crate) fn get(&self, t: Table, key: &[u8]) -> Option<Loc> {
        match (t, split_event(key)) {
            (Table::Tasks, _) => self.tasks.get(&key_of(key)).and_then(|r| r.record),
            (Table::Events, Some((task, seq))) => {
                let events = &self.tasks.get(&key_of(task))?.events;
                let i = events.binary_search_by_key(&seq, |(n, _)| *n).ok()?;
                Some(events[i].1)
            }
            _ => self.table(t).get(&key_of(key)).copied(),
        }
    }

    /// The rows of `start..end` (`None`: to the end), in key order.
    ///
    /// Events are kept under their task's key; their order is the bytes' order because no
    /// task key of the store is a prefix of another (its parts are length-prefixed).
    pub(crate) fn range<'a>(
        &'a self,
        t: Table,
        start: &'a [u8],
        end: Option<&'a [u8]>,
    ) -> Box<dyn Iterator<Item = (Vec<u8>, Loc)> + 'a> {
        // An empty range (a start at or past the end: `Last-Event-ID` beyond the last
        // number, say) holds nothing; the maps would refuse it.
        if end.is_some_and(|e| start >= e) {
            return Box::new(std::iter::empty());
        }
        let upper = end.map_or(Bound::Unbounded, |e| Bound::Excluded(key_of(e)));
        let plain = |upper| {
            self.table(t)
                .range((Bound::Included(key_of(start)), upper))
                .map(|(k, l)| (bytes_of(k), *l))
        };
        match t {
            Table::Tasks => Box::new(
                self.tasks
                    .range((Bound::Included(key_of(start)), upper))
                    .filter_map(|(k, r)| Some((bytes_of(k), r.record?))),
            ),
            Table::Events => {
                // An event of a task whose key is at or past the end is past it too; one
                // at or past the start belongs to a task at or past the start less its
                // last 8 bytes.
                let lower = key_of(&start[..start.len().saturating_sub(8)]);
                let events = self
                    .tasks
                    .range((Bound::Included(lower), upper.clone()))
                    .flat_map(move |(k, r)| {
                        // Built once per task; the one closure owns it (a `filter` and a
                        // `map` would both need it).
                        let task = bytes_of(k);
                        #[allow(clippy::filter_map_bool_then)]
                        r.events.iter().filter_map(move |(seq, l)| {
                            in_range(&task, *seq, start, end)
                                .then(|| ([task.as_slice(), &seq.to_be_bytes()].concat(), *l))
                        })
                    });
                Box::new(events.chain(plain(upper)))
            }
            _ => Box::new(plain(upper)),
        }
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

    /// Tasks with rows (a record, events or both).
    pub(crate) fn tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Rows, over all tables.
    #[cfg(test)]
    pub(crate) fn rows(&self) -> usize {
        let tasks: usize = self
            .tasks
            .values()
            .map(|r| usize::from(r.record.is_some()) + r.events.len())
            .sum();
        tasks + self.tables.iter().map(BTreeMap::len).sum::<usize>()
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

    /// A task key as the store writes them: a time, then length-prefixed parts.
    fn task(time: u64, id: &str) -> Vec<u8> {
        let mut k = time.to_be_bytes().to_vec();
        k.extend_from_slice(&(id.len() as u32).to_be_bytes());
        k.extend_from_slice(id.as_bytes());
        k
    }

    fn event(task: &[u8], seq: u64) -> Vec<u8> {
        [task, &seq.to_be_bytes()].concat()
    }

    #[test]
    fn a_frame_applied_in_runs_leaves_what_its_operations_one_by_one_leave() {
        let (a, b) = (task(7, "a"), task(8, "b"));
        let mut f = frame::FrameBuf::default();
        // Runs of a's rows broken by another table's put (which does not end a run), by
        // b's rows, by a removal; an event written twice in one run; a short events key.
        f.put(Table::Events, &event(&a, 1), b"one");
        f.put(Table::Outbox, &event(&a, 1), b"delivery");
        f.put(Table::Events, &event(&a, 2), b"two");
        f.put(Table::Events, &event(&a, 1), b"one again");
        f.put(Table::Tasks, &a, b"record a");
        f.put(Table::Events, &event(&b, 1), b"b one");
        f.put(Table::Events, b"short", b"plain");
        f.put(Table::Tasks, &b, b"record b");
        f.remove(Table::Events, &event(&a, 2));
        f.put(Table::Tasks, &a, b"record a again");
        f.put(Table::Events, &event(&a, 3), b"three");
        f.remove_range(Table::Events, &event(&b, 0), &event(&b, 9));
        f.put(Table::Events, &event(&b, 2), b"b two");
        let payload = f.payload().to_vec();
        // On top of rows already there (an earlier frame's), in both.
        let mut one_by_one = Keydir::default();
        one_by_one.put(Table::Events, &event(&a, 1), loc(1, 0));
        one_by_one.put(Table::Tasks, &b, loc(1, 9));
        let mut grouped = Keydir::default();
        grouped.put(Table::Events, &event(&a, 1), loc(1, 0));
        grouped.put(Table::Tasks, &b, loc(1, 9));
        assert!(frame::each_op(&payload, |op| one_by_one.apply(2, 100, &op)));
        assert!(grouped.apply_frame(2, 100, &payload));
        assert!(grouped == one_by_one);
        assert_eq!(grouped.live_in(1), 0, "the earlier rows were replaced");
        assert_eq!(
            grouped.get(Table::Events, &event(&a, 1)).map(|l| l.len),
            Some(9),
            "the later of two puts"
        );
        assert_eq!(grouped.get(Table::Events, &event(&a, 2)), None);
        assert_eq!(grouped.get(Table::Events, &event(&b, 1)), None);
        assert_eq!(grouped.rows(), 7);
        // A malformed tail: what came before it is applied, and it says so.
        let mut cut = payload.clone();
        cut.push(9);
        assert!(!Keydir::default().apply_frame(2, 100, &cut));
    }

    #[test]
    fn a_tasks_record_and_events_share_its_key_and_read_in_byte_order() {
        let mut k = Keydir::default();
        // "ab" sorts before "abc" though its events' keys would interleave without the
        // length prefix.
        let (a, b, c) = (task(7, "ab"), task(7, "abc"), task(8, "a"));
        for (i, t) in [&b, &a, &c].into_iter().enumerate() {
            for seq in [3, 1, 2] {
                k.put(Table::Events, &event(t, seq), loc(1, i as u64 * 100 + seq));
            }
        }
        k.put(Table::Tasks, &b, loc(2, 0));
        assert_eq!(k.rows(), 10);
        let all: Vec<Vec<u8>> = k.range(Table::Events, b"", None).map(|(k, _)| k).collect();
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!((all.len(), &all), (9, &sorted));
        assert_eq!(k.get(Table::Events, &event(&b, 2)), Some(loc(1, 2)));
        assert_eq!(k.get(Table::Tasks, &b), Some(loc(2, 0)));
        assert_eq!(
            k.get(Table::Tasks, &a),
            None,
            "a task with events but no record"
        );
        // From an event on, to the end of its task.
        let end = [b.as_slice(), &[0xff; 9]].concat();
        let from: Vec<u64> = k
            .range(Table::Events, &event(&b, 2), Some(&end))
            .map(|(_, l)| l.at)
            .collect();
        assert_eq!(from, vec![2, 3]);
        // A task's rows go; its neighbours stay, with their live bytes.
        let before = k.live_in(1);
        k.remove(Table::Tasks, &b);
        k.remove_range(Table::Events, &b, &end);
        assert_eq!(k.rows(), 6);
        assert_eq!(k.live_in(2), 0);
        assert_eq!(k.live_in(1), before - 3 * (b.len() as u64 + 8 + 15));
        assert_eq!(
            k.range(Table::Tasks, b"", None).count(),
            0,
            "no record is left"
        );
        k.remove(Table::Events, &event(&a, 1));
        assert_eq!(k.get(Table::Events, &event(&a, 1)), None);
        assert_eq!(k.get(Table::Events, &event(&a, 3)), Some(loc(1, 103)));
        // Part of a task's events: from one number to the end of the task.
        k.put(Table::Events, &event(&a, 1), loc(1, 101));
        let a_end = [a.as_slice(), &[0xff; 9]].concat();
        k.remove_range(Table::Events, &event(&a, 2), &a_end);
        assert_eq!(k.get(Table::Events, &event(&a, 1)), Some(loc(1, 101)));
        assert_eq!(k.get(Table::Events, &event(&a, 2)), None);
        assert_eq!(k.get(Table::Events, &event(&c, 2)), Some(loc(1, 202)));
    }
}
