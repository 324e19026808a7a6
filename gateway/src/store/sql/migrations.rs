//! The schema: numbered migrations, applied once each, in order.

use super::db::{args, Dialect};
use crate::store::error::StoreError;

/// Applied in order, once each, by both backends (in each one's dialect); append new files,
/// never edit applied ones. The number of a migration is its place here.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_core.sql"),
    include_str!("../migrations/0002_records.sql"),
    include_str!("../migrations/0003_users.sql"),
    include_str!("../migrations/0004_credentials.sql"),
    include_str!("../migrations/0005_suborgs.sql"),
    include_str!("../migrations/0006_votes.sql"),
    include_str!("../migrations/0007_certificates.sql"),
    include_str!("../migrations/0008_activity_pages.sql"),
    include_str!("../migrations/0009_list_pages.sql"),
    include_str!("../migrations/0010_webhook_deliveries.sql"),
    include_str!("../migrations/0011_deleted_organizations.sql"),
    include_str!("../migrations/0012_login.sql"),
    include_str!("../migrations/0013_webhook_leases.sql"),
    include_str!("../migrations/0014_redundant_indexes.sql"),
    include_str!("../migrations/0015_record_counts.sql"),
    include_str!("../migrations/0016_proofs.sql"),
    include_str!("../migrations/0017_verified_contacts.sql"),
    include_str!("../migrations/0018_webhook_top_level.sql"),
    include_str!("../migrations/0019_email_events.sql"),
];

/// Brings the schema to the latest version, in one transaction (several gateways starting at
/// once apply each migration once). A database newer than this build is refused: an older
/// gateway must not write to a schema it does not know.
pub fn migrate<D: Dialect>(db: &mut D) -> Result<(), StoreError> {
    db.transaction(|db| {
        if !D::MIGRATION_LOCK.is_empty() {
            db.batch(D::MIGRATION_LOCK)?;
        }
        db.batch("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY)")?;
        let done = db.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", args![], |r| r.int(0))?;
        let known = MIGRATIONS.len() as i64;
        if done > known {
            return Err(StoreError::Backend(format!(
                "the database schema is at version {done}, newer than this build knows ({known}): upgrade the gateway"
            )));
        }
        for (i, sql) in MIGRATIONS.iter().enumerate() {
            let version = i as i64 + 1;
            if version <= done {
                continue;
            }
            db.batch(&D::dialect(sql))?;
            db.execute("INSERT INTO schema_migrations (version) VALUES (?1)", args![version])?;
        }
        Ok(())
    })
}

/// A read that succeeds when the database answers and is migrated (`/healthz`).
pub fn ping<D: Dialect>(db: &mut D) -> Result<(), StoreError> {
    db.query_one("SELECT COUNT(*) FROM schema_migrations", args![], |_| Ok(()))
}
