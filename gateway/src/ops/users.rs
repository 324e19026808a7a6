//! Users and their API keys: create, update, delete and read, and the `User` / `ApiKey` JSON.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use coffer_org_rules::model::CredentialKind;

use super::lookup::load_user;
use super::params::dedup;
use super::params::required;
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::{api_key_json, user_view};
use crate::error::{ApiError, Code};
use crate::record_kinds::USER_TAG;
use crate::state::AppState;
use crate::store::{ApiKey, Nanos, Store, StoreError, User, Write};

/// Full swagger `User` objects (API keys, tags, passkeys, OAuth providers), read through `s`.
pub fn users_json(s: &dyn Store, org: &str, users: &[User]) -> Result<Vec<Value>, StoreError> {
    // Per user (indexed reads): a page of users costs the same whatever the organization holds.
    let mut keys_of: HashMap<String, Vec<ApiKey>> = HashMap::new();
    let mut tags_of: HashMap<String, Vec<String>> = HashMap::new();
    for u in users {
        keys_of.insert(u.id.clone(), s.api_keys_of_user(org, &u.id)?);
        tags_of.insert(u.id.clone(), s.user_tags_of(org, &u.id)?);
    }
    Ok(users
        .iter()
        .map(|u| {
            user_view(
                u,
                keys_of.get(&u.id).map(Vec::as_slice).unwrap_or_default(),
                tags_of.get(&u.id).map(Vec::as_slice).unwrap_or_default(),
                super::credentials::authenticators_json(s, org, &u.id),
                super::credentials::oauth_providers_json(s, org, &u.id),
            )
        })
        .collect())
}

/// `userEmail`: a plausible address (`coffer_org_rules::fields::email`).
pub fn valid_email(email: &str) -> Result<String, ApiError> {
    if !coffer_org_rules::fields::email(email) {
        return Err(ApiError::new(Code::InvalidArgument, "INVALID_EMAIL", format!("invalid email: {email:?}")));
    }
    Ok(email.to_string())
}

/// `userPhoneNumber`: E.164, e.g. `+13214567890`.
pub fn valid_phone(phone: &str) -> Result<String, ApiError> {
    if !coffer_org_rules::fields::phone(phone) {
        return Err(ApiError::invalid(format!("invalid phone number: {phone:?} (expected E.164, e.g. +13214567890)")));
    }
    Ok(phone.to_string())
}

/// A name field (`coffer_org_rules::fields::name`), as a 400 naming it.
pub fn valid_name(field: &str, value: &str) -> Result<(), ApiError> {
    coffer_org_rules::fields::name(field, value).map_err(ApiError::invalid)
}

/// `ApiKeyParamsV2`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyParams {
    pub api_key_name: String,
    pub public_key: String,
    pub curve_type: String,
    /// A decimal string (a JSON number is accepted too).
    pub expiration_seconds: Option<Value>,
}

/// Checks a public key against its `curveType`; returns it as lowercase hex and its credential
/// type. P-256 and secp256k1 keys are compressed SEC1 points (33 bytes), Ed25519 keys 32 bytes.
pub fn parse_api_public_key(curve_type: &str, public_key: &str) -> Result<(String, &'static str), ApiError> {
    Ok(coffer_auth::grants::api_public_key(curve_type, public_key)?)
}

/// `expirationSeconds`: absent, or a positive whole number of seconds.
pub fn parse_expiration(v: Option<&Value>) -> Result<Option<u64>, ApiError> {
    Ok(coffer_auth::grants::expiration(v)?)
}

/// Validates API key parameters and makes the rows for `user_id`. `taken` holds the public keys
/// already registered in the organization; the new ones are added to it.
pub fn api_key_rows(
    org: &str,
    user_id: &str,
    params: &[ApiKeyParams],
    fingerprint: &str,
    now: Nanos,
    taken: &mut HashSet<String>,
) -> Result<Vec<ApiKey>, ApiError> {
    params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            required(&p.api_key_name, "apiKeyName")?;
            let (public_key, credential_type) = parse_api_public_key(&p.curve_type, &p.public_key)?;
            let expiration_seconds = parse_expiration(p.expiration_seconds.as_ref())?;
            if !taken.insert(public_key.clone()) {
                return Err(ApiError::new(
                    Code::InvalidArgument,
                    "CREDENTIAL_CONFLICT",
                    format!("api key public key already exists in this organization: {public_key}"),
                ));
            }
            Ok(ApiKey {
                id: super::params::credential_id(fingerprint, CredentialKind::ApiKey, user_id, i),
                organization_id: org.to_string(),
                user_id: user_id.to_string(),
                name: p.api_key_name.clone(),
                public_key,
                credential_type: credential_type.to_string(),
                expiration_seconds,
                certificate: Vec::new(),
                // A nanosecond apart, so lists keep the request's order.
                created_at: now + i as i64,
                updated_at: now + i as i64,
            })
        })
        .collect()
}

/// Public keys of every API key of the organization.
async fn org_public_keys(state: &Arc<AppState>, org: &str) -> Result<HashSet<String>, ApiError> {
    let org = org.to_string();
    Ok(state.db(move |s| s.api_keys(&org)).await??.into_iter().map(|k| k.public_key).collect())
}

/// Fails with 404 unless every id is a user tag of the organization.
pub(super) async fn check_user_tags(state: &Arc<AppState>, org: &str, ids: &[String]) -> Result<(), ApiError> {
    if ids.is_empty() {
        return Ok(());
    }
    let org = org.to_string();
    let known: HashSet<String> =
        state.db(move |s| s.records(&org, USER_TAG)).await??.into_iter().map(|r| r.id).collect();
    match ids.iter().find(|id| !known.contains(*id)) {
        Some(missing) => Err(ApiError::not_found(format!("user tag not found: {missing}"))),
        None => Ok(()),
    }
}

/// `UserParamsV4`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserParams {
    user_name: String,
    user_email: Option<String>,
    user_phone_number: Option<String>,
    #[serde(default)]
    api_keys: Vec<ApiKeyParams>,
    #[serde(default)]
    authenticators: Vec<Value>,
    #[serde(default)]
    oauth_providers: Vec<Value>,
    #[serde(default)]
    user_tags: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateUsersIntent {
    #[serde(default)]
    users: Vec<UserParams>,
}

pub async fn create_users(ctx: Ctx, intent: CreateUsersIntent) -> Result<Outcome, ApiError> {
    if intent.users.is_empty() {
        return Err(ApiError::invalid("users must not be empty"));
    }
    // Only users with API keys need the organization's keys (to refuse one already there).
    let mut taken = match intent.users.iter().any(|u| !u.api_keys.is_empty()) {
        true => org_public_keys(&ctx.state, &ctx.org.id).await?,
        false => HashSet::new(),
    };
    let mut writes = Vec::new();
    let mut user_ids = Vec::with_capacity(intent.users.len());
    for (index, p) in intent.users.iter().enumerate() {
        valid_name("userName", &p.user_name)?;
        let email = p.user_email.as_deref().filter(|e| !e.is_empty()).map(valid_email).transpose()?;
        let phone = p.user_phone_number.as_deref().filter(|e| !e.is_empty()).map(valid_phone).transpose()?;
        let tags = dedup(&p.user_tags);
        check_user_tags(&ctx.state, &ctx.org.id, &tags).await?;
        // Derived from the activity's fingerprint: the enclave recomputes it to certify the
        // user's credentials.
        let id = coffer_auth::envelope::derived_id(&ctx.fingerprint, coffer_auth::envelope::USER_ID, index);
        let keys = api_key_rows(&ctx.org.id, &id, &p.api_keys, &ctx.fingerprint, ctx.now, &mut taken)?;
        writes.push(Write::InsertUser(User {
            id: id.clone(),
            organization_id: ctx.org.id.clone(),
            name: p.user_name.clone(),
            email,
            phone_number: phone,
            // A nanosecond apart, so lists keep the request's order.
            contacts_verified: false,
            created_at: ctx.now + user_ids.len() as i64,
            updated_at: ctx.now + user_ids.len() as i64,
        }));
        writes.extend(keys.into_iter().map(Write::InsertApiKey));
        if !tags.is_empty() {
            writes.push(Write::UpdateUser {
                organization_id: ctx.org.id.clone(),
                id: id.clone(),
                name: None,
                email: None,
                phone_number: None,
                tag_ids: Some(tags),
                updated_at: ctx.now,
            });
        }
        if !p.authenticators.is_empty() || !p.oauth_providers.is_empty() {
            writes.extend(
                super::credentials::inline_credentials(&ctx, &id, &p.authenticators, &p.oauth_providers).await?,
            );
        }
        user_ids.push(id);
    }
    Ok(Outcome { result: json!({ "userIds": user_ids }), writes })
}

/// The first `ApiKeyParams`: no curve (P-256, `coffer_auth::grants::API_ONLY_CURVE`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiOnlyKeyParams {
    api_key_name: String,
    public_key: String,
    expiration_seconds: Option<Value>,
}

/// `ApiOnlyUserParams`: a user with API keys alone.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiOnlyUserParams {
    user_name: String,
    user_email: Option<String>,
    #[serde(default)]
    user_tags: Vec<String>,
    #[serde(default)]
    api_keys: Vec<ApiOnlyKeyParams>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateApiOnlyUsersIntent {
    #[serde(default)]
    api_only_users: Vec<ApiOnlyUserParams>,
}

/// `create_api_only_users`: `create_users` of users with API keys alone, each P-256.
pub async fn create_api_only_users(ctx: Ctx, intent: CreateApiOnlyUsersIntent) -> Result<Outcome, ApiError> {
    let users = intent
        .api_only_users
        .into_iter()
        .map(|u| UserParams {
            user_name: u.user_name,
            user_email: u.user_email,
            user_phone_number: None,
            api_keys: u
                .api_keys
                .into_iter()
                .map(|k| ApiKeyParams {
                    api_key_name: k.api_key_name,
                    public_key: k.public_key,
                    curve_type: coffer_auth::grants::API_ONLY_CURVE.to_string(),
                    expiration_seconds: k.expiration_seconds,
                })
                .collect(),
            authenticators: vec![],
            oauth_providers: vec![],
            user_tags: u.user_tags,
        })
        .collect();
    create_users(ctx, CreateUsersIntent { users }).await
}

/// The user an invitation's acceptance makes: `create_users` of one user with the invitation's
/// name, email and tags and the one P-256 API key the receiver brings.
pub async fn create_invited_user(
    ctx: Ctx,
    invitation: &coffer_org_rules::model::Invitation,
    key: ApiOnlyKeyParams,
) -> Result<Outcome, ApiError> {
    let user = UserParams {
        user_name: invitation.receiver_user_name.clone(),
        user_email: Some(invitation.receiver_email.clone()),
        user_phone_number: None,
        api_keys: vec![ApiKeyParams {
            api_key_name: key.api_key_name,
            public_key: key.public_key,
            curve_type: coffer_auth::grants::API_ONLY_CURVE.to_string(),
            expiration_seconds: key.expiration_seconds,
        }],
        authenticators: vec![],
        oauth_providers: vec![],
        user_tags: invitation.receiver_user_tags.clone(),
    };
    create_users(ctx, CreateUsersIntent { users: vec![user] }).await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateUserIntent {
    user_id: String,
    user_name: Option<String>,
    user_email: Option<String>,
    /// Replaces the user's tags when non-empty; empty (what clients send when unused) keeps them.
    #[serde(default)]
    user_tag_ids: Vec<String>,
    user_phone_number: Option<String>,
}

pub async fn update_user(ctx: Ctx, intent: UpdateUserIntent) -> Result<Outcome, ApiError> {
    load_user(&ctx.state, &ctx.org.id, &intent.user_id).await?;
    if let Some(name) = &intent.user_name {
        valid_name("userName", name)?;
    }
    // An empty email or phone number clears it.
    let email = match intent.user_email.as_deref() {
        Some("") => Some(String::new()),
        Some(e) => Some(valid_email(e)?),
        None => None,
    };
    let phone = match intent.user_phone_number.as_deref() {
        Some("") => Some(String::new()),
        Some(p) => Some(valid_phone(p)?),
        None => None,
    };
    let tags = dedup(&intent.user_tag_ids);
    check_user_tags(&ctx.state, &ctx.org.id, &tags).await?;
    Ok(Outcome {
        result: json!({ "userId": intent.user_id }),
        writes: vec![Write::UpdateUser {
            organization_id: ctx.org.id.clone(),
            id: intent.user_id.clone(),
            name: intent.user_name.clone(),
            email,
            phone_number: phone,
            tag_ids: (!tags.is_empty()).then_some(tags),
            updated_at: ctx.now,
        }],
    })
}

/// `update_user_name`: the user's name alone.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateUserNameIntent {
    user_id: String,
    user_name: String,
}

pub async fn update_user_name(ctx: Ctx, intent: UpdateUserNameIntent) -> Result<Outcome, ApiError> {
    valid_name("userName", &intent.user_name)?;
    one_field(ctx, intent.user_id, Some(intent.user_name), None, None, None).await
}

/// `update_user_email`: the user's email alone (empty clears it). A changed email is no longer
/// verified, unless a verification token of the new address comes with it (checked and spent by
/// the enclave; `coffer_org_rules::transition::verifies_contacts`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateUserEmailIntent {
    user_id: String,
    user_email: String,
    #[serde(default)]
    verification_token: Option<String>,
}

pub async fn update_user_email(ctx: Ctx, intent: UpdateUserEmailIntent) -> Result<Outcome, ApiError> {
    let email = match intent.user_email.as_str() {
        "" => String::new(),
        e => valid_email(e)?,
    };
    one_field(ctx, intent.user_id, None, Some(email), None, intent.verification_token).await
}

/// `update_user_phone_number`: the user's phone number alone (empty clears it), as the email.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateUserPhoneNumberIntent {
    user_id: String,
    user_phone_number: String,
    #[serde(default)]
    verification_token: Option<String>,
}

pub async fn update_user_phone_number(ctx: Ctx, intent: UpdateUserPhoneNumberIntent) -> Result<Outcome, ApiError> {
    let phone = match intent.user_phone_number.as_str() {
        "" => String::new(),
        p => valid_phone(p)?,
    };
    one_field(ctx, intent.user_id, None, None, Some(phone), intent.verification_token).await
}

/// One of a user's name, email or phone number changed.
async fn one_field(
    ctx: Ctx,
    user_id: String,
    name: Option<String>,
    email: Option<String>,
    phone_number: Option<String>,
    verification_token: Option<String>,
) -> Result<Outcome, ApiError> {
    let user = load_user(&ctx.state, &ctx.org.id, &user_id).await?;
    let (field, value) = match (&email, &phone_number) {
        (Some(e), _) => ("userEmail", e.as_str()),
        (_, Some(p)) => ("userPhoneNumber", p.as_str()),
        _ => ("userName", ""),
    };
    let token = verification_token.is_some_and(|t| !t.is_empty());
    let contacts = (
        user.contacts_verified,
        user.email.as_deref().unwrap_or_default(),
        user.phone_number.as_deref().unwrap_or_default(),
    );
    let verified = coffer_org_rules::transition::verifies_contacts(contacts, field, value, token);
    let mut writes = vec![Write::UpdateUser {
        organization_id: ctx.org.id.clone(),
        id: user_id.clone(),
        name,
        email,
        phone_number,
        tag_ids: None,
        updated_at: ctx.now,
    }];
    if verified {
        writes.push(Write::MarkContactsVerified { organization_id: ctx.org.id.clone(), id: user_id.clone() });
    }
    Ok(Outcome { result: json!({ "userId": user_id }), writes })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteUsersIntent {
    #[serde(default)]
    user_ids: Vec<String>,
}

pub async fn delete_users(ctx: Ctx, intent: DeleteUsersIntent) -> Result<Outcome, ApiError> {
    let ids = dedup(&intent.user_ids);
    if ids.is_empty() {
        return Err(ApiError::invalid("userIds must not be empty"));
    }
    for id in &ids {
        load_user(&ctx.state, &ctx.org.id, id).await?;
        if ctx.org.root_user_ids.contains(id) {
            return Err(ApiError::invalid(format!("cannot delete a root quorum member: {id}")));
        }
    }
    Ok(Outcome {
        result: json!({ "userIds": ids }),
        writes: vec![Write::DeleteUsers { organization_id: ctx.org.id.clone(), ids: ids.clone() }],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateApiKeysIntent {
    #[serde(default)]
    api_keys: Vec<ApiKeyParams>,
    user_id: String,
}

pub async fn create_api_keys(ctx: Ctx, intent: CreateApiKeysIntent) -> Result<Outcome, ApiError> {
    load_user(&ctx.state, &ctx.org.id, &intent.user_id).await?;
    if intent.api_keys.is_empty() {
        return Err(ApiError::invalid("apiKeys must not be empty"));
    }
    let mut taken = org_public_keys(&ctx.state, &ctx.org.id).await?;
    let keys = api_key_rows(&ctx.org.id, &intent.user_id, &intent.api_keys, &ctx.fingerprint, ctx.now, &mut taken)?;
    Ok(Outcome {
        result: json!({ "apiKeyIds": keys.iter().map(|k| k.id.clone()).collect::<Vec<_>>() }),
        writes: keys.into_iter().map(Write::InsertApiKey).collect(),
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteApiKeysIntent {
    user_id: String,
    #[serde(default)]
    api_key_ids: Vec<String>,
}

pub async fn delete_api_keys(ctx: Ctx, intent: DeleteApiKeysIntent) -> Result<Outcome, ApiError> {
    load_user(&ctx.state, &ctx.org.id, &intent.user_id).await?;
    let ids = dedup(&intent.api_key_ids);
    if ids.is_empty() {
        return Err(ApiError::invalid("apiKeyIds must not be empty"));
    }
    let (org, user) = (ctx.org.id.clone(), intent.user_id.clone());
    let own: HashSet<String> =
        ctx.state.db(move |s| s.api_keys_of_user(&org, &user)).await??.into_iter().map(|k| k.id).collect();
    if let Some(missing) = ids.iter().find(|id| !own.contains(*id)) {
        return Err(ApiError::not_found(format!("api key not found for user {}: {missing}", intent.user_id)));
    }
    Ok(Outcome {
        result: json!({ "apiKeyIds": ids }),
        writes: vec![Write::DeleteApiKeys {
            organization_id: ctx.org.id.clone(),
            user_id: intent.user_id.clone(),
            ids: ids.clone(),
        }],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetUserRequest {
    user_id: String,
}

pub async fn get_user(ctx: QueryCtx, req: GetUserRequest) -> Result<Value, ApiError> {
    let user = load_user(&ctx.state, &ctx.org.id, &req.user_id).await?;
    let org = ctx.org.id.clone();
    let mut out = ctx.state.db(move |s| users_json(s, &org, std::slice::from_ref(&user))).await??;
    Ok(json!({ "user": out.pop().unwrap_or_default() }))
}

pub async fn list_users(ctx: QueryCtx, req: super::params::ListRequest) -> Result<Value, ApiError> {
    let (org, page) = (ctx.org.id.clone(), req.page()?);
    let users = ctx.state.db(move |s| users_json(s, &org, &s.users_page(&org, &page)?)).await??;
    Ok(json!({ "users": users }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetApiKeyRequest {
    api_key_id: String,
}

pub async fn get_api_key(ctx: QueryCtx, req: GetApiKeyRequest) -> Result<Value, ApiError> {
    let (org, id) = (ctx.org.id.clone(), req.api_key_id.clone());
    let key = ctx.state.db(move |s| s.api_key(&org, &id)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("api key not found: {}", req.api_key_id)),
        other => other.into(),
    })?;
    Ok(json!({ "apiKey": api_key_json(&key) }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetApiKeysRequest {
    user_id: Option<String>,
    #[serde(default)]
    pagination_options: super::params::Pagination,
}

pub async fn get_api_keys(ctx: QueryCtx, req: GetApiKeysRequest) -> Result<Value, ApiError> {
    let org = ctx.org.id.clone();
    let keys = match req.user_id {
        Some(user) => {
            load_user(&ctx.state, &org, &user).await?;
            ctx.state.db(move |s| s.api_keys_of_user(&org, &user)).await??
        }
        None => {
            let page = super::params::ListRequest { pagination_options: req.pagination_options }.page()?;
            ctx.state.db(move |s| s.api_keys_page(&org, &page)).await??
        }
    };
    Ok(json!({ "apiKeys": keys.iter().map(api_key_json).collect::<Vec<_>>() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_keys_are_checked_per_curve() {
        // P-256 and secp256k1 generators, compressed; an RFC 8032 Ed25519 test key.
        let p256 = "036b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296";
        let (k, t) = parse_api_public_key("API_KEY_CURVE_P256", &format!("0x{}", p256.to_uppercase())).unwrap();
        assert_eq!((k.as_str(), t), (p256, "CREDENTIAL_TYPE_API_KEY_P256"));
        let g = "0279be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798";
        assert_eq!(parse_api_public_key("API_KEY_CURVE_SECP256K1", g).unwrap().1, "CREDENTIAL_TYPE_API_KEY_SECP256K1");
        let ed = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
        assert_eq!(parse_api_public_key("API_KEY_CURVE_ED25519", ed).unwrap().1, "CREDENTIAL_TYPE_API_KEY_ED25519");
        for (curve, key) in [
            ("API_KEY_CURVE_P256", "zz"),
            ("API_KEY_CURVE_P256", ed),
            ("API_KEY_CURVE_SECP256K1", &g[..64]),
            ("API_KEY_CURVE_SECP256K1", "0479be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798"),
            ("API_KEY_CURVE_ED25519", g),
            ("API_KEY_CURVE_UNSPECIFIED", g),
        ] {
            let e = parse_api_public_key(curve, key).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{curve} {key}");
        }
    }

    #[test]
    fn expiration_must_be_positive_seconds() {
        assert_eq!(parse_expiration(None).unwrap(), None);
        assert_eq!(parse_expiration(Some(&json!("900"))).unwrap(), Some(900));
        assert_eq!(parse_expiration(Some(&json!(60))).unwrap(), Some(60));
        for bad in [json!("0"), json!("abc"), json!("-5"), json!(""), json!(1.5), json!(true)] {
            let e = parse_expiration(Some(&bad)).unwrap_err();
            assert!(e.message.starts_with("invalid api key expiration"), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn email_and_phone() {
        assert!(valid_email("a@b.co").is_ok());
        for bad in ["", "a", "a@b", "@b.co", "a b@c.co", "a@.co", "a@b.co."] {
            assert_eq!(valid_email(bad).unwrap_err().turnkey_code, "INVALID_EMAIL", "{bad}");
        }
        assert!(valid_phone("+13214567890").is_ok());
        for bad in ["13214567890", "+1", "+1-321-456", "+1234567890123456"] {
            assert!(valid_phone(bad).is_err(), "{bad}");
        }
    }

    /// The enclave's rule (`coffer_org_rules::fields::phone`) and the one-time codes' rule
    /// (`coffer_auth::verification_token::is_e164`) agree: a number one accepts, the other does.
    #[test]
    fn both_phone_number_rules_agree() {
        for v in ["+1234", "+123", "+123456789012345", "+1234567890123456", "+1 234", "1234", "+12a4", "", "+"] {
            assert_eq!(coffer_org_rules::fields::phone(v), coffer_auth::verification_token::is_e164(v), "{v:?}");
        }
    }
}
