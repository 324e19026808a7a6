//! Opening the store a URL names.

use super::error::StoreError;
use super::interface::Store;
use super::postgres::{self, PostgresStore};
use super::sqlite::SqliteStore;

/// Opens the store a `store_url` names: `sqlite://PATH` or `postgres://…` (`postgresql://…`).
pub fn open(url: &str) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    open_at(url, false)
}

/// [`open`] for an operator command, which never creates a store: a missing or empty SQLite
/// file, or a PostgreSQL database without the gateway's schema, is refused and left as it was.
pub fn open_existing(url: &str) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    open_at(url, true)
}

/// Whether `path` is an SQLite file with the gateway's schema, read without creating anything.
fn sqlite_has_schema(path: &std::path::Path) -> bool {
    if !path.is_file() {
        return false;
    }
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    rusqlite::Connection::open_with_flags(path, flags)
        .and_then(|c| {
            c.query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations')",
                [],
                |r| r.get::<_, bool>(0),
            )
        })
        .unwrap_or(false)
}

fn open_at(url: &str, must_exist: bool) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    let missing = |what: String| {
        StoreError::Backend(format!(
            "no gateway store {what}: name the gateway's store (--store-url, COFFER_STORE_URL or store_url in \
             --config); this command never creates one"
        ))
    };
    if let Some(path) = url.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err(StoreError::Backend("sqlite:// needs a path".into()));
        }
        // A file holding the gateway's schema: not an empty one (SQLite would make a store in
        // it), nor another database (the enclave's authority store, say), nor a directory.
        if must_exist && !sqlite_has_schema(std::path::Path::new(path)) {
            return Err(missing(format!("at {path}")));
        }
        return Ok(std::sync::Arc::new(SqliteStore::open(std::path::Path::new(path))?));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        if must_exist && !PostgresStore::exists(url)? {
            return Err(missing(format!("in {}", postgres::redact(url))));
        }
        return Ok(std::sync::Arc::new(PostgresStore::open(url)?));
    }
    Err(StoreError::Backend(format!(
        "unsupported store URL (expected sqlite://PATH or postgres://…): {}",
        postgres::redact(url)
    )))
}
