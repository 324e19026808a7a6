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
use std::sync::{Condvar, Mutex};

use ::postgres::error::SqlState;
use ::postgres::{Client, GenericClient, NoTls};

use super::interface::{
    check_changes, version_of, ActivityLink, DecisionRecord, EnclaveStore, Entry, LatestDecision, LinkedActivity,
    OrgChanges, OrgHead, Remembered, ReplayShare, StoreError, StoreLimits, OUTCOME_REFUSE, REASON_CONSENSUS_NEEDED,
};

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
];

/// The PostgreSQL authority store (`postgres://…`).
pub struct PostgresEnclaveStore {
    config: ::postgres::Config,
    pool: Mutex<Pool>,
    freed: Condvar,
    limits: StoreLimits,
    next_prune_ms: AtomicI64,
    next_decision_prune_ms: AtomicI64,
    /// (read at ms, live entries then) of the whole window.
    total: Mutex<(i64, i64)>,
}

struct Pool {
    idle: Vec<Client>,
    open: usize,
}

fn pg(e: ::postgres::Error) -> StoreError {
    match e.code() {
        Some(c) if *c == SqlState::DATA_CORRUPTED || *c == SqlState::INDEX_CORRUPTED => {
            StoreError::Corrupt(format!("postgres: {e}"))
        }
        _ => StoreError::Unavailable(format!("postgres: {e}")),
    }
}

fn poisoned<T>(_: T) -> StoreError {
    StoreError::Unavailable("postgres: the pool lock is poisoned".into())
}

/// Runs blocking database work where blocking is allowed: under `block_in_place` on a
/// multi-thread runtime's worker, on a thread of its own from a current-thread runtime, directly
/// on any other thread (`postgres` runs its own runtime, which cannot start inside another one).
fn off_executor<T: Send>(f: impl FnOnce() -> Result<T, StoreError> + Send) -> Result<T, StoreError> {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        Ok(_) => std::thread::scope(|s| s.spawn(f).join())
            .unwrap_or_else(|_| Err(StoreError::Unavailable("an authority store call panicked".into()))),
        Err(_) => f(),
    }
}

fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let mut tx = client.transaction().map_err(pg)?;
    // One migrating enclave at a time; the others wait, then find nothing left to do.
    tx.batch_execute(
        "SELECT pg_advisory_xact_lock(7046632);
         CREATE TABLE IF NOT EXISTS authority_schema (one INTEGER PRIMARY KEY CHECK (one = 1), version BIGINT NOT NULL);
         INSERT INTO authority_schema (one, version) VALUES (1, 0) ON CONFLICT (one) DO NOTHING;",
    )
    .map_err(pg)?;
    let applied: i64 = tx.query_one("SELECT version FROM authority_schema", &[]).map_err(pg)?.get(0);
    let applied = usize::try_from(applied).map_err(|_| StoreError::Corrupt(format!("schema version {applied}")))?;
    if applied > MIGRATIONS.len() {
        return Err(StoreError::Corrupt(format!(
            "schema version {applied} is newer than this enclave's ({}): run the newer enclave",
            MIGRATIONS.len()
        )));
    }
    for m in &MIGRATIONS[applied..] {
        tx.batch_execute(m).map_err(pg)?;
    }
    tx.execute("UPDATE authority_schema SET version = $1", &[&(MIGRATIONS.len() as i64)]).map_err(pg)?;
    tx.commit().map_err(pg)
}

/// The URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

fn as_count(limit: u64) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX).max(1)
}

/// Removes every expired replay entry, subtracting them from their organizations' counts.
const PRUNE_ALL: &str = "WITH gone AS (DELETE FROM replay WHERE expires_ms < $1 RETURNING organization_id, slot),
     n AS (SELECT organization_id, slot, count(*) AS c FROM gone GROUP BY 1, 2)
     UPDATE replay_live l SET live = l.live - n.c FROM n WHERE l.organization_id = n.organization_id AND l.slot = n.slot";

fn decision_of(r: &::postgres::Row) -> Result<DecisionRecord, StoreError> {
    Ok(DecisionRecord {
        at_ms: r.try_get(0).map_err(pg)?,
        organization_id: r.try_get(1).map_err(pg)?,
        operation: r.try_get(2).map_err(pg)?,
        fingerprint: r.try_get(3).map_err(pg)?,
        activity_type: r.try_get(4).map_err(pg)?,
        user_id: r.try_get(5).map_err(pg)?,
        outcome: r.try_get(6).map_err(pg)?,
        reason: r.try_get(7).map_err(pg)?,
        result_digest: r.try_get(8).map_err(pg)?,
    })
}

impl PostgresEnclaveStore {
    /// Connects with `config` (its password set by [`PostgresEnclaveStore::config`] from a file)
    /// and applies pending migrations.
    pub fn open(config: ::postgres::Config, limits: StoreLimits) -> Result<Self, StoreError> {
        let first = off_executor(|| {
            let mut c = config.connect(NoTls).map_err(pg)?;
            migrate(&mut c)?;
            Ok(c)
        })?;
        Ok(Self {
            config,
            pool: Mutex::new(Pool { idle: vec![first], open: 1 }),
            freed: Condvar::new(),
            limits,
            next_prune_ms: AtomicI64::new(0),
            next_decision_prune_ms: AtomicI64::new(0),
            total: Mutex::new((i64::MIN, 0)),
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

    /// Runs `f` on a pooled connection (opened on demand, at most [`MAX_CONNECTIONS`]); one that
    /// broke is dropped rather than returned.
    fn with_conn<T: Send>(&self, f: impl FnOnce(&mut Client) -> Result<T, StoreError> + Send) -> Result<T, StoreError> {
        off_executor(|| {
            let mut client = match self.checkout()? {
                Some(c) => c,
                None => self.config.connect(NoTls).map_err(pg).inspect_err(|_| self.release(None))?,
            };
            let out = f(&mut client);
            let keep = !client.is_closed();
            self.release(keep.then_some(client));
            out
        })
    }

    fn checkout(&self) -> Result<Option<Client>, StoreError> {
        let mut pool = self.pool.lock().map_err(poisoned)?;
        loop {
            if let Some(c) = pool.idle.pop() {
                return Ok(Some(c));
            }
            if pool.open < MAX_CONNECTIONS {
                pool.open += 1;
                return Ok(None);
            }
            pool = self.freed.wait(pool).map_err(poisoned)?;
        }
    }

    fn release(&self, client: Option<Client>) {
        if let Ok(mut pool) = self.pool.lock() {
            match client {
                Some(c) => pool.idle.push(c),
                None => pool.open -= 1,
            }
        }
        self.freed.notify_one();
    }

    /// Periodic housekeeping before a replay insert: expired entries, old decisions, the total.
    fn housekeeping(&self, client: &mut Client, now_ms: i64) -> Result<i64, StoreError> {
        if now_ms >= self.next_prune_ms.load(Ordering::Relaxed) {
            self.next_prune_ms.store(now_ms + PRUNE_EVERY_MS, Ordering::Relaxed);
            client.execute(PRUNE_ALL, &[&now_ms]).map_err(pg)?;
            client.execute("DELETE FROM replay_live WHERE live <= 0", &[]).map_err(pg)?;
            self.total.lock().map_err(poisoned)?.0 = i64::MIN;
        }
        if self.limits.decision_retention_ms > 0 && now_ms >= self.next_decision_prune_ms.load(Ordering::Relaxed) {
            // At most a batch at a time; a full batch has the next request go on.
            let pruned = client
                .execute(
                    "DELETE FROM decisions WHERE seq IN (SELECT seq FROM decisions WHERE at_ms < $1 ORDER BY at_ms LIMIT $2)",
                    &[&(now_ms - self.limits.decision_retention_ms), &PRUNE_DECISIONS_BATCH],
                )
                .map_err(pg)?;
            let next = if pruned as i64 >= PRUNE_DECISIONS_BATCH { now_ms } else { now_ms + PRUNE_DECISIONS_EVERY_MS };
            self.next_decision_prune_ms.store(next, Ordering::Relaxed);
        }
        let (at, total) = *self.total.lock().map_err(poisoned)?;
        if now_ms.saturating_sub(at) < TOTAL_EVERY_MS {
            return Ok(total);
        }
        let total = self.read_total(client)?;
        *self.total.lock().map_err(poisoned)? = (now_ms, total);
        Ok(total)
    }

    fn read_total(&self, client: &mut Client) -> Result<i64, StoreError> {
        let total: Option<i64> =
            client.query_one("SELECT sum(live)::BIGINT FROM replay_live", &[]).map_err(pg)?.try_get(0).map_err(pg)?;
        Ok(total.unwrap_or(0))
    }

    /// One entry in the replay window through `function` (`coffer_remember`, or
    /// `coffer_remember_exact` for a scope counted exactly).
    fn remember_in(
        &self,
        function: &str,
        organization: &str,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
        quota: u64,
    ) -> Result<Remembered, StoreError> {
        let quota = as_count(quota);
        let capacity = as_count(self.limits.replay_capacity);
        self.with_conn(|client| {
            let total = self.housekeeping(client, now_ms)?;
            if total >= capacity {
                client.execute(PRUNE_ALL, &[&now_ms]).map_err(pg)?;
                let total = self.read_total(client)?;
                *self.total.lock().map_err(poisoned)? = (now_ms, total);
                if total >= capacity {
                    return Ok(Remembered::WindowFull);
                }
            }
            let answered = remembered(client, function, organization, &key, expires_ms, now_ms, quota)?;
            if answered == Remembered::Fresh {
                self.counted(1);
            }
            Ok(answered)
        })
    }

    /// Adds `n` fresh entries to the remembered total.
    fn counted(&self, n: i64) {
        if let Ok(mut t) = self.total.lock() {
            t.1 += n;
        }
    }

    /// One try of [`EnclaveStore::remember_allowed`]: the lanes first (a full one refuses
    /// before the organization's share is touched, and every transaction takes the rows of a
    /// share in the same order), then the share, then the allow; committed only if all are fresh.
    /// Answers `coffer_remember`'s code and the entries made.
    fn share_once(
        &self,
        client: &mut Client,
        share: &ReplayShare,
        key: &[u8; 32],
        expires_ms: i64,
        now_ms: i64,
        allowed: &DecisionRecord,
    ) -> Result<(i32, i64), ::postgres::Error> {
        let mut tx = client.transaction()?;
        let mut fresh = 0;
        for lane in &share.lanes {
            let lane_key = lane.key(key);
            match remember_code(
                &mut tx,
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
                full => return Ok((full, 0)),
            }
        }
        let quota = as_count(self.limits.replay_per_organization);
        let first = remember_code(&mut tx, "coffer_remember", &share.organization, key, expires_ms, now_ms, quota)?;
        if first != 0 {
            return Ok((first, 0));
        }
        insert_decision_row(&mut tx, allowed)?;
        tx.commit()?;
        Ok((0, fresh + 1))
    }
}

/// One call of a replay function (`coffer_remember`, `coffer_remember_exact`).
fn remembered(
    client: &mut impl GenericClient,
    function: &str,
    scope: &str,
    key: &[u8; 32],
    expires_ms: i64,
    now_ms: i64,
    quota: i64,
) -> Result<Remembered, StoreError> {
    answer_of(remember_code(client, function, scope, key, expires_ms, now_ms, quota).map_err(pg)?)
}

/// A replay function's answer as it returns it: 0 fresh, 1 replayed, 2 the scope's quota full.
fn remember_code(
    client: &mut impl GenericClient,
    function: &str,
    scope: &str,
    key: &[u8; 32],
    expires_ms: i64,
    now_ms: i64,
    quota: i64,
) -> Result<i32, ::postgres::Error> {
    client
        .query_one(
            &format!("SELECT {function}($1, $2, $3, $4, $5)"),
            &[&scope, &&key[..], &expires_ms, &now_ms, &quota],
        )?
        .try_get(0)
}

fn answer_of(code: i32) -> Result<Remembered, StoreError> {
    match code {
        0 => Ok(Remembered::Fresh),
        1 => Ok(Remembered::Replayed),
        2 => Ok(Remembered::OrganizationQuotaFull),
        other => Err(StoreError::Corrupt(format!("the replay function answered {other}"))),
    }
}

/// Appends one decision to the decision log through `client` (a connection or a transaction).
fn insert_decision(client: &mut impl GenericClient, d: &DecisionRecord) -> Result<(), StoreError> {
    insert_decision_row(client, d).map_err(pg)
}

fn insert_decision_row(client: &mut impl GenericClient, d: &DecisionRecord) -> Result<(), ::postgres::Error> {
    client.execute(
        "INSERT INTO decisions (at_ms, organization_id, operation, fingerprint, activity_type, user_id, outcome,
                                reason, result_digest)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        &[
            &d.at_ms,
            &d.organization_id,
            &d.operation,
            &d.fingerprint,
            &d.activity_type,
            &d.user_id,
            &d.outcome,
            &d.reason,
            &d.result_digest,
        ],
    )?;
    Ok(())
}

/// Closing a `postgres` client blocks on its own runtime, which must not happen on an async
/// worker: the idle connections are closed on a thread of their own.
impl Drop for PostgresEnclaveStore {
    fn drop(&mut self) {
        let idle = match self.pool.get_mut() {
            Ok(pool) => std::mem::take(&mut pool.idle),
            Err(_) => return,
        };
        let _ = std::thread::spawn(move || drop(idle)).join();
    }
}

impl EnclaveStore for PostgresEnclaveStore {
    fn sealed_service_key(&self, label: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.with_conn(|client| {
            let row =
                client.query_opt("SELECT blob FROM sealed_service_keys WHERE label = $1", &[&label]).map_err(pg)?;
            row.map(|r| r.try_get(0).map_err(pg)).transpose()
        })
    }

    fn keep_sealed_service_key(&self, label: &str, blob: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.with_conn(|client| {
            client
                .execute(
                    "INSERT INTO sealed_service_keys (label, blob) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                    &[&label, &blob],
                )
                .map_err(pg)?;
            let row =
                client.query_one("SELECT blob FROM sealed_service_keys WHERE label = $1", &[&label]).map_err(pg)?;
            row.try_get(0).map_err(pg)
        })
    }

    fn log_head(&self, org: &str) -> Result<Option<(u64, String)>, StoreError> {
        self.with_conn(|client| {
            let row = client
                .query_opt("SELECT links, head FROM log_heads WHERE organization_id = $1", &[&org])
                .map_err(pg)?;
            row.map(|r| Ok((version_of(r.try_get(0).map_err(pg)?)?, r.try_get(1).map_err(pg)?))).transpose()
        })
    }

    fn advance_log(
        &self,
        org: &str,
        expected: u64,
        links: u64,
        head: &str,
        linked: &[LinkedActivity<'_>],
    ) -> Result<(), StoreError> {
        if links <= expected {
            return Err(StoreError::Invalid(format!("the log moves forward only (from {expected} to {links})")));
        }
        let (from, to) = (expected as i64, links as i64);
        let advanced = self.with_conn(|client| {
            let mut tx = client.transaction().map_err(pg)?;
            let changed = if expected == 0 {
                tx.execute(
                    "INSERT INTO log_heads (organization_id, links, head) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    &[&org, &to, &head],
                )
            } else {
                tx.execute(
                    "UPDATE log_heads SET links = $3, head = $4 WHERE organization_id = $1 AND links = $2",
                    &[&org, &from, &to, &head],
                )
            }
            .map_err(pg)?;
            if changed == 0 {
                return Ok(false);
            }
            // All the links in one statement.
            let fingerprints: Vec<&str> = linked.iter().map(|l| l.fingerprint).collect();
            let statuses: Vec<&str> = linked.iter().map(|l| l.status).collect();
            let ids: Vec<&str> = linked.iter().map(|l| l.activity_id).collect();
            let seqs: Vec<i64> = linked.iter().map(|l| l.seq as i64).collect();
            let digests: Vec<&str> = linked.iter().map(|l| l.activity_digest).collect();
            let taken = tx
                .execute(
                    "INSERT INTO log_links (organization_id, fingerprint, status, activity_id, seq, activity_digest)
                     SELECT $1, f, s, a, q, d
                     FROM UNNEST($2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[]) AS t(f, s, a, q, d)
                     WHERE NOT EXISTS (SELECT 1 FROM log_links l WHERE l.organization_id = $1 AND l.fingerprint = t.f)
                       AND NOT EXISTS (SELECT 1 FROM log_links l WHERE l.organization_id = $1 AND l.activity_id = t.a)
                     ON CONFLICT DO NOTHING",
                    &[&org, &fingerprints, &statuses, &ids, &seqs, &digests],
                )
                .map_err(pg)?;
            // An activity already linked in that status: nothing of the move is kept.
            if taken != linked.len() as u64 {
                return Ok(false);
            }
            tx.commit().map_err(pg)?;
            Ok(true)
        })?;
        if !advanced {
            let found = self.log_head(org)?.map(|(n, _)| n);
            return Err(StoreError::VersionMoved { organization_id: org.to_string(), expected, found });
        }
        Ok(())
    }

    fn linked(&self, org: &str, activities: &[(&str, &str)]) -> Result<Vec<bool>, StoreError> {
        let fingerprints: Vec<&str> = activities.iter().map(|(f, _)| *f).collect();
        let ids: Vec<&str> = activities.iter().map(|(_, a)| *a).collect();
        let found: Vec<(String, String)> = self.with_conn(|client| {
            client
                .query(
                    // Two lookups, each on its index.
                    "SELECT fingerprint, activity_id FROM log_links WHERE organization_id = $1 AND fingerprint = ANY($2)
                     UNION ALL
                     SELECT fingerprint, activity_id FROM log_links WHERE organization_id = $1 AND activity_id = ANY($3)",
                    &[&org, &fingerprints, &ids],
                )
                .map_err(pg)?
                .iter()
                .map(|r| Ok((r.try_get(0).map_err(pg)?, r.try_get(1).map_err(pg)?)))
                .collect()
        })?;
        Ok(activities.iter().map(|(f, a)| found.iter().any(|(ff, aa)| ff == f || aa == a)).collect())
    }

    fn link_of(&self, org: &str, fingerprint: &str, status: &str) -> Result<Option<ActivityLink>, StoreError> {
        self.with_conn(|client| {
            let row = client
                .query_opt(
                    "SELECT activity_id, activity_digest FROM log_links
                     WHERE organization_id = $1 AND fingerprint = $2 AND status = $3",
                    &[&org, &fingerprint, &status],
                )
                .map_err(pg)?;
            row.map(|r| {
                Ok(ActivityLink { activity_id: r.try_get(0).map_err(pg)?, activity_digest: r.try_get(1).map_err(pg)? })
            })
            .transpose()
        })
    }

    fn load(&self, org: &str) -> Result<Option<OrgHead>, StoreError> {
        self.with_conn(|client| {
            // One statement, one snapshot: the version and every entry (none: one row of NULLs).
            let rows = client
                .query(
                    "SELECT h.version, e.kind, e.id, e.data FROM org_heads h \
                     LEFT JOIN entries e ON e.organization_id = h.organization_id \
                     WHERE h.organization_id = $1 ORDER BY e.kind, e.id",
                    &[&org],
                )
                .map_err(pg)?;
            let Some(first) = rows.first() else { return Ok(None) };
            let version = version_of(first.try_get(0).map_err(pg)?)?;
            let mut entries = Vec::with_capacity(rows.len());
            for r in &rows {
                if let Some(kind) = r.try_get::<_, Option<String>>(1).map_err(pg)? {
                    entries.push(Entry { kind, id: r.try_get(2).map_err(pg)?, data: r.try_get(3).map_err(pg)? });
                }
            }
            Ok(Some(OrgHead { version, entries }))
        })
    }

    fn version(&self, org: &str) -> Result<Option<u64>, StoreError> {
        self.with_conn(|client| {
            let row =
                client.query_opt("SELECT version FROM org_heads WHERE organization_id = $1", &[&org]).map_err(pg)?;
            row.map(|r| r.try_get(0).map_err(pg).and_then(version_of)).transpose()
        })
    }

    fn apply(&self, changes: &[OrgChanges]) -> Result<Vec<u64>, StoreError> {
        check_changes(changes)?;
        self.with_conn(|client| {
            let mut tx = client.transaction().map_err(pg)?;
            let mut versions = Vec::with_capacity(changes.len());
            for c in changes {
                let next = c.expected_version + 1;
                // The compare-and-set: a row lock on the head, or the insert that must not collide.
                let moved = if c.expected_version == 0 {
                    tx.execute(
                        "INSERT INTO org_heads (organization_id, version) VALUES ($1, 1) ON CONFLICT DO NOTHING",
                        &[&c.organization_id],
                    )
                    .map_err(pg)?
                        == 0
                } else {
                    tx.execute(
                        "UPDATE org_heads SET version = $3 WHERE organization_id = $1 AND version = $2",
                        &[&c.organization_id, &(c.expected_version as i64), &(next as i64)],
                    )
                    .map_err(pg)?
                        == 0
                };
                if moved {
                    let found = tx
                        .query_opt("SELECT version FROM org_heads WHERE organization_id = $1", &[&c.organization_id])
                        .map_err(pg)?
                        .map(|r| r.try_get(0).map_err(pg).and_then(version_of))
                        .transpose()?;
                    return Err(StoreError::VersionMoved {
                        organization_id: c.organization_id.clone(),
                        expected: c.expected_version,
                        found,
                    });
                }
                for e in &c.puts {
                    tx.execute(
                        "INSERT INTO entries (organization_id, kind, id, data) VALUES ($1, $2, $3, $4)
                         ON CONFLICT (organization_id, kind, id) DO UPDATE SET data = EXCLUDED.data",
                        &[&c.organization_id, &e.kind, &e.id, &e.data],
                    )
                    .map_err(pg)?;
                }
                for (kind, id) in &c.deletes {
                    tx.execute(
                        "DELETE FROM entries WHERE organization_id = $1 AND kind = $2 AND id = $3",
                        &[&c.organization_id, kind, id],
                    )
                    .map_err(pg)?;
                }
                versions.push(next);
            }
            tx.commit().map_err(pg)?;
            Ok(versions)
        })
    }

    fn organizations(&self) -> Result<Vec<String>, StoreError> {
        self.with_conn(|client| {
            client
                .query("SELECT organization_id FROM org_heads ORDER BY organization_id", &[])
                .map_err(pg)?
                .iter()
                .map(|r| r.try_get(0).map_err(pg))
                .collect()
        })
    }

    fn remember(
        &self,
        organization: &str,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<Remembered, StoreError> {
        self.remember_in("coffer_remember", organization, key, expires_ms, now_ms, self.limits.replay_per_organization)
    }

    fn remember_within(
        &self,
        scope: &str,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
        quota: u64,
    ) -> Result<Remembered, StoreError> {
        // An unbounded scope (a token spent, a code verified) needs no order: its keys are unique.
        let function = if quota == u64::MAX { "coffer_remember" } else { "coffer_remember_exact" };
        self.remember_in(function, scope, key, expires_ms, now_ms, quota)
    }

    fn spent(&self, key: [u8; 32], now_ms: i64, org: &str, fingerprint: &str) -> Result<bool, StoreError> {
        self.with_conn(|client| {
            let row = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM replay WHERE key = $1 AND expires_ms > $2)
                         OR EXISTS (SELECT 1 FROM log_links WHERE organization_id = $3 AND fingerprint = $4)",
                    &[&key.as_slice(), &now_ms, &org, &fingerprint],
                )
                .map_err(pg)?;
            row.try_get(0).map_err(pg)
        })
    }

    fn record_decision(&self, d: &DecisionRecord) -> Result<(), StoreError> {
        self.with_conn(|client| insert_decision(client, d))
    }

    /// The entry under its organization's quota, one under each lane's, and the allow, in one
    /// transaction (rolled back unless all are fresh).
    fn remember_allowed(
        &self,
        share: &ReplayShare,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
        allowed: &DecisionRecord,
    ) -> Result<Remembered, StoreError> {
        let capacity = as_count(self.limits.replay_capacity);
        let rows = 1 + share.lanes.len() as i64;
        self.with_conn(|client| {
            let total = self.housekeeping(client, now_ms)?;
            if total + rows > capacity {
                client.execute(PRUNE_ALL, &[&now_ms]).map_err(pg)?;
                let total = self.read_total(client)?;
                *self.total.lock().map_err(poisoned)? = (now_ms, total);
                if total + rows > capacity {
                    return Ok(Remembered::WindowFull);
                }
            }
            // A deadlock (with another enclave's prune, which counts rows down in its own order)
            // rolled the whole transaction back: it is tried again.
            let mut tries = 0;
            let (answer, fresh) = loop {
                tries += 1;
                match self.share_once(client, share, &key, expires_ms, now_ms, allowed) {
                    Err(e) if tries < 4 && e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED) => continue,
                    other => break other.map_err(pg)?,
                }
            };
            let answered = answer_of(answer)?;
            if answered == Remembered::Fresh {
                self.counted(fresh);
            }
            Ok(answered)
        })
    }

    fn decided(&self, organization: &str, fingerprint: &str) -> Result<LatestDecision, StoreError> {
        self.with_conn(|client| {
            let row = client
                .query_opt(
                    "SELECT outcome, result_digest FROM decisions WHERE organization_id = $1 AND fingerprint = $2
                     ORDER BY result_digest <> '' DESC, seq DESC LIMIT 1",
                    &[&organization, &fingerprint],
                )
                .map_err(pg)?;
            let latest: Option<(String, String)> =
                row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose().map_err(pg)?;
            Ok(LatestDecision::of(latest))
        })
    }

    fn waited_for_votes(&self, organization: &str, fingerprint: &str, activity_type: &str) -> Result<bool, StoreError> {
        self.with_conn(|client| {
            let row = client
                .query_one(
                    "SELECT EXISTS(SELECT 1 FROM decisions WHERE organization_id = $1 AND fingerprint = $2
                     AND outcome = $3 AND reason = $4 AND activity_type = $5)",
                    &[&organization, &fingerprint, &OUTCOME_REFUSE, &REASON_CONSENSUS_NEEDED, &activity_type],
                )
                .map_err(pg)?;
            row.try_get(0).map_err(pg)
        })
    }

    fn decisions(&self, since_ms: i64, limit: usize) -> Result<Vec<DecisionRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with_conn(|client| {
            client
                .query(
                    "SELECT at_ms, organization_id, operation, fingerprint, activity_type, user_id, outcome, reason,
                            result_digest
                     FROM decisions WHERE at_ms >= $1 ORDER BY at_ms, seq LIMIT $2",
                    &[&since_ms, &limit],
                )
                .map_err(pg)?
                .iter()
                .map(decision_of)
                .collect()
        })
    }
}
