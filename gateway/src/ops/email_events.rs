//! `query/list_email_events`: the messages the enclave reported sending for the organization
//! (one-time codes, email credentials, invitations), by recipient, newest first, kept
//! [`KEPT_NANOS`]. Only what the enclave knows is listed: `Send` (its mail transport took the
//! message) and `SendFailure`; Coffer has no delivery feed, so no `Delivery` or `Bounce`.

use coffer_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{json, Value};

use super::params::Pagination;
use crate::activity::registry::QueryCtx;
use crate::error::ApiError;
use crate::store::{EmailEventRecord, Nanos, Write};

/// How long an event is kept: 30 days.
pub const KEPT_NANOS: i64 = 30 * 24 * 3_600 * 1_000_000_000;

/// The writes that keep what the enclave reported sending for the activity `fingerprint` of
/// `organization_id` (events of other organizations are not this one's to keep), and drop the
/// organization's events older than [`KEPT_NANOS`].
pub fn writes(organization_id: &str, fingerprint: &str, now: Nanos, events: &[pb::EmailEvent]) -> Vec<Write> {
    let records: Vec<EmailEventRecord> = events
        .iter()
        .filter(|e| e.organization_id == organization_id)
        .enumerate()
        .map(|(n, e)| EmailEventRecord {
            organization_id: organization_id.to_string(),
            id: coffer_auth::envelope::derived_id(fingerprint, "email-event", n),
            to_address: e.to_address.clone(),
            event_type: e.event_type.clone(),
            message_id: e.message_id.clone(),
            from_address: e.from_address.clone(),
            timestamp_ms: e.timestamp_ms,
            created_at: now + n as i64,
        })
        .collect();
    if records.is_empty() {
        return Vec::new();
    }
    vec![
        Write::InsertEmailEvents(records),
        Write::PruneEmailEvents { organization_id: organization_id.to_string(), created_before: now - KEPT_NANOS },
    ]
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListEmailEventsRequest {
    email: String,
    #[serde(default)]
    event_type: Option<String>,
    #[serde(default)]
    pagination_options: Pagination,
}

pub async fn list_email_events(ctx: QueryCtx, req: ListEmailEventsRequest) -> Result<Value, ApiError> {
    let email = req.email.trim().to_string();
    if email.is_empty() || email.len() > 320 {
        return Err(ApiError::invalid("email is required (a recipient's address)"));
    }
    let event_type = req.event_type.map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
    if event_type.as_ref().is_some_and(|t| t.len() > 64) {
        return Err(ApiError::invalid("eventType: at most 64 characters"));
    }
    let page = req.pagination_options.page()?;
    let org = ctx.org.id.clone();
    let events = ctx.state.db(move |s| s.email_events_page(&org, &email, event_type.as_deref(), &page)).await??;
    Ok(json!({ "emailEvents": events.iter().map(event_json).collect::<Vec<_>>() }))
}

/// An event as clients read it (`v1EmailEvent`).
fn event_json(e: &EmailEventRecord) -> Value {
    json!({
        "id": e.id,
        "organizationId": e.organization_id,
        "messageId": e.message_id,
        "eventType": e.event_type,
        "fromAddress": e.from_address,
        "toAddress": e.to_address,
        "timestamp": e.timestamp_ms.to_string(),
        "createdAt": (e.created_at / 1_000_000).to_string(),
        // No tenant of a hosted mail service sent it; no delivery details are known.
        "senderTenant": "",
    })
}
