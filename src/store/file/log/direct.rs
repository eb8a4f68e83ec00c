//! Frames written past the page cache. A buffered `pwrite` copies a frame into the page
//! cache and the `fdatasync` after it writes those pages back, waits, and flushes the
//! disk's cache; with `O_DIRECT` the frame goes from memory to the disk in the write
//! itself, and the `fdatasync` is left with the flush. Measured on the reference machine
//! (a program outside the project, 4,000 appends each, into a segment written in advance):
//! a 36 KB batch 169–200 µs and 52–68 µs of CPU buffered, 128–140 µs and 24–36 µs direct;
//! a 1.5 KB one 143–154 µs / 35–44 µs against 111–124 µs / 23–33 µs (docs/decisions/frames-past-the-page-cache.md).
//! The `fdatasync` stays: durability is decided exactly as before, by the same call.
//!
//! Direct I/O moves whole blocks ([`BLOCK`]) from block-aligned memory. The log's end is
//! rarely on a block boundary, so each write starts at the block that holds the end: the
//! bytes already there (kept in memory, at the start of the aligned buffer), then the
//! frame, then zeros to the next boundary (already in the buffer). Those zeros are the end
//! of the log as in a segment written in advance; a segment is cut back to its last frame
//! before the next one is begun ([`LogDisk::rotate`](super::LogDisk)), so only the newest
//! ever ends in them. Rewriting the bytes already there is what writeback does anyway (it
//! writes whole pages).
//!
//! A file system that refuses direct I/O (at open, or with `EINVAL` on the first write)
//! is written through the page cache as before.

use std::fs::File;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::Path;

/// The unit of a direct write: offsets, lengths and memory aligned to it. 4 KiB is a
/// multiple of every common logical block size (512 B, 4 KiB); a device with larger
/// blocks refuses the first write, and the log falls back to the page cache.
pub(super) const BLOCK: usize = 4096;

/// The newest segment, opened for direct writes.
pub(super) struct Direct {
    file: File,
    /// Block-aligned at `at`: the segment's bytes from the start of the block holding its
    /// end up to the end (`kept` of them), then bytes left from earlier writes up to
    /// `dirty`, then zeros to the buffer's end. A write adds its frame after the kept
    /// bytes, zeros what is left after it, and sends whole blocks: the kept bytes are
    /// never copied, and only bytes an earlier write left are zeroed.
    buf: Vec<u8>,
    /// Where the aligned block starts in `buf`.
    at: usize,
    /// How many bytes of the segment's last block are held.
    kept: usize,
    /// Where the zeros begin (relative to `at`).
    dirty: usize,
}

impl Direct {
    /// Opens the segment at `path`, whose log ends at `len`, for direct writes; `file`
    /// (the buffered descriptor) reads the bytes before `len` in its last block. `None`
    /// where the file system refuses.
    pub(super) fn open(path: &Path, file: &File, len: u64) -> Option<Self> {
        let direct = File::options()
            .write(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(path)
            .ok()?;
        let kept = (len % BLOCK as u64) as usize;
        let mut d = Self {
            file: direct,
            buf: Vec::new(),
            at: 0,
            kept: 0,
            dirty: 0,
        };
        d.grow(BLOCK);
        file.read_exact_at(&mut d.buf[d.at..d.at + kept], len - kept as u64)
            .ok()?;
        d.kept = kept;
        d.dirty = kept;
        Some(d)
    }

    /// A zeroed buffer with `whole` aligned bytes, the kept bytes moved to its start.
    fn grow(&mut self, whole: usize) {
        let mut buf = vec![0u8; whole + BLOCK];
        let at = buf.as_ptr().align_offset(BLOCK);
        buf[at..at + self.kept].copy_from_slice(&self.buf[self.at..self.at + self.kept]);
        self.buf = buf;
        self.at = at;
        self.dirty = self.kept;
    }

    /// Writes `bytes` at `len`, the end of the log (not yet durable: the caller syncs).
    /// `EINVAL` means the file system will not take direct writes at all.
    pub(super) fn write(&mut self, bytes: &[u8], len: u64) -> std::io::Result<()> {
        let kept = self.kept;
        let start = len - kept as u64;
        if !start.is_multiple_of(BLOCK as u64) {
            return Err(std::io::Error::other(
                "the direct writer lost track of the log's end",
            ));
        }
        let used = kept + bytes.len();
        let whole = used.div_ceil(BLOCK) * BLOCK;
        if self.buf.len() < self.at + whole {
            self.grow(whole);
        }
        let region = &mut self.buf[self.at..];
        region[kept..used].copy_from_slice(bytes);
        // What this write sends past the log's end is zeroed; stale bytes beyond the
        // blocks it sends stay until a write reaches them (`dirty` still covers them).
        let stale = self.dirty.min(whole);
        if stale > used {
            region[used..stale].fill(0);
        }
        if self.dirty <= whole {
            self.dirty = used;
        }
        self.file.write_all_at(&region[..whole], start)?;
        // The new last block's bytes move to the start; what they leave is zeroed by the
        // write that sends it next.
        let now_kept = used % BLOCK;
        let from = used - now_kept;
        if from > 0 {
            region.copy_within(from..used, 0);
        }
        self.kept = now_kept;
        Ok(())
    }

    /// The scratch buffer's size (it is let go when a huge batch made it large).
    pub(super) fn scratch(&self) -> usize {
        self.buf.capacity()
    }

    /// Lets the large scratch buffer go, keeping one block for the kept bytes.
    pub(super) fn release(&mut self) {
        self.grow(BLOCK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of its own, removed afterwards.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        /// A new file holding `bytes`, opened buffered (as the log's reader is) and for
        /// direct writes after them; `None` where the file system refuses direct I/O.
        fn with(bytes: &[u8]) -> (Self, Option<Direct>) {
            let scratch =
                Self(std::env::temp_dir().join(format!("a2ad-direct-{}", uuid::Uuid::new_v4())));
            let file = File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&scratch.0)
                .expect("created");
            file.write_all_at(bytes, 0).expect("written");
            let direct = Direct::open(&scratch.0, &file, bytes.len() as u64);
            (scratch, direct)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn writes_land_where_a_buffered_write_would_and_leave_zeros_to_the_block_end() {
        let (scratch, direct) = Scratch::with(b"0123456789abcdef");
        let Some(mut d) = direct else {
            // This file system refuses direct I/O: the log writes buffered there.
            return;
        };
        let path = &scratch.0;
        let mut expected = b"0123456789abcdef".to_vec();
        // Within a block, across one, exactly to one, and several blocks at once.
        // After the large one, the scratch buffer is let go (its kept bytes stay), and
        // the writes go on. A short write after a long one leaves stale bytes beyond the
        // blocks it sends; the longer writes after it reach them.
        for size in [
            100,
            4000,
            BLOCK * 2 - 4116,
            3 * BLOCK + 5,
            7,
            BLOCK,
            2 * BLOCK - 3,
            1,
            BLOCK + 900,
            2,
            2 * BLOCK,
            5,
        ] {
            let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8 + 1).collect();
            d.write(&bytes, expected.len() as u64).expect("written");
            if size > 2 * BLOCK {
                d.release();
            }
            expected.extend_from_slice(&bytes);
            let on_disk = std::fs::read(path).expect("read back");
            assert_eq!(&on_disk[..expected.len()], &expected[..]);
            assert_eq!(on_disk.len() % BLOCK, 0, "whole blocks");
            assert!(on_disk[expected.len()..].iter().all(|b| *b == 0));
        }
    }

    #[test]
    fn a_writer_that_lost_the_end_refuses_rather_than_writing_elsewhere() {
        let (scratch, direct) = Scratch::with(&[7u8; 20]);
        let Some(mut d) = direct else {
            return;
        };
        assert!(d.write(b"x", 21).is_err());
        assert_eq!(std::fs::read(&scratch.0).expect("read"), vec![7u8; 20]);
    }
}
