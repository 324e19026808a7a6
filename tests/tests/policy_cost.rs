//! End to end: what policies cost the gateway (issue 23). Evaluation runs on a pool of its own,
//! so expensive dry runs leave `/healthz` answering and another organization's evaluations
//! served (one organization gets at most its share of the pool); an organization's policy count
//! is capped; the compiled-policy cache is bounded by bytes, so many large policies do not grow
//! the gateway's memory without bound.
//!
//! One stack for the file: a pool of 2 threads, 1 per organization (the defaults on 2 cores,
//! set explicitly so the test means the same on any machine), a 1,000-policy cap and a 48 MiB
//! cache.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coffer_tests::{post_to, refused_raw, submit, RawResponse, Stack};
use serde_json::{json, Value};
use turnkey_client::TurnkeyP256ApiKey;

const MAX_POLICIES: usize = 1_000;
const CACHE_MIB: usize = 48;

/// An expensive policy that stays within the evaluator's step budget (20,000), so it costs time
/// whatever the budget charges: a list of `n` zeros quantified, a few steps per element. It
/// applies to every activity type. `i` makes each text its own: one decision evaluates a text
/// once and shares its value with every policy that has it (`coffer_policy::decision`), so copies
/// of one text would cost one evaluation.
fn expensive(n: usize, i: usize) -> String {
    format!("[{}0].all(x, x == 0) && {i} == {i}", "0,".repeat(n - 1))
}

/// Creates `conditions` as ALLOW policies in one `create_policies`; the raw answer.
async fn create_policies(
    stack: &Stack,
    key: &TurnkeyP256ApiKey,
    org: &str,
    prefix: &str,
    conditions: &[String],
) -> RawResponse {
    let policies: Vec<Value> = conditions
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"policyName": format!("{prefix}-{i}"), "effect": "EFFECT_ALLOW", "condition": c, "notes": ""}))
        .collect();
    submit(stack, key, org, "create_policies", "ACTIVITY_TYPE_CREATE_POLICIES", json!({"policies": policies})).await
}

fn completed(r: &RawResponse) {
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{}", r.text);
}

/// A non-root user of `org` with an API key (its activities are decided by the policies; a root
/// user's by the root quorum, which reads no policy).
async fn member(stack: &Stack, root: &TurnkeyP256ApiKey, org: &str, name: &str) -> TurnkeyP256ApiKey {
    let key = TurnkeyP256ApiKey::generate();
    let user = json!({"userName": name, "userEmail": format!("{name}@example.com"), "apiKeys": [{
        "apiKeyName": name, "publicKey": hex::encode(key.compressed_public_key()), "curveType": "API_KEY_CURVE_P256"}],
        "authenticators": [], "oauthProviders": [], "userTags": []});
    let r = submit(stack, root, org, "create_users", "ACTIVITY_TYPE_CREATE_USERS_V4", json!({"users": [user]})).await;
    completed(&r);
    key
}

/// A second root organization with its own root key (the operator's `init-org`).
fn organization(stack: &Stack, name: &str) -> (String, TurnkeyP256ApiKey) {
    let key = TurnkeyP256ApiKey::generate();
    let public = hex::encode(key.compressed_public_key());
    let created = stack.gateway_cli(&["init-org", "--name", name, "--api-public-key", &public]);
    (created["organizationId"].as_str().expect("organizationId").to_string(), key)
}

/// The body of a dry run of a wallet creation in `org`.
fn dry_run_body(org: &str) -> String {
    json!({"organizationId": org, "activity": {"type": "ACTIVITY_TYPE_CREATE_WALLET", "organizationId": org,
        "parameters": {"walletName": "dry", "accounts": []}}})
    .to_string()
}

/// The value of a metric line `name value` in the gateway's `/metrics`.
async fn metric(base_url: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base_url}/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// A gateway process's memory high-water mark, in MiB (`VmHWM`).
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb / 1024.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn evaluation_cost_stays_with_its_organization() {
    let stack = Stack::start_with(&[
        ("COFFER_POLICY_THREADS", "2"),
        ("COFFER_POLICY_THREADS_PER_ORGANIZATION", "1"),
        ("COFFER_MAX_POLICIES_PER_ORGANIZATION", &MAX_POLICIES.to_string()),
        ("COFFER_POLICY_CACHE_BYTES", &(CACHE_MIB << 20).to_string()),
    ])
    .await;
    let (root, org_a) = (stack.api_key(), stack.organization_id.clone());

    // (a), (b): organization A's expensive policies; B's cheap one.
    let costly: Vec<String> = (0..750).map(|i| expensive(3_000, i)).collect();
    for (i, chunk) in costly.chunks(50).enumerate() {
        completed(&create_policies(&stack, &root, &org_a, &format!("costly-{i}"), chunk).await);
    }
    let alice = member(&stack, &root, &org_a, "alice").await;
    let (org_b, root_b) = organization(&stack, "org-b");
    completed(&create_policies(&stack, &root_b, &org_b, "cheap", &["true".to_string()]).await);
    let bob = member(&stack, &root_b, &org_b, "bob").await;

    // One dry run alone: how long A's evaluation takes (and that it evaluates A's policies).
    let t = Instant::now();
    let r =
        stack.post_raw("/public/v1/query/coffer_policy_dry_run", dry_run_body(&org_a).as_bytes(), Some(&alice)).await;
    let alone = t.elapsed();
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["policies"].as_array().map(Vec::len), Some(750), "{}", r.text);
    eprintln!("one dry run of organization A alone: {alone:?}");

    // Four at once from A. Once one is being evaluated (the pool's wait count moved), /healthz
    // and B's dry run must both answer before any of A's finishes.
    let waits = "coffer_policy_evaluation_wait_seconds_count";
    let before = metric(&stack.base_url, waits).await;
    let finished = Arc::new(AtomicUsize::new(0));
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let (url, org, finished) = (stack.base_url.clone(), org_a.clone(), finished.clone());
            let key = TurnkeyP256ApiKey::from_strings(hex::encode(alice.private_key()), None).unwrap();
            tokio::spawn(async move {
                let r =
                    post_to(&url, "/public/v1/query/coffer_policy_dry_run", dry_run_body(&org).as_bytes(), Some(&key))
                        .await;
                finished.fetch_add(1, Ordering::SeqCst);
                r
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&stack.base_url, waits).await <= before {
        assert!(Instant::now() < deadline, "no evaluation of A's dry runs started in 30 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "a dry run of A finished before the probe saw one start (too cheap, or the probe was held up)"
    );
    let health = reqwest::get(format!("{}/healthz", stack.base_url)).await.unwrap();
    assert_eq!(health.status(), 200);
    let health_done = finished.load(Ordering::SeqCst);
    let b = stack.post_raw("/public/v1/query/coffer_policy_dry_run", dry_run_body(&org_b).as_bytes(), Some(&bob)).await;
    let b_done = finished.load(Ordering::SeqCst);
    assert_eq!(health_done, 0, "/healthz answered only after {health_done} of A's dry runs finished");
    assert_eq!(b.status, 200, "{}", b.text);
    assert_eq!(
        (b.json["decision"].as_str(), b.json["policies"].as_array().map(Vec::len)),
        (Some("DECISION_ALLOW"), Some(1))
    );
    assert_eq!(b_done, 0, "B's dry run answered only after {b_done} of A's dry runs finished");
    for run in runs {
        let r = run.await.unwrap();
        // Served in turn (one at a time for A), or shed with the 503 of an overloaded gateway.
        if r.status != 200 {
            refused_raw(&r, 503, "UNAVAILABLE", "overloaded: too many policy evaluation requests");
        }
    }

    // (c) The cap: A has 750; a batch that would pass 1,000 is refused whole, one that reaches it is
    // not, and then one more is refused.
    let small: Vec<String> =
        (0..251).map(|i| format!("activity.type == 'ACTIVITY_TYPE_CREATE_WALLET' && {i} == {i}")).collect();
    let r = create_policies(&stack, &root, &org_a, "over", &small).await;
    refused_raw(
        &r,
        400,
        "REQUEST_INVALID",
        &format!("too many policies: an organization may have at most {MAX_POLICIES}"),
    );
    completed(&create_policies(&stack, &root, &org_a, "fill", &small[..250]).await);
    let one = json!({"policyName": "one-more", "effect": "EFFECT_ALLOW", "condition": "true", "notes": ""});
    let r = submit(&stack, &root, &org_a, "create_policy", "ACTIVITY_TYPE_CREATE_POLICY_V3", one).await;
    refused_raw(&r, 400, "REQUEST_INVALID", "it has 1000, this adds 1");

    // (d) Memory: 20 organizations with 30 policies each at the literal-list cap (4,096 items,
    // the densest source: about 0.7 MB compiled each, 21 MB an organization), each organization
    // evaluated once. Cached whole they would hold over 400 MiB; the cache keeps at most 48 MiB,
    // so the peak grows by about that plus the set being evaluated.
    let (_, gateway) = stack.pids();
    let gateway = gateway.expect("gateway pid");
    let base = peak_rss_mib(gateway);
    let items = 4_096; // coffer_policy::MAX_LIST_LEN, the literal-list cap
    for i in 0..20 {
        let (org, key) = organization(&stack, &format!("large-{i}"));
        // Each source differs (a different last element), so nothing is shared between them.
        let conditions: Vec<String> =
            (0..30).map(|j| format!("[{}{}].count() > 0", "0,".repeat(items - 1), i * 100 + j)).collect();
        completed(&create_policies(&stack, &key, &org, "large", &conditions).await);
        let user = member(&stack, &key, &org, "user").await;
        let r =
            stack.post_raw("/public/v1/query/coffer_policy_dry_run", dry_run_body(&org).as_bytes(), Some(&user)).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json["policies"].as_array().map(Vec::len), Some(30), "{}", r.text);
    }
    let growth = peak_rss_mib(gateway) - base;
    eprintln!("gateway peak RSS growth over 20 organizations of large policies: {growth:.0} MiB (cache bound {CACHE_MIB} MiB)");
    assert!(growth < 200.0, "the gateway's peak RSS grew by {growth:.0} MiB over 20 organizations of large policies");
}
