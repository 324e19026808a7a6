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

use std::collections::HashMap;
use std::str::FromStr as _;
use std::sync::{mpsc, Condvar, Mutex};

use ::postgres::error::SqlState;
use ::postgres::types::{IsNull, ToSql, Type};
use ::postgres::{Client, NoTls, Statement};

use super::backend::{commit_and_reply, gather, Backend, CommitJob, CommitQueue};
use super::error::{Constraint, StoreError, Unique};
use super::interface::CommitCallback;
use super::model::ActivityRecord;
use super::nowait;
use super::sql::{self, Arg, Db, SqlRow, Value};
use super::write::Write;

/// Connections one store opens at most for reads and write transactions (the committer has
/// its own). PostgreSQL's default `max_connections` is 100: room for a few gateways.
const MAX_CONNECTIONS: usize = 24;
/// Statements cached per connection before the cache is reset (lists with `IN (...)` of
/// varying length make distinct statements).
const MAX_STATEMENTS: usize = 512;
/// Most activities one group commit takes (one transaction, one WAL flush).
const MAX_BATCH: usize = 512;

/// PostgreSQL store (`postgres://…` store URL).
pub struct PostgresStore {
    config: ::postgres::Config,
    idle: Mutex<Pool>,
    freed: Condvar,
    commits: CommitQueue,
}

struct Pool {
    idle: Vec<PgConn>,
    open: usize,
}

/// One connection and its prepared statements (keyed by the statement's `?` text).
pub struct PgConn {
    client: Client,
    statements: HashMap<String, Statement>,
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

fn pg(e: ::postgres::Error) -> StoreError {
    if e.code() == Some(&SqlState::UNIQUE_VIOLATION) {
        // PostgreSQL names the constraint; a records name clash is records' UNIQUE (organization_id, kind, name).
        let name = e.as_db_error().and_then(|d| d.constraint()).unwrap_or_default();
        let constraint = match name {
            "records_organization_id_kind_name_key" => Constraint::RecordName,
            _ => Constraint::Other,
        };
        return StoreError::Unique(Unique::new(constraint, format!("UNIQUE constraint failed: {name}")));
    }
    StoreError::Backend(format!("postgres: {e}"))
}

impl ToSql for Arg<'_> {
    fn to_sql(&self, ty: &Type, out: &mut bytes::BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match *self {
            Arg::Null => Ok(IsNull::Yes),
            Arg::Int(v) if *ty == Type::INT4 => i32::try_from(v)?.to_sql(ty, out),
            Arg::Int(v) if *ty == Type::INT2 => i16::try_from(v)?.to_sql(ty, out),
            Arg::Int(v) if *ty == Type::TEXT || *ty == Type::VARCHAR => v.to_string().to_sql(ty, out),
            Arg::Int(v) => v.to_sql(ty, out),
            Arg::Text(s) => s.to_sql(ty, out),
            Arg::Bytes(b) => b.to_sql(ty, out),
        }
    }
    fn accepts(_: &Type) -> bool {
        true
    }
    ::postgres::types::to_sql_checked!();
}

impl SqlRow for ::postgres::Row {
    fn value(&self, i: usize) -> Result<Value, StoreError> {
        let ty =
            self.columns().get(i).map(|c| c.type_().clone()).ok_or(StoreError::Backend(format!("no column {i}")))?;
        let value = match ty {
            Type::INT8 => self.try_get::<_, Option<i64>>(i).map(|v| v.map(Value::Int)),
            Type::INT4 => self.try_get::<_, Option<i32>>(i).map(|v| v.map(|v| Value::Int(v.into()))),
            Type::INT2 => self.try_get::<_, Option<i16>>(i).map(|v| v.map(|v| Value::Int(v.into()))),
            Type::BOOL => self.try_get::<_, Option<bool>>(i).map(|v| v.map(|v| Value::Int(v.into()))),
            Type::BYTEA => self.try_get::<_, Option<Vec<u8>>>(i).map(|v| v.map(Value::Bytes)),
            Type::TEXT | Type::VARCHAR | Type::NAME | Type::BPCHAR => {
                self.try_get::<_, Option<String>>(i).map(|v| v.map(Value::Text))
            }
            other => return Err(StoreError::Backend(format!("column {i}: unsupported type {other}"))),
        };
        Ok(value.map_err(pg)?.unwrap_or(Value::Null))
    }
}

/// `?N` and bare `?` placeholders as PostgreSQL's `$N` (statements here have no `?` in literals).
fn placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut next = 0;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '?' {
            out.push(c);
            continue;
        }
        let mut digits = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(*d);
            chars.next();
        }
        if digits.is_empty() {
            next += 1;
            digits = next.to_string();
        }
        out.push('$');
        out.push_str(&digits);
    }
    out
}

impl PgConn {
    fn connect(config: &::postgres::Config) -> Result<Self, StoreError> {
        let mut client = config.connect(NoTls).map_err(pg)?;
        // Every statement here is an indexed lookup, page or insert whose plan does not depend
        // on the bound values; left to choose, PostgreSQL plans joins afresh on each execution
        // for its first five and often for good. Measured: 22 % less database CPU per read.
        client.batch_execute("SET plan_cache_mode = force_generic_plan").map_err(pg)?;
        Ok(Self { client, statements: HashMap::new() })
    }

    fn statement(&mut self, sql: &str) -> Result<Statement, StoreError> {
        if let Some(st) = self.statements.get(sql) {
            return Ok(st.clone());
        }
        if self.statements.len() >= MAX_STATEMENTS {
            self.statements.clear();
        }
        let st = self.client.prepare(&placeholders(sql)).map_err(pg)?;
        self.statements.insert(sql.to_string(), st.clone());
        Ok(st)
    }
}

fn params<'a>(args: &'a [Arg<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    args.iter().map(|a| a as &(dyn ToSql + Sync)).collect()
}

impl Db for PgConn {
    const BEGIN_WRITE: &'static str = "BEGIN";
    /// One migrating gateway at a time; the others wait, then find nothing left to do.
    const MIGRATION_LOCK: &'static str = "SELECT pg_advisory_xact_lock(7046631)";
    const VOTE_COUNT: &'static str = "json_array_length(votes::json)";
    const INSERTION_ORDER: &'static str = "id";
    const TABLES_WITH_ORGANIZATION_ID: &'static str = "SELECT table_name::text FROM information_schema.columns
         WHERE table_schema = current_schema() AND column_name = 'organization_id' ORDER BY 1";

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let st = self.statement(sql)?;
        self.client.execute(&st, &params(args)).map_err(pg)
    }

    fn query<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        mut f: impl FnMut(&dyn SqlRow) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let st = self.statement(sql)?;
        let rows = self.client.query(&st, &params(args)).map_err(pg)?;
        rows.iter().map(|r| f(r)).collect()
    }

    fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        self.client.batch_execute(sql).map_err(pg)
    }

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

/// Runs blocking database work where blocking is allowed: under `block_in_place` on a
/// multi-thread runtime's worker, on a thread of its own from a current-thread runtime (the
/// gateway's operations listener), directly on any other thread. (`postgres` runs its own small
/// runtime, which cannot start on a thread that is inside another one.)
fn off_executor<T: Send>(f: impl FnOnce() -> Result<T, StoreError> + Send) -> Result<T, StoreError> {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        Ok(_) => std::thread::scope(|s| s.spawn(f).join())
            .unwrap_or_else(|_| Err(StoreError::Backend("a store call panicked".into()))),
        Err(_) => f(),
    }
}

impl PostgresStore {
    /// Connects, applies pending migrations (one gateway at a time) and starts the committer.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let config = ::postgres::Config::from_str(url)
            .map_err(|e| StoreError::Backend(format!("store URL {}: {e}", redact(url))))?;
        let (tx, rx) = mpsc::channel();
        let store = off_executor(|| {
            let mut first = PgConn::connect(&config)?;
            sql::migrate(&mut first)?;
            let committer = PgConn::connect(&config)?;
            let cfg = config.clone();
            std::thread::Builder::new()
                .name("coffer-pg-committer".into())
                .spawn(move || committer_loop(cfg, committer, rx))
                .map_err(|e| StoreError::Backend(format!("starting the committer thread: {e}")))?;
            Ok(Self {
                config: config.clone(),
                idle: Mutex::new(Pool { idle: vec![first], open: 1 }),
                freed: Condvar::new(),
                commits: CommitQueue::new(tx),
            })
        })?;
        Ok(store)
    }

    /// Runs `f` on a pooled connection (opened on demand, at most [`MAX_CONNECTIONS`]); a
    /// connection that broke is dropped rather than returned.
    fn with_conn<T: Send>(&self, f: impl FnOnce(&mut PgConn) -> Result<T, StoreError> + Send) -> Result<T, StoreError> {
        if nowait::active() {
            return Err(nowait::give_up());
        }
        off_executor(|| {
            let mut conn = match self.checkout()? {
                Some(c) => c,
                None => PgConn::connect(&self.config).inspect_err(|_| self.release(None))?,
            };
            let out = f(&mut conn);
            let keep = !conn.client.is_closed();
            self.release(keep.then_some(conn));
            out
        })
    }

    /// An idle connection, or `None` with a slot reserved for a new one; waits while every
    /// slot is in use.
    fn checkout(&self) -> Result<Option<PgConn>, StoreError> {
        let poisoned = |_| StoreError::Backend("pool lock poisoned".into());
        let mut pool = self.idle.lock().map_err(poisoned)?;
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

    fn release(&self, conn: Option<PgConn>) {
        if let Ok(mut pool) = self.idle.lock() {
            match conn {
                Some(c) => pool.idle.push(c),
                None => pool.open -= 1,
            }
        }
        self.freed.notify_one();
    }
}

/// Closing a `postgres` client blocks on its own runtime, which must not happen on an async
/// worker: the idle connections are closed on a thread of their own.
impl Drop for PostgresStore {
    fn drop(&mut self) {
        let idle = match self.idle.get_mut() {
            Ok(pool) => std::mem::take(&mut pool.idle),
            Err(_) => return,
        };
        let _ = std::thread::spawn(move || drop(idle)).join();
    }
}

fn committer_loop(config: ::postgres::Config, mut conn: PgConn, jobs: mpsc::Receiver<CommitJob>) {
    while let Ok(first) = jobs.recv() {
        let batch = gather(first, &jobs, MAX_BATCH);
        if conn.client.is_closed() {
            match PgConn::connect(&config) {
                Ok(c) => conn = c,
                Err(e) => {
                    tracing::error!(error = %e, "PostgreSQL committer could not reconnect");
                    commit_and_reply::<PgConn>(Err(e), batch);
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
    fn placeholders_are_numbered_as_written_or_in_order() {
        assert_eq!(placeholders("a = ?1 AND b = ?2 OR c = ?1"), "a = $1 AND b = $2 OR c = $1");
        assert_eq!(placeholders("x IN (?, ?) LIMIT ?"), "x IN ($1, $2) LIMIT $3");
        assert_eq!(placeholders("?12"), "$12");
    }

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

    #[test]
    fn urls_in_messages_carry_no_password() {
        assert_eq!(redact("postgres://coffer:s3cret@db:5432/coffer"), "postgres://coffer@db:5432/coffer");
        assert_eq!(redact("postgres://coffer@%2Frun/coffer"), "postgres://coffer@%2Frun/coffer");
        assert_eq!(redact("postgres://db/coffer"), "postgres://db/coffer");
    }
}
