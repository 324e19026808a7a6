//! The enclave tier's durable store ("authority store"): each organization's authority state as
//! versioned opaque entries, the replay window every enclave of a deployment shares (with a quota
//! per organization), and the log of the enclave's decisions. See docs/security.md, "Authority state".
//!
//! Two backends behind one trait ([`EnclaveStore`]): an SQLite file owned by the enclave's user
//! (the default, `sqlite://PATH`), and a PostgreSQL database of the enclave tier for several
//! enclaves (`postgres://…`, with credentials the gateway is never given). [`open`] picks one from
//! the configured URL.
//!
//! This file only declares the modules and re-exports. From the bottom up: `interface` (the
//! types, the trait and [`StoreError`], the one error type of this boundary), `sql` (every
//! statement both backends run, written once over `coffer-sql`), `backend` (what a backend
//! provides, and the [`EnclaveStore`] it gets from `sql`), the backends `sqlite` and `postgres`
//! (connections, durability, the replay window's counting), and `open` on top. No module imports from one above it; the mapping
//! of [`StoreError`] into the enclave's `EnclaveError` lives in `crate::error`.

mod backend;
mod interface;
mod open;
mod postgres;
mod sql;
mod sqlite;

pub use interface::{
    ActivityLink, BallotKept, DecisionRecord, EnclaveStore, Entry, KekRecord, KeptBallot, LatestDecision,
    LinkedActivity, LoggedDecision, NativeKeyCounted, NativeKeyRow, OrgChanges, OrgHead, Remembered, ReplayLane,
    ReplayShare, Spend, StoreError, StoreLimits, DONE_MARK, MAX_BALLOTS_PER_ORGANIZATION, OUTCOME_ALLOW, OUTCOME_DONE,
    OUTCOME_FAILED, OUTCOME_REFUSE, REASON_CONSENSUS_NEEDED, REASON_VOTE_REJECTED,
};
pub use open::{default_url, open, open_existing, redact, StoreSettings};
pub use postgres::PostgresEnclaveStore;
pub use sqlite::SqliteEnclaveStore;
