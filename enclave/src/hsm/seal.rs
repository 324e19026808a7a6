//! The sealed-blob format: versioned, names its KEK, records its IV (length and origin), and
//! binds kind, usage, organization, resource, curve and address or public key.

use super::error::HsmError;
use super::profile::IvSource;

pub(crate) const TAG_BITS: usize = 128;
const TAG_LEN: usize = TAG_BITS / 8;
const MAGIC: &[u8; 2] = b"CS";
/// Version 3 records its IV's length and origin (an IV the HSM chose may be 16 bytes); version 2
/// binds curve, usage and address or public key with a fixed 12-byte IV; version 1 blobs (kind,
/// organization and resource only) still open, and `coffer-gateway reseal` moves them on.
pub(crate) const VERSION: u8 = 3;
pub(crate) const V2: u8 = 2;
pub(crate) const LEGACY_VERSION: u8 = 1;
/// The IV length of versions 1 and 2.
const FIXED_IV_LEN: usize = 12;
/// The longest IV a version 3 blob may record.
const MAX_IV_LEN: usize = 64;
const DOMAIN_V1: &[u8] = b"coffer-seal-v1";
const DOMAIN_V2: &[u8] = b"coffer-seal-v2";
const DOMAIN_V3: &[u8] = b"coffer-seal-v3";

/// The plaintext of an opened (unsealed) blob: locked in RAM while it lives (kept out of swap,
/// where the process may lock memory), wiped when dropped (before its pages are unlocked), never
/// cloned, and its `Debug` prints only the length.
#[derive(zeroize::Zeroize, zeroize::ZeroizeOnDrop)]
pub struct OpenedBlob {
    plaintext: Vec<u8>,
    #[zeroize(skip)]
    _locked: Option<region::LockGuard>,
}

impl OpenedBlob {
    pub(crate) fn new(plaintext: Vec<u8>) -> Self {
        let locked = match plaintext.is_empty() {
            true => None,
            false => region::lock(plaintext.as_ptr(), plaintext.len()).map_err(not_locked).ok(),
        };
        Self { plaintext, _locked: locked }
    }

    /// The plaintext.
    pub fn as_slice(&self) -> &[u8] {
        &self.plaintext
    }
}

/// Logs, once per process, that opened secrets could not be locked in RAM (`RLIMIT_MEMLOCK`
/// reached, or no right to lock): they are then used unlocked, as before, and may be swapped.
fn not_locked(e: region::Error) {
    static TOLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !TOLD.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(error = %e, "opened secrets cannot be locked in RAM (raise RLIMIT_MEMLOCK, e.g. LimitMEMLOCK= in systemd): they may be swapped");
    }
}

impl std::ops::Deref for OpenedBlob {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.plaintext
    }
}

impl AsRef<[u8]> for OpenedBlob {
    fn as_ref(&self) -> &[u8] {
        &self.plaintext
    }
}

impl std::fmt::Debug for OpenedBlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OpenedBlob({} bytes)", self.plaintext.len())
    }
}

/// What a blob holds; each kind has its own AAD, so a seed never opens as a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlobKind {
    WalletSeed,
    WalletAccountKey,
    PrivateKey,
    ImportTarget,
    /// The auth proxy user's P-256 API key: stamps login activities only.
    AuthProxyKey,
    /// A service key the module cannot hold (its label is the resource).
    ServiceKey,
    /// A one-time code's record (a salted hash of the code, its expiry and its encryption
    /// target's secret); the resource is the otp id.
    OtpRecord,
}

impl BlobKind {
    fn tag(self) -> &'static str {
        match self {
            Self::WalletSeed => "wallet-seed",
            Self::WalletAccountKey => "wallet-account-key",
            Self::PrivateKey => "private-key",
            Self::ImportTarget => "import-target",
            Self::AuthProxyKey => "auth-proxy-key",
            Self::ServiceKey => "service-key",
            Self::OtpRecord => "otp-record",
        }
    }

    /// What the sealed secret may be used for.
    fn usage(self) -> &'static str {
        match self {
            Self::WalletSeed => "derive-and-export",
            Self::WalletAccountKey | Self::PrivateKey => "sign-and-export",
            Self::ImportTarget => "hpke-decrypt-import",
            Self::AuthProxyKey => "stamp-login-activities",
            Self::ServiceKey => "enclave-service",
            Self::OtpRecord => "verify-one-time-code",
        }
    }
}

/// The place a blob belongs to. A blob opened under any other binding fails authentication.
#[derive(Clone, Copy, Debug)]
pub struct BlobBinding<'a> {
    pub kind: BlobKind,
    pub organization_id: &'a str,
    pub resource_id: &'a str,
    /// `CURVE_*` of a signing key; empty for seeds and import targets.
    pub curve: &'a str,
    /// A wallet account key's address; empty otherwise.
    pub address: &'a str,
    /// A private key's public key (hex); empty otherwise.
    pub public_key: &'a str,
}

impl<'a> BlobBinding<'a> {
    /// A binding with no curve, address or public key (seeds and import targets).
    pub fn plain(kind: BlobKind, organization_id: &'a str, resource_id: &'a str) -> Self {
        Self { kind, organization_id, resource_id, curve: "", address: "", public_key: "" }
    }

    /// Versions 2 and 3: AAD = domain ‖ kind ‖ usage ‖ organization ‖ resource ‖ curve ‖
    /// address ‖ public key ‖ KEK label (version 3 has its own domain); version 1: domain ‖ kind
    /// ‖ organization ‖ resource ‖ KEK label. Each field is length-prefixed.
    pub(crate) fn aad(&self, version: u8, kek_label: &str) -> Vec<u8> {
        let fields: Vec<&[u8]> = if version == LEGACY_VERSION {
            vec![DOMAIN_V1, self.kind.tag().as_bytes(), self.organization_id.as_bytes(), self.resource_id.as_bytes()]
        } else {
            vec![
                if version == V2 { DOMAIN_V2 } else { DOMAIN_V3 },
                self.kind.tag().as_bytes(),
                self.kind.usage().as_bytes(),
                self.organization_id.as_bytes(),
                self.resource_id.as_bytes(),
                self.curve.as_bytes(),
                self.address.as_bytes(),
                self.public_key.as_bytes(),
            ]
        };
        let mut aad = Vec::with_capacity(160);
        for field in fields.into_iter().chain([kek_label.as_bytes()]) {
            aad.extend_from_slice(&(field.len() as u32).to_be_bytes());
            aad.extend_from_slice(field);
        }
        aad
    }
}

/// Whether `blob` is in the legacy format (version 1: bound to kind, organization and resource
/// only), whose curve and address must be checked against the opened key.
pub fn is_legacy(blob: &[u8]) -> bool {
    blob.get(2) == Some(&LEGACY_VERSION)
}

/// Versions 1 and 2: `"CS" ‖ version ‖ len(kek) ‖ kek label ‖ iv(12) ‖ ciphertext ‖ tag(16)`;
/// version 3: `"CS" ‖ 3 ‖ len(kek) ‖ kek label ‖ iv source ‖ len(iv) ‖ iv ‖ ciphertext ‖ tag(16)`.
/// `iv_source` is ignored for versions 1 and 2.
pub(crate) fn encode(version: u8, kek_label: &str, iv_source: u8, iv: &[u8], ciphertext: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + kek_label.len() + iv.len() + ciphertext.len());
    out.extend_from_slice(MAGIC);
    out.push(version);
    out.push(kek_label.len() as u8);
    out.extend_from_slice(kek_label.as_bytes());
    if version == VERSION {
        out.push(iv_source);
        out.push(iv.len() as u8);
    }
    out.extend_from_slice(iv);
    out.extend_from_slice(ciphertext);
    out
}

pub(crate) struct ParsedBlob<'a> {
    pub version: u8,
    pub kek_label: &'a str,
    /// The recorded origin of the IV (version 3); `None` for versions 1 and 2 (caller IVs).
    pub iv_source: Option<IvSource>,
    pub iv: &'a [u8],
    pub ciphertext: &'a [u8],
}

pub(crate) fn decode(blob: &[u8]) -> Result<ParsedBlob<'_>, HsmError> {
    let bad = || HsmError::Malformed("sealed blob");
    let (header, rest) = blob.split_at_checked(4).ok_or_else(bad)?;
    let version = header[2];
    if &header[..2] != MAGIC || !matches!(version, LEGACY_VERSION | V2 | VERSION) {
        return Err(bad());
    }
    let (label, rest) = rest.split_at_checked(header[3] as usize).ok_or_else(bad)?;
    let kek_label = std::str::from_utf8(label).map_err(|_| bad())?;
    let (iv_source, iv_len, rest) = if version == VERSION {
        let [source, len, rest @ ..] = rest else { return Err(bad()) };
        let source = IvSource::from_code(*source).ok_or_else(bad)?;
        if *len == 0 || *len as usize > MAX_IV_LEN {
            return Err(bad());
        }
        (Some(source), *len as usize, rest)
    } else {
        (None, FIXED_IV_LEN, rest)
    };
    let (iv, ciphertext) = rest.split_at_checked(iv_len).ok_or_else(bad)?;
    if ciphertext.len() < TAG_LEN {
        return Err(bad());
    }
    Ok(ParsedBlob { version, kek_label, iv_source, iv, ciphertext })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opened_blobs_print_only_their_length() {
        let opened = OpenedBlob::new(b"seed words".to_vec());
        assert_eq!(format!("{opened:?}"), "OpenedBlob(10 bytes)");
        assert_eq!(opened.as_slice(), b"seed words");
        assert_eq!(opened.len(), 10);
    }

    #[test]
    fn opened_blobs_are_locked_in_ram_while_they_live() {
        let opened = OpenedBlob::new(vec![7u8; 64]);
        // This machine's RLIMIT_MEMLOCK (8 MiB) lets a process lock a page.
        assert!(opened._locked.is_some(), "not locked");
        assert!(OpenedBlob::new(Vec::new())._locked.is_none(), "nothing to lock");
    }

    #[test]
    fn aad_differs_by_every_field() {
        let base = BlobBinding {
            kind: BlobKind::PrivateKey,
            organization_id: "org",
            resource_id: "r",
            curve: "CURVE_SECP256K1",
            address: "",
            public_key: "02ab",
        };
        let a = base.aad(VERSION, "k");
        assert_ne!(a, BlobBinding { kind: BlobKind::WalletSeed, ..base }.aad(VERSION, "k"));
        assert_ne!(a, BlobBinding { organization_id: "org2", ..base }.aad(VERSION, "k"));
        assert_ne!(a, BlobBinding { resource_id: "r2", ..base }.aad(VERSION, "k"));
        assert_ne!(a, BlobBinding { curve: "CURVE_ED25519", ..base }.aad(VERSION, "k"));
        assert_ne!(a, BlobBinding { public_key: "02ac", ..base }.aad(VERSION, "k"));
        assert_ne!(a, BlobBinding { public_key: "", address: "02ab", ..base }.aad(VERSION, "k"));
        assert_ne!(a, base.aad(VERSION, "k2"));
        assert_ne!(a, base.aad(LEGACY_VERSION, "k"));
        assert_ne!(a, base.aad(V2, "k"));
        // Length prefixes keep ("ab","c") and ("a","bc") apart.
        let x = BlobBinding { organization_id: "ab", resource_id: "c", ..base }.aad(VERSION, "k");
        let y = BlobBinding { organization_id: "a", resource_id: "bc", ..base }.aad(VERSION, "k");
        assert_ne!(x, y);
        // Version 1 ignores what it never bound.
        assert_eq!(base.aad(LEGACY_VERSION, "k"), BlobBinding { curve: "x", ..base }.aad(LEGACY_VERSION, "k"));
    }

    #[test]
    fn encode_decode_round_trip_and_rejects_garbage() {
        let blob = encode(VERSION, "kek", IvSource::Appended.code(), &[7u8; 16], &[1u8; 40]);
        assert!(!is_legacy(&blob));
        assert!(is_legacy(&encode(LEGACY_VERSION, "kek", 0, &[7u8; 12], &[1u8; 40])));
        let p = decode(&blob).unwrap();
        assert_eq!(p.kek_label, "kek");
        assert_eq!((p.iv_source, p.iv), (Some(IvSource::Appended), &[7u8; 16][..]));
        assert_eq!(p.ciphertext, &[1u8; 40][..]);
        assert_eq!(p.version, VERSION);
        // Version 2: a fixed 12-byte IV and no origin byte.
        let v2 = encode(V2, "kek", 9, &[8u8; 12], &[2u8; 16]);
        assert_eq!(v2.len(), 4 + 3 + 12 + 16);
        let p = decode(&v2).unwrap();
        assert_eq!((p.version, p.iv_source, p.iv, p.ciphertext), (V2, None, &[8u8; 12][..], &[2u8; 16][..]));
        assert!(decode(b"").is_err());
        assert!(decode(&blob[..20]).is_err());
        let mut wrong_version = blob.clone();
        wrong_version[2] = 9;
        assert!(decode(&wrong_version).is_err());
        for (at, value) in [(7, 0u8), (7, 6), (8, 0), (8, 65), (8, 200)] {
            let mut bad = blob.clone();
            bad[at] = value;
            assert!(decode(&bad).is_err(), "byte {at} = {value}");
        }
        // A tag's worth of ciphertext at least.
        assert!(decode(&encode(VERSION, "kek", 1, &[7u8; 12], &[1u8; 15])).is_err());
    }
}
