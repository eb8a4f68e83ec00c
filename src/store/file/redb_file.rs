//! The redb file (`backend = "redb"`): the rows in B-trees, one write transaction with
//! `Durability::Immediate` per batch. Also read once to carry an existing file over into
//! the log (`backend = "log"`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use redb::{
    Database, DatabaseError, Durability, ReadTransaction, ReadableDatabase, ReadableTable,
    WriteTransaction,
};

use super::load::{Loaded, guarded_load, load, read_events, refuse_damage};
use super::schema::{
    Def, EVENTS, OUTBOX, PUSH, TASKS, TURNS, check_existing, check_schema, refused, restrict,
};
use super::tables::{DiskError, Table, TableRead, TableWrite};
use super::{Disk, open_error};
use crate::config::Config;
use crate::error::Result;
use crate::model::{Message, TaskEvent, TaskKey};
use crate::store::codec::{Created, SCHEMA_VERSION};
use crate::store::index::Indexes;

fn def(table: Table) -> Def {
    match table {
        Table::Tasks => TASKS,
        Table::Events => EVENTS,
        Table::Outbox => OUTBOX,
        Table::Push => PUSH,
        Table::Turns => TURNS,
    }
}

impl From<redb::Error> for DiskError {
    fn from(e: redb::Error) -> Self {
        match e {
            redb::Error::Corrupted(why) => DiskError::Damaged(why),
            other => DiskError::Io(other.to_string()),
        }
    }
}

macro_rules! via_redb_error {
    ($($t:ty),*) => {$(
        impl From<$t> for DiskError {
            fn from(e: $t) -> Self {
                redb::Error::from(e).into()
            }
        }
    )*};
}
via_redb_error!(
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError
);

/// Takes rows one by one (carrying the file over into the log).
pub(super) type RowSink<'a> =
    dyn FnMut(Table, &[u8], &[u8]) -> std::result::Result<(), DiskError> + 'a;

/// The open file, replaced when a failed commit makes the committer reopen it. `None`
/// only while a reopen has not succeeded yet.
pub(super) struct RedbDisk {
    db: RwLock<Option<Database>>,
    path: PathBuf,
    cache_bytes: usize,
    quick_repair: bool,
}

/// The tables of one write transaction, opened once.
struct Writer<'t>([redb::Table<'t, &'static [u8], &'static [u8]>; 5]);

impl<'t> Writer<'t> {
    fn open(w: &'t WriteTransaction) -> std::result::Result<Self, DiskError> {
        Ok(Self([
            w.open_table(TASKS)?,
            w.open_table(EVENTS)?,
            w.open_table(OUTBOX)?,
            w.open_table(PUSH)?,
            w.open_table(TURNS)?,
        ]))
    }

    fn table(&mut self, t: Table) -> &mut redb::Table<'t, &'static [u8], &'static [u8]> {
        &mut self.0[usize::from(t.code())]
    }
}

impl TableWrite for Writer<'_> {
    fn put(&mut self, t: Table, key: &[u8], value: &[u8]) -> std::result::Result<(), DiskError> {
        self.table(t).insert(key, value)?;
        Ok(())
    }

    fn remove(&mut self, t: Table, key: &[u8]) -> std::result::Result<(), DiskError> {
        self.table(t).remove(key)?;
        Ok(())
    }

    fn remove_range(
        &mut self,
        t: Table,
        start: &[u8],
        end: &[u8],
    ) -> std::result::Result<(), DiskError> {
        self.table(t).retain_in(start..end, |_, _| false)?;
        Ok(())
    }

    fn contains(&mut self, t: Table, key: &[u8]) -> std::result::Result<bool, DiskError> {
        Ok(self.table(t).get(key)?.is_some())
    }
}

/// Reading through one read transaction.
pub(super) struct Reader(pub(super) ReadTransaction);

impl TableRead for Reader {
    fn scan(
        &self,
        t: Table,
        start: &[u8],
        end: Option<&[u8]>,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> std::result::Result<(), DiskError> {
        let table = self.0.open_table(def(t))?;
        let range = match end {
            Some(end) => table.range(start..end)?,
            None => table.range(start..)?,
        };
        for entry in range {
            let (k, v) = entry?;
            if !f(k.value(), v.value()) {
                break;
            }
        }
        Ok(())
    }

    fn get(&self, t: Table, key: &[u8]) -> std::result::Result<Option<Vec<u8>>, DiskError> {
        let table = self.0.open_table(def(t))?;
        Ok(table.get(key)?.map(|v| v.value().to_vec()))
    }
}

impl RedbDisk {
    /// Opens (or creates) the file, checks it is an a2ad store of a schema this build
    /// reads, and loads it into `indexes`.
    pub(super) fn open(config: &Config, indexes: &Indexes) -> Result<(Self, Loaded)> {
        let store = &config.store;
        let path = PathBuf::from(store.path());
        super::create_parent(&path)?;
        let fresh = !path.exists();
        if !fresh && std::fs::metadata(&path).is_ok_and(|m| m.len() == 0) {
            // An a2ad store is never empty (redb writes its header when it creates the
            // file): this is an operator's `> a2ad.redb` or a truncation, not a new store.
            return Err(open_error(
                &path,
                "is empty (0 bytes), so it is not a store a2ad wrote: if it held tasks, restore it from a backup; to start with a new, empty store, delete the file",
            ));
        }
        let mut loaded = None;
        if !fresh {
            loaded = read_only(&path, indexes, config)?;
        }
        let db = redb::Builder::new()
            .set_cache_size(store.cache_mib.saturating_mul(1 << 20))
            .create(&path)
            .map_err(|e| refused(&path, e))?;
        if fresh {
            restrict(&path, 0o600);
        }
        check_schema(&db, &path)?;
        let loaded = match loaded {
            Some(l) => l,
            None => {
                let l = guarded_load(&path, || load(&Reader(db.begin_read()?), indexes, config))?;
                refuse_damage(&path, &l.damaged, store.set_aside_damaged)?;
                l
            }
        };
        let disk = Self {
            db: RwLock::new(Some(db)),
            path,
            cache_bytes: store.cache_mib.saturating_mul(1 << 20),
            quick_repair: store.quick_repair,
        };
        super::settle(&disk, &disk.path, &loaded)?;
        Ok((disk, loaded))
    }

    /// Every row of every table, table by table in key order (carrying the file over into
    /// the log).
    pub(super) fn rows(&self, f: &mut RowSink<'_>) -> std::result::Result<(), DiskError> {
        let db = self.db.read().unwrap_or_else(|e| e.into_inner());
        let Some(db) = db.as_ref() else {
            return Err(DiskError::Io("the store file is not open".into()));
        };
        let read = Reader(db.begin_read()?);
        for t in Table::ALL {
            let mut failed = None;
            read.each(t, &mut |k, v| match f(t, k, v) {
                Ok(()) => true,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            })?;
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(())
    }

    /// One write transaction (durable at commit).
    fn transaction<T>(
        &self,
        f: impl FnOnce(&mut Writer<'_>) -> std::result::Result<T, DiskError>,
    ) -> std::result::Result<T, DiskError> {
        let db = self.db.read().unwrap_or_else(|e| e.into_inner());
        let Some(db) = db.as_ref() else {
            return Err(DiskError::Io("the store file is not open".into()));
        };
        let mut w = db.begin_write()?;
        w.set_durability(Durability::Immediate)
            .map_err(|e| DiskError::Io(e.to_string()))?;
        w.set_quick_repair(self.quick_repair);
        let out = {
            let mut tables = Writer::open(&w)?;
            f(&mut tables)?
        };
        w.commit()?;
        Ok(out)
    }
}

/// Looks at an existing file before writing: a file that is not ours, or a damaged one,
/// is left exactly as it was. A clean file is loaded through this read-only handle; one
/// that was not closed cleanly (a crash) is left to the writer, which repairs it.
fn read_only(path: &Path, indexes: &Indexes, config: &Config) -> Result<Option<Loaded>> {
    match redb::Builder::new().open_read_only(path) {
        Ok(read) => {
            if check_existing(&read, path)? != SCHEMA_VERSION {
                return Ok(None);
            }
            let l = guarded_load(path, || load(&Reader(read.begin_read()?), indexes, config))?;
            refuse_damage(path, &l.damaged, config.store.set_aside_damaged)?;
            Ok(Some(l))
        }
        Err(DatabaseError::RepairAborted) => Ok(None),
        Err(e) => Err(refused(path, e)),
    }
}

impl Disk for RedbDisk {
    fn write(
        &self,
        f: &mut dyn FnMut(&mut dyn TableWrite) -> std::result::Result<(), DiskError>,
    ) -> std::result::Result<(), DiskError> {
        self.transaction(|w| f(w))
    }

    /// Closes the file and opens it again: a failed commit leaves redb's handle unusable
    /// (it latches the I/O error); redb repairs what the failed commit left.
    fn reopen(&self) -> std::result::Result<(), DiskError> {
        let mut slot = self.db.write().unwrap_or_else(|e| e.into_inner());
        // One handle per file: the failed one goes first.
        drop(slot.take());
        let db = redb::Builder::new()
            .set_cache_size(self.cache_bytes)
            .create(&self.path)
            .map_err(|e| DiskError::Io(e.to_string()))?;
        *slot = Some(db);
        Ok(())
    }

    fn events(
        &self,
        key: &TaskKey,
        created: Created,
        after: u64,
        history: &[Arc<Message>],
    ) -> std::result::Result<Vec<TaskEvent>, DiskError> {
        let db = self.db.read().unwrap_or_else(|e| e.into_inner());
        let Some(db) = db.as_ref() else {
            return Err(DiskError::Io("the store file is being reopened".into()));
        };
        let read = Reader(db.begin_read()?);
        read_events(&read, key, created, after, history)
    }

    fn bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }
}
