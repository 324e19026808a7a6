//! End to end: organization features, the root quorum (root-quorum-only activities, threshold
//! above one waits for consensus), `get_organization` and `get_organization_configs`, and a body
//! stamped by `coffer-gateway stamp` (the README's curl).

use coffer_tests::{refused, refused_raw, Stack};
use serde_json::{json, Value};
use turnkey_client::generated::external::data::v1::Quorum;
use turnkey_client::generated::immutable::activity::v1::ActivityStatus;
use turnkey_client::generated::immutable::common::v1::{
    AddressFormat, ApiKeyCurve, Curve, Effect, FeatureName, PathFormat,
};
use turnkey_client::generated::immutable::data::v1::Feature;
use turnkey_client::generated::{
    ApiKeyParamsV2, ApproveActivityIntent, CreatePolicyIntentV3, CreateUsersIntentV4, CreateWalletIntent,
    GetActivityRequest, GetOrganizationConfigsRequest, GetOrganizationResponse, RemoveOrganizationFeatureIntent,
    SetOrganizationFeatureIntent, UpdateRootQuorumIntent, UserParamsV4, WalletAccountParams,
};
use turnkey_client::{TurnkeyClient, TurnkeyClientError, TurnkeyP256ApiKey};

type Client = TurnkeyClient<TurnkeyP256ApiKey>;

const UNKNOWN_ID: &str = "00000000-0000-4000-8000-000000000000";

fn feature(name: FeatureName, value: &str) -> Feature {
    Feature { name, value: Some(value.into()) }
}

/// Creates the non-root user "alice" with one P-256 API key, `key`; answers her id.
async fn alice_with_key(root: &Client, org: &str, key: &TurnkeyP256ApiKey) -> String {
    let params = UserParamsV4 {
        user_name: "alice".into(),
        user_email: None,
        user_phone_number: None,
        api_keys: vec![ApiKeyParamsV2 {
            api_key_name: "alice".into(),
            public_key: hex::encode(key.compressed_public_key()),
            curve_type: ApiKeyCurve::P256,
            expiration_seconds: None,
        }],
        authenticators: vec![],
        oauth_providers: vec![],
        user_tags: vec![],
    };
    let created = root.create_users(org.into(), root.current_timestamp(), CreateUsersIntentV4 { users: vec![params] });
    created.await.unwrap().result.user_ids[0].clone()
}

async fn configs(c: &Client, org: &str) -> (Vec<Feature>, Quorum) {
    let cfg = c
        .get_organization_configs(GetOrganizationConfigsRequest { organization_id: org.into() })
        .await
        .unwrap()
        .configs
        .unwrap();
    (cfg.features, cfg.quorum.unwrap())
}

async fn set(c: &Client, org: &str, name: FeatureName, value: &str) -> Result<Vec<Feature>, TurnkeyClientError> {
    let intent = SetOrganizationFeatureIntent { name, value: Some(value.into()) };
    c.set_organization_feature(org.into(), c.current_timestamp(), intent).await.map(|r| r.result.features)
}

async fn remove(c: &Client, org: &str, name: FeatureName) -> Result<Vec<Feature>, TurnkeyClientError> {
    let intent = RemoveOrganizationFeatureIntent { name };
    c.remove_organization_feature(org.into(), c.current_timestamp(), intent).await.map(|r| r.result.features)
}

async fn quorum(c: &Client, org: &str, threshold: i32, user_ids: &[&str]) -> Result<(), TurnkeyClientError> {
    let intent = UpdateRootQuorumIntent { threshold, user_ids: user_ids.iter().map(|s| s.to_string()).collect() };
    c.update_root_quorum(org.into(), c.current_timestamp(), intent).await.map(|_| ())
}

fn q(threshold: i32, user_ids: &[&str]) -> Quorum {
    Quorum { threshold, user_ids: user_ids.iter().map(|s| s.to_string()).collect() }
}

#[tokio::test]
async fn features_set_override_remove() {
    let stack = Stack::start().await;
    let c = stack.client();
    let org = stack.organization_id.clone();

    let (features, quorum0) = configs(&c, &org).await;
    assert!(features.is_empty());
    assert_eq!(quorum0, q(1, &[&stack.user_id]));

    assert_eq!(set(&c, &org, FeatureName::EmailAuth, "").await.unwrap(), [feature(FeatureName::EmailAuth, "")]);
    let origins = "https://app.example.com,https://admin.example.com";
    let both = [feature(FeatureName::EmailAuth, ""), feature(FeatureName::WebauthnOrigins, origins)];
    assert_eq!(set(&c, &org, FeatureName::WebauthnOrigins, origins).await.unwrap(), both);
    assert_eq!(configs(&c, &org).await.0, both);

    // Setting again overrides the value in place.
    let overridden = [feature(FeatureName::EmailAuth, "disabled"), feature(FeatureName::WebauthnOrigins, origins)];
    assert_eq!(set(&c, &org, FeatureName::EmailAuth, "disabled").await.unwrap(), overridden);
    assert_eq!(configs(&c, &org).await.0, overridden);

    // Refusals change nothing. (The oracle sees the three settings above.)
    let activities = stack.activity_count(&stack.api_key(), &org).await;
    assert_eq!(activities, 3);
    refused(set(&c, &org, FeatureName::Unspecified, "x").await, 400, "REQUEST_INVALID", "invalid feature name");
    refused(
        remove(&c, &org, FeatureName::Webhook).await,
        404,
        "REQUEST_INVALID",
        "organization feature not set: FEATURE_NAME_WEBHOOK",
    );
    let body = json!({
        "type": "ACTIVITY_TYPE_SET_ORGANIZATION_FEATURE",
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org,
        "parameters": {"name": "FEATURE_NAME_TELEPORT", "value": "on"},
    })
    .to_string();
    let r = stack.post_raw("/public/v1/submit/set_organization_feature", body.as_bytes(), Some(&stack.api_key())).await;
    refused_raw(&r, 400, "REQUEST_INVALID", "invalid feature name");
    assert_eq!(r.json["message"], "invalid feature name: \"FEATURE_NAME_TELEPORT\"");
    assert_eq!(configs(&c, &org).await.0, overridden);
    assert_eq!(stack.activity_count(&stack.api_key(), &org).await, activities);

    // Remove returns what is left.
    assert_eq!(
        remove(&c, &org, FeatureName::EmailAuth).await.unwrap(),
        [feature(FeatureName::WebauthnOrigins, origins)]
    );
    assert_eq!(configs(&c, &org).await, (vec![feature(FeatureName::WebauthnOrigins, origins)], quorum0));

    // Another organization's features are its own: it does not see these, and whatever it does
    // cannot change them.
    let kp = stack.gateway_cli(&["keygen"]);
    let (pub_b, priv_b) = (kp["apiPublicKey"].as_str().unwrap(), kp["apiPrivateKey"].as_str().unwrap());
    let org_b = stack.gateway_cli(&["init-org", "--name", "org-b", "--api-public-key", pub_b])["organizationId"]
        .as_str()
        .unwrap()
        .to_string();
    let b = stack.client_with(TurnkeyP256ApiKey::from_strings(priv_b, Some(pub_b)).unwrap());
    assert!(configs(&b, &org_b).await.0.is_empty());
    assert_eq!(set(&b, &org_b, FeatureName::Webhook, "b").await.unwrap(), [feature(FeatureName::Webhook, "b")]);
    assert_eq!(
        set(&b, &org_b, FeatureName::WebauthnOrigins, "https://b.example").await.unwrap(),
        [feature(FeatureName::Webhook, "b"), feature(FeatureName::WebauthnOrigins, "https://b.example")]
    );
    assert_eq!(configs(&c, &org).await.0, [feature(FeatureName::WebauthnOrigins, origins)]);
    refused(remove(&b, &org_b, FeatureName::EmailAuth).await, 404, "REQUEST_INVALID", "organization feature not set");
}

#[tokio::test]
async fn features_with_the_same_name_in_two_organizations() {
    let stack = Stack::start().await;
    let c = stack.client();
    let org = stack.organization_id.clone();
    set(&c, &org, FeatureName::EmailAuth, "a").await.unwrap();
    let kp = stack.gateway_cli(&["keygen"]);
    let (pub_b, priv_b) = (kp["apiPublicKey"].as_str().unwrap(), kp["apiPrivateKey"].as_str().unwrap());
    let org_b = stack.gateway_cli(&["init-org", "--name", "org-b", "--api-public-key", pub_b])["organizationId"]
        .as_str()
        .unwrap()
        .to_string();
    let b = stack.client_with(TurnkeyP256ApiKey::from_strings(priv_b, Some(pub_b)).unwrap());
    assert_eq!(set(&b, &org_b, FeatureName::EmailAuth, "b").await.unwrap(), [feature(FeatureName::EmailAuth, "b")]);
    assert_eq!(configs(&c, &org).await.0, [feature(FeatureName::EmailAuth, "a")]);
}

#[tokio::test]
async fn root_quorum_end_to_end() {
    let stack = Stack::start().await;
    let root = stack.client();
    let org = stack.organization_id.clone();
    let root_id = stack.user_id.clone();

    // Threshold validation; nothing changes.
    refused(
        quorum(&root, &org, 0, &[&root_id]).await,
        400,
        "REQUEST_INVALID",
        "quorum threshold must be non-zero integer",
    );
    refused(
        quorum(&root, &org, -1, &[&root_id]).await,
        400,
        "REQUEST_INVALID",
        "quorum threshold must be non-zero integer",
    );
    refused(
        quorum(&root, &org, 2, &[&root_id]).await,
        400,
        "REQUEST_INVALID",
        "quorum threshold must be non-zero integer",
    );
    refused(quorum(&root, &org, 1, &[]).await, 400, "REQUEST_INVALID", "quorum threshold must be non-zero integer");
    refused(quorum(&root, &org, 1, &[&root_id, UNKNOWN_ID]).await, 404, "REQUEST_INVALID", "user not found");
    refused(quorum(&root, &org, 1, &[&root_id, &root_id]).await, 400, "REQUEST_INVALID", "duplicate user id");
    assert_eq!(configs(&root, &org).await.1, q(1, &[&root_id]));
    assert_eq!(stack.activity_count(&stack.api_key(), &org).await, 0);

    // Threshold 1 with the existing root user: the root user's own vote runs it (and the
    // oracle above sees it: one activity).
    quorum(&root, &org, 1, &[&root_id]).await.unwrap();
    assert_eq!(configs(&root, &org).await.1, q(1, &[&root_id]));
    assert_eq!(stack.activity_count(&stack.api_key(), &org).await, 1);

    // A second user (not root yet) may not submit root-quorum-only activities.
    let alice_key = TurnkeyP256ApiKey::generate();
    let alice_id = alice_with_key(&root, &org, &alice_key).await;
    let alice = stack.client_with(alice_key);
    let before = stack.activity_count(&stack.api_key(), &org).await;
    assert_eq!(before, 2, "the quorum update and alice's creation");
    refused(
        set(&alice, &org, FeatureName::EmailAuth, "x").await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "request not authorized",
    );
    refused(
        remove(&alice, &org, FeatureName::EmailAuth).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "request not authorized",
    );
    refused(quorum(&alice, &org, 1, &[&alice_id]).await, 403, "REQUEST_NOT_AUTHORIZED", "request not authorized");
    assert_eq!(stack.activity_count(&stack.api_key(), &org).await, before);
    assert_eq!(configs(&root, &org).await, (vec![], q(1, &[&root_id])));

    // Two root users, threshold 2.
    quorum(&root, &org, 2, &[&root_id, &alice_id]).await.unwrap();
    assert_eq!(configs(&root, &org).await.1, q(2, &[&root_id, &alice_id]));

    // Now one vote is not enough: the activity is recorded as waiting, with the submitter's
    // vote and no result, and nothing changed.
    let waiting = match set(&root, &org, FeatureName::EmailAuth, "on").await {
        Err(TurnkeyClientError::ActivityRequiresApproval(id)) => id,
        other => panic!("expected ActivityRequiresApproval, got {other:?}"),
    };
    let a = root
        .get_activity(GetActivityRequest { organization_id: org.clone(), activity_id: waiting.clone() })
        .await
        .unwrap()
        .activity
        .unwrap();
    assert_eq!(a.status, ActivityStatus::ConsensusNeeded);
    assert!(a.result.as_ref().and_then(|r| r.inner.as_ref()).is_none(), "{:?}", a.result);
    assert_eq!(a.votes.len(), 1);
    assert_eq!(a.votes[0].user_id, root_id);
    assert!(configs(&root, &org).await.0.is_empty());

    // Either root user alone; every root-quorum-only activity waits the same way.
    assert!(matches!(
        set(&alice, &org, FeatureName::EmailAuth, "on").await,
        Err(TurnkeyClientError::ActivityRequiresApproval(_))
    ));
    assert!(matches!(quorum(&root, &org, 1, &[&root_id]).await, Err(TurnkeyClientError::ActivityRequiresApproval(_))));
    assert!(matches!(
        remove(&root, &org, FeatureName::EmailAuth).await,
        Err(TurnkeyClientError::ActivityRequiresApproval(_))
    ));
    assert_eq!(configs(&root, &org).await, (vec![], q(2, &[&root_id, &alice_id])));

    // Above threshold 1 a lone root is not a quorum for other activities either (spec 12.2):
    // the policy waits for alice's approval; then that allow-all policy lets root act alone.
    let policy = CreatePolicyIntentV3 {
        policy_name: "p".into(),
        effect: Effect::Allow,
        condition: None,
        consensus: None,
        notes: String::new(),
        time: None,
    };
    let waiting = match root.create_policy(org.clone(), root.current_timestamp(), policy).await {
        Err(TurnkeyClientError::ActivityRequiresApproval(id)) => id,
        other => panic!("expected ActivityRequiresApproval, got {other:?}"),
    };
    let fingerprint = root
        .get_activity(GetActivityRequest { organization_id: org.clone(), activity_id: waiting })
        .await
        .unwrap()
        .activity
        .unwrap()
        .fingerprint;
    let approved = alice
        .approve_activity(org.clone(), alice.current_timestamp(), ApproveActivityIntent { fingerprint })
        .await
        .unwrap();
    assert_eq!(approved.status, ActivityStatus::Completed);
    let wallet = CreateWalletIntent {
        wallet_name: "w".into(),
        accounts: vec![WalletAccountParams {
            curve: Curve::Secp256k1,
            path_format: PathFormat::Bip32,
            path: "m/44'/60'/0'/0/0".into(),
            address_format: AddressFormat::Ethereum,
            name: None,
        }],
        mnemonic_length: None,
    };
    let wallet_id = root.create_wallet(org.clone(), root.current_timestamp(), wallet).await.unwrap().result.wallet_id;

    // get_organization: the whole organization, in the shape the official types read.
    let body = json!({"organizationId": org}).to_string();
    let r = stack.post_raw("/public/v1/query/get_organization", body.as_bytes(), Some(&stack.api_key())).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    let data = serde_json::from_value::<GetOrganizationResponse>(r.json.clone()).unwrap().organization_data.unwrap();
    assert_eq!((data.organization_id.as_str(), data.name.as_str()), (org.as_str(), "e2e"));
    assert_eq!(data.root_quorum, Some(q(2, &[&root_id, &alice_id])));
    let mut users: Vec<&str> = data.users.iter().map(|u| u.user_name.as_str()).collect();
    users.sort_unstable();
    assert_eq!(users, ["alice", "root"]);
    assert!(data.users.iter().all(|u| u.api_keys.len() == 1));
    assert_eq!(data.policies.len(), 1);
    assert_eq!((data.policies[0].policy_name.as_str(), data.policies[0].effect), ("p", Effect::Allow));
    assert_eq!(data.wallets.len(), 1);
    assert_eq!(data.wallets[0].wallet_id, wallet_id);
    assert!(data.private_keys.is_empty() && data.features.is_empty() && data.tags.is_empty());
    assert!(data.smart_contract_interface_references.is_empty() && data.invitations.is_empty());
}

/// Every list pages in the database: `paginationOptions` (also accepted on the lists the SDK
/// sends without them) give keyset pages oldest first, and a name check reads one row.
#[tokio::test]
async fn lists_page_with_pagination_options() {
    let stack = Stack::start().await;
    let key = stack.api_key();
    let org = stack.organization_id.clone();
    let post = |path: &'static str, body: Value| {
        let (stack, key) = (&stack, &key);
        async move { stack.post_raw(path, body.to_string().as_bytes(), Some(key)).await }
    };
    let mut wallet_ids = Vec::new();
    for i in 0..4 {
        let body = json!({
            "type": "ACTIVITY_TYPE_CREATE_WALLET",
            "timestampMs": Stack::now_ms().to_string(),
            "organizationId": org,
            "parameters": {"walletName": format!("w{i}"), "accounts": [{
                "curve": "CURVE_SECP256K1", "pathFormat": "PATH_FORMAT_BIP32",
                "path": format!("m/44'/60'/0'/0/{i}"), "addressFormat": "ADDRESS_FORMAT_ETHEREUM"}]},
        });
        let r = post("/public/v1/submit/create_wallet", body.clone()).await;
        assert_eq!(r.status, 200, "{}", r.text);
        wallet_ids.push(r.json["activity"]["result"]["createWalletResult"]["walletId"].as_str().unwrap().to_string());
        if i == 0 {
            // The same name again: refused by the one-row name check, with the name in the message.
            let mut again = body;
            again["timestampMs"] = json!((Stack::now_ms() + 1).to_string());
            again["parameters"]["accounts"][0]["path"] = json!("m/44'/60'/0'/0/9");
            let r = post("/public/v1/submit/create_wallet", again).await;
            refused_raw(&r, 400, "REQUEST_INVALID", "wallet name must be unique: \"w0\"");
        }
    }
    let names = |r: &coffer_tests::RawResponse| -> Vec<String> {
        r.json["wallets"].as_array().unwrap().iter().map(|w| w["walletName"].as_str().unwrap().to_string()).collect()
    };
    let list = |options: Value| {
        post("/public/v1/query/list_wallets", json!({"organizationId": org, "paginationOptions": options}))
    };
    let all = post("/public/v1/query/list_wallets", json!({"organizationId": org})).await;
    assert_eq!(names(&all), ["w0", "w1", "w2", "w3"], "without options: everything up to the maximum page");
    assert_eq!(names(&list(json!({"limit": "2"})).await), ["w0", "w1"]);
    assert_eq!(names(&list(json!({"limit": "2", "after": wallet_ids[1]})).await), ["w2", "w3"]);
    assert_eq!(names(&list(json!({"limit": "2", "before": wallet_ids[3]})).await), ["w1", "w2"]);
    assert_eq!(names(&list(json!({"after": wallet_ids[3]})).await), Vec::<String>::new());
    let r = list(json!({"limit": "1001"})).await;
    refused_raw(&r, 400, "REQUEST_INVALID", "invalid pagination limit: must be a string from \"1\" to \"1000\"");

    // Accounts across wallets, in wallet order, paged the way the SDK pages them.
    let accounts = |options: Value| {
        post("/public/v1/query/list_wallet_accounts", json!({"organizationId": org, "paginationOptions": options}))
    };
    let first = accounts(json!({"limit": "3"})).await;
    let paths: Vec<&str> =
        first.json["accounts"].as_array().unwrap().iter().map(|a| a["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["m/44'/60'/0'/0/0", "m/44'/60'/0'/0/1", "m/44'/60'/0'/0/2"], "{}", first.text);
    let last_id = first.json["accounts"][2]["walletAccountId"].as_str().unwrap().to_string();
    let rest = accounts(json!({"after": last_id})).await;
    assert_eq!(rest.json["accounts"].as_array().unwrap().len(), 1, "{}", rest.text);
    assert_eq!(rest.json["accounts"][0]["walletId"], wallet_ids[3].as_str());
    let r = accounts(json!({"limit": "101"})).await;
    // The SDK's paged lists keep the spec's maximum of 100.
    refused_raw(&r, 400, "REQUEST_INVALID", "invalid pagination limit: must be a string from \"1\" to \"100\"");

    // The users list takes the same options.
    let r =
        post("/public/v1/query/list_users", json!({"organizationId": org, "paginationOptions": {"limit": "1"}})).await;
    assert_eq!(r.json["users"].as_array().unwrap().len(), 1, "{}", r.text);
    assert_eq!(r.json["users"][0]["userId"], stack.user_id.as_str());
    assert_eq!(r.json["users"][0]["apiKeys"].as_array().unwrap().len(), 1, "{}", r.text);
}

/// `coffer-gateway stamp` makes the `X-Stamp` a hand-made request needs (README's curl): the body
/// it stamped is answered; another body under the same stamp is refused.
#[tokio::test]
async fn a_body_stamped_by_the_stamp_command_is_answered_and_no_other() {
    let stack = Stack::start().await;
    let key_file = stack.dir.join("stamp-command.key");
    std::fs::write(&key_file, format!("{}\n", stack.api_private_key)).unwrap();
    let body = serde_json::json!({ "organizationId": stack.organization_id }).to_string();
    let out = stack.run_with_stdin("coffer-gateway", &["stamp", "--api-key-file", key_file.to_str().unwrap()], &body);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stamp = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let post = |body: String| {
        let (url, stamp) = (format!("{}/public/v1/query/whoami", stack.base_url), stamp.clone());
        async move { reqwest::Client::new().post(url).header("X-Stamp", stamp).body(body).send().await.unwrap() }
    };
    let answered = post(body.clone()).await;
    assert_eq!(answered.status(), 200);
    let whoami: serde_json::Value = answered.json().await.unwrap();
    assert_eq!(whoami["organizationId"], stack.organization_id.as_str());
    assert_eq!(whoami["userId"], stack.user_id.as_str());
    let other = serde_json::json!({ "organizationId": stack.organization_id, "x": 1 }).to_string();
    let refused = post(other).await;
    assert_eq!(refused.status(), 401, "a stamp stands for the body it stamped only");
    let refused: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(refused["message"], "could not verify api key signature", "{refused}");
    let _ = std::fs::remove_file(&key_file);
}

#[tokio::test]
async fn the_organization_is_renamed_by_its_root_quorum_only() {
    use turnkey_client::generated::GetWhoamiRequest;
    let stack = Stack::start().await;
    let root = stack.client();
    let org = stack.organization_id.clone();
    async fn rename(
        c: &Client,
        org: &str,
        name: &str,
    ) -> Result<
        turnkey_client::ActivityResult<turnkey_client::generated::UpdateOrganizationNameResult>,
        TurnkeyClientError,
    > {
        let intent = turnkey_client::generated::UpdateOrganizationNameIntent { organization_name: name.into() };
        c.update_organization_name(org.to_string(), c.current_timestamp(), intent).await
    }
    let renamed = rename(&root, &org, "Acme treasury").await.unwrap().result;
    assert_eq!((renamed.organization_id.as_str(), renamed.organization_name.as_str()), (org.as_str(), "Acme treasury"));
    let name = || async {
        root.get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await.unwrap().organization_name
    };
    assert_eq!(name().await, "Acme treasury");
    refused(rename(&root, &org, "  ").await, 400, "REQUEST_INVALID", "organizationName must not be empty");

    // A non-root user may not, even with a policy that allows her everything.
    let alice_key = TurnkeyP256ApiKey::generate();
    let alice_id = alice_with_key(&root, &org, &alice_key).await;
    let everything = CreatePolicyIntentV3 {
        policy_name: "alice may".into(),
        effect: Effect::Allow,
        condition: Some("true".into()),
        consensus: Some(format!("approvers.any(user, user.id == '{alice_id}')")),
        notes: String::new(),
        time: None,
    };
    root.create_policy(org.clone(), root.current_timestamp(), everything).await.unwrap();
    let alice = stack.client_with(alice_key);
    refused(rename(&alice, &org, "Alice's now").await, 403, "REQUEST_NOT_AUTHORIZED", "request not authorized");
    assert_eq!(name().await, "Acme treasury");
}
