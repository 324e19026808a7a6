//! Webhook endpoints end to end: create, list, update (pause, rename, new URL), delete, the
//! per-organization limit, and the refusals (private targets, unsupported event types, filters)
//! that record nothing.

use std::time::Duration;

use coffer_tests::{refused_raw, settled, RawResponse, Stack};
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

/// A refusal of a malformed or unknown request ([`refused_raw`] with `REQUEST_INVALID`).
#[track_caller]
fn refused(r: &RawResponse, status: u16, needle: &str) {
    refused_raw(r, status, "REQUEST_INVALID", needle);
}

/// What the receiver saw, once it has seen at least `at_least` requests (the receiver's count
/// is awaited, up to `within`) and then nothing new for 2 s: a late duplicate or a stray delivery
/// would be in it. The caller asserts the exact contents.
async fn settled_seen(seen: &Seen, at_least: usize, within: Duration) -> Vec<Request> {
    seen.reach(at_least, within).await;
    settled("the receiver's requests", || async { seen.all().len() }, Duration::from_secs(2)).await;
    seen.all()
}

#[tokio::test]
async fn endpoints_are_created_listed_updated_deleted_and_private_targets_refused() {
    let stack = Stack::start().await;
    let key = stack.api_key();
    let sub = |event: &str| json!({"eventType": event});
    let activities = stack.activities(&key, &stack.organization_id).await;

    // Targets a webhook may not reach, with the development setting off (the default).
    const PRIVATE: &str = "url host is a loopback, private, link-local or metadata address";
    for (url, why) in [
        ("http://hooks.example.com/coffer", "url must use https://"),
        ("https://127.0.0.1/hook", PRIVATE),
        ("https://10.0.0.1/hook", PRIVATE),
        ("https://169.254.169.254/latest/meta-data", PRIVATE),
        ("https://[::1]/hook", PRIVATE),
        ("https://user:secret@hooks.example.com/hook", "url must not carry a user name or password"),
        ("https://localhost/hook", PRIVATE),
        ("hooks.example.com/relative", "url is not an absolute URL"),
    ] {
        let r =
            create(&stack, &key, json!({"url": url, "name": "x", "subscriptions": [sub("ACTIVITY_UPDATES")]})).await;
        refused(&r, 400, why);
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
    assert_eq!(stack.activities(&key, &stack.organization_id).await, activities, "nor an activity");

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
    // The checks above see what is there: this endpoint, and its activity.
    let listed = endpoints(&stack, &key).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(stack.activity_count(&key, &stack.organization_id).await, activities.len() + 1);
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
    let full = endpoints(&stack, &key).await;
    assert_eq!(full.len(), 10);
    let r = create(&stack, &key, json!({"url": "https://hooks.example.com/11", "name": "one too many"})).await;
    refused(&r, 400, "at most 10 webhook endpoints");
    assert_eq!(endpoints(&stack, &key).await, full);

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

/// A request a local receiver saw: its path, headers (lowercase names) and body.
type Request = (String, std::collections::HashMap<String, String>, String);

/// What a local receiver saw, and a count of it the test waits on.
#[derive(Clone)]
struct Seen {
    requests: std::sync::Arc<std::sync::Mutex<Vec<Request>>>,
    count: std::sync::Arc<tokio::sync::watch::Sender<usize>>,
}

impl Seen {
    fn new() -> Self {
        Self { requests: Default::default(), count: std::sync::Arc::new(tokio::sync::watch::Sender::new(0)) }
    }

    fn push(&self, r: Request) {
        self.requests.lock().unwrap().push(r);
        self.count.send_modify(|n| *n += 1);
    }

    fn all(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// Waits until at least `n` requests have arrived or `within` has passed (the caller then
    /// asserts what did arrive).
    async fn reach(&self, n: usize, within: Duration) {
        let mut changes = self.count.subscribe();
        let _ = tokio::time::timeout(within, changes.wait_for(|c| *c >= n)).await;
    }
}

/// A receiver on 127.0.0.1 answering each path with the statuses given in turn (the last one
/// repeats).
async fn receiver(plan: &[(&'static str, Vec<u16>)]) -> (String, Seen) {
    receiver_on(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(), plan)
}

/// [`receiver`] on a listener of the caller's.
fn receiver_on(listener: tokio::net::TcpListener, plan: &[(&'static str, Vec<u16>)]) -> (String, Seen) {
    use axum::http::StatusCode;
    let seen = Seen::new();
    let plan: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<u16>>>> =
        std::sync::Arc::new(std::sync::Mutex::new(plan.iter().map(|(p, s)| (p.to_string(), s.clone())).collect()));
    let (seen2, plan2) = (seen.clone(), plan.clone());
    let app =
        axum::Router::new().fallback(move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: String| {
            let (seen, plan) = (seen2.clone(), plan2.clone());
            async move {
                let path = uri.path().to_string();
                let headers = headers
                    .iter()
                    .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or_default().to_string()))
                    .collect();
                seen.push((path.clone(), headers, body));
                let status = {
                    let mut plan = plan.lock().unwrap();
                    let statuses = plan.get_mut(&path).expect("a planned path");
                    if statuses.len() > 1 {
                        statuses.remove(0)
                    } else {
                        statuses[0]
                    }
                };
                if status == 0 {
                    // 0 in a plan: take the request and never answer.
                    std::future::pending::<()>().await;
                }
                StatusCode::from_u16(status).unwrap()
            }
        });
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

/// An endpoint's deliveries as `coffer_list_webhook_deliveries` shows them once `done` holds for
/// them, or as they are after `within` (the caller's assertions then say what is missing). The
/// outbox is seen only through the API, so it is read until then.
async fn deliveries_once(
    stack: &Stack,
    key: &TurnkeyP256ApiKey,
    endpoint: &str,
    within: Duration,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let body = json!({"organizationId": stack.organization_id, "endpointId": endpoint});
    let deadline = std::time::Instant::now() + within;
    loop {
        let r = stack
            .post_raw("/public/v1/query/coffer_list_webhook_deliveries", body.to_string().as_bytes(), Some(key))
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let list = r.json["deliveries"].as_array().unwrap().clone();
        if done(&list) || std::time::Instant::now() > deadline {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// An endpoint's deliveries once none is pending (attempts are recorded shortly after they
/// end), or after 10 s.
async fn settled_deliveries(stack: &Stack, key: &TurnkeyP256ApiKey, endpoint: String) -> Vec<Value> {
    deliveries_once(stack, key, &endpoint, Duration::from_secs(10), |list| {
        list.iter().all(|d| d["status"] != "PENDING")
    })
    .await
}

/// Deliveries: signed with the published key (checked here with ed25519-dalek), retried with
/// the same event id after a 503, stopped by a 400, none for a paused endpoint, and visible to
/// operators through `coffer_list_webhook_deliveries`.
#[tokio::test]
async fn activity_updates_are_delivered_signed_retried_and_stopped() {
    use base64::Engine;
    let stack = Stack::start_with(&[("COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS", "true")]).await;
    let key = stack.api_key();
    let (base, seen) = receiver(&[("/retry", vec![503, 200]), ("/refuse", vec![400]), ("/paused", vec![200])]).await;
    let mut ids = std::collections::HashMap::new();
    // Only policy creations: the endpoints' own creation and update are not what is tested here.
    let policies_only = json!({"eventType": "ACTIVITY_UPDATES", "filtersJson": "{\"activityTypes\":[\"ACTIVITY_TYPE_CREATE_POLICY_V3\"]}"});
    for path in ["/retry", "/refuse", "/paused"] {
        let r = create(
            &stack,
            &key,
            json!({"url": format!("{base}{path}"), "name": path, "subscriptions": [policies_only.clone()]}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
        ids.insert(
            path,
            r.json["activity"]["result"]["createWebhookEndpointResult"]["endpointId"].as_str().unwrap().to_string(),
        );
    }
    let r = submit(
        &stack,
        &key,
        "update_webhook_endpoint",
        "ACTIVITY_TYPE_UPDATE_WEBHOOK_ENDPOINT",
        json!({"endpointId": ids["/paused"], "isActive": false}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);

    // One activity after the endpoints exist (their own creation is not reported to them).
    let r = submit(
        &stack,
        &key,
        "create_policy",
        "ACTIVITY_TYPE_CREATE_POLICY_V3",
        json!({
        "policyName": "webhook-test", "effect": "EFFECT_ALLOW", "condition": "false", "notes": ""}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let activity_id = r.json["activity"]["id"].as_str().unwrap().to_string();

    // /retry's two attempts and /refuse's one, then nothing more for 2 s.
    let all = settled_seen(&seen, 3, Duration::from_secs(15)).await;
    let on = |path: &str| all.iter().filter(|(p, ..)| p == path).cloned().collect::<Vec<_>>();
    assert_eq!(all.len(), 3, "{all:?}");
    let retry = on("/retry");
    assert_eq!(retry.len(), 2, "a 503, then the retry that got a 200");
    let jwks: Value = reqwest::get(format!("{}/public/v1/discovery/webhooks/jwks", stack.base_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(jwks["keys"][0]["x"].as_str().unwrap()).unwrap();
    let verifying = ed25519_dalek::VerifyingKey::from_bytes(&x.try_into().unwrap()).unwrap();
    for (_, h, body) in &retry {
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h["x-turnkey-organization-id"], stack.organization_id);
        assert_eq!(h["x-turnkey-event-type"], "ACTIVITY_UPDATES");
        assert_eq!(h["x-turnkey-webhook-version"], "1");
        assert_eq!(h["x-turnkey-signature-algorithm"], "ed25519");
        assert_eq!(h["x-turnkey-signature-version"], "v1");
        assert_eq!(h["x-turnkey-signature-key-id"], jwks["keys"][0]["kid"].as_str().unwrap());
        let message = format!(
            "v1.ed25519.{}.{}.{}.{body}",
            h["x-turnkey-signature-key-id"], h["x-turnkey-timestamp"], h["x-turnkey-event-id"]
        );
        let signature: [u8; 64] = hex::decode(&h["x-turnkey-signature"]).unwrap().try_into().unwrap();
        verifying
            .verify_strict(message.as_bytes(), &ed25519_dalek::Signature::from_bytes(&signature))
            .expect("signature verifies against the JWKS key");
        let activity: Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            (activity["id"].as_str(), activity["status"].as_str()),
            (Some(activity_id.as_str()), Some("ACTIVITY_STATUS_COMPLETED"))
        );
        assert_eq!(activity["type"], "ACTIVITY_TYPE_CREATE_POLICY_V3");
    }
    assert_eq!(retry[0].1["x-turnkey-event-id"], retry[1].1["x-turnkey-event-id"], "the same event id across retries");
    assert_ne!(retry[0].1["x-turnkey-timestamp"], retry[1].1["x-turnkey-timestamp"], "a fresh timestamp per attempt");

    let refused = on("/refuse");
    assert_eq!(refused.len(), 1, "a 400 is final");
    assert_ne!(refused[0].1["x-turnkey-event-id"], retry[0].1["x-turnkey-event-id"], "event ids are per endpoint");
    assert!(on("/paused").is_empty(), "a paused endpoint receives nothing");

    let deliveries = |endpoint: &str| settled_deliveries(&stack, &key, endpoint.to_string());
    let d = deliveries(&ids["/refuse"]).await;
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0]["status"].as_str(), d[0]["attempts"].as_i64(), d[0]["lastStatusCode"].as_i64()),
        (Some("FAILED"), Some(1), Some(400))
    );
    assert_eq!(d[0]["activityId"], activity_id.as_str());
    let d = deliveries(&ids["/retry"]).await;
    assert_eq!(
        (d[0]["status"].as_str(), d[0]["attempts"].as_i64(), d[0]["lastStatusCode"].as_i64()),
        (Some("DELIVERED"), Some(2), Some(200))
    );
    assert!(deliveries(&ids["/paused"]).await.is_empty());
}

/// A sub-organization's activity reaches its parent's endpoint; a delivery pending when the
/// gateway is killed (-9) is delivered after it restarts.
#[tokio::test]
async fn sub_organization_events_reach_the_parent_and_survive_a_gateway_crash() {
    let mut stack = Stack::start_with(&[("COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS", "true")]).await;
    let key = stack.api_key();
    // The receiver is down at first: nothing listens on this port yet.
    let port = coffer_tests::free_port();
    let policies_only = json!({"eventType": "ACTIVITY_UPDATES", "filtersJson": "{\"activityTypes\":[\"ACTIVITY_TYPE_CREATE_POLICY_V3\"]}"});
    let r = create(
        &stack,
        &key,
        json!({"url": format!("http://127.0.0.1:{port}/parent"), "name": "parent", "subscriptions": [policies_only]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let endpoint =
        r.json["activity"]["result"]["createWebhookEndpointResult"]["endpointId"].as_str().unwrap().to_string();
    // A second receiver is up but holds the first request without answering: the gateway dies
    // with that event in hand and no attempt recorded.
    let (held_base, held_seen) = receiver(&[("/held", vec![0, 200])]).await;
    let r = create(
        &stack,
        &key,
        json!({"url": format!("{held_base}/held"), "name": "held", "subscriptions": [policies_only.clone()]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let held_endpoint =
        r.json["activity"]["result"]["createWebhookEndpointResult"]["endpointId"].as_str().unwrap().to_string();

    // A sub-organization whose root is a new key of the test's, and a policy created in it.
    let sub_key = TurnkeyP256ApiKey::generate();
    let r = submit(&stack, &key, "create_sub_organization", "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8", json!({
        "subOrganizationName": "child", "rootQuorumThreshold": 1,
        "rootUsers": [{"userName": "child-root", "apiKeys": [{"apiKeyName": "k", "publicKey": hex::encode(sub_key.compressed_public_key()), "curveType": "API_KEY_CURVE_P256"}], "authenticators": [], "oauthProviders": []}],
    })).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let child = r.json["activity"]["result"]["createSubOrganizationResultV8"]["subOrganizationId"]
        .as_str()
        .unwrap()
        .to_string();
    let body = json!({
        "type": "ACTIVITY_TYPE_CREATE_POLICY_V3", "timestampMs": Stack::now_ms().to_string(), "organizationId": child,
        "parameters": {"policyName": "in-child", "effect": "EFFECT_ALLOW", "condition": "false", "notes": ""},
    });
    let r = stack.post_raw("/public/v1/submit/create_policy", body.to_string().as_bytes(), Some(&sub_key)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let activity_id = r.json["activity"]["id"].as_str().unwrap().to_string();

    // The first attempt to the parent's endpoint fails (connection refused) and a retry is
    // scheduled, recorded in the outbox; the held receiver has the event and has not answered;
    // then the gateway dies.
    held_seen.reach(1, Duration::from_secs(10)).await;
    assert_eq!(held_seen.all().len(), 1, "the held receiver got the event before the crash");
    let refused = deliveries_once(&stack, &key, &endpoint, Duration::from_secs(10), |list| {
        list.iter().any(|d| d["attempts"].as_i64() >= Some(1))
    })
    .await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["status"], "PENDING", "the refused attempt is recorded, a retry pending: {refused:?}");
    assert!(refused[0]["attempts"].as_i64() >= Some(1), "the refused attempt is recorded: {refused:?}");
    stack.kill_gateway();
    stack.start_gateway();
    stack.wait_healthy().await;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let (base, seen) = receiver_on(listener, &[("/parent", vec![200])]);
    let got = settled_seen(&seen, 1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1, "delivered once after the restart, and not again ({base}): {got:?}");
    let (path, headers, body) = &got[0];
    assert_eq!(path, "/parent");
    assert_eq!(headers["x-turnkey-organization-id"], child, "the activity's own organization");
    let activity: Value = serde_json::from_str(body).unwrap();
    assert_eq!(activity["id"], activity_id.as_str());
    assert_eq!(activity["organizationId"], child.as_str());

    let d = &settled_deliveries(&stack, &key, endpoint.clone()).await[0];
    assert_eq!(d["status"], "DELIVERED", "{d}");
    assert!(d["attempts"].as_i64().unwrap() >= 2, "at least the refused attempt and the delivery: {d}");

    // The event the dead gateway held is sent again by the new one, long before its lease
    // (a minute) would have lapsed: same event id, answered this time, and not sent a third time.
    let held = settled_seen(&held_seen, 2, Duration::from_secs(20)).await;
    assert_eq!(held.len(), 2, "sent again after the restart, once: {held:?}");
    assert_eq!(held[0].1["x-turnkey-event-id"], held[1].1["x-turnkey-event-id"], "the same event");
    assert_eq!(serde_json::from_str::<Value>(&held[1].2).unwrap()["id"], activity_id.as_str());
    let d = &settled_deliveries(&stack, &key, held_endpoint).await[0];
    assert_eq!((d["status"].as_str(), d["attempts"].as_i64()), (Some("DELIVERED"), Some(1)), "{d}");
}

/// An activity that waits for consensus is reported twice: when it starts waiting and when the
/// second root's approval completes it.
#[tokio::test]
async fn consensus_is_reported_when_it_waits_and_when_it_completes() {
    let stack = Stack::start_with(&[("COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS", "true")]).await;
    let key = stack.api_key();
    let (base, seen) = receiver(&[("/hook", vec![200])]).await;
    let policies_only = json!({"eventType": "ACTIVITY_UPDATES", "filtersJson": "{\"activityTypes\":[\"ACTIVITY_TYPE_CREATE_POLICY_V3\"]}"});
    let r = create(
        &stack,
        &key,
        json!({"url": format!("{base}/hook"), "name": "quorum", "subscriptions": [policies_only]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);

    // A second root user, and a root quorum of two.
    let second = TurnkeyP256ApiKey::generate();
    let r = submit(&stack, &key, "create_users", "ACTIVITY_TYPE_CREATE_USERS_V4", json!({"users": [{
        "userName": "second-root", "userTags": [], "authenticators": [], "oauthProviders": [],
        "apiKeys": [{"apiKeyName": "k", "publicKey": hex::encode(second.compressed_public_key()), "curveType": "API_KEY_CURVE_P256"}],
    }]})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let second_id = r.json["activity"]["result"]["createUsersResult"]["userIds"][0].as_str().unwrap().to_string();
    let r = submit(
        &stack,
        &key,
        "update_root_quorum",
        "ACTIVITY_TYPE_UPDATE_ROOT_QUORUM",
        json!({"threshold": 2, "userIds": [stack.user_id, second_id]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);

    let r = submit(
        &stack,
        &key,
        "create_policy",
        "ACTIVITY_TYPE_CREATE_POLICY_V3",
        json!({
        "policyName": "needs-two", "effect": "EFFECT_ALLOW", "condition": "false", "notes": ""}),
    )
    .await;
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_CONSENSUS_NEEDED", "{}", r.text);
    let (activity_id, fingerprint) = (
        r.json["activity"]["id"].as_str().unwrap().to_string(),
        r.json["activity"]["fingerprint"].as_str().unwrap().to_string(),
    );
    let approve = json!({"type": "ACTIVITY_TYPE_APPROVE_ACTIVITY", "timestampMs": Stack::now_ms().to_string(),
        "organizationId": stack.organization_id, "parameters": {"fingerprint": fingerprint}});
    let r = stack.post_raw("/public/v1/submit/approve_activity", approve.to_string().as_bytes(), Some(&second)).await;
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{}", r.text);

    let got = settled_seen(&seen, 2, Duration::from_secs(10)).await;
    let statuses: std::collections::BTreeSet<String> = got
        .iter()
        .map(|(_, _, body)| {
            let a: Value = serde_json::from_str(body).unwrap();
            assert_eq!(a["id"], activity_id.as_str());
            a["status"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(got.len(), 2, "two events");
    assert_eq!(statuses, ["ACTIVITY_STATUS_COMPLETED", "ACTIVITY_STATUS_CONSENSUS_NEEDED"].map(String::from).into());
    assert_ne!(got[0].1["x-turnkey-event-id"], got[1].1["x-turnkey-event-id"], "one event id per event");
}

/// Two gateways on one PostgreSQL database, one endpoint that refuses the first attempts: every
/// event submitted through either gateway is delivered, and none twice, though both gateways
/// poll the one outbox for the retries (each due retry is claimed by one of them).
#[tokio::test]
async fn on_postgres_two_gateways_deliver_each_event_once() {
    let stack = Stack::start_on("postgres", &[("COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS", "true")]).await;
    let key = stack.api_key();
    let (second, _second_gateway) = stack.spawn_gateway().await;
    const REFUSED: usize = 6;
    let mut plan = vec![503; REFUSED];
    plan.push(200);
    let (base, seen) = receiver(&[("/once", plan)]).await;
    let policies_only = json!({"eventType": "ACTIVITY_UPDATES", "filtersJson": "{\"activityTypes\":[\"ACTIVITY_TYPE_CREATE_POLICY_V3\"]}"});
    let r =
        create(&stack, &key, json!({"url": format!("{base}/once"), "name": "once", "subscriptions": [policies_only]}))
            .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let endpoint =
        r.json["activity"]["result"]["createWebhookEndpointResult"]["endpointId"].as_str().unwrap().to_string();

    const EVENTS: usize = 12;
    let mut activity_ids = Vec::new();
    for i in 0..EVENTS {
        let body = json!({
            "type": "ACTIVITY_TYPE_CREATE_POLICY_V3", "timestampMs": Stack::now_ms().to_string(),
            "organizationId": stack.organization_id,
            "parameters": {"policyName": format!("p{i}"), "effect": "EFFECT_ALLOW", "condition": "false", "notes": ""},
        });
        let gateway = if i % 2 == 0 { &stack.base_url } else { &second };
        let r =
            coffer_tests::post_to(gateway, "/public/v1/submit/create_policy", body.to_string().as_bytes(), Some(&key))
                .await;
        assert_eq!(r.status, 200, "{}", r.text);
        activity_ids.push(r.json["activity"]["id"].as_str().unwrap().to_string());
    }
    // The refused attempts come due again about a second later (then two, four...).
    let settled = deliveries_once(&stack, &key, &endpoint, Duration::from_secs(30), |list| {
        list.len() == EVENTS && list.iter().all(|d| d["status"] == "DELIVERED")
    })
    .await;
    assert_eq!(settled.len(), EVENTS, "{settled:?}");
    assert!(settled.iter().all(|d| d["status"] == "DELIVERED"), "{settled:?}");
    // Settled: a duplicate (a retry sent by both gateways) would arrive within the quiet time.
    let got = settled_seen(&seen, EVENTS + REFUSED, Duration::from_secs(10)).await;
    let mut per_event: std::collections::HashMap<String, usize> = Default::default();
    for (_, headers, _) in &got {
        *per_event.entry(headers["x-turnkey-event-id"].clone()).or_default() += 1;
    }
    assert_eq!(per_event.len(), EVENTS, "every event reached the receiver");
    assert_eq!(
        got.len(),
        EVENTS + REFUSED,
        "one answered attempt per event, besides the {REFUSED} refused: {per_event:?}"
    );
    let attempts: i64 = settled.iter().map(|d| d["attempts"].as_i64().unwrap()).sum();
    assert_eq!(attempts as usize, EVENTS + REFUSED, "the outbox counts the same attempts");
    let delivered: std::collections::HashSet<String> = got
        .iter()
        .map(|(_, _, body)| serde_json::from_str::<Value>(body).unwrap()["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(delivered, activity_ids.iter().cloned().collect(), "the events are the activities");
}

/// Concurrent creations cannot pass the per-organization cap: 40 at once against the default
/// cap of 10 (on PostgreSQL through two gateways) leave exactly 10 endpoints, in the gateway's
/// store, in the enclave's authority state and through the API. The enclave decides, on the
/// state version it commits on; the others are refused with a JSON 400 naming the limit.
#[tokio::test]
async fn concurrent_creations_never_pass_the_endpoint_cap() {
    const CAP: usize = 10;
    const TRIES: usize = 40;
    let stack = std::sync::Arc::new(Stack::start().await);
    let key = stack.api_key();
    let second = stack.second_gateway_on_postgres().await;
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..TRIES {
        let stack = stack.clone();
        let base = match (&second, i % 2) {
            (Some((url, _)), 1) => url.clone(),
            _ => stack.base_url.clone(),
        };
        burst.spawn(async move {
            let body = json!({
                "type": "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT",
                "timestampMs": Stack::now_ms().to_string(),
                "organizationId": stack.organization_id,
                "parameters": {"url": format!("https://hooks.example.com/{i}"), "name": format!("n{i}")},
            });
            let key = stack.api_key();
            let path = "/public/v1/submit/create_webhook_endpoint";
            coffer_tests::post_to(&base, path, body.to_string().as_bytes(), Some(&key)).await
        });
    }
    let mut created = 0;
    while let Some(r) = burst.join_next().await {
        let r = r.unwrap();
        match r.status {
            200 => created += 1,
            _ => refused(&r, 400, "at most 10 webhook endpoints"),
        }
    }
    let org = stack.organization_id.clone();
    let stored = stack.stored_record_count(&org, "webhook_endpoint");
    let in_state = stack.authority_entry_count(&org, "webhook_endpoint");
    let listed = endpoints(&stack, &key).await.len();
    assert_eq!(
        (created, stored, in_state, listed),
        (CAP, CAP, CAP, CAP),
        "{TRIES} concurrent creations at a cap of {CAP}: (created, gateway store, authority state, listed)"
    );
    stack.refusals_accounted();
    // Full: the next one is refused too.
    let r = create(&stack, &key, json!({"url": "https://hooks.example.com/late", "name": "late"})).await;
    refused(&r, 400, "at most 10 webhook endpoints");
}

/// The cap is the enclave's own setting: with the enclave's at 3 and the gateway's at its
/// default 10, the fourth creation passes the gateway and the enclave refuses it
/// (`REFUSAL_REASON_LIMIT_EXCEEDED`), a JSON 400 naming the limit; nothing is recorded.
#[tokio::test]
async fn the_enclave_decides_the_endpoint_cap() {
    let stack = Stack::start_with(&[("COFFER_MAX_WEBHOOK_ENDPOINTS_PER_ORGANIZATION", "3")]).await;
    let key = stack.api_key();
    for i in 0..3 {
        let r = create(&stack, &key, json!({"url": format!("https://hooks.example.com/{i}"), "name": "n"})).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let activities = stack.activity_count(&key, &stack.organization_id).await;
    stack.refusals_accounted();
    let r = create(&stack, &key, json!({"url": "https://hooks.example.com/3", "name": "n"})).await;
    refused(&r, 400, "max_webhook_endpoints_per_organization");
    stack.refused_for(&r, 400, "REQUEST_INVALID", coffer_proto::v1::RefusalReason::LimitExceeded);
    let org = stack.organization_id.clone();
    assert_eq!(stack.stored_record_count(&org, "webhook_endpoint"), 3);
    assert_eq!(stack.authority_entry_count(&org, "webhook_endpoint"), 3);
    assert_eq!(endpoints(&stack, &key).await.len(), 3);
    assert_eq!(stack.activity_count(&key, &stack.organization_id).await, activities, "the refusal records nothing");
    // An update of an endpoint at the cap changes no count: allowed.
    let id = endpoints(&stack, &key).await[0]["endpointId"].as_str().unwrap().to_string();
    let r = submit(
        &stack,
        &key,
        "update_webhook_endpoint",
        "ACTIVITY_TYPE_UPDATE_WEBHOOK_ENDPOINT",
        json!({"endpointId": id, "name": "renamed"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
}
