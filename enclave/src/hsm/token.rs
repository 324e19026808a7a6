//! The token: one module load, one login held by an anchor session, a bounded session pool, the
//! module's profile, and the service keys found by label (in the HSM, or sealed where the profile
//! says the module cannot hold them); randomness, certificate MACs, sealing and the signer keys.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::Slot;
use cryptoki::types::AuthPin;
use zeroize::Zeroizing;

use super::error::HsmError;
use super::kek::{self, GcmFault};
use super::key_labels::{
    kek_label, kek_version, LoginPublicKeys, CERT_MAC_LABEL, NOTARIZER_LABEL, OIDC_ISSUER_LABEL, PROOF_LABEL,
    SIGNER_LABEL, TLS_FETCHER_LABEL, WEBHOOK_SIGNER_LABEL,
};
use super::pool::{Lease, SessionPool};
#[cfg(test)]
use super::profile::IvSource;
use super::profile::{KeyHome, ModuleProfile};
use super::seal::{self, BlobBinding, OpenedBlob};
use super::software_keys::{self, SealedBlobCache, SealedKeyShelf};

const OID_P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_ED25519: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];
/// PKCS#11 3.0's return value for a failed AEAD tag check.
const CKR_AEAD_DECRYPT_FAILED: cryptoki_sys::CK_RV = 0x35;

/// Where the token is, how to log in, and what the module may be assumed to do. The PIN is a
/// `secrecy` string, wiped on drop.
pub struct HsmSettings {
    pub module: PathBuf,
    pub token_label: String,
    pub pin: AuthPin,
    /// Most sessions open for operations at once (the profile's limit, less the anchor, caps it).
    pub pool_size: usize,
    /// What the module may be assumed to do ([`ModuleProfile::named`]); `None` detects it from
    /// `C_GetInfo` (`hsm_profile = "auto"`).
    pub profile: Option<ModuleProfile>,
    /// Where sealed service keys are kept (the authority store); needed where the profile says
    /// a service key cannot live in the module.
    pub shelf: Option<Arc<dyn SealedKeyShelf>>,
    /// Whether this process makes keys (`init`): the module must then offer the key-generation
    /// mechanisms too; `serve` needs only the mechanisms it uses (a module with pre-provisioned
    /// keys may offer no key generation at all).
    pub creates_keys: bool,
    /// Most HSM-native keys the token, and one top-level organization, may hold (counted in the
    /// authority store); a total of 0 offers none.
    pub native_keys: NativeKeyBounds,
}

/// Bounds on the HSM-native keys of one token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NativeKeyBounds {
    /// Every organization together; 0 offers none.
    pub total: u64,
    /// One top-level organization, its sub-organizations with it.
    pub per_organization: u64,
}

impl std::fmt::Debug for HsmSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HsmSettings")
            .field("module", &self.module)
            .field("token_label", &self.token_label)
            .field("pin", &"<redacted>")
            .field("pool_size", &self.pool_size)
            .field("profile", &self.profile.as_ref().map(|p| p.name))
            .field("shelf", &self.shelf.is_some())
            .field("creates_keys", &self.creates_keys)
            .finish()
    }
}

/// Handles of the service keys; valid only for the current login (re-resolved after recovery).
#[derive(Clone, Copy)]
pub(super) struct ServiceKeys {
    signer: ObjectHandle,
    /// Absent where the profile keeps the key sealed in the authority store (also for the
    /// webhook signer and the TLS-fetcher key).
    cert_mac: Option<ObjectHandle>,
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
    /// The KEKs found so far, by label.
    keks: HashMap<String, ObjectHandle>,
    /// HSM-native keys found so far, by label (at most [`NATIVE_HANDLES`]).
    native: HashMap<String, ObjectHandle>,
}

/// HSM-native key handles remembered at most (about 100 bytes each); past it the memory starts
/// over.
const NATIVE_HANDLES: usize = 65_536;

/// A logged-in token with a pool of sessions. Cheap to share behind an `Arc`.
pub struct Hsm {
    ctx: Pkcs11,
    slot: Slot,
    pin: AuthPin,
    profile: ModuleProfile,
    /// Whether the profile was detected (`hsm_profile = "auto"`), not configured.
    auto: bool,
    anchor: Mutex<Anchor>,
    pool: SessionPool,
    pub(super) shelf: Option<Arc<dyn SealedKeyShelf>>,
    pub(super) sealed_blobs: SealedBlobCache,
    signer_public: OnceLock<[u8; 65]>,
    webhook_public: OnceLock<[u8; 32]>,
    pub(super) login_public: OnceLock<LoginPublicKeys>,
    pub(super) proof_public: OnceLock<[u8; 65]>,
    /// Most HSM-native keys the token and one organization may hold ([`HsmSettings::native_keys`]).
    pub(super) native_keys: NativeKeyBounds,
    /// Seals this process may still make under the KEK before it reserves more from the store
    /// ([`Hsm::count_seal`]).
    seal_budget: Mutex<SealBudget>,
    /// Certificates whose MAC this process checked valid, by digest of what was checked: a
    /// credential stamps request after request with one certificate, and a MAC check in the HSM
    /// (a `C_VerifyInit` each) was about 9 % of the enclave's CPU per signature.
    verified_certificates: crate::bounded_cache::BoundedCache<()>,
}

/// The seals reserved for this process under the KEK `label`: the next one's number and the end
/// of the block (`next == end`: none left).
#[derive(Default)]
struct SealBudget {
    label: String,
    next: u64,
    end: u64,
}

/// Seals reserved from the store at a time: a durable write per 1,024 seals. A block an enclave
/// does not use up (it stops) stays counted: the count is an upper bound.
const SEAL_BLOCK: u64 = 1024;
/// Seals under one KEK past which every reservation warns (2³¹)...
const SEALS_WARN: u64 = 1 << 31;
/// ...and at which sealing stops (2³², NIST SP 800-38D §8.3 for random 96-bit IVs).
const SEALS_MAX: u64 = 1 << 32;

/// Bytes of certificates checked valid the enclave remembers ([`Hsm::certificate_mac_valid`]):
/// about 32,000 of them.
const VERIFIED_CERTIFICATES_BYTES: usize = 4 << 20;
/// What one remembered certificate is charged: its key (64 hex digits) and the map's entry.
const VERIFIED_CERTIFICATE_BYTES: usize = 128;

/// A PKCS#11 module is a process-wide singleton: `C_Initialize` may run only once per module
/// (a process may load several, as the HSM tests do).
static MODULES: Mutex<Option<HashMap<PathBuf, Pkcs11>>> = Mutex::new(None);

fn load_module(path: &Path) -> Result<Pkcs11, HsmError> {
    let mut modules = MODULES.lock().map_err(|_| HsmError::Poisoned)?;
    let modules = modules.get_or_insert_with(HashMap::new);
    if let Some(ctx) = modules.get(path) {
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
    modules.insert(path.to_path_buf(), ctx.clone());
    Ok(ctx)
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
    // SoftHSM adds its next free slot while another token is being initialised: a list taken
    // then may have none, and the next one does.
    let mut free = None;
    for attempt in 0..3 {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let slots = ctx.get_slots_with_token().map_err(|e| HsmError::call("C_GetSlotList", e))?;
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
        if free.is_some() {
            break;
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
    /// Loads the module, chooses its profile, checks that the module offers every mechanism the
    /// profile needs (refusing with what is missing), finds the token by label and logs in once.
    pub fn open(settings: HsmSettings) -> Result<Self, HsmError> {
        let ctx = load_module(&settings.module)?;
        let auto = settings.profile.is_none();
        let profile = match settings.profile {
            Some(profile) => profile,
            None => ModuleProfile::detect(&ctx)?,
        };
        let slot = ctx
            .get_slots_with_initialized_token()
            .map_err(|e| HsmError::call("C_GetSlotList", e))?
            .into_iter()
            .find(|s| ctx.get_token_info(*s).map(|t| t.label().trim_end() == settings.token_label).unwrap_or(false))
            .ok_or_else(|| HsmError::TokenNotFound(settings.token_label.clone()))?;
        let session = ctx.open_rw_session(slot).map_err(|e| HsmError::call("C_OpenSession", e))?;
        login(&session, &settings.pin)?;
        let profile = profile.check(&ctx, slot, settings.creates_keys, |mechanism, public, private| {
            let (public, private) = session.generate_key_pair(mechanism, public, private)?;
            session.destroy_object(private)?;
            session.destroy_object(public)
        })?;
        // The anchor holds one of the module's sessions.
        let limit =
            profile.max_sessions.map_or(settings.pool_size, |max| settings.pool_size.min(max.saturating_sub(1)));
        tracing::info!(
            profile = profile.name,
            iv = ?profile.iv_source,
            webhook_signer = ?profile.webhook_signer,
            tls_fetcher = ?profile.tls_fetcher,
            certificate_mac = ?profile.cert_mac,
            sessions = limit.max(1),
            "PKCS#11 module profile"
        );
        Ok(Self {
            ctx,
            slot,
            pin: settings.pin,
            profile,
            auto,
            anchor: Mutex::new(Anchor { _session: session, keys: None, keks: HashMap::new(), native: HashMap::new() }),
            pool: SessionPool::new(limit),
            shelf: settings.shelf,
            sealed_blobs: SealedBlobCache::default(),
            signer_public: OnceLock::new(),
            webhook_public: OnceLock::new(),
            login_public: OnceLock::new(),
            proof_public: OnceLock::new(),
            verified_certificates: crate::bounded_cache::BoundedCache::new(VERIFIED_CERTIFICATES_BYTES),
            seal_budget: Mutex::default(),
            native_keys: settings.native_keys,
        })
    }

    /// Counts one seal under the KEK `label` against its bound, reserving a block of seals from
    /// the authority store when this process has none left under it (every enclave on the store
    /// counts into one total). Warns past 2³¹ seals, refuses at 2³². Not counted without a store
    /// (tests, tools that seal nothing).
    fn count_seal(&self, label: &str) -> Result<(), HsmError> {
        let Some(shelf) = &self.shelf else { return Ok(()) };
        let mut budget = self.seal_budget.lock().map_err(|_| HsmError::Poisoned)?;
        if budget.label != label || budget.next == budget.end {
            let end = shelf.reserve_seals(label, SEAL_BLOCK)?;
            *budget = SealBudget { label: label.to_string(), next: end.saturating_sub(SEAL_BLOCK), end };
            if end > SEALS_WARN {
                tracing::warn!(
                    kek = label,
                    seals = end,
                    "the KEK is past 2^31 seals: rotate it (coffer-gateway rotate-kek) before 2^32, where sealing stops"
                );
            } else {
                tracing::info!(kek = label, seals = end, "seals reserved under the KEK");
            }
        }
        if budget.next >= SEALS_MAX {
            return Err(HsmError::KekExhausted { label: label.to_string(), count: budget.next });
        }
        budget.next += 1;
        Ok(())
    }

    /// The label of the KEK new seals use: the newest the authority store records (rotation
    /// adds one), `coffer-kek-v1` while it records none or the HSM has no store.
    pub fn current_kek(&self) -> Result<String, HsmError> {
        let newest = match &self.shelf {
            Some(shelf) => shelf.keks()?.iter().map(|k| k.version).max().unwrap_or(1),
            None => 1,
        };
        Ok(kek_label(newest.max(1)))
    }

    /// The handle of the KEK labelled `label` (found once per login); `UnknownKek` if the token
    /// holds none (destroyed, or never made here). A rotated KEK is the object of the `CKA_ID`
    /// the store recorded for it where the label has several (a rotation that lost a race, or
    /// stopped before it was recorded, leaves one).
    pub(super) fn kek(&self, label: &str) -> Result<ObjectHandle, HsmError> {
        if let Some(handle) = self.anchor.lock().map_err(|_| HsmError::Poisoned)?.keks.get(label) {
            return Ok(*handle);
        }
        let session = self.session()?;
        let mut found = objects_labelled(&session, ObjectClass::SECRET_KEY, label)?;
        if found.len() > 1 {
            let recorded = match (&self.shelf, kek_version(label)) {
                (Some(shelf), Some(version)) => {
                    shelf.keks()?.into_iter().find(|k| k.version == version).and_then(|k| k.object_id)
                }
                _ => None,
            };
            if let Some(id) = recorded {
                let by_id = [
                    Attribute::Class(ObjectClass::SECRET_KEY),
                    Attribute::Label(label.as_bytes().to_vec()),
                    Attribute::Id(id),
                ];
                found = session.find_objects(&by_id).map_err(|e| HsmError::call("C_FindObjects", e))?;
            }
        }
        let handle = match found.as_slice() {
            [] => return Err(HsmError::UnknownKek(label.to_string())),
            [one] => *one,
            many => return Err(HsmError::DuplicateLabel { label: label.to_string(), count: many.len() }),
        };
        drop(session);
        self.anchor.lock().map_err(|_| HsmError::Poisoned)?.keks.insert(label.to_string(), handle);
        Ok(handle)
    }

    /// Makes a new KEK object labelled `label` with `CKA_ID` `object_id` (a rotation's), and
    /// remembers it as the KEK of that label in this process.
    pub(super) fn make_rotated_kek(&self, label: &str, object_id: &[u8]) -> Result<ObjectHandle, HsmError> {
        let mut template = secret_template(KeyType::AES, label);
        template.extend([Attribute::Id(object_id.to_vec()), Attribute::Encrypt(true), Attribute::Decrypt(true)]);
        let handle = self
            .session()?
            .generate_key(&Mechanism::AesKeyGen, &template)
            .map_err(|e| HsmError::call("C_GenerateKey (KEK)", e))?;
        self.anchor.lock().map_err(|_| HsmError::Poisoned)?.keks.insert(label.to_string(), handle);
        Ok(handle)
    }

    /// Destroys the object `handle`.
    pub(super) fn destroy_object(&self, handle: ObjectHandle) -> Result<(), HsmError> {
        self.session()?.destroy_object(handle).map_err(|e| HsmError::call("C_DestroyObject", e))
    }

    /// The handle of the HSM-native key labelled `label` (found once per login);
    /// `NativeKeyMissing` if the token holds none.
    pub(super) fn native_handle(&self, label: &str) -> Result<ObjectHandle, HsmError> {
        if let Some(handle) = self.anchor.lock().map_err(|_| HsmError::Poisoned)?.native.get(label) {
            return Ok(*handle);
        }
        let handle = find_key(&*self.session()?, ObjectClass::PRIVATE_KEY, label)?
            .ok_or_else(|| HsmError::NativeKeyMissing(label.to_string()))?;
        let mut anchor = self.anchor.lock().map_err(|_| HsmError::Poisoned)?;
        if anchor.native.len() >= NATIVE_HANDLES {
            anchor.native.clear();
        }
        anchor.native.insert(label.to_string(), handle);
        Ok(handle)
    }

    /// Forgets the handle of the HSM-native key `label` (destroyed).
    pub(super) fn forget_native(&self, label: &str) -> Result<(), HsmError> {
        self.anchor.lock().map_err(|_| HsmError::Poisoned)?.native.remove(label);
        Ok(())
    }

    /// Forgets the handle of the KEK `label` (after it was destroyed).
    pub(super) fn forget_kek(&self, label: &str) -> Result<(), HsmError> {
        self.anchor.lock().map_err(|_| HsmError::Poisoned)?.keks.remove(label);
        Ok(())
    }

    /// Creates the keys every module holds itself, the KEK and the bundle signer, if they are
    /// missing; answers those it created. `init` makes them first, and runs the sealing
    /// self-test before it seals any service key under the KEK.
    pub fn init_resident_keys(&self) -> Result<Vec<String>, HsmError> {
        let mut created = Vec::new();
        let kek = self.current_kek()?;
        if self.make_kek(&kek)? {
            created.push(kek);
        }
        if find_key(&*self.session()?, ObjectClass::PRIVATE_KEY, SIGNER_LABEL)?.is_none() {
            generate_pair(&*self.session()?, Mechanism::EccKeyPairGen, OID_P256, SIGNER_LABEL, Attribute::Sign(true))?;
            created.push(SIGNER_LABEL.to_string());
        }
        if !created.is_empty() {
            // Found from now on (blobs are sealed under the KEK).
            self.anchor.lock().map_err(|_| HsmError::Poisoned)?.keys = None;
        }
        Ok(created)
    }

    /// Makes the KEK `label` in the token unless it holds it already; answers whether it made it.
    pub(super) fn make_kek(&self, label: &str) -> Result<bool, HsmError> {
        if find_key(&*self.session()?, ObjectClass::SECRET_KEY, label)?.is_some() {
            return Ok(false);
        }
        let usage = [Attribute::Encrypt(true), Attribute::Decrypt(true)];
        generate_secret(&*self.session()?, Mechanism::AesKeyGen, KeyType::AES, label, usage)
            .map_err(|e| HsmError::call("C_GenerateKey (KEK)", e))?;
        Ok(true)
    }

    /// Creates the service keys if they are missing (idempotent), each where the profile says:
    /// in the HSM, or sealed in the authority store. Returns what it created.
    pub fn init_service_keys(&self) -> Result<Vec<String>, HsmError> {
        // Each step leases a session of its own and returns it before sealing (which leases
        // again): a pool bounded at one session must not wait for itself.
        let mut created = self.init_resident_keys()?;
        let sealed_or_missing = |class, label| -> Result<bool, HsmError> {
            Ok(find_key(&*self.session()?, class, label)?.is_none() && !self.has_sealed_key(label)?)
        };
        if sealed_or_missing(ObjectClass::SECRET_KEY, CERT_MAC_LABEL)? {
            if self.profile.cert_mac == KeyHome::Sealed {
                self.create_sealed_key(CERT_MAC_LABEL, |_| true)?;
            } else {
                let (key_type, usage) =
                    (self.profile.cert_mac_key_type, [Attribute::Sign(true), Attribute::Verify(true)]);
                generate_secret(&*self.session()?, Mechanism::GenericSecretKeyGen, key_type, CERT_MAC_LABEL, usage)
                    .map_err(|e| HsmError::call("C_GenerateKey (certificate MAC key)", e))?;
            }
            created.push(CERT_MAC_LABEL.to_string());
        }
        if sealed_or_missing(ObjectClass::PRIVATE_KEY, WEBHOOK_SIGNER_LABEL)? {
            if self.profile.webhook_signer == KeyHome::Sealed {
                self.create_sealed_key(WEBHOOK_SIGNER_LABEL, |_| true)?;
            } else {
                generate_pair(
                    &*self.session()?,
                    Mechanism::EccEdwardsKeyPairGen,
                    OID_ED25519,
                    WEBHOOK_SIGNER_LABEL,
                    Attribute::Sign(true),
                )?;
            }
            created.push(WEBHOOK_SIGNER_LABEL.to_string());
        }
        for (label, usage) in [
            (NOTARIZER_LABEL, Attribute::Sign(true)),
            (OIDC_ISSUER_LABEL, Attribute::Sign(true)),
            (PROOF_LABEL, Attribute::Sign(true)),
            (TLS_FETCHER_LABEL, Attribute::Derive(true)),
        ] {
            if !sealed_or_missing(ObjectClass::PRIVATE_KEY, label)? {
                continue;
            }
            if label == TLS_FETCHER_LABEL && self.profile.tls_fetcher == KeyHome::Sealed {
                self.create_sealed_key(label, software_keys::is_p256_scalar)?;
            } else {
                generate_pair(&*self.session()?, Mechanism::EccKeyPairGen, OID_P256, label, usage)?;
            }
            created.push(label.to_string());
        }
        self.anchor.lock().map_err(|_| HsmError::Poisoned)?.keys = None;
        Ok(created)
    }

    /// The profile the enclave runs under, its `HsmIfOffered` homes settled at start.
    pub fn profile(&self) -> &ModuleProfile {
        &self.profile
    }

    /// Whether the profile was detected from the module, not configured.
    pub(super) fn auto_detected(&self) -> bool {
        self.auto
    }

    /// Runs as if its profile had been detected (`hsm_profile = "auto"`), for tests of what
    /// detection does with a vendor's profile on a module of another vendor.
    #[cfg(test)]
    pub(super) fn as_if_detected(&mut self) {
        self.auto = true;
    }

    /// Runs under `profile` from now on (the self-test's choice of how to seal).
    pub(super) fn set_sealing(&mut self, profile: ModuleProfile) {
        self.profile = profile;
    }

    /// A session from the pool (waits while all are leased); returns to it when dropped.
    pub(crate) fn session(&self) -> Result<Lease<'_>, HsmError> {
        self.pool.take(|| {
            let session = self.ctx.open_rw_session(self.slot).map_err(|e| HsmError::call("C_OpenSession", e))?;
            if !self.profile.shared_login {
                login(&session, &self.pin)?;
            }
            Ok(session)
        })
    }

    /// The most sessions the pool lets be open at once, and the most it ever had open.
    pub fn session_bound_and_peak(&self) -> (usize, usize) {
        (self.pool.limit(), self.pool.peak())
    }

    pub(super) fn keys(&self) -> Result<ServiceKeys, HsmError> {
        let mut anchor = self.anchor.lock().map_err(|_| HsmError::Poisoned)?;
        if let Some(keys) = anchor.keys {
            return Ok(keys);
        }
        let session = self.session()?;
        let signer =
            find_key(&session, ObjectClass::PRIVATE_KEY, SIGNER_LABEL)?.ok_or(HsmError::KeyMissing(SIGNER_LABEL))?;
        let keys = ServiceKeys {
            signer,
            cert_mac: find_key(&session, ObjectClass::SECRET_KEY, CERT_MAC_LABEL)?,
            webhook: find_key(&session, ObjectClass::PRIVATE_KEY, WEBHOOK_SIGNER_LABEL)?,
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
        self.pool.clear()?;
        let session = self.ctx.open_rw_session(self.slot).map_err(|e| HsmError::call("C_OpenSession", e))?;
        login(&session, &self.pin)?;
        let mut anchor = self.anchor.lock().map_err(|_| HsmError::Poisoned)?;
        *anchor = Anchor { _session: session, keys: None, keks: HashMap::new(), native: HashMap::new() };
        Ok(())
    }

    /// Runs `op` on a pooled session. A session that saw an error is closed, never reused
    /// (an abandoned operation would wedge it); a lost session or login is recovered once.
    pub(super) fn with_session<T>(
        &self,
        op: impl Fn(&Session, ServiceKeys) -> Result<T, CkError>,
        call: &'static str,
    ) -> Result<T, HsmError> {
        self.with_session_using(|| self.keys(), op, call)
    }

    /// [`Hsm::with_session`] with the KEK labelled `label`.
    fn with_kek<T>(
        &self,
        label: &str,
        op: impl Fn(&Session, ObjectHandle) -> Result<T, CkError>,
        call: &'static str,
    ) -> Result<T, HsmError> {
        self.with_session_using(|| self.kek(label), op, call)
    }

    /// [`Hsm::with_session`] with the handles `handles` finds (again after a recovery).
    pub(super) fn with_session_using<K, T>(
        &self,
        handles: impl Fn() -> Result<K, HsmError>,
        op: impl Fn(&Session, K) -> Result<T, CkError>,
        call: &'static str,
    ) -> Result<T, HsmError> {
        let mut recovered = false;
        loop {
            let keys = handles()?;
            let session = self.session()?;
            match op(&session, keys) {
                Ok(v) => return Ok(v),
                Err(e) if needs_recovery(&e) && !recovered => {
                    session.discard();
                    self.recover()?;
                    recovered = true;
                }
                Err(e) => {
                    session.discard();
                    return Err(HsmError::call(call, e));
                }
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

    /// HMAC-SHA256 of `data` under the certificate key: in the HSM, or with the sealed key
    /// opened in the enclave where the profile keeps it sealed.
    pub fn certificate_mac(&self, data: &[u8]) -> Result<Vec<u8>, HsmError> {
        use hmac::Mac;
        let in_hsm = self.with_session(
            |s, keys| keys.cert_mac.map(|key| s.sign(&Mechanism::Sha256Hmac, key, data)).transpose(),
            "C_Sign (certificate MAC)",
        )?;
        if let Some(mac) = in_hsm {
            return Ok(mac);
        }
        let mut mac = software_keys::hmac_sha256(&self.open_sealed_key(CERT_MAC_LABEL)?)?;
        mac.update(data);
        Ok(mac.finalize().into_bytes().to_vec())
    }

    /// Whether `mac` is the certificate key's HMAC-SHA256 of `data` (checked in the HSM, or in
    /// constant time with the sealed key). A valid one is remembered, by the digest of `data`
    /// and `mac` together, so that the next request stamped with the same certificate is not
    /// checked in the HSM again (the key never changes while the process runs); an invalid one
    /// is checked every time.
    pub fn certificate_mac_valid(&self, data: &[u8], mac: &[u8]) -> Result<bool, HsmError> {
        if mac.len() != 32 {
            return Ok(false);
        }
        let checked = {
            use sha2::Digest;
            let mut d = sha2::Sha256::new();
            d.update((data.len() as u64).to_be_bytes());
            d.update(data);
            d.update(mac);
            hex::encode(d.finalize())
        };
        if self.verified_certificates.get(&checked).is_some() {
            return Ok(true);
        }
        let valid = self.certificate_mac_checked(data, mac)?;
        if valid {
            self.verified_certificates.insert(&checked, (), VERIFIED_CERTIFICATE_BYTES);
        }
        Ok(valid)
    }

    /// [`Hsm::certificate_mac_valid`] without the memory of valid ones.
    fn certificate_mac_checked(&self, data: &[u8], mac: &[u8]) -> Result<bool, HsmError> {
        use hmac::Mac;
        let result = self.with_session(
            |s, keys| keys.cert_mac.map(|key| s.verify(&Mechanism::Sha256Hmac, key, data, mac)).transpose(),
            "C_Verify (certificate MAC)",
        );
        match result {
            Ok(Some(())) => Ok(true),
            Ok(None) => {
                let mut expected = software_keys::hmac_sha256(&self.open_sealed_key(CERT_MAC_LABEL)?)?;
                expected.update(data);
                Ok(expected.verify_slice(mac).is_ok())
            }
            Err(HsmError::Pkcs11 { rv: RvError::SignatureInvalid | RvError::SignatureLenRange, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Seals `plaintext` under the KEK (AES-256-GCM in the HSM, the IV produced as the profile
    /// says and recorded in the blob), bound to `binding`.
    pub fn seal(&self, binding: &BlobBinding<'_>, plaintext: &[u8]) -> Result<Vec<u8>, HsmError> {
        self.seal_under(&self.current_kek()?, binding, plaintext)
    }

    /// [`Hsm::seal`] under the KEK labelled `kek_label`.
    pub(super) fn seal_under(
        &self,
        kek_label: &str,
        binding: &BlobBinding<'_>,
        plaintext: &[u8],
    ) -> Result<Vec<u8>, HsmError> {
        self.count_seal(kek_label)?;
        let aad = binding.aad(seal::VERSION, kek_label);
        let output = self
            .with_kek(kek_label, |s, kek| kek::encrypt(s, kek, &self.profile, &aad, plaintext), "C_Encrypt (seal)")?
            .map_err(|fault| match fault {
                GcmFault::NoIvWrittenBack => HsmError::Malformed("the module wrote no GCM IV back (check hsm_profile)"),
                GcmFault::ShortOutput => HsmError::Malformed("the module's GCM output has no room for its IV"),
            })?;
        let blob =
            seal::encode(seal::VERSION, kek_label, self.profile.iv_source.code(), &output.iv, &output.ciphertext);
        // Opened once before it is kept: a module that seals what it cannot open again (a Luna in
        // FIPS mode sent caller IVs) is found now, not when a user signs. One decrypt per seal;
        // seals are never on the signing path.
        match self.unseal(binding, &blob) {
            Ok(opened) if opened.as_slice() == plaintext => Ok(blob),
            Ok(_) | Err(HsmError::SealAuthentication) => Err(HsmError::SealNotReopened(self.profile.name)),
            Err(e) => Err(e),
        }
    }

    /// A blob in an earlier format (version 1 or 2, caller IVs), as earlier enclaves sealed
    /// them (tests only).
    #[cfg(test)]
    pub(crate) fn seal_as_version(
        &self,
        binding: &BlobBinding<'_>,
        plaintext: &[u8],
        version: u8,
    ) -> Result<Vec<u8>, HsmError> {
        let label = self.current_kek()?;
        let aad = binding.aad(version, &label);
        let caller = ModuleProfile { iv_source: IvSource::Caller, iv_len: 12, ..self.profile.clone() };
        let output = self
            .with_kek(&label, |s, kek| kek::encrypt(s, kek, &caller, &aad, plaintext), "C_Encrypt (seal)")?
            .expect("caller IVs");
        Ok(seal::encode(version, &label, 0, &output.iv, &output.ciphertext))
    }

    /// Opens (unseals) a sealed blob; fails with `SealAuthentication` if it was bound elsewhere or
    /// altered. Whatever produced its IV, the recorded IV opens it; version 1 blobs open under
    /// their legacy binding.
    pub fn unseal(&self, binding: &BlobBinding<'_>, blob: &[u8]) -> Result<OpenedBlob, HsmError> {
        let parsed = seal::decode(blob)?;
        if kek_version(parsed.kek_label).is_none() {
            return Err(HsmError::UnknownKek(parsed.kek_label.to_string()));
        }
        let aad = binding.aad(parsed.version, parsed.kek_label);
        let result = self.with_kek(
            parsed.kek_label,
            |s, kek| kek::decrypt(s, kek, &self.profile, parsed.iv, &aad, parsed.ciphertext).map(OpenedBlob::new),
            "C_Decrypt (open)",
        );
        match result {
            Ok(pt) => Ok(pt),
            // SoftHSM reports a failed GCM tag check as CKR_GENERAL_ERROR (notes 4.9); PKCS#11 3.0
            // modules as CKR_AEAD_DECRYPT_FAILED, which cryptoki 0.12 does not name.
            Err(HsmError::Pkcs11 {
                rv:
                    RvError::GeneralError
                    | RvError::EncryptedDataInvalid
                    | RvError::EncryptedDataLenRange
                    | RvError::UnknownErrorCode(CKR_AEAD_DECRYPT_FAILED),
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

    /// The webhook signer's Ed25519 public key, read once from the token (or from the sealed
    /// seed, where the profile keeps it sealed).
    pub fn webhook_public_key(&self) -> Result<[u8; 32], HsmError> {
        if let Some(pk) = self.webhook_public.get() {
            return Ok(*pk);
        }
        let pk: [u8; 32] = if self.keys()?.webhook.is_some() {
            self.public_point(WEBHOOK_SIGNER_LABEL, 32)?
                .try_into()
                .map_err(|_| HsmError::Malformed("webhook signer public key is not 32 bytes"))?
        } else {
            let seed = self.open_sealed_key(WEBHOOK_SIGNER_LABEL)?;
            software_keys::ed25519_key(&seed).verifying_key().to_bytes()
        };
        Ok(*self.webhook_public.get_or_init(|| pk))
    }

    /// Pure Ed25519 over each of `messages` with the webhook signer, in one session (or with the
    /// sealed seed, opened once); every signature is checked against the public key before it
    /// leaves (a faulty signature is never handed out).
    pub fn sign_webhooks(&self, messages: &[Vec<u8>]) -> Result<Vec<[u8; 64]>, HsmError> {
        use cryptoki::mechanism::eddsa::{EddsaParams, EddsaSignatureScheme};
        use ed25519_dalek::Signer;
        let public = self.webhook_public_key()?;
        let in_hsm = self.with_session(
            |s, keys| {
                let Some(key) = keys.webhook else { return Ok(None) };
                let mechanism = Mechanism::Eddsa(EddsaParams::new(EddsaSignatureScheme::Pure));
                messages.iter().map(|m| s.sign(&mechanism, key, m)).collect::<Result<Vec<_>, _>>().map(Some)
            },
            "C_Sign (webhook signer)",
        )?;
        let raw: Vec<Vec<u8>> = match in_hsm {
            Some(raw) => raw,
            None if messages.is_empty() => Vec::new(),
            None => {
                let key = software_keys::ed25519_key(&self.open_sealed_key(WEBHOOK_SIGNER_LABEL)?);
                messages.iter().map(|m| key.sign(m).to_bytes().to_vec()).collect()
            }
        };
        let key = ed25519_dalek::VerifyingKey::from_bytes(&public)
            .map_err(|_| HsmError::Malformed("webhook signer public key is not a curve point"))?;
        raw.iter()
            .zip(messages)
            .map(|(raw, message)| {
                let signature: [u8; 64] =
                    raw.as_slice().try_into().map_err(|_| HsmError::Malformed("Ed25519 signature is not 64 bytes"))?;
                key.verify_strict(message, &ed25519_dalek::Signature::from_bytes(&signature))
                    .map_err(|_| HsmError::Malformed("the webhook signature does not verify"))?;
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

/// Generates a 32-byte token secret key of `key_type` under `label` for two `usage`s: sensitive
/// and never extractable.
pub(super) fn generate_secret(
    session: &Session,
    mechanism: Mechanism,
    key_type: KeyType,
    label: &str,
    usage: [Attribute; 2],
) -> Result<(), CkError> {
    let mut template = secret_template(key_type, label);
    template.extend(usage);
    session.generate_key(&mechanism, &template).map(|_| ())
}

/// A 32-byte token secret key of `key_type` under `label`: sensitive and never extractable.
fn secret_template(key_type: KeyType, label: &str) -> Vec<Attribute> {
    vec![
        Attribute::Class(ObjectClass::SECRET_KEY),
        Attribute::KeyType(key_type),
        Attribute::ValueLen(32.into()),
        Attribute::Token(true),
        Attribute::Private(true),
        Attribute::Sensitive(true),
        Attribute::Extractable(false),
        Attribute::Label(label.as_bytes().to_vec()),
    ]
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

/// Every object of `class` labelled `label` (a KEK's label may have several: see [`Hsm::kek`]).
pub(super) fn objects_labelled(
    session: &Session,
    class: ObjectClass,
    label: &str,
) -> Result<Vec<ObjectHandle>, HsmError> {
    session
        .find_objects(&[Attribute::Class(class), Attribute::Label(label.as_bytes().to_vec())])
        .map_err(|e| HsmError::call("C_FindObjects", e))
}

/// The one object of `class` labelled `label`, if any; refused if the token holds several (two
/// `init` runs at once can make two, and which one a search finds first is the module's choice).
pub(super) fn find_key(session: &Session, class: ObjectClass, label: &str) -> Result<Option<ObjectHandle>, HsmError> {
    let found = objects_labelled(session, class, label)?;
    match found.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(*one)),
        many => Err(HsmError::DuplicateLabel { label: label.to_string(), count: many.len() }),
    }
}
