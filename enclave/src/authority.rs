//! Enclave authority: key material is used only for what a certified credential of the
//! organization stamped, just now, for exactly that operation — verified here, never taken
//! from the gateway's word.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use coffer_auth::envelope::StampedActivity;
use coffer_auth::oidc::Claims;
use coffer_auth::{attested, stamp, webauthn};
use coffer_proto::v1 as pb;
use prost::Message;
use serde_json::Value;
use sha2::Digest;

use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::Hsm;

/// The activity type of a vote that lets a waiting activity run.
pub const APPROVE_ACTIVITY: &str = "ACTIVITY_TYPE_APPROVE_ACTIVITY";
/// How long a waiting activity's original stamp stays usable (the vote lifetime).
pub const VOTE_LIFETIME_MS: i64 = 24 * 60 * 60 * 1000;
/// `issuing_fingerprint` prefix of certificates made by operator bootstrap.
pub const BOOTSTRAP: &str = "bootstrap:";

const CERT_DOMAIN: &[u8] = b"coffer-credential-certificate-v1";

/// Length-prefixed fields: what an HSM MAC covers (the first field is the domain).
fn mac_input(fields: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    for field in fields {
        out.extend_from_slice(&(field.len() as u32).to_be_bytes());
        out.extend_from_slice(field);
    }
    out
}

/// The bytes a certificate's MAC covers: every field but the MAC, length-prefixed.
pub fn certificate_mac_input(c: &pb::CredentialCertificate) -> Vec<u8> {
    mac_input(&[
        CERT_DOMAIN,
        c.organization_id.as_bytes(),
        c.user_id.as_bytes(),
        c.credential_type.as_bytes(),
        c.public_key.as_bytes(),
        &c.expires_at_ms.to_be_bytes(),
        c.issuing_fingerprint.as_bytes(),
    ])
}

const OAUTH2_DOMAIN: &[u8] = b"coffer-oauth2-credential-v1";

/// The bytes an OAuth 2.0 credential's MAC covers: every field but the MAC, length-prefixed.
pub fn oauth2_mac_input(c: &pb::Oauth2Credential) -> Vec<u8> {
    mac_input(&[
        OAUTH2_DOMAIN,
        c.organization_id.as_bytes(),
        c.credential_id.as_bytes(),
        c.provider.as_bytes(),
        c.client_id.as_bytes(),
        c.encrypted_client_secret.as_bytes(),
    ])
}

/// What the enclave established about a request before touching key material.
#[derive(Debug)]
pub struct Authorized {
    /// The enclave operation it was authorized for (audit lines name it).
    pub operation: &'static str,
    /// The stamped body of the activity: the only source of the operation's parameters.
    pub activity: StampedActivity,
    /// The certified credential that stamped it.
    pub credential: pb::CredentialCertificate,
    /// The credential is the parent organization's, acting for its sub-organization (login
    /// activities only, with the sub-organization's parent certificate).
    pub via_parent: bool,
}

impl Authorized {
    /// What this authorization's allow line named, for its outcome line (`crate::audit`).
    pub fn decision(&self) -> crate::audit::Decision {
        crate::audit::Decision {
            operation: self.operation,
            organization: self.activity.organization_id.clone(),
            credential: self.credential.public_key.clone(),
            fingerprint: self.activity.fingerprint.clone(),
        }
    }
}

/// Fingerprints seen within the freshness window, per operation. Bounded: when full of live
/// entries it refuses new requests rather than forgetting one (forgetting would allow a replay).
struct ReplaySet {
    /// SHA-256(operation ‖ fingerprint) → the time (ms) after which the body is stale anyway.
    seen: HashMap<[u8; 32], i64>,
    capacity: usize,
    next_prune: usize,
}

impl ReplaySet {
    fn new(capacity: usize) -> Self {
        Self { seen: HashMap::new(), capacity: capacity.max(1), next_prune: 1024 }
    }

    /// Records `key` until `expires_ms`; `Ok(false)` if it was already there.
    fn insert(&mut self, key: [u8; 32], expires_ms: i64, now_ms: i64) -> Result<bool, EnclaveError> {
        if let Some(exp) = self.seen.get(&key) {
            if *exp >= now_ms {
                return Ok(false);
            }
        }
        if self.seen.len() >= self.next_prune.min(self.capacity) {
            self.seen.retain(|_, exp| *exp >= now_ms);
            self.next_prune = (self.seen.len() * 2).max(1024);
            if self.seen.len() >= self.capacity {
                return Err(EnclaveError::Busy { reason: RefusalReason::ReplayWindowFull, message: BUSY.into() });
            }
        }
        self.seen.insert(key, expires_ms);
        Ok(true)
    }
}

/// Verifies stamps, certificates, freshness and replay for every key-using call.
pub struct Authority {
    hsm: Arc<Hsm>,
    freshness_ms: i64,
    replay: Mutex<ReplaySet>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A refusal, with what is known of the request for the audit line.
struct Refusal {
    reason: RefusalReason,
    message: String,
    organization: String,
    credential: String,
    fingerprint: String,
}

impl Refusal {
    /// Writes the refusal's audit line.
    fn audit(&self, operation: &str) {
        tracing::warn!(
            target: "coffer_audit",
            decision = "refuse",
            operation,
            reason = %self.message,
            reason_code = self.reason.as_str_name(),
            organization = %self.organization,
            credential = %self.credential,
            fingerprint = %self.fingerprint,
            "enclave decision"
        );
    }

    fn new(reason: RefusalReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            organization: String::new(),
            credential: String::new(),
            fingerprint: String::new(),
        }
    }

    /// The error the caller sees: busy when the replay window is full, else a refusal.
    fn into_error(self) -> EnclaveError {
        match self.reason {
            RefusalReason::ReplayWindowFull => EnclaveError::Busy { reason: self.reason, message: self.message },
            reason => EnclaveError::Refused { reason, message: self.message },
        }
    }

    fn about(mut self, activity: &StampedActivity, credential: &pb::CredentialCertificate) -> Self {
        self.organization = activity.organization_id.clone();
        self.credential = credential.public_key.clone();
        self.fingerprint = activity.fingerprint.clone();
        self
    }
}

impl Authority {
    pub fn new(hsm: Arc<Hsm>, freshness_ms: i64, replay_capacity: usize) -> Self {
        Self { hsm, freshness_ms, replay: Mutex::new(ReplaySet::new(replay_capacity)) }
    }

    /// Issues a certificate (the MAC computed in the HSM) and returns it encoded.
    pub fn certify(&self, mut cert: pb::CredentialCertificate) -> Result<Vec<u8>, EnclaveError> {
        cert.mac = self.hsm.certificate_mac(&certificate_mac_input(&cert))?;
        Ok(cert.encode_to_vec())
    }

    /// Certifies an OAuth 2.0 credential (the MAC computed in the HSM).
    pub fn certify_oauth2(&self, mut c: pb::Oauth2Credential) -> Result<pb::Oauth2Credential, EnclaveError> {
        c.mac = self.hsm.certificate_mac(&oauth2_mac_input(&c))?;
        Ok(c)
    }

    /// Checks that `c` is a credential this enclave certified, of the stamped body's organization
    /// and the one the body names.
    pub fn check_oauth2(&self, a: &Authorized, c: &pb::Oauth2Credential, named_id: &str) -> Result<(), EnclaveError> {
        if !self.hsm.certificate_mac_valid(&oauth2_mac_input(c), &c.mac)? {
            return Err(refuse(
                a,
                RefusalReason::CertificateInvalid,
                "the OAuth 2.0 credential's certificate does not verify",
            ));
        }
        if c.organization_id != a.activity.organization_id {
            return Err(refuse(
                a,
                RefusalReason::BindingMismatch,
                "the OAuth 2.0 credential belongs to another organization than the stamped body",
            ));
        }
        if c.credential_id != named_id {
            return Err(refuse(
                a,
                RefusalReason::BindingMismatch,
                "the OAuth 2.0 credential is not the one the stamped body names",
            ));
        }
        Ok(())
    }

    /// Checks one webhook delivery attempt before the webhook key signs it: the timestamp is the
    /// enclave's now (within the freshness window, so no delivery can be signed ahead of time),
    /// the event id is short and plain, and the body is an activity. Returns the message to sign
    /// (`v1.ed25519.<key_id>.<timestamp>.<event_id>.` + body) and writes one audit line.
    pub fn webhook_message(
        &self,
        key_id: &str,
        timestamp_ms: u64,
        event_id: &str,
        body: &[u8],
    ) -> Result<Vec<u8>, EnclaveError> {
        const OPERATION: &str = "sign_webhook_delivery";
        /// The two fields of an activity the enclave checks (the rest is parsed, not kept).
        #[derive(serde::Deserialize)]
        struct ActivityIds {
            id: String,
            #[serde(rename = "organizationId")]
            organization_id: String,
        }
        // An object only: serde would also read a struct from an array.
        let is_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
        let ids = is_object.then(|| serde_json::from_slice::<ActivityIds>(body).ok()).flatten();
        let (organization, activity_id) = match ids {
            Some(a) => (Some(a.organization_id), Some(a.id)),
            None => (None, None),
        };
        let refusal = if (timestamp_ms as i64 - now_ms()).abs() > self.freshness_ms {
            Some((RefusalReason::Stale, "delivery timestamp is not the enclave's now"))
        } else if event_id.is_empty()
            || event_id.len() > 128
            || !event_id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_:.".contains(&b))
        {
            Some((RefusalReason::DeliveryInvalid, "event id must be 1-128 characters of [A-Za-z0-9-_:.]"))
        } else if body.len() > 4 * 1024 * 1024 || organization.is_none() || activity_id.is_none() {
            Some((
                RefusalReason::DeliveryInvalid,
                "delivery body is not an activity (an object with id and organizationId, at most 4 MiB)",
            ))
        } else {
            None
        };
        let organization = organization.unwrap_or_default();
        if let Some((reason, message)) = refusal {
            let refusal = Refusal { organization, ..Refusal::new(reason, message) };
            refusal.audit(OPERATION);
            return Err(refusal.into_error());
        }
        tracing::info!(
            target: "coffer_audit",
            decision = "allow",
            operation = OPERATION,
            organization = %organization,
            activity = %activity_id.unwrap_or_default(),
            event = %event_id,
            "enclave decision"
        );
        crate::audit::record(crate::audit::Decision {
            operation: OPERATION,
            organization,
            credential: String::new(),
            fingerprint: event_id.to_string(),
        });
        let mut message = format!("v1.ed25519.{key_id}.{timestamp_ms}.{event_id}.").into_bytes();
        message.extend_from_slice(body);
        Ok(message)
    }

    /// Expiry of a new credential valid for `seconds` from now (0 = none).
    pub fn expiry(&self, seconds: Option<u64>) -> u64 {
        seconds.map_or(0, |s| (now_ms().max(0) as u64).saturating_add(s.saturating_mul(1000)))
    }

    /// Checks `auth` for `operation`: the body must be one of `types`, stamped by a live certified
    /// credential of its organization, fresh and not seen before (or, after consensus, approved
    /// just now by such a credential naming its fingerprint). Writes one audit line either way.
    pub fn authorize(
        &self,
        operation: &'static str,
        auth: Option<&pb::Authorization>,
        types: &[&str],
    ) -> Result<Authorized, EnclaveError> {
        self.authorize_for(operation, auth, types, None, None)
    }

    /// [`Authority::authorize`] for a login activity, which a credential of the sub-organization's
    /// parent may also stamp when `parent_certificate` (a `COFFER_PARENT_ORGANIZATION` certificate
    /// of the body's organization) names the credential's organization as its parent, and which
    /// an attested session key may stamp (`X-Stamp-Attested`, `stamp_login` only) when
    /// `attested_claims` are its token's claims, verified by the caller.
    pub fn authorize_for(
        &self,
        operation: &'static str,
        auth: Option<&pb::Authorization>,
        types: &[&str],
        parent_certificate: Option<&[u8]>,
        attested_claims: Option<&Claims>,
    ) -> Result<Authorized, EnclaveError> {
        match self.check(operation, auth, types, parent_certificate, attested_claims) {
            Ok(a) => {
                tracing::info!(
                    target: "coffer_audit",
                    decision = "allow",
                    operation,
                    organization = %a.activity.organization_id,
                    credential = %a.credential.public_key,
                    user = %a.credential.user_id,
                    fingerprint = %a.activity.fingerprint,
                    approved = auth.is_some_and(|a| a.approval.is_some()),
                    "enclave decision"
                );
                crate::audit::record(a.decision());
                Ok(a)
            }
            Err(r) => {
                r.audit(operation);
                Err(r.into_error())
            }
        }
    }

    fn check(
        &self,
        operation: &'static str,
        auth: Option<&pb::Authorization>,
        types: &[&str],
        parent_certificate: Option<&[u8]>,
        attested_claims: Option<&Claims>,
    ) -> Result<Authorized, Refusal> {
        let now = now_ms();
        let request = auth
            .and_then(|a| a.request.as_ref())
            .ok_or_else(|| Refusal::new(RefusalReason::NoAuthorization, "no stamped request"))?;
        let (activity, credential) = self.verify_stamped(request, now, attested_claims)?;
        let via_parent = activity.organization_id != credential.organization_id;
        if via_parent {
            let parent = parent_certificate.and_then(|c| pb::CredentialCertificate::decode(c).ok()).filter(|p| {
                p.credential_type == coffer_auth::grants::PARENT_ORGANIZATION
                    && p.organization_id == activity.organization_id
                    && p.public_key == credential.organization_id
                    && self.hsm.certificate_mac_valid(&certificate_mac_input(p), &p.mac).unwrap_or(false)
            });
            if parent.is_none() {
                return Err(Refusal::new(
                    RefusalReason::OrganizationMismatch,
                    "the credential belongs to another organization than the stamped body",
                )
                .about(&activity, &credential));
            }
        }
        if !types.contains(&activity.activity_type.as_str()) {
            return Err(Refusal::new(
                RefusalReason::OperationMismatch,
                format!("the stamped body is {}, which does not ask for this operation", activity.activity_type),
            )
            .about(&activity, &credential));
        }
        let replay_key = match auth.and_then(|a| a.approval.as_ref()) {
            None => {
                self.fresh(&activity, now).map_err(|r| r.about(&activity, &credential))?;
                (activity.fingerprint.clone(), activity.timestamp_ms)
            }
            Some(approval) => {
                if now - activity.timestamp_ms > VOTE_LIFETIME_MS || activity.timestamp_ms - now > self.freshness_ms {
                    return Err(Refusal::new(
                        RefusalReason::Stale,
                        "the waiting activity's stamp is older than the vote lifetime",
                    )
                    .about(&activity, &credential));
                }
                let (vote, voter) = self.verify_stamped(approval, now, None)?;
                let named = vote.parameters.get("fingerprint").and_then(Value::as_str);
                if vote.organization_id != voter.organization_id {
                    return Err(Refusal::new(
                        RefusalReason::OrganizationMismatch,
                        "the credential belongs to another organization than the stamped body",
                    )
                    .about(&vote, &voter));
                }
                if vote.activity_type != APPROVE_ACTIVITY
                    || vote.organization_id != activity.organization_id
                    || named != Some(activity.fingerprint.as_str())
                {
                    return Err(Refusal::new(
                        RefusalReason::NotApproved,
                        "the approval does not approve this activity",
                    )
                    .about(&vote, &voter));
                }
                self.fresh(&vote, now).map_err(|r| r.about(&vote, &voter))?;
                (vote.fingerprint.clone(), vote.timestamp_ms)
            }
        };
        let first = self
            .first_use_at(operation, &replay_key.0, replay_key.1, now)
            .map_err(|_| Refusal::new(RefusalReason::ReplayWindowFull, BUSY).about(&activity, &credential))?;
        if !first {
            return Err(Refusal::new(
                RefusalReason::Replayed,
                "replayed request: this stamped body was already used for this operation",
            )
            .about(&activity, &credential));
        }
        Ok(Authorized { operation, activity, credential, via_parent })
    }

    /// Records that the body with `fingerprint`, timestamped `timestamp_ms`, was used for
    /// `operation` (remembered until it is stale anyway): `Ok(false)` if it already was, a replay;
    /// busy when the replay window is full of live entries.
    pub fn first_use(&self, operation: &str, fingerprint: &str, timestamp_ms: i64) -> Result<bool, EnclaveError> {
        self.first_use_at(operation, fingerprint, timestamp_ms, now_ms())
    }

    fn first_use_at(
        &self,
        operation: &str,
        fingerprint: &str,
        timestamp_ms: i64,
        now: i64,
    ) -> Result<bool, EnclaveError> {
        let mut key = sha2::Sha256::new();
        key.update(operation.as_bytes());
        key.update([0u8]);
        key.update(fingerprint.as_bytes());
        let key: [u8; 32] = key.finalize().into();
        self.replay
            .lock()
            .map_err(|_| EnclaveError::Busy { reason: RefusalReason::ReplayWindowFull, message: BUSY.into() })?
            .insert(key, timestamp_ms.saturating_add(self.freshness_ms), now)
    }

    /// Whether `timestamp_ms` is within the freshness window of the enclave's clock.
    pub fn is_fresh(&self, timestamp_ms: i64) -> bool {
        (now_ms() - timestamp_ms).abs() <= self.freshness_ms
    }

    fn fresh(&self, activity: &StampedActivity, now: i64) -> Result<(), Refusal> {
        if (now - activity.timestamp_ms).abs() > self.freshness_ms {
            return Err(Refusal::new(
                RefusalReason::Stale,
                format!(
                    "stale or future timestampMs: more than {} s from the enclave's clock",
                    self.freshness_ms / 1000
                ),
            ));
        }
        Ok(())
    }

    /// Verifies one stamped request: a genuine, unexpired certificate, and a stamp over the exact
    /// body by that certificate's key. Whose organization the body may name is the caller's check.
    fn verify_stamped(
        &self,
        req: &pb::StampedRequest,
        now: i64,
        attested_claims: Option<&Claims>,
    ) -> Result<(StampedActivity, pb::CredentialCertificate), Refusal> {
        let activity =
            StampedActivity::parse(&req.body).map_err(|e| Refusal::new(RefusalReason::StampInvalid, e.message))?;
        let cert = pb::CredentialCertificate::decode(req.certificate.as_slice())
            .ok()
            .filter(|c| !c.mac.is_empty())
            .ok_or_else(|| {
                Refusal::new(RefusalReason::CertificateInvalid, "the credential has no enclave certificate")
            })?;
        let refuse = |reason: RefusalReason, message: &str| Refusal::new(reason, message).about(&activity, &cert);
        use RefusalReason::{CertificateExpired, CertificateInvalid, IdentityInvalid, OperationMismatch, StampInvalid};
        match self.hsm.certificate_mac_valid(&certificate_mac_input(&cert), &cert.mac) {
            Ok(true) => {}
            Ok(false) => return Err(refuse(CertificateInvalid, "the credential's certificate is not genuine")),
            Err(e) => return Err(refuse(CertificateInvalid, &format!("certificate check failed: {e}"))),
        }
        if cert.expires_at_ms != 0 && now >= cert.expires_at_ms as i64 {
            return Err(refuse(CertificateExpired, "the credential has expired"));
        }
        match req.stamp_header.to_ascii_lowercase().as_str() {
            "x-stamp" => {
                let s = stamp::parse(&req.stamp).map_err(|e| refuse(StampInvalid, &e.message))?;
                if s.public_key != cert.public_key || !s.scheme.signs_for(&cert.credential_type) {
                    return Err(refuse(
                        StampInvalid,
                        "the stamp was made by another key than the certified credential",
                    ));
                }
                stamp::verify(&s, &req.body).map_err(|e| refuse(StampInvalid, &e.message))?;
            }
            "x-stamp-webauthn" => {
                let s = webauthn::parse_stamp(&req.stamp, &req.body).map_err(|e| refuse(StampInvalid, &e.message))?;
                if cert.credential_type != webauthn::CREDENTIAL_TYPE {
                    return Err(refuse(StampInvalid, "a passkey stamp names a credential that is not a passkey"));
                }
                webauthn::verify_assertion(&s, &cert.public_key).map_err(|e| refuse(StampInvalid, &e.message))?;
            }
            "x-stamp-attested" => {
                // A session key attested by an OIDC token: only to log in, as the user whose
                // certified OAuth identity the token (verified by the caller) names.
                let s = attested::parse(&req.stamp).map_err(|e| refuse(StampInvalid, &e.message))?;
                let claims = attested_claims
                    .ok_or_else(|| refuse(OperationMismatch, "an attested stamp authorizes only a login"))?;
                if activity.activity_type != ATTESTED_LOGIN {
                    return Err(refuse(OperationMismatch, "an attested stamp authorizes only stamp_login"));
                }
                if cert.credential_type != coffer_auth::grants::OAUTH_PROVIDER
                    || cert.public_key != coffer_auth::oidc::identity_hash(&claims.iss, &claims.sub, &claims.aud)
                {
                    return Err(refuse(IdentityInvalid, "the attested token is not the certified OAuth identity"));
                }
                attested::check_binding(&s, claims).map_err(|e| refuse(StampInvalid, &e.message))?;
                attested::verify_signature(&s, &req.body).map_err(|e| refuse(StampInvalid, &e.message))?;
            }
            _ => return Err(refuse(StampInvalid, "no stamp")),
        }
        if cert.credential_type == coffer_auth::grants::OAUTH_PROVIDER
            && !req.stamp_header.eq_ignore_ascii_case(attested::HEADER)
        {
            return Err(refuse(StampInvalid, "an OAuth identity's certificate authorizes only an attested stamp"));
        }
        Ok((activity, cert))
    }
}

const BUSY: &str = "replay window is full: retry shortly";
/// The one activity an attested stamp may submit.
const ATTESTED_LOGIN: &str = "ACTIVITY_TYPE_STAMP_LOGIN";

/// Refuses an authorized request whose sealed material does not match its stamped body (the
/// wrong wallet, key or account), with the same audit line as every other refusal.
pub fn refuse(a: &Authorized, reason: RefusalReason, message: &str) -> EnclaveError {
    let refusal = Refusal::new(reason, message).about(&a.activity, &a.credential);
    refusal.audit(a.operation);
    refusal.into_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_set_refuses_repeats_forgets_expired_and_is_bounded() {
        let mut r = ReplaySet::new(2);
        assert!(r.insert([1; 32], 100, 0).unwrap());
        assert!(!r.insert([1; 32], 100, 50).unwrap(), "a repeat within the window");
        assert!(r.insert([2; 32], 100, 50).unwrap());
        assert!(
            matches!(
                r.insert([3; 32], 100, 50),
                Err(EnclaveError::Busy { reason: RefusalReason::ReplayWindowFull, .. })
            ),
            "full of live entries"
        );
        // Past the expiry the old entries go, and new ones fit.
        assert!(r.insert([3; 32], 300, 200).unwrap());
        assert!(r.insert([1; 32], 300, 200).unwrap(), "expired entries no longer count");
    }

    #[test]
    fn busy_or_refused_is_decided_on_the_reason_type() {
        let busy = Refusal::new(RefusalReason::ReplayWindowFull, "any words").into_error();
        assert!(matches!(busy, EnclaveError::Busy { reason: RefusalReason::ReplayWindowFull, .. }), "{busy:?}");
        // The busy wording alone no longer decides anything.
        let refused = Refusal::new(RefusalReason::Replayed, BUSY).into_error();
        assert!(matches!(refused, EnclaveError::Refused { reason: RefusalReason::Replayed, .. }), "{refused:?}");
        assert_eq!(refused.to_string(), format!("enclave refused: {BUSY}"));
    }

    #[test]
    fn certificate_mac_input_binds_every_field() {
        let base = pb::CredentialCertificate {
            organization_id: "o".into(),
            user_id: "u".into(),
            credential_type: "t".into(),
            public_key: "02".into(),
            expires_at_ms: 5,
            issuing_fingerprint: "f".into(),
            mac: vec![1],
        };
        let input = certificate_mac_input(&base);
        let variants = [
            pb::CredentialCertificate { organization_id: "o2".into(), ..base.clone() },
            pb::CredentialCertificate { user_id: "u2".into(), ..base.clone() },
            pb::CredentialCertificate { credential_type: "t2".into(), ..base.clone() },
            pb::CredentialCertificate { public_key: "03".into(), ..base.clone() },
            pb::CredentialCertificate { expires_at_ms: 6, ..base.clone() },
            pb::CredentialCertificate { issuing_fingerprint: "g".into(), ..base.clone() },
        ];
        for v in variants {
            assert_ne!(certificate_mac_input(&v), input, "{v:?}");
        }
        assert_eq!(certificate_mac_input(&pb::CredentialCertificate { mac: vec![2], ..base }), input);
    }

    #[test]
    fn webhook_messages_need_the_enclaves_now_a_plain_event_id_and_an_activity() {
        let authority = Authority::new(crate::hsm::tests::hsm(), 300_000, 16);
        let body = br#"{"id":"a1","organizationId":"o1","status":"ACTIVITY_STATUS_COMPLETED"}"#;
        let now = now_ms() as u64;
        let message = authority.webhook_message("kid", now, "evt-1:a1", body).unwrap();
        assert_eq!(message, [format!("v1.ed25519.kid.{now}.evt-1:a1.").as_bytes(), body.as_slice()].concat());
        let refused = |ts: u64, event: &str, body: &[u8]| match authority.webhook_message("kid", ts, event, body) {
            Err(EnclaveError::Refused { reason, message }) => (reason, message),
            other => panic!("{other:?}"),
        };
        use RefusalReason::{DeliveryInvalid, Stale};
        assert_eq!(refused(now + 301_000, "e", body).0, Stale, "a delivery signed ahead of time");
        assert_eq!(refused(now - 301_000, "e", body).0, Stale);
        for event in ["", "e.v\nX-Injected: 1", &"e".repeat(129)] {
            let (reason, message) = refused(now, event, body);
            assert!(reason == DeliveryInvalid && message.contains("event id"), "{event:?}: {message}");
        }
        for (body, why) in [
            (b"not json".as_slice(), "not json"),
            (br#"{"id":"a1"}"#, "no organizationId"),
            (br#"["a1","o1"]"#, "an array is not an activity"),
            (br#"{"id":1,"organizationId":"o1"}"#, "a numeric id"),
            (br#"{"id":"a1","organizationId":"o1"} trailing"#, "trailing bytes"),
        ] {
            let (reason, message) = refused(now, "e", body);
            assert!(reason == DeliveryInvalid && message.contains("not an activity"), "{why}: {message}");
        }
    }
}
