//! A software passkey (a platform authenticator's P-256 key and credential id): registration
//! (`none` or `packed` self-attestation) and `X-Stamp-Webauthn` stamps, as the browser makes them.

use base64::Engine;
use p256::ecdsa::signature::Signer;
use serde_json::json;
use sha2::{Digest, Sha256};
use turnkey_client::generated::immutable::webauthn::v1::AuthenticatorTransport;
use turnkey_client::generated::{Attestation, AuthenticatorParamsV2};

use crate::cbor::{cbor, Cbor};
use crate::Stack;

/// Base64url without padding, as WebAuthn encodes.
pub fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// A new P-256 key, different in every call and every run.
pub fn fresh_key() -> p256::ecdsa::SigningKey {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let seed = format!("{}-{}-{n}", std::process::id(), Stack::now_ms());
    p256::ecdsa::SigningKey::from_slice(&Sha256::digest(seed.as_bytes())).unwrap()
}

// --- a software authenticator -----------------------------------------------------------------

/// A passkey: a P-256 key and a random credential id, as a platform authenticator holds them.
pub struct Passkey {
    pub key: p256::ecdsa::SigningKey,
    pub id: Vec<u8>,
}

pub const RP: &[u8] = b"coffer.example";
pub const ORIGIN: &str = "https://coffer.example";

impl Default for Passkey {
    fn default() -> Self {
        Self::new()
    }
}

impl Passkey {
    /// A fresh key and its credential id.
    pub fn new() -> Self {
        let key = fresh_key();
        let id = Sha256::digest(key.verifying_key().to_encoded_point(true).as_bytes())[..16].to_vec();
        Passkey { key, id }
    }

    pub fn credential_id(&self) -> String {
        b64url(&self.id)
    }

    pub fn public_key_hex(&self) -> String {
        hex::encode(self.key.verifying_key().to_encoded_point(true).as_bytes())
    }

    /// `AuthenticatorParamsV2` from a `navigator.credentials.create` with attestation `fmt`.
    pub fn register(&self, name: &str, challenge: &str, fmt: &'static str) -> AuthenticatorParamsV2 {
        let client_data =
            json!({"type": "webauthn.create", "challenge": challenge, "origin": ORIGIN, "crossOrigin": false})
                .to_string();
        let p = self.key.verifying_key().to_encoded_point(false);
        let cose = Cbor::Map(vec![
            (Cbor::Int(1), Cbor::Int(2)),
            (Cbor::Int(3), Cbor::Int(-7)),
            (Cbor::Int(-1), Cbor::Int(1)),
            (Cbor::Int(-2), Cbor::Bytes(p.x().unwrap().to_vec())),
            (Cbor::Int(-3), Cbor::Bytes(p.y().unwrap().to_vec())),
        ]);
        let mut auth_data = Sha256::digest(RP).to_vec();
        auth_data.push(0x45); // UP | UV | AT
        auth_data.extend_from_slice(&0u32.to_be_bytes());
        auth_data.extend_from_slice(&[0u8; 16]);
        auth_data.extend_from_slice(&(self.id.len() as u16).to_be_bytes());
        auth_data.extend_from_slice(&self.id);
        cbor(&cose, &mut auth_data);
        let stmt = match fmt {
            "packed" => {
                let mut msg = auth_data.clone();
                msg.extend_from_slice(&Sha256::digest(client_data.as_bytes()));
                let sig: p256::ecdsa::Signature = self.key.sign(&msg);
                Cbor::Map(vec![
                    (Cbor::Text("alg"), Cbor::Int(-7)),
                    (Cbor::Text("sig"), Cbor::Bytes(sig.to_der().as_bytes().to_vec())),
                ])
            }
            _ => Cbor::Map(vec![]),
        };
        let obj = Cbor::Map(vec![
            (Cbor::Text("fmt"), Cbor::Text(fmt)),
            (Cbor::Text("attStmt"), stmt),
            (Cbor::Text("authData"), Cbor::Bytes(auth_data)),
        ]);
        let mut attestation_object = vec![];
        cbor(&obj, &mut attestation_object);
        AuthenticatorParamsV2 {
            authenticator_name: name.into(),
            challenge: challenge.into(),
            attestation: Some(Attestation {
                credential_id: self.credential_id(),
                client_data_json: b64url(client_data.as_bytes()),
                attestation_object: b64url(&attestation_object),
                transports: vec![AuthenticatorTransport::Internal, AuthenticatorTransport::Hybrid],
            }),
        }
    }

    /// The `X-Stamp-Webauthn` value of `@turnkey/webauthn-stamper` for `body`, from `origin`.
    pub fn stamp(&self, body: &[u8], origin: &str) -> String {
        let challenge = b64url(hex::encode(Sha256::digest(body)).as_bytes());
        let client_data = json!({"type": "webauthn.get", "challenge": challenge, "origin": origin}).to_string();
        let mut auth_data = Sha256::digest(RP).to_vec();
        auth_data.push(0x05); // UP | UV
        auth_data.extend_from_slice(&1u32.to_be_bytes());
        let mut msg = auth_data.clone();
        msg.extend_from_slice(&Sha256::digest(client_data.as_bytes()));
        let sig: p256::ecdsa::Signature = self.key.sign(&msg);
        json!({
            "authenticatorData": b64url(&auth_data),
            "clientDataJson": b64url(client_data.as_bytes()),
            "credentialId": self.credential_id(),
            "signature": b64url(sig.to_der().as_bytes()),
        })
        .to_string()
    }
}
