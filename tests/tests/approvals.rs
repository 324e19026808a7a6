//! End to end: the policy engine and approvals — default deny, scoped ALLOW, DENY beating ALLOW,
//! 2-of-N consensus with approve/reject, concurrent approvals, root quorums, Idempotency-Key and
//! the policy dry run, through the official client and raw HTTP.

use std::time::Duration;

use coffer_tests::{recover_eth_address, refused, refused_raw, settled, RawResponse, Stack, AUDIT_LOG};
use serde_json::{json, Value};
use sha2::Digest;
use turnkey_client::generated::immutable::activity::v1::{ActivityStatus, ActivityType};
use turnkey_client::generated::immutable::common::v1::Outcome;
use turnkey_client::generated::immutable::common::v1::{
    AddressFormat, ApiKeyCurve, Curve, Effect, FeatureName, HashFunction, PathFormat, PayloadEncoding,
};
use turnkey_client::generated::{
    ApiKeyParamsV2, ApproveActivityIntent, CreateApiKeysIntentV2, CreatePolicyIntentV3, CreateSubOrganizationIntentV8,
    CreateUsersIntentV4, CreateWalletIntent, DeleteSubOrganizationIntent, GetActivityRequest,
    GetPolicyEvaluationsRequest, GetWhoamiRequest, RootUserParamsV5, SetOrganizationFeatureIntent,
    SignRawPayloadIntentV2, UpdateRootQuorumIntent, UserParamsV4, WalletAccountParams,
};
use turnkey_client::{TurnkeyClient, TurnkeyClientError, TurnkeyP256ApiKey};

type Client = TurnkeyClient<TurnkeyP256ApiKey>;

/// A user of the test organization: id, a client with its key, and the key for raw calls.
struct Member {
    id: String,
    client: Client,
    key: TurnkeyP256ApiKey,
}

fn copy_key(k: &TurnkeyP256ApiKey) -> TurnkeyP256ApiKey {
    TurnkeyP256ApiKey::from_strings(hex::encode(k.private_key()), None).unwrap()
}

async fn add_user(stack: &Stack, root: &Client, org: &str, name: &str) -> Member {
    let key = TurnkeyP256ApiKey::generate();
    let params = UserParamsV4 {
        user_name: name.into(),
        user_email: Some(format!("{name}@example.com")),
        user_phone_number: None,
        api_keys: vec![ApiKeyParamsV2 {
            api_key_name: name.into(),
            public_key: hex::encode(key.compressed_public_key()),
            curve_type: ApiKeyCurve::P256,
            expiration_seconds: None,
        }],
        authenticators: vec![],
        oauth_providers: vec![],
        user_tags: vec![],
    };
    let id = root
        .create_users(org.into(), root.current_timestamp(), CreateUsersIntentV4 { users: vec![params] })
        .await
        .unwrap()
        .result
        .user_ids[0]
        .clone();
    Member { id, client: stack.client_with(copy_key(&key)), key }
}

/// A wallet with one Ethereum account: (wallet id, address).
async fn add_wallet(root: &Client, org: &str, name: &str) -> (String, String) {
    let intent = CreateWalletIntent {
        wallet_name: name.into(),
        accounts: vec![WalletAccountParams {
            curve: Curve::Secp256k1,
            path_format: PathFormat::Bip32,
            path: "m/44'/60'/0'/0/0".into(),
            address_format: AddressFormat::Ethereum,
            name: None,
        }],
        mnemonic_length: None,
    };
    let r = root.create_wallet(org.into(), root.current_timestamp(), intent).await.unwrap().result;
    (r.wallet_id, r.addresses[0].clone())
}

async fn add_policy(root: &Client, org: &str, name: &str, effect: Effect, condition: &str, consensus: &str) -> String {
    let intent = CreatePolicyIntentV3 {
        policy_name: name.into(),
        effect,
        condition: Some(condition.into()),
        consensus: Some(consensus.into()),
        notes: String::new(),
        time: None,
    };
    root.create_policy(org.into(), root.current_timestamp(), intent).await.unwrap().result.policy_id
}

fn sign_intent(sign_with: &str, payload: &str) -> SignRawPayloadIntentV2 {
    SignRawPayloadIntentV2 {
        sign_with: sign_with.into(),
        payload: payload.into(),
        encoding: PayloadEncoding::TextUtf8,
        hash_function: HashFunction::Keccak256,
        external_signer_pubkey: None,
    }
}

/// A raw `sign_raw_payload` submission body.
fn sign_body(org: &str, sign_with: &str, payload: &str) -> String {
    json!({
        "type": "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org,
        "parameters": {"signWith": sign_with, "payload": payload, "encoding": "PAYLOAD_ENCODING_TEXT_UTF8",
            "hashFunction": "HASH_FUNCTION_KECCAK256"},
    })
    .to_string()
}

fn vote_body(org: &str, approve: bool, fingerprint: &str) -> String {
    let (ty, key) = if approve {
        ("ACTIVITY_TYPE_APPROVE_ACTIVITY", "fingerprint")
    } else {
        ("ACTIVITY_TYPE_REJECT_ACTIVITY", "fingerprint")
    };
    json!({"type": ty, "timestampMs": Stack::now_ms().to_string(), "organizationId": org,
        "parameters": {key: fingerprint}})
    .to_string()
}

async fn vote(stack: &Stack, key: &TurnkeyP256ApiKey, org: &str, approve: bool, fingerprint: &str) -> RawResponse {
    let path = if approve { "/public/v1/submit/approve_activity" } else { "/public/v1/submit/reject_activity" };
    stack.post_raw(path, vote_body(org, approve, fingerprint).as_bytes(), Some(key)).await
}

/// The Ethereum address that signed keccak256(`message`) with r/s/v ([`recover_eth_address`],
/// low-S checked).
fn recover(message: &[u8], r: &str, s: &str, v: &str) -> String {
    recover_eth_address(&sha3::Keccak256::digest(message).into(), r, s, v)
}

/// The ids of every activity of `org` (the exact, paged oracle), read by the root.
async fn activity_ids(stack: &Stack, org: &str) -> std::collections::BTreeSet<String> {
    stack.activities(&stack.api_key(), org).await.iter().map(|a| a["id"].as_str().unwrap().to_string()).collect()
}

/// How many signatures the enclave made for the activity with `fingerprint`: its `coffer_audit`
/// allow lines for `sign` naming that fingerprint, once the log has stopped growing for 300 ms.
async fn signings(stack: &Stack, fingerprint: &str) -> usize {
    let count = || async {
        stack.audit("allow", "sign").iter().filter(|f| f["fingerprint"].as_str() == Some(fingerprint)).count()
    };
    settled("the enclave's signings", count, Duration::from_millis(300)).await
}

/// Every `sign` the enclave allowed so far, settled (see [`signings`]).
async fn all_signings(stack: &Stack) -> usize {
    settled("the enclave's signings", || async { stack.audit("allow", "sign").len() }, Duration::from_millis(300)).await
}

async fn get_activity(stack: &Stack, key: &TurnkeyP256ApiKey, org: &str, id: &str) -> Value {
    let body = json!({"organizationId": org, "activityId": id}).to_string();
    let r = stack.post_raw("/public/v1/query/get_activity", body.as_bytes(), Some(key)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["activity"].clone()
}

async fn dry_run(stack: &Stack, key: &TurnkeyP256ApiKey, org: &str, activity: &str) -> Value {
    let activity: Value = serde_json::from_str(activity).unwrap();
    let body = json!({"organizationId": org, "activity": activity}).to_string();
    let r = stack.post_raw("/public/v1/query/coffer_policy_dry_run", body.as_bytes(), Some(key)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json
}

async fn evaluations(c: &Client, org: &str, activity_id: &str) -> Vec<Vec<(String, Outcome)>> {
    let req = GetPolicyEvaluationsRequest { organization_id: org.into(), activity_id: activity_id.into() };
    let r = c.get_policy_evaluations(req).await.unwrap();
    r.policy_evaluations
        .iter()
        .map(|e| {
            assert_eq!((e.activity_id.as_str(), e.organization_id.as_str()), (activity_id, org));
            assert!(!e.vote_id.is_empty() && e.created_at.is_some());
            by_policy_id(e.policy_evaluations.iter().map(|p| (p.policy_id.clone(), p.outcome)).collect())
        })
        .collect()
}

/// `outcomes` in policy id order: the enclave records them in its state's order (by id), the
/// gateway's rejection in its records' order.
fn by_policy_id(mut outcomes: Vec<(String, Outcome)>) -> Vec<(String, Outcome)> {
    outcomes.sort_by(|a, b| a.0.cmp(&b.0));
    outcomes
}

#[tokio::test]
async fn default_deny_scoped_allow_deny_wins_and_dry_run() {
    let stack = Stack::start_with(&[AUDIT_LOG]).await;
    let root = stack.client();
    let org = stack.organization_id.clone();
    let alice = add_user(&stack, &root, &org, "alice").await;
    let bob = add_user(&stack, &root, &org, "bob").await;
    let (w1, a1) = add_wallet(&root, &org, "w1").await;
    let (_w2, a2) = add_wallet(&root, &org, "w2").await;

    // A non-root user is denied by default: 403, nothing recorded, nothing signed; the dry run
    // agrees. (The oracles see what there is: the setup's activities, and no signature yet.)
    let before = activity_ids(&stack, &org).await;
    assert_eq!(before.len(), 4, "two users, two wallets: {before:?}");
    assert_eq!(all_signings(&stack).await, 0);
    let r = alice.client.sign_raw_payload(org.clone(), alice.client.current_timestamp(), sign_intent(&a1, "x")).await;
    refused(r, 403, "REQUEST_NOT_AUTHORIZED", "request not authorized");
    let raw = stack
        .post_raw("/public/v1/submit/sign_raw_payload", sign_body(&org, &a1, "x").as_bytes(), Some(&alice.key))
        .await;
    refused_raw(&raw, 403, "REQUEST_NOT_AUTHORIZED", "request not authorized");
    assert_eq!(raw.json["message"], "request not authorized");
    assert_eq!(activity_ids(&stack, &org).await, before);
    let d = dry_run(&stack, &alice.key, &org, &sign_body(&org, &a1, "x")).await;
    assert_eq!((d["decision"].as_str(), d["reason"].as_str()), (Some("DECISION_DENY"), Some("IMPLICIT_DENY")));
    assert_eq!((d["resource"].as_str(), d["action"].as_str()), (Some("PRIVATE_KEY"), Some("SIGN")));
    assert_eq!(activity_ids(&stack, &org).await, before);
    assert_eq!(all_signings(&stack).await, 0, "a refused request reached the enclave's signing");

    // An ALLOW scoped to one wallet and to alice.
    let allow = add_policy(
        &root,
        &org,
        "alice signs with w1",
        Effect::Allow,
        &format!("activity.action == 'SIGN' && wallet.id == '{w1}'"),
        &format!("approvers.any(user, user.id == '{}')", alice.id),
    )
    .await;
    let d = dry_run(&stack, &alice.key, &org, &sign_body(&org, &a1, "hello")).await;
    assert_eq!(d["decision"], "DECISION_ALLOW", "{d}");
    assert_eq!(
        d["policies"],
        json!([{"policyId": allow, "policyName": "alice signs with w1", "effect": "EFFECT_ALLOW",
        "outcome": "OUTCOME_ALLOW", "decidingClause": "consensus", "detail": null}])
    );
    let sig = alice
        .client
        .sign_raw_payload(org.clone(), alice.client.current_timestamp(), sign_intent(&a1, "hello"))
        .await
        .unwrap();
    assert_eq!(recover(b"hello", &sig.result.r, &sig.result.s, &sig.result.v), a1.to_lowercase());
    assert_eq!(evaluations(&root, &org, &sig.activity_id).await, vec![vec![(allow.clone(), Outcome::Allow)]]);
    // The signings oracle counts what the enclave signed: this one, once.
    assert_eq!(all_signings(&stack).await, 1);

    // Another wallet: refused, and the dry run names the clause.
    let d = dry_run(&stack, &alice.key, &org, &sign_body(&org, &a2, "hello")).await;
    assert_eq!(d["decision"], "DECISION_DENY");
    assert_eq!(
        (d["policies"][0]["outcome"].as_str(), d["policies"][0]["decidingClause"].as_str()),
        (Some("OUTCOME_DENY_IMPLICIT"), Some("condition"))
    );
    let before = activity_ids(&stack, &org).await;
    let r =
        alice.client.sign_raw_payload(org.clone(), alice.client.current_timestamp(), sign_intent(&a2, "hello")).await;
    refused(r, 403, "REQUEST_NOT_AUTHORIZED", "request not authorized");
    assert_eq!(activity_ids(&stack, &org).await, before);
    // bob is not named in the consensus: waits for alice (consensus needed), never runs.
    let r = bob.client.sign_raw_payload(org.clone(), bob.client.current_timestamp(), sign_intent(&a1, "bob")).await;
    let waiting = match r {
        Err(TurnkeyClientError::ActivityRequiresApproval(id)) => id,
        other => panic!("expected ActivityRequiresApproval, got {other:?}"),
    };
    let mut expected = before.clone();
    expected.insert(waiting.clone());
    assert_eq!(activity_ids(&stack, &org).await, expected);
    assert_eq!(evaluations(&root, &org, &waiting).await, vec![vec![(allow.clone(), Outcome::RequiresConsensus)]]);
    assert_eq!(all_signings(&stack).await, 1, "neither the refused nor the waiting request was signed");

    // An erroring clause never allows: `private_key` is missing when signing with a wallet.
    let broken =
        add_policy(&root, &org, "broken", Effect::Allow, "wallet.id == 'x' || private_key.id == 'y'", "").await;
    let d = dry_run(&stack, &bob.key, &org, &sign_body(&org, &a2, "z")).await;
    let p = d["policies"].as_array().unwrap().iter().find(|p| p["policyId"] == broken.as_str()).unwrap().clone();
    assert_eq!((p["outcome"].as_str(), p["decidingClause"].as_str()), (Some("OUTCOME_ERROR"), Some("condition")));
    assert!(p["detail"].as_str().unwrap().contains("MissingField"), "{p}");
    assert_eq!(d["decision"], "DECISION_DENY");

    // A DENY on the same wallet beats the ALLOW; root users (threshold 1) still bypass policies.
    // Scoped to signing: a DENY naming `wallet` errs, and denies, on activities without one.
    let deny_w1 = format!("activity.resource == 'PRIVATE_KEY' && wallet.id == '{w1}'");
    let deny = add_policy(&root, &org, "no w1", Effect::Deny, &deny_w1, "").await;
    let d = dry_run(&stack, &alice.key, &org, &sign_body(&org, &a1, "again")).await;
    assert_eq!((d["decision"].as_str(), d["reason"].as_str()), (Some("DECISION_DENY"), Some("EXPLICIT_DENY")));
    let before = activity_ids(&stack, &org).await;
    let r =
        alice.client.sign_raw_payload(org.clone(), alice.client.current_timestamp(), sign_intent(&a1, "again")).await;
    refused(r, 403, "REQUEST_NOT_AUTHORIZED", "request not authorized");
    assert_eq!(activity_ids(&stack, &org).await, before);
    assert_eq!(all_signings(&stack).await, 1, "the denied request was not signed");
    let d = dry_run(&stack, &stack.api_key(), &org, &sign_body(&org, &a1, "root")).await;
    assert_eq!((d["decision"].as_str(), d["reason"].as_str()), (Some("DECISION_ALLOW"), Some("ROOT_QUORUM")));
    let sig = root.sign_raw_payload(org.clone(), root.current_timestamp(), sign_intent(&a1, "root")).await.unwrap();
    assert_eq!(recover(b"root", &sig.result.r, &sig.result.s, &sig.result.v), a1.to_lowercase());
    assert_eq!(all_signings(&stack).await, 2);
    let _ = deny;

    // Implicit permission: one's own credentials, not another user's.
    let own = |user: &str| CreateApiKeysIntentV2 {
        api_keys: vec![ApiKeyParamsV2 {
            api_key_name: format!("extra-{user}"),
            public_key: hex::encode(TurnkeyP256ApiKey::generate().compressed_public_key()),
            curve_type: ApiKeyCurve::P256,
            expiration_seconds: None,
        }],
        user_id: user.into(),
    };
    alice.client.create_api_keys(org.clone(), alice.client.current_timestamp(), own(&alice.id)).await.unwrap();
    let r = alice.client.create_api_keys(org.clone(), alice.client.current_timestamp(), own(&bob.id)).await;
    // bob's keys: no policy applies (the wallet policies need a wallet): implicit deny.
    refused(r, 403, "REQUEST_NOT_AUTHORIZED", "request not authorized");
}

#[tokio::test]
async fn two_of_n_consensus_approve_reject_double_and_concurrent_votes() {
    let stack = Stack::start_with(&[AUDIT_LOG]).await;
    let root = stack.client();
    let org = stack.organization_id.clone();
    let alice = add_user(&stack, &root, &org, "alice").await;
    let bob = add_user(&stack, &root, &org, "bob").await;
    let carol = add_user(&stack, &root, &org, "carol").await;
    let (w1, a1) = add_wallet(&root, &org, "w1").await;
    let (w2, a2) = add_wallet(&root, &org, "w2").await;
    let two =
        add_policy(&root, &org, "2 of n", Effect::Allow, &format!("wallet.id == '{w1}'"), "approvers.count() >= 2")
            .await;
    let three =
        add_policy(&root, &org, "3 of n", Effect::Allow, &format!("wallet.id == '{w2}'"), "approvers.count() >= 3")
            .await;

    // alice alone: CONSENSUS_NEEDED, her vote recorded, nothing signed.
    let id = match alice
        .client
        .sign_raw_payload(org.clone(), alice.client.current_timestamp(), sign_intent(&a1, "2of"))
        .await
    {
        Err(TurnkeyClientError::ActivityRequiresApproval(id)) => id,
        other => panic!("expected ActivityRequiresApproval, got {other:?}"),
    };
    let a = get_activity(&stack, &alice.key, &org, &id).await;
    assert_eq!(a["status"], "ACTIVITY_STATUS_CONSENSUS_NEEDED");
    assert_eq!(a["result"], json!({}));
    assert_eq!((a["canApprove"].as_bool(), a["canReject"].as_bool()), (Some(false), Some(false)));
    assert_eq!(a["votes"].as_array().unwrap().len(), 1);
    assert_eq!(a["votes"][0]["userId"], alice.id.as_str());
    assert!(a["votes"][0]["message"].as_str().unwrap().contains("\"2of\""));
    assert_eq!(a["votes"][0]["scheme"], "SIGNATURE_SCHEME_TK_API_P256");
    let b = get_activity(&stack, &bob.key, &org, &id).await;
    assert_eq!((b["canApprove"].as_bool(), b["canReject"].as_bool()), (Some(true), Some(true)));
    let fingerprint = a["fingerprint"].as_str().unwrap().to_string();
    assert_eq!(signings(&stack, &fingerprint).await, 0, "nothing signed before consensus");

    // Voting twice, and an unknown fingerprint.
    let r = vote(&stack, &alice.key, &org, true, &fingerprint).await;
    refused_raw(&r, 400, "REQUEST_INVALID", "user has already voted on this activity");
    assert_eq!(r.json["message"], "user has already voted on this activity");
    let r = vote(&stack, &bob.key, &org, true, "sha256:00").await;
    refused_raw(&r, 404, "REQUEST_INVALID", "No activity found with fingerprint");
    assert!(r.json["message"].as_str().unwrap().starts_with("No activity found with fingerprint"), "{}", r.text);
    assert_eq!(signings(&stack, &fingerprint).await, 0, "nothing signed by a refused vote");

    // bob approves through the official client: the target activity comes back, completed, and
    // linked in the log by the enclave call that ran it (no `RecordActivity` after the vote).
    let record_calls = stack.enclave_calls("RecordActivity").await;
    let done = bob
        .client
        .approve_activity(
            org.clone(),
            bob.client.current_timestamp(),
            ApproveActivityIntent { fingerprint: fingerprint.clone() },
        )
        .await
        .unwrap();
    assert_eq!(
        (done.id.as_str(), done.status, done.r#type),
        (id.as_str(), ActivityStatus::Completed, ActivityType::SignRawPayloadV2)
    );
    assert_eq!(done.votes.len(), 2);
    let a = get_activity(&stack, &root_key(&stack), &org, &id).await;
    let sig = &a["result"]["signRawPayloadResult"];
    assert_eq!(
        recover(b"2of", sig["r"].as_str().unwrap(), sig["s"].as_str().unwrap(), sig["v"].as_str().unwrap()),
        a1.to_lowercase()
    );
    assert_eq!(signings(&stack, &fingerprint).await, 1, "signed once, on the second approval");
    assert_eq!(stack.enclave_calls("RecordActivity").await, record_calls, "linked in the call that ran it");
    assert_eq!(
        evaluations(&root, &org, &id).await,
        vec![
            by_policy_id(vec![(two.clone(), Outcome::RequiresConsensus), (three.clone(), Outcome::DenyImplicit)]),
            by_policy_id(vec![(two.clone(), Outcome::Allow), (three.clone(), Outcome::DenyImplicit)])
        ]
    );
    // Voting on it again: bob counted once; carol sees the completed activity, unchanged.
    let r = vote(&stack, &bob.key, &org, true, &fingerprint).await;
    refused_raw(&r, 400, "REQUEST_INVALID", "user has already voted on this activity");
    let r = vote(&stack, &carol.key, &org, true, &fingerprint).await;
    assert_eq!((r.status, r.json["activity"]["status"].as_str()), (200, Some("ACTIVITY_STATUS_COMPLETED")));
    assert_eq!(r.json["activity"]["votes"].as_array().unwrap().len(), 2);
    assert_eq!(r.json["activity"]["result"], a["result"]);
    assert_eq!(signings(&stack, &fingerprint).await, 1, "a vote on a completed activity signs nothing");

    // 3 of n: double approval by bob counts once.
    let body = sign_body(&org, &a2, "3of");
    let r = stack.post_raw("/public/v1/submit/sign_raw_payload", body.as_bytes(), Some(&alice.key)).await;
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_CONSENSUS_NEEDED", "{}", r.text);
    let (id3, fp3) = (
        r.json["activity"]["id"].as_str().unwrap().to_string(),
        r.json["activity"]["fingerprint"].as_str().unwrap().to_string(),
    );
    let r = vote(&stack, &bob.key, &org, true, &fp3).await;
    assert_eq!((r.status, r.json["activity"]["status"].as_str()), (200, Some("ACTIVITY_STATUS_CONSENSUS_NEEDED")));
    assert_eq!(r.json["activity"]["type"], "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2");
    let r = vote(&stack, &bob.key, &org, true, &fp3).await;
    refused_raw(&r, 400, "REQUEST_INVALID", "user has already voted on this activity");
    let a = get_activity(&stack, &alice.key, &org, &id3).await;
    assert_eq!(
        (a["status"].as_str(), a["votes"].as_array().unwrap().len()),
        (Some("ACTIVITY_STATUS_CONSENSUS_NEEDED"), 2)
    );

    // carol rejects: REJECTED, never runs; a later approval does not revive it.
    let r = vote(&stack, &carol.key, &org, false, &fp3).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        (r.json["activity"]["id"].as_str(), r.json["activity"]["status"].as_str()),
        (Some(id3.as_str()), Some("ACTIVITY_STATUS_REJECTED"))
    );
    assert_eq!(r.json["activity"]["result"], json!({}));
    assert_eq!(r.json["activity"]["votes"][2]["selection"], "VOTE_SELECTION_REJECTED");
    let r = vote(&stack, &stack.api_key(), &org, true, &fp3).await;
    assert_eq!((r.status, r.json["activity"]["status"].as_str()), (200, Some("ACTIVITY_STATUS_REJECTED")));
    assert_eq!(r.json["activity"]["result"], json!({}));
    let evals = evaluations(&root, &org, &id3).await;
    assert_eq!(evals.len(), 3);
    assert_eq!(evals[2], by_policy_id(vec![(two.clone(), Outcome::Rejected), (three.clone(), Outcome::Rejected)]));
    assert_eq!(signings(&stack, &fp3).await, 0, "a rejected activity is never signed");

    // Two approvals at the same moment, either of which completes it: it runs once.
    for round in 0..3 {
        let payload = format!("race-{round}");
        let body = sign_body(&org, &a1, &payload);
        let r = stack.post_raw("/public/v1/submit/sign_raw_payload", body.as_bytes(), Some(&alice.key)).await;
        assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_CONSENSUS_NEEDED", "{}", r.text);
        let (rid, fp) = (
            r.json["activity"]["id"].as_str().unwrap().to_string(),
            r.json["activity"]["fingerprint"].as_str().unwrap().to_string(),
        );
        assert_eq!(signings(&stack, &fp).await, 0, "nothing signed before the approvals");
        let (x, y) = tokio::join!(vote(&stack, &bob.key, &org, true, &fp), vote(&stack, &carol.key, &org, true, &fp));
        assert_eq!((x.status, y.status), (200, 200), "{} / {}", x.text, y.text);
        // Executed once: the enclave signed for this activity exactly once, counted after its
        // log has settled (equal results prove nothing: RFC 6979 signing is deterministic).
        assert_eq!(signings(&stack, &fp).await, 1, "round {round}: the enclave's signings for {fp}");
        assert_eq!(x.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED");
        assert_eq!(y.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED");
        assert_eq!(x.json["activity"]["result"], y.json["activity"]["result"]);
        let a = get_activity(&stack, &alice.key, &org, &rid).await;
        assert_eq!(a["votes"].as_array().unwrap().len(), 2, "{a}");
        assert_eq!(evaluations(&root, &org, &rid).await.len(), 2);
        let sig = &a["result"]["signRawPayloadResult"];
        assert_eq!(
            recover(
                payload.as_bytes(),
                sig["r"].as_str().unwrap(),
                sig["s"].as_str().unwrap(),
                sig["v"].as_str().unwrap()
            ),
            a1.to_lowercase()
        );
    }
    assert_eq!(stack.unlogged_activities().await, Vec::<String>::new(), "every finished activity is logged");
}

fn root_key(stack: &Stack) -> TurnkeyP256ApiKey {
    stack.api_key()
}

#[tokio::test]
async fn root_quorum_of_two_needs_both_roots() {
    let stack = Stack::start().await;
    let root = stack.client();
    let org = stack.organization_id.clone();
    let alice = add_user(&stack, &root, &org, "alice").await;
    let bob = add_user(&stack, &root, &org, "bob").await;
    let intent = UpdateRootQuorumIntent { threshold: 2, user_ids: vec![stack.user_id.clone(), alice.id.clone()] };
    root.update_root_quorum(org.clone(), root.current_timestamp(), intent).await.unwrap();

    // One root's feature change waits; bob (not root) may not vote on it; alice completes it.
    let set = SetOrganizationFeatureIntent { name: FeatureName::EmailAuth, value: Some("on".into()) };
    let id = match root.set_organization_feature(org.clone(), root.current_timestamp(), set).await {
        Err(TurnkeyClientError::ActivityRequiresApproval(id)) => id,
        other => panic!("expected ActivityRequiresApproval, got {other:?}"),
    };
    let a = root
        .get_activity(GetActivityRequest { organization_id: org.clone(), activity_id: id.clone() })
        .await
        .unwrap()
        .activity
        .unwrap();
    assert_eq!((a.status, a.can_approve), (ActivityStatus::ConsensusNeeded, false));
    let b = get_activity(&stack, &bob.key, &org, &id).await;
    assert_eq!(b["canApprove"], false);
    let c = get_activity(&stack, &alice.key, &org, &id).await;
    assert_eq!(c["canApprove"], true);
    let r = vote(&stack, &bob.key, &org, true, &a.fingerprint).await;
    refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "this user may not vote on this activity");
    assert_eq!(features(&stack, &org).await, json!([]));
    let done = alice
        .client
        .approve_activity(
            org.clone(),
            alice.client.current_timestamp(),
            ApproveActivityIntent { fingerprint: a.fingerprint.clone() },
        )
        .await
        .unwrap();
    assert_eq!((done.status, done.r#type), (ActivityStatus::Completed, ActivityType::SetOrganizationFeature));
    assert_eq!(features(&stack, &org).await, json!([{"name": "FEATURE_NAME_EMAIL_AUTH", "value": "on"}]));

    // Above threshold 1, a lone root is no longer a quorum for anything: a wallet waits too.
    let body = json!({"type": "ACTIVITY_TYPE_CREATE_WALLET", "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org, "parameters": {"walletName": "quorum", "accounts": []}})
    .to_string();
    let r = stack.post_raw("/public/v1/submit/create_wallet", body.as_bytes(), Some(&stack.api_key())).await;
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_CONSENSUS_NEEDED", "{}", r.text);
    let d = dry_run(&stack, &stack.api_key(), &org, &body).await;
    assert_eq!(
        (d["decision"].as_str(), d["reason"].as_str()),
        (Some("DECISION_CONSENSUS_NEEDED"), Some("ROOT_QUORUM_PENDING"))
    );
    let fp = r.json["activity"]["fingerprint"].as_str().unwrap().to_string();
    let r = vote(&stack, &alice.key, &org, true, &fp).await;
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{}", r.text);
    assert!(r.json["activity"]["result"]["createWalletResult"]["walletId"].is_string(), "{}", r.text);

    // A state change the other root rejects: REJECTED, not applied, and linked in the log as
    // rejected (the enclave keeps the rejection; the link spends nothing that runs).
    let unset = SetOrganizationFeatureIntent { name: FeatureName::EmailAuth, value: Some("off".into()) };
    let id = match root.set_organization_feature(org.clone(), root.current_timestamp(), unset).await {
        Err(TurnkeyClientError::ActivityRequiresApproval(id)) => id,
        other => panic!("expected ActivityRequiresApproval, got {other:?}"),
    };
    let waiting = get_activity(&stack, &alice.key, &org, &id).await;
    let r = vote(&stack, &alice.key, &org, false, waiting["fingerprint"].as_str().unwrap()).await;
    assert_eq!(
        (r.status, r.json["activity"]["status"].as_str()),
        (200, Some("ACTIVITY_STATUS_REJECTED")),
        "{}",
        r.text
    );
    assert_eq!(features(&stack, &org).await, json!([{"name": "FEATURE_NAME_EMAIL_AUTH", "value": "on"}]));
    let body = json!({ "organizationId": org }).to_string();
    let log =
        stack.post_raw("/public/v1/query/coffer_list_activity_log", body.as_bytes(), Some(&stack.api_key())).await;
    let linked: Vec<&Value> =
        log.json["links"].as_array().unwrap().iter().filter(|l| l["activityId"] == id.as_str()).collect();
    assert_eq!(linked.len(), 1, "{}", log.text);
    let payload: Value = serde_json::from_str(linked[0]["link"]["proofPayload"].as_str().unwrap()).unwrap();
    assert_eq!(payload["activityLogLink"]["status"], "ACTIVITY_STATUS_REJECTED", "{payload}");
}

/// The organization's wallet names, oldest first.
async fn wallet_names(stack: &Stack, org: &str) -> Vec<String> {
    let body = json!({"organizationId": org}).to_string();
    let r = stack.post_raw("/public/v1/query/list_wallets", body.as_bytes(), Some(&stack.api_key())).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["wallets"].as_array().unwrap().iter().map(|w| w["walletName"].as_str().unwrap().to_string()).collect()
}

async fn features(stack: &Stack, org: &str) -> Value {
    let body = json!({"organizationId": org}).to_string();
    let r = stack.post_raw("/public/v1/query/get_organization_configs", body.as_bytes(), Some(&stack.api_key())).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["configs"]["features"].clone()
}

/// POSTs a stamped body with an `Idempotency-Key` header.
async fn post_idem(stack: &Stack, path: &str, body: &str, key: &TurnkeyP256ApiKey, idem: &str) -> RawResponse {
    use turnkey_api_key_stamper::Stamp;
    let stamp = key.stamp(body.as_bytes()).unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{}{}", stack.base_url, path))
        .header(stamp.name, stamp.value)
        .header("Idempotency-Key", idem)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    RawResponse { status, content_type, json, text }
}

#[tokio::test]
async fn idempotency_key_returns_the_first_activity() {
    let stack = Stack::start().await;
    let org = stack.organization_id.clone();
    let key = stack.api_key();
    let wallet = |name: &str, ts: u128| {
        json!({"type": "ACTIVITY_TYPE_CREATE_WALLET", "timestampMs": ts.to_string(), "organizationId": org,
            "parameters": {"walletName": name, "accounts": []}})
        .to_string()
    };
    let path = "/public/v1/submit/create_wallet";
    let now = Stack::now_ms();
    let first = post_idem(&stack, path, &wallet("idem", now), &key, "key-1").await;
    assert_eq!(first.status, 200, "{}", first.text);
    // The first one is on record (the oracle sees it), with its wallet.
    let before = activity_ids(&stack, &org).await;
    let first_id = first.json["activity"]["id"].as_str().unwrap().to_string();
    assert!(before.contains(&first_id), "{before:?}");
    assert_eq!(wallet_names(&stack, &org).await, ["idem"]);
    // Same key, same intent, new timestamp (new bytes): the first activity, nothing new.
    let again = post_idem(&stack, path, &wallet("idem", now + 1000), &key, "key-1").await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["activity"]["id"], first.json["activity"]["id"]);
    assert_eq!(again.json["activity"]["result"], first.json["activity"]["result"]);
    assert_eq!(activity_ids(&stack, &org).await, before);
    assert_eq!(wallet_names(&stack, &org).await, ["idem"]);
    // Same key, another intent: 409, nothing new.
    let other = post_idem(&stack, path, &wallet("other", now + 2000), &key, "key-1").await;
    refused_raw(&other, 409, "REQUEST_INVALID", "Idempotency-Key was already used for a different request");
    assert_eq!(activity_ids(&stack, &org).await, before);
    assert_eq!(wallet_names(&stack, &org).await, ["idem"]);
    // Another key: a new activity (the wallet name is taken, so a new name).
    let fresh = post_idem(&stack, path, &wallet("idem-2", now + 3000), &key, "key-2").await;
    assert_eq!(fresh.status, 200, "{}", fresh.text);
    assert_ne!(fresh.json["activity"]["id"], first.json["activity"]["id"]);
    let mut expected = before.clone();
    expected.insert(fresh.json["activity"]["id"].as_str().unwrap().to_string());
    assert_eq!(activity_ids(&stack, &org).await, expected);
    // A bad header value: refused, nothing new.
    let bad = post_idem(&stack, path, &wallet("idem-3", now + 4000), &key, " ").await;
    refused_raw(&bad, 400, "REQUEST_INVALID", "invalid Idempotency-Key header");
    assert_eq!(activity_ids(&stack, &org).await, expected);
    assert_eq!(wallet_names(&stack, &org).await, ["idem", "idem-2"]);
}

#[tokio::test]
async fn approved_sub_organization_deletion_deletes_it() {
    let stack = Stack::start().await;
    let parent = stack.client();
    let p = stack.organization_id.clone();
    let (erin_key, fred_key) = (TurnkeyP256ApiKey::generate(), TurnkeyP256ApiKey::generate());
    let root_user = |name: &str, key: &TurnkeyP256ApiKey| RootUserParamsV5 {
        user_name: name.into(),
        user_email: None,
        user_phone_number: None,
        api_keys: vec![ApiKeyParamsV2 {
            api_key_name: name.into(),
            public_key: hex::encode(key.compressed_public_key()),
            curve_type: ApiKeyCurve::P256,
            expiration_seconds: None,
        }],
        authenticators: vec![],
        oauth_providers: vec![],
    };
    let intent = CreateSubOrganizationIntentV8 {
        sub_organization_name: "two roots".into(),
        root_users: vec![root_user("erin", &erin_key), root_user("fred", &fred_key)],
        root_quorum_threshold: 2,
        wallet: None,
        disable_email_recovery: None,
        disable_email_auth: None,
        disable_sms_auth: None,
        disable_otp_email_auth: None,
        verification_token: None,
        client_signature: None,
    };
    let sub = parent
        .create_sub_organization(p.clone(), parent.current_timestamp(), intent)
        .await
        .unwrap()
        .result
        .sub_organization_id;
    let erin = stack.client_with(copy_key(&erin_key));
    let delete = DeleteSubOrganizationIntent { delete_without_export: Some(true) };
    let id = match erin.delete_sub_organization(sub.clone(), erin.current_timestamp(), delete).await {
        Err(TurnkeyClientError::ActivityRequiresApproval(id)) => id,
        other => panic!("expected ActivityRequiresApproval, got {other:?}"),
    };
    let a = get_activity(&stack, &erin_key, &sub, &id).await;
    let fingerprint = a["fingerprint"].as_str().unwrap().to_string();
    assert!(erin.get_whoami(GetWhoamiRequest { organization_id: sub.clone() }).await.is_ok());

    // fred's approval completes it: the sub-organization is gone, its activity in the parent's log.
    let r = vote(&stack, &fred_key, &sub, true, &fingerprint).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED");
    assert_eq!(r.json["activity"]["organizationId"], p.as_str());
    assert_eq!(r.json["activity"]["result"]["deleteSubOrganizationResult"]["subOrganizationUuid"], sub.as_str());
    match erin.get_whoami(GetWhoamiRequest { organization_id: sub.clone() }).await {
        Err(TurnkeyClientError::UnexpectedHttpStatus(404, _)) => {}
        other => panic!("expected the sub-organization to be gone, got {other:?}"),
    }
    let moved = get_activity(&stack, &stack.api_key(), &p, &id).await;
    assert_eq!(moved["status"], "ACTIVITY_STATUS_COMPLETED");
    assert_eq!(moved["votes"].as_array().unwrap().len(), 2);
}
