//! The proof key in the HSM: its public half, and ECDSA P-256 signatures of proof payloads.

use cryptoki::mechanism::Mechanism;

use super::error::HsmError;
use super::key_labels::PROOF_LABEL;
use super::token::Hsm;

impl Hsm {
    /// The proof key's uncompressed SEC1 public key, read once from the token.
    pub fn proof_public_key(&self) -> Result<[u8; 65], HsmError> {
        if let Some(pk) = self.proof_public.get() {
            return Ok(*pk);
        }
        let mut point = self.public_point(PROOF_LABEL, 65)?;
        // `public_point` strips SoftHSM's OCTET STRING only for a given length; keep the 0x04.
        if point.len() == 64 {
            point.insert(0, 0x04);
        }
        let pk: [u8; 65] =
            point.try_into().map_err(|_| HsmError::Malformed("the proof key is not a 65-byte P-256 point"))?;
        Ok(*self.proof_public.get_or_init(|| pk))
    }

    /// ECDSA P-256 with the proof key over SHA-256 of `payload`'s UTF-8 bytes: raw r ‖ s, low-S,
    /// checked against the public key before it leaves.
    pub fn sign_proof(&self, payload: &str) -> Result<[u8; 64], HsmError> {
        let digest = coffer_auth::proof::payload_digest(payload);
        let public = self.proof_public_key()?;
        let raw = self.with_session(
            |s, keys| keys.proof.map(|h| s.sign(&Mechanism::Ecdsa, h, &digest)).transpose(),
            "C_Sign (proof key)",
        )?;
        let raw = raw.ok_or(HsmError::KeyMissing(PROOF_LABEL))?;
        let sig = p256::ecdsa::Signature::from_slice(&raw)
            .map_err(|_| HsmError::Malformed("HSM returned a malformed ECDSA signature"))?;
        let sig: [u8; 64] = sig.normalize_s().unwrap_or(sig).to_bytes().into();
        ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, &public)
            .verify(payload.as_bytes(), &sig)
            .map_err(|_| HsmError::Malformed("the HSM's proof signature does not verify"))?;
        Ok(sig)
    }
}
