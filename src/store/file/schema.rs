//! Opening the file: refusing what is not ours (another program's file, a newer schema),
//! its permissions, and migrating older schemas.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use redb::{
    Database, DatabaseError, ReadableDatabase, ReadableTable, StorageError, TableDefinition,
    TableHandle,
};

use super::open_error;
use crate::error::{Error, Result};
use crate::model::{ContextId, Principal, TaskKey};
use crate::store::codec::{self, Created, SCHEMA_VERSION};

/// A table of the redb file: byte keys, byte values.
pub(super) type Def = TableDefinition<'static, &'static [u8], &'static [u8]>;

pub(super) const META: Def = TableDefinition::new("meta");
pub(super) const TASKS: Def = TableDefinition::new("tasks");
pub(super) const EVENTS: Def = TableDefinition::new("events");
pub(super) const OUTBOX: Def = TableDefinition::new("outbox");
pub(super) const PUSH: Def = TableDefinition::new("push");
pub(super) const TURNS: Def = TableDefinition::new("turns");

/// What `meta.app` holds in a2ad's files.
pub(super) const APP: &[u8] = b"a2ad";

/// Why a file cannot be opened, said so an operator knows what to do.
pub(super) fn refused(path: &Path, e: DatabaseError) -> Error {
    match e {
        DatabaseError::DatabaseAlreadyOpen => open_error(
            path,
            "is in use by another a2ad (the file is locked); stop it or point store.path elsewhere",
        ),
        DatabaseError::Storage(StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::InvalidData =>
        {
            open_error(
                path,
                format!("is not an a2ad store ({io}); point store.path elsewhere"),
            )
        }
        DatabaseError::Storage(StorageError::Io(io)) => {
            open_error(path, format!("cannot be read or written: {io}"))
        }
        DatabaseError::UpgradeRequired(v) => open_error(
            path,
            format!("was written in redb file format {v}, which this build cannot open"),
        ),
        other => open_error(
            path,
            format!("is not an a2ad store (or is damaged beyond repair): {other}"),
        ),
    }
}

#[cfg(unix)]
pub(super) fn restrict(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}

#[cfg(not(unix))]
pub(super) fn restrict(_path: &Path, _mode: u32) {}

/// A fresh file gets the schema; an existing one must carry a2ad's, at this version.
pub(super) fn check_schema(db: &Database, path: &Path) -> Result<()> {
    let io = |e: &dyn std::fmt::Display| open_error(path, format!("cannot be read: {e}"));
    let read = db.begin_read().map_err(|e| io(&e))?;
    let empty = read.list_tables().map_err(|e| io(&e))?.next().is_none();
    drop(read);
    if !empty {
        return match check_existing(db, path)? {
            1 => migrate_v1(db, path),
            2..=4 => set_schema(db, path),
            _ => Ok(()),
        };
    }
    let w = db.begin_write().map_err(|e| io(&e))?;
    {
        let mut meta = w.open_table(META).map_err(|e| io(&e))?;
        meta.insert(b"app".as_slice(), APP).map_err(|e| io(&e))?;
        meta.insert(
            b"schema".as_slice(),
            SCHEMA_VERSION.to_be_bytes().as_slice(),
        )
        .map_err(|e| io(&e))?;
        for t in [TASKS, EVENTS, OUTBOX, PUSH, TURNS] {
            w.open_table(t).map_err(|e| io(&e))?;
        }
    }
    w.commit().map_err(|e| io(&e))
}

/// An existing file must be an a2ad store of the schema this build reads, or of one it
/// migrates (an empty redb file — a first start that stopped early — is initialized by the
/// writer). Returns the schema found.
pub(super) fn check_existing(db: &impl ReadableDatabase, path: &Path) -> Result<u32> {
    let io = |e: &dyn std::fmt::Display| open_error(path, format!("cannot be read: {e}"));
    let read = db.begin_read().map_err(|e| io(&e))?;
    let tables: Vec<String> = read
        .list_tables()
        .map_err(|e| io(&e))?
        .map(|t| t.name().to_string())
        .collect();
    if tables.is_empty() {
        return Ok(SCHEMA_VERSION);
    }
    if !tables.iter().any(|t| t == "meta") {
        return Err(open_error(
            path,
            "is a redb file of another program, not an a2ad store",
        ));
    }
    let meta = read.open_table(META).map_err(|e| io(&e))?;
    let app = meta
        .get(b"app".as_slice())
        .map_err(|e| io(&e))?
        .map(|v| v.value().to_vec());
    if app.as_deref() != Some(APP) {
        return Err(open_error(
            path,
            "is a redb file of another program, not an a2ad store",
        ));
    }
    let schema = meta
        .get(b"schema".as_slice())
        .map_err(|e| io(&e))?
        .and_then(|v| <[u8; 4]>::try_from(v.value()).ok())
        .map(u32::from_be_bytes);
    match schema {
        Some(v @ 1..=SCHEMA_VERSION) => Ok(v),
        Some(v) if v > SCHEMA_VERSION => Err(open_error(
            path,
            format!(
                "was written by a newer a2ad (store schema {v}; this build reads {SCHEMA_VERSION}); run that version, or point store.path elsewhere"
            ),
        )),
        Some(v) => Err(open_error(
            path,
            format!(
                "has store schema {v}, which this build ({SCHEMA_VERSION}) cannot migrate; see docs/ARCHITECTURE.md"
            ),
        )),
        None => Err(open_error(path, "has no readable schema version")),
    }
}

/// Schema 2, 3 or 4 → 5: nothing to convert (rows of schema 2 read as they are; schema 4
/// adds records that carry their turn and tombstones of forgotten conversations; schema 5
/// writes compact rows of tag 2), only the version, so that an older a2ad refuses the file
/// instead of reading what is new as damage or losing turns.
fn set_schema(db: &Database, path: &Path) -> Result<()> {
    let write = || -> std::result::Result<(), redb::Error> {
        let w = db.begin_write()?;
        w.open_table(META)?.insert(
            b"schema".as_slice(),
            SCHEMA_VERSION.to_be_bytes().as_slice(),
        )?;
        w.commit()?;
        Ok(())
    };
    write().map_err(|e| {
        open_error(
            path,
            format!("could not be migrated to store schema {SCHEMA_VERSION}: {e}"),
        )
    })
}

/// Migrates a file of schema 1 (task and turn rows keyed by their ids) to schema 2 (keyed
/// by the task's creation time, or the conversation's, first), in one write transaction: a crash in the middle leaves schema 1
/// as it was, and the next start migrates again.
pub(super) fn migrate_v1(db: &Database, path: &Path) -> Result<()> {
    let fail = |e: &dyn std::fmt::Display| {
        open_error(
            path,
            format!("could not be migrated from store schema 1: {e}"),
        )
    };
    let started = Instant::now();
    let migrate = || -> std::result::Result<usize, redb::Error> {
        let w = db.begin_write()?;
        let mut created: HashMap<TaskKey, Created> = HashMap::new();
        for table in [TASKS, EVENTS, OUTBOX, TURNS] {
            let old: Vec<(Vec<u8>, Vec<u8>)> = w
                .open_table(table)?
                .iter()?
                .map(|e| e.map(|(k, v)| (k.value().to_vec(), v.value().to_vec())))
                .collect::<std::result::Result<_, _>>()?;
            w.delete_table(table)?;
            let mut new = w.open_table(table)?;
            for (k, v) in old {
                let row = if table.name() == TURNS.name() {
                    // Schema 1 did not know when a conversation began: 0 for all of them
                    // (their tasks' records carry no such time either, so they agree).
                    let mut row =
                        codec::context_prefix(&Principal::new(""), &ContextId::new(""), 0);
                    row.truncate(8);
                    row.extend_from_slice(&k);
                    row
                } else if table.name() == TASKS.name() {
                    let Some(key) = codec::v1::parse_task_key(&k) else {
                        continue;
                    };
                    let Some((task, _)) = codec::decode_task(&key, &v) else {
                        continue;
                    };
                    let at = codec::created(&task);
                    let row = codec::task_key(&key, at);
                    created.insert(key, at);
                    row
                } else {
                    // Events and outbox entries: the task's key, then the rest as it was.
                    let Some((key, rest)) = codec::v1::split_task_key(&k) else {
                        continue;
                    };
                    let Some(at) = created.get(&key) else {
                        continue;
                    };
                    let mut row = codec::task_key(&key, *at);
                    row.extend_from_slice(rest);
                    row
                };
                new.insert(row.as_slice(), v.as_slice())?;
            }
        }
        w.open_table(META)?.insert(
            b"schema".as_slice(),
            SCHEMA_VERSION.to_be_bytes().as_slice(),
        )?;
        w.commit()?;
        Ok(created.len())
    };
    let tasks = migrate().map_err(|e| fail(&e))?;
    tracing::info!(
        path = %path.display(),
        tasks,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "store migrated from schema 1 to {SCHEMA_VERSION}"
    );
    Ok(())
}
