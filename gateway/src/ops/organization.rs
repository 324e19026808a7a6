//! The organization itself: features (set, remove), the root quorum, and the organization-wide
//! reads `get_organization` and `get_organization_configs`.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::{json, Value};

use super::contracts;
use super::policies;
use super::tags;
use super::{keys, users, wallets};
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::error::ApiError;
use crate::record_kinds::{FEATURE, INVITATION, POLICY, PRIVATE_KEY_TAG, SMART_CONTRACT_INTERFACE, USER_TAG};
use crate::store::{Organization, Page, Record, StoreError, Write};

/// `FeatureName` values (`turnkey_client` 0.17.1), `FEATURE_NAME_UNSPECIFIED` excluded, and
/// Coffer's own (HSM-native keys).
pub const FEATURE_NAMES: &[&str] = &[
    coffer_org_rules::transition::HSM_NATIVE_KEYS_FEATURE,
    "FEATURE_NAME_ROOT_USER_EMAIL_RECOVERY",
    "FEATURE_NAME_WEBAUTHN_ORIGINS",
    "FEATURE_NAME_EMAIL_AUTH",
    "FEATURE_NAME_EMAIL_RECOVERY",
    "FEATURE_NAME_WEBHOOK",
    "FEATURE_NAME_SMS_AUTH",
    "FEATURE_NAME_OTP_EMAIL_AUTH",
    "FEATURE_NAME_AUTH_PROXY",
    "FEATURE_NAME_SOLANA_RENT_PREFUND_ENABLED",
    "FEATURE_NAME_SWAP_CONFIG",
    "FEATURE_NAME_EARN_CONFIG",
    "FEATURE_NAME_SWAP_FEE_SPONSORSHIP",
    "FEATURE_NAME_SWAP_FIXED_RATE",
];

fn feature_name(name: &str) -> Result<&'static str, ApiError> {
    FEATURE_NAMES
        .iter()
        .find(|n| **n == name)
        .copied()
        .ok_or_else(|| ApiError::invalid(format!("invalid feature name: {name:?}")))
}

/// `(name, value)` of a feature record.
fn feature_of(r: &Record) -> (String, String) {
    (r.id.clone(), r.data.get("value").and_then(Value::as_str).unwrap_or_default().to_string())
}

/// The swagger `Feature` list.
fn features_json(features: &[(String, String)]) -> Vec<Value> {
    features.iter().map(|(name, value)| json!({ "name": name, "value": value })).collect()
}

fn quorum_json(org: &Organization) -> Value {
    json!({ "threshold": org.root_quorum_threshold, "userIds": org.root_user_ids })
}

async fn features(ctx: &Ctx) -> Result<Vec<(String, String)>, ApiError> {
    let org = ctx.org.id.clone();
    Ok(ctx.state.db(move |s| s.records(&org, FEATURE)).await??.iter().map(feature_of).collect())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetOrganizationFeatureIntent {
    name: String,
    value: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateOrganizationNameIntent {
    organization_name: String,
}

/// Renames the organization (root quorum only).
pub async fn update_organization_name(ctx: Ctx, intent: UpdateOrganizationNameIntent) -> Result<Outcome, ApiError> {
    super::users::valid_name("organizationName", &intent.organization_name)?;
    Ok(Outcome {
        result: json!({ "organizationId": ctx.org.id, "organizationName": intent.organization_name }),
        writes: vec![Write::RenameOrganization {
            id: ctx.org.id.clone(),
            name: intent.organization_name,
            updated_at: ctx.now,
        }],
    })
}

/// Sets (or overrides) a feature; the result is the organization's features afterwards.
pub async fn set_organization_feature(ctx: Ctx, intent: SetOrganizationFeatureIntent) -> Result<Outcome, ApiError> {
    let name = feature_name(&intent.name)?;
    let value = intent.value.unwrap_or_default();
    let mut list = features(&ctx).await?;
    match list.iter_mut().find(|(n, _)| n == name) {
        Some(entry) => entry.1 = value.clone(),
        None => list.push((name.to_string(), value.clone())),
    }
    let record = Record {
        organization_id: ctx.org.id.clone(),
        kind: FEATURE.into(),
        id: name.into(),
        name: name.into(),
        data: json!({ "value": value }),
        created_at: ctx.now,
        updated_at: ctx.now,
    };
    Ok(Outcome {
        result: json!({ "features": features_json(&list) }),
        writes: vec![Write::PutRecordChecked {
            record,
            unique_message: format!("feature {name} is already set"),
            must_exist: false,
        }],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoveOrganizationFeatureIntent {
    name: String,
}

pub async fn remove_organization_feature(
    ctx: Ctx,
    intent: RemoveOrganizationFeatureIntent,
) -> Result<Outcome, ApiError> {
    let name = feature_name(&intent.name)?;
    let mut list = features(&ctx).await?;
    let before = list.len();
    list.retain(|(n, _)| n != name);
    if list.len() == before {
        return Err(ApiError::not_found(format!("organization feature not set: {name}")));
    }
    Ok(Outcome {
        result: json!({ "features": features_json(&list) }),
        writes: vec![Write::DeleteRecords {
            organization_id: ctx.org.id.clone(),
            kind: FEATURE.into(),
            ids: vec![name.into()],
        }],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateRootQuorumIntent {
    /// An integer; anything else is refused with the spec's message.
    threshold: Option<Value>,
    #[serde(default)]
    user_ids: Vec<String>,
}

/// Spec 5: the message for a threshold that is not a positive integer.
pub const BAD_THRESHOLD: &str = "quorum threshold must be non-zero integer";

pub async fn update_root_quorum(ctx: Ctx, intent: UpdateRootQuorumIntent) -> Result<Outcome, ApiError> {
    let threshold = match &intent.threshold {
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => s.trim().parse::<i64>().ok(),
        _ => None,
    };
    let Some(threshold) = threshold.filter(|t| *t >= 1) else {
        return Err(ApiError::invalid(BAD_THRESHOLD));
    };
    let mut seen = HashSet::new();
    if let Some(dup) = intent.user_ids.iter().find(|id| !seen.insert(id.as_str())) {
        return Err(ApiError::invalid(format!("duplicate user id in root quorum: {dup}")));
    }
    if threshold as u64 > intent.user_ids.len() as u64 {
        return Err(ApiError::invalid(format!(
            "{BAD_THRESHOLD} and at most the number of quorum users: threshold {threshold} > {} users",
            intent.user_ids.len()
        )));
    }
    for id in &intent.user_ids {
        super::lookup::load_user(&ctx.state, &ctx.org.id, id).await?;
    }
    Ok(Outcome {
        result: json!({}),
        writes: vec![Write::SetRootQuorum {
            organization_id: ctx.org.id.clone(),
            threshold,
            user_ids: intent.user_ids,
            updated_at: ctx.now,
        }],
    })
}

/// `get_organization`: the whole organization in one object (legacy, `@turnkey/http` only); each
/// list holds at most the first [`super::params::LIST_PAGE_MAX`] items, like the lists themselves.
pub async fn get_organization(ctx: QueryCtx, _req: super::params::Empty) -> Result<Value, ApiError> {
    let org = ctx.org.clone();
    let data = ctx
        .state
        .db(move |s| -> Result<Value, StoreError> {
            let id = org.id.as_str();
            let first = Page { limit: super::params::LIST_PAGE_MAX, before: None, after: None };
            let user_rows = s.users_page(id, &first)?;
            let mut tag_rows = s.records_page(id, USER_TAG, &first)?;
            tag_rows.extend(s.records_page(id, PRIVATE_KEY_TAG, &first)?);
            let features: Vec<(String, String)> = s.records(id, FEATURE)?.iter().map(feature_of).collect();
            Ok(json!({
                "organizationId": org.id,
                "name": org.name,
                "users": users::users_json(s, id, &user_rows)?,
                "policies": s.records_page(id, POLICY, &first)?.iter().map(policies::policy_json).collect::<Vec<_>>(),
                "privateKeys": s.private_keys_page(id, &first)?.iter().map(keys::private_key_json).collect::<Vec<_>>(),
                "invitations": s.records_page(id, INVITATION, &first)?.iter().map(super::invitations::invitation_json).collect::<Vec<_>>(),
                "tags": tag_rows.iter().map(tags::tag_json).collect::<Vec<_>>(),
                "rootQuorum": quorum_json(&org),
                "features": features_json(&features),
                "wallets": s.wallets_page(id, &first)?.iter().map(wallets::wallet_json).collect::<Vec<_>>(),
                "smartContractInterfaceReferences":
                    s.records_page(id, SMART_CONTRACT_INTERFACE, &first)?.iter().map(contracts::reference_json).collect::<Vec<_>>(),
            }))
        })
        .await??;
    Ok(json!({ "organizationData": data }))
}

/// `get_organization_configs`: features and root quorum.
pub async fn get_organization_configs(ctx: QueryCtx, _req: super::params::Empty) -> Result<Value, ApiError> {
    let org = ctx.org.clone();
    Ok(json!({ "configs": ctx.state.db(move |s| configs_json(s, &org)).await?? }))
}

/// An organization's `configs` (features and root quorum) as `get_organization_configs` answers.
pub fn configs_json(s: &dyn crate::store::Store, org: &Organization) -> Result<Value, StoreError> {
    let features: Vec<(String, String)> = s.records(&org.id, FEATURE)?.iter().map(feature_of).collect();
    Ok(json!({ "features": features_json(&features), "quorum": quorum_json(org) }))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;
    use crate::activity::pipeline;
    use crate::state::AppState;
    use crate::store::{now_nanos, ApiKey, SqliteStore, Store, User};

    fn org(threshold: i64, roots: &[&str]) -> Organization {
        Organization {
            id: "org".into(),
            name: "org".into(),
            parent_id: None,
            root_quorum_threshold: threshold,
            root_user_ids: roots.iter().map(|s| s.to_string()).collect(),
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn feature_names() {
        assert!(FEATURE_NAMES.iter().all(|n| feature_name(n).is_ok()));
        assert!(feature_name("FEATURE_NAME_UNSPECIFIED").is_err());
    }

    /// A scratch directory removed on drop.
    struct TempDir(PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    struct Harness {
        _dir: TempDir,
        state: Arc<AppState>,
        keys: Vec<p256::ecdsa::SigningKey>,
    }

    const USERS: [&str; 3] = ["root-1", "root-2", "member"];

    /// An organization with two root users (threshold 2) and a third, non-root user, each with
    /// one P-256 API key; the enclave is never dialed (the channel is lazy).
    async fn harness() -> Harness {
        let dir = std::env::temp_dir().join(format!("coffer-org-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(&dir.join("coffer.db")).unwrap();
        let now = now_nanos();
        let mut writes = vec![Write::InsertOrganization(org(2, &USERS[..2]))];
        let mut keys = Vec::new();
        for (i, user) in USERS.iter().enumerate() {
            let key = p256::ecdsa::SigningKey::from_slice(&[i as u8 + 1; 32]).unwrap();
            writes.push(Write::InsertUser(User {
                id: user.to_string(),
                organization_id: "org".into(),
                name: user.to_string(),
                email: None,
                phone_number: None,
                contacts_verified: false,
                created_at: now,
                updated_at: now,
            }));
            writes.push(Write::InsertApiKey(ApiKey {
                id: format!("key-{user}"),
                organization_id: "org".into(),
                user_id: user.to_string(),
                name: "k".into(),
                public_key: hex::encode(key.verifying_key().to_encoded_point(true).as_bytes()),
                credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
                expiration_seconds: None,
                created_at: now,
                updated_at: now,
                certificate: vec![],
            }));
            keys.push(key);
        }
        store.apply(&writes).unwrap();
        let custody = crate::custody::Custody::connect_all(vec![crate::custody::transport::EnclaveEndpoint::Unix(
            dir.join("no-enclave.sock"),
        )])
        .unwrap();
        let state = crate::custody::in_process::gateway_state(store, custody);
        Harness { _dir: TempDir(dir), state, keys }
    }

    impl Harness {
        async fn submit(&self, user: usize, path: &str, ty: &str, params: Value) -> Result<Value, ApiError> {
            let body = json!({
                "type": ty,
                "timestampMs": (now_nanos() / 1_000_000).to_string(),
                "organizationId": "org",
                "parameters": params,
            })
            .to_string();
            self.submit_body(user, path, body.as_bytes()).await
        }

        async fn submit_body(&self, user: usize, path: &str, body: &[u8]) -> Result<Value, ApiError> {
            let headers = crate::custody::in_process::stamp_headers(&self.keys[user], body);
            pipeline::submit(self.state.clone(), &crate::ops::REGISTRY, path, &headers, body).await
        }

        fn features(&self) -> usize {
            self.state.store.records("org", FEATURE).unwrap().len()
        }
    }

    /// Root-quorum-only activities are decided by the enclave alone (issue 40): the gateway no
    /// longer refuses, or records as waiting, what its own records say. With no enclave to
    /// decide, a root user's and another user's submissions are unavailable and change nothing.
    /// (What the enclave decides, end to end: organization.rs `root_quorum_end_to_end`.)
    #[tokio::test]
    async fn root_quorum_activities_are_decided_by_the_enclave_alone() {
        let h = harness().await;
        let set = json!({ "name": "FEATURE_NAME_EMAIL_AUTH", "value": "on" });
        let ty = "ACTIVITY_TYPE_SET_ORGANIZATION_FEATURE";
        for user in [0, 2] {
            let err = h.submit(user, "set_organization_feature", ty, set.clone()).await.unwrap_err();
            assert_eq!(err.code, crate::error::Code::Unavailable, "user {user}: {err:?}");
        }
        let quorum = json!({ "threshold": 1, "userIds": ["root-1"] });
        let err = h.submit(1, "update_root_quorum", "ACTIVITY_TYPE_UPDATE_ROOT_QUORUM", quorum).await.unwrap_err();
        assert_eq!(err.code, crate::error::Code::Unavailable, "{err:?}");
        assert_eq!(h.features(), 0);
        let o = h.state.store.organization("org").unwrap();
        assert_eq!((o.root_quorum_threshold, o.root_user_ids.len()), (2, 2));
    }

    #[tokio::test]
    async fn root_quorum_write_checks_users_inside_the_transaction() {
        let h = harness().await;
        let err = h
            .state
            .store
            .apply(&[Write::SetRootQuorum {
                organization_id: "org".into(),
                threshold: 1,
                user_ids: vec!["root-1".into(), "ghost".into()],
                updated_at: now_nanos(),
            }])
            .unwrap_err();
        assert!(matches!(err, StoreError::Conflict(ref m) if m == "user not found: ghost"), "{err:?}");
        assert_eq!(h.state.store.organization("org").unwrap().root_quorum_threshold, 2);
    }

    #[tokio::test]
    async fn checked_records_stay_in_their_organization() {
        let h = harness().await;
        let store = &h.state.store;
        let mut other = org(1, &[]);
        other.id = "other".into();
        store.apply(&[Write::InsertOrganization(other)]).unwrap();
        let rec = |org: &str, value: &str| Record {
            organization_id: org.into(),
            kind: FEATURE.into(),
            id: "FEATURE_NAME_WEBHOOK".into(),
            name: "FEATURE_NAME_WEBHOOK".into(),
            data: json!({ "value": value }),
            created_at: 1,
            updated_at: 1,
        };
        let put = |r: Record, must_exist: bool| Write::PutRecordChecked {
            record: r,
            unique_message: "taken".into(),
            must_exist,
        };
        store.apply(&[put(rec("org", "a"), false)]).unwrap();
        store.apply(&[put(rec("org", "b"), true)]).unwrap();
        assert_eq!(store.record("org", FEATURE, "FEATURE_NAME_WEBHOOK").unwrap().data["value"], "b");
        // Another organization can never overwrite this one's record, whatever the table's key.
        match store.apply(&[put(rec("other", "evil"), false)]) {
            Ok(()) => assert_eq!(store.record("other", FEATURE, "FEATURE_NAME_WEBHOOK").unwrap().data["value"], "evil"),
            Err(e) => assert!(matches!(e, StoreError::Conflict(_)), "{e:?}"),
        }
        assert_eq!(store.record("org", FEATURE, "FEATURE_NAME_WEBHOOK").unwrap().data["value"], "b");
        // must_exist: an update of a record that is gone fails.
        let err = store.apply(&[put(rec("other", "x"), true)]);
        if store.record("other", FEATURE, "FEATURE_NAME_WEBHOOK").is_err() {
            assert!(matches!(err, Err(StoreError::Conflict(ref m)) if m == "feature not found: FEATURE_NAME_WEBHOOK"));
        }
        // A taken name is reported with the caller's message.
        let mut dup = rec("org", "c");
        dup.id = "another-id".into();
        let err = store.apply(&[put(dup, false)]).unwrap_err();
        assert!(matches!(err, StoreError::Unique(ref m) if m == "taken"), "{err:?}");
    }
}
