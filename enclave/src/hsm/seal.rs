//! The sealed-blob format: versioned, names its KEK, and binds kind, usage, organization,
//! resource, curve and address or public key.

use super::error::HsmError;

pub(crate) const IV_LEN: usize = 12;
pub(crate) const TAG_BITS: usize = 128;
const MAGIC: &[u8; 2] = b"CS";
/// Version 2 binds curve, usage and address or public key; version 1 blobs (kind, organization
/// and resource only) still open, and `coffer-enclave reseal` moves them to version 2.
pub(crate) const VERSION: u8 = 2;
pub(crate) const LEGACY_VERSION: u8 = 1;
const DOMAIN_V1: &[u8] = b"coffer-seal-v1";
const DOMAIN_V2: &[u8] = b"coffer-seal-v2";

/// The plaintext of an opened (unsealed) blob: wiped when dropped, never cloned, and its `Debug`
/// prints only the length.
#[derive(zeroize::Zeroize, zeroize::ZeroizeOnDrop)]
pub struct OpenedBlob(Vec<u8>);

impl OpenedBlob {
    pub(crate) fn new(plaintext: Vec<u8>) -> Self {
        Self(plaintext)
    }

    /// The plaintext.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::Deref for OpenedBlob {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for OpenedBlob {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for OpenedBlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OpenedBlob({} bytes)", self.0.len())
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
}

impl BlobKind {
    fn tag(self) -> &'static str {
        match self {
            Self::WalletSeed => "wallet-seed",
            Self::WalletAccountKey => "wallet-account-key",
            Self::PrivateKey => "private-key",
            Self::ImportTarget => "import-target",
            Self::AuthProxyKey => "auth-proxy-key",
        }
    }

    /// What the sealed secret may be used for.
    fn usage(self) -> &'static str {
        match self {
            Self::WalletSeed => "derive-and-export",
            Self::WalletAccountKey | Self::PrivateKey => "sign-and-export",
            Self::ImportTarget => "hpke-decrypt-import",
            Self::AuthProxyKey => "stamp-login-activities",
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

    /// Version 2: AAD = domain ‖ kind ‖ usage ‖ organization ‖ resource ‖ curve ‖ address ‖
    /// public key ‖ KEK label; version 1: domain ‖ kind ‖ organization ‖ resource ‖ KEK label.
    /// Each field is length-prefixed.
    pub(crate) fn aad(&self, version: u8, kek_label: &str) -> Vec<u8> {
        let fields: Vec<&[u8]> = if version == LEGACY_VERSION {
            vec![DOMAIN_V1, self.kind.tag().as_bytes(), self.organization_id.as_bytes(), self.resource_id.as_bytes()]
        } else {
            vec![
                DOMAIN_V2,
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

/// `"CS" ‖ version ‖ len(kek) ‖ kek label ‖ iv(12) ‖ ciphertext ‖ tag(16)`.
pub(crate) fn encode(version: u8, kek_label: &str, iv: &[u8], ciphertext: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + kek_label.len() + iv.len() + ciphertext.len());
    out.extend_from_slice(MAGIC);
    out.push(version);
    out.push(kek_label.len() as u8);
    out.extend_from_slice(kek_label.as_bytes());
    out.extend_from_slice(iv);
    out.extend_from_slice(ciphertext);
    out
}

pub(crate) struct ParsedBlob<'a> {
    pub version: u8,
    pub kek_label: &'a str,
    pub iv: [u8; IV_LEN],
    pub ciphertext: &'a [u8],
}

pub(crate) fn decode(blob: &[u8]) -> Result<ParsedBlob<'_>, HsmError> {
    let bad = HsmError::Malformed("sealed blob");
    if blob.len() < 4 || &blob[..2] != MAGIC || !(blob[2] == VERSION || blob[2] == LEGACY_VERSION) {
        return Err(bad);
    }
    let label_len = blob[3] as usize;
    let rest = &blob[4..];
    if rest.len() < label_len + IV_LEN + TAG_BITS / 8 {
        return Err(bad);
    }
    let kek_label = std::str::from_utf8(&rest[..label_len]).map_err(|_| HsmError::Malformed("sealed blob"))?;
    let mut iv = [0u8; IV_LEN];
    iv.copy_from_slice(&rest[label_len..label_len + IV_LEN]);
    Ok(ParsedBlob { version: blob[2], kek_label, iv, ciphertext: &rest[label_len + IV_LEN..] })
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
        // Length prefixes keep ("ab","c") and ("a","bc") apart.
        let x = BlobBinding { organization_id: "ab", resource_id: "c", ..base }.aad(VERSION, "k");
        let y = BlobBinding { organization_id: "a", resource_id: "bc", ..base }.aad(VERSION, "k");
        assert_ne!(x, y);
        // Version 1 ignores what it never bound.
        assert_eq!(base.aad(LEGACY_VERSION, "k"), BlobBinding { curve: "x", ..base }.aad(LEGACY_VERSION, "k"));
    }

    #[test]
    fn encode_decode_round_trip_and_rejects_garbage() {
        let blob = encode(VERSION, "kek", &[7u8; 12], &[1u8; 40]);
        assert!(!is_legacy(&blob));
        assert!(is_legacy(&encode(LEGACY_VERSION, "kek", &[7u8; 12], &[1u8; 40])));
        let p = decode(&blob).unwrap();
        assert_eq!(p.kek_label, "kek");
        assert_eq!(p.iv, [7u8; 12]);
        assert_eq!(p.ciphertext, &[1u8; 40][..]);
        assert!(decode(b"").is_err());
        assert!(decode(&blob[..20]).is_err());
        assert_eq!(p.version, VERSION);
        let mut wrong_version = blob.clone();
        wrong_version[2] = 9;
        assert!(decode(&wrong_version).is_err());
    }
}
