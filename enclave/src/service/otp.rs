//! One-time codes: drawn from the HSM, sent by the enclave itself, kept only as a salted hash in a
//! record sealed to the organization, verified once within a bounded number of attempts, and
//! traded for a verification token the HSM signs; `otp_login` spends that token once.

use std::sync::Arc;

use coffer_auth::envelope::{derived_id, text};
use coffer_proto::v1 as pb;
use lettre::message::{header::ContentType, Mailbox, MultiPart, SinglePart};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tonic::{Response, Status};
use zeroize::{Zeroize, Zeroizing};

use super::worker::{run_blocking, status};
use crate::admission::{now_ms, refuse, Admission, Admitted};
use crate::audit;
use crate::config::OtpSettings;
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::{BlobBinding, BlobKind, Hsm};
use crate::mail::Mailer;
use crate::sessions::{SessionGrant, INIT_OTP, INIT_OTP_AUTH, VERIFY_OTP};
use crate::store::Remembered;
use crate::verification_token::{self, OTP_INVALID};

/// Code lengths the interface allows, and its default (`otpLength`).
const LENGTHS: std::ops::RangeInclusive<usize> = 6..=9;
const DEFAULT_LENGTH: usize = 9;
/// `expirationSeconds` of a code: default and most.
const DEFAULT_CODE_SECONDS: u64 = 300;
const MAX_CODE_SECONDS: u64 = 600;
/// `expirationSeconds` of a verification token: default and most.
const DEFAULT_TOKEN_SECONDS: u64 = 3600;
const MAX_TOKEN_SECONDS: u64 = 86_400;
/// Crockford's base32 alphabet (no I, L, O, U): what alphanumeric codes are drawn from.
pub(super) const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const HOUR_MS: i64 = 3_600_000;

/// The services one-time codes need besides the HSM and the admission.
pub struct OtpService {
    pub settings: OtpSettings,
    pub mailer: Mailer,
    pub sms: crate::sms::SmsSender,
}

/// A code's record, sealed to (organization, otp id): everything `verify_otp` needs, and of the
/// code only a salted hash. Zeroized when dropped (it holds the encryption target's secret).
#[derive(Serialize, Deserialize)]
struct OtpRecord {
    v: u8,
    otp_id: String,
    organization_id: String,
    contact: String,
    otp_type: String,
    salt: String,
    code_hash: String,
    expires_ms: i64,
    /// The P-256 secret the client encrypts the code to (hex); empty for an `init_otp_auth` code.
    target_secret: String,
    /// What the code is for: [`Purpose::Verify`] (`init_otp`, absent in records written before
    /// `init_otp_auth`) or [`Purpose::Auth`]. A code serves only the call it was made for.
    #[serde(default)]
    purpose: Purpose,
}

/// The call a code was made for, and the only one it serves.
#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
enum Purpose {
    /// `init_otp` → `verify_otp` (the code encrypted to the record's key) → a verification token.
    #[default]
    Verify,
    /// `init_otp_auth` → `otp_auth` (the code as typed, in the stamped body) → a credential.
    Auth,
}

impl Drop for OtpRecord {
    fn drop(&mut self) {
        self.target_secret.zeroize();
        self.code_hash.zeroize();
    }
}

/// `init_otp`: authorize, charge the send limits, draw the code, seal its record, send it.
pub(super) async fn init_otp(
    hsm: Arc<Hsm>,
    admission: Arc<Admission>,
    otp: Arc<OtpService>,
    req: pb::InitOtpRequest,
) -> Result<Response<pb::InitOtpResponse>, Status> {
    let o = otp.clone();
    let prepared = run_blocking(move || {
        // A parent organization's credential may ask for init_otp_auth (as for a login), and only
        // for it: init_otp's token is the sub-organization's own business.
        let parent = (!req.parent_certificate.is_empty()).then_some(req.parent_certificate.as_slice());
        let types: &[&str] = if parent.is_some() { &[INIT_OTP_AUTH] } else { &[INIT_OTP, INIT_OTP_AUTH] };
        let a = admission.authorize_for("init_otp", req.auth.as_ref(), types, parent, None)?;
        // Past its allow, how it ends is recorded: the log links it so.
        let outcome_log = a.outcome_recorder();
        let prepared = prepare(&hsm, &admission, &o, &a).inspect_err(|e| outcome_log.failed(e))?;
        Ok((prepared, audit::carry(), outcome_log))
    })
    .await;
    let ((response, outgoing), outcome, outcome_log) = match prepared {
        Ok(v) => v,
        Err(e) => return Err(status(e)),
    };
    let mut response = response;
    let sent = outcome_log.close(match outgoing {
        Outgoing::Email(message, event) => {
            let sent = otp.mailer.send(*message).await;
            response.email_events.extend(sent.is_ok().then_some(event));
            sent
        }
        Outgoing::Sms { to, text } => otp.sms.send(&to, &text).await,
    });
    outcome.close(sent.as_ref().map(|_| ()));
    sent.map(|_| Response::new(response)).map_err(status)
}

/// What carries a code: email, or SMS through the configured provider.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Channel {
    Email,
    Sms,
}

impl Channel {
    /// The `otpType` (and a verification token's `verification_type`) of the channel.
    fn otp_type(self) -> &'static str {
        match self {
            Self::Email => "OTP_TYPE_EMAIL",
            Self::Sms => "OTP_TYPE_SMS",
        }
    }
}

/// A message ready to send.
enum Outgoing {
    /// The message, and what is recorded of it once sent.
    Email(Box<lettre::Message>, pb::EmailEvent),
    Sms {
        to: String,
        text: Zeroizing<String>,
    },
}

/// What a well-formed `initOtpIntentV3` asks for.
struct InitParams {
    channel: Channel,
    contact: String,
    /// `smsCustomization.template` (with `{{.OtpCode}}`), or empty for the default text.
    sms_template: String,
    length: usize,
    alphanumeric: bool,
    expires_secs: u64,
    app_name: String,
    from: Mailbox,
    reply_to: Option<Mailbox>,
    user_identifier: String,
    logo_url: String,
    magic_link_template: String,
}

fn read_init(p: &Value, s: &OtpSettings) -> Result<InitParams, EnclaveError> {
    let channel = match text(p, "otpType") {
        "OTP_TYPE_EMAIL" => Channel::Email,
        "OTP_TYPE_SMS" => Channel::Sms,
        "OTP_TYPE_WHATSAPP" => {
            return Err(EnclaveError::invalid(
                "otpType: OTP_TYPE_WHATSAPP is not supported (OTP_TYPE_EMAIL or OTP_TYPE_SMS)",
            ))
        }
        _ => return Err(EnclaveError::invalid("otpType must be OTP_TYPE_EMAIL, OTP_TYPE_SMS or OTP_TYPE_WHATSAPP")),
    };
    let raw_contact = text(p, "contact").trim();
    let contact = match channel {
        Channel::Email => raw_contact
            .parse::<lettre::Address>()
            .map_err(|_| EnclaveError::invalid("contact: not an email address"))?
            .to_string(),
        Channel::Sms if coffer_auth::verification_token::is_e164(raw_contact) => raw_contact.to_string(),
        Channel::Sms => return Err(EnclaveError::invalid("contact: not an E.164 phone number (e.g. +13214567890)")),
    };
    let sms_template = text(p.get("smsCustomization").unwrap_or(&Value::Null), "template").trim().to_string();
    if !sms_template.is_empty()
        && (sms_template.matches("{{.OtpCode}}").count() != 1
            || sms_template.len() > 320
            || sms_template.chars().any(|c| c.is_control() && c != '\n'))
    {
        return Err(EnclaveError::invalid(
            "smsCustomization.template: at most 320 characters with exactly one {{.OtpCode}}",
        ));
    }
    let length = match p.get("otpLength") {
        None => DEFAULT_LENGTH,
        Some(v) => v
            .as_u64()
            .map(|n| n as usize)
            .filter(|n| LENGTHS.contains(n))
            .ok_or_else(|| EnclaveError::invalid("otpLength: a whole number from 6 to 9"))?,
    };
    let alphanumeric = match p.get("alphanumeric") {
        None => true,
        Some(v) => v.as_bool().ok_or_else(|| EnclaveError::invalid("alphanumeric: true or false"))?,
    };
    let expires_secs = seconds(p, DEFAULT_CODE_SECONDS, MAX_CODE_SECONDS)?;
    let app_name = text(p, "appName").trim().to_string();
    if app_name.is_empty() || app_name.len() > 256 || app_name.chars().any(char::is_control) {
        return Err(EnclaveError::invalid("appName is required (at most 256 characters, no control characters)"));
    }
    let sender = match text(p, "sendFromEmailAddress").trim() {
        "" => s.sender.as_str(),
        a => a,
    };
    let sender: lettre::Address =
        sender.parse().map_err(|_| EnclaveError::invalid("sendFromEmailAddress: not an email address"))?;
    let default_domain = s.sender.rsplit('@').next().unwrap_or_default().to_ascii_lowercase();
    let domain = sender.domain().to_ascii_lowercase();
    if domain != default_domain && !s.sender_domains.contains(&domain) {
        return Err(EnclaveError::invalid(
            "sendFromEmailAddress: its domain is not one the enclave may send from ([otp] sender_domains)",
        ));
    }
    let name = match text(p, "sendFromEmailSenderName").trim() {
        "" => s.sender_name.clone(),
        n if n.len() <= 256 && !n.chars().any(char::is_control) => n.to_string(),
        _ => {
            return Err(EnclaveError::invalid("sendFromEmailSenderName: at most 256 characters, no control characters"))
        }
    };
    let reply_to = match text(p, "replyToEmailAddress").trim() {
        "" => None,
        r => Some(Mailbox::new(
            None,
            r.parse().map_err(|_| EnclaveError::invalid("replyToEmailAddress: not an email address"))?,
        )),
    };
    let custom = p.get("emailCustomization").cloned().unwrap_or(Value::Null);
    let logo_url = text(&custom, "logoUrl").trim().to_string();
    if !logo_url.is_empty() && (!logo_url.starts_with("https://") || logo_url.contains(['"', '<', '>', ' '])) {
        return Err(EnclaveError::invalid("emailCustomization.logoUrl: an https URL"));
    }
    let magic_link_template = text(&custom, "magicLinkTemplate").trim().to_string();
    if !magic_link_template.is_empty()
        && (!magic_link_template.starts_with("https://")
            || magic_link_template.matches("%s").count() != 1
            || magic_link_template.contains(['"', '<', '>', ' ']))
    {
        return Err(EnclaveError::invalid(
            "emailCustomization.magicLinkTemplate: an https URL with exactly one %s where the code goes",
        ));
    }
    Ok(InitParams {
        channel,
        contact,
        sms_template,
        length,
        alphanumeric,
        expires_secs,
        app_name,
        from: Mailbox::new(Some(name), sender),
        reply_to,
        user_identifier: text(p, "userIdentifier").trim().to_string(),
        logo_url,
        magic_link_template,
    })
}

/// `expirationSeconds` (a decimal string, or a number): absent → `default`, else 1 ..= `max`.
fn seconds(p: &Value, default: u64, max: u64) -> Result<u64, EnclaveError> {
    let invalid = || EnclaveError::invalid(format!("expirationSeconds: a whole number of seconds from 1 to {max}"));
    let n = match p.get("expirationSeconds") {
        None => return Ok(default),
        Some(Value::String(s)) if s.trim().is_empty() => return Ok(default),
        Some(Value::String(s)) => s.trim().parse::<u64>().map_err(|_| invalid())?,
        Some(v) => v.as_u64().ok_or_else(invalid)?,
    };
    if n == 0 || n > max {
        return Err(invalid());
    }
    Ok(n)
}

/// The blocking part of `init_otp`: limits, code, record, bundle and message (sent by the caller).
fn prepare(
    hsm: &Hsm,
    admission: &Admission,
    otp: &OtpService,
    a: &Admitted,
) -> Result<(pb::InitOtpResponse, Outgoing), EnclaveError> {
    let org = a.activity.organization_id.as_str();
    let sender = sender_of(admission, a)?;
    let params = read_init(&sender.parameters(a, "appName")?, &otp.settings)?;
    match params.channel {
        Channel::Email if !otp.mailer.configured() => {
            return Err(EnclaveError::invalid(
                "email one-time codes need the enclave's mail transport ([otp] smtp_url or mail_dir)",
            ))
        }
        Channel::Sms if !otp.sms.configured() => {
            return Err(EnclaveError::invalid("SMS one-time codes need the enclave's SMS provider ([otp] sms_url)"))
        }
        _ => {}
    }
    charge_send(admission, &otp.settings, a, &sender, &params.contact, &params.user_identifier)?;
    let now = now_ms();
    let code = draw_code(hsm, params.length, params.alphanumeric)?;
    let otp_id = derived_id(&a.activity.fingerprint, "otp", 0);
    let salt = hex::encode(hsm.random(16)?.as_slice());
    let purpose = if a.activity.activity_type == INIT_OTP_AUTH { Purpose::Auth } else { Purpose::Verify };
    // Only a code verify_otp checks is sent back encrypted, to a key of its own.
    let target = match purpose {
        Purpose::Verify => Some(coffer_crypto::bundle::new_import_target(&hsm.random_seed()?)?),
        Purpose::Auth => None,
    };
    let record = OtpRecord {
        v: 1,
        otp_id: otp_id.clone(),
        organization_id: org.to_string(),
        contact: params.contact.clone(),
        otp_type: params.channel.otp_type().into(),
        code_hash: code_hash(&salt, &otp_id, &code),
        salt,
        expires_ms: now.saturating_add(params.expires_secs as i64 * 1000),
        target_secret: target.as_ref().map(|t| hex::encode(t.secret.as_slice())).unwrap_or_default(),
        purpose,
    };
    let plain = Zeroizing::new(serde_json::to_vec(&record).map_err(|_| EnclaveError::Internal("otp record".into()))?);
    let sealed_otp = hsm.seal(&BlobBinding::plain(BlobKind::OtpRecord, org, &otp_id), &plain)?;
    let otp_encryption_target_bundle = match &target {
        Some(t) => coffer_crypto::bundle::import_bundle(&super::transfer::HsmSigner::new(hsm)?, &t.public, org, "")?,
        None => String::new(),
    };
    let outgoing = match params.channel {
        Channel::Email => {
            let message = message(&params, &code)?;
            let event = crate::mail::event_of(&message, org, crate::mail::SENT);
            Outgoing::Email(Box::new(message), event)
        }
        Channel::Sms => Outgoing::Sms { to: params.contact.clone(), text: sms_text(&params, &code) },
    };
    drop(code);
    tracing::info!(
        target: "coffer_audit",
        decision = "allow",
        operation = %a.activity.activity_type,
        organization = %org,
        otp_id = %otp_id,
        fingerprint = %a.activity.fingerprint,
        "enclave decision"
    );
    let result = json!({ "otpId": otp_id });
    let app_proofs = crate::proofs::of_call(hsm, a, result)?;
    let evaluation = a.evaluation();
    let response = pb::InitOtpResponse {
        otp_id,
        otp_encryption_target_bundle,
        sealed_otp,
        evaluation,
        app_proofs,
        email_events: Vec::new(),
    };
    Ok((response, outgoing))
}

/// Who what an organization sends goes out as, and whose allowance it counts against: the
/// organization itself, or, for a sub-organization the auth proxy signed up
/// (`Organization::auth_proxy_signup`, from the enclave's own state), its parent, whose auth
/// proxy app name (else its name) it carries and nothing the sub-organization chose.
pub(super) struct Sender {
    /// The organization whose hourly allowance (`sends_per_organization_per_hour`) is charged.
    allowance: String,
    /// For a marked sub-organization's own send (not its parent's credential acting for it), the
    /// sub-organization: charged first its own small allowance
    /// (`sends_per_sub_organization_per_hour`), then its share of the parent's that every marked
    /// sub-organization of that parent spends together (`sub_organizations_share_percent`), so
    /// that the rest of the parent's allowance (its auth proxy's login codes) is beyond their reach.
    pub(super) marked: Option<String>,
    /// For a marked sub-organization, the only app name its messages carry (the parent's name).
    brand: Option<String>,
}

/// The fields of a body that choose how a message looks or who it seems to come from.
const CUSTOMISATION: &[&str] = &[
    "appName",
    "emailCustomization",
    "smsCustomization",
    "sendFromEmailAddress",
    "sendFromEmailSenderName",
    "replyToEmailAddress",
];

/// The [`Sender`] of the activity's organization, from its authority state (and its parent's).
/// A parent's own credential acting for its sub-organization brands as it likes, as the parent.
pub(super) fn sender_of(admission: &Admission, a: &Admitted) -> Result<Sender, EnclaveError> {
    let org = a.activity.organization_id.as_str();
    let own = Sender { allowance: org.to_string(), marked: None, brand: None };
    let Some(loaded) = admission.rules().load(org)? else { return Ok(own) };
    let o = &loaded.state.organization;
    let Some(parent) = o.parent_id.as_deref().filter(|_| o.auth_proxy_signup) else { return Ok(own) };
    if a.via_parent {
        return Ok(Sender { allowance: parent.to_string(), marked: None, brand: None });
    }
    // The parent's auth proxy app name as the enclave recorded it (update_auth_proxy_config),
    // else the parent's name.
    let name = admission
        .rules()
        .load(parent)?
        .map(|l| {
            let o = &l.state.organization;
            match o.auth_proxy_app_name.trim() {
                "" => o.name.trim().to_string(),
                app => app.to_string(),
            }
        })
        .unwrap_or_default();
    let brand =
        if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) { "Coffer".into() } else { name };
    Ok(Sender { allowance: parent.to_string(), marked: Some(org.to_string()), brand: Some(brand) })
}

/// Whether a body's customisation field is set: a non-empty text, or an object with any such value.
fn chosen(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.trim().is_empty(),
        Some(Value::Object(m)) => m.values().any(|v| chosen(Some(v))),
        Some(Value::Array(a)) => a.iter().any(|v| chosen(Some(v))),
        Some(_) => true,
    }
}

/// The first customisation field a marked sub-organization's body sets, if any (its app name
/// may be the brand itself, which some clients always send).
fn customised(p: &Value, brand: &str) -> Option<&'static str> {
    CUSTOMISATION.iter().copied().find(|k| match *k {
        "appName" => chosen(p.get(*k)) && text(p, k).trim() != brand,
        "emailCustomization" => {
            let app = p.get(*k).and_then(|c| c.get("appName")).and_then(Value::as_str).map(str::trim);
            let mut rest = p.get(*k).cloned().unwrap_or(Value::Null);
            if let Some(m) = rest.as_object_mut() {
                m.remove("appName");
            }
            chosen(Some(&rest)) || app.is_some_and(|n| !n.is_empty() && n != brand)
        }
        _ => chosen(p.get(*k)),
    })
}

impl Sender {
    /// The activity's parameters as the message is made from them: as stamped, or for a marked
    /// sub-organization, refused if they choose anything ([`CUSTOMISATION`]) and with the
    /// parent's name at `app_name_at` (`appName`, or `emailCustomization.appName`).
    fn parameters(&self, a: &Admitted, app_name_at: &str) -> Result<Value, EnclaveError> {
        let mut p = a.activity.parameters.clone();
        let Some(brand) = &self.brand else { return Ok(p) };
        if let Some(field) = customised(&p, brand) {
            return Err(refuse(
                a,
                RefusalReason::CustomizationNotAllowed,
                &format!(
                    "{field} is not allowed: this sub-organization was signed up through the auth proxy, and what \
                     Coffer sends for it carries its parent's name and nothing it chooses"
                ),
            ));
        }
        match app_name_at.split_once('.') {
            Some((outer, inner)) => {
                let mut m = serde_json::Map::new();
                m.insert(inner.to_string(), json!(brand));
                p[outer] = Value::Object(m);
            }
            None => p[app_name_at] = json!(brand),
        }
        Ok(p)
    }
}

/// Counts one message to `contact` before anything is sent, in the store every enclave shares:
/// per contact, per user identifier (a marked sub-organization's own sends in a lane of their
/// own), for a marked sub-organization's own send its allowance and
/// then its parent's sub-organizations' share, then per organization (an hour each). The same
/// stamped body is never counted twice.
pub(super) fn charge_send(
    admission: &Admission,
    s: &OtpSettings,
    a: &Admitted,
    sender: &Sender,
    contact: &str,
    user_identifier: &str,
) -> Result<(), EnclaveError> {
    charge_message(admission, s, &a.activity.fingerprint, sender, contact, user_identifier)
}

/// [`charge_send`] of the message `what` (a body's fingerprint, or one of the messages a body
/// sends: each counted once).
pub(super) fn charge_message(
    admission: &Admission,
    s: &OtpSettings,
    what: &str,
    sender: &Sender,
    contact: &str,
    user_identifier: &str,
) -> Result<(), EnclaveError> {
    let org = sender.allowance.as_str();
    // Every spelling of one mailbox (quoted, capitals, +tag) or phone number shares its allowance.
    let canonical = coffer_auth::verification_token::canonical_contact(contact)
        .ok_or_else(|| EnclaveError::invalid("contact: not an email address or an E.164 phone number"))?;
    let contact_key = hex::encode(Sha256::digest(canonical.as_bytes()));
    // A marked sub-organization's own sends count per contact in a lane of their own: however
    // many sign-ups a visitor makes, a contact's codes through the parent's proxy (its logins)
    // keep their allowance, and its inbox gets at most one allowance from each lane.
    let lane = if sender.marked.is_some() { "marked-sub-organizations/" } else { "" };
    let mut scopes = Vec::new();
    // A marked sub-organization's own allowance first: past it a send is refused before it
    // spends an entry of any other scope (a visitor cycling through made-up contacts would
    // otherwise leave two hour-long entries per refused send in the shared window).
    if let Some(sub) = &sender.marked {
        scopes.push((format!("otp-sends/marked-sub-organization/{sub}"), s.sends_per_sub_organization_per_hour));
    }
    scopes.push((format!("otp-sends/contact/{lane}{contact_key}"), s.sends_per_contact_per_hour));
    if !user_identifier.is_empty() {
        let id = hex::encode(Sha256::digest(user_identifier.as_bytes()));
        scopes.push((format!("otp-sends/user-identifier/{lane}{id}"), s.sends_per_contact_per_hour));
    }
    // A sub-organization anyone can get by signing up spends a few of its own, then at most its
    // share of the parent's together with every other such sub-organization: the parent's auth
    // proxy (its own otp_init) keeps the rest whatever visitors do with the keys they were given.
    if sender.marked.is_some() {
        scopes.push((format!("otp-sends/marked-sub-organizations-of/{org}"), s.sub_organizations_share()));
    }
    // The organization's last: a send refused for its contact or identifier spends none of it.
    scopes.push((format!("otp-sends/organization/{org}"), s.sends_per_organization_per_hour));
    let now = now_ms();
    for (scope, quota) in scopes {
        match admission.count_within(&scope, what, now.saturating_add(HOUR_MS), now, quota)? {
            Remembered::Fresh | Remembered::Replayed => {}
            Remembered::OrganizationQuotaFull => {
                return Err(EnclaveError::Busy {
                    reason: RefusalReason::OtpRateLimited,
                    message: "too many one-time codes were sent to this contact or by this organization in the last hour: retry later".into(),
                })
            }
            Remembered::WindowFull => {
                return Err(EnclaveError::Busy {
                    reason: RefusalReason::ReplayWindowFull,
                    message: "replay window is full: retry shortly".into(),
                })
            }
            Remembered::Rejected => return Err(EnclaveError::Internal(crate::admission::NO_ALLOW_COUNTED.into())),
        }
    }
    Ok(())
}

/// `email_auth` and `init_user_email_recovery`: a P-256 key from the HSM for the organization's
/// user with the body's `email`, certified until `expirationSeconds` (default 900), whose private
/// half goes encrypted to the body's `targetPublicKey` and only by email (see [`email_bundle`]).
/// The send is counted as a code's is.
pub fn email_grant(
    hsm: &Hsm,
    admission: &Admission,
    otp: &OtpService,
    a: &Admitted,
) -> Result<SessionGrant, EnclaveError> {
    let p = &a.activity.parameters;
    if !otp.mailer.configured() {
        return Err(EnclaveError::invalid(
            "email_auth and recovery need the enclave's mail transport ([otp] smtp_url or mail_dir)",
        ));
    }
    let email: lettre::Address =
        text(p, "email").trim().parse().map_err(|_| EnclaveError::invalid("email: not an email address"))?;
    if text(p, "targetPublicKey").is_empty() {
        return Err(EnclaveError::invalid("targetPublicKey is required"));
    }
    // The email is built once without the bundle first: a body whose addresses or customization
    // cannot make one (or may not choose them) is refused before any credential exists.
    let sender = sender_of(admission, a)?;
    email_bundle(admission, otp, a, "")?;
    let loaded = admission
        .rules()
        .load(&a.activity.organization_id)?
        .ok_or_else(|| refuse(a, RefusalReason::OrganizationUnknown, "the organization has no authority state"))?;
    let wanted = email.to_string().to_ascii_lowercase();
    let user_id = user_with_contact(a, &loaded.state, "OTP_TYPE_EMAIL", &wanted)
        .ok_or_else(|| refuse(a, RefusalReason::IdentityInvalid, "no user of this organization has this email"))?;
    charge_send(admission, &otp.settings, a, &sender, &wanted, "")?;
    let (secret, public_key) = crate::sessions::new_session_key(hsm)?;
    let credential_type = if a.activity.activity_type == crate::sessions::EMAIL_AUTH {
        "CREDENTIAL_TYPE_EMAIL_AUTH_KEY_P256"
    } else {
        "CREDENTIAL_TYPE_RECOVER_USER_KEY_P256"
    };
    Ok(SessionGrant { user_id, public_key, credential_type, secret: Some(secret) })
}

/// The email that carries an `email_auth` or recovery credential bundle to the body's `email`
/// (the bundle in the text, and in `magicLinkTemplate`'s link when the body gives one).
pub fn email_bundle(
    admission: &Admission,
    otp: &OtpService,
    a: &Admitted,
    bundle: &str,
) -> Result<lettre::Message, EnclaveError> {
    let p = &sender_of(admission, a)?.parameters(a, "emailCustomization.appName")?;
    let custom = p.get("emailCustomization").cloned().unwrap_or(Value::Null);
    let mut init = p.clone();
    init["otpType"] = json!("OTP_TYPE_EMAIL");
    init["contact"] = json!(text(p, "email"));
    init["appName"] = json!(match text(&custom, "appName").trim() {
        "" => "Coffer",
        n => n,
    });
    init.as_object_mut().map(|o| o.remove("expirationSeconds"));
    let params = read_init(&init, &otp.settings)?;
    let recovery = a.activity.activity_type != crate::sessions::EMAIL_AUTH;
    let what = if recovery { "recovery" } else { "login" };
    let link = (!params.magic_link_template.is_empty()).then(|| params.magic_link_template.replacen("%s", bundle, 1));
    let mut plain = format!(
        "Your {} {what} credential (paste it into the app that asked for it):\n\n{bundle}\n\nIf you did not ask for it, ignore this email.\n",
        params.app_name
    );
    if let Some(l) = &link {
        plain.push_str(&format!("\nOr open: {l}\n"));
    }
    let to: lettre::Address =
        params.contact.parse().map_err(|_| EnclaveError::invalid("email: not an email address"))?;
    let mut builder = lettre::Message::builder()
        .message_id(None)
        .from(params.from.clone())
        .to(Mailbox::new(None, to))
        .subject(format!("Your {} {what} credential", params.app_name));
    if let Some(r) = &params.reply_to {
        builder = builder.reply_to(r.clone());
    }
    builder
        .singlepart(SinglePart::builder().header(ContentType::TEXT_PLAIN).body(plain))
        .map_err(|_| EnclaveError::invalid("the email could not be built from the body's addresses"))
}

/// A code of `length` characters from the HSM's generator: decimal digits, or Crockford base32
/// when `alphanumeric`; each character uniform (bytes past the last whole multiple are redrawn).
fn draw_code(hsm: &Hsm, length: usize, alphanumeric: bool) -> Result<Zeroizing<String>, EnclaveError> {
    let radix: u8 = if alphanumeric { 32 } else { 10 };
    let limit = 256 - (256 % radix as u16);
    let mut code = Zeroizing::new(String::with_capacity(length));
    while code.len() < length {
        for b in hsm.random(length * 2)?.iter() {
            if (*b as u16) < limit && code.len() < length {
                let i = (b % radix) as usize;
                code.push(if alphanumeric { CROCKFORD[i] as char } else { (b'0' + i as u8) as char });
            }
        }
    }
    Ok(code)
}

/// The salted hash of a code as the record keeps it: SHA-256 over a domain, the salt, the otp id
/// and the code as typed (uppercased: Crockford codes are read without case).
fn code_hash(salt: &str, otp_id: &str, code: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"coffer-otp-code-v1\0");
    h.update(salt.as_bytes());
    h.update(b"\0");
    h.update(otp_id.as_bytes());
    h.update(b"\0");
    let upper = Zeroizing::new(code.trim().to_ascii_uppercase());
    h.update(upper.as_bytes());
    hex::encode(h.finalize())
}

/// The email's two bodies, plain text and HTML: the code in both and nowhere else.
fn bodies(p: &InitParams, code: &str) -> (Zeroizing<String>, Zeroizing<String>) {
    let minutes = p.expires_secs.div_ceil(60);
    let plural = if minutes == 1 { "" } else { "s" };
    let link =
        (!p.magic_link_template.is_empty()).then(|| Zeroizing::new(p.magic_link_template.replacen("%s", code, 1)));
    let mut plain = Zeroizing::new(format!(
        "Your {} code is: {code}\n\nIt expires in {minutes} minute{plural}. If you did not ask for it, ignore this email.\n",
        p.app_name
    ));
    if let Some(l) = &link {
        plain.push_str(&format!("\nOr open: {}\n", l.as_str()));
    }
    let app = html_escape(&p.app_name);
    let logo = if p.logo_url.is_empty() {
        String::new()
    } else {
        format!("<p><img src=\"{}\" alt=\"{app}\" height=\"48\"></p>", html_escape(&p.logo_url))
    };
    let button = Zeroizing::new(
        link.as_ref()
            .map(|l| format!("<p><a href=\"{}\">Continue to {app}</a></p>", html_escape(l)))
            .unwrap_or_default(),
    );
    let html = Zeroizing::new(format!(
        "<!doctype html><html><body style=\"font-family:sans-serif\">{logo}<p>Your {app} code is:</p>\
         <p style=\"font-size:28px;letter-spacing:4px;font-family:monospace\"><strong>{code}</strong></p>{}\
         <p>It expires in {minutes} minute{plural}. If you did not ask for it, ignore this email.</p></body></html>",
        button.as_str()
    ));
    (plain, html)
}

/// The text message: the body's template with the code, or the default.
fn sms_text(p: &InitParams, code: &str) -> Zeroizing<String> {
    if p.sms_template.is_empty() {
        Zeroizing::new(format!("Your {} code is: {code}", p.app_name))
    } else {
        Zeroizing::new(p.sms_template.replacen("{{.OtpCode}}", code, 1))
    }
}

/// The email: a MIME message (multipart/alternative) from the sender the body may use.
fn message(p: &InitParams, code: &str) -> Result<lettre::Message, EnclaveError> {
    let (plain, html) = bodies(p, code);
    let to: lettre::Address = p.contact.parse().map_err(|_| EnclaveError::invalid("contact: not an email address"))?;
    let mut builder = lettre::Message::builder()
        .message_id(None)
        .from(p.from.clone())
        .to(Mailbox::new(None, to))
        .subject(format!("Your {} code", p.app_name));
    if let Some(r) = &p.reply_to {
        builder = builder.reply_to(r.clone());
    }
    builder
        .multipart(
            MultiPart::alternative()
                .singlepart(SinglePart::builder().header(ContentType::TEXT_PLAIN).body(plain.to_string()))
                .singlepart(SinglePart::builder().header(ContentType::TEXT_HTML).body(html.to_string())),
        )
        .map_err(|_| EnclaveError::invalid("the email could not be built from the body's addresses"))
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

/// Opens the record the gateway kept for the body's `otpId`: made for `purpose`, for this
/// organization and id, unexpired. The attempt is counted here, before the code is looked at, in
/// the shared store: past `max_attempts` the code is dead whatever is sent.
fn open_record(
    hsm: &Hsm,
    admission: &Admission,
    otp: &OtpService,
    a: &Admitted,
    sealed: &[u8],
    purpose: Purpose,
) -> Result<OtpRecord, EnclaveError> {
    let (org, otp_id) = (a.activity.organization_id.as_str(), text(&a.activity.parameters, "otpId").trim());
    if otp_id.is_empty() {
        return Err(EnclaveError::invalid("otpId is required"));
    }
    // A record that does not open under (organization, otp id) is another code's, or forged.
    let opened = hsm
        .unseal(&BlobBinding::plain(BlobKind::OtpRecord, org, otp_id), sealed)
        .map_err(|_| refuse(a, RefusalReason::OtpInvalid, OTP_INVALID))?;
    let record: OtpRecord = serde_json::from_slice(opened.as_slice())
        .map_err(|_| EnclaveError::Internal("an otp record that opened does not parse".into()))?;
    if record.otp_id != otp_id || record.organization_id != org || record.purpose != purpose {
        return Err(refuse(a, RefusalReason::OtpInvalid, OTP_INVALID));
    }
    let now = now_ms();
    if now >= record.expires_ms {
        return Err(refuse(a, RefusalReason::OtpInvalid, OTP_INVALID));
    }
    let scope = format!("otp-attempts/{otp_id}");
    match admission.count_within(
        &scope,
        &a.activity.fingerprint,
        kept_until(&record),
        now,
        otp.settings.max_attempts,
    )? {
        Remembered::Fresh | Remembered::Replayed => Ok(record),
        Remembered::OrganizationQuotaFull | Remembered::WindowFull => {
            Err(refuse(a, RefusalReason::OtpInvalid, OTP_INVALID))
        }
        Remembered::Rejected => Err(EnclaveError::Internal(crate::admission::NO_ALLOW_COUNTED.into())),
    }
}

/// How long the markers of a code (attempts, verified) are kept: past its expiry, with a margin.
fn kept_until(record: &OtpRecord) -> i64 {
    record.expires_ms.saturating_add(verification_token::MARKER_MARGIN_MS)
}

/// Accepts `code` for `record`, once: the hashes compared without an early exit, then the code
/// remembered as verified in the shared store (a second verification is refused).
fn accept_code(admission: &Admission, a: &Admitted, record: &OtpRecord, code: &str) -> Result<(), EnclaveError> {
    let given = code_hash(&record.salt, &record.otp_id, code);
    let differ = given.len() != record.code_hash.len()
        || given.bytes().zip(record.code_hash.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) != 0;
    if differ {
        return Err(refuse(a, RefusalReason::OtpInvalid, OTP_INVALID));
    }
    if admission.count_within("otp-verified", &record.otp_id, kept_until(record), now_ms(), u64::MAX)?
        != Remembered::Fresh
    {
        return Err(refuse(a, RefusalReason::OtpInvalid, OTP_INVALID));
    }
    Ok(())
}

/// What a client encrypts to a code's target (`encryptedOtpBundle`, `encryptOtpCodeToBundle`):
/// the code as typed, and the key it binds the code to. Zeroized when dropped.
#[derive(Deserialize)]
pub(super) struct EncryptedCode {
    pub otp_code: String,
    #[serde(default)]
    pub public_key: String,
}

impl Drop for EncryptedCode {
    fn drop(&mut self) {
        self.otp_code.zeroize();
    }
}

/// `verify_otp`: the record opened, the attempt counted, the code compared, the token signed.
pub(super) fn verify_otp(
    hsm: &Hsm,
    admission: &Admission,
    otp: &OtpService,
    req: pb::VerifyOtpRequest,
) -> Result<pb::VerifyOtpResponse, EnclaveError> {
    let a = admission.authorize("verify_otp", req.auth.as_ref(), &[VERIFY_OTP])?;
    // Past its allow, how it ends is recorded: the log links it so.
    let outcome_log = a.outcome_recorder();
    outcome_log.close(verify_authorized(hsm, admission, otp, &req, a))
}

/// The authorized part of [`verify_otp`].
fn verify_authorized(
    hsm: &Hsm,
    admission: &Admission,
    otp: &OtpService,
    req: &pb::VerifyOtpRequest,
    a: Admitted,
) -> Result<pb::VerifyOtpResponse, EnclaveError> {
    let p = &a.activity.parameters;
    let org = a.activity.organization_id.as_str();
    let token_seconds = seconds(p, DEFAULT_TOKEN_SECONDS, MAX_TOKEN_SECONDS)?;
    let record = open_record(hsm, admission, otp, &a, &req.sealed_otp, Purpose::Verify)?;
    let otp_id = record.otp_id.as_str();
    let now = now_ms();
    let mut secret = Zeroizing::new([0u8; 32]);
    let decoded = Zeroizing::new(hex::decode(&record.target_secret).unwrap_or_default());
    if decoded.len() != 32 {
        return Err(EnclaveError::Internal("an otp record's target key is malformed".into()));
    }
    secret.copy_from_slice(&decoded);
    let plain = coffer_crypto::bundle::open_encrypted_bundle(&secret, text(p, "encryptedOtpBundle"))
        .map_err(|_| EnclaveError::invalid("encryptedOtpBundle: not the code encrypted to this otp's target"))?;
    let sent: EncryptedCode = serde_json::from_slice(&plain)
        .map_err(|_| EnclaveError::invalid("encryptedOtpBundle: not {\"otp_code\", \"public_key\"}"))?;
    // The key the token will name, checked before the code so that no answer depends on the
    // code being right. Required: a token without a key would be a bearer token the gateway
    // carries, and could redeem itself.
    let public_key = coffer_auth::grants::api_public_key("API_KEY_CURVE_P256", sent.public_key.trim())
        .map(|(k, _)| k)
        .map_err(|_| {
            EnclaveError::invalid(
                "encryptedOtpBundle: public_key is required, a compressed P-256 key (66 hex characters)",
            )
        })?;
    accept_code(admission, &a, &record, &sent.otp_code)?;
    let token_id = derived_id(&a.activity.fingerprint, "otp-verification-token", 0);
    let expires_ms = now.saturating_add(token_seconds as i64 * 1000);
    let claims = json!({
        "id": token_id,
        "verification_type": record.otp_type,
        "contact": record.contact,
        "organization_id": org,
        "public_key": public_key,
        "exp": expires_ms.to_string(),
    });
    let verification_token = verification_token::sign(hsm, &claims)?;
    tracing::info!(
        target: "coffer_audit",
        decision = "allow",
        operation = "verify_otp",
        organization = %org,
        otp_id = %otp_id,
        token = %token_id,
        fingerprint = %a.activity.fingerprint,
        "enclave decision"
    );
    let result = json!({ "verificationTokenSha256": hex::encode(Sha256::digest(verification_token.as_bytes())) });
    let app_proofs = crate::proofs::of_call(hsm, &a, result)?;
    Ok(pb::VerifyOtpResponse { verification_token, evaluation: a.evaluation(), app_proofs })
}

/// `otp_login`: the session for the organization's user whose email the token verified. The
/// token is spent (once, in the shared store); when it names a key, the body's `clientSignature`
/// must be that key's signature of this login (`{"login":{"publicKey"},"tokenId","type"}`).
pub fn login_grant(hsm: &Hsm, admission: &Admission, a: &Admitted) -> Result<SessionGrant, EnclaveError> {
    let p = &a.activity.parameters;
    let now = now_ms();
    let token = match verification_token::read(hsm, text(p, "verificationToken"), now) {
        Ok(t) => t,
        Err(e) => {
            refuse(a, RefusalReason::OtpInvalid, OTP_INVALID);
            return Err(e);
        }
    };
    let session_key =
        coffer_auth::grants::api_public_key("API_KEY_CURVE_P256", text(p, "publicKey")).map(|(k, _)| k).map_err(
            |_| EnclaveError::invalid("invalid publicKey: a compressed P-256 public key (66 hex characters)"),
        )?;
    if !token.public_key.is_empty() {
        let usage =
            json!({ "login": { "publicKey": text(p, "publicKey") }, "tokenId": token.id, "type": "USAGE_TYPE_LOGIN" });
        verification_token::check_client_signature(p, &token, &usage)
            .map_err(|m| refuse(a, RefusalReason::BindingMismatch, m))?;
    }
    let loaded = admission
        .rules()
        .load(&a.activity.organization_id)?
        .ok_or_else(|| refuse(a, RefusalReason::OrganizationUnknown, "the organization has no authority state"))?;
    // A token verified in an organization serves it and its sub-organizations only.
    let body_org = &loaded.state.organization;
    if token.organization_id != body_org.id && body_org.parent_id.as_deref() != Some(token.organization_id.as_str()) {
        return Err(refuse(a, RefusalReason::OtpInvalid, OTP_INVALID));
    }
    let user_id = user_with_contact(a, &loaded.state, &token.verification_type, &token.contact).ok_or_else(|| {
        refuse(a, RefusalReason::IdentityInvalid, "no user of this organization has the verified email or phone number")
    })?;
    if !verification_token::spend(admission, &token, verification_token::Usage::Login, now)? {
        return Err(refuse(a, RefusalReason::OtpInvalid, OTP_INVALID));
    }
    Ok(SessionGrant {
        user_id,
        public_key: session_key,
        credential_type: "CREDENTIAL_TYPE_OTP_AUTH_KEY_P256",
        secret: None,
    })
}

/// The user of the activity's organization (`state`) whose email (`OTP_TYPE_EMAIL`, without
/// case) or phone number (`OTP_TYPE_SMS`) is `contact`. When the parent organization submits it
/// (the auth proxy, a backend), only a user whose contacts are the sign-up's, unchanged: an
/// address a sub-organization's user set on itself is no proof that the address is theirs.
fn user_with_contact(
    a: &Admitted,
    state: &coffer_org_rules::model::OrgState,
    verification_type: &str,
    contact: &str,
) -> Option<String> {
    user_by_contact(state, verification_type, contact, a.via_parent)
}

/// The user of `state` with `contact`, only among those whose contacts are verified when
/// `verified_only`.
fn user_by_contact(
    state: &coffer_org_rules::model::OrgState,
    verification_type: &str,
    contact: &str,
    verified_only: bool,
) -> Option<String> {
    let has_contact = |u: &&coffer_org_rules::model::User| match verification_type {
        "OTP_TYPE_EMAIL" => !u.email.is_empty() && u.email.eq_ignore_ascii_case(contact),
        "OTP_TYPE_SMS" => !u.phone_number.is_empty() && u.phone_number == contact,
        _ => false,
    };
    let vouched = |u: &&coffer_org_rules::model::User| !verified_only || u.contacts_verified;
    state.users.values().filter(has_contact).find(vouched).map(|u| u.id.clone())
}

/// `otp_auth`: the code of an `init_otp_auth`, typed in the stamped body, checked as
/// `verify_otp` checks one (record, purpose, expiry, attempts, once), and traded for a P-256 key
/// from the HSM certified (`CREDENTIAL_TYPE_OTP_AUTH_KEY_P256`, expiring) for the organization's
/// user with the code's contact; its private half leaves only encrypted to `targetPublicKey`.
/// The gateway sees the code in the body, but cannot use it: only this stamped body redeems it.
pub fn otp_auth_grant(
    hsm: &Hsm,
    admission: &Admission,
    otp: &OtpService,
    a: &Admitted,
    sealed: &[u8],
) -> Result<SessionGrant, EnclaveError> {
    let p = &a.activity.parameters;
    if text(p, "otpCode").trim().is_empty() {
        return Err(EnclaveError::invalid("otpCode is required"));
    }
    // The target is checked before the code is spent on it.
    let target = text(p, "targetPublicKey").trim();
    let target_ok = hex::decode(target).ok().is_some_and(|b| p256::PublicKey::from_sec1_bytes(&b).is_ok());
    if !target_ok {
        return Err(EnclaveError::invalid("targetPublicKey: a P-256 public key (hex, compressed or uncompressed)"));
    }
    let loaded = admission
        .rules()
        .load(&a.activity.organization_id)?
        .ok_or_else(|| refuse(a, RefusalReason::OrganizationUnknown, "the organization has no authority state"))?;
    let record = open_record(hsm, admission, otp, a, sealed, Purpose::Auth)?;
    let code = Zeroizing::new(text(p, "otpCode").to_string());
    accept_code(admission, a, &record, &code)?;
    let user_id = user_with_contact(a, &loaded.state, &record.otp_type, &record.contact).ok_or_else(|| {
        refuse(a, RefusalReason::IdentityInvalid, "no user of this organization has the verified email or phone number")
    })?;
    let (secret, public_key) = crate::sessions::new_session_key(hsm)?;
    Ok(SessionGrant { user_id, public_key, credential_type: "CREDENTIAL_TYPE_OTP_AUTH_KEY_P256", secret: Some(secret) })
}

/// Who a verification token's attested stamp (the `stamp_login` of `@turnkey/core` 2.7's
/// `loginWithOtp`) logs in as, decided before the stamp is authorized: the token verified with
/// the notarizer key and unexpired, naming the stamp's key; the body's organization a
/// sub-organization of the one that verified the token (or that sub-organization itself, for its
/// own codes), never a top-level organization, whose members a code alone must not reach; the
/// user there whose verified contact the token names. A login stamped for the token's own
/// organization goes to the sub-organization the gateway routes it to (`routed_organization_id`),
/// checked the same way. The token is spent when the session opens.
pub(super) fn token_login_identity(
    hsm: &Hsm,
    admission: &Admission,
    req: &pb::CreateSessionRequest,
    stamp: &coffer_auth::attested::AttestedStamp,
) -> Result<crate::admission::AttestedIdentity, EnclaveError> {
    let token = verification_token::read(hsm, &stamp.token, now_ms())?;
    coffer_auth::attested::check_token_binding(stamp, &token.public_key)
        .map_err(|e| EnclaveError::refused(RefusalReason::StampInvalid, e.message))?;
    let body = req.auth.as_ref().and_then(|a| a.request.as_ref()).map(|r| r.body.as_slice()).unwrap_or_default();
    let org = serde_json::from_slice::<Value>(body)
        .ok()
        .map(|b| text(&b, "organizationId").to_string())
        .filter(|o| !o.is_empty())
        .ok_or_else(|| EnclaveError::refused(RefusalReason::StampInvalid, "the stamped body names no organization"))?;
    // Stamped for the token's own (top-level) organization, the login goes to the sub-organization
    // the gateway names, if it is one of that organization's.
    let routed = !req.routed_organization_id.is_empty();
    let body_org = org;
    let org = if routed { req.routed_organization_id.clone() } else { body_org.clone() };
    let loaded = admission.rules().load(&org)?.ok_or_else(|| {
        EnclaveError::refused(RefusalReason::OrganizationUnknown, "the organization has no authority state")
    })?;
    let parent = loaded.state.organization.parent_id.as_deref();
    let serves = match routed {
        true => parent == Some(body_org.as_str()) && token.organization_id == body_org,
        false => parent.is_some() && (token.organization_id == org || parent == Some(token.organization_id.as_str())),
    };
    if !serves {
        return Err(EnclaveError::refused(
            RefusalReason::OtpInvalid,
            "a verification token logs in only to a sub-organization of the organization that verified it",
        ));
    }
    let user_id = user_by_contact(&loaded.state, &token.verification_type, &token.contact, true).ok_or_else(|| {
        EnclaveError::refused(
            RefusalReason::IdentityInvalid,
            "no user of this organization has the verified email or phone number of the token",
        )
    })?;
    let credential = pb::CredentialCertificate {
        organization_id: org,
        user_id,
        credential_type: coffer_auth::grants::VERIFICATION_TOKEN.into(),
        public_key: token.public_key.clone(),
        expires_at_ms: token.expires_ms.max(0) as u64,
        issuing_fingerprint: String::new(),
        mac: Vec::new(),
        session_scope: String::new(),
    };
    Ok(crate::admission::AttestedIdentity::VerificationToken { token, credential })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiration_seconds_are_bounded_and_default() {
        assert_eq!(seconds(&json!({}), 300, 600).unwrap(), 300);
        assert_eq!(seconds(&json!({ "expirationSeconds": "120" }), 300, 600).unwrap(), 120);
        assert_eq!(seconds(&json!({ "expirationSeconds": 600 }), 300, 600).unwrap(), 600);
        for bad in [json!("0"), json!("601"), json!("-1"), json!("ten"), json!(true)] {
            assert!(seconds(&json!({ "expirationSeconds": bad }), 300, 600).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_marked_sub_organization_chooses_nothing() {
        let base = json!({ "otpType": "OTP_TYPE_EMAIL", "contact": "a@b.test" });
        assert_eq!(customised(&base, "Parent"), None);
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            customised(&b, "Parent")
        };
        assert_eq!(with("appName", json!("")), None);
        assert_eq!(with("appName", json!("Parent")), None, "the brand itself");
        assert_eq!(with("appName", json!("Evil Bank Security")), Some("appName"));
        assert_eq!(with("replyToEmailAddress", json!("m@evil.test")), Some("replyToEmailAddress"));
        assert_eq!(with("sendFromEmailAddress", json!("x@localhost")), Some("sendFromEmailAddress"));
        assert_eq!(with("sendFromEmailSenderName", json!("Bank")), Some("sendFromEmailSenderName"));
        assert_eq!(with("smsCustomization", json!({ "template": "{{.OtpCode}}" })), Some("smsCustomization"));
        assert_eq!(with("smsCustomization", json!({ "template": "" })), None);
        assert_eq!(
            with("emailCustomization", json!({ "logoUrl": "https://e.test/l.png" })),
            Some("emailCustomization")
        );
        assert_eq!(with("emailCustomization", json!({ "templateVariables": "{}" })), Some("emailCustomization"));
        assert_eq!(with("emailCustomization", json!({ "appName": "Parent" })), None);
        assert_eq!(with("emailCustomization", json!({ "appName": "Evil" })), Some("emailCustomization"));
        assert_eq!(with("emailCustomization", json!({})), None);
    }

    #[test]
    fn the_hash_reads_codes_without_case_and_binds_salt_and_id() {
        let h = code_hash("aa", "id", "ABC123");
        assert_eq!(h, code_hash("aa", "id", "abc123 "));
        assert_ne!(h, code_hash("ab", "id", "ABC123"));
        assert_ne!(h, code_hash("aa", "id2", "ABC123"));
        assert_ne!(h, code_hash("aa", "id", "ABC124"));
    }

    #[test]
    fn init_parameters_are_checked() {
        let s = OtpSettings { sender_domains: vec!["example.com".into()], ..OtpSettings::default() };
        let ok = json!({ "otpType": "OTP_TYPE_EMAIL", "contact": "a@b.test", "appName": "App" });
        let p = read_init(&ok, &s).unwrap();
        assert_eq!((p.length, p.alphanumeric, p.expires_secs), (9, true, 300));
        let with = |k: &str, v: Value| {
            let mut b = ok.clone();
            b[k] = v;
            read_init(&b, &s).err().map(|e| e.to_string())
        };
        assert!(with("otpLength", json!(5)).unwrap().contains("otpLength"));
        assert!(with("otpLength", json!(10)).unwrap().contains("otpLength"));
        assert!(with("contact", json!("not-an-email")).unwrap().contains("contact"));
        assert!(with("otpType", json!("OTP_TYPE_SMS")).unwrap().contains("E.164"));
        assert!(with("otpType", json!("OTP_TYPE_WHATSAPP")).unwrap().contains("not supported"));
        let mut sms = ok.clone();
        sms["otpType"] = json!("OTP_TYPE_SMS");
        sms["contact"] = json!("+13214567890");
        sms["smsCustomization"] = json!({ "template": "{{.OtpCode}} is your code" });
        let p = read_init(&sms, &s).unwrap();
        assert_eq!(sms_text(&p, "123456").as_str(), "123456 is your code");
        sms["smsCustomization"] = json!({ "template": "no placeholder" });
        assert!(read_init(&sms, &s).err().unwrap().to_string().contains("smsCustomization"));
        assert!(with("sendFromEmailAddress", json!("x@evil.test")).unwrap().contains("sender_domains"));
        assert!(with("sendFromEmailAddress", json!("x@Example.com")).is_none());
        assert!(with("expirationSeconds", json!("601")).unwrap().contains("expirationSeconds"));
        assert!(with("appName", json!("")).unwrap().contains("appName"));
        let magic = |t: &str| with("emailCustomization", json!({ "magicLinkTemplate": t }));
        assert!(magic("https://app.test/login?code=%s").is_none());
        assert!(magic("http://app.test/%s").is_some());
        assert!(magic("https://app.test/").is_some());
    }

    #[test]
    fn the_message_holds_the_code_and_escapes_the_app_name() {
        let s = OtpSettings::default();
        let b = json!({ "otpType": "OTP_TYPE_EMAIL", "contact": "a@b.test", "appName": "<App>",
            "emailCustomization": { "magicLinkTemplate": "https://app.test/login?code=%s" } });
        let p = read_init(&b, &s).unwrap();
        let (plain, html) = bodies(&p, "7K3Q9ZX2M");
        assert!(plain.contains("Your <App> code is: 7K3Q9ZX2M"), "{}", plain.as_str());
        assert!(plain.contains("https://app.test/login?code=7K3Q9ZX2M"), "{}", plain.as_str());
        assert!(
            html.contains("<strong>7K3Q9ZX2M</strong>") && html.contains("Your &lt;App&gt; code"),
            "{}",
            html.as_str()
        );
        assert!(!html.contains("<App>"), "{}", html.as_str());
        let text = String::from_utf8(message(&p, "7K3Q9ZX2M").unwrap().formatted()).unwrap();
        assert!(text.contains("multipart/alternative") && text.contains("text/html"), "{text}");
        assert!(text.contains("To: a@b.test") && text.contains("From: Coffer <no-reply@localhost>"), "{text}");
        assert!(text.contains("code is: 7K3Q9ZX2M"), "{text}");
    }
}
