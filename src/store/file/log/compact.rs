//! Compaction's copies. A step reads the next frames of the oldest segment between two
//! batches and keeps the rows the keydir still finds there, each with the place it was
//! read from ([`read_step`]). The copies are not a commit of their own: the next frame
//! carries them ahead of its own operations ([`Copies::write`]), so a newer write in that
//! frame still wins, and only the copies whose row has not moved since they were read
//! are written (a delete or a newer write in between drops them). The segment goes once
//! the frame carrying its last copies is durable. So a step costs the requests a bounded
//! slice of the committer's CPU and a few more bytes in one write, never an `fdatasync` of
//! its own; with no batch to carry them, the copies go in a frame alone (`LogDisk`'s
//! `maintain`).

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::sync::RwLock;

use super::frame::{self, FrameBuf};
use super::keydir::{self, Keydir, Loc};
use super::segment_name;
use crate::store::file::tables::{DiskError, Table};

/// The live rows of one step of a compacted segment, waiting for a frame to carry them.
pub(super) struct Copies {
    /// The segment.
    pub(super) seg: u32,
    /// Where the step began in it (read again if the frame carrying it fails) and ended.
    pub(super) from: u64,
    pub(super) to: u64,
    /// Each row's key, then its value.
    bytes: Vec<u8>,
    /// Each row's table, key and value lengths, and where its value was read from.
    rows: Vec<(Table, usize, usize, Loc)>,
}

impl Copies {
    /// The rows the keydir still finds where they were read, written into `frame`;
    /// returns how many.
    pub(super) fn write(&self, frame: &mut FrameBuf, keydir: &Keydir) -> usize {
        let mut at = 0;
        let mut written = 0;
        for &(table, key_len, value_len, was) in &self.rows {
            let value_at = at + key_len;
            let end = value_at + value_len;
            let (key, value) = (&self.bytes[at..value_at], &self.bytes[value_at..end]);
            at = end;
            if keydir.get(table, key) == Some(was) {
                frame.put(table, key, value);
                written += 1;
            }
        }
        written
    }

    /// Whether a row of `table` under `key` was read.
    #[cfg(test)]
    pub(super) fn holds(&self, table: Table, key: &[u8]) -> bool {
        let mut at = 0;
        self.rows.iter().any(|&(t, key_len, value_len, _)| {
            let here = &self.bytes[at..at + key_len];
            at += key_len + value_len;
            t == table && here == key
        })
    }
}

/// Reads the frames of segment `seg` (`size` bytes long, open as `file`) from `from`
/// until at least `step` bytes were read or the segment ends, keeping the rows the keydir
/// finds there. A frame that runs past the segment's end or does not read is damage.
pub(super) fn read_step(
    file: &File,
    seg: u32,
    from: u64,
    size: u64,
    step: u64,
    keydir: &RwLock<Keydir>,
) -> Result<Copies, DiskError> {
    let mut copies = Copies {
        seg,
        from,
        to: from,
        bytes: Vec::new(),
        rows: Vec::new(),
    };
    let mut pos = from;
    let mut payload = Vec::new();
    while pos < size && pos < from + step {
        let mut head = [0u8; frame::FRAME_HEADER];
        file.read_exact_at(&mut head, pos)?;
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as u64;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let payload_at = pos + frame::FRAME_HEADER as u64;
        if len == 0 || payload_at + len > size {
            return Err(DiskError::Damaged(format!(
                "{} has a frame at offset {pos} that runs past its end",
                segment_name(seg)
            )));
        }
        payload.resize(len as usize, 0);
        file.read_exact_at(&mut payload, payload_at)?;
        let ops = (crc32fast::hash(&payload) == crc)
            .then(|| frame::ops(&payload))
            .flatten()
            .ok_or_else(|| {
                DiskError::Damaged(format!(
                    "{} has an unreadable frame at offset {pos}",
                    segment_name(seg)
                ))
            })?;
        let keydir = keydir.read().unwrap_or_else(|e| e.into_inner());
        for op in &ops {
            if let Some((table, key, value, here)) = keydir::put_at(op, seg, payload_at)
                && keydir.get(table, key) == Some(here)
            {
                copies.bytes.extend_from_slice(key);
                copies.bytes.extend_from_slice(value);
                copies.rows.push((table, key.len(), value.len(), here));
            }
        }
        drop(keydir);
        pos = payload_at + len;
    }
    copies.to = pos;
    Ok(copies)
}
