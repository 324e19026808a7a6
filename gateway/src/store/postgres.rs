//! The PostgreSQL backend: several gateways share one database; a pool of connections for reads,
//! a group committer for activities, and the shared SQL of `sql`.
//!
//! The driver is `postgres` (the blocking face of `tokio-postgres`): the `Store` interface is
//! synchronous, so each call blocks its thread for one round trip. Calls made on the async
//! executor give up in no-wait mode and are rerun under `block_in_place` (see
//! `AppState::read_store`), so a round trip never stalls the executor's other tasks. Correctness
//! across gateways rests on the database, not on this process: unique constraints (fingerprint,
//! names, idempotency keys), conditional updates (the vote compare-and-set, import targets) and
//! `ON CONFLICT DO NOTHING` on the fingerprint, which waits for a concurrent insert to settle.

use std::str::FromStr as _;
use std::sync::mpsc;

use coffer_sql::{off_executor, PgConn, PgPool};

use super::backend::{commit_and_reply, gather, Backend, CommitJob, CommitQueue};
use super::error::StoreError;
use super::interface::CommitCallback;
use super::model::ActivityRecord;
use super::nowait;
use super::sql::{self, Db, Dialect};
use super::write::Write;

pub use coffer_sql::redact;

/// Connections one store opens at most for reads and write transactions (the committer has
/// its own). PostgreSQL's default `max_connections` is 100: room for a few gateways.
const MAX_CONNECTIONS: usize = 24;
/// Most activities one group commit takes (one transaction, one WAL flush).
const MAX_BATCH: usize = 512;

/// PostgreSQL store (`postgres://…` store URL).
pub struct PostgresStore {
    pool: PgPool,
    commits: CommitQueue,
}

impl Dialect for PgConn {
    /// One migrating gateway at a time; the others wait, then find nothing left to do.
    const MIGRATION_LOCK: &'static str = "SELECT pg_advisory_xact_lock(7046631)";
    const VOTE_COUNT: &'static str = "json_array_length(votes::json)";
    const INSERTION_ORDER: &'static str = "id";
    const TABLES_WITH_ORGANIZATION_ID: &'static str = "SELECT table_name::text FROM information_schema.columns
         WHERE table_schema = current_schema() AND column_name = 'organization_id' ORDER BY 1";

    /// The shared migrations in PostgreSQL's words: BYTEA for BLOB, 64-bit integers throughout,
    /// and no SQLite trigger (migration 0005 made one, 0011 dropped it; PostgreSQL never had it).
    fn dialect(migration: &str) -> String {
        let mut out = String::new();
        let mut in_trigger = false;
        for line in migration.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("CREATE TRIGGER") {
                in_trigger = true;
            }
            if in_trigger {
                if trimmed.starts_with("END;") {
                    in_trigger = false;
                }
                continue;
            }
            if trimmed.starts_with("DROP TRIGGER") {
                continue;
            }
            out.push_str(&line.replace("BLOB", "BYTEA").replace(" INTEGER", " BIGINT").replace("x''", "''::bytea"));
            out.push('\n');
        }
        out
    }
}

impl PostgresStore {
    /// Connects, applies pending migrations (one gateway at a time) and starts the committer.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let config = ::postgres::Config::from_str(url)
            .map_err(|e| StoreError::Backend(format!("store URL {}: {e}", redact(url))))?;
        let (tx, rx) = mpsc::channel();
        off_executor(|| {
            let mut first = PgConn::connect(&config)?;
            sql::migrate(&mut first)?;
            let committer = PgConn::connect(&config)?;
            let cfg = config.clone();
            std::thread::Builder::new()
                .name("coffer-pg-committer".into())
                .spawn(move || committer_loop(cfg, committer, rx))
                .map_err(|e| StoreError::Backend(format!("starting the committer thread: {e}")))?;
            Ok(Self { pool: PgPool::new(config.clone(), MAX_CONNECTIONS, first), commits: CommitQueue::new(tx) })
        })
    }

    /// Whether the database `url` names holds the gateway's schema (connects once, creates nothing).
    pub fn exists(url: &str) -> Result<bool, StoreError> {
        let config = ::postgres::Config::from_str(url)
            .map_err(|e| StoreError::Backend(format!("store URL {}: {e}", redact(url))))?;
        off_executor(|| {
            let mut c = PgConn::connect(&config)?;
            // Whatever the role may read of it (information_schema lists only granted tables).
            let found = c.query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[], |r| r.flag(0))?;
            Ok::<_, StoreError>(found)
        })
    }

    /// Runs `f` on a pooled connection ([`PgPool`]), unless in no-wait mode.
    fn with_conn<T: Send>(&self, f: impl FnOnce(&mut PgConn) -> Result<T, StoreError> + Send) -> Result<T, StoreError> {
        if nowait::active() {
            return Err(nowait::give_up());
        }
        self.pool.with_conn(f)
    }
}

fn committer_loop(config: ::postgres::Config, mut conn: PgConn, jobs: mpsc::Receiver<CommitJob>) {
    while let Ok(first) = jobs.recv() {
        let batch = gather(first, &jobs, MAX_BATCH);
        if conn.is_closed() {
            match PgConn::connect(&config) {
                Ok(c) => conn = c,
                Err(e) => {
                    tracing::error!(error = %e, "PostgreSQL committer could not reconnect");
                    commit_and_reply::<PgConn>(Err(e.into()), batch);
                    continue;
                }
            }
        }
        commit_and_reply(Ok(&mut conn), batch);
    }
}

impl Backend for PostgresStore {
    type Db = PgConn;

    fn read<T: Send>(&self, f: impl FnMut(&mut PgConn) -> Result<T, StoreError> + Send) -> Result<T, StoreError> {
        let mut f = f;
        self.with_conn(|c| f(c))
    }

    fn write<T: Send>(&self, f: impl FnOnce(&mut PgConn) -> Result<T, StoreError> + Send) -> Result<T, StoreError> {
        self.with_conn(|c| c.transaction(f))
    }

    fn commit_then(&self, activity: ActivityRecord, writes: Vec<Write>, done: CommitCallback) {
        self.commits.send(activity, writes, done)
    }

    /// PostgreSQL removes deleted rows' old versions itself (VACUUM); nothing to force here.
    fn purge_deleted_data(&self) -> Result<bool, StoreError> {
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_in_postgresql_words() {
        let m = PgConn::dialect(sql::MIGRATIONS[4]);
        assert!(!m.contains("TRIGGER") && !m.contains("BEGIN\n") && !m.contains("END;"), "{m}");
        assert!(m.contains("CREATE TABLE IF NOT EXISTS organization_deletions"));
        let m = PgConn::dialect(sql::MIGRATIONS[6]);
        assert!(m.contains("BYTEA NOT NULL DEFAULT ''::bytea") && !m.contains("BLOB"), "{m}");
        let m = PgConn::dialect(sql::MIGRATIONS[9]);
        assert!(m.contains("attempts BIGINT") && !m.contains(" INTEGER"), "{m}");
        assert!(!PgConn::dialect(sql::MIGRATIONS[10]).contains("DROP TRIGGER"));
    }
}
