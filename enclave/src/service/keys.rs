//! Key creation: wallets (a fresh mnemonic, its accounts), more accounts of a wallet, and
//! standalone private keys, each sealed to what it is bound to.

use coffer_auth::envelope::{
    derived_id, derived_ids, items, text, PRIVATE_KEY_ID, SUB_ORGANIZATION_ID, WALLET_ACCOUNT_ID, WALLET_ID,
};
use coffer_auth::grants;
use coffer_crypto::keys::SecretKey;
use coffer_crypto::{address, keys, Curve};
use coffer_org_rules::transition;
use coffer_proto::v1 as pb;
use serde_json::{json, Value};
use zeroize::Zeroizing;

use super::key_facts;
use super::sealed_refs::{open, sealed};
use crate::admission::{now_ms, refuse, Admission};
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::{BlobBinding, BlobKind, Hsm};

/// Activity types, as the stamped bodies name them.
mod types {
    pub const CREATE_WALLET: &str = "ACTIVITY_TYPE_CREATE_WALLET";
    pub const CREATE_WALLET_ACCOUNTS: &str = "ACTIVITY_TYPE_CREATE_WALLET_ACCOUNTS";
    pub const CREATE_PRIVATE_KEYS: &str = "ACTIVITY_TYPE_CREATE_PRIVATE_KEYS_V2";
}

/// A new wallet (of the body's organization, or of the sub-organization it creates): a fresh
/// mnemonic from HSM randomness, its accounts, all sealed.
pub(super) fn create_wallet(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::CreateWalletRequest,
) -> Result<pb::CreateWalletResponse, EnclaveError> {
    let (a, unspent, link) = admission.authorize_key_use(
        "create_wallet",
        req.auth.as_ref(),
        &[types::CREATE_WALLET, grants::CREATE_SUB_ORGANIZATION],
    )?;
    // create_sub_organization's wallet belongs to the sub-organization the body creates.
    let (organization_id, wallet) = if a.activity.activity_type == types::CREATE_WALLET {
        (a.activity.organization_id.clone(), &a.activity.parameters)
    } else {
        let wallet = a
            .activity
            .parameters
            .get("wallet")
            .ok_or_else(|| EnclaveError::invalid("the stamped body creates no wallet"))?;
        (derived_id(&a.activity.fingerprint, SUB_ORGANIZATION_ID, 0), wallet)
    };
    // Every id is derived from the stamped body: the caller names none.
    let fingerprint = &a.activity.fingerprint;
    let wallet_id = derived_id(fingerprint, WALLET_ID, 0);
    let account_ids = derived_ids(fingerprint, WALLET_ACCOUNT_ID, items(wallet, "accounts").len());
    let specs = account_specs(items(wallet, "accounts"), &account_ids)?;
    let own = organization_id == a.activity.organization_id;
    // The sub-organization's wallet is made before the sub-organization (its apply_activity
    // records both): once it exists, or existed, its stamp makes no wallet for it.
    if !own && admission.rules().store().version(&organization_id)?.is_some() {
        return Err(refuse(&a, RefusalReason::BindingMismatch, "the stamped body's sub-organization exists already"));
    }
    key_facts::ensure_new_ids(admission, &a, &organization_id, &new_ids(Some(&wallet_id), &specs))?;
    let words = count(wallet.get("mnemonicLength")).unwrap_or(12);
    let entropy = keys::Entropy::from(hsm.random(keys::entropy_len_for_words(words)?)?);
    let phrase = keys::mnemonic_phrase(&entropy, "")?;
    let mut made = seal_wallet(hsm, &organization_id, &wallet_id, &phrase, &specs)?;
    let result = wallet_result(&wallet_id, &made.accounts);
    made.result = result.to_string().into_bytes();
    made.evaluation = a.evaluation();
    // Proofs of the ids checked new above; then the stamp spent with the link, once the work is
    // done, and only then the facts: a refused or failed call spends nothing and records nothing,
    // and a link the log refuses (the activity linked already, as failed, say) leaves nothing
    // recorded, and no result leaves. A sub-organization's wallet is part of that activity's
    // result, which the gateway renders (its stamp is spent alone, and that activity links it).
    made.app_proofs = wallet_proofs(hsm, &a, &organization_id, &wallet_id, &specs, &made.accounts)?;
    let spent = if own { unspent.with_result(&result) } else { unspent };
    made.log_link = crate::proofs::spend_and_link(hsm, admission, &a, spent, link, &result, &made.app_proofs)?;
    if own {
        key_facts::wallet_created(admission, &a, &wallet_id, false, &made)?;
    }
    Ok(made)
}

/// A new wallet as the API's result states it: its id and its accounts' addresses.
pub(super) fn wallet_result(wallet_id: &str, accounts: &[pb::Account]) -> Value {
    json!({ "walletId": wallet_id, "addresses": accounts.iter().map(|a| a.address.as_str()).collect::<Vec<_>>() })
}

/// Private keys as the API's result states them: each id and its addresses.
pub(super) fn private_key_result(private_key_id: &str, k: &pb::KeyMaterial) -> Value {
    let addresses: Vec<Value> =
        k.addresses.iter().map(|a| json!({ "format": a.format, "address": a.address })).collect();
    json!({ "privateKeyId": private_key_id, "addresses": addresses })
}

/// The ids a call gives new key records: the wallet's (if any), then each account's.
pub(super) fn new_ids<'a>(wallet_id: Option<&'a str>, specs: &[(&'a str, &Value)]) -> Vec<&'a str> {
    wallet_id.into_iter().chain(specs.iter().map(|(id, _)| *id)).collect()
}

/// More accounts of the wallet the stamped body names, derived from its sealed seed.
pub(super) fn derive_accounts(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::DeriveAccountsRequest,
) -> Result<pb::DeriveAccountsResponse, EnclaveError> {
    let (a, unspent, link) =
        admission.authorize_key_use("derive_accounts", req.auth.as_ref(), &[types::CREATE_WALLET_ACCOUNTS])?;
    let (seed_ref, kind) = sealed(req.seed.as_ref(), &[BlobKind::WalletSeed], &a)?;
    if seed_ref.resource_id != text(&a.activity.parameters, "walletId") {
        return Err(refuse(
            &a,
            RefusalReason::BindingMismatch,
            "the sealed seed is not the wallet the stamped body names",
        ));
    }
    let accounts = items(&a.activity.parameters, "accounts");
    let account_ids = derived_ids(&a.activity.fingerprint, WALLET_ACCOUNT_ID, accounts.len());
    let specs = account_specs(accounts, &account_ids)?;
    key_facts::ensure_new_ids(admission, &a, &a.activity.organization_id, &new_ids(None, &specs))?;
    let phrase = checked_phrase(&open(hsm, seed_ref, kind)?)?;
    let seed = keys::seed_from_phrase(&phrase)?;
    let accounts = seal_accounts(hsm, &a.activity.organization_id, &seed, &specs)?;
    let result = json!({ "addresses": accounts.iter().map(|a| a.address.as_str()).collect::<Vec<_>>() });
    let app_proofs = wallet_proofs(hsm, &a, &a.activity.organization_id, &seed_ref.resource_id, &specs, &accounts)?;
    let spent = unspent.with_result(&result);
    let log_link = crate::proofs::spend_and_link(hsm, admission, &a, spent, link, &result, &app_proofs)?;
    // Recorded once linked: a link the log refuses records nothing.
    key_facts::accounts_derived(admission, &a, &seed_ref.resource_id, &accounts)?;
    let (evaluation, result) = (a.evaluation(), result.to_string().into_bytes());
    Ok(pb::DeriveAccountsResponse { accounts, app_proofs, evaluation, result, log_link })
}

/// Standalone private keys from HSM randomness, each sealed to its id, curve and public key.
pub(super) fn create_private_keys(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::CreatePrivateKeysRequest,
) -> Result<pb::CreatePrivateKeysResponse, EnclaveError> {
    let (a, unspent, link) =
        admission.authorize_key_use("create_private_keys", req.auth.as_ref(), &[types::CREATE_PRIVATE_KEYS])?;
    let params = items(&a.activity.parameters, "privateKeys");
    let private_key_ids = derived_ids(&a.activity.fingerprint, PRIVATE_KEY_ID, params.len());
    let ids: Vec<&str> = private_key_ids.iter().map(String::as_str).collect();
    key_facts::ensure_new_ids(admission, &a, &a.activity.organization_id, &ids)?;
    // The organization's setting, in the state the decision read.
    let native = a.decided.loaded.state.organization.features.contains_key(transition::HSM_NATIVE_KEYS_FEATURE);
    let organization_id = a.activity.organization_id.as_str();
    // HSM-native keys are charged to the top-level organization, as the enclave's state says.
    let charged_to = match native {
        true => admission.top_level_id(organization_id, Some(a.decided.loaded.clone()))?,
        false => String::new(),
    };
    let mut made_in_hsm = Vec::new();
    let created = (|| {
        let keys = params
            .iter()
            .zip(&private_key_ids)
            .map(|(p, id)| {
                let curve = Curve::parse(text(p, "curve"))?;
                if native {
                    let (label, public_key) = hsm.make_native_key(curve, organization_id, &charged_to, id, now_ms())?;
                    made_in_hsm.push(label.clone());
                    let reference = Zeroizing::new(crate::hsm::native_reference(&label));
                    return seal_private_key_as(
                        hsm,
                        organization_id,
                        id,
                        curve,
                        &public_key,
                        &reference,
                        items(p, "addressFormats"),
                    );
                }
                // Rejection-sample until the bytes are a valid scalar (always valid for Ed25519).
                let key = loop {
                    let key = SecretKey::from_slice(curve, &hsm.random(32)?)?;
                    if key.public_key().is_ok() {
                        break key;
                    }
                };
                seal_private_key(hsm, organization_id, id, &key, items(p, "addressFormats"))
            })
            .collect::<Result<Vec<_>, EnclaveError>>()?;
        finish_private_keys(hsm, admission, &a, unspent, link, params, &ids, &private_key_ids, keys)
    })();
    // Keys made in the HSM for a call that failed are destroyed: nothing names them.
    if created.is_err() {
        for label in &made_in_hsm {
            if let Err(e) = hsm.destroy_native_key(label) {
                tracing::warn!(error = %e, key = label.as_str(), "an HSM-native key of a failed call was not destroyed");
            }
        }
    }
    created
}

/// The rest of `create_private_keys` once the keys are made: proofs, the spend and link, the
/// facts recorded.
#[allow(clippy::too_many_arguments)]
fn finish_private_keys(
    hsm: &Hsm,
    admission: &Admission,
    a: &crate::admission::Admitted,
    unspent: crate::admission::Unspent,
    link: Option<crate::link_request::LinkRequest>,
    params: &[Value],
    ids: &[&str],
    private_key_ids: &[String],
    keys: Vec<pb::KeyMaterial>,
) -> Result<pb::CreatePrivateKeysResponse, EnclaveError> {
    let made: Vec<Value> = ids.iter().zip(&keys).map(|(id, k)| private_key_result(id, k)).collect();
    let api_result = json!({ "privateKeys": made });
    let result =
        json!({ "privateKeys": private_key_ids.iter().zip(&keys).map(|(id, k)| key_json(id, k)).collect::<Vec<_>>() });
    let app_proofs = crate::proofs::of_call(hsm, a, result)?;
    let spent = unspent.with_result(&api_result);
    let log_link = crate::proofs::spend_and_link(hsm, admission, a, spent, link, &api_result, &app_proofs)?;
    // Recorded once linked: a link the log refuses records nothing.
    let made: Vec<_> = ids.iter().zip(params).zip(&keys).map(|((id, p), k)| (*id, p, k)).collect();
    key_facts::private_keys_made(admission, a, &made, false)?;
    let (evaluation, result) = (a.evaluation(), api_result.to_string().into_bytes());
    Ok(pb::CreatePrivateKeysResponse { app_proofs, keys, evaluation, result, log_link })
}

/// A private key the enclave made, as a proof states it: id, public key and addresses.
pub(super) fn key_json(private_key_id: &str, k: &pb::KeyMaterial) -> Value {
    json!({
        "privateKeyId": private_key_id,
        "publicKey": hex::encode(&k.public_key),
        "addresses": k.addresses.iter().map(|a| json!({ "format": a.format, "address": a.address })).collect::<Vec<_>>(),
    })
}

/// When the stamped body asks: an address-derivation proof per account of the wallet, and the
/// proof of the call's decision and accounts.
pub(super) fn wallet_proofs(
    hsm: &Hsm,
    a: &crate::admission::Admitted,
    organization_id: &str,
    wallet_id: &str,
    specs: &[(&str, &Value)],
    accounts: &[pb::Account],
) -> Result<Vec<pb::AppProof>, EnclaveError> {
    if !a.activity.generate_app_proofs {
        return Ok(Vec::new());
    }
    let derived: Vec<(&str, &str)> =
        specs.iter().zip(accounts).map(|((_, spec), account)| (text(spec, "path"), account.address.as_str())).collect();
    let mut proofs = crate::proofs::of_addresses(hsm, a, organization_id, wallet_id, &derived)?;
    let result = json!({
        "organizationId": organization_id,
        "walletId": wallet_id,
        "accounts": derived.iter().map(|(path, address)| json!({ "path": path, "address": address })).collect::<Vec<_>>(),
    });
    proofs.extend(crate::proofs::of_call(hsm, a, result)?);
    Ok(proofs)
}

/// `WalletAccountParams` of a stamped body, paired with the ids the gateway chose for them.
pub(super) fn account_specs<'a>(
    accounts: &'a [Value],
    ids: &'a [String],
) -> Result<Vec<(&'a str, &'a Value)>, EnclaveError> {
    if accounts.len() != ids.len() {
        return Err(EnclaveError::invalid("one account id is needed per account of the stamped body"));
    }
    Ok(ids.iter().map(String::as_str).zip(accounts).collect())
}

/// Derives, addresses and seals each account from one BIP-39 seed; each key is bound to its
/// account id, curve and address.
fn seal_accounts(
    hsm: &Hsm,
    organization_id: &str,
    seed: &keys::Seed,
    specs: &[(&str, &Value)],
) -> Result<Vec<pb::Account>, EnclaveError> {
    specs
        .iter()
        .map(|(account_id, spec)| {
            let (curve, secret, public_key, address) = derive_account(seed, spec)?;
            let binding = BlobBinding {
                curve: curve.wire_name(),
                address: &address,
                ..BlobBinding::plain(BlobKind::WalletAccountKey, organization_id, account_id)
            };
            let sealed_key = hsm.seal(&binding, secret.secret_bytes())?;
            Ok(pb::Account { account_id: account_id.to_string(), public_key, address, sealed_key })
        })
        .collect()
}

/// One account of a BIP-39 seed as the body's `spec` asks: its curve, key, public key and
/// address.
fn derive_account(seed: &keys::Seed, spec: &Value) -> Result<(Curve, SecretKey, Vec<u8>, String), EnclaveError> {
    if text(spec, "pathFormat") != "PATH_FORMAT_BIP32" {
        return Err(EnclaveError::invalid("invalid path format (only PATH_FORMAT_BIP32)"));
    }
    let curve = Curve::parse(text(spec, "curve"))?;
    let secret = keys::derive(seed, curve, text(spec, "path"))?;
    let public_key = secret.public_key()?;
    let address = address::address(text(spec, "addressFormat"), curve, &public_key)?;
    Ok((curve, secret, public_key, address))
}

/// The addresses a new sub-organization's wallet gives the accounts its stamped body asks for
/// (`wallet`: the body's `wallet`), derived from the wallet's sealed seed, opened under the
/// sub-organization's id and the wallet's id, both derived from the body: what the
/// sub-organization's state records.
pub(super) fn sub_organization_addresses(
    hsm: &Hsm,
    sub_organization: &str,
    fingerprint: &str,
    wallet: &Value,
    sealed_seed: &[u8],
) -> Result<Vec<String>, EnclaveError> {
    let wallet_id = derived_id(fingerprint, WALLET_ID, 0);
    let binding = BlobBinding::plain(BlobKind::WalletSeed, sub_organization, &wallet_id);
    let phrase = checked_phrase(hsm.unseal(&binding, sealed_seed)?.as_slice())?;
    let seed = keys::seed_from_phrase(&phrase)?;
    items(wallet, "accounts").iter().map(|spec| derive_account(&seed, spec).map(|(.., address)| address)).collect()
}

fn addresses_for(curve: Curve, public_key: &[u8], formats: &[Value]) -> Result<Vec<pb::Address>, EnclaveError> {
    formats
        .iter()
        .map(|f| {
            let f = f.as_str().ok_or_else(|| EnclaveError::invalid("addressFormats must be strings"))?;
            Ok(pb::Address { format: f.to_string(), address: address::address(f, curve, public_key)? })
        })
        .collect()
}

/// Seals a standalone private key bound to its id, curve and public key, with its addresses.
pub(super) fn seal_private_key(
    hsm: &Hsm,
    organization_id: &str,
    private_key_id: &str,
    key: &SecretKey,
    formats: &[Value],
) -> Result<pb::KeyMaterial, EnclaveError> {
    let public_key = key.public_key()?;
    seal_private_key_as(hsm, organization_id, private_key_id, key.curve(), &public_key, key.secret_bytes(), formats)
}

/// A private key's material: `plaintext` (its secret, or an HSM-native key's reference) sealed
/// bound to its organization, id, curve and `public_key`, and its addresses.
fn seal_private_key_as(
    hsm: &Hsm,
    organization_id: &str,
    private_key_id: &str,
    curve: Curve,
    public_key: &[u8],
    plaintext: &[u8],
    formats: &[Value],
) -> Result<pb::KeyMaterial, EnclaveError> {
    let public_key = public_key.to_vec();
    let addresses = addresses_for(curve, &public_key, formats)?;
    let public_hex = hex::encode(&public_key);
    let binding = BlobBinding {
        curve: curve.wire_name(),
        public_key: &public_hex,
        ..BlobBinding::plain(BlobKind::PrivateKey, organization_id, private_key_id)
    };
    let sealed_key = hsm.seal(&binding, plaintext)?;
    Ok(pb::KeyMaterial {
        public_key,
        addresses,
        sealed_key,
        private_key_id: private_key_id.to_string(),
        ..Default::default()
    })
}

/// A wallet from its mnemonic: the requested accounts, and the phrase sealed to the wallet.
pub(super) fn seal_wallet(
    hsm: &Hsm,
    organization_id: &str,
    wallet_id: &str,
    phrase: &str,
    specs: &[(&str, &Value)],
) -> Result<pb::CreateWalletResponse, EnclaveError> {
    let seed = keys::seed_from_phrase(phrase)?;
    let accounts = seal_accounts(hsm, organization_id, &seed, specs)?;
    let binding = BlobBinding::plain(BlobKind::WalletSeed, organization_id, wallet_id);
    let sealed_seed = hsm.seal(&binding, phrase.as_bytes())?;
    Ok(pb::CreateWalletResponse { sealed_seed, accounts, wallet_id: wallet_id.to_string(), ..Default::default() })
}

/// Checks a mnemonic and returns the phrase to keep: normalized whitespace, as given.
pub(super) fn checked_phrase(plain: &[u8]) -> Result<Zeroizing<String>, EnclaveError> {
    let text = std::str::from_utf8(plain).map_err(|_| EnclaveError::invalid("invalid mnemonic"))?;
    let phrase = Zeroizing::new(text.split_whitespace().collect::<Vec<_>>().join(" "));
    keys::entropy_from_phrase(&phrase)?;
    Ok(phrase)
}

/// A positive count from a body (`mnemonicLength`: a JSON number or decimal string).
fn count(v: Option<&Value>) -> Option<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    }
}
