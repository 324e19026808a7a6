//! Tags of users (`user_tags` rows) and of private keys (each key's `tags` list); the tags
//! themselves are records.

use super::db::{args, json_text, parse_json, unique_as, Dialect};
use crate::store::error::StoreError;
use crate::store::model::Nanos;

/// See `Write::UpdateTag`.
#[allow(clippy::too_many_arguments)]
pub fn update<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    kind: &str,
    id: &str,
    new_name: Option<&str>,
    add: &[String],
    remove: &[String],
    updated_at: Nanos,
) -> Result<(), StoreError> {
    let label = kind.replace('_', " ");
    if !db.exists(
        "SELECT 1 FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
        args![organization_id, kind, id],
    )? {
        return Err(StoreError::conflict(format!("{label} not found: {id}")));
    }
    let changes = add.iter().map(|m| (m, true)).chain(remove.iter().map(|m| (m, false)));
    match kind {
        "user_tag" => {
            for (user, adding) in changes {
                if !db.exists(
                    "SELECT 1 FROM users WHERE organization_id = ?1 AND id = ?2",
                    args![organization_id, user],
                )? {
                    return Err(StoreError::conflict(format!("user not found: {user}")));
                }
                let sql = if adding {
                    "INSERT INTO user_tags (organization_id, tag_id, user_id) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING"
                } else {
                    "DELETE FROM user_tags WHERE organization_id = ?1 AND tag_id = ?2 AND user_id = ?3"
                };
                db.execute(sql, args![organization_id, id, user])?;
            }
        }
        "private_key_tag" => {
            for (key, adding) in changes {
                let Some(tags) = db.query_opt(
                    "SELECT tags FROM private_keys WHERE organization_id = ?1 AND id = ?2",
                    args![organization_id, key],
                    |r| r.text(0),
                )?
                else {
                    return Err(StoreError::conflict(format!("private key not found: {key}")));
                };
                let mut tags: Vec<String> = parse_json(tags);
                tags.retain(|t| t != id);
                if adding {
                    tags.push(id.to_string());
                }
                db.execute(
                    "UPDATE private_keys SET tags = ?3 WHERE organization_id = ?1 AND id = ?2",
                    args![organization_id, key, json_text(&tags)],
                )?;
            }
        }
        other => return Err(StoreError::conflict(format!("not a tag kind: {other}"))),
    }
    // Renamed last: a name clash rolls back the membership changes above with it.
    db.execute(
        "UPDATE records SET name = COALESCE(CAST(?4 AS TEXT), name), updated_at = ?5 WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
        args![organization_id, kind, id, new_name, updated_at],
    )
    .map_err(unique_as(format!("{label} name must be unique: {:?}", new_name.unwrap_or(""))))?;
    super::records::counted(db, organization_id, kind, 0)
}

/// See `Write::DeleteTags`.
pub fn delete<D: Dialect>(db: &mut D, organization_id: &str, kind: &str, ids: &[String]) -> Result<(), StoreError> {
    if kind == "private_key_tag" {
        let keys =
            db.query("SELECT id, tags FROM private_keys WHERE organization_id = ?1", args![organization_id], |r| {
                Ok::<_, StoreError>((r.text(0)?, r.text(1)?))
            })?;
        for (key, tags) in keys {
            let tags: Vec<String> = parse_json(tags);
            if tags.iter().any(|t| ids.contains(t)) {
                let kept: Vec<&String> = tags.iter().filter(|t| !ids.contains(t)).collect();
                db.execute("UPDATE private_keys SET tags = ?2 WHERE id = ?1", args![key, json_text(&kept)])?;
            }
        }
    }
    for id in ids {
        if kind == "user_tag" {
            db.execute("DELETE FROM user_tags WHERE organization_id = ?1 AND tag_id = ?2", args![organization_id, id])?;
        }
        let n = db.execute(
            "DELETE FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
            args![organization_id, kind, id],
        )?;
        if n != 1 {
            return Err(StoreError::conflict(format!("{} not found: {id}", kind.replace('_', " "))));
        }
    }
    super::records::counted(db, organization_id, kind, -(ids.len() as i64))
}

pub fn user_tag_members<D: Dialect>(db: &mut D, org: &str) -> Result<Vec<(String, String)>, StoreError> {
    db.query(
        "SELECT m.tag_id, m.user_id FROM user_tags m JOIN records r ON r.kind = m.tag_kind AND r.id = m.tag_id
         WHERE m.organization_id = ?1 ORDER BY r.created_at, r.id, m.user_id",
        args![org],
        |r| Ok((r.text(0)?, r.text(1)?)),
    )
}

pub fn user_tags_of<D: Dialect>(db: &mut D, org: &str, user_id: &str) -> Result<Vec<String>, StoreError> {
    db.query(
        "SELECT m.tag_id FROM user_tags m JOIN records r ON r.organization_id = m.organization_id
           AND r.kind = m.tag_kind AND r.id = m.tag_id
         WHERE m.user_id = ?2 AND m.organization_id = ?1 AND r.kind = 'user_tag' ORDER BY r.created_at, r.id",
        args![org, user_id],
        |r| Ok::<_, StoreError>(r.text(0)?),
    )
}
