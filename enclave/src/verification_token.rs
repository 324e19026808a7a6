//! Verification tokens in the enclave (their format is `coffer_auth::verification_token`): signed
//! by the HSM's notarizer for a right code, checked, spent once in the shared store; a client
//! signature by the key one names; and what a sign-up with one must show.

use coffer_auth::envelope::text;
use serde_json::Value;

use crate::admission::{refuse, Admission, Admitted};
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::{Hsm, LoginKey};
use crate::store::Remembered;

/// How long past a code's or token's expiry the store keeps what was counted and spent of it:
/// another enclave whose clock is behind still sees it as counted or spent while it thinks the
/// code or token is alive.
pub const MARKER_MARGIN_MS: i64 = 10 * 60 * 1000;

/// The one answer for a code or token that cannot be used, whatever the reason (wrong, expired,
/// used, out of attempts): a caller learns nothing more by trying.
pub const OTP_INVALID: &str = "the one-time code or verification token is invalid, expired or already used";
pub use coffer_auth::verification_token::VerifiedToken;

/// Signs `claims` (the interface's six, all strings) as a verification token.
pub fn sign(hsm: &Hsm, claims: &Value) -> Result<String, EnclaveError> {
    let (input, digest) = coffer_auth::verification_token::signing_input(claims);
    let signature = hsm.sign_digest_with(LoginKey::Notarizer, &digest)?;
    Ok(coffer_auth::verification_token::assemble(&input, &signature))
}

/// Checks a verification token against this enclave's notarizer key: signed as one, and
/// unexpired. Every failure is [`OTP_INVALID`].
pub fn read(hsm: &Hsm, token: &str, now_ms: i64) -> Result<VerifiedToken, EnclaveError> {
    let notarizer = hsm.login_public_keys()?.notarizer;
    coffer_auth::verification_token::verify(token, &notarizer, now_ms)
        .ok_or_else(|| EnclaveError::refused(RefusalReason::OtpInvalid, OTP_INVALID))
}

/// What a token is spent on: once for each. `@turnkey/core`'s `signUpWithOtp` signs up and then
/// logs in with the same token, as the hosted service allows (the usage types of its client
/// signatures).
#[derive(Clone, Copy)]
pub enum Usage {
    /// A sign-up (`create_sub_organization` with the token).
    Signup,
    /// A login (`otp_login`, or a `stamp_login` the token attests).
    Login,
    /// A user's new email or phone number (`update_user_email`, `update_user_phone_number`).
    Contact,
}

/// Spends `token` for `usage` in the store every enclave shares: `true` the first time, `false`
/// after.
pub fn spend(admission: &Admission, token: &VerifiedToken, usage: Usage, now_ms: i64) -> Result<bool, EnclaveError> {
    let kept_until = token.expires_ms.saturating_add(MARKER_MARGIN_MS);
    let scope = match usage {
        Usage::Signup => "otp-tokens-spent/signup",
        Usage::Login => "otp-tokens-spent/login",
        Usage::Contact => "otp-tokens-spent/contact",
    };
    Ok(admission.count_within(scope, &token.id, kept_until, now_ms, u64::MAX)? == Remembered::Fresh)
}

/// The body's `verificationToken`, read ([`read`]) with the refusal's audit line when it is not
/// a genuine, unexpired token.
fn read_stamped(hsm: &Hsm, a: &Admitted, now_ms: i64) -> Result<VerifiedToken, EnclaveError> {
    read(hsm, text(&a.activity.parameters, "verificationToken"), now_ms).inspect_err(|_| {
        refuse(a, RefusalReason::OtpInvalid, OTP_INVALID);
    })
}

/// The body's `clientSignature` (in `p`) by the token's key over `usage`
/// (`coffer_auth::client_signature::check`).
pub fn check_client_signature(p: &Value, token: &VerifiedToken, usage: &Value) -> Result<(), &'static str> {
    coffer_auth::client_signature::check(p, &token.public_key, usage)
}

/// The contacts (email, phone number) a sub-organization's root users are created with.
pub fn signup_contacts(p: &Value) -> Vec<(&'static str, String)> {
    let users = p.get("rootUsers").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let mut out = Vec::new();
    for u in users {
        for (k, ty) in [("userEmail", "OTP_TYPE_EMAIL"), ("userPhoneNumber", "OTP_TYPE_SMS")] {
            let v = text(u, k).trim();
            if !v.is_empty() {
                out.push((ty, v.to_string()));
            }
        }
    }
    out
}

/// A `create_sub_organization` with a `verificationToken`: the token is this enclave's and
/// unexpired, every contact of the root users is the one it verified, the body's
/// `clientSignature` by the token's key covers this sign-up (`{"signupV2": {apiKeys,
/// authenticators, oauthProviders, email?, phoneNumber?}, "tokenId", "type": "USAGE_TYPE_SIGNUP"}`)
/// when the token names a key, and the token is spent.
pub fn check_signup(hsm: &Hsm, admission: &Admission, a: &Admitted) -> Result<(), EnclaveError> {
    let p = &a.activity.parameters;
    let now = crate::admission::now_ms();
    let token = read_stamped(hsm, a, now)?;
    // The token's organization signs its users up (into a new sub-organization of it).
    if token.organization_id != a.activity.organization_id {
        return Err(refuse(a, RefusalReason::OtpInvalid, OTP_INVALID));
    }
    // The client's signature covers one root user: a sign-up with a token has that one user, alone
    // in the root quorum, so that nobody else's user or key can be added beside it.
    let one_user = p.get("rootUsers").and_then(Value::as_array).is_some_and(|u| u.len() == 1);
    let threshold = p.get("rootQuorumThreshold");
    let threshold_one = threshold.and_then(Value::as_i64) == Some(1) || threshold.and_then(Value::as_str) == Some("1");
    if !one_user || !threshold_one {
        return Err(refuse(
            a,
            RefusalReason::BindingMismatch,
            "a sign-up with a verification token has one root user and a root quorum threshold of 1",
        ));
    }
    let contacts = signup_contacts(p);
    let verified = |(ty, c): &(&str, String)| *ty == token.verification_type && c.eq_ignore_ascii_case(&token.contact);
    if contacts.is_empty() || !contacts.iter().all(verified) {
        return Err(refuse(
            a,
            RefusalReason::BindingMismatch,
            "the root users' email or phone number is not the contact the verification token verified",
        ));
    }
    let usage = coffer_auth::client_signature::signup_usage(p, Some(&token.id));
    check_client_signature(p, &token, &usage).map_err(|m| refuse(a, RefusalReason::BindingMismatch, m))?;
    if !spend(admission, &token, Usage::Signup, now)? {
        return Err(refuse(a, RefusalReason::OtpInvalid, OTP_INVALID));
    }
    Ok(())
}

/// The activity types whose `verificationToken` verifies the contact they set, with the field
/// that holds it and the kind of code that verifies it.
pub const CONTACT_UPDATES: [(&str, &str, &str); 2] = [
    ("ACTIVITY_TYPE_UPDATE_USER_EMAIL", "userEmail", "OTP_TYPE_EMAIL"),
    ("ACTIVITY_TYPE_UPDATE_USER_PHONE_NUMBER", "userPhoneNumber", "OTP_TYPE_SMS"),
];

/// An `update_user_email` or `update_user_phone_number` with a `verificationToken`: the token is
/// this enclave's and unexpired, was issued by the organization or its parent (whose auth proxy
/// verifies its sub-organizations' users), verified a code of the field's kind sent to exactly
/// the new value; the user is the stamping credential's own; the token's key stamped the body or
/// signed `update_contact_usage` in its `clientSignature` (a token alone is no bearer secret:
/// whoever saw it, the gateway included, cannot spend it); and it is spent, for a contact and for
/// any other use (a token that logged in or signed up verifies no contact, and one that verified
/// a contact does neither after). The transition then marks the contact verified
/// (`coffer_org_rules`' `update_user_field`).
pub fn check_contact(hsm: &Hsm, admission: &Admission, a: &Admitted) -> Result<(), EnclaveError> {
    let p = &a.activity.parameters;
    let Some((_, field, kind)) = CONTACT_UPDATES.iter().find(|(t, _, _)| *t == a.activity.activity_type) else {
        return Err(EnclaveError::Internal("a contact check of another activity".into()));
    };
    let value = text(p, field).trim();
    if value.is_empty() {
        return Err(refuse(
            a,
            RefusalReason::BindingMismatch,
            "a verification token verifies a contact, not its removal",
        ));
    }
    let now = crate::admission::now_ms();
    let token = read_stamped(hsm, a, now)?;
    let org = &a.activity.organization_id;
    let parent = admission.rules().load(org)?.and_then(|l| l.state.organization.parent_id.clone());
    if token.organization_id != *org && Some(&token.organization_id) != parent.as_ref() {
        return Err(refuse(a, RefusalReason::OtpInvalid, OTP_INVALID));
    }
    if token.verification_type != *kind || !value.eq_ignore_ascii_case(&token.contact) {
        return Err(refuse(
            a,
            RefusalReason::BindingMismatch,
            "the new email or phone number is not the contact the verification token verified",
        ));
    }
    let user_id = text(p, "userId");
    if user_id != a.credential.user_id {
        return Err(refuse(
            a,
            RefusalReason::BindingMismatch,
            "a verification token verifies a contact of the stamping user only",
        ));
    }
    let stamped_by_token_key = a.credential.public_key.eq_ignore_ascii_case(&token.public_key);
    if !stamped_by_token_key {
        let usage = coffer_auth::client_signature::update_contact_usage(user_id, value, &token.id);
        check_client_signature(p, &token, &usage).map_err(|m| refuse(a, RefusalReason::BindingMismatch, m))?;
    }
    // Spent for every use at once: each scope answers whether it was fresh.
    let mut fresh = true;
    for usage in [Usage::Contact, Usage::Login, Usage::Signup] {
        fresh &= spend(admission, &token, usage, now)?;
    }
    if !fresh {
        return Err(refuse(a, RefusalReason::OtpInvalid, OTP_INVALID));
    }
    Ok(())
}
