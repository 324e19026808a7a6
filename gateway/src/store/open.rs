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

fn open_at(url: &str, must_exist: bool) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    let missing = |what: String| {
        StoreError::Backend(format!(
            "no gateway store {what}: name the gateway's store (--store-url, COFFER_STORE_URL or store_url in \
             --config); this command never creates one"
        ))
    };
    if let Some(path) = url.strip_prefix("sqlite://") {
        // An empty file is no store either: SQLite would make one in it.
        if must_exist && std::fs::metadata(path).map_or(true, |m| m.len() == 0) {
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
