//! Export and import bundles: HPKE (P-256, HKDF-SHA256, AES-256-GCM) in signed envelopes.
// OWNER: helper B. Interface:
// pub trait EnvelopeSigner { fn public_key(&self) -> [u8; 65]; fn sign(&self, data: &[u8]) -> Result<Vec<u8> /* DER ECDSA P-256 over SHA-256(data) */, CryptoError>; }
// pub fn export_bundle(signer: &dyn EnvelopeSigner, rng_seed: [u8; 32], target_public_key_hex: &str, organization_id: &str, plaintext: &[u8]) -> Result<String, CryptoError>
// pub struct ImportTarget { pub secret: Zeroizing<[u8; 32]>, pub public: [u8; 65] }
// pub fn new_import_target(rng_seed: [u8; 32]) -> Result<ImportTarget, CryptoError>
// pub fn import_bundle(signer: &dyn EnvelopeSigner, target_public: &[u8; 65], organization_id: &str, user_id: &str) -> Result<String, CryptoError>
// pub fn open_encrypted_bundle(target_secret: &[u8; 32], encrypted_bundle: &str) -> Result<Zeroizing<Vec<u8>>, CryptoError>
