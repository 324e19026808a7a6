//! The store's SQL, written once for both backends, one module per feature (its columns, row
//! mappers, writes and reads), over the small [`Db`] interface that SQLite and PostgreSQL
//! implement (`db`).
//!
//! Statements use `?N` (or bare `?`) placeholders; PostgreSQL's connection rewrites them to `$N`.
//! Where the dialects differ (transaction start, JSON length, table catalogue, binary literals)
//! the difference is a constant of the [`Db`] implementation or [`Db::dialect`], not a branch here.
//!
//! This file only declares the modules and re-exports what the backends call. `db` and `page`
//! are below every feature module; `commit` (the batch commit and the write dispatcher) is above
//! them all; `stamp` joins organizations, credentials and users; `suborgs` reads organization rows.

mod activities;
mod approvals;
mod commit;
mod credentials;
mod db;
pub mod email_events;
mod migrations;
mod organizations;
mod page;
mod records;
mod sealed_blobs;
mod stamp_context;
mod suborgs;
mod tags;
mod users;
mod wallets;
mod webhooks;

pub use activities::{activities, activity, activity_by_fingerprint, idempotency_key, log_page, unlogged};
pub use approvals::policy_evaluations;
pub use commit::{apply_write, commit_batch};
pub use credentials::{
    api_key, api_key_by_public_key, api_keys_of_user, api_keys_page, authenticator, authenticator_by_credential_id,
    authenticators_of_user, oauth_providers, uncertified_credentials,
};
pub use db::{Db, Dialect};
#[cfg(test)]
pub use migrations::MIGRATIONS;
pub use migrations::{migrate, ping};
pub use organizations::organization;
pub use records::{record, record_by_id, records_of_kind, records_page, records_version};
pub use sealed_blobs::{replace_sealed_blob, sealed_blobs_page};
pub use stamp_context::stamp_context;
pub use suborgs::{
    deleted_organization, organization_footprint, sub_organization_ids, KEPT_ON_DELETION, PURGED_ON_DELETION,
};
pub use tags::{user_tag_members, user_tags_of};
pub use users::{user, users_page};
pub use wallets::{
    account_by_address, account_key_left, accounts_page, import_target, names_in_use, private_key,
    private_key_by_address, private_keys_page, wallet, wallets_page,
};
pub use webhooks::{
    any_due_webhook_delivery, claim_due_webhook_deliveries, record_webhook_attempts, release_webhook_leases,
    renew_webhook_leases, webhook_deliveries,
};
