//! End to end: policies (create, batch create, update, delete, read; expressions validated at
//! write time) and smart contract interfaces, through the official Rust client.

use coffer_tests::{refused, refused_raw, Stack};
use serde_json::{json, Value};
use sha2::Digest;
use turnkey_client::generated::external::data::v1::{Policy, Timestamp};
use turnkey_client::generated::immutable::common::v1::{Effect, SmartContractInterfaceType};
use turnkey_client::generated::{
    CreatePoliciesIntent, CreatePolicyIntentV3, CreateSmartContractInterfaceIntent, DeletePoliciesIntent,
    DeletePolicyIntent, DeleteSmartContractInterfaceIntent, GetPoliciesRequest, GetPolicyRequest,
    GetSmartContractInterfaceRequest, GetSmartContractInterfacesRequest, UpdatePolicyIntentV2,
};
use turnkey_client::{TurnkeyClient, TurnkeyClientError, TurnkeyP256ApiKey};

const UNKNOWN_ID: &str = "00000000-0000-4000-8000-000000000000";
const MAX_INTERFACE: usize = 409_600;

type Client = TurnkeyClient<TurnkeyP256ApiKey>;

fn intent(name: &str, effect: Effect, condition: Option<&str>, consensus: Option<&str>) -> CreatePolicyIntentV3 {
    CreatePolicyIntentV3 {
        policy_name: name.into(),
        effect,
        condition: condition.map(String::from),
        consensus: consensus.map(String::from),
        notes: format!("notes of {name}"),
        time: None,
    }
}

async fn policies(c: &Client, org: &str) -> Vec<Policy> {
    c.get_policies(GetPoliciesRequest { organization_id: org.into() }).await.unwrap().policies
}

async fn policy(c: &Client, org: &str, id: &str) -> Result<Policy, TurnkeyClientError> {
    c.get_policy(GetPolicyRequest { organization_id: org.into(), policy_id: id.into() })
        .await
        .map(|r| r.policy.unwrap())
}

fn names(list: &[Policy]) -> Vec<&str> {
    list.iter().map(|p| p.policy_name.as_str()).collect()
}

/// Submits `parameters` as raw JSON (for values the typed client cannot express).
async fn submit_raw(stack: &Stack, path: &str, ty: &str, parameters: Value) -> coffer_tests::RawResponse {
    let body = json!({
        "type": ty,
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": stack.organization_id,
        "parameters": parameters,
    })
    .to_string();
    stack.post_raw(&format!("/public/v1/submit/{path}"), body.as_bytes(), Some(&stack.api_key())).await
}

fn ts(t: &Option<Timestamp>) -> (u64, u64) {
    let t = t.as_ref().expect("timestamp");
    (t.seconds.parse().unwrap(), t.nanos.parse().unwrap())
}

#[tokio::test]
async fn policies_end_to_end() {
    let stack = Stack::start().await;
    let c = stack.client();
    let org = stack.organization_id.clone();
    let consensus = format!("approvers.any(user, user.id == '{}')", stack.user_id);
    let condition = "eth.tx.to == '0x08d2b0a37F869FF76BACB5Bab3278E26ab7067B7' && eth.tx.data[0..10] == '0xa9059cbb'";

    // Create and read back.
    let first = c
        .create_policy(
            org.clone(),
            c.current_timestamp(),
            intent("allow-usdc", Effect::Allow, Some(condition), Some(&consensus)),
        )
        .await
        .unwrap();
    let first_id = first.result.policy_id.clone();
    let p = policy(&c, &org, &first_id).await.unwrap();
    assert_eq!(
        (p.policy_id.as_str(), p.policy_name.as_str(), p.effect),
        (first_id.as_str(), "allow-usdc", Effect::Allow)
    );
    assert_eq!(p.condition.as_deref(), Some(condition));
    assert_eq!(p.consensus.as_deref(), Some(consensus.as_str()));
    assert_eq!((p.notes.as_str(), p.time.as_deref()), ("notes of allow-usdc", None));
    assert_eq!(ts(&p.created_at), ts(&p.updated_at));

    // Absent expressions are empty (always true); a time window is kept.
    let mut deny = intent("deny-noop", Effect::Deny, None, None);
    deny.notes = String::new();
    deny.time = Some("time.now < Timestamp('2030-01-01T00:00:00Z')".into());
    let second_id = c.create_policy(org.clone(), c.current_timestamp(), deny).await.unwrap().result.policy_id;
    let p = policy(&c, &org, &second_id).await.unwrap();
    assert_eq!((p.effect, p.notes.as_str()), (Effect::Deny, ""));
    assert_eq!((p.condition.as_deref(), p.consensus.as_deref()), (Some(""), Some("")));
    assert_eq!(p.time.as_deref(), Some("time.now < Timestamp('2030-01-01T00:00:00Z')"));
    assert_eq!(names(&policies(&c, &org).await), ["allow-usdc", "deny-noop"]);
    let activities = stack.activity_count(&stack.api_key(), &org).await;
    assert_eq!(activities, 2);

    // Refusals record nothing.
    let ts_now = || c.current_timestamp();
    refused(
        c.create_policy(org.clone(), ts_now(), intent("allow-usdc", Effect::Deny, None, None)).await,
        400,
        "REQUEST_INVALID",
        "policy label must be unique",
    );
    refused(
        c.create_policy(org.clone(), ts_now(), intent("bad-cond", Effect::Allow, Some("foo.bar == 1"), None)).await,
        400,
        "REQUEST_INVALID",
        "invalid policy condition: unknown identifier 'foo'",
    );
    refused(
        c.create_policy(org.clone(), ts_now(), intent("bad-cond", Effect::Allow, Some("(activity.type == 'x'"), None))
            .await,
        400,
        "REQUEST_INVALID",
        "invalid policy condition: missing ')' to close '(' at column 1",
    );
    refused(
        c.create_policy(org.clone(), ts_now(), intent("bad-cond", Effect::Allow, Some("activity.type == \"x\""), None))
            .await,
        400,
        "REQUEST_INVALID",
        "single quotes",
    );
    refused(
        c.create_policy(org.clone(), ts_now(), intent("bad-cons", Effect::Allow, None, Some("wallet.id == 'x'"))).await,
        400,
        "REQUEST_INVALID",
        "invalid policy consensus: unknown identifier 'wallet'",
    );
    refused(
        c.create_policy(org.clone(), ts_now(), intent("bad-effect", Effect::Unspecified, None, None)).await,
        400,
        "REQUEST_INVALID",
        "invalid policy effect",
    );
    let mut bad_time = intent("bad-time", Effect::Allow, None, None);
    bad_time.time = Some("time.now < Timestamp('2030-01-01')".into());
    refused(
        c.create_policy(org.clone(), ts_now(), bad_time).await,
        400,
        "REQUEST_INVALID",
        "invalid policy time: invalid Timestamp",
    );
    let r = submit_raw(
        &stack,
        "create_policy",
        "ACTIVITY_TYPE_CREATE_POLICY_V3",
        json!({"policyName": "raw", "effect": "EFFECT_MAYBE", "notes": ""}),
    )
    .await;
    refused_raw(&r, 400, "REQUEST_INVALID", "invalid policy effect: \"EFFECT_MAYBE\"");
    let r = submit_raw(
        &stack,
        "create_policy",
        "ACTIVITY_TYPE_CREATE_POLICY_V3",
        json!({"policyName": "raw", "effect": "EFFECT_ALLOW"}),
    )
    .await;
    refused_raw(&r, 400, "REQUEST_INVALID", "notes");
    assert_eq!(names(&policies(&c, &org).await), ["allow-usdc", "deny-noop"]);
    assert_eq!(stack.activity_count(&stack.api_key(), &org).await, activities);

    // Batch create: all or nothing.
    let batch = |list: Vec<CreatePolicyIntentV3>| CreatePoliciesIntent { policies: list };
    refused(
        c.create_policies(
            org.clone(),
            ts_now(),
            batch(vec![
                intent("b1", Effect::Allow, Some("activity.resource in ['AUTH', 'OTP']"), None),
                intent("b2", Effect::Allow, None, Some("approvers.count( >= 2")),
            ]),
        )
        .await,
        400,
        "REQUEST_INVALID",
        "invalid policy consensus",
    );
    refused(
        c.create_policies(
            org.clone(),
            ts_now(),
            batch(vec![intent("b1", Effect::Allow, None, None), intent("b1", Effect::Deny, None, None)]),
        )
        .await,
        400,
        "REQUEST_INVALID",
        "policy label must be unique",
    );
    refused(
        c.create_policies(
            org.clone(),
            ts_now(),
            batch(vec![intent("b1", Effect::Allow, None, None), intent("deny-noop", Effect::Deny, None, None)]),
        )
        .await,
        400,
        "REQUEST_INVALID",
        "policy label must be unique",
    );
    refused(
        c.create_policies(org.clone(), ts_now(), batch(vec![])).await,
        400,
        "REQUEST_INVALID",
        "policies must not be empty",
    );
    assert_eq!(names(&policies(&c, &org).await), ["allow-usdc", "deny-noop"]);
    assert_eq!(stack.activity_count(&stack.api_key(), &org).await, activities);
    let created = c
        .create_policies(
            org.clone(),
            ts_now(),
            batch(vec![
                intent("b1", Effect::Allow, Some("activity.resource in ['AUTH', 'OTP']"), None),
                intent("b2", Effect::Allow, None, Some("approvers.filter(u, u.tags.contains('ops')).count() >= 2")),
            ]),
        )
        .await
        .unwrap();
    assert_eq!(created.result.policy_ids.len(), 2);
    let all = policies(&c, &org).await;
    assert_eq!(names(&all), ["allow-usdc", "deny-noop", "b1", "b2"]);
    assert_eq!(all[2].policy_id, created.result.policy_ids[0]);
    assert_eq!(all[3].policy_id, created.result.policy_ids[1]);

    // Update: V2 field names; absent fields keep their values.
    let before = policy(&c, &org, &first_id).await.unwrap();
    let update = |name: Option<&str>, condition: Option<&str>| UpdatePolicyIntentV2 {
        policy_id: first_id.clone(),
        policy_name: name.map(String::from),
        policy_effect: None,
        policy_condition: condition.map(String::from),
        policy_consensus: None,
        policy_notes: None,
        time: None,
    };
    refused(
        c.update_policy(org.clone(), ts_now(), update(Some("b1"), None)).await,
        400,
        "REQUEST_INVALID",
        "policy label must be unique",
    );
    refused(
        c.update_policy(org.clone(), ts_now(), update(None, Some("activity.type =="))).await,
        400,
        "REQUEST_INVALID",
        "invalid policy condition: unexpected end of expression",
    );
    let mut unknown = update(Some("x"), None);
    unknown.policy_id = UNKNOWN_ID.into();
    refused(c.update_policy(org.clone(), ts_now(), unknown).await, 404, "REQUEST_INVALID", "policy not found");
    assert_eq!(policy(&c, &org, &first_id).await.unwrap(), before);

    let mut change = update(Some("allow-usdc-v2"), Some("activity.kind == 'SIGN_TRANSACTION'"));
    change.policy_effect = Some(Effect::Deny);
    change.policy_notes = Some("changed".into());
    let updated = c.update_policy(org.clone(), ts_now(), change).await.unwrap();
    assert_eq!(updated.result.policy_id, first_id);
    let after = policy(&c, &org, &first_id).await.unwrap();
    assert_eq!(
        (after.policy_name.as_str(), after.effect, after.notes.as_str()),
        ("allow-usdc-v2", Effect::Deny, "changed")
    );
    assert_eq!(after.condition.as_deref(), Some("activity.kind == 'SIGN_TRANSACTION'"));
    assert_eq!(after.consensus, before.consensus);
    assert_eq!(after.created_at, before.created_at);
    assert!(ts(&after.updated_at) > ts(&before.updated_at));
    // The old name is free again.
    let reuse = c.create_policy(org.clone(), ts_now(), intent("allow-usdc", Effect::Allow, None, None)).await.unwrap();

    // Delete one, then several; unknown or repeated ids refuse the whole request.
    let deleted =
        c.delete_policy(org.clone(), ts_now(), DeletePolicyIntent { policy_id: second_id.clone() }).await.unwrap();
    assert_eq!(deleted.result.policy_id, second_id);
    refused(policy(&c, &org, &second_id).await, 404, "REQUEST_INVALID", "policy not found");
    refused(
        c.delete_policy(org.clone(), ts_now(), DeletePolicyIntent { policy_id: second_id.clone() }).await,
        404,
        "REQUEST_INVALID",
        "policy not found",
    );
    let ids = created.result.policy_ids.clone();
    refused(
        c.delete_policies(
            org.clone(),
            ts_now(),
            DeletePoliciesIntent { policy_ids: vec![ids[0].clone(), UNKNOWN_ID.into()] },
        )
        .await,
        404,
        "REQUEST_INVALID",
        "policy not found",
    );
    refused(
        c.delete_policies(
            org.clone(),
            ts_now(),
            DeletePoliciesIntent { policy_ids: vec![ids[0].clone(), ids[0].clone()] },
        )
        .await,
        400,
        "REQUEST_INVALID",
        "duplicate policy id",
    );
    assert_eq!(names(&policies(&c, &org).await), ["allow-usdc-v2", "b1", "b2", "allow-usdc"]);
    let deleted =
        c.delete_policies(org.clone(), ts_now(), DeletePoliciesIntent { policy_ids: ids.clone() }).await.unwrap();
    assert_eq!(deleted.result.policy_ids, ids);
    let left = policies(&c, &org).await;
    assert_eq!(names(&left), ["allow-usdc-v2", "allow-usdc"]);
    assert_eq!(left[1].policy_id, reuse.result.policy_id);
    // create, create, create_policies, update, create, delete, delete_policies.
    assert_eq!(stack.activity_count(&stack.api_key(), &org).await, 7);
    active_policies(&c, &org).await;
}

/// `get_active_policies`: a policy whose time window is over is inactive, one inside it and one
/// without a window are active, each as the enclave's decisions read the window.
async fn active_policies(c: &Client, org: &str) {
    let mut over = intent("over", Effect::Deny, Some("true"), None);
    over.time = Some("time.now < Timestamp('2020-01-01T00:00:00Z')".into());
    let mut inside = intent("inside", Effect::Deny, Some("false"), None);
    inside.time = Some("time.now < Timestamp('2100-01-01T00:00:00Z')".into());
    let mut ids = Vec::new();
    for i in [over, inside, intent("always", Effect::Allow, Some("false"), None)] {
        ids.push(c.create_policy(org.into(), c.current_timestamp(), i).await.unwrap().result.policy_id);
    }
    let before = Stack::now_ms() as u64;
    let r = c
        .get_active_policies(turnkey_client::generated::GetActivePoliciesRequest { organization_id: org.into() })
        .await
        .unwrap();
    assert!(r.evaluated_at_ms >= before && r.evaluated_at_ms <= Stack::now_ms() as u64 + 1, "{}", r.evaluated_at_ms);
    let status = |id: &str| r.statuses.iter().find(|s| s.policy_id == id).unwrap_or_else(|| panic!("{id}: {r:?}"));
    let over = status(&ids[0]);
    assert_eq!((over.active, over.time_expr.as_deref()), (false, Some("time.now < Timestamp('2020-01-01T00:00:00Z')")));
    assert!(status(&ids[1]).active && status(&ids[1]).error.is_none());
    assert_eq!((status(&ids[2]).active, status(&ids[2]).time_expr.as_deref()), (true, None));
    assert!(r.statuses.iter().all(|s| s.organization_id == org));
    assert_eq!(r.statuses.len(), policies(c, org).await.len());
}

/// A JSON document of exactly `len` bytes.
fn json_of_len(len: usize) -> String {
    let s = format!("{{\"idl\":\"{}\"}}", "a".repeat(len - 10));
    assert_eq!(s.len(), len);
    serde_json::from_str::<Value>(&s).unwrap();
    s
}

#[tokio::test]
async fn smart_contract_interfaces_end_to_end() {
    let stack = Stack::start().await;
    let c = stack.client();
    let org = stack.organization_id.clone();
    let abi = r#"[{"type":"function","name":"transfer","inputs":[{"name":"to","type":"address"},{"name":"value","type":"uint256"}],"outputs":[{"name":"","type":"bool"}],"stateMutability":"nonpayable"}]"#;
    let sci = |address: &str, interface: String, ty: SmartContractInterfaceType, label: &str| {
        CreateSmartContractInterfaceIntent {
            smart_contract_address: address.into(),
            smart_contract_interface: interface,
            r#type: ty,
            label: label.into(),
            notes: "erc-20".into(),
        }
    };
    let usdc = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48";
    let created = c
        .create_smart_contract_interface(
            org.clone(),
            c.current_timestamp(),
            sci(usdc, abi.into(), SmartContractInterfaceType::Ethereum, "usdc"),
        )
        .await
        .unwrap();
    let eth_id = created.result.smart_contract_interface_id.clone();
    let got = c
        .get_smart_contract_interface(GetSmartContractInterfaceRequest {
            organization_id: org.clone(),
            smart_contract_interface_id: eth_id.clone(),
        })
        .await
        .unwrap()
        .smart_contract_interface
        .unwrap();
    assert_eq!(
        (got.organization_id.as_str(), got.smart_contract_interface_id.as_str()),
        (org.as_str(), eth_id.as_str())
    );
    assert_eq!((got.smart_contract_address.as_str(), got.smart_contract_interface.as_str()), (usdc, abi));
    assert_eq!(
        (got.r#type.as_str(), got.label.as_str(), got.notes.as_str()),
        ("SMART_CONTRACT_INTERFACE_TYPE_ETHEREUM", "usdc", "erc-20")
    );
    assert!(got.created_at.is_some() && got.updated_at.is_some());

    // The size limit, both sides of it; the body limit (1 MiB) lets both through to the handler.
    let program = "TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA";
    let exact = json_of_len(MAX_INTERFACE);
    let big = c
        .create_smart_contract_interface(
            org.clone(),
            c.current_timestamp(),
            sci(program, exact.clone(), SmartContractInterfaceType::Solana, "usdc"),
        )
        .await
        .unwrap();
    let sol_id = big.result.smart_contract_interface_id.clone();
    let activities = stack.activity_count(&stack.api_key(), &org).await;
    refused(
        c.create_smart_contract_interface(
            org.clone(),
            c.current_timestamp(),
            sci(program, json_of_len(MAX_INTERFACE + 1), SmartContractInterfaceType::Solana, "too-big"),
        )
        .await,
        400,
        "REQUEST_INVALID",
        "smart contract interface exceeds 409600 bytes",
    );
    refused(
        c.create_smart_contract_interface(
            org.clone(),
            c.current_timestamp(),
            sci(usdc, "[{\"type\":".into(), SmartContractInterfaceType::Ethereum, "broken"),
        )
        .await,
        400,
        "REQUEST_INVALID",
        "smart contract interface is not valid JSON",
    );
    refused(
        c.create_smart_contract_interface(
            org.clone(),
            c.current_timestamp(),
            sci(usdc, abi.into(), SmartContractInterfaceType::Unspecified, "untyped"),
        )
        .await,
        400,
        "REQUEST_INVALID",
        "invalid smart contract interface type",
    );
    refused(
        c.create_smart_contract_interface(
            org.clone(),
            c.current_timestamp(),
            sci("", abi.into(), SmartContractInterfaceType::Ethereum, "no-address"),
        )
        .await,
        400,
        "REQUEST_INVALID",
        "smartContractAddress is required",
    );
    assert_eq!(stack.activity_count(&stack.api_key(), &org).await, activities);

    // Labels need not be unique; the list is in creation order and carries the full interfaces.
    let list = c
        .get_smart_contract_interfaces(GetSmartContractInterfacesRequest { organization_id: org.clone() })
        .await
        .unwrap()
        .smart_contract_interfaces;
    assert_eq!(list.len(), 2);
    assert_eq!(
        (list[0].smart_contract_interface_id.as_str(), list[1].smart_contract_interface_id.as_str()),
        (eth_id.as_str(), sol_id.as_str())
    );
    assert_eq!((list[1].label.as_str(), list[1].r#type.as_str()), ("usdc", "SMART_CONTRACT_INTERFACE_TYPE_SOLANA"));
    assert_eq!(list[1].smart_contract_interface, exact);

    // get_organization references them by id, address and digest (not the whole interface).
    let body = json!({"organizationId": org}).to_string();
    let r = stack.post_raw("/public/v1/query/get_organization", body.as_bytes(), Some(&stack.api_key())).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let refs = &r.json["organizationData"]["smartContractInterfaceReferences"];
    assert_eq!(
        refs[0],
        json!({"smartContractInterfaceId": eth_id, "smartContractAddress": usdc, "digest": hex::encode(sha2::Sha256::digest(abi))})
    );
    assert_eq!(refs.as_array().unwrap().len(), 2);

    // Delete.
    let deleted = c
        .delete_smart_contract_interface(
            org.clone(),
            c.current_timestamp(),
            DeleteSmartContractInterfaceIntent { smart_contract_interface_id: eth_id.clone() },
        )
        .await
        .unwrap();
    assert_eq!(deleted.result.smart_contract_interface_id, eth_id);
    refused(
        c.get_smart_contract_interface(GetSmartContractInterfaceRequest {
            organization_id: org.clone(),
            smart_contract_interface_id: eth_id.clone(),
        })
        .await,
        404,
        "REQUEST_INVALID",
        "smart contract interface not found",
    );
    refused(
        c.delete_smart_contract_interface(
            org.clone(),
            c.current_timestamp(),
            DeleteSmartContractInterfaceIntent { smart_contract_interface_id: eth_id.clone() },
        )
        .await,
        404,
        "REQUEST_INVALID",
        "smart contract interface not found",
    );
    let list = c
        .get_smart_contract_interfaces(GetSmartContractInterfacesRequest { organization_id: org.clone() })
        .await
        .unwrap()
        .smart_contract_interfaces;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].smart_contract_interface_id, sol_id);
}

/// Concurrent creations cannot pass the per-organization policy cap: with the cap at 5 (the
/// enclave's and the gateway's early check alike), 20 `create_policy` at once (on PostgreSQL
/// through two gateways) and batches of two leave exactly 5 policies, in the gateway's store, in
/// the enclave's authority state and through the API; the rest are JSON 400s naming the limit.
#[tokio::test]
async fn concurrent_creations_never_pass_the_policy_cap() {
    const CAP: usize = 5;
    const TRIES: usize = 20;
    let stack = std::sync::Arc::new(Stack::start_with(&[("COFFER_MAX_POLICIES_PER_ORGANIZATION", "5")]).await);
    let second = stack.second_gateway_on_postgres().await;
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..TRIES {
        let stack = stack.clone();
        let base = match (&second, i % 2) {
            (Some((url, _)), 1) => url.clone(),
            _ => stack.base_url.clone(),
        };
        burst.spawn(async move {
            let policy =
                |n: &str| json!({"policyName": n, "effect": "EFFECT_ALLOW", "condition": "false", "notes": ""});
            // Every fourth a batch of two.
            let (path, ty, parameters) = if i % 4 == 3 {
                let batch = [policy(&format!("p{i}a")), policy(&format!("p{i}b"))];
                ("create_policies", "ACTIVITY_TYPE_CREATE_POLICIES", json!({ "policies": batch }))
            } else {
                ("create_policy", "ACTIVITY_TYPE_CREATE_POLICY_V3", policy(&format!("p{i}")))
            };
            let body = json!({
                "type": ty,
                "timestampMs": Stack::now_ms().to_string(),
                "organizationId": stack.organization_id,
                "parameters": parameters,
            });
            let path = format!("/public/v1/submit/{path}");
            coffer_tests::post_to(&base, &path, body.to_string().as_bytes(), Some(&stack.api_key())).await
        });
    }
    while let Some(r) = burst.join_next().await {
        let r = r.unwrap();
        if r.status != 200 {
            refused_raw(&r, 400, "REQUEST_INVALID", "an organization may have at most 5");
        }
    }
    let org = stack.organization_id.clone();
    let stored = stack.stored_record_count(&org, "policy");
    let in_state = stack.authority_entry_count(&org, "policy");
    let listed = policies(&stack.client(), &org).await.len();
    assert_eq!(
        (stored, in_state, listed),
        (CAP, CAP, CAP),
        "{TRIES} concurrent creations at a cap of {CAP}: (gateway store, authority state, listed)"
    );
}
