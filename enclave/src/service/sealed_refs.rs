//! The sealed references a call carries: which kinds a stamped body may use, in its organization,
//! while its authority state holds them, and opening them (a signing key, or the plain bytes)
//! through the HSM.

use coffer_crypto::keys::SecretKey;
use coffer_crypto::{address, sign, Curve};
use coffer_org_rules::OrgState;
use coffer_proto::v1 as pb;

use crate::admission::{refuse, Admitted};
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

/// A sealed blob the stamped body may use: of an expected kind, in the body's organization, and
/// (a wallet seed, an account key, a private key) bound to a wallet, account or key the
/// organization's authority state holds now ([`held`]): a blob the gateway kept of a deleted
/// wallet or key opens no more. What it is bound to (resource, curve, address, public key) is
/// authenticated when it opens.
pub(super) fn sealed<'a>(
    sealed: Option<&'a pb::SealedRef>,
    expect: &[BlobKind],
    a: &Admitted,
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
    // The state the decision read: the body's own organization's, as key operations take no
    // parent's credential.
    if let Err(why) = held(&a.decided.loaded.state, sealed, kind) {
        return Err(refuse(a, RefusalReason::BindingMismatch, why));
    }
    Ok((sealed, kind))
}

/// Whether `state` (of the blob's organization) holds what `sealed` is bound to now: the wallet
/// of a seed; the account of an account key, in a live wallet, at the address (and in the
/// format) the reference names; the private key of a key blob, each of its recorded addresses
/// the one the reference's curve and public key give. Import targets are a user's, not keys of
/// the state: always held. `Err` says what is missing.
pub(super) fn held(state: &OrgState, sealed: &pb::SealedRef, kind: BlobKind) -> Result<(), &'static str> {
    if state.organization.id != sealed.organization_id {
        return Err("the sealed key's organization has no authority state here");
    }
    match kind {
        BlobKind::WalletSeed if !state.wallets.contains_key(&sealed.resource_id) => {
            Err("the sealed seed's wallet is not in the organization's authority state (deleted, or never recorded)")
        }
        BlobKind::WalletAccountKey => {
            let account = state.accounts.get(&sealed.resource_id).filter(|a| state.wallets.contains_key(&a.wallet_id));
            match account {
                None => Err("the sealed key's account is not in the organization's authority state (its wallet deleted, or never recorded)"),
                Some(a) if a.address != sealed.address => {
                    Err("the sealed key's account has another address in the organization's authority state")
                }
                Some(a) if !sealed.address_format.is_empty() && a.address_format != sealed.address_format => {
                    Err("the sealed key's account has another address format in the organization's authority state")
                }
                Some(_) => Ok(()),
            }
        }
        BlobKind::PrivateKey => {
            let Some(key) = state.private_keys.get(&sealed.resource_id) else {
                return Err(
                    "the sealed private key is not in the organization's authority state (deleted, or never recorded)",
                );
            };
            let public_key = hex::decode(&sealed.public_key).ok();
            let curve = Curve::parse(&sealed.curve).ok();
            let same_key = key.addresses.iter().all(|entry| match (curve, &public_key) {
                (Some(curve), Some(public_key)) => {
                    address::address(&entry.format, curve, public_key).is_ok_and(|a| a == entry.address)
                }
                _ => false,
            });
            if same_key {
                Ok(())
            } else {
                Err("the sealed private key's public key does not give the addresses the organization's authority state records for it")
            }
        }
        _ => Ok(()),
    }
}

/// The binding a reference names for a blob of `kind`.
pub(super) fn binding_of(sealed: &pb::SealedRef, kind: BlobKind) -> BlobBinding<'_> {
    BlobBinding {
        kind,
        organization_id: &sealed.organization_id,
        resource_id: &sealed.resource_id,
        curve: &sealed.curve,
        address: &sealed.address,
        public_key: &sealed.public_key,
    }
}

/// Opens a sealed blob under the binding its reference names.
pub(super) fn open(hsm: &Hsm, sealed: &pb::SealedRef, kind: BlobKind) -> Result<OpenedBlob, EnclaveError> {
    Ok(hsm.unseal(&binding_of(sealed, kind), &sealed.blob)?)
}

/// A signing key as a call uses it: opened from its blob, or held by the HSM (an HSM-native
/// private key, whose blob names the module's object and is bound to its public key).
pub(super) enum UsableKey {
    Opened(SecretKey),
    InHsm { label: String, curve: Curve, public_key: Vec<u8> },
}

impl UsableKey {
    pub(super) fn curve(&self) -> Curve {
        match self {
            Self::Opened(key) => key.curve(),
            Self::InHsm { curve, .. } => *curve,
        }
    }

    /// The public key (compressed SEC1; Ed25519's 32 bytes).
    pub(super) fn public_key(&self) -> Result<Vec<u8>, EnclaveError> {
        match self {
            Self::Opened(key) => Ok(key.public_key()?),
            Self::InHsm { public_key, .. } => Ok(public_key.clone()),
        }
    }

    /// ECDSA over `digest`, low-S, with its recovery id: in software, or `CKM_ECDSA` in the HSM
    /// (normalized, the recovery id found by trial, checked against the bound public key).
    pub(super) fn sign_digest(&self, hsm: &Hsm, digest: &[u8; 32]) -> Result<sign::EcdsaSignature, EnclaveError> {
        match self {
            Self::Opened(key) => Ok(sign::sign_digest(key.curve(), key.secret_bytes(), digest)?),
            Self::InHsm { label, curve, public_key } => {
                let raw = hsm.sign_native(label, digest)?;
                Ok(sign::ecdsa_from_raw(*curve, public_key, digest, &raw)?)
            }
        }
    }

    /// A raw payload's signature, as `sign_raw_payload` returns it.
    pub(super) fn sign_payload(
        &self,
        hsm: &Hsm,
        payload: &str,
        encoding: &str,
        hash_function: &str,
    ) -> Result<sign::SignatureParts, EnclaveError> {
        match self {
            Self::Opened(key) => {
                Ok(sign::sign_payload(key.curve(), key.secret_bytes(), payload, encoding, hash_function)?)
            }
            Self::InHsm { curve, .. } => match sign::payload_to_sign(*curve, payload, encoding, hash_function)? {
                sign::ToSign::Digest(digest) => Ok(self.sign_digest(hsm, &digest)?.parts()),
                sign::ToSign::Message(_) => Err(EnclaveError::invalid("an HSM-native key signs digests only")),
            },
        }
    }

    /// The secret itself, for Ed25519 signing and export; an HSM-native key has none to give.
    pub(super) fn secret(&self) -> Result<&SecretKey, EnclaveError> {
        match self {
            Self::Opened(key) => Ok(key),
            Self::InHsm { .. } => Err(EnclaveError::invalid(
                "this private key is HSM-native (FEATURE_NAME_COFFER_HSM_NATIVE_KEYS): it never leaves the HSM, so it cannot be exported",
            )),
        }
    }
}

/// Opens a signing key; its curve is the one the blob is bound to. A legacy blob binds no curve
/// or address, so the key it holds must match the public key or address it is presented with.
pub(super) fn open_key(hsm: &Hsm, sealed: &pb::SealedRef, kind: BlobKind) -> Result<UsableKey, EnclaveError> {
    let curve = Curve::parse(&sealed.curve)?;
    let plain = open(hsm, sealed, kind)?;
    // An HSM-native private key's blob names its object, bound to the key's public key.
    if let Some(label) = crate::hsm::native_label_of(&plain) {
        if kind != BlobKind::PrivateKey
            || crate::hsm::is_legacy(&sealed.blob)
            || label != crate::hsm::native_label(&sealed.resource_id)
        {
            return Err(EnclaveError::SealAuthentication);
        }
        let public_key = hex::decode(&sealed.public_key).map_err(|_| EnclaveError::SealAuthentication)?;
        return Ok(UsableKey::InHsm { label: label.to_string(), curve, public_key });
    }
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
    Ok(UsableKey::Opened(key))
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

    /// Organization `o` with wallet `w` (account `acc` at `address`, Ethereum) and private key
    /// `k` (`key_public` on secp256k1, with its Ethereum address).
    fn state_with_keys(address: &str, key_public: &[u8]) -> OrgState {
        use coffer_org_rules::model::{Account, AddressEntry, PrivateKey, Wallet};
        use coffer_org_rules::{Effect, Organization};
        let mut state = OrgState::new(Organization { id: "o".into(), ..Default::default() });
        let eth = "ADDRESS_FORMAT_ETHEREUM";
        let key_address = address::address(eth, Curve::Secp256k1, key_public).unwrap();
        let account = Account {
            id: "acc".into(),
            wallet_id: "w".into(),
            address: address.into(),
            address_format: eth.into(),
            exported: false,
        };
        let key = PrivateKey {
            id: "k".into(),
            addresses: vec![AddressEntry { format: eth.into(), address: key_address }],
            ..Default::default()
        };
        state
            .apply_all(&[
                Effect::PutWallet { wallet: Wallet { id: "w".into(), ..Default::default() } },
                Effect::PutAccounts { accounts: vec![account] },
                Effect::PutPrivateKey { private_key: key },
            ])
            .unwrap();
        state
    }

    #[test]
    fn an_hsm_native_key_is_the_one_its_id_names_and_a_32_byte_secret_is_always_a_key() {
        let hsm = crate::hsm::tests::hsm();
        let public_hex = "02".to_string() + &"ab".repeat(32);
        let sealed = |plaintext: &[u8]| {
            let binding = BlobBinding {
                curve: "CURVE_P256",
                public_key: &public_hex,
                ..BlobBinding::plain(BlobKind::PrivateKey, "o", "r")
            };
            pb::SealedRef {
                public_key: public_hex.clone(),
                ..key_ref(pb::BlobKind::PrivateKey, hsm.seal(&binding, plaintext).unwrap(), "CURVE_P256")
            }
        };
        // The reference of key "r" is an HSM-native key; one naming another key's object is not
        // opened at all.
        let own = open_key(
            &hsm,
            &sealed(&crate::hsm::native_reference(&crate::hsm::native_label("r"))),
            BlobKind::PrivateKey,
        );
        assert!(matches!(own, Ok(UsableKey::InHsm { ref label, .. }) if label == "coffer-native-r"));
        assert!(own.unwrap().secret().is_err(), "no secret to export");
        let other = crate::hsm::native_reference(&crate::hsm::native_label("another-key"));
        assert!(matches!(open_key(&hsm, &sealed(&other), BlobKind::PrivateKey), Err(EnclaveError::SealAuthentication)));
        // 32 bytes are a software key, whatever they start with (an imported key can).
        let mut secret = [0x11u8; 32];
        secret[..21].copy_from_slice(b"coffer-hsm-native-v1:");
        assert!(matches!(open_key(&hsm, &sealed(&secret), BlobKind::PrivateKey), Ok(UsableKey::Opened(_))));
    }

    #[test]
    fn only_what_the_state_holds_now_is_held() {
        use coffer_org_rules::Effect;
        let account_public = keys::public_key(Curve::Secp256k1, &[3u8; 32]).unwrap();
        let address = address::address("ADDRESS_FORMAT_ETHEREUM", Curve::Secp256k1, &account_public).unwrap();
        let key_public = keys::public_key(Curve::Secp256k1, &[4u8; 32]).unwrap();
        let state = state_with_keys(&address, &key_public);

        let seed = pb::SealedRef { resource_id: "w".into(), ..key_ref(pb::BlobKind::WalletSeed, vec![], "") };
        let mut account = key_ref(pb::BlobKind::WalletAccountKey, vec![], "CURVE_SECP256K1");
        (account.resource_id, account.address, account.address_format) =
            ("acc".into(), address.clone(), "ADDRESS_FORMAT_ETHEREUM".into());
        let mut key = key_ref(pb::BlobKind::PrivateKey, vec![], "CURVE_SECP256K1");
        (key.resource_id, key.public_key) = ("k".into(), hex::encode(&key_public));
        let target = key_ref(pb::BlobKind::ImportTarget, vec![], "");
        let all = [
            (&seed, BlobKind::WalletSeed),
            (&account, BlobKind::WalletAccountKey),
            (&key, BlobKind::PrivateKey),
            (&target, BlobKind::ImportTarget),
        ];
        for (r, kind) in all {
            assert_eq!(held(&state, r, kind), Ok(()), "{kind:?}");
        }

        // Another organization's state holds none of them.
        let mut elsewhere = state.clone();
        elsewhere.organization.id = "p".into();
        assert!(held(&elsewhere, &seed, BlobKind::WalletSeed).is_err());

        // An unknown id, the account at another address or in another format, a key whose
        // public key gives other addresses (or none: no curve, not hex).
        let unknown = |r: &pb::SealedRef| pb::SealedRef { resource_id: "other".into(), ..r.clone() };
        assert!(held(&state, &unknown(&seed), BlobKind::WalletSeed).is_err());
        assert!(held(&state, &unknown(&account), BlobKind::WalletAccountKey).is_err());
        assert!(held(&state, &unknown(&key), BlobKind::PrivateKey).is_err());
        let moved = pb::SealedRef { address: "0x0000000000000000000000000000000000000001".into(), ..account.clone() };
        assert!(held(&state, &moved, BlobKind::WalletAccountKey).is_err());
        let reformatted = pb::SealedRef { address_format: "ADDRESS_FORMAT_TRON".into(), ..account.clone() };
        assert!(held(&state, &reformatted, BlobKind::WalletAccountKey).is_err());
        let rekeyed = pb::SealedRef { public_key: hex::encode(&account_public), ..key.clone() };
        assert!(held(&state, &rekeyed, BlobKind::PrivateKey).is_err());
        for (curve, public_key) in [("", hex::encode(&key_public)), ("CURVE_SECP256K1", "zz".into())] {
            let bad = pb::SealedRef { curve: curve.into(), public_key, ..key.clone() };
            assert!(held(&state, &bad, BlobKind::PrivateKey).is_err(), "{bad:?}");
        }

        // Deleting the wallet takes its seed and accounts; deleting the key takes it.
        let mut deleted = state.clone();
        deleted.apply(&Effect::DeleteWallets { ids: vec!["w".into()] }).unwrap();
        deleted.apply(&Effect::DeletePrivateKeys { ids: vec!["k".into()] }).unwrap();
        for (r, kind) in &all[..3] {
            assert!(held(&deleted, r, *kind).is_err(), "{kind:?} held after its deletion");
        }
        assert_eq!(held(&deleted, &target, BlobKind::ImportTarget), Ok(()));
        // An account left behind without its wallet (a state written otherwise) is not held.
        let mut orphan = state.clone();
        orphan.wallets.remove("w");
        assert!(held(&orphan, &account, BlobKind::WalletAccountKey).is_err());
    }

    #[test]
    fn legacy_blobs_must_hold_the_key_they_are_presented_as() {
        let hsm = crate::hsm::tests::hsm();
        let secret = [7u8; 32];
        let public_key = keys::public_key(Curve::Secp256k1, &secret).unwrap();
        let legacy = |kind| hsm.seal_as_version(&BlobBinding::plain(kind, "o", "r"), &secret, 1).unwrap();

        let mut k = key_ref(pb::BlobKind::PrivateKey, legacy(BlobKind::PrivateKey), "CURVE_SECP256K1");
        k.public_key = hex::encode(&public_key);
        assert_eq!(open_key(&hsm, &k, BlobKind::PrivateKey).unwrap().secret().unwrap().secret_bytes(), &secret);
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
