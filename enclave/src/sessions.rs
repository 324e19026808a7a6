//! Sessions: which user a login activity may open a session for (decided here, from the stamped
//! body and certificates), the session key's certificate, and the notarizer-signed session JWT.

use coffer_auth::envelope::{derived_id, text};
use coffer_auth::grants::{self, OAUTH_PROVIDER};
use coffer_auth::oidc;
use coffer_org_rules::model::{CredentialKind, OrgState};
use coffer_org_rules::{Change, Credential, Effect};
use coffer_proto::v1 as pb;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use prost::Message;
use serde_json::{json, Value};
use sha2::Digest;
use zeroize::Zeroizing;

use crate::admission::{certificate_mac_input, refuse, Admission, Admitted};
use crate::config::LoginSettings;
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::{Hsm, LoginKey};

pub const OAUTH_LOGIN: &str = "ACTIVITY_TYPE_OAUTH_LOGIN";
/// The first OAuth login (`oauth`): the token's identity, and a new key the enclave makes and
/// encrypts to `targetPublicKey` (the token's nonce binds that target), instead of a session of
/// the client's key.
pub const OAUTH: &str = "ACTIVITY_TYPE_OAUTH";
/// Whether `activity_type` logs in by an OIDC token's identity.
pub fn by_oidc_token(activity_type: &str) -> bool {
    activity_type == OAUTH_LOGIN || activity_type == OAUTH
}
pub const STAMP_LOGIN: &str = "ACTIVITY_TYPE_STAMP_LOGIN";
pub const CREATE_READ_WRITE_SESSION: &str = "ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2";
pub const LOGIN_TYPES: &[&str] = &[
    OAUTH_LOGIN,
    OAUTH,
    STAMP_LOGIN,
    CREATE_READ_WRITE_SESSION,
    OTP_LOGIN,
    OTP_AUTH,
    EMAIL_AUTH,
    INIT_USER_EMAIL_RECOVERY,
    CREATE_READ_ONLY_SESSION,
];
/// `create_read_only_session`: a session JWT that reads as the stamping user (the gateway
/// accepts it as `X-Session` on queries only); no key, no credential.
pub const CREATE_READ_ONLY_SESSION: &str = "ACTIVITY_TYPE_CREATE_READ_ONLY_SESSION";
/// `email_auth` and `init_user_email_recovery`: a credential for the user with the body's email,
/// sent only by email (`service::otp`).
pub const EMAIL_AUTH: &str = "ACTIVITY_TYPE_EMAIL_AUTH_V3";
pub const INIT_USER_EMAIL_RECOVERY: &str = "ACTIVITY_TYPE_INIT_USER_EMAIL_RECOVERY_V2";
/// `otp_login`: decided in `service::otp` (the verification token and the user it names).
pub const OTP_LOGIN: &str = "ACTIVITY_TYPE_OTP_LOGIN_V2";
/// `otp_auth`: the code of an `init_otp_auth` (typed, in the stamped body) traded for a
/// credential of the user with the code's contact, encrypted to `targetPublicKey`
/// (`service::otp`).
pub const OTP_AUTH: &str = "ACTIVITY_TYPE_OTP_AUTH";
/// The one-time code activities before a login (`service::otp`).
pub const INIT_OTP: &str = "ACTIVITY_TYPE_INIT_OTP_V3";
pub const INIT_OTP_AUTH: &str = "ACTIVITY_TYPE_INIT_OTP_AUTH_V3";
pub const VERIFY_OTP: &str = "ACTIVITY_TYPE_VERIFY_OTP_V2";
/// What a parent organization's credential may submit for its sub-organization (with the
/// sub-organization's parent certificate): the logins ([`LOGIN_TYPES`]), and the one-time code
/// before a login.
pub fn parent_may_submit() -> impl Iterator<Item = &'static str> {
    LOGIN_TYPES.iter().copied().chain([INIT_OTP_AUTH])
}

/// Default session length when the body gives none.
pub const DEFAULT_SESSION_SECONDS: u64 = 900;

/// `expirationSeconds` of a login body: absent → 900, else 1 ..= the deployment's maximum.
pub fn session_seconds(p: &Value, max: u64) -> Result<u64, EnclaveError> {
    let seconds = grants::expiration(p.get("expirationSeconds"))
        .map_err(|_| EnclaveError::invalid("invalid expirationSeconds: a positive number of seconds"))?
        .unwrap_or(DEFAULT_SESSION_SECONDS);
    if seconds > max {
        return Err(EnclaveError::invalid(format!("invalid expirationSeconds: at most {max} seconds")));
    }
    Ok(seconds)
}

/// What the enclave says when a token's issuer is not one it trusts: the same words whatever the
/// issuer, and nothing about whether it can be reached (nothing was fetched).
pub const ISSUER_NOT_ALLOWED: &str =
    "the OIDC token's issuer is not Coffer's own nor one of the enclave's oidc_issuers_allowed";

/// The claims of `token` read without verifying its signature (structure, registered claims,
/// `exp`, algorithm): what the local checks before any fetch are made on.
pub fn read_token(token: &str) -> Result<oidc::Claims, EnclaveError> {
    Ok(oidc::unverified_claims(token.trim(), now_secs())?)
}

/// An OIDC token a login has still to verify, and the claims its local checks were made on.
pub struct PendingToken {
    pub token: String,
    pub claims: oidc::Claims,
}

/// The checks of a login's OIDC tokens that need no network, made after the call's stamp and
/// credential are verified (`a`) and before anything is fetched: each token's issuer is Coffer's
/// own or allowlisted (else [`ISSUER_NOT_ALLOWED`], typed), and an `oauth_login` token of another
/// issuer names the identity of a certified OAuth provider of the body's organization. `attested`
/// is an attested stamp's token with the claims the authority checked. Returns the tokens to
/// verify, the `oauth_login` one first.
pub fn before_fetch(
    hsm: &Hsm,
    settings: &LoginSettings,
    a: &Admitted,
    attested: Option<PendingToken>,
    provider_certificate: &[u8],
) -> Result<Vec<PendingToken>, EnclaveError> {
    let mut pending = Vec::new();
    if by_oidc_token(&a.activity.activity_type) {
        let token = text(&a.activity.parameters, "oidcToken").trim();
        if token.is_empty() {
            return Err(EnclaveError::invalid("oidcToken is required"));
        }
        let claims = match read_token(token) {
            Ok(c) => c,
            Err(e) => {
                refuse(a, RefusalReason::IdentityInvalid, &e.to_string());
                return Err(e);
            }
        };
        if !settings.issuer_allowed(&claims.iss) {
            return Err(refuse(a, RefusalReason::IssuerNotAllowed, ISSUER_NOT_ALLOWED));
        }
        if settings.oidc_issuer.as_deref() != Some(claims.iss.as_str()) {
            provider_user(hsm, a, &claims, provider_certificate)?;
        }
        pending.push(PendingToken { token: token.to_string(), claims });
    }
    if let Some(t) = attested {
        if !settings.issuer_allowed(&t.claims.iss) {
            return Err(refuse(a, RefusalReason::IssuerNotAllowed, ISSUER_NOT_ALLOWED));
        }
        pending.push(t);
    }
    Ok(pending)
}

/// Verifies a token [`before_fetch`] passed (Coffer's own against the issuer key in the HSM,
/// another allowlisted issuer's against its published keys) and that it says what it was read
/// to say. A token that does not verify is refused with an audit line; the error is the
/// verification's.
pub async fn verify_pending(
    hsm: &Hsm,
    settings: &LoginSettings,
    a: &Admitted,
    t: &PendingToken,
) -> Result<oidc::Claims, EnclaveError> {
    let claims = match verify_token(hsm, settings, &t.token).await {
        Ok(c) => c,
        Err(e) => {
            refuse(a, RefusalReason::IdentityInvalid, &e.to_string());
            return Err(e);
        }
    };
    if (&claims.iss, &claims.sub, &claims.aud, &claims.nonce)
        != (&t.claims.iss, &t.claims.sub, &t.claims.aud, &t.claims.nonce)
    {
        return Err(EnclaveError::Internal("a verified token's claims are not the ones it was read with".into()));
    }
    Ok(claims)
}

/// An `oauth_login` body's verified claims must have as nonce the lowercase hex SHA-256 of the
/// body's `publicKey` string (spec §14).
pub fn check_nonce(activity_type: &str, p: &Value, claims: &oidc::Claims) -> Result<(), EnclaveError> {
    let field = if activity_type == OAUTH { "targetPublicKey" } else { "publicKey" };
    let expected = hex::encode(sha2::Sha256::digest(text(p, field).as_bytes()));
    if claims.nonce.as_deref() != Some(expected.as_str()) {
        return Err(EnclaveError::invalid(format!(
            "invalid OIDC token: its nonce is not the SHA-256 of the {field} (sha256({field}) as lowercase hex)"
        )));
    }
    Ok(())
}

/// An OIDC token verified by the enclave: Coffer's own against the issuer key in the HSM (no
/// fetch), another issuer's against its published keys, fetched with the enclave's client and
/// only from an allowlisted issuer (`[login] oidc_issuers_allowed`).
pub async fn verify_token(hsm: &Hsm, settings: &LoginSettings, token: &str) -> Result<oidc::Claims, EnclaveError> {
    let issuer_key = hsm.login_public_keys()?.oidc_issuer;
    let jwks = json!({ "keys": [oidc::es256_jwk(&issuer_key, &crate::oauth2_exchange::oidc_key_id(&issuer_key))] });
    let own = settings.oidc_issuer.as_deref().map(|issuer| oidc::OwnIssuer { issuer, jwks: &jwks });
    let fetch = oidc::Fetch { client: crate::egress::client(), allowed: Some(&settings.oidc_issuers_allowed) };
    Ok(oidc::verify(token, own, fetch).await?)
}

fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// A session key's public half as stored: a compressed P-256 point, lowercase hex.
fn session_public_key(p: &Value) -> Result<String, EnclaveError> {
    grants::api_public_key("API_KEY_CURVE_P256", text(p, "publicKey"))
        .map(|(k, _)| k)
        .map_err(|_| EnclaveError::invalid("invalid publicKey: a compressed P-256 public key (66 hex characters)"))
}

/// What a login activity opens: for whom, with which key, of which credential type.
pub struct SessionGrant {
    pub user_id: String,
    pub public_key: String,
    pub credential_type: &'static str,
    /// create_read_write_session: the key pair made here; its private half leaves only encrypted.
    pub secret: Option<Zeroizing<[u8; 32]>>,
}

/// Decides the user and key of a login activity already authorized (`a`); `identity` is the
/// verified OIDC claims of an `oauth_login`.
pub fn grant(
    hsm: &Hsm,
    admission: &Admission,
    a: &Admitted,
    identity: Option<&oidc::Claims>,
    provider_certificate: &[u8],
) -> Result<SessionGrant, EnclaveError> {
    let p = &a.activity.parameters;
    match a.activity.activity_type.as_str() {
        STAMP_LOGIN => {
            if a.via_parent {
                return Err(EnclaveError::invalid(
                    "stamp_login opens a session for the stamping user: stamp it with a credential of the organization itself",
                ));
            }
            Ok(SessionGrant {
                user_id: a.credential.user_id.clone(),
                public_key: session_public_key(p)?,
                credential_type: "CREDENTIAL_TYPE_LOGIN",
                secret: None,
            })
        }
        t @ (OAUTH_LOGIN | OAUTH) => {
            let claims = identity.ok_or_else(|| EnclaveError::Internal("oauth_login without its identity".into()))?;
            let user_id = provider_user(hsm, a, claims, provider_certificate)?;
            // The certificate outlives the provider: deleted from its user (or the user deleted),
            // it opens nothing, whichever certificate the gateway still has.
            let provider = oidc::identity_hash(&claims.iss, &claims.sub, &claims.aud);
            let live = admission.rules().load(&a.activity.organization_id)?.is_some_and(|l| {
                l.state.live_credential(&user_id, &provider, OAUTH_PROVIDER, crate::admission::now_ms()).is_some()
            });
            if !live {
                return Err(refuse(
                    a,
                    RefusalReason::CredentialRevoked,
                    "the OAuth provider is no longer a credential of its user in this organization",
                ));
            }
            if t == OAUTH {
                if text(p, "targetPublicKey").is_empty() {
                    return Err(EnclaveError::invalid("targetPublicKey is required"));
                }
                let (secret, public_key) = new_session_key(hsm)?;
                return Ok(SessionGrant {
                    user_id,
                    public_key,
                    credential_type: "CREDENTIAL_TYPE_OAUTH_KEY_P256",
                    secret: Some(secret),
                });
            }
            Ok(SessionGrant {
                user_id,
                public_key: session_public_key(p)?,
                credential_type: "CREDENTIAL_TYPE_OAUTH_KEY_P256",
                secret: None,
            })
        }
        CREATE_READ_WRITE_SESSION => {
            let user_id = match text(p, "userId") {
                "" if a.via_parent => {
                    return Err(EnclaveError::invalid(
                        "userId is required when a parent organization's credential asks",
                    ))
                }
                "" => a.credential.user_id.clone(),
                u => u.to_string(),
            };
            if !may_open_for(a, &user_id) {
                return Err(refuse(
                    a,
                    RefusalReason::ConsensusNeeded,
                    "a session for another user than the stamping one opens only by the root quorum or the parent organization",
                ));
            }
            if text(p, "targetPublicKey").is_empty() {
                return Err(EnclaveError::invalid("targetPublicKey is required"));
            }
            let (secret, public_key) = new_session_key(hsm)?;
            Ok(SessionGrant {
                user_id,
                public_key,
                credential_type: "CREDENTIAL_TYPE_READ_WRITE_SESSION_KEY_P256",
                secret: Some(secret),
            })
        }
        other => Err(EnclaveError::invalid(format!("{other} opens no session"))),
    }
}

/// The evaluation reason of a decision the root quorum made alone (`coffer_org_rules::decide`).
const ROOT_QUORUM: &str = "ROOT_QUORUM";

/// Whether `a` may open a session for `user_id`: always for the stamping credential's own user;
/// for another user only when the sub-organization's parent asks (its credential, through the
/// parent certificate) or the organization's root quorum approved it. A policy that lets a
/// member open sessions lets it open its own.
fn may_open_for(a: &Admitted, user_id: &str) -> bool {
    user_id == a.credential.user_id
        || a.via_parent
        || (a.decided.evaluation.decision == coffer_policy::decision::Decision::Allow
            && a.decided.evaluation.reason == ROOT_QUORUM)
}

/// The expiry of a session asked to end at `requested_ms`, opened by a stamp of `credential`: no
/// later than that credential's own, as its certificate says and as `state` (the authority state
/// the decision read, when there is one) records it, the lower of the two; a session opened by a
/// session is such a credential too. A credential without expiry bounds nothing; the identity an
/// attested stamp stands for (an OAuth identity, a verification token this login spends) is no
/// credential the session descends from.
pub fn bounded_expiry(requested_ms: u64, credential: &pb::CredentialCertificate, state: Option<&OrgState>) -> u64 {
    let c = credential;
    if [grants::OAUTH_PROVIDER, grants::VERIFICATION_TOKEN].contains(&c.credential_type.as_str()) {
        return requested_ms;
    }
    let stored = state.and_then(|s| {
        s.credentials_by_public_key(&c.public_key)
            .filter(|s| s.user_id == c.user_id && s.credential_type == c.credential_type)
            .map(|s| s.expires_at_ms)
            .filter(|e| *e != 0)
            .min()
    });
    [Some(c.expires_at_ms).filter(|e| *e != 0), stored].into_iter().flatten().fold(requested_ms, u64::min)
}

/// [`bounded_expiry`] of the session `a` opens, asked for `seconds` from now.
fn session_expiry(admission: &Admission, a: &Admitted, seconds: u64) -> u64 {
    bounded_expiry(admission.expiry(Some(seconds)), &a.credential, Some(&a.decided.loaded.state))
}

/// A P-256 key pair drawn from the HSM's generator (a valid scalar by rejection sampling): the
/// secret, and the public key as stored (compressed, lowercase hex).
pub fn new_session_key(hsm: &Hsm) -> Result<(Zeroizing<[u8; 32]>, String), EnclaveError> {
    let secret = loop {
        let bytes = hsm.random(32)?;
        if p256::SecretKey::from_slice(&bytes).is_ok() {
            let mut s = Zeroizing::new([0u8; 32]);
            s.copy_from_slice(&bytes);
            break s;
        }
    };
    let sk = p256::SecretKey::from_slice(secret.as_slice())
        .map_err(|_| EnclaveError::Internal("session key is not a scalar".into()))?;
    Ok((secret, hex::encode(sk.public_key().to_encoded_point(true).as_bytes())))
}

/// The user whose certified OAuth provider (`provider_certificate`, of the body's organization)
/// is the identity `claims` name.
fn provider_user(
    hsm: &Hsm,
    a: &Admitted,
    claims: &oidc::Claims,
    provider_certificate: &[u8],
) -> Result<String, EnclaveError> {
    let cert = pb::CredentialCertificate::decode(provider_certificate)
        .ok()
        .filter(|c| !c.mac.is_empty())
        .ok_or_else(|| refuse(a, RefusalReason::CertificateInvalid, "no certified OAuth provider matches the token"))?;
    if !hsm.certificate_mac_valid(&certificate_mac_input(&cert), &cert.mac)?
        || cert.credential_type != OAUTH_PROVIDER
        || cert.organization_id != a.activity.organization_id
        || cert.public_key != oidc::identity_hash(&claims.iss, &claims.sub, &claims.aud)
    {
        return Err(refuse(
            a,
            RefusalReason::IdentityInvalid,
            "the OAuth provider's certificate is not the token's identity in this organization",
        ));
    }
    Ok(cert.user_id)
}

/// A read-only session for the stamping user: the notarizer's JWT (`SESSION_TYPE_READ_ONLY`,
/// naming the stamping key), `seconds` long and no longer than a session that stamped it. It
/// certifies and records nothing: it can only read, which the gateway serves.
pub fn read_only_session(
    hsm: &Hsm,
    admission: &Admission,
    a: &Admitted,
    seconds: u64,
) -> Result<pb::CreateSessionResponse, EnclaveError> {
    if a.via_parent {
        return Err(EnclaveError::invalid(
            "create_read_only_session reads as the stamping user: stamp it with a credential of the organization itself",
        ));
    }
    let expires_at_ms = session_expiry(admission, a, seconds);
    let credential_id = stamping_credential_id(a)?;
    // `credential_id` names the credential by id (a key deleted and added back under a new id
    // does not revive the session); `public_key` stays for the SDKs that decode it.
    let claims = json!({
        "exp": expires_at_ms / 1000,
        "public_key": a.credential.public_key,
        "session_type": "SESSION_TYPE_READ_ONLY",
        "user_id": a.credential.user_id,
        "organization_id": a.activity.organization_id,
        "credential_id": credential_id,
    });
    let session = coffer_crypto::session::assemble_session_jwt(&claims, |digest| {
        hsm.sign_digest_with(LoginKey::Notarizer, digest)
            .map_err(|e| coffer_crypto::CryptoError::Internal(e.to_string()))
    })?;
    tracing::info!(
        target: "coffer_audit",
        decision = "allow",
        operation = "create_read_only_session",
        organization = %a.activity.organization_id,
        user = %a.credential.user_id,
        fingerprint = %a.activity.fingerprint,
        "enclave decision"
    );
    let result = json!({
        "userId": a.credential.user_id,
        "sessionExpiry": (expires_at_ms / 1000).to_string(),
        "sessionSha256": hex::encode(sha2::Sha256::digest(session.as_bytes())),
    });
    Ok(pb::CreateSessionResponse {
        app_proofs: crate::proofs::of_call(hsm, a, result)?,
        session,
        user_id: a.credential.user_id.clone(),
        public_key: a.credential.public_key.clone(),
        expires_at_ms,
        evaluation: a.evaluation(),
        ..Default::default()
    })
}

/// The id, in the organization's authority state, of the live credential that stamped `a` (the
/// state the decision read): what a read-only session names, so that only that credential keeps
/// it alive.
fn stamping_credential_id(a: &Admitted) -> Result<String, EnclaveError> {
    let c = &a.credential;
    Some(&a.decided.loaded)
        .and_then(|l| {
            l.state.live_credential(&c.user_id, &c.public_key, &c.credential_type, crate::admission::now_ms()).map(|c| c.id.clone())
        })
        .ok_or_else(|| {
            refuse(
                a,
                RefusalReason::CredentialRevoked,
                "the stamping credential is not live in the organization's authority state: no read-only session names it",
            )
        })
}

/// The session profile a login's `sessionProfileId` names, with its id: one of the organization's
/// or, for a sub-organization, of its parent's (a parent makes profiles for its users' sessions).
/// `None` when the body names none; a 400 when it names one that is neither.
pub fn named_profile(
    admission: &Admission,
    a: &Admitted,
) -> Result<Option<(String, coffer_org_rules::model::SessionProfile)>, EnclaveError> {
    let id = text(&a.activity.parameters, "sessionProfileId").trim();
    if id.is_empty() {
        return Ok(None);
    }
    let rules = admission.rules();
    let Some(own) = rules.load(&a.activity.organization_id)? else {
        return Err(EnclaveError::invalid("sessionProfileId names no session profile of this organization"));
    };
    if let Some(p) = own.state.organization.session_profiles.get(id) {
        return Ok(Some((id.to_string(), p.clone())));
    }
    if let Some(parent) = own.state.organization.parent_id.as_deref() {
        if let Some(p) = rules.load(parent)?.and_then(|l| l.state.organization.session_profiles.get(id).cloned()) {
            return Ok(Some((id.to_string(), p)));
        }
    }
    Err(EnclaveError::invalid("sessionProfileId names no session profile of this organization or its parent"))
}

/// The scope of a session opened by a credential with scope `opener` (empty: none) under a
/// profile with scope `profile`: both hold (a session of a profile cannot log in again out of
/// its scope, whatever profile it names).
pub fn session_scope(opener: &str, profile: Option<&str>) -> String {
    match (opener.is_empty(), profile) {
        (true, None) => String::new(),
        (true, Some(p)) => p.to_string(),
        (false, None) => opener.to_string(),
        (false, Some(p)) => format!("({opener}) && ({p})"),
    }
}

/// Certifies the session key and signs its JWT; for a read-write session also encrypts the key
/// to the body's `targetPublicKey`. With a session profile, the JWT's `session_type` is the
/// profile's name and it carries `session_profile_id` and `scope`.
pub fn open_session(
    hsm: &Hsm,
    admission: &Admission,
    a: &Admitted,
    g: SessionGrant,
    seconds: u64,
    profile: Option<&(String, coffer_org_rules::model::SessionProfile)>,
) -> Result<pb::CreateSessionResponse, EnclaveError> {
    // A session cannot outlive the credential (API key, session) that opened it.
    let expires_at_ms = session_expiry(admission, a, seconds);
    let organization_id = a.activity.organization_id.clone();
    let certificate = admission.certify(pb::CredentialCertificate {
        organization_id: organization_id.clone(),
        user_id: g.user_id.clone(),
        credential_type: g.credential_type.to_string(),
        public_key: g.public_key.clone(),
        expires_at_ms,
        issuing_fingerprint: a.activity.fingerprint.clone(),
        mac: vec![],
        session_scope: session_scope(&a.credential.session_scope, profile.map(|(_, p)| p.scope.as_str())),
    })?;
    let mut claims = json!({
        "exp": expires_at_ms / 1000,
        "public_key": g.public_key,
        "session_type": "SESSION_TYPE_READ_WRITE",
        "user_id": g.user_id,
        "organization_id": organization_id,
    });
    if let Some((id, p)) = profile {
        claims["session_type"] = json!(p.name);
        claims["session_profile_id"] = json!(id);
        claims["scope"] = json!(p.scope);
    }
    let session = coffer_crypto::session::assemble_session_jwt(&claims, |digest| {
        hsm.sign_digest_with(LoginKey::Notarizer, digest)
            .map_err(|e| coffer_crypto::CryptoError::Internal(e.to_string()))
    })?;
    let credential_bundle = match &g.secret {
        Some(secret) => {
            let seed = hsm.random_seed()?;
            coffer_crypto::session::credential_bundle(&seed, text(&a.activity.parameters, "targetPublicKey"), secret)?
        }
        None => String::new(),
    };
    // The session key is a credential of the user from now on (and the user's earlier sessions
    // are not, when the body says so), durably, before the session leaves the enclave.
    let credential_id = derived_id(&a.activity.fingerprint, SESSION_CREDENTIAL_ID, 0);
    let mut effects = Vec::new();
    let invalidate = a.activity.parameters.get("invalidateExisting").and_then(serde_json::Value::as_bool) == Some(true);
    if let Some(l) = admission.rules().load(&organization_id)? {
        let now = crate::admission::now_ms();
        let sessions = |expired_only: bool| -> Vec<String> {
            l.state
                .credentials
                .values()
                .filter(|c| c.user_id == g.user_id && c.kind == CredentialKind::Session)
                .filter(|c| !expired_only || !c.live(now))
                .map(|c| c.id.clone())
                .collect()
        };
        let remove = |ids: Vec<String>| Effect::RemoveCredentials {
            user_id: g.user_id.clone(),
            kind: CredentialKind::Session,
            ids,
        };
        let (earlier, expired) = (sessions(false), sessions(true));
        if invalidate && !earlier.is_empty() {
            effects.push(remove(earlier));
        } else if !expired.is_empty() {
            // The user's expired sessions leave the state, so that logins do not grow it (its
            // weight is capped) without end: first, in a commit of their own, and best effort (a
            // login of the same user at once may have removed them already).
            let pruned = [Change { organization_id: organization_id.clone(), effect: remove(expired) }];
            if let Err(e) = admission.rules().record(&pruned) {
                tracing::debug!(error = %e, "expired sessions not removed");
            }
        }
    }
    effects.push(Effect::AddCredential {
        credential: Credential {
            id: credential_id.clone(),
            user_id: g.user_id.clone(),
            kind: CredentialKind::Session,
            credential_type: g.credential_type.to_string(),
            public_key: g.public_key.clone(),
            expires_at_ms,
        },
    });
    let changes: Vec<Change> =
        effects.into_iter().map(|effect| Change { organization_id: organization_id.clone(), effect }).collect();
    admission.rules().record(&changes)?;
    tracing::info!(
        target: "coffer_audit",
        decision = "allow",
        operation = "create_session",
        organization = %organization_id,
        user = %g.user_id,
        credential = %g.public_key,
        via_parent = a.via_parent,
        fingerprint = %a.activity.fingerprint,
        "enclave decision"
    );
    let result = json!({
        "userId": g.user_id,
        "sessionPublicKey": g.public_key,
        "credentialType": g.credential_type,
        "expiresAtMs": expires_at_ms.to_string(),
        "sessionSha256": hex::encode(sha2::Sha256::digest(session.as_bytes())),
    });
    let app_proofs = crate::proofs::of_call(hsm, a, result)?;
    Ok(pb::CreateSessionResponse {
        app_proofs,
        session,
        user_id: g.user_id,
        public_key: g.public_key,
        credential_type: g.credential_type.to_string(),
        expires_at_ms,
        certificate,
        credential_bundle,
        credential_id,
        evaluation: a.evaluation(),
        email_events: Vec::new(),
    })
}

/// `derived_id` purpose of a session key's credential id (the gateway's API key id of it).
const SESSION_CREDENTIAL_ID: &str = "session-credential";

#[cfg(test)]
mod tests {
    /// Each login type's call is authorized under the operation the registry names for it.
    #[test]
    fn the_registry_names_each_login_type_s_operation() {
        use coffer_org_rules::subjects::login_operation;
        for t in LOGIN_TYPES {
            assert_eq!(login_operation(t), Some("create_session"), "{t}");
        }
        for t in [INIT_OTP, INIT_OTP_AUTH] {
            assert_eq!(login_operation(t), Some("init_otp"), "{t}");
        }
        assert_eq!(login_operation(VERIFY_OTP), Some("verify_otp"));
        assert_eq!(login_operation("ACTIVITY_TYPE_OAUTH2_AUTHENTICATE"), Some("oauth2_authenticate"));
        assert_eq!(login_operation("ACTIVITY_TYPE_APPROVE_ACTIVITY"), None);
    }
    use super::*;

    #[test]
    fn a_scoped_session_logs_in_again_only_within_its_scope() {
        assert_eq!(session_scope("", None), "");
        assert_eq!(session_scope("", Some("a")), "a");
        assert_eq!(session_scope("a", None), "a");
        assert_eq!(session_scope("a", Some("b")), "(a) && (b)");
        let both = session_scope("activity.type == 'X'", Some("true"));
        assert!(coffer_policy::parse_condition(&both).is_ok(), "{both}");
    }
    use coffer_org_rules::model::{Organization, User};

    fn certificate(credential_type: &str, expires_at_ms: u64) -> pb::CredentialCertificate {
        pb::CredentialCertificate {
            organization_id: "o".into(),
            user_id: "u".into(),
            credential_type: credential_type.into(),
            public_key: "02aa".into(),
            expires_at_ms,
            ..Default::default()
        }
    }

    fn state_with(expires_at_ms: u64) -> OrgState {
        let mut s = OrgState::new(Organization { id: "o".into(), ..Default::default() });
        s.apply(&Effect::PutUser { user: User { id: "u".into(), name: "u".into(), ..Default::default() } }).unwrap();
        let credential = Credential {
            id: "k".into(),
            user_id: "u".into(),
            kind: CredentialKind::ApiKey,
            credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
            public_key: "02aa".into(),
            expires_at_ms,
        };
        s.apply(&Effect::AddCredential { credential }).unwrap();
        s
    }

    #[test]
    fn a_session_ends_no_later_than_the_credential_that_opened_it() {
        const API_KEY: &str = "CREDENTIAL_TYPE_API_KEY_P256";
        let week = 7 * 24 * 3_600_000;
        // A 60 s key asking for a week: the key's end.
        assert_eq!(bounded_expiry(week, &certificate(API_KEY, 60_000), None), 60_000);
        // Asking for less than the key has left: what was asked.
        assert_eq!(bounded_expiry(30_000, &certificate(API_KEY, 60_000), None), 30_000);
        // No expiry: unaffected.
        assert_eq!(bounded_expiry(week, &certificate(API_KEY, 0), None), week);
        // The state's record bounds it too, the lower of the two (an expiry the certificate
        // does not carry, or a later one it does).
        assert_eq!(bounded_expiry(week, &certificate(API_KEY, 0), Some(&state_with(50_000))), 50_000);
        assert_eq!(bounded_expiry(week, &certificate(API_KEY, 90_000), Some(&state_with(50_000))), 50_000);
        assert_eq!(bounded_expiry(week, &certificate(API_KEY, 40_000), Some(&state_with(50_000))), 40_000);
        assert_eq!(bounded_expiry(week, &certificate(API_KEY, 0), Some(&state_with(0))), week);
        // A session opened by a session: the opening session's end.
        assert_eq!(bounded_expiry(week, &certificate("CREDENTIAL_TYPE_LOGIN", 900_000), None), 900_000);
        // What an attested stamp stands for is no credential the session descends from.
        for t in [grants::VERIFICATION_TOKEN, grants::OAUTH_PROVIDER] {
            assert_eq!(bounded_expiry(week, &certificate(t, 60_000), None), week, "{t}");
        }
    }
}
