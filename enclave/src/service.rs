//! The enclave's gRPC service: every key-using call is authorized by the stamped request it
//! carries, takes its parameters from that body, opens what it needs through the HSM and drops it.

use std::sync::Arc;

use coffer_auth::envelope::{derived_id, items, text, SUB_ORGANIZATION_ID};
use coffer_auth::grants::{self, granted_credentials};
use coffer_crypto::bundle::{self, EnvelopeSigner};
use coffer_crypto::keys::SecretKey;
use coffer_crypto::{address, keys, sign, CryptoError, Curve};
use coffer_proto::v1 as pb;
use coffer_proto::v1::enclave_server::Enclave;
use serde_json::Value;
use tonic::{Request, Response, Status};
use zeroize::Zeroizing;

use crate::authority::{refuse, Authority, Authorized, BOOTSTRAP};
use crate::config::LoginSettings;
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::LoginKey;
use crate::hsm::{BlobBinding, BlobKind, Hsm};
use crate::{login, sessions};

/// Activity types, as the stamped bodies name them.
mod types {
    pub const CREATE_WALLET: &str = "ACTIVITY_TYPE_CREATE_WALLET";
    pub const CREATE_WALLET_ACCOUNTS: &str = "ACTIVITY_TYPE_CREATE_WALLET_ACCOUNTS";
    pub const CREATE_PRIVATE_KEYS: &str = "ACTIVITY_TYPE_CREATE_PRIVATE_KEYS_V2";
    pub const SIGN_RAW_PAYLOAD: &str = "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2";
    pub const SIGN_RAW_PAYLOADS: &str = "ACTIVITY_TYPE_SIGN_RAW_PAYLOADS";
    pub const SIGN_TRANSACTION: &str = "ACTIVITY_TYPE_SIGN_TRANSACTION_V2";
    pub const EXPORT_WALLET: &str = "ACTIVITY_TYPE_EXPORT_WALLET";
    pub const EXPORT_PRIVATE_KEY: &str = "ACTIVITY_TYPE_EXPORT_PRIVATE_KEY";
    pub const EXPORT_WALLET_ACCOUNT: &str = "ACTIVITY_TYPE_EXPORT_WALLET_ACCOUNT";
    pub const INIT_IMPORT_WALLET: &str = "ACTIVITY_TYPE_INIT_IMPORT_WALLET";
    pub const INIT_IMPORT_PRIVATE_KEY: &str = "ACTIVITY_TYPE_INIT_IMPORT_PRIVATE_KEY";
    pub const IMPORT_WALLET: &str = "ACTIVITY_TYPE_IMPORT_WALLET";
    pub const IMPORT_PRIVATE_KEY: &str = "ACTIVITY_TYPE_IMPORT_PRIVATE_KEY";
    pub const CREATE_OAUTH2_CREDENTIAL: &str = "ACTIVITY_TYPE_CREATE_OAUTH2_CREDENTIAL";
    pub const UPDATE_OAUTH2_CREDENTIAL: &str = "ACTIVITY_TYPE_UPDATE_OAUTH2_CREDENTIAL";
    pub const OAUTH2_AUTHENTICATE: &str = "ACTIVITY_TYPE_OAUTH2_AUTHENTICATE";
}

/// The gRPC service over one logged-in HSM.
#[derive(Clone)]
pub struct EnclaveService {
    hsm: Arc<Hsm>,
    authority: Arc<Authority>,
    login: Arc<LoginSettings>,
}

impl EnclaveService {
    pub fn new(hsm: Arc<Hsm>, authority: Arc<Authority>, login: Arc<LoginSettings>) -> Self {
        Self { hsm, authority, login }
    }
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

/// Most webhook deliveries signed in one call.
const MAX_WEBHOOK_BATCH: usize = 256;

/// The webhook key's id: stable for a key, `coffer-webhook-` + 16 hex digits of its SHA-256.
fn webhook_key_id(public_key: &[u8; 32]) -> String {
    use sha2::Digest;
    format!("coffer-webhook-{}", hex::encode(&sha2::Sha256::digest(public_key)[..8]))
}

/// Runs blocking HSM and crypto work off the async executor.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, EnclaveError> + Send + 'static,
) -> Result<Response<T>, Status> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(Response::new(v)),
        Ok(Err(e)) => {
            if matches!(e, EnclaveError::Hsm(_) | EnclaveError::Internal(_)) {
                tracing::error!(error = %e, "enclave call failed");
            }
            Err(e.into())
        }
        Err(_) => Err(Status::internal("enclave worker panicked")),
    }
}

/// The HSM bundle signer seen through the crypto crate's envelope interface.
struct HsmSigner<'a> {
    hsm: &'a Hsm,
    public: [u8; 65],
}

impl<'a> HsmSigner<'a> {
    fn new(hsm: &'a Hsm) -> Result<Self, EnclaveError> {
        Ok(Self { hsm, public: hsm.signer_public_key()? })
    }
}

impl EnvelopeSigner for HsmSigner<'_> {
    fn public_key(&self) -> [u8; 65] {
        self.public
    }
    fn sign(&self, data: &[u8]) -> Result<Vec<u8>, CryptoError> {
        self.hsm.sign_with_bundle_signer(data).map_err(|e| CryptoError::Internal(e.to_string()))
    }
}

fn kind_of(kind: i32) -> Result<BlobKind, EnclaveError> {
    match pb::BlobKind::try_from(kind) {
        Ok(pb::BlobKind::WalletSeed) => Ok(BlobKind::WalletSeed),
        Ok(pb::BlobKind::WalletAccountKey) => Ok(BlobKind::WalletAccountKey),
        Ok(pb::BlobKind::PrivateKey) => Ok(BlobKind::PrivateKey),
        Ok(pb::BlobKind::ImportTarget) => Ok(BlobKind::ImportTarget),
        _ => Err(EnclaveError::invalid("unknown sealed blob kind")),
    }
}

/// A sealed blob the stamped body may use: of an expected kind and in the body's organization.
/// What it is bound to (resource, curve, address) is authenticated when it opens.
fn sealed<'a>(
    sealed: Option<&'a pb::SealedRef>,
    expect: &[BlobKind],
    a: &Authorized,
) -> Result<(&'a pb::SealedRef, BlobKind), EnclaveError> {
    let sealed = sealed.ok_or_else(|| EnclaveError::invalid("missing sealed reference"))?;
    let kind = kind_of(sealed.kind)?;
    if !expect.contains(&kind) {
        return Err(EnclaveError::invalid("sealed blob of the wrong kind"));
    }
    if sealed.organization_id != a.activity.organization_id {
        return Err(refuse(
            a,
            RefusalReason::BindingMismatch,
            "the sealed key belongs to another organization than the stamped body",
        ));
    }
    Ok((sealed, kind))
}

fn open(hsm: &Hsm, sealed: &pb::SealedRef, kind: BlobKind) -> Result<Zeroizing<Vec<u8>>, EnclaveError> {
    let binding = BlobBinding {
        kind,
        organization_id: &sealed.organization_id,
        resource_id: &sealed.resource_id,
        curve: &sealed.curve,
        address: &sealed.address,
        public_key: &sealed.public_key,
    };
    Ok(hsm.unseal(&binding, &sealed.blob)?)
}

/// Opens a signing key; its curve is the one the blob is bound to. A legacy blob binds no curve
/// or address, so the key it holds must match the public key or address it is presented with.
fn open_key(hsm: &Hsm, sealed: &pb::SealedRef, kind: BlobKind) -> Result<SecretKey, EnclaveError> {
    let curve = Curve::parse(&sealed.curve)?;
    let plain = open(hsm, sealed, kind)?;
    let key = SecretKey::from_slice(curve, &plain)
        .map_err(|_| EnclaveError::Internal("sealed key is not 32 bytes".into()))?;
    if crate::hsm::is_legacy(&sealed.blob) {
        let public_key = key.public_key()?;
        let matches = match kind {
            BlobKind::PrivateKey => hex::encode(&public_key) == sealed.public_key,
            _ => address::address(&sealed.address_format, curve, &public_key).is_ok_and(|a| a == sealed.address),
        };
        if !matches {
            return Err(EnclaveError::SealAuthentication);
        }
    }
    Ok(key)
}

/// `WalletAccountParams` of a stamped body, paired with the ids the gateway chose for them.
fn account_specs<'a>(accounts: &'a [Value], ids: &'a [String]) -> Result<Vec<(&'a str, &'a Value)>, EnclaveError> {
    if accounts.len() != ids.len() {
        return Err(EnclaveError::invalid("one account id is needed per account of the stamped body"));
    }
    Ok(ids.iter().map(String::as_str).zip(accounts).collect())
}

/// Derives, addresses and seals each account from one BIP-39 seed; each key is bound to its
/// account id, curve and address.
fn derive_accounts(
    hsm: &Hsm,
    organization_id: &str,
    seed: &[u8],
    specs: &[(&str, &Value)],
) -> Result<Vec<pb::Account>, EnclaveError> {
    specs
        .iter()
        .map(|(account_id, spec)| {
            if text(spec, "pathFormat") != "PATH_FORMAT_BIP32" {
                return Err(EnclaveError::invalid("invalid path format (only PATH_FORMAT_BIP32)"));
            }
            let curve = Curve::parse(text(spec, "curve"))?;
            let secret = keys::derive(seed, curve, text(spec, "path"))?;
            let public_key = keys::public_key(curve, &secret)?;
            let address = address::address(text(spec, "addressFormat"), curve, &public_key)?;
            let binding = BlobBinding {
                curve: curve.wire_name(),
                address: &address,
                ..BlobBinding::plain(BlobKind::WalletAccountKey, organization_id, account_id)
            };
            let sealed_key = hsm.seal(&binding, secret.as_slice())?;
            Ok(pb::Account { account_id: account_id.to_string(), public_key, address, sealed_key })
        })
        .collect()
}

fn addresses_for(curve: Curve, public_key: &[u8], formats: &[Value]) -> Result<Vec<pb::Address>, EnclaveError> {
    formats
        .iter()
        .map(|f| {
            let f = f.as_str().ok_or_else(|| EnclaveError::invalid("addressFormats must be strings"))?;
            Ok(pb::Address { format: f.to_string(), address: address::address(f, curve, public_key)? })
        })
        .collect()
}

/// Seals a standalone private key bound to its id, curve and public key, with its addresses.
fn seal_private_key(
    hsm: &Hsm,
    organization_id: &str,
    private_key_id: &str,
    key: &SecretKey,
    formats: &[Value],
) -> Result<pb::KeyMaterial, EnclaveError> {
    let public_key = key.public_key()?;
    let addresses = addresses_for(key.curve(), &public_key, formats)?;
    let public_hex = hex::encode(&public_key);
    let binding = BlobBinding {
        curve: key.curve().wire_name(),
        public_key: &public_hex,
        ..BlobBinding::plain(BlobKind::PrivateKey, organization_id, private_key_id)
    };
    let sealed_key = hsm.seal(&binding, key.secret_bytes())?;
    Ok(pb::KeyMaterial { public_key, addresses, sealed_key })
}

/// A wallet from its mnemonic: the requested accounts, and the phrase sealed to the wallet.
fn seal_wallet(
    hsm: &Hsm,
    organization_id: &str,
    wallet_id: &str,
    phrase: &str,
    specs: &[(&str, &Value)],
) -> Result<pb::CreateWalletResponse, EnclaveError> {
    let seed = keys::seed_from_phrase(phrase)?;
    let accounts = derive_accounts(hsm, organization_id, seed.as_slice(), specs)?;
    let binding = BlobBinding::plain(BlobKind::WalletSeed, organization_id, wallet_id);
    let sealed_seed = hsm.seal(&binding, phrase.as_bytes())?;
    Ok(pb::CreateWalletResponse { sealed_seed, accounts })
}

/// Checks a mnemonic and returns the phrase to keep: normalized whitespace, as given.
fn checked_phrase(plain: &[u8]) -> Result<Zeroizing<String>, EnclaveError> {
    let text = std::str::from_utf8(plain).map_err(|_| EnclaveError::invalid("invalid mnemonic"))?;
    let phrase = Zeroizing::new(text.split_whitespace().collect::<Vec<_>>().join(" "));
    keys::entropy_from_phrase(&phrase)?;
    Ok(phrase)
}

/// A positive count from a body (`mnemonicLength`: a JSON number or decimal string).
fn count(v: Option<&Value>) -> Option<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Exports `secret` to the target key the stamped body names.
fn export(hsm: &Hsm, a: &Authorized, secret: &[u8]) -> Result<pb::ExportResponse, EnclaveError> {
    let signer = HsmSigner::new(hsm)?;
    let seed = hsm.random_seed()?;
    let target = text(&a.activity.parameters, "targetPublicKey");
    let export_bundle = bundle::export_bundle(&signer, &seed, target, &a.activity.organization_id, secret)?;
    Ok(pb::ExportResponse { export_bundle })
}

/// `signWith` of the body names this key: an account by its address, a private key by its id or
/// by one of its addresses (recomputed here from the bound public key).
fn names_key(a: &Authorized, sealed: &pb::SealedRef, kind: BlobKind, address_format: &str) -> Result<(), EnclaveError> {
    let sign_with = text(&a.activity.parameters, "signWith");
    let named = match kind {
        BlobKind::WalletAccountKey => !sign_with.is_empty() && sign_with == sealed.address,
        _ if sign_with == sealed.resource_id => true,
        _ if !address_format.is_empty() => {
            let curve = Curve::parse(&sealed.curve)?;
            let public_key = hex::decode(&sealed.public_key).map_err(|_| EnclaveError::invalid("bad public key"))?;
            address::address(address_format, curve, &public_key).is_ok_and(|addr| addr == sign_with)
        }
        _ => false,
    };
    if named {
        Ok(())
    } else {
        Err(refuse(
            a,
            RefusalReason::BindingMismatch,
            "the sealed key is not the one signWith names in the stamped body",
        ))
    }
}

#[tonic::async_trait]
impl Enclave for EnclaveService {
    async fn get_signer_public_key(
        &self,
        _req: Request<pb::GetSignerPublicKeyRequest>,
    ) -> Result<Response<pb::GetSignerPublicKeyResponse>, Status> {
        let hsm = self.hsm.clone();
        blocking(move || Ok(pb::GetSignerPublicKeyResponse { public_key: hsm.signer_public_key()?.to_vec() })).await
    }

    async fn get_login_keys(
        &self,
        _req: Request<pb::GetLoginKeysRequest>,
    ) -> Result<Response<pb::GetLoginKeysResponse>, Status> {
        let (hsm, login) = (self.hsm.clone(), self.login.clone());
        blocking(move || {
            let keys = hsm.login_public_keys()?;
            Ok(pb::GetLoginKeysResponse {
                notarizer_public_key: keys.notarizer.to_vec(),
                oidc_issuer_public_key: keys.oidc_issuer.to_vec(),
                oidc_key_id: login::oidc_key_id(&keys.oidc_issuer),
                tls_fetcher_public_key: keys.tls_fetcher.to_vec(),
                oidc_issuer: login.oidc_issuer.clone().unwrap_or_default(),
            })
        })
        .await
    }

    async fn certify_oauth2_credential(
        &self,
        req: Request<pb::CertifyOauth2CredentialRequest>,
    ) -> Result<Response<pb::Oauth2Credential>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let a = authority.authorize(
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
                    authority.check_oauth2(&a, c, &credential_id)?;
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
            login::check_provider(&provider)?;
            let client_id = field("clientId", current.map(|c| &c.client_id))?;
            let encrypted_client_secret = field("encryptedClientSecret", current.map(|c| &c.encrypted_client_secret))?;
            // It must open now; the plaintext is dropped (zeroized) at once.
            drop(open_client_secret(&hsm, &encrypted_client_secret)?);
            tracing::info!(
                target: "coffer_audit",
                decision = "allow",
                operation = "certify_oauth2_credential",
                organization = %a.activity.organization_id,
                fingerprint = %a.activity.fingerprint,
                "enclave decision"
            );
            authority.certify_oauth2(pb::Oauth2Credential {
                organization_id: a.activity.organization_id.clone(),
                credential_id,
                provider,
                client_id,
                encrypted_client_secret,
                mac: vec![],
            })
        })
        .await
    }

    async fn oauth2_authenticate(
        &self,
        req: Request<pb::Oauth2AuthenticateRequest>,
    ) -> Result<Response<pb::Oauth2AuthenticateResponse>, Status> {
        let (hsm, authority, settings) = (self.hsm.clone(), self.authority.clone(), self.login.clone());
        let req = req.into_inner();
        let Some(issuer) = settings.oidc_issuer.clone() else {
            return Err(EnclaveError::invalid(
                "oauth2_authenticate needs the enclave's oidc_issuer setting (COFFER_OIDC_ISSUER)",
            )
            .into());
        };
        // Authorize and open the secret in the HSM.
        let h = hsm.clone();
        let (a, credential, secret) = blocking(move || {
            let a = authority.authorize("oauth2_authenticate", req.auth.as_ref(), &[types::OAUTH2_AUTHENTICATE])?;
            let credential = req.credential.ok_or_else(|| EnclaveError::invalid("missing OAuth 2.0 credential"))?;
            authority.check_oauth2(&a, &credential, text(&a.activity.parameters, "oauth2CredentialId"))?;
            let secret = open_client_secret(&h, &credential.encrypted_client_secret)?;
            Ok((a, credential, secret))
        })
        .await?
        .into_inner();
        let p = a.activity.parameters.clone();
        for k in ["authCode", "redirectUri", "codeVerifier", "nonce"] {
            if text(&p, k).is_empty() {
                return Err(EnclaveError::invalid(format!("{k} is required")).into());
            }
        }
        let user = login::exchange(
            &settings,
            &login::CodeExchange {
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
        blocking(move || {
            let target = text(&p, "bearerTokenTargetPublicKey");
            let encrypted_bearer_token = if target.is_empty() {
                None
            } else {
                let seed = hsm.random_seed()?;
                Some(coffer_crypto::session::sealed_to_target(&seed, target, user.bearer_token.as_bytes())?)
            };
            let claims = login::oidc_claims(
                &issuer,
                &credential.client_id,
                text(&p, "nonce"),
                &user,
                now_secs(),
                encrypted_bearer_token,
            );
            let kid = login::oidc_key_id(&hsm.login_public_keys()?.oidc_issuer);
            let oidc_token =
                login::es256_jwt(&kid, &claims, |digest| Ok(hsm.sign_digest_with(LoginKey::OidcIssuer, digest)?))?;
            tracing::info!(
                target: "coffer_audit",
                decision = "allow",
                operation = "oauth2_authenticate",
                organization = %a.activity.organization_id,
                fingerprint = %a.activity.fingerprint,
                "enclave decision"
            );
            Ok(pb::Oauth2AuthenticateResponse { oidc_token })
        })
        .await
    }

    async fn create_session(
        &self,
        req: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        let (hsm, authority, settings) = (self.hsm.clone(), self.authority.clone(), self.login.clone());
        let req = Arc::new(req.into_inner());
        // An attested stamp's token is verified first (it may need the issuer's keys from the
        // network); the authority then checks it against the certified identity and the stamp.
        let attested = req
            .auth
            .as_ref()
            .and_then(|a| a.request.as_ref())
            .filter(|r| r.stamp_header.eq_ignore_ascii_case(coffer_auth::attested::HEADER))
            .map(|r| coffer_auth::attested::parse(&r.stamp));
        let attested_claims = match attested {
            None => None,
            Some(Err(e)) => return Err(EnclaveError::refused(RefusalReason::StampInvalid, e.message).into()),
            Some(Ok(stamp)) => match sessions::verify_token(&hsm, &settings, &stamp.token).await {
                Ok(claims) => Some(claims),
                Err(e) => {
                    return Err(
                        EnclaveError::refused(RefusalReason::IdentityInvalid, format!("attested stamp: {e}")).into()
                    )
                }
            },
        };
        let (h, au, r) = (hsm.clone(), authority.clone(), req.clone());
        let a = blocking(move || {
            let parent = (!r.parent_certificate.is_empty()).then_some(r.parent_certificate.as_slice());
            au.authorize_for("create_session", r.auth.as_ref(), sessions::LOGIN_TYPES, parent, attested_claims.as_ref())
        })
        .await?
        .into_inner();
        let seconds = sessions::session_seconds(&a.activity.parameters, settings.max_session_seconds)?;
        let identity = if a.activity.activity_type == sessions::OAUTH_LOGIN {
            match sessions::verified_identity(&h, &settings, &a.activity.parameters).await {
                Ok(claims) => Some(claims),
                Err(e) => {
                    refuse(&a, RefusalReason::IdentityInvalid, &e.to_string());
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        blocking(move || {
            let g = sessions::grant(&hsm, &a, identity.as_ref(), &req.provider_certificate)?;
            sessions::open_session(&hsm, &authority, &a, g, seconds)
        })
        .await
    }

    async fn enable_auth_proxy(
        &self,
        req: Request<pb::EnableAuthProxyRequest>,
    ) -> Result<Response<pb::EnableAuthProxyResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let a =
                authority.authorize("enable_auth_proxy", req.auth.as_ref(), &[crate::auth_proxy::ENABLE_AUTH_PROXY])?;
            crate::auth_proxy::enable(&hsm, &authority, &a)
        })
        .await
    }

    async fn stamp_auth_proxy_request(
        &self,
        req: Request<pb::StampAuthProxyRequestRequest>,
    ) -> Result<Response<pb::StampAuthProxyRequestResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let stamp = crate::auth_proxy::stamp(&hsm, &authority, &req)?;
            Ok(pb::StampAuthProxyRequestResponse { stamp })
        })
        .await
    }

    async fn get_webhook_signing_key(
        &self,
        _req: Request<pb::GetWebhookSigningKeyRequest>,
    ) -> Result<Response<pb::GetWebhookSigningKeyResponse>, Status> {
        let hsm = self.hsm.clone();
        blocking(move || {
            let public_key = hsm.webhook_public_key()?;
            Ok(pb::GetWebhookSigningKeyResponse {
                key_id: webhook_key_id(&public_key),
                public_key: public_key.to_vec(),
            })
        })
        .await
    }

    async fn sign_webhook_deliveries(
        &self,
        req: Request<pb::SignWebhookDeliveriesRequest>,
    ) -> Result<Response<pb::SignWebhookDeliveriesResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        if req.deliveries.len() > MAX_WEBHOOK_BATCH {
            return Err(EnclaveError::refused(
                RefusalReason::BatchTooLarge,
                format!("at most {MAX_WEBHOOK_BATCH} webhook deliveries per call"),
            )
            .into());
        }
        blocking(move || {
            let key_id = webhook_key_id(&hsm.webhook_public_key()?);
            // Each delivery is checked on its own; a refused one does not stop the others.
            let mut messages = Vec::with_capacity(req.deliveries.len());
            let refusals: Vec<Option<(String, RefusalReason)>> = req
                .deliveries
                .iter()
                .map(|d| match authority.webhook_message(&key_id, d.timestamp_ms, &d.event_id, &d.body) {
                    Ok(message) => {
                        messages.push(message);
                        None
                    }
                    Err(e) => Some((e.to_string(), e.refusal_reason().unwrap_or(RefusalReason::Unspecified))),
                })
                .collect();
            let mut signatures = hsm.sign_webhooks(&messages)?.into_iter();
            let deliveries = refusals
                .into_iter()
                .map(|refusal| match refusal {
                    None => pb::SignedWebhookDelivery {
                        signature: signatures.next().map(|s| s.to_vec()).unwrap_or_default(),
                        refusal: String::new(),
                        refusal_reason: RefusalReason::Unspecified as i32,
                    },
                    Some((refusal, reason)) => {
                        pb::SignedWebhookDelivery { signature: Vec::new(), refusal, refusal_reason: reason as i32 }
                    }
                })
                .collect();
            Ok(pb::SignWebhookDeliveriesResponse { key_id, deliveries })
        })
        .await
    }

    async fn bootstrap_organization(
        &self,
        req: Request<pb::BootstrapOrganizationRequest>,
    ) -> Result<Response<pb::BootstrapOrganizationResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            if req.credential_type != "CREDENTIAL_TYPE_API_KEY_P256" {
                return Err(EnclaveError::invalid("bootstrap credentials are P-256 API keys"));
            }
            let (public_key, _) = grants::api_public_key("API_KEY_CURVE_P256", &req.public_key)?;
            // Fresh ids from the HSM: a bootstrap can only ever create a new organization, never
            // certify a key into an existing one.
            let uuid = |bytes: &[u8]| {
                let mut b = [0u8; 16];
                b.copy_from_slice(&bytes[..16]);
                uuid::Builder::from_random_bytes(b).into_uuid().to_string()
            };
            let random = hsm.random(32)?;
            let (organization_id, user_id) = (uuid(&random[..16]), uuid(&random[16..]));
            let certificate = authority.certify(pb::CredentialCertificate {
                organization_id: organization_id.clone(),
                user_id: user_id.clone(),
                credential_type: req.credential_type,
                public_key: public_key.clone(),
                expires_at_ms: 0,
                issuing_fingerprint: format!("{BOOTSTRAP}{organization_id}"),
                mac: vec![],
            })?;
            tracing::info!(
                target: "coffer_audit",
                decision = "allow",
                operation = "bootstrap_organization",
                organization = %organization_id,
                credential = %public_key,
                "enclave decision"
            );
            Ok(pb::BootstrapOrganizationResponse { organization_id, user_id, certificate })
        })
        .await
    }

    async fn issue_certificates(
        &self,
        req: Request<pb::IssueCertificatesRequest>,
    ) -> Result<Response<pb::IssueCertificatesResponse>, Status> {
        let authority = self.authority.clone();
        let req = req.into_inner();
        blocking(move || {
            let a = authority.authorize(
                "issue_certificates",
                req.auth.as_ref(),
                &[
                    grants::CREATE_USERS,
                    grants::CREATE_API_KEYS,
                    grants::CREATE_AUTHENTICATORS,
                    grants::CREATE_SUB_ORGANIZATION,
                    grants::CREATE_OAUTH_PROVIDERS,
                ],
            )?;
            let granted = granted_credentials(&a.activity)?;
            let certificates = req
                .credentials
                .iter()
                .map(|c| {
                    let grant = granted
                        .iter()
                        .find(|g| {
                            g.organization_id == c.organization_id
                                && g.user_id == c.user_id
                                && g.credential_type == c.credential_type
                                && g.public_key == c.public_key
                        })
                        .ok_or_else(|| {
                            refuse(
                                &a,
                                RefusalReason::BindingMismatch,
                                "a credential to certify is not one the stamped body adds",
                            )
                        })?;
                    authority.certify(pb::CredentialCertificate {
                        organization_id: grant.organization_id.clone(),
                        user_id: grant.user_id.clone(),
                        credential_type: grant.credential_type.clone(),
                        public_key: grant.public_key.clone(),
                        expires_at_ms: authority.expiry(grant.expiration_seconds),
                        issuing_fingerprint: a.activity.fingerprint.clone(),
                        mac: vec![],
                    })
                })
                .collect::<Result<Vec<_>, EnclaveError>>()?;
            Ok(pb::IssueCertificatesResponse { certificates })
        })
        .await
    }

    async fn create_wallet(
        &self,
        req: Request<pb::CreateWalletRequest>,
    ) -> Result<Response<pb::CreateWalletResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let a = authority.authorize(
                "create_wallet",
                req.auth.as_ref(),
                &[types::CREATE_WALLET, grants::CREATE_SUB_ORGANIZATION],
            )?;
            // create_sub_organization's wallet belongs to the sub-organization the body creates.
            let (organization_id, wallet) = if a.activity.activity_type == types::CREATE_WALLET {
                (a.activity.organization_id.clone(), &a.activity.parameters)
            } else {
                let wallet = a
                    .activity
                    .parameters
                    .get("wallet")
                    .ok_or_else(|| EnclaveError::invalid("the stamped body creates no wallet"))?;
                (derived_id(&a.activity.fingerprint, SUB_ORGANIZATION_ID, 0), wallet)
            };
            let specs = account_specs(items(wallet, "accounts"), &req.account_ids)?;
            let words = count(wallet.get("mnemonicLength")).unwrap_or(12);
            let entropy = hsm.random(keys::entropy_len_for_words(words)?)?;
            let phrase = keys::mnemonic_phrase(&entropy, "")?;
            seal_wallet(&hsm, &organization_id, &req.wallet_id, &phrase, &specs)
        })
        .await
    }

    async fn derive_accounts(
        &self,
        req: Request<pb::DeriveAccountsRequest>,
    ) -> Result<Response<pb::DeriveAccountsResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let a = authority.authorize("derive_accounts", req.auth.as_ref(), &[types::CREATE_WALLET_ACCOUNTS])?;
            let (seed_ref, kind) = sealed(req.seed.as_ref(), &[BlobKind::WalletSeed], &a)?;
            if seed_ref.resource_id != text(&a.activity.parameters, "walletId") {
                return Err(refuse(
                    &a,
                    RefusalReason::BindingMismatch,
                    "the sealed seed is not the wallet the stamped body names",
                ));
            }
            let specs = account_specs(items(&a.activity.parameters, "accounts"), &req.account_ids)?;
            let phrase = checked_phrase(&open(&hsm, seed_ref, kind)?)?;
            let seed = keys::seed_from_phrase(&phrase)?;
            let accounts = derive_accounts(&hsm, &a.activity.organization_id, seed.as_slice(), &specs)?;
            Ok(pb::DeriveAccountsResponse { accounts })
        })
        .await
    }

    async fn create_private_keys(
        &self,
        req: Request<pb::CreatePrivateKeysRequest>,
    ) -> Result<Response<pb::CreatePrivateKeysResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let a = authority.authorize("create_private_keys", req.auth.as_ref(), &[types::CREATE_PRIVATE_KEYS])?;
            let params = items(&a.activity.parameters, "privateKeys");
            if params.len() != req.private_key_ids.len() {
                return Err(EnclaveError::invalid("one private key id is needed per key of the stamped body"));
            }
            let keys = params
                .iter()
                .zip(&req.private_key_ids)
                .map(|(p, id)| {
                    let curve = Curve::parse(text(p, "curve"))?;
                    // Rejection-sample until the bytes are a valid scalar (always valid for Ed25519).
                    let key = loop {
                        let key = SecretKey::from_slice(curve, &hsm.random(32)?)?;
                        if key.public_key().is_ok() {
                            break key;
                        }
                    };
                    seal_private_key(&hsm, &a.activity.organization_id, id, &key, items(p, "addressFormats"))
                })
                .collect::<Result<Vec<_>, EnclaveError>>()?;
            Ok(pb::CreatePrivateKeysResponse { keys })
        })
        .await
    }

    async fn sign(&self, req: Request<pb::SignRequest>) -> Result<Response<pb::SignResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let a =
                authority.authorize("sign", req.auth.as_ref(), &[types::SIGN_RAW_PAYLOAD, types::SIGN_RAW_PAYLOADS])?;
            let (key_ref, kind) = sealed(req.key.as_ref(), &[BlobKind::WalletAccountKey, BlobKind::PrivateKey], &a)?;
            names_key(&a, key_ref, kind, &req.address_format)?;
            let p = &a.activity.parameters;
            let payloads: Vec<&str> = if a.activity.activity_type == types::SIGN_RAW_PAYLOAD {
                vec![p
                    .get("payload")
                    .and_then(Value::as_str)
                    .ok_or_else(|| EnclaveError::invalid("payload is required"))?]
            } else {
                items(p, "payloads")
                    .iter()
                    .map(|v| v.as_str().ok_or_else(|| EnclaveError::invalid("payloads must be strings")))
                    .collect::<Result<_, _>>()?
            };
            if payloads.is_empty() {
                return Err(EnclaveError::invalid("payloads must not be empty"));
            }
            let key = open_key(&hsm, key_ref, kind)?;
            let signatures = payloads
                .into_iter()
                .map(|payload| {
                    let sig = sign::sign_payload(
                        key.curve(),
                        key.secret_bytes(),
                        payload,
                        text(p, "encoding"),
                        text(p, "hashFunction"),
                    )?;
                    Ok(pb::Signature { r: sig.r, s: sig.s, v: sig.v })
                })
                .collect::<Result<Vec<_>, EnclaveError>>()?;
            Ok(pb::SignResponse { signatures })
        })
        .await
    }

    async fn sign_transaction(
        &self,
        req: Request<pb::SignRequest>,
    ) -> Result<Response<pb::SignTransactionResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let a = authority.authorize("sign_transaction", req.auth.as_ref(), &[types::SIGN_TRANSACTION])?;
            let (key_ref, kind) = sealed(req.key.as_ref(), &[BlobKind::WalletAccountKey, BlobKind::PrivateKey], &a)?;
            names_key(&a, key_ref, kind, &req.address_format)?;
            // The transaction is the stamped body's, parsed here: the gateway's parse decides
            // nothing the enclave signs.
            let p = &a.activity.parameters;
            let tx = coffer_chain::parse(text(p, "type"), text(p, "unsignedTransaction"))
                .map_err(|e| EnclaveError::invalid(e.to_string()))?;
            let key = open_key(&hsm, key_ref, kind)?;
            let needs = |curve: Curve, chain: &str| {
                if key.curve() == curve {
                    Ok(())
                } else {
                    Err(EnclaveError::invalid(format!(
                        "signWith: {chain} transactions are signed by a {} key",
                        curve.wire_name()
                    )))
                }
            };
            let signed_transaction = match &tx {
                coffer_chain::Unsigned::Ethereum(t) => {
                    needs(Curve::Secp256k1, "Ethereum")?;
                    let sig = sign::sign_digest(Curve::Secp256k1, key.secret_bytes(), &t.signing_hash())?;
                    t.signed(&sig.r, &sig.s, sig.recovery_id == 1)
                }
                coffer_chain::Unsigned::Tron(t) => {
                    needs(Curve::Secp256k1, "Tron")?;
                    let sig = sign::sign_digest(Curve::Secp256k1, key.secret_bytes(), &t.signing_hash())?;
                    t.signed(&sig.r, &sig.s, sig.recovery_id)
                }
                coffer_chain::Unsigned::Solana(t) => {
                    needs(Curve::Ed25519, "Solana")?;
                    let slot = t.signer_slot(&key.public_key()?).map_err(|e| EnclaveError::invalid(e.to_string()))?;
                    t.signed(slot, &sign::sign_ed25519(key.secret_bytes(), t.message()))
                }
            };
            Ok(pb::SignTransactionResponse { signed_transaction })
        })
        .await
    }

    async fn export_wallet(
        &self,
        req: Request<pb::ExportWalletRequest>,
    ) -> Result<Response<pb::ExportResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let a = authority.authorize("export_wallet", req.auth.as_ref(), &[types::EXPORT_WALLET])?;
            let (seed_ref, kind) = sealed(req.seed.as_ref(), &[BlobKind::WalletSeed], &a)?;
            if seed_ref.resource_id != text(&a.activity.parameters, "walletId") {
                return Err(refuse(
                    &a,
                    RefusalReason::BindingMismatch,
                    "the sealed seed is not the wallet the stamped body names",
                ));
            }
            let phrase = checked_phrase(&open(&hsm, seed_ref, kind)?)?;
            let language = text(&a.activity.parameters, "language");
            let phrase = if language.is_empty() || language == "MNEMONIC_LANGUAGE_ENGLISH" {
                phrase
            } else {
                let entropy = keys::entropy_from_phrase(&phrase)?;
                keys::mnemonic_phrase(&entropy, language)?
            };
            export(&hsm, &a, phrase.as_bytes())
        })
        .await
    }

    async fn export_key(&self, req: Request<pb::ExportKeyRequest>) -> Result<Response<pb::ExportResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let a = authority.authorize(
                "export_key",
                req.auth.as_ref(),
                &[types::EXPORT_PRIVATE_KEY, types::EXPORT_WALLET_ACCOUNT],
            )?;
            let p = &a.activity.parameters;
            let (key_ref, kind) = if a.activity.activity_type == types::EXPORT_PRIVATE_KEY {
                let (r, k) = sealed(req.key.as_ref(), &[BlobKind::PrivateKey], &a)?;
                if r.resource_id != text(p, "privateKeyId") {
                    return Err(refuse(
                        &a,
                        RefusalReason::BindingMismatch,
                        "the sealed key is not the private key the stamped body names",
                    ));
                }
                (r, k)
            } else {
                let (r, k) = sealed(req.key.as_ref(), &[BlobKind::WalletAccountKey], &a)?;
                if r.address != text(p, "address") {
                    return Err(refuse(
                        &a,
                        RefusalReason::BindingMismatch,
                        "the sealed key is not the account the stamped body names",
                    ));
                }
                (r, k)
            };
            let key = open_key(&hsm, key_ref, kind)?;
            export(&hsm, &a, key.secret_bytes())
        })
        .await
    }

    async fn init_import(
        &self,
        req: Request<pb::InitImportRequest>,
    ) -> Result<Response<pb::InitImportResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let a = authority.authorize(
                "init_import",
                req.auth.as_ref(),
                &[types::INIT_IMPORT_WALLET, types::INIT_IMPORT_PRIVATE_KEY],
            )?;
            let (org, user) = (a.activity.organization_id.as_str(), text(&a.activity.parameters, "userId"));
            if user.is_empty() {
                return Err(EnclaveError::invalid("userId is required"));
            }
            let seed = hsm.random_seed()?;
            let target = bundle::new_import_target(&seed)?;
            let binding = BlobBinding::plain(BlobKind::ImportTarget, org, user);
            let sealed_target_key = hsm.seal(&binding, target.secret.as_slice())?;
            let signer = HsmSigner::new(&hsm)?;
            let import_bundle = bundle::import_bundle(&signer, &target.public, org, user)?;
            Ok(pb::InitImportResponse { import_bundle, sealed_target_key })
        })
        .await
    }

    async fn import_wallet(
        &self,
        req: Request<pb::ImportWalletRequest>,
    ) -> Result<Response<pb::CreateWalletResponse>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let a = authority.authorize("import_wallet", req.auth.as_ref(), &[types::IMPORT_WALLET])?;
            let plain = open_import(&hsm, &a, req.target.as_ref())?;
            let phrase = checked_phrase(&plain)?;
            let specs = account_specs(items(&a.activity.parameters, "accounts"), &req.account_ids)?;
            seal_wallet(&hsm, &a.activity.organization_id, &req.wallet_id, &phrase, &specs)
        })
        .await
    }

    async fn import_private_key(
        &self,
        req: Request<pb::ImportPrivateKeyRequest>,
    ) -> Result<Response<pb::KeyMaterial>, Status> {
        let (hsm, authority) = (self.hsm.clone(), self.authority.clone());
        let req = req.into_inner();
        blocking(move || {
            let a = authority.authorize("import_private_key", req.auth.as_ref(), &[types::IMPORT_PRIVATE_KEY])?;
            let p = &a.activity.parameters;
            let curve = Curve::parse(text(p, "curve"))?;
            let plain = open_import(&hsm, &a, req.target.as_ref())?;
            if plain.len() != 32 {
                return Err(EnclaveError::invalid("imported private key must be 32 bytes"));
            }
            let key = SecretKey::from_slice(curve, &plain)?;
            seal_private_key(&hsm, &a.activity.organization_id, &req.private_key_id, &key, items(p, "addressFormats"))
        })
        .await
    }
}

/// Decrypts the stamped body's `encryptedBundle` with the import target of the body's user.
fn open_import(hsm: &Hsm, a: &Authorized, target: Option<&pb::SealedRef>) -> Result<Zeroizing<Vec<u8>>, EnclaveError> {
    let (target_ref, kind) = sealed(target, &[BlobKind::ImportTarget], a)?;
    if target_ref.resource_id != text(&a.activity.parameters, "userId") {
        return Err(refuse(
            a,
            RefusalReason::BindingMismatch,
            "the import target is not the one of the user the stamped body names",
        ));
    }
    let secret = open(hsm, target_ref, kind)?;
    let secret: &[u8; 32] =
        secret.as_slice().try_into().map_err(|_| EnclaveError::Internal("import target is not 32 bytes".into()))?;
    Ok(bundle::open_encrypted_bundle(secret, text(&a.activity.parameters, "encryptedBundle"))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_ref(kind: pb::BlobKind, blob: Vec<u8>, curve: &str) -> pb::SealedRef {
        pb::SealedRef {
            kind: kind as i32,
            organization_id: "o".into(),
            resource_id: "r".into(),
            blob,
            curve: curve.into(),
            ..Default::default()
        }
    }

    #[test]
    fn legacy_blobs_must_hold_the_key_they_are_presented_as() {
        let hsm = crate::hsm::tests::hsm();
        let secret = [7u8; 32];
        let public_key = keys::public_key(Curve::Secp256k1, &secret).unwrap();
        let legacy = |kind| hsm.seal_legacy(&BlobBinding::plain(kind, "o", "r"), &secret).unwrap();

        let mut k = key_ref(pb::BlobKind::PrivateKey, legacy(BlobKind::PrivateKey), "CURVE_SECP256K1");
        k.public_key = hex::encode(&public_key);
        assert_eq!(open_key(&hsm, &k, BlobKind::PrivateKey).unwrap().secret_bytes(), &secret);
        k.public_key = hex::encode(keys::public_key(Curve::Secp256k1, &[8u8; 32]).unwrap());
        assert!(matches!(open_key(&hsm, &k, BlobKind::PrivateKey), Err(EnclaveError::SealAuthentication)));

        let address = address::address("ADDRESS_FORMAT_ETHEREUM", Curve::Secp256k1, &public_key).unwrap();
        let mut a = key_ref(pb::BlobKind::WalletAccountKey, legacy(BlobKind::WalletAccountKey), "CURVE_SECP256K1");
        (a.address, a.address_format) = (address, "ADDRESS_FORMAT_ETHEREUM".into());
        assert!(open_key(&hsm, &a, BlobKind::WalletAccountKey).is_ok());
        let mut other_curve = a.clone();
        other_curve.curve = "CURVE_P256".into();
        assert!(matches!(
            open_key(&hsm, &other_curve, BlobKind::WalletAccountKey),
            Err(EnclaveError::SealAuthentication)
        ));
        let mut other_address = a.clone();
        other_address.address = "0x0000000000000000000000000000000000000001".into();
        assert!(matches!(
            open_key(&hsm, &other_address, BlobKind::WalletAccountKey),
            Err(EnclaveError::SealAuthentication)
        ));

        // Current blobs bind curve and address themselves.
        let binding = BlobBinding {
            curve: "CURVE_SECP256K1",
            address: &a.address,
            ..BlobBinding::plain(BlobKind::WalletAccountKey, "o", "r")
        };
        let mut current = a.clone();
        current.blob = hsm.seal(&binding, &secret).unwrap();
        assert!(open_key(&hsm, &current, BlobKind::WalletAccountKey).is_ok());
        current.curve = "CURVE_P256".into();
        assert!(matches!(open_key(&hsm, &current, BlobKind::WalletAccountKey), Err(EnclaveError::SealAuthentication)));
    }
}
