//! The `disk` scenario: what the store's disk alone costs a commit — no server. The log
//! (the default store) makes each batch durable with one write at the end of a segment
//! written in advance, past the page cache where the file system allows it, and one
//! `fdatasync`; this loop does exactly that with the smallest batch (one 4 KiB block), so
//! its time is the least any durable commit on this disk can take, and a bound on what a
//! durable store can serve to one connection (docs/PERFORMANCE.md, "The durable store beside memory").

use std::fs::File;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::client::{self, Stats};
use crate::procs;
use crate::report::{Report, report};

/// One block: the smallest write direct I/O allows, and more than a one-task batch.
const BLOCK: usize = 4096;
/// The file the loop writes into, written whole first (as a segment written in advance).
const FILE_BYTES: u64 = 16 << 20;

/// The loop's file, removed when dropped — and the directories the loop made for it.
struct Scratch {
    file: PathBuf,
    /// Made for the file, the deepest first.
    made: Vec<PathBuf>,
}

impl Scratch {
    /// A file of this process's in `dir`, which is made (and later removed) if missing.
    fn new(dir: &Path) -> Result<Self, String> {
        let made: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
            .map(Path::to_path_buf)
            .collect();
        let scratch = Self {
            file: dir.join(format!("a2ad-load-disk-{}", std::process::id())),
            made,
        };
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(scratch)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        for dir in &self.made {
            // Only while empty: whatever else came to be there stays.
            if std::fs::remove_dir(dir).is_err() {
                break;
            }
        }
    }
}

/// Times of each commit: the write, the flush, and both.
#[derive(Default)]
pub(crate) struct Commits {
    pub(crate) write_us: Vec<u32>,
    pub(crate) flush_us: Vec<u32>,
    pub(crate) both: Stats,
    /// The writes went past the page cache (the file system allowed direct I/O).
    pub(crate) direct: bool,
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// Commits one block at a time into a file written in advance under `dir` until
/// `deadline` or `max` commits; the file is removed afterwards, and `dir` too if this
/// made it.
pub(crate) fn commits(dir: &Path, deadline: Instant, max: u64) -> Result<Commits, String> {
    let scratch = Scratch::new(dir)?;
    let path = &scratch.file;
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(err)?;
    let chunk = vec![0x5a_u8; 1 << 20];
    let mut at = 0;
    while at < FILE_BYTES {
        file.write_all_at(&chunk, at).map_err(err)?;
        at += chunk.len() as u64;
    }
    file.sync_all().map_err(err)?;
    let mut direct = File::options()
        .write(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path)
        .ok();
    // Direct I/O wants block-aligned memory: a block found inside a larger buffer.
    let mut buf = vec![0x33_u8; 2 * BLOCK];
    let skip = buf.as_ptr().align_offset(BLOCK);
    let block = &mut buf[skip..skip + BLOCK];
    let mut out = Commits {
        direct: direct.is_some(),
        ..Commits::default()
    };
    let mut n = 0u64;
    while n < max && Instant::now() < deadline {
        let offset = (n * BLOCK as u64) % FILE_BYTES;
        block[..8].copy_from_slice(&n.to_be_bytes());
        let t0 = Instant::now();
        let wrote = match &direct {
            Some(d) => match d.write_all_at(block, offset) {
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                    // Refused: this file system writes buffered (as the log then does).
                    direct = None;
                    out.direct = false;
                    file.write_all_at(block, offset)
                }
                r => r,
            },
            None => file.write_all_at(block, offset),
        };
        wrote.map_err(err)?;
        let t1 = Instant::now();
        file.sync_data().map_err(err)?;
        let t2 = Instant::now();
        out.write_us.push(micros(t1 - t0));
        out.flush_us.push(micros(t2 - t1));
        out.both.latencies.push(micros(t2 - t0));
        n += 1;
    }
    Ok(out)
}

/// The `disk` scenario's report: commits per second, their times, and the CPU this
/// process spent on each (system calls; the kernel's own threads are not counted).
pub(crate) fn run(dir: &Path, duration: f64, max: Option<u64>) -> Result<Report, String> {
    let me = std::process::id();
    let cpu0 = procs::cpu_seconds(me);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(duration);
    let mut c = commits(dir, deadline, max.unwrap_or(u64::MAX))?;
    let seconds = t0.elapsed().as_secs_f64();
    let n = c.both.latencies.len();
    let cpu_us = match (cpu0, procs::cpu_seconds(me)) {
        (Some(a), Some(b)) if n > 0 => Some(((b - a) / n as f64 * 1e6).round()),
        _ => None,
    };
    c.write_us.sort_unstable();
    c.flush_us.sort_unstable();
    // In µs, as measured (`percentile` answers in ms).
    let median = |v: &[u32]| (client::percentile(v, 0.5) * 1000.0).round();
    let mut r = report(
        crate::Scenario::Disk,
        "disk",
        1,
        seconds,
        c.both,
        None,
        None,
    );
    r.extra.insert("direct", json!(c.direct));
    r.extra.insert("write_us_p50", json!(median(&c.write_us)));
    r.extra.insert("flush_us_p50", json!(median(&c.flush_us)));
    if let Some(cpu) = cpu_us {
        r.extra.insert("cpu_us_per_commit", json!(cpu));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_commit_is_timed_write_and_flush_and_the_file_is_removed() {
        let top =
            std::env::temp_dir().join(format!("a2ad-load-disk-test-{}", uuid::Uuid::new_v4()));
        let dir = top.join("nested");
        let c = commits(&dir, Instant::now() + Duration::from_secs(60), 5).expect("measured");
        assert_eq!(c.both.latencies.len(), 5);
        assert_eq!(c.write_us.len(), 5);
        assert_eq!(c.flush_us.len(), 5);
        for ((w, f), b) in c.write_us.iter().zip(&c.flush_us).zip(&c.both.latencies) {
            assert!(u64::from(*w) + u64::from(*f) <= u64::from(*b) + 1);
        }
        // The file is gone, and the directories the run made for it.
        assert!(!top.exists(), "{} left behind", top.display());
    }

    #[test]
    fn a_directory_that_was_there_stays_with_what_else_it_holds() {
        let dir =
            std::env::temp_dir().join(format!("a2ad-load-disk-keep-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&dir).expect("dir");
        std::fs::write(dir.join("other"), b"x").expect("other file");
        let c = commits(&dir, Instant::now() + Duration::from_secs(60), 2).expect("measured");
        assert_eq!(c.both.latencies.len(), 2);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("other")]);
        std::fs::remove_dir_all(&dir).expect("cleaned");
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_an_error_not_a_panic() {
        let file =
            std::env::temp_dir().join(format!("a2ad-load-disk-file-{}", uuid::Uuid::new_v4()));
        std::fs::write(&file, b"x").expect("file");
        let r = commits(
            &file.join("sub"),
            Instant::now() + Duration::from_secs(1),
            1,
        );
        assert!(r.is_err());
        let _ = std::fs::remove_file(&file);
    }
}
