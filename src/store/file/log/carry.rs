//! Carrying a redb store over into the log: at the first start of the log store in a
//! directory `DIR/log` (no segments yet) beside a redb store `DIR/a2ad.redb` — the
//! previous default's layout — the redb file is opened as the redb backend opens it
//! (every refusal holds: locked, foreign, newer, damaged, empty), its rows are written as
//! the log's first segments in a staging directory that becomes `DIR/log` by one rename
//! once durable, and the file is renamed `DIR/a2ad.redb.carried-over` (kept, for the
//! operator to delete). A crash at any point leaves either the redb file to carry over
//! again or a complete log.

use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::time::Instant;

use super::super::redb_file::RedbDisk;
use super::super::tables::DiskError;
use super::frame::{self, FrameBuf};
use super::{create_segment, io_at, sync_dir};
use crate::config::{Config, StoreBackend};
use crate::error::Result;
use crate::store::index::Indexes;

/// The redb store the log carries over, beside the log's directory.
pub(crate) const REDB: &str = "a2ad.redb";
/// What it is renamed once carried over.
pub(crate) const CARRIED: &str = "a2ad.redb.carried-over";
/// Bytes of rows per frame while carrying over.
const FRAME_BYTES: usize = 1 << 20;

/// Carries `DIR/a2ad.redb` over into the log directory `dir` when the log has no
/// segments yet. Returns whether it did.
pub(super) fn carry_over(
    config: &Config,
    dir: &Path,
    has_segments: bool,
    segment_bytes: u64,
) -> Result<bool> {
    let Some(parent) = dir.parent() else {
        return Ok(false);
    };
    let redb = parent.join(REDB);
    if !redb.is_file() {
        return Ok(false);
    }
    if has_segments {
        tracing::warn!(
            redb = %redb.display(),
            log = %dir.display(),
            "a redb store sits beside the log store, which has its own segments: it is not read (it was carried over already, or belongs to another configuration)"
        );
        return Ok(false);
    }
    let started = Instant::now();
    let mut from = config.clone();
    from.store.backend = StoreBackend::Redb;
    from.store.path = Some(redb.display().to_string());
    let indexes = Indexes::for_config(&from);
    let (disk, _) = RedbDisk::open(&from, &indexes)?;
    let staging = parent.join(format!(
        "{}.carrying",
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| io_at(&staging, "cannot be cleared", &e))?;
    }
    crate::store::private::create_dir(&staging)
        .map_err(|e| io_at(&staging, "cannot be created", &e))?;
    let mut out = Segments::begin(&staging, segment_bytes)
        .map_err(|e| io_at(&staging, "cannot be written", &e))?;
    let mut rows = 0u64;
    disk.rows(&mut |t, k, v| {
        out.frame.put(t, k, v);
        rows += 1;
        if out.frame.len() >= FRAME_BYTES {
            out.flush()?;
        }
        Ok(())
    })
    .and_then(|()| out.flush())
    .map_err(|e| match e {
        DiskError::Damaged(why) => super::super::load::damaged(&redb, &why),
        DiskError::Key(why) => super::super::open_error(&redb, why),
        DiskError::Io(why) => io_at(&staging, "cannot be written", &std::io::Error::other(why)),
    })?;
    drop(disk);
    if dir.exists() {
        // No segments: at most the lock file of a start that stopped early.
        std::fs::remove_dir_all(dir).map_err(|e| io_at(dir, "cannot be replaced", &e))?;
    }
    std::fs::rename(&staging, dir)
        .and_then(|()| sync_dir(parent))
        .map_err(|e| io_at(dir, "cannot be put in place", &e))?;
    std::fs::rename(&redb, parent.join(CARRIED))
        .and_then(|()| sync_dir(parent))
        .map_err(|e| io_at(&redb, "cannot be renamed after carrying it over", &e))?;
    tracing::info!(
        from = %redb.display(),
        to = %dir.display(),
        rows,
        tasks = indexes.tasks.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "the redb store was carried over into the log store; the redb file is kept as {CARRIED}"
    );
    Ok(true)
}

/// Segments written one after another in a directory (no keydir: the log's open reads
/// them back).
struct Segments<'a> {
    dir: &'a Path,
    seg: u32,
    file: std::fs::File,
    len: u64,
    segment_bytes: u64,
    frame: FrameBuf,
}

impl<'a> Segments<'a> {
    fn begin(dir: &'a Path, segment_bytes: u64) -> std::io::Result<Self> {
        Ok(Self {
            dir,
            seg: 1,
            file: create_segment(dir, 1)?,
            len: frame::HEADER as u64,
            segment_bytes,
            frame: FrameBuf::default(),
        })
    }

    /// Writes the frame built so far, durable, beginning the next segment when this one
    /// is full.
    fn flush(&mut self) -> std::result::Result<(), DiskError> {
        if self.frame.is_empty() {
            return Ok(());
        }
        if self.len >= self.segment_bytes {
            self.seg += 1;
            self.file = create_segment(self.dir, self.seg)?;
            self.len = frame::HEADER as u64;
        }
        let mut frame = std::mem::take(&mut self.frame);
        let bytes = frame.seal();
        self.file.write_all_at(bytes, self.len)?;
        self.file.sync_data()?;
        self.len += bytes.len() as u64;
        Ok(())
    }
}
