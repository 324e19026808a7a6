//! Transitions of users and their credentials: `create_users`, `update_user`, `delete_users`,
//! API keys, passkeys and OAuth identities, and the sub-organizations that bring root users of
//! their own. User and sub-organization ids are the ones the body derives; passkeys' public keys
//! and OAuth identities' hashes the ones it grants; API keys are read from the body itself.

use serde_json::Value;

use super::input::{
    dedup, integer, items, text_of, Input, TransitionError, SUB_ORGANIZATION_ID, USER_ID, WALLET_ACCOUNT_ID, WALLET_ID,
};
use crate::effect::{Change, Effect};
use crate::model::{Account, Credential, CredentialKind, Organization, User, Wallet};

/// `coffer_auth::webauthn::CREDENTIAL_TYPE`: a passkey's credential type.
pub const WEBAUTHN_CREDENTIAL_TYPE: &str = "CREDENTIAL_TYPE_WEBAUTHN_AUTHENTICATOR";
/// `coffer_auth::grants::OAUTH_PROVIDER`: an OAuth identity's credential type.
pub const OAUTH_CREDENTIAL_TYPE: &str = "COFFER_OAUTH_PROVIDER";

type Changes = Result<Vec<Change>, TransitionError>;

/// The credential type an API key of `curve_type` is certified as.
pub fn api_key_type(curve_type: &str) -> Option<&'static str> {
    Some(match curve_type {
        "API_KEY_CURVE_P256" => "CREDENTIAL_TYPE_API_KEY_P256",
        "API_KEY_CURVE_SECP256K1" => "CREDENTIAL_TYPE_API_KEY_SECP256K1",
        "API_KEY_CURVE_ED25519" => "CREDENTIAL_TYPE_API_KEY_ED25519",
        _ => return None,
    })
}

/// A public key as the gateway stores it (`coffer_auth::grants::api_public_key`): trimmed,
/// without `0x`, lowercase.
fn stored_public_key(key: &str) -> String {
    let key = key.trim();
    key.strip_prefix("0x").unwrap_or(key).to_ascii_lowercase()
}

/// The longest `expirationSeconds` an API key may have (`coffer_auth::grants`' bound, which the
/// gateway checks too): its expiry in milliseconds never wraps in either process's arithmetic.
pub const MAX_API_KEY_EXPIRATION_SECONDS: u64 = 10_000_000_000;

/// `expirationSeconds` as the gateway reads it (a decimal string or a number).
pub(crate) fn expiration_seconds(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str()?.trim().parse().ok())
}

/// Where the records a transition makes go, and which ids are already taken there.
struct Target<'s> {
    organization_id: String,
    /// Credential ids of the organization's state (none for a new organization).
    taken: &'s dyn Fn(&str) -> bool,
}

impl Target<'_> {
    fn change(&self, effect: Effect) -> Change {
        Change { organization_id: self.organization_id.clone(), effect }
    }
}

/// Appends the credentials one user entry of a body lists (`apiKeys`, then `authenticators`,
/// then `oauthProviders`), with `between` after the API keys, in the order the gateway writes
/// them: its API key rows, then the inline credentials. Each one's id is derived from the body
/// ([`super::input::credential_id_label`], by kind and position).
fn user_credentials(
    i: &Input<'_>,
    t: &Target<'_>,
    user_id: &str,
    entry: &Value,
    between: Option<Effect>,
    out: &mut Vec<Change>,
) -> Result<(), TransitionError> {
    api_keys(i, t, user_id, items(entry, "apiKeys"), out)?;
    out.extend(between.map(|e| t.change(e)));
    passkeys(i, t, user_id, items(entry, "authenticators").len(), out)?;
    oauth_identities(i, t, user_id, items(entry, "oauthProviders").len(), out)
}

/// The API keys of one user the body lists. A key's expiry is `now + expirationSeconds` on the
/// enclave's clock.
fn api_keys(
    i: &Input<'_>,
    t: &Target<'_>,
    user_id: &str,
    keys: &[Value],
    out: &mut Vec<Change>,
) -> Result<(), TransitionError> {
    for (n, k) in keys.iter().enumerate() {
        let text = |f: &str| text_of(k, f).unwrap_or_default();
        let credential_type = api_key_type(&text("curveType"))
            .ok_or_else(|| i.invalid(format!("apiKeys[{n}].curveType is not a curve")))?;
        let id = i.credential_id(CredentialKind::ApiKey, user_id, n, out, t.taken)?;
        let expires_at_ms = match k.get("expirationSeconds").filter(|v| !v.is_null()) {
            None => 0,
            Some(v) => match expiration_seconds(v) {
                Some(s) if s > 0 && s <= MAX_API_KEY_EXPIRATION_SECONDS => (i.now_ms.max(0) as u64) + s * 1000,
                _ => {
                    return Err(i.invalid(format!(
                        "apiKeys[{n}].expirationSeconds is not 1 to {MAX_API_KEY_EXPIRATION_SECONDS}"
                    )))
                }
            },
        };
        out.push(t.change(Effect::AddCredential {
            credential: Credential {
                id,
                user_id: user_id.to_string(),
                kind: CredentialKind::ApiKey,
                credential_type: credential_type.to_string(),
                public_key: stored_public_key(&text("publicKey")),
                expires_at_ms,
            },
        }));
    }
    Ok(())
}

/// `count` passkeys of `user_id`, with the public keys the body grants.
fn passkeys(
    i: &Input<'_>,
    t: &Target<'_>,
    user_id: &str,
    count: usize,
    out: &mut Vec<Change>,
) -> Result<(), TransitionError> {
    granted_credentials(i, t, user_id, count, CredentialKind::Passkey, WEBAUTHN_CREDENTIAL_TYPE, out)
}

/// `count` OAuth identities of `user_id`, with the identity hashes the body grants.
fn oauth_identities(
    i: &Input<'_>,
    t: &Target<'_>,
    user_id: &str,
    count: usize,
    out: &mut Vec<Change>,
) -> Result<(), TransitionError> {
    granted_credentials(i, t, user_id, count, CredentialKind::OauthIdentity, OAUTH_CREDENTIAL_TYPE, out)
}

fn granted_credentials(
    i: &Input<'_>,
    t: &Target<'_>,
    user_id: &str,
    count: usize,
    kind: CredentialKind,
    credential_type: &str,
    out: &mut Vec<Change>,
) -> Result<(), TransitionError> {
    for (n, public_key) in i.granted(&t.organization_id, user_id, credential_type, count)?.into_iter().enumerate() {
        let id = i.credential_id(kind, user_id, n, out, t.taken)?;
        out.push(t.change(Effect::AddCredential {
            credential: Credential {
                id,
                user_id: user_id.to_string(),
                kind,
                credential_type: credential_type.to_string(),
                public_key,
                expires_at_ms: 0,
            },
        }));
    }
    Ok(())
}

/// This organization, for credentials of an existing user.
fn here<'s>(i: &'s Input<'_>, taken: &'s dyn Fn(&str) -> bool) -> Target<'s> {
    Target { organization_id: i.org(), taken }
}

/// The user the body names (`userId`), which must exist.
fn existing_user(i: &Input<'_>) -> Result<String, TransitionError> {
    let user_id = i.text("userId")?;
    if !i.state.users.contains_key(&user_id) {
        return Err(i.invalid(format!("user {user_id} does not exist")));
    }
    Ok(user_id)
}

pub(crate) fn create_api_keys(i: &Input<'_>) -> Changes {
    let user_id = existing_user(i)?;
    let taken = |id: &str| i.state.credentials.contains_key(id);
    let mut out = Vec::new();
    api_keys(i, &here(i, &taken), &user_id, items(i.params, "apiKeys"), &mut out)?;
    Ok(out)
}

pub(crate) fn create_authenticators(i: &Input<'_>) -> Changes {
    let user_id = existing_user(i)?;
    let taken = |id: &str| i.state.credentials.contains_key(id);
    let mut out = Vec::new();
    passkeys(i, &here(i, &taken), &user_id, items(i.params, "authenticators").len(), &mut out)?;
    Ok(out)
}

/// `recover_user`: the one passkey (`authenticator`) the body grants its user.
pub(crate) fn recover_user(i: &Input<'_>) -> Changes {
    let user_id = existing_user(i)?;
    let taken = |id: &str| i.state.credentials.contains_key(id);
    let mut out = Vec::new();
    passkeys(i, &here(i, &taken), &user_id, 1, &mut out)?;
    Ok(out)
}

pub(crate) fn create_oauth_providers(i: &Input<'_>) -> Changes {
    let user_id = existing_user(i)?;
    let taken = |id: &str| i.state.credentials.contains_key(id);
    let mut out = Vec::new();
    oauth_identities(i, &here(i, &taken), &user_id, items(i.params, "oauthProviders").len(), &mut out)?;
    Ok(out)
}

/// `delete_api_keys`, `delete_authenticators`, `delete_oauth_providers`.
pub(crate) fn remove_credentials(i: &Input<'_>, kind: CredentialKind, key: &str) -> Changes {
    Ok(vec![i.change(Effect::RemoveCredentials { user_id: i.text("userId")?, kind, ids: i.texts(key) })])
}

/// A new user as the gateway inserts it: name, email and phone number (empty: none) from the body,
/// no tags yet.
fn new_user(i: &Input<'_>, id: &str, entry: &Value) -> Result<User, TransitionError> {
    let name = text_of(entry, "userName").filter(|n| !n.trim().is_empty());
    let name = name.ok_or_else(|| i.invalid("userName is missing"))?;
    let email = text_of(entry, "userEmail").unwrap_or_default();
    let phone_number = text_of(entry, "userPhoneNumber").unwrap_or_default();
    check_user_fields(Some(&name), Some(&email), Some(&phone_number)).map_err(|reason| i.invalid(reason))?;
    Ok(User { id: id.to_string(), name, email, phone_number, tag_ids: Vec::new(), contacts_verified: false })
}

/// A user's name (`fields::name`), email and phone number (each valid, or empty for none), where
/// given.
fn check_user_fields(name: Option<&str>, email: Option<&str>, phone: Option<&str>) -> Result<(), String> {
    if let Some(n) = name {
        crate::fields::name("userName", n)?;
    }
    if let Some(e) = email.filter(|e| !e.is_empty() && !crate::fields::email(e)) {
        return Err(format!("invalid email: {e:?}"));
    }
    if let Some(p) = phone.filter(|p| !p.is_empty() && !crate::fields::phone(p)) {
        return Err(format!("invalid phone number: {p:?}"));
    }
    Ok(())
}

pub(crate) fn create_users(i: &Input<'_>) -> Changes {
    let users = items(i.params, "users");
    if users.is_empty() {
        return Err(i.invalid("users must not be empty"));
    }
    let taken = |id: &str| i.state.credentials.contains_key(id);
    let t = here(i, &taken);
    let mut out = Vec::new();
    for (index, entry) in users.iter().enumerate() {
        let id = (i.derive_id)(USER_ID, index);
        if i.state.users.contains_key(&id) {
            return Err(i.invalid(format!("user {id} already exists")));
        }
        out.push(i.change(Effect::PutUser { user: new_user(i, &id, entry)? }));
        let tags = dedup(items(entry, "userTags").iter().filter_map(Value::as_str).map(str::to_string).collect());
        let tags = (!tags.is_empty()).then(|| Effect::UpdateUser {
            id: id.clone(),
            name: None,
            email: None,
            phone_number: None,
            tag_ids: Some(tags),
        });
        user_credentials(i, &t, &id, entry, tags, &mut out)?;
    }
    Ok(out)
}

/// The curve of an API key of `create_api_only_users` (the first `ApiKeyParams` names none), as
/// `coffer_auth::grants::API_ONLY_CURVE` grants it.
pub const API_ONLY_CURVE: &str = "API_KEY_CURVE_P256";

/// `create_api_only_users`: [`create_users`] of the `apiOnlyUsers` with their names, emails,
/// tags and API keys alone, each key of [`API_ONLY_CURVE`].
pub(crate) fn create_api_only_users(i: &Input<'_>) -> Changes {
    let users: Vec<Value> = items(i.params, "apiOnlyUsers")
        .iter()
        .map(|u| {
            let keys: Vec<Value> = items(u, "apiKeys")
                .iter()
                .map(|k| {
                    let mut k = k.clone();
                    if let Some(m) = k.as_object_mut() {
                        m.insert("curveType".into(), Value::String(API_ONLY_CURVE.into()));
                    }
                    k
                })
                .collect();
            let field = |f: &str| u.get(f).cloned().unwrap_or(Value::Null);
            serde_json::json!({
                "userName": field("userName"),
                "userEmail": field("userEmail"),
                "userTags": field("userTags"),
                "apiKeys": keys,
            })
        })
        .collect();
    let params = serde_json::json!({ "users": users });
    create_users(&Input { params: &params, ..*i })
}

pub(crate) fn update_user(i: &Input<'_>) -> Changes {
    let id = existing_user(i)?;
    let (name, email, phone) = (i.opt_text("userName"), i.opt_text("userEmail"), i.opt_text("userPhoneNumber"));
    check_user_fields(name.as_deref(), email.as_deref(), phone.as_deref()).map_err(|reason| i.invalid(reason))?;
    let tags = i.texts("userTagIds");
    Ok(vec![i.change(Effect::UpdateUser {
        id,
        name: i.opt_text("userName"),
        email: i.opt_text("userEmail"),
        phone_number: i.opt_text("userPhoneNumber"),
        tag_ids: (!tags.is_empty()).then_some(tags),
    })])
}

/// Whether setting `field` (`userEmail` or `userPhoneNumber`) of `user` to `value` with a
/// verification token of it leaves every contact of the user verified: the token verifies the
/// new one, and the other is verified already (`contacts_verified`) or absent.
/// `user` is its `(contacts_verified, email, phone number)`, empty for none.
pub fn verifies_contacts(user: (bool, &str, &str), field: &str, value: &str, token: bool) -> bool {
    let (contacts_verified, email, phone_number) = user;
    let other_verified = match field {
        "userEmail" => contacts_verified || phone_number.is_empty(),
        "userPhoneNumber" => contacts_verified || email.is_empty(),
        _ => return false,
    };
    token && !value.is_empty() && other_verified
}

/// `update_user_name`, `update_user_email`, `update_user_phone_number`: the one field `field`
/// of an existing user (a name is never empty; an empty email or phone number clears it). A
/// changed email or phone number is no longer verified ([`Effect::UpdateUser`]); a verification
/// token the body carries verifies it ([`Effect::MarkContactsVerified`]).
pub(crate) fn update_user_field(i: &Input<'_>, field: &str) -> Changes {
    let id = existing_user(i)?;
    let value = i.params.get(field).and_then(Value::as_str).ok_or_else(|| i.invalid(format!("{field} is required")))?;
    // An email or phone number is checked here too (the gateway's check is not the enclave's);
    // "" removes it.
    let checked = match field {
        "userName" => crate::fields::name(field, value),
        "userEmail" if !value.is_empty() && !crate::fields::email(value) => Err(format!("invalid email: {value:?}")),
        "userPhoneNumber" if !value.is_empty() && !crate::fields::phone(value) => {
            Err(format!("invalid phone number: {value:?}"))
        }
        _ => Ok(()),
    };
    checked.map_err(|reason| i.invalid(reason))?;
    // A verification token was checked and spent by the enclave before this runs.
    let token = text_of(i.params, "verificationToken").is_some_and(|t| !t.is_empty());
    let user = &i.state.users[&id];
    let verified = verifies_contacts((user.contacts_verified, &user.email, &user.phone_number), field, value, token);
    let value = Some(value.to_string());
    let effect = match field {
        "userName" => {
            Effect::UpdateUser { id: id.clone(), name: value, email: None, phone_number: None, tag_ids: None }
        }
        "userEmail" => {
            Effect::UpdateUser { id: id.clone(), name: None, email: value, phone_number: None, tag_ids: None }
        }
        _ => Effect::UpdateUser { id: id.clone(), name: None, email: None, phone_number: value, tag_ids: None },
    };
    let mut out = vec![i.change(effect)];
    if verified {
        out.push(i.change(Effect::MarkContactsVerified { id }));
    }
    Ok(out)
}

/// The root quorum threshold of a new sub-organization: from 1 to its number of root users.
fn threshold(i: &Input<'_>, root_users: usize) -> Result<i64, TransitionError> {
    match integer(i.params.get("rootQuorumThreshold")) {
        Some(t) if t >= 1 && t as u64 <= root_users as u64 => Ok(t),
        _ => Err(i.invalid("rootQuorumThreshold is not an integer from 1 to the number of root users")),
    }
}

/// The login features a new sub-organization starts with: on unless the body disables them.
const SUB_ORGANIZATION_FEATURES: &[(&str, &str)] = &[
    ("FEATURE_NAME_EMAIL_RECOVERY", "disableEmailRecovery"),
    ("FEATURE_NAME_EMAIL_AUTH", "disableEmailAuth"),
    ("FEATURE_NAME_OTP_EMAIL_AUTH", "disableOtpEmailAuth"),
    ("FEATURE_NAME_SMS_AUTH", "disableSmsAuth"),
];

/// `create_sub_organization` (V8): the new organization (its id and its root users' derived
/// from the body, its parent this organization), each root user with the credentials the body
/// lists, its login features, and its wallet if the body asks for one. The wallet's ids are
/// derived from the body, as the enclave's `create_wallet` derived them; its addresses are the
/// ones the enclave derived from the wallet's sealed seed ([`Input::wallet_addresses`]), with the
/// name and the account formats the body gives.
pub(crate) fn create_sub_organization(i: &Input<'_>) -> Changes {
    if let Some(parent) = &i.state.organization.parent_id {
        return Err(i.invalid(format!("organization {} is a sub-organization of {parent}", i.org())));
    }
    let root_users = items(i.params, "rootUsers");
    if root_users.is_empty() {
        return Err(i.invalid("rootUsers must not be empty"));
    }
    let sub = (i.derive_id)(SUB_ORGANIZATION_ID, 0);
    if sub.is_empty() || sub == i.org() {
        return Err(i.invalid("the sub-organization id is not a new one"));
    }
    let sub_name = i.opt_text("subOrganizationName").unwrap_or_default();
    if !sub_name.is_empty() {
        crate::fields::name("subOrganizationName", &sub_name).map_err(|reason| i.invalid(reason))?;
    }
    let user_ids: Vec<String> = (0..root_users.len()).map(|n| (i.derive_id)(USER_ID, n)).collect();
    let nothing_taken = |_: &str| false;
    let t = Target { organization_id: sub.clone(), taken: &nothing_taken };
    let organization = Organization {
        id: sub.clone(),
        name: sub_name,
        parent_id: Some(i.org()),
        root_quorum_threshold: threshold(i, root_users.len())?,
        root_user_ids: user_ids.clone(),
        auth_proxy_signup: marks_auth_proxy_signup(i.params),
        ..Default::default()
    };
    let mut out = vec![t.change(Effect::CreateOrganization { organization })];
    for (entry, id) in root_users.iter().zip(&user_ids) {
        // The sign-up's contacts are its parent's word (or, through the auth proxy, a verified
        // token's: the enclave checks it before this runs).
        let user = User { contacts_verified: true, ..new_user(i, id, entry)? };
        out.push(t.change(Effect::PutUser { user }));
        user_credentials(i, &t, id, entry, None, &mut out)?;
    }
    for (name, disable) in SUB_ORGANIZATION_FEATURES {
        if i.params.get(*disable).and_then(Value::as_bool) != Some(true) {
            out.push(t.change(Effect::SetFeature { name: name.to_string(), value: String::new() }));
        }
    }
    if let Some(wallet) = i.params.get("wallet").filter(|w| !w.is_null()) {
        sub_organization_wallet(i, &t, wallet, &mut out)?;
    }
    Ok(out)
}

/// The wallet of a new sub-organization: a new wallet named as the body asks, then its accounts
/// (if the body lists any) in the body's address formats at the addresses the enclave derived,
/// none exported.
fn sub_organization_wallet(
    i: &Input<'_>,
    t: &Target<'_>,
    body: &Value,
    out: &mut Vec<Change>,
) -> Result<(), TransitionError> {
    let wallet_id = (i.derive_id)(WALLET_ID, 0);
    let label = text_of(body, "walletName").filter(|n| !n.trim().is_empty());
    let wallet = Wallet {
        id: wallet_id.clone(),
        label: label.ok_or_else(|| i.invalid("wallet.walletName is missing"))?,
        imported: false,
        exported: false,
    };
    out.push(t.change(Effect::PutWallet { wallet }));
    let wanted = items(body, "accounts");
    if wanted.is_empty() {
        return Ok(());
    }
    if i.wallet_addresses.len() != wanted.len() || i.wallet_addresses.iter().any(String::is_empty) {
        return Err(i.invalid("the sub-organization's wallet has no address for each account the body lists"));
    }
    let mut accounts: Vec<Account> = Vec::with_capacity(wanted.len());
    for (n, (address, w)) in i.wallet_addresses.iter().zip(wanted).enumerate() {
        let address_format = text_of(w, "addressFormat")
            .ok_or_else(|| i.invalid(format!("wallet.accounts[{n}].addressFormat is missing")))?;
        accounts.push(Account {
            id: (i.derive_id)(WALLET_ACCOUNT_ID, n),
            wallet_id: wallet_id.clone(),
            address: address.clone(),
            address_format,
            exported: false,
        });
    }
    out.push(t.change(Effect::PutAccounts { accounts }));
    Ok(())
}

/// Whether `delete_without_export` is set: without it, every key must have been exported.
fn without_export(i: &Input<'_>) -> bool {
    i.params.get("deleteWithoutExport").and_then(Value::as_bool) == Some(true)
}

/// `delete_sub_organization`, submitted in the sub-organization itself: its state goes.
pub(crate) fn delete_sub_organization(i: &Input<'_>) -> Changes {
    if i.state.organization.parent_id.is_none() {
        return Err(i.invalid(format!("organization {} is not a sub-organization", i.org())));
    }
    if !without_export(i) {
        if let Some(w) = i.state.wallets.values().find(|w| !w.exported) {
            return Err(i.invalid(format!("wallet {} was never exported", w.id)));
        }
        if let Some(k) = i.state.private_keys.values().find(|k| !k.exported) {
            return Err(i.invalid(format!("private key {} was never exported", k.id)));
        }
    }
    Ok(vec![i.change(Effect::DeleteOrganization)])
}

/// `delete_wallets`: the ids as given; unexported wallets only with `deleteWithoutExport`.
pub(crate) fn delete_wallets(i: &Input<'_>) -> Changes {
    let ids = super::input::raw_texts(i.params, "walletIds");
    if ids.is_empty() {
        return Err(i.invalid("walletIds must not be empty"));
    }
    if !without_export(i) {
        if let Some(id) = ids.iter().find(|id| i.state.wallets.get(*id).is_some_and(|w| !w.exported)) {
            return Err(i.invalid(format!("wallet {id} was never exported")));
        }
    }
    Ok(vec![i.change(Effect::DeleteWallets { ids })])
}

/// `update_wallet`: a wallet of the organization gets a new name (`fields::name`).
pub(crate) fn update_wallet(i: &Input<'_>) -> Changes {
    let id = i.text("walletId")?;
    let name = text_of(i.params, "walletName").unwrap_or_default();
    crate::fields::name("walletName", &name).map_err(|reason| i.invalid(reason))?;
    if !i.state.wallets.contains_key(&id) {
        return Err(i.invalid(format!("wallet not found: {id}")));
    }
    // Names are unique (policies may read `wallet.label`: a rename must not make a wallet pass
    // for another).
    if i.state.wallets.values().any(|w| w.id != id && w.label == name) {
        return Err(i.invalid(format!("walletName {name:?} is another wallet's")));
    }
    Ok(vec![i.change(Effect::RenameWallet { id, label: name })])
}

/// `delete_wallet_accounts`: accounts of the organization's wallets, each once; an account whose
/// key never left (neither it nor its wallet exported) only with `deleteWithoutExport`.
pub(crate) fn delete_wallet_accounts(i: &Input<'_>) -> Changes {
    let ids = super::input::raw_texts(i.params, "walletAccountIds");
    if ids.is_empty() {
        return Err(i.invalid("walletAccountIds must not be empty"));
    }
    // A body that names a wallet (what policies read as `wallet`) deletes accounts of that wallet
    // only.
    let named_wallet = text_of(i.params, "walletId");
    for (n, id) in ids.iter().enumerate() {
        if ids[..n].contains(id) {
            return Err(i.invalid(format!("walletAccountIds names {id} twice")));
        }
        let account = i.state.accounts.get(id).ok_or_else(|| i.invalid(format!("wallet account not found: {id}")))?;
        if named_wallet.as_ref().is_some_and(|w| *w != account.wallet_id) {
            return Err(i.invalid(format!("wallet account {id} is not of the wallet the body names")));
        }
        let exported = account.exported || i.state.wallets.get(&account.wallet_id).is_some_and(|w| w.exported);
        if !exported && !without_export(i) {
            return Err(i.invalid(format!("wallet account {id} was never exported")));
        }
    }
    Ok(vec![i.change(Effect::DeleteAccounts { ids })])
}

/// `delete_private_keys`: the ids as given; unexported keys only with `deleteWithoutExport`.
pub(crate) fn delete_private_keys(i: &Input<'_>) -> Changes {
    let ids = super::input::raw_texts(i.params, "privateKeyIds");
    if ids.is_empty() {
        return Err(i.invalid("privateKeyIds must not be empty"));
    }
    if !without_export(i) {
        if let Some(id) = ids.iter().find(|id| i.state.private_keys.get(*id).is_some_and(|k| !k.exported)) {
            return Err(i.invalid(format!("private key {id} was never exported")));
        }
    }
    Ok(vec![i.change(Effect::DeletePrivateKeys { ids })])
}

/// The parameter of `create_sub_organization` that marks the new sub-organization as one the
/// auth proxy signed up ([`crate::model::Organization::auth_proxy_signup`]): every sign-up the
/// proxy's key stamps carries it (the enclave's stamper refuses one without), and a parent may
/// set it on a sub-organization it creates itself.
pub const AUTH_PROXY_SIGNUP: &str = "authProxySignup";

/// Whether a `create_sub_organization` body marks its sub-organization ([`AUTH_PROXY_SIGNUP`]:
/// `true`, nothing else).
pub fn marks_auth_proxy_signup(params: &serde_json::Value) -> bool {
    params.get(AUTH_PROXY_SIGNUP).and_then(serde_json::Value::as_bool) == Some(true)
}
