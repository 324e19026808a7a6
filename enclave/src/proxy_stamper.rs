//! The auth proxy's key: made and sealed here when an organization enables its auth proxy, and
//! used only to stamp what the proxy submits for browsers — oauth2_authenticate and signups
//! (create_sub_organization) of its own organization, oauth_login — timestamped now.

use coffer_auth::envelope::{derived_id, text, StampedActivity, USER_ID};
use coffer_proto::v1 as pb;
use p256::ecdsa::signature::Signer;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use serde_json::json;

use crate::admission::{Admission, Admitted};
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::{BlobBinding, BlobKind, Hsm};

pub const ENABLE_AUTH_PROXY: &str = "ACTIVITY_TYPE_ENABLE_AUTH_PROXY";
const OAUTH2_AUTHENTICATE: &str = "ACTIVITY_TYPE_OAUTH2_AUTHENTICATE";
const CREATE_SUB_ORGANIZATION: &str = coffer_auth::grants::CREATE_SUB_ORGANIZATION;
use crate::sessions::{INIT_OTP, VERIFY_OTP};

fn binding<'a>(organization_id: &'a str, user_id: &'a str, public_key: &'a str) -> BlobBinding<'a> {
    BlobBinding {
        curve: "CURVE_P256",
        public_key,
        ..BlobBinding::plain(BlobKind::AuthProxyKey, organization_id, user_id)
    }
}

/// A fresh P-256 key for the proxy user the stamped `enable_auth_proxy` creates.
pub fn enable(hsm: &Hsm, admission: &Admission, a: &Admitted) -> Result<pb::EnableAuthProxyResponse, EnclaveError> {
    if a.via_parent {
        return Err(EnclaveError::invalid("enable_auth_proxy is the organization's own activity"));
    }
    let organization_id = a.activity.organization_id.clone();
    let user_id = derived_id(&a.activity.fingerprint, USER_ID, 0);
    let secret = loop {
        let bytes = hsm.random(32)?;
        if let Ok(sk) = p256::SecretKey::from_slice(&bytes) {
            break sk;
        }
    };
    let public_key = hex::encode(secret.public_key().to_encoded_point(true).as_bytes());
    let sealed_key = hsm.seal(&binding(&organization_id, &user_id, &public_key), secret.to_bytes().as_slice())?;
    let certificate = admission.certify(pb::CredentialCertificate {
        organization_id: organization_id.clone(),
        user_id: user_id.clone(),
        credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
        public_key: public_key.clone(),
        expires_at_ms: 0,
        issuing_fingerprint: a.activity.fingerprint.clone(),
        mac: vec![],
        session_scope: String::new(),
    })?;
    // The proxy user, its key and the switch enter the authority state with the activity's
    // changes (ApplyActivity, which checks this certificate is the one issued here).
    Ok(pb::EnableAuthProxyResponse { user_id, public_key, sealed_key, certificate })
}

/// The `X-Stamp` of `req.body` by the proxy key, for the login activities and sign-ups only.
pub fn stamp(hsm: &Hsm, admission: &Admission, req: &pb::StampAuthProxyRequestRequest) -> Result<String, EnclaveError> {
    let activity = StampedActivity::parse(&req.body)?;
    // The audit line of a refusal.
    let audit = |code: RefusalReason, reason: &str| {
        tracing::warn!(
            target: "coffer_audit",
            decision = "refuse",
            operation = "stamp_auth_proxy_request",
            reason,
            reason_code = code.as_str_name(),
            organization = %req.organization_id,
            fingerprint = %activity.fingerprint,
            "enclave decision"
        );
    };
    let refuse = |code: RefusalReason, reason: &str| {
        audit(code, reason);
        EnclaveError::refused(code, reason)
    };
    match activity.activity_type.as_str() {
        OAUTH2_AUTHENTICATE | CREATE_SUB_ORGANIZATION | INIT_OTP | VERIFY_OTP
            if activity.organization_id != req.organization_id =>
        {
            return Err(refuse(
                RefusalReason::OrganizationMismatch,
                "the auth proxy exchanges codes, sends and verifies one-time codes and signs users up only in its own organization",
            ))
        }
        // Another organization's oauth_login (a sub-organization's user) runs only with that
        // organization's parent certificate naming the proxy's organization. A signup makes a new
        // sub-organization (what the proxy does for anyone, by design), never touches another.
        OAUTH2_AUTHENTICATE
        | CREATE_SUB_ORGANIZATION
        | INIT_OTP
        | VERIFY_OTP
        | crate::sessions::OAUTH_LOGIN
        | crate::sessions::OTP_LOGIN => {}
        _ => {
            return Err(refuse(
                RefusalReason::OperationMismatch,
                "the auth proxy key stamps only oauth2_authenticate, oauth_login, init_otp, verify_otp, otp_login and create_sub_organization",
            ))
        }
    }
    if !admission.is_fresh(activity.timestamp_ms) {
        return Err(refuse(RefusalReason::Stale, "the body's timestampMs is not the enclave's now"));
    }
    // The proxy stops with disable_auth_proxy: its organization's state must still have it
    // enabled, with this key a live credential of the proxy user.
    let loaded = admission.rules().load(&req.organization_id)?;
    let live = loaded.as_ref().is_some_and(|l| {
        l.state.organization.auth_proxy_enabled
            && l.state
                .live_credential(
                    &req.user_id,
                    &req.public_key,
                    "CREDENTIAL_TYPE_API_KEY_P256",
                    crate::admission::now_ms(),
                )
                .is_some()
    });
    if !live {
        return Err(refuse(
            RefusalReason::CredentialRevoked,
            "the auth proxy is disabled, or this is not its key, in the organization's authority state",
        ));
    }
    // A code the proxy sends for anyone carries nothing the visitor chose but the contact: no
    // link, logo, sender or template, which would make the enclave's mail a phishing relay.
    if activity.activity_type == INIT_OTP {
        let p = &activity.parameters;
        let email = p.get("emailCustomization").cloned().unwrap_or(serde_json::Value::Null);
        let sms = p.get("smsCustomization").cloned().unwrap_or(serde_json::Value::Null);
        let chosen = ["magicLinkTemplate", "logoUrl", "templateVariables"].iter().any(|k| !text(&email, k).is_empty())
            || !text(&sms, "template").is_empty()
            || ["sendFromEmailAddress", "sendFromEmailSenderName", "replyToEmailAddress"]
                .iter()
                .any(|k| !text(p, k).is_empty());
        if chosen {
            return Err(refuse(
                RefusalReason::BindingMismatch,
                "the auth proxy sends codes without a link, logo, sender or template of the visitor's",
            ));
        }
        // Under its configuration's app name as this enclave recorded it (update_auth_proxy_config),
        // never one the gateway's record or the visitor holds.
        let recorded = loaded.as_ref().map_or(coffer_org_rules::transition::DEFAULT_AUTH_PROXY_APP_NAME, |l| {
            coffer_org_rules::transition::proxy_app_name(&l.state.organization)
        });
        if text(p, "appName").trim() != recorded {
            return Err(refuse(
                RefusalReason::BindingMismatch,
                &format!(
                    "the auth proxy sends codes under its configuration's appName as the enclave recorded it \
                     ({recorded:?}, from update_auth_proxy_config), not another"
                ),
            ));
        }
    }
    // The proxy logs users of its sub-organizations in by one-time code, never its own
    // organization's (whose members an email alone must not reach).
    if activity.activity_type == crate::sessions::OTP_LOGIN && activity.organization_id == req.organization_id {
        return Err(refuse(
            RefusalReason::OrganizationMismatch,
            "the auth proxy logs in by one-time code only users of its sub-organizations",
        ));
    }
    // A sign-up the proxy stamps for anyone names an email or phone number only with the
    // verification token of it (checked and spent where the sign-up is applied): else anyone could
    // take someone else's address, and its owner's one-time code login would find their account.
    if activity.activity_type == CREATE_SUB_ORGANIZATION
        && !crate::verification_token::signup_contacts(&activity.parameters).is_empty()
        && text(&activity.parameters, "verificationToken").is_empty()
    {
        return Err(refuse(
            RefusalReason::BindingMismatch,
            "an auth proxy sign-up with an email or phone number needs the verificationToken of it (one-time code)",
        ));
    }
    // Every sign-up the proxy stamps marks its sub-organization as the proxy's (the authority
    // state keeps the mark): what Coffer sends for it then carries its parent's name only and
    // counts against its parent's allowance, so fresh sign-ups are no phishing relay.
    if activity.activity_type == CREATE_SUB_ORGANIZATION
        && !coffer_org_rules::transition::marks_auth_proxy_signup(&activity.parameters)
    {
        return Err(refuse(
            RefusalReason::BindingMismatch,
            &format!(
                "an auth proxy sign-up carries {}: true (its sub-organization sends under its parent's name)",
                coffer_org_rules::transition::AUTH_PROXY_SIGNUP
            ),
        ));
    }
    // Nor may it register a lasting API key its holder did not sign the sign-up with: else anyone
    // could register someone else's (wallet) key beside a passkey of their own.
    if activity.activity_type == CREATE_SUB_ORGANIZATION {
        if let Some(key) = coffer_auth::client_signature::unproven_lasting_key(&activity.parameters) {
            return Err(refuse(
                RefusalReason::BindingMismatch,
                &format!(
                    "an auth proxy sign-up registers API key {key} only with its clientSignature over the sign-up, \
                     or expiring within {} seconds",
                    coffer_auth::client_signature::UNPROVEN_KEY_MOST_SECONDS
                ),
            ));
        }
    }
    // Nor an OAuth identity the visitor did not show a token of: with bare `oidcClaims` anyone
    // could register someone's identity (its subject is no secret) beside a passkey of their own.
    if activity.activity_type == CREATE_SUB_ORGANIZATION {
        let users = activity.parameters.get("rootUsers").and_then(serde_json::Value::as_array);
        let bare = users.into_iter().flatten().any(|u| {
            let providers = u.get("oauthProviders").and_then(serde_json::Value::as_array);
            providers.into_iter().flatten().any(|p| text(p, "oidcToken").trim().is_empty())
        });
        if bare {
            return Err(refuse(
                RefusalReason::BindingMismatch,
                "an auth proxy sign-up names an OAuth identity only with its oidcToken, not oidcClaims",
            ));
        }
    }
    // Sign-ups, which the proxy stamps for anyone, are counted per proxy and bounded.
    if activity.activity_type == CREATE_SUB_ORGANIZATION {
        if let Err(e) = admission.charge_signup(&req.organization_id, &activity.fingerprint) {
            let code = match &e {
                EnclaveError::Busy { reason, .. } => *reason,
                _ => RefusalReason::Unspecified,
            };
            audit(code, &e.to_string());
            return Err(e);
        }
    }
    // Decided: the key is opened (a sealed key that does not open is an outcome, see audit.rs).
    tracing::info!(
        target: "coffer_audit",
        decision = "allow",
        operation = "stamp_auth_proxy_request",
        organization = %activity.organization_id,
        fingerprint = %activity.fingerprint,
        "enclave decision"
    );
    crate::audit::record(crate::audit::Decision {
        operation: "stamp_auth_proxy_request",
        organization: activity.organization_id.clone(),
        credential: req.public_key.clone(),
        fingerprint: activity.fingerprint.clone(),
    });
    let plain = hsm.unseal(&binding(&req.organization_id, &req.user_id, &req.public_key), &req.sealed_key)?;
    let key = p256::ecdsa::SigningKey::from_slice(&plain)
        .map_err(|_| EnclaveError::Internal("sealed auth proxy key is not a P-256 scalar".into()))?;
    drop(plain);
    let signature: p256::ecdsa::Signature = key.sign(&req.body);
    let stamp = json!({
        "publicKey": req.public_key,
        "scheme": "SIGNATURE_SCHEME_TK_API_P256",
        "signature": hex::encode(signature.to_der().as_bytes()),
    });
    use base64::Engine;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(stamp.to_string()))
}
