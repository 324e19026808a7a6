//! The store's SQL, written once for both backends: bound values, rows, migrations, every write
//! and every read, over the small [`Db`] interface that SQLite and PostgreSQL implement.
//!
//! Statements use `?N` (or bare `?`) placeholders; PostgreSQL's connection rewrites them to `$N`.
//! Where the dialects differ (transaction start, JSON length, table catalogue, binary literals)
//! the difference is a constant of the [`Db`] implementation or [`Db::dialect`], not a branch here.

use super::*;

/// A value bound to a statement, borrowed so that binding copies nothing.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Null,
    Int(i64),
    Text(&'a str),
    Bytes(&'a [u8]),
}

/// An owned column value (keyset cursors carry them from one statement to the next).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

impl Value {
    pub fn arg(&self) -> Arg<'_> {
        match self {
            Value::Null => Arg::Null,
            Value::Int(v) => Arg::Int(*v),
            Value::Text(s) => Arg::Text(s),
            Value::Bytes(b) => Arg::Bytes(b),
        }
    }
}

/// What can be bound: strings, integers, bytes, options of them, and references to them.
pub trait ToArg {
    fn to_arg(&self) -> Arg<'_>;
}
impl ToArg for str {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(self)
    }
}
impl ToArg for String {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(self)
    }
}
impl ToArg for i64 {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Int(*self)
    }
}
impl ToArg for Vec<u8> {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Bytes(self)
    }
}
impl<T: ToArg> ToArg for Option<T> {
    fn to_arg(&self) -> Arg<'_> {
        self.as_ref().map_or(Arg::Null, ToArg::to_arg)
    }
}
impl<T: ToArg + ?Sized> ToArg for &T {
    fn to_arg(&self) -> Arg<'_> {
        (**self).to_arg()
    }
}

/// `args![a, b]`: the bound values of a statement, in placeholder order.
macro_rules! args {
    ($($e:expr),* $(,)?) => { &[$($crate::store::sql::ToArg::to_arg(&$e)),*][..] };
}
#[allow(unused_imports)]
pub(crate) use args;

/// One result row, read by column index.
pub trait SqlRow {
    fn value(&self, i: usize) -> Result<Value, StoreError>;
    fn int(&self, i: usize) -> Result<i64, StoreError> {
        match self.value(i)? {
            Value::Int(v) => Ok(v),
            other => Err(column_type(i, "integer", &other)),
        }
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        match self.value(i)? {
            Value::Null => Ok(None),
            Value::Int(v) => Ok(Some(v)),
            other => Err(column_type(i, "integer", &other)),
        }
    }
    fn text(&self, i: usize) -> Result<String, StoreError> {
        match self.value(i)? {
            Value::Text(s) => Ok(s),
            other => Err(column_type(i, "text", &other)),
        }
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        match self.value(i)? {
            Value::Null => Ok(None),
            Value::Text(s) => Ok(Some(s)),
            other => Err(column_type(i, "text", &other)),
        }
    }
    fn bytes(&self, i: usize) -> Result<Vec<u8>, StoreError> {
        match self.value(i)? {
            Value::Bytes(b) => Ok(b),
            // SQLite keeps what was bound: an empty default written as x'' is a blob, but be lenient.
            Value::Text(s) => Ok(s.into_bytes()),
            other => Err(column_type(i, "bytes", &other)),
        }
    }
}

fn column_type(i: usize, want: &str, got: &Value) -> StoreError {
    let got = match got {
        Value::Null => "null",
        Value::Int(_) => "integer",
        Value::Text(_) => "text",
        Value::Bytes(_) => "bytes",
    };
    StoreError::Backend(format!("column {i}: expected {want}, found {got}"))
}

/// A database connection as the store's SQL needs it. Implemented by SQLite's and
/// PostgreSQL's connections; statements are prepared once per connection and cached.
pub trait Db {
    /// Starts a write transaction (SQLite takes the write lock up front).
    const BEGIN_WRITE: &'static str;
    /// Serializes migrations across processes inside the migration transaction (empty: the
    /// write transaction already does).
    const MIGRATION_LOCK: &'static str;
    /// The number of votes of an activity (`votes` holds a JSON array as text).
    const VOTE_COUNT: &'static str;
    /// A column that orders rows of one table by insertion among equal timestamps.
    const INSERTION_ORDER: &'static str;
    /// Names of the tables that have an `organization_id` column, ordered by name.
    const TABLES_WITH_ORGANIZATION_ID: &'static str;

    /// Runs a statement; how many rows it changed.
    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError>;
    /// Runs a query and maps every row.
    fn query<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        f: impl FnMut(&dyn SqlRow) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError>;
    /// Runs statements without parameters (transaction control, migrations).
    fn batch(&mut self, sql: &str) -> Result<(), StoreError>;
    /// A migration's text in this backend's dialect.
    fn dialect(migration: &str) -> String;

    /// The first row, if any.
    fn query_opt<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        f: impl FnMut(&dyn SqlRow) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        Ok(self.query(sql, args, f)?.into_iter().next())
    }
    /// The first row, or [`StoreError::NotFound`].
    fn query_one<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        f: impl FnMut(&dyn SqlRow) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.query_opt(sql, args, f)?.ok_or(StoreError::NotFound)
    }
    /// Whether a row matches.
    fn exists(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<bool, StoreError> {
        Ok(self.query_opt(sql, args, |_| Ok(()))?.is_some())
    }
    /// Runs `f` in a savepoint: its changes are kept if it succeeds and undone if it fails,
    /// and a failure leaves the enclosing transaction usable.
    fn savepoint<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, StoreError>) -> Result<T, StoreError>
    where
        Self: Sized,
    {
        self.batch("SAVEPOINT coffer_job")?;
        match f(self) {
            Ok(v) => {
                self.batch("RELEASE SAVEPOINT coffer_job")?;
                Ok(v)
            }
            Err(e) => {
                self.batch("ROLLBACK TO SAVEPOINT coffer_job; RELEASE SAVEPOINT coffer_job")?;
                Err(e)
            }
        }
    }
    /// Runs `f` in a write transaction, committed if it succeeds.
    fn transaction<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, StoreError>) -> Result<T, StoreError>
    where
        Self: Sized,
    {
        self.batch(Self::BEGIN_WRITE)?;
        match f(self) {
            Ok(v) => {
                self.batch("COMMIT")?;
                Ok(v)
            }
            Err(e) => {
                let _ = self.batch("ROLLBACK");
                Err(e)
            }
        }
    }
}

// <migrations>

/// Applied in order, once each, by both backends (in each one's dialect); append new files,
/// never edit applied ones. The number of a migration is its place here.
pub const MIGRATIONS: &[&str] = &[
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
    include_str!("migrations/0012_login.sql"),
    include_str!("migrations/0013_webhook_leases.sql"),
    include_str!("migrations/0014_redundant_indexes.sql"),
];

/// Brings the schema to the latest version, in one transaction (several gateways starting at
/// once apply each migration once). A database newer than this build is refused: an older
/// gateway must not write to a schema it does not know.
pub fn migrate<D: Db>(db: &mut D) -> Result<(), StoreError> {
    db.transaction(|db| {
        if !D::MIGRATION_LOCK.is_empty() {
            db.batch(D::MIGRATION_LOCK)?;
        }
        db.batch("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY)")?;
        let done = db.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", args![], |r| r.int(0))?;
        let known = MIGRATIONS.len() as i64;
        if done > known {
            return Err(StoreError::Backend(format!(
                "the database schema is at version {done}, newer than this build knows ({known}): upgrade the gateway"
            )));
        }
        for (i, sql) in MIGRATIONS.iter().enumerate() {
            let version = i as i64 + 1;
            if version <= done {
                continue;
            }
            db.batch(&D::dialect(sql))?;
            db.execute("INSERT INTO schema_migrations (version) VALUES (?1)", args![version])?;
        }
        Ok(())
    })
}

// <rows>

pub fn json_text<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

fn parse_json<T: serde::de::DeserializeOwned + Default>(s: String) -> T {
    serde_json::from_str(&s).unwrap_or_default()
}

pub const ORG_COLS: &str = "id, name, parent_id, root_quorum_threshold, root_user_ids, created_at, updated_at";
fn org_row(r: &dyn SqlRow) -> Result<Organization, StoreError> {
    Ok(Organization {
        id: r.text(0)?,
        name: r.text(1)?,
        parent_id: r.opt_text(2)?,
        root_quorum_threshold: r.int(3)?,
        root_user_ids: parse_json(r.text(4)?),
        created_at: r.int(5)?,
        updated_at: r.int(6)?,
    })
}

const USER_COLS: &str = "id, organization_id, name, email, phone_number, created_at, updated_at";
fn user_row(r: &dyn SqlRow) -> Result<User, StoreError> {
    Ok(User {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        name: r.text(2)?,
        email: r.opt_text(3)?,
        phone_number: r.opt_text(4)?,
        created_at: r.int(5)?,
        updated_at: r.int(6)?,
    })
}

const API_KEY_COLS: &str = "id, organization_id, user_id, name, public_key, credential_type, expiration_seconds, created_at, updated_at, certificate";
fn api_key_row(r: &dyn SqlRow) -> Result<ApiKey, StoreError> {
    Ok(ApiKey {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        user_id: r.text(2)?,
        name: r.text(3)?,
        public_key: r.text(4)?,
        credential_type: r.text(5)?,
        expiration_seconds: r.opt_int(6)?.map(|v| v as u64),
        created_at: r.int(7)?,
        updated_at: r.int(8)?,
        certificate: r.bytes(9)?,
    })
}

const WALLET_COLS: &str = "id, organization_id, name, exported, imported, sealed_seed, created_at, updated_at";
fn wallet_row(r: &dyn SqlRow) -> Result<Wallet, StoreError> {
    Ok(Wallet {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        name: r.text(2)?,
        exported: r.int(3)? != 0,
        imported: r.int(4)? != 0,
        sealed_seed: r.bytes(5)?,
        created_at: r.int(6)?,
        updated_at: r.int(7)?,
    })
}

const ACCOUNT_COLS: &str = "id, organization_id, wallet_id, curve, path_format, path, address_format, address, public_key, sealed_key, created_at, updated_at";
fn account_row(r: &dyn SqlRow) -> Result<WalletAccount, StoreError> {
    Ok(WalletAccount {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        wallet_id: r.text(2)?,
        curve: r.text(3)?,
        path_format: r.text(4)?,
        path: r.text(5)?,
        address_format: r.text(6)?,
        address: r.text(7)?,
        public_key: r.text(8)?,
        sealed_key: r.bytes(9)?,
        created_at: r.int(10)?,
        updated_at: r.int(11)?,
    })
}

const PRIVATE_KEY_COLS: &str = "id, organization_id, name, curve, public_key, addresses, tags, exported, imported, sealed_key, created_at, updated_at";
fn private_key_row(r: &dyn SqlRow) -> Result<PrivateKey, StoreError> {
    Ok(PrivateKey {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        name: r.text(2)?,
        curve: r.text(3)?,
        public_key: r.text(4)?,
        addresses: parse_json(r.text(5)?),
        tags: parse_json(r.text(6)?),
        exported: r.int(7)? != 0,
        imported: r.int(8)? != 0,
        sealed_key: r.bytes(9)?,
        created_at: r.int(10)?,
        updated_at: r.int(11)?,
    })
}

const ACTIVITY_COLS: &str =
    "id, organization_id, activity_type, status, fingerprint, intent, result, votes, created_at, failure, updated_at";
fn activity_row(r: &dyn SqlRow) -> Result<ActivityRecord, StoreError> {
    Ok(ActivityRecord {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        activity_type: r.text(2)?,
        status: r.text(3)?,
        fingerprint: r.text(4)?,
        intent: parse_json(r.text(5)?),
        result: parse_json(r.text(6)?),
        votes: parse_json(r.text(7)?),
        failure: r.opt_text(9)?.map(parse_json),
        created_at: r.int(8)?,
        updated_at: r.int(10)?,
    })
}

const RECORD_COLS: &str = "organization_id, kind, id, name, data, created_at, updated_at";
fn record_row(r: &dyn SqlRow) -> Result<Record, StoreError> {
    Ok(Record {
        organization_id: r.text(0)?,
        kind: r.text(1)?,
        id: r.text(2)?,
        name: r.text(3)?,
        data: parse_json(r.text(4)?),
        created_at: r.int(5)?,
        updated_at: r.int(6)?,
    })
}

const DELIVERY_COLS: &str = "id, organization_id, endpoint_id, activity_organization_id, activity_id, event_type, body, status, attempts, next_attempt_at, last_status_code, last_error, created_at, updated_at, leased_by";
fn delivery_row(r: &dyn SqlRow) -> Result<WebhookDelivery, StoreError> {
    Ok(WebhookDelivery {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        endpoint_id: r.text(2)?,
        activity_organization_id: r.text(3)?,
        activity_id: r.text(4)?,
        event_type: r.text(5)?,
        body: r.text(6)?,
        status: r.text(7)?,
        attempts: r.int(8)?,
        next_attempt_at: r.int(9)?,
        last_status_code: r.opt_int(10)?,
        last_error: r.opt_text(11)?,
        created_at: r.int(12)?,
        updated_at: r.int(13)?,
        leased_by: r.opt_text(14)?,
    })
}

const AUTHENTICATOR_COLS: &str = "id, organization_id, user_id, name, credential_id, public_key, attestation_type, aaguid, transports, sign_count, created_at, updated_at, certificate";
fn authenticator_row(r: &dyn SqlRow) -> Result<AuthenticatorRecord, StoreError> {
    Ok(AuthenticatorRecord {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        user_id: r.text(2)?,
        name: r.text(3)?,
        credential_id: r.text(4)?,
        public_key: r.text(5)?,
        attestation_type: r.text(6)?,
        aaguid: r.text(7)?,
        transports: parse_json(r.text(8)?),
        sign_count: r.int(9)?,
        created_at: r.int(10)?,
        updated_at: r.int(11)?,
        certificate: r.bytes(12)?,
    })
}

const OAUTH_PROVIDER_COLS: &str =
    "id, organization_id, user_id, name, issuer, audience, subject, created_at, updated_at, certificate";
fn oauth_provider_row(r: &dyn SqlRow) -> Result<OauthProviderRecord, StoreError> {
    Ok(OauthProviderRecord {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        user_id: r.text(2)?,
        name: r.text(3)?,
        issuer: r.text(4)?,
        audience: r.text(5)?,
        subject: r.text(6)?,
        created_at: r.int(7)?,
        updated_at: r.int(8)?,
        certificate: r.bytes(9)?,
    })
}

// <commits>

/// What a deleted sub-organization loses, children before parents: every credential, key,
/// record and pending delivery. Its activities and policy evaluations stay (the audit trail), as
/// does its organization row, as a tombstone. A test checks that every table holding an
/// `organization_id` is either here or kept on purpose.
pub const PURGED_ON_DELETION: &[&str] = &[
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
pub const KEPT_ON_DELETION: &[&str] = &["activities", "policy_evaluations", "organizations"];

/// Commits activities with their writes in one transaction. The activity row goes in first and
/// its fingerprint is unique: a second submission of the same request (through this gateway or
/// another one, at the same moment) finds the first one's record instead of applying its writes
/// again.
///
/// First optimistically, all activities as they come; if any fails, that transaction is rolled
/// back and the batch redone with a savepoint per activity, so one failure costs only its own
/// activity. (On PostgreSQL each savepoint is two more round trips per activity on the committer,
/// which a batch that fails nowhere — nearly every batch — need not pay.)
pub fn commit_batch<D: Db>(db: &mut D, batch: &[(&ActivityRecord, &[Write])]) -> Vec<Result<Committed, StoreError>> {
    let fail_all = |e: &StoreError| batch.iter().map(|_| Err(StoreError::Backend(e.to_string()))).collect();
    if let Err(e) = db.batch(D::BEGIN_WRITE) {
        return fail_all(&e);
    }
    let optimistic: Result<Vec<Committed>, StoreError> =
        batch.iter().map(|(activity, writes)| commit_one(db, activity, writes)).collect();
    let results: Vec<_> = match optimistic {
        Ok(done) => done.into_iter().map(Ok).collect(),
        Err(_) => {
            if let Err(e) = db.batch("ROLLBACK").and_then(|()| db.batch(D::BEGIN_WRITE)) {
                return fail_all(&e);
            }
            batch.iter().map(|(activity, writes)| db.savepoint(|db| commit_one(db, activity, writes))).collect()
        }
    };
    match db.batch("COMMIT") {
        Ok(()) => results,
        Err(e) => {
            let _ = db.batch("ROLLBACK");
            fail_all(&e)
        }
    }
}

fn commit_one<D: Db>(db: &mut D, activity: &ActivityRecord, writes: &[Write]) -> Result<Committed, StoreError> {
    // The record of a sub-organization's deletion goes to its parent's log.
    let organization_id = deletion_parent(writes, &activity.id).unwrap_or(&activity.organization_id);
    if insert_activity(db, activity, organization_id)? {
        for w in writes {
            apply_write(db, w)?;
        }
        Ok(Committed::New(activity.clone()))
    } else {
        let sql = format!("SELECT {ACTIVITY_COLS} FROM activities WHERE fingerprint = ?1");
        Ok(Committed::Existing(db.query_one(&sql, args![activity.fingerprint], activity_row)?))
    }
}

/// The parent of the sub-organization `writes` delete, when `activity_id` is the deleting one.
fn deletion_parent<'a>(writes: &'a [Write], activity_id: &str) -> Option<&'a String> {
    writes.iter().find_map(|w| match w {
        Write::DeleteSubOrganization { activity_id: a, parent_id, .. } if a == activity_id => Some(parent_id),
        _ => None,
    })
}

/// Inserts the activity unless one with its fingerprint exists (then `false`, nothing written).
fn insert_activity<D: Db>(db: &mut D, a: &ActivityRecord, organization_id: &str) -> Result<bool, StoreError> {
    let n = db.execute(
        &format!(
            "INSERT INTO activities ({ACTIVITY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
             ON CONFLICT (fingerprint) DO NOTHING"
        ),
        args![
            a.id,
            organization_id,
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
    )?;
    Ok(n == 1)
}

/// Replaces a uniqueness error's message with one for the caller.
fn unique_as(message: impl Into<String>) -> impl FnOnce(StoreError) -> StoreError {
    move |e| match e {
        StoreError::Unique(_) => StoreError::Unique(message.into()),
        other => other,
    }
}

/// Whether a uniqueness error is about a record's name (not its id).
fn is_record_name_clash(message: &str) -> bool {
    // SQLite names the columns, PostgreSQL the constraint.
    message.contains("records.name") || message.contains("records_organization_id_kind_name_key")
}

/// Applies one write inside a transaction. Preconditions that fail return `Conflict` (the caller
/// rolls back).
pub fn apply_write<D: Db>(db: &mut D, w: &Write) -> Result<(), StoreError> {
    let now = now_nanos();
    match w {
        Write::InsertOrganization(o) => {
            db.execute(
                &format!("INSERT INTO organizations ({ORG_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                args![
                    o.id,
                    o.name,
                    o.parent_id,
                    o.root_quorum_threshold,
                    json_text(&o.root_user_ids),
                    o.created_at,
                    o.updated_at
                ],
            )?;
        }
        Write::InsertUser(u) => {
            db.execute(
                &format!("INSERT INTO users ({USER_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                args![u.id, u.organization_id, u.name, u.email, u.phone_number, u.created_at, u.updated_at],
            )?;
        }
        Write::InsertApiKey(k) => {
            db.execute(
                &format!("INSERT INTO api_keys ({API_KEY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
                args![
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
            )?;
        }
        Write::InsertWallet(wl) => {
            db.execute(
                &format!("INSERT INTO wallets ({WALLET_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
                args![
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
            .map_err(unique_as("wallet name must be unique"))?;
        }
        Write::InsertAccounts(accounts) => {
            // An account's place in its wallet is the wallet's last plus one: the wallet's row is
            // locked first, so a transaction of another gateway deriving into the same wallet
            // waits for this one and then counts its accounts (a no-op write on SQLite, whose
            // one writer already serializes).
            let mut locked: Vec<&str> = Vec::new();
            for a in accounts {
                if !locked.contains(&a.wallet_id.as_str()) {
                    db.execute("UPDATE wallets SET updated_at = updated_at WHERE id = ?1", args![a.wallet_id])?;
                    locked.push(&a.wallet_id);
                }
            }
            for a in accounts {
                db.execute(
                    "INSERT INTO wallet_accounts (id, organization_id, wallet_id, seq, curve, path_format, path, address_format, address, public_key, exported, sealed_key, created_at, updated_at)
                     VALUES (?1, ?2, ?3, (SELECT COALESCE(MAX(seq), -1) + 1 FROM wallet_accounts WHERE wallet_id = ?3), ?4, ?5, ?6, ?7, ?8, ?9, 0, ?10, ?11, ?12)",
                    args![a.id, a.organization_id, a.wallet_id, a.curve, a.path_format, a.path, a.address_format, a.address, a.public_key, a.sealed_key, a.created_at, a.updated_at],
                )
                .map_err(unique_as(format!(
                    "wallet account already exists for path {} and address format {}",
                    a.path, a.address_format
                )))?;
            }
        }
        Write::InsertPrivateKeys(keys) => {
            for k in keys {
                db.execute(
                    &format!("INSERT INTO private_keys ({PRIVATE_KEY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"),
                    args![
                        k.id, k.organization_id, k.name, k.curve, k.public_key, json_text(&k.addresses),
                        json_text(&k.tags), k.exported as i64, k.imported as i64, k.sealed_key, k.created_at, k.updated_at
                    ],
                )
                .map_err(unique_as("private key name must be unique"))?;
                for a in &k.addresses {
                    db.execute(
                        "INSERT INTO private_key_addresses (private_key_id, organization_id, address) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                        args![k.id, k.organization_id, a.address],
                    )?;
                }
            }
        }
        Write::SetCertificate { kind, id, certificate } => {
            let sql = match kind {
                CredentialKind::ApiKey => "UPDATE api_keys SET certificate = ?2 WHERE id = ?1",
                CredentialKind::Authenticator => "UPDATE authenticators SET certificate = ?2 WHERE id = ?1",
                CredentialKind::OauthProvider => "UPDATE oauth_providers SET certificate = ?2 WHERE id = ?1",
                // Parent certificates are records (Write::PutRecord), written by the importer.
                CredentialKind::ParentOrganization => {
                    return Err(StoreError::Conflict("a parent certificate is stored as a record".into()))
                }
            };
            if db.execute(sql, args![id, certificate])? != 1 {
                return Err(StoreError::NotFound);
            }
        }
        Write::MarkWalletExported(id) => {
            db.execute("UPDATE wallets SET exported = 1, updated_at = ?2 WHERE id = ?1", args![id, now])?;
        }
        Write::MarkPrivateKeyExported(id) => {
            db.execute("UPDATE private_keys SET exported = 1, updated_at = ?2 WHERE id = ?1", args![id, now])?;
        }
        Write::MarkAccountExported(id) => {
            db.execute("UPDATE wallet_accounts SET exported = 1, updated_at = ?2 WHERE id = ?1", args![id, now])?;
        }
        Write::DeleteWallets { ids, require_exported } => {
            for id in ids {
                match db.query_opt("SELECT exported FROM wallets WHERE id = ?1", args![id], |r| r.int(0))? {
                    None => return Err(StoreError::Conflict(format!("wallet not found: {id}"))),
                    Some(0) if *require_exported => {
                        return Err(StoreError::Conflict(format!(
                            "wallet account has not been exported: wallet {id} was never exported; pass deleteWithoutExport: true to delete it anyway"
                        )))
                    }
                    Some(_) => {}
                }
                db.execute("DELETE FROM wallet_accounts WHERE wallet_id = ?1", args![id])?;
                db.execute("DELETE FROM wallets WHERE id = ?1", args![id])?;
            }
        }
        Write::DeletePrivateKeys { ids, require_exported } => {
            for id in ids {
                match db.query_opt("SELECT exported FROM private_keys WHERE id = ?1", args![id], |r| r.int(0))? {
                    None => return Err(StoreError::Conflict(format!("private key not found: {id}"))),
                    Some(0) if *require_exported => {
                        return Err(StoreError::Conflict(format!(
                            "wallet account has not been exported: private key {id} was never exported; pass deleteWithoutExport: true to delete it anyway"
                        )))
                    }
                    Some(_) => {}
                }
                db.execute("DELETE FROM private_key_addresses WHERE private_key_id = ?1", args![id])?;
                db.execute("DELETE FROM private_keys WHERE id = ?1", args![id])?;
            }
        }
        Write::PutRecord(r) => {
            db.execute(
                "INSERT INTO records (organization_id, kind, id, name, data, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (organization_id, kind, id) DO UPDATE SET name = excluded.name, data = excluded.data, updated_at = excluded.updated_at",
                args![r.organization_id, r.kind, r.id, r.name, json_text(&r.data), r.created_at, r.updated_at],
            )
            .map_err(unique_as(format!("{} name must be unique: {:?}", r.kind, r.name)))?;
        }
        Write::DeleteRecords { organization_id, kind, ids } => {
            for id in ids {
                let n = db.execute(
                    "DELETE FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
                    args![organization_id, kind, id],
                )?;
                if n != 1 {
                    return Err(StoreError::Conflict(format!("{kind} not found: {id}")));
                }
            }
        }
        // <users, api keys and tags>
        Write::UpdateUser { organization_id, id, name, email, phone_number, tag_ids, updated_at } => {
            // `?4`/`?5` absent: unchanged; empty: cleared.
            let n = db.execute(
                "UPDATE users SET name = COALESCE(CAST(?3 AS TEXT), name),
                    email = CASE WHEN CAST(?4 AS TEXT) IS NULL THEN email WHEN CAST(?4 AS TEXT) = '' THEN NULL ELSE CAST(?4 AS TEXT) END,
                    phone_number = CASE WHEN CAST(?5 AS TEXT) IS NULL THEN phone_number WHEN CAST(?5 AS TEXT) = '' THEN NULL ELSE CAST(?5 AS TEXT) END,
                    updated_at = ?6
                 WHERE organization_id = ?1 AND id = ?2",
                args![organization_id, id, name, email, phone_number, updated_at],
            )?;
            if n != 1 {
                return Err(StoreError::Conflict(format!("user not found: {id}")));
            }
            if let Some(tags) = tag_ids {
                db.execute("DELETE FROM user_tags WHERE user_id = ?1", args![id])?;
                for tag in tags {
                    if !db.exists(
                        "SELECT 1 FROM records WHERE organization_id = ?1 AND kind = 'user_tag' AND id = ?2",
                        args![organization_id, tag],
                    )? {
                        return Err(StoreError::Conflict(format!("user tag not found: {tag}")));
                    }
                    db.execute(
                        "INSERT INTO user_tags (organization_id, tag_id, user_id) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                        args![organization_id, tag, id],
                    )?;
                }
            }
        }
        Write::DeleteUsers { organization_id, ids } => {
            let roots =
                db.query_opt("SELECT root_user_ids FROM organizations WHERE id = ?1", args![organization_id], |r| {
                    r.text(0)
                })?;
            let roots: Vec<String> = roots.map(parse_json).unwrap_or_default();
            for id in ids {
                if roots.contains(id) {
                    return Err(StoreError::Conflict(format!("cannot delete a root quorum member: {id}")));
                }
                db.execute(
                    "DELETE FROM import_targets WHERE organization_id = ?1 AND user_id = ?2",
                    args![organization_id, id],
                )?;
                // API keys and tag memberships go with the user (ON DELETE CASCADE).
                let n =
                    db.execute("DELETE FROM users WHERE organization_id = ?1 AND id = ?2", args![organization_id, id])?;
                if n != 1 {
                    return Err(StoreError::Conflict(format!("user not found: {id}")));
                }
            }
        }
        Write::DeleteApiKeys { organization_id, user_id, ids } => {
            for id in ids {
                let n = db.execute(
                    "DELETE FROM api_keys WHERE organization_id = ?1 AND user_id = ?2 AND id = ?3",
                    args![organization_id, user_id, id],
                )?;
                if n != 1 {
                    return Err(StoreError::Conflict(format!("api key not found for user {user_id}: {id}")));
                }
            }
        }
        Write::UpdateTag { organization_id, kind, id, new_name, add, remove, updated_at } => {
            let label = kind.replace('_', " ");
            if !db.exists(
                "SELECT 1 FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
                args![organization_id, kind, id],
            )? {
                return Err(StoreError::Conflict(format!("{label} not found: {id}")));
            }
            let changes = add.iter().map(|m| (m, true)).chain(remove.iter().map(|m| (m, false)));
            match kind.as_str() {
                "user_tag" => {
                    for (user, adding) in changes {
                        if !db.exists(
                            "SELECT 1 FROM users WHERE organization_id = ?1 AND id = ?2",
                            args![organization_id, user],
                        )? {
                            return Err(StoreError::Conflict(format!("user not found: {user}")));
                        }
                        let sql = if adding {
                            "INSERT INTO user_tags (organization_id, tag_id, user_id) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING"
                        } else {
                            "DELETE FROM user_tags WHERE organization_id = ?1 AND tag_id = ?2 AND user_id = ?3"
                        };
                        db.execute(sql, args![organization_id, id, user])?;
                    }
                }
                "private_key_tag" => {
                    for (key, adding) in changes {
                        let Some(tags) = db.query_opt(
                            "SELECT tags FROM private_keys WHERE organization_id = ?1 AND id = ?2",
                            args![organization_id, key],
                            |r| r.text(0),
                        )?
                        else {
                            return Err(StoreError::Conflict(format!("private key not found: {key}")));
                        };
                        let mut tags: Vec<String> = parse_json(tags);
                        tags.retain(|t| t != id);
                        if adding {
                            tags.push(id.clone());
                        }
                        db.execute(
                            "UPDATE private_keys SET tags = ?3 WHERE organization_id = ?1 AND id = ?2",
                            args![organization_id, key, json_text(&tags)],
                        )?;
                    }
                }
                other => return Err(StoreError::Conflict(format!("not a tag kind: {other}"))),
            }
            // Renamed last: a name clash rolls back the membership changes above with it.
            db.execute(
                "UPDATE records SET name = COALESCE(CAST(?4 AS TEXT), name), updated_at = ?5 WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
                args![organization_id, kind, id, new_name, updated_at],
            )
            .map_err(unique_as(format!("{label} name must be unique: {:?}", new_name.as_deref().unwrap_or(""))))?;
        }
        Write::DeleteTags { organization_id, kind, ids } => {
            if kind == "private_key_tag" {
                let keys = db.query(
                    "SELECT id, tags FROM private_keys WHERE organization_id = ?1",
                    args![organization_id],
                    |r| Ok((r.text(0)?, r.text(1)?)),
                )?;
                for (key, tags) in keys {
                    let tags: Vec<String> = parse_json(tags);
                    if tags.iter().any(|t| ids.contains(t)) {
                        let kept: Vec<&String> = tags.iter().filter(|t| !ids.contains(t)).collect();
                        db.execute("UPDATE private_keys SET tags = ?2 WHERE id = ?1", args![key, json_text(&kept)])?;
                    }
                }
            }
            for id in ids {
                if kind == "user_tag" {
                    db.execute(
                        "DELETE FROM user_tags WHERE organization_id = ?1 AND tag_id = ?2",
                        args![organization_id, id],
                    )?;
                }
                let n = db.execute(
                    "DELETE FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
                    args![organization_id, kind, id],
                )?;
                if n != 1 {
                    return Err(StoreError::Conflict(format!("{} not found: {id}", kind.replace('_', " "))));
                }
            }
        }
        // <passkeys and oauth providers>
        Write::InsertAuthenticators(list) => {
            for a in list {
                db.execute(
                    &format!("INSERT INTO authenticators ({AUTHENTICATOR_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"),
                    args![
                        a.id, a.organization_id, a.user_id, a.name, a.credential_id, a.public_key, a.attestation_type,
                        a.aaguid, json_text(&a.transports), a.sign_count, a.created_at, a.updated_at, a.certificate
                    ],
                )
                .map_err(unique_as(format!(
                    "an authenticator with credential ID {} already exists in the organization",
                    a.credential_id
                )))?;
            }
        }
        Write::DeleteAuthenticators { organization_id, user_id, ids } => {
            for id in ids {
                let n = db.execute(
                    "DELETE FROM authenticators WHERE organization_id = ?1 AND user_id = ?2 AND id = ?3",
                    args![organization_id, user_id, id],
                )?;
                if n != 1 {
                    return Err(StoreError::Conflict(format!("authenticator not found for user {user_id}: {id}")));
                }
            }
        }
        Write::InsertOauthProviders(list) => {
            for p in list {
                db.execute(
                    &format!(
                        "INSERT INTO oauth_providers ({OAUTH_PROVIDER_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
                    ),
                    args![
                        p.id,
                        p.organization_id,
                        p.user_id,
                        p.name,
                        p.issuer,
                        p.audience,
                        p.subject,
                        p.created_at,
                        p.updated_at,
                        p.certificate
                    ],
                )
                .map_err(unique_as("oauth provider already exists"))?;
            }
        }
        Write::DeleteOauthProviders { organization_id, user_id, ids } => {
            for id in ids {
                let n = db.execute(
                    "DELETE FROM oauth_providers WHERE organization_id = ?1 AND user_id = ?2 AND id = ?3",
                    args![organization_id, user_id, id],
                )?;
                if n != 1 {
                    return Err(StoreError::Conflict(format!("oauth provider not found for user {user_id}: {id}")));
                }
            }
        }
        // <policies, contract interfaces, organization features and root quorum>
        Write::PutRecordChecked { record: r, unique_message, must_exist } => {
            // Update-then-insert rather than ON CONFLICT: scoped to the organization whatever the
            // table's key is, so another organization's record with the same id is never touched.
            let name_taken = |e: StoreError| match e {
                StoreError::Unique(m) if is_record_name_clash(&m) => StoreError::Unique(unique_message.clone()),
                StoreError::Unique(_) => {
                    StoreError::Conflict(format!("{} id {} is already in use by another organization", r.kind, r.id))
                }
                other => other,
            };
            let n = db
                .execute(
                    "UPDATE records SET name = ?4, data = ?5, updated_at = ?6 WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
                    args![r.organization_id, r.kind, r.id, r.name, json_text(&r.data), r.updated_at],
                )
                .map_err(name_taken)?;
            if n == 0 {
                if *must_exist {
                    return Err(StoreError::Conflict(format!("{} not found: {}", r.kind.replace('_', " "), r.id)));
                }
                db.execute(
                    "INSERT INTO records (organization_id, kind, id, name, data, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    args![r.organization_id, r.kind, r.id, r.name, json_text(&r.data), r.created_at, r.updated_at],
                )
                .map_err(name_taken)?;
            }
        }
        Write::SetRootQuorum { organization_id, threshold, user_ids, updated_at } => {
            for user in user_ids {
                if !db.exists(
                    "SELECT 1 FROM users WHERE organization_id = ?1 AND id = ?2",
                    args![organization_id, user],
                )? {
                    return Err(StoreError::Conflict(format!("user not found: {user}")));
                }
            }
            let n = db.execute(
                "UPDATE organizations SET root_quorum_threshold = ?2, root_user_ids = ?3, updated_at = ?4 WHERE id = ?1",
                args![organization_id, threshold, json_text(user_ids), updated_at],
            )?;
            if n != 1 {
                return Err(StoreError::Conflict(format!("organization not found: {organization_id}")));
            }
        }
        // <tvc apps and deployments>
        Write::RequireRecordSet { organization_id, kind, key, value, ids } => {
            let rows = db.query(
                "SELECT id, data FROM records WHERE organization_id = ?1 AND kind = ?2",
                args![organization_id, kind],
                |r| Ok((r.text(0)?, r.text(1)?)),
            )?;
            let mut found = std::collections::BTreeSet::new();
            for (id, data) in rows {
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
            let parent = db.query_opt(
                "SELECT parent_id FROM organizations WHERE id = ?1 AND deleted_at IS NULL",
                args![organization_id],
                |r| r.opt_text(0),
            )?;
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
                let unexported = db.query_opt(
                    "SELECT 'wallet ' || id FROM wallets WHERE organization_id = ?1 AND exported = 0
                     UNION ALL SELECT 'private key ' || id FROM private_keys WHERE organization_id = ?1 AND exported = 0
                     LIMIT 1",
                    args![organization_id],
                    |r| r.text(0),
                )?;
                if let Some(what) = unexported {
                    return Err(StoreError::Conflict(format!(
                        "wallet account has not been exported: {what} was never exported; pass deleteWithoutExport: true to delete the sub-organization anyway"
                    )));
                }
            }
            for table in PURGED_ON_DELETION {
                if *table == "webhook_deliveries" {
                    db.execute(
                        "DELETE FROM webhook_attempts WHERE delivery_id IN
                         (SELECT id FROM webhook_deliveries WHERE organization_id = ?1)",
                        args![organization_id],
                    )?;
                }
                db.execute(&format!("DELETE FROM {table} WHERE organization_id = ?1"), args![organization_id])?;
            }
            db.execute(
                "UPDATE organizations SET deleted_at = ?2, deletion_activity_id = ?3, root_user_ids = '[]', updated_at = ?2
                 WHERE id = ?1",
                args![organization_id, deleted_at, activity_id],
            )?;
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
            // A compare-and-set: with two gateways, the second update waits for the first's
            // row lock and then finds the row no longer matching.
            let n = db.execute(
                &format!(
                    "UPDATE activities SET status = ?1, result = ?2, votes = ?3, failure = ?4, updated_at = ?5
                     WHERE id = ?6 AND organization_id = ?7 AND status = 'ACTIVITY_STATUS_CONSENSUS_NEEDED'
                       AND {} = ?8",
                    D::VOTE_COUNT
                ),
                args![
                    status,
                    json_text(result),
                    json_text(votes),
                    failure.as_ref().map(json_text),
                    updated_at,
                    id,
                    organization_id,
                    *expected_votes as i64
                ],
            )?;
            if n != 1 {
                return Err(StoreError::Conflict(CONSENSUS_MOVED.into()));
            }
            // An approved deletion of this organization: its record goes to the parent's log.
            let parent = db.query_opt(
                "SELECT parent_id FROM organizations WHERE id = ?1 AND deletion_activity_id = ?2",
                args![organization_id, id],
                |r| r.opt_text(0),
            )?;
            if let Some(Some(parent)) = parent {
                db.execute("UPDATE activities SET organization_id = ?1 WHERE id = ?2", args![parent, id])?;
            }
        }
        Write::InsertPolicyEvaluation(e) => {
            db.execute(
                "INSERT INTO policy_evaluations (id, activity_id, organization_id, vote_id, evaluations, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                args![e.id, e.activity_id, e.organization_id, e.vote_id, json_text(&e.evaluations), e.created_at],
            )?;
        }
        Write::InsertIdempotencyKey { organization_id, key, intent_hash, activity_id, created_at } => {
            db.execute(
                "INSERT INTO idempotency_keys (organization_id, key, intent_hash, activity_id, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                args![organization_id, key, intent_hash, activity_id, created_at],
            )?;
        }
        Write::EnqueueWebhookDelivery(d) => {
            db.execute(
                &format!("INSERT INTO webhook_deliveries ({DELIVERY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"),
                args![
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
                    d.updated_at,
                    d.leased_by
                ],
            )?;
        }
        Write::DropWebhookDeliveries { organization_id, endpoint_id } => {
            db.execute(
                "DELETE FROM webhook_deliveries WHERE organization_id = ?1 AND endpoint_id = ?2 AND status = 'PENDING'",
                args![organization_id, endpoint_id],
            )?;
        }
        Write::PutImportTarget(t) => {
            db.execute(
                "INSERT INTO import_targets (organization_id, user_id, sealed_key, created_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (organization_id, user_id) DO UPDATE SET sealed_key = excluded.sealed_key, created_at = excluded.created_at",
                args![t.organization_id, t.user_id, t.sealed_key, t.created_at],
            )?;
        }
        Write::TakeImportTarget { organization_id, user_id, sealed_key } => {
            let n = db.execute(
                "DELETE FROM import_targets WHERE organization_id = ?1 AND user_id = ?2 AND sealed_key = ?3",
                args![organization_id, user_id, sealed_key],
            )?;
            if n != 1 {
                return Err(StoreError::Conflict(
                    "import target was already used or replaced: call init_import again".into(),
                ));
            }
        }
    }
    Ok(())
}

// <reads>

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
fn keyset_page<D: Db, T>(
    db: &mut D,
    list: Listing<'_>,
    page: &Page,
    row: impl FnMut(&dyn SqlRow) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let Listing { table, cols, scope, args, order } = list;
    let keys = order.join(", ");
    let mut cursor = |id: &Option<String>| -> Result<Option<Vec<Value>>, StoreError> {
        let Some(id) = id else { return Ok(None) };
        let sql = format!("SELECT {keys} FROM {table} WHERE {scope} AND id = ?");
        let bound: Vec<Arg<'_>> = args.iter().map(|a| Arg::Text(a)).chain([Arg::Text(id)]).collect();
        db.query_opt(&sql, &bound, |r| (0..order.len()).map(|i| r.value(i)).collect())
    };
    let (after, before) = (cursor(&page.after)?, cursor(&page.before)?);
    let marks = vec!["?"; order.len()].join(", ");
    let mut sql = format!("SELECT {cols} FROM {table} WHERE {scope}");
    let mut bound: Vec<Arg<'_>> = args.iter().map(|a| Arg::Text(a)).collect();
    if let Some(values) = &after {
        sql.push_str(&format!(" AND ({keys}) > ({marks})"));
        bound.extend(values.iter().map(Value::arg));
    }
    if let Some(values) = &before {
        sql.push_str(&format!(" AND ({keys}) < ({marks})"));
        bound.extend(values.iter().map(Value::arg));
    }
    // Before a cursor: the rows just preceding it, read downwards and turned around.
    let direction = if before.is_some() { "DESC" } else { "ASC" };
    let ordering: Vec<String> = order.iter().map(|k| format!("{k} {direction}")).collect();
    sql.push_str(&format!(" ORDER BY {} LIMIT ?", ordering.join(", ")));
    bound.push(Arg::Int(page.limit.min(i64::MAX as usize) as i64));
    let mut items = db.query(&sql, &bound, row)?;
    if before.is_some() {
        items.reverse();
    }
    Ok(items)
}

pub fn organization<D: Db>(db: &mut D, id: &str) -> Result<Organization, StoreError> {
    let sql = format!("SELECT {ORG_COLS} FROM organizations WHERE id = ?1 AND deleted_at IS NULL");
    db.query_one(&sql, args![id], org_row)
}

pub fn deleted_organization<D: Db>(db: &mut D, id: &str) -> Result<Organization, StoreError> {
    let sql = format!("SELECT {ORG_COLS} FROM organizations WHERE id = ?1 AND deleted_at IS NOT NULL");
    db.query_one(&sql, args![id], org_row)
}

pub fn api_key_by_public_key<D: Db>(db: &mut D, org: &str, public_key: &str) -> Result<ApiKey, StoreError> {
    let sql = format!("SELECT {API_KEY_COLS} FROM api_keys WHERE organization_id = ?1 AND public_key = ?2");
    db.query_one(&sql, args![org, public_key], api_key_row)
}

/// The columns of a row from `offset` on, read as a row of their own (a joined statement reads
/// several records from one row).
struct Shifted<'a> {
    row: &'a dyn SqlRow,
    offset: usize,
}

impl SqlRow for Shifted<'_> {
    fn value(&self, i: usize) -> Result<Value, StoreError> {
        self.row.value(self.offset + i)
    }
}

/// `cols` of the table `alias` names.
fn qualified(alias: &str, cols: &str) -> String {
    cols.split(", ").map(|c| format!("{alias}.{c}")).collect::<Vec<_>>().join(", ")
}

/// See [`Store::stamp_context`]. The organization's own key sorts before its parent's.
pub fn stamp_context<D: Db>(
    db: &mut D,
    org: &str,
    public_key: &str,
    fingerprint: Option<&str>,
    record_kind: &str,
) -> Result<StampContext, StoreError> {
    // The statement, and where the key's and the user's columns start and the flags follow.
    static SQL: std::sync::LazyLock<(String, usize, usize, usize)> = std::sync::LazyLock::new(|| {
        let count = |cols: &str| cols.split(',').count();
        let key_at = count(ORG_COLS);
        let user_at = key_at + count(API_KEY_COLS);
        let statement = format!(
            "SELECT {}, {}, {},
                k.organization_id <> o.id AS via_parent,
                EXISTS (SELECT 1 FROM activities a WHERE a.fingerprint = ?3),
                EXISTS (SELECT 1 FROM records r WHERE r.kind = ?4 AND (r.organization_id = o.id OR r.organization_id = o.parent_id))
             FROM organizations o
             JOIN api_keys k ON k.public_key = ?2 AND (k.organization_id = o.id OR k.organization_id = o.parent_id)
             LEFT JOIN users u ON u.organization_id = k.organization_id AND u.id = k.user_id
             WHERE o.id = ?1 AND o.deleted_at IS NULL
             ORDER BY via_parent LIMIT 1",
            qualified("o", ORG_COLS),
            qualified("k", API_KEY_COLS),
            qualified("u", USER_COLS)
        );
        (statement, key_at, user_at, user_at + count(USER_COLS))
    });
    let (sql, key_at, user_at, flags) = (&SQL.0, SQL.1, SQL.2, SQL.3);
    db.query_one(sql, args![org, public_key, fingerprint, record_kind], |r| {
        let user = match r.value(user_at)? {
            Value::Null => None,
            _ => Some(user_row(&Shifted { row: r, offset: user_at })?),
        };
        Ok(StampContext {
            organization: org_row(r)?,
            api_key: api_key_row(&Shifted { row: r, offset: key_at })?,
            user,
            via_parent: r.int(flags)? != 0,
            fingerprint_taken: r.int(flags + 1)? != 0,
            has_records_of_kind: r.int(flags + 2)? != 0,
        })
    })
}

pub fn user<D: Db>(db: &mut D, org: &str, id: &str) -> Result<User, StoreError> {
    let sql = format!("SELECT {USER_COLS} FROM users WHERE organization_id = ?1 AND id = ?2");
    db.query_one(&sql, args![org, id], user_row)
}

pub fn names_in_use<D: Db>(db: &mut D, org: &str, kind: Named, names: &[&str]) -> Result<Vec<String>, StoreError> {
    let sql = match kind {
        Named::Wallet => "SELECT name FROM wallets WHERE organization_id = ?1 AND name = ?2",
        Named::PrivateKey => "SELECT name FROM private_keys WHERE organization_id = ?1 AND name = ?2",
    };
    let mut taken = Vec::new();
    for name in names {
        if let Some(n) = db.query_opt(sql, args![org, name], |r| r.text(0))? {
            taken.push(n);
        }
    }
    Ok(taken)
}

fn by_organization<'a>(table: &'a str, cols: &'a str, org: &'a [&'a str]) -> Listing<'a> {
    Listing { table, cols, scope: "organization_id = ?", args: org, order: &["created_at", "id"] }
}

pub fn users_page<D: Db>(db: &mut D, org: &str, page: &Page) -> Result<Vec<User>, StoreError> {
    keyset_page(db, by_organization("users", USER_COLS, &[org]), page, user_row)
}

pub fn api_keys_of_user<D: Db>(db: &mut D, org: &str, user_id: &str) -> Result<Vec<ApiKey>, StoreError> {
    let sql = format!(
        "SELECT {API_KEY_COLS} FROM api_keys WHERE organization_id = ?1 AND user_id = ?2 ORDER BY created_at, id"
    );
    db.query(&sql, args![org, user_id], api_key_row)
}

pub fn wallet<D: Db>(db: &mut D, org: &str, id: &str) -> Result<Wallet, StoreError> {
    let sql = format!("SELECT {WALLET_COLS} FROM wallets WHERE organization_id = ?1 AND id = ?2");
    db.query_one(&sql, args![org, id], wallet_row)
}

pub fn wallets_page<D: Db>(db: &mut D, org: &str, page: &Page) -> Result<Vec<Wallet>, StoreError> {
    keyset_page(db, by_organization("wallets", WALLET_COLS, &[org]), page, wallet_row)
}

pub fn accounts_page<D: Db>(
    db: &mut D,
    org: &str,
    wallet_id: Option<&str>,
    page: &Page,
) -> Result<Vec<WalletAccount>, StoreError> {
    let list = match wallet_id {
        Some(w) => Listing {
            table: "wallet_accounts",
            cols: ACCOUNT_COLS,
            scope: "organization_id = ? AND wallet_id = ?",
            args: &[org, w],
            order: &["seq"],
        },
        None => Listing {
            table: "wallet_accounts",
            cols: ACCOUNT_COLS,
            scope: "organization_id = ?",
            args: &[org],
            order: &["created_at", "wallet_id", "seq"],
        },
    };
    keyset_page(db, list, page, account_row)
}

pub fn account_by_address<D: Db>(db: &mut D, org: &str, address: &str) -> Result<WalletAccount, StoreError> {
    let sql = format!(
        "SELECT {ACCOUNT_COLS} FROM wallet_accounts WHERE organization_id = ?1 AND address = ?2 ORDER BY created_at LIMIT 1"
    );
    db.query_one(&sql, args![org, address], account_row)
}

pub fn private_key<D: Db>(db: &mut D, org: &str, id: &str) -> Result<PrivateKey, StoreError> {
    let sql = format!("SELECT {PRIVATE_KEY_COLS} FROM private_keys WHERE organization_id = ?1 AND id = ?2");
    db.query_one(&sql, args![org, id], private_key_row)
}

pub fn private_keys_page<D: Db>(db: &mut D, org: &str, page: &Page) -> Result<Vec<PrivateKey>, StoreError> {
    keyset_page(db, by_organization("private_keys", PRIVATE_KEY_COLS, &[org]), page, private_key_row)
}

pub fn private_key_by_address<D: Db>(db: &mut D, org: &str, address: &str) -> Result<PrivateKey, StoreError> {
    let sql = format!(
        "SELECT {} FROM private_keys k JOIN private_key_addresses a ON a.private_key_id = k.id
         WHERE a.organization_id = ?1 AND a.address = ?2 ORDER BY k.created_at LIMIT 1",
        PRIVATE_KEY_COLS.split(", ").map(|c| format!("k.{c}")).collect::<Vec<_>>().join(", ")
    );
    db.query_one(&sql, args![org, address], private_key_row)
}

pub fn import_target<D: Db>(db: &mut D, org: &str, user_id: &str) -> Result<ImportTarget, StoreError> {
    db.query_one(
        "SELECT organization_id, user_id, sealed_key, created_at FROM import_targets WHERE organization_id = ?1 AND user_id = ?2",
        args![org, user_id],
        |r| Ok(ImportTarget { organization_id: r.text(0)?, user_id: r.text(1)?, sealed_key: r.bytes(2)?, created_at: r.int(3)? }),
    )
}

pub fn activity<D: Db>(db: &mut D, org: &str, id: &str) -> Result<ActivityRecord, StoreError> {
    let sql = format!("SELECT {ACTIVITY_COLS} FROM activities WHERE organization_id = ?1 AND id = ?2");
    db.query_one(&sql, args![org, id], activity_row)
}

pub fn activity_by_fingerprint<D: Db>(db: &mut D, fingerprint: &str) -> Result<ActivityRecord, StoreError> {
    let sql = format!("SELECT {ACTIVITY_COLS} FROM activities WHERE fingerprint = ?1");
    db.query_one(&sql, args![fingerprint], activity_row)
}

/// Newest first; `after` = older than the cursor, `before` = the page just newer than the
/// cursor (an unknown cursor is ignored). Filters, cursors and the limit are all applied in
/// SQL over the (organization, created_at, id) index: one page reads one page of rows.
pub fn activities<D: Db>(db: &mut D, org: &str, f: &ActivityFilter) -> Result<Vec<ActivityRecord>, StoreError> {
    let mut cursor = |id: &Option<String>| -> Result<Option<(i64, String)>, StoreError> {
        let Some(id) = id else { return Ok(None) };
        db.query_opt(
            "SELECT created_at, id FROM activities WHERE organization_id = ?1 AND id = ?2",
            args![org, id],
            |r| Ok((r.int(0)?, r.text(1)?)),
        )
    };
    let (after, before) = (cursor(&f.after)?, cursor(&f.before)?);
    let mut sql = format!("SELECT {ACTIVITY_COLS} FROM activities WHERE organization_id = ?");
    let mut bound: Vec<Arg<'_>> = vec![Arg::Text(org)];
    for (column, values) in [("status", &f.statuses), ("activity_type", &f.types)] {
        if !values.is_empty() {
            sql.push_str(&format!(" AND {column} IN ({})", vec!["?"; values.len()].join(", ")));
            bound.extend(values.iter().map(|v| Arg::Text(v)));
        }
    }
    if let Some((at, id)) = &after {
        sql.push_str(" AND (created_at < ? OR (created_at = ? AND id < ?))");
        bound.extend([Arg::Int(*at), Arg::Int(*at), Arg::Text(id)]);
    }
    if let Some((at, id)) = &before {
        sql.push_str(" AND (created_at > ? OR (created_at = ? AND id > ?))");
        bound.extend([Arg::Int(*at), Arg::Int(*at), Arg::Text(id)]);
    }
    // Before a cursor: the rows just newer than it, read upwards and turned around.
    let order = if before.is_some() { "ASC" } else { "DESC" };
    sql.push_str(&format!(" ORDER BY created_at {order}, id {order} LIMIT ?"));
    bound.push(Arg::Int(f.limit.min(i64::MAX as usize) as i64));
    let mut items = db.query(&sql, &bound, activity_row)?;
    if before.is_some() {
        items.reverse();
    }
    Ok(items)
}

pub fn record<D: Db>(db: &mut D, org: &str, kind: &str, id: &str) -> Result<Record, StoreError> {
    let sql = format!("SELECT {RECORD_COLS} FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3");
    db.query_one(&sql, args![org, kind, id], record_row)
}

/// The record of `kind` with `id` in whichever organization holds it (ids are UUIDs).
pub fn record_by_id<D: Db>(db: &mut D, kind: &str, id: &str) -> Result<Record, StoreError> {
    let sql = format!("SELECT {RECORD_COLS} FROM records WHERE kind = ?1 AND id = ?2");
    db.query_one(&sql, args![kind, id], record_row)
}

/// Every record of `kind` in every organization (at most 100,000; auth proxy configurations).
pub fn records_of_kind<D: Db>(db: &mut D, kind: &str) -> Result<Vec<Record>, StoreError> {
    let sql = format!("SELECT {RECORD_COLS} FROM records WHERE kind = ?1 ORDER BY created_at, id LIMIT 100000");
    db.query(&sql, args![kind], record_row)
}

pub fn records_page<D: Db>(db: &mut D, org: &str, kind: &str, page: &Page) -> Result<Vec<Record>, StoreError> {
    let list = Listing {
        table: "records",
        cols: RECORD_COLS,
        scope: "organization_id = ? AND kind = ?",
        args: &[org, kind],
        order: &["created_at", "id"],
    };
    keyset_page(db, list, page, record_row)
}

pub fn records_version<D: Db>(db: &mut D, org: &str, kind: &str) -> Result<(i64, i64), StoreError> {
    db.query_one(
        "SELECT COUNT(*), COALESCE(MAX(updated_at), 0) FROM records WHERE organization_id = ?1 AND kind = ?2",
        args![org, kind],
        |r| Ok((r.int(0)?, r.int(1)?)),
    )
}

pub fn ping<D: Db>(db: &mut D) -> Result<(), StoreError> {
    db.query_one("SELECT COUNT(*) FROM schema_migrations", args![], |_| Ok(()))
}

pub fn api_key<D: Db>(db: &mut D, org: &str, id: &str) -> Result<ApiKey, StoreError> {
    let sql = format!("SELECT {API_KEY_COLS} FROM api_keys WHERE organization_id = ?1 AND id = ?2");
    db.query_one(&sql, args![org, id], api_key_row)
}

pub fn api_keys_page<D: Db>(db: &mut D, org: &str, page: &Page) -> Result<Vec<ApiKey>, StoreError> {
    keyset_page(db, by_organization("api_keys", API_KEY_COLS, &[org]), page, api_key_row)
}

pub fn uncertified_credentials<D: Db>(db: &mut D) -> Result<Vec<UncertifiedCredential>, StoreError> {
    let mut out = db.query(
        "SELECT id, organization_id, user_id, credential_type, public_key, expiration_seconds, created_at
         FROM api_keys WHERE length(certificate) = 0 ORDER BY created_at, id",
        args![],
        |r| {
            let expiration = r.opt_int(5)?;
            let created_at = r.int(6)?;
            Ok(UncertifiedCredential {
                kind: CredentialKind::ApiKey,
                id: r.text(0)?,
                organization_id: r.text(1)?,
                user_id: r.text(2)?,
                credential_type: r.text(3)?,
                public_key: r.text(4)?,
                expires_at_ms: expiration
                    .map_or(0, |e| (created_at / 1_000_000).saturating_add(e.saturating_mul(1000)).max(1) as u64),
            })
        },
    )?;
    out.extend(db.query(
        "SELECT id, organization_id, user_id, public_key FROM authenticators
         WHERE length(certificate) = 0 ORDER BY created_at, id",
        args![],
        |r| {
            Ok(UncertifiedCredential {
                kind: CredentialKind::Authenticator,
                id: r.text(0)?,
                organization_id: r.text(1)?,
                user_id: r.text(2)?,
                credential_type: coffer_auth::webauthn::CREDENTIAL_TYPE.to_string(),
                public_key: r.text(3)?,
                expires_at_ms: 0,
            })
        },
    )?);
    out.extend(db.query(
        "SELECT id, organization_id, user_id, issuer, subject, audience FROM oauth_providers
         WHERE length(certificate) = 0 ORDER BY created_at, id",
        args![],
        |r| {
            Ok(UncertifiedCredential {
                kind: CredentialKind::OauthProvider,
                id: r.text(0)?,
                organization_id: r.text(1)?,
                user_id: r.text(2)?,
                credential_type: coffer_auth::grants::OAUTH_PROVIDER.to_string(),
                public_key: coffer_auth::oidc::identity_hash(&r.text(3)?, &r.text(4)?, &r.text(5)?),
                expires_at_ms: 0,
            })
        },
    )?);
    out.extend(db.query(
        "SELECT o.id, o.parent_id FROM organizations o
         WHERE o.parent_id IS NOT NULL AND o.deleted_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM records r WHERE r.organization_id = o.id AND r.kind = 'parent_certificate')
         ORDER BY o.created_at, o.id",
        args![],
        |r| {
            Ok(UncertifiedCredential {
                kind: CredentialKind::ParentOrganization,
                id: r.text(0)?,
                organization_id: r.text(0)?,
                user_id: String::new(),
                credential_type: coffer_auth::grants::PARENT_ORGANIZATION.to_string(),
                public_key: r.text(1)?,
                expires_at_ms: 0,
            })
        },
    )?);
    Ok(out)
}

pub fn user_tag_members<D: Db>(db: &mut D, org: &str) -> Result<Vec<(String, String)>, StoreError> {
    db.query(
        "SELECT m.tag_id, m.user_id FROM user_tags m JOIN records r ON r.kind = m.tag_kind AND r.id = m.tag_id
         WHERE m.organization_id = ?1 ORDER BY r.created_at, r.id, m.user_id",
        args![org],
        |r| Ok((r.text(0)?, r.text(1)?)),
    )
}

pub fn user_tags_of<D: Db>(db: &mut D, org: &str, user_id: &str) -> Result<Vec<String>, StoreError> {
    db.query(
        "SELECT m.tag_id FROM user_tags m JOIN records r ON r.organization_id = m.organization_id
           AND r.kind = m.tag_kind AND r.id = m.tag_id
         WHERE m.user_id = ?2 AND m.organization_id = ?1 ORDER BY r.created_at, r.id",
        args![org, user_id],
        |r| r.text(0),
    )
}

pub fn authenticator<D: Db>(db: &mut D, org: &str, id: &str) -> Result<AuthenticatorRecord, StoreError> {
    let sql = format!("SELECT {AUTHENTICATOR_COLS} FROM authenticators WHERE organization_id = ?1 AND id = ?2");
    db.query_one(&sql, args![org, id], authenticator_row)
}

pub fn authenticator_by_credential_id<D: Db>(
    db: &mut D,
    org: &str,
    credential_id: &str,
) -> Result<AuthenticatorRecord, StoreError> {
    let sql =
        format!("SELECT {AUTHENTICATOR_COLS} FROM authenticators WHERE organization_id = ?1 AND credential_id = ?2");
    db.query_one(&sql, args![org, credential_id], authenticator_row)
}

pub fn authenticators_of_user<D: Db>(
    db: &mut D,
    org: &str,
    user_id: &str,
) -> Result<Vec<AuthenticatorRecord>, StoreError> {
    let sql = format!(
        "SELECT {AUTHENTICATOR_COLS} FROM authenticators WHERE organization_id = ?1 AND user_id = ?2 ORDER BY created_at, id"
    );
    db.query(&sql, args![org, user_id], authenticator_row)
}

pub fn oauth_providers<D: Db>(
    db: &mut D,
    org: &str,
    user_id: Option<&str>,
) -> Result<Vec<OauthProviderRecord>, StoreError> {
    let sql = format!(
        "SELECT {OAUTH_PROVIDER_COLS} FROM oauth_providers WHERE organization_id = ?1
           AND (CAST(?2 AS TEXT) IS NULL OR user_id = CAST(?2 AS TEXT))
         ORDER BY created_at, id"
    );
    db.query(&sql, args![org, user_id], oauth_provider_row)
}

pub fn sub_organization_ids<D: Db>(
    db: &mut D,
    parent: &str,
    filter: &SubOrgFilter,
    page: &Page,
) -> Result<Vec<String>, StoreError> {
    // ?1 parent, ?2..?4 the filter's values, ?5 the `after` cursor, ?6 `before`, ?7 limit. Each
    // is used at least once (`?5 = ?5`...) so that every backend can type every parameter.
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
           AND CAST(?2 AS TEXT) = CAST(?2 AS TEXT) AND CAST(?3 AS TEXT) = CAST(?3 AS TEXT)
           AND CAST(?4 AS TEXT) = CAST(?4 AS TEXT) AND CAST(?5 AS TEXT) = CAST(?5 AS TEXT)
           AND CAST(?6 AS TEXT) = CAST(?6 AS TEXT)
         ORDER BY o.created_at {dir}, o.id {dir} LIMIT ?7"
    );
    let mut ids = db.query(
        &sql,
        args![
            parent,
            values[0],
            values[1],
            values[2],
            page.after.as_deref().unwrap_or_default(),
            page.before.as_deref().unwrap_or_default(),
            page.limit.min(i64::MAX as usize) as i64
        ],
        |r| r.text(0),
    )?;
    if backwards {
        ids.reverse();
    }
    Ok(ids)
}

pub fn organization_footprint<D: Db>(db: &mut D, org: &str) -> Result<Vec<(String, i64)>, StoreError> {
    let mut tables = db.query(D::TABLES_WITH_ORGANIZATION_ID, args![], |r| r.text(0))?;
    tables.push("organizations".into());
    tables.sort();
    let mut out = Vec::with_capacity(tables.len());
    for table in tables {
        let quoted = format!("\"{}\"", table.replace('"', "\"\""));
        let sql = if table == "organizations" {
            format!("SELECT COUNT(*) FROM {quoted} WHERE id = ?1 OR parent_id = ?1")
        } else {
            format!("SELECT COUNT(*) FROM {quoted} WHERE organization_id = ?1")
        };
        let n = db.query_one(&sql, args![org], |r| r.int(0))?;
        out.push((table, n));
    }
    Ok(out)
}

pub fn policy_evaluations<D: Db>(
    db: &mut D,
    org: &str,
    activity_id: &str,
) -> Result<Vec<PolicyEvaluationRecord>, StoreError> {
    let sql = format!(
        "SELECT id, activity_id, organization_id, vote_id, evaluations, created_at FROM policy_evaluations
         WHERE organization_id = ?1 AND activity_id = ?2 ORDER BY created_at, {}",
        D::INSERTION_ORDER
    );
    db.query(&sql, args![org, activity_id], |r| {
        Ok(PolicyEvaluationRecord {
            id: r.text(0)?,
            activity_id: r.text(1)?,
            organization_id: r.text(2)?,
            vote_id: r.text(3)?,
            evaluations: parse_json::<serde_json::Value>(r.text(4)?),
            created_at: r.int(5)?,
        })
    })
}

/// `?N, ?N+1, …` for `n` values from placeholder `first` on.
fn marks(first: usize, n: usize) -> String {
    (first..first + n).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", ")
}

/// Whether a pending delivery is due at `now`, of an endpoint not in `skip` (a read: most polls
/// find nothing, and need not take the writer).
pub fn any_due_webhook_delivery<D: Db>(db: &mut D, now: Nanos, skip: &[String]) -> Result<bool, StoreError> {
    let mut sql = "SELECT 1 FROM webhook_deliveries WHERE status = 'PENDING' AND next_attempt_at <= ?1".to_string();
    if !skip.is_empty() {
        sql.push_str(&format!(" AND endpoint_id NOT IN ({})", marks(2, skip.len())));
    }
    sql.push_str(" LIMIT 1");
    let mut bound = vec![Arg::Int(now)];
    bound.extend(skip.iter().map(|e| Arg::Text(e)));
    db.exists(&sql, &bound)
}

/// Inside a write transaction. The outer `next_attempt_at <= now` is checked again on the row
/// as it is when its lock is had: on PostgreSQL a row another gateway claimed meanwhile no longer
/// matches and is left to it.
pub fn claim_due_webhook_deliveries<D: Db>(
    db: &mut D,
    now: Nanos,
    (lease_until, owner): (Nanos, &str),
    limit: usize,
    skip: &[String],
) -> Result<Vec<WebhookDelivery>, StoreError> {
    let due = "status = 'PENDING' AND next_attempt_at <= ?2";
    let mut bound = vec![Arg::Int(lease_until), Arg::Int(now), Arg::Text(owner)];
    let mut busy = String::new();
    if !skip.is_empty() {
        busy = format!(" AND endpoint_id NOT IN ({})", marks(bound.len() + 1, skip.len()));
        bound.extend(skip.iter().map(|e| Arg::Text(e)));
    }
    bound.push(Arg::Int(limit.min(i64::MAX as usize) as i64));
    let sql = format!(
        "UPDATE webhook_deliveries SET next_attempt_at = ?1, leased_by = ?3
         WHERE id IN (SELECT id FROM webhook_deliveries WHERE {due}{busy} ORDER BY next_attempt_at LIMIT ?{})
           AND {due}
         RETURNING {DELIVERY_COLS}",
        bound.len()
    );
    let mut claimed = db.query(&sql, &bound, delivery_row)?;
    claimed.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    Ok(claimed)
}

/// Inside a write transaction: extends `owner`'s leases of `ids` to `lease_until`; the ids it
/// still held (a lease that lapsed may have been claimed by another gateway since).
pub fn renew_webhook_leases<D: Db>(
    db: &mut D,
    ids: &[String],
    (lease_until, owner): (Nanos, &str),
) -> Result<Vec<String>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "UPDATE webhook_deliveries SET next_attempt_at = ?1
         WHERE leased_by = ?2 AND status = 'PENDING' AND id IN ({})
         RETURNING id",
        marks(3, ids.len())
    );
    let mut bound = vec![Arg::Int(lease_until), Arg::Text(owner)];
    bound.extend(ids.iter().map(|i| Arg::Text(i)));
    db.query(&sql, &bound, |r| r.text(0))
}

/// Rows leased before leases had owners (`leased_by` empty, never attempted) count as `owner`'s:
/// then one gateway held them all.
pub fn release_webhook_leases<D: Db>(db: &mut D, now: Nanos, owner: &str) -> Result<usize, StoreError> {
    let n = db.execute(
        "UPDATE webhook_deliveries SET next_attempt_at = ?1, leased_by = NULL
         WHERE status = 'PENDING' AND next_attempt_at > ?1
           AND (leased_by = ?2 OR (leased_by IS NULL AND attempts = 0))",
        args![now, owner],
    )?;
    Ok(n as usize)
}

/// Inside a write transaction.
pub fn record_webhook_attempts<D: Db>(db: &mut D, attempts: &[(String, WebhookAttempt)]) -> Result<(), StoreError> {
    for (id, a) in attempts {
        let n = db.query_opt(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, status = ?2, next_attempt_at = ?3,
                last_status_code = ?4, last_error = ?5, updated_at = ?6, leased_by = NULL
             WHERE id = ?1 AND status = 'PENDING' RETURNING attempts",
            args![id, a.status, a.next_attempt_at, a.status_code, a.error, a.at],
            |r| r.int(0),
        )?;
        if let Some(n) = n {
            db.execute(
                "INSERT INTO webhook_attempts (delivery_id, attempt, at, status_code, error, duration_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                args![id, n, a.at, a.status_code, a.error, a.duration_ms],
            )?;
        }
    }
    Ok(())
}

pub fn webhook_deliveries<D: Db>(
    db: &mut D,
    org: &str,
    endpoint_id: &str,
    limit: usize,
) -> Result<Vec<WebhookDelivery>, StoreError> {
    let sql = format!(
        "SELECT {DELIVERY_COLS} FROM webhook_deliveries WHERE organization_id = ?1 AND endpoint_id = ?2
         ORDER BY created_at DESC, id DESC LIMIT ?3"
    );
    db.query(&sql, args![org, endpoint_id, limit.min(i64::MAX as usize) as i64], delivery_row)
}

pub fn idempotency_key<D: Db>(db: &mut D, org: &str, key: &str) -> Result<(String, String), StoreError> {
    db.query_one(
        "SELECT intent_hash, activity_id FROM idempotency_keys WHERE organization_id = ?1 AND key = ?2",
        args![org, key],
        |r| Ok((r.text(0)?, r.text(1)?)),
    )
}
