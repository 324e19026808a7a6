//! Export and import bundles (wire spec §9): HPKE (RFC 9180 mode Base, DHKEM(P-256, HKDF-SHA256),
//! HKDF-SHA256, AES-256-GCM, info `turnkey_hpke`, AAD = encapped ‖ receiver, both uncompressed) in
//! envelopes signed by the enclave quorum key, byte-compatible with `turnkey_enclave_encrypt`
//! 0.17.1 (`ServerSendMsgV1`, `ServerTargetMsgV1`, `ClientSendMsg`) and `@turnkey/crypto`.

use hpke::{Deserializable, Kem as KemTrait, OpModeR, OpModeS, Serializable};
use p256::ecdsa::signature::Verifier as _;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, Zeroizing};

use crate::error::CryptoError;
use crate::secret::RngSeed;

type Kem = hpke::kem::DhP256HkdfSha256;
type Aead = hpke::aead::AesGcm256;
type Kdf = hpke::kdf::HkdfSha256;

const HPKE_INFO: &[u8] = b"turnkey_hpke";
const DATA_VERSION: &str = "v1.0.0";

/// The enclave quorum key that signs bundle envelopes (the HSM in production).
pub trait EnvelopeSigner {
    /// Uncompressed SEC1 P-256 public key (`04 ‖ x ‖ y`).
    fn public_key(&self) -> [u8; 65];
    /// DER ECDSA P-256 signature over SHA-256(`data`).
    fn sign(&self, data: &[u8]) -> Result<Vec<u8>, CryptoError>;
}

/// Envelope shared by `ServerSendMsgV1` and `ServerTargetMsgV1` (field order as the reference).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    version: &'static str,
    data: String,
    data_signature: String,
    enclave_quorum_public: String,
}

/// `ServerSendData`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SendData<'a> {
    encapped_public: String,
    ciphertext: String,
    organization_id: &'a str,
}

/// `ServerTargetData`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TargetData<'a> {
    target_public: String,
    organization_id: &'a str,
    user_id: &'a str,
}

/// `ClientSendMsg` (JS `formatHpkeBuf`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClientMsg {
    encapped_public: String,
    ciphertext: String,
}

fn internal(what: &str) -> CryptoError {
    CryptoError::Internal(what.into())
}

/// Parses a P-256 public key given as uncompressed (130 hex) or compressed (66 hex) SEC1, with
/// an optional `0x`; returns it uncompressed.
pub(crate) fn parse_target_public_key(hex_key: &str) -> Result<[u8; 65], CryptoError> {
    let invalid = || CryptoError::invalid("invalid target public key");
    let body = hex_key.trim();
    let body = body.strip_prefix("0x").unwrap_or(body);
    if body.len() != 130 && body.len() != 66 {
        return Err(invalid());
    }
    let bytes = hex::decode(body).map_err(|_| invalid())?;
    let key = p256::PublicKey::from_sec1_bytes(&bytes).map_err(|_| invalid())?;
    uncompressed(&key).ok_or_else(invalid)
}

fn uncompressed(key: &p256::PublicKey) -> Option<[u8; 65]> {
    key.to_encoded_point(false).as_bytes().try_into().ok()
}

/// Signs `data` with the quorum key, checks the signature (a bad HSM answer must not produce a
/// bundle no client accepts) and wraps it in the v1 envelope.
fn envelope(signer: &dyn EnvelopeSigner, data: &[u8]) -> Result<String, CryptoError> {
    let public = signer.public_key();
    let signature = signer.sign(data)?;
    let vk = p256::ecdsa::VerifyingKey::from_sec1_bytes(&public)
        .map_err(|_| internal("enclave quorum public key is not a P-256 point"))?;
    let der = p256::ecdsa::DerSignature::try_from(signature.as_slice())
        .map_err(|_| internal("enclave quorum signature is not DER"))?;
    vk.verify(data, &der).map_err(|_| internal("enclave quorum signature does not verify"))?;
    serde_json::to_string(&Envelope {
        version: DATA_VERSION,
        data: hex::encode(data),
        data_signature: hex::encode(&signature),
        enclave_quorum_public: hex::encode(public),
    })
    .map_err(|_| internal("cannot serialize bundle"))
}

/// HPKE-seals `plaintext` to `target` (uncompressed) with the Turnkey suite, info and AAD;
/// returns the uncompressed encapsulated key and `ciphertext ‖ tag`. The ephemeral key is drawn
/// from a ChaCha20 RNG seeded with `rng_seed`.
pub(crate) fn hpke_seal(
    rng_seed: &RngSeed,
    target: &[u8; 65],
    plaintext: &[u8],
) -> Result<([u8; 65], Vec<u8>), CryptoError> {
    let receiver = <Kem as KemTrait>::PublicKey::from_bytes(target)
        .map_err(|_| CryptoError::invalid("invalid target public key"))?;
    // Note: rand_chacha 0.3 does not zeroize its state on drop; the RNG lives only for this call.
    let mut rng = rng_seed.rng();
    let (encapped, mut ctx) = hpke::setup_sender::<Aead, Kdf, Kem, _>(&OpModeS::Base, &receiver, HPKE_INFO, &mut rng)
        .map_err(|_| internal("HPKE sender setup failed"))?;
    let encapped: [u8; 65] =
        encapped.to_bytes().as_slice().try_into().map_err(|_| internal("unexpected encapsulated key size"))?;
    let aad = [encapped.as_slice(), target].concat();
    let ciphertext = ctx.seal(plaintext, &aad).map_err(|_| internal("HPKE seal failed"))?;
    Ok((encapped, ciphertext))
}

/// Opens an HPKE `ciphertext ‖ tag` sealed to `secret` by [`hpke_seal`] (or the SDK's
/// `hpkeEncrypt`); `encapped` is uncompressed. `None` for any malformed or unauthentic input.
pub(crate) fn hpke_open(secret: &[u8; 32], encapped: &[u8], ciphertext: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
    let receiver_public = import_target_public(secret).ok()?;
    let private = <Kem as KemTrait>::PrivateKey::from_bytes(secret).ok()?;
    if encapped.len() != 65 {
        return None;
    }
    let encapped_key = <Kem as KemTrait>::EncappedKey::from_bytes(encapped).ok()?;
    let mut ctx = hpke::setup_receiver::<Aead, Kdf, Kem>(&OpModeR::Base, &private, &encapped_key, HPKE_INFO).ok()?;
    let aad = [encapped, receiver_public.as_slice()].concat();
    ctx.open(ciphertext, &aad).ok().map(Zeroizing::new)
}

/// Encrypts `plaintext` (mnemonic UTF-8 or 32-byte private key) to the client's target key and
/// returns the `exportBundle` JSON (`ServerSendMsgV1`). The HPKE ephemeral key is drawn from a
/// ChaCha20 RNG seeded with `rng_seed` (32 bytes of HSM randomness; never reuse a seed), borrowed
/// so the caller's zeroizing copy is the only one outside the RNG.
pub fn export_bundle(
    signer: &dyn EnvelopeSigner,
    rng_seed: &RngSeed,
    target_public_key_hex: &str,
    organization_id: &str,
    plaintext: &[u8],
) -> Result<String, CryptoError> {
    let target = parse_target_public_key(target_public_key_hex)?;
    let (encapped, ciphertext) = hpke_seal(rng_seed, &target, plaintext)?;
    let data = serde_json::to_vec(&SendData {
        encapped_public: hex::encode(encapped),
        ciphertext: hex::encode(ciphertext),
        organization_id,
    })
    .map_err(|_| internal("cannot serialize bundle data"))?;
    envelope(signer, &data)
}

/// A fresh import target key pair; the secret is kept by the enclave (bound to org and user)
/// until the matching `import_*` call, and used once.
pub struct ImportTarget {
    pub secret: Zeroizing<[u8; 32]>,
    pub public: [u8; 65],
}

/// Draws an import target key from a ChaCha20 RNG seeded with `rng_seed`.
pub fn new_import_target(rng_seed: &RngSeed) -> Result<ImportTarget, CryptoError> {
    let mut rng = rng_seed.rng();
    let key = p256::SecretKey::random(&mut rng);
    let mut secret = Zeroizing::new([0u8; 32]);
    let mut bytes = key.to_bytes();
    secret.copy_from_slice(&bytes);
    bytes.zeroize();
    let public = uncompressed(&key.public_key()).ok_or_else(|| internal("cannot encode P-256 point"))?;
    Ok(ImportTarget { secret, public })
}

/// The uncompressed public key of a stored import target secret.
pub fn import_target_public(secret: &[u8; 32]) -> Result<[u8; 65], CryptoError> {
    let key = p256::SecretKey::from_slice(secret).map_err(|_| internal("invalid import target key"))?;
    uncompressed(&key.public_key()).ok_or_else(|| internal("cannot encode P-256 point"))
}

/// The `importBundle` JSON (`ServerTargetMsgV1`) announcing `target_public` to the client.
pub fn import_bundle(
    signer: &dyn EnvelopeSigner,
    target_public: &[u8; 65],
    organization_id: &str,
    user_id: &str,
) -> Result<String, CryptoError> {
    let valid = target_public[0] == 0x04 && p256::PublicKey::from_sec1_bytes(target_public).is_ok();
    if !valid {
        return Err(CryptoError::invalid("invalid target public key"));
    }
    let data = serde_json::to_vec(&TargetData { target_public: hex::encode(target_public), organization_id, user_id })
        .map_err(|_| internal("cannot serialize bundle data"))?;
    envelope(signer, &data)
}

/// Decrypts the client's `encryptedBundle` (`{"encappedPublic","ciphertext"}`) with the import
/// target secret. Every malformed or unauthentic bundle gives the same `invalid encrypted bundle`.
pub fn open_encrypted_bundle(
    target_secret: &[u8; 32],
    encrypted_bundle: &str,
) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
    import_target_public(target_secret)?;
    let invalid = || CryptoError::invalid("invalid encrypted bundle");
    let msg: ClientMsg = serde_json::from_str(encrypted_bundle).map_err(|_| invalid())?;
    let unhex = |s: &str| hex::decode(s.strip_prefix("0x").unwrap_or(s)).map_err(|_| invalid());
    let encapped = unhex(&msg.encapped_public)?;
    let ciphertext = unhex(&msg.ciphertext)?;
    hpke_open(target_secret, &encapped, &ciphertext).ok_or_else(invalid)
}

#[cfg(test)]
mod tests;
