//! The log (`backend = "log"`, the default): the store's rows as framed operations
//! appended to segment files in one directory — one `pwrite` and one `fdatasync` per
//! batch — with the place of every row's newest value kept in memory ([`Keydir`]).
//!
//! - **Write path.** A batch becomes one frame (log/frame.rs) at the end of the newest
//!   segment, written past the page cache where the file system allows it
//!   (log/direct.rs); once it is durable its operations update the keydir. A segment
//!   that reaches [`SEGMENT_BYTES`] is cut back to its last frame and sealed, and the
//!   next one begun (the directory is synced first) — one written whole in advance when
//!   there is one (log/prealloc.rs), so that a commit's fdatasync need not also make a
//!   larger file size durable.
//! - **Reads.** Task records, push configurations and conversations are served from
//!   memory by the layers above; the one read that comes here is a finished task's events,
//!   one `pread` per event.
//! - **Bounded.** Between batches the committer compacts: when the segments hold more
//!   than half again what is live, the oldest segment's live rows are appended anew (in
//!   steps of [`STEP_BYTES`], each step's rows carried by the next frame ahead of its own
//!   operations: log/compact.rs) and the segment is deleted once the frame carrying its
//!   last rows is durable. Oldest first, so a removal that a compacted segment held can be
//!   dropped with it: nothing older remains for it to hide.
//! - **Restart.** Every segment is read in order into the keydir, then the rows are
//!   loaded like redb's. After a crash, only the newest segment's last frame can be
//!   incomplete: it is cut off (it was never acknowledged). An unreadable frame anywhere
//!   else is damage, and the start is refused.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

mod carry;
mod compact;
mod direct;
mod frame;
mod keydir;
mod prealloc;
#[cfg(test)]
mod tests;

use direct::Direct;
use frame::{FrameBuf, Header, Next};
use keydir::{Keydir, Loc};
use prealloc::Prealloc;

use super::load::{Loaded, damaged, guarded_load, load_beside, read_events, refuse_damage};
use super::tables::{DiskError, Table, TableRead, TableWrite};
use super::{Disk, open_error};
use crate::config::Config;
use crate::error::Result;
use crate::model::{Message, TaskEvent, TaskKey};
use crate::store::codec::{self, Created};
use crate::store::damage::Damaged;
use crate::store::index::Indexes;

/// A segment is sealed once it holds this many bytes.
pub(crate) const SEGMENT_BYTES: u64 = 64 << 20;
/// Bytes of a compacted segment read per step between batches (its live rows ride in the
/// next frame: log/compact.rs).
const STEP_BYTES: u64 = 256 << 10;
/// A frame buffer up to this size is kept for the next batch.
const SPARE_BYTES: usize = 4 << 20;
/// After a failed compaction step, the next one waits this long.
const COMPACT_BACKOFF: Duration = Duration::from_secs(5);
/// The lock file (held while a2ad runs).
const LOCK: &str = "LOCK";
/// Segment files: `<number, 10 digits>.a2l`.
const SUFFIX: &str = ".a2l";
/// A segment being created (renamed once its header is durable).
const TMP: &str = ".tmp";

fn segment_name(seg: u32) -> String {
    format!("{seg:010}{SUFFIX}")
}

fn segment_number(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(SUFFIX)?;
    (digits.len() == 10 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The log store's directory.
pub(super) struct LogDisk {
    dir: PathBuf,
    /// Held (locked) for as long as the store is open.
    _lock: File,
    keydir: RwLock<Keydir>,
    files: RwLock<HashMap<u32, Arc<File>>>,
    writer: Mutex<Writer>,
    bytes: AtomicU64,
    segment_bytes: u64,
    /// The next segment, written in advance.
    prealloc: Prealloc,
}

/// The write side (the committer's).
struct Writer {
    /// The newest segment, its file and length.
    seg: u32,
    file: Arc<File>,
    len: u64,
    /// The same file opened for direct writes (log/direct.rs); `None` where the file
    /// system refuses them.
    direct: Option<Direct>,
    /// Direct writes are not tried again (the file system refused one).
    buffered_only: bool,
    /// Its length when this process began writing it.
    begun: u64,
    /// It was written whole in advance: its file runs on, in zeros, past `len`.
    ahead: bool,
    /// The recent frames' mean size (a moving average over about eight).
    mean_frame: u64,
    /// Every segment's length.
    sizes: BTreeMap<u32, u64>,
    /// The segment being compacted and where its next frame starts.
    compacting: Option<(u32, u64)>,
    /// A compaction step's live rows, for the next frame to carry.
    copies: Option<compact::Copies>,
    /// No compaction before this (after a failure).
    calm_until: Option<Instant>,
    /// The last batch's frame buffer, kept for the next.
    spare: Vec<u8>,
    /// When beginning the next segment last failed (and was logged).
    rotate_failed: Option<Instant>,
}

fn io_at(path: &Path, what: &str, e: &std::io::Error) -> crate::Error {
    open_error(path, format!("{what}: {e}"))
}

/// Syncs a directory, so that files created or removed in it stay so after a crash.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

impl LogDisk {
    /// Opens (or creates) the log's directory, reads every segment into the keydir (cutting
    /// off a torn last frame), and loads the rows into `indexes`.
    pub(super) fn open(config: &Config, indexes: &Indexes) -> Result<(Self, Loaded)> {
        #[cfg(test)]
        let segment_bytes = tests::SEGMENT.with(std::cell::Cell::get);
        #[cfg(not(test))]
        let segment_bytes = SEGMENT_BYTES;

        let dir = PathBuf::from(config.store.path());
        if dir.is_file() {
            let parent = dir
                .parent()
                .map_or_else(|| ".".into(), |p| p.display().to_string());
            return Err(open_error(
                &dir,
                format!(
                    "is a file, not the log store's directory. If it is a redb store, serve it as it is with store.backend = \"redb\", or carry it over into the log store: rename it {parent}/{} and set store.path = \"{parent}/log\" (docs/CONFIG.md)",
                    carry::REDB
                ),
            ));
        }
        super::create_parent(&dir.join(LOCK))?;
        // Nothing is written before everything is read and checked: a start that is
        // refused leaves the directory exactly as it was (docs/CONFIG.md). A foreign
        // directory is refused before a lock file is made in it.
        let listed = list_dir(&dir)?;
        carry::carry_over(config, &dir, !listed.numbers.is_empty(), segment_bytes)?;
        let lock_path = dir.join(LOCK);
        let lock_existed = lock_path.exists();
        let lock = crate::store::private::file()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| io_at(&dir, "cannot be opened", &e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(open_error(
                    &dir,
                    "is in use by another a2ad (its LOCK file is locked); stop it or point store.path elsewhere",
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(io_at(&dir, "cannot be locked", &e));
            }
        }
        // A lock file this start made goes again if the start is refused.
        let made_lock = RemoveOnRefusal((!lock_existed).then(|| lock_path.clone()));
        // Listed again under the lock (a carry-over may have put segments in place).
        let Listed { mut numbers, tidy } = list_dir(&dir)?;
        numbers.sort_unstable();
        if let Some(w) = numbers.windows(2).find(|w| w[1] != w[0] + 1) {
            return Err(open_error(
                &dir,
                format!(
                    "is damaged: segment {} is missing between {} and {}; restore the directory from a backup",
                    w[0] + 1,
                    segment_name(w[0]),
                    segment_name(w[1])
                ),
            ));
        }
        let mut keydir = Keydir::default();
        let mut files = HashMap::new();
        let mut sizes = BTreeMap::new();
        let mut opened = Vec::new();
        let newest = numbers.last().copied();
        for &seg in &numbers {
            let path = dir.join(segment_name(seg));
            let file = File::options()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| io_at(&path, "cannot be opened", &e))?;
            opened.push((seg, path, Arc::new(file)));
        }
        // Threads read and check the segments ahead (each every `READERS`th one) while
        // this one points the keydir at the rows of each in turn, in order.
        const READERS: usize = 2;
        let scanning = Instant::now();
        let torn = &Mutex::new(None);
        let suspects = std::thread::scope(|s| -> Result<Vec<(Vec<u8>, Loc)>> {
            let mut readers = Vec::with_capacity(READERS);
            for first in 0..READERS.min(opened.len()) {
                let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Scanned>>(1);
                let (spent_tx, spent_rx) = std::sync::mpsc::channel::<Vec<u8>>();
                let opened = &opened;
                let read = move || {
                    let mut suspects = Vec::new();
                    for (seg, path, file) in opened.iter().skip(first).step_by(READERS) {
                        let mut bytes = spent_rx.try_recv().unwrap_or_default();
                        let scanned = scan_segment(
                            path,
                            file,
                            *seg,
                            Some(*seg) == newest,
                            &mut bytes,
                            &mut suspects,
                            torn,
                        )
                        .map(|(len, frames)| Scanned {
                            seg: *seg,
                            bytes,
                            frames,
                            len,
                        });
                        let failed = scanned.is_err();
                        if tx.send(scanned).is_err() || failed {
                            break;
                        }
                    }
                    suspects
                };
                let thread = std::thread::Builder::new()
                    .name("a2ad-replay".into())
                    .spawn_scoped(s, read)
                    .map_err(|e| io_at(&dir, "cannot start reading", &e))?;
                readers.push((thread, rx, spent_tx));
            }
            for i in 0..opened.len() {
                let (_, rx, spent) = &readers[i % READERS];
                let scanned = rx
                    .recv()
                    .map_err(|_| open_error(&dir, "stopped reading a segment"))??;
                scanned.apply(&mut keydir);
                sizes.insert(scanned.seg, scanned.len);
                let _ = spent.send(scanned.bytes);
            }
            let mut suspects = Vec::new();
            for (thread, ..) in readers {
                suspects.extend(
                    thread
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                );
            }
            // In the order the segments hold them, whichever thread read them.
            suspects.sort_by_key(|(_, loc)| (loc.seg, loc.at));
            Ok(suspects)
        })?;
        tracing::debug!(
            segments = opened.len(),
            elapsed_ms = scanning.elapsed().as_millis() as u64,
            "segments read"
        );
        for (seg, _, file) in opened {
            files.insert(seg, file);
        }
        let (seg, len) = match sizes.last_key_value() {
            Some((&seg, &len)) => (seg, len),
            None if numbers.is_empty() => (0, 0),
            None => {
                return Err(open_error(&dir, "lost its segments' sizes while opening"));
            }
        };
        let loaded = {
            let read = Reader {
                keydir: &keydir,
                files: &files,
                cache: std::cell::RefCell::new(BlockCache::default()),
            };
            let events = damaged_events(&read, suspects).map_err(|e| damaged(&dir, &e))?;
            let turns = Reader {
                keydir: &keydir,
                files: &files,
                cache: std::cell::RefCell::new(BlockCache::default()),
            };
            let mut loaded = guarded_load(&dir, || load_beside(&read, turns, indexes, config))?;
            loaded.damaged.splice(0..0, events);
            loaded
        };
        refuse_damage(&dir, &loaded.damaged, config.store.set_aside_damaged)?;
        // Checked: from here on the start may write.
        made_lock.keep();
        tidy_dir(&dir, &tidy, &lock_path, &numbers)?;
        if let Some((path, at)) = torn.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let file = files
                .get(&seg)
                .ok_or_else(|| open_error(&dir, "lost its newest segment while opening"))?;
            file.set_len(at)
                .and_then(|()| file.sync_data())
                .map_err(|e| io_at(&path, "cannot be repaired", &e))?;
        }
        let (seg, len) = if numbers.is_empty() {
            let seg = 1;
            let file = create_segment(&dir, seg)
                .map_err(|e| io_at(&dir, "cannot create its first segment", &e))?;
            files.insert(seg, Arc::new(file));
            sizes.insert(seg, frame::HEADER as u64);
            (seg, frame::HEADER as u64)
        } else {
            (seg, len)
        };
        let file = files
            .get(&seg)
            .cloned()
            .ok_or_else(|| open_error(&dir, "lost its newest segment while opening"))?;
        upgrade_header(&file)
            .map_err(|e| io_at(&dir.join(segment_name(seg)), "cannot be written", &e))?;
        let bytes = sizes.values().sum();
        // A segment written in advance runs on in zeros past its last frame.
        let ahead = file.metadata().is_ok_and(|m| m.len() > len);
        #[cfg(test)]
        let buffered_only = tests::BUFFERED.with(std::cell::Cell::get);
        #[cfg(not(test))]
        let buffered_only = false;
        let direct = if buffered_only {
            None
        } else {
            Direct::open(&dir.join(segment_name(seg)), &file, len)
        };
        let disk = Self {
            prealloc: Prealloc::new(&dir, segment_bytes),
            dir,
            _lock: lock,
            keydir: RwLock::new(keydir),
            files: RwLock::new(files),
            writer: Mutex::new(Writer {
                direct,
                buffered_only,
                seg,
                file,
                len,
                begun: len,
                ahead,
                mean_frame: 0,
                sizes,
                compacting: None,
                copies: None,
                calm_until: None,
                spare: Vec::new(),
                rotate_failed: None,
            }),
            bytes: AtomicU64::new(bytes),
            segment_bytes,
        };
        super::settle(&disk, &disk.dir, &loaded)?;
        Ok((disk, loaded))
    }

    /// Builds one frame with `f` and makes it durable: a compaction step's copies first,
    /// when one is waiting, then what `f` writes (which a newer value of a copied row is).
    fn batch<T>(
        &self,
        f: impl FnOnce(&mut Batch<'_>) -> std::result::Result<T, DiskError>,
    ) -> std::result::Result<T, DiskError> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut b = Batch {
            frame: FrameBuf::reusing(std::mem::take(&mut w.spare)),
            keydir: &self.keydir,
            mine: Mine::default(),
        };
        let copies = w.copies.take();
        if let Some(c) = &copies {
            c.write(
                &mut b.frame,
                &self.keydir.read().unwrap_or_else(|e| e.into_inner()),
            );
        }
        let out = f(&mut b);
        let mut frame = b.frame;
        let written = out.and_then(|out| self.append(&mut w, &mut frame).map(|()| out));
        if let Some(c) = copies {
            self.copied(&mut w, c, written.is_ok());
        }
        // The buffer serves the next batch (unless a huge one made it large).
        let spare = frame.into_inner();
        if spare.capacity() <= SPARE_BYTES {
            w.spare = spare;
        }
        written
    }

    /// Writes a frame at the end of the newest segment, makes it durable, and only then
    /// points the keydir at its values. On failure the segment is cut back to where it was
    /// (the frame was never acknowledged) and the error returned, for a retry.
    fn append(&self, w: &mut Writer, frame: &mut FrameBuf) -> std::result::Result<(), DiskError> {
        if frame.is_empty() {
            return Ok(());
        }
        let bytes = frame.seal();
        let written = Self::write_at_end(w, bytes).and_then(|()| w.file.sync_data());
        if let Err(e) = written {
            // Best effort: a retry writes the same place again anyway.
            let _ = w.file.set_len(w.len);
            w.ahead = false;
            return Err(e.into());
        }
        let payload_at = w.len + frame::FRAME_HEADER as u64;
        {
            let mut keydir = self.keydir.write().unwrap_or_else(|e| e.into_inner());
            keydir.apply_frame(w.seg, payload_at, &bytes[frame::FRAME_HEADER..]);
        }
        w.len += bytes.len() as u64;
        w.sizes.insert(w.seg, w.len);
        self.bytes.fetch_add(bytes.len() as u64, Relaxed);
        w.mean_frame = (w.mean_frame * 7 + bytes.len() as u64) / 8;
        let taken = w.len - w.begun;
        let after = prealloc::prepare_after(self.segment_bytes);
        if w.len >= self.segment_bytes || (!w.ahead && taken >= after && self.prealloc.ready()) {
            // Full — or begun the slow way, and one written in advance is ready.
            self.rotate(w);
        } else if taken >= after && w.mean_frame < prealloc::SMALL_FRAMES {
            self.prealloc.want();
        }
        Ok(())
    }

    /// Writes `bytes` at the end of the newest segment: directly where the file system
    /// allows it, else through the page cache (not yet durable either way).
    fn write_at_end(w: &mut Writer, bytes: &[u8]) -> std::io::Result<()> {
        let Some(direct) = w.direct.as_mut() else {
            return w.file.write_all_at(bytes, w.len);
        };
        match direct.write(bytes, w.len) {
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                tracing::info!(error = %e, "store: the file system refuses direct writes; the log is written through the page cache");
                w.direct = None;
                w.buffered_only = true;
                w.file.write_all_at(bytes, w.len)
            }
            written => {
                if direct.scratch() > SPARE_BYTES {
                    direct.release();
                }
                written
            }
        }
    }

    /// Opens the newest segment for direct writes again (after it changed or failed).
    fn redirect(&self, w: &mut Writer) {
        w.direct = if w.buffered_only {
            None
        } else {
            Direct::open(&self.dir.join(segment_name(w.seg)), &w.file, w.len)
        };
    }

    /// Seals the newest segment and begins the next. A failure leaves the current one in
    /// use (it is tried again after the next batch).
    fn rotate(&self, w: &mut Writer) {
        // Sealed, a segment ends with its last frame: the zeros a direct write leaves
        // after it (or a segment written in advance) end only the newest one.
        let cut = w.file.metadata().and_then(|m| {
            if m.len() == w.len {
                Ok(())
            } else {
                w.file.set_len(w.len).and_then(|()| w.file.sync_data())
            }
        });
        if let Err(e) = cut {
            if w.rotate_failed
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(60))
            {
                tracing::error!(error = %e, segment = w.seg, "store: cannot seal the newest log segment; it grows meanwhile");
                w.rotate_failed = Some(Instant::now());
            }
            return;
        }
        let seg = w.seg + 1;
        let (made, ahead) = match self.prealloc.take(seg) {
            Some(taken) => (taken, true),
            None => (create_segment(&self.dir, seg), false),
        };
        match made {
            Ok(file) => {
                let file = Arc::new(file);
                self.files
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(seg, file.clone());
                w.seg = seg;
                w.file = file;
                w.len = frame::HEADER as u64;
                self.redirect(w);
                w.begun = w.len;
                w.ahead = ahead;
                w.sizes.insert(seg, w.len);
                w.rotate_failed = None;
                self.bytes.fetch_add(w.len, Relaxed);
            }
            Err(e) => {
                // Tried again after every batch; said once a minute.
                if w.rotate_failed
                    .is_none_or(|at| at.elapsed() >= Duration::from_secs(60))
                {
                    tracing::error!(error = %e, segment = seg, "store: cannot begin the next log segment; the current one grows meanwhile");
                    w.rotate_failed = Some(Instant::now());
                }
            }
        }
    }

    /// One step of compaction, when the segments hold more than half again what is live:
    /// the next [`STEP_BYTES`] of the oldest segment read, and its live rows kept for the
    /// next frame to carry (log/compact.rs). Returns whether there is more to do.
    fn compact_step(&self, w: &mut Writer) -> std::result::Result<bool, DiskError> {
        if w.compacting.is_none() {
            let total: u64 = w.sizes.values().sum();
            let live = self.keydir.read().unwrap_or_else(|e| e.into_inner()).live();
            let oldest = w.sizes.first_key_value().map(|(s, _)| *s);
            match oldest {
                Some(oldest)
                    if oldest != w.seg
                        && total > 2 * self.segment_bytes
                        && total > live + live / 2 =>
                {
                    w.compacting = Some((oldest, frame::HEADER as u64));
                }
                _ => return Ok(false),
            }
        }
        let Some((seg, pos)) = w.compacting else {
            return Ok(false);
        };
        let size = w.sizes.get(&seg).copied().unwrap_or(0);
        let file = self
            .files
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&seg)
            .cloned();
        let Some(file) = file else {
            w.compacting = None;
            return Ok(false);
        };
        let copies = compact::read_step(&file, seg, pos, size, STEP_BYTES, &self.keydir)?;
        w.compacting = Some((seg, copies.to));
        w.copies = Some(copies);
        Ok(true)
    }

    /// After the frame that carried a step's copies: once it is durable and the step
    /// reached the segment's end, everything live in the segment lives later, and the
    /// segment goes. If the frame failed, the step is read again later.
    fn copied(&self, w: &mut Writer, copies: compact::Copies, durable: bool) {
        let seg = copies.seg;
        if !durable {
            w.compacting = Some((seg, copies.from));
            return;
        }
        let size = w.sizes.get(&seg).copied().unwrap_or(0);
        if copies.to < size {
            return;
        }
        w.compacting = None;
        let path = self.dir.join(segment_name(seg));
        // (Gone already: an earlier removal whose directory sync failed.)
        let removed = match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => sync_dir(&self.dir),
        };
        if let Err(e) = removed {
            // No row is read from it any more: a later step reads it again, copies
            // nothing, and removes it then.
            tracing::error!(error = %e, segment = seg, "store: cannot remove a compacted log segment; retried later");
            w.calm_until = Some(Instant::now() + COMPACT_BACKOFF);
            return;
        }
        self.files
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&seg);
        w.sizes.remove(&seg);
        self.bytes.fetch_sub(size, Relaxed);
        self.keydir
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .drop_segment(seg);
    }
}

/// Reads arbitrary bytes as a restart reads a segment's frames (the fuzz target
/// `log_frame`): whatever they hold, no panic, each frame ends after it starts and within
/// the bytes, every payload that decodes encodes back to the same bytes, and its
/// operations apply to a keydir — frame by frame the same as one by one.
pub(crate) fn check_any(bytes: &[u8]) {
    let mut keydir = Keydir::default();
    let mut grouped = Keydir::default();
    let mut at = 0;
    while let Next::Frame { payload, next: end } = frame::next(bytes, at) {
        assert!(end > at && end <= bytes.len(), "a frame within the bytes");
        if let Some(ops) = frame::ops(payload) {
            let mut again = FrameBuf::default();
            for op in &ops {
                match *op {
                    frame::Op::Put {
                        table,
                        key,
                        value,
                        at: value_at,
                    } => {
                        let w = again.put(table, key, value);
                        assert_eq!(w - frame::FRAME_HEADER, value_at, "a value where it was");
                    }
                    frame::Op::Remove { table, key } => again.remove(table, key),
                    frame::Op::RemoveRange { table, start, end } => {
                        again.remove_range(table, start, end)
                    }
                }
                keydir.apply(1, (at + frame::FRAME_HEADER) as u64, op);
            }
            assert_eq!(
                &again.seal()[frame::FRAME_HEADER..],
                payload,
                "a payload round trip"
            );
            assert!(grouped.apply_frame(1, (at + frame::FRAME_HEADER) as u64, payload));
            assert!(
                grouped == keydir,
                "a frame applied as its operations one by one"
            );
        }
        at = end;
    }
}

/// What the log's directory holds: its segments' numbers, and the files a crash left that
/// a start removes (once it has checked everything).
struct Listed {
    numbers: Vec<u32>,
    tidy: Vec<PathBuf>,
}

/// Lists the log's directory, refusing it when it holds a file a2ad did not write. Reads
/// only.
fn list_dir(dir: &Path) -> Result<Listed> {
    let mut listed = Listed {
        numbers: Vec::new(),
        tidy: Vec::new(),
    };
    let entries = std::fs::read_dir(dir).map_err(|e| io_at(dir, "cannot be read", &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_at(dir, "cannot be read", &e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        match segment_number(&name) {
            Some(n) => listed.numbers.push(n),
            None if name == LOCK || name == "lost+found" => {}
            // A segment being prepared in advance when the server stopped, or one whose
            // creation a crash cut short: neither ever held anything.
            None if name == prealloc::SPARE
                || name.strip_suffix(TMP).and_then(segment_number).is_some() =>
            {
                listed.tidy.push(entry.path());
            }
            None => {
                return Err(open_error(
                    dir,
                    format!(
                        "holds a file a2ad did not write ({name}), so it is not an a2ad log store; point store.path elsewhere"
                    ),
                ));
            }
        }
    }
    Ok(listed)
}

/// After a start's checks: removes what a crash left (`tidy`) and makes the lock file and
/// the segments private (0600) where an older a2ad, or a copy, left them readable by
/// others.
fn tidy_dir(dir: &Path, tidy: &[PathBuf], lock: &Path, numbers: &[u32]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for path in tidy {
        std::fs::remove_file(path).map_err(|e| io_at(dir, "cannot be tidied", &e))?;
    }
    let paths = numbers.iter().map(|&n| dir.join(segment_name(n)));
    for path in std::iter::once(lock.to_path_buf()).chain(paths) {
        if std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
            super::schema::restrict(&path, 0o600);
        }
    }
    Ok(())
}

/// A file a start made, removed again when the start is refused (dropped before
/// [`RemoveOnRefusal::keep`]).
struct RemoveOnRefusal(Option<PathBuf>);

impl RemoveOnRefusal {
    /// The start goes on: the file stays.
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnRefusal {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The newest segment, written by an older format this build reads, goes on in this
/// build's: its header says so from now on, so that an a2ad of the older format refuses
/// the directory (as written by a newer a2ad) instead of misreading what this one adds.
fn upgrade_header(file: &File) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    let mut header = [0u8; frame::HEADER];
    file.read_exact_at(&mut header, 0)?;
    if header == frame::header() {
        return Ok(());
    }
    file.write_all_at(&frame::header(), 0)?;
    file.sync_data()
}

/// A new file at `path` (replacing one a crash left there) holding a segment's header.
fn headed_file(path: &Path) -> std::io::Result<File> {
    let _ = std::fs::remove_file(path);
    let file = crate::store::private::file()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)?;
    file.write_all_at(&frame::header(), 0)?;
    Ok(file)
}

/// Creates segment `seg` with its header, durable, under a temporary name first: a
/// segment file is never seen without its header, so a short one is always damage.
fn create_segment(dir: &Path, seg: u32) -> std::io::Result<File> {
    let name = segment_name(seg);
    let tmp = dir.join(format!("{name}{TMP}"));
    let file = headed_file(&tmp)?;
    file.sync_data()?;
    std::fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)?;
    Ok(file)
}

/// The events among `suspects` (rows that did not read as events when replayed) that are
/// still live: damaged rows a start must refuse or set aside.
fn damaged_events(
    read: &Reader<'_>,
    suspects: Vec<(Vec<u8>, Loc)>,
) -> std::result::Result<Vec<Damaged>, DiskError> {
    let mut out = Vec::new();
    for (key, loc) in suspects {
        if read.keydir.get(Table::Events, &key) == Some(loc) {
            out.push(Damaged::new(Table::Events.name(), &key, &read.value(loc)?));
        }
    }
    Ok(out)
}

/// One segment read and checked: its bytes, the payloads of its frames, its length (after
/// cutting off a torn last frame of the newest segment).
struct Scanned {
    seg: u32,
    bytes: Vec<u8>,
    frames: Vec<std::ops::Range<usize>>,
    len: u64,
}

impl Scanned {
    /// Points the keydir at the rows of every frame.
    fn apply(&self, keydir: &mut Keydir) {
        for payload in &self.frames {
            keydir.apply_frame(self.seg, payload.start as u64, &self.bytes[payload.clone()]);
        }
    }
}

/// Reads one segment into `bytes` and checks it: every frame whole, its operations
/// readable, each event decodable (those that are not join `suspects`). Returns its
/// length (after cutting off a torn last frame of the newest segment) and the payloads of
/// its frames.
fn scan_segment(
    path: &Path,
    file: &File,
    seg: u32,
    newest: bool,
    bytes: &mut Vec<u8>,
    suspects: &mut Vec<(Vec<u8>, Loc)>,
    torn: &Mutex<Option<(PathBuf, u64)>>,
) -> Result<(u64, Vec<std::ops::Range<usize>>)> {
    let mut frames = Vec::new();
    bytes.clear();
    {
        use std::io::Read as _;
        let mut f = file;
        f.read_to_end(bytes)
            .map_err(|e| io_at(path, "cannot be read", &e))?;
    }
    let bytes = &bytes[..];
    match frame::check_header(bytes) {
        Header::Ours => {}
        Header::Short => {
            return Err(open_error(
                path,
                "is damaged: the segment is shorter than its header (a2ad never leaves one so; if it is empty, it was truncated); restore the directory from a backup",
            ));
        }
        Header::Foreign => {
            return Err(open_error(
                path,
                "is not an a2ad log segment; point store.path elsewhere",
            ));
        }
        Header::Newer(v) => {
            return Err(open_error(
                path,
                format!(
                    "was written by a newer a2ad (log format {v}; this build reads {}); run that version, or point store.path elsewhere",
                    frame::VERSION
                ),
            ));
        }
    }
    let mut at = frame::HEADER;
    loop {
        if newest && frame::zeros_from(bytes, at) {
            // The rest of a segment written in advance: the end of the log.
            return Ok((at as u64, frames));
        }
        match frame::next(bytes, at) {
            Next::Frame { payload, next } => {
                let Some(ops) = frame::ops(payload) else {
                    return Err(open_error(
                        path,
                        format!(
                            "is damaged: the frame at offset {at} holds operations this build cannot read; restore the directory from a backup"
                        ),
                    ));
                };
                let payload_at = at + frame::FRAME_HEADER;
                for op in &ops {
                    if let Some((Table::Events, key, value, here)) =
                        keydir::put_at(op, seg, payload_at as u64)
                        && !codec::event_row_is_valid(key, value)
                    {
                        suspects.push((key.to_vec(), here));
                    }
                }
                frames.push(payload_at..payload_at + payload.len());
                at = next;
            }
            Next::End => return Ok((at as u64, frames)),
            Next::Torn if newest => {
                tracing::warn!(
                    path = %path.display(),
                    offset = at,
                    dropped_bytes = bytes.len() - at,
                    "store: the log's last write was cut short by a crash (never acknowledged); it is dropped"
                );
                // Cut off once the whole directory has been checked: a start refused
                // for damage elsewhere leaves the torn write where it is.
                *torn.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((path.to_path_buf(), at as u64));
                return Ok((at as u64, frames));
            }
            Next::Torn | Next::Damaged => {
                return Err(open_error(
                    path,
                    format!(
                        "is damaged: the frame at offset {at} cannot be read and is not the log's last write; restore the directory from a backup, or move it aside to start with an empty store"
                    ),
                ));
            }
        }
    }
}

/// The rows of one batch, framed.
struct Batch<'a> {
    frame: FrameBuf,
    keydir: &'a RwLock<Keydir>,
    mine: Mine,
}

/// What the batch itself did to each row, read from its frame when `contains` first asks
/// and then only for what was added since: an outbox retry per delivery stays linear in
/// the batch, and a batch nobody asks costs nothing.
#[derive(Default)]
struct Mine {
    /// Payload bytes read so far.
    upto: usize,
    /// Operations read so far (their order decides).
    n: usize,
    /// Per row: the last operation on it (its number) and whether it left the row there.
    rows: HashMap<Row, (usize, bool), foldhash::fast::RandomState>,
    /// Range removals: their number, table, start, end.
    ranges: Vec<(usize, Row, Box<[u8]>)>,
}

/// A row of a table.
type Row = (Table, Box<[u8]>);

impl Mine {
    /// Whether this batch leaves the row there, if it touched it.
    fn leaves(&mut self, payload: &[u8], t: Table, key: &[u8]) -> Option<bool> {
        frame::each_op(payload.get(self.upto..).unwrap_or_default(), |op| {
            self.n += 1;
            match op {
                frame::Op::Put { table, key, .. } => {
                    self.rows.insert((table, key.into()), (self.n, true));
                }
                frame::Op::Remove { table, key } => {
                    self.rows.insert((table, key.into()), (self.n, false));
                }
                frame::Op::RemoveRange { table, start, end } => {
                    self.ranges
                        .push((self.n, (table, start.into()), end.into()));
                }
            }
        });
        self.upto = payload.len();
        let row = self.rows.get(&(t, key.into())).copied();
        let removed = self
            .ranges
            .iter()
            .filter(|(_, (table, start), end)| *table == t && **start <= *key && *key < **end)
            .map(|(n, ..)| *n)
            .max();
        match (row, removed) {
            (Some((n, there)), r) if r.is_none_or(|r| r < n) => Some(there),
            (_, Some(_)) => Some(false),
            _ => None,
        }
    }
}

impl TableWrite for Batch<'_> {
    fn put(&mut self, t: Table, key: &[u8], value: &[u8]) -> std::result::Result<(), DiskError> {
        self.frame.put(t, key, value);
        Ok(())
    }

    fn put_with(
        &mut self,
        t: Table,
        key: &[u8],
        encode: &mut dyn FnMut(&mut Vec<u8>),
    ) -> std::result::Result<(), DiskError> {
        self.frame.put_with(t, key, encode);
        Ok(())
    }

    fn remove(&mut self, t: Table, key: &[u8]) -> std::result::Result<(), DiskError> {
        self.frame.remove(t, key);
        Ok(())
    }

    fn remove_range(
        &mut self,
        t: Table,
        start: &[u8],
        end: &[u8],
    ) -> std::result::Result<(), DiskError> {
        self.frame.remove_range(t, start, end);
        Ok(())
    }

    fn contains(&mut self, t: Table, key: &[u8]) -> std::result::Result<bool, DiskError> {
        // This batch's own operations first, the newest deciding.
        let mine = self.mine.leaves(self.frame.payload(), t, key);
        Ok(mine.unwrap_or_else(|| {
            self.keydir
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(t, key)
                .is_some()
        }))
    }
}

/// Reads a value from its segment.
fn read_value(file: &File, loc: Loc) -> std::io::Result<Vec<u8>> {
    let mut v = vec![0u8; loc.len as usize];
    file.read_exact_at(&mut v, loc.at)?;
    Ok(v)
}

/// Blocks of segments read at start-up, so that loading every row reads each segment
/// about once, in large reads.
#[derive(Default)]
struct BlockCache {
    blocks: HashMap<(u32, u64), Vec<u8>, foldhash::fast::RandomState>,
    order: VecDeque<(u32, u64)>,
}

impl BlockCache {
    const BLOCK: u64 = 1 << 20;
    const BLOCKS: usize = 64;

    /// Reads the block a value lies in, unless it is here; `false`: the value spans two
    /// blocks.
    fn fill(&mut self, file: &File, loc: Loc) -> std::io::Result<bool> {
        let block = loc.at / Self::BLOCK;
        let end = loc.at + u64::from(loc.len);
        if end > (block + 1) * Self::BLOCK {
            return Ok(false);
        }
        if !self.blocks.contains_key(&(loc.seg, block)) {
            // The buffer of the block it replaces serves again: freshly allocated memory
            // costs a page fault per page.
            let reused = if self.order.len() >= Self::BLOCKS {
                self.order
                    .pop_front()
                    .and_then(|old| self.blocks.remove(&old))
            } else {
                None
            };
            let mut bytes = reused.unwrap_or_default();
            bytes.resize(Self::BLOCK as usize, 0);
            let mut filled = 0;
            while filled < bytes.len() {
                match file.read_at(&mut bytes[filled..], block * Self::BLOCK + filled as u64)? {
                    0 => break,
                    n => filled += n,
                }
            }
            bytes.truncate(filled);
            self.order.push_back((loc.seg, block));
            self.blocks.insert((loc.seg, block), bytes);
        }
        Ok(true)
    }

    /// A value [`BlockCache::fill`] has read.
    fn get(&self, loc: Loc) -> std::io::Result<&[u8]> {
        let block = loc.at / Self::BLOCK;
        let from = (loc.at - block * Self::BLOCK) as usize;
        self.blocks
            .get(&(loc.seg, block))
            .and_then(|bytes| bytes.get(from..from + loc.len as usize))
            .ok_or_else(|| std::io::Error::other("a value runs past its segment's end"))
    }
}

/// Reading rows at start-up, before the committer runs.
struct Reader<'a> {
    keydir: &'a Keydir,
    files: &'a HashMap<u32, Arc<File>>,
    cache: std::cell::RefCell<BlockCache>,
}

impl Reader<'_> {
    fn file(&self, loc: Loc) -> std::result::Result<&File, DiskError> {
        self.files.get(&loc.seg).map(|f| &**f).ok_or_else(|| {
            DiskError::Damaged(format!(
                "a row points into segment {} that is gone",
                loc.seg
            ))
        })
    }

    /// Calls `f` with a value, read through the cache of blocks (in place, when it lies
    /// in one block).
    fn with_value<R>(
        &self,
        loc: Loc,
        f: impl FnOnce(&[u8]) -> R,
    ) -> std::result::Result<R, DiskError> {
        let file = self.file(loc)?;
        // A read from within `f` finds the cache lent out and reads the file itself.
        let filled = match self.cache.try_borrow_mut() {
            Ok(mut cache) => cache.fill(file, loc)?,
            Err(_) => false,
        };
        if filled && let Ok(cache) = self.cache.try_borrow() {
            return Ok(f(cache.get(loc)?));
        }
        Ok(f(&read_value(file, loc)?))
    }

    fn value(&self, loc: Loc) -> std::result::Result<Vec<u8>, DiskError> {
        self.with_value(loc, <[u8]>::to_vec)
    }
}

impl TableRead for Reader<'_> {
    fn events_checked(&self) -> bool {
        true
    }

    fn tasks_hint(&self) -> usize {
        self.keydir.tasks()
    }

    fn scan(
        &self,
        t: Table,
        start: &[u8],
        end: Option<&[u8]>,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> std::result::Result<(), DiskError> {
        for (k, loc) in self.keydir.range(t, start, end) {
            if !self.with_value(loc, |v| f(&k, v))? {
                break;
            }
        }
        Ok(())
    }

    fn get(&self, t: Table, key: &[u8]) -> std::result::Result<Option<Vec<u8>>, DiskError> {
        self.keydir.get(t, key).map(|l| self.value(l)).transpose()
    }
}

/// Reading rows while the store runs: the places under the keydir's lock, the values
/// after it.
struct Live<'a>(&'a LogDisk);

impl TableRead for Live<'_> {
    fn scan(
        &self,
        t: Table,
        start: &[u8],
        end: Option<&[u8]>,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> std::result::Result<(), DiskError> {
        let rows: Vec<(Vec<u8>, Loc, Option<Arc<File>>)> = {
            let keydir = self.0.keydir.read().unwrap_or_else(|e| e.into_inner());
            let files = self.0.files.read().unwrap_or_else(|e| e.into_inner());
            keydir
                .range(t, start, end)
                .map(|(k, l)| (k, l, files.get(&l.seg).cloned()))
                .collect()
        };
        for (k, loc, file) in rows {
            let file = file.ok_or_else(|| DiskError::Io("a log segment is gone".into()))?;
            if !f(&k, &read_value(&file, loc)?) {
                break;
            }
        }
        Ok(())
    }

    fn get(&self, t: Table, key: &[u8]) -> std::result::Result<Option<Vec<u8>>, DiskError> {
        let mut out = None;
        self.scan(t, key, None, &mut |k, v| {
            if k == key {
                out = Some(v.to_vec());
            }
            false
        })?;
        Ok(out)
    }
}

impl Disk for LogDisk {
    fn write(
        &self,
        f: &mut dyn FnMut(&mut dyn TableWrite) -> std::result::Result<(), DiskError>,
    ) -> std::result::Result<(), DiskError> {
        self.batch(|b| f(b))
    }

    fn reopen(&self) -> std::result::Result<(), DiskError> {
        // A new descriptor for the newest segment: the failed one may hold the error.
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let path = self.dir.join(segment_name(w.seg));
        let file = Arc::new(File::options().read(true).write(true).open(&path)?);
        file.set_len(w.len)?;
        w.ahead = false;
        self.files
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(w.seg, file.clone());
        w.file = file;
        self.redirect(&mut w);
        Ok(())
    }

    fn events(
        &self,
        key: &TaskKey,
        created: Created,
        after: u64,
        history: &[Arc<Message>],
    ) -> std::result::Result<Vec<TaskEvent>, DiskError> {
        read_events(&Live(self), key, created, after, history)
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    fn maintain(&self) -> std::result::Result<bool, DiskError> {
        // Copies that no frame carried since the last call: the log is idle, so they go in
        // a frame of their own.
        let waiting = self
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .copies
            .is_some();
        let flushed = if waiting {
            self.batch(|_| Ok(()))
        } else {
            Ok(())
        };
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if flushed.is_ok() && w.calm_until.is_some_and(|t| Instant::now() < t) {
            return Ok(false);
        }
        w.calm_until = None;
        let step = flushed.and_then(|()| self.compact_step(&mut w));
        if step.is_err() {
            w.compacting = None;
            w.copies = None;
            w.calm_until = Some(Instant::now() + COMPACT_BACKOFF);
        }
        step
    }
}
