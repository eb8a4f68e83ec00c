//! The log's bytes. A segment file is a 16-byte header (`A2ADLOG\n`, the format's version,
//! 4 reserved bytes) and then frames, one per durable batch: the payload's length and its
//! CRC-32 (both little-endian u32), then the payload — a sequence of operations on the
//! store's tables:
//!
//! | op | bytes |
//! |---|---|
//! | put | `1`, table, key length (u32), key, value length (u32), value |
//! | remove | `2`, table, key length (u32), key |
//! | remove range | `3`, table, start length (u32), start, end length (u32), end |
//!
//! A frame is written with one `pwrite` and made durable with one `fdatasync` before
//! anything it holds is acknowledged, so only the last frame of the newest segment can be
//! incomplete after a crash; see [`next`] for how that is told apart from damage. The
//! newest segment may run on in zeros after its last frame (it was written whole in
//! advance, or a direct write filled its last block): zeros from a frame's start to the end of the newest segment are its end
//! ([`zeros_from`]); anywhere else they are damage like any unreadable bytes.

use super::super::tables::Table;

/// The first bytes of every segment.
pub(crate) const MAGIC: &[u8; 8] = b"A2ADLOG\n";
/// The format this build writes (and the newest it reads). 2: a task's record may carry
/// its conversation turn, and a forgotten conversation leaves a tombstone (turn 0) — rows
/// an a2ad of format 1 would misread, so it is told to refuse the directory. 3: rows of
/// tag 2 (codec/binary.rs: extensions, part metadata). Older segments read as they are.
pub(crate) const VERSION: u32 = 3;
/// A segment's header: magic, version, reserved.
pub(crate) const HEADER: usize = 16;
/// A frame's header: payload length, CRC-32.
pub(crate) const FRAME_HEADER: usize = 8;
/// The largest payload a frame may declare (a batch is far smaller).
pub(crate) const MAX_PAYLOAD: usize = 1 << 30;

const PUT: u8 = 1;
const REMOVE: u8 = 2;
const REMOVE_RANGE: u8 = 3;

/// A segment's header.
pub(crate) fn header() -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h
}

/// What a segment's first bytes say.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Header {
    /// One of ours, of a version this build reads.
    Ours,
    /// Shorter than a header (a segment whose creation a crash cut short).
    Short,
    /// Not an a2ad log.
    Foreign,
    /// Written by a newer a2ad.
    Newer(u32),
}

/// Reads a segment's header.
pub(crate) fn check_header(bytes: &[u8]) -> Header {
    if bytes.len() < HEADER {
        return if MAGIC.starts_with(bytes) || bytes.iter().all(|b| *b == 0) {
            Header::Short
        } else {
            Header::Foreign
        };
    }
    if &bytes[..8] != MAGIC {
        return Header::Foreign;
    }
    match u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) {
        v if v > VERSION => Header::Newer(v),
        0 => Header::Foreign,
        _ => Header::Ours,
    }
}

/// A frame being built: room for its header, then operations.
pub(crate) struct FrameBuf(Vec<u8>);

impl Default for FrameBuf {
    fn default() -> Self {
        Self(vec![0; FRAME_HEADER])
    }
}

impl FrameBuf {
    /// An empty frame in `buf`'s memory.
    pub(crate) fn reusing(mut buf: Vec<u8>) -> Self {
        buf.clear();
        buf.resize(FRAME_HEADER, 0);
        Self(buf)
    }

    /// The buffer, for reuse.
    pub(crate) fn into_inner(self) -> Vec<u8> {
        self.0
    }

    /// Nothing but the header's room.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.len() == FRAME_HEADER
    }

    fn part(&mut self, bytes: &[u8]) {
        self.0
            .extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_le_bytes());
        self.0.extend_from_slice(bytes);
    }

    /// Adds a put; returns where its value starts in the frame.
    pub(crate) fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> usize {
        self.put_with(table, key, &mut |buf| buf.extend_from_slice(value))
    }

    /// Adds a put whose value `encode` appends to the frame (its length filled in after);
    /// returns where the value starts in the frame.
    pub(crate) fn put_with(
        &mut self,
        table: Table,
        key: &[u8],
        encode: &mut dyn FnMut(&mut Vec<u8>),
    ) -> usize {
        self.0.extend_from_slice(&[PUT, table.code()]);
        self.part(key);
        let len_at = self.0.len();
        self.0.extend_from_slice(&[0; 4]);
        let at = self.0.len();
        encode(&mut self.0);
        let len = u32::try_from(self.0.len() - at).unwrap_or(u32::MAX);
        self.0[len_at..at].copy_from_slice(&len.to_le_bytes());
        at
    }

    /// Adds a remove.
    pub(crate) fn remove(&mut self, table: Table, key: &[u8]) {
        self.0.extend_from_slice(&[REMOVE, table.code()]);
        self.part(key);
    }

    /// Adds a range remove.
    pub(crate) fn remove_range(&mut self, table: Table, start: &[u8], end: &[u8]) {
        self.0.extend_from_slice(&[REMOVE_RANGE, table.code()]);
        self.part(start);
        self.part(end);
    }

    /// Bytes so far, the header's room included.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The payload so far.
    pub(crate) fn payload(&self) -> &[u8] {
        &self.0[FRAME_HEADER..]
    }

    /// The finished frame: its header filled in.
    pub(crate) fn seal(&mut self) -> &[u8] {
        let payload = self.0.len() - FRAME_HEADER;
        let crc = crc32fast::hash(&self.0[FRAME_HEADER..]);
        self.0[..4].copy_from_slice(&u32::try_from(payload).unwrap_or(u32::MAX).to_le_bytes());
        self.0[4..8].copy_from_slice(&crc.to_le_bytes());
        &self.0
    }
}

/// One operation of a payload; values and keys borrow from it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Op<'a> {
    /// Set a row; `at` is where the value starts in the payload.
    Put {
        /// The table.
        table: Table,
        /// The key.
        key: &'a [u8],
        /// The value.
        value: &'a [u8],
        /// The value's offset in the payload.
        at: usize,
    },
    /// Remove a row.
    Remove {
        /// The table.
        table: Table,
        /// The key.
        key: &'a [u8],
    },
    /// Remove the rows of a range.
    RemoveRange {
        /// The table.
        table: Table,
        /// First key.
        start: &'a [u8],
        /// End (excluded).
        end: &'a [u8],
    },
}

/// Decodes a payload's operations. `None` when any of it is malformed (a checksum that
/// matched over bytes this build did not write).
pub(crate) fn ops(payload: &[u8]) -> Option<Vec<Op<'_>>> {
    let mut out = Vec::new();
    each_op(payload, |op| out.push(op)).then_some(out)
}

/// Calls `f` with each operation of a payload, in order; false when some of it is
/// malformed (the operations before that were passed on).
pub(crate) fn each_op<'a>(payload: &'a [u8], mut f: impl FnMut(Op<'a>)) -> bool {
    let part = |at: &mut usize| -> Option<(&'a [u8], usize)> {
        let len = payload.get(*at..*at + 4)?;
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let start = *at + 4;
        let bytes = payload.get(start..start.checked_add(len)?)?;
        *at = start + len;
        Some((bytes, start))
    };
    let mut at = 0usize;
    let one = |at: &mut usize| -> Option<Op<'a>> {
        let (op, table) = (*payload.get(*at)?, *payload.get(*at + 1)?);
        let table = Table::from_code(table)?;
        *at += 2;
        Some(match op {
            PUT => {
                let (key, _) = part(at)?;
                let (value, start) = part(at)?;
                Op::Put {
                    table,
                    key,
                    value,
                    at: start,
                }
            }
            REMOVE => Op::Remove {
                table,
                key: part(at)?.0,
            },
            REMOVE_RANGE => {
                let (start, _) = part(at)?;
                let (end, _) = part(at)?;
                Op::RemoveRange { table, start, end }
            }
            _ => return None,
        })
    };
    while at < payload.len() {
        match one(&mut at) {
            Some(op) => f(op),
            None => return false,
        }
    }
    true
}

/// What follows a position in a segment's bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next<'a> {
    /// A whole frame whose checksum holds: its payload, and where the next one starts.
    Frame {
        /// The payload.
        payload: &'a [u8],
        /// Where the next frame starts.
        next: usize,
    },
    /// The end of the bytes.
    End,
    /// An incomplete or unreadable frame with no whole frame after it: the tail of a write
    /// that a crash cut short (never acknowledged).
    Torn,
    /// An unreadable frame followed by whole ones: damage.
    Damaged,
}

/// A whole frame with a matching checksum at `at`, if there is one.
fn whole(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let head = bytes.get(at..at.checked_add(FRAME_HEADER)?)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if len == 0 || len > MAX_PAYLOAD {
        return None;
    }
    let start = at + FRAME_HEADER;
    let payload = bytes.get(start..start.checked_add(len)?)?;
    (crc32fast::hash(payload) == crc).then_some((payload, start + len))
}

/// Only zeros from `at` to the end (and at least one): the unwritten rest of a segment
/// written in advance.
pub(crate) fn zeros_from(bytes: &[u8], at: usize) -> bool {
    bytes
        .get(at..)
        .is_some_and(|rest| !rest.is_empty() && rest.iter().all(|b| *b == 0))
}

/// The frame at `at`. A frame that is incomplete or fails its checksum is the torn tail
/// of the log when no whole frame starts anywhere after it, and damage when one does (a
/// crash only ever cuts the last write short).
pub(crate) fn next(bytes: &[u8], at: usize) -> Next<'_> {
    if at >= bytes.len() {
        return Next::End;
    }
    if let Some((payload, next)) = whole(bytes, at) {
        return Next::Frame { payload, next };
    }
    if (at + 1..bytes.len()).any(|later| whole(bytes, later).is_some()) {
        Next::Damaged
    } else {
        Next::Torn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ops: impl FnOnce(&mut FrameBuf)) -> Vec<u8> {
        let mut f = FrameBuf::default();
        ops(&mut f);
        f.seal().to_vec()
    }

    #[test]
    fn operations_come_back_as_they_were_written() {
        let mut f = FrameBuf::default();
        let at = f.put(Table::Events, b"k1", b"value");
        f.remove(Table::Push, b"k2");
        f.remove_range(Table::Turns, b"a", b"b");
        let bytes = f.seal().to_vec();
        assert_eq!(&bytes[at..at + 5], b"value");
        let Next::Frame { payload, next } = super::next(&bytes, 0) else {
            panic!("a whole frame")
        };
        assert_eq!(next, bytes.len());
        assert_eq!(
            ops(payload).expect("decodes"),
            vec![
                Op::Put {
                    table: Table::Events,
                    key: b"k1",
                    value: b"value",
                    at: at - FRAME_HEADER,
                },
                Op::Remove {
                    table: Table::Push,
                    key: b"k2"
                },
                Op::RemoveRange {
                    table: Table::Turns,
                    start: b"a",
                    end: b"b"
                },
            ]
        );
    }

    #[test]
    fn a_value_encoded_into_the_frame_is_the_put_of_the_same_bytes() {
        let value = b"an encoded row".as_slice();
        let copied = frame(|f| {
            f.put(Table::Tasks, b"k0", b"first");
            f.put(Table::Events, b"k1", value);
            f.put(Table::Tasks, b"k2", b"");
        });
        let encoded = frame(|f| {
            f.put(Table::Tasks, b"k0", b"first");
            f.put_with(Table::Events, b"k1", &mut |buf| {
                buf.extend_from_slice(value)
            });
            f.put_with(Table::Tasks, b"k2", &mut |_| {});
        });
        assert_eq!(encoded, copied, "its length is filled in after it");
    }
    #[test]
    fn a_cut_short_last_frame_is_torn_and_a_bad_one_before_a_whole_one_is_damage() {
        let a = frame(|f| {
            f.put(Table::Tasks, b"a", &[7; 100]);
        });
        let b = frame(|f| {
            f.put(Table::Tasks, b"b", &[8; 100]);
        });
        let mut log = a.clone();
        log.extend_from_slice(&b);
        // Every cut inside the second frame is a torn tail after the first.
        for cut in a.len() + 1..log.len() {
            assert_eq!(next(&log[..cut], a.len()), Next::Torn, "cut at {cut}");
        }
        // Zeros where the last frame should be (a size extended, the data never written).
        let mut zeros = a.clone();
        zeros.extend_from_slice(&[0; 64]);
        assert_eq!(next(&zeros, a.len()), Next::Torn);
        // A flipped byte in the first frame, with a whole frame after it: damage.
        let mut bad = log.clone();
        bad[20] ^= 0x40;
        assert_eq!(next(&bad, 0), Next::Damaged);
        // The same flip in the last frame: indistinguishable from a torn write.
        let mut last = log.clone();
        let i = a.len() + 20;
        last[i] ^= 0x40;
        assert_eq!(next(&last, a.len()), Next::Torn);
        assert_eq!(next(&log, log.len()), Next::End);
    }

    #[test]
    fn malformed_payloads_are_refused_not_misread() {
        assert_eq!(ops(&[9, 0]), None, "unknown op");
        assert_eq!(ops(&[1, 9, 0, 0, 0, 0]), None, "unknown table");
        assert_eq!(ops(&[1, 0, 200, 0, 0, 0, 1]), None, "key past the end");
        assert_eq!(ops(&[2]), None, "cut op");
        assert_eq!(ops(&[]), Some(Vec::new()));
    }

    #[test]
    fn any_bytes_are_read_without_a_panic() {
        let mut log = frame(|f| {
            f.put(Table::Tasks, b"a", b"1");
            f.remove_range(Table::Events, b"a", b"b");
        });
        super::super::check_any(&log);
        log.extend_from_slice(&[3, 0, 0, 0, 9]);
        super::super::check_any(&log);
        super::super::check_any(&[0xff; 64]);
    }

    #[test]
    fn headers_are_told_apart() {
        assert_eq!(check_header(&header()), Header::Ours);
        assert_eq!(check_header(&header()[..5]), Header::Short);
        assert_eq!(check_header(&[]), Header::Short);
        assert_eq!(check_header(b"SQLite format 3\0"), Header::Foreign);
        let mut newer = header();
        newer[8] = 9;
        assert_eq!(check_header(&newer), Header::Newer(9));
    }
}
