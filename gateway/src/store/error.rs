//! The store's errors, typed so that callers decide on what went wrong rather than on message
//! text.

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    /// A precondition checked inside the transaction failed; the message is caller-facing.
    #[error("{0}")]
    Conflict(Conflict),
    /// A uniqueness constraint fired; the message names what must be unique.
    #[error("{0}")]
    Unique(Unique),
    #[error("database error: {0}")]
    Backend(String),
    /// A transient lock conflict (SQLite's SQLITE_BUSY); reads are retried.
    #[error("database busy")]
    Busy,
    /// A store call in no-wait mode gave up rather than wait ([`crate::store::nowait`]): the
    /// caller reruns it where waiting is allowed. An expected retry, never a failure to log.
    #[error("the store call would wait (retried off the executor)")]
    WouldWait,
}

/// The SQL layer's errors as the store's: the one place a driver's report becomes a decision
/// (which uniqueness constraint fired, a busy lock to retry).
impl From<coffer_sql::SqlError> for StoreError {
    fn from(e: coffer_sql::SqlError) -> Self {
        use coffer_sql::SqlError;
        match e {
            SqlError::NotFound => StoreError::NotFound,
            SqlError::Busy => StoreError::Busy,
            SqlError::Unique(u) => {
                // PostgreSQL names the constraint, SQLite its columns.
                let record_name = u.constraint == "records_organization_id_kind_name_key"
                    || u.constraint.split(", ").any(|c| c == "records.name");
                let constraint = if record_name { Constraint::RecordName } else { Constraint::Other };
                StoreError::Unique(Unique::new(constraint, u.message))
            }
            SqlError::Deadlock(m) | SqlError::Corrupt(m) | SqlError::Constraint(m) | SqlError::Backend(m) => {
                StoreError::Backend(m)
            }
        }
    }
}

/// Which precondition failed, where a caller answers one differently from the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictKind {
    /// Any other: a row that is missing or was changed meanwhile, a lost race, ...
    Precondition,
    /// A wallet or private key that was never exported, deleted with `require_exported`.
    NotExported,
    /// An activity no longer awaits the vote being recorded ([`crate::store::CONSENSUS_MOVED`]):
    /// another vote moved it first; the voter re-reads it and tries again.
    ConsensusMoved,
}

/// A failed precondition: its kind and its caller-facing message. It reads as its message
/// (`Deref` to `str`, equal to a string with the same text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub kind: ConflictKind,
    pub message: String,
}

impl Conflict {
    /// A wallet or private key (`what`: "wallet <id>", "private key <id>") deleted without
    /// `deleteWithoutExport` that was never exported.
    pub fn not_exported(what: &str) -> Self {
        Self::new(
            ConflictKind::NotExported,
            format!(
                "wallet account has not been exported: {what} was never exported; pass deleteWithoutExport: true to delete it anyway"
            ),
        )
    }

    pub fn new(kind: ConflictKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
}

impl StoreError {
    /// A failed precondition of no particular kind ([`ConflictKind::Precondition`]).
    pub fn conflict(message: impl Into<String>) -> Self {
        StoreError::Conflict(Conflict::new(ConflictKind::Precondition, message))
    }
}

/// Which uniqueness constraint fired, as the backend's driver reports it (each backend reads its
/// own driver's error; the shared SQL decides on this).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Constraint {
    /// A record's name, unique per organization and kind.
    RecordName,
    /// Any other.
    Other,
}

/// A uniqueness constraint that fired: which one, and the message (the driver's, until the
/// shared SQL replaces it with one for the caller). It reads as its message, like [`Conflict`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unique {
    pub constraint: Constraint,
    pub message: String,
}

impl Unique {
    pub fn new(constraint: Constraint, message: impl Into<String>) -> Self {
        Self { constraint, message: message.into() }
    }
}

macro_rules! reads_as_message {
    ($t:ty) => {
        impl std::ops::Deref for $t {
            type Target = str;
            fn deref(&self) -> &str {
                &self.message
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.message)
            }
        }
        impl PartialEq<str> for $t {
            fn eq(&self, other: &str) -> bool {
                self.message == other
            }
        }
        impl PartialEq<&str> for $t {
            fn eq(&self, other: &&str) -> bool {
                self.message == *other
            }
        }
    };
}
reads_as_message!(Conflict);
reads_as_message!(Unique);

/// `Ok(None)` for a record that is not there, so lookups can fall through to the next kind.
pub fn found<T>(r: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(StoreError::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
}
