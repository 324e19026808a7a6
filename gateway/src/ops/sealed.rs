//! The sealed blobs of stored records as the enclave opens them: each with the place it was
//! sealed to (organization, record id, curve, address or public key), all of it in the seal's AAD.

use coffer_proto::v1 as pb;

use crate::store::{ImportTarget, PrivateKey, Wallet, WalletAccount};

pub fn seed(w: &Wallet) -> pb::SealedRef {
    pb::SealedRef {
        kind: pb::BlobKind::WalletSeed as i32,
        organization_id: w.organization_id.clone(),
        resource_id: w.id.clone(),
        blob: w.sealed_seed.clone(),
        ..Default::default()
    }
}

pub fn account(a: &WalletAccount) -> pb::SealedRef {
    pb::SealedRef {
        kind: pb::BlobKind::WalletAccountKey as i32,
        organization_id: a.organization_id.clone(),
        resource_id: a.id.clone(),
        blob: a.sealed_key.clone(),
        curve: a.curve.clone(),
        address: a.address.clone(),
        public_key: String::new(),
        address_format: a.address_format.clone(),
    }
}

pub fn private_key(k: &PrivateKey) -> pb::SealedRef {
    pb::SealedRef {
        kind: pb::BlobKind::PrivateKey as i32,
        organization_id: k.organization_id.clone(),
        resource_id: k.id.clone(),
        blob: k.sealed_key.clone(),
        curve: k.curve.clone(),
        address: String::new(),
        public_key: k.public_key.clone(),
        address_format: String::new(),
    }
}

pub fn import_target(t: &ImportTarget) -> pb::SealedRef {
    pb::SealedRef {
        kind: pb::BlobKind::ImportTarget as i32,
        organization_id: t.organization_id.clone(),
        resource_id: t.user_id.clone(),
        blob: t.sealed_key.clone(),
        ..Default::default()
    }
}
