//! The login keys in the HSM: the notarizer (session JWTs), the OIDC issuer (ES256 tokens) and
//! the TLS-fetcher key that OAuth 2.0 client secrets are encrypted to (ECDH only).

use cryptoki::mechanism::elliptic_curve::{EcKdf, Ecdh1DeriveParams};
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass};
use p256::ecdsa::signature::hazmat::PrehashVerifier;
use zeroize::Zeroizing;

use super::error::HsmError;
use super::key_labels::{LoginKey, LoginPublicKeys, NOTARIZER_LABEL, OIDC_ISSUER_LABEL, TLS_FETCHER_LABEL};
use super::software_keys;
use super::token::Hsm;

fn point65(v: Vec<u8>) -> Result<[u8; 65], HsmError> {
    let mut with_tag = v;
    // `public_point` strips SoftHSM's OCTET STRING only for a given length; put the 0x04 back.
    if with_tag.len() == 64 {
        with_tag.insert(0, 0x04);
    }
    with_tag.try_into().map_err(|_| HsmError::Malformed("login public key is not a 65-byte P-256 point"))
}

impl Hsm {
    /// Whether the TLS-fetcher key is a token object (else it is a sealed software key).
    fn tls_fetcher_in_hsm(&self) -> Result<bool, HsmError> {
        Ok(self.keys()?.tls_fetcher.is_some())
    }

    /// The login keys' public halves, read once from the token.
    pub fn login_public_keys(&self) -> Result<LoginPublicKeys, HsmError> {
        if let Some(keys) = self.login_public.get() {
            return Ok(*keys);
        }
        let read = |label| self.public_point(label, 65).and_then(point65);
        let tls_fetcher = match self.tls_fetcher_in_hsm()? {
            true => read(TLS_FETCHER_LABEL)?,
            false => {
                let key = software_keys::p256_key(&self.open_sealed_key(TLS_FETCHER_LABEL)?)?;
                point65(key.public_key().to_sec1_bytes().to_vec())?
            }
        };
        let keys =
            LoginPublicKeys { notarizer: read(NOTARIZER_LABEL)?, oidc_issuer: read(OIDC_ISSUER_LABEL)?, tls_fetcher };
        Ok(*self.login_public.get_or_init(|| keys))
    }

    /// ECDSA P-256 over the 32-byte `digest` with a login key: raw r ‖ s, low-S, checked
    /// against the public key before it leaves.
    pub fn sign_digest_with(&self, key: LoginKey, digest: &[u8; 32]) -> Result<[u8; 64], HsmError> {
        let public = self.login_public_keys()?;
        let raw = self.with_session(
            |s, keys| {
                let handle = match key {
                    LoginKey::Notarizer => keys.notarizer,
                    LoginKey::OidcIssuer => keys.oidc_issuer,
                };
                handle.map(|h| s.sign(&Mechanism::Ecdsa, h, digest)).transpose()
            },
            "C_Sign (login key)",
        )?;
        let raw = raw.ok_or(HsmError::KeyMissing(key.label()))?;
        let sig = p256::ecdsa::Signature::from_slice(&raw)
            .map_err(|_| HsmError::Malformed("HSM returned a malformed ECDSA signature"))?;
        let sig = sig.normalize_s().unwrap_or(sig);
        let point = match key {
            LoginKey::Notarizer => public.notarizer,
            LoginKey::OidcIssuer => public.oidc_issuer,
        };
        let verifying = p256::ecdsa::VerifyingKey::from_sec1_bytes(&point)
            .map_err(|_| HsmError::Malformed("login public key is not a curve point"))?;
        verifying
            .verify_prehash(digest, &sig)
            .map_err(|_| HsmError::Malformed("the HSM's login-key signature does not verify"))?;
        Ok(sig.to_bytes().into())
    }

    /// The raw ECDH shared secret (the x-coordinate) of the TLS-fetcher key and `peer`, an
    /// uncompressed P-256 point. In the HSM the derived secret is a session object, destroyed at
    /// once; where the profile keeps the key sealed, it is opened in the enclave for this one use.
    pub fn tls_fetcher_ecdh(&self, peer: &[u8; 65]) -> Result<Zeroizing<[u8; 32]>, HsmError> {
        let Ok(peer_key) = p256::PublicKey::from_sec1_bytes(peer) else {
            return Err(HsmError::Malformed("the sender key is not a P-256 point"));
        };
        if !self.tls_fetcher_in_hsm()? {
            let key = software_keys::p256_key(&self.open_sealed_key(TLS_FETCHER_LABEL)?)?;
            let shared = p256::ecdh::diffie_hellman(key.to_nonzero_scalar(), peer_key.as_affine());
            let mut out = Zeroizing::new([0u8; 32]);
            out.copy_from_slice(shared.raw_secret_bytes());
            return Ok(out);
        }
        let value = self.with_session(
            |s, keys| {
                let Some(private) = keys.tls_fetcher else { return Ok(None) };
                let params = Ecdh1DeriveParams::new(EcKdf::null(), peer);
                let derived = s.derive_key(
                    &Mechanism::Ecdh1Derive(params),
                    private,
                    &[
                        Attribute::Class(ObjectClass::SECRET_KEY),
                        Attribute::KeyType(KeyType::GENERIC_SECRET),
                        Attribute::ValueLen(32.into()),
                        Attribute::Token(false),
                        Attribute::Sensitive(false),
                        Attribute::Extractable(true),
                    ],
                )?;
                let attrs = s.get_attributes(derived, &[AttributeType::Value]);
                let destroyed = s.destroy_object(derived);
                let value = attrs?.into_iter().find_map(|a| match a {
                    Attribute::Value(v) => Some(Zeroizing::new(v)),
                    _ => None,
                });
                destroyed?;
                Ok(Some(value))
            },
            "C_DeriveKey (TLS-fetcher ECDH)",
        )?;
        let value = value.ok_or(HsmError::KeyMissing(TLS_FETCHER_LABEL))?;
        let value = value.ok_or(HsmError::Malformed("the derived ECDH secret has no value"))?;
        let mut out = Zeroizing::new([0u8; 32]);
        if value.len() != 32 {
            return Err(HsmError::Malformed("the ECDH shared secret is not 32 bytes"));
        }
        out.copy_from_slice(&value);
        Ok(out)
    }
}
