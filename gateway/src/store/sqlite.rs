//! The embedded SQLite backend: one file, WAL, one writer connection and a few readers.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use rusqlite::Connection;

use super::backend::{commit_and_reply, gather, Backend, CommitJob, CommitQueue};
use super::error::StoreError;
use super::interface::CommitCallback;
use super::model::ActivityRecord;
use super::nowait;
use super::sql::{self, Db, Dialect};
use super::write::Write;

const READERS: usize = 4;

/// WAL size (pages) past which the background checkpointer truncates the WAL.
const WAL_RESET_PAGES: i64 = 8192;

/// Most activities one group commit takes (one transaction, one fsync).
const MAX_BATCH: usize = 512;

/// SQLite store. `synchronous=FULL` in WAL mode: a commit is durable when `commit` returns.
/// Activity commits go through one committer thread that takes every commit waiting at that
/// moment into one transaction (a savepoint each, so one failure costs only its own activity)
/// and one fsync: concurrent activities share the cost of durability.
pub struct SqliteStore {
    writer: Arc<Mutex<Connection>>,
    commits: CommitQueue,
    readers: Vec<Mutex<Connection>>,
    next_reader: AtomicUsize,
    /// The checkpoint thread runs while this lives.
    _alive: Arc<()>,
}

fn committer(writer: Arc<Mutex<Connection>>, jobs: mpsc::Receiver<CommitJob>) {
    while let Ok(first) = jobs.recv() {
        let batch = gather(first, &jobs, MAX_BATCH);
        match writer.lock() {
            Ok(mut conn) => commit_and_reply(Ok(&mut *conn), batch),
            Err(_) => commit_and_reply::<Connection>(Err(StoreError::Backend("writer lock poisoned".into())), batch),
        }
    }
}

/// The driver's error where this backend calls it itself (opening, pragmas, checkpoints),
/// through the one mapping.
fn backend(e: rusqlite::Error) -> StoreError {
    coffer_sql::sqlite_error(e).into()
}

impl Dialect for Connection {
    const MIGRATION_LOCK: &'static str = "";
    const VOTE_COUNT: &'static str = "json_array_length(votes)";
    const INSERTION_ORDER: &'static str = "rowid";
    const TABLES_WITH_ORGANIZATION_ID: &'static str = "SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) c
         WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' AND c.name = 'organization_id' ORDER BY m.name";

    fn dialect(migration: &str) -> String {
        migration.to_string()
    }
}

fn open_conn(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path).map_err(backend)?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;
         PRAGMA busy_timeout=5000; PRAGMA secure_delete=ON;",
    )
    .map_err(backend)?;
    conn.set_prepared_statement_cache_capacity(128);
    Ok(conn)
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and applies pending migrations.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|e| StoreError::Backend(e.to_string()))?;
            }
        }
        let mut writer = open_conn(path)?;
        sql::migrate(&mut writer)?;
        let readers = (0..READERS).map(|_| open_conn(path).map(Mutex::new)).collect::<Result<Vec<_>, _>>()?;
        // Checkpoints move off the commit path: SQLite's automatic checkpoint would run inside
        // an activity's commit every ~1000 WAL pages (copying pages and fsyncing the database
        // file: a latency spike for whoever committed then). A background thread checkpoints
        // passively instead, until the store is dropped.
        writer.execute_batch("PRAGMA wal_autocheckpoint=0;").map_err(backend)?;
        let alive = Arc::new(());
        let checkpointer = open_conn(path)?;
        let weak = Arc::downgrade(&alive);
        std::thread::Builder::new()
            .name("coffer-checkpointer".into())
            .spawn(move || {
                while weak.upgrade().is_some() {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    // A passive checkpoint never resets the WAL while readers are active, so under
                    // constant load the file only grows (seen: 2.5 GB, and commits slowing with
                    // it). Past WAL_RESET_PAGES, truncate it: that waits briefly for readers and
                    // holds writers back for that moment.
                    let mode =
                        match checkpointer.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(1)) {
                            Ok(frames) if frames > WAL_RESET_PAGES => "PRAGMA wal_checkpoint(TRUNCATE)",
                            Ok(_) => continue,
                            Err(e) => {
                                tracing::warn!(error = %e, "WAL checkpoint failed");
                                continue;
                            }
                        };
                    if let Err(e) = checkpointer.query_row(mode, [], |_| Ok(())) {
                        tracing::warn!(error = %e, "WAL truncation failed");
                    }
                }
            })
            .map_err(|e| StoreError::Backend(format!("starting the checkpoint thread: {e}")))?;
        let writer = Arc::new(Mutex::new(writer));
        let (tx, rx) = mpsc::channel();
        let w = writer.clone();
        std::thread::Builder::new()
            .name("coffer-committer".into())
            .spawn(move || committer(w, rx))
            .map_err(|e| StoreError::Backend(format!("starting the committer thread: {e}")))?;
        Ok(Self { writer, commits: CommitQueue::new(tx), readers, next_reader: AtomicUsize::new(0), _alive: alive })
    }

    /// Runs a read on a pooled reader. A read can meet SQLITE_BUSY without SQLite's busy
    /// handler being consulted while the checkpointer resets the WAL; reads are idempotent, so
    /// they are retried for up to about a second.
    fn read_on<T>(&self, mut f: impl FnMut(&mut Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let i = self.next_reader.fetch_add(1, Ordering::Relaxed) % self.readers.len();
        if nowait::active() {
            // A free reader or none: no lock waits, no busy retries.
            for k in 0..self.readers.len() {
                let mut conn = match self.readers[(i + k) % self.readers.len()].try_lock() {
                    Ok(conn) => conn,
                    Err(std::sync::TryLockError::WouldBlock) => continue,
                    Err(std::sync::TryLockError::Poisoned(_)) => {
                        return Err(StoreError::Backend("reader lock poisoned".into()))
                    }
                };
                return match f(&mut conn) {
                    Err(StoreError::Busy) => Err(nowait::give_up()),
                    other => other,
                };
            }
            return Err(nowait::give_up());
        }
        let mut conn = self.readers[i].lock().map_err(|_| StoreError::Backend("reader lock poisoned".into()))?;
        let mut attempt = 0;
        loop {
            match f(&mut conn) {
                Err(StoreError::Busy) if attempt < 1000 => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                other => return other,
            }
        }
    }
}

impl Backend for SqliteStore {
    type Db = Connection;

    fn read<T: Send>(&self, f: impl FnMut(&mut Connection) -> Result<T, StoreError> + Send) -> Result<T, StoreError> {
        self.read_on(f)
    }

    fn write<T: Send>(&self, f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send) -> Result<T, StoreError> {
        if nowait::active() {
            return Err(nowait::give_up());
        }
        let mut conn = self.writer.lock().map_err(|_| StoreError::Backend("writer lock poisoned".into()))?;
        Db::transaction(&mut *conn, f)
    }

    fn commit_then(&self, activity: ActivityRecord, writes: Vec<Write>, done: CommitCallback) {
        self.commits.send(activity, writes, done)
    }

    fn purge_deleted_data(&self) -> Result<bool, StoreError> {
        // The WAL still holds the frames written before a deletion (secure_delete zeroes only
        // the new page versions): copy the latest pages into the database, then empty the WAL.
        let conn = self.writer.lock().map_err(|_| StoreError::Backend("writer lock poisoned".into()))?;
        let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0)).map_err(backend)?;
        Ok(busy == 0)
    }
}

/// The behaviour both backends share is tested in `tests/tests/store.rs` (the conformance suite,
/// on SQLite and PostgreSQL); what is SQLite's own is tested here.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::error::ConflictKind;
    use crate::store::error::Constraint;
    use crate::store::interface::Store;
    use crate::store::model::{Organization, Record, Wallet};

    fn org(id: &str) -> Organization {
        Organization {
            id: id.into(),
            name: "o".into(),
            parent_id: None,
            root_quorum_threshold: 1,
            root_user_ids: vec!["u".into()],
            created_at: 1,
            updated_at: 1,
        }
    }

    fn store() -> (tempdir::Dir, SqliteStore) {
        let dir = tempdir::Dir::new();
        let s = SqliteStore::open(&dir.0.join("t.db")).unwrap();
        s.apply(&[Write::InsertOrganization(org("o1"))]).unwrap();
        (dir, s)
    }

    /// A throwaway directory removed on drop (keeps the dependency list short).
    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                let p = std::env::temp_dir().join(format!("coffer-store-{}", uuid::Uuid::new_v4()));
                std::fs::create_dir_all(&p).unwrap();
                Self(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn no_wait_reads_give_up_instead_of_waiting() {
        let (_dir, s) = store();
        s.apply(&[Write::InsertOrganization(org("nowait-org"))]).unwrap();
        assert_eq!(
            nowait::run(|| s.organization("nowait-org").map(|o| o.id)).map(Result::unwrap),
            Some("nowait-org".to_string())
        );
        // Every reader connection held elsewhere: the read gives up at once, and says so.
        let held: Vec<_> = s.readers.iter().map(|r| r.lock().unwrap()).collect();
        assert!(nowait::run(|| s.organization("nowait-org")).is_none());
        // Typed as the expected retry it is (never logged as a store failure).
        let mut gave_up = None;
        nowait::run(|| gave_up = s.organization("nowait-org").err());
        assert!(matches!(gave_up, Some(StoreError::WouldWait)), "{gave_up:?}");
        let mut listed = None;
        nowait::run(|| listed = Some(crate::ops::credentials::authenticators_json(&s, "nowait-org", "u")));
        assert_eq!(listed, Some(Vec::new()), "an attempt that gave up answers nothing, and is rerun");
        assert!(nowait::run(|| s.apply(&[])).is_none(), "the writer's lock is not waited for either");
        drop(held);
        // Outside no-wait mode nothing changed, and the flag does not leak into the next run.
        assert_eq!(s.organization("nowait-org").unwrap().id, "nowait-org");
        assert!(nowait::run(|| s.organization("nowait-org")).is_some());
    }

    #[test]
    fn errors_are_typed_where_the_store_raises_them() {
        let (_dir, s) = store();
        let wallet = |id: &str| Wallet {
            id: id.into(),
            organization_id: "o1".into(),
            name: "same".into(),
            exported: false,
            imported: false,
            sealed_seed: vec![1],
            created_at: 1,
            updated_at: 1,
        };
        s.apply(&[Write::InsertWallet(wallet("w1"))]).unwrap();
        let delete = |id: &str| Write::DeleteWallets { ids: vec![id.into()], require_exported: true };
        let err = s.apply(&[delete("w1")]).unwrap_err();
        assert!(matches!(&err, StoreError::Conflict(c) if c.kind == ConflictKind::NotExported), "{err:?}");
        assert!(err.to_string().starts_with("wallet account has not been exported: wallet w1"), "{err}");
        let err = s.apply(&[delete("nope")]).unwrap_err();
        assert!(matches!(&err, StoreError::Conflict(c) if c.kind == ConflictKind::Precondition), "{err:?}");
        assert!(matches!(&err, StoreError::Conflict(c) if c == "wallet not found: nope"), "{err:?}");

        // SQLite's message names the columns; the adapter tells a record name from the rest.
        let err = s.apply(&[Write::InsertWallet(wallet("w2"))]).unwrap_err();
        assert!(matches!(&err, StoreError::Unique(u) if u.constraint == Constraint::Other), "{err:?}");
        assert_eq!(err.to_string(), "wallet name must be unique");
        let checked = |id: &str| Write::PutRecordChecked {
            record: Record {
                organization_id: "o1".into(),
                kind: "policy".into(),
                id: id.into(),
                name: "same".into(),
                data: serde_json::json!({}),
                created_at: 1,
                updated_at: 1,
            },
            unique_message: "policy name taken".into(),
            must_exist: false,
        };
        s.apply(&[checked("p1")]).unwrap();
        let err = s.apply(&[checked("p2")]).unwrap_err();
        assert!(matches!(&err, StoreError::Unique(u) if u.constraint == Constraint::RecordName), "{err:?}");
        assert_eq!(err.to_string(), "policy name taken");
    }
}
