//! Passkeys: WebAuthn registration (attestation objects, `none` and `packed` self-attestation)
//! and the `X-Stamp-Webauthn` assertion stamp over the raw request body.

use base64::Engine;
use p256::ecdsa::signature::Verifier;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::AuthError;

/// The vote scheme recorded for passkey stamps (`SignatureScheme` enum of the official protos).
pub const SCHEME: &str = "SIGNATURE_SCHEME_TK_WEBAUTHN";
/// The credential type of a passkey in `Authenticator.credential.type`.
pub const CREDENTIAL_TYPE: &str = "CREDENTIAL_TYPE_WEBAUTHN_AUTHENTICATOR";
/// The organization feature listing the origins passkey ceremonies may come from.
pub const ORIGINS_FEATURE: &str = "FEATURE_NAME_WEBAUTHN_ORIGINS";

const FLAG_USER_PRESENT: u8 = 0x01;
const FLAG_ATTESTED_DATA: u8 = 0x40;
const FLAG_EXTENSIONS: u8 = 0x80;

/// base64url without padding, as WebAuthn JSON encodes buffers.
pub fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Decodes base64url with or without padding (standard base64 too, for robustness).
pub fn b64url_decode(s: &str) -> Option<Vec<u8>> {
    let t = s.trim().trim_end_matches('=');
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(t)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(t))
        .ok()
}

/// A credential id in the form it is stored and looked up by: base64url without padding.
pub fn canonical_credential_id(s: &str) -> Option<String> {
    b64url_decode(s).filter(|b| !b.is_empty() && b.len() <= 1023).map(|b| b64url(&b))
}

// ---------------------------------------------------------------------------------------------
// CBOR: the subset WebAuthn uses (RFC 8949 definite-length items). Hand-written because the
// attestation object and COSE key need only ~80 lines of decoding, not a general CBOR crate.

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cbor {
    Uint(u64),
    /// A negative integer, stored as its value (-1 - n).
    Nint(i128),
    Bytes(Vec<u8>),
    Text(String),
    Array(Vec<Cbor>),
    Map(Vec<(Cbor, Cbor)>),
    Tag(u64, Box<Cbor>),
    /// `false`, `true`, `null`, `undefined`, other simple values and floats (never used here).
    Simple(u64),
}

impl Cbor {
    fn get(&self, key: &Cbor) -> Option<&Cbor> {
        match self {
            Cbor::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    fn text_key(&self, key: &str) -> Option<&Cbor> {
        self.get(&Cbor::Text(key.to_string()))
    }
    fn int_key(&self, key: i64) -> Option<&Cbor> {
        let k = if key >= 0 { Cbor::Uint(key as u64) } else { Cbor::Nint(key as i128) };
        self.get(&k)
    }
    fn as_int(&self) -> Option<i128> {
        match self {
            Cbor::Uint(n) => Some(*n as i128),
            Cbor::Nint(n) => Some(*n),
            _ => None,
        }
    }
}

const MAX_DEPTH: usize = 16;

/// Decodes one item from the start of `input`; returns it and the number of bytes it used.
pub(crate) fn cbor_decode_prefix(input: &[u8]) -> Result<(Cbor, usize), String> {
    let mut pos = 0;
    let v = cbor_item(input, &mut pos, 0)?;
    Ok((v, pos))
}

/// Decodes exactly one item that fills `input`.
pub(crate) fn cbor_decode(input: &[u8]) -> Result<Cbor, String> {
    let (v, used) = cbor_decode_prefix(input)?;
    if used != input.len() {
        return Err("trailing bytes after the CBOR item".into());
    }
    Ok(v)
}

fn take<'a>(input: &'a [u8], pos: &mut usize, n: usize) -> Result<&'a [u8], String> {
    let end = pos.checked_add(n).filter(|e| *e <= input.len()).ok_or("truncated CBOR")?;
    let s = &input[*pos..end];
    *pos = end;
    Ok(s)
}

fn cbor_item(input: &[u8], pos: &mut usize, depth: usize) -> Result<Cbor, String> {
    if depth > MAX_DEPTH {
        return Err("CBOR nested too deeply".into());
    }
    let first = take(input, pos, 1)?[0];
    let (major, info) = (first >> 5, first & 0x1f);
    let arg: u64 = match info {
        0..=23 => info as u64,
        24 => take(input, pos, 1)?[0] as u64,
        25 => u16::from_be_bytes(take(input, pos, 2)?.try_into().map_err(|_| "truncated CBOR")?) as u64,
        26 => u32::from_be_bytes(take(input, pos, 4)?.try_into().map_err(|_| "truncated CBOR")?) as u64,
        27 => u64::from_be_bytes(take(input, pos, 8)?.try_into().map_err(|_| "truncated CBOR")?),
        _ => return Err("indefinite-length or reserved CBOR item".into()),
    };
    // Every element takes at least one byte: a count larger than what is left is malformed.
    let count = |n: u64| -> Result<usize, String> {
        let n = usize::try_from(n).map_err(|_| "CBOR length too large")?;
        if n > input.len().saturating_sub(*pos) {
            return Err("truncated CBOR".into());
        }
        Ok(n)
    };
    Ok(match major {
        0 => Cbor::Uint(arg),
        1 => Cbor::Nint(-1 - arg as i128),
        2 => {
            let n = count(arg)?;
            Cbor::Bytes(take(input, pos, n)?.to_vec())
        }
        3 => {
            let n = count(arg)?;
            let s = take(input, pos, n)?;
            Cbor::Text(String::from_utf8(s.to_vec()).map_err(|_| "CBOR text is not UTF-8")?)
        }
        4 => {
            let n = count(arg)?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(cbor_item(input, pos, depth + 1)?);
            }
            Cbor::Array(items)
        }
        5 => {
            let n = count(arg)?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                let k = cbor_item(input, pos, depth + 1)?;
                let v = cbor_item(input, pos, depth + 1)?;
                entries.push((k, v));
            }
            Cbor::Map(entries)
        }
        6 => Cbor::Tag(arg, Box::new(cbor_item(input, pos, depth + 1)?)),
        _ => Cbor::Simple(arg),
    })
}

// ---------------------------------------------------------------------------------------------
// Authenticator data and COSE keys.

/// The parsed `authenticatorData` of a registration.
#[derive(Debug, Clone)]
pub struct AttestedData {
    pub rp_id_hash: [u8; 32],
    pub flags: u8,
    pub sign_count: u32,
    /// Lowercase UUID text, e.g. `adce0002-35bc-c60a-648b-0b25f1f05503`.
    pub aaguid: String,
    pub credential_id: Vec<u8>,
    pub public_key: p256::ecdsa::VerifyingKey,
}

fn parse_attested_data(auth_data: &[u8]) -> Result<AttestedData, String> {
    if auth_data.len() < 37 {
        return Err("authenticator data is shorter than 37 bytes".into());
    }
    let rp_id_hash: [u8; 32] = auth_data[..32].try_into().map_err(|_| "bad rpIdHash")?;
    let flags = auth_data[32];
    let sign_count = u32::from_be_bytes(auth_data[33..37].try_into().map_err(|_| "bad signCount")?);
    if flags & FLAG_ATTESTED_DATA == 0 {
        return Err("authenticator data carries no attested credential data (AT flag unset)".into());
    }
    let rest = &auth_data[37..];
    if rest.len() < 18 {
        return Err("attested credential data is truncated".into());
    }
    let aaguid = uuid::Uuid::from_slice(&rest[..16]).map_err(|_| "bad aaguid")?.to_string();
    let id_len = u16::from_be_bytes([rest[16], rest[17]]) as usize;
    let rest = &rest[18..];
    if rest.len() < id_len || id_len == 0 {
        return Err("credential id is truncated".into());
    }
    let credential_id = rest[..id_len].to_vec();
    let (cose, used) = cbor_decode_prefix(&rest[id_len..]).map_err(|e| format!("credential public key: {e}"))?;
    let after = &rest[id_len + used..];
    if flags & FLAG_EXTENSIONS != 0 {
        cbor_decode(after).map_err(|e| format!("extensions: {e}"))?;
    } else if !after.is_empty() {
        return Err("trailing bytes after the credential public key".into());
    }
    let public_key = cose_p256_key(&cose)?;
    Ok(AttestedData { rp_id_hash, flags, sign_count, aaguid, credential_id, public_key })
}

/// A COSE_Key that must be EC2 (kty 2), ES256 (alg -7), P-256 (crv 1) with 32-byte x and y.
fn cose_p256_key(cose: &Cbor) -> Result<p256::ecdsa::VerifyingKey, String> {
    let unsupported = "unsupported credential public key: only ES256 (COSE EC2, P-256) passkeys are supported";
    if cose.int_key(1).and_then(Cbor::as_int) != Some(2)
        || cose.int_key(3).and_then(Cbor::as_int) != Some(-7)
        || cose.int_key(-1).and_then(Cbor::as_int) != Some(1)
    {
        return Err(unsupported.into());
    }
    let coord = |k: i64| match cose.int_key(k) {
        Some(Cbor::Bytes(b)) if b.len() == 32 => Ok(b.clone()),
        _ => Err("credential public key coordinates must be 32 bytes".to_string()),
    };
    let mut sec1 = vec![0x04];
    sec1.extend_from_slice(&coord(-2)?);
    sec1.extend_from_slice(&coord(-3)?);
    p256::ecdsa::VerifyingKey::from_sec1_bytes(&sec1).map_err(|_| "credential public key is not a P-256 point".into())
}

/// Compressed SEC1 hex, the form passkey public keys are stored and shown in.
pub fn public_key_hex(key: &p256::ecdsa::VerifyingKey) -> String {
    hex::encode(key.to_encoded_point(true).as_bytes())
}

#[derive(Deserialize)]
struct ClientData {
    #[serde(rename = "type")]
    kind: String,
    challenge: String,
    #[serde(default)]
    origin: String,
}

fn client_data(bytes: &[u8]) -> Result<ClientData, String> {
    serde_json::from_slice(bytes).map_err(|_| "clientDataJSON is not JSON with type, challenge and origin".into())
}

// ---------------------------------------------------------------------------------------------
// Registration.

/// A verified registration: what is stored for the new authenticator.
#[derive(Debug, Clone)]
pub struct Registration {
    /// base64url (no padding) of the raw credential id.
    pub credential_id: String,
    /// Compressed SEC1 hex.
    pub public_key: String,
    /// The attestation statement format (`none`, `packed`, ...).
    pub attestation_type: String,
    pub aaguid: String,
    pub sign_count: u32,
    /// `clientDataJSON.origin`, for the organization's origin check.
    pub origin: String,
}

fn invalid_attestation(detail: impl std::fmt::Display) -> AuthError {
    AuthError::invalid(format!("invalid authenticator attestation: {detail}"))
}

/// Verifies an `Attestation` (`credentialId`, `clientDataJson`, `attestationObject`, all
/// base64url) against the registration `challenge` (base64url) the intent names.
///
/// Attestation statements: `none`; `packed` self-attestation (no `x5c`: `sig` over
/// authData ‖ SHA-256(clientDataJSON) with the credential key itself, alg -7) is verified.
/// Formats whose statement is a certificate chain (`packed` with `x5c`, `fido-u2f`, `tpm`,
/// `android-key`, `apple`, ...) are accepted without checking the chain: Coffer keeps no
/// attestation trust roots, so it trusts the credential key as an RP asking for `none` would.
pub fn verify_registration(
    credential_id: &str,
    client_data_json: &str,
    attestation_object: &str,
    challenge: &str,
) -> Result<Registration, AuthError> {
    let client_bytes =
        b64url_decode(client_data_json).ok_or_else(|| invalid_attestation("clientDataJson is not base64url"))?;
    let cd = client_data(&client_bytes).map_err(invalid_attestation)?;
    if cd.kind != "webauthn.create" {
        return Err(invalid_attestation(format!("clientDataJSON type is {:?}, expected \"webauthn.create\"", cd.kind)));
    }
    let expected = b64url_decode(challenge).ok_or_else(|| invalid_attestation("challenge is not base64url"))?;
    if b64url_decode(&cd.challenge).as_deref() != Some(expected.as_slice()) {
        return Err(invalid_attestation("clientDataJSON challenge does not match the authenticator's challenge"));
    }
    let raw =
        b64url_decode(attestation_object).ok_or_else(|| invalid_attestation("attestationObject is not base64url"))?;
    let obj = cbor_decode(&raw).map_err(|e| invalid_attestation(format!("attestationObject: {e}")))?;
    let fmt = match obj.text_key("fmt") {
        Some(Cbor::Text(f)) => f.clone(),
        _ => return Err(invalid_attestation("attestationObject has no fmt")),
    };
    let auth_data = match obj.text_key("authData") {
        Some(Cbor::Bytes(b)) => b.clone(),
        _ => return Err(invalid_attestation("attestationObject has no authData")),
    };
    let att_stmt = match obj.text_key("attStmt") {
        Some(m @ Cbor::Map(_)) => m.clone(),
        _ => return Err(invalid_attestation("attestationObject has no attStmt map")),
    };
    let data = parse_attested_data(&auth_data).map_err(invalid_attestation)?;
    if data.flags & FLAG_USER_PRESENT == 0 {
        return Err(invalid_attestation("user presence flag is not set"));
    }
    let given = b64url_decode(credential_id).ok_or_else(|| invalid_attestation("credentialId is not base64url"))?;
    if given != data.credential_id {
        return Err(invalid_attestation("credentialId does not match the credential id in authenticator data"));
    }
    match fmt.as_str() {
        "none" => {
            if att_stmt != Cbor::Map(vec![]) {
                return Err(invalid_attestation("a \"none\" attestation must have an empty attStmt"));
            }
        }
        "packed" if att_stmt.text_key("x5c").is_none() => {
            if att_stmt.text_key("alg").and_then(Cbor::as_int) != Some(-7) {
                return Err(invalid_attestation("packed self-attestation must use alg -7 (ES256)"));
            }
            let Some(Cbor::Bytes(sig)) = att_stmt.text_key("sig") else {
                return Err(invalid_attestation("packed attestation has no sig"));
            };
            let sig = p256::ecdsa::Signature::from_der(sig)
                .map_err(|_| invalid_attestation("packed attestation signature is not DER ECDSA"))?;
            let sig = sig.normalize_s().unwrap_or(sig);
            let mut msg = auth_data.clone();
            msg.extend_from_slice(&Sha256::digest(&client_bytes));
            data.public_key
                .verify(&msg, &sig)
                .map_err(|_| invalid_attestation("packed self-attestation signature does not verify"))?;
        }
        "packed" | "fido-u2f" | "tpm" | "android-key" | "android-safetynet" | "apple" => {}
        other => return Err(invalid_attestation(format!("unknown attestation format {other:?}"))),
    }
    Ok(Registration {
        credential_id: b64url(&data.credential_id),
        public_key: public_key_hex(&data.public_key),
        attestation_type: fmt,
        aaguid: data.aaguid,
        sign_count: data.sign_count,
        origin: cd.origin,
    })
}

// ---------------------------------------------------------------------------------------------
// Assertion: the `X-Stamp-Webauthn` header.

/// A parsed passkey stamp whose challenge already matched the body; its signature is verified
/// by [`verify_assertion`] once the credential's public key is known.
#[derive(Debug, Clone)]
pub struct WebauthnStamp {
    /// base64url (no padding) of the raw credential id.
    pub credential_id: String,
    pub authenticator_data: Vec<u8>,
    pub client_data_json: Vec<u8>,
    /// DER ECDSA signature bytes.
    pub signature: Vec<u8>,
    pub origin: String,
}

fn malformed(detail: &str) -> AuthError {
    AuthError::unauthenticated("SIGNATURE_INVALID", format!("malformed WebAuthn stamp: {detail}"))
}

/// 401 `SIGNATURE_INVALID` with the spec's message.
pub fn invalid_signature() -> AuthError {
    AuthError::unauthenticated("SIGNATURE_INVALID", "could not verify WebAuthN signature")
}

/// The challenge a passkey signs for `body`: the ASCII bytes of lowercase hex SHA-256(body).
pub fn challenge_for(body: &[u8]) -> Vec<u8> {
    hex::encode(Sha256::digest(body)).into_bytes()
}

/// Parses the header (plain JSON `{authenticatorData, clientDataJson, credentialId, signature}`,
/// base64url values; a base64url-wrapped JSON is accepted too) and checks that clientDataJSON
/// is a `webauthn.get` over this exact body.
pub fn parse_stamp(header: &str, body: &[u8]) -> Result<WebauthnStamp, AuthError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Wire {
        authenticator_data: String,
        client_data_json: String,
        credential_id: String,
        signature: String,
    }
    let header = header.trim();
    let json = if header.starts_with('{') {
        header.as_bytes().to_vec()
    } else {
        b64url_decode(header).ok_or_else(|| malformed("expected JSON"))?
    };
    let wire: Wire = serde_json::from_slice(&json)
        .map_err(|_| malformed("expected JSON with authenticatorData, clientDataJson, credentialId and signature"))?;
    let decode = |v: &str, what: &str| b64url_decode(v).ok_or_else(|| malformed(&format!("{what} is not base64url")));
    let authenticator_data = decode(&wire.authenticator_data, "authenticatorData")?;
    let client_data_json = decode(&wire.client_data_json, "clientDataJson")?;
    let signature = decode(&wire.signature, "signature")?;
    let credential_id = canonical_credential_id(&wire.credential_id).ok_or_else(|| malformed("bad credentialId"))?;
    let cd = client_data(&client_data_json).map_err(|e| malformed(&e))?;
    if cd.kind != "webauthn.get" {
        return Err(malformed("clientDataJSON type must be \"webauthn.get\""));
    }
    if b64url_decode(&cd.challenge) != Some(challenge_for(body)) {
        return Err(AuthError::unauthenticated(
            "SIGNATURE_INVALID",
            "could not verify WebAuthN signature: the challenge is not the SHA-256 of this request body",
        ));
    }
    if authenticator_data.len() < 37 {
        return Err(malformed("authenticatorData is shorter than 37 bytes"));
    }
    Ok(WebauthnStamp { credential_id, authenticator_data, client_data_json, signature, origin: cd.origin })
}

/// Verifies the assertion signature (DER ECDSA P-256 over authenticatorData ‖
/// SHA-256(clientDataJSON); high-S accepted) with the stored compressed-hex public key, and
/// requires the user-present flag.
pub fn verify_assertion(stamp: &WebauthnStamp, public_key_hex: &str) -> Result<(), AuthError> {
    let pk = hex::decode(public_key_hex).map_err(|_| invalid_signature())?;
    let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&pk).map_err(|_| invalid_signature())?;
    if !matches!(stamp.authenticator_data.get(32), Some(f) if f & FLAG_USER_PRESENT != 0) {
        return Err(invalid_signature());
    }
    let sig = p256::ecdsa::Signature::from_der(&stamp.signature).map_err(|_| invalid_signature())?;
    let sig = sig.normalize_s().unwrap_or(sig);
    let mut msg = stamp.authenticator_data.clone();
    msg.extend_from_slice(&Sha256::digest(&stamp.client_data_json));
    key.verify(&msg, &sig).map_err(|_| invalid_signature())
}

/// Whether `origin` is allowed by the feature value (comma-separated origins; unset = any).
pub fn origin_allowed(feature_value: Option<&str>, origin: &str) -> bool {
    let Some(list) = feature_value.map(str::trim).filter(|v| !v.is_empty()) else {
        return true;
    };
    let norm = |s: &str| s.trim().trim_end_matches('/').to_ascii_lowercase();
    let origin = norm(origin);
    list.split(',').map(norm).any(|o| !o.is_empty() && o == origin)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer;

    /// A minimal CBOR encoder for building test attestation objects.
    pub(crate) fn enc(v: &Cbor, out: &mut Vec<u8>) {
        fn head(major: u8, n: u64, out: &mut Vec<u8>) {
            let m = major << 5;
            match n {
                0..=23 => out.push(m | n as u8),
                24..=0xff => out.extend_from_slice(&[m | 24, n as u8]),
                0x100..=0xffff => {
                    out.push(m | 25);
                    out.extend_from_slice(&(n as u16).to_be_bytes())
                }
                _ => {
                    out.push(m | 26);
                    out.extend_from_slice(&(n as u32).to_be_bytes())
                }
            }
        }
        match v {
            Cbor::Uint(n) => head(0, *n, out),
            Cbor::Nint(n) => head(1, (-1 - *n) as u64, out),
            Cbor::Bytes(b) => {
                head(2, b.len() as u64, out);
                out.extend_from_slice(b)
            }
            Cbor::Text(s) => {
                head(3, s.len() as u64, out);
                out.extend_from_slice(s.as_bytes())
            }
            Cbor::Array(items) => {
                head(4, items.len() as u64, out);
                items.iter().for_each(|i| enc(i, out))
            }
            Cbor::Map(entries) => {
                head(5, entries.len() as u64, out);
                for (k, v) in entries {
                    enc(k, out);
                    enc(v, out);
                }
            }
            Cbor::Tag(t, inner) => {
                head(6, *t, out);
                enc(inner, out)
            }
            Cbor::Simple(s) => head(7, *s, out),
        }
    }

    fn text(s: &str) -> Cbor {
        Cbor::Text(s.into())
    }

    /// A software authenticator: a P-256 key and a credential id.
    pub(crate) struct SoftKey {
        pub key: p256::ecdsa::SigningKey,
        pub id: Vec<u8>,
    }

    impl SoftKey {
        pub fn new(seed: u8) -> Self {
            Self { key: p256::ecdsa::SigningKey::from_slice(&[seed; 32]).unwrap(), id: vec![seed; 20] }
        }
        fn cose(&self) -> Cbor {
            let p = self.key.verifying_key().to_encoded_point(false);
            Cbor::Map(vec![
                (Cbor::Uint(1), Cbor::Uint(2)),
                (Cbor::Uint(3), Cbor::Nint(-7)),
                (Cbor::Nint(-1), Cbor::Uint(1)),
                (Cbor::Nint(-2), Cbor::Bytes(p.x().unwrap().to_vec())),
                (Cbor::Nint(-3), Cbor::Bytes(p.y().unwrap().to_vec())),
            ])
        }
        fn auth_data(&self, flags: u8) -> Vec<u8> {
            let mut d = Sha256::digest(b"example.com").to_vec();
            d.push(flags);
            d.extend_from_slice(&7u32.to_be_bytes());
            d.extend_from_slice(&[0xad; 16]);
            d.extend_from_slice(&(self.id.len() as u16).to_be_bytes());
            d.extend_from_slice(&self.id);
            enc(&self.cose(), &mut d);
            d
        }
        /// (clientDataJson, attestationObject), base64url.
        pub fn attest(&self, challenge: &str, fmt: &str) -> (String, String) {
            let cd = format!(r#"{{"type":"webauthn.create","challenge":"{challenge}","origin":"https://a.example"}}"#);
            let ad = self.auth_data(0x45);
            let stmt = if fmt == "packed" {
                let mut msg = ad.clone();
                msg.extend_from_slice(&Sha256::digest(cd.as_bytes()));
                let sig: p256::ecdsa::Signature = self.key.sign(&msg);
                Cbor::Map(vec![
                    (text("alg"), Cbor::Nint(-7)),
                    (text("sig"), Cbor::Bytes(sig.to_der().as_bytes().to_vec())),
                ])
            } else {
                Cbor::Map(vec![])
            };
            let obj =
                Cbor::Map(vec![(text("fmt"), text(fmt)), (text("attStmt"), stmt), (text("authData"), Cbor::Bytes(ad))]);
            let mut out = vec![];
            enc(&obj, &mut out);
            (b64url(cd.as_bytes()), b64url(&out))
        }
        /// The `X-Stamp-Webauthn` header value for `body`.
        pub fn stamp(&self, body: &[u8], origin: &str) -> String {
            let cd = format!(
                r#"{{"type":"webauthn.get","challenge":"{}","origin":"{origin}","crossOrigin":false}}"#,
                b64url(&challenge_for(body))
            );
            let mut ad = Sha256::digest(b"example.com").to_vec();
            ad.push(0x05);
            ad.extend_from_slice(&8u32.to_be_bytes());
            let mut msg = ad.clone();
            msg.extend_from_slice(&Sha256::digest(cd.as_bytes()));
            let sig: p256::ecdsa::Signature = self.key.sign(&msg);
            serde_json::json!({
                "authenticatorData": b64url(&ad),
                "clientDataJson": b64url(cd.as_bytes()),
                "credentialId": b64url(&self.id),
                "signature": b64url(sig.to_der().as_bytes()),
            })
            .to_string()
        }
    }

    const CHALLENGE: &str = "c2lnbi11cC1jaGFsbGVuZ2U";

    #[test]
    fn spec_challenge_vector() {
        let body = br#"{"organizationId":"00000000-0000-4000-8000-000000000000"}"#;
        assert_eq!(
            String::from_utf8(challenge_for(body)).unwrap(),
            "f61774c4e8eabf6377930808ee4bb02fd0c1d65adc1ca692c84b6c8c134e043d"
        );
        assert_eq!(
            b64url(&challenge_for(body)),
            "ZjYxNzc0YzRlOGVhYmY2Mzc3OTMwODA4ZWU0YmIwMmZkMGMxZDY1YWRjMWNhNjkyYzg0YjZjOGMxMzRlMDQzZA"
        );
    }

    #[test]
    fn none_and_packed_registrations_verify() {
        let k = SoftKey::new(3);
        for fmt in ["none", "packed"] {
            let (cd, ao) = k.attest(CHALLENGE, fmt);
            let r = verify_registration(&b64url(&k.id), &cd, &ao, CHALLENGE).unwrap();
            assert_eq!(r.credential_id, b64url(&k.id));
            assert_eq!(r.public_key, public_key_hex(k.key.verifying_key()));
            assert_eq!(r.attestation_type, fmt);
            assert_eq!(r.aaguid, "adadadad-adad-adad-adad-adadadadadad");
            assert_eq!(r.sign_count, 7);
            assert_eq!(r.origin, "https://a.example");
        }
    }

    #[test]
    fn registration_refusals() {
        let k = SoftKey::new(4);
        let (cd, ao) = k.attest(CHALLENGE, "packed");
        let id = b64url(&k.id);
        let msg = |r: Result<Registration, AuthError>| r.unwrap_err().message;
        assert!(msg(verify_registration(&id, &cd, &ao, "b3RoZXI")).contains("challenge does not match"));
        assert!(
            msg(verify_registration(&b64url(&[1, 2, 3]), &cd, &ao, CHALLENGE)).contains("credentialId does not match")
        );
        assert!(msg(verify_registration(&id, &cd, "!!", CHALLENGE)).contains("not base64url"));
        assert!(msg(verify_registration(&id, &cd, &b64url(&[0xa0]), CHALLENGE)).contains("no fmt"));
        // A packed signature made by another key does not verify.
        let other = SoftKey { key: SoftKey::new(5).key, id: k.id.clone() };
        let (_, ao_other) = other.attest(CHALLENGE, "packed");
        let raw = b64url_decode(&ao_other).unwrap();
        let obj = cbor_decode(&raw).unwrap();
        let mut good = cbor_decode(&b64url_decode(&ao).unwrap()).unwrap();
        if let (Cbor::Map(g), Some(stmt)) = (&mut good, obj.text_key("attStmt")) {
            g[1].1 = stmt.clone();
        }
        let mut forged = vec![];
        enc(&good, &mut forged);
        assert!(msg(verify_registration(&id, &cd, &b64url(&forged), CHALLENGE)).contains("does not verify"));
        // A get clientData is not a registration.
        let get = b64url(br#"{"type":"webauthn.get","challenge":"c2lnbi11cC1jaGFsbGVuZ2U","origin":"x"}"#);
        assert!(msg(verify_registration(&id, &get, &ao, CHALLENGE)).contains("webauthn.create"));
        let e = verify_registration(&id, &get, &ao, CHALLENGE).unwrap_err();
        assert_eq!(e.code, crate::Code::InvalidArgument);
    }

    #[test]
    fn rs256_keys_are_refused() {
        let cose = Cbor::Map(vec![(Cbor::Uint(1), Cbor::Uint(3)), (Cbor::Uint(3), Cbor::Nint(-257))]);
        assert!(cose_p256_key(&cose).unwrap_err().contains("only ES256"));
    }

    #[test]
    fn assertion_round_trip_and_tampering() {
        let k = SoftKey::new(6);
        let pk = public_key_hex(k.key.verifying_key());
        let body = br#"{"organizationId":"o"}"#;
        let header = k.stamp(body, "https://a.example");
        let s = parse_stamp(&header, body).unwrap();
        assert_eq!(s.credential_id, b64url(&k.id));
        assert_eq!(s.origin, "https://a.example");
        verify_assertion(&s, &pk).unwrap();
        // base64url-wrapped JSON is accepted too.
        verify_assertion(&parse_stamp(&b64url(header.as_bytes()), body).unwrap(), &pk).unwrap();
        // Another body: the challenge does not match.
        let e = parse_stamp(&header, b"{}").unwrap_err();
        assert_eq!(e.code, crate::Code::Unauthenticated);
        assert!(e.message.starts_with("could not verify WebAuthN signature"));
        // Another key, or a flipped signature byte.
        let e = verify_assertion(&s, &public_key_hex(SoftKey::new(7).key.verifying_key())).unwrap_err();
        assert_eq!((e.message.as_str(), e.turnkey_code), ("could not verify WebAuthN signature", "SIGNATURE_INVALID"));
        let mut bad = s.clone();
        let n = bad.signature.len();
        bad.signature[n - 1] ^= 1;
        assert!(verify_assertion(&bad, &pk).is_err());
        // High-S is accepted.
        let sig = p256::ecdsa::Signature::from_der(&s.signature).unwrap();
        let (r, sv) = sig.split_scalars();
        let high = p256::ecdsa::Signature::from_scalars(r, -*sv).unwrap();
        let mut hs = s.clone();
        hs.signature = high.to_der().as_bytes().to_vec();
        verify_assertion(&hs, &pk).unwrap();
        // No user presence.
        let mut up = s.clone();
        up.authenticator_data[32] = 0;
        assert!(verify_assertion(&up, &pk).is_err());
    }

    #[test]
    fn malformed_stamps() {
        for h in ["", "{}", "{\"authenticatorData\":1}", "!!"] {
            let e = parse_stamp(h, b"{}").unwrap_err();
            assert!(e.message.starts_with("malformed WebAuthn stamp"), "{h}: {}", e.message);
        }
    }

    #[test]
    fn origins() {
        assert!(origin_allowed(None, "https://x"));
        assert!(origin_allowed(Some(" "), "https://x"));
        let v = Some("https://a.example, https://b.example/");
        assert!(origin_allowed(v, "https://b.example"));
        assert!(origin_allowed(v, "https://A.example"));
        assert!(!origin_allowed(v, "https://c.example"));
        assert!(!origin_allowed(v, ""));
    }

    #[test]
    fn cbor_limits() {
        assert!(cbor_decode(&[0x5f]).is_err()); // indefinite byte string
        assert!(cbor_decode(&[0x9a, 0xff, 0xff, 0xff, 0xff]).is_err()); // huge array count
        assert!(cbor_decode(&[0x42, 0x01]).is_err()); // truncated
        assert!(cbor_decode(&[0x00, 0x00]).is_err()); // trailing
        assert!(cbor_decode(&[0x81; 40].iter().copied().chain([0]).collect::<Vec<_>>()).is_err()); // deep
        assert_eq!(cbor_decode(&[0x38, 0x18]).unwrap(), Cbor::Nint(-25));
    }
}
