//! Raw-payload signing (`sign_raw_payload`, wire spec §10.1): payload encodings, hash functions,
//! EIP-712 / EIP-7702 digests, r/s/v.
//!
//! ECDSA (secp256k1, P-256) is RFC 6979 deterministic and always returns low-S with the recovery
//! id of the returned signature; Ed25519 signs the raw payload bytes.

// The typed payloads are parsed by coffer-chain, which also describes them to policies: what a
// policy reads is what was encoded.
use coffer_chain::{eip712, eip7702};

/// The EIP-712 hasher alone, for the fuzz targets (`fuzz-targets/`). Not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    /// The digest [`super::sign_payload`] signs for a `PAYLOAD_ENCODING_EIP712` payload.
    pub fn eip712_digest(typed_data_json: &str) -> Result<[u8; 32], String> {
        super::eip712::hash_typed_data(typed_data_json).map(|h| h.digest()).map_err(|e| e.0)
    }

    /// The digest [`super::sign_payload`] signs for a `PAYLOAD_ENCODING_EIP7702_AUTHORIZATION`
    /// payload.
    pub fn eip7702_digest(authorization_json: &str) -> Result<[u8; 32], String> {
        super::eip7702_digest(authorization_json)
    }
}

use ed25519_dalek::Signer as _;
use sha2::{Digest, Sha256};

// The `ecdsa` crate's generic signing trait (implemented by k256's and p256's scalars).
use k256::ecdsa::hazmat::SignPrimitive;
use zeroize::Zeroizing;

use crate::error::CryptoError;
use crate::keys::Curve;

pub const PAYLOAD_ENCODING_HEXADECIMAL: &str = "PAYLOAD_ENCODING_HEXADECIMAL";
pub const PAYLOAD_ENCODING_TEXT_UTF8: &str = "PAYLOAD_ENCODING_TEXT_UTF8";
pub const PAYLOAD_ENCODING_EIP712: &str = eip712::PAYLOAD_ENCODING;
pub const PAYLOAD_ENCODING_EIP7702_AUTHORIZATION: &str = eip7702::PAYLOAD_ENCODING;

pub const HASH_FUNCTION_NO_OP: &str = "HASH_FUNCTION_NO_OP";
pub const HASH_FUNCTION_SHA256: &str = "HASH_FUNCTION_SHA256";
pub const HASH_FUNCTION_KECCAK256: &str = "HASH_FUNCTION_KECCAK256";
pub const HASH_FUNCTION_NOT_APPLICABLE: &str = "HASH_FUNCTION_NOT_APPLICABLE";

/// A signature as returned by `sign_raw_payload`: r and s as 64 lowercase hex chars (no `0x`),
/// v = recovery id `"00"`/`"01"` (always `"00"` for Ed25519).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignatureParts {
    pub r: String,
    pub s: String,
    pub v: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Hex,
    Utf8,
    Eip712,
    Eip7702,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum HashFunction {
    NoOp,
    Sha256,
    Keccak256,
    NotApplicable,
}

impl Encoding {
    fn parse(s: &str) -> Result<Self, CryptoError> {
        Ok(match s {
            PAYLOAD_ENCODING_HEXADECIMAL => Self::Hex,
            PAYLOAD_ENCODING_TEXT_UTF8 => Self::Utf8,
            PAYLOAD_ENCODING_EIP712 => Self::Eip712,
            PAYLOAD_ENCODING_EIP7702_AUTHORIZATION => Self::Eip7702,
            _ => return Err(CryptoError::invalid(format!("invalid payload encoding: {s}"))),
        })
    }
}

impl HashFunction {
    fn parse(s: &str) -> Result<Self, CryptoError> {
        Ok(match s {
            HASH_FUNCTION_NO_OP => Self::NoOp,
            HASH_FUNCTION_SHA256 => Self::Sha256,
            HASH_FUNCTION_KECCAK256 => Self::Keccak256,
            HASH_FUNCTION_NOT_APPLICABLE => Self::NotApplicable,
            _ => return Err(CryptoError::invalid(format!("invalid hash function: {s}"))),
        })
    }
}

fn curve_label(curve: Curve) -> &'static str {
    match curve {
        Curve::Secp256k1 => "secp256k1",
        Curve::P256 => "P-256",
        Curve::Ed25519 => "ed25519",
    }
}

fn bad_payload(reason: impl std::fmt::Display) -> CryptoError {
    CryptoError::invalid(format!("invalid payload: {reason}"))
}

/// Signs `payload` (decoded per `encoding`, hashed per `hash_function`) with the `curve` key
/// `secret`. Validation order: enum names, encoding/hash/curve combination, payload.
pub fn sign_payload(
    curve: Curve,
    secret: &[u8; 32],
    payload: &str,
    encoding: &str,
    hash_function: &str,
) -> Result<SignatureParts, CryptoError> {
    match payload_to_sign(curve, payload, encoding, hash_function)? {
        ToSign::Message(bytes) => {
            let key = ed25519_dalek::SigningKey::from_bytes(secret);
            let sig = key.sign(&bytes).to_bytes();
            Ok(SignatureParts { r: hex::encode(&sig[..32]), s: hex::encode(&sig[32..]), v: "00".into() })
        }
        ToSign::Digest(digest) => Ok(sign_digest(curve, secret, &digest)?.parts()),
    }
}

/// What a raw payload signature signs: the digest an ECDSA key signs, or the message an Ed25519
/// key signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToSign {
    Digest([u8; 32]),
    Message(Vec<u8>),
}

/// What a `curve` key signs for `payload` (decoded per `encoding`, hashed per `hash_function`),
/// checked as [`sign_payload`] checks it.
pub fn payload_to_sign(
    curve: Curve,
    payload: &str,
    encoding: &str,
    hash_function: &str,
) -> Result<ToSign, CryptoError> {
    let enc = Encoding::parse(encoding)?;
    let hf = HashFunction::parse(hash_function)?;
    let hf_refused = |why: &str| CryptoError::invalid(format!("invalid hash function: {hash_function} {why}"));

    // Typed Ethereum encodings: secp256k1 only; the digest is computed by the encoding, the
    // client sends NO_OP (viem, ethers) — KECCAK256 is tolerated as it names the same hash.
    if matches!(enc, Encoding::Eip712 | Encoding::Eip7702) {
        if curve != Curve::Secp256k1 {
            return Err(CryptoError::invalid(format!("invalid payload encoding: {encoding} requires a secp256k1 key")));
        }
        if !matches!(hf, HashFunction::NoOp | HashFunction::Keccak256) {
            return Err(hf_refused(&format!("cannot be used with {encoding}")));
        }
        let digest = match enc {
            Encoding::Eip712 => eip712::hash_typed_data(payload)
                .map_err(|e| bad_payload(format_args!("invalid EIP-712 typed data: {e}")))?
                .digest(),
            _ => {
                eip7702_digest(payload).map_err(|e| bad_payload(format_args!("invalid EIP-7702 authorization: {e}")))?
            }
        };
        return Ok(ToSign::Digest(digest));
    }

    match (curve, hf) {
        (Curve::Ed25519, HashFunction::NotApplicable) => {}
        (Curve::Ed25519, _) => {
            return Err(hf_refused("is not supported for ed25519 keys (use HASH_FUNCTION_NOT_APPLICABLE)"))
        }
        (_, HashFunction::NotApplicable) => {
            return Err(hf_refused(&format!("is not supported for {} keys", curve_label(curve))))
        }
        _ => {}
    }

    let bytes = match enc {
        Encoding::Hex => eip712::decode_hex(payload).ok_or_else(|| bad_payload("not valid hexadecimal"))?,
        _ => payload.as_bytes().to_vec(),
    };

    if curve == Curve::Ed25519 {
        return Ok(ToSign::Message(bytes));
    }

    let digest: [u8; 32] = match hf {
        HashFunction::Sha256 => Sha256::digest(&bytes).into(),
        HashFunction::Keccak256 => eip712::keccak256(&bytes),
        _ => <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| bad_payload("NO_OP requires a 32-byte digest"))?,
    };
    Ok(ToSign::Digest(digest))
}

/// An ECDSA signature: r and s big-endian, low-S, and the recovery id (0 or 1) that matches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EcdsaSignature {
    pub r: [u8; 32],
    pub s: [u8; 32],
    pub recovery_id: u8,
}

impl EcdsaSignature {
    /// As `sign_raw_payload` returns it: r, s, and v the recovery id.
    pub fn parts(&self) -> SignatureParts {
        SignatureParts { r: hex::encode(self.r), s: hex::encode(self.s), v: format!("{:02x}", self.recovery_id) }
    }
}

/// A signature a key outside this process made (an HSM's `CKM_ECDSA`: `r ‖ s`, 64 bytes, any
/// S) over `digest`, as Coffer returns signatures: normalized to low-S, with the recovery id
/// found by trial (the one that recovers `public_key`, SEC1). Refused if it does not verify
/// under `public_key` (a faulty signature never leaves).
pub fn ecdsa_from_raw(
    curve: Curve,
    public_key: &[u8],
    digest: &[u8; 32],
    raw: &[u8],
) -> Result<EcdsaSignature, CryptoError> {
    let faulty = |why: &str| CryptoError::Internal(format!("the HSM's ECDSA signature {why}"));
    if raw.len() != 64 {
        return Err(faulty("is not 64 bytes"));
    }
    macro_rules! normalize {
        ($ecdsa:path) => {{
            use $ecdsa as ecdsa;
            let key =
                ecdsa::VerifyingKey::from_sec1_bytes(public_key).map_err(|_| faulty("has no valid public key"))?;
            let sig = ecdsa::Signature::from_slice(raw).map_err(|_| faulty("is not a signature"))?;
            let sig = sig.normalize_s().unwrap_or(sig);
            let recovery_id = (0u8..2)
                .find(|id| {
                    let id = k256::ecdsa::RecoveryId::from_byte(*id).expect("0 and 1 are recovery ids");
                    ecdsa::VerifyingKey::recover_from_prehash(digest, &sig, id).is_ok_and(|k| k == key)
                })
                .ok_or_else(|| faulty("does not verify under the key's public key"))?;
            let (r, s) = sig.split_bytes();
            (r.into(), s.into(), recovery_id)
        }};
    }
    let (r, s, recovery_id) = match curve {
        Curve::Secp256k1 => normalize!(k256::ecdsa),
        Curve::P256 => normalize!(p256::ecdsa),
        Curve::Ed25519 => return Err(CryptoError::Internal("ECDSA requested for ed25519".into())),
    };
    Ok(EcdsaSignature { r, s, recovery_id })
}

/// RFC 6979 ECDSA over a 32-byte digest (secp256k1 or P-256), normalized to low-S with the
/// matching recovery id: what transaction signing writes into a transaction.
pub fn sign_digest(curve: Curve, secret: &[u8; 32], digest: &[u8; 32]) -> Result<EcdsaSignature, CryptoError> {
    let bad_key = || CryptoError::Internal(format!("invalid {} secret key", curve_label(curve)));
    let sign_err = |e: k256::ecdsa::Error| CryptoError::Internal(format!("ECDSA signing failed: {e}"));
    let (r, s, recid) = match curve {
        // The scalar signs directly (hazmat): a `SigningKey` would first compute the public key,
        // a full scalar multiplication that signing does not need (measured: most of the
        // enclave's signing time). The scalar lives in `Zeroizing` and is wiped on drop.
        Curve::Secp256k1 => {
            let scalar = Zeroizing::new(
                Option::<k256::NonZeroScalar>::from(k256::NonZeroScalar::from_repr((*secret).into()))
                    .ok_or_else(bad_key)?,
            );
            let (sig, recid) =
                scalar.as_ref().try_sign_prehashed_rfc6979::<sha2::Sha256>(&(*digest).into(), &[]).map_err(sign_err)?;
            let recid = recid.ok_or_else(|| CryptoError::Internal("ECDSA signing gave no recovery id".into()))?;
            let (sig, recid) = match sig.normalize_s() {
                Some(low) => (low, flip(recid)),
                None => (sig, recid),
            };
            let (r, s) = sig.split_bytes();
            (r.to_vec(), s.to_vec(), recid)
        }
        Curve::P256 => {
            let scalar = Zeroizing::new(
                Option::<p256::NonZeroScalar>::from(p256::NonZeroScalar::from_repr((*secret).into()))
                    .ok_or_else(bad_key)?,
            );
            let (sig, recid) =
                scalar.as_ref().try_sign_prehashed_rfc6979::<sha2::Sha256>(&(*digest).into(), &[]).map_err(sign_err)?;
            let recid = recid.ok_or_else(|| CryptoError::Internal("ECDSA signing gave no recovery id".into()))?;
            let (sig, recid) = match sig.normalize_s() {
                Some(low) => (low, flip(recid)),
                None => (sig, recid),
            };
            let (r, s) = sig.split_bytes();
            (r.to_vec(), s.to_vec(), recid)
        }
        Curve::Ed25519 => return Err(CryptoError::Internal("ECDSA requested for ed25519".into())),
    };
    let (mut rb, mut sb) = ([0u8; 32], [0u8; 32]);
    rb.copy_from_slice(&r);
    sb.copy_from_slice(&s);
    Ok(EcdsaSignature { r: rb, s: sb, recovery_id: recid.to_byte() })
}

/// Ed25519 over the message bytes (RFC 8032).
pub fn sign_ed25519(secret: &[u8; 32], message: &[u8]) -> [u8; 64] {
    ed25519_dalek::SigningKey::from_bytes(secret).sign(message).to_bytes()
}

/// Negating s negates the nonce point R: flip the y-parity bit of the recovery id.
/// (`RecoveryId` and `Error` are the shared `ecdsa` 0.16 types, re-exported by k256 and p256.)
fn flip(recid: k256::ecdsa::RecoveryId) -> k256::ecdsa::RecoveryId {
    k256::ecdsa::RecoveryId::new(!recid.is_y_odd(), recid.is_x_reduced())
}

// ---------------------------------------------------------------------------------------------
// EIP-7702
// ---------------------------------------------------------------------------------------------

/// Appends the RLP encoding of a byte string.
fn rlp_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    if let [b] = bytes {
        if *b < 0x80 {
            out.push(*b);
            return;
        }
    }
    rlp_header(out, 0x80, bytes.len());
    out.extend_from_slice(bytes);
}

/// Appends an RLP header (`offset` 0x80 for strings, 0xc0 for lists) for a payload of `len` bytes.
fn rlp_header(out: &mut Vec<u8>, offset: u8, len: usize) {
    if len <= 55 {
        out.push(offset + len as u8);
    } else {
        let be = len.to_be_bytes();
        let len_bytes = &be[be.iter().position(|&b| b != 0).unwrap_or(be.len() - 1)..];
        out.push(offset + 55 + len_bytes.len() as u8);
        out.extend_from_slice(len_bytes);
    }
}

/// Minimal big-endian bytes of a 256-bit integer (zero → empty), as RLP wants integers.
fn trim_leading_zeros(word: &[u8]) -> &[u8] {
    &word[word.iter().position(|&b| b != 0).unwrap_or(word.len())..]
}

/// `keccak256(0x05 ‖ rlp([chainId, address, nonce]))` for `{"address","chainId","nonce"}`
/// (numbers as JSON numbers, decimal or `0x`-hex strings; `contractAddress` accepted as viem's
/// alias of `address`).
fn eip7702_digest(payload: &str) -> Result<[u8; 32], String> {
    eip7702_preimage(payload).map(|pre| eip712::keccak256(&pre))
}

/// `0x05 ‖ rlp([chainId, address, nonce])`, of the authorization coffer-chain parsed.
fn eip7702_preimage(payload: &str) -> Result<Vec<u8>, String> {
    let eip7702::Authorization { address, chain_id, nonce, .. } =
        eip7702::Authorization::parse(payload).map_err(|e| e.0)?;

    let mut items = Vec::with_capacity(64);
    rlp_bytes(&mut items, trim_leading_zeros(&chain_id));
    rlp_bytes(&mut items, &address);
    rlp_bytes(&mut items, trim_leading_zeros(&nonce));
    let mut pre = vec![0x05];
    rlp_header(&mut pre, 0xc0, items.len());
    pre.extend_from_slice(&items);
    Ok(pre)
}

#[cfg(test)]
mod tests;
