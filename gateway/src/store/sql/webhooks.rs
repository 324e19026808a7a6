//! The webhook outbox: deliveries enqueued with the activity change they report, claimed under
//! leases by the gateways that send them, and their attempts.

use super::db::{args, Arg, Dialect, SqlRow};
use crate::store::error::StoreError;
use crate::store::model::{DueSkip, Nanos, WebhookAttempt, WebhookDelivery};

const DELIVERY_COLS: &str = "id, organization_id, endpoint_id, activity_organization_id, activity_id, event_type, body, status, attempts, next_attempt_at, last_status_code, last_error, created_at, updated_at, leased_by, top_level_id";
fn delivery_row(r: &dyn SqlRow) -> Result<WebhookDelivery, StoreError> {
    Ok(WebhookDelivery {
        id: r.text(0)?,
        organization_id: r.text(1)?,
        endpoint_id: r.text(2)?,
        activity_organization_id: r.text(3)?,
        activity_id: r.text(4)?,
        event_type: r.text(5)?,
        body: r.text(6)?,
        status: r.text(7)?,
        attempts: r.int(8)?,
        next_attempt_at: r.int(9)?,
        last_status_code: r.opt_int(10)?,
        last_error: r.opt_text(11)?,
        created_at: r.int(12)?,
        updated_at: r.int(13)?,
        leased_by: r.opt_text(14)?,
        top_level_id: r.text(15)?,
    })
}

pub fn enqueue<D: Dialect>(db: &mut D, d: &WebhookDelivery) -> Result<(), StoreError> {
    db.execute(
        &format!("INSERT INTO webhook_deliveries ({DELIVERY_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"),
        args![
            d.id,
            d.organization_id,
            d.endpoint_id,
            d.activity_organization_id,
            d.activity_id,
            d.event_type,
            d.body,
            d.status,
            d.attempts,
            d.next_attempt_at,
            d.last_status_code,
            d.last_error,
            d.created_at,
            d.updated_at,
            d.leased_by,
            d.top_level_id
        ],
    )?;
    Ok(())
}

/// See `Write::DropWebhookDeliveries`.
pub fn drop_pending<D: Dialect>(db: &mut D, organization_id: &str, endpoint_id: &str) -> Result<(), StoreError> {
    db.execute(
        "DELETE FROM webhook_deliveries WHERE organization_id = ?1 AND endpoint_id = ?2 AND status = 'PENDING'",
        args![organization_id, endpoint_id],
    )?;
    Ok(())
}

/// `?N, ?N+1, …` for `n` values from placeholder `first` on.
fn marks(first: usize, n: usize) -> String {
    (first..first + n).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", ")
}

/// ` AND endpoint_id NOT IN (…) AND top_level_id NOT IN (…)` for `skip`, its placeholders
/// numbered on after the `bound` ones already bound (its values: [`skipped`]).
fn skipping(skip: &DueSkip, bound: usize) -> String {
    let (mut sql, mut next) = (String::new(), bound + 1);
    for (column, values) in [("endpoint_id", &skip.endpoints), ("top_level_id", &skip.top_levels)] {
        if !values.is_empty() {
            sql.push_str(&format!(" AND {column} NOT IN ({})", marks(next, values.len())));
            next += values.len();
        }
    }
    sql
}

/// `skip`'s values in the order [`skipping`] numbers them.
fn skipped(skip: &DueSkip) -> impl Iterator<Item = Arg<'_>> {
    skip.endpoints.iter().chain(&skip.top_levels).map(|v| Arg::Text(v))
}

/// Whether a pending delivery is due at `now`, not left out by `skip` (a read: most polls find
/// nothing, and need not take the writer).
pub fn any_due_webhook_delivery<D: Dialect>(db: &mut D, now: Nanos, skip: &DueSkip) -> Result<bool, StoreError> {
    let mut bound = vec![Arg::Int(now)];
    let mut sql = "SELECT 1 FROM webhook_deliveries WHERE status = 'PENDING' AND next_attempt_at <= ?1".to_string();
    sql.push_str(&skipping(skip, bound.len()));
    bound.extend(skipped(skip));
    sql.push_str(" LIMIT 1");
    Ok(db.exists(&sql, &bound)?)
}

/// Inside a write transaction. The outer `next_attempt_at <= now` is checked again on the row
/// as it is when its lock is had: on PostgreSQL a row another gateway claimed meanwhile no longer
/// matches and is left to it.
pub fn claim_due_webhook_deliveries<D: Dialect>(
    db: &mut D,
    now: Nanos,
    (lease_until, owner): (Nanos, &str),
    limit: usize,
    skip: &DueSkip,
) -> Result<Vec<WebhookDelivery>, StoreError> {
    let due = "status = 'PENDING' AND next_attempt_at <= ?2";
    let mut bound = vec![Arg::Int(lease_until), Arg::Int(now), Arg::Text(owner)];
    let busy = skipping(skip, bound.len());
    bound.extend(skipped(skip));
    bound.push(Arg::Int(limit.min(i64::MAX as usize) as i64));
    let sql = format!(
        "UPDATE webhook_deliveries SET next_attempt_at = ?1, leased_by = ?3
         WHERE id IN (SELECT id FROM webhook_deliveries WHERE {due}{busy} ORDER BY next_attempt_at LIMIT ?{})
           AND {due}
         RETURNING {DELIVERY_COLS}",
        bound.len()
    );
    let mut claimed = db.query(&sql, &bound, delivery_row)?;
    claimed.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    Ok(claimed)
}

/// Inside a write transaction: extends `owner`'s leases of `ids` to `lease_until`; the ids it
/// still held (a lease that lapsed may have been claimed by another gateway since).
pub fn renew_webhook_leases<D: Dialect>(
    db: &mut D,
    ids: &[String],
    (lease_until, owner): (Nanos, &str),
) -> Result<Vec<String>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "UPDATE webhook_deliveries SET next_attempt_at = ?1
         WHERE leased_by = ?2 AND status = 'PENDING' AND id IN ({})
         RETURNING id",
        marks(3, ids.len())
    );
    let mut bound = vec![Arg::Int(lease_until), Arg::Text(owner)];
    bound.extend(ids.iter().map(|i| Arg::Text(i)));
    Ok(db.query(&sql, &bound, |r| r.text(0))?)
}

/// Rows leased before leases had owners (`leased_by` empty, never attempted) count as `owner`'s:
/// then one gateway held them all.
pub fn release_webhook_leases<D: Dialect>(db: &mut D, now: Nanos, owner: &str) -> Result<usize, StoreError> {
    let n = db.execute(
        "UPDATE webhook_deliveries SET next_attempt_at = ?1, leased_by = NULL
         WHERE status = 'PENDING' AND next_attempt_at > ?1
           AND (leased_by = ?2 OR (leased_by IS NULL AND attempts = 0))",
        args![now, owner],
    )?;
    Ok(n as usize)
}

/// Inside a write transaction.
pub fn record_webhook_attempts<D: Dialect>(
    db: &mut D,
    attempts: &[(String, WebhookAttempt)],
) -> Result<(), StoreError> {
    for (id, a) in attempts {
        let n = db.query_opt(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, status = ?2, next_attempt_at = ?3,
                last_status_code = ?4, last_error = ?5, updated_at = ?6, leased_by = NULL
             WHERE id = ?1 AND status = 'PENDING' RETURNING attempts",
            args![id, a.status, a.next_attempt_at, a.status_code, a.error, a.at],
            |r| r.int(0),
        )?;
        if let Some(n) = n {
            db.execute(
                "INSERT INTO webhook_attempts (delivery_id, attempt, at, status_code, error, duration_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                args![id, n, a.at, a.status_code, a.error, a.duration_ms],
            )?;
        }
    }
    Ok(())
}

pub fn webhook_deliveries<D: Dialect>(
    db: &mut D,
    org: &str,
    endpoint_id: &str,
    limit: usize,
) -> Result<Vec<WebhookDelivery>, StoreError> {
    let sql = format!(
        "SELECT {DELIVERY_COLS} FROM webhook_deliveries WHERE organization_id = ?1 AND endpoint_id = ?2
         ORDER BY created_at DESC, id DESC LIMIT ?3"
    );
    db.query(&sql, args![org, endpoint_id, limit.min(i64::MAX as usize) as i64], delivery_row)
}
