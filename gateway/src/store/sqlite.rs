//! The embedded SQLite backend: one file, WAL, one writer connection and a few readers.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode};

use super::backend::Backend;
use super::sql::{self, Arg, Db, SqlRow, Value};
use super::*;

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
    commits: Mutex<mpsc::Sender<CommitJob>>,
    readers: Vec<Mutex<Connection>>,
    next_reader: AtomicUsize,
    /// The checkpoint thread runs while this lives.
    _alive: Arc<()>,
}

/// One activity waiting for the committer, and where to send its outcome.
pub(super) struct CommitJob {
    pub activity: ActivityRecord,
    pub writes: Vec<Write>,
    pub reply: CommitCallback,
}

/// Takes every job waiting (up to `max`) after the first into one batch.
pub(super) fn gather(first: CommitJob, jobs: &mpsc::Receiver<CommitJob>, max: usize) -> Vec<CommitJob> {
    let mut batch = vec![first];
    while batch.len() < max {
        match jobs.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
    batch
}

/// Commits a batch with the shared SQL, records the metrics, and answers every job.
pub(super) fn commit_and_reply<D: Db>(db: Result<&mut D, StoreError>, batch: Vec<CommitJob>) {
    let results = match db {
        Ok(db) => {
            let started = std::time::Instant::now();
            let jobs: Vec<(&ActivityRecord, &[Write])> = batch.iter().map(|j| (&j.activity, &j.writes[..])).collect();
            let results = sql::commit_batch(db, &jobs);
            let m = crate::metrics::metrics();
            m.commit_seconds.observe(started.elapsed().as_secs_f64());
            m.commit_batch.observe(batch.len() as f64);
            results
        }
        Err(e) => batch.iter().map(|_| Err(StoreError::Backend(e.to_string()))).collect(),
    };
    for (job, result) in batch.into_iter().zip(results) {
        (job.reply)(result);
    }
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

fn backend(e: rusqlite::Error) -> StoreError {
    if let rusqlite::Error::SqliteFailure(f, msg) = &e {
        if f.code == ErrorCode::ConstraintViolation && msg.as_deref().is_some_and(|m| m.contains("UNIQUE")) {
            return StoreError::Unique(msg.clone().unwrap_or_default());
        }
        if f.code == ErrorCode::DatabaseBusy {
            return StoreError::Busy;
        }
    }
    StoreError::Backend(e.to_string())
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Arg::Null => ValueRef::Null,
            Arg::Int(v) => ValueRef::Integer(v),
            Arg::Text(s) => ValueRef::Text(s.as_bytes()),
            Arg::Bytes(b) => ValueRef::Blob(b),
        }))
    }
}

impl SqlRow for rusqlite::Row<'_> {
    fn value(&self, i: usize) -> Result<Value, StoreError> {
        Ok(match self.get_ref(i).map_err(backend)? {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(v) => Value::Int(v),
            ValueRef::Real(v) => Value::Int(v as i64),
            ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
            ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
        })
    }
}

/// Statements go through the connection's prepared-statement cache: preparing (parsing and
/// planning) a statement cost more than running it in the gateway's profile.
impl Db for Connection {
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";
    const MIGRATION_LOCK: &'static str = "";
    const VOTE_COUNT: &'static str = "json_array_length(votes)";
    const INSERTION_ORDER: &'static str = "rowid";
    const TABLES_WITH_ORGANIZATION_ID: &'static str = "SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) c
         WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' AND c.name = 'organization_id' ORDER BY m.name";

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let mut st = self.prepare_cached(sql).map_err(backend)?;
        Ok(st.execute(rusqlite::params_from_iter(args)).map_err(backend)? as u64)
    }

    fn query<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        mut f: impl FnMut(&dyn SqlRow) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let mut st = self.prepare_cached(sql).map_err(backend)?;
        let mut rows = st.query(rusqlite::params_from_iter(args)).map_err(backend)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(backend)? {
            out.push(f(row)?);
        }
        Ok(out)
    }

    fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        self.execute_batch(sql).map_err(backend)
    }

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
        Ok(Self { writer, commits: Mutex::new(tx), readers, next_reader: AtomicUsize::new(0), _alive: alive })
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

    fn read<T>(&self, f: impl FnMut(&mut Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        self.read_on(f)
    }

    fn write<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        if nowait::active() {
            return Err(nowait::give_up());
        }
        let mut conn = self.writer.lock().map_err(|_| StoreError::Backend("writer lock poisoned".into()))?;
        Db::transaction(&mut *conn, f)
    }

    fn commit_then(&self, activity: ActivityRecord, writes: Vec<Write>, done: CommitCallback) {
        let queue = match self.commits.lock() {
            Ok(q) => q,
            Err(_) => return done(Err(StoreError::Backend("commit queue lock poisoned".into()))),
        };
        if let Err(mpsc::SendError(job)) = queue.send(CommitJob { activity, writes, reply: done }) {
            (job.reply)(Err(StoreError::Backend("committer thread stopped".into())));
        }
    }

    fn purge_deleted_data(&self) -> Result<bool, StoreError> {
        // The WAL still holds the frames written before a deletion (secure_delete zeroes only
        // the new page versions): copy the latest pages into the database, then empty the WAL.
        let conn = self.writer.lock().map_err(|_| StoreError::Backend("writer lock poisoned".into()))?;
        let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0)).map_err(backend)?;
        Ok(busy == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sql::{KEPT_ON_DELETION, PURGED_ON_DELETION};

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

    fn activity(fp: &str) -> ActivityRecord {
        ActivityRecord {
            id: uuid::Uuid::new_v4().to_string(),
            organization_id: "o1".into(),
            activity_type: "ACTIVITY_TYPE_X".into(),
            status: "ACTIVITY_STATUS_COMPLETED".into(),
            fingerprint: fp.into(),
            intent: serde_json::json!({}),
            result: serde_json::json!({}),
            votes: serde_json::json!([]),
            failure: None,
            created_at: now_nanos(),
            updated_at: now_nanos(),
        }
    }

    fn wallet(id: &str, name: &str) -> Wallet {
        Wallet {
            id: id.into(),
            organization_id: "o1".into(),
            name: name.into(),
            exported: false,
            imported: false,
            sealed_seed: vec![1, 2, 3],
            created_at: 1,
            updated_at: 1,
        }
    }

    #[test]
    fn every_table_of_an_organization_is_purged_or_kept_on_deletion_by_decision() {
        let (_dir, s) = store();
        let tables: Vec<String> = s.organization_footprint("o1").unwrap().into_iter().map(|(t, _)| t).collect();
        let unclassified: Vec<&String> = tables
            .iter()
            .filter(|t| !PURGED_ON_DELETION.contains(&t.as_str()) && !KEPT_ON_DELETION.contains(&t.as_str()))
            .collect();
        assert!(
            unclassified.is_empty(),
            "tables a sub-organization deletion neither purges nor keeps: {unclassified:?}"
        );
        for t in PURGED_ON_DELETION.iter().chain(KEPT_ON_DELETION) {
            assert!(tables.iter().any(|x| x == t), "{t} is not a table with an organization_id");
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
    fn same_fingerprint_commits_once() {
        let (_d, s) = store();
        let first = activity("sha256:aa");
        assert!(matches!(s.commit(&first, &[Write::InsertWallet(wallet("w1", "a"))]).unwrap(), Committed::New(_)));
        let again = activity("sha256:aa");
        match s.commit(&again, &[Write::InsertWallet(wallet("w2", "b"))]).unwrap() {
            Committed::Existing(a) => assert_eq!(a.id, first.id),
            other => panic!("expected existing, got {other:?}"),
        }
        // The second activity's effects were not applied.
        assert_eq!(s.wallets("o1").unwrap().len(), 1);
    }

    #[test]
    fn failed_write_rolls_back_everything() {
        let (_d, s) = store();
        s.commit(&activity("sha256:1"), &[Write::InsertWallet(wallet("w1", "a"))]).unwrap();
        // Second wallet is fine, then a name clash: neither the wallet nor the activity lands.
        let err = s
            .commit(
                &activity("sha256:2"),
                &[Write::InsertWallet(wallet("w2", "b")), Write::InsertWallet(wallet("w3", "a"))],
            )
            .unwrap_err();
        assert!(matches!(err, StoreError::Unique(ref m) if m == "wallet name must be unique"), "{err:?}");
        assert_eq!(s.wallets("o1").unwrap().len(), 1);
        assert!(matches!(s.activity_by_fingerprint("sha256:2"), Err(StoreError::NotFound)));
    }

    #[test]
    fn delete_requires_export_unless_told() {
        let (_d, s) = store();
        s.commit(&activity("sha256:1"), &[Write::InsertWallet(wallet("w1", "a"))]).unwrap();
        let err = s
            .commit(&activity("sha256:2"), &[Write::DeleteWallets { ids: vec!["w1".into()], require_exported: true }])
            .unwrap_err();
        assert!(matches!(err, StoreError::Conflict(ref m) if m.starts_with("wallet account has not been exported")));
        assert_eq!(s.wallets("o1").unwrap().len(), 1);
        s.commit(&activity("sha256:3"), &[Write::MarkWalletExported("w1".into())]).unwrap();
        s.commit(&activity("sha256:4"), &[Write::DeleteWallets { ids: vec!["w1".into()], require_exported: true }])
            .unwrap();
        assert!(s.wallets("o1").unwrap().is_empty());
    }

    #[test]
    fn import_target_is_used_once() {
        let (_d, s) = store();
        let t = ImportTarget { organization_id: "o1".into(), user_id: "u".into(), sealed_key: vec![9], created_at: 1 };
        s.apply(&[Write::PutImportTarget(t.clone())]).unwrap();
        assert_eq!(s.import_target("o1", "u").unwrap().sealed_key, vec![9]);
        let take = Write::TakeImportTarget { organization_id: "o1".into(), user_id: "u".into(), sealed_key: vec![9] };
        s.apply(std::slice::from_ref(&take)).unwrap();
        assert!(matches!(s.apply(&[take]), Err(StoreError::Conflict(_))));
    }

    #[test]
    fn records_unique_names_replace_and_delete() {
        let (_d, s) = store();
        let rec = |id: &str, name: &str| Record {
            organization_id: "o1".into(),
            kind: "policy".into(),
            id: id.into(),
            name: name.into(),
            data: serde_json::json!({"n": name}),
            created_at: 1,
            updated_at: 1,
        };
        s.apply(&[Write::PutRecord(rec("p1", "a"))]).unwrap();
        let err = s.apply(&[Write::PutRecord(rec("p2", "a"))]).unwrap_err();
        assert!(matches!(err, StoreError::Unique(ref m) if m.contains("policy name must be unique")), "{err:?}");
        s.apply(&[Write::PutRecord(rec("p1", "b"))]).unwrap();
        assert_eq!(s.record("o1", "policy", "p1").unwrap().data, serde_json::json!({"n": "b"}));
        assert_eq!(s.records("o1", "policy").unwrap().len(), 1);
        let del = |ids: Vec<&str>| Write::DeleteRecords {
            organization_id: "o1".into(),
            kind: "policy".into(),
            ids: ids.into_iter().map(String::from).collect(),
        };
        // Deleting a missing record fails the whole transaction: p1 survives.
        assert!(matches!(s.apply(&[del(vec!["p1", "nope"])]), Err(StoreError::Conflict(_))));
        assert!(s.record("o1", "policy", "p1").is_ok());
        s.apply(&[del(vec!["p1"])]).unwrap();
        assert!(matches!(s.record("o1", "policy", "p1"), Err(StoreError::NotFound)));
    }

    #[test]
    fn concurrent_commits_share_batches_and_fail_alone() {
        let (_d, s) = store();
        let s = std::sync::Arc::new(s);
        // 64 threads commit at once; every 8th reuses a wallet name, so exactly those fail.
        let handles: Vec<_> = (0..64)
            .map(|i| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let name = if i % 8 == 0 { "dup".to_string() } else { format!("w{i}") };
                    s.commit(
                        &activity(&format!("sha256:{i}")),
                        &[Write::InsertWallet(wallet(&format!("id{i}"), &name))],
                    )
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let ok = results.iter().filter(|r| matches!(r, Ok(Committed::New(_)))).count();
        let unique = results.iter().filter(|r| matches!(r, Err(StoreError::Unique(_)))).count();
        // One "dup" wins, seven lose; every other commit lands.
        assert_eq!((ok, unique), (57, 7));
        assert_eq!(s.wallets("o1").unwrap().len(), 57);
        let filter = ActivityFilter { limit: 100, ..Default::default() };
        assert_eq!(s.activities("o1", &filter).unwrap().len(), 57);
    }

    /// Pages from SQL match the list semantics: newest first, `after` older than the cursor,
    /// `before` the page just newer than it, filters first, unknown cursors ignored.
    #[test]
    fn activity_pages_are_keyset_pages_in_sql() {
        let (_d, s) = store();
        let mut all = Vec::new();
        for i in 0..40i64 {
            let mut a = activity(&format!("sha256:p{i}"));
            a.id = format!("a{i:02}");
            // Pairs share a timestamp, so the id breaks ties.
            a.created_at = 1_000 + i / 2;
            a.status = if i % 3 == 0 { "ACTIVITY_STATUS_FAILED" } else { "ACTIVITY_STATUS_COMPLETED" }.into();
            s.commit(&a, &[]).unwrap();
            all.push(a);
        }
        all.sort_by(|x, y| (y.created_at, &y.id).cmp(&(x.created_at, &x.id)));
        let ids = |v: Vec<ActivityRecord>| v.into_iter().map(|a| a.id).collect::<Vec<_>>();
        let expect = |f: &ActivityFilter| {
            let mut items: Vec<&ActivityRecord> =
                all.iter().filter(|a| f.statuses.is_empty() || f.statuses.contains(&a.status)).collect();
            if let Some(pos) = f.after.as_ref().and_then(|c| all.iter().position(|a| &a.id == c)) {
                let cut = &all[pos];
                items.retain(|a| (a.created_at, &a.id) < (cut.created_at, &cut.id));
            }
            if let Some(pos) = f.before.as_ref().and_then(|c| all.iter().position(|a| &a.id == c)) {
                let cut = &all[pos];
                items.retain(|a| (a.created_at, &a.id) > (cut.created_at, &cut.id));
                let skip = items.len().saturating_sub(f.limit);
                items.drain(..skip);
            }
            items.truncate(f.limit);
            items.into_iter().map(|a| a.id.clone()).collect::<Vec<_>>()
        };
        let failed = vec!["ACTIVITY_STATUS_FAILED".to_string()];
        for (statuses, after, before, limit) in [
            (vec![], None, None, 10),
            (vec![], Some("a21"), None, 10),
            (vec![], Some("a20"), None, 100),
            (vec![], None, Some("a10"), 5),
            (vec![], None, Some("a38"), 5),
            (vec![], Some("a30"), Some("a10"), 4),
            (failed.clone(), Some("a33"), None, 3),
            (failed.clone(), None, Some("a03"), 3),
            (vec![], Some("unknown"), None, 3),
        ] {
            let f = ActivityFilter {
                statuses,
                types: vec![],
                limit,
                after: after.map(String::from),
                before: before.map(String::from),
            };
            let got = ids(s.activities("o1", &f).unwrap());
            assert_eq!(got, expect(&f), "{after:?} {before:?} {limit}");
            assert!(!got.is_empty());
        }
        // Walking `after` cursors visits every activity once, newest first.
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let f = ActivityFilter { limit: 7, after: after.clone(), ..Default::default() };
            let page = ids(s.activities("o1", &f).unwrap());
            if page.is_empty() {
                break;
            }
            after = page.last().cloned();
            seen.extend(page);
        }
        assert_eq!(seen, all.iter().map(|a| a.id.clone()).collect::<Vec<_>>());
        let typed = ActivityFilter { limit: 100, types: vec!["ACTIVITY_TYPE_NONE".into()], ..Default::default() };
        assert!(s.activities("o1", &typed).unwrap().is_empty());
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
        assert!(nowait::run(|| s.apply(&[])).is_none(), "the writer's lock is not waited for either");
        drop(held);
        // Outside no-wait mode nothing changed, and the flag does not leak into the next run.
        assert_eq!(s.organization("nowait-org").unwrap().id, "nowait-org");
        assert!(nowait::run(|| s.organization("nowait-org")).is_some());
    }

    #[test]
    fn webhook_outbox_rows_are_due_skipped_attempted_and_dropped() {
        let (_dir, s) = store();
        let row = |id: &str, endpoint: &str, due: Nanos| WebhookDelivery {
            id: id.into(),
            organization_id: "o1".into(),
            endpoint_id: endpoint.into(),
            activity_organization_id: "o1".into(),
            activity_id: "a1".into(),
            event_type: "ACTIVITY_UPDATES".into(),
            body: "{}".into(),
            status: DELIVERY_PENDING.into(),
            attempts: 0,
            next_attempt_at: due,
            last_status_code: None,
            last_error: None,
            created_at: 1,
            updated_at: 1,
        };
        s.apply(&[
            Write::EnqueueWebhookDelivery(row("d1", "slow", 10)),
            Write::EnqueueWebhookDelivery(row("d2", "slow", 11)),
            Write::EnqueueWebhookDelivery(row("d3", "fast", 12)),
            Write::EnqueueWebhookDelivery(row("d4", "fast", 99)),
        ])
        .unwrap();
        let ids = |v: Vec<WebhookDelivery>| v.into_iter().map(|d| d.id).collect::<Vec<_>>();
        assert_eq!(ids(s.due_webhook_deliveries(50, 10, &[]).unwrap()), ["d1", "d2", "d3"], "due, oldest first");
        assert_eq!(
            ids(s.due_webhook_deliveries(50, 10, &["slow".into()]).unwrap()),
            ["d3"],
            "a busy endpoint is skipped"
        );
        let attempt = |status: &str, next: Nanos| WebhookAttempt {
            at: 20,
            status_code: Some(503),
            error: Some("HTTP 503".into()),
            duration_ms: 3,
            status: status.into(),
            next_attempt_at: next,
        };
        assert_eq!(s.due_webhook_deliveries(50, 10, &[]).unwrap()[0].body, "{}", "with their bodies");
        s.record_webhook_attempt("d1", &attempt(DELIVERY_PENDING, 70)).unwrap();
        assert_eq!(ids(s.due_webhook_deliveries(50, 10, &[]).unwrap()), ["d2", "d3"], "retried later");
        // A restart releases the leases of never attempted deliveries (d4), not retries (d1).
        assert_eq!(s.release_webhook_leases(50).unwrap(), 1);
        assert_eq!(ids(s.due_webhook_deliveries(50, 10, &[]).unwrap()), ["d2", "d3", "d4"]);
        assert_eq!(s.release_webhook_leases(50).unwrap(), 0);
        s.record_webhook_attempt("d2", &attempt(DELIVERY_FAILED, 20)).unwrap();
        let listed = s.webhook_deliveries("o1", "slow", 10).unwrap();
        let d1 = listed.iter().find(|d| d.id == "d1").unwrap();
        assert_eq!((d1.attempts, d1.last_status_code, d1.next_attempt_at), (1, Some(503), 70));
        assert_eq!(listed.iter().find(|d| d.id == "d2").unwrap().status, DELIVERY_FAILED);
        // A finished delivery takes no more attempts.
        s.record_webhook_attempt("d2", &attempt(DELIVERY_DELIVERED, 20)).unwrap();
        assert_eq!(s.webhook_deliveries("o1", "slow", 10).unwrap().iter().find(|d| d.id == "d2").unwrap().attempts, 1);
        // Deleting the endpoint drops what is still pending, keeps what is settled.
        s.apply(&[Write::DropWebhookDeliveries { organization_id: "o1".into(), endpoint_id: "slow".into() }]).unwrap();
        assert_eq!(ids(s.webhook_deliveries("o1", "slow", 10).unwrap()), ["d2"]);
    }

    #[test]
    fn migrations_are_idempotent() {
        let dir = tempdir::Dir::new();
        let path = dir.0.join("m.db");
        SqliteStore::open(&path).unwrap().apply(&[Write::InsertOrganization(org("o1"))]).unwrap();
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(s.organization("o1").unwrap(), org("o1"));
    }
}
