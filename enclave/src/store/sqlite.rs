//! The SQLite backend of the authority store: one file owned by the enclave's user (mode 0600),
//! in WAL mode so reads never wait for a write, shareable by several enclave processes on one host
//! (writes take SQLite's file lock, waiting up to five seconds).
//!
//! Durability, by what is written:
//! - state changes (`apply`) and sealed service keys commit with `synchronous=FULL`: the WAL is
//!   fsync'd before the call returns, so a change survives a power loss once the enclave has
//!   answered;
//! - replay entries and decisions commit with `synchronous=NORMAL`: written to the WAL (the
//!   kernel has them, so they survive a crash or kill of the enclave process) but fsync'd only at
//!   the next checkpoint or state change. Chosen because an fsync per signing would halve signing
//!   throughput on most disks, and what a power loss can undo is narrow: a replay entry lives for
//!   the freshness window only (5 minutes by default); a replay accepted after the machine came
//!   back needs a captured body whose first use landed in the last unsynced moment before the power
//!   went, is still fresh once the enclave is up again, and asks again for an operation that
//!   body's own stamp authorized. The decision log loses at most the same moment, as the log files
//!   of the audit lines would.
//! - activity log heads (`advance_log`) commit with `synchronous=NORMAL` too, for the same reason
//!   (one per finished activity): a power loss can take back the last heads, and a verifier then
//!   reports the links the gateway stored beyond them (docs/proofs.md "The activity log").

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use crate::group_commit::{self, Reply, Turn};
use coffer_sql::Db;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::backend::Backend;
use super::interface::{DecisionRecord, Remembered, ReplayLane, ReplayShare, Spend, StoreError, StoreLimits};
use super::sql;

/// The schema, one migration per entry; `PRAGMA user_version` is how many were applied.
const MIGRATIONS: &[&str] = &[
    r"
CREATE TABLE org_heads (
    organization_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE entries (
    organization_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (organization_id, kind, id)
) WITHOUT ROWID;
CREATE TABLE replay (
    key BLOB PRIMARY KEY,
    organization_id TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX replay_expiry ON replay (expires_ms);
CREATE INDEX replay_organization_expiry ON replay (organization_id, expires_ms);
CREATE TABLE replay_live (
    organization_id TEXT PRIMARY KEY,
    live INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE replay_total (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    live INTEGER NOT NULL
);
INSERT INTO replay_total (one, live) VALUES (1, 0);
CREATE TABLE decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    organization_id TEXT NOT NULL,
    operation TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    activity_type TEXT NOT NULL,
    user_id TEXT NOT NULL,
    outcome TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX decisions_fingerprint ON decisions (organization_id, fingerprint);
CREATE INDEX decisions_at ON decisions (at_ms);
",
    r"
CREATE TABLE log_heads (
    organization_id TEXT PRIMARY KEY,
    links INTEGER NOT NULL,
    head TEXT NOT NULL
) WITHOUT ROWID;
",
    r"
CREATE TABLE sealed_service_keys (
    label TEXT PRIMARY KEY,
    blob BLOB NOT NULL
) WITHOUT ROWID;
",
    r"
CREATE TABLE log_links (
    organization_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL,
    activity_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (organization_id, fingerprint, status)
) WITHOUT ROWID;
",
    r"
ALTER TABLE log_links ADD COLUMN activity_digest TEXT NOT NULL DEFAULT '';
CREATE INDEX log_links_by_activity ON log_links (organization_id, activity_id);
",
    r"
ALTER TABLE decisions ADD COLUMN result_digest TEXT NOT NULL DEFAULT '';
",
    r"
CREATE TABLE ballots (
    organization_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    user_id TEXT NOT NULL,
    rejected INTEGER NOT NULL,
    stamped BLOB NOT NULL,
    at_ms INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,
    PRIMARY KEY (organization_id, fingerprint, user_id)
) WITHOUT ROWID;
CREATE INDEX ballots_expiry ON ballots (expires_ms);
",
    r"
CREATE TABLE kek_seals (
    kek_label TEXT PRIMARY KEY,
    reserved INTEGER NOT NULL
) WITHOUT ROWID;
",
    r"
CREATE TABLE keks (
    version INTEGER PRIMARY KEY,
    made_ms INTEGER NOT NULL,
    destroyed_ms INTEGER,
    object_id BLOB
);
CREATE TABLE native_keys (
    label TEXT PRIMARY KEY,
    organization_id TEXT NOT NULL,
    charged_to TEXT NOT NULL,
    made_ms INTEGER NOT NULL
) WITHOUT ROWID;
",
];

/// How often (ms) expired replay entries are pruned as a whole; between, an organization's own
/// are pruned when it reaches its quota.
const PRUNE_EVERY_MS: i64 = 10_000;
/// How often (ms) decisions past their retention are pruned.
const PRUNE_DECISIONS_EVERY_MS: i64 = 600_000;
/// Most old decisions one prune deletes (one commit's worth).
const PRUNE_DECISIONS_BATCH: i64 = 10_000;
/// How long a write waits for another process's write lock.
const BUSY_TIMEOUT_MS: u64 = 5_000;
/// Reader connections kept open for reuse.
const MAX_IDLE_READERS: usize = 8;
/// How often the background thread checkpoints the WAL into the database file.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// The writer's own automatic checkpoint, a safety net should the background one stall (pages).
const WRITER_AUTOCHECKPOINT_PAGES: i64 = 100_000;

/// The SQLite authority store (`sqlite://PATH`).
///
/// Replay entries (with the allow each stands for) are group committed: the caller that finds no
/// commit running leads one, taking every entry waiting and committing them in one transaction,
/// then the entries that arrived meanwhile, until none wait. Concurrent requests share one commit
/// (and the pages they all touch: the counts, the indexes' last pages), and a request that finds
/// the store idle commits on its own thread, without a hand-off to another. Each caller still
/// waits for its own commit.
pub struct SqliteEnclaveStore {
    shared: Arc<Shared>,
    /// Replay entries waiting for a group commit, and whether one is being led.
    waiting: Mutex<group_commit::Queue<Job>>,
}

impl std::ops::Deref for SqliteEnclaveStore {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.shared
    }
}

/// One replay insert waiting for a group commit.
struct Job {
    organization: String,
    key: [u8; 32],
    expires_ms: i64,
    now_ms: i64,
    /// The scope's quota (the window's per-organization one when `None`).
    quota: Option<u64>,
    /// Lanes the entry is charged to as well (`ReplayShare::lanes`).
    lanes: Vec<ReplayLane>,
    allowed: Option<DecisionRecord>,
    reply: Reply<Result<Remembered, StoreError>>,
}

/// Most replay inserts one group commit takes.
const MAX_BATCH: usize = 256;

/// Commits `batch` in one transaction and answers each job.
fn commit_group(shared: &Shared, batch: Vec<Job>) {
    let outcome = (|| {
        let mut conn = shared.writer.lock().map_err(poisoned)?;
        // Committed whatever the answers: pruning done on the way stays done.
        Db::transaction(&mut *conn, |db: &mut Connection| {
            let mut answers = Vec::with_capacity(batch.len());
            let mut counts = Counts::default();
            for j in &batch {
                // An allow of an activity a kept vote rejected is not recorded (nor its entry):
                // the writer is one, so a rejection kept before is seen, one kept after sees this.
                if j.allowed.as_ref().map(|d| sql::rejected_by_vote(db, d)).transpose()?.unwrap_or(false) {
                    answers.push(Remembered::Rejected);
                    continue;
                }
                let answer = shared.remember_in(db, &mut counts, j)?;
                if let (Remembered::Fresh, Some(d)) = (answer, &j.allowed) {
                    sql::insert_decision(db, d)?;
                }
                answers.push(answer);
            }
            counts.flush(db)?;
            Ok::<_, StoreError>(answers)
        })
    })();
    match outcome {
        Ok(answers) => {
            for (j, a) in batch.iter().zip(answers) {
                let _ = j.reply.send(Turn::Answer(Ok(a)));
            }
        }
        Err(e) => {
            for j in &batch {
                let _ = j.reply.send(Turn::Answer(Err(e.clone())));
            }
        }
    }
}

/// What the store and its committer thread share.
pub struct Shared {
    /// `None` in memory (tests): reads then use the writer.
    path: Option<PathBuf>,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    limits: StoreLimits,
    next_prune_ms: AtomicI64,
    next_decision_prune_ms: AtomicI64,
    /// Tells the checkpoint thread to stop (set on drop).
    stop: Arc<AtomicBool>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Checkpoints the WAL of `path` off the request path, every [`CHECKPOINT_EVERY`], PASSIVE (it
/// never waits for a reader or a writer), until `stop`. A checkpoint fsyncs; done by a commit,
/// it would hold every request behind it for that long.
fn start_checkpointer(path: PathBuf, stop: Arc<AtomicBool>) -> Result<(), StoreError> {
    let conn = connect(Some(&path))?;
    std::thread::Builder::new()
        .name("coffer-authority-checkpoint".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(CHECKPOINT_EVERY);
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    tracing::warn!(error = %e, "authority store: WAL checkpoint failed");
                }
            }
        })
        .map(|_| ())
        .map_err(|e| StoreError::Unavailable(format!("starting the checkpoint thread: {e}")))
}

/// The driver's error as the store's, through the one mapping (`coffer-sql`'s, then
/// [`StoreError`]'s `From`).
fn sq(e: rusqlite::Error) -> StoreError {
    coffer_sql::sqlite_error(e).into()
}

fn poisoned<T>(_: T) -> StoreError {
    StoreError::Unavailable("sqlite: a connection lock is poisoned".into())
}

/// Opens one connection with the settings every connection of the store has.
fn connect(path: Option<&Path>) -> Result<Connection, StoreError> {
    let conn = match path {
        Some(p) => Connection::open(p),
        None => Connection::open_in_memory(),
    }
    .map_err(sq)?;
    conn.busy_timeout(std::time::Duration::from_millis(BUSY_TIMEOUT_MS)).map_err(sq)?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(sq)?;
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(sq)?;
    Ok(conn)
}

/// Creates `path` (and its directory) owner-only if it does not exist, and makes it 0600 if it does.
fn create_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let io = |what: &str, e: std::io::Error| StoreError::Unavailable(format!("{what} {}: {e}", path.display()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io("creating the directory of", e))?;
    }
    std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path).map_err(|e| io("creating", e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| io("restricting", e))
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sq)?;
    let applied: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(sq)?;
    for m in sql::pending_migrations(applied, MIGRATIONS)? {
        tx.execute_batch(m).map_err(sq)?;
    }
    tx.pragma_update(None, "user_version", MIGRATIONS.len() as i64).map_err(sq)?;
    tx.commit().map_err(sq)
}

/// The replay window's counts (live entries per organization and in all) as one transaction sees
/// them: each read once, changed in memory, written back once by [`Counts::flush`], so a group
/// commit of many inserts costs one read and one write of each count it touches.
#[derive(Default)]
struct Counts {
    /// Per organization: the stored count when first read, and what this transaction added.
    live: HashMap<String, (i64, i64)>,
    /// The stored total when first read (`None`: not read yet), and what this transaction added.
    total: Option<i64>,
    total_added: i64,
}

impl Counts {
    fn live_of(&mut self, tx: &Connection, organization: &str) -> Result<i64, StoreError> {
        if let Some((stored, added)) = self.live.get(organization) {
            return Ok(stored + added);
        }
        let stored: i64 = tx
            .prepare_cached("SELECT live FROM replay_live WHERE organization_id = ?1")
            .and_then(|mut st| st.query_row([organization], |r| r.get(0)).optional())
            .map(Option::unwrap_or_default)
            .map_err(sq)?;
        self.live.insert(organization.to_string(), (stored, 0));
        Ok(stored)
    }

    fn total_live(&mut self, tx: &Connection) -> Result<i64, StoreError> {
        let stored = match self.total {
            Some(t) => t,
            None => {
                let t = tx
                    .prepare_cached("SELECT live FROM replay_total WHERE one = 1")
                    .and_then(|mut st| st.query_row([], |r| r.get(0)))
                    .map_err(sq)?;
                *self.total.insert(t)
            }
        };
        Ok(stored + self.total_added)
    }

    /// Counts `n` more (or, negative, fewer) live entries of `organization`.
    fn add(&mut self, tx: &Connection, organization: &str, n: i64) -> Result<(), StoreError> {
        self.live_of(tx, organization)?;
        if let Some((_, added)) = self.live.get_mut(organization) {
            *added += n;
        }
        self.total_added += n;
        Ok(())
    }

    /// Writes every changed count (the transaction holds the write lock: nobody else changed them).
    fn flush(self, tx: &Connection) -> Result<(), StoreError> {
        for (organization, (stored, added)) in self.live {
            if added == 0 {
                continue;
            }
            if stored + added <= 0 {
                tx.prepare_cached("DELETE FROM replay_live WHERE organization_id = ?1")
                    .and_then(|mut st| st.execute([&organization]))
                    .map_err(sq)?;
            } else {
                tx.prepare_cached(
                    "INSERT INTO replay_live (organization_id, live) VALUES (?1, ?2)
                     ON CONFLICT (organization_id) DO UPDATE SET live = excluded.live",
                )
                .and_then(|mut st| st.execute(params![organization, stored + added]))
                .map_err(sq)?;
            }
        }
        if self.total_added != 0 {
            tx.prepare_cached("UPDATE replay_total SET live = live + ?1")
                .and_then(|mut st| st.execute([self.total_added]))
                .map_err(sq)?;
        }
        Ok(())
    }
}

/// Removes every expired replay entry.
fn prune_all(tx: &Connection, counts: &mut Counts, now_ms: i64) -> Result<(), StoreError> {
    let mut gone: HashMap<String, i64> = HashMap::new();
    {
        let mut st =
            tx.prepare_cached("DELETE FROM replay WHERE expires_ms < ?1 RETURNING organization_id").map_err(sq)?;
        let mut rows = st.query([now_ms]).map_err(sq)?;
        while let Some(row) = rows.next().map_err(sq)? {
            *gone.entry(row.get(0).map_err(sq)?).or_default() += 1;
        }
    }
    for (organization, n) in gone {
        counts.add(tx, &organization, -n)?;
    }
    Ok(())
}

/// Whether `key` may be entered: no live entry has it (an expired one is removed). `false`: a
/// live entry has it.
fn make_way(tx: &Connection, counts: &mut Counts, key: &[u8; 32], now_ms: i64) -> Result<bool, StoreError> {
    let existing: Option<(String, i64)> = tx
        .prepare_cached("SELECT organization_id, expires_ms FROM replay WHERE key = ?1")
        .and_then(|mut st| st.query_row([&key[..]], |r| Ok((r.get(0)?, r.get(1)?))).optional())
        .map_err(sq)?;
    let Some((owner, expiry)) = existing else { return Ok(true) };
    if expiry >= now_ms {
        return Ok(false);
    }
    tx.prepare_cached("DELETE FROM replay WHERE key = ?1").and_then(|mut st| st.execute([&key[..]])).map_err(sq)?;
    counts.add(tx, &owner, -1)?;
    Ok(true)
}

/// Removes the expired replay entries of one organization.
fn prune_organization(tx: &Connection, counts: &mut Counts, organization: &str, now_ms: i64) -> Result<(), StoreError> {
    let n = tx
        .prepare_cached("DELETE FROM replay WHERE organization_id = ?1 AND expires_ms < ?2")
        .and_then(|mut st| st.execute(params![organization, now_ms]))
        .map_err(sq)?;
    counts.add(tx, organization, -(n as i64))
}

fn as_count(limit: u64) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX).max(1)
}

impl SqliteEnclaveStore {
    /// Opens (creating it 0600 if missing) the store file at `path` and applies pending migrations.
    pub fn open(path: &Path, limits: StoreLimits) -> Result<Self, StoreError> {
        create_private(path)?;
        Self::with_connection(Some(path.to_path_buf()), limits)
    }

    /// A store in memory, for one process (tests, and an `Admission` built without a store).
    pub fn open_in_memory(limits: StoreLimits) -> Result<Self, StoreError> {
        Self::with_connection(None, limits)
    }

    fn with_connection(path: Option<PathBuf>, limits: StoreLimits) -> Result<Self, StoreError> {
        let mut writer = connect(path.as_deref())?;
        migrate(&mut writer)?;
        let stop = Arc::new(AtomicBool::new(false));
        if let Some(p) = &path {
            writer.pragma_update(None, "wal_autocheckpoint", WRITER_AUTOCHECKPOINT_PAGES).map_err(sq)?;
            start_checkpointer(p.clone(), stop.clone())?;
        }
        let shared = Arc::new(Shared {
            stop,
            path,
            writer: Mutex::new(writer),
            readers: Mutex::new(Vec::new()),
            limits,
            next_prune_ms: AtomicI64::new(0),
            next_decision_prune_ms: AtomicI64::new(0),
        });
        Ok(Self { shared, waiting: Mutex::default() })
    }

    /// A replay insert, group committed with the others waiting (see [`SqliteEnclaveStore`]).
    fn remember_through(
        &self,
        share: ReplayShare,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
        quota: Option<u64>,
        allowed: Option<&DecisionRecord>,
    ) -> Result<Remembered, StoreError> {
        let (reply, answer) = group_commit::channel();
        let ReplayShare { organization, lanes } = share;
        let job = Job { organization, key, expires_ms, now_ms, quota, lanes, allowed: allowed.cloned(), reply };
        let lead = group_commit::join(&self.waiting, job).map_err(poisoned)?;
        group_commit::wait(
            &answer,
            lead,
            || self.lead_one_group(),
            || StoreError::Unavailable("sqlite: a group commit was abandoned".into()),
        )
    }

    /// Commits the first group waiting, then hands the lead to the owner of the first entry still
    /// waiting (so that no caller leads for ever under load), or gives it up.
    fn lead_one_group(&self) -> Result<(), StoreError> {
        group_commit::lead_one(
            &self.waiting,
            MAX_BATCH,
            |batch| commit_group(&self.shared, batch),
            |next| {
                let _ = next.reply.send(Turn::Lead);
            },
        )
        .map_err(poisoned)
    }
}

impl Shared {
    /// Runs `f` on a reader connection (the writer's, in memory).
    fn read<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let Some(path) = &self.path else {
            return f(&mut *self.writer.lock().map_err(poisoned)?);
        };
        let idle = self.readers.lock().map_err(poisoned)?.pop();
        let mut conn = match idle {
            Some(c) => c,
            None => connect(Some(path))?,
        };
        let out = f(&mut conn);
        let mut readers = self.readers.lock().map_err(poisoned)?;
        if readers.len() < MAX_IDLE_READERS {
            readers.push(conn);
        }
        out
    }

    /// Prunes decisions past their retention, at most every [`PRUNE_DECISIONS_EVERY_MS`].
    fn prune_decisions(&self, db: &mut Connection, now_ms: i64) -> Result<(), StoreError> {
        if self.limits.decision_retention_ms <= 0 || now_ms < self.next_decision_prune_ms.load(Ordering::Relaxed) {
            return Ok(());
        }
        // At most a batch per commit it rides in (a backlog of old decisions would otherwise be
        // one long delete inside some request's commit); a full batch has the next commit go on.
        let pruned = sql::prune_decisions(db, now_ms - self.limits.decision_retention_ms, PRUNE_DECISIONS_BATCH)?;
        let next = if pruned as i64 >= PRUNE_DECISIONS_BATCH { now_ms } else { now_ms + PRUNE_DECISIONS_EVERY_MS };
        self.next_decision_prune_ms.store(next, Ordering::Relaxed);
        Ok(())
    }

    /// One job's replay insert, in the group commit's transaction.
    fn remember_in(&self, tx: &mut Connection, counts: &mut Counts, job: &Job) -> Result<Remembered, StoreError> {
        let Job { organization, key, expires_ms, now_ms, quota, lanes, .. } = job;
        self.remember_entry(tx, counts, organization, *key, *expires_ms, *now_ms, *quota, lanes)
    }

    /// One replay entry (and one per lane), in the caller's transaction.
    #[allow(clippy::too_many_arguments)]
    fn remember_entry(
        &self,
        tx: &mut Connection,
        counts: &mut Counts,
        organization: &str,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
        quota: Option<u64>,
        lanes: &[ReplayLane],
    ) -> Result<Remembered, StoreError> {
        if now_ms >= self.next_prune_ms.load(Ordering::Relaxed) {
            self.next_prune_ms.store(now_ms + PRUNE_EVERY_MS, Ordering::Relaxed);
            prune_all(tx, counts, now_ms)?;
        }
        self.prune_decisions(tx, now_ms)?;
        if !make_way(tx, counts, &key, now_ms)? {
            return Ok(Remembered::Replayed);
        }
        // The entry, then one per lane (a lane's entry live already counts it: its request's
        // entry was pruned before it, so it is not counted twice).
        let mut entries = vec![(organization, key, quota.unwrap_or(self.limits.replay_per_organization))];
        for lane in lanes {
            let lane_key = lane.key(&key);
            if make_way(tx, counts, &lane_key, now_ms)? {
                entries.push((lane.scope.as_str(), lane_key, lane.quota));
            }
        }
        for (scope, _, quota) in &entries {
            let quota = as_count(*quota);
            if counts.live_of(tx, scope)? >= quota {
                prune_organization(tx, counts, scope, now_ms)?;
                if counts.live_of(tx, scope)? >= quota {
                    return Ok(Remembered::OrganizationQuotaFull);
                }
            }
        }
        let capacity = as_count(self.limits.replay_capacity);
        let room = capacity.saturating_sub(entries.len() as i64 - 1);
        if counts.total_live(tx)? >= room {
            prune_all(tx, counts, now_ms)?;
            self.next_prune_ms.store(now_ms + PRUNE_EVERY_MS, Ordering::Relaxed);
            if counts.total_live(tx)? >= room {
                return Ok(Remembered::WindowFull);
            }
        }
        for (scope, key, _) in entries {
            tx.prepare_cached("INSERT INTO replay (key, organization_id, expires_ms) VALUES (?1, ?2, ?3)")
                .and_then(|mut st| st.execute(params![&key[..], scope, expires_ms]))
                .map_err(sq)?;
            counts.add(tx, scope, 1)?;
        }
        Ok(Remembered::Fresh)
    }
}

impl Backend for SqliteEnclaveStore {
    type Db = Connection;

    fn read<T: Send>(&self, f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send) -> Result<T, StoreError> {
        self.shared.read(f)
    }

    fn write<T: Send>(
        &self,
        durable: bool,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send,
    ) -> Result<T, StoreError> {
        let mut conn = self.writer.lock().map_err(poisoned)?;
        if !durable {
            return Db::transaction(&mut *conn, f);
        }
        // Back to NORMAL whatever the transaction's outcome.
        conn.pragma_update(None, "synchronous", "FULL").map_err(sq)?;
        let out = Db::transaction(&mut *conn, f);
        if let Err(e) = conn.pragma_update(None, "synchronous", "NORMAL") {
            tracing::warn!(error = %e, "authority store: restoring synchronous=NORMAL");
        }
        out
    }

    fn remember_in_window(
        &self,
        share: &ReplayShare,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
        quota: Option<u64>,
        allowed: Option<&DecisionRecord>,
    ) -> Result<Remembered, StoreError> {
        self.remember_through(share.clone(), key, expires_ms, now_ms, quota, allowed)
    }

    fn spend_in(
        &self,
        db: &mut Connection,
        spends: &[(usize, &Spend)],
    ) -> Result<Vec<(usize, Remembered)>, StoreError> {
        let mut counts = Counts::default();
        let mut refused = Vec::new();
        // A prune done here is undone if the transaction is (a refused spend rolls it back): it
        // stays due then, whoever caused the rollback.
        let due = (self.next_prune_ms.load(Ordering::Relaxed), self.next_decision_prune_ms.load(Ordering::Relaxed));
        for (i, s) in spends {
            if sql::rejected_by_vote(db, &s.allowed)? {
                refused.push((*i, Remembered::Rejected));
                continue;
            }
            let ReplayShare { organization, lanes } = &s.share;
            match self.remember_entry(db, &mut counts, organization, s.key, s.expires_ms, s.now_ms, None, lanes)? {
                Remembered::Fresh => sql::insert_decision(db, &s.allowed)?,
                other => refused.push((*i, other)),
            }
        }
        counts.flush(db)?;
        if !refused.is_empty() {
            self.next_prune_ms.store(due.0, Ordering::Relaxed);
            self.next_decision_prune_ms.store(due.1, Ordering::Relaxed);
        }
        Ok(refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{EnclaveStore, Entry, OrgChanges, OrgHead};

    fn limits(capacity: u64, per_organization: u64) -> StoreLimits {
        StoreLimits { replay_capacity: capacity, replay_per_organization: per_organization, decision_retention_ms: 0 }
    }

    fn scratch() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("coffer-authority-store-{}", uuid::Uuid::new_v4()));
        dir.join("sub").join("authority.sqlite")
    }

    fn entry(kind: &str, id: &str, data: &[u8]) -> Entry {
        Entry { kind: kind.into(), id: id.into(), data: data.to_vec() }
    }

    #[test]
    fn the_file_is_private_and_versions_compare_and_set_across_processes() {
        use std::os::unix::fs::PermissionsExt;
        let path = scratch();
        let a = SqliteEnclaveStore::open(&path, limits(100, 10)).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        // A second store on the same file: another enclave process.
        let b = SqliteEnclaveStore::open(&path, limits(100, 10)).unwrap();
        let create = OrgChanges {
            organization_id: "o1".into(),
            expected_version: 0,
            puts: vec![entry("user", "u1", b"alice"), entry("policy", "p1", b"allow")],
            deletes: vec![],
        };
        assert_eq!(a.apply(std::slice::from_ref(&create)).unwrap(), vec![1]);
        assert!(
            matches!(b.apply(&[create]), Err(StoreError::VersionMoved { found: Some(1), expected: 0, .. })),
            "must not exist yet"
        );
        assert_eq!(b.version("o1").unwrap(), Some(1));
        let change = OrgChanges {
            organization_id: "o1".into(),
            expected_version: 1,
            puts: vec![entry("user", "u1", b"alice2")],
            deletes: vec![("policy".into(), "p1".into())],
        };
        assert_eq!(b.apply(std::slice::from_ref(&change)).unwrap(), vec![2]);
        // The same change computed from version 1 again loses.
        assert!(matches!(a.apply(&[change]), Err(StoreError::VersionMoved { found: Some(2), .. })));
        let head = a.load("o1").unwrap().unwrap();
        assert_eq!(head, OrgHead { version: 2, entries: vec![entry("user", "u1", b"alice2")] });
        assert_eq!(a.load("nobody").unwrap(), None);
        let _ = std::fs::remove_dir_all(path.parent().unwrap().parent().unwrap());
    }

    #[test]
    fn apply_is_one_transaction() {
        let s = SqliteEnclaveStore::open_in_memory(limits(100, 10)).unwrap();
        let new =
            |org: &str, v: u64| OrgChanges { organization_id: org.into(), expected_version: v, ..Default::default() };
        assert_eq!(s.apply(&[new("a", 0), new("b", 0)]).unwrap(), vec![1, 1]);
        // b moved: a's change is not applied either.
        let mut a = new("a", 1);
        a.puts.push(entry("k", "1", b"x"));
        assert!(matches!(
            s.apply(&[a, new("b", 5)]),
            Err(StoreError::VersionMoved { ref organization_id, found: Some(1), .. }) if organization_id == "b"
        ));
        assert_eq!(s.load("a").unwrap().unwrap(), OrgHead { version: 1, entries: vec![] });
        assert!(matches!(s.apply(&[new("a", 1), new("a", 1)]), Err(StoreError::Invalid(_))));
        // Deleting every entry keeps the version: it is never reused.
        assert_eq!(s.apply(&[new("a", 1)]).unwrap(), vec![2]);
        assert_eq!(s.organizations().unwrap(), vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn concurrent_callers_share_group_commits_and_each_gets_its_own_answer() {
        let path = scratch();
        let s = Arc::new(SqliteEnclaveStore::open(&path, limits(10_000, 300)).unwrap());
        // 8 threads × 50 keys; every key is sent twice (by two threads), so exactly one of the
        // two is fresh; organization "q" (every 4th key) has a quota of 300 but takes 100.
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    (0..50u8)
                        .map(|n| {
                            let mut key = [0u8; 32];
                            key[0] = t / 2;
                            key[1] = n;
                            let org = if n % 4 == 0 { "q" } else { "r" };
                            s.remember(org, key, 1_000, 1).unwrap()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let answers: Vec<Remembered> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        let fresh = answers.iter().filter(|a| **a == Remembered::Fresh).count();
        let replayed = answers.iter().filter(|a| **a == Remembered::Replayed).count();
        assert_eq!((fresh, replayed), (200, 200), "{answers:?}");
        // The counts written back by the group commits are those of the entries.
        let counts: Vec<(String, i64)> = s
            .read(|c| {
                let mut st = c.prepare("SELECT organization_id, live FROM replay_live ORDER BY 1").map_err(sq)?;
                let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).map_err(sq)?;
                rows.collect::<Result<Vec<_>, _>>().map_err(sq)
            })
            .unwrap();
        assert_eq!(counts, [("q".to_string(), 52), ("r".to_string(), 148)]);
        let total: i64 =
            s.read(|c| c.query_row("SELECT live FROM replay_total", [], |r| r.get(0)).map_err(sq)).unwrap();
        assert_eq!(total, 200);
        drop(s);
        let _ = std::fs::remove_dir_all(path.parent().unwrap().parent().unwrap());
    }

    #[test]
    fn the_replay_window_has_a_quota_per_organization_and_a_capacity() {
        let s = SqliteEnclaveStore::open_in_memory(limits(5, 2)).unwrap();
        let key = |n: u8| [n; 32];
        assert_eq!(s.remember("a", key(1), 100, 0).unwrap(), Remembered::Fresh);
        assert_eq!(s.remember("a", key(1), 100, 50).unwrap(), Remembered::Replayed);
        assert_eq!(s.remember("b", key(1), 100, 50).unwrap(), Remembered::Replayed, "keys are global");
        assert_eq!(s.remember("a", key(2), 100, 50).unwrap(), Remembered::Fresh);
        assert_eq!(s.remember("a", key(3), 100, 50).unwrap(), Remembered::OrganizationQuotaFull);
        // Other organizations go on, each to its own quota, until the window itself is full.
        assert_eq!(s.remember("b", key(10), 100, 50).unwrap(), Remembered::Fresh);
        assert_eq!(s.remember("b", key(11), 100, 50).unwrap(), Remembered::Fresh);
        assert_eq!(s.remember("b", key(12), 100, 50).unwrap(), Remembered::OrganizationQuotaFull);
        assert_eq!(s.remember("c", key(20), 100, 50).unwrap(), Remembered::Fresh);
        assert_eq!(s.remember("c", key(21), 100, 50).unwrap(), Remembered::WindowFull, "5 live entries");
        // Past the expiry the old entries go, and new ones fit.
        assert_eq!(s.remember("a", key(3), 300, 101).unwrap(), Remembered::Fresh);
        assert_eq!(s.remember("a", key(1), 300, 101).unwrap(), Remembered::Fresh, "an expired key is new again");
    }

    #[test]
    fn decisions_are_logged_and_found_by_fingerprint() {
        let s = SqliteEnclaveStore::open_in_memory(limits(5, 2)).unwrap();
        let d = |at: i64, fp: &str, outcome: &str| DecisionRecord {
            at_ms: at,
            organization_id: "o".into(),
            operation: "sign".into(),
            fingerprint: fp.into(),
            activity_type: "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2".into(),
            user_id: "u".into(),
            outcome: outcome.into(),
            reason: String::new(),
            result_digest: if outcome == crate::store::OUTCOME_ALLOW {
                format!("digest-of-{fp}")
            } else {
                String::new()
            },
        };
        s.record_decision(&d(1, "f1", crate::store::OUTCOME_ALLOW)).unwrap();
        s.record_decision(&d(2, "f2", "refuse")).unwrap();
        s.record_decision(&d(2, "f3", crate::store::OUTCOME_DONE)).unwrap();
        assert_eq!(s.decided("o", "f1").unwrap().logged, crate::store::LoggedDecision::Authorized);
        assert_eq!(
            s.decided("o", "f2").unwrap().logged,
            crate::store::LoggedDecision::Refused,
            "a refusal is no authorization"
        );
        assert_eq!(s.decided("o", "f3").unwrap().logged, crate::store::LoggedDecision::Authorized);
        assert_eq!(s.decided("other", "f1").unwrap().logged, crate::store::LoggedDecision::Nothing);
        let all = s.decisions(0, 10).unwrap();
        assert_eq!(all.iter().map(|d| d.fingerprint.as_str()).collect::<Vec<_>>(), ["f1", "f2", "f3"]);
        assert_eq!(all[0], d(1, "f1", crate::store::OUTCOME_ALLOW));
        assert_eq!(s.decisions(2, 1).unwrap()[0].fingerprint, "f2");
    }
}
