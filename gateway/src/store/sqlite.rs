//! The embedded SQLite backend: one file, WAL, one writer connection and a few readers.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::*;

/// Applied in order, once each; append new files, never edit applied ones.
const MIGRATIONS: &[&str] = &[
    include_str!("migrations/0001_core.sql"),
    include_str!("migrations/0002_records.sql"),
    include_str!("migrations/0003_users.sql"),
    include_str!("migrations/0004_credentials.sql"),
    include_str!("migrations/0005_suborgs.sql"),
    include_str!("migrations/0006_votes.sql"),
    include_str!("migrations/0007_certificates.sql"),
    include_str!("migrations/0008_activity_pages.sql"),
    include_str!("migrations/0009_list_pages.sql"),
    include_str!("migrations/0010_webhook_deliveries.sql"),
    include_str!("migrations/0011_deleted_organizations.sql"),
];

/// What a deleted sub-organization loses, children before parents: every credential, key,
/// record and pending delivery. Its activities and policy evaluations stay (the audit trail), as
/// does its organization row, as a tombstone. A test checks that every table holding an
/// `organization_id` is either here or kept on purpose.
const PURGED_ON_DELETION: &[&str] = &[
    "api_keys",
    "authenticators",
    "oauth_providers",
    "user_tags",
    "import_targets",
    "users",
    "wallet_accounts",
    "wallets",
    "private_key_addresses",
    "private_keys",
    "records",
    "idempotency_keys",
    "webhook_deliveries",
];
/// Kept when a sub-organization is deleted.
#[cfg(test)]
const KEPT_ON_DELETION: &[&str] = &["activities", "policy_evaluations", "organizations"];
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
struct CommitJob {
    activity: ActivityRecord,
    writes: Vec<Write>,
    reply: CommitCallback,
}

fn committer(writer: Arc<Mutex<Connection>>, jobs: mpsc::Receiver<CommitJob>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let results = match writer.lock() {
            Ok(mut conn) => {
                let started = std::time::Instant::now();
                let results = commit_batch(&mut conn, &batch);
                let m = crate::metrics::metrics();
                m.commit_seconds.observe(started.elapsed().as_secs_f64());
                m.commit_batch.observe(batch.len() as f64);
                results
            }
            Err(_) => batch.iter().map(|_| Err(StoreError::Backend("writer lock poisoned".into()))).collect(),
        };
        for (job, result) in batch.into_iter().zip(results) {
            (job.reply)(result);
        }
    }
}

/// Commits a batch in one transaction; each activity in its own savepoint. `BEGIN IMMEDIATE`
/// takes the write lock up front (waiting through the busy handler while the checkpointer
/// resets the WAL) instead of failing with SQLITE_BUSY_SNAPSHOT on the first write.
fn commit_batch(conn: &mut Connection, batch: &[CommitJob]) -> Vec<Result<Committed, StoreError>> {
    let fail_all = |e: StoreError| batch.iter().map(|_| Err(StoreError::Backend(e.to_string()))).collect();
    let mut tx = match conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => return fail_all(backend(e)),
    };
    let mut results = Vec::with_capacity(batch.len());
    for job in batch {
        let result = (|| {
            let sp = tx.savepoint().map_err(backend)?;
            let existing = sp
                .query_row(
                    &format!("SELECT {ACTIVITY_COLS} FROM activities WHERE fingerprint = ?1"),
                    params![job.activity.fingerprint],
                    activity_row,
                )
                .optional()
                .map_err(backend)?;
            if let Some(existing) = existing {
                return Ok(Committed::Existing(existing));
            }
            for w in &job.writes {
                apply_write(&sp, w)?;
            }
            match deletion_parent(&job.writes, &job.activity.id) {
                // The record of a sub-organization's deletion goes to its parent's log.
                Some(parent) => insert_activity(
                    &sp,
                    &ActivityRecord { organization_id: parent.to_string(), ..job.activity.clone() },
                )?,
                None => insert_activity(&sp, &job.activity)?,
            }
            sp.commit().map_err(backend)?;
            Ok(Committed::New(job.activity.clone()))
        })();
        results.push(result);
    }
    match tx.commit() {
        Ok(()) => results,
        Err(e) => fail_all(backend(e)),
    }
}

/// The parent of the sub-organization `writes` delete, when `activity_id` is the deleting one.
fn deletion_parent<'a>(writes: &'a [Write], activity_id: &str) -> Option<&'a str> {
    writes.iter().find_map(|w| match w {
        Write::DeleteSubOrganization { activity_id: a, parent_id, .. } if a == activity_id => Some(parent_id.as_str()),
        _ => None,
    })
}

fn insert_activity(conn: &Connection, a: &ActivityRecord) -> Result<(), StoreError> {
    execute_cached(
        conn,
        &format!("INSERT INTO activities ({ACTIVITY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"),
        params![
            a.id,
            a.organization_id,
            a.activity_type,
            a.status,
            a.fingerprint,
            json_text(&a.intent),
            json_text(&a.result),
            json_text(&a.votes),
            a.created_at,
            a.failure.as_ref().map(json_text),
            a.updated_at
        ],
    )
    .map_err(backend)?;
    Ok(())
}

fn backend(e: rusqlite::Error) -> StoreError {
    if let rusqlite::Error::SqliteFailure(f, Some(msg)) = &e {
        if f.code == rusqlite::ErrorCode::ConstraintViolation && msg.contains("UNIQUE") {
            return StoreError::Unique(msg.clone());
        }
    }
    StoreError::Backend(e.to_string())
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

/// `query_row` through the connection's prepared-statement cache: preparing (parsing and
/// planning) a statement cost more than running it in the gateway's profile.
fn query_row_cached<T, P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
    f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached(sql)?.query_row(params, f)
}

/// `execute` through the prepared-statement cache.
fn execute_cached<P: rusqlite::Params>(conn: &Connection, sql: &str, params: P) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
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
        migrate(&mut writer)?;
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
    fn read<T>(&self, f: impl Fn(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let i = self.next_reader.fetch_add(1, Ordering::Relaxed) % self.readers.len();
        if nowait::active() {
            // A free reader or none: no lock waits, no busy retries.
            for k in 0..self.readers.len() {
                let conn = match self.readers[(i + k) % self.readers.len()].try_lock() {
                    Ok(conn) => conn,
                    Err(std::sync::TryLockError::WouldBlock) => continue,
                    Err(std::sync::TryLockError::Poisoned(_)) => {
                        return Err(StoreError::Backend("reader lock poisoned".into()))
                    }
                };
                return match f(&conn) {
                    Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::DatabaseBusy => {
                        Err(nowait::give_up())
                    }
                    other => other.map_err(backend),
                };
            }
            return Err(nowait::give_up());
        }
        let conn = self.readers[i].lock().map_err(|_| StoreError::Backend("reader lock poisoned".into()))?;
        let mut attempt = 0;
        loop {
            match f(&conn) {
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy && attempt < 1000 =>
                {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                other => return other.map_err(backend),
            }
        }
    }

    fn one<T>(&self, f: impl Fn(&Connection) -> rusqlite::Result<Option<T>>) -> Result<T, StoreError> {
        self.read(f)?.ok_or(StoreError::NotFound)
    }
}

/// What [`keyset_page`] lists: `cols` of `table` where `scope` holds, in `order`.
struct Listing<'a> {
    table: &'a str,
    cols: &'a str,
    scope: &'a str,
    args: &'a [&'a str],
    order: &'a [&'a str],
}

/// One keyset page of `table`: rows where `scope` holds (its `?`s bound to `args`), ordered by
/// the `order` columns (ending in a unique one), at most `page.limit`, strictly after or before
/// the row whose id is a cursor (a cursor id outside `scope` is ignored). With an index on
/// (scope columns, order columns) a page reads one page of rows, whatever the table holds.
fn keyset_page<T>(
    c: &Connection,
    list: Listing<'_>,
    page: &Page,
    row: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<Vec<T>> {
    let Listing { table, cols, scope, args, order } = list;
    use rusqlite::types::Value as Sql;
    let keys = order.join(", ");
    let mut bound: Vec<Sql> = Vec::new();
    let scoped = |extra: &[Sql]| -> Vec<Sql> {
        args.iter().map(|a| Sql::Text(a.to_string())).chain(extra.iter().cloned()).collect()
    };
    let cursor = |id: &Option<String>| -> rusqlite::Result<Option<Vec<Sql>>> {
        let Some(id) = id else { return Ok(None) };
        let sql = format!("SELECT {keys} FROM {table} WHERE {scope} AND id = ?");
        c.prepare_cached(&sql)?
            .query_row(rusqlite::params_from_iter(scoped(&[Sql::Text(id.clone())])), |r| {
                (0..order.len()).map(|i| r.get::<_, Sql>(i)).collect()
            })
            .optional()
    };
    let (after, before) = (cursor(&page.after)?, cursor(&page.before)?);
    let marks = vec!["?"; order.len()].join(", ");
    let mut sql = format!("SELECT {cols} FROM {table} WHERE {scope}");
    bound.extend(scoped(&[]));
    if let Some(values) = &after {
        sql.push_str(&format!(" AND ({keys}) > ({marks})"));
        bound.extend(values.iter().cloned());
    }
    if let Some(values) = &before {
        sql.push_str(&format!(" AND ({keys}) < ({marks})"));
        bound.extend(values.iter().cloned());
    }
    // Before a cursor: the rows just preceding it, read downwards and turned around.
    let direction = if before.is_some() { "DESC" } else { "ASC" };
    let ordering: Vec<String> = order.iter().map(|k| format!("{k} {direction}")).collect();
    sql.push_str(&format!(" ORDER BY {} LIMIT ?", ordering.join(", ")));
    bound.push(Sql::Integer(page.limit.min(i64::MAX as usize) as i64));
    let mut items = c
        .prepare_cached(&sql)?
        .query_map(rusqlite::params_from_iter(bound), row)?
        .collect::<rusqlite::Result<Vec<T>>>()?;
    if before.is_some() {
        items.reverse();
    }
    Ok(items)
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    conn.execute_batch("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY)").map_err(backend)?;
    let done: i64 = query_row_cached(conn, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| r.get(0))
        .map_err(backend)?;
    for (i, sql) in MIGRATIONS.iter().enumerate() {
        let version = i as i64 + 1;
        if version <= done {
            continue;
        }
        let tx = conn.transaction().map_err(backend)?;
        tx.execute_batch(sql).map_err(backend)?;
        tx.execute("INSERT INTO schema_migrations (version) VALUES (?1)", params![version]).map_err(backend)?;
        tx.commit().map_err(backend)?;
    }
    Ok(())
}

fn json_text<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

fn parse_json<T: serde::de::DeserializeOwned + Default>(s: String) -> T {
    serde_json::from_str(&s).unwrap_or_default()
}

fn org_row(r: &Row<'_>) -> rusqlite::Result<Organization> {
    Ok(Organization {
        id: r.get(0)?,
        name: r.get(1)?,
        parent_id: r.get(2)?,
        root_quorum_threshold: r.get(3)?,
        root_user_ids: parse_json(r.get(4)?),
        created_at: r.get(5)?,
        updated_at: r.get(6)?,
    })
}
const ORG_COLS: &str = "id, name, parent_id, root_quorum_threshold, root_user_ids, created_at, updated_at";

fn user_row(r: &Row<'_>) -> rusqlite::Result<User> {
    Ok(User {
        id: r.get(0)?,
        organization_id: r.get(1)?,
        name: r.get(2)?,
        email: r.get(3)?,
        phone_number: r.get(4)?,
        created_at: r.get(5)?,
        updated_at: r.get(6)?,
    })
}
const USER_COLS: &str = "id, organization_id, name, email, phone_number, created_at, updated_at";

fn api_key_row(r: &Row<'_>) -> rusqlite::Result<ApiKey> {
    Ok(ApiKey {
        id: r.get(0)?,
        organization_id: r.get(1)?,
        user_id: r.get(2)?,
        name: r.get(3)?,
        public_key: r.get(4)?,
        credential_type: r.get(5)?,
        expiration_seconds: r.get::<_, Option<i64>>(6)?.map(|v| v as u64),
        created_at: r.get(7)?,
        updated_at: r.get(8)?,
        certificate: r.get(9)?,
    })
}
const API_KEY_COLS: &str = "id, organization_id, user_id, name, public_key, credential_type, expiration_seconds, created_at, updated_at, certificate";

fn wallet_row(r: &Row<'_>) -> rusqlite::Result<Wallet> {
    Ok(Wallet {
        id: r.get(0)?,
        organization_id: r.get(1)?,
        name: r.get(2)?,
        exported: r.get::<_, i64>(3)? != 0,
        imported: r.get::<_, i64>(4)? != 0,
        sealed_seed: r.get(5)?,
        created_at: r.get(6)?,
        updated_at: r.get(7)?,
    })
}
const WALLET_COLS: &str = "id, organization_id, name, exported, imported, sealed_seed, created_at, updated_at";

fn account_row(r: &Row<'_>) -> rusqlite::Result<WalletAccount> {
    Ok(WalletAccount {
        id: r.get(0)?,
        organization_id: r.get(1)?,
        wallet_id: r.get(2)?,
        curve: r.get(3)?,
        path_format: r.get(4)?,
        path: r.get(5)?,
        address_format: r.get(6)?,
        address: r.get(7)?,
        public_key: r.get(8)?,
        sealed_key: r.get(9)?,
        created_at: r.get(10)?,
        updated_at: r.get(11)?,
    })
}
const ACCOUNT_COLS: &str = "id, organization_id, wallet_id, curve, path_format, path, address_format, address, public_key, sealed_key, created_at, updated_at";

fn private_key_row(r: &Row<'_>) -> rusqlite::Result<PrivateKey> {
    Ok(PrivateKey {
        id: r.get(0)?,
        organization_id: r.get(1)?,
        name: r.get(2)?,
        curve: r.get(3)?,
        public_key: r.get(4)?,
        addresses: parse_json(r.get(5)?),
        tags: parse_json(r.get(6)?),
        exported: r.get::<_, i64>(7)? != 0,
        imported: r.get::<_, i64>(8)? != 0,
        sealed_key: r.get(9)?,
        created_at: r.get(10)?,
        updated_at: r.get(11)?,
    })
}
const PRIVATE_KEY_COLS: &str = "id, organization_id, name, curve, public_key, addresses, tags, exported, imported, sealed_key, created_at, updated_at";

fn activity_row(r: &Row<'_>) -> rusqlite::Result<ActivityRecord> {
    let failure: Option<String> = r.get(9)?;
    Ok(ActivityRecord {
        id: r.get(0)?,
        organization_id: r.get(1)?,
        activity_type: r.get(2)?,
        status: r.get(3)?,
        fingerprint: r.get(4)?,
        intent: parse_json(r.get(5)?),
        result: parse_json(r.get(6)?),
        votes: parse_json(r.get(7)?),
        failure: failure.map(parse_json),
        created_at: r.get(8)?,
        updated_at: r.get(10)?,
    })
}
const ACTIVITY_COLS: &str =
    "id, organization_id, activity_type, status, fingerprint, intent, result, votes, created_at, failure, updated_at";

fn record_row(r: &Row<'_>) -> rusqlite::Result<Record> {
    Ok(Record {
        organization_id: r.get(0)?,
        kind: r.get(1)?,
        id: r.get(2)?,
        name: r.get(3)?,
        data: parse_json(r.get(4)?),
        created_at: r.get(5)?,
        updated_at: r.get(6)?,
    })
}
const DELIVERY_COLS: &str = "id, organization_id, endpoint_id, activity_organization_id, activity_id, event_type, body, status, attempts, next_attempt_at, last_status_code, last_error, created_at, updated_at";

fn delivery_row(r: &Row<'_>) -> rusqlite::Result<WebhookDelivery> {
    Ok(WebhookDelivery {
        id: r.get(0)?,
        organization_id: r.get(1)?,
        endpoint_id: r.get(2)?,
        activity_organization_id: r.get(3)?,
        activity_id: r.get(4)?,
        event_type: r.get(5)?,
        body: r.get(6)?,
        status: r.get(7)?,
        attempts: r.get(8)?,
        next_attempt_at: r.get(9)?,
        last_status_code: r.get(10)?,
        last_error: r.get(11)?,
        created_at: r.get(12)?,
        updated_at: r.get(13)?,
    })
}

const RECORD_COLS: &str = "organization_id, kind, id, name, data, created_at, updated_at";

fn authenticator_row(r: &Row<'_>) -> rusqlite::Result<AuthenticatorRecord> {
    Ok(AuthenticatorRecord {
        id: r.get(0)?,
        organization_id: r.get(1)?,
        user_id: r.get(2)?,
        name: r.get(3)?,
        credential_id: r.get(4)?,
        public_key: r.get(5)?,
        attestation_type: r.get(6)?,
        aaguid: r.get(7)?,
        transports: parse_json(r.get(8)?),
        sign_count: r.get(9)?,
        created_at: r.get(10)?,
        updated_at: r.get(11)?,
        certificate: r.get(12)?,
    })
}
const AUTHENTICATOR_COLS: &str = "id, organization_id, user_id, name, credential_id, public_key, attestation_type, aaguid, transports, sign_count, created_at, updated_at, certificate";

fn oauth_provider_row(r: &Row<'_>) -> rusqlite::Result<OauthProviderRecord> {
    Ok(OauthProviderRecord {
        id: r.get(0)?,
        organization_id: r.get(1)?,
        user_id: r.get(2)?,
        name: r.get(3)?,
        issuer: r.get(4)?,
        audience: r.get(5)?,
        subject: r.get(6)?,
        created_at: r.get(7)?,
        updated_at: r.get(8)?,
    })
}
const OAUTH_PROVIDER_COLS: &str =
    "id, organization_id, user_id, name, issuer, audience, subject, created_at, updated_at";

/// Applies one write inside `tx`. Preconditions that fail return `Conflict` (the caller rolls back).
fn apply_write(tx: &Connection, w: &Write) -> Result<(), StoreError> {
    let now = now_nanos();
    match w {
        Write::InsertOrganization(o) => {
            execute_cached(
                tx,
                &format!("INSERT INTO organizations ({ORG_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                params![
                    o.id,
                    o.name,
                    o.parent_id,
                    o.root_quorum_threshold,
                    json_text(&o.root_user_ids),
                    o.created_at,
                    o.updated_at
                ],
            )
            .map_err(backend)?;
        }
        Write::InsertUser(u) => {
            execute_cached(
                tx,
                &format!("INSERT INTO users ({USER_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                params![u.id, u.organization_id, u.name, u.email, u.phone_number, u.created_at, u.updated_at],
            )
            .map_err(backend)?;
        }
        Write::InsertApiKey(k) => {
            execute_cached(
                tx,
                &format!("INSERT INTO api_keys ({API_KEY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
                params![
                    k.id,
                    k.organization_id,
                    k.user_id,
                    k.name,
                    k.public_key,
                    k.credential_type,
                    k.expiration_seconds.map(|v| v as i64),
                    k.created_at,
                    k.updated_at,
                    k.certificate
                ],
            )
            .map_err(backend)?;
        }
        Write::InsertWallet(wl) => {
            execute_cached(
                tx,
                &format!("INSERT INTO wallets ({WALLET_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
                params![
                    wl.id,
                    wl.organization_id,
                    wl.name,
                    wl.exported as i64,
                    wl.imported as i64,
                    wl.sealed_seed,
                    wl.created_at,
                    wl.updated_at
                ],
            )
            .map_err(|e| match backend(e) {
                StoreError::Unique(_) => StoreError::Unique("wallet name must be unique".into()),
                other => other,
            })?;
        }
        Write::InsertAccounts(accounts) => {
            for a in accounts {
                execute_cached(tx,
                    "INSERT INTO wallet_accounts (id, organization_id, wallet_id, seq, curve, path_format, path, address_format, address, public_key, exported, sealed_key, created_at, updated_at)
                     VALUES (?1, ?2, ?3, (SELECT COALESCE(MAX(seq), -1) + 1 FROM wallet_accounts WHERE wallet_id = ?3), ?4, ?5, ?6, ?7, ?8, ?9, 0, ?10, ?11, ?12)",
                    params![a.id, a.organization_id, a.wallet_id, a.curve, a.path_format, a.path, a.address_format, a.address, a.public_key, a.sealed_key, a.created_at, a.updated_at],
                )
                .map_err(|e| match backend(e) {
                    StoreError::Unique(_) => StoreError::Unique(format!(
                        "wallet account already exists for path {} and address format {}",
                        a.path, a.address_format
                    )),
                    other => other,
                })?;
            }
        }
        Write::InsertPrivateKeys(keys) => {
            for k in keys {
                execute_cached(tx,
                    &format!("INSERT INTO private_keys ({PRIVATE_KEY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"),
                    params![
                        k.id, k.organization_id, k.name, k.curve, k.public_key, json_text(&k.addresses),
                        json_text(&k.tags), k.exported as i64, k.imported as i64, k.sealed_key, k.created_at, k.updated_at
                    ],
                )
                .map_err(|e| match backend(e) {
                    StoreError::Unique(_) => StoreError::Unique("private key name must be unique".into()),
                    other => other,
                })?;
                for a in &k.addresses {
                    execute_cached(tx,
                        "INSERT INTO private_key_addresses (private_key_id, organization_id, address) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                        params![k.id, k.organization_id, a.address],
                    )
                    .map_err(backend)?;
                }
            }
        }
        Write::SetCertificate { kind, id, certificate } => {
            let sql = match kind {
                CredentialKind::ApiKey => "UPDATE api_keys SET certificate = ?2 WHERE id = ?1",
                CredentialKind::Authenticator => "UPDATE authenticators SET certificate = ?2 WHERE id = ?1",
            };
            if execute_cached(tx, sql, params![id, certificate]).map_err(backend)? != 1 {
                return Err(StoreError::NotFound);
            }
        }
        Write::MarkWalletExported(id) => {
            execute_cached(tx, "UPDATE wallets SET exported = 1, updated_at = ?2 WHERE id = ?1", params![id, now])
                .map_err(backend)?;
        }
        Write::MarkPrivateKeyExported(id) => {
            execute_cached(tx, "UPDATE private_keys SET exported = 1, updated_at = ?2 WHERE id = ?1", params![id, now])
                .map_err(backend)?;
        }
        Write::MarkAccountExported(id) => {
            execute_cached(
                tx,
                "UPDATE wallet_accounts SET exported = 1, updated_at = ?2 WHERE id = ?1",
                params![id, now],
            )
            .map_err(backend)?;
        }
        Write::DeleteWallets { ids, require_exported } => {
            for id in ids {
                let exported: Option<i64> = tx
                    .query_row("SELECT exported FROM wallets WHERE id = ?1", params![id], |r| r.get(0))
                    .optional()
                    .map_err(backend)?;
                match exported {
                    None => return Err(StoreError::Conflict(format!("wallet not found: {id}"))),
                    Some(0) if *require_exported => {
                        return Err(StoreError::Conflict(format!(
                            "wallet account has not been exported: wallet {id} was never exported; pass deleteWithoutExport: true to delete it anyway"
                        )))
                    }
                    Some(_) => {}
                }
                execute_cached(tx, "DELETE FROM wallet_accounts WHERE wallet_id = ?1", params![id]).map_err(backend)?;
                execute_cached(tx, "DELETE FROM wallets WHERE id = ?1", params![id]).map_err(backend)?;
            }
        }
        Write::DeletePrivateKeys { ids, require_exported } => {
            for id in ids {
                let exported: Option<i64> = tx
                    .query_row("SELECT exported FROM private_keys WHERE id = ?1", params![id], |r| r.get(0))
                    .optional()
                    .map_err(backend)?;
                match exported {
                    None => return Err(StoreError::Conflict(format!("private key not found: {id}"))),
                    Some(0) if *require_exported => {
                        return Err(StoreError::Conflict(format!(
                            "wallet account has not been exported: private key {id} was never exported; pass deleteWithoutExport: true to delete it anyway"
                        )))
                    }
                    Some(_) => {}
                }
                execute_cached(tx, "DELETE FROM private_key_addresses WHERE private_key_id = ?1", params![id])
                    .map_err(backend)?;
                execute_cached(tx, "DELETE FROM private_keys WHERE id = ?1", params![id]).map_err(backend)?;
            }
        }
        Write::PutRecord(r) => {
            execute_cached(tx,
                "INSERT INTO records (organization_id, kind, id, name, data, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (organization_id, kind, id) DO UPDATE SET name = excluded.name, data = excluded.data, updated_at = excluded.updated_at",
                params![r.organization_id, r.kind, r.id, r.name, json_text(&r.data), r.created_at, r.updated_at],
            )
            .map_err(|e| match backend(e) {
                StoreError::Unique(_) => StoreError::Unique(format!("{} name must be unique: {:?}", r.kind, r.name)),
                other => other,
            })?;
        }
        Write::DeleteRecords { organization_id, kind, ids } => {
            for id in ids {
                let n = tx
                    .execute(
                        "DELETE FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
                        params![organization_id, kind, id],
                    )
                    .map_err(backend)?;
                if n != 1 {
                    return Err(StoreError::Conflict(format!("{kind} not found: {id}")));
                }
            }
        }
        // <users, api keys and tags>
        Write::UpdateUser { organization_id, id, name, email, phone_number, tag_ids, updated_at } => {
            let n = tx
                .execute(
                    "UPDATE users SET name = COALESCE(?3, name),
                        email = CASE WHEN ?4 IS NULL THEN email WHEN ?4 = '' THEN NULL ELSE ?4 END,
                        phone_number = CASE WHEN ?5 IS NULL THEN phone_number WHEN ?5 = '' THEN NULL ELSE ?5 END,
                        updated_at = ?6
                     WHERE organization_id = ?1 AND id = ?2",
                    params![organization_id, id, name, email, phone_number, updated_at],
                )
                .map_err(backend)?;
            if n != 1 {
                return Err(StoreError::Conflict(format!("user not found: {id}")));
            }
            if let Some(tags) = tag_ids {
                execute_cached(tx, "DELETE FROM user_tags WHERE user_id = ?1", params![id]).map_err(backend)?;
                for tag in tags {
                    let found = tx
                        .query_row(
                            "SELECT 1 FROM records WHERE organization_id = ?1 AND kind = 'user_tag' AND id = ?2",
                            params![organization_id, tag],
                            |_| Ok(()),
                        )
                        .optional()
                        .map_err(backend)?;
                    if found.is_none() {
                        return Err(StoreError::Conflict(format!("user tag not found: {tag}")));
                    }
                    execute_cached(tx,
                        "INSERT INTO user_tags (organization_id, tag_id, user_id) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                        params![organization_id, tag, id],
                    )
                    .map_err(backend)?;
                }
            }
        }
        Write::DeleteUsers { organization_id, ids } => {
            let roots: Option<String> = tx
                .query_row("SELECT root_user_ids FROM organizations WHERE id = ?1", params![organization_id], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(backend)?;
            let roots: Vec<String> = roots.map(parse_json).unwrap_or_default();
            for id in ids {
                if roots.contains(id) {
                    return Err(StoreError::Conflict(format!("cannot delete a root quorum member: {id}")));
                }
                execute_cached(
                    tx,
                    "DELETE FROM import_targets WHERE organization_id = ?1 AND user_id = ?2",
                    params![organization_id, id],
                )
                .map_err(backend)?;
                // API keys and tag memberships go with the user (ON DELETE CASCADE).
                let n = tx
                    .execute("DELETE FROM users WHERE organization_id = ?1 AND id = ?2", params![organization_id, id])
                    .map_err(backend)?;
                if n != 1 {
                    return Err(StoreError::Conflict(format!("user not found: {id}")));
                }
            }
        }
        Write::DeleteApiKeys { organization_id, user_id, ids } => {
            for id in ids {
                let n = tx
                    .execute(
                        "DELETE FROM api_keys WHERE organization_id = ?1 AND user_id = ?2 AND id = ?3",
                        params![organization_id, user_id, id],
                    )
                    .map_err(backend)?;
                if n != 1 {
                    return Err(StoreError::Conflict(format!("api key not found for user {user_id}: {id}")));
                }
            }
        }
        Write::UpdateTag { organization_id, kind, id, new_name, add, remove, updated_at } => {
            let label = kind.replace('_', " ");
            let found = tx
                .query_row(
                    "SELECT 1 FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
                    params![organization_id, kind, id],
                    |_| Ok(()),
                )
                .optional()
                .map_err(backend)?;
            if found.is_none() {
                return Err(StoreError::Conflict(format!("{label} not found: {id}")));
            }
            let changes = add.iter().map(|m| (m, true)).chain(remove.iter().map(|m| (m, false)));
            match kind.as_str() {
                "user_tag" => {
                    for (user, adding) in changes {
                        let exists = tx
                            .query_row(
                                "SELECT 1 FROM users WHERE organization_id = ?1 AND id = ?2",
                                params![organization_id, user],
                                |_| Ok(()),
                            )
                            .optional()
                            .map_err(backend)?;
                        if exists.is_none() {
                            return Err(StoreError::Conflict(format!("user not found: {user}")));
                        }
                        let sql = if adding {
                            "INSERT INTO user_tags (organization_id, tag_id, user_id) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING"
                        } else {
                            "DELETE FROM user_tags WHERE organization_id = ?1 AND tag_id = ?2 AND user_id = ?3"
                        };
                        execute_cached(tx, sql, params![organization_id, id, user]).map_err(backend)?;
                    }
                }
                "private_key_tag" => {
                    for (key, adding) in changes {
                        let tags: Option<String> = tx
                            .query_row(
                                "SELECT tags FROM private_keys WHERE organization_id = ?1 AND id = ?2",
                                params![organization_id, key],
                                |r| r.get(0),
                            )
                            .optional()
                            .map_err(backend)?;
                        let Some(tags) = tags else {
                            return Err(StoreError::Conflict(format!("private key not found: {key}")));
                        };
                        let mut tags: Vec<String> = parse_json(tags);
                        tags.retain(|t| t != id);
                        if adding {
                            tags.push(id.clone());
                        }
                        execute_cached(
                            tx,
                            "UPDATE private_keys SET tags = ?3 WHERE organization_id = ?1 AND id = ?2",
                            params![organization_id, key, json_text(&tags)],
                        )
                        .map_err(backend)?;
                    }
                }
                other => return Err(StoreError::Conflict(format!("not a tag kind: {other}"))),
            }
            // Renamed last: a name clash rolls back the membership changes above with it.
            execute_cached(tx,
                "UPDATE records SET name = COALESCE(?4, name), updated_at = ?5 WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
                params![organization_id, kind, id, new_name, updated_at],
            )
            .map_err(|e| match backend(e) {
                StoreError::Unique(_) => {
                    StoreError::Unique(format!("{label} name must be unique: {:?}", new_name.as_deref().unwrap_or("")))
                }
                other => other,
            })?;
        }
        Write::DeleteTags { organization_id, kind, ids } => {
            if kind == "private_key_tag" {
                let keys: Vec<(String, String)> = tx
                    .prepare("SELECT id, tags FROM private_keys WHERE organization_id = ?1")
                    .and_then(|mut st| {
                        st.query_map(params![organization_id], |r| Ok((r.get(0)?, r.get(1)?)))?.collect()
                    })
                    .map_err(backend)?;
                for (key, tags) in keys {
                    let tags: Vec<String> = parse_json(tags);
                    if tags.iter().any(|t| ids.contains(t)) {
                        let kept: Vec<&String> = tags.iter().filter(|t| !ids.contains(t)).collect();
                        execute_cached(
                            tx,
                            "UPDATE private_keys SET tags = ?2 WHERE id = ?1",
                            params![key, json_text(&kept)],
                        )
                        .map_err(backend)?;
                    }
                }
            }
            for id in ids {
                if kind == "user_tag" {
                    execute_cached(
                        tx,
                        "DELETE FROM user_tags WHERE organization_id = ?1 AND tag_id = ?2",
                        params![organization_id, id],
                    )
                    .map_err(backend)?;
                }
                let n = tx
                    .execute(
                        "DELETE FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
                        params![organization_id, kind, id],
                    )
                    .map_err(backend)?;
                if n != 1 {
                    return Err(StoreError::Conflict(format!("{} not found: {id}", kind.replace('_', " "))));
                }
            }
        }
        // <passkeys and oauth providers>
        Write::InsertAuthenticators(list) => {
            for a in list {
                execute_cached(tx,
                    &format!("INSERT INTO authenticators ({AUTHENTICATOR_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"),
                    params![
                        a.id, a.organization_id, a.user_id, a.name, a.credential_id, a.public_key, a.attestation_type,
                        a.aaguid, json_text(&a.transports), a.sign_count, a.created_at, a.updated_at, a.certificate
                    ],
                )
                .map_err(|e| match backend(e) {
                    StoreError::Unique(_) => StoreError::Unique(format!(
                        "an authenticator with credential ID {} already exists in the organization",
                        a.credential_id
                    )),
                    other => other,
                })?;
            }
        }
        Write::DeleteAuthenticators { organization_id, user_id, ids } => {
            for id in ids {
                let n = tx
                    .execute(
                        "DELETE FROM authenticators WHERE organization_id = ?1 AND user_id = ?2 AND id = ?3",
                        params![organization_id, user_id, id],
                    )
                    .map_err(backend)?;
                if n != 1 {
                    return Err(StoreError::Conflict(format!("authenticator not found for user {user_id}: {id}")));
                }
            }
        }
        Write::InsertOauthProviders(list) => {
            for p in list {
                execute_cached(tx,
                    &format!("INSERT INTO oauth_providers ({OAUTH_PROVIDER_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"),
                    params![
                        p.id, p.organization_id, p.user_id, p.name, p.issuer, p.audience, p.subject, p.created_at,
                        p.updated_at
                    ],
                )
                .map_err(|e| match backend(e) {
                    StoreError::Unique(_) => StoreError::Unique("oauth provider already exists".into()),
                    other => other,
                })?;
            }
        }
        Write::DeleteOauthProviders { organization_id, user_id, ids } => {
            for id in ids {
                let n = tx
                    .execute(
                        "DELETE FROM oauth_providers WHERE organization_id = ?1 AND user_id = ?2 AND id = ?3",
                        params![organization_id, user_id, id],
                    )
                    .map_err(backend)?;
                if n != 1 {
                    return Err(StoreError::Conflict(format!("oauth provider not found for user {user_id}: {id}")));
                }
            }
        }
        // <policies, contract interfaces, organization features and root quorum>
        Write::PutRecordChecked { record: r, unique_message, must_exist } => {
            // Update-then-insert rather than ON CONFLICT: scoped to the organization whatever the
            // table's key is, so another organization's record with the same id is never touched.
            let name_taken = |e: rusqlite::Error| match backend(e) {
                StoreError::Unique(m) if m.contains("records.name") => StoreError::Unique(unique_message.clone()),
                StoreError::Unique(_) => {
                    StoreError::Conflict(format!("{} id {} is already in use by another organization", r.kind, r.id))
                }
                other => other,
            };
            let n = tx
                .execute(
                    "UPDATE records SET name = ?4, data = ?5, updated_at = ?6 WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
                    params![r.organization_id, r.kind, r.id, r.name, json_text(&r.data), r.updated_at],
                )
                .map_err(name_taken)?;
            if n == 0 {
                if *must_exist {
                    return Err(StoreError::Conflict(format!("{} not found: {}", r.kind.replace('_', " "), r.id)));
                }
                execute_cached(tx,
                    "INSERT INTO records (organization_id, kind, id, name, data, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![r.organization_id, r.kind, r.id, r.name, json_text(&r.data), r.created_at, r.updated_at],
                )
                .map_err(name_taken)?;
            }
        }
        Write::SetRootQuorum { organization_id, threshold, user_ids, updated_at } => {
            for user in user_ids {
                let found: Option<i64> = tx
                    .query_row(
                        "SELECT 1 FROM users WHERE organization_id = ?1 AND id = ?2",
                        params![organization_id, user],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(backend)?;
                if found.is_none() {
                    return Err(StoreError::Conflict(format!("user not found: {user}")));
                }
            }
            let n = tx
                .execute(
                    "UPDATE organizations SET root_quorum_threshold = ?2, root_user_ids = ?3, updated_at = ?4 WHERE id = ?1",
                    params![organization_id, threshold, json_text(user_ids), updated_at],
                )
                .map_err(backend)?;
            if n != 1 {
                return Err(StoreError::Conflict(format!("organization not found: {organization_id}")));
            }
        }
        // <tvc apps and deployments>
        Write::RequireRecordSet { organization_id, kind, key, value, ids } => {
            let mut stmt = tx
                .prepare_cached("SELECT id, data FROM records WHERE organization_id = ?1 AND kind = ?2")
                .map_err(backend)?;
            let rows = stmt
                .query_map(params![organization_id, kind], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
                .map_err(backend)?;
            let mut found = std::collections::BTreeSet::new();
            for row in rows {
                let (id, data) = row.map_err(backend)?;
                let data: serde_json::Value = parse_json(data);
                if data.get(key).and_then(serde_json::Value::as_str) == Some(value.as_str()) {
                    found.insert(id);
                }
            }
            if found != ids.iter().cloned().collect() {
                return Err(StoreError::Conflict(format!(
                    "{} records changed while this activity ran; retry",
                    kind.replace('_', " ")
                )));
            }
        }
        // <sub-organizations>
        Write::DeleteSubOrganization { organization_id, parent_id, activity_id, require_exported, deleted_at } => {
            let parent: Option<Option<String>> = tx
                .query_row(
                    "SELECT parent_id FROM organizations WHERE id = ?1 AND deleted_at IS NULL",
                    params![organization_id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(backend)?;
            match parent {
                None => return Err(StoreError::Conflict(format!("organization not found: {organization_id}"))),
                Some(p) if p.as_deref() != Some(parent_id.as_str()) => {
                    return Err(StoreError::Conflict(format!(
                        "organization {organization_id} is not a sub-organization of {parent_id}"
                    )))
                }
                Some(_) => {}
            }
            if *require_exported {
                let unexported: Option<String> = tx
                    .query_row(
                        "SELECT 'wallet ' || id FROM wallets WHERE organization_id = ?1 AND exported = 0
                         UNION ALL SELECT 'private key ' || id FROM private_keys WHERE organization_id = ?1 AND exported = 0
                         LIMIT 1",
                        params![organization_id],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(backend)?;
                if let Some(what) = unexported {
                    return Err(StoreError::Conflict(format!(
                        "wallet account has not been exported: {what} was never exported; pass deleteWithoutExport: true to delete the sub-organization anyway"
                    )));
                }
            }
            for table in PURGED_ON_DELETION {
                if *table == "webhook_deliveries" {
                    execute_cached(
                        tx,
                        "DELETE FROM webhook_attempts WHERE delivery_id IN
                         (SELECT id FROM webhook_deliveries WHERE organization_id = ?1)",
                        params![organization_id],
                    )
                    .map_err(backend)?;
                }
                execute_cached(
                    tx,
                    &format!("DELETE FROM {table} WHERE organization_id = ?1"),
                    params![organization_id],
                )
                .map_err(backend)?;
            }
            execute_cached(
                tx,
                "UPDATE organizations SET deleted_at = ?2, deletion_activity_id = ?3, root_user_ids = '[]', updated_at = ?2
                 WHERE id = ?1",
                params![organization_id, deleted_at, activity_id],
            )
            .map_err(backend)?;
        }
        Write::UpdateConsensusActivity {
            organization_id,
            id,
            expected_votes,
            status,
            result,
            votes,
            failure,
            updated_at,
        } => {
            let n = tx
                .execute(
                    "UPDATE activities SET status = ?1, result = ?2, votes = ?3, failure = ?4, updated_at = ?5
                     WHERE id = ?6 AND organization_id = ?7 AND status = 'ACTIVITY_STATUS_CONSENSUS_NEEDED'
                       AND json_array_length(votes) = ?8",
                    params![
                        status,
                        json_text(result),
                        json_text(votes),
                        failure.as_ref().map(json_text),
                        updated_at,
                        id,
                        organization_id,
                        *expected_votes as i64
                    ],
                )
                .map_err(backend)?;
            if n != 1 {
                return Err(StoreError::Conflict(CONSENSUS_MOVED.into()));
            }
            // An approved deletion of this organization: its record goes to the parent's log.
            let parent: Option<String> = tx
                .query_row(
                    "SELECT parent_id FROM organizations WHERE id = ?1 AND deletion_activity_id = ?2",
                    params![organization_id, id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(backend)?;
            if let Some(parent) = parent {
                execute_cached(tx, "UPDATE activities SET organization_id = ?1 WHERE id = ?2", params![parent, id])
                    .map_err(backend)?;
            }
        }
        Write::InsertPolicyEvaluation(e) => {
            execute_cached(
                tx,
                "INSERT INTO policy_evaluations (id, activity_id, organization_id, vote_id, evaluations, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![e.id, e.activity_id, e.organization_id, e.vote_id, json_text(&e.evaluations), e.created_at],
            )
            .map_err(backend)?;
        }
        Write::InsertIdempotencyKey { organization_id, key, intent_hash, activity_id, created_at } => {
            execute_cached(
                tx,
                "INSERT INTO idempotency_keys (organization_id, key, intent_hash, activity_id, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![organization_id, key, intent_hash, activity_id, created_at],
            )
            .map_err(backend)?;
        }
        Write::EnqueueWebhookDelivery(d) => {
            execute_cached(
                tx,
                &format!("INSERT INTO webhook_deliveries ({DELIVERY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"),
                params![
                    d.id,
                    d.organization_id,
                    d.endpoint_id,
                    d.activity_organization_id,
                    d.activity_id,
                    d.event_type,
                    d.body,
                    d.status,
                    d.attempts,
                    d.next_attempt_at,
                    d.last_status_code,
                    d.last_error,
                    d.created_at,
                    d.updated_at
                ],
            )
            .map_err(backend)?;
        }
        Write::DropWebhookDeliveries { organization_id, endpoint_id } => {
            execute_cached(
                tx,
                "DELETE FROM webhook_deliveries WHERE organization_id = ?1 AND endpoint_id = ?2 AND status = 'PENDING'",
                params![organization_id, endpoint_id],
            )
            .map_err(backend)?;
        }
        Write::PutImportTarget(t) => {
            execute_cached(tx,
                "INSERT INTO import_targets (organization_id, user_id, sealed_key, created_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (organization_id, user_id) DO UPDATE SET sealed_key = excluded.sealed_key, created_at = excluded.created_at",
                params![t.organization_id, t.user_id, t.sealed_key, t.created_at],
            )
            .map_err(backend)?;
        }
        Write::TakeImportTarget { organization_id, user_id, sealed_key } => {
            let n = tx
                .execute(
                    "DELETE FROM import_targets WHERE organization_id = ?1 AND user_id = ?2 AND sealed_key = ?3",
                    params![organization_id, user_id, sealed_key],
                )
                .map_err(backend)?;
            if n != 1 {
                return Err(StoreError::Conflict(
                    "import target was already used or replaced: call init_import again".into(),
                ));
            }
        }
    }
    Ok(())
}

impl Store for SqliteStore {
    fn commit(&self, a: &ActivityRecord, writes: &[Write]) -> Result<Committed, StoreError> {
        let (reply, outcome) = mpsc::sync_channel(1);
        self.commit_then(
            a.clone(),
            writes.to_vec(),
            Box::new(move |r| {
                let _ = reply.send(r);
            }),
        );
        outcome.recv().map_err(|_| StoreError::Backend("committer thread stopped".into()))?
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

    fn apply(&self, writes: &[Write]) -> Result<(), StoreError> {
        if nowait::active() {
            return Err(nowait::give_up());
        }
        let mut conn = self.writer.lock().map_err(|_| StoreError::Backend("writer lock poisoned".into()))?;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(backend)?;
        for w in writes {
            apply_write(&tx, w)?;
        }
        tx.commit().map_err(backend)
    }

    fn organization(&self, id: &str) -> Result<Organization, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!("SELECT {ORG_COLS} FROM organizations WHERE id = ?1 AND deleted_at IS NULL"),
                params![id],
                org_row,
            )
            .optional()
        })
    }

    fn deleted_organization(&self, id: &str) -> Result<Organization, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!("SELECT {ORG_COLS} FROM organizations WHERE id = ?1 AND deleted_at IS NOT NULL"),
                params![id],
                org_row,
            )
            .optional()
        })
    }

    fn api_key_by_public_key(&self, org: &str, public_key: &str) -> Result<ApiKey, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!("SELECT {API_KEY_COLS} FROM api_keys WHERE organization_id = ?1 AND public_key = ?2"),
                params![org, public_key],
                api_key_row,
            )
            .optional()
        })
    }

    fn user(&self, org: &str, id: &str) -> Result<User, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!("SELECT {USER_COLS} FROM users WHERE organization_id = ?1 AND id = ?2"),
                params![org, id],
                user_row,
            )
            .optional()
        })
    }

    fn names_in_use(&self, org: &str, kind: Named, names: &[&str]) -> Result<Vec<String>, StoreError> {
        let sql = match kind {
            Named::Wallet => "SELECT name FROM wallets WHERE organization_id = ?1 AND name = ?2",
            Named::PrivateKey => "SELECT name FROM private_keys WHERE organization_id = ?1 AND name = ?2",
        };
        self.read(|c| {
            let mut taken = Vec::new();
            for name in names {
                if let Some(n) = query_row_cached(c, sql, params![org, name], |r| r.get(0)).optional()? {
                    taken.push(n);
                }
            }
            Ok(taken)
        })
    }

    fn users_page(&self, org: &str, page: &Page) -> Result<Vec<User>, StoreError> {
        self.read(|c| {
            keyset_page(
                c,
                Listing {
                    table: "users",
                    cols: USER_COLS,
                    scope: "organization_id = ?",
                    args: &[org],
                    order: &["created_at", "id"],
                },
                page,
                user_row,
            )
        })
    }

    fn api_keys_of_user(&self, org: &str, user_id: &str) -> Result<Vec<ApiKey>, StoreError> {
        self.read(|c| {
            c.prepare_cached(&format!(
                "SELECT {API_KEY_COLS} FROM api_keys WHERE organization_id = ?1 AND user_id = ?2 ORDER BY created_at, id"
            ))?
            .query_map(params![org, user_id], api_key_row)?
            .collect()
        })
    }

    fn wallet(&self, org: &str, id: &str) -> Result<Wallet, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!("SELECT {WALLET_COLS} FROM wallets WHERE organization_id = ?1 AND id = ?2"),
                params![org, id],
                wallet_row,
            )
            .optional()
        })
    }

    fn wallets_page(&self, org: &str, page: &Page) -> Result<Vec<Wallet>, StoreError> {
        self.read(|c| {
            keyset_page(
                c,
                Listing {
                    table: "wallets",
                    cols: WALLET_COLS,
                    scope: "organization_id = ?",
                    args: &[org],
                    order: &["created_at", "id"],
                },
                page,
                wallet_row,
            )
        })
    }

    fn accounts_page(&self, org: &str, wallet_id: Option<&str>, page: &Page) -> Result<Vec<WalletAccount>, StoreError> {
        self.read(|c| match wallet_id {
            Some(w) => keyset_page(
                c,
                Listing {
                    table: "wallet_accounts",
                    cols: ACCOUNT_COLS,
                    scope: "organization_id = ? AND wallet_id = ?",
                    args: &[org, w],
                    order: &["seq"],
                },
                page,
                account_row,
            ),
            None => keyset_page(
                c,
                Listing {
                    table: "wallet_accounts",
                    cols: ACCOUNT_COLS,
                    scope: "organization_id = ?",
                    args: &[org],
                    order: &["created_at", "wallet_id", "seq"],
                },
                page,
                account_row,
            ),
        })
    }

    fn account_by_address(&self, org: &str, address: &str) -> Result<WalletAccount, StoreError> {
        self.one(|c| {
            query_row_cached(c,
                &format!("SELECT {ACCOUNT_COLS} FROM wallet_accounts WHERE organization_id = ?1 AND address = ?2 ORDER BY created_at LIMIT 1"),
                params![org, address],
                account_row,
            )
            .optional()
        })
    }

    fn private_key(&self, org: &str, id: &str) -> Result<PrivateKey, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!("SELECT {PRIVATE_KEY_COLS} FROM private_keys WHERE organization_id = ?1 AND id = ?2"),
                params![org, id],
                private_key_row,
            )
            .optional()
        })
    }

    fn private_keys_page(&self, org: &str, page: &Page) -> Result<Vec<PrivateKey>, StoreError> {
        self.read(|c| {
            let order = &["created_at", "id"];
            keyset_page(
                c,
                Listing {
                    table: "private_keys",
                    cols: PRIVATE_KEY_COLS,
                    scope: "organization_id = ?",
                    args: &[org],
                    order,
                },
                page,
                private_key_row,
            )
        })
    }

    fn private_key_by_address(&self, org: &str, address: &str) -> Result<PrivateKey, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!(
                    "SELECT {} FROM private_keys k JOIN private_key_addresses a ON a.private_key_id = k.id
                     WHERE a.organization_id = ?1 AND a.address = ?2 ORDER BY k.created_at LIMIT 1",
                    PRIVATE_KEY_COLS.split(", ").map(|c| format!("k.{c}")).collect::<Vec<_>>().join(", ")
                ),
                params![org, address],
                private_key_row,
            )
            .optional()
        })
    }

    fn import_target(&self, org: &str, user_id: &str) -> Result<ImportTarget, StoreError> {
        self.one(|c| {
            query_row_cached(c,
                "SELECT organization_id, user_id, sealed_key, created_at FROM import_targets WHERE organization_id = ?1 AND user_id = ?2",
                params![org, user_id],
                |r| Ok(ImportTarget { organization_id: r.get(0)?, user_id: r.get(1)?, sealed_key: r.get(2)?, created_at: r.get(3)? }),
            )
            .optional()
        })
    }

    fn activity(&self, org: &str, id: &str) -> Result<ActivityRecord, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!("SELECT {ACTIVITY_COLS} FROM activities WHERE organization_id = ?1 AND id = ?2"),
                params![org, id],
                activity_row,
            )
            .optional()
        })
    }

    fn activity_by_fingerprint(&self, fingerprint: &str) -> Result<ActivityRecord, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!("SELECT {ACTIVITY_COLS} FROM activities WHERE fingerprint = ?1"),
                params![fingerprint],
                activity_row,
            )
            .optional()
        })
    }

    /// Newest first; `after` = older than the cursor, `before` = the page just newer than the
    /// cursor (an unknown cursor is ignored). Filters, cursors and the limit are all applied in
    /// SQL over the (organization, created_at, id) index: one page reads one page of rows.
    fn activities(&self, org: &str, f: &ActivityFilter) -> Result<Vec<ActivityRecord>, StoreError> {
        use rusqlite::types::Value as Sql;
        self.read(|c| {
            let cursor = |id: &Option<String>| -> rusqlite::Result<Option<(i64, String)>> {
                let Some(id) = id else { return Ok(None) };
                query_row_cached(
                    c,
                    "SELECT created_at, id FROM activities WHERE organization_id = ?1 AND id = ?2",
                    params![org, id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
            };
            let (after, before) = (cursor(&f.after)?, cursor(&f.before)?);
            let mut sql = format!("SELECT {ACTIVITY_COLS} FROM activities WHERE organization_id = ?");
            let mut args: Vec<Sql> = vec![Sql::Text(org.to_string())];
            for (column, values) in [("status", &f.statuses), ("activity_type", &f.types)] {
                if !values.is_empty() {
                    sql.push_str(&format!(" AND {column} IN ({})", vec!["?"; values.len()].join(", ")));
                    args.extend(values.iter().map(|v| Sql::Text(v.clone())));
                }
            }
            if let Some((at, id)) = &after {
                sql.push_str(" AND (created_at < ? OR (created_at = ? AND id < ?))");
                args.extend([Sql::Integer(*at), Sql::Integer(*at), Sql::Text(id.clone())]);
            }
            if let Some((at, id)) = &before {
                sql.push_str(" AND (created_at > ? OR (created_at = ? AND id > ?))");
                args.extend([Sql::Integer(*at), Sql::Integer(*at), Sql::Text(id.clone())]);
            }
            // Before a cursor: the rows just newer than it, read upwards and turned around.
            let order = if before.is_some() { "ASC" } else { "DESC" };
            sql.push_str(&format!(" ORDER BY created_at {order}, id {order} LIMIT ?"));
            args.push(Sql::Integer(f.limit.min(i64::MAX as usize) as i64));
            let mut items: Vec<ActivityRecord> = c
                .prepare_cached(&sql)?
                .query_map(rusqlite::params_from_iter(args), activity_row)?
                .collect::<rusqlite::Result<_>>()?;
            if before.is_some() {
                items.reverse();
            }
            Ok(items)
        })
    }

    fn record(&self, org: &str, kind: &str, id: &str) -> Result<Record, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!("SELECT {RECORD_COLS} FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3"),
                params![org, kind, id],
                record_row,
            )
            .optional()
        })
    }

    fn records_page(&self, org: &str, kind: &str, page: &Page) -> Result<Vec<Record>, StoreError> {
        self.read(|c| {
            let scope = "organization_id = ? AND kind = ?";
            keyset_page(
                c,
                Listing {
                    table: "records",
                    cols: RECORD_COLS,
                    scope,
                    args: &[org, kind],
                    order: &["created_at", "id"],
                },
                page,
                record_row,
            )
        })
    }

    fn records_version(&self, org: &str, kind: &str) -> Result<(i64, i64), StoreError> {
        self.read(|c| {
            query_row_cached(
                c,
                "SELECT COUNT(*), COALESCE(MAX(updated_at), 0) FROM records WHERE organization_id = ?1 AND kind = ?2",
                params![org, kind],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
    }

    fn ping(&self) -> Result<(), StoreError> {
        self.read(|c| query_row_cached(c, "SELECT 1", [], |r| r.get::<_, i64>(0)).map(|_| ()))
    }

    // <users, api keys and tags>
    fn api_key(&self, org: &str, id: &str) -> Result<ApiKey, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!("SELECT {API_KEY_COLS} FROM api_keys WHERE organization_id = ?1 AND id = ?2"),
                params![org, id],
                api_key_row,
            )
            .optional()
        })
    }

    fn api_keys_page(&self, org: &str, page: &Page) -> Result<Vec<ApiKey>, StoreError> {
        self.read(|c| {
            keyset_page(
                c,
                Listing {
                    table: "api_keys",
                    cols: API_KEY_COLS,
                    scope: "organization_id = ?",
                    args: &[org],
                    order: &["created_at", "id"],
                },
                page,
                api_key_row,
            )
        })
    }

    fn uncertified_credentials(&self) -> Result<Vec<UncertifiedCredential>, StoreError> {
        let mut out: Vec<UncertifiedCredential> = self.read(|c| {
            c.prepare(
                "SELECT id, organization_id, user_id, credential_type, public_key, expiration_seconds, created_at
                 FROM api_keys WHERE length(certificate) = 0 ORDER BY created_at, id",
            )?
            .query_map([], |r| {
                let expiration: Option<i64> = r.get(5)?;
                let created_at: i64 = r.get(6)?;
                Ok(UncertifiedCredential {
                    kind: CredentialKind::ApiKey,
                    id: r.get(0)?,
                    organization_id: r.get(1)?,
                    user_id: r.get(2)?,
                    credential_type: r.get(3)?,
                    public_key: r.get(4)?,
                    expires_at_ms: expiration
                        .map_or(0, |e| (created_at / 1_000_000).saturating_add(e.saturating_mul(1000)).max(1) as u64),
                })
            })?
            .collect()
        })?;
        let passkeys: Vec<UncertifiedCredential> = self.read(|c| {
            c.prepare(
                "SELECT id, organization_id, user_id, public_key FROM authenticators
                 WHERE length(certificate) = 0 ORDER BY created_at, id",
            )?
            .query_map([], |r| {
                Ok(UncertifiedCredential {
                    kind: CredentialKind::Authenticator,
                    id: r.get(0)?,
                    organization_id: r.get(1)?,
                    user_id: r.get(2)?,
                    credential_type: coffer_auth::webauthn::CREDENTIAL_TYPE.to_string(),
                    public_key: r.get(3)?,
                    expires_at_ms: 0,
                })
            })?
            .collect()
        })?;
        out.extend(passkeys);
        Ok(out)
    }

    fn user_tag_members(&self, org: &str) -> Result<Vec<(String, String)>, StoreError> {
        self.read(|c| {
            c.prepare_cached(
                "SELECT m.tag_id, m.user_id FROM user_tags m JOIN records r ON r.kind = m.tag_kind AND r.id = m.tag_id
                 WHERE m.organization_id = ?1 ORDER BY r.created_at, r.id, m.user_id",
            )?
            .query_map(params![org], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
        })
    }

    fn user_tags_of(&self, org: &str, user_id: &str) -> Result<Vec<String>, StoreError> {
        self.read(|c| {
            c.prepare_cached(
                "SELECT m.tag_id FROM user_tags m JOIN records r ON r.organization_id = m.organization_id
                   AND r.kind = m.tag_kind AND r.id = m.tag_id
                 WHERE m.user_id = ?2 AND m.organization_id = ?1 ORDER BY r.created_at, r.id",
            )?
            .query_map(params![org, user_id], |r| r.get(0))?
            .collect()
        })
    }

    // <passkeys and oauth providers>
    fn authenticator(&self, org: &str, id: &str) -> Result<AuthenticatorRecord, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!("SELECT {AUTHENTICATOR_COLS} FROM authenticators WHERE organization_id = ?1 AND id = ?2"),
                params![org, id],
                authenticator_row,
            )
            .optional()
        })
    }

    fn authenticator_by_credential_id(
        &self,
        org: &str,
        credential_id: &str,
    ) -> Result<AuthenticatorRecord, StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                &format!(
                    "SELECT {AUTHENTICATOR_COLS} FROM authenticators WHERE organization_id = ?1 AND credential_id = ?2"
                ),
                params![org, credential_id],
                authenticator_row,
            )
            .optional()
        })
    }

    fn authenticators_of_user(&self, org: &str, user_id: &str) -> Result<Vec<AuthenticatorRecord>, StoreError> {
        self.read(|c| {
            c.prepare_cached(&format!(
                "SELECT {AUTHENTICATOR_COLS} FROM authenticators WHERE organization_id = ?1 AND user_id = ?2 ORDER BY created_at, id"
            ))?
            .query_map(params![org, user_id], authenticator_row)?
            .collect()
        })
    }

    fn oauth_providers(&self, org: &str, user_id: Option<&str>) -> Result<Vec<OauthProviderRecord>, StoreError> {
        self.read(|c| {
            c.prepare_cached(&format!(
                "SELECT {OAUTH_PROVIDER_COLS} FROM oauth_providers WHERE organization_id = ?1 AND (?2 IS NULL OR user_id = ?2)
                 ORDER BY created_at, id"
            ))?
            .query_map(params![org, user_id], oauth_provider_row)?
            .collect()
        })
    }

    // <sub-organizations>
    fn sub_organization_ids(
        &self,
        parent: &str,
        filter: &SubOrgFilter,
        page: &Page,
    ) -> Result<Vec<String>, StoreError> {
        // ?1 parent, ?2..?4 the filter's values, ?5 the `after` cursor, ?6 `before`, ?7 limit.
        let (cond, values): (&str, [&str; 3]) = match filter {
            SubOrgFilter::All => ("", ["", "", ""]),
            SubOrgFilter::Name(v) => ("AND o.name = ?2", [v, "", ""]),
            SubOrgFilter::Username(v) => ("AND o.id IN (SELECT organization_id FROM users WHERE name = ?2)", [v, "", ""]),
            SubOrgFilter::Email(v) => {
                ("AND o.id IN (SELECT organization_id FROM users WHERE lower(email) = lower(?2))", [v, "", ""])
            }
            SubOrgFilter::PhoneNumber(v) => {
                ("AND o.id IN (SELECT organization_id FROM users WHERE phone_number = ?2)", [v, "", ""])
            }
            SubOrgFilter::CredentialId(v) => {
                ("AND o.id IN (SELECT organization_id FROM authenticators WHERE credential_id = ?2)", [v, "", ""])
            }
            SubOrgFilter::PublicKey(v) => (
                "AND (o.id IN (SELECT organization_id FROM api_keys WHERE public_key = ?2)
                      OR o.id IN (SELECT organization_id FROM authenticators WHERE public_key = ?2))",
                [v, "", ""],
            ),
            SubOrgFilter::WalletAccountAddress(v) => {
                let hex = v.len() > 2
                    && (v.starts_with("0x") || v.starts_with("0X"))
                    && v[2..].bytes().all(|b| b.is_ascii_hexdigit());
                (
                    "AND o.id IN (SELECT organization_id FROM wallet_accounts
                                  WHERE lower(address) = lower(?2) AND (?3 = 'any case' OR address = ?2))",
                    [v, if hex { "any case" } else { "" }, ""],
                )
            }
            SubOrgFilter::OauthIdentity { issuer, subject, audience } => (
                "AND o.id IN (SELECT organization_id FROM oauth_providers WHERE issuer = ?2 AND subject = ?3 AND audience = ?4)",
                [issuer, subject, audience],
            ),
        };
        let after = match page.after {
            Some(_) => "AND (o.created_at, o.id) > (SELECT c.created_at, c.id FROM organizations c WHERE c.id = ?5)",
            None => "",
        };
        let before = match page.before {
            Some(_) => "AND (o.created_at, o.id) < (SELECT c.created_at, c.id FROM organizations c WHERE c.id = ?6)",
            None => "",
        };
        // Only `before`: the page just before the cursor, read backwards, then put in order.
        let backwards = page.before.is_some() && page.after.is_none();
        let dir = if backwards { "DESC" } else { "ASC" };
        let sql = format!(
            "SELECT o.id FROM organizations o WHERE o.parent_id = ?1 AND o.deleted_at IS NULL {cond} {after} {before}
             ORDER BY o.created_at {dir}, o.id {dir} LIMIT ?7"
        );
        let mut ids: Vec<String> = self.read(|c| {
            c.prepare_cached(&sql)?
                .query_map(
                    params![
                        parent,
                        values[0],
                        values[1],
                        values[2],
                        page.after.as_deref().unwrap_or_default(),
                        page.before.as_deref().unwrap_or_default(),
                        page.limit as i64
                    ],
                    |r| r.get(0),
                )?
                .collect()
        })?;
        if backwards {
            ids.reverse();
        }
        Ok(ids)
    }

    fn organization_footprint(&self, org: &str) -> Result<Vec<(String, i64)>, StoreError> {
        self.read(|c| {
            let tables: Vec<String> = c
                .prepare(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
                )?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            let mut out = Vec::with_capacity(tables.len());
            for table in tables {
                let columns: Vec<String> = c
                    .prepare("SELECT name FROM pragma_table_info(?1)")?
                    .query_map(params![table], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?;
                let quoted = format!("\"{}\"", table.replace('"', "\"\""));
                let sql = if table == "organizations" {
                    format!("SELECT COUNT(*) FROM {quoted} WHERE id = ?1 OR parent_id = ?1")
                } else if columns.iter().any(|c| c == "organization_id") {
                    format!("SELECT COUNT(*) FROM {quoted} WHERE organization_id = ?1")
                } else {
                    continue;
                };
                out.push((table, query_row_cached(c, &sql, params![org], |r| r.get(0))?));
            }
            Ok(out)
        })
    }

    fn purge_deleted_data(&self) -> Result<bool, StoreError> {
        // The WAL still holds the frames written before a deletion (secure_delete zeroes only
        // the new page versions): copy the latest pages into the database, then empty the WAL.
        let conn = self.writer.lock().map_err(|_| StoreError::Backend("writer lock poisoned".into()))?;
        let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0)).map_err(backend)?;
        Ok(busy == 0)
    }

    fn policy_evaluations(&self, org: &str, activity_id: &str) -> Result<Vec<PolicyEvaluationRecord>, StoreError> {
        self.read(|c| {
            let mut st = c.prepare_cached(
                "SELECT id, activity_id, organization_id, vote_id, evaluations, created_at FROM policy_evaluations
                 WHERE organization_id = ?1 AND activity_id = ?2 ORDER BY created_at, rowid",
            )?;
            let rows = st.query_map(params![org, activity_id], |r| {
                Ok(PolicyEvaluationRecord {
                    id: r.get(0)?,
                    activity_id: r.get(1)?,
                    organization_id: r.get(2)?,
                    vote_id: r.get(3)?,
                    evaluations: parse_json::<serde_json::Value>(r.get(4)?),
                    created_at: r.get(5)?,
                })
            })?;
            rows.collect()
        })
    }

    fn due_webhook_deliveries(
        &self,
        now: Nanos,
        limit: usize,
        skip: &[String],
    ) -> Result<Vec<WebhookDelivery>, StoreError> {
        use rusqlite::types::Value as Sql;
        self.read(|c| {
            let mut sql = format!(
                "SELECT {DELIVERY_COLS} FROM webhook_deliveries WHERE status = 'PENDING' AND next_attempt_at <= ?"
            );
            let mut args = vec![Sql::Integer(now)];
            if !skip.is_empty() {
                sql.push_str(&format!(" AND endpoint_id NOT IN ({})", vec!["?"; skip.len()].join(", ")));
                args.extend(skip.iter().map(|e| Sql::Text(e.clone())));
            }
            sql.push_str(" ORDER BY next_attempt_at LIMIT ?");
            args.push(Sql::Integer(limit.min(i64::MAX as usize) as i64));
            c.prepare_cached(&sql)?.query_map(rusqlite::params_from_iter(args), delivery_row)?.collect()
        })
    }

    fn release_webhook_leases(&self, now: Nanos) -> Result<usize, StoreError> {
        if nowait::active() {
            return Err(nowait::give_up());
        }
        let conn = self.writer.lock().map_err(|_| StoreError::Backend("writer lock poisoned".into()))?;
        conn.execute(
            "UPDATE webhook_deliveries SET next_attempt_at = ?1
             WHERE status = 'PENDING' AND attempts = 0 AND next_attempt_at > ?1",
            params![now],
        )
        .map_err(backend)
    }

    fn record_webhook_attempts(&self, attempts: &[(String, WebhookAttempt)]) -> Result<(), StoreError> {
        if nowait::active() {
            return Err(nowait::give_up());
        }
        let mut conn = self.writer.lock().map_err(|_| StoreError::Backend("writer lock poisoned".into()))?;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(backend)?;
        for (id, a) in attempts {
            let n: Option<i64> = tx
                .prepare_cached(
                    "UPDATE webhook_deliveries SET attempts = attempts + 1, status = ?2, next_attempt_at = ?3,
                        last_status_code = ?4, last_error = ?5, updated_at = ?6
                     WHERE id = ?1 AND status = 'PENDING' RETURNING attempts",
                )
                .map_err(backend)?
                .query_row(params![id, a.status, a.next_attempt_at, a.status_code, a.error, a.at], |r| r.get(0))
                .optional()
                .map_err(backend)?;
            if let Some(n) = n {
                execute_cached(
                    &tx,
                    "INSERT INTO webhook_attempts (delivery_id, attempt, at, status_code, error, duration_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![id, n, a.at, a.status_code, a.error, a.duration_ms],
                )
                .map_err(backend)?;
            }
        }
        tx.commit().map_err(backend)
    }

    fn webhook_deliveries(
        &self,
        org: &str,
        endpoint_id: &str,
        limit: usize,
    ) -> Result<Vec<WebhookDelivery>, StoreError> {
        self.read(|c| {
            c.prepare_cached(&format!(
                "SELECT {DELIVERY_COLS} FROM webhook_deliveries WHERE organization_id = ?1 AND endpoint_id = ?2
                 ORDER BY created_at DESC, id DESC LIMIT ?3"
            ))?
            .query_map(params![org, endpoint_id, limit.min(i64::MAX as usize) as i64], delivery_row)?
            .collect()
        })
    }

    fn idempotency_key(&self, org: &str, key: &str) -> Result<(String, String), StoreError> {
        self.one(|c| {
            query_row_cached(
                c,
                "SELECT intent_hash, activity_id FROM idempotency_keys WHERE organization_id = ?1 AND key = ?2",
                params![org, key],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
