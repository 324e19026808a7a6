//! Organizations: their rows, creation, root quorum, and the live-organization read.

use super::db::{args, json_text, parse_json, Dialect, SqlRow};
use crate::store::error::StoreError;
use crate::store::model::{Nanos, Organization};

pub const ORG_COLS: &str = "id, name, parent_id, root_quorum_threshold, root_user_ids, created_at, updated_at";
pub fn org_row(r: &dyn SqlRow) -> Result<Organization, StoreError> {
    Ok(Organization {
        id: r.text(0)?,
        name: r.text(1)?,
        parent_id: r.opt_text(2)?,
        root_quorum_threshold: r.int(3)?,
        root_user_ids: parse_json(r.text(4)?),
        created_at: r.int(5)?,
        updated_at: r.int(6)?,
    })
}

pub fn insert<D: Dialect>(db: &mut D, o: &Organization) -> Result<(), StoreError> {
    db.execute(
        &format!("INSERT INTO organizations ({ORG_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
        args![
            o.id,
            o.name,
            o.parent_id,
            o.root_quorum_threshold,
            json_text(&o.root_user_ids),
            o.created_at,
            o.updated_at
        ],
    )?;
    Ok(())
}

/// Renames organization `organization_id`.
pub fn rename<D: Dialect>(db: &mut D, organization_id: &str, name: &str, updated_at: Nanos) -> Result<(), StoreError> {
    let n = db.execute(
        "UPDATE organizations SET name = ?2, updated_at = ?3 WHERE id = ?1",
        args![organization_id, name, updated_at],
    )?;
    if n == 0 {
        return Err(StoreError::conflict(format!("organization not found: {organization_id}")));
    }
    Ok(())
}

/// Sets the root quorum; every user must be in the organization.
pub fn set_root_quorum<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    threshold: i64,
    user_ids: &[String],
    updated_at: Nanos,
) -> Result<(), StoreError> {
    for user in user_ids {
        if !db.exists("SELECT 1 FROM users WHERE organization_id = ?1 AND id = ?2", args![organization_id, user])? {
            return Err(StoreError::conflict(format!("user not found: {user}")));
        }
    }
    let n = db.execute(
        "UPDATE organizations SET root_quorum_threshold = ?2, root_user_ids = ?3, updated_at = ?4 WHERE id = ?1",
        args![organization_id, threshold, json_text(user_ids), updated_at],
    )?;
    if n != 1 {
        return Err(StoreError::conflict(format!("organization not found: {organization_id}")));
    }
    Ok(())
}

pub fn organization<D: Dialect>(db: &mut D, id: &str) -> Result<Organization, StoreError> {
    let sql = format!("SELECT {ORG_COLS} FROM organizations WHERE id = ?1 AND deleted_at IS NULL");
    db.query_one(&sql, args![id], org_row)
}
