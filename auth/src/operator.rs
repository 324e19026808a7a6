//! Operator calls to the enclave: the bodies an operator's key stamps to bootstrap an
//! organization, rotate the KEK or destroy an old one. The gateway's CLI (`init-org`,
//! `rotate-kek`, `destroy-kek`) makes and stamps them; the enclave verifies the stamp against the
//! operator keys of its own configuration, its freshness and that it was not used before, and
//! does exactly what the body names. One format, written once, for both sides.

use p256::ecdsa::signature::Signer;
use serde::{Deserialize, Serialize};

use crate::AuthError;

/// The `type` of a bootstrap body.
pub const BOOTSTRAP_ORGANIZATION: &str = "COFFER_OPERATOR_BOOTSTRAP_ORGANIZATION";

/// What an operator bootstraps: a new organization (its id chosen by the enclave) with one root
/// user holding one P-256 API key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootstrapParameters {
    pub organization_name: String,
    pub root_user_name: String,
    /// The root user's API key: a compressed P-256 point, hex.
    pub root_api_public_key: String,
}

/// The `type` of a body that makes the KEK after `kekLabel` current.
pub const ROTATE_KEK: &str = "COFFER_OPERATOR_ROTATE_KEK";
/// The `type` of a body that destroys the KEK `kekLabel`.
pub const DESTROY_KEK: &str = "COFFER_OPERATOR_DESTROY_KEK";

/// What an operator does to a KEK: rotate from it (it must be the current one, so a rotation
/// happens once however often its body is sent), or destroy it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KekParameters {
    pub kek_label: String,
    /// Destroying: the stored blobs the operator was shown to still name the KEK (the gateway's
    /// count, `coffer-gateway kek-status`); the enclave destroys only at 0. Rotating: 0.
    pub blobs_naming_it: u64,
}

/// A parsed operator body of `P`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorBody<P> {
    pub timestamp_ms: i64,
    pub parameters: P,
    /// `crate::envelope::fingerprint` of the exact body: what replay refusal remembers.
    pub fingerprint: String,
}

/// A parsed bootstrap body.
pub type BootstrapBody = OperatorBody<BootstrapParameters>;
/// A parsed rotation or destruction body.
pub type KekBody = OperatorBody<KekParameters>;

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Wire<P> {
    #[serde(rename = "type")]
    kind: String,
    timestamp_ms: String,
    parameters: P,
}

fn body<P: Serialize + Clone>(kind: &str, parameters: &P, timestamp_ms: i64) -> Vec<u8> {
    let wire = Wire { kind: kind.into(), timestamp_ms: timestamp_ms.to_string(), parameters: parameters.clone() };
    serde_json::to_vec(&wire).unwrap_or_default()
}

fn parse<P: serde::de::DeserializeOwned>(kind: &str, body: &[u8]) -> Result<OperatorBody<P>, AuthError> {
    let wire: Wire<P> = serde_json::from_slice(body).map_err(|_| {
        AuthError::invalid(format!(
            "not an operator body of type {kind} (type, timestampMs and parameters, nothing else)"
        ))
    })?;
    if wire.kind != kind {
        return Err(AuthError::invalid(format!("the operator body has type {:?}, not {kind}", wire.kind)));
    }
    let timestamp_ms =
        wire.timestamp_ms.parse().map_err(|_| AuthError::invalid("an operator body has no valid timestampMs"))?;
    Ok(OperatorBody { timestamp_ms, parameters: wire.parameters, fingerprint: crate::envelope::fingerprint(body) })
}

/// The body that asks for `parameters` at `timestamp_ms` (Unix milliseconds).
pub fn bootstrap_body(parameters: &BootstrapParameters, timestamp_ms: i64) -> Vec<u8> {
    body(BOOTSTRAP_ORGANIZATION, parameters, timestamp_ms)
}

/// Parses a bootstrap body: exactly the fields [`bootstrap_body`] writes, of that type.
pub fn parse_bootstrap(body: &[u8]) -> Result<BootstrapBody, AuthError> {
    parse(BOOTSTRAP_ORGANIZATION, body)
}

/// The body of a KEK operation `kind` ([`ROTATE_KEK`] or [`DESTROY_KEK`]).
pub fn kek_body(kind: &str, parameters: &KekParameters, timestamp_ms: i64) -> Vec<u8> {
    body(kind, parameters, timestamp_ms)
}

/// Parses a KEK operation's body of type `kind`.
pub fn parse_kek(kind: &str, body: &[u8]) -> Result<KekBody, AuthError> {
    parse(kind, body)
}

/// The `X-Stamp` value of `body` by the operator's `key` (the API-key P-256 scheme, so
/// [`crate::stamp::verify`] checks it).
pub fn stamp(key: &p256::ecdsa::SigningKey, body: &[u8]) -> String {
    use base64::Engine;
    let signature: p256::ecdsa::Signature = key.sign(body);
    let stamp = serde_json::json!({
        "publicKey": public_key_hex(key),
        "scheme": crate::stamp::Scheme::P256.wire_name(),
        "signature": hex::encode(signature.to_der().as_bytes()),
    });
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(stamp.to_string())
}

/// The compressed public key of `key`, lowercase hex (how operator keys are configured).
pub fn public_key_hex(key: &p256::ecdsa::SigningKey) -> String {
    hex::encode(key.verifying_key().to_encoded_point(true).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_round_trips_and_its_stamp_verifies_only_over_it() {
        let key = p256::ecdsa::SigningKey::from_slice(&[3; 32]).unwrap();
        let params = BootstrapParameters {
            organization_name: "o".into(),
            root_user_name: "root".into(),
            root_api_public_key: "02ab".into(),
        };
        let body = bootstrap_body(&params, 1234);
        let parsed = parse_bootstrap(&body).unwrap();
        assert_eq!((parsed.timestamp_ms, &parsed.parameters), (1234, &params));
        assert_eq!(parsed.fingerprint, crate::envelope::fingerprint(&body));
        let s = crate::stamp::parse(&stamp(&key, &body)).unwrap();
        assert_eq!(s.public_key, public_key_hex(&key));
        crate::stamp::verify(&s, &body).unwrap();
        assert!(crate::stamp::verify(&s, &bootstrap_body(&params, 1235)).is_err());
        // Anything else than exactly this shape is refused.
        for other in [
            br#"{"type":"X","timestampMs":"1","parameters":{"organizationName":"o","rootUserName":"r","rootApiPublicKey":"k"}}"#.as_slice(),
            br#"{"type":"COFFER_OPERATOR_BOOTSTRAP_ORGANIZATION","timestampMs":"1","parameters":{"organizationName":"o","rootUserName":"r","rootApiPublicKey":"k","extra":1}}"#,
            br#"{"type":"COFFER_OPERATOR_BOOTSTRAP_ORGANIZATION","timestampMs":"x","parameters":{"organizationName":"o","rootUserName":"r","rootApiPublicKey":"k"}}"#,
            b"[]",
        ] {
            assert!(parse_bootstrap(other).is_err(), "{}", String::from_utf8_lossy(other));
        }
        let kek = KekParameters { kek_label: "coffer-kek-v1".into(), blobs_naming_it: 0 };
        let rotate = kek_body(ROTATE_KEK, &kek, 99);
        assert_eq!(parse_kek(ROTATE_KEK, &rotate).unwrap().parameters, kek);
        assert!(parse_kek(DESTROY_KEK, &rotate).is_err(), "a rotation is not a destruction");
        assert!(parse_bootstrap(&rotate).is_err());
    }
}
