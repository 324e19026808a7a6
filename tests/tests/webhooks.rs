//! Webhook endpoints end to end: create, list, update (pause, rename, new URL), delete, the
//! per-organization limit, and the refusals (private targets, unsupported event types, filters)
//! that record nothing.

use coffer_tests::{RawResponse, Stack};
use serde_json::{json, Value};
use turnkey_api_key_stamper::TurnkeyP256ApiKey;

async fn submit(stack: &Stack, key: &TurnkeyP256ApiKey, path: &str, ty: &str, parameters: Value) -> RawResponse {
    let body = json!({
        "type": ty,
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": stack.organization_id,
        "parameters": parameters,
    });
    stack.post_raw(&format!("/public/v1/submit/{path}"), body.to_string().as_bytes(), Some(key)).await
}

async fn create(stack: &Stack, key: &TurnkeyP256ApiKey, parameters: Value) -> RawResponse {
    submit(stack, key, "create_webhook_endpoint", "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT", parameters).await
}

async fn endpoints(stack: &Stack, key: &TurnkeyP256ApiKey) -> Vec<Value> {
    let body = json!({"organizationId": stack.organization_id});
    let r = stack.post_raw("/public/v1/query/list_webhook_endpoints", body.to_string().as_bytes(), Some(key)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["webhookEndpoints"].as_array().unwrap().clone()
}

#[track_caller]
fn refused(r: &RawResponse, status: u16, needle: &str) {
    assert_eq!(r.status, status, "{}", r.text);
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    let m = r.json["message"].as_str().unwrap_or_default();
    assert!(m.contains(needle), "message {m:?} should contain {needle:?}");
}

#[tokio::test]
async fn endpoints_are_created_listed_updated_deleted_and_private_targets_refused() {
    let stack = Stack::start().await;
    let key = stack.api_key();
    let sub = |event: &str| json!({"eventType": event});

    // Targets a webhook may not reach, with the development setting off (the default).
    for url in [
        "http://hooks.example.com/coffer",
        "https://127.0.0.1/hook",
        "https://10.0.0.1/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/hook",
        "https://user:secret@hooks.example.com/hook",
        "https://localhost/hook",
        "hooks.example.com/relative",
    ] {
        let r =
            create(&stack, &key, json!({"url": url, "name": "x", "subscriptions": [sub("ACTIVITY_UPDATES")]})).await;
        assert_eq!(r.status, 400, "{url}: {}", r.text);
        assert_eq!(r.json["code"], 3, "{url}");
    }
    let r = create(
        &stack,
        &key,
        json!({"url": "https://hooks.example.com/a", "name": "x", "subscriptions": [sub("BALANCE_CONFIRMED_UPDATES")]}),
    )
    .await;
    refused(&r, 400, "chain indexer");
    let r = create(
        &stack,
        &key,
        json!({"url": "https://hooks.example.com/a", "name": "x", "subscriptions": [sub("ACTIVITY_UPDATE")]}),
    )
    .await;
    refused(&r, 400, "unknown webhook event type");
    let bad_filter = json!({"eventType": "ACTIVITY_UPDATES", "filtersJson": "{\"organizationIds\":[]}"});
    let r =
        create(&stack, &key, json!({"url": "https://hooks.example.com/a", "name": "x", "subscriptions": [bad_filter]}))
            .await;
    refused(&r, 400, "invalid filtersJson");
    let r = create(&stack, &key, json!({"url": "https://hooks.example.com/a", "name": "", "subscriptions": []})).await;
    refused(&r, 400, "name is required");
    assert!(endpoints(&stack, &key).await.is_empty(), "a refusal records nothing");

    // Create: active unless told otherwise, subscriptions as given.
    let filters = "{\"activityTypes\":[\"ACTIVITY_TYPE_CREATE_WALLET\"]}";
    let r = create(
        &stack,
        &key,
        json!({"url": "https://hooks.example.com/coffer", "name": "payments", "subscriptions": [
            {"eventType": "ACTIVITY_UPDATES", "filtersJson": filters},
            {"eventType": "ACTIVITY_UPDATES", "isActive": false},
        ]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let result = &r.json["activity"]["result"]["createWebhookEndpointResult"];
    let id = result["endpointId"].as_str().unwrap().to_string();
    assert_eq!(result["webhookEndpoint"]["endpointId"], id.as_str());
    let listed = endpoints(&stack, &key).await;
    assert_eq!(listed.len(), 1);
    let e = &listed[0];
    assert_eq!(e["endpointId"], id.as_str());
    assert_eq!(e["organizationId"], stack.organization_id.as_str());
    assert_eq!(
        (e["url"].as_str(), e["name"].as_str(), e["isActive"].as_bool()),
        (Some("https://hooks.example.com/coffer"), Some("payments"), Some(true))
    );
    assert_eq!(
        e["subscriptions"],
        json!([
            {"eventType": "ACTIVITY_UPDATES", "filtersJson": filters, "isActive": true},
            {"eventType": "ACTIVITY_UPDATES", "filtersJson": "", "isActive": false},
        ])
    );
    assert!(e["createdAt"]["seconds"].as_str().is_some() && e["updatedAt"]["nanos"].as_str().is_some(), "{e}");

    // Update: supplied fields replace, absent ones stay; a private URL is refused there too.
    let update = |params: Value| {
        submit(&stack, &key, "update_webhook_endpoint", "ACTIVITY_TYPE_UPDATE_WEBHOOK_ENDPOINT", params)
    };
    let r = update(json!({"endpointId": id, "isActive": false})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = update(json!({"endpointId": id, "name": "payments-v2"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = update(json!({"endpointId": id, "url": "https://10.1.1.1/x"})).await;
    refused(&r, 400, "private");
    let e = &endpoints(&stack, &key).await[0];
    assert_eq!(
        (e["url"].as_str(), e["name"].as_str(), e["isActive"].as_bool()),
        (Some("https://hooks.example.com/coffer"), Some("payments-v2"), Some(false))
    );
    assert_eq!(e["subscriptions"].as_array().unwrap().len(), 2, "subscriptions unchanged");
    let r = update(json!({"endpointId": id, "url": "https://hooks2.example.com/coffer"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(endpoints(&stack, &key).await[0]["url"], "https://hooks2.example.com/coffer");
    let unknown = "00000000-0000-4000-8000-000000000000";
    refused(&update(json!({"endpointId": unknown, "isActive": true})).await, 404, unknown);

    // At most 10 per organization (the default setting).
    for i in 1..10 {
        let r = create(&stack, &key, json!({"url": format!("https://hooks.example.com/{i}"), "name": format!("n{i}")}))
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = create(&stack, &key, json!({"url": "https://hooks.example.com/11", "name": "one too many"})).await;
    refused(&r, 400, "at most 10 webhook endpoints");
    assert_eq!(endpoints(&stack, &key).await.len(), 10);

    // Delete.
    let delete = |params: Value| {
        submit(&stack, &key, "delete_webhook_endpoint", "ACTIVITY_TYPE_DELETE_WEBHOOK_ENDPOINT", params)
    };
    let r = delete(json!({"endpointId": id})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["activity"]["result"]["deleteWebhookEndpointResult"]["endpointId"], id.as_str());
    let left = endpoints(&stack, &key).await;
    assert_eq!(left.len(), 9);
    assert!(left.iter().all(|e| e["endpointId"] != id.as_str()));
    refused(&delete(json!({"endpointId": id})).await, 404, &id);
}

/// The webhook signing key's JWKS: unstamped, cacheable, one Ed25519 key with a stable id whose
/// `x` is a valid curve point (the private half never leaves the enclave's HSM).
#[tokio::test]
async fn the_webhook_key_is_published_as_a_jwks() {
    use base64::Engine;
    let stack = Stack::start().await;
    let get = || reqwest::get(format!("{}/public/v1/discovery/webhooks/jwks", stack.base_url));
    let r = get().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["cache-control"], "public, max-age=86400, s-maxage=86400, stale-if-error=604800");
    let jwks: Value = r.json().await.unwrap();
    let keys = jwks["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{jwks}");
    let k = &keys[0];
    for (field, value) in [
        ("kty", "OKP"),
        ("crv", "Ed25519"),
        ("alg", "EdDSA"),
        ("use", "sig"),
        ("turnkey_signature_algorithm", "ed25519"),
        ("turnkey_signature_version", "v1"),
    ] {
        assert_eq!(k[field], value, "{field}: {jwks}");
    }
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(k["x"].as_str().unwrap()).unwrap();
    let x: [u8; 32] = x.try_into().unwrap();
    ed25519_dalek::VerifyingKey::from_bytes(&x).expect("a valid Ed25519 public key");
    let again: Value = get().await.unwrap().json().await.unwrap();
    assert_eq!(again, jwks, "the key and its id are stable");
    assert!(k["kid"].as_str().unwrap().starts_with("coffer-webhook-"));
}
