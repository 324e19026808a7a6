//! The messages the enclave sent for an organization (`email_events`): written as its answers
//! report them, listed newest first by recipient, and kept for a bounded time.

use super::db::{args, Dialect, SqlRow};
use crate::store::error::StoreError;
use crate::store::model::{EmailEventRecord, Page};

const COLS: &str = "organization_id, id, to_address, event_type, message_id, from_address, timestamp_ms, created_at";

fn row(r: &dyn SqlRow) -> Result<EmailEventRecord, StoreError> {
    Ok(EmailEventRecord {
        organization_id: r.text(0)?,
        id: r.text(1)?,
        to_address: r.text(2)?,
        event_type: r.text(3)?,
        message_id: r.text(4)?,
        from_address: r.text(5)?,
        timestamp_ms: r.int(6)?,
        created_at: r.int(7)?,
    })
}

/// See `Write::InsertEmailEvents`: the recipient kept in lowercase (what the list is asked by).
pub fn insert<D: Dialect>(db: &mut D, events: &[EmailEventRecord]) -> Result<(), StoreError> {
    for e in events {
        db.execute(
            &format!(
                "INSERT INTO email_events ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO NOTHING"
            ),
            args![
                e.organization_id,
                e.id,
                e.to_address.to_ascii_lowercase(),
                e.event_type,
                e.message_id,
                e.from_address,
                e.timestamp_ms,
                e.created_at
            ],
        )?;
    }
    Ok(())
}

/// See `Write::PruneEmailEvents`.
pub fn prune<D: Dialect>(db: &mut D, organization_id: &str, created_before: i64) -> Result<(), StoreError> {
    db.execute(
        "DELETE FROM email_events WHERE organization_id = ?1 AND created_at < ?2",
        args![organization_id, created_before],
    )?;
    Ok(())
}

/// `org`'s events of messages to `to` (any case), of `event_type` when given, newest first: at
/// most `page.limit`, older than the `after` cursor's event or newer than the `before` one's.
pub fn page<D: Dialect>(
    db: &mut D,
    org: &str,
    to: &str,
    event_type: Option<&str>,
    page: &Page,
) -> Result<Vec<EmailEventRecord>, StoreError> {
    let to = to.to_ascii_lowercase();
    let mut cursor = |id: &Option<String>| -> Result<Option<(i64, String)>, StoreError> {
        let Some(id) = id else { return Ok(None) };
        db.query_opt(
            "SELECT created_at, id FROM email_events WHERE organization_id = ?1 AND to_address = ?2 AND id = ?3",
            args![org, to, id],
            |r| Ok::<_, StoreError>((r.int(0)?, r.text(1)?)),
        )
    };
    let (after, before) = (cursor(&page.after)?, cursor(&page.before)?);
    let kind = event_type.unwrap_or_default();
    let limit = page.limit.min(i64::MAX as usize) as i64;
    let (bound, direction, mark) = match (&before, &after) {
        (Some((at, id)), _) => ((*at, id.clone()), "ASC", ">"),
        (None, Some((at, id))) => ((*at, id.clone()), "DESC", "<"),
        (None, None) => ((i64::MAX, String::new()), "DESC", "<"),
    };
    let sql = format!(
        "SELECT {COLS} FROM email_events WHERE organization_id = ?1 AND to_address = ?2 \
         AND (?3 = '' OR event_type = ?3) AND (created_at, id) {mark} (?4, ?5) \
         ORDER BY created_at {direction}, id {direction} LIMIT ?6"
    );
    let (at, id) = bound;
    let mut items = db.query(&sql, args![org, to, kind, at, id, limit], row)?;
    if before.is_some() {
        items.reverse();
    }
    Ok(items)
}
