//! Request authentication: API-key stamps (`X-Stamp`), passkey stamps (`X-Stamp-Webauthn`) and
//! OIDC-attested session keys (`X-Stamp-Attested`, logins only), resolved to a credential and a
//! user.

pub use coffer_auth::{attested, stamp, webauthn};

use std::sync::Arc;

use axum::http::HeaderMap;

use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{now_nanos, ApiKey, AuthenticatorRecord, OauthProviderRecord, Organization, StoreError, User};

/// A stamp read from the request headers. API-key stamps are fully verified when read; a
/// passkey stamp's challenge is checked against the body when read and its signature when the
/// credential's public key is known ([`resolve`]).
#[derive(Debug, Clone)]
pub enum Stamp {
    ApiKey(stamp::ApiStamp, RawStamp),
    Webauthn(webauthn::WebauthnStamp, RawStamp),
    /// Signature verified when read; the token and the identity in [`resolve`].
    Attested(attested::AttestedStamp, RawStamp),
}

/// A stamp header exactly as received, for the enclave to verify again over the same bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawStamp {
    /// `X-Stamp` or `X-Stamp-Webauthn`.
    pub header: &'static str,
    pub value: String,
}

pub const X_STAMP: &str = "X-Stamp";
pub const X_STAMP_WEBAUTHN: &str = "X-Stamp-Webauthn";
pub const X_STAMP_ATTESTED: &str = attested::HEADER;

/// The credential a request was stamped with.
#[derive(Debug, Clone)]
pub enum Credential {
    ApiKey(ApiKey),
    Authenticator(AuthenticatorRecord),
    /// A session key attested by an OIDC token, acting as the user of this OAuth identity (it
    /// may only log in).
    Attested(OauthProviderRecord),
    /// A key attested by a verification token, acting as the user with the token's contact (it
    /// may only log in).
    VerificationToken(TokenLogin),
    /// The key an invitation's acceptance brings, acting as the user it makes (it may only
    /// accept the invitation; the enclave checks its code).
    Invitation(InvitationAcceptance),
}

/// Who an invitation's acceptance acts as: the user it makes in the invitation's organization.
#[derive(Debug, Clone)]
pub struct InvitationAcceptance {
    pub organization_id: String,
    pub invitation_id: String,
}

/// Who a verification token's attested stamp logs in: the user of a sub-organization whose
/// verified contact the token names.
#[derive(Debug, Clone)]
pub struct TokenLogin {
    pub organization_id: String,
    pub user_id: String,
    /// The token's `id`.
    pub token_id: String,
    /// Stamped for the token's own organization, routed here ([`token_login_route`]).
    pub routed: bool,
}

impl Credential {
    /// The organization the credential is registered in (the target org or its parent).
    pub fn organization_id(&self) -> &str {
        match self {
            Credential::ApiKey(k) => &k.organization_id,
            Credential::Authenticator(a) => &a.organization_id,
            Credential::Attested(p) => &p.organization_id,
            Credential::VerificationToken(t) => &t.organization_id,
            Credential::Invitation(i) => &i.organization_id,
        }
    }
    pub fn id(&self) -> &str {
        match self {
            Credential::ApiKey(k) => &k.id,
            Credential::Authenticator(a) => &a.id,
            Credential::Attested(p) => &p.id,
            Credential::VerificationToken(t) => &t.token_id,
            Credential::Invitation(i) => &i.invitation_id,
        }
    }
    /// The `CREDENTIAL_TYPE_*` of the credential.
    pub fn credential_type(&self) -> &str {
        match self {
            Credential::ApiKey(k) => &k.credential_type,
            Credential::Authenticator(_) => webauthn::CREDENTIAL_TYPE,
            Credential::Attested(_) => "CREDENTIAL_TYPE_OAUTH_KEY_P256",
            Credential::VerificationToken(_) => coffer_auth::grants::VERIFICATION_TOKEN,
            Credential::Invitation(_) => coffer_auth::grants::INVITATION_ACCEPTANCE,
        }
    }
    pub fn api_key(&self) -> Option<&ApiKey> {
        match self {
            Credential::ApiKey(k) => Some(k),
            Credential::Authenticator(_)
            | Credential::Attested(_)
            | Credential::VerificationToken(_)
            | Credential::Invitation(_) => None,
        }
    }
    pub fn authenticator(&self) -> Option<&AuthenticatorRecord> {
        match self {
            Credential::ApiKey(_)
            | Credential::Attested(_)
            | Credential::VerificationToken(_)
            | Credential::Invitation(_) => None,
            Credential::Authenticator(a) => Some(a),
        }
    }
    /// The enclave-issued certificate of the credential (empty if it has none).
    pub fn certificate(&self) -> &[u8] {
        match self {
            Credential::ApiKey(k) => &k.certificate,
            Credential::Authenticator(a) => &a.certificate,
            // The OAuth identity's certificate: the enclave checks the token against it.
            Credential::Attested(p) => &p.certificate,
            // None: the enclave checks the token (the invitation's code) itself.
            Credential::VerificationToken(_) | Credential::Invitation(_) => &[],
        }
    }
}

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: User,
    pub credential: Credential,
    /// What the submitter's vote records: the credential's public key (lowercase hex), the
    /// stamp's scheme (`SIGNATURE_SCHEME_TK_API_*` or `SIGNATURE_SCHEME_TK_WEBAUTHN`) and its
    /// signature (lowercase hex; DER for ECDSA).
    pub public_key: String,
    pub scheme: &'static str,
    pub signature: String,
    /// The credential belongs to the parent of the target organization (may read, not act).
    pub via_parent: bool,
    /// The stamp as received.
    pub raw_stamp: RawStamp,
}

impl Caller {
    /// `body` as this caller stamped it, for the enclave to verify.
    pub fn stamped(&self, body: &[u8]) -> coffer_proto::v1::StampedRequest {
        coffer_proto::v1::StampedRequest {
            body: body.to_vec(),
            stamp_header: self.raw_stamp.header.to_string(),
            stamp: self.raw_stamp.value.clone(),
            certificate: self.credential.certificate().to_vec(),
        }
    }
}

/// Whether the request carries a stamp of any kind (a stamp wins over `X-Session`).
pub fn has_stamp(headers: &HeaderMap) -> bool {
    ["x-stamp", "x-stamp-webauthn", "x-stamp-attested"].iter().any(|h| headers.contains_key(*h))
}

/// The header a read-only session travels in (queries only).
pub const X_SESSION: &str = "X-Session";
/// What a read-only session's caller is, as a credential.
pub const READ_ONLY_SESSION_TYPE: &str = "CREDENTIAL_TYPE_READ_ONLY_SESSION";

/// A read-only session (`X-Session`, from `create_read_only_session`): a JWT the enclave's
/// notarizer signed (checked against its published key), `SESSION_TYPE_READ_ONLY`, unexpired,
/// for `org` (or its parent, which reads its sub-organizations), of a user who still exists,
/// made by a credential (named by id) that still exists with the session's key.
/// Anything else is a 401 `SESSION_INVALID` whose message names the reason (the holder of the
/// token learns only why it no longer reads).
pub async fn read_only_session(
    state: &Arc<AppState>,
    header: &axum::http::HeaderValue,
    org: Organization,
) -> Result<(Organization, Caller), ApiError> {
    let refuse = |why: &str| {
        ApiError::unauthenticated("SESSION_INVALID", format!("invalid or expired read-only session (X-Session): {why}"))
    };
    let token = header.to_str().map_err(|_| refuse("not a JWT"))?.trim().to_string();
    let keys = crate::login_public_keys::login_keys(state).await?;
    if !coffer_auth::session_jwt::verify_issued(&token, &keys.notarizer) {
        return Err(refuse("not signed by the notarizer"));
    }
    let claims: serde_json::Value = token
        .split('.')
        .nth(1)
        .and_then(|c| {
            use base64::Engine;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(c).ok()
        })
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| refuse("unreadable claims"))?;
    let text = |k: &str| claims[k].as_str().unwrap_or_default().to_string();
    let exp = claims["exp"].as_i64().unwrap_or(0);
    if text("session_type") != "SESSION_TYPE_READ_ONLY" {
        return Err(refuse("not a read-only session"));
    }
    if now_nanos() / 1_000_000_000 >= exp {
        return Err(refuse("expired"));
    }
    let (session_org, user_id) = (text("organization_id"), text("user_id"));
    let via_parent = session_org != org.id;
    if via_parent && org.parent_id.as_deref() != Some(session_org.as_str()) {
        return Err(refuse("a session of another organization"));
    }
    let (o, u) = (session_org.clone(), user_id.clone());
    let user = state.db(move |s| s.user(&o, &u)).await?.map_err(|_| refuse("its user no longer exists"))?;
    // The credential that made the session, by id, must still be one of the user's, unexpired,
    // with the session's key: deleting it (or its expiry) ends the read-only sessions it made,
    // and adding the same public key back (a new id) does not revive them.
    let credential_id = text("credential_id");
    if credential_id.is_empty() {
        return Err(refuse("it names no credential id (credential_id): create a new session"));
    }
    let (o, u, pk, cid) = (session_org.clone(), user_id.clone(), text("public_key"), credential_id);
    let live = state
        .db(move |s| -> Result<bool, StoreError> {
            match s.api_key(&o, &cid) {
                Ok(k) => {
                    let expired = k.expiration_seconds.is_some_and(|exp| {
                        now_nanos() >= k.created_at.saturating_add((exp as i64).saturating_mul(1_000_000_000))
                    });
                    Ok(k.user_id == u && k.public_key == pk && !expired)
                }
                Err(StoreError::NotFound) => match s.authenticator(&o, &cid) {
                    Ok(a) => Ok(a.user_id == u && a.public_key == pk),
                    Err(StoreError::NotFound) => Ok(false),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            }
        })
        .await??;
    if !live {
        return Err(refuse("the credential that made it is gone or expired"));
    }
    use sha2::Digest;
    let id = format!("read-only-session:{}", hex::encode(&sha2::Sha256::digest(token.as_bytes())[..8]));
    let credential = Credential::ApiKey(ApiKey {
        id,
        organization_id: session_org,
        user_id,
        name: "read-only session".into(),
        public_key: text("public_key"),
        credential_type: READ_ONLY_SESSION_TYPE.into(),
        expiration_seconds: None,
        created_at: 0,
        updated_at: 0,
        certificate: Vec::new(),
    });
    let caller = Caller {
        user,
        public_key: text("public_key"),
        scheme: "SESSION_READ_ONLY",
        signature: String::new(),
        via_parent,
        raw_stamp: RawStamp { header: X_SESSION, value: token },
        credential,
    };
    Ok((org, caller))
}

/// Reads the stamp and checks it against the raw body: `X-Stamp` is verified outright;
/// `X-Stamp-Webauthn` must be a `webauthn.get` whose challenge is this body's hash. Missing
/// stamp: 401 `SIGNATURE_MISSING`.
pub fn verified_stamp(headers: &HeaderMap, body: &[u8]) -> Result<Stamp, ApiError> {
    if let Some(value) = headers.get("x-stamp") {
        let value =
            value.to_str().map_err(|_| ApiError::unauthenticated("SIGNATURE_INVALID", "malformed activity stamp"))?;
        let stamp = stamp::parse(value)?;
        stamp::verify(&stamp, body)?;
        return Ok(Stamp::ApiKey(stamp, RawStamp { header: X_STAMP, value: value.to_string() }));
    }
    if let Some(value) = headers.get("x-stamp-webauthn") {
        let value = value.to_str().map_err(|_| {
            ApiError::unauthenticated("SIGNATURE_INVALID", "malformed WebAuthn stamp: header is not ASCII")
        })?;
        let raw = RawStamp { header: X_STAMP_WEBAUTHN, value: value.to_string() };
        return Ok(Stamp::Webauthn(webauthn::parse_stamp(value, body)?, raw));
    }
    if let Some(value) = headers.get("x-stamp-attested") {
        let value =
            value.to_str().map_err(|_| ApiError::unauthenticated("SIGNATURE_INVALID", "malformed attested stamp"))?;
        let stamp = attested::parse(value)?;
        attested::verify_signature(&stamp, body)?;
        return Ok(Stamp::Attested(stamp, RawStamp { header: X_STAMP_ATTESTED, value: value.to_string() }));
    }
    Err(ApiError::unauthenticated(
        "SIGNATURE_MISSING",
        "cannot authenticate public API activity request without a stamp (X-Stamp/X-Stamp-Webauthn header)",
    ))
}

/// Looks `find` up in `org`, then in its parent; `Some((found, via_parent))`.
async fn in_org_or_parent<T: Send + 'static>(
    state: &Arc<AppState>,
    org: &Organization,
    find: impl Fn(&dyn crate::store::Store, &str) -> Result<T, StoreError> + Send + 'static,
) -> Result<Option<(T, bool)>, ApiError> {
    let org_id = org.id.clone();
    let parent = org.parent_id.clone();
    Ok(state
        .db(move |s| -> Result<Option<(T, bool)>, StoreError> {
            match find(s, &org_id) {
                Ok(v) => return Ok(Some((v, false))),
                Err(StoreError::NotFound) => {}
                Err(e) => return Err(e),
            }
            if let Some(parent) = &parent {
                match find(s, parent) {
                    Ok(v) => return Ok(Some((v, true))),
                    Err(StoreError::NotFound) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(None)
        })
        .await??)
}

/// Resolves the stamp's credential in `org`, then in its parent, and checks it: curve and
/// expiry for API keys; allowed origin and signature for passkeys.
pub async fn resolve(state: &Arc<AppState>, org: &Organization, stamp: Stamp) -> Result<Caller, ApiError> {
    let (credential, public_key, scheme, signature, via_parent, raw_stamp) = match stamp {
        Stamp::ApiKey(stamp, raw) => {
            let (api_key, via_parent) = resolve_api_key(state, org, &stamp).await?;
            let credential = Credential::ApiKey(api_key);
            (credential, stamp.public_key, stamp.scheme.wire_name(), stamp.signature, via_parent, raw)
        }
        Stamp::Webauthn(stamp, raw) => {
            let (authenticator, via_parent) = resolve_authenticator(state, org, &stamp).await?;
            let public_key = authenticator.public_key.clone();
            let signature = hex::encode(&stamp.signature);
            (Credential::Authenticator(authenticator), public_key, webauthn::SCHEME, signature, via_parent, raw)
        }
        Stamp::Attested(stamp, raw) => {
            let credential = match stamp.attestation {
                attested::Attestation::Oidc => Credential::Attested(resolve_attested(state, org, &stamp).await?),
                attested::Attestation::VerificationToken => {
                    Credential::VerificationToken(resolve_token_login(state, org, &stamp).await?)
                }
            };
            (credential, stamp.public_key, "SIGNATURE_SCHEME_TK_API_P256", stamp.signature, false, raw)
        }
    };
    let key_org = credential.organization_id().to_string();
    let user_id = match &credential {
        Credential::ApiKey(k) => k.user_id.clone(),
        Credential::Authenticator(a) => a.user_id.clone(),
        Credential::Attested(p) => p.user_id.clone(),
        Credential::VerificationToken(t) => t.user_id.clone(),
        Credential::Invitation(_) => return Err(ApiError::internal()),
    };
    let user = state.db(move |s| s.user(&key_org, &user_id)).await?.map_err(|e| match e {
        StoreError::NotFound => {
            ApiError::unauthenticated("PUBLIC_KEY_NOT_FOUND", "the credential's user no longer exists")
        }
        other => other.into(),
    })?;
    Ok(Caller { user, credential, public_key, scheme, signature, via_parent, raw_stamp })
}

/// The OAuth identity an attested stamp's token names, in `org` itself (a login acts for the
/// organization's own user): the token verified, bound to the stamp's key by its nonce.
async fn resolve_attested(
    state: &Arc<AppState>,
    org: &Organization,
    stamp: &attested::AttestedStamp,
) -> Result<OauthProviderRecord, ApiError> {
    let claims = crate::oidc_tokens::verify(crate::oidc_tokens::own_keys(state).await, &stamp.token)
        .await
        .map_err(|e| ApiError::unauthenticated("SIGNATURE_INVALID", format!("attested stamp: {}", e.message)))?;
    attested::check_binding(stamp, &claims)?;
    oauth_identity(state, &org.id, &claims).await?.ok_or_else(|| {
        ApiError::unauthenticated(
            "PUBLIC_KEY_NOT_FOUND",
            "attested stamp: no user of this organization has an oauth provider matching the OIDC token",
        )
    })
}

/// The user a verification token's attested stamp logs in to `org`: the token verified against
/// the published notarizer key, unexpired (spent or not is the enclave's to decide), naming the
/// stamp's key; `org` a sub-organization of the organization that verified it (or that
/// sub-organization itself), never a top-level organization, whose members a code alone must not
/// reach; the user one whose contacts its sign-up gave (`contacts_verified`). The enclave decides
/// all of it again.
async fn resolve_token_login(
    state: &Arc<AppState>,
    org: &Organization,
    stamp: &attested::AttestedStamp,
) -> Result<TokenLogin, ApiError> {
    let keys = crate::oidc_tokens::own_keys(state).await.ok_or_else(|| {
        ApiError::unavailable("enclave unavailable: key operations are temporarily not possible, retry shortly")
    })?;
    let now_ms = now_nanos() / 1_000_000;
    let token = coffer_auth::verification_token::verify(&stamp.token, &keys.notarizer, now_ms).ok_or_else(|| {
        ApiError::unauthenticated(
            "SIGNATURE_INVALID",
            "attested stamp: publicKeyAttestation is not an unexpired verification token of this deployment",
        )
    })?;
    attested::check_token_binding(stamp, &token.public_key)?;
    let serves = org.parent_id.is_some()
        && (token.organization_id == org.id || org.parent_id.as_deref() == Some(token.organization_id.as_str()));
    if !serves {
        let message = match org.parent_id {
            // The token's own organization, with no sub-organization to route to.
            None if token.organization_id == org.id => {
                "attested stamp: no sub-organization of this organization has a user with the verified email or \
                 phone number of the verification token"
            }
            _ => "attested stamp: a verification token logs in only to a sub-organization of the organization that verified it",
        };
        return Err(ApiError::unauthenticated("PUBLIC_KEY_NOT_FOUND", message));
    }
    let org_id = org.id.clone();
    let users = state.db(move |s| s.users(&org_id)).await??;
    let email = token.verification_type == "OTP_TYPE_EMAIL";
    let user = users.into_iter().find(|u| {
        let contact = if email { u.email.as_deref() } else { u.phone_number.as_deref() };
        u.contacts_verified
            && contact.is_some_and(|c| if email { c.eq_ignore_ascii_case(&token.contact) } else { c == token.contact })
    });
    let user = user.ok_or_else(|| {
        ApiError::unauthenticated(
            "PUBLIC_KEY_NOT_FOUND",
            "attested stamp: no user of this organization has the verified email or phone number of the token",
        )
    })?;
    Ok(TokenLogin { organization_id: org.id.clone(), user_id: user.id, token_id: token.id, routed: false })
}

/// Where a verification token's attested stamp for `org` logs in when `org` is the token's own
/// top-level organization: its sub-organization with a user whose verified contact the token
/// names (the oldest, if several). `None`: not such a stamp, or no such sub-organization (then
/// [`resolve`] answers why).
pub async fn token_login_route(
    state: &Arc<AppState>,
    org: &Organization,
    stamp: &attested::AttestedStamp,
) -> Result<Option<Organization>, ApiError> {
    if org.parent_id.is_some() {
        return Ok(None);
    }
    let Some(keys) = crate::oidc_tokens::own_keys(state).await else { return Ok(None) };
    let now_ms = now_nanos() / 1_000_000;
    let Some(token) = coffer_auth::verification_token::verify(&stamp.token, &keys.notarizer, now_ms) else {
        return Ok(None);
    };
    if token.organization_id != org.id {
        return Ok(None);
    }
    let sms = token.verification_type == "OTP_TYPE_SMS";
    let Some(id) = sub_organization_with_verified_contact(state, &org.id, sms, token.contact).await? else {
        return Ok(None);
    };
    match state.db(move |s| s.organization(&id)).await? {
        Ok(sub) => Ok(Some(sub)),
        Err(StoreError::NotFound) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The (oldest) sub-organization of `parent` with a user whose verified phone number (`sms`) or
/// email is `contact`: where a code login for that contact goes.
pub async fn sub_organization_with_verified_contact(
    state: &Arc<AppState>,
    parent: &str,
    sms: bool,
    contact: String,
) -> Result<Option<String>, ApiError> {
    let filter = match sms {
        true => crate::store::SubOrgFilter::VerifiedPhoneNumber(contact),
        false => crate::store::SubOrgFilter::VerifiedEmail(contact),
    };
    let (parent, page) = (parent.to_string(), crate::store::Page { limit: 1, before: None, after: None });
    Ok(state.db(move |s| s.sub_organization_ids(&parent, &filter, &page)).await??.into_iter().next())
}

/// The OAuth provider of `org` whose identity (issuer, subject, audience) a verified token's
/// `claims` name, if a user of `org` has it.
pub async fn oauth_identity(
    state: &Arc<AppState>,
    org: &str,
    claims: &coffer_auth::oidc::Claims,
) -> Result<Option<OauthProviderRecord>, ApiError> {
    let org = org.to_string();
    let providers = state.db(move |s| s.oauth_providers(&org, None)).await??;
    Ok(providers.into_iter().find(|p| p.issuer == claims.iss && p.subject == claims.sub && p.audience == claims.aud))
}

async fn resolve_api_key(
    state: &Arc<AppState>,
    org: &Organization,
    stamp: &stamp::ApiStamp,
) -> Result<(ApiKey, bool), ApiError> {
    let pk = stamp.public_key.clone();
    let found = in_org_or_parent(state, org, move |s, o| s.api_key_by_public_key(o, &pk)).await?;
    let Some((api_key, via_parent)) = found else {
        return Err(ApiError::unauthenticated(
            "PUBLIC_KEY_NOT_FOUND",
            format!(
                "could not find public key in organization or its parent organization organizationId={} publicKey={}",
                org.id, stamp.public_key
            ),
        ));
    };
    check_api_key(stamp, &api_key)?;
    Ok((api_key, via_parent))
}

/// Whether the found `api_key` may have made `stamp`: its type signs with the stamp's scheme and
/// it has not expired.
fn check_api_key(stamp: &stamp::ApiStamp, api_key: &ApiKey) -> Result<(), ApiError> {
    if !stamp.scheme.signs_for(&api_key.credential_type) {
        return Err(ApiError::unauthenticated(
            "SIGNATURE_INVALID",
            format!(
                "stamp scheme {} does not match the api key's type {}",
                stamp.scheme.wire_name(),
                api_key.credential_type
            ),
        ));
    }
    if let Some(exp) = api_key.expiration_seconds {
        let expires_at = api_key.created_at.saturating_add((exp as i64).saturating_mul(1_000_000_000));
        if now_nanos() >= expires_at {
            let what = if stamp::SESSION_CREDENTIAL_TYPES.contains(&api_key.credential_type.as_str()) {
                "expired session"
            } else {
                "expired api key"
            };
            return Err(ApiError::unauthenticated("API_KEY_EXPIRED", what));
        }
    }
    Ok(())
}

/// An invitation's acceptance stamp: an `X-Stamp` (verified when read) by the API key the body
/// brings (`apiKey.publicKey`).
pub fn acceptance_stamp(stamp: Stamp, params: &serde_json::Value) -> Result<(stamp::ApiStamp, RawStamp), ApiError> {
    let Stamp::ApiKey(stamp, raw_stamp) = stamp else {
        return Err(ApiError::unauthenticated(
            "SIGNATURE_INVALID",
            "an invitation's acceptance is stamped (X-Stamp) by the API key it brings",
        ));
    };
    let brought = params.get("apiKey").map(|k| coffer_auth::envelope::text(k, "publicKey").trim().to_ascii_lowercase());
    if brought.as_deref() != Some(stamp.public_key.as_str()) {
        return Err(ApiError::unauthenticated(
            "PUBLIC_KEY_NOT_FOUND",
            "an invitation's acceptance is stamped by the API key it brings (apiKey.publicKey)",
        ));
    }
    Ok((stamp, raw_stamp))
}

/// The caller of an invitation's acceptance (`accept_invitation`, its [`acceptance_stamp`]), for
/// an invitation of `org` that is open here, acting as the user the acceptance makes
/// (`create_users`' id for the body). The enclave checks the invitation's code and decides.
pub async fn invitation_caller(
    state: &Arc<AppState>,
    org: &Organization,
    (stamp, raw_stamp): (stamp::ApiStamp, RawStamp),
    params: &serde_json::Value,
    fingerprint: &str,
) -> Result<Caller, ApiError> {
    let invitation_id = coffer_auth::envelope::text(params, "invitationId").trim().to_string();
    let invitation = crate::open_invitations::open_invitation(state, &org.id, &invitation_id).await?;
    let now = now_nanos();
    let user = User {
        id: coffer_auth::envelope::derived_id(fingerprint, coffer_auth::envelope::USER_ID, 0),
        organization_id: org.id.clone(),
        name: invitation.receiver_user_name,
        email: Some(invitation.receiver_email),
        phone_number: None,
        contacts_verified: false,
        created_at: now,
        updated_at: now,
    };
    Ok(Caller {
        user,
        credential: Credential::Invitation(InvitationAcceptance { organization_id: org.id.clone(), invitation_id }),
        public_key: stamp.public_key,
        scheme: stamp.scheme.wire_name(),
        signature: stamp.signature,
        via_parent: false,
        raw_stamp,
    })
}

/// The caller of an API-key stamp whose key and user were read together
/// ([`crate::store::Store::stamp_context`]), checked as [`resolve`] checks them.
pub fn api_key_caller(
    stamp: stamp::ApiStamp,
    raw_stamp: RawStamp,
    api_key: ApiKey,
    user: User,
    via_parent: bool,
) -> Result<Caller, ApiError> {
    check_api_key(&stamp, &api_key)?;
    Ok(Caller {
        user,
        credential: Credential::ApiKey(api_key),
        public_key: stamp.public_key,
        scheme: stamp.scheme.wire_name(),
        signature: stamp.signature,
        via_parent,
        raw_stamp,
    })
}

/// The `FEATURE_NAME_WEBAUTHN_ORIGINS` value of `org`, or of its parent when `org` has none.
pub async fn webauthn_origins(state: &Arc<AppState>, org: &Organization) -> Result<Option<String>, ApiError> {
    let found = in_org_or_parent(state, org, |s, o| s.record(o, "feature", webauthn::ORIGINS_FEATURE)).await?;
    Ok(found.and_then(|(r, _)| r.data.get("value").and_then(|v| v.as_str()).map(str::to_string)))
}

async fn resolve_authenticator(
    state: &Arc<AppState>,
    org: &Organization,
    stamp: &webauthn::WebauthnStamp,
) -> Result<(AuthenticatorRecord, bool), ApiError> {
    let cred = stamp.credential_id.clone();
    let found = in_org_or_parent(state, org, move |s, o| s.authenticator_by_credential_id(o, &cred)).await?;
    let Some((authenticator, via_parent)) = found else {
        return Err(ApiError::unauthenticated(
            "CREDENTIAL_NOT_FOUND",
            "credential ID could not be found in organization or its parent organization",
        ));
    };
    let origins = webauthn_origins(state, org).await?;
    if !webauthn::origin_allowed(origins.as_deref(), &stamp.origin) {
        return Err(ApiError::unauthenticated(
            "UNAUTHENTICATED",
            format!(
                "WebAuthn origin {:?} is not allowed for this organization ({})",
                stamp.origin,
                webauthn::ORIGINS_FEATURE
            ),
        ));
    }
    webauthn::verify_assertion(stamp, &authenticator.public_key)?;
    Ok((authenticator, via_parent))
}
