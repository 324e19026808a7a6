//! IP allowlists end to end (on SQLite, and on PostgreSQL in `make test`): the organization's
//! list and an API key's, set through the official Rust client and decided by the enclave's
//! policies; enforced by the gateway on the address it sees, with `X-Forwarded-For` believed only
//! from the configured proxy (127.0.0.2 here: the test connects from 127.0.0.1, or binds
//! 127.0.0.2 to play the proxy).

use std::net::IpAddr;

use coffer_tests::{refused_raw, RawResponse, Stack};
use serde_json::{json, Value};
use turnkey_client::generated::{
    GetIpAllowlistRequest, IpAllowlistIntentRule, RemoveIpAllowlistIntent, SetIpAllowlistIntent,
};
use turnkey_client::TurnkeyP256ApiKey;

const PROXY: &str = "127.0.0.2";

/// `whoami` stamped by `key`, from local address `from`, with `X-Forwarded-For` values `xff`.
async fn whoami(stack: &Stack, key: &TurnkeyP256ApiKey, from: &str, xff: &[&str]) -> RawResponse {
    use turnkey_api_key_stamper::Stamp;
    let body = json!({ "organizationId": stack.organization_id }).to_string();
    let client = reqwest::Client::builder().local_address(from.parse::<IpAddr>().unwrap()).build().unwrap();
    let mut req = client.post(format!("{}/public/v1/query/whoami", stack.base_url)).body(body.clone());
    let stamp = key.stamp(body.as_bytes()).unwrap();
    req = req.header(stamp.name, stamp.value);
    for v in xff {
        req = req.header("X-Forwarded-For", *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    RawResponse { status, content_type, json, text }
}

fn rule(cidr: &str, label: Option<&str>) -> IpAllowlistIntentRule {
    IpAllowlistIntentRule { cidr: cidr.into(), label: label.map(String::from) }
}

#[tokio::test]
async fn allowlists_let_through_only_their_addresses_and_forwarded_for_only_from_the_proxy() {
    let stack = Stack::start_with(&[("COFFER_TRUSTED_PROXIES", PROXY)]).await;
    let (root, org) = (stack.client(), stack.organization_id.clone());
    let root_key = stack.api_key();
    let root_hex = hex::encode(root_key.compressed_public_key());
    let (_, bob_key) = coffer_tests::user_with_key(&root, &org, "bob").await;
    let set = |public_key: Option<&str>, enabled: Option<bool>, rules: Vec<IpAllowlistIntentRule>| {
        SetIpAllowlistIntent { public_key: public_key.map(String::from), enabled, rules, on_evaluation_error: None }
    };

    // The root key's own list first (not enforced until the organization's is enabled), so that
    // the organization's list below does not lock the root out.
    root.set_ip_allowlist(
        org.clone(),
        root.current_timestamp(),
        set(Some(&root_hex), None, vec![rule("127.0.0.1/32", None)]),
    )
    .await
    .unwrap();
    // Bob, not a root user: the enclave refuses his lists, even with a policy that allows him
    // everything (the root quorum's alone, as the organization's name): no list of his own that
    // lets everything in, no organization list.
    let everything = turnkey_client::generated::CreatePolicyIntentV3 {
        policy_name: "bob may".into(),
        effect: turnkey_client::generated::immutable::common::v1::Effect::Allow,
        condition: Some("true".into()),
        consensus: Some("true".into()),
        notes: String::new(),
        time: None,
    };
    root.create_policy(org.clone(), root.current_timestamp(), everything).await.unwrap();
    let bob_client =
        stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(bob_key.private_key()), None).unwrap());
    let bob_hex = hex::encode(bob_key.compressed_public_key());
    stack.refusals_accounted();
    let wide = vec![rule("0.0.0.0/0", None), rule("::/0", None)];
    for intent in [set(Some(&bob_hex), None, wide), set(None, Some(true), vec![])] {
        let r = bob_client.set_ip_allowlist(org.clone(), bob_client.current_timestamp(), intent).await;
        stack.refused_for(r, 403, "REQUEST_NOT_AUTHORIZED", coffer_proto::v1::RefusalReason::RootQuorumOnly);
    }
    // A rule that is not a CIDR changes nothing.
    let r = root
        .set_ip_allowlist(org.clone(), root.current_timestamp(), set(None, Some(true), vec![rule("10.0.0.0/33", None)]))
        .await;
    coffer_tests::refused(r, 400, "REQUEST_INVALID", "rules[0].cidr is not a CIDR");
    assert_eq!(whoami(&stack, &bob_key, "127.0.0.1", &[]).await.status, 200);

    // The organization's list: the office network only.
    let office = vec![rule("10.0.0.0/8", Some("office")), rule("2001:db8::/32", None)];
    root.set_ip_allowlist(org.clone(), root.current_timestamp(), set(None, Some(true), office)).await.unwrap();
    let listed = root
        .get_ip_allowlist(GetIpAllowlistRequest { organization_id: org.clone(), public_key: None })
        .await
        .unwrap()
        .allowlist
        .expect("the organization's list");
    assert_eq!((listed.enabled, listed.on_evaluation_error.as_deref()), (Some(true), Some("DENY")));
    let rules: Vec<(String, Option<String>)> = listed.rules.iter().map(|r| (r.cidr.clone(), r.label.clone())).collect();
    assert_eq!(rules, [("10.0.0.0/8".to_string(), Some("office".to_string())), ("2001:db8::/32".to_string(), None)]);
    assert!(listed.rules.iter().all(|r| r.created_at.parse::<u64>().is_ok()));

    // Bob from 127.0.0.1: refused, naming the list and not its rules; the root, held to its own
    // key's list, goes on.
    let r = whoami(&stack, &bob_key, "127.0.0.1", &[]).await;
    refused_raw(
        &r,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "the client address is not allowed by the organization's IP allowlist",
    );
    assert!(!r.text.contains("10.0.0.0") && !r.text.contains("office"), "{}", r.text);
    assert_eq!(whoami(&stack, &root_key, "127.0.0.1", &[]).await.status, 200);
    // Submits are refused alike.
    let body = json!({"type": "ACTIVITY_TYPE_CREATE_USER_TAG", "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org, "parameters": {"userTagName": "t", "userIds": []}})
    .to_string();
    let r = stack.post_raw("/public/v1/submit/create_user_tag", body.as_bytes(), Some(&bob_key)).await;
    refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "organization's IP allowlist");
    // A forged X-Forwarded-For from a peer that is not the proxy is ignored.
    let r = whoami(&stack, &bob_key, "127.0.0.1", &["10.1.2.3"]).await;
    refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "organization's IP allowlist");
    // From the proxy, the client it names: the right-most address the proxy did not add itself.
    assert_eq!(whoami(&stack, &bob_key, PROXY, &["10.1.2.3"]).await.status, 200);
    assert_eq!(whoami(&stack, &bob_key, PROXY, &["2001:db8::7"]).await.status, 200);
    let r = whoami(&stack, &bob_key, PROXY, &["10.1.2.3, 192.0.2.9"]).await;
    refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "organization's IP allowlist");
    let r = whoami(&stack, &bob_key, PROXY, &["192.0.2.9"]).await;
    refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "organization's IP allowlist");
    // A header that names no address cannot be evaluated: DENY by default.
    let r = whoami(&stack, &bob_key, PROXY, &["not an address"]).await;
    refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "organization's IP allowlist");

    // The root's key list is the root's alone: from the proxy for 10.1.2.3 it is refused.
    let r = whoami(&stack, &root_key, PROXY, &["10.1.2.3"]).await;
    refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "the API key's IP allowlist");

    // Disabled (enabled: false), nothing is enforced; enabled again, it is; removed, it is not.
    root.set_ip_allowlist(
        org.clone(),
        root.current_timestamp(),
        set(None, Some(false), vec![rule("10.0.0.0/8", None)]),
    )
    .await
    .unwrap();
    assert_eq!(whoami(&stack, &bob_key, "127.0.0.1", &[]).await.status, 200);
    root.set_ip_allowlist(org.clone(), root.current_timestamp(), set(None, Some(true), vec![rule("10.0.0.0/8", None)]))
        .await
        .unwrap();
    assert_eq!(whoami(&stack, &bob_key, "127.0.0.1", &[]).await.status, 403);
    root.remove_ip_allowlist(org.clone(), root.current_timestamp(), RemoveIpAllowlistIntent { public_key: None })
        .await
        .unwrap();
    assert_eq!(whoami(&stack, &bob_key, "127.0.0.1", &[]).await.status, 200);
    let none = root.get_ip_allowlist(GetIpAllowlistRequest { organization_id: org.clone(), public_key: None }).await;
    assert!(none.unwrap().allowlist.is_none());
    let own = root
        .get_ip_allowlist(GetIpAllowlistRequest { organization_id: org.clone(), public_key: Some(root_hex.clone()) })
        .await
        .unwrap()
        .allowlist
        .expect("the root key's list");
    assert_eq!((own.public_key.as_deref(), own.rules.len()), (Some(root_hex.as_str()), 1));

    // The same bytes again are the same activity.
    let body = json!({"type": "ACTIVITY_TYPE_REMOVE_IP_ALLOWLIST", "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org, "parameters": {"publicKey": root_hex}})
    .to_string();
    let first = stack.post_raw("/public/v1/submit/remove_ip_allowlist", body.as_bytes(), Some(&root_key)).await;
    let again = stack.post_raw("/public/v1/submit/remove_ip_allowlist", body.as_bytes(), Some(&root_key)).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.json["activity"]["id"], again.json["activity"]["id"]);
    assert_eq!(first.json["activity"]["intent"]["removeIpAllowlistIntent"]["publicKey"], root_hex.as_str());
    assert!(first.json["activity"]["result"]["removeIpAllowlistResult"].is_object(), "{}", first.text);
}
