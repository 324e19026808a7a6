//! The KEK's operator calls (rotate, destroy), what each KEK holds, and re-sealing the blobs the
//! gateway keeps under the current KEK.

use coffer_proto::v1 as pb;

use super::sealed_refs;
use crate::admission::{now_ms, Admission};
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::{BlobKind, Hsm, HsmError};
use crate::operator::{Operators, DESTROY_KEK, ROTATE_KEK};

/// Most blobs one `ResealBlobs` call moves.
pub const MAX_RESEAL_BATCH: usize = 256;
/// The longest blob `ResealBlobs` takes (a sealed seed or key is under 200 bytes; a code's record
/// under 300).
const MAX_RESEAL_BLOB: usize = 4096;

/// Makes the KEK after the one the operator's stamped body names current.
pub(super) fn rotate(
    hsm: &Hsm,
    admission: &Admission,
    operators: &Operators,
    req: pb::OperatorKekRequest,
) -> Result<pb::KekStatus, EnclaveError> {
    let stamped = operators.authorize_kek(admission, req.operator.as_ref(), ROTATE_KEK)?;
    let from = &stamped.body.parameters.kek_label;
    let to = hsm.rotate_kek(from, now_ms())?;
    tracing::warn!(
        target: "coffer_audit",
        decision = "allow",
        operation = ROTATE_KEK,
        from = from.as_str(),
        to = to.as_str(),
        operator = stamped.operator.as_str(),
        fingerprint = stamped.body.fingerprint.as_str(),
        "enclave decision"
    );
    status(hsm)
}

/// Destroys the old KEK the operator's stamped body names, which must say that no stored blob
/// names it any more.
pub(super) fn destroy(
    hsm: &Hsm,
    admission: &Admission,
    operators: &Operators,
    req: pb::OperatorKekRequest,
) -> Result<pb::KekStatus, EnclaveError> {
    let stamped = operators.authorize_kek(admission, req.operator.as_ref(), DESTROY_KEK)?;
    let p = &stamped.body.parameters;
    if p.blobs_naming_it != 0 {
        return Err(EnclaveError::refused(
            RefusalReason::OperationMismatch,
            format!(
                "the operator's body counts {} stored blobs under {}: re-seal them first",
                p.blobs_naming_it, p.kek_label
            ),
        ));
    }
    hsm.destroy_kek(&p.kek_label, now_ms())?;
    tracing::warn!(
        target: "coffer_audit",
        decision = "allow",
        operation = DESTROY_KEK,
        kek = p.kek_label.as_str(),
        operator = stamped.operator.as_str(),
        fingerprint = stamped.body.fingerprint.as_str(),
        "enclave decision"
    );
    status(hsm)
}

/// What each KEK holds.
pub(super) fn status(hsm: &Hsm) -> Result<pb::KekStatus, EnclaveError> {
    let keks = hsm.kek_states()?;
    Ok(pb::KekStatus {
        current: keks.iter().find(|k| k.current).map(|k| k.label.clone()).unwrap_or_default(),
        keks: keks
            .into_iter()
            .map(|k| pb::KekInfo {
                label: k.label,
                current: k.current,
                seals: k.seals,
                made_ms: k.made_ms,
                destroyed_ms: k.destroyed_ms.unwrap_or(0),
                in_token: k.in_token,
                service_keys: k.service_keys,
            })
            .collect(),
    })
}

/// Seals each blob again under the current KEK, bound as before. A blob that does not open as
/// its reference binds it gets an error of its own (the rest go on); the HSM or the store
/// failing fails the call. Nothing here is a decision: what a blob may be used for is checked
/// when it is used, and a re-sealed blob opens under exactly the binding it opened under.
pub(super) fn reseal_blobs(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::ResealBlobsRequest,
) -> Result<pb::ResealBlobsResponse, EnclaveError> {
    if req.blobs.len() > MAX_RESEAL_BATCH {
        return Err(EnclaveError::invalid(format!("at most {MAX_RESEAL_BATCH} blobs per call")));
    }
    let blobs: Vec<pb::ResealedBlob> = req
        .blobs
        .iter()
        .map(|sealed| match reseal_one(hsm, admission, sealed) {
            Ok(blob) => Ok(pb::ResealedBlob { blob: blob.unwrap_or_default(), error: String::new() }),
            Err(EnclaveError::SealAuthentication) => {
                Ok(pb::ResealedBlob { blob: vec![], error: EnclaveError::SealAuthentication.to_string() })
            }
            Err(EnclaveError::InvalidArgument(why)) => Ok(pb::ResealedBlob { blob: vec![], error: why }),
            Err(e) => Err(e),
        })
        .collect::<Result<_, _>>()?;
    let moved = blobs.iter().filter(|b: &&pb::ResealedBlob| !b.blob.is_empty()).count();
    let current = hsm.current_kek()?;
    tracing::info!(
        target: "coffer_audit",
        decision = "allow",
        operation = "reseal_blobs",
        asked = req.blobs.len(),
        moved,
        kek = current.as_str(),
        "enclave decision"
    );
    Ok(pb::ResealBlobsResponse { current, blobs })
}

fn reseal_one(hsm: &Hsm, admission: &Admission, sealed: &pb::SealedRef) -> Result<Option<Vec<u8>>, EnclaveError> {
    if sealed.blob.len() > MAX_RESEAL_BLOB {
        return Err(EnclaveError::invalid(format!("a sealed blob is at most {MAX_RESEAL_BLOB} bytes")));
    }
    let kind = match pb::BlobKind::try_from(sealed.kind) {
        Ok(pb::BlobKind::WalletSeed) => BlobKind::WalletSeed,
        Ok(pb::BlobKind::WalletAccountKey) => BlobKind::WalletAccountKey,
        Ok(pb::BlobKind::PrivateKey) => BlobKind::PrivateKey,
        Ok(pb::BlobKind::ImportTarget) => BlobKind::ImportTarget,
        Ok(pb::BlobKind::AuthProxyKey) => BlobKind::AuthProxyKey,
        Ok(pb::BlobKind::OtpRecord) => BlobKind::OtpRecord,
        _ => return Err(EnclaveError::invalid("unknown sealed blob kind")),
    };
    // A wallet, account or key moves only while its organization's authority state holds it,
    // as it is used (a deleted one's blob stays as it is, and opens nowhere).
    if matches!(kind, BlobKind::WalletSeed | BlobKind::WalletAccountKey | BlobKind::PrivateKey) {
        let loaded = admission
            .rules()
            .load(&sealed.organization_id)?
            .ok_or_else(|| EnclaveError::invalid("the blob's organization has no authority state"))?;
        sealed_refs::held(&loaded.state, sealed, kind).map_err(EnclaveError::invalid)?;
        // A legacy (version 1) key binds no curve or address: it moves only if the key it holds
        // is the one its reference names, as when it signs, and a private key only with the
        // addresses the state records for it (which fix its curve); the new blob binds them.
        if crate::hsm::is_legacy(&sealed.blob) && kind != BlobKind::WalletSeed {
            let unaddressed = kind == BlobKind::PrivateKey
                && loaded.state.private_keys.get(&sealed.resource_id).is_none_or(|k| k.addresses.is_empty());
            if unaddressed {
                return Err(EnclaveError::invalid("a legacy private key with no addresses is not re-sealed"));
            }
            sealed_refs::open_key(hsm, sealed, kind)?;
        }
    }
    let binding = sealed_refs::binding_of(sealed, kind);
    // A blob naming a KEK the token does not hold fails alone; the current KEK missing fails
    // the call (`Hsm::reseal` seals only after the blob opened).
    let named = crate::hsm::kek_of_blob(&sealed.blob);
    match hsm.reseal(&binding, &sealed.blob) {
        Ok(blob) => Ok(blob),
        Err(HsmError::UnknownKek(label)) if named.as_deref() == Some(label.as_str()) => {
            Err(EnclaveError::invalid("the blob names a KEK the token does not hold (destroyed, or never made here)"))
        }
        // The current KEK missing is this enclave's, not the blob's (restart it after a rotation
        // where the module does not show other processes' objects).
        Err(e @ HsmError::UnknownKek(_)) => Err(EnclaveError::Hsm(e.to_string())),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use coffer_org_rules::model::{AddressEntry, PrivateKey, Wallet};
    use coffer_org_rules::{Change, Effect, Organization};

    use super::*;
    use crate::hsm::BlobBinding;

    fn key_ref(org: &str, id: &str, public_key: &str, blob: Vec<u8>) -> pb::SealedRef {
        pb::SealedRef {
            kind: pb::BlobKind::PrivateKey as i32,
            organization_id: org.into(),
            resource_id: id.into(),
            blob,
            curve: "CURVE_SECP256K1".into(),
            public_key: public_key.into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_key_the_state_holds_moves_under_its_own_binding_and_a_batch_is_bounded() {
        let hsm = crate::hsm::tests::hsm();
        let admission = Admission::in_memory(hsm.clone(), 300_000, 16).unwrap();
        let secret = [0x21u8; 32];
        let public = coffer_crypto::keys::public_key(coffer_crypto::Curve::Secp256k1, &secret).unwrap();
        let public_hex = hex::encode(&public);
        let eth = "ADDRESS_FORMAT_ETHEREUM";
        let address = coffer_crypto::address::address(eth, coffer_crypto::Curve::Secp256k1, &public).unwrap();
        let change = |effect| Change { organization_id: "reseal-org".into(), effect };
        admission
            .rules()
            .import(
                "reseal-org",
                &[
                    change(Effect::CreateOrganization {
                        organization: Organization { id: "reseal-org".into(), ..Default::default() },
                    }),
                    change(Effect::PutWallet { wallet: Wallet { id: "wallet".into(), ..Default::default() } }),
                    change(Effect::PutPrivateKey {
                        private_key: PrivateKey {
                            id: "held".into(),
                            addresses: vec![AddressEntry { format: eth.into(), address }],
                            ..Default::default()
                        },
                    }),
                ],
            )
            .unwrap();
        let seal = |id: &str| {
            let binding = BlobBinding {
                curve: "CURVE_SECP256K1",
                public_key: &public_hex,
                ..BlobBinding::plain(BlobKind::PrivateKey, "reseal-org", id)
            };
            hsm.seal_as_version(&binding, &secret, 2).unwrap()
        };
        let ask = |refs: Vec<pb::SealedRef>| reseal_blobs(&hsm, &admission, pb::ResealBlobsRequest { blobs: refs });
        // The held key's blob (an older format) moves; a key the state does not hold, a blob
        // presented under another key, and another organization's do not.
        let answer = ask(vec![
            key_ref("reseal-org", "held", &public_hex, seal("held")),
            key_ref("reseal-org", "gone", &public_hex, seal("gone")),
            key_ref("reseal-org", "held", &public_hex, seal("gone")),
            key_ref("other-org", "held", &public_hex, seal("held")),
        ])
        .unwrap();
        let outcome: Vec<(bool, &str)> = answer.blobs.iter().map(|b| (!b.blob.is_empty(), b.error.as_str())).collect();
        assert!(outcome[0].0 && outcome[0].1.is_empty(), "{outcome:?}");
        assert!(!outcome[1].0 && outcome[1].1.contains("not in the organization's authority state"), "{outcome:?}");
        assert!(!outcome[2].0 && outcome[2].1.contains("failed authentication"), "{outcome:?}");
        assert!(!outcome[3].0 && outcome[3].1.contains("no authority state"), "{outcome:?}");
        // What moved opens under the same binding, in the current format; again, it needs nothing.
        let moved = answer.blobs[0].blob.clone();
        assert!(!crate::hsm::is_legacy(&moved));
        let again = ask(vec![key_ref("reseal-org", "held", &public_hex, moved)]).unwrap();
        assert!(again.blobs[0].blob.is_empty() && again.blobs[0].error.is_empty());
        // A wallet's seed in the first format (bound to kind, organization and wallet only) moves
        // too, to the current format.
        let seed_binding = BlobBinding::plain(BlobKind::WalletSeed, "reseal-org", "wallet");
        let old_seed = hsm.seal_as_version(&seed_binding, b"abandon abandon about", 1).unwrap();
        let seed_ref = pb::SealedRef {
            kind: pb::BlobKind::WalletSeed as i32,
            organization_id: "reseal-org".into(),
            resource_id: "wallet".into(),
            blob: old_seed,
            ..Default::default()
        };
        let moved = ask(vec![seed_ref]).unwrap().blobs.remove(0);
        assert!(moved.error.is_empty(), "{}", moved.error);
        assert!(!crate::hsm::is_legacy(&moved.blob));
        assert_eq!(hsm.unseal(&seed_binding, &moved.blob).unwrap().as_slice(), b"abandon abandon about");
        // A batch is bounded before anything is opened.
        let many = vec![key_ref("reseal-org", "held", &public_hex, vec![]); MAX_RESEAL_BATCH + 1];
        assert!(matches!(ask(many), Err(EnclaveError::InvalidArgument(_))));
    }
}
