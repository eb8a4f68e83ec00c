//! Damaged store files: records that cannot be read, set aside on the operator's word, and
//! panics inside the storage engine turned into a refusal that names the file.

use std::cell::Cell;
use std::io::Write as _;
use std::path::Path;

use crate::error::{Error, Result};

/// One row that cannot be read: where it is and its raw bytes.
pub(crate) struct Damaged {
    pub(crate) table: String,
    pub(crate) key: Vec<u8>,
    value: Vec<u8>,
}

impl Damaged {
    pub(crate) fn new(table: &str, key: &[u8], value: &[u8]) -> Self {
        Self {
            table: table.to_string(),
            key: key.to_vec(),
            value: value.to_vec(),
        }
    }
}

/// "tasks: 3, events: 1" — how many damaged rows each table holds.
pub(crate) fn summary(damaged: &[Damaged]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for d in damaged {
        match counts.iter_mut().find(|(t, _)| *t == d.table) {
            Some((_, n)) => *n += 1,
            None => counts.push((&d.table, 1)),
        }
    }
    counts
        .iter()
        .map(|(t, n)| format!("{t}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Copies the damaged rows to `<store>.damaged-<unix time>.jsonl` beside the store (one
/// JSON object per row: table, key and value in hex), makes that copy durable, then
/// removes the rows from the store with `remove` (one durable change).
pub(crate) fn set_aside(
    path: &Path,
    damaged: &[Damaged],
    remove: impl FnOnce() -> std::result::Result<(), String>,
) -> Result<()> {
    let fail = |what: &str, e: &dyn std::fmt::Display| Error::Store {
        path: path.display().to_string(),
        message: format!("could not set its damaged records aside ({what}: {e})"),
    };
    let stamp = chrono::Utc::now().timestamp();
    let aside = path.with_file_name(format!(
        "{}.damaged-{stamp}.jsonl",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let mut out = Vec::new();
    for d in damaged {
        let line = serde_json::json!({
            "table": d.table,
            "key": hex(&d.key),
            "value": hex(&d.value),
        });
        out.extend_from_slice(line.to_string().as_bytes());
        out.push(b'\n');
    }
    let mut file = super::private::file()
        .write(true)
        .create_new(true)
        .open(&aside)
        .map_err(|e| fail(&aside.display().to_string(), &e))?;
    file.write_all(&out)
        .and_then(|()| file.sync_all())
        .map_err(|e| fail(&aside.display().to_string(), &e))?;
    remove().map_err(|e| fail("removing them", &e))?;
    tracing::warn!(
        path = %path.display(),
        set_aside = %aside.display(),
        records = damaged.len(),
        tables = %summary(damaged),
        "damaged store records were set aside; the rest is served"
    );
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

thread_local! {
    /// Set while [`catch_quietly`] runs on this thread: its panics are not printed.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, turning a panic into an error that carries its message. The panic is not
/// printed (the caller reports it in its own words); panics elsewhere are printed as
/// before, by the hook that was installed.
pub(crate) fn catch_quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
    QUIET.with(|q| q.set(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    result.map_err(|panic| {
        panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "the storage engine stopped".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_with_its_message() {
        let r: std::result::Result<(), String> = catch_quietly(|| panic!("page 7 is zeros"));
        assert_eq!(r, Err("page 7 is zeros".to_string()));
        assert_eq!(catch_quietly(|| 5), Ok(5));
    }

    #[test]
    fn the_summary_counts_rows_per_table() {
        let d = [
            Damaged::new("tasks", b"a", b"b"),
            Damaged::new("events", b"c", b"d"),
            Damaged::new("tasks", b"e", b"f"),
        ];
        assert_eq!(summary(&d), "tasks: 2, events: 1");
    }
}
