//! Segments written in advance. An `fdatasync` after an append that grows the file must
//! also make the file's new size durable (a journal commit of its metadata); into space
//! that is already written, it flushes the data alone. On the reference machine that is
//! 110–120 µs instead of 180 per commit, and 45–50 µs of system CPU instead of 70
//! (docs/decisions/segments-written-in-advance.md). So the next segment is written whole — its header, then zeros to
//! its full size, durable — by a thread of its own, under a temporary name, and renamed
//! into place when the newest segment is full.
//!
//! The zeros after the last frame of the newest segment are the end of the log
//! ([`frame::zeros_from`](super::frame::zeros_from)). A server that has written little (a
//! test, an idle deployment) never prepares one: preparation starts once the newest
//! segment has taken [`prepare_after`] bytes, and only while the disk has room for
//! [`ROOM_SEGMENTS`] segments, so that the spare never competes with the log for the last
//! of a disk, and only while commits are small (frames under [`SMALL_FRAMES`] on
//! average): a busy server's batches are large and few, the size update is a small part
//! of each, and writing every byte twice (zeros, then frames) cost more than it saved
//! (send at 256 connections: p99 15 → 19 ms). A segment begun the slow way (the first
//! one, or when no spare was ready) is left for the spare as soon as it is ready.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{frame, headed_file, segment_name, sync_dir};

/// The file a segment is prepared in (removed at open if a crash left it).
pub(super) const SPARE: &str = "spare.a2l.tmp";
/// Preparation starts once the newest segment has taken this many bytes since it was
/// begun (or since the store was opened): 1 MiB, or a sixteenth of a smaller segment.
pub(super) fn prepare_after(segment_bytes: u64) -> u64 {
    (segment_bytes / 16).min(1 << 20)
}
/// A spare is prepared only while the recent frames are smaller than this on average.
pub(super) const SMALL_FRAMES: u64 = 32 << 10;
/// A spare is prepared only while the disk has room for this many segments.
const ROOM_SEGMENTS: u64 = 4;
/// After a preparation failed (or found too little room), the next try waits this long.
const RETRY: Duration = Duration::from_secs(60);
/// Zeros written per call.
const CHUNK: usize = 1 << 20;

/// Where the spare stands.
enum State {
    /// None prepared; none tried before `retry_after`.
    Idle { retry_after: Option<Instant> },
    /// A thread is writing it.
    Preparing,
    /// Written whole and durable, under [`SPARE`].
    Ready(File),
}

/// The spare segment of one log directory.
pub(super) struct Prealloc {
    dir: PathBuf,
    segment_bytes: u64,
    state: Arc<Mutex<State>>,
    /// Set when the store closes: a preparation under way stops.
    stop: Arc<AtomicBool>,
}

impl Prealloc {
    pub(super) fn new(dir: &Path, segment_bytes: u64) -> Self {
        Self {
            dir: dir.to_path_buf(),
            segment_bytes,
            state: Arc::new(Mutex::new(State::Idle { retry_after: None })),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts preparing a spare, unless one is ready or under way, a recent try failed, or
    /// the disk has too little room. Never waits.
    pub(super) fn want(&self) {
        let mut state = self.lock();
        match &*state {
            State::Idle { retry_after } if retry_after.is_none_or(|t| Instant::now() >= t) => {}
            _ => return,
        }
        if !self.has_room() {
            *state = State::Idle {
                retry_after: Some(Instant::now() + RETRY),
            };
            return;
        }
        *state = State::Preparing;
        drop(state);
        let (dir, bytes) = (self.dir.clone(), self.segment_bytes);
        let (shared, stop) = (self.state.clone(), self.stop.clone());
        let spawned = std::thread::Builder::new()
            .name("a2ad-log-prep".into())
            .spawn(move || {
                let outcome = prepare(&dir, bytes, &stop);
                let mut state = shared.lock().unwrap_or_else(|e| e.into_inner());
                *state = match outcome {
                    Ok(file) => State::Ready(file),
                    // A store that closed leaves its spare to the next open's tidying.
                    Err(_) if stop.load(Relaxed) => State::Idle { retry_after: None },
                    Err(e) => {
                        tracing::warn!(error = %e, "store: cannot prepare the next log segment in advance; it is begun when needed");
                        // Its space goes back (a full disk is the likely cause).
                        let _ = std::fs::remove_file(dir.join(SPARE));
                        State::Idle {
                            retry_after: Some(Instant::now() + RETRY),
                        }
                    }
                };
            });
        if spawned.is_err() {
            *self.lock() = State::Idle {
                retry_after: Some(Instant::now() + RETRY),
            };
        }
    }

    /// Whether a spare is ready to be taken.
    pub(super) fn ready(&self) -> bool {
        matches!(&*self.lock(), State::Ready(_))
    }

    /// The spare as segment `seg`: renamed into place, the directory synced. `None` when
    /// none is ready (the caller begins the segment the slow way).
    pub(super) fn take(&self, seg: u32) -> Option<std::io::Result<File>> {
        let file = {
            let mut state = self.lock();
            match std::mem::replace(&mut *state, State::Idle { retry_after: None }) {
                State::Ready(file) => file,
                other => {
                    *state = other;
                    return None;
                }
            }
        };
        Some(
            std::fs::rename(self.dir.join(SPARE), self.dir.join(segment_name(seg)))
                .and_then(|()| sync_dir(&self.dir))
                .map(|()| file),
        )
    }

    /// Room for [`ROOM_SEGMENTS`] segments on the log's file system.
    fn has_room(&self) -> bool {
        rustix::fs::statvfs(&self.dir).is_ok_and(|s| {
            s.f_bavail.saturating_mul(s.f_frsize) >= self.segment_bytes * ROOM_SEGMENTS
        })
    }
}

impl Drop for Prealloc {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

/// Writes a whole segment — header, then zeros — under [`SPARE`], durable.
fn prepare(dir: &Path, bytes: u64, stop: &AtomicBool) -> std::io::Result<File> {
    let file = headed_file(&dir.join(SPARE))?;
    let zeros = vec![0u8; CHUNK];
    let mut at = frame::HEADER as u64;
    while at < bytes {
        if stop.load(Relaxed) {
            return Err(std::io::Error::other("the store closed"));
        }
        // Chunks end on a multiple of CHUNK (the first is short by the header): the
        // advice below may drop the partial page at the end of the file, which the next
        // chunk would then have to read back before writing the rest of it.
        let to_edge = CHUNK - (at % CHUNK as u64) as usize;
        let n = usize::try_from(bytes - at).unwrap_or(CHUNK).min(to_edge);
        file.write_all_at(&zeros[..n], at)?;
        // Flushed a chunk at a time: the commits' fdatasyncs never queue behind a whole
        // segment's worth of writeback.
        file.sync_data()?;
        at += n as u64;
        drop_behind(&file, at);
    }
    file.sync_all()?;
    Ok(file)
}

/// Lets the page cache drop the zeros written so far, `0..end`, once they are durable. The
/// frames that replace them are written past the cache (`direct.rs`), and a direct write
/// must first take out of the cache every page of its range that is still there: with the
/// spare's 64 MiB left cached, that was 1–3% of the committer's CPU (send at 32
/// connections: `invalidate_inode_pages2_range` under every `pwrite`, docs/decisions/segments-written-in-advance.md), and 64 MiB of cache a segment that nothing reads. The advice covers
/// everything from the start, not the chunk alone: the file system caches in large folios,
/// and one that straddles a chunk's edge is kept whole by advice that covers only part of
/// it (advice chunk by chunk, from byte 16 on, left 47 of 64 MiB cached). Advice only:
/// where it is refused, the pages go as before, at the direct writes.
fn drop_behind(file: &File, end: u64) {
    let _ = rustix::fs::fadvise(
        file,
        0,
        std::num::NonZeroU64::new(end),
        rustix::fs::Advice::DontNeed,
    );
}
