//! Opening the authority store a URL names: `sqlite://PATH` or `postgres://…` (the password from
//! a file, never from argv).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::interface::{EnclaveStore, StoreError, StoreLimits};
use super::postgres::PostgresEnclaveStore;
use super::sqlite::SqliteEnclaveStore;

pub use super::postgres::redact;

/// Where the authority store is and how to get in.
#[derive(Debug, Clone, Default)]
pub struct StoreSettings {
    /// `sqlite://PATH` or `postgres://USER@HOST[:PORT]/DB` (a Unix socket directory as a
    /// percent-encoded host). A password in the URL works but belongs in `password_file`.
    pub url: String,
    /// A file whose first line is the PostgreSQL password.
    pub password_file: Option<PathBuf>,
    pub limits: StoreLimits,
}

/// The default store: `authority.sqlite` in the directory of the enclave's socket, which is where
/// the enclave keeps its state (`make run`: `$COFFER_HOME`, beside the token).
pub fn default_url(socket: &Path) -> String {
    let dir = socket.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    format!("sqlite://{}", dir.join("authority.sqlite").display())
}

/// Opens the store `settings.url` names only if it exists already: for the operator commands
/// that read what the enclave recorded (`reconcile`), which must never create an empty store in
/// the place a default points to and report on it.
pub fn open_existing(settings: &StoreSettings) -> Result<Arc<dyn EnclaveStore>, StoreError> {
    open_at(settings, true)
}

/// Opens (and migrates) the store `settings.url` names.
pub fn open(settings: &StoreSettings) -> Result<Arc<dyn EnclaveStore>, StoreError> {
    open_at(settings, false)
}

/// What an operator is told when the store a command must read is not there.
fn missing(what: &str) -> StoreError {
    StoreError::Invalid(format!(
        "no authority store {what}: name the enclave's store (authority_store in its configuration, \
         COFFER_AUTHORITY_STORE_URL, or its socket's directory); this command never creates one"
    ))
}

fn open_at(settings: &StoreSettings, must_exist: bool) -> Result<Arc<dyn EnclaveStore>, StoreError> {
    let url = settings.url.trim();
    if let Some(path) = url.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err(StoreError::Invalid("sqlite:// needs a path".into()));
        }
        // An empty file is no store either: SQLite would make one in it.
        if must_exist && std::fs::metadata(path).map_or(true, |m| m.len() == 0) {
            return Err(missing(&format!("at {path}")));
        }
        return Ok(Arc::new(SqliteEnclaveStore::open(Path::new(path), settings.limits)?));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let password = match &settings.password_file {
            Some(file) => {
                let text = zeroize::Zeroizing::new(std::fs::read_to_string(file).map_err(|e| {
                    StoreError::Invalid(format!("reading the authority store password file {}: {e}", file.display()))
                })?);
                let first = text.lines().next().unwrap_or("").trim().to_string();
                if first.is_empty() {
                    return Err(StoreError::Invalid(format!("the password file {} is empty", file.display())));
                }
                Some(zeroize::Zeroizing::new(first))
            }
            None => None,
        };
        let config = PostgresEnclaveStore::config(url, password.as_deref().map(String::as_str))?;
        if must_exist && !PostgresEnclaveStore::exists(&config)? {
            return Err(missing(&format!("in the database {}", redact(url))));
        }
        return Ok(Arc::new(PostgresEnclaveStore::open(config, settings.limits)?));
    }
    Err(StoreError::Invalid(format!(
        "unsupported authority store URL {}: expected sqlite://PATH or postgres://…",
        redact(url)
    )))
}
