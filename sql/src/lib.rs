//! SQL written once for SQLite and PostgreSQL: the connection interface ([`Db`]) both drivers
//! implement, the values bound to statements, result rows, the one error type of this boundary,
//! and PostgreSQL's connection pool. Each tier (the gateway's store, the enclave's) writes its
//! statements once over [`Db`] and maps [`SqlError`] into its own error in one place.
//!
//! From the bottom up: `value` (what is bound and read), `db` (the interface and its error), the
//! drivers `sqlite` and `postgres`. No module imports from one above it.

mod db;
mod postgres;
mod sqlite;
mod value;

pub use db::{Db, SqlError, SqlRow, UniqueViolation};
pub use postgres::{off_executor, redact, PgConn, PgPool};
pub use sqlite::sqlite_error;
pub use value::{Arg, ToArg, Value};

/// `args![a, b]`: the bound values of a statement, in placeholder order.
#[macro_export]
macro_rules! args {
    ($($e:expr),* $(,)?) => { &[$($crate::ToArg::to_arg(&$e)),*][..] };
}
