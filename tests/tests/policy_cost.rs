//! End to end: what policies cost (issues 23 and 40). The enclave evaluates every policy; the
//! dry runs the gateway asks of it take slots of their own, so expensive dry runs leave
//! `/healthz` answering and another organization's served (one organization gets at most its
//! share of the slots); an organization's policy count is capped; the enclave's state cache,
//! compiled policies included, is bounded by bytes, so many large policies do not grow the
//! enclave's memory without bound.
//!
//! One stack for the file: 2 evaluation slots, 1 per organization (the defaults on 2 cores, set
//! explicitly so the test means the same on any machine), a 1,000-policy cap and a 48 MiB state
//! cache.

use std::time::{Duration, Instant};

use coffer_tests::{peak_rss_mib, post_to, refused_raw, submit, RawResponse, Stack};
use serde_json::{json, Value};
use turnkey_client::TurnkeyP256ApiKey;

const MAX_POLICIES: usize = 1_000;
const CACHE_MIB: usize = 48;
/// Organization A's expensive policies: about 6 KB each, 150 KB of text, within the text cap
/// and the state's weight the cache keeps (half of it; literal lists weigh about 96 bytes a
/// byte of text compiled: 14.5 MB).
const COSTLY: usize = 25;

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

/// The gateway's evaluation slots' counters, from one reading of the gateway's `/metrics`: slots
/// taken (the wait ends once an evaluation has its slot) and evaluations ended (counted before
/// the slot is given back).
struct Pool {
    taken: u64,
    ended: u64,
}

async fn pool(base_url: &str) -> Pool {
    let text = reqwest::get(format!("{base_url}/metrics")).await.unwrap().text().await.unwrap();
    let metric = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    Pool {
        taken: metric("coffer_policy_evaluation_wait_seconds_count"),
        ended: metric("coffer_policy_evaluation_seconds_count"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn evaluation_cost_stays_with_its_organization() {
    let stack = Stack::start_with(&[
        ("COFFER_POLICY_THREADS", "2"),
        ("COFFER_POLICY_THREADS_PER_ORGANIZATION", "1"),
        // A's second dry run waits for A's share while its first runs: long enough not to be
        // shed, whatever the machine's speed.
        ("COFFER_POLICY_QUEUE_TIMEOUT_MS", "120000"),
        ("COFFER_MAX_POLICIES_PER_ORGANIZATION", &MAX_POLICIES.to_string()),
        ("COFFER_STATE_CACHE_MIB", &CACHE_MIB.to_string()),
    ])
    .await;
    let (root, org_a) = (stack.api_key(), stack.organization_id.clone());

    // (a), (b): organization A's expensive policies; B's cheap one.
    let costly: Vec<String> = (0..COSTLY).map(|i| expensive(3_000, i)).collect();
    for (i, chunk) in costly.chunks(50).enumerate() {
        completed(&create_policies(&stack, &root, &org_a, &format!("costly-{i}"), chunk).await);
    }
    let alice = member(&stack, &root, &org_a, "alice").await;
    let (org_b, root_b) = organization(&stack, "org-b");
    completed(&create_policies(&stack, &root_b, &org_b, "cheap", &["true".to_string()]).await);
    let bob = member(&stack, &root_b, &org_b, "bob").await;

    // One dry run alone evaluates A's policies. (How long it takes, and how long B and /healthz
    // take while A's run, is measured by the bench: `make bench`, section "policy cost".)
    let r =
        stack.post_raw("/public/v1/query/coffer_policy_dry_run", dry_run_body(&org_a).as_bytes(), Some(&alice)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["policies"].as_array().map(Vec::len), Some(COSTLY), "{}", r.text);

    // Two at once from A. The pool's own counters (slots taken, evaluations ended) tell how many
    // evaluations hold a slot: until A's first one ends, A's are all there are, and never more
    // than its share (1) of them, however fast the machine. Then A's second takes the slot the
    // first gave back and, while it holds it, B's dry run is served by the other. /healthz is
    // answered meanwhile (the pool is not its). Every check reads the counters or the answers,
    // none how long anything took.
    let before = pool(&stack.base_url).await;
    assert_eq!(before.taken, before.ended, "no evaluation is in flight before A's dry runs");
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let (url, org) = (stack.base_url.clone(), org_a.clone());
            let key = TurnkeyP256ApiKey::from_strings(hex::encode(alice.private_key()), None).unwrap();
            tokio::spawn(async move {
                post_to(&url, "/public/v1/query/coffer_policy_dry_run", dry_run_body(&org).as_bytes(), Some(&key)).await
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = pool(&stack.base_url).await;
    while last.taken == before.taken {
        assert!(Instant::now() < deadline, "none of A's dry runs took a slot of the pool");
        tokio::time::sleep(Duration::from_millis(2)).await;
        last = pool(&stack.base_url).await;
    }
    let health = reqwest::get(format!("{}/healthz", stack.base_url)).await.unwrap();
    assert_eq!(health.status(), 200);
    // A slot taken by one reading and not ended by the next was held between them (the counters
    // only grow), so that difference never exceeds the slots A holds.
    let mut most = 0;
    while last.ended == before.ended {
        assert!(Instant::now() < deadline, "A's first dry run did not end");
        tokio::time::sleep(Duration::from_millis(2)).await;
        let now = pool(&stack.base_url).await;
        most = most.max(last.taken.saturating_sub(now.ended));
        last = now;
    }
    assert!(most <= 1, "A's dry runs held {most} of the pool's slots at once (its share is 1)");
    while last.taken < before.taken + 2 {
        assert!(Instant::now() < deadline, "A's second dry run did not take a slot");
        tokio::time::sleep(Duration::from_millis(2)).await;
        last = pool(&stack.base_url).await;
    }
    let b = stack.post_raw("/public/v1/query/coffer_policy_dry_run", dry_run_body(&org_b).as_bytes(), Some(&bob)).await;
    assert_eq!(b.status, 200, "{}", b.text);
    assert_eq!(
        (b.json["decision"].as_str(), b.json["policies"].as_array().map(Vec::len)),
        (Some("DECISION_ALLOW"), Some(1))
    );
    for run in runs {
        let r = run.await.unwrap();
        // Served in turn (the queue wait is long enough for both).
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json["policies"].as_array().map(Vec::len), Some(COSTLY), "{}", r.text);
    }
    let after = pool(&stack.base_url).await;
    assert_eq!(after.taken - before.taken, 3, "A's two evaluations and B's took a slot each");
    assert_eq!(after.taken, after.ended, "and ended");

    // (c) The cap: A has 25; a batch that would pass 1,000 is refused whole, one that reaches it is
    // not, and then one more is refused.
    let small: Vec<String> = (0..MAX_POLICIES - COSTLY + 1)
        .map(|i| format!("activity.type == 'ACTIVITY_TYPE_CREATE_WALLET' && {i} == {i}"))
        .collect();
    let r = create_policies(&stack, &root, &org_a, "over", &small).await;
    refused_raw(
        &r,
        400,
        "REQUEST_INVALID",
        &format!("too many policies: an organization may have at most {MAX_POLICIES}"),
    );
    completed(&create_policies(&stack, &root, &org_a, "fill", &small[..MAX_POLICIES - COSTLY]).await);
    let one = json!({"policyName": "one-more", "effect": "EFFECT_ALLOW", "condition": "true", "notes": ""});
    let r = submit(&stack, &root, &org_a, "create_policy", "ACTIVITY_TYPE_CREATE_POLICY_V3", one).await;
    refused_raw(&r, 400, "REQUEST_INVALID", "it has 1000, this adds 1");

    // (d) Memory: 20 organizations with 30 policies each at the literal-list cap (4,096 items,
    // the densest source: about 0.7 MB compiled each, 21 MB an organization), each organization
    // evaluated once. Cached whole they would hold over 400 MiB; the enclave's state cache keeps
    // at most 48 MiB, so its peak grows by about that plus the state being evaluated.
    let enclave = stack.pids().0.expect("enclave pid");
    let base = peak_rss_mib(enclave);
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
    let growth = peak_rss_mib(enclave) - base;
    eprintln!("enclave peak RSS growth over 20 organizations of large policies: {growth:.0} MiB (cache bound {CACHE_MIB} MiB)");
    assert!(growth < 200.0, "the enclave's peak RSS grew by {growth:.0} MiB over 20 organizations of large policies");
}

/// An ALLOW that costs about 15,000 steps, within a clause's budget (20,000): `i` makes its
/// text its own. About 6 KB of text.
fn within_a_clause(i: usize) -> String {
    expensive(3_000, i)
}

/// Issue 39: one budget for the whole decision, the same in both processes, and a cap on an
/// organization's policy text. Before, 40 policies each within a clause's budget cost 40 clause
/// budgets a decision (70 of them 11 s a dry run), and allowed; and an organization could hold
/// any amount of policy text (96 policies of 9 MB grew the gateway to 1.43 GB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_decision_has_one_budget_and_the_policy_text_a_cap() {
    let stack = Stack::start().await;
    let (root, org) = (stack.api_key(), stack.organization_id.clone());
    // 40 policies × 6 KB: 240 KB of text, within the default 256 KiB.
    let costly: Vec<String> = (0..40).map(within_a_clause).collect();
    for (i, chunk) in costly.chunks(20).enumerate() {
        completed(&create_policies(&stack, &root, &org, &format!("costly-{i}"), chunk).await);
    }
    let alice = member(&stack, &root, &org, "alice").await;

    // Each would allow; together they cost 600,000 steps, past the decision's 200,000: the
    // decision denies, naming why, and the policies it could not read say so.
    let r = stack.post_raw("/public/v1/query/coffer_policy_dry_run", dry_run_body(&org).as_bytes(), Some(&alice)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        (r.json["decision"].as_str(), r.json["reason"].as_str()),
        (Some("DECISION_DENY"), Some("BUDGET_EXHAUSTED")),
        "{}",
        r.text
    );
    let outcomes = r.json["policies"].as_array().unwrap();
    assert_eq!(outcomes.len(), 40);
    assert!(outcomes.iter().any(|o| o["outcome"] == "OUTCOME_ALLOW"), "{}", r.text);
    let unread: Vec<&Value> = outcomes.iter().filter(|o| o["outcome"] == "OUTCOME_ERROR").collect();
    assert!(!unread.is_empty(), "{}", r.text);
    assert!(
        unread.iter().all(|o| o["detail"].as_str().unwrap_or_default().contains("the decision's budget")),
        "{}",
        r.text
    );

    // Submitted, it is refused (by the enclave, which alone decides a key use) and records
    // nothing.
    let before = stack.activity_count(&root, &org).await;
    let r = submit(
        &stack,
        &alice,
        &org,
        "create_wallet",
        "ACTIVITY_TYPE_CREATE_WALLET",
        json!({"walletName": "w", "accounts": []}),
    )
    .await;
    refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "request not authorized");
    stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", coffer_proto::v1::RefusalReason::PolicyDenied);
    assert_eq!(stack.activity_count(&root, &org).await, before);

    // The text cap: 240 KB held, 4 more policies of 6 KB pass 256 KiB, refused by the enclave
    // whole; 2 fit.
    let more: Vec<String> = (40..44).map(within_a_clause).collect();
    let r = create_policies(&stack, &root, &org, "more", &more).await;
    stack.refused_for(&r, 400, "REQUEST_INVALID", coffer_proto::v1::RefusalReason::LimitExceeded);
    assert!(r.text.contains("at most 262144 bytes of policy text"), "{}", r.text);
    assert!(r.text.contains("max_policy_text_bytes_per_organization"), "{}", r.text);
    assert_eq!(stack.activity_count(&root, &org).await, before);
    completed(&create_policies(&stack, &root, &org, "fit", &more[..2]).await);
}
