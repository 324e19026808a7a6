//! Invitations: `create_invitations` records who is invited (the enclave then mails each receiver
//! the invitation's acceptance code), `delete_invitation` revokes one, and
//! `accept_invitation` makes the invited user with the API key the receiver brings.

use serde_json::{json, Value};

use super::input::TransitionError;
use super::input::{dedup, items, raw_texts, text_of, Input, INVITATION_ID};
use super::users::{create_users, API_ONLY_CURVE};
use crate::effect::{Change, Effect};
use crate::model::Invitation;

/// Most invitations one activity makes (each is a message the enclave sends).
pub const MAX_INVITATIONS_PER_ACTIVITY: usize = 10;
/// Most invitations an organization keeps waiting for their receivers at once.
pub const MAX_OPEN_INVITATIONS: usize = 100;
/// Most user tags one invitation gives.
pub const MAX_INVITATION_TAGS: usize = 32;
/// The status of an open invitation (an accepted or revoked one is removed).
pub const INVITATION_CREATED: &str = "INVITATION_STATUS_CREATED";
pub const ACCESS_TYPES: &[&str] = &["ACCESS_TYPE_WEB", "ACCESS_TYPE_API", "ACCESS_TYPE_ALL"];
/// The access type whose receiver signs in with a passkey (which an acceptance cannot bring
/// yet): accepted with an API key only as `ACCESS_TYPE_API` or `ACCESS_TYPE_ALL`.
pub const WEB_ONLY: &str = "ACCESS_TYPE_WEB";

/// One `InvitationParams` of `create_invitations`, checked: the receiver's name and email as a
/// user's are, its tags listed once, a known access type and a sender. Whether the tags and the
/// sender exist is the organization's state's to say.
pub fn invitation(params: &Value) -> Result<Invitation, String> {
    let text = |k: &str| text_of(params, k).unwrap_or_default();
    let name = text("receiverUserName");
    crate::fields::name("receiverUserName", &name)?;
    let email = text("receiverUserEmail");
    if !crate::fields::email(&email) {
        return Err(format!("receiverUserEmail: not an email address: {email:?}"));
    }
    let access_type = text("accessType");
    if !ACCESS_TYPES.contains(&access_type.as_str()) {
        return Err(format!("accessType must be one of {}", ACCESS_TYPES.join(", ")));
    }
    let sender = text("senderUserId");
    if sender.trim().is_empty() {
        return Err("senderUserId is missing".into());
    }
    let tags = raw_texts(params, "receiverUserTags");
    if tags.len() > MAX_INVITATION_TAGS {
        return Err(format!("receiverUserTags: at most {MAX_INVITATION_TAGS}"));
    }
    Ok(Invitation {
        receiver_user_name: name,
        receiver_email: email,
        receiver_user_tags: dedup(tags),
        access_type,
        sender_user_id: sender,
        status: INVITATION_CREATED.into(),
    })
}

/// `create_invitations`: each invitation ([`invitation`]) with an id derived from the body; its
/// tags user tags of the organization and its sender one of its users; its receiver no user of
/// the organization has the email of (an acceptance verifies it: two users with one verified
/// email would make logins by it ambiguous), nor another invitation of the body or open; at most
/// [`MAX_INVITATIONS_PER_ACTIVITY`] at once and [`MAX_OPEN_INVITATIONS`] open.
pub(crate) fn create_invitations(i: &Input<'_>) -> Result<Vec<Change>, TransitionError> {
    let listed = items(i.params, "invitations");
    if listed.is_empty() || listed.len() > MAX_INVITATIONS_PER_ACTIVITY {
        return Err(i.invalid(format!("invitations: 1 to {MAX_INVITATIONS_PER_ACTIVITY} of them")));
    }
    let invitations = &i.state.organization.invitations;
    if invitations.len() + listed.len() > MAX_OPEN_INVITATIONS {
        return Err(i.invalid(format!("an organization has at most {MAX_OPEN_INVITATIONS} open invitations")));
    }
    let mut out = Vec::with_capacity(listed.len());
    for (n, params) in listed.iter().enumerate() {
        let invitation = invitation(params).map_err(|reason| i.invalid(format!("invitations[{n}]: {reason}")))?;
        if let Some(tag) = invitation.receiver_user_tags.iter().find(|t| !i.state.user_tags.contains_key(*t)) {
            return Err(i.invalid(format!("invitations[{n}]: no user tag {tag}")));
        }
        if !i.state.users.contains_key(&invitation.sender_user_id) {
            return Err(i.invalid(format!("invitations[{n}]: no user {}", invitation.sender_user_id)));
        }
        let email = invitation.receiver_email.as_str();
        let taken = email_taken(i.state, email)
            || invitations.values().any(|v| v.receiver_email.eq_ignore_ascii_case(email))
            || out.iter().any(|c: &Change| {
                matches!(&c.effect, Effect::PutInvitation { invitation, .. } if invitation.receiver_email.eq_ignore_ascii_case(email))
            });
        if taken {
            return Err(i.invalid(format!(
                "invitations[{n}]: a user or an open invitation of this organization has {email} already"
            )));
        }
        let id = i.derived_new_id(INVITATION_ID, n, |id| invitations.contains_key(id))?;
        out.push(i.change(Effect::PutInvitation { id, invitation }));
    }
    Ok(out)
}

/// The invitation the body names (`invitationId`), which must be open.
pub fn open_invitation<'s>(i: &'s Input<'_>) -> Result<(String, &'s Invitation), TransitionError> {
    let id = i.text("invitationId")?;
    match i.state.organization.invitations.get(&id) {
        Some(v) => Ok((id, v)),
        None => Err(i.invalid(format!("no open invitation {id} (accepted, revoked or never made)"))),
    }
}

/// Whether a user of the organization has `email` (without case).
fn email_taken(state: &crate::model::OrgState, email: &str) -> bool {
    state.users.values().any(|u| u.email.eq_ignore_ascii_case(email))
}

/// `delete_invitation`: an open invitation is revoked: it goes.
pub(crate) fn delete_invitation(i: &Input<'_>) -> Result<Vec<Change>, TransitionError> {
    let (id, _) = open_invitation(i)?;
    Ok(vec![i.change(Effect::RemoveInvitation { id })])
}

/// `accept_invitation`: the invited user, as `create_users` makes it (id derived from the body),
/// with the invitation's name, email and tags and the body's `apiKey` (P-256), its email verified
/// (the acceptance code came to it: the enclave checked it before); the accepted invitation goes.
/// A web-only invitation is refused ([`WEB_ONLY`]).
pub(crate) fn accept_invitation(i: &Input<'_>) -> Result<Vec<Change>, TransitionError> {
    let (id, open) = open_invitation(i)?;
    if open.access_type == WEB_ONLY {
        return Err(i.invalid(
            "a web-only invitation (ACCESS_TYPE_WEB) is accepted with a passkey, which Coffer does not take yet",
        ));
    }
    if email_taken(i.state, &open.receiver_email) {
        return Err(i.invalid("a user of this organization has the invitation's email already"));
    }
    let key = i.params.get("apiKey").filter(|k| k.is_object()).ok_or_else(|| i.invalid("apiKey is missing"))?;
    let mut key = key.clone();
    key["curveType"] = json!(API_ONLY_CURVE);
    let params = json!({ "users": [{
        "userName": open.receiver_user_name,
        "userEmail": open.receiver_email,
        "userTags": open.receiver_user_tags,
        "apiKeys": [key],
    }]});
    let mut out = create_users(&Input { params: &params, ..*i })?;
    let user_id = out
        .iter()
        .find_map(|c| match &c.effect {
            Effect::PutUser { user } => Some(user.id.clone()),
            _ => None,
        })
        .ok_or_else(|| i.invalid("no user made"))?;
    out.push(i.change(Effect::MarkContactsVerified { id: user_id }));
    out.push(i.change(Effect::RemoveInvitation { id }));
    Ok(out)
}
