//! The connection interface both drivers implement ([`Db`]), a result row ([`SqlRow`]), and
//! [`SqlError`], the one error type of this boundary: typed, so that callers decide on what went
//! wrong, never on a driver's message.

use crate::value::{Arg, Value};

/// What a statement or a driver reported. Each tier maps it into its own error in one place.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SqlError {
    /// [`Db::query_one`] found no row.
    #[error("not found")]
    NotFound,
    /// A uniqueness constraint fired.
    #[error("{0}")]
    Unique(UniqueViolation),
    /// A transient lock conflict (SQLite's SQLITE_BUSY): retrying can succeed.
    #[error("database busy")]
    Busy,
    /// PostgreSQL chose this transaction to break a deadlock; it was rolled back whole and can be
    /// run again.
    #[error("deadlock: {0}")]
    Deadlock(String),
    /// The database holds something it should not (a corrupt file or index, a column of the
    /// wrong type).
    #[error("database corrupt: {0}")]
    Corrupt(String),
    /// Another integrity constraint fired (a check, a value that may not be null, a reference):
    /// the statement asked for something the schema forbids; running it again cannot succeed.
    #[error("constraint failed: {0}")]
    Constraint(String),
    /// Anything else (connection, I/O, a statement the database refused).
    #[error("database error: {0}")]
    Backend(String),
}

/// A uniqueness constraint that fired. `constraint` is what the driver names it by: PostgreSQL's
/// constraint name (`records_organization_id_kind_name_key`), SQLite's list of its columns
/// (`records.organization_id, records.kind, records.name`). Read by the tier's one mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniqueViolation {
    pub constraint: String,
    pub message: String,
}

impl std::fmt::Display for UniqueViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// One result row, read by column index.
pub trait SqlRow {
    fn value(&self, i: usize) -> Result<Value, SqlError>;
    fn int(&self, i: usize) -> Result<i64, SqlError> {
        match self.value(i)? {
            Value::Int(v) => Ok(v),
            other => Err(column_type(i, "integer", &other)),
        }
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>, SqlError> {
        match self.value(i)? {
            Value::Null => Ok(None),
            Value::Int(v) => Ok(Some(v)),
            other => Err(column_type(i, "integer", &other)),
        }
    }
    fn text(&self, i: usize) -> Result<String, SqlError> {
        match self.value(i)? {
            Value::Text(s) => Ok(s),
            other => Err(column_type(i, "text", &other)),
        }
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>, SqlError> {
        match self.value(i)? {
            Value::Null => Ok(None),
            Value::Text(s) => Ok(Some(s)),
            other => Err(column_type(i, "text", &other)),
        }
    }
    fn bytes(&self, i: usize) -> Result<Vec<u8>, SqlError> {
        match self.value(i)? {
            Value::Bytes(b) => Ok(b),
            // SQLite keeps what was bound: an empty default written as x'' is a blob, but be lenient.
            Value::Text(s) => Ok(s.into_bytes()),
            other => Err(column_type(i, "bytes", &other)),
        }
    }
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>, SqlError> {
        match self.value(i)? {
            Value::Null => Ok(None),
            _ => self.bytes(i).map(Some),
        }
    }
    /// A boolean as both dialects answer one (`EXISTS (...)`: SQLite 0/1, PostgreSQL `bool`).
    fn flag(&self, i: usize) -> Result<bool, SqlError> {
        Ok(self.int(i)? != 0)
    }
}

fn column_type(i: usize, want: &str, got: &Value) -> SqlError {
    let got = match got {
        Value::Null => "null",
        Value::Int(_) => "integer",
        Value::Text(_) => "text",
        Value::Bytes(_) => "bytes",
    };
    SqlError::Corrupt(format!("column {i}: expected {want}, found {got}"))
}

/// A database connection as SQL written once needs it. Implemented by SQLite's connection and
/// PostgreSQL's [`crate::PgConn`]; statements are prepared once per connection and cached.
/// Statements use `?N` (or bare `?`) placeholders; PostgreSQL's connection rewrites them to `$N`.
pub trait Db {
    /// Starts a write transaction (SQLite takes the write lock up front).
    const BEGIN_WRITE: &'static str;

    /// Runs a statement; how many rows it changed.
    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, SqlError>;
    /// Runs a query and maps every row (`f`'s error is the caller's own, so that a tier's row
    /// mappers return its error type).
    fn query<T, E: From<SqlError>>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        f: impl FnMut(&dyn SqlRow) -> Result<T, E>,
    ) -> Result<Vec<T>, E>;
    /// Runs statements without parameters (transaction control, migrations).
    fn batch(&mut self, sql: &str) -> Result<(), SqlError>;
    /// Marks the connection unusable (a transaction it could not end): a pool drops it rather
    /// than hand it to the next caller inside that transaction.
    fn discard(&mut self) {}

    /// The first row, if any.
    fn query_opt<T, E: From<SqlError>>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        f: impl FnMut(&dyn SqlRow) -> Result<T, E>,
    ) -> Result<Option<T>, E> {
        Ok(self.query(sql, args, f)?.into_iter().next())
    }
    /// The first row, or [`SqlError::NotFound`].
    fn query_one<T, E: From<SqlError>>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        f: impl FnMut(&dyn SqlRow) -> Result<T, E>,
    ) -> Result<T, E> {
        self.query_opt(sql, args, f)?.ok_or(SqlError::NotFound.into())
    }
    /// Whether a row matches.
    fn exists(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<bool, SqlError> {
        Ok(self.query_opt(sql, args, |_| Ok::<_, SqlError>(()))?.is_some())
    }
    /// Runs `f` in a savepoint: its changes are kept if it succeeds and undone if it fails,
    /// and a failure leaves the enclosing transaction usable.
    fn savepoint<T, E: From<SqlError>>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, E>) -> Result<T, E>
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
    /// Runs `f` in a write transaction, committed if it succeeds, rolled back if it fails.
    fn transaction<T, E: From<SqlError>>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, E>) -> Result<T, E>
    where
        Self: Sized,
    {
        self.batch(Self::BEGIN_WRITE)?;
        let outcome = f(self).and_then(|v| self.batch("COMMIT").map(|()| v).map_err(E::from));
        // A failed COMMIT may leave the transaction open (SQLite's disk full, I/O error): it is
        // rolled back like a failed `f`, and a connection that cannot roll back is not reused.
        if outcome.is_err() && self.batch("ROLLBACK").is_err() {
            self.discard();
        }
        outcome
    }
}
