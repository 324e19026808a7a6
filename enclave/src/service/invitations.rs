//! Invitations in the enclave: each receiver's acceptance code and encryption target, derived
//! from the HSM's MAC key (nothing is stored, nothing crosses the gateway in the clear), the
//! messages that carry them (counted against the send limits before the invitations are
//! committed), and the acceptance's identity: the key the receiver brings, standing for the
//! invitation once its code, encrypted to the invitation's target with that key, checks.

use coffer_auth::envelope::{derived_id, text, StampedActivity, USER_ID};
use coffer_auth::grants::{ACCEPT_INVITATION, INVITATION_ACCEPTANCE};
use coffer_org_rules::{Change, Effect};
use coffer_proto::v1 as pb;
use lettre::message::{header::ContentType, Mailbox, SinglePart};
use zeroize::Zeroizing;

use super::otp::{charge_message, sender_of, EncryptedCode, CROCKFORD};
use crate::admission::{mac_input, now_ms, refuse, Admission, Admitted, AttestedIdentity};
use crate::config::OtpSettings;
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::Hsm;
use crate::store::Remembered;

/// `create_invitations`.
pub const CREATE_INVITATIONS: &str = "ACTIVITY_TYPE_CREATE_INVITATIONS";
/// Characters of an acceptance code (Crockford base32: 40 bits).
const CODE_LENGTH: usize = 8;
/// Most acceptances tried per invitation in an hour (a 40-bit code: guessing it takes about
/// 25 million years at this rate).
pub const MAX_ACCEPTANCE_ATTEMPTS: u64 = 5;
/// Most acceptances tried in an hour for all the invitations of one organization.
pub const MAX_ACCEPTANCE_ATTEMPTS_PER_ORGANIZATION: u64 = 50;
/// Most acceptances tried in an hour for all the invitations of one top-level organization and
/// its sub-organizations together (which its own credentials made: a visitor's sub-organization
/// sends no invitations): what attempts hold of the replay window every organization shares is
/// bounded by the top-level organizations, which the operator makes.
pub const MAX_ACCEPTANCE_ATTEMPTS_PER_TOP_LEVEL: u64 = 1_000;
/// How long an attempt counts.
const ATTEMPT_WINDOW_MS: i64 = 3_600_000;
const INVITATION_INVALID: &str =
    "the invitation is not open, or its acceptance code or encrypted bundle is not the one it was sent";

/// The domain of the HSM MAC inputs an invitation's secrets are derived from.
const DOMAIN: &[u8] = b"coffer-invitation-v1";

/// The HSM MAC (the certificate key, domain-separated) of `what` for invitation `id` of `org`.
fn derived(hsm: &Hsm, what: &[u8], org: &str, id: &str) -> Result<Zeroizing<Vec<u8>>, EnclaveError> {
    let mac = hsm.certificate_mac(&mac_input(&[DOMAIN, what, org.as_bytes(), id.as_bytes()]))?;
    Ok(Zeroizing::new(mac))
}

/// The invitation's acceptance code: [`CODE_LENGTH`] Crockford base32 characters of its MAC
/// (each byte mod 32: uniform, 256 being a multiple of 32).
fn acceptance_code(hsm: &Hsm, org: &str, id: &str) -> Result<Zeroizing<String>, EnclaveError> {
    let mac = derived(hsm, b"code", org, id)?;
    Ok(Zeroizing::new(mac.iter().take(CODE_LENGTH).map(|b| CROCKFORD[(b % 32) as usize] as char).collect()))
}

/// The P-256 key the receiver encrypts the code to, drawn from a generator seeded with its MAC.
fn acceptance_target(hsm: &Hsm, org: &str, id: &str) -> Result<coffer_crypto::bundle::ImportTarget, EnclaveError> {
    let seed = coffer_crypto::secret::RngSeed::from_slice(&derived(hsm, b"target", org, id)?)?;
    Ok(coffer_crypto::bundle::new_import_target(&seed)?)
}

/// Counts the message of each invitation `create_invitations` makes (`changes`, the checked
/// transition's) against the send limits of one-time codes (per receiver, per organization; a
/// sub-organization the auth proxy signed up against its own and its parent's share), before
/// anything is committed; each must name the stamping user as its sender and a receiver the mail
/// transport can address.
pub(super) fn charge(
    admission: &Admission,
    settings: &OtpSettings,
    a: &Admitted,
    changes: &[Change],
) -> Result<(), EnclaveError> {
    let made: Vec<&coffer_org_rules::model::Invitation> = changes
        .iter()
        .filter_map(|c| match &c.effect {
            Effect::PutInvitation { invitation, .. } => Some(invitation),
            _ => None,
        })
        .collect();
    let sender = sender_of(admission, a)?;
    // A sub-organization the auth proxy signed up (a visitor's) mails no one: its messages would
    // go to any address in the operator's name.
    if sender.marked.is_some() {
        return Err(refuse(
            a,
            RefusalReason::CustomizationNotAllowed,
            "a sub-organization signed up through the auth proxy sends no invitations",
        ));
    }
    let mut mailboxes = std::collections::BTreeSet::new();
    for invitation in &made {
        // Sent in the stamping user's name, and no one else's.
        if invitation.sender_user_id != a.credential.user_id {
            return Err(refuse(a, RefusalReason::BindingMismatch, "senderUserId is not the stamping user"));
        }
        // An address mail can go to, each mailbox once (every spelling of one counts as it).
        let mailbox = coffer_auth::verification_token::canonical_contact(&invitation.receiver_email);
        let addressable = invitation.receiver_email.parse::<lettre::Address>().is_ok();
        if !addressable || !mailbox.is_some_and(|m| mailboxes.insert(m)) {
            return Err(refuse(
                a,
                RefusalReason::TransitionRefused,
                "receiverUserEmail: not an address mail can go to, or one mailbox twice",
            ));
        }
    }
    for (n, invitation) in made.iter().enumerate() {
        let what = format!("{}/{n}", a.activity.fingerprint);
        charge_message(admission, settings, &what, &sender, &invitation.receiver_email, "")?;
    }
    Ok(())
}

/// The messages of the invitations `changes` open, each with its organization: to each receiver, from the operator's sender,
/// its invitation and organization ids, its code and its signed encryption target. Nothing of it
/// is the body's words (no names, no sender's text): the organization's members choose only who
/// receives it.
pub(super) fn messages(hsm: &Hsm, settings: &OtpSettings, changes: &[Change]) -> Vec<(lettre::Message, String)> {
    let mut out = Vec::new();
    for c in changes {
        let Effect::PutInvitation { id, invitation } = &c.effect else { continue };
        match message(hsm, settings, &c.organization_id, id, invitation) {
            Ok(m) => out.push((m, c.organization_id.clone())),
            // Committed: the operator's log says which one was not sent.
            Err(e) => tracing::warn!(error = %e, invitation = %id, "an invitation's message could not be made"),
        }
    }
    out
}

/// The message of invitation `id` of `org` ([`messages`]).
fn message(
    hsm: &Hsm,
    settings: &OtpSettings,
    org: &str,
    id: &str,
    invitation: &coffer_org_rules::model::Invitation,
) -> Result<lettre::Message, EnclaveError> {
    let code = acceptance_code(hsm, org, id)?;
    let target = acceptance_target(hsm, org, id)?;
    let bundle = coffer_crypto::bundle::import_bundle(&super::transfer::HsmSigner::new(hsm)?, &target.public, org, "")?;
    let body = Zeroizing::new(format!(
        "You are invited to join an organization of this Coffer deployment.\n\n\
         Organization: {org}\nInvitation: {id}\nAcceptance code: {}\n\n\
         To accept, submit accept_invitation for this invitation, stamped with the API key you bring, with \
         the code and that key's public key encrypted to this acceptance target (as a one-time code's \
         encryptedOtpBundle):\n\n{bundle}\n\nIf you did not expect this invitation, ignore this email.\n",
        code.as_str()
    ));
    let from: lettre::Address =
        settings.sender.parse().map_err(|_| EnclaveError::Internal("[otp] sender is not an email address".into()))?;
    let to: lettre::Address = invitation
        .receiver_email
        .parse()
        .map_err(|_| EnclaveError::invalid("receiverUserEmail: not an email address"))?;
    let message = lettre::Message::builder()
        .message_id(None)
        .from(Mailbox::new(Some(settings.sender_name.clone()), from))
        .to(Mailbox::new(None, to))
        .subject("Your invitation")
        .singlepart(
            SinglePart::builder()
                .header(ContentType::TEXT_PLAIN)
                .header(lettre::message::header::ContentTransferEncoding::Base64)
                .body(body.to_string()),
        )
        .map_err(|_| EnclaveError::invalid("the invitation's email could not be built"))?;
    Ok(message)
}

/// The identity an `accept_invitation` stamped with the key it brings acts as, checked before
/// its stamp is authorized: `None` for any other request. The body's `apiKey.publicKey` is the
/// stamp's key; the invitation is open in the organization's state; within
/// [`MAX_ACCEPTANCE_ATTEMPTS`], `encryptedOtpBundle` opens under the invitation's target to its
/// code and that same key. The identity is the user the acceptance makes (`create_users`' id
/// for the body), with a credential of type `INVITATION_ACCEPTANCE` for the key: never
/// certified, it may submit this acceptance alone.
pub(super) fn acceptance_identity(
    hsm: &Hsm,
    admission: &Admission,
    auth: Option<&pb::Authorization>,
) -> Result<Option<AttestedIdentity>, EnclaveError> {
    let Some(request) = auth.and_then(|a| a.request.as_ref()) else { return Ok(None) };
    let Ok(activity) = StampedActivity::parse(&request.body) else { return Ok(None) };
    if activity.activity_type != ACCEPT_INVITATION || !request.certificate.is_empty() {
        return Ok(None);
    }
    let refused = |reason, message: &str| EnclaveError::refused(reason, message);
    if !request.stamp_header.eq_ignore_ascii_case("x-stamp") {
        return Err(refused(
            RefusalReason::StampInvalid,
            "an acceptance is stamped (X-Stamp) by the API key it brings",
        ));
    }
    let stamp =
        coffer_auth::stamp::parse(&request.stamp).map_err(|e| refused(RefusalReason::StampInvalid, &e.message))?;
    // The brought key's own signature first: no attempt is counted for a body its key did not
    // stamp (any key may be brought: the signature binds the body to it, so that the same body
    // sent again is the same attempt).
    coffer_auth::stamp::verify(&stamp, &request.body).map_err(|e| refused(RefusalReason::StampInvalid, &e.message))?;
    let p = &activity.parameters;
    let brought = p.get("apiKey").map(|k| text(k, "publicKey").trim().to_ascii_lowercase()).unwrap_or_default();
    if brought.is_empty() || brought != stamp.public_key {
        return Err(refused(RefusalReason::StampInvalid, "an acceptance is stamped by the API key it brings (apiKey)"));
    }
    let org = activity.organization_id.as_str();
    let id = text(p, "invitationId").trim();
    let loaded = admission.rules().load(org)?;
    if !loaded.as_ref().is_some_and(|l| l.state.organization.invitations.contains_key(id)) {
        return Err(refused(RefusalReason::OtpInvalid, INVITATION_INVALID));
    }
    // The attempt counts before the code is looked at (the same stamped body once): for the
    // invitation, then its organization, then its top-level organization (an attempt one lane
    // refuses spends none of the next).
    let now = now_ms();
    let top = admission.top_level_id(org, loaded)?;
    let counts = [
        (format!("invitation-attempts/{org}/{id}"), MAX_ACCEPTANCE_ATTEMPTS),
        (format!("invitation-attempts-of-organization/{org}"), MAX_ACCEPTANCE_ATTEMPTS_PER_ORGANIZATION),
        (format!("invitation-attempts-of/{top}"), MAX_ACCEPTANCE_ATTEMPTS_PER_TOP_LEVEL),
    ];
    for (scope, quota) in counts {
        match admission.count_within(&scope, &activity.fingerprint, now + ATTEMPT_WINDOW_MS, now, quota)? {
            Remembered::Fresh | Remembered::Replayed => {}
            _ => return Err(refused(RefusalReason::OtpRateLimited, "too many acceptances tried lately: retry later")),
        }
    }
    let target = acceptance_target(hsm, org, id)?;
    let plain = coffer_crypto::bundle::open_encrypted_bundle(&target.secret, text(p, "encryptedOtpBundle"))
        .map_err(|_| refused(RefusalReason::OtpInvalid, INVITATION_INVALID))?;
    let sent: EncryptedCode =
        serde_json::from_slice(&plain).map_err(|_| refused(RefusalReason::OtpInvalid, INVITATION_INVALID))?;
    let code = acceptance_code(hsm, org, id)?;
    let given = Zeroizing::new(sent.otp_code.trim().to_ascii_uppercase());
    let same_code =
        given.len() == code.len() && given.bytes().zip(code.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
    if !same_code || sent.public_key.trim().to_ascii_lowercase() != stamp.public_key {
        return Err(refused(RefusalReason::OtpInvalid, INVITATION_INVALID));
    }
    let credential = pb::CredentialCertificate {
        organization_id: org.to_string(),
        user_id: derived_id(&activity.fingerprint, USER_ID, 0),
        credential_type: INVITATION_ACCEPTANCE.into(),
        public_key: stamp.public_key,
        expires_at_ms: 0,
        issuing_fingerprint: String::new(),
        mac: Vec::new(),
        session_scope: String::new(),
    };
    Ok(Some(AttestedIdentity::Invitation { credential }))
}
