//! Moving key material in and out: exports encrypted to the stamped body's target key, and
//! imports decrypted with the user's import target, both under the HSM bundle signer.

use coffer_auth::envelope::{derived_id, derived_ids, items, text, PRIVATE_KEY_ID, WALLET_ACCOUNT_ID, WALLET_ID};
use coffer_crypto::bundle::{self, EnvelopeSigner};
use coffer_crypto::keys::SecretKey;
use coffer_crypto::{keys, CryptoError, Curve};
use coffer_proto::v1 as pb;
use zeroize::Zeroizing;

use super::key_facts;
use super::keys::{
    account_specs, checked_phrase, key_json, new_ids, private_key_result, seal_private_key, seal_wallet, wallet_proofs,
    wallet_result,
};
use super::sealed_refs::{open, open_key, sealed};
use crate::admission::{refuse, Admission, Admitted};
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::{BlobBinding, BlobKind, Hsm};

/// Activity types, as the stamped bodies name them.
mod types {
    pub const EXPORT_WALLET: &str = "ACTIVITY_TYPE_EXPORT_WALLET";
    pub const EXPORT_PRIVATE_KEY: &str = "ACTIVITY_TYPE_EXPORT_PRIVATE_KEY";
    pub const EXPORT_WALLET_ACCOUNT: &str = "ACTIVITY_TYPE_EXPORT_WALLET_ACCOUNT";
    pub const INIT_IMPORT_WALLET: &str = "ACTIVITY_TYPE_INIT_IMPORT_WALLET";
    pub const INIT_IMPORT_PRIVATE_KEY: &str = "ACTIVITY_TYPE_INIT_IMPORT_PRIVATE_KEY";
    pub const IMPORT_WALLET: &str = "ACTIVITY_TYPE_IMPORT_WALLET";
    pub const IMPORT_PRIVATE_KEY: &str = "ACTIVITY_TYPE_IMPORT_PRIVATE_KEY";
}

/// The bundle signer's public key (export and import envelopes verify against it).
pub(super) fn signer_public_key(hsm: &Hsm) -> Result<pb::GetSignerPublicKeyResponse, EnclaveError> {
    Ok(pb::GetSignerPublicKeyResponse { public_key: hsm.signer_public_key()?.to_vec() })
}

/// Exports the mnemonic of the wallet the stamped body names (in its language).
pub(super) fn export_wallet(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::ExportWalletRequest,
) -> Result<pb::ExportResponse, EnclaveError> {
    let (a, unspent, link) =
        admission.authorize_key_use("export_wallet", req.auth.as_ref(), &[types::EXPORT_WALLET])?;
    let (seed_ref, kind) = sealed(req.seed.as_ref(), &[BlobKind::WalletSeed], &a)?;
    if seed_ref.resource_id != text(&a.activity.parameters, "walletId") {
        return Err(refuse(
            &a,
            RefusalReason::BindingMismatch,
            "the sealed seed is not the wallet the stamped body names",
        ));
    }
    let phrase = checked_phrase(&open(hsm, seed_ref, kind)?)?;
    let language = text(&a.activity.parameters, "language");
    let phrase = if language.is_empty() || language == "MNEMONIC_LANGUAGE_ENGLISH" {
        phrase
    } else {
        let entropy = keys::entropy_from_phrase(&phrase)?;
        keys::mnemonic_phrase(&entropy, language)?
    };
    let mut bundle = export(hsm, &a, phrase.as_bytes())?;
    let result = serde_json::json!({ "walletId": seed_ref.resource_id, "exportBundle": bundle.export_bundle });
    // Spent with its link, once the work is done: a refused or failed call spends nothing.
    let spent = unspent.with_result(&result);
    bundle.log_link = crate::proofs::spend_and_link(hsm, admission, &a, spent, link, &result, &bundle.app_proofs)?;
    // Exported once linked: a link the log refuses (the activity linked already, as failed, say)
    // marks nothing exported, and no bundle leaves.
    key_facts::exported(admission, &a, Some(&seed_ref.resource_id), None, None)?;
    bundle.result = result.to_string().into_bytes();
    Ok(bundle)
}

/// Exports the private key or wallet account the stamped body names.
pub(super) fn export_key(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::ExportKeyRequest,
) -> Result<pb::ExportResponse, EnclaveError> {
    let (a, unspent, link) = admission.authorize_key_use(
        "export_key",
        req.auth.as_ref(),
        &[types::EXPORT_PRIVATE_KEY, types::EXPORT_WALLET_ACCOUNT],
    )?;
    let p = &a.activity.parameters;
    let (key_ref, kind) = if a.activity.activity_type == types::EXPORT_PRIVATE_KEY {
        let (r, k) = sealed(req.key.as_ref(), &[BlobKind::PrivateKey], &a)?;
        if r.resource_id != text(p, "privateKeyId") {
            return Err(refuse(
                &a,
                RefusalReason::BindingMismatch,
                "the sealed key is not the private key the stamped body names",
            ));
        }
        (r, k)
    } else {
        let (r, k) = sealed(req.key.as_ref(), &[BlobKind::WalletAccountKey], &a)?;
        if r.address != text(p, "address") {
            return Err(refuse(
                &a,
                RefusalReason::BindingMismatch,
                "the sealed key is not the account the stamped body names",
            ));
        }
        (r, k)
    };
    let private_key_id = (kind == BlobKind::PrivateKey).then(|| key_ref.resource_id.clone());
    let key = open_key(hsm, key_ref, kind)?;
    let mut bundle = export(hsm, &a, key.secret()?.secret_bytes())?;
    let result = match &private_key_id {
        Some(id) => serde_json::json!({ "privateKeyId": id, "exportBundle": bundle.export_bundle }),
        None => serde_json::json!({ "address": key_ref.address, "exportBundle": bundle.export_bundle }),
    };
    let spent = unspent.with_result(&result);
    bundle.log_link = crate::proofs::spend_and_link(hsm, admission, &a, spent, link, &result, &bundle.app_proofs)?;
    // Exported once linked (as above).
    let account = private_key_id.is_none().then_some(key_ref.resource_id.as_str());
    key_facts::exported(admission, &a, None, private_key_id.as_deref(), account)?;
    bundle.result = result.to_string().into_bytes();
    Ok(bundle)
}

/// A new import target for the body's user: sealed here, its public half in a signed bundle.
pub(super) fn init_import(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::InitImportRequest,
) -> Result<pb::InitImportResponse, EnclaveError> {
    let (a, unspent, link) = admission.authorize_key_use(
        "init_import",
        req.auth.as_ref(),
        &[types::INIT_IMPORT_WALLET, types::INIT_IMPORT_PRIVATE_KEY],
    )?;
    let (org, user) = (a.activity.organization_id.as_str(), text(&a.activity.parameters, "userId"));
    if user.is_empty() {
        return Err(EnclaveError::invalid("userId is required"));
    }
    let seed = hsm.random_seed()?;
    let target = bundle::new_import_target(&seed)?;
    let binding = BlobBinding::plain(BlobKind::ImportTarget, org, user);
    let sealed_target_key = hsm.seal(&binding, target.secret.as_slice())?;
    let signer = HsmSigner::new(hsm)?;
    let import_bundle = bundle::import_bundle(&signer, &target.public, org, user)?;
    let api_result = serde_json::json!({ "importBundle": import_bundle });
    let result = serde_json::json!({ "userId": user, "importBundleSha256": sha256_hex(&import_bundle) });
    let app_proofs = crate::proofs::of_call(hsm, &a, result)?;
    let spent = unspent.with_result(&api_result);
    let log_link = crate::proofs::spend_and_link(hsm, admission, &a, spent, link, &api_result, &app_proofs)?;
    let (evaluation, result) = (a.evaluation(), api_result.to_string().into_bytes());
    Ok(pb::InitImportResponse { import_bundle, sealed_target_key, app_proofs, evaluation, result, log_link })
}

/// A wallet from the mnemonic the stamped body's bundle holds, sealed with its accounts.
pub(super) fn import_wallet(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::ImportWalletRequest,
) -> Result<pb::CreateWalletResponse, EnclaveError> {
    let (a, unspent, link) =
        admission.authorize_key_use("import_wallet", req.auth.as_ref(), &[types::IMPORT_WALLET])?;
    // Every id is derived from the stamped body: the caller names none.
    let accounts = items(&a.activity.parameters, "accounts");
    let wallet_id = derived_id(&a.activity.fingerprint, WALLET_ID, 0);
    let account_ids = derived_ids(&a.activity.fingerprint, WALLET_ACCOUNT_ID, accounts.len());
    let specs = account_specs(accounts, &account_ids)?;
    key_facts::ensure_new_ids(admission, &a, &a.activity.organization_id, &new_ids(Some(&wallet_id), &specs))?;
    let plain = open_import(hsm, &a, req.target.as_ref())?;
    let phrase = checked_phrase(&plain)?;
    let mut made = seal_wallet(hsm, &a.activity.organization_id, &wallet_id, &phrase, &specs)?;
    let result = wallet_result(&wallet_id, &made.accounts);
    made.result = result.to_string().into_bytes();
    made.evaluation = a.evaluation();
    made.app_proofs = wallet_proofs(hsm, &a, &a.activity.organization_id, &wallet_id, &specs, &made.accounts)?;
    let spent = unspent.with_result(&result);
    made.log_link = crate::proofs::spend_and_link(hsm, admission, &a, spent, link, &result, &made.app_proofs)?;
    // Recorded once linked: a link the log refuses records nothing.
    key_facts::wallet_created(admission, &a, &wallet_id, true, &made)?;
    Ok(made)
}

/// A private key from the stamped body's bundle, sealed with its addresses.
pub(super) fn import_private_key(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::ImportPrivateKeyRequest,
) -> Result<pb::KeyMaterial, EnclaveError> {
    let (a, unspent, link) =
        admission.authorize_key_use("import_private_key", req.auth.as_ref(), &[types::IMPORT_PRIVATE_KEY])?;
    let p = &a.activity.parameters;
    let private_key_id = derived_id(&a.activity.fingerprint, PRIVATE_KEY_ID, 0);
    key_facts::ensure_new_ids(admission, &a, &a.activity.organization_id, &[&private_key_id])?;
    let curve = Curve::parse(text(p, "curve"))?;
    let plain = open_import(hsm, &a, req.target.as_ref())?;
    if plain.len() != 32 {
        return Err(EnclaveError::invalid("imported private key must be 32 bytes"));
    }
    let key = SecretKey::from_slice(curve, &plain)?;
    let mut made =
        seal_private_key(hsm, &a.activity.organization_id, &private_key_id, &key, items(p, "addressFormats"))?;
    let api_result = private_key_result(&private_key_id, &made);
    made.result = api_result.to_string().into_bytes();
    made.evaluation = a.evaluation();
    let result = serde_json::json!({ "privateKeys": [key_json(&private_key_id, &made)] });
    made.app_proofs = crate::proofs::of_call(hsm, &a, result)?;
    let spent = unspent.with_result(&api_result);
    made.log_link = crate::proofs::spend_and_link(hsm, admission, &a, spent, link, &api_result, &made.app_proofs)?;
    // Recorded once linked: a link the log refuses records nothing.
    key_facts::private_keys_made(admission, &a, &[(&private_key_id, p, &made)], true)?;
    Ok(made)
}

/// The HSM bundle signer seen through the crypto crate's envelope interface.
pub(super) struct HsmSigner<'a> {
    hsm: &'a Hsm,
    public: [u8; 65],
}

impl<'a> HsmSigner<'a> {
    pub(super) fn new(hsm: &'a Hsm) -> Result<Self, EnclaveError> {
        Ok(Self { hsm, public: hsm.signer_public_key()? })
    }
}

impl EnvelopeSigner for HsmSigner<'_> {
    fn public_key(&self) -> [u8; 65] {
        self.public
    }
    fn sign(&self, data: &[u8]) -> Result<Vec<u8>, CryptoError> {
        self.hsm.sign_with_bundle_signer(data).map_err(|e| CryptoError::Internal(e.to_string()))
    }
}

/// Exports `secret` to the target key the stamped body names.
fn export(hsm: &Hsm, a: &Admitted, secret: &[u8]) -> Result<pb::ExportResponse, EnclaveError> {
    let signer = HsmSigner::new(hsm)?;
    let seed = hsm.random_seed()?;
    let target = text(&a.activity.parameters, "targetPublicKey");
    let export_bundle = bundle::export_bundle(&signer, &seed, target, &a.activity.organization_id, secret)?;
    let result = serde_json::json!({ "targetPublicKey": target, "exportBundleSha256": sha256_hex(&export_bundle) });
    let app_proofs = crate::proofs::of_call(hsm, a, result)?;
    Ok(pb::ExportResponse { app_proofs, export_bundle, evaluation: a.evaluation(), ..Default::default() })
}

/// SHA-256 of a bundle, lowercase hex: what a proof states of it.
fn sha256_hex(bundle: &str) -> String {
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bundle.as_bytes()))
}

/// Decrypts the stamped body's `encryptedBundle` with the import target of the body's user.
fn open_import(hsm: &Hsm, a: &Admitted, target: Option<&pb::SealedRef>) -> Result<Zeroizing<Vec<u8>>, EnclaveError> {
    let (target_ref, kind) = sealed(target, &[BlobKind::ImportTarget], a)?;
    if target_ref.resource_id != text(&a.activity.parameters, "userId") {
        return Err(refuse(
            a,
            RefusalReason::BindingMismatch,
            "the import target is not the one of the user the stamped body names",
        ));
    }
    let secret = open(hsm, target_ref, kind)?;
    let secret: &[u8; 32] =
        secret.as_slice().try_into().map_err(|_| EnclaveError::Internal("import target is not 32 bytes".into()))?;
    Ok(bundle::open_encrypted_bundle(secret, text(&a.activity.parameters, "encryptedBundle"))?)
}
