//! `create_invitations`, `delete_invitation` and Coffer's `accept_invitation`: the invitations the
//! enclave's state holds (it mails each receiver its acceptance code), and the user an accepted
//! one makes with the API key its receiver brings.

use coffer_org_rules::model::Invitation;
use coffer_org_rules::transition::{INVITATION_ID, MAX_INVITATIONS_PER_ACTIVITY, MAX_OPEN_INVITATIONS};
use serde::Deserialize;
use serde_json::{json, Value};

use super::users::ApiOnlyKeyParams;
use crate::activity::registry::{Ctx, Outcome};
use crate::activity::render::timestamp;
use crate::error::ApiError;
use crate::record_kinds::INVITATION;
use crate::store::{Record, Write};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateInvitationsIntent {
    #[serde(default)]
    invitations: Vec<Value>,
}

/// `create_invitations`: each invitation (`coffer_org_rules::transition::invitation`) sent by the
/// stamping user, its tags the organization's.
pub async fn create_invitations(ctx: Ctx, intent: CreateInvitationsIntent) -> Result<Outcome, ApiError> {
    if intent.invitations.is_empty() || intent.invitations.len() > MAX_INVITATIONS_PER_ACTIVITY {
        return Err(ApiError::invalid(format!("invitations: 1 to {MAX_INVITATIONS_PER_ACTIVITY} of them")));
    }
    let org = ctx.org.id.clone();
    // Only open invitations are kept: the store's count of them (one row read).
    let (open, _) = ctx.state.db(move |s| s.records_version(&org, INVITATION)).await??;
    if open as usize + intent.invitations.len() > MAX_OPEN_INVITATIONS {
        return Err(ApiError::invalid(format!("an organization has at most {MAX_OPEN_INVITATIONS} open invitations")));
    }
    let mut writes = Vec::new();
    let mut ids = Vec::new();
    for (n, params) in intent.invitations.iter().enumerate() {
        let invitation = coffer_org_rules::transition::invitation(params)
            .map_err(|reason| ApiError::invalid(format!("invitations[{n}]: {reason}")))?;
        if invitation.sender_user_id != ctx.caller.user.id {
            return Err(ApiError::invalid(format!("invitations[{n}]: senderUserId is not the stamping user")));
        }
        super::users::check_user_tags(&ctx.state, &ctx.org.id, &invitation.receiver_user_tags).await?;
        let id = ctx.derived_id(INVITATION_ID, n);
        writes.push(Write::PutRecord(record(&ctx, &id, &invitation)?));
        ids.push(id);
    }
    Ok(Outcome { result: json!({ "invitationIds": ids }), writes })
}

fn record(ctx: &Ctx, id: &str, invitation: &Invitation) -> Result<Record, ApiError> {
    Ok(Record {
        organization_id: ctx.org.id.clone(),
        kind: INVITATION.into(),
        id: id.to_string(),
        name: id.to_string(),
        data: serde_json::to_value(invitation).map_err(|_| ApiError::internal())?,
        created_at: ctx.now,
        updated_at: ctx.now,
    })
}

/// The write that removes invitation `id` of the activity's organization, accepted or revoked.
fn closed(ctx: &Ctx, id: &str) -> Write {
    Write::DeleteRecords { organization_id: ctx.org.id.clone(), kind: INVITATION.into(), ids: vec![id.to_string()] }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteInvitationIntent {
    invitation_id: String,
}

/// `delete_invitation`: an open invitation is revoked: it goes.
pub async fn delete_invitation(ctx: Ctx, intent: DeleteInvitationIntent) -> Result<Outcome, ApiError> {
    crate::open_invitations::open_invitation(&ctx.state, &ctx.org.id, &intent.invitation_id).await?;
    let writes = vec![closed(&ctx, &intent.invitation_id)];
    Ok(Outcome { result: json!({ "invitationId": intent.invitation_id }), writes })
}

/// `AcceptInvitationIntentV2` as Coffer takes it: the API key the receiver brings (which stamps
/// the acceptance) instead of a passkey, and the invitation's code with that key's public key
/// encrypted to the invitation's target (`encryptedOtpBundle`, which the enclave opens).
/// `userId` is not read: the enclave names the user it makes.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcceptInvitationIntent {
    invitation_id: String,
    api_key: Option<ApiOnlyKeyParams>,
    #[serde(default)]
    authenticator: Option<Value>,
    #[serde(default)]
    encrypted_otp_bundle: String,
}

/// `accept_invitation`: the invited user with the invitation's name, email (verified: its code
/// came to it) and tags, and the brought API key; the accepted invitation goes.
pub async fn accept_invitation(ctx: Ctx, intent: AcceptInvitationIntent) -> Result<Outcome, ApiError> {
    let Some(key) = intent.api_key else {
        return Err(ApiError::invalid(match intent.authenticator {
            Some(_) => {
                "authenticator: Coffer accepts an invitation with an API key (apiKey) only; add a passkey afterwards"
            }
            None => "apiKey is required: the API key the acceptance makes, which stamps it",
        }));
    };
    if intent.encrypted_otp_bundle.trim().is_empty() {
        return Err(ApiError::invalid("encryptedOtpBundle is required: the invitation's code, encrypted"));
    }
    let open = crate::open_invitations::open_invitation(&ctx.state, &ctx.org.id, &intent.invitation_id).await?;
    if open.access_type == coffer_org_rules::transition::WEB_ONLY {
        return Err(ApiError::invalid(
            "a web-only invitation (ACCESS_TYPE_WEB) is accepted with a passkey, which Coffer does not take yet",
        ));
    }
    let accepted = closed(&ctx, &intent.invitation_id);
    let (organization_id, invitation_id) = (ctx.org.id.clone(), intent.invitation_id.clone());
    let mut made = super::users::create_invited_user(ctx, &open, key).await?;
    let user_id = made.result["userIds"][0].as_str().unwrap_or_default().to_string();
    made.writes.push(Write::MarkContactsVerified { organization_id, id: user_id.clone() });
    made.writes.push(accepted);
    Ok(Outcome { result: json!({ "invitationId": invitation_id, "userId": user_id }), writes: made.writes })
}

/// An invitation as clients read it (`v1Invitation`).
pub fn invitation_json(r: &Record) -> Value {
    let v: Invitation = serde_json::from_value(r.data.clone()).unwrap_or_default();
    json!({
        "invitationId": r.id,
        "receiverUserName": v.receiver_user_name,
        "receiverEmail": v.receiver_email,
        "receiverUserTags": v.receiver_user_tags,
        "accessType": v.access_type,
        "status": v.status,
        "createdAt": timestamp(r.created_at),
        "updatedAt": timestamp(r.updated_at),
        "senderUserId": v.sender_user_id,
    })
}
