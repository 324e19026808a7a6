//! Keys that never leave the HSM (HSM-native): P-256 or secp256k1 pairs made in the module,
//! sensitive and never extractable, signing with `CKM_ECDSA`; the blob the gateway keeps for one
//! is sealed like any key's, bound to its organization, id, curve and public key, and holds only
//! the label of the module's object.

use cryptoki::error::RvError;
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, AttributeType, ObjectClass};

use coffer_crypto::Curve;

use super::error::HsmError;
use super::token::{find_key, Hsm};

/// What an opened blob of an HSM-native key starts with (a software key's blob opens to its 32
/// secret bytes, never to this).
const NATIVE_REFERENCE: &[u8] = b"coffer-hsm-native-v1:";
/// The DER OIDs of the curves a native key may be on.
const OID_P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_SECP256K1: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x0a];

/// The label of the module's object for private key `private_key_id` (ids are the enclave's, so
/// one object per key).
pub fn native_label(private_key_id: &str) -> String {
    format!("{NATIVE_LABEL_PREFIX}{private_key_id}")
}

const NATIVE_LABEL_PREFIX: &str = "coffer-native-";

/// The plaintext sealed for the native key labelled `label`.
pub fn native_reference(label: &str) -> Vec<u8> {
    [NATIVE_REFERENCE, label.as_bytes()].concat()
}

/// The label an opened blob names, if it is an HSM-native key's (a software key's blob opens to
/// exactly 32 bytes, whatever they are).
pub fn native_label_of(opened: &[u8]) -> Option<&str> {
    if opened.len() == 32 {
        return None;
    }
    std::str::from_utf8(opened.strip_prefix(NATIVE_REFERENCE)?).ok()
}

fn curve_oid(curve: Curve) -> Result<&'static [u8], HsmError> {
    match curve {
        Curve::P256 => Ok(OID_P256),
        Curve::Secp256k1 => Ok(OID_SECP256K1),
        Curve::Ed25519 => Err(HsmError::NativeCurveUnsupported("CURVE_ED25519")),
    }
}

impl Hsm {
    /// Makes a `curve` key pair in the module for private key `private_key_id` of
    /// `organization_id`, counted first against the token's and its top-level organization
    /// `charged_to`'s bounds: the private half a token object, sensitive, never extractable, for
    /// signing only; the public half a session object, read once. Answers the label and the
    /// compressed SEC1 public key. A module that does not make keys on `curve` is refused as
    /// such; whatever fails after the count leaves neither the object nor the count.
    pub fn make_native_key(
        &self,
        curve: Curve,
        organization_id: &str,
        charged_to: &str,
        private_key_id: &str,
        now_ms: i64,
    ) -> Result<(String, Vec<u8>), HsmError> {
        let oid = curve_oid(curve)?;
        if curve == Curve::Secp256k1 && !self.profile().native_secp256k1 {
            return Err(HsmError::NativeCurveUnsupported(curve.wire_name()));
        }
        let shelf = self.shelf.as_ref().ok_or(HsmError::NoShelf("HSM-native keys"))?;
        if self.native_keys.total == 0 {
            return Err(HsmError::NativeKeysOff);
        }
        let label = native_label(private_key_id);
        shelf.count_native_key(
            &label,
            organization_id,
            charged_to,
            now_ms,
            (self.native_keys.total, self.native_keys.per_organization),
        )?;
        let made = self.generate_native_key(curve, oid, &label);
        if made.is_err() {
            // Made and then failed (its point unreadable): destroyed with its count.
            if let Err(e) = self.destroy_native_key(&label) {
                tracing::warn!(error = %e, key = label.as_str(), "an HSM-native key that failed was not destroyed");
            }
        }
        made.map(|public| (label, public))
    }

    fn generate_native_key(&self, curve: Curve, oid: &'static [u8], label: &str) -> Result<Vec<u8>, HsmError> {
        let name = label.as_bytes().to_vec();
        let point = self.with_session(
            |s, _| {
                // Once only: a session recovered after the pair was made must not make a second
                // object under the label.
                let held =
                    s.find_objects(&[Attribute::Class(ObjectClass::PRIVATE_KEY), Attribute::Label(name.clone())])?;
                if !held.is_empty() {
                    return Ok(Err(HsmError::DuplicateLabel { label: label.to_string(), count: held.len() }));
                }
                let (public, private) = s.generate_key_pair(
                    &Mechanism::EccKeyPairGen,
                    &[
                        Attribute::Token(false),
                        Attribute::Verify(true),
                        Attribute::EcParams(oid.to_vec()),
                        Attribute::Label(name.clone()),
                    ],
                    &[
                        Attribute::Token(true),
                        Attribute::Private(true),
                        Attribute::Sensitive(true),
                        Attribute::Extractable(false),
                        Attribute::Sign(true),
                        Attribute::Label(name.clone()),
                        Attribute::Id(name.clone()),
                    ],
                )?;
                let read = s.get_attributes(public, &[AttributeType::EcPoint]);
                let _ = s.destroy_object(public);
                let point = match read {
                    Ok(attrs) => attrs.into_iter().find_map(|a| match a {
                        Attribute::EcPoint(p) => Some(p),
                        _ => None,
                    }),
                    Err(e) => {
                        let _ = s.destroy_object(private);
                        return Err(e);
                    }
                };
                Ok(Ok(point))
            },
            "C_GenerateKeyPair (HSM-native key)",
        );
        let point = match point {
            Ok(Ok(point)) => point.ok_or(HsmError::Malformed("the module gave the native key no public point"))?,
            Ok(Err(e)) => return Err(e),
            Err(HsmError::Pkcs11 {
                rv:
                    RvError::CurveNotSupported
                    | RvError::DomainParamsInvalid
                    | RvError::AttributeValueInvalid
                    | RvError::TemplateInconsistent
                    | RvError::MechanismInvalid,
                ..
            }) => return Err(HsmError::NativeCurveUnsupported(curve.wire_name())),
            Err(e) => return Err(e),
        };
        // SoftHSM wraps the point in a DER OCTET STRING; some modules return it raw (notes 4.7).
        let sec1 = match point.as_slice() {
            [0x04, 0x41, rest @ ..] if rest.len() == 65 => rest,
            raw => raw,
        };
        match curve {
            Curve::Secp256k1 => k256::PublicKey::from_sec1_bytes(sec1).map(|k| k.to_sec1_bytes_compressed()),
            _ => p256::PublicKey::from_sec1_bytes(sec1).map(|k| k.to_sec1_bytes_compressed()),
        }
        .map_err(|_| HsmError::Malformed("the native key's public point is not on its curve"))
    }

    /// Destroys every HSM-native key of `organization_id` (deleted with its state); answers how
    /// many the module held.
    pub fn destroy_native_keys_of(&self, organization_id: &str) -> Result<usize, HsmError> {
        let Some(shelf) = &self.shelf else { return Ok(0) };
        let mut held = 0;
        for (label, _, _) in shelf.native_keys(Some(organization_id))? {
            held += usize::from(self.destroy_native_key(&label)?);
        }
        Ok(held)
    }

    /// The HSM-native keys counted, made before `before_ms`: (private key id, organization).
    pub fn native_keys_made_before(&self, before_ms: i64) -> Result<Vec<(String, String)>, HsmError> {
        let Some(shelf) = &self.shelf else { return Ok(Vec::new()) };
        Ok(shelf
            .native_keys(None)?
            .into_iter()
            .filter(|(_, _, made)| *made < before_ms)
            .filter_map(|(label, org, _)| Some((label.strip_prefix(NATIVE_LABEL_PREFIX)?.to_string(), org)))
            .collect())
    }

    /// `CKM_ECDSA` over `digest` with the native key labelled `label`: `r ‖ s`, as the module
    /// made it (any S; the caller normalizes and checks it).
    pub fn sign_native(&self, label: &str, digest: &[u8; 32]) -> Result<Vec<u8>, HsmError> {
        self.with_session_using(
            || self.native_handle(label),
            |s, key| s.sign(&Mechanism::Ecdsa, key, digest),
            "C_Sign (HSM-native key)",
        )
    }

    /// Destroys the native key labelled `label`; answers whether the module held it.
    pub fn destroy_native_key(&self, label: &str) -> Result<bool, HsmError> {
        let session = self.session()?;
        let held = match find_key(&session, ObjectClass::PRIVATE_KEY, label)? {
            Some(key) => {
                session.destroy_object(key).map_err(|e| HsmError::call("C_DestroyObject (HSM-native key)", e))?;
                true
            }
            None => false,
        };
        drop(session);
        self.forget_native(label)?;
        if let Some(shelf) = &self.shelf {
            shelf.remove_native_key(label)?;
        }
        Ok(held)
    }
}

/// Compressed SEC1 encoding, for both curves' public keys.
trait Compressed {
    fn to_sec1_bytes_compressed(&self) -> Vec<u8>;
}

impl Compressed for k256::PublicKey {
    fn to_sec1_bytes_compressed(&self) -> Vec<u8> {
        use k256::elliptic_curve::sec1::ToEncodedPoint;
        self.to_encoded_point(true).as_bytes().to_vec()
    }
}

impl Compressed for p256::PublicKey {
    fn to_sec1_bytes_compressed(&self) -> Vec<u8> {
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        self.to_encoded_point(true).as_bytes().to_vec()
    }
}
