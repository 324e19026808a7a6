//! Sub-organizations: create one under the caller's organization (root users, their credentials
//! and an optional wallet, in one transaction), delete one from inside it, and list a parent's.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use super::credentials::inline_credentials;
use super::organization::BAD_THRESHOLD;
use super::params::{required, Pagination};
use super::users::{api_key_rows, valid_email, valid_phone, ApiKeyParams};
use super::wallets::{check_accounts, new_wallet, AccountParams};
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::error::{ApiError, Code};
use crate::oidc_tokens;
use crate::record_kinds::FEATURE;
use crate::state::AppState;
use crate::store::{Organization, Page, Record, StoreError, SubOrgFilter, User, Write};
use coffer_auth::envelope::{derived_id, SUB_ORGANIZATION_ID, USER_ID};

/// `RootUserParamsV5`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RootUserParams {
    user_name: String,
    user_email: Option<String>,
    user_phone_number: Option<String>,
    #[serde(default)]
    api_keys: Vec<ApiKeyParams>,
    /// `AuthenticatorParamsV2` / `OauthProviderParamsV2`, decoded by [`inline_credentials`].
    #[serde(default)]
    authenticators: Vec<Value>,
    #[serde(default)]
    oauth_providers: Vec<Value>,
}

/// `WalletParams`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WalletParams {
    wallet_name: String,
    #[serde(default)]
    accounts: Vec<AccountParams>,
    /// Read by the enclave from the stamped body.
    #[allow(dead_code)]
    mnemonic_length: Option<u32>,
}

/// `CreateSubOrganizationIntentV8`. `verificationToken` and `clientSignature` are accepted and
/// not used: Coffer issues no OTP verification tokens, so no sub-organization is "verified".
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateSubOrganizationIntent {
    /// Optional in the official validation (`omitempty`), so an empty name is accepted.
    #[serde(default)]
    sub_organization_name: String,
    #[serde(default)]
    root_users: Vec<RootUserParams>,
    /// An integer; anything else is refused with the spec's message.
    root_quorum_threshold: Option<Value>,
    wallet: Option<WalletParams>,
    disable_email_recovery: Option<bool>,
    disable_email_auth: Option<bool>,
    disable_sms_auth: Option<bool>,
    disable_otp_email_auth: Option<bool>,
}

/// The root quorum threshold: an integer from 1 to the number of root users.
fn threshold(value: Option<&Value>, root_users: usize) -> Result<i64, ApiError> {
    let t = match value {
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => s.trim().parse::<i64>().ok(),
        _ => None,
    };
    let Some(t) = t.filter(|t| *t >= 1) else {
        return Err(ApiError::invalid(BAD_THRESHOLD));
    };
    if t as u64 > root_users as u64 {
        return Err(ApiError::invalid(format!(
            "{BAD_THRESHOLD} and at most the number of root users: rootQuorumThreshold {t} > {root_users} root users"
        )));
    }
    Ok(t)
}

/// Turns `Some("")` into `None` (clients send empty strings for unset optionals).
fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

pub async fn create_sub_organization(ctx: Ctx, intent: CreateSubOrganizationIntent) -> Result<Outcome, ApiError> {
    if let Some(parent) = &ctx.org.parent_id {
        return Err(ApiError::invalid(format!(
            "organization {} is a sub-organization of {parent}: a sub-organization cannot have sub-organizations",
            ctx.org.id
        )));
    }
    if intent.root_users.is_empty() {
        return Err(ApiError::invalid("rootUsers must not be empty: a sub-organization needs at least one root user"));
    }
    let threshold = threshold(intent.root_quorum_threshold.as_ref(), intent.root_users.len())?;
    // The sub-organization's login features, as records: on unless the intent disables them
    // (the hosted service documents email auth and email OTP as on by default; email recovery
    // and SMS follow their disable flags the same way here).
    let on = |disabled: Option<bool>| !disabled.unwrap_or(false);
    let features = [
        ("FEATURE_NAME_EMAIL_RECOVERY", on(intent.disable_email_recovery)),
        ("FEATURE_NAME_EMAIL_AUTH", on(intent.disable_email_auth)),
        ("FEATURE_NAME_OTP_EMAIL_AUTH", on(intent.disable_otp_email_auth)),
        ("FEATURE_NAME_SMS_AUTH", on(intent.disable_sms_auth)),
    ];
    let email_login = on(intent.disable_email_auth) || on(intent.disable_otp_email_auth);
    let sms_login = on(intent.disable_sms_auth);
    if let Some(w) = &intent.wallet {
        required(&w.wallet_name, "wallet.walletName")?;
        check_accounts(&w.accounts)?;
    }

    // The new organization's and root users' ids derive from the activity's fingerprint, so the
    // enclave can recompute which credentials the stamped body adds where.
    let sub = Organization {
        id: derived_id(&ctx.fingerprint, SUB_ORGANIZATION_ID, 0),
        name: intent.sub_organization_name.clone(),
        parent_id: Some(ctx.org.id.clone()),
        root_quorum_threshold: threshold,
        root_user_ids: (0..intent.root_users.len()).map(|i| derived_id(&ctx.fingerprint, USER_ID, i)).collect(),
        created_at: ctx.now,
        updated_at: ctx.now,
    };
    // Credentials and wallet rows are made as the new organization's; passkey origins come from
    // the parent's FEATURE_NAME_WEBAUTHN_ORIGINS, since the sub-organization has none yet.
    let sub_ctx = Ctx {
        state: ctx.state.clone(),
        registry: ctx.registry,
        org: sub.clone(),
        caller: ctx.caller.clone(),
        activity_id: ctx.activity_id.clone(),
        now: ctx.now,
        auth: ctx.auth.clone(),
        fingerprint: ctx.fingerprint.clone(),
        returned: ctx.returned.clone(),
    };
    let mut writes = vec![Write::InsertOrganization(sub.clone())];
    let mut taken = HashSet::new();
    for (p, user_id) in intent.root_users.iter().zip(&sub.root_user_ids) {
        required(&p.user_name, "rootUsers.userName")?;
        let email = non_empty(p.user_email.as_deref()).map(valid_email).transpose()?;
        let phone = non_empty(p.user_phone_number.as_deref()).map(valid_phone).transpose()?;
        let can_log_in = !p.api_keys.is_empty()
            || !p.authenticators.is_empty()
            || !p.oauth_providers.is_empty()
            || (email.is_some() && email_login)
            || (phone.is_some() && sms_login);
        if !can_log_in {
            return Err(ApiError::invalid(format!(
                "root user {:?} has no way to authenticate: give it an API key, an authenticator, an OAuth provider, \
                 or an email or phone number with a login method enabled on the sub-organization",
                p.user_name
            )));
        }
        let keys = api_key_rows(&sub.id, user_id, &p.api_keys, &ctx.fingerprint, ctx.now, &mut taken)?;
        writes.push(Write::InsertUser(User {
            id: user_id.clone(),
            organization_id: sub.id.clone(),
            name: p.user_name.clone(),
            email,
            phone_number: phone,
            contacts_verified: true,
            created_at: ctx.now,
            updated_at: ctx.now,
        }));
        writes.extend(keys.into_iter().map(Write::InsertApiKey));
        writes.extend(inline_credentials(&sub_ctx, user_id, &p.authenticators, &p.oauth_providers).await?);
    }
    for (name, enabled) in features {
        if enabled {
            writes.push(Write::PutRecord(Record {
                organization_id: sub.id.clone(),
                kind: FEATURE.into(),
                id: name.into(),
                name: name.into(),
                data: json!({ "value": "" }),
                created_at: ctx.now,
                updated_at: ctx.now,
            }));
        }
    }
    // An API key the sign-up's clientSignature shows its holder signed with is found by
    // anonymous PUBLIC_KEY lookups from the start (others once they stamp a stamp_login here).
    let body = ctx.auth.request.as_ref().and_then(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok());
    let proven =
        body.as_ref().and_then(|b| b.get("parameters")).and_then(coffer_auth::client_signature::proven_signup_key);
    if let Some(key) = proven {
        writes.push(super::sessions::proven_key(&ctx, &sub.id, &key));
    }
    let mut result = json!({ "subOrganizationId": sub.id, "rootUserIds": sub.root_user_ids });

    // Last, once everything else is known to be acceptable: the wallet, sealed by the enclave
    // under the new organization's id (the sealed blobs' AAD binds it).
    if let Some(w) = intent.wallet {
        let (wallet, wallet_writes) = new_wallet(&ctx, &sub_ctx, w.wallet_name, &w.accounts).await?;
        writes.extend(wallet_writes);
        result["wallet"] = wallet;
    }
    Ok(Outcome { result, writes })
}

/// Spec 5 / seed rule 2: the refusal of deleting key material that was never exported.
fn not_exported(what: &str) -> ApiError {
    ApiError::new(
        Code::InvalidArgument,
        "WALLET_ACCOUNT_NOT_EXPORTED",
        format!(
            "wallet account has not been exported: {what} was never exported; pass deleteWithoutExport: true to delete the sub-organization anyway"
        ),
    )
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteSubOrganizationIntent {
    delete_without_export: Option<bool>,
}

/// Submitted in the sub-organization itself, by its root users (a root-quorum activity). The
/// export rule is checked here for a clear answer and again inside the transaction; the
/// activity is recorded in the parent's log, since the sub-organization's goes with it.
pub async fn delete_sub_organization(ctx: Ctx, intent: DeleteSubOrganizationIntent) -> Result<Outcome, ApiError> {
    let Some(parent_id) = ctx.org.parent_id.clone() else {
        return Err(ApiError::invalid(format!(
            "organization {} is not a sub-organization: only sub-organizations can be deleted",
            ctx.org.id
        )));
    };
    let require_exported = !intent.delete_without_export.unwrap_or(false);
    if require_exported {
        let org = ctx.org.id.clone();
        let (wallets, keys) =
            ctx.state.db(move |s| -> Result<_, StoreError> { Ok((s.wallets(&org)?, s.private_keys(&org)?)) }).await??;
        if let Some(w) = wallets.iter().find(|w| !w.exported) {
            return Err(not_exported(&format!("wallet {}", w.id)));
        }
        if let Some(k) = keys.iter().find(|k| !k.exported) {
            return Err(not_exported(&format!("private key {}", k.id)));
        }
    }
    purge_after_deletion(ctx.state.clone(), ctx.org.id.clone());
    Ok(Outcome {
        result: json!({ "subOrganizationUuid": ctx.org.id }),
        writes: vec![Write::DeleteSubOrganization {
            organization_id: ctx.org.id.clone(),
            parent_id,
            activity_id: ctx.activity_id.clone(),
            require_exported,
            deleted_at: ctx.now,
        }],
    })
}

/// Once the deletion has committed (the pipeline commits right after the handler returns),
/// purges the store's files of the deleted rows' old copies: `secure_delete` zeroes the new page
/// versions, but the WAL still holds the frames with the sealed blobs until it is checkpointed
/// and truncated. Gives up quietly if the organization is still there after a few seconds (the
/// commit failed).
fn purge_after_deletion(state: Arc<AppState>, org: String) {
    tokio::spawn(async move {
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(25)).await;
            let id = org.clone();
            match state.db(move |s| s.organization(&id)).await {
                Ok(Err(StoreError::NotFound)) => {}
                Ok(Ok(_)) => continue,
                Ok(Err(_)) | Err(_) => return,
            }
            for _ in 0..20 {
                // It takes the writer and may wait for readers: off the executor.
                let st = state.clone();
                match tokio::task::spawn_blocking(move || st.store.purge_deleted_data()).await {
                    Ok(Ok(true)) => return,
                    Ok(Ok(false)) => tokio::time::sleep(Duration::from_millis(50)).await,
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, organization = %org, "purging a deleted sub-organization's old pages");
                        return;
                    }
                    Err(_) => return,
                }
            }
            tracing::warn!(organization = %org, "readers kept the WAL from being truncated after a deletion");
            return;
        }
    });
}

/// `GetSubOrgIdsRequest`. The official client sends `""` for an unset filter and cursor.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListSubOrgsRequest {
    filter_type: Option<String>,
    filter_value: Option<String>,
    #[serde(default)]
    pagination_options: Pagination,
}

/// The filter a `filterType` / `filterValue` pair names; `OIDC_TOKEN` is verified against its
/// issuer and matches the token's (issuer, subject, audience).
pub async fn filter(
    own: Option<&crate::login_public_keys::LoginKeys>,
    filter_type: &str,
    value: &str,
) -> Result<SubOrgFilter, ApiError> {
    if filter_type.is_empty() {
        if !value.trim().is_empty() {
            return Err(ApiError::invalid("filterType is required when filterValue is set"));
        }
        return Ok(SubOrgFilter::All);
    }
    if value.trim().is_empty() {
        return Err(ApiError::invalid(format!("filterValue is required with filterType {filter_type}")));
    }
    let v = value.to_string();
    Ok(match filter_type {
        "NAME" => SubOrgFilter::Name(v),
        "USERNAME" => SubOrgFilter::Username(v),
        "EMAIL" => SubOrgFilter::Email(v),
        "PHONE_NUMBER" => SubOrgFilter::PhoneNumber(v),
        "CREDENTIAL_ID" => SubOrgFilter::CredentialId(v),
        "PUBLIC_KEY" => {
            let key = value.trim();
            SubOrgFilter::PublicKey(key.strip_prefix("0x").unwrap_or(key).to_ascii_lowercase())
        }
        "WALLET_ACCOUNT_ADDRESS" => SubOrgFilter::WalletAccountAddress(v),
        "OIDC_TOKEN" => {
            let c = oidc_tokens::verify(own, value.trim()).await?;
            SubOrgFilter::OauthIdentity { issuer: c.iss, subject: c.sub, audience: c.aud }
        }
        other => {
            return Err(ApiError::invalid(format!(
                "invalid filter type: {other:?} (NAME, USERNAME, EMAIL, PHONE_NUMBER, CREDENTIAL_ID, PUBLIC_KEY, \
                 WALLET_ACCOUNT_ADDRESS or OIDC_TOKEN)"
            )))
        }
    })
}

/// `list_suborgs`: ids of the organization's sub-organizations, oldest first, `limit` (default
/// 10) at a time; `after` / `before` are sub-organization ids.
pub async fn list_suborgs(ctx: QueryCtx, req: ListSubOrgsRequest) -> Result<Value, ApiError> {
    let filter = filter(
        oidc_tokens::own_keys(&ctx.state).await,
        req.filter_type.as_deref().unwrap_or_default(),
        req.filter_value.as_deref().unwrap_or_default(),
    )
    .await?;
    sub_organization_ids(ctx, req.pagination_options, filter).await
}

/// `list_verified_suborgs`: [`list_suborgs`] of the sub-organizations with a user whose email
/// (`filterType` `EMAIL`) or phone number (`PHONE_NUMBER`) is `filterValue` and verified.
pub async fn list_verified_suborgs(ctx: QueryCtx, req: ListSubOrgsRequest) -> Result<Value, ApiError> {
    let value = req.filter_value.unwrap_or_default();
    if value.trim().is_empty() {
        return Err(ApiError::invalid("filterValue is required"));
    }
    let filter = match req.filter_type.as_deref().unwrap_or_default() {
        "EMAIL" => SubOrgFilter::VerifiedEmail(value),
        "PHONE_NUMBER" => SubOrgFilter::VerifiedPhoneNumber(value),
        other => return Err(ApiError::invalid(format!("invalid filter type: {other:?} (EMAIL or PHONE_NUMBER)"))),
    };
    sub_organization_ids(ctx, req.pagination_options, filter).await
}

/// The ids of the organization's sub-organizations that `filter` keeps, one page.
async fn sub_organization_ids(ctx: QueryCtx, p: Pagination, filter: SubOrgFilter) -> Result<Value, ApiError> {
    let cursor = |c: Option<String>| c.filter(|c| !c.is_empty());
    let limit = Pagination { limit: cursor(p.limit), before: None, after: None }.limit()?;
    let page = Page { limit, before: cursor(p.before), after: cursor(p.after) };
    for id in [&page.after, &page.before].into_iter().flatten() {
        let cursor = id.clone();
        let parent = match ctx.state.db(move |s| s.organization(&cursor)).await? {
            Ok(o) => o.parent_id,
            Err(StoreError::NotFound) => None,
            Err(e) => return Err(e.into()),
        };
        if parent.as_deref() != Some(ctx.org.id.as_str()) {
            return Err(ApiError::invalid(format!(
                "invalid pagination cursor: {id:?} is not a sub-organization of this organization"
            )));
        }
    }
    let org = ctx.org.id.clone();
    let ids = ctx.state.db(move |s| s.sub_organization_ids(&org, &filter, &page)).await??;
    Ok(json!({ "organizationIds": ids }))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::store::{
        now_nanos, ActivityRecord, ApiKey, AuthenticatorRecord, Committed, OauthProviderRecord, PrivateKey,
        SqliteStore, Store, Wallet, WalletAccount,
    };

    /// A scratch directory removed on drop.
    struct TempDir(PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn open() -> (TempDir, SqliteStore) {
        let dir = std::env::temp_dir().join(format!("coffer-suborgs-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(&dir.join("coffer.db")).unwrap();
        (TempDir(dir), store)
    }

    fn org(id: &str, name: &str, parent: Option<&str>, created_at: i64) -> Organization {
        Organization {
            id: id.into(),
            name: name.into(),
            parent_id: parent.map(str::to_string),
            root_quorum_threshold: 1,
            root_user_ids: vec![format!("{id}-user")],
            created_at,
            updated_at: created_at,
        }
    }

    /// A sub-organization with one of everything: a user with an email, a phone number, an API
    /// key, a passkey, an OAuth identity and a tag; a wallet with an account; a private key;
    /// an import target, a feature and an activity.
    fn populate(s: &SqliteStore, id: &str, name: &str, parent: &str, created_at: i64) {
        let user = format!("{id}-user");
        let o = id.to_string();
        let rec = |kind: &str, rid: &str| Record {
            organization_id: o.clone(),
            kind: kind.into(),
            id: rid.into(),
            name: rid.into(),
            data: json!({ "value": "" }),
            created_at,
            updated_at: created_at,
        };
        s.apply(&[
            Write::InsertOrganization(org(id, name, Some(parent), created_at)),
            Write::InsertUser(User {
                id: user.clone(),
                organization_id: o.clone(),
                name: format!("{name}-alice"),
                email: Some(format!("Alice@{name}.example")),
                contacts_verified: false,
                phone_number: Some(format!("+1555{created_at:07}")),
                created_at,
                updated_at: created_at,
            }),
            Write::InsertApiKey(ApiKey {
                id: format!("{id}-key"),
                organization_id: o.clone(),
                user_id: user.clone(),
                name: "k".into(),
                public_key: format!("02{:064x}", created_at),
                credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
                expiration_seconds: None,
                created_at,
                updated_at: created_at,
                certificate: vec![],
            }),
            Write::InsertAuthenticators(vec![AuthenticatorRecord {
                id: format!("{id}-passkey"),
                organization_id: o.clone(),
                user_id: user.clone(),
                name: "p".into(),
                credential_id: format!("cred-{name}"),
                public_key: format!("03{:064x}", created_at),
                attestation_type: "none".into(),
                aaguid: String::new(),
                transports: vec![],
                sign_count: 0,
                created_at,
                updated_at: created_at,
                certificate: vec![],
            }]),
            Write::InsertOauthProviders(vec![OauthProviderRecord {
                id: format!("{id}-oauth"),
                organization_id: o.clone(),
                user_id: user.clone(),
                name: "google".into(),
                issuer: "https://issuer.example".into(),
                audience: "app".into(),
                subject: format!("sub-{name}"),
                created_at,
                updated_at: created_at,
                certificate: vec![],
            }]),
            Write::PutRecord(rec("user_tag", &format!("{id}-tag"))),
            Write::UpdateUser {
                organization_id: o.clone(),
                id: user.clone(),
                name: None,
                email: None,
                phone_number: None,
                tag_ids: Some(vec![format!("{id}-tag")]),
                updated_at: created_at,
            },
            Write::PutRecord(rec(FEATURE, "FEATURE_NAME_EMAIL_AUTH")),
            Write::InsertWallet(Wallet {
                id: format!("{id}-wallet"),
                organization_id: o.clone(),
                name: "w".into(),
                exported: false,
                imported: false,
                sealed_seed: vec![0x5e; 48],
                created_at,
                updated_at: created_at,
            }),
            Write::InsertAccounts(vec![WalletAccount {
                id: format!("{id}-account"),
                organization_id: o.clone(),
                wallet_id: format!("{id}-wallet"),
                curve: "CURVE_SECP256K1".into(),
                path_format: "PATH_FORMAT_BIP32".into(),
                path: "m/44'/60'/0'/0/0".into(),
                address_format: "ADDRESS_FORMAT_ETHEREUM".into(),
                address: format!("0xAbC{created_at:037}"),
                public_key: "04".into(),
                sealed_key: vec![0x5e; 48],
                created_at,
                updated_at: created_at,
            }]),
            Write::InsertPrivateKeys(vec![PrivateKey {
                id: format!("{id}-pk"),
                organization_id: o.clone(),
                name: "pk".into(),
                curve: "CURVE_SECP256K1".into(),
                public_key: "04".into(),
                addresses: vec![crate::store::AddressEntry {
                    format: "ADDRESS_FORMAT_ETHEREUM".into(),
                    address: format!("0xdef{created_at:037}"),
                }],
                tags: vec![],
                exported: false,
                imported: false,
                sealed_key: vec![0x5e; 48],
                created_at,
                updated_at: created_at,
            }]),
            Write::PutImportTarget(crate::store::ImportTarget {
                organization_id: o.clone(),
                user_id: user,
                sealed_key: vec![0x5e; 48],
                created_at,
            }),
        ])
        .unwrap();
        s.commit(&activity(id, &format!("sha256:{id}-created")), &[]).unwrap();
    }

    fn activity(org: &str, fingerprint: &str) -> ActivityRecord {
        ActivityRecord {
            id: uuid::Uuid::new_v4().to_string(),
            organization_id: org.into(),
            activity_type: "ACTIVITY_TYPE_DELETE_SUB_ORGANIZATION".into(),
            status: "ACTIVITY_STATUS_COMPLETED".into(),
            fingerprint: fingerprint.into(),
            intent: json!({}),
            result: json!({}),
            votes: json!([]),
            failure: None,
            created_at: now_nanos(),
            updated_at: now_nanos(),
            app_proofs: Vec::new(),
        }
    }

    fn page(limit: usize, after: Option<&str>, before: Option<&str>) -> Page {
        Page { limit, after: after.map(str::to_string), before: before.map(str::to_string) }
    }

    fn ids(s: &SqliteStore, parent: &str, f: SubOrgFilter) -> Vec<String> {
        s.sub_organization_ids(parent, &f, &page(100, None, None)).unwrap()
    }

    fn footprint(s: &SqliteStore, org: &str) -> Vec<(String, i64)> {
        s.organization_footprint(org).unwrap()
    }

    fn total(s: &SqliteStore, org: &str) -> i64 {
        footprint(s, org).iter().map(|(_, n)| n).sum()
    }

    /// Parent `p` with sub-organizations a, b, c (in that order) and an unrelated `q` with `x`.
    fn fixture() -> (TempDir, SqliteStore) {
        let (dir, s) = open();
        s.apply(&[
            Write::InsertOrganization(org("p", "parent", None, 1)),
            Write::InsertOrganization(org("q", "q", None, 1)),
        ])
        .unwrap();
        populate(&s, "a", "alpha", "p", 10);
        populate(&s, "b", "beta", "p", 20);
        populate(&s, "c", "gamma", "p", 30);
        populate(&s, "x", "alpha", "q", 40);
        (dir, s)
    }

    #[test]
    fn filters_find_the_right_sub_organizations() {
        let (_d, s) = fixture();
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(&s, "p", SubOrgFilter::All), v(&["a", "b", "c"]));
        assert_eq!(ids(&s, "q", SubOrgFilter::All), v(&["x"]));
        assert!(ids(&s, "a", SubOrgFilter::All).is_empty());
        // The same name under another parent is not this parent's.
        assert_eq!(ids(&s, "p", SubOrgFilter::Name("alpha".into())), v(&["a"]));
        assert_eq!(ids(&s, "p", SubOrgFilter::Username("beta-alice".into())), v(&["b"]));
        assert_eq!(ids(&s, "p", SubOrgFilter::Email("alice@GAMMA.example".into())), v(&["c"]));
        assert_eq!(ids(&s, "p", SubOrgFilter::PhoneNumber("+15550000020".into())), v(&["b"]));
        assert_eq!(ids(&s, "p", SubOrgFilter::CredentialId("cred-alpha".into())), v(&["a"]));
        assert!(ids(&s, "p", SubOrgFilter::CredentialId("CRED-ALPHA".into())).is_empty());
        // API key and passkey public keys both count.
        assert_eq!(ids(&s, "p", SubOrgFilter::PublicKey(format!("02{:064x}", 20))), v(&["b"]));
        assert_eq!(ids(&s, "p", SubOrgFilter::PublicKey(format!("03{:064x}", 30))), v(&["c"]));
        // 0x addresses in any case; others exactly.
        let addr = format!("0xAbC{:037}", 10);
        assert_eq!(ids(&s, "p", SubOrgFilter::WalletAccountAddress(addr.to_lowercase())), v(&["a"]));
        assert_eq!(
            ids(&s, "p", SubOrgFilter::WalletAccountAddress(addr.to_uppercase().replace("0X", "0x"))),
            v(&["a"])
        );
        assert!(ids(&s, "p", SubOrgFilter::WalletAccountAddress(format!("AbC{:037}", 10))).is_empty());
        assert_eq!(
            ids(
                &s,
                "p",
                SubOrgFilter::OauthIdentity {
                    issuer: "https://issuer.example".into(),
                    subject: "sub-gamma".into(),
                    audience: "app".into()
                }
            ),
            v(&["c"])
        );
        for nothing in [
            SubOrgFilter::Name("nope".into()),
            SubOrgFilter::Username("alpha".into()),
            SubOrgFilter::Email("nobody@example.com".into()),
            SubOrgFilter::PublicKey("02".into()),
        ] {
            assert!(ids(&s, "p", nothing.clone()).is_empty(), "{nothing:?}");
        }
    }

    #[test]
    fn pages_follow_creation_order() {
        let (_d, s) = fixture();
        let get = |p: Page| s.sub_organization_ids("p", &SubOrgFilter::All, &p).unwrap();
        assert_eq!(get(page(2, None, None)), ["a", "b"]);
        assert_eq!(get(page(2, Some("b"), None)), ["c"]);
        assert_eq!(get(page(2, Some("c"), None)), Vec::<String>::new());
        assert_eq!(get(page(1, None, Some("c"))), ["b"]);
        assert_eq!(get(page(5, None, Some("c"))), ["a", "b"]);
        assert_eq!(get(page(5, Some("a"), Some("c"))), ["b"]);
    }

    #[test]
    fn deletion_lands_with_its_activity_and_keeps_only_the_history() {
        let (_d, s) = fixture();
        let before_b = footprint(&s, "b");
        // Every table that holds organization rows is non-empty for "b" before.
        for table in [
            "activities",
            "api_keys",
            "authenticators",
            "import_targets",
            "oauth_providers",
            "organizations",
            "private_key_addresses",
            "private_keys",
            "records",
            "user_tags",
            "users",
            "wallet_accounts",
            "wallets",
        ] {
            let n = before_b.iter().find(|(t, _)| t == table).map(|(_, n)| *n);
            assert!(n.unwrap_or(0) > 0, "{table}: {n:?}");
        }
        let delete = |org: &str, parent: &str, a: &ActivityRecord, require_exported: bool| {
            s.commit(
                a,
                &[Write::DeleteSubOrganization {
                    organization_id: org.into(),
                    parent_id: parent.into(),
                    activity_id: a.id.clone(),
                    require_exported,
                    deleted_at: a.created_at,
                }],
            )
        };

        // Unexported material: refused inside the transaction, nothing changes, nothing recorded.
        let a1 = activity("b", "sha256:delete-1");
        let err = delete("b", "p", &a1, true).unwrap_err();
        assert!(
            matches!(err, StoreError::Conflict(ref m) if m.starts_with("wallet account has not been exported: wallet b-wallet")),
            "{err:?}"
        );
        assert_eq!(ApiError::from(err).turnkey_code, "WALLET_ACCOUNT_NOT_EXPORTED");
        assert_eq!(footprint(&s, "b"), before_b);
        assert!(matches!(s.activity_by_fingerprint("sha256:delete-1"), Err(StoreError::NotFound)));
        // Exported wallets but an unexported private key: still refused.
        s.apply(&[Write::MarkWalletExported("b-wallet".into())]).unwrap();
        let err = delete("b", "p", &activity("b", "sha256:delete-2"), true).unwrap_err();
        assert!(matches!(err, StoreError::Conflict(ref m) if m.contains("private key b-pk")), "{err:?}");
        // Not this parent's sub-organization; not a sub-organization at all.
        let err = delete("b", "q", &activity("b", "sha256:delete-3"), false).unwrap_err();
        assert!(matches!(err, StoreError::Conflict(ref m) if m.contains("is not a sub-organization of q")), "{err:?}");
        let err = delete("p", "q", &activity("p", "sha256:delete-4"), false).unwrap_err();
        assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
        assert_eq!(total(&s, "p"), 4, "p and its three sub-organizations, nothing else");

        // Forced: the activity lands in the parent's log; "b" keeps only its history (activities,
        // policy evaluations) and its row as a tombstone the parent can still read through.
        let a = activity("b", "sha256:delete-5");
        let Committed::New(_) = delete("b", "p", &a, false).unwrap() else { panic!("expected a new activity") };
        assert!(matches!(s.organization("b"), Err(StoreError::NotFound)));
        assert_eq!(s.deleted_organization("b").unwrap().parent_id.as_deref(), Some("p"));
        assert!(matches!(s.deleted_organization("a"), Err(StoreError::NotFound)), "a live one is not deleted");
        let count = |fp: &[(String, i64)], t: &str| fp.iter().find(|(x, _)| x == t).map_or(0, |(_, n)| *n);
        let after_b = footprint(&s, "b");
        for (table, n) in &after_b {
            let expected = match table.as_str() {
                "activities" | "policy_evaluations" => count(&before_b, table),
                "organizations" => 1,
                _ => 0,
            };
            assert_eq!(*n, expected, "{table} after the deletion: {after_b:?}");
        }
        assert!(count(&before_b, "activities") > 0);
        let all = crate::store::ActivityFilter { limit: 1000, ..Default::default() };
        assert_eq!(s.activities("b", &all).unwrap().len() as i64, count(&before_b, "activities"));
        let recorded = s.activity("p", &a.id).unwrap();
        assert_eq!((recorded.organization_id.as_str(), recorded.fingerprint.as_str()), ("p", "sha256:delete-5"));
        assert!(matches!(s.activity("b", &a.id), Err(StoreError::NotFound)));
        // The siblings and the parent are untouched.
        assert_eq!(ids(&s, "p", SubOrgFilter::All), ["a", "c"]);
        assert_eq!(total(&s, "a"), before_b.iter().map(|(_, n)| n).sum::<i64>());
        assert!(s.wallets("a").unwrap().len() == 1 && s.users("p").unwrap().is_empty());
        // Deleting it again: the organization is gone.
        let err = delete("b", "p", &activity("b", "sha256:delete-6"), false).unwrap_err();
        assert!(matches!(err, StoreError::Conflict(ref m) if m == "organization not found: b"), "{err:?}");

        // Everything exported: the default (export required) deletes too.
        s.apply(&[Write::MarkWalletExported("c-wallet".into()), Write::MarkPrivateKeyExported("c-pk".into())]).unwrap();
        delete("c", "p", &activity("c", "sha256:delete-7"), true).unwrap();
        assert!(
            s.wallets("c").unwrap().is_empty()
                && s.private_keys("c").unwrap().is_empty()
                && s.users("c").unwrap().is_empty()
        );
        assert_eq!(ids(&s, "p", SubOrgFilter::All), ["a"]);
    }

    #[test]
    fn an_approved_deletion_moves_its_record_to_the_parent() {
        let (_d, s) = fixture();
        // The deletion waited for votes: its activity is already in "b"'s log.
        let mut a = activity("b", "sha256:delete-after-votes");
        a.status = "ACTIVITY_STATUS_CONSENSUS_NEEDED".into();
        s.commit(&a, &[]).unwrap();
        assert_eq!(s.activity("b", &a.id).unwrap().organization_id, "b");
        s.apply(&[
            Write::DeleteSubOrganization {
                organization_id: "b".into(),
                parent_id: "p".into(),
                activity_id: a.id.clone(),
                require_exported: false,
                deleted_at: a.created_at,
            },
            Write::UpdateConsensusActivity {
                organization_id: "b".into(),
                id: a.id.clone(),
                expected_votes: 0,
                status: "ACTIVITY_STATUS_COMPLETED".into(),
                result: json!({}),
                votes: json!([]),
                failure: None,
                updated_at: a.created_at,
                app_proofs: Vec::new(),
            },
        ])
        .unwrap();
        let moved = s.activity("p", &a.id).unwrap();
        assert_eq!((moved.organization_id.as_str(), moved.status.as_str()), ("p", "ACTIVITY_STATUS_COMPLETED"));
        assert!(matches!(s.organization("b"), Err(StoreError::NotFound)));
        assert!(s.deleted_organization("b").is_ok());
        assert!(s.users("b").unwrap().is_empty() && s.wallets("b").unwrap().is_empty());
    }

    #[test]
    fn threshold_and_filter_parameters() {
        assert_eq!(threshold(Some(&json!(1)), 1).unwrap(), 1);
        assert_eq!(threshold(Some(&json!("2")), 3).unwrap(), 2);
        for (v, n) in
            [(None, 1), (Some(json!(0)), 1), (Some(json!(-1)), 1), (Some(json!(1.5)), 2), (Some(json!(true)), 1)]
        {
            assert_eq!(threshold(v.as_ref(), n).unwrap_err().message, BAD_THRESHOLD, "{v:?}");
        }
        let e = threshold(Some(&json!(3)), 2).unwrap_err();
        assert!(e.message.starts_with(BAD_THRESHOLD) && e.message.contains("3 > 2"), "{}", e.message);

        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            assert_eq!(filter(None, "", "").await.unwrap(), SubOrgFilter::All);
            assert_eq!(filter(None, "NAME", " n ").await.unwrap(), SubOrgFilter::Name(" n ".into()));
            assert_eq!(filter(None, "PUBLIC_KEY", " 0x02AB").await.unwrap(), SubOrgFilter::PublicKey("02ab".into()));
            assert!(filter(None, "NAME", "  ").await.unwrap_err().message.contains("filterValue is required"));
            assert!(filter(None, "", "x").await.unwrap_err().message.contains("filterType is required"));
            assert!(filter(None, "NAME", "").await.unwrap_err().message.contains("filterValue is required"));
            assert!(filter(None, "BOGUS", "x").await.unwrap_err().message.starts_with("invalid filter type"));
            assert_eq!(filter(None, "OIDC_TOKEN", "not.a.jwt").await.unwrap_err().turnkey_code, "INVALID_OIDC_TOKEN");
        });
    }
}
