//! QOS quorum-key envelopes: what `encryptOauth2ClientSecret` (and `encryptToEnclave`,
//! `quorumKeyEncrypt`) of `@turnkey/crypto` 2.13 send, e.g. the `encryptedClientSecret` of
//! `CREATE_OAUTH2_CREDENTIAL`.
//!
//! Wire format (`@turnkey/crypto` `dist/crypto.js`, after `tkhq/qos` `qos_p256/src/encrypt.rs`):
//! - text: lowercase hex, no `0x`, of the borsh envelope;
//! - envelope: `nonce [u8; 12] ‖ ephemeral_sender_public [u8; 65] (uncompressed) ‖
//!   u32 LE length ‖ encrypted_message` (AES-256-GCM ciphertext ‖ 16-byte tag);
//! - key: the first 32 bytes of HMAC-SHA512 keyed with `sender_public ‖ receiver_public ‖ x`
//!   (x = the x-coordinate of the ECDH point) over the ASCII `qos_encryption_hmac_message`;
//! - AAD: `sender_public ‖ len(sender_public) ‖ receiver_public ‖ len(receiver_public)`, one
//!   length byte each.
//!
//! `receiver_public` is the key as the client gave it to the SDK: the SDK documents an
//! uncompressed key but also accepts a compressed one, which then enters the KDF and AAD in its
//! 33-byte form; [`open_quorum_envelope`] accepts both.

use aes_gcm::aead::{Aead as _, KeyInit as _, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use hmac::{Hmac, Mac};
use p256::elliptic_curve::sec1::ToEncodedPoint;
use sha2::Sha512;
use zeroize::Zeroizing;

use crate::error::CryptoError;

/// The HMAC message of the QOS key derivation.
const HMAC_MESSAGE: &[u8] = b"qos_encryption_hmac_message";
const NONCE_LEN: usize = 12;
const POINT_LEN: usize = 65;
const LEN_PREFIX: usize = 4;
const TAG_LEN: usize = 16;
const HEADER_LEN: usize = NONCE_LEN + POINT_LEN + LEN_PREFIX;
/// Client secrets are short; anything larger than this is refused before any work.
const MAX_ENVELOPE_LEN: usize = 64 * 1024;

fn invalid() -> CryptoError {
    CryptoError::invalid("invalid quorum-encrypted envelope")
}

/// The parts of a well-formed envelope.
struct Envelope<'a> {
    nonce: &'a [u8; NONCE_LEN],
    sender_public: &'a [u8; POINT_LEN],
    encrypted_message: &'a [u8],
}

/// Borsh-decodes an envelope: exact length, no trailing bytes, a ciphertext at least a tag long,
/// and a sender key that is an uncompressed point of P-256 (checked here, before the HSM sees it).
fn parse(envelope: &[u8]) -> Result<Envelope<'_>, CryptoError> {
    if envelope.len() < HEADER_LEN + TAG_LEN || envelope.len() > MAX_ENVELOPE_LEN {
        return Err(invalid());
    }
    let (nonce, rest) = envelope.split_at(NONCE_LEN);
    let (sender_public, rest) = rest.split_at(POINT_LEN);
    let (len, encrypted_message) = rest.split_at(LEN_PREFIX);
    let len = u32::from_le_bytes(len.try_into().map_err(|_| invalid())?);
    if usize::try_from(len).ok() != Some(encrypted_message.len()) {
        return Err(invalid());
    }
    let sender_public: &[u8; POINT_LEN] = sender_public.try_into().map_err(|_| invalid())?;
    if sender_public[0] != 0x04 || p256::PublicKey::from_sec1_bytes(sender_public).is_err() {
        return Err(invalid());
    }
    Ok(Envelope { nonce: nonce.try_into().map_err(|_| invalid())?, sender_public, encrypted_message })
}

/// Decodes the text `encryptOauth2ClientSecret` returns (hex; an optional `0x` and upper case are
/// tolerated) and checks the envelope's structure, so malformed input is refused without an HSM
/// call. Returns the envelope bytes for [`open_quorum_envelope`].
pub fn decode_encrypted_client_secret(text: &str) -> Result<Vec<u8>, CryptoError> {
    let body = text.trim();
    let body = body.strip_prefix("0x").unwrap_or(body);
    if body.len() > 2 * MAX_ENVELOPE_LEN {
        return Err(invalid());
    }
    let bytes = hex::decode(body).map_err(|_| invalid())?;
    parse(&bytes)?;
    Ok(bytes)
}

/// `sender_public ‖ 65 ‖ receiver_public ‖ len(receiver_public)`.
fn aad(sender_public: &[u8; POINT_LEN], receiver_public: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(POINT_LEN + receiver_public.len() + 2);
    aad.extend_from_slice(sender_public);
    aad.push(POINT_LEN as u8);
    aad.extend_from_slice(receiver_public);
    // Receiver encodings are 33 or 65 bytes, so the length always fits the byte.
    aad.push(receiver_public.len() as u8);
    aad
}

/// HMAC-SHA512(key = sender ‖ receiver ‖ x, "qos_encryption_hmac_message"): bytes 0..32 are the
/// AES key; bytes 32..44 are the nonce of [`seal_quorum_envelope`] (a free choice of ours: the
/// key is single-use, so any nonce is safe; the SDK draws a random one).
fn derive(
    sender_public: &[u8; POINT_LEN],
    receiver_public: &[u8],
    shared_x: &[u8; 32],
) -> Result<Zeroizing<[u8; 64]>, CryptoError> {
    let mut key = Zeroizing::new(Vec::with_capacity(POINT_LEN + receiver_public.len() + 32));
    key.extend_from_slice(sender_public);
    key.extend_from_slice(receiver_public);
    key.extend_from_slice(shared_x);
    // HMAC accepts keys of any length (longer ones are hashed first, as WebCrypto does).
    let mut mac =
        <Hmac<Sha512> as Mac>::new_from_slice(&key).map_err(|_| CryptoError::Internal("HMAC key rejected".into()))?;
    mac.update(HMAC_MESSAGE);
    let mut out = Zeroizing::new([0u8; 64]);
    out.copy_from_slice(&mac.finalize().into_bytes());
    Ok(out)
}

fn cipher(okm: &[u8; 64]) -> Aes256Gcm {
    Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&okm[..32]))
}

/// A valid receiver key in its uncompressed and compressed SEC1 forms.
fn receiver_forms(receiver_public: &[u8; POINT_LEN]) -> Result<[Vec<u8>; 2], CryptoError> {
    let key = p256::PublicKey::from_sec1_bytes(receiver_public)
        .ok()
        .filter(|_| receiver_public[0] == 0x04)
        .ok_or_else(|| CryptoError::invalid("invalid receiver public key"))?;
    Ok([receiver_public.to_vec(), key.to_encoded_point(true).as_bytes().to_vec()])
}

/// Opens a quorum envelope sent to `receiver_public` (uncompressed SEC1, `04 ‖ x ‖ y`).
///
/// `ecdh` is called once, with the envelope's ephemeral sender key (uncompressed, already checked
/// to be a point of P-256), and returns the raw ECDH shared secret: the 32-byte x-coordinate of
/// `receiver_secret · sender_public`, which is what PKCS#11 `CKM_ECDH1_DERIVE` with `CKD_NULL`
/// produces. QOS needs nothing else from the private key. Envelopes sealed to the compressed
/// form of the key are opened too. Every malformed or unauthentic envelope gives the same
/// `invalid quorum-encrypted envelope`; errors of `ecdh` are passed through.
pub fn open_quorum_envelope(
    envelope: &[u8],
    receiver_public: &[u8; 65],
    ecdh: impl FnOnce(&[u8; 65]) -> Result<Zeroizing<[u8; 32]>, CryptoError>,
) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
    let receivers = receiver_forms(receiver_public)?;
    let parsed = parse(envelope)?;
    let shared_x = ecdh(parsed.sender_public)?;
    let nonce = Nonce::from_slice(parsed.nonce);
    for receiver in &receivers {
        let okm = derive(parsed.sender_public, receiver, &shared_x)?;
        let aad = aad(parsed.sender_public, receiver);
        let payload = Payload { msg: parsed.encrypted_message, aad: &aad };
        if let Ok(plaintext) = cipher(&okm).decrypt(nonce, payload) {
            return Ok(Zeroizing::new(plaintext));
        }
    }
    Err(invalid())
}

/// Seals `plaintext` to `receiver_public` (uncompressed) as the SDK does, with the ephemeral
/// sender key `ephemeral_secret` (a P-256 scalar; never reuse one). Deterministic: the nonce is
/// derived with the key. For our own clients and tests; the enclave only opens envelopes.
pub fn seal_quorum_envelope(
    plaintext: &[u8],
    receiver_public: &[u8; 65],
    ephemeral_secret: &[u8; 32],
) -> Result<Vec<u8>, CryptoError> {
    receiver_forms(receiver_public)?;
    let receiver = p256::PublicKey::from_sec1_bytes(receiver_public)
        .map_err(|_| CryptoError::invalid("invalid receiver public key"))?;
    let ephemeral = p256::SecretKey::from_slice(ephemeral_secret)
        .map_err(|_| CryptoError::invalid("invalid ephemeral secret key"))?;
    let sender_public: [u8; POINT_LEN] = ephemeral
        .public_key()
        .to_encoded_point(false)
        .as_bytes()
        .try_into()
        .map_err(|_| CryptoError::Internal("cannot encode P-256 point".into()))?;
    let shared = p256::ecdh::diffie_hellman(ephemeral.to_nonzero_scalar(), receiver.as_affine());
    let mut shared_x = Zeroizing::new([0u8; 32]);
    shared_x.copy_from_slice(shared.raw_secret_bytes());
    let okm = derive(&sender_public, receiver_public, &shared_x)?;
    let aad = aad(&sender_public, receiver_public);
    let ciphertext = cipher(&okm)
        .encrypt(Nonce::from_slice(&okm[32..32 + NONCE_LEN]), Payload { msg: plaintext, aad: &aad })
        .map_err(|_| CryptoError::Internal("AES-GCM seal failed".into()))?;
    let len = u32::try_from(ciphertext.len()).map_err(|_| CryptoError::invalid("plaintext too long"))?;
    if HEADER_LEN + ciphertext.len() > MAX_ENVELOPE_LEN {
        return Err(CryptoError::invalid("plaintext too long"));
    }
    let mut out = Vec::with_capacity(HEADER_LEN + ciphertext.len());
    out.extend_from_slice(&okm[32..32 + NONCE_LEN]);
    out.extend_from_slice(&sender_public);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&ciphertext);
    Ok(out)
}

#[cfg(test)]
mod tests;
