//! Sub-organizations: deletion (what goes, what stays as a tombstone), the deleted
//! organization's read, the filtered list of a parent's sub-organizations, and the footprint
//! audit of what an organization holds.

use super::db::{args, Dialect};
use super::organizations::{org_row, ORG_COLS};
use crate::store::error::{Conflict, ConflictKind, StoreError};
use crate::store::model::{Nanos, Organization, Page, SubOrgFilter};

/// What a deleted sub-organization loses, children before parents: every credential, key,
/// record and pending delivery. Its activities and policy evaluations stay (the audit trail), as
/// does its organization row, as a tombstone. A test checks that every table holding an
/// `organization_id` is either here or kept on purpose.
pub const PURGED_ON_DELETION: &[&str] = &[
    "api_keys",
    "authenticators",
    "oauth_providers",
    "user_tags",
    "import_targets",
    "users",
    "wallet_accounts",
    "wallets",
    "private_key_addresses",
    "private_keys",
    "records",
    "record_counts",
    "email_events",
    "idempotency_keys",
    "webhook_deliveries",
];
/// Kept when a sub-organization is deleted.
pub const KEPT_ON_DELETION: &[&str] = &["activities", "activity_log", "policy_evaluations", "organizations"];

/// See `Write::DeleteSubOrganization`.
pub fn delete_sub_organization<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    parent_id: &str,
    activity_id: &str,
    require_exported: bool,
    deleted_at: Nanos,
) -> Result<(), StoreError> {
    let parent = db.query_opt(
        "SELECT parent_id FROM organizations WHERE id = ?1 AND deleted_at IS NULL",
        args![organization_id],
        |r| r.opt_text(0),
    )?;
    match parent {
        None => return Err(StoreError::conflict(format!("organization not found: {organization_id}"))),
        Some(p) if p.as_deref() != Some(parent_id) => {
            return Err(StoreError::conflict(format!(
                "organization {organization_id} is not a sub-organization of {parent_id}"
            )))
        }
        Some(_) => {}
    }
    if require_exported {
        let unexported = db.query_opt(
            "SELECT 'wallet ' || id FROM wallets WHERE organization_id = ?1 AND exported = 0
                     UNION ALL SELECT 'private key ' || id FROM private_keys WHERE organization_id = ?1 AND exported = 0
                     LIMIT 1",
            args![organization_id],
            |r| r.text(0),
        )?;
        if let Some(what) = unexported {
            return Err(StoreError::Conflict(Conflict::new(ConflictKind::NotExported, format!(
                "wallet account has not been exported: {what} was never exported; pass deleteWithoutExport: true to delete the sub-organization anyway"
            ))));
        }
    }
    for table in PURGED_ON_DELETION {
        if *table == "webhook_deliveries" {
            db.execute(
                "DELETE FROM webhook_attempts WHERE delivery_id IN
                         (SELECT id FROM webhook_deliveries WHERE organization_id = ?1)",
                args![organization_id],
            )?;
        }
        db.execute(&format!("DELETE FROM {table} WHERE organization_id = ?1"), args![organization_id])?;
    }
    db.execute(
        "UPDATE organizations SET deleted_at = ?2, deletion_activity_id = ?3, root_user_ids = '[]', updated_at = ?2
                 WHERE id = ?1",
        args![organization_id, deleted_at, activity_id],
    )?;
    Ok(())
}

pub fn deleted_organization<D: Dialect>(db: &mut D, id: &str) -> Result<Organization, StoreError> {
    let sql = format!("SELECT {ORG_COLS} FROM organizations WHERE id = ?1 AND deleted_at IS NOT NULL");
    db.query_one(&sql, args![id], org_row)
}

pub fn sub_organization_ids<D: Dialect>(
    db: &mut D,
    parent: &str,
    filter: &SubOrgFilter,
    page: &Page,
) -> Result<Vec<String>, StoreError> {
    // ?1 parent, ?2..?4 the filter's values, ?5 the `after` cursor, ?6 `before`, ?7 limit. Each
    // is used at least once (`?5 = ?5`...) so that every backend can type every parameter.
    let (cond, values): (&str, [&str; 3]) = match filter {
        SubOrgFilter::All => ("", ["", "", ""]),
        SubOrgFilter::Name(v) => ("AND o.name = ?2", [v, "", ""]),
        SubOrgFilter::Username(v) => ("AND o.id IN (SELECT organization_id FROM users WHERE name = ?2)", [v, "", ""]),
        SubOrgFilter::Email(v) => {
            ("AND o.id IN (SELECT organization_id FROM users WHERE lower(email) = lower(?2))", [v, "", ""])
        }
        SubOrgFilter::PhoneNumber(v) => {
            ("AND o.id IN (SELECT organization_id FROM users WHERE phone_number = ?2)", [v, "", ""])
        }
        SubOrgFilter::VerifiedEmail(v) => (
            "AND o.id IN (SELECT organization_id FROM users WHERE lower(email) = lower(?2) AND contacts_verified <> 0)",
            [v, "", ""],
        ),
        SubOrgFilter::VerifiedPhoneNumber(v) => (
            "AND o.id IN (SELECT organization_id FROM users WHERE phone_number = ?2 AND contacts_verified <> 0)",
            [v, "", ""],
        ),
        SubOrgFilter::CredentialId(v) => {
            ("AND o.id IN (SELECT organization_id FROM authenticators WHERE credential_id = ?2)", [v, "", ""])
        }
        SubOrgFilter::PublicKey(v) => (
            "AND (o.id IN (SELECT organization_id FROM api_keys WHERE public_key = ?2)
                  OR o.id IN (SELECT organization_id FROM authenticators WHERE public_key = ?2))",
            [v, "", ""],
        ),
        SubOrgFilter::ProvenPublicKey(v) => (
            "AND (o.id IN (SELECT organization_id FROM api_keys WHERE public_key = ?2)
                  OR o.id IN (SELECT organization_id FROM authenticators WHERE public_key = ?2))
             AND o.id IN (SELECT organization_id FROM records WHERE kind = ?3 AND id = ?2)",
            [v, crate::record_kinds::PROVEN_KEY, ""],
        ),
        SubOrgFilter::WalletAccountAddress(v) => {
            let hex = v.len() > 2
                && (v.starts_with("0x") || v.starts_with("0X"))
                && v[2..].bytes().all(|b| b.is_ascii_hexdigit());
            (
                "AND o.id IN (SELECT organization_id FROM wallet_accounts
                              WHERE lower(address) = lower(?2) AND (?3 = 'any case' OR address = ?2))",
                [v, if hex { "any case" } else { "" }, ""],
            )
        }
        SubOrgFilter::OauthIdentity { issuer, subject, audience } => (
            "AND o.id IN (SELECT organization_id FROM oauth_providers WHERE issuer = ?2 AND subject = ?3 AND audience = ?4)",
            [issuer, subject, audience],
        ),
    };
    let after = match page.after {
        Some(_) => "AND (o.created_at, o.id) > (SELECT c.created_at, c.id FROM organizations c WHERE c.id = ?5)",
        None => "",
    };
    let before = match page.before {
        Some(_) => "AND (o.created_at, o.id) < (SELECT c.created_at, c.id FROM organizations c WHERE c.id = ?6)",
        None => "",
    };
    // Only `before`: the page just before the cursor, read backwards, then put in order.
    let backwards = page.before.is_some() && page.after.is_none();
    let dir = if backwards { "DESC" } else { "ASC" };
    let sql = format!(
        "SELECT o.id FROM organizations o WHERE o.parent_id = ?1 AND o.deleted_at IS NULL {cond} {after} {before}
           AND CAST(?2 AS TEXT) = CAST(?2 AS TEXT) AND CAST(?3 AS TEXT) = CAST(?3 AS TEXT)
           AND CAST(?4 AS TEXT) = CAST(?4 AS TEXT) AND CAST(?5 AS TEXT) = CAST(?5 AS TEXT)
           AND CAST(?6 AS TEXT) = CAST(?6 AS TEXT)
         ORDER BY o.created_at {dir}, o.id {dir} LIMIT ?7"
    );
    let mut ids = db.query(
        &sql,
        args![
            parent,
            values[0],
            values[1],
            values[2],
            page.after.as_deref().unwrap_or_default(),
            page.before.as_deref().unwrap_or_default(),
            page.limit.min(i64::MAX as usize) as i64
        ],
        |r| r.text(0),
    )?;
    if backwards {
        ids.reverse();
    }
    Ok(ids)
}

pub fn organization_footprint<D: Dialect>(db: &mut D, org: &str) -> Result<Vec<(String, i64)>, StoreError> {
    let mut tables = db.query(D::TABLES_WITH_ORGANIZATION_ID, args![], |r| r.text(0))?;
    tables.push("organizations".into());
    tables.sort();
    let mut out = Vec::with_capacity(tables.len());
    for table in tables {
        let quoted = format!("\"{}\"", table.replace('"', "\"\""));
        let sql = if table == "organizations" {
            format!("SELECT COUNT(*) FROM {quoted} WHERE id = ?1 OR parent_id = ?1")
        } else {
            format!("SELECT COUNT(*) FROM {quoted} WHERE organization_id = ?1")
        };
        let n = db.query_one(&sql, args![org], |r| r.int(0))?;
        out.push((table, n));
    }
    Ok(out)
}
