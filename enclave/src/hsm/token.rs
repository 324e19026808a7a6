//! The token: one module load, one login held by an anchor session, a session pool, and the
//! service keys found by label; randomness, certificate MACs, sealing and the signer keys.

use std::sync::{Mutex, OnceLock};

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::Slot;
use cryptoki::types::AuthPin;
use zeroize::Zeroizing;

use super::error::HsmError;
use super::key_labels::{
    LoginPublicKeys, CERT_MAC_LABEL, KEK_LABEL, NOTARIZER_LABEL, OIDC_ISSUER_LABEL, PROOF_LABEL, SIGNER_LABEL,
    TLS_FETCHER_LABEL, WEBHOOK_SIGNER_LABEL,
};
use super::seal::{self, BlobBinding, OpenedBlob};

const OID_P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_ED25519: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];

/// Where the token is and how to log in. The PIN is a `secrecy` string, wiped on drop.
pub struct HsmSettings {
    pub module: std::path::PathBuf,
    pub token_label: String,
    pub pin: AuthPin,
    pub pool_size: usize,
}

impl std::fmt::Debug for HsmSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HsmSettings")
            .field("module", &self.module)
            .field("token_label", &self.token_label)
            .field("pin", &"<redacted>")
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

/// Handles of the service keys; valid only for the current login (re-resolved after recovery).
#[derive(Clone, Copy)]
pub(super) struct ServiceKeys {
    kek: ObjectHandle,
    signer: ObjectHandle,
    cert_mac: ObjectHandle,
    /// Absent on a token initialised before webhooks existed, until `init` runs again.
    webhook: Option<ObjectHandle>,
    /// Absent on a token initialised before sessions and OAuth existed, until `init` runs again.
    pub(super) notarizer: Option<ObjectHandle>,
    pub(super) oidc_issuer: Option<ObjectHandle>,
    pub(super) tls_fetcher: Option<ObjectHandle>,
    /// Absent on a token initialised before proofs existed, until `init` runs again.
    pub(super) proof: Option<ObjectHandle>,
}

struct Anchor {
    /// Kept open for the life of the process: closing the last session logs the token out.
    _session: Session,
    keys: Option<ServiceKeys>,
}

/// A logged-in token with a pool of sessions. Cheap to share behind an `Arc`.
pub struct Hsm {
    ctx: Pkcs11,
    slot: Slot,
    pin: AuthPin,
    anchor: Mutex<Anchor>,
    pool: Mutex<Vec<Session>>,
    pool_size: usize,
    signer_public: OnceLock<[u8; 65]>,
    webhook_public: OnceLock<[u8; 32]>,
    pub(super) login_public: OnceLock<LoginPublicKeys>,
    pub(super) proof_public: OnceLock<[u8; 65]>,
}

/// The PKCS#11 module is a process-wide singleton: `C_Initialize` may run only once.
static MODULE: OnceLock<Pkcs11> = OnceLock::new();

fn load_module(path: &std::path::Path) -> Result<Pkcs11, HsmError> {
    if let Some(ctx) = MODULE.get() {
        return Ok(ctx.clone());
    }
    let ctx = Pkcs11::new(path).map_err(|e| HsmError::call("load module", e))?;
    // Without CKF_OS_LOCKING_OK SoftHSM silently disables all its mutexes (its MutexFactory is
    // turned off), and threads with sessions of their own then fail with CKR_GENERAL_ERROR. The
    // module is one per process: a second C_Initialize answers CRYPTOKI_ALREADY_INITIALIZED.
    match ctx.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)) {
        Ok(()) | Err(CkError::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {}
        Err(e) => return Err(HsmError::call("C_Initialize", e)),
    }
    Ok(MODULE.get_or_init(|| ctx).clone())
}

fn login(session: &Session, pin: &AuthPin) -> Result<(), HsmError> {
    match session.login(UserType::User, Some(pin)) {
        Ok(()) | Err(CkError::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => Ok(()),
        Err(e) => Err(HsmError::call("C_Login", e)),
    }
}

/// Errors after which the session, the login or the handles cannot be trusted any more.
fn needs_recovery(e: &CkError) -> bool {
    matches!(
        e,
        CkError::Pkcs11(
            RvError::SessionHandleInvalid
                | RvError::SessionClosed
                | RvError::ObjectHandleInvalid
                | RvError::KeyHandleInvalid
                | RvError::UserNotLoggedIn
                | RvError::TokenNotPresent
                | RvError::DeviceRemoved
                | RvError::DeviceError,
            _
        )
    )
}

/// Initializes a token with `label` in the first free slot, and sets its user PIN, unless a
/// token with that label exists already (idempotent). PINs come from the caller, never argv.
pub fn init_token(
    module: &std::path::Path,
    label: &str,
    so_pin: &AuthPin,
    user_pin: &AuthPin,
) -> Result<bool, HsmError> {
    let ctx = load_module(module)?;
    let slots = ctx.get_slots_with_token().map_err(|e| HsmError::call("C_GetSlotList", e))?;
    let mut free = None;
    for slot in slots {
        let info = ctx.get_token_info(slot).map_err(|e| HsmError::call("C_GetTokenInfo", e))?;
        if info.token_initialized() {
            if info.label().trim_end() == label {
                return Ok(false);
            }
        } else if free.is_none() {
            free = Some(slot);
        }
    }
    let slot = free.ok_or_else(|| HsmError::TokenNotFound(format!("{label} (and no free slot to create it)")))?;
    ctx.init_token(slot, so_pin, label).map_err(|e| HsmError::call("C_InitToken", e))?;
    // Slot ids may change after C_InitToken (SoftHSM reassigns them): find the token again.
    let slot = ctx
        .get_slots_with_initialized_token()
        .map_err(|e| HsmError::call("C_GetSlotList", e))?
        .into_iter()
        .find(|s| ctx.get_token_info(*s).map(|t| t.label().trim_end() == label).unwrap_or(false))
        .ok_or_else(|| HsmError::TokenNotFound(label.to_string()))?;
    let session = ctx.open_rw_session(slot).map_err(|e| HsmError::call("C_OpenSession", e))?;
    session.login(UserType::So, Some(so_pin)).map_err(|e| HsmError::call("C_Login (SO)", e))?;
    session.init_pin(user_pin).map_err(|e| HsmError::call("C_InitPIN", e))?;
    session.logout().map_err(|e| HsmError::call("C_Logout", e))?;
    Ok(true)
}

impl Hsm {
    /// Loads the module, finds the token by label and logs in once.
    pub fn open(settings: HsmSettings) -> Result<Self, HsmError> {
        let ctx = load_module(&settings.module)?;
        let slot = ctx
            .get_slots_with_initialized_token()
            .map_err(|e| HsmError::call("C_GetSlotList", e))?
            .into_iter()
            .find(|s| ctx.get_token_info(*s).map(|t| t.label().trim_end() == settings.token_label).unwrap_or(false))
            .ok_or_else(|| HsmError::TokenNotFound(settings.token_label.clone()))?;
        let session = ctx.open_rw_session(slot).map_err(|e| HsmError::call("C_OpenSession", e))?;
        login(&session, &settings.pin)?;
        Ok(Self {
            ctx,
            slot,
            pin: settings.pin,
            anchor: Mutex::new(Anchor { _session: session, keys: None }),
            pool: Mutex::new(Vec::new()),
            pool_size: settings.pool_size.max(1),
            signer_public: OnceLock::new(),
            webhook_public: OnceLock::new(),
            login_public: OnceLock::new(),
            proof_public: OnceLock::new(),
        })
    }

    /// Creates the service keys if they are missing (idempotent). Returns what it created.
    pub fn init_service_keys(&self) -> Result<Vec<&'static str>, HsmError> {
        let session = self.new_session()?;
        let mut created = Vec::new();
        if find_key(&session, ObjectClass::SECRET_KEY, KEK_LABEL)?.is_none() {
            session
                .generate_key(
                    &Mechanism::AesKeyGen,
                    &[
                        Attribute::Class(ObjectClass::SECRET_KEY),
                        Attribute::KeyType(KeyType::AES),
                        Attribute::ValueLen(32.into()),
                        Attribute::Token(true),
                        Attribute::Private(true),
                        Attribute::Sensitive(true),
                        Attribute::Extractable(false),
                        Attribute::Encrypt(true),
                        Attribute::Decrypt(true),
                        Attribute::Label(KEK_LABEL.as_bytes().to_vec()),
                    ],
                )
                .map_err(|e| HsmError::call("C_GenerateKey (KEK)", e))?;
            created.push(KEK_LABEL);
        }
        if find_key(&session, ObjectClass::PRIVATE_KEY, SIGNER_LABEL)?.is_none() {
            generate_pair(&session, Mechanism::EccKeyPairGen, OID_P256, SIGNER_LABEL, Attribute::Sign(true))?;
            created.push(SIGNER_LABEL);
        }
        if find_key(&session, ObjectClass::SECRET_KEY, CERT_MAC_LABEL)?.is_none() {
            session
                .generate_key(
                    &Mechanism::GenericSecretKeyGen,
                    &[
                        Attribute::Class(ObjectClass::SECRET_KEY),
                        Attribute::KeyType(KeyType::GENERIC_SECRET),
                        Attribute::ValueLen(32.into()),
                        Attribute::Token(true),
                        Attribute::Private(true),
                        Attribute::Sensitive(true),
                        Attribute::Extractable(false),
                        Attribute::Sign(true),
                        Attribute::Verify(true),
                        Attribute::Label(CERT_MAC_LABEL.as_bytes().to_vec()),
                    ],
                )
                .map_err(|e| HsmError::call("C_GenerateKey (certificate MAC key)", e))?;
            created.push(CERT_MAC_LABEL);
        }
        if find_key(&session, ObjectClass::PRIVATE_KEY, WEBHOOK_SIGNER_LABEL)?.is_none() {
            generate_pair(
                &session,
                Mechanism::EccEdwardsKeyPairGen,
                OID_ED25519,
                WEBHOOK_SIGNER_LABEL,
                Attribute::Sign(true),
            )?;
            created.push(WEBHOOK_SIGNER_LABEL);
        }
        for (label, usage) in [
            (NOTARIZER_LABEL, Attribute::Sign(true)),
            (OIDC_ISSUER_LABEL, Attribute::Sign(true)),
            (PROOF_LABEL, Attribute::Sign(true)),
            (TLS_FETCHER_LABEL, Attribute::Derive(true)),
        ] {
            if find_key(&session, ObjectClass::PRIVATE_KEY, label)?.is_none() {
                generate_pair(&session, Mechanism::EccKeyPairGen, OID_P256, label, usage)?;
                created.push(label);
            }
        }
        self.anchor.lock().map_err(|_| HsmError::Poisoned)?.keys = None;
        Ok(created)
    }

    pub(super) fn new_session(&self) -> Result<Session, HsmError> {
        self.ctx.open_rw_session(self.slot).map_err(|e| HsmError::call("C_OpenSession", e))
    }

    fn keys(&self) -> Result<ServiceKeys, HsmError> {
        let mut anchor = self.anchor.lock().map_err(|_| HsmError::Poisoned)?;
        if let Some(keys) = anchor.keys {
            return Ok(keys);
        }
        let session = self.new_session()?;
        let kek = find_key(&session, ObjectClass::SECRET_KEY, KEK_LABEL)?.ok_or(HsmError::KeyMissing(KEK_LABEL))?;
        let signer =
            find_key(&session, ObjectClass::PRIVATE_KEY, SIGNER_LABEL)?.ok_or(HsmError::KeyMissing(SIGNER_LABEL))?;
        let cert_mac =
            find_key(&session, ObjectClass::SECRET_KEY, CERT_MAC_LABEL)?.ok_or(HsmError::KeyMissing(CERT_MAC_LABEL))?;
        let webhook = find_key(&session, ObjectClass::PRIVATE_KEY, WEBHOOK_SIGNER_LABEL)?;
        let keys = ServiceKeys {
            kek,
            signer,
            cert_mac,
            webhook,
            notarizer: find_key(&session, ObjectClass::PRIVATE_KEY, NOTARIZER_LABEL)?,
            oidc_issuer: find_key(&session, ObjectClass::PRIVATE_KEY, OIDC_ISSUER_LABEL)?,
            tls_fetcher: find_key(&session, ObjectClass::PRIVATE_KEY, TLS_FETCHER_LABEL)?,
            proof: find_key(&session, ObjectClass::PRIVATE_KEY, PROOF_LABEL)?,
        };
        anchor.keys = Some(keys);
        Ok(keys)
    }

    /// Re-opens the anchor, logs in again and forgets handles (after the token dropped us).
    fn recover(&self) -> Result<(), HsmError> {
        tracing::warn!("PKCS#11 session or login lost; re-opening and logging in again");
        self.pool.lock().map_err(|_| HsmError::Poisoned)?.clear();
        let session = self.new_session()?;
        login(&session, &self.pin)?;
        let mut anchor = self.anchor.lock().map_err(|_| HsmError::Poisoned)?;
        *anchor = Anchor { _session: session, keys: None };
        Ok(())
    }

    /// Runs `op` on a pooled session. A session that saw an error is dropped, never reused
    /// (an abandoned operation would wedge it); a lost session or login is recovered once.
    pub(super) fn with_session<T>(
        &self,
        op: impl Fn(&Session, ServiceKeys) -> Result<T, CkError>,
        call: &'static str,
    ) -> Result<T, HsmError> {
        let mut recovered = false;
        loop {
            let keys = self.keys()?;
            let pooled = self.pool.lock().map_err(|_| HsmError::Poisoned)?.pop();
            let session = match pooled {
                Some(s) => s,
                None => self.new_session()?,
            };
            match op(&session, keys) {
                Ok(v) => {
                    let mut pool = self.pool.lock().map_err(|_| HsmError::Poisoned)?;
                    if pool.len() < self.pool_size {
                        pool.push(session);
                    }
                    return Ok(v);
                }
                Err(e) if needs_recovery(&e) && !recovered => {
                    drop(session);
                    self.recover()?;
                    recovered = true;
                }
                Err(e) => return Err(HsmError::call(call, e)),
            }
        }
    }

    /// `n` bytes from the HSM's random number generator.
    pub fn random(&self, n: usize) -> Result<Zeroizing<Vec<u8>>, HsmError> {
        self.with_session(
            |s, _| {
                let mut buf = Zeroizing::new(vec![0u8; n]);
                s.generate_random_slice(&mut buf)?;
                Ok(buf)
            },
            "C_GenerateRandom",
        )
    }

    /// 32 random bytes, e.g. to seed an ephemeral RNG.
    pub fn random_seed(&self) -> Result<coffer_crypto::secret::RngSeed, HsmError> {
        let bytes = self.random(32)?;
        let mut seed = Zeroizing::new([0u8; 32]);
        seed.copy_from_slice(&bytes);
        Ok(seed.into())
    }

    /// HMAC-SHA256 of `data` under the certificate key, computed in the HSM.
    pub fn certificate_mac(&self, data: &[u8]) -> Result<Vec<u8>, HsmError> {
        self.with_session(|s, keys| s.sign(&Mechanism::Sha256Hmac, keys.cert_mac, data), "C_Sign (certificate MAC)")
    }

    /// Whether `mac` is the certificate key's HMAC-SHA256 of `data` (checked in the HSM).
    pub fn certificate_mac_valid(&self, data: &[u8], mac: &[u8]) -> Result<bool, HsmError> {
        if mac.len() != 32 {
            return Ok(false);
        }
        let result = self.with_session(
            |s, keys| s.verify(&Mechanism::Sha256Hmac, keys.cert_mac, data, mac),
            "C_Verify (certificate MAC)",
        );
        match result {
            Ok(()) => Ok(true),
            Err(HsmError::Pkcs11 { rv: RvError::SignatureInvalid | RvError::SignatureLenRange, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Seals `plaintext` under the KEK (AES-256-GCM in the HSM), bound to `binding`.
    pub fn seal(&self, binding: &BlobBinding<'_>, plaintext: &[u8]) -> Result<Vec<u8>, HsmError> {
        self.seal_version(binding, plaintext, seal::VERSION)
    }

    /// A blob in the legacy format, as enclaves before binding version 2 sealed them (tests only).
    #[cfg(test)]
    pub(crate) fn seal_legacy(&self, binding: &BlobBinding<'_>, plaintext: &[u8]) -> Result<Vec<u8>, HsmError> {
        self.seal_version(binding, plaintext, seal::LEGACY_VERSION)
    }

    fn seal_version(&self, binding: &BlobBinding<'_>, plaintext: &[u8], version: u8) -> Result<Vec<u8>, HsmError> {
        let aad = binding.aad(version, KEK_LABEL);
        let iv = self.random(seal::IV_LEN)?;
        let ct = self.with_session(
            |s, keys| {
                let mut iv_buf = [0u8; seal::IV_LEN];
                iv_buf.copy_from_slice(&iv);
                let params = cryptoki::mechanism::aead::GcmParams::new(
                    &mut iv_buf,
                    &aad,
                    cryptoki::types::Ulong::from(seal::TAG_BITS as u64),
                )?;
                s.encrypt(&Mechanism::AesGcm(params), keys.kek, plaintext)
            },
            "C_Encrypt (seal)",
        )?;
        Ok(seal::encode(version, KEK_LABEL, &iv, &ct))
    }

    /// Opens (unseals) a sealed blob; fails with `SealAuthentication` if it was bound elsewhere or
    /// altered. Version 1 blobs open under their legacy binding.
    pub fn unseal(&self, binding: &BlobBinding<'_>, blob: &[u8]) -> Result<OpenedBlob, HsmError> {
        let parsed = seal::decode(blob)?;
        if parsed.kek_label != KEK_LABEL {
            return Err(HsmError::UnknownKek(parsed.kek_label.to_string()));
        }
        let aad = binding.aad(parsed.version, parsed.kek_label);
        let result = self.with_session(
            |s, keys| {
                let mut iv_buf = parsed.iv;
                let params = cryptoki::mechanism::aead::GcmParams::new(
                    &mut iv_buf,
                    &aad,
                    cryptoki::types::Ulong::from(seal::TAG_BITS as u64),
                )?;
                s.decrypt(&Mechanism::AesGcm(params), keys.kek, parsed.ciphertext).map(OpenedBlob::new)
            },
            "C_Decrypt (open)",
        );
        match result {
            Ok(pt) => Ok(pt),
            // SoftHSM reports a failed GCM tag check as CKR_GENERAL_ERROR (notes 4.9).
            Err(HsmError::Pkcs11 {
                rv: RvError::GeneralError | RvError::EncryptedDataInvalid | RvError::EncryptedDataLenRange,
                ..
            }) => Err(HsmError::SealAuthentication),
            Err(e) => Err(e),
        }
    }

    /// The bundle signer's uncompressed SEC1 public key, read once from the token.
    pub fn signer_public_key(&self) -> Result<[u8; 65], HsmError> {
        if let Some(pk) = self.signer_public.get() {
            return Ok(*pk);
        }
        let pk: [u8; 65] = self
            .public_point(SIGNER_LABEL, 65)?
            .try_into()
            .map_err(|_| HsmError::Malformed("signer public key is not a 65-byte point"))?;
        Ok(*self.signer_public.get_or_init(|| pk))
    }

    /// The `CKA_EC_POINT` of the public key labelled `label`, `len` bytes, without the DER OCTET
    /// STRING SoftHSM wraps it in (some HSMs return it raw, notes 4.7).
    pub(super) fn public_point(&self, label: &'static str, len: usize) -> Result<Vec<u8>, HsmError> {
        let point = self.with_session(
            |s, _| {
                let handles = s.find_objects(&[
                    Attribute::Class(ObjectClass::PUBLIC_KEY),
                    Attribute::Label(label.as_bytes().to_vec()),
                ])?;
                let Some(h) = handles.first() else { return Ok(None) };
                let attrs = s.get_attributes(*h, &[AttributeType::EcPoint])?;
                Ok(attrs.into_iter().find_map(|a| match a {
                    Attribute::EcPoint(p) => Some(p),
                    _ => None,
                }))
            },
            "C_GetAttributeValue (public key)",
        )?;
        let point = point.ok_or(HsmError::KeyMissing(label))?;
        Ok(match point.as_slice() {
            [0x04, n, rest @ ..] if *n as usize == len && rest.len() == len => rest.to_vec(),
            _ => point,
        })
    }

    /// The webhook signer's Ed25519 public key, read once from the token.
    pub fn webhook_public_key(&self) -> Result<[u8; 32], HsmError> {
        if let Some(pk) = self.webhook_public.get() {
            return Ok(*pk);
        }
        let pk: [u8; 32] = self
            .public_point(WEBHOOK_SIGNER_LABEL, 32)?
            .try_into()
            .map_err(|_| HsmError::Malformed("webhook signer public key is not 32 bytes"))?;
        Ok(*self.webhook_public.get_or_init(|| pk))
    }

    /// Pure Ed25519 over each of `messages` with the webhook signer, in one session; every
    /// signature is checked against the public key before it leaves (a faulty signature is never
    /// handed out).
    pub fn sign_webhooks(&self, messages: &[Vec<u8>]) -> Result<Vec<[u8; 64]>, HsmError> {
        use cryptoki::mechanism::eddsa::{EddsaParams, EddsaSignatureScheme};
        let public = self.webhook_public_key()?;
        let raw = self.with_session(
            |s, keys| {
                let Some(key) = keys.webhook else { return Ok(None) };
                let mechanism = Mechanism::Eddsa(EddsaParams::new(EddsaSignatureScheme::Pure));
                messages.iter().map(|m| s.sign(&mechanism, key, m)).collect::<Result<Vec<_>, _>>().map(Some)
            },
            "C_Sign (webhook signer)",
        )?;
        let raw = raw.ok_or(HsmError::KeyMissing(WEBHOOK_SIGNER_LABEL))?;
        let key = ed25519_dalek::VerifyingKey::from_bytes(&public)
            .map_err(|_| HsmError::Malformed("webhook signer public key is not a curve point"))?;
        raw.iter()
            .zip(messages)
            .map(|(raw, message)| {
                let signature: [u8; 64] =
                    raw.as_slice().try_into().map_err(|_| HsmError::Malformed("Ed25519 signature is not 64 bytes"))?;
                key.verify_strict(message, &ed25519_dalek::Signature::from_bytes(&signature))
                    .map_err(|_| HsmError::Malformed("the HSM's webhook signature does not verify"))?;
                Ok(signature)
            })
            .collect()
    }

    /// ECDSA P-256 over SHA-256(`data`) with the bundle signer, DER encoded.
    pub fn sign_with_bundle_signer(&self, data: &[u8]) -> Result<Vec<u8>, HsmError> {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(data);
        let raw =
            self.with_session(|s, keys| s.sign(&Mechanism::Ecdsa, keys.signer, &digest), "C_Sign (bundle signer)")?;
        let sig = p256::ecdsa::Signature::from_slice(&raw)
            .map_err(|_| HsmError::Malformed("HSM returned a malformed ECDSA signature"))?;
        Ok(sig.to_der().as_bytes().to_vec())
    }
}

/// Generates a token key pair under `label` for one `usage` (`Sign` or `Derive`): the private
/// half sensitive and never extractable, the public half readable.
fn generate_pair(
    session: &Session,
    mechanism: Mechanism,
    curve: &[u8],
    label: &'static str,
    usage: Attribute,
) -> Result<(), HsmError> {
    let name = label.as_bytes().to_vec();
    session
        .generate_key_pair(
            &mechanism,
            &[
                Attribute::Token(true),
                Attribute::Private(false),
                Attribute::Verify(true),
                Attribute::EcParams(curve.to_vec()),
                Attribute::Label(name.clone()),
            ],
            &[
                Attribute::Token(true),
                Attribute::Private(true),
                Attribute::Sensitive(true),
                Attribute::Extractable(false),
                usage,
                Attribute::Label(name),
            ],
        )
        .map(|_| ())
        .map_err(|e| HsmError::call("C_GenerateKeyPair", e))
}

pub(super) fn find_key(session: &Session, class: ObjectClass, label: &str) -> Result<Option<ObjectHandle>, HsmError> {
    session
        .find_objects(&[Attribute::Class(class), Attribute::Label(label.as_bytes().to_vec())])
        .map(|v| v.first().copied())
        .map_err(|e| HsmError::call("C_FindObjects", e))
}
