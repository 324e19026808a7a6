//! Opening the store a URL names.

use super::error::StoreError;
use super::interface::Store;
use super::postgres::{self, PostgresStore};
use super::sqlite::SqliteStore;

/// Opens the store a `store_url` names: `sqlite://PATH` or `postgres://…` (`postgresql://…`).
pub fn open(url: &str) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        return Ok(std::sync::Arc::new(SqliteStore::open(std::path::Path::new(path))?));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(std::sync::Arc::new(PostgresStore::open(url)?));
    }
    Err(StoreError::Backend(format!(
        "unsupported store URL (expected sqlite://PATH or postgres://…): {}",
        postgres::redact(url)
    )))
}
