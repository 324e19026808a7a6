//! The PostgreSQL backend of the authority store: one database of the enclave tier that several
//! enclaves share, reached with credentials only the enclaves have (the password comes from a
//! file or the environment, never from argv, and no message carries it).
//!
//! Every call is a blocking round trip or two on a pooled connection (the `postgres` client runs
//! its own small runtime: on the tokio executor the call steps aside with `block_in_place`).
//! Commits keep PostgreSQL's `synchronous_commit` (on by default): durable before they return.
//!
//! The replay window is one function (`coffer_remember`, one round trip). An organization's live
//! entries are counted in 16 rows (slot = the key's first byte mod 16), so concurrent inserts of
//! one organization rarely wait for each other's commit; the quota check reads their sum without a
//! lock, so enclaves inserting for one organization at the same moment may pass its quota by at
//! most their number. Scoped counts (`remember_within`: code attempts, sends, sign-ups) are exact:
//! `coffer_remember_exact` first takes a transaction lock on the scope, so callers of one scope
//! count one after another. The total for the window's global capacity is read at most once a
//! second.

use std::str::FromStr as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use coffer_sql::{args, off_executor, Db, PgConn, PgPool, SqlError};

use super::backend::Backend;
use super::interface::{DecisionRecord, Remembered, ReplayShare, Spend, StoreError, StoreLimits};
use super::sql;

pub use coffer_sql::redact;

/// Connections one store opens at most.
const MAX_CONNECTIONS: usize = 16;
/// How often (ms) expired replay entries are pruned as a whole, and the total re-read.
const PRUNE_EVERY_MS: i64 = 10_000;
const TOTAL_EVERY_MS: i64 = 1_000;
const PRUNE_DECISIONS_EVERY_MS: i64 = 600_000;
/// Most old decisions one prune deletes.
const PRUNE_DECISIONS_BATCH: i64 = 10_000;

/// The schema, one migration per entry; `authority_schema.version` is how many were applied.
const MIGRATIONS: &[&str] = &[
    r"
CREATE TABLE org_heads (
    organization_id TEXT PRIMARY KEY,
    version BIGINT NOT NULL
);
CREATE TABLE entries (
    organization_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (organization_id, kind, id)
);
CREATE TABLE replay (
    key BYTEA PRIMARY KEY,
    organization_id TEXT NOT NULL,
    slot INTEGER NOT NULL,
    expires_ms BIGINT NOT NULL
);
CREATE INDEX replay_expiry ON replay (expires_ms);
CREATE INDEX replay_organization_expiry ON replay (organization_id, expires_ms);
CREATE TABLE replay_live (
    organization_id TEXT NOT NULL,
    slot INTEGER NOT NULL,
    live BIGINT NOT NULL,
    PRIMARY KEY (organization_id, slot)
);
CREATE TABLE decisions (
    seq BIGSERIAL PRIMARY KEY,
    at_ms BIGINT NOT NULL,
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
-- 0 fresh, 1 replayed, 2 the organization's quota is full.
CREATE FUNCTION coffer_remember(p_org TEXT, p_key BYTEA, p_expires BIGINT, p_now BIGINT, p_quota BIGINT)
RETURNS INTEGER LANGUAGE plpgsql AS $fn$
DECLARE
    old_org TEXT;
    old_slot INTEGER;
    old_expires BIGINT;
    live BIGINT;
    s INTEGER := get_byte(p_key, 0) % 16;
BEGIN
    SELECT organization_id, slot, expires_ms INTO old_org, old_slot, old_expires
        FROM replay WHERE key = p_key FOR UPDATE;
    IF FOUND THEN
        IF old_expires >= p_now THEN
            RETURN 1;
        END IF;
        DELETE FROM replay WHERE key = p_key;
        UPDATE replay_live SET live = live - 1 WHERE organization_id = old_org AND slot = old_slot;
    END IF;
    SELECT coalesce(sum(l.live), 0) INTO live FROM replay_live l WHERE l.organization_id = p_org;
    IF live >= p_quota THEN
        WITH gone AS (
            DELETE FROM replay WHERE organization_id = p_org AND expires_ms < p_now RETURNING slot
        ), n AS (SELECT slot, count(*) AS c FROM gone GROUP BY slot)
        UPDATE replay_live l SET live = l.live - n.c FROM n WHERE l.organization_id = p_org AND l.slot = n.slot;
        SELECT coalesce(sum(l.live), 0) INTO live FROM replay_live l WHERE l.organization_id = p_org;
        IF live >= p_quota THEN
            RETURN 2;
        END IF;
    END IF;
    INSERT INTO replay (key, organization_id, slot, expires_ms) VALUES (p_key, p_org, s, p_expires)
        ON CONFLICT (key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN 1; -- a twin committed it meanwhile
    END IF;
    INSERT INTO replay_live (organization_id, slot, live) VALUES (p_org, s, 1)
        ON CONFLICT (organization_id, slot) DO UPDATE SET live = replay_live.live + 1;
    RETURN 0;
END
$fn$;
",
    r"
CREATE TABLE log_heads (
    organization_id TEXT PRIMARY KEY,
    links BIGINT NOT NULL,
    head TEXT NOT NULL
);
",
    r"
CREATE TABLE sealed_service_keys (
    label TEXT PRIMARY KEY,
    blob BYTEA NOT NULL
);
",
    r"
-- coffer_remember for a scope whose quota must hold exactly: one caller of the scope at a time
-- (the lock is held until the calling statement's transaction commits, after its insert).
CREATE FUNCTION coffer_remember_exact(p_scope TEXT, p_key BYTEA, p_expires BIGINT, p_now BIGINT, p_quota BIGINT)
RETURNS INTEGER LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('coffer-scope:' || p_scope, 0));
    RETURN coffer_remember(p_scope, p_key, p_expires, p_now, p_quota);
END
$fn$;
",
    r"
CREATE TABLE log_links (
    organization_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL,
    activity_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    PRIMARY KEY (organization_id, fingerprint, status)
);
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
    rejected BIGINT NOT NULL,
    stamped BYTEA NOT NULL,
    at_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL,
    PRIMARY KEY (organization_id, fingerprint, user_id)
);
CREATE INDEX ballots_expiry ON ballots (expires_ms);
",
    r"
CREATE TABLE kek_seals (
    kek_label TEXT PRIMARY KEY,
    reserved BIGINT NOT NULL
);
",
    r"
CREATE TABLE keks (
    version BIGINT PRIMARY KEY,
    made_ms BIGINT NOT NULL,
    destroyed_ms BIGINT,
    object_id BYTEA
);
CREATE TABLE native_keys (
    label TEXT PRIMARY KEY,
    organization_id TEXT NOT NULL,
    charged_to TEXT NOT NULL,
    made_ms BIGINT NOT NULL
);
",
];

/// The PostgreSQL authority store (`postgres://…`).
pub struct PostgresEnclaveStore {
    pool: PgPool,
    limits: StoreLimits,
    next_prune_ms: AtomicI64,
    next_decision_prune_ms: AtomicI64,
    /// (read at ms, live entries then) of the whole window.
    total: Mutex<(i64, i64)>,
}

fn poisoned<T>(_: T) -> StoreError {
    StoreError::Unavailable("postgres: a lock is poisoned".into())
}

fn migrate(db: &mut PgConn) -> Result<(), StoreError> {
    Db::transaction(db, |db: &mut PgConn| {
        // One migrating enclave at a time; the others wait, then find nothing left to do.
        db.batch(
            "SELECT pg_advisory_xact_lock(7046632);
             CREATE TABLE IF NOT EXISTS authority_schema (one INTEGER PRIMARY KEY CHECK (one = 1), version BIGINT NOT NULL);
             INSERT INTO authority_schema (one, version) VALUES (1, 0) ON CONFLICT (one) DO NOTHING;",
        )?;
        let applied = db.query_one("SELECT version FROM authority_schema", &[], |r| Ok::<_, StoreError>(r.int(0)?))?;
        for m in sql::pending_migrations(applied, MIGRATIONS)? {
            db.batch(m)?;
        }
        db.execute("UPDATE authority_schema SET version = ?1", args![MIGRATIONS.len() as i64])?;
        Ok(())
    })
}

fn as_count(limit: u64) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX).max(1)
}

/// Removes every expired replay entry, subtracting them from their organizations' counts.
const PRUNE_ALL: &str = "WITH gone AS (DELETE FROM replay WHERE expires_ms < ?1 RETURNING organization_id, slot),
     n AS (SELECT organization_id, slot, count(*) AS c FROM gone GROUP BY 1, 2)
     UPDATE replay_live l SET live = l.live - n.c FROM n WHERE l.organization_id = n.organization_id AND l.slot = n.slot";

impl PostgresEnclaveStore {
    /// Connects with `config` (its password set by [`PostgresEnclaveStore::config`] from a file)
    /// and applies pending migrations.
    pub fn open(config: ::postgres::Config, limits: StoreLimits) -> Result<Self, StoreError> {
        let first = off_executor(|| {
            let mut c = PgConn::connect(&config)?;
            migrate(&mut c)?;
            Ok::<_, StoreError>(c)
        })?;
        Ok(Self {
            pool: PgPool::new(config, MAX_CONNECTIONS, first),
            limits,
            next_prune_ms: AtomicI64::new(0),
            next_decision_prune_ms: AtomicI64::new(0),
            total: Mutex::new((i64::MIN, 0)),
        })
    }

    /// Whether the database `config` names holds an authority store (its schema table), read
    /// without creating anything.
    pub fn exists(config: &::postgres::Config) -> Result<bool, StoreError> {
        off_executor(|| {
            let mut c = PgConn::connect(config)?;
            let found = c.query_one(
                "SELECT EXISTS (SELECT 1 FROM information_schema.tables
                                WHERE table_schema = current_schema() AND table_name = 'authority_schema')",
                &[],
                |r| Ok::<_, StoreError>(r.flag(0)?),
            )?;
            Ok::<_, StoreError>(found)
        })
    }

    /// Parses `url` (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB`) and sets `password` if given.
    pub fn config(url: &str, password: Option<&str>) -> Result<::postgres::Config, StoreError> {
        let mut config = ::postgres::Config::from_str(url)
            .map_err(|e| StoreError::Invalid(format!("authority store URL {}: {e}", redact(url))))?;
        if let Some(p) = password {
            config.password(p);
        }
        Ok(config)
    }

    /// Periodic housekeeping before a replay insert: expired entries, old decisions, the total.
    fn housekeeping(&self, db: &mut PgConn, now_ms: i64) -> Result<i64, StoreError> {
        if now_ms >= self.next_prune_ms.load(Ordering::Relaxed) {
            self.next_prune_ms.store(now_ms + PRUNE_EVERY_MS, Ordering::Relaxed);
            db.execute(PRUNE_ALL, args![now_ms])?;
            db.execute("DELETE FROM replay_live WHERE live <= 0", &[])?;
            self.total.lock().map_err(poisoned)?.0 = i64::MIN;
        }
        if self.limits.decision_retention_ms > 0 && now_ms >= self.next_decision_prune_ms.load(Ordering::Relaxed) {
            // At most a batch at a time; a full batch has the next request go on.
            let pruned = sql::prune_decisions(db, now_ms - self.limits.decision_retention_ms, PRUNE_DECISIONS_BATCH)?;
            let next = if pruned as i64 >= PRUNE_DECISIONS_BATCH { now_ms } else { now_ms + PRUNE_DECISIONS_EVERY_MS };
            self.next_decision_prune_ms.store(next, Ordering::Relaxed);
        }
        let (at, total) = *self.total.lock().map_err(poisoned)?;
        if now_ms.saturating_sub(at) < TOTAL_EVERY_MS {
            return Ok(total);
        }
        let total = read_total(db)?;
        *self.total.lock().map_err(poisoned)? = (now_ms, total);
        Ok(total)
    }

    /// Whether `rows` more entries fit the window's capacity (pruning all expired ones first if
    /// the remembered total says they would not).
    fn room_for(&self, db: &mut PgConn, now_ms: i64, rows: i64) -> Result<bool, StoreError> {
        let capacity = as_count(self.limits.replay_capacity);
        if self.housekeeping(db, now_ms)? + rows <= capacity {
            return Ok(true);
        }
        db.execute(PRUNE_ALL, args![now_ms])?;
        let total = read_total(db)?;
        *self.total.lock().map_err(poisoned)? = (now_ms, total);
        Ok(total + rows <= capacity)
    }

    /// Adds `n` fresh entries to the remembered total.
    fn counted(&self, n: i64) {
        if let Ok(mut t) = self.total.lock() {
            t.1 += n;
        }
    }

    /// One try of a remember with an allow: the lanes first (a full one refuses before the
    /// organization's share is touched, and every transaction takes the rows of a share in the
    /// same order), then the share, then the allow; committed only if all are fresh. Answers
    /// `coffer_remember`'s code and the entries made.
    fn share_once(
        &self,
        db: &mut PgConn,
        share: &ReplayShare,
        key: &[u8; 32],
        expires_ms: i64,
        now_ms: i64,
        allowed: &DecisionRecord,
    ) -> Result<(i64, i64), SqlError> {
        let quota = as_count(self.limits.replay_per_organization);
        let outcome = Db::transaction(db, |db: &mut PgConn| {
            lock_votes_of(db, &[(&allowed.organization_id, &allowed.fingerprint)]).map_err(ShareStop::Store)?;
            if sql::rejected_by_vote(db, allowed).map_err(ShareStop::Store)? {
                return Err(ShareStop::NotFresh(REJECTED_CODE));
            }
            let mut fresh = 0;
            for lane in &share.lanes {
                let lane_key = lane.key(key);
                match remember_code(
                    db,
                    "coffer_remember",
                    &lane.scope,
                    &lane_key,
                    expires_ms,
                    now_ms,
                    as_count(lane.quota),
                )? {
                    0 => fresh += 1,
                    // Live already: its request's entry is (a replay, refused below) or was pruned
                    // before it (counted already).
                    1 => {}
                    full => return Err(ShareStop::NotFresh(full)),
                }
            }
            match remember_code(db, "coffer_remember", &share.organization, key, expires_ms, now_ms, quota)? {
                0 => {}
                other => return Err(ShareStop::NotFresh(other)),
            }
            sql::insert_decision(db, allowed).map_err(ShareStop::Store)?;
            Ok(fresh + 1)
        });
        match outcome {
            Ok(made) => Ok((0, made)),
            Err(ShareStop::NotFresh(code)) => Ok((code, 0)),
            Err(ShareStop::Sql(e)) => Err(e),
            Err(ShareStop::Store(StoreError::Conflict(m))) => Err(SqlError::Deadlock(m)),
            Err(ShareStop::Store(e)) => Err(SqlError::Backend(e.to_string())),
        }
    }
}

/// Why [`PostgresEnclaveStore::share_once`] rolled its transaction back: an entry that was not
/// fresh (its replay function's code), or the database.
enum ShareStop {
    NotFresh(i64),
    Sql(SqlError),
    /// The allow's insert, as the shared SQL reports it.
    Store(StoreError),
}

impl From<SqlError> for ShareStop {
    fn from(e: SqlError) -> Self {
        ShareStop::Sql(e)
    }
}

fn read_total(db: &mut PgConn) -> Result<i64, StoreError> {
    let total =
        db.query_one("SELECT sum(live)::BIGINT FROM replay_live", &[], |r| Ok::<_, StoreError>(r.opt_int(0)?))?;
    Ok(total.unwrap_or(0))
}

/// A replay function's answer as it returns it (`coffer_remember`, `coffer_remember_exact`):
/// 0 fresh, 1 replayed, 2 the scope's quota full.
fn remember_code(
    db: &mut PgConn,
    function: &str,
    scope: &str,
    key: &[u8; 32],
    expires_ms: i64,
    now_ms: i64,
    quota: i64,
) -> Result<i64, SqlError> {
    db.query_one(&format!("SELECT {function}(?1, ?2, ?3, ?4, ?5)"), args![scope, key, expires_ms, now_ms, quota], |r| {
        r.int(0)
    })
}

/// Most rows one locking statement names.
const LOCK_ROWS_PER_STATEMENT: usize = 64;

/// Locks the rows of the window's live counts that `spends` will update (each lane's and the
/// share's, by scope and slot), all of them, in one order: every lane in the place it has in its
/// share (a sign-up's own lane, then its parent's sign-ups' lane), then the organizations, each
/// class by scope and slot. A single spend takes its rows in that order too (lanes, then its
/// organization), so no two transactions hold rows the other waits for: spent in the order they
/// came, two groups with the same organizations' stamps in other orders deadlocked, and one of
/// them ran again after `deadlock_timeout`.
fn lock_live_counts(db: &mut PgConn, spends: &[(usize, &Spend)]) -> Result<(), StoreError> {
    let slot = |key: &[u8; 32]| i64::from(key[0] % 16);
    let mut rows: Vec<(usize, String, i64)> = spends
        .iter()
        .flat_map(|(_, s)| {
            let lanes =
                s.share.lanes.iter().enumerate().map(|(place, l)| (place, l.scope.clone(), slot(&l.key(&s.key))));
            lanes.chain(std::iter::once((usize::MAX, s.share.organization.clone(), slot(&s.key))))
        })
        .collect();
    rows.sort();
    rows.dedup();
    if rows.len() < 2 {
        return Ok(());
    }
    for chunk in rows.chunks(LOCK_ROWS_PER_STATEMENT) {
        let args: Vec<coffer_sql::Arg<'_>> = chunk
            .iter()
            .flat_map(|(_, scope, slot)| [coffer_sql::Arg::Text(scope), coffer_sql::Arg::Int(*slot)])
            .collect();
        let values = |place: bool| -> String {
            let row = |i: usize| match place {
                true => format!("(?{}::text, ?{}::integer, {i})", 2 * i + 1, 2 * i + 2),
                false => format!("(?{}::text, ?{}::integer, 0)", 2 * i + 1, 2 * i + 2),
            };
            (0..chunk.len()).map(row).collect::<Vec<_>>().join(", ")
        };
        // Rows not made yet are made first, in the same order (two first inserts of two rows in
        // other orders deadlock too), with no entry counted.
        let made = format!(
            "INSERT INTO replay_live (organization_id, slot, live) VALUES {} ON CONFLICT (organization_id, slot) DO NOTHING",
            values(false)
        );
        db.execute(&made, &args)?;
        let lock = format!(
            "SELECT 1 FROM replay_live l JOIN (VALUES {}) AS v(scope, slot, place) \
             ON l.organization_id = v.scope AND l.slot = v.slot ORDER BY v.place FOR UPDATE OF l",
            values(true)
        );
        db.query(&lock, &args, |_| Ok::<(), StoreError>(()))?;
    }
    Ok(())
}

/// [`share_once`](PostgresEnclaveStore::share_once)'s code for an allow of a rejected activity.
const REJECTED_CODE: i64 = 4;

/// Takes the vote locks of `activities` (organization, fingerprint; empty fingerprints left out)
/// in one order, before any row lock of the transaction, so that two transactions never wait on
/// each other's (see [`Backend::lock_votes`]).
fn lock_votes_of(db: &mut PgConn, activities: &[(&str, &str)]) -> Result<(), StoreError> {
    let mut keys: Vec<String> =
        activities.iter().filter(|(_, f)| !f.is_empty()).map(|(o, f)| format!("coffer-votes:{o}/{f}")).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        db.query_one("SELECT pg_advisory_xact_lock(hashtextextended(?1, 0))::TEXT", args![key], |_| {
            Ok::<_, StoreError>(())
        })?;
    }
    Ok(())
}

fn answer_of(code: i64) -> Result<Remembered, StoreError> {
    match code {
        0 => Ok(Remembered::Fresh),
        1 => Ok(Remembered::Replayed),
        2 => Ok(Remembered::OrganizationQuotaFull),
        REJECTED_CODE => Ok(Remembered::Rejected),
        other => Err(StoreError::Corrupt(format!("the replay function answered {other}"))),
    }
}

impl Backend for PostgresEnclaveStore {
    type Db = PgConn;

    fn lock_votes(&self, db: &mut PgConn, activities: &[(&str, &str)]) -> Result<(), StoreError> {
        lock_votes_of(db, activities)
    }

    fn read<T: Send>(&self, f: impl FnOnce(&mut PgConn) -> Result<T, StoreError> + Send) -> Result<T, StoreError> {
        self.pool.with_conn(f)
    }

    /// Every commit keeps PostgreSQL's `synchronous_commit`: durable whatever `durable` says.
    fn write<T: Send>(
        &self,
        _durable: bool,
        f: impl FnOnce(&mut PgConn) -> Result<T, StoreError> + Send,
    ) -> Result<T, StoreError> {
        self.pool.with_conn(|db| Db::transaction(db, f))
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
        let rows = 1 + share.lanes.len() as i64;
        self.pool.with_conn(|db| {
            if !self.room_for(db, now_ms, rows)? {
                return Ok(Remembered::WindowFull);
            }
            let (code, made) = match allowed {
                // The entry under its organization's quota, one under each lane's, and the allow,
                // in one transaction (rolled back unless all are fresh). A deadlock (with another
                // enclave's prune, which counts rows down in its own order) rolled the whole
                // transaction back: it is tried again.
                Some(allowed) => {
                    let mut tries = 0;
                    loop {
                        tries += 1;
                        match self.share_once(db, share, &key, expires_ms, now_ms, allowed) {
                            Err(SqlError::Deadlock(_)) if tries < 4 => continue,
                            other => break other?,
                        }
                    }
                }
                None => {
                    // An unbounded scope (a token spent, a code verified) needs no order: its keys
                    // are unique. A bounded one is counted exactly (one caller of it at a time).
                    let (function, quota) = match quota {
                        None => ("coffer_remember", self.limits.replay_per_organization),
                        Some(u64::MAX) => ("coffer_remember", u64::MAX),
                        Some(q) => ("coffer_remember_exact", q),
                    };
                    let code =
                        remember_code(db, function, &share.organization, &key, expires_ms, now_ms, as_count(quota))?;
                    (code, i64::from(code == 0))
                }
            };
            let answered = answer_of(code)?;
            if answered == Remembered::Fresh {
                self.counted(made);
            }
            Ok(answered)
        })
    }

    /// The prunes in a transaction of their own, so that a group's or a log's transaction does
    /// not hold every row they touch (another enclave's spends then wait on it, or deadlock).
    /// Best effort: a failure (a deadlock with another enclave's prune, say) is logged, the
    /// prunes stay due, and the write goes on (its capacity check prunes if it must).
    fn before_spending(&self, now_ms: i64) -> Result<(), StoreError> {
        let due = (self.next_prune_ms.load(Ordering::Relaxed), self.next_decision_prune_ms.load(Ordering::Relaxed));
        let done = self.pool.with_conn(|db| Db::transaction(db, |db| self.housekeeping(db, now_ms).map(|_| ())));
        if let Err(e) = done {
            self.next_prune_ms.store(due.0, Ordering::Relaxed);
            self.next_decision_prune_ms.store(due.1, Ordering::Relaxed);
            tracing::warn!(error = %e, "the replay window's housekeeping failed; it stays due");
        }
        Ok(())
    }

    fn spend_in(&self, db: &mut PgConn, spends: &[(usize, &Spend)]) -> Result<Vec<(usize, Remembered)>, StoreError> {
        let quota = as_count(self.limits.replay_per_organization);
        // A prune done here is undone if the transaction is (a refused spend rolls it back): it
        // stays due then, whoever caused the rollback.
        let due = (self.next_prune_ms.load(Ordering::Relaxed), self.next_decision_prune_ms.load(Ordering::Relaxed));
        let activities: Vec<(&str, &str)> =
            spends.iter().map(|(_, s)| (s.allowed.organization_id.as_str(), s.allowed.fingerprint.as_str())).collect();
        lock_votes_of(db, &activities)?;
        lock_live_counts(db, spends)?;
        let mut refused = Vec::new();
        let mut made = 0;
        for (i, s) in spends {
            if sql::rejected_by_vote(db, &s.allowed)? {
                refused.push((*i, Remembered::Rejected));
                continue;
            }
            let rows = 1 + s.share.lanes.len() as i64;
            if !self.room_for(db, s.now_ms, made + rows)? {
                refused.push((*i, Remembered::WindowFull));
                continue;
            }
            // The lanes first, then the share, as a remember with an allow takes them. A spend
            // with lanes runs in a savepoint, so that the lane entries of one refused undo
            // themselves at once and count against no later spend of the transaction.
            let one = |db: &mut PgConn| -> Result<i64, StoreError> {
                let mut entries = 0;
                for lane in &s.share.lanes {
                    let lane_key = lane.key(&s.key);
                    let lane_quota = as_count(lane.quota);
                    match remember_code(
                        db,
                        "coffer_remember",
                        &lane.scope,
                        &lane_key,
                        s.expires_ms,
                        s.now_ms,
                        lane_quota,
                    )? {
                        0 => entries += 1,
                        1 => {}
                        full => return Err(StoreError::NotSpent(vec![(*i, answer_of(full)?)])),
                    }
                }
                match answer_of(remember_code(
                    db,
                    "coffer_remember",
                    &s.share.organization,
                    &s.key,
                    s.expires_ms,
                    s.now_ms,
                    quota,
                )?)? {
                    Remembered::Fresh => {
                        sql::insert_decision(db, &s.allowed)?;
                        Ok(entries + 1)
                    }
                    other => Err(StoreError::NotSpent(vec![(*i, other)])),
                }
            };
            let spent = if s.share.lanes.is_empty() { one(db) } else { db.savepoint(one) };
            match spent {
                Ok(entries) => made += entries,
                Err(StoreError::NotSpent(r)) => refused.extend(r),
                Err(e) => return Err(e),
            }
        }
        if refused.is_empty() {
            self.counted(made);
        } else {
            self.next_prune_ms.store(due.0, Ordering::Relaxed);
            self.next_decision_prune_ms.store(due.1, Ordering::Relaxed);
        }
        Ok(refused)
    }
}
