//! The glue between the gateway's shared SQL and a backend: the connection interface of
//! `coffer-sql` ([`Db`]) with the gateway's own dialect constants ([`Dialect`]), and the JSON and
//! error helpers every feature's SQL uses.

use crate::store::error::{StoreError, Unique};

pub use coffer_sql::{Arg, Db, SqlError, SqlRow, Value};

/// `args![a, b]`: the bound values of a statement, in placeholder order.
#[allow(unused_imports)]
pub(crate) use coffer_sql::args;

/// Where the gateway's SQL differs between SQLite and PostgreSQL beyond what [`Db`] hides: a
/// constant of the connection, not a branch in the shared SQL.
pub trait Dialect: Db + Sized {
    /// Serializes migrations across processes inside the migration transaction (empty: the
    /// write transaction already does).
    const MIGRATION_LOCK: &'static str;
    /// The number of votes of an activity (`votes` holds a JSON array as text).
    const VOTE_COUNT: &'static str;
    /// A column that orders rows of one table by insertion among equal timestamps.
    const INSERTION_ORDER: &'static str;
    /// Names of the tables that have an `organization_id` column, ordered by name.
    const TABLES_WITH_ORGANIZATION_ID: &'static str;
    /// A migration's text in this backend's dialect.
    fn dialect(migration: &str) -> String;
}

pub fn json_text<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

pub fn parse_json<T: serde::de::DeserializeOwned + Default>(s: String) -> T {
    serde_json::from_str(&s).unwrap_or_default()
}

/// Replaces a uniqueness error's message with one for the caller.
pub fn unique_as<E: Into<StoreError>>(message: impl Into<String>) -> impl FnOnce(E) -> StoreError {
    move |e| match e.into() {
        StoreError::Unique(u) => StoreError::Unique(Unique::new(u.constraint, message)),
        other => other,
    }
}
