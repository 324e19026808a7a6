//! The sealed references a call carries: which kinds a stamped body may use, in its organization,
//! and opening them (a signing key, or the plain bytes) through the HSM.

use coffer_crypto::keys::SecretKey;
use coffer_crypto::{address, Curve};
use coffer_proto::v1 as pb;

use crate::authority::{refuse, Authorized};
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::{BlobBinding, BlobKind, Hsm, OpenedBlob};

fn kind_of(kind: i32) -> Result<BlobKind, EnclaveError> {
    match pb::BlobKind::try_from(kind) {
        Ok(pb::BlobKind::WalletSeed) => Ok(BlobKind::WalletSeed),
        Ok(pb::BlobKind::WalletAccountKey) => Ok(BlobKind::WalletAccountKey),
        Ok(pb::BlobKind::PrivateKey) => Ok(BlobKind::PrivateKey),
        Ok(pb::BlobKind::ImportTarget) => Ok(BlobKind::ImportTarget),
        _ => Err(EnclaveError::invalid("unknown sealed blob kind")),
    }
}

/// A sealed blob the stamped body may use: of an expected kind and in the body's organization.
/// What it is bound to (resource, curve, address) is authenticated when it opens.
pub(super) fn sealed<'a>(
    sealed: Option<&'a pb::SealedRef>,
    expect: &[BlobKind],
    a: &Authorized,
) -> Result<(&'a pb::SealedRef, BlobKind), EnclaveError> {
    let sealed = sealed.ok_or_else(|| EnclaveError::invalid("missing sealed reference"))?;
    let kind = kind_of(sealed.kind)?;
    if !expect.contains(&kind) {
        return Err(EnclaveError::invalid("sealed blob of the wrong kind"));
    }
    if sealed.organization_id != a.activity.organization_id {
        return Err(refuse(
            a,
            RefusalReason::BindingMismatch,
            "the sealed key belongs to another organization than the stamped body",
        ));
    }
    Ok((sealed, kind))
}

/// Opens a sealed blob under the binding its reference names.
pub(super) fn open(hsm: &Hsm, sealed: &pb::SealedRef, kind: BlobKind) -> Result<OpenedBlob, EnclaveError> {
    let binding = BlobBinding {
        kind,
        organization_id: &sealed.organization_id,
        resource_id: &sealed.resource_id,
        curve: &sealed.curve,
        address: &sealed.address,
        public_key: &sealed.public_key,
    };
    Ok(hsm.unseal(&binding, &sealed.blob)?)
}

/// Opens a signing key; its curve is the one the blob is bound to. A legacy blob binds no curve
/// or address, so the key it holds must match the public key or address it is presented with.
pub(super) fn open_key(hsm: &Hsm, sealed: &pb::SealedRef, kind: BlobKind) -> Result<SecretKey, EnclaveError> {
    let curve = Curve::parse(&sealed.curve)?;
    let plain = open(hsm, sealed, kind)?;
    let key = SecretKey::from_slice(curve, &plain)
        .map_err(|_| EnclaveError::Internal("sealed key is not 32 bytes".into()))?;
    if crate::hsm::is_legacy(&sealed.blob) {
        let public_key = key.public_key()?;
        let matches = match kind {
            BlobKind::PrivateKey => hex::encode(&public_key) == sealed.public_key,
            _ => address::address(&sealed.address_format, curve, &public_key).is_ok_and(|a| a == sealed.address),
        };
        if !matches {
            return Err(EnclaveError::SealAuthentication);
        }
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use coffer_crypto::keys;

    fn key_ref(kind: pb::BlobKind, blob: Vec<u8>, curve: &str) -> pb::SealedRef {
        pb::SealedRef {
            kind: kind as i32,
            organization_id: "o".into(),
            resource_id: "r".into(),
            blob,
            curve: curve.into(),
            ..Default::default()
        }
    }

    #[test]
    fn legacy_blobs_must_hold_the_key_they_are_presented_as() {
        let hsm = crate::hsm::tests::hsm();
        let secret = [7u8; 32];
        let public_key = keys::public_key(Curve::Secp256k1, &secret).unwrap();
        let legacy = |kind| hsm.seal_as_version(&BlobBinding::plain(kind, "o", "r"), &secret, 1).unwrap();

        let mut k = key_ref(pb::BlobKind::PrivateKey, legacy(BlobKind::PrivateKey), "CURVE_SECP256K1");
        k.public_key = hex::encode(&public_key);
        assert_eq!(open_key(&hsm, &k, BlobKind::PrivateKey).unwrap().secret_bytes(), &secret);
        k.public_key = hex::encode(keys::public_key(Curve::Secp256k1, &[8u8; 32]).unwrap());
        assert!(matches!(open_key(&hsm, &k, BlobKind::PrivateKey), Err(EnclaveError::SealAuthentication)));

        let address = address::address("ADDRESS_FORMAT_ETHEREUM", Curve::Secp256k1, &public_key).unwrap();
        let mut a = key_ref(pb::BlobKind::WalletAccountKey, legacy(BlobKind::WalletAccountKey), "CURVE_SECP256K1");
        (a.address, a.address_format) = (address, "ADDRESS_FORMAT_ETHEREUM".into());
        assert!(open_key(&hsm, &a, BlobKind::WalletAccountKey).is_ok());
        let mut other_curve = a.clone();
        other_curve.curve = "CURVE_P256".into();
        assert!(matches!(
            open_key(&hsm, &other_curve, BlobKind::WalletAccountKey),
            Err(EnclaveError::SealAuthentication)
        ));
        let mut other_address = a.clone();
        other_address.address = "0x0000000000000000000000000000000000000001".into();
        assert!(matches!(
            open_key(&hsm, &other_address, BlobKind::WalletAccountKey),
            Err(EnclaveError::SealAuthentication)
        ));

        // Current blobs bind curve and address themselves.
        let binding = BlobBinding {
            curve: "CURVE_SECP256K1",
            address: &a.address,
            ..BlobBinding::plain(BlobKind::WalletAccountKey, "o", "r")
        };
        let mut current = a.clone();
        current.blob = hsm.seal(&binding, &secret).unwrap();
        assert!(open_key(&hsm, &current, BlobKind::WalletAccountKey).is_ok());
        current.curve = "CURVE_P256".into();
        assert!(matches!(open_key(&hsm, &current, BlobKind::WalletAccountKey), Err(EnclaveError::SealAuthentication)));
    }
}
