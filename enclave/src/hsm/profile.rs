//! What Coffer may assume about its PKCS#11 module, in one place: a profile per module family
//! (named in the configuration or detected from `C_GetInfo`), and the start-up check that the
//! module offers every mechanism the profile needs.

use cryptoki::context::{Function, Pkcs11};
use cryptoki::mechanism::{Mechanism, MechanismType};
use cryptoki::object::{Attribute, KeyType};
use cryptoki::slot::Slot;

use super::error::HsmError;

/// How the AES-GCM IV of a seal under the KEK is produced. Every blob records its IV (format
/// version 3), so a blob sealed in one mode opens under any profile of the same KEK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IvSource {
    /// Coffer draws the IV from `C_GenerateRandom` and passes it in `CK_GCM_PARAMS.pIv`.
    Caller,
    /// The module chooses the IV and writes it into `pIv` (a zeroed buffer) during `C_Encrypt`.
    WrittenBack,
    /// The module chooses the IV and appends it to the output: ciphertext ‖ tag ‖ IV.
    Appended,
    /// The module chooses the IV and puts it in front of the output: IV ‖ ciphertext ‖ tag.
    Prepended,
    /// The module generates the IV through the PKCS#11 3.0 message API (`C_EncryptMessage` with
    /// `CKG_GENERATE_RANDOM`) and writes it into `pIv`.
    MessageApi,
}

impl IvSource {
    /// The byte a version 3 blob records.
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Caller => 1,
            Self::WrittenBack => 2,
            Self::Appended => 3,
            Self::Prepended => 4,
            Self::MessageApi => 5,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        [Self::Caller, Self::WrittenBack, Self::Appended, Self::Prepended, Self::MessageApi]
            .into_iter()
            .find(|s| s.code() == code)
    }
}

/// Where a service key lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyHome {
    /// A token object: sensitive, never extractable, used through the module.
    Hsm,
    /// A software key: generated from the HSM's randomness, sealed under the KEK, kept in the
    /// authority store, opened only inside the enclave for one use and zeroized.
    Sealed,
    /// In the HSM if the module offers the mechanisms at start, sealed otherwise.
    HsmIfOffered,
}

/// What Coffer may assume about a PKCS#11 module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleProfile {
    /// The profile's name in the configuration (`hsm_profile`).
    pub name: &'static str,
    /// The mechanism that seals and opens under the KEK: `CKM_AES_GCM`, or a vendor's GCM.
    pub gcm_mechanism: MechanismType,
    pub iv_source: IvSource,
    /// Bytes of IV the module uses (and a blob records).
    pub iv_len: usize,
    /// The Ed25519 key that signs webhook deliveries.
    pub webhook_signer: KeyHome,
    /// The P-256 key OAuth 2.0 client secrets are encrypted to (raw ECDH, `CKD_NULL`).
    pub tls_fetcher: KeyHome,
    /// The HMAC-SHA256 key that certifies credentials.
    pub cert_mac: KeyHome,
    /// The key type of an HSM-resident certificate MAC key (`CKK_GENERIC_SECRET` on most
    /// modules, `CKK_SHA256_HMAC` where the module types HMAC keys).
    pub cert_mac_key_type: KeyType,
    /// Most sessions open at once, the anchor session included; `None` where the module sets no
    /// limit worth knowing (the configured `session_pool` still bounds it).
    pub max_sessions: Option<usize>,
    /// Whether one `C_Login` serves every session of the process (PKCS#11's rule); where not,
    /// every new session logs in.
    pub shared_login: bool,
    /// Whether objects another process creates (`coffer-enclave init`) become visible to a
    /// running enclave; where not, the enclave must be restarted after `init`.
    pub sees_other_processes_objects: bool,
    /// Whether `coffer-enclave init-token` can work (`C_InitToken`); elsewhere the vendor's tools
    /// make the token or partition.
    pub init_token: bool,
    /// Whether the module makes secp256k1 key pairs (checked by making one at start): HSM-native
    /// keys (`FEATURE_NAME_COFFER_HSM_NATIVE_KEYS`) are offered on secp256k1 only then, on P-256
    /// everywhere. Set for SoftHSM; the vendor profiles leave it off until a run on the module
    /// shows it (their documentation says Luna, CloudHSM, nShield and YubiHSM make them).
    pub native_secp256k1: bool,
}

/// The names `hsm_profile` accepts.
pub const PROFILE_NAMES: [&str; 11] = [
    "auto",
    "softhsm",
    "kryoptic",
    "cloudhsm",
    "luna",
    "luna-fips",
    "nshield",
    "nshield-fips",
    "yubihsm",
    "gcp-kms",
    "generic",
];

const OID_SECP256K1: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x0a];

/// `CKM_VENDOR_DEFINED | 0x1E100 | 1`: Google Cloud KMS's AES-GCM (`kmsp11.h`).
const CKM_CLOUDKMS_AES_GCM: u64 = 0x8000_0000 | 0x1E100 | 0x01;

impl ModuleProfile {
    /// The built-in profile called `name` (not `auto`).
    pub fn named(name: &str) -> Option<Self> {
        let base = Self {
            name: "generic",
            gcm_mechanism: MechanismType::AES_GCM,
            iv_source: IvSource::Caller,
            iv_len: 12,
            webhook_signer: KeyHome::HsmIfOffered,
            tls_fetcher: KeyHome::HsmIfOffered,
            cert_mac: KeyHome::HsmIfOffered,
            cert_mac_key_type: KeyType::GENERIC_SECRET,
            max_sessions: None,
            shared_login: true,
            sees_other_processes_objects: true,
            init_token: true,
            native_secp256k1: false,
        };
        let sealed_extras = |p: Self| Self { webhook_signer: KeyHome::Sealed, tls_fetcher: KeyHome::Sealed, ..p };
        Some(match name {
            "generic" => base,
            "softhsm" => Self {
                name: "softhsm",
                webhook_signer: KeyHome::Hsm,
                tls_fetcher: KeyHome::Hsm,
                cert_mac: KeyHome::Hsm,
                native_secp256k1: true,
                ..base
            },
            // Ed25519 only when built against OpenSSL >= 3.2.
            "kryoptic" => Self {
                name: "kryoptic",
                iv_source: IvSource::MessageApi,
                tls_fetcher: KeyHome::Hsm,
                cert_mac: KeyHome::Hsm,
                ..base
            },
            // Client SDK 5: writes its own 12-byte IV into pIv; no Ed25519; ECDH with X9.63 KDFs.
            "cloudhsm" => Self {
                name: "cloudhsm",
                iv_source: IvSource::WrittenBack,
                cert_mac: KeyHome::Hsm,
                max_sessions: Some(1024),
                init_token: false,
                ..sealed_extras(base)
            },
            // Luna 7 outside FIPS mode: caller IVs; derived keys must be sensitive (no raw ECDH).
            "luna" => {
                Self { name: "luna", tls_fetcher: KeyHome::Sealed, cert_mac: KeyHome::Hsm, init_token: false, ..base }
            }
            // Luna 7 in FIPS mode: a 16-byte IV the HSM generates, appended to the output.
            "luna-fips" => Self {
                name: "luna-fips",
                iv_source: IvSource::Appended,
                iv_len: 16,
                cert_mac: KeyHome::Hsm,
                init_token: false,
                ..sealed_extras(base)
            },
            // Sees only the objects loaded when it started (unless CKNFAST_ASSUME_SINGLE_PROCESS=0).
            "nshield" => Self {
                name: "nshield",
                tls_fetcher: KeyHome::Sealed,
                cert_mac: KeyHome::Hsm,
                sees_other_processes_objects: false,
                init_token: false,
                ..base
            },
            // An nShield in a Security World conforming to FIPS 140 Level 3. Entrust's mechanism
            // list says only that some mechanisms "may be restricted" in such a world; what is
            // assumed is the PKCS#11 standard's way for a token that must choose its own GCM IV:
            // a 12-byte IV written back into pIv. The sealing self-test checks it on the module.
            "nshield-fips" => Self {
                name: "nshield-fips",
                iv_source: IvSource::WrittenBack,
                tls_fetcher: KeyHome::Sealed,
                cert_mac: KeyHome::Hsm,
                sees_other_processes_objects: false,
                init_token: false,
                ..base
            },
            // No AES-GCM at all (the start-up check refuses it for the KEK); 16 device sessions.
            "yubihsm" => Self {
                name: "yubihsm",
                webhook_signer: KeyHome::Hsm,
                tls_fetcher: KeyHome::Hsm,
                cert_mac: KeyHome::Hsm,
                cert_mac_key_type: KeyType::SHA256_HMAC,
                max_sessions: Some(16),
                init_token: false,
                ..base
            },
            // Only its vendor GCM, with a zeroed IV buffer it fills; no C_DeriveKey, no Ed25519,
            // HMAC keys need a vendor attribute.
            "gcp-kms" => Self {
                name: "gcp-kms",
                gcm_mechanism: MechanismType::new_vendor_defined(CKM_CLOUDKMS_AES_GCM).ok()?,
                iv_source: IvSource::WrittenBack,
                cert_mac: KeyHome::Sealed,
                init_token: false,
                ..sealed_extras(base)
            },
            _ => return None,
        })
    }

    /// The profile configured as `name`: `None` for `auto`, refused if unknown.
    pub fn configured(name: &str) -> Result<Option<Self>, HsmError> {
        match name {
            "auto" => Ok(None),
            _ => Self::named(name).map(Some).ok_or_else(|| unknown(name)),
        }
    }

    /// The profile of the module's manufacturer (`C_GetInfo`); a module none matches is refused
    /// (`hsm_profile = "generic"` runs it under the generic profile).
    pub fn detect(ctx: &Pkcs11) -> Result<Self, HsmError> {
        let info = ctx.get_library_info().map_err(|e| HsmError::call("C_GetInfo", e))?;
        let who = format!("{} {}", info.manufacturer_id(), info.library_description()).to_ascii_lowercase();
        let name = [
            ("softhsm", "softhsm"),
            ("kryoptic", "kryoptic"),
            ("cloudhsm", "cloudhsm"),
            ("amazon", "cloudhsm"),
            ("safenet", "luna"),
            ("luna", "luna"),
            ("ncipher", "nshield"),
            ("nshield", "nshield"),
            ("entrust", "nshield"),
            ("yubico", "yubihsm"),
            ("google", "gcp-kms"),
        ]
        .into_iter()
        .find(|(needle, _)| who.contains(needle))
        .map(|(_, name)| name)
        .ok_or_else(|| {
            HsmError::UnknownModule(
                format!("{} {}", info.manufacturer_id(), info.library_description()).trim().to_string(),
            )
        })?;
        Self::named(name).ok_or_else(|| unknown(name))
    }

    /// Checks that the module in `slot` offers every mechanism this profile needs, with the
    /// uses it needs them for, and settles each `HsmIfOffered` key home; refuses with one
    /// message naming everything missing. `creates_keys`: the key-generation mechanisms are
    /// needed too (`init`); `serve` needs only what it uses. A home `HsmIfOffered` is settled the
    /// same way for both (in the module where it generates and uses such keys), so that `serve`
    /// looks where `init` put the key. `probe` makes session objects (secp256k1).
    pub(crate) fn check(
        mut self,
        ctx: &Pkcs11,
        slot: Slot,
        creates_keys: bool,
        probe: impl Fn(&Mechanism, &[Attribute], &[Attribute]) -> Result<(), cryptoki::error::Error>,
    ) -> Result<Self, HsmError> {
        let offered = |mechanism: MechanismType, uses: &[Use]| -> Vec<String> {
            match ctx.get_mechanism_info(slot, mechanism) {
                Ok(info) => uses
                    .iter()
                    .filter(|u| !u.allowed_by(&info))
                    .map(|u| format!("{} for {}", mechanism_name(mechanism), u.name()))
                    .collect(),
                Err(_) => vec![mechanism_name(mechanism)],
            }
        };
        let mut missing = Vec::new();
        if creates_keys {
            missing.extend(offered(MechanismType::AES_KEY_GEN, &[Use::Generate]));
        }
        if self.iv_source == IvSource::MessageApi {
            if !ctx.is_fn_supported(Function::MessageEncryptInit) {
                missing.push("C_MessageEncryptInit (the PKCS#11 3.0 message API)".into());
            }
            missing.extend(offered(self.gcm_mechanism, &[Use::MessageEncrypt, Use::Decrypt]));
        } else {
            missing.extend(offered(self.gcm_mechanism, &[Use::Encrypt, Use::Decrypt]));
        }
        if creates_keys {
            missing.extend(offered(MechanismType::ECC_KEY_PAIR_GEN, &[Use::GenerateKeyPair]));
        }
        missing.extend(offered(MechanismType::ECDSA, &[Use::Sign]));
        // Each key the module may hold: what making it takes, and what using it takes.
        let webhook = (
            offered(MechanismType::ECC_EDWARDS_KEY_PAIR_GEN, &[Use::GenerateKeyPair]),
            offered(MechanismType::EDDSA, &[Use::Sign]),
        );
        let tls = (
            offered(MechanismType::ECC_KEY_PAIR_GEN, &[Use::GenerateKeyPair]),
            offered(MechanismType::ECDH1_DERIVE, &[Use::Derive]),
        );
        let mac = (
            offered(MechanismType::GENERIC_SECRET_KEY_GEN, &[Use::Generate]),
            offered(MechanismType::SHA256_HMAC, &[Use::Sign, Use::Verify]),
        );
        for (home, (making, using)) in
            [(&mut self.webhook_signer, webhook), (&mut self.tls_fetcher, tls), (&mut self.cert_mac, mac)]
        {
            match *home {
                KeyHome::HsmIfOffered if making.is_empty() && using.is_empty() => *home = KeyHome::Hsm,
                KeyHome::HsmIfOffered => *home = KeyHome::Sealed,
                KeyHome::Hsm if creates_keys => missing.extend(making.into_iter().chain(using)),
                KeyHome::Hsm => missing.extend(using),
                KeyHome::Sealed => {}
            }
        }
        if self.native_secp256k1 {
            let made = probe(
                &Mechanism::EccKeyPairGen,
                &[Attribute::Token(false), Attribute::EcParams(OID_SECP256K1.to_vec())],
                &[Attribute::Token(false), Attribute::Sensitive(true), Attribute::Sign(true)],
            );
            if made.is_err() {
                missing.push("secp256k1 key pairs (CKM_EC_KEY_PAIR_GEN on secp256k1)".into());
            }
        }
        if missing.is_empty() {
            Ok(self)
        } else {
            Err(HsmError::ProfileUnsupported { profile: self.name, missing: missing.join(", ") })
        }
    }
}

fn unknown(name: &str) -> HsmError {
    HsmError::UnknownProfile { name: name.to_string(), known: PROFILE_NAMES.join(", ") }
}

/// `CKM_…` for a standard mechanism, the number for a vendor's.
fn mechanism_name(mechanism: MechanismType) -> String {
    let value: cryptoki_sys::CK_MECHANISM_TYPE = mechanism.into();
    if value >= cryptoki_sys::CKM_VENDOR_DEFINED {
        format!("vendor mechanism {value:#x}")
    } else {
        mechanism.to_string()
    }
}

/// A use of a mechanism, as `C_GetMechanismInfo`'s flags state it.
#[derive(Clone, Copy)]
enum Use {
    Generate,
    GenerateKeyPair,
    Encrypt,
    MessageEncrypt,
    Decrypt,
    Sign,
    Verify,
    Derive,
}

impl Use {
    fn allowed_by(self, info: &cryptoki::mechanism::MechanismInfo) -> bool {
        match self {
            Self::Generate => info.generate(),
            Self::GenerateKeyPair => info.generate_key_pair(),
            Self::Encrypt => info.encrypt(),
            Self::MessageEncrypt => info.message_encrypt(),
            Self::Decrypt => info.decrypt(),
            Self::Sign => info.sign(),
            Self::Verify => info.verify(),
            Self::Derive => info.derive(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Generate => "key generation",
            Self::GenerateKeyPair => "key pair generation",
            Self::Encrypt => "encryption",
            Self::MessageEncrypt => "message-based encryption",
            Self::Decrypt => "decryption",
            Self::Sign => "signing",
            Self::Verify => "verification",
            Self::Derive => "key derivation",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_but_auto_is_a_profile_and_iv_codes_round_trip() {
        for name in PROFILE_NAMES.iter().filter(|n| **n != "auto") {
            assert_eq!(ModuleProfile::named(name).unwrap().name, *name);
        }
        assert!(ModuleProfile::named("auto").is_none());
        assert!(ModuleProfile::named("softHSM").is_none());
        for code in 0..=255u8 {
            if let Some(source) = IvSource::from_code(code) {
                assert_eq!(source.code(), code);
            }
        }
        assert_eq!(IvSource::from_code(5), Some(IvSource::MessageApi));
        assert_eq!(IvSource::from_code(0), None);
        let gcp = ModuleProfile::named("gcp-kms").unwrap();
        assert_eq!(
            format!("{}", gcp.gcm_mechanism),
            format!("{}", MechanismType::new_vendor_defined(0x8001_e101).unwrap())
        );
    }
}
