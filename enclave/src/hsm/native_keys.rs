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
    format!("coffer-native-{private_key_id}")
}

/// The plaintext sealed for the native key labelled `label`.
pub fn native_reference(label: &str) -> Vec<u8> {
    [NATIVE_REFERENCE, label.as_bytes()].concat()
}

/// The label an opened blob names, if it is an HSM-native key's.
pub fn native_label_of(opened: &[u8]) -> Option<&str> {
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
    /// Makes a `curve` key pair in the module for private key `private_key_id`: the private half
    /// a token object, sensitive, never extractable, for signing only; the public half a session
    /// object, read once. Answers the label and the compressed SEC1 public key. A module that does
    /// not make keys on `curve` is refused as such.
    pub fn make_native_key(
        &self,
        curve: Curve,
        organization_id: &str,
        private_key_id: &str,
        now_ms: i64,
    ) -> Result<(String, Vec<u8>), HsmError> {
        let oid = curve_oid(curve)?;
        if curve == Curve::Secp256k1 && !self.profile().native_secp256k1 {
            return Err(HsmError::NativeCurveUnsupported(curve.wire_name()));
        }
        let label = native_label(private_key_id);
        // Counted before it is made: the module's storage is shared by every organization.
        let shelf = self.shelf.as_ref().ok_or(HsmError::NoShelf("HSM-native keys"))?;
        if self.native_keys_max == 0 {
            return Err(HsmError::NativeKeysOff);
        }
        if !shelf.add_native_key(&label, organization_id, now_ms, self.native_keys_max)? {
            return Err(HsmError::NativeKeysFull(self.native_keys_max));
        }
        let made = self.generate_native_key(curve, oid, &label);
        if made.is_err() {
            shelf.remove_native_key(&label)?;
        }
        made.map(|public| (label, public))
    }

    fn generate_native_key(&self, curve: Curve, oid: &'static [u8], label: &str) -> Result<Vec<u8>, HsmError> {
        let name = label.as_bytes().to_vec();
        let point = self.with_session(
            |s, _| {
                let (public, _private) = s.generate_key_pair(
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
                let point = s.get_attributes(public, &[AttributeType::EcPoint])?.into_iter().find_map(|a| match a {
                    Attribute::EcPoint(p) => Some(p),
                    _ => None,
                });
                s.destroy_object(public)?;
                Ok(point)
            },
            "C_GenerateKeyPair (HSM-native key)",
        );
        let point = match point {
            Ok(point) => point.ok_or(HsmError::Malformed("the module gave the native key no public point"))?,
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
        let compressed = match curve {
            Curve::Secp256k1 => k256::PublicKey::from_sec1_bytes(sec1).map(|k| k.to_sec1_bytes_compressed()),
            _ => p256::PublicKey::from_sec1_bytes(sec1).map(|k| k.to_sec1_bytes_compressed()),
        }
        .map_err(|_| HsmError::Malformed("the native key's public point is not on its curve"))?;
        Ok(compressed)
    }

    /// `CKM_ECDSA` over `digest` with the native key labelled `label`: `r ‖ s`, as the module
    /// made it (any S; the caller normalizes and checks it).
    pub fn sign_native(&self, label: &str, digest: &[u8; 32]) -> Result<Vec<u8>, HsmError> {
        self.with_session(
            |s, _| {
                let found = s.find_objects(&[
                    Attribute::Class(ObjectClass::PRIVATE_KEY),
                    Attribute::Label(label.as_bytes().to_vec()),
                ])?;
                let [key] = found.as_slice() else { return Ok(None) };
                s.sign(&Mechanism::Ecdsa, *key, digest).map(Some)
            },
            "C_Sign (HSM-native key)",
        )?
        .ok_or_else(|| HsmError::NativeKeyMissing(label.to_string()))
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
