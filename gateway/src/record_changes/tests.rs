//! The projection per write, and its agreement with the enclave's transitions: the real
//! handlers run on a store, their writes are projected, and must follow the changes
//! `transition::expected` computes for the stamped body (with the ids and grants coffer-auth
//! derives from it).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use coffer_auth::envelope::{derived_id, StampedActivity};
use coffer_org_rules::transition::{self, Grant, Input};
use coffer_org_rules::OrgState;
use serde_json::{json, Value};

use super::*;
use crate::activity::registry::Ctx;
use crate::state::AppState;
use crate::store::{now_nanos, AuthenticatorRecord, OauthProviderRecord, Organization, SqliteStore, User, Wallet};

#[test]
fn constants_agree_with_coffer_auth_and_the_handlers() {
    assert_eq!(transition::WEBAUTHN_CREDENTIAL_TYPE, coffer_auth::webauthn::CREDENTIAL_TYPE);
    assert_eq!(transition::MAX_API_KEY_EXPIRATION_SECONDS, coffer_auth::grants::MAX_API_KEY_EXPIRATION_SECONDS);
    assert_eq!(transition::OAUTH_CREDENTIAL_TYPE, coffer_auth::grants::OAUTH_PROVIDER);
    assert_eq!(transition::USER_ID, coffer_auth::envelope::USER_ID);
    assert_eq!(transition::API_ONLY_CURVE, coffer_auth::grants::API_ONLY_CURVE);
    assert_eq!(transition::SUB_ORGANIZATION_ID, coffer_auth::envelope::SUB_ORGANIZATION_ID);
    assert_eq!(transition::WALLET_ID, coffer_auth::envelope::WALLET_ID);
    assert_eq!(transition::WALLET_ACCOUNT_ID, coffer_auth::envelope::WALLET_ACCOUNT_ID);
    assert_eq!(transition::AUTH_PROXY_POLICY_NAME, crate::ops::proxy_config::PROXY_POLICY_NAME);
    assert_eq!(transition::AUTH_PROXY_FEATURE, crate::ops::proxy_config::FEATURE_AUTH_PROXY);
    for (curve, ty) in [
        ("API_KEY_CURVE_P256", "CREDENTIAL_TYPE_API_KEY_P256"),
        ("API_KEY_CURVE_SECP256K1", "CREDENTIAL_TYPE_API_KEY_SECP256K1"),
        ("API_KEY_CURVE_ED25519", "CREDENTIAL_TYPE_API_KEY_ED25519"),
    ] {
        assert_eq!(transition::api_key_type(curve), Some(ty));
    }
}

fn api_key(id: &str, certificate: Vec<u8>, expiration_seconds: Option<u64>) -> ApiKey {
    ApiKey {
        id: id.into(),
        organization_id: "o".into(),
        user_id: "u".into(),
        name: "k".into(),
        public_key: "02ab".into(),
        credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
        expiration_seconds,
        created_at: 5_000_000_000,
        updated_at: 5_000_000_000,
        certificate,
    }
}

fn record(kind: &str, id: &str, data: Value) -> Record {
    Record {
        organization_id: "o".into(),
        kind: kind.into(),
        id: id.into(),
        name: id.into(),
        data,
        created_at: 1,
        updated_at: 1,
    }
}

#[test]
fn each_write_projects_to_its_effect() {
    let c = |effect| Change { organization_id: "o".into(), effect };
    let writes = vec![
        Write::InsertApiKey(api_key("k1", vec![], Some(60))),
        // A session key: certified by the enclave, which records it.
        Write::InsertApiKey(api_key("s1", vec![1], Some(60))),
        Write::InsertAuthenticators(vec![AuthenticatorRecord {
            id: "a1".into(),
            organization_id: "o".into(),
            user_id: "u".into(),
            name: "p".into(),
            credential_id: "cred".into(),
            public_key: "03aa".into(),
            attestation_type: "none".into(),
            aaguid: String::new(),
            transports: vec![],
            sign_count: 0,
            created_at: 1,
            updated_at: 1,
            certificate: vec![],
        }]),
        Write::InsertOauthProviders(vec![OauthProviderRecord {
            id: "p1".into(),
            organization_id: "o".into(),
            user_id: "u".into(),
            name: "g".into(),
            issuer: "https://i".into(),
            audience: "a".into(),
            subject: "s".into(),
            created_at: 1,
            updated_at: 1,
            certificate: vec![],
        }]),
        Write::PutRecord(record(kinds::AUTH_PROXY, "cfg", json!({"enabled": true, "userId": "px"}))),
        Write::PutRecord(record(kinds::PARENT_CERTIFICATE, kinds::PARENT_CERTIFICATE, json!({"certificate": "00"}))),
        Write::PutRecord(record(kinds::WEBHOOK_ENDPOINT, "w1", json!({"url": "https://h.example/x", "name": "n"}))),
        Write::PutRecordChecked {
            record: record(kinds::OAUTH2_CREDENTIAL, "c1", json!({"provider": "OAUTH2_PROVIDER_X", "clientId": "cid"})),
            unique_message: String::new(),
            must_exist: false,
        },
        Write::DeleteRecords { organization_id: "o".into(), kind: kinds::FEATURE.into(), ids: vec!["F".into()] },
        Write::DeleteRecords { organization_id: "o".into(), kind: kinds::TVC_APP.into(), ids: vec!["t".into()] },
        Write::DeleteWallets { ids: vec!["w".into()], require_exported: true },
        Write::MarkWalletExported("w".into()),
        Write::DropWebhookDeliveries { organization_id: "o".into(), endpoint_id: "w1".into() },
        Write::DeleteSubOrganization {
            organization_id: "sub".into(),
            parent_id: "o".into(),
            activity_id: "a".into(),
            require_exported: true,
            deleted_at: 1,
        },
    ];
    let credential = |id: &str, kind, ty: &str, pk: String, expires_at_ms| Credential {
        id: id.into(),
        user_id: "u".into(),
        kind,
        credential_type: ty.into(),
        public_key: pk,
        expires_at_ms,
    };
    assert_eq!(
        of_writes("o", &writes),
        vec![
            c(Effect::AddCredential {
                credential: credential(
                    "k1",
                    CredentialKind::ApiKey,
                    "CREDENTIAL_TYPE_API_KEY_P256",
                    "02ab".into(),
                    65_000
                )
            }),
            c(Effect::AddCredential {
                credential: credential(
                    "a1",
                    CredentialKind::Passkey,
                    "CREDENTIAL_TYPE_WEBAUTHN_AUTHENTICATOR",
                    "03aa".into(),
                    0
                )
            }),
            c(Effect::AddCredential {
                credential: credential(
                    "p1",
                    CredentialKind::OauthIdentity,
                    "COFFER_OAUTH_PROVIDER",
                    coffer_auth::oidc::identity_hash("https://i", "s", "a"),
                    0
                )
            }),
            c(Effect::SetAuthProxy { enabled: true }),
            c(Effect::PutWebhookEndpoint { endpoint: Named { id: "w1".into(), value: "https://h.example/x".into() } }),
            c(Effect::PutOauth2Credential {
                credential: Named { id: "c1".into(), value: "OAUTH2_PROVIDER_X/cid".into() }
            }),
            c(Effect::RemoveFeature { name: "F".into() }),
            c(Effect::DeleteWallets { ids: vec!["w".into()] }),
            c(Effect::MarkWalletExported { id: "w".into() }),
            Change { organization_id: "sub".into(), effect: Effect::DeleteOrganization },
        ]
    );
}

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const ORG: &str = "org";
/// Two P-256 keys and a secp256k1 key, compressed.
const KEYS: [&str; 3] = [
    "036b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296",
    "0303b68b7daa21027d1b9ca5b7f6bd65aaa8d99573a8d1984d4168291fe9e3059c",
    "0279be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798",
];

/// A store and the authority states built from the same writes' changes, kept in step: each
/// activity runs its real handler, and its records must follow the enclave's transition.
struct Harness {
    _dir: TempDir,
    state: Arc<AppState>,
    states: BTreeMap<String, OrgState>,
}

impl Harness {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("coffer-record-changes-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(&dir.join("coffer.db")).unwrap();
        let custody = crate::custody::Custody::connect_all(vec![crate::custody::transport::EnclaveEndpoint::Unix(
            dir.join("no-enclave.sock"),
        )])
        .unwrap();
        let mut state = crate::custody::in_process::gateway_state(store, custody);
        Arc::get_mut(&mut state).unwrap().webhooks.allow_private_targets = true;
        let mut h = Harness { _dir: TempDir(dir), state, states: BTreeMap::new() };
        let user = |id: &str| {
            Write::InsertUser(User {
                id: id.into(),
                organization_id: ORG.into(),
                name: id.into(),
                email: None,
                phone_number: None,
                contacts_verified: false,
                created_at: 1,
                updated_at: 1,
            })
        };
        let wallet = |id: &str, exported: bool| {
            Write::InsertWallet(Wallet {
                id: id.into(),
                organization_id: ORG.into(),
                name: id.into(),
                exported,
                imported: false,
                sealed_seed: vec![1; 48],
                created_at: 1,
                updated_at: 1,
            })
        };
        let account = |id: &str, wallet_id: &str| crate::store::WalletAccount {
            id: id.into(),
            organization_id: ORG.into(),
            wallet_id: wallet_id.into(),
            curve: "CURVE_SECP256K1".into(),
            path_format: "PATH_FORMAT_BIP32".into(),
            path: format!("m/44'/60'/0'/0/{}", id.len()),
            address_format: "ADDRESS_FORMAT_ETHEREUM".into(),
            address: format!("0x{id}"),
            public_key: "02aa".into(),
            sealed_key: vec![2; 48],
            created_at: 1,
            updated_at: 1,
        };
        let mut root_key = api_key("root-key", vec![], None);
        (root_key.organization_id, root_key.user_id, root_key.public_key) = (ORG.into(), "root".into(), KEYS[0].into());
        h.setup(vec![
            Write::InsertOrganization(Organization {
                id: ORG.into(),
                name: ORG.into(),
                parent_id: None,
                root_quorum_threshold: 1,
                root_user_ids: vec!["root".into()],
                created_at: 1,
                updated_at: 1,
            }),
            user("root"),
            user("member"),
            Write::InsertApiKey(root_key),
            wallet("w-exported", true),
            wallet("w-kept", false),
            Write::InsertAccounts(vec![account("acct-exported", "w-exported"), account("acct-kept", "w-kept")]),
        ]);
        h
    }

    /// Writes the store and the states take without an activity.
    fn setup(&mut self, writes: Vec<Write>) {
        self.state.store.apply(&writes).unwrap();
        self.apply(&of_writes(ORG, &writes));
    }

    fn apply(&mut self, changes: &[Change]) {
        for ch in changes {
            let s = self.states.entry(ch.organization_id.clone()).or_default();
            s.apply(&ch.effect).unwrap_or_else(|e| panic!("{ch:?}: {e}"));
        }
    }

    /// Runs the handler of `path` for `params` in `org`, checks that its records follow the
    /// changes the enclave computes, and commits both; returns the result.
    async fn run(&mut self, org: &str, path: &str, params: Value) -> Value {
        let op = crate::ops::REGISTRY.activity(path).unwrap();
        let body = json!({"type": op.activity_type, "timestampMs": "1", "organizationId": org, "parameters": params});
        let stamped = StampedActivity::parse(body.to_string().as_bytes()).unwrap();
        let store = self.state.store.clone();
        let root = store.user(ORG, "root").unwrap();
        let key = store.api_key(ORG, "root-key").unwrap();
        let ctx = Ctx {
            state: self.state.clone(),
            registry: &crate::ops::REGISTRY,
            org: store.organization(org).unwrap(),
            caller: crate::stamps::Caller {
                user: root,
                credential: crate::stamps::Credential::ApiKey(key),
                public_key: KEYS[0].into(),
                scheme: "SIGNATURE_SCHEME_TK_API_P256",
                signature: String::new(),
                via_parent: false,
                raw_stamp: crate::stamps::RawStamp { header: crate::stamps::X_STAMP, value: String::new() },
            },
            activity_id: uuid::Uuid::new_v4().to_string(),
            now: now_nanos(),
            auth: Default::default(),
            fingerprint: stamped.fingerprint.clone(),
            returned: Default::default(),
        };
        let outcome = (op.handler)(ctx, stamped.parameters.clone()).await.unwrap_or_else(|e| panic!("{path}: {e:?}"));
        let ours = of_writes(org, &outcome.writes);
        let grants: Vec<Grant> = coffer_auth::grants::granted_credentials(&stamped)
            .unwrap()
            .into_iter()
            .map(|g| Grant {
                organization_id: g.organization_id,
                user_id: g.user_id,
                credential_type: g.credential_type,
                public_key: g.public_key,
            })
            .collect();
        let derive = |label: &str, i: usize| derived_id(&stamped.fingerprint, label, i);
        // What the enclave's own work made: a new sub-organization's addresses (here the
        // handler's, from its CreateWallet call), the auth proxy's key.
        let wallet_addresses: Vec<String> =
            sub_organization_accounts(org, &outcome.writes).map(|a| a.address.clone()).collect();
        let issued = outcome.writes.iter().any(|w| matches!(w, Write::InsertApiKey(k) if !k.certificate.is_empty()));
        let input = Input {
            state: &self.states[org],
            activity_type: op.activity_type,
            params: &stamped.parameters,
            now_ms: now_nanos() / 1_000_000,
            derive_id: &derive,
            grants: &grants,
            wallet_addresses: &wallet_addresses,
            auth_proxy_key_issued: issued,
        };
        let expected = transition::expected(&input).unwrap_or_else(|e| panic!("{path}: {e}"));
        // The result names what the changes made as the enclave checks it before linking.
        for (at, value) in transition::made_ids(op.activity_type, &expected) {
            assert_eq!(outcome.result.pointer(at), Some(&value), "{path}: {at} of {}", outcome.result);
        }
        if let Err(n) = follows(&ours, &expected, 0) {
            panic!("{path}: change {n} differs\nours: {ours:#?}\nexpected: {expected:#?}");
        }
        assert_eq!(transition::known(op.activity_type), !ours.is_empty(), "{path}");
        store.apply(&outcome.writes).unwrap();
        self.apply(&ours);
        outcome.result
    }
}

fn key(n: usize) -> Value {
    json!({"apiKeyName": format!("k{n}"), "publicKey": KEYS[n].to_uppercase(), "curveType": "API_KEY_CURVE_P256"})
}

#[tokio::test]
async fn the_handlers_records_follow_the_transitions() {
    let mut h = Harness::new();
    let tag = h.run(ORG, "create_user_tag", json!({"userTagName": "ops", "userIds": ["member"]})).await["userTagId"]
        .as_str()
        .unwrap()
        .to_string();
    let claims = json!({"iss": "https://issuer.example", "sub": "s1", "aud": "app"});
    let users = h
        .run(
            ORG,
            "create_users",
            json!({"users": [
                {"userName": "alice", "userEmail": "alice@x.io", "userTags": [tag, tag],
                 "apiKeys": [key(1)], "oauthProviders": [{"providerName": "g", "oidcClaims": claims}]},
                {"userName": "bob", "userPhoneNumber": "+13214567890"},
            ]}),
        )
        .await;
    let alice = users["userIds"][0].as_str().unwrap().to_string();
    assert!(h.states[ORG].users[&alice].tag_ids.contains(&tag));
    let api_keys = h
        .run(
            ORG,
            "create_api_keys",
            json!({"userId": "member", "apiKeys": [{"apiKeyName": "e", "publicKey": format!("0x{}", KEYS[2]), "curveType": "API_KEY_CURVE_SECP256K1", "expirationSeconds": "3600"}]}),
        )
        .await;
    let key_id = api_keys["apiKeyIds"][0].as_str().unwrap().to_string();
    h.run(ORG, "delete_api_keys", json!({"userId": "member", "apiKeyIds": [key_id, key_id]})).await;
    let claims2 = json!({"iss": "https://issuer.example", "sub": "s2", "aud": "app"});
    let providers = h
        .run(
            ORG,
            "create_oauth_providers",
            json!({"userId": "member", "oauthProviders": [{"providerName": "g", "oidcClaims": claims2}]}),
        )
        .await;
    h.run(ORG, "delete_oauth_providers", json!({"userId": "member", "providerIds": providers["providerIds"]})).await;
    h.run(ORG, "update_user", json!({"userId": alice, "userName": "Alice", "userEmail": "", "userTagIds": []})).await;
    h.run(ORG, "update_user_name", json!({"userId": alice, "userName": "Alice B."})).await;
    h.run(
        ORG,
        "create_api_only_users",
        json!({"apiOnlyUsers": [{"userName": "ci", "userEmail": "ci@example.com", "userTags": [],
            "apiKeys": [{"apiKeyName": "deploy", "publicKey": "028e533b6fa0bf7b4625bb30667c01fb607ef9f8b8a80fef5b300628703187b2a3", "expirationSeconds": "3600"}]}]}),
    )
    .await;
    h.run(ORG, "update_organization_name", json!({"organizationName": "renamed"})).await;
    h.run(ORG, "update_user_email", json!({"userId": alice, "userEmail": "alice@example.com"})).await;
    h.run(ORG, "update_user_phone_number", json!({"userId": alice, "userPhoneNumber": "+14155550100"})).await;
    h.run(ORG, "update_user_email", json!({"userId": alice, "userEmail": ""})).await;
    // A verification token (the enclave checks it before the transition) verifies the new contact
    // when the other one is absent.
    h.run(
        ORG,
        "update_user_phone_number",
        json!({"userId": alice, "userPhoneNumber": "+14155550101", "verificationToken": "t"}),
    )
    .await;
    assert!(h.states[ORG].users[alice.as_str()].contacts_verified);
    h.run(
        ORG,
        "update_user_tag",
        json!({"userTagId": tag, "newUserTagName": "ops2", "addUserIds": [alice], "removeUserIds": ["member"]}),
    )
    .await;

    let policy = h
        .run(
            ORG,
            "create_policy",
            json!({"policyName": "p", "effect": "EFFECT_ALLOW", "condition": "activity.resource == 'WALLET'", "notes": ""}),
        )
        .await["policyId"]
        .as_str()
        .unwrap()
        .to_string();
    h.run(ORG, "update_policy", json!({"policyId": policy, "policyEffect": "EFFECT_DENY", "policyConsensus": ""}))
        .await;
    let more = h
        .run(
            ORG,
            "create_policies",
            json!({"policies": [
                {"policyName": "q", "effect": "EFFECT_ALLOW", "notes": ""},
                {"policyName": "r", "effect": "EFFECT_DENY", "condition": "true", "notes": "", "time": ""},
            ]}),
        )
        .await;
    h.run(ORG, "delete_policies", json!({"policyIds": more["policyIds"]})).await;
    h.run(ORG, "delete_policy", json!({"policyId": policy})).await;

    let interface = h
        .run(
            ORG,
            "create_smart_contract_interface",
            json!({"smartContractAddress": "0xAbC", "smartContractInterface": "[]", "type": "SMART_CONTRACT_INTERFACE_TYPE_ETHEREUM", "label": "l"}),
        )
        .await;
    h.run(
        ORG,
        "delete_smart_contract_interface",
        json!({"smartContractInterfaceId": interface["smartContractInterfaceId"]}),
    )
    .await;
    let endpoint = h.run(ORG, "create_webhook_endpoint", json!({"url": "https://127.0.0.1/a", "name": "n"})).await;
    let endpoint_id = endpoint["endpointId"].clone();
    h.run(ORG, "update_webhook_endpoint", json!({"endpointId": endpoint_id, "name": "m"})).await;
    h.run(ORG, "update_webhook_endpoint", json!({"endpointId": endpoint_id, "url": "https://127.0.0.1/b"})).await;
    h.run(ORG, "delete_webhook_endpoint", json!({"endpointId": endpoint_id})).await;

    h.run(
        ORG,
        "set_organization_feature",
        json!({"name": "FEATURE_NAME_WEBAUTHN_ORIGINS", "value": "https://a.example"}),
    )
    .await;
    h.run(ORG, "remove_organization_feature", json!({"name": "FEATURE_NAME_WEBAUTHN_ORIGINS"})).await;
    h.run(ORG, "set_ip_allowlist", json!({"rules": [{"cidr": "10.0.0.0/8", "label": "office"}], "enabled": true}))
        .await;
    h.run(ORG, "set_ip_allowlist", json!({"publicKey": KEYS[0], "rules": [{"cidr": "2001:db8::/32"}]})).await;
    // Enabled stays as it was when the body leaves it out.
    h.run(ORG, "set_ip_allowlist", json!({"rules": [], "onEvaluationError": "ALLOW"})).await;
    assert!(h.states[ORG].organization.ip_allowlists[""].enabled);
    h.run(ORG, "remove_ip_allowlist", json!({"publicKey": KEYS[0]})).await;
    h.run(ORG, "remove_ip_allowlist", json!({})).await;
    let profile = h
        .run(
            ORG,
            "create_session_profile",
            json!({"sessionProfileName": "signer", "scope": "activity.action == 'SIGN'", "expirationSeconds": "60"}),
        )
        .await;
    let id = profile["sessionProfileId"].as_str().unwrap();
    assert_eq!(h.states[ORG].organization.session_profiles[id].expiration_seconds, Some(60));
    assert!(h.states[ORG].organization.ip_allowlists.is_empty());
    let invitation = |email: &str, access: &str| {
        json!({"receiverUserName": "grace", "receiverUserEmail": email, "receiverUserTags": [],
            "accessType": access, "senderUserId": "root"})
    };
    let invited = h
        .run(
            ORG,
            "create_invitations",
            json!({"invitations": [invitation("g@x.io", "ACCESS_TYPE_API"), invitation("h@x.io", "ACCESS_TYPE_ALL")]}),
        )
        .await;
    let (first, second) = (invited["invitationIds"][0].clone(), invited["invitationIds"][1].clone());
    // 2G of P-256, a key no one in the organization has.
    let brought = "037cf27b188d034f7e8a52380304b51ac3c08969e277f21b35a60b48fc47669978";
    let accepted = h
        .run(
            ORG,
            "accept_invitation",
            json!({"invitationId": first, "userId": "", "encryptedOtpBundle": "{}",
                "apiKey": {"apiKeyName": "grace", "publicKey": brought}}),
        )
        .await;
    let grace = accepted["userId"].as_str().unwrap();
    assert!(h.states[ORG].users[grace].contacts_verified);
    h.run(ORG, "delete_invitation", json!({"invitationId": second})).await;
    assert!(h.states[ORG].organization.invitations.is_empty(), "accepted and revoked invitations go");
    h.run(ORG, "update_wallet", json!({"walletId": "w-kept", "walletName": "kept, renamed"})).await;
    h.run(ORG, "delete_wallet_accounts", json!({"walletAccountIds": ["acct-exported"]})).await;
    h.run(ORG, "delete_wallet_accounts", json!({"walletAccountIds": ["acct-kept"], "deleteWithoutExport": true})).await;
    h.run(ORG, "delete_wallets", json!({"walletIds": ["w-exported"]})).await;
    h.run(ORG, "delete_wallets", json!({"walletIds": ["w-kept"], "deleteWithoutExport": true})).await;
    h.run(ORG, "delete_user_tags", json!({"userTagIds": [tag]})).await;
    h.run(ORG, "delete_users", json!({"userIds": [users["userIds"][1]]})).await;
    h.run(ORG, "update_root_quorum", json!({"threshold": "1", "userIds": ["root", alice]})).await;
    assert_eq!(h.states[ORG].organization.root_user_ids, vec!["root".to_string(), alice.clone()]);

    // A sub-organization with root users of its own, created here and deleted from inside.
    let claims3 = json!({"iss": "https://issuer.example", "sub": "s3", "aud": "app"});
    let sub = h
        .run(
            ORG,
            "create_sub_organization",
            json!({
                "subOrganizationName": "sub",
                "rootQuorumThreshold": 2,
                "rootUsers": [
                    {"userName": "carol", "apiKeys": [key(1)]},
                    {"userName": "dave", "userEmail": "d@x.io", "oauthProviders": [{"providerName": "g", "oidcClaims": claims3}]},
                ],
                "disableSmsAuth": true,
            }),
        )
        .await;
    let sub_id = sub["subOrganizationId"].as_str().unwrap().to_string();
    let s = &h.states[&sub_id];
    assert_eq!(s.organization.parent_id.as_deref(), Some(ORG));
    assert_eq!((s.users.len(), s.credentials.len(), s.organization.features.len()), (2, 2, 3));
    h.run(&sub_id, "delete_sub_organization", json!({})).await;
    assert!(h.states[&sub_id].users.is_empty());
}

/// The records follow the enclave's changes only when they are the same, in the same order; an
/// API key's expiry may differ by a minute (two clocks), not more, and not from none; the
/// credentials the enclave issued itself (last) are left out.
#[test]
fn records_follow_only_the_changes_the_enclave_applied() {
    let key = |expires_at_ms| Change {
        organization_id: "o".into(),
        effect: Effect::AddCredential {
            credential: Credential {
                id: "k".into(),
                user_id: "u".into(),
                kind: CredentialKind::ApiKey,
                credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
                public_key: "02ab".into(),
                expires_at_ms,
            },
        },
    };
    let flag = Change { organization_id: "o".into(), effect: Effect::SetAuthProxy { enabled: true } };
    let ours = vec![key(100_000), flag.clone()];
    assert_eq!(follows(&ours, &ours, 0), Ok(()));
    assert_eq!(follows(&ours, &[key(150_000), flag.clone()], 0), Ok(()));
    assert_eq!(follows(&ours, &[key(170_001), flag.clone()], 0), Err(0));
    assert_eq!(follows(&[key(0), flag.clone()], &[key(30_000), flag.clone()], 0), Err(0));
    assert_eq!(follows(&ours, &[flag.clone(), key(100_000)], 0), Err(0));
    assert_eq!(follows(&ours, &ours[..1], 0), Err(1));
    assert_eq!(follows(&ours[..1], &ours, 0), Err(1));
    assert_eq!(follows(&ours[..1], &ours, 1), Ok(()));
    let mut elsewhere = key(100_000);
    elsewhere.organization_id = "x".into();
    assert_eq!(follows(&ours, &[elsewhere, flag], 0), Err(0));
}
