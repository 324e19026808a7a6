//! The glue between the shared SQL and a backend: values bound to statements, result rows, the
//! connection interface ([`Db`]) each backend implements, and the JSON and error helpers every
//! feature's SQL uses.

use crate::store::error::{StoreError, Unique};

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
impl ToArg for [u8] {
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
    ($($e:expr),* $(,)?) => { &[$($crate::store::sql::db::ToArg::to_arg(&$e)),*][..] };
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

pub fn json_text<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

pub fn parse_json<T: serde::de::DeserializeOwned + Default>(s: String) -> T {
    serde_json::from_str(&s).unwrap_or_default()
}

/// Replaces a uniqueness error's message with one for the caller.
pub fn unique_as(message: impl Into<String>) -> impl FnOnce(StoreError) -> StoreError {
    move |e| match e {
        StoreError::Unique(u) => StoreError::Unique(Unique::new(u.constraint, message)),
        other => other,
    }
}
