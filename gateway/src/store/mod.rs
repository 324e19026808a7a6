//! Storage: the `Store` abstraction the gateway runs on, its records, and its two backends
//! (embedded SQLite, PostgreSQL for several gateways), which share one set of SQL (`sql`).
//!
//! Every activity is committed together with its effects (`Write`s) in one transaction; the
//! fingerprint is a unique constraint, so identical submissions can never record twice, even
//! when two gateways commit them at the same moment.
//!
//! This file only declares the modules and re-exports what the gateway uses. Below it, from the
//! bottom up: `error` and `model` (the types), `write`, `interface` (the `Store` trait), `nowait`,
//! `sql` (the shared SQL), `backend` (the `Store` every SQL backend gets), the backends `sqlite`
//! and `postgres`, and `open`, `sign_with` on top. No module imports from one above it.

mod backend;
mod error;
mod interface;
mod model;
pub mod nowait;
mod open;
pub mod outcomes;
mod postgres;
mod sign_with;
pub(crate) mod sql;
mod sqlite;
mod write;

pub use error::{found, Conflict, ConflictKind, Constraint, StoreError, Unique};
pub use interface::{CommitCallback, Store};
pub use model::{
    now_nanos, ActivityFilter, ActivityRecord, AddressEntry, ApiKey, AuthenticatorRecord, Committed, CredentialKind,
    DueSkip, EmailEventRecord, ImportTarget, LogEntry, Named, Nanos, OauthProviderRecord, Organization, Page,
    PolicyEvaluationRecord, PrivateKey, Record, SealedBlobTable, StampContext, StoredBlob, SubOrgFilter,
    UncertifiedCredential, User, Wallet, WalletAccount, WebhookAttempt, WebhookDelivery, DELIVERY_DELIVERED,
    DELIVERY_FAILED, DELIVERY_PENDING,
};
pub use open::{open, open_existing};
pub use postgres::PostgresStore;
pub use sign_with::{sign_with_key, SignWithKey};
pub use sql::{KEPT_ON_DELETION, PURGED_ON_DELETION};
pub use sqlite::SqliteStore;
pub use write::{Write, CONSENSUS_MOVED};
