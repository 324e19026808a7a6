//! Users: their rows, creation, updates (with their tag memberships), deletion and reads.

use super::db::{args, parse_json, Dialect, SqlRow};
use super::page::{by_organization, keyset_page};
use crate::store::error::StoreError;
use crate::store::model::{Nanos, Page, User};

pub const USER_COLS: &str = "id, organization_id, name, email, phone_number, created_at, updated_at, contacts_verified";
pub fn user_row(r: &dyn SqlRow) -> Result<User, StoreError> {
    Ok(User {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        name: r.text(2)?,
        email: r.opt_text(3)?,
        phone_number: r.opt_text(4)?,
        created_at: r.int(5)?,
        updated_at: r.int(6)?,
        contacts_verified: r.int(7)? != 0,
    })
}

pub fn insert<D: Dialect>(db: &mut D, u: &User) -> Result<(), StoreError> {
    db.execute(
        &format!("INSERT INTO users ({USER_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
        args![
            u.id,
            u.organization_id,
            u.name,
            u.email,
            u.phone_number,
            u.created_at,
            u.updated_at,
            u.contacts_verified as i64
        ],
    )?;
    Ok(())
}

/// See `Write::UpdateUser`.
#[allow(clippy::too_many_arguments)]
pub fn update<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    id: &str,
    name: Option<&str>,
    email: Option<&str>,
    phone_number: Option<&str>,
    tag_ids: Option<&[String]>,
    updated_at: Nanos,
) -> Result<(), StoreError> {
    // `?4`/`?5` absent: unchanged; empty: cleared.
    let n = db.execute(
        // A contact that changes is no longer the sign-up's (as the authority state's update).
        "UPDATE users SET name = COALESCE(CAST(?3 AS TEXT), name),
                    contacts_verified = CASE
                        WHEN CAST(?4 AS TEXT) IS NOT NULL AND COALESCE(email, '') <> CAST(?4 AS TEXT) THEN 0
                        WHEN CAST(?5 AS TEXT) IS NOT NULL AND COALESCE(phone_number, '') <> CAST(?5 AS TEXT) THEN 0
                        ELSE contacts_verified END,
                    email = CASE WHEN CAST(?4 AS TEXT) IS NULL THEN email WHEN CAST(?4 AS TEXT) = '' THEN NULL ELSE CAST(?4 AS TEXT) END,
                    phone_number = CASE WHEN CAST(?5 AS TEXT) IS NULL THEN phone_number WHEN CAST(?5 AS TEXT) = '' THEN NULL ELSE CAST(?5 AS TEXT) END,
                    updated_at = ?6
                 WHERE organization_id = ?1 AND id = ?2",
        args![organization_id, id, name, email, phone_number, updated_at],
    )?;
    if n != 1 {
        return Err(StoreError::conflict(format!("user not found: {id}")));
    }
    if let Some(tags) = tag_ids {
        db.execute("DELETE FROM user_tags WHERE user_id = ?1", args![id])?;
        for tag in tags {
            if !db.exists(
                "SELECT 1 FROM records WHERE organization_id = ?1 AND kind = 'user_tag' AND id = ?2",
                args![organization_id, tag],
            )? {
                return Err(StoreError::conflict(format!("user tag not found: {tag}")));
            }
            db.execute(
                "INSERT INTO user_tags (organization_id, tag_id, user_id) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                args![organization_id, tag, id],
            )?;
        }
    }
    Ok(())
}

/// See `Write::DeleteUsers`.
pub fn delete<D: Dialect>(db: &mut D, organization_id: &str, ids: &[String]) -> Result<(), StoreError> {
    let roots =
        db.query_opt("SELECT root_user_ids FROM organizations WHERE id = ?1", args![organization_id], |r| r.text(0))?;
    let roots: Vec<String> = roots.map(parse_json).unwrap_or_default();
    for id in ids {
        if roots.contains(id) {
            return Err(StoreError::conflict(format!("cannot delete a root quorum member: {id}")));
        }
        db.execute(
            "DELETE FROM import_targets WHERE organization_id = ?1 AND user_id = ?2",
            args![organization_id, id],
        )?;
        // API keys and tag memberships go with the user (ON DELETE CASCADE).
        let n = db.execute("DELETE FROM users WHERE organization_id = ?1 AND id = ?2", args![organization_id, id])?;
        if n != 1 {
            return Err(StoreError::conflict(format!("user not found: {id}")));
        }
    }
    Ok(())
}

pub fn user<D: Dialect>(db: &mut D, org: &str, id: &str) -> Result<User, StoreError> {
    let sql = format!("SELECT {USER_COLS} FROM users WHERE organization_id = ?1 AND id = ?2");
    db.query_one(&sql, args![org, id], user_row)
}

pub fn users_page<D: Dialect>(db: &mut D, org: &str, page: &Page) -> Result<Vec<User>, StoreError> {
    keyset_page(db, by_organization("users", USER_COLS, &[org]), page, user_row)
}

/// See `Write::MarkContactsVerified`.
pub fn mark_contacts_verified<D: Dialect>(db: &mut D, organization_id: &str, id: &str) -> Result<(), StoreError> {
    let n = db.execute(
        "UPDATE users SET contacts_verified = 1 WHERE id = ?1 AND organization_id = ?2",
        args![id, organization_id],
    )?;
    if n == 0 {
        return Err(StoreError::conflict(format!("user not found: {id}")));
    }
    Ok(())
}
