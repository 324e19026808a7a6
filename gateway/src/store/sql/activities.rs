//! Activities: their rows, the insert a commit starts with, Idempotency-Keys, and the reads.

use super::db::{args, json_text, parse_json, Arg, Dialect, SqlRow};
use crate::store::error::StoreError;
use crate::store::model::{ActivityFilter, ActivityRecord, LogEntry, Nanos};

const ACTIVITY_COLS: &str =
    "id, organization_id, activity_type, status, fingerprint, intent, result, votes, created_at, failure, updated_at, app_proofs";
fn activity_row(r: &dyn SqlRow) -> Result<ActivityRecord, StoreError> {
    Ok(ActivityRecord {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        activity_type: r.text(2)?,
        status: r.text(3)?,
        fingerprint: r.text(4)?,
        intent: parse_json(r.text(5)?),
        result: parse_json(r.text(6)?),
        votes: parse_json(r.text(7)?),
        failure: r.opt_text(9)?.map(parse_json),
        created_at: r.int(8)?,
        updated_at: r.int(10)?,
        app_proofs: r.opt_text(11)?.map(parse_json::<Vec<serde_json::Value>>).unwrap_or_default(),
    })
}

/// Inserts the activity unless one with its fingerprint exists (then `false`, nothing written).
pub fn insert<D: Dialect>(db: &mut D, a: &ActivityRecord, organization_id: &str) -> Result<bool, StoreError> {
    let n = db.execute(
        &format!(
            "INSERT INTO activities ({ACTIVITY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
             ON CONFLICT (fingerprint) DO NOTHING"
        ),
        args![
            a.id,
            organization_id,
            a.activity_type,
            a.status,
            a.fingerprint,
            json_text(&a.intent),
            json_text(&a.result),
            json_text(&a.votes),
            a.created_at,
            a.failure.as_ref().map(json_text),
            a.updated_at,
            proofs_text(&a.app_proofs)
        ],
    )?;
    Ok(n == 1)
}

/// The `app_proofs` column: NULL when there are none (most activities).
pub fn proofs_text(proofs: &[serde_json::Value]) -> Option<String> {
    (!proofs.is_empty()).then(|| serde_json::Value::from(proofs.to_vec()).to_string())
}

/// See `Write::InsertIdempotencyKey`.
pub fn insert_idempotency_key<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    key: &str,
    intent_hash: &str,
    activity_id: &str,
    created_at: Nanos,
) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO idempotency_keys (organization_id, key, intent_hash, activity_id, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
        args![organization_id, key, intent_hash, activity_id, created_at],
    )?;
    Ok(())
}

pub fn activity<D: Dialect>(db: &mut D, org: &str, id: &str) -> Result<ActivityRecord, StoreError> {
    let sql = format!("SELECT {ACTIVITY_COLS} FROM activities WHERE organization_id = ?1 AND id = ?2");
    db.query_one(&sql, args![org, id], activity_row)
}

pub fn activity_by_fingerprint<D: Dialect>(db: &mut D, fingerprint: &str) -> Result<ActivityRecord, StoreError> {
    let sql = format!("SELECT {ACTIVITY_COLS} FROM activities WHERE fingerprint = ?1");
    db.query_one(&sql, args![fingerprint], activity_row)
}

/// Newest first; `after` = older than the cursor, `before` = the page just newer than the
/// cursor (an unknown cursor is ignored). Filters, cursors and the limit are all applied in
/// SQL over the (organization, created_at, id) index: one page reads one page of rows.
pub fn activities<D: Dialect>(db: &mut D, org: &str, f: &ActivityFilter) -> Result<Vec<ActivityRecord>, StoreError> {
    let mut cursor = |id: &Option<String>| -> Result<Option<(i64, String)>, StoreError> {
        let Some(id) = id else { return Ok(None) };
        db.query_opt(
            "SELECT created_at, id FROM activities WHERE organization_id = ?1 AND id = ?2",
            args![org, id],
            |r| Ok((r.int(0)?, r.text(1)?)),
        )
    };
    let (after, before) = (cursor(&f.after)?, cursor(&f.before)?);
    let mut sql = format!("SELECT {ACTIVITY_COLS} FROM activities WHERE organization_id = ?");
    let mut bound: Vec<Arg<'_>> = vec![Arg::Text(org)];
    for (column, values) in [("status", &f.statuses), ("activity_type", &f.types)] {
        if !values.is_empty() {
            sql.push_str(&format!(" AND {column} IN ({})", vec!["?"; values.len()].join(", ")));
            bound.extend(values.iter().map(|v| Arg::Text(v)));
        }
    }
    if let Some((at, id)) = &after {
        sql.push_str(" AND (created_at < ? OR (created_at = ? AND id < ?))");
        bound.extend([Arg::Int(*at), Arg::Int(*at), Arg::Text(id)]);
    }
    if let Some((at, id)) = &before {
        sql.push_str(" AND (created_at > ? OR (created_at = ? AND id > ?))");
        bound.extend([Arg::Int(*at), Arg::Int(*at), Arg::Text(id)]);
    }
    // Before a cursor: the rows just newer than it, read upwards and turned around.
    let order = if before.is_some() { "ASC" } else { "DESC" };
    sql.push_str(&format!(" ORDER BY created_at {order}, id {order} LIMIT ?"));
    bound.push(Arg::Int(f.limit.min(i64::MAX as usize) as i64));
    let mut items = db.query(&sql, &bound, activity_row)?;
    if before.is_some() {
        items.reverse();
    }
    Ok(items)
}

pub fn idempotency_key<D: Dialect>(db: &mut D, org: &str, key: &str) -> Result<(String, String), StoreError> {
    db.query_one(
        "SELECT intent_hash, activity_id FROM idempotency_keys WHERE organization_id = ?1 AND key = ?2",
        args![org, key],
        |r| Ok((r.text(0)?, r.text(1)?)),
    )
}

/// See `Write::InsertLogLink`. A position taken already fails the transaction.
pub fn insert_log_link<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    seq: u64,
    activity_id: &str,
    link: &str,
) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO activity_log (organization_id, seq, activity_id, link) VALUES (?1, ?2, ?3, ?4)",
        args![organization_id, seq as i64, activity_id, link],
    )?;
    Ok(())
}

/// One page of the organization's activity log from position `after` (exclusive), in order: each
/// link with the activity it names as the activities table holds it now (`None` if it is gone).
pub fn log_page<D: Dialect>(db: &mut D, org: &str, after: u64, limit: usize) -> Result<Vec<LogEntry>, StoreError> {
    let cols = ACTIVITY_COLS.split(", ").map(|c| format!("a.{c}")).collect::<Vec<_>>().join(", ");
    let sql = format!(
        "SELECT l.seq, l.link, l.activity_id, {cols} FROM activity_log l
         LEFT JOIN activities a ON a.id = l.activity_id
         WHERE l.organization_id = ?1 AND l.seq > ?2 ORDER BY l.seq LIMIT ?3"
    );
    db.query(&sql, args![org, after as i64, limit.min(i64::MAX as usize) as i64], |r| {
        let activity = match r.opt_text(3)? {
            Some(_) => Some(activity_row(&Offset(r, 3))?),
            None => None,
        };
        Ok(LogEntry { seq: r.int(0)? as u64, link: r.text(1)?, activity_id: r.text(2)?, activity })
    })
}

/// Finished activities of the organization that no link names (recorded while the enclave could
/// not be reached, or before the log existed), oldest first, at most `limit`.
pub fn unlogged<D: Dialect>(db: &mut D, org: &str, limit: usize) -> Result<Vec<ActivityRecord>, StoreError> {
    let sql = format!(
        "SELECT {ACTIVITY_COLS} FROM activities a WHERE a.organization_id = ?1
           AND a.status IN ('ACTIVITY_STATUS_COMPLETED', 'ACTIVITY_STATUS_FAILED', 'ACTIVITY_STATUS_REJECTED')
           AND NOT EXISTS (SELECT 1 FROM activity_log l WHERE l.organization_id = a.organization_id AND l.activity_id = a.id)
         ORDER BY a.created_at, a.id LIMIT ?2"
    );
    db.query(&sql, args![org, limit.min(i64::MAX as usize) as i64], activity_row)
}

/// The columns of a row from the `.1`th on, as a row of their own.
struct Offset<'a>(&'a dyn SqlRow, usize);
impl SqlRow for Offset<'_> {
    fn value(&self, i: usize) -> Result<super::db::Value, super::db::SqlError> {
        self.0.value(i + self.1)
    }
}
