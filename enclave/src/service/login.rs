//! Login: the login keys, OAuth 2.0 credentials and the code exchange, sessions, and the auth
//! proxy's key.

use std::sync::Arc;

use coffer_auth::envelope::text;
use coffer_crypto::CryptoError;
use coffer_proto::v1 as pb;
use tonic::{Response, Status};
use zeroize::Zeroizing;

use super::worker::{run_blocking, status};
use crate::admission::{audit_early_refusal, refuse, Admission, Admitted, AttestedIdentity};
use crate::audit;
use crate::config::LoginSettings;
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::{Hsm, LoginKey};
use crate::{oauth2_exchange, proxy_stamper, sessions};

/// Activity types, as the stamped bodies name them.
mod types {
    pub const CREATE_OAUTH2_CREDENTIAL: &str = "ACTIVITY_TYPE_CREATE_OAUTH2_CREDENTIAL";
    pub const UPDATE_OAUTH2_CREDENTIAL: &str = "ACTIVITY_TYPE_UPDATE_OAUTH2_CREDENTIAL";
    pub const OAUTH2_AUTHENTICATE: &str = "ACTIVITY_TYPE_OAUTH2_AUTHENTICATE";
}

/// The login keys' public halves, the OIDC key id and the configured issuer.
pub(super) fn login_keys(hsm: &Hsm, settings: &LoginSettings) -> Result<pb::GetLoginKeysResponse, EnclaveError> {
    let keys = hsm.login_public_keys()?;
    Ok(pb::GetLoginKeysResponse {
        notarizer_public_key: keys.notarizer.to_vec(),
        oidc_issuer_public_key: keys.oidc_issuer.to_vec(),
        oidc_key_id: oauth2_exchange::oidc_key_id(&keys.oidc_issuer),
        tls_fetcher_public_key: keys.tls_fetcher.to_vec(),
        oidc_issuer: settings.oidc_issuer.clone().unwrap_or_default(),
    })
}

/// Certifies an OAuth 2.0 credential the stamped body creates or updates; its client secret must
/// open now.
pub(super) fn certify_oauth2_credential(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::CertifyOauth2CredentialRequest,
) -> Result<pb::Oauth2Credential, EnclaveError> {
    let a = admission.authorize(
        "certify_oauth2_credential",
        req.auth.as_ref(),
        &[types::CREATE_OAUTH2_CREDENTIAL, types::UPDATE_OAUTH2_CREDENTIAL],
    )?;
    let p = &a.activity.parameters;
    let credential_id = if a.activity.activity_type == types::CREATE_OAUTH2_CREDENTIAL {
        req.credential_id.clone()
    } else {
        text(p, "oauth2CredentialId").to_string()
    };
    if credential_id.is_empty() || credential_id != req.credential_id {
        return Err(refuse(
            &a,
            RefusalReason::BindingMismatch,
            "the credential id is not the one the stamped body names",
        ));
    }
    // Update: the stored credential (certified, of this organization and id) gives the
    // fields the body leaves out.
    let current = match &req.current {
        Some(c) if a.activity.activity_type == types::UPDATE_OAUTH2_CREDENTIAL => {
            admission.check_oauth2(&a, c, &credential_id)?;
            Some(c)
        }
        _ => None,
    };
    let field = |k: &str, old: Option<&String>| -> Result<String, EnclaveError> {
        match (text(p, k), old) {
            ("", Some(old)) => Ok(old.clone()),
            ("", None) => Err(EnclaveError::invalid(format!("{k} is required"))),
            (v, _) => Ok(v.to_string()),
        }
    };
    let provider = field("provider", current.map(|c| &c.provider))?;
    oauth2_exchange::check_provider(&provider)?;
    let client_id = field("clientId", current.map(|c| &c.client_id))?;
    let encrypted_client_secret = field("encryptedClientSecret", current.map(|c| &c.encrypted_client_secret))?;
    // It must open now; the plaintext is dropped (zeroized) at once.
    drop(open_client_secret(hsm, &encrypted_client_secret)?);
    tracing::info!(
        target: "coffer_audit",
        decision = "allow",
        operation = "certify_oauth2_credential",
        organization = %a.activity.organization_id,
        fingerprint = %a.activity.fingerprint,
        "enclave decision"
    );
    admission.certify_oauth2(pb::Oauth2Credential {
        organization_id: a.activity.organization_id.clone(),
        credential_id,
        provider,
        client_id,
        encrypted_client_secret,
        mac: vec![],
    })
}

/// The OAuth 2.0 code exchange the stamped body asks for, answered with an OIDC token Coffer signs.
pub(super) async fn oauth2_authenticate(
    hsm: Arc<Hsm>,
    admission: Arc<Admission>,
    settings: Arc<LoginSettings>,
    req: pb::Oauth2AuthenticateRequest,
) -> Result<Response<pb::Oauth2AuthenticateResponse>, Status> {
    let Some(issuer) = settings.oidc_issuer.clone() else {
        return Err(EnclaveError::invalid(
            "oauth2_authenticate needs the enclave's oidc_issuer setting (COFFER_OIDC_ISSUER)",
        )
        .into());
    };
    // Authorize and open the secret in the HSM; only then is the provider called. The decision's
    // outcome is written when the whole call ends.
    let h = hsm.clone();
    let authorized = run_blocking(move || {
        let a = admission.authorize("oauth2_authenticate", req.auth.as_ref(), &[types::OAUTH2_AUTHENTICATE])?;
        // Past its allow, how it ends is recorded: the log links it so.
        let outcome_log = a.outcome_recorder();
        let opened = (|| {
            let credential = req.credential.ok_or_else(|| EnclaveError::invalid("missing OAuth 2.0 credential"))?;
            admission.check_oauth2(&a, &credential, text(&a.activity.parameters, "oauth2CredentialId"))?;
            let secret = open_client_secret(&h, &credential.encrypted_client_secret)?;
            Ok((credential, secret))
        })();
        let (credential, secret) = opened.inspect_err(|e| outcome_log.failed(e))?;
        Ok((a, credential, secret, audit::carry(), outcome_log))
    })
    .await;
    let (a, credential, secret, outcome, outcome_log) = match authorized {
        Ok(v) => v,
        Err(e) => return Err(status(e)),
    };
    let result = outcome_log.close(exchange_and_sign(hsm, &settings, issuer, a, credential, secret).await);
    outcome.close(result.as_ref().map(|_| ()));
    result.map(Response::new).map_err(status)
}

/// The authorized part of [`oauth2_authenticate`]: the exchange at the provider, then the token.
async fn exchange_and_sign(
    hsm: Arc<Hsm>,
    settings: &LoginSettings,
    issuer: String,
    a: Admitted,
    credential: pb::Oauth2Credential,
    secret: Zeroizing<String>,
) -> Result<pb::Oauth2AuthenticateResponse, EnclaveError> {
    let p = a.activity.parameters.clone();
    for k in ["authCode", "redirectUri", "codeVerifier", "nonce"] {
        if text(&p, k).is_empty() {
            return Err(EnclaveError::invalid(format!("{k} is required")));
        }
    }
    let user = oauth2_exchange::exchange(
        settings,
        &oauth2_exchange::CodeExchange {
            provider: &credential.provider,
            client_id: &credential.client_id,
            client_secret: &secret,
            auth_code: text(&p, "authCode"),
            redirect_uri: text(&p, "redirectUri"),
            code_verifier: text(&p, "codeVerifier"),
        },
    )
    .await?;
    drop(secret);
    run_blocking(move || {
        let target = text(&p, "bearerTokenTargetPublicKey");
        let encrypted_bearer_token = if target.is_empty() {
            None
        } else {
            let seed = hsm.random_seed()?;
            Some(coffer_crypto::session::sealed_to_target(&seed, target, user.bearer_token.as_bytes())?)
        };
        let claims = oauth2_exchange::oidc_claims(
            &issuer,
            &credential.client_id,
            text(&p, "nonce"),
            &user,
            now_secs(),
            encrypted_bearer_token,
        );
        let kid = oauth2_exchange::oidc_key_id(&hsm.login_public_keys()?.oidc_issuer);
        let oidc_token =
            oauth2_exchange::es256_jwt(
                &kid,
                &claims,
                |digest| Ok(hsm.sign_digest_with(LoginKey::OidcIssuer, digest)?),
            )?;
        tracing::info!(
            target: "coffer_audit",
            decision = "allow",
            operation = "oauth2_authenticate",
            organization = %a.activity.organization_id,
            fingerprint = %a.activity.fingerprint,
            "enclave decision"
        );
        Ok(pb::Oauth2AuthenticateResponse { oidc_token, evaluation: a.evaluation() })
    })
    .await
}

/// A session for the user a login activity names: its key's certificate and its JWT.
///
/// Nothing is fetched before the call's stamp and credential are verified and every local check
/// passed: an attested stamp's OIDC token is first only read (the authority checks the stamp,
/// the certified identity and the key binding against its claims), and a token's issuer must be
/// Coffer's own or allowlisted before its keys are fetched (`sessions::before_fetch`).
pub(super) async fn create_session(
    hsm: Arc<Hsm>,
    admission: Arc<Admission>,
    settings: Arc<LoginSettings>,
    otp: Arc<super::otp::OtpService>,
    req: pb::CreateSessionRequest,
) -> Result<Response<pb::CreateSessionResponse>, Status> {
    let req = Arc::new(req);
    let attested = req
        .auth
        .as_ref()
        .and_then(|a| a.request.as_ref())
        .filter(|r| r.stamp_header.eq_ignore_ascii_case(coffer_auth::attested::HEADER))
        .map(|r| coffer_auth::attested::parse(&r.stamp));
    let early = |e: EnclaveError| status(audit_early_refusal("create_session", e));
    let attested = match attested {
        None => None,
        Some(Err(e)) => return Err(early(EnclaveError::refused(RefusalReason::StampInvalid, e.message))),
        Some(Ok(stamp)) if stamp.attestation == coffer_auth::attested::Attestation::VerificationToken => {
            Some(Attested::Token(stamp))
        }
        Some(Ok(stamp)) => match sessions::read_token(&stamp.token) {
            Ok(claims) => Some(Attested::Oidc(sessions::PendingToken { token: stamp.token, claims })),
            Err(e) => {
                return Err(early(EnclaveError::refused(
                    RefusalReason::IdentityInvalid,
                    format!("attested stamp: {e}"),
                )))
            }
        },
    };
    let (h, au, st, r) = (hsm.clone(), admission.clone(), settings.clone(), req.clone());
    let authorized = run_blocking(move || {
        let parent = (!r.parent_certificate.is_empty()).then_some(r.parent_certificate.as_slice());
        let (identity, pending) = match attested {
            None => (None, None),
            Some(Attested::Oidc(p)) => (Some(AttestedIdentity::Oidc(p.claims.clone())), Some(p)),
            Some(Attested::Token(stamp)) => (
                Some(
                    super::otp::token_login_identity(&h, &au, &r, &stamp)
                        .map_err(|e| audit_early_refusal("create_session", e))?,
                ),
                None,
            ),
        };
        let a =
            au.authorize_for("create_session", r.auth.as_ref(), sessions::LOGIN_TYPES, parent, identity.as_ref())?;
        // Past its allow, how it ends is recorded: the log links it so.
        let outcome_log = a.outcome_recorder();
        let tokens = sessions::before_fetch(&h, &st, &a, pending, &r.provider_certificate)
            .inspect_err(|e| outcome_log.failed(e))?;
        let verification = match identity {
            Some(AttestedIdentity::VerificationToken { token, .. }) => Some(token),
            _ => None,
        };
        Ok((a, tokens, verification, audit::carry(), outcome_log))
    })
    .await;
    let (a, tokens, verification, outcome, outcome_log) = match authorized {
        Ok(v) => v,
        Err(e) => return Err(status(e)),
    };
    let result = outcome_log.close(verify_and_open(hsm, admission, &settings, otp, req, a, tokens, verification).await);
    outcome.close(result.as_ref().map(|_| ()));
    result.map(Response::new).map_err(status)
}

/// What attests an attested stamp's key.
enum Attested {
    Oidc(sessions::PendingToken),
    Token(coffer_auth::attested::AttestedStamp),
}

/// The authorized part of [`create_session`]: the tokens verified (fetching an allowlisted
/// issuer's keys if need be), then the session opened; a verification token that attested the
/// stamp is spent first.
#[allow(clippy::too_many_arguments)]
async fn verify_and_open(
    hsm: Arc<Hsm>,
    admission: Arc<Admission>,
    settings: &LoginSettings,
    otp: Arc<super::otp::OtpService>,
    req: Arc<pb::CreateSessionRequest>,
    a: Admitted,
    tokens: Vec<sessions::PendingToken>,
    verification: Option<coffer_auth::verification_token::VerifiedToken>,
) -> Result<pb::CreateSessionResponse, EnclaveError> {
    let seconds = sessions::session_seconds(&a.activity.parameters, settings.max_session_seconds)?;
    // A session profile the login names: its organization's (or its parent's), whose lifetime
    // caps the session's and whose name and scope its JWT carries.
    let profile = sessions::named_profile(&admission, &a)?;
    let seconds = profile.as_ref().and_then(|(_, p)| p.expiration_seconds).map_or(seconds, |max| seconds.min(max));
    let mut verified = Vec::with_capacity(tokens.len());
    for t in &tokens {
        verified.push(sessions::verify_pending(&hsm, settings, &a, t).await?);
    }
    // The oauth_login token comes first (`before_fetch`); its nonce binds the session key.
    let identity = if sessions::by_oidc_token(&a.activity.activity_type) {
        let claims = verified
            .into_iter()
            .next()
            .ok_or_else(|| EnclaveError::Internal("oauth_login without its token".into()))?;
        if let Err(e) = sessions::check_nonce(&a.activity.activity_type, &a.activity.parameters, &claims) {
            refuse(&a, RefusalReason::IdentityInvalid, &e.to_string());
            return Err(e);
        }
        Some(claims)
    } else {
        None
    };
    let by_email =
        [sessions::EMAIL_AUTH, sessions::INIT_USER_EMAIL_RECOVERY].contains(&a.activity.activity_type.as_str());
    if a.activity.activity_type == sessions::CREATE_READ_ONLY_SESSION {
        return run_blocking(move || sessions::read_only_session(&hsm, &admission, &a, seconds)).await;
    }
    let o = otp.clone();
    let (mut session, message) = run_blocking(move || {
        let g = match coffer_org_rules::subjects::current_version(&a.activity.activity_type) {
            sessions::OTP_LOGIN => super::otp::login_grant(&hsm, &admission, &a)?,
            sessions::OTP_AUTH => super::otp::otp_auth_grant(&hsm, &admission, &o, &a, &req.sealed_otp)?,
            t if [sessions::EMAIL_AUTH, sessions::INIT_USER_EMAIL_RECOVERY].contains(&t) => {
                super::otp::email_grant(&hsm, &admission, &o, &a)?
            }
            _ => {
                let mut g = sessions::grant(&hsm, &admission, &a, identity.as_ref(), &req.provider_certificate)?;
                // A verification token's login: once, and a session of the code's kind.
                if let Some(token) = &verification {
                    let usage = crate::verification_token::Usage::Login;
                    if !crate::verification_token::spend(&admission, token, usage, crate::admission::now_ms())? {
                        return Err(refuse(&a, RefusalReason::OtpInvalid, crate::verification_token::OTP_INVALID));
                    }
                    g.credential_type = "CREDENTIAL_TYPE_OTP_AUTH_KEY_P256";
                }
                g
            }
        };
        let session = sessions::open_session(&hsm, &admission, &a, g, seconds, profile.as_ref())?;
        let message = match by_email {
            true => {
                let m = super::otp::email_bundle(&admission, &o, &a, &session.credential_bundle)?;
                let event = crate::mail::event_of(&m, &a.activity.organization_id, crate::mail::SENT);
                Some((m, event))
            }
            false => None,
        };
        Ok((session, message))
    })
    .await?;
    // The credential of email_auth and recovery reaches only the inbox: nothing of it is answered
    // but its public half and certificate.
    if let Some((m, event)) = message {
        session.credential_bundle.clear();
        session.session.clear();
        otp.mailer.send(m).await?;
        session.email_events.push(event);
    }
    Ok(session)
}
/// The auth proxy's key, made and sealed for the stamped `enable_auth_proxy`.
pub(super) fn enable_auth_proxy(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::EnableAuthProxyRequest,
) -> Result<pb::EnableAuthProxyResponse, EnclaveError> {
    let a = admission.authorize("enable_auth_proxy", req.auth.as_ref(), &[proxy_stamper::ENABLE_AUTH_PROXY])?;
    proxy_stamper::enable(hsm, admission, &a)
}

/// The auth proxy key's stamp of a login activity it submits.
pub(super) fn stamp_auth_proxy_request(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::StampAuthProxyRequestRequest,
) -> Result<pb::StampAuthProxyRequestResponse, EnclaveError> {
    let stamp = proxy_stamper::stamp(hsm, admission, &req)?;
    Ok(pb::StampAuthProxyRequestResponse { stamp })
}

/// Opens an OAuth 2.0 client secret (`encryptedClientSecret`, a QOS envelope to the TLS-fetcher
/// key) with ECDH in the HSM. The plaintext never leaves the enclave.
fn open_client_secret(hsm: &Hsm, encrypted: &str) -> Result<Zeroizing<String>, EnclaveError> {
    let envelope = coffer_crypto::qos::decode_encrypted_client_secret(encrypted)
        .map_err(|_| EnclaveError::invalid("invalid encryptedClientSecret: not an encrypted client secret"))?;
    let receiver = hsm.login_public_keys()?.tls_fetcher;
    let plain = coffer_crypto::qos::open_quorum_envelope(&envelope, &receiver, |sender| {
        hsm.tls_fetcher_ecdh(sender).map_err(|e| CryptoError::Internal(e.to_string()))
    })
    .map_err(|_| {
        EnclaveError::invalid("invalid encryptedClientSecret: it does not decrypt with Coffer's TLS-fetcher key")
    })?;
    let secret = String::from_utf8(plain.to_vec())
        .map_err(|_| EnclaveError::invalid("invalid encryptedClientSecret: the secret is not UTF-8 text"))?;
    if secret.is_empty() {
        return Err(EnclaveError::invalid("invalid encryptedClientSecret: the secret is empty"));
    }
    Ok(Zeroizing::new(secret))
}

fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}
