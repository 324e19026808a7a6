//! The operator console in a real browser: Debian's headless Chromium, driven through
//! chromedriver (`coffer_tests::webdriver`) with a virtual authenticator, against real binaries;
//! every outcome is read back through the API with the official client or raw stamped posts.

use std::path::PathBuf;
use std::time::Instant;

use coffer_tests::rlp::{eip1559, erc20_transfer};
use coffer_tests::webdriver::Browser;
use coffer_tests::{submit, user_with_key, Stack};
use serde_json::{json, Value};
use turnkey_api_key_stamper::TurnkeyP256ApiKey;
use turnkey_client::generated::immutable::webauthn::v1::AuthenticatorTransport;
use turnkey_client::generated::{
    Attestation, AuthenticatorParamsV2, CreateAuthenticatorsIntentV2, GetActivityRequest, UpdateRootQuorumIntent,
};

/// Where the screenshots of the main pages go, for the closing note.
fn shots() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("console")
}

/// The console's address: `localhost`, a secure origin for WebAuthn (127.0.0.1 is not one for
/// the relying party id a passkey is made for).
fn console_url(stack: &Stack) -> String {
    stack.base_url.replace("127.0.0.1", "localhost") + "/console"
}

/// Opens a page of the signed-in console and waits until it is built; returns how long that took
/// (reported, not asserted: the budget is checked by the benchmark, never by a timed test).
async fn open(browser: &Browser, hash: &str) -> u128 {
    let started = Instant::now();
    browser.execute("document.querySelector('#main section') && document.querySelector('#main section').removeAttribute('data-ready'); location.hash = arguments[0];", vec![json!(hash)]).await;
    browser.wait_for("#main section[data-ready]").await;
    started.elapsed().as_millis()
}

/// Clicks what navigates to another page (or the same one again) and waits until it is built.
async fn click_to_page(browser: &Browser, css: &str) {
    browser.execute("document.querySelector('#main section').removeAttribute('data-ready')", vec![]).await;
    browser.click(css).await;
    browser.wait_for("#main section[data-ready]").await;
}

async fn error_text(browser: &Browser) -> String {
    browser
        .execute("const e = document.querySelector('#error'); return e.hidden ? '' : e.innerText;", vec![])
        .await
        .as_str()
        .unwrap_or("")
        .to_string()
}

async fn sign_in_with_key(browser: &Browser, url: &str, org: &str, public: &str, private: &str) {
    browser.goto(url).await;
    browser.fill("#org-id", org).await;
    browser.click("details summary").await;
    browser.fill("#api-public", public).await;
    browser.fill("#api-private", private).await;
    browser.click("#apikey-signin").await;
    browser.wait_for("#main section[data-ready]").await;
    assert_eq!(error_text(browser).await, "");
    // The sign-in form, and the private key's field with it, is gone.
    assert!(browser.find("#api-private").await.is_none());
}

/// Signs in with the browser's passkey; returns who the console says signed in, and how.
async fn sign_in_with_passkey(browser: &Browser, url: &str, org: &str) -> String {
    browser.goto(url).await;
    browser.fill("#org-id", org).await;
    browser.click("#passkey-signin").await;
    browser.wait_for("#main section[data-ready]").await;
    assert_eq!(error_text(browser).await, "");
    browser.text("#who").await
}

async fn activity(stack: &Stack, id: &str) -> Value {
    let body = json!({"organizationId": stack.organization_id, "activityId": id}).to_string();
    let r = stack.post_raw("/public/v1/query/get_activity", body.as_bytes(), Some(&stack.api_key())).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["activity"].clone()
}

async fn activity_count(stack: &Stack) -> usize {
    stack.activity_count(&stack.api_key(), &stack.organization_id).await
}

/// Submits as `key` and returns the activity's id and status.
async fn submitted(
    stack: &Stack,
    key: &TurnkeyP256ApiKey,
    path: &str,
    ty: &str,
    parameters: Value,
) -> (String, String) {
    let r = submit(stack, key, &stack.organization_id, path, ty, parameters).await;
    assert_eq!(r.status, 200, "{}", r.text);
    (r.json["activity"]["id"].as_str().unwrap().into(), r.json["activity"]["status"].as_str().unwrap().into())
}

const TOKEN: &str = "0xabcdefabcdefabcdefabcdefabcdefabcdefabcd";
const RECIPIENT: &str = "0x4444444444444444444444444444444444444444";
const ERC20: &str = r#"[{"type":"function","name":"transfer","stateMutability":"nonpayable",
    "inputs":[{"name":"_to","type":"address"},{"name":"_value","type":"uint256"}],"outputs":[{"name":"","type":"bool"}]}]"#;

#[tokio::test]
async fn console_in_a_real_browser() {
    let stack =
        Stack::start_with(&[("COFFER_CONSOLE", "true"), ("COFFER_WEBHOOK_ALLOW_PRIVATE_TARGETS", "true")]).await;
    let org = stack.organization_id.clone();
    let root = stack.client();
    let root_key = stack.api_key();
    let url = console_url(&stack);
    let http = reqwest::Client::new();
    let mut timings: Vec<(&str, u128)> = Vec::new();

    // ---- The files: strict headers, within the budget ------------------------------------
    let mut first_load = 0;
    for (path, kind) in
        [("/console", "text/html"), ("/console/app.js", "text/javascript"), ("/console/app.css", "text/css")]
    {
        let r = http.get(format!("{}{path}", stack.base_url)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let header = |name: &str| r.headers().get(name).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        assert!(header("content-type").starts_with(kind), "{path}: {}", header("content-type"));
        let csp = header("content-security-policy");
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
            "form-action 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
        assert_eq!(
            (header("x-content-type-options"), header("cache-control"), header("cross-origin-opener-policy")),
            ("nosniff".into(), "no-store".into(), "same-origin".into()),
            "{path}"
        );
        first_load += r.bytes().await.unwrap().len();
    }
    assert!(first_load < 200 * 1024, "first load {first_load} bytes");
    // The API's own answers are never sniffed as a page either.
    let r = http.post(format!("{}/public/v1/query/whoami", stack.base_url)).body("{}").send().await.unwrap();
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");

    // ---- Data made through the API before any browser comes -----------------------------
    let (bob_id, bob_key) = user_with_key(&root, &org, "bob").await;
    let (alice_id, alice_key) = user_with_key(&root, &org, "alice").await;
    // A name made to be markup: the console must show it as text.
    let hostile = "<img src=x onerror=\"document.title='owned'\">";
    let (_, _) = user_with_key(&root, &org, hostile).await;
    let (_, status) = submitted(
        &stack,
        &root_key,
        "create_policy",
        "ACTIVITY_TYPE_CREATE_POLICY_V3",
        json!({
        "policyName": "bob makes wallets", "effect": "EFFECT_ALLOW",
        "condition": "activity.resource == 'WALLET' && activity.action == 'CREATE'",
        "consensus": format!("approvers.any(user, user.id == '{bob_id}')"), "notes": ""}),
    )
    .await;
    assert_eq!(status, "ACTIVITY_STATUS_COMPLETED");
    let (_, status) = submitted(
        &stack,
        &root_key,
        "create_wallet",
        "ACTIVITY_TYPE_CREATE_WALLET",
        json!({
        "walletName": "treasury", "accounts": [{"curve": "CURVE_SECP256K1", "pathFormat": "PATH_FORMAT_BIP32",
        "path": "m/44'/60'/0'/0/0", "addressFormat": "ADDRESS_FORMAT_ETHEREUM"}]}),
    )
    .await;
    assert_eq!(status, "ACTIVITY_STATUS_COMPLETED");
    for name in ["spare 1", "spare 2", "spare 3"] {
        submitted(
            &stack,
            &root_key,
            "create_wallet",
            "ACTIVITY_TYPE_CREATE_WALLET",
            json!({"walletName": name, "accounts": []}),
        )
        .await;
    }
    let body = json!({"organizationId": org}).to_string();
    let accounts = stack.post_raw("/public/v1/query/list_wallet_accounts", body.as_bytes(), Some(&root_key)).await;
    let eth = accounts.json["accounts"][0]["address"].as_str().unwrap().to_string();
    let (_, status) = submitted(&stack, &root_key, "create_smart_contract_interface", "ACTIVITY_TYPE_CREATE_SMART_CONTRACT_INTERFACE",
        json!({"smartContractAddress": TOKEN, "smartContractInterface": ERC20, "type": "SMART_CONTRACT_INTERFACE_TYPE_ETHEREUM", "label": "token", "notes": ""})).await;
    assert_eq!(status, "ACTIVITY_STATUS_COMPLETED");
    // A webhook endpoint whose receiver refuses connections: its deliveries fail.
    let (_, status) = submitted(&stack, &root_key, "create_webhook_endpoint", "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT",
        json!({"url": "http://127.0.0.1:9/hook", "name": "audit feed", "subscriptions": [{"eventType": "ACTIVITY_UPDATES"}]})).await;
    assert_eq!(status, "ACTIVITY_STATUS_COMPLETED");

    let browser = Browser::start().await;
    let shot = |name: &str| shots().join(format!("{name}.png"));

    // ---- A tab without a credential sees nothing -----------------------------------------
    browser.goto(&format!("{url}#organization")).await;
    browser.wait_for("#signin").await;
    browser.screenshot(&shot("signin")).await;
    let seen = browser
        .execute(
            "return {nav: document.querySelector('#nav').hidden, users: !!document.querySelector('#users'), \
             api: performance.getEntriesByType('resource').filter(e => e.name.includes('/public/v1/')).length}",
            vec![],
        )
        .await;
    assert_eq!(seen, json!({"nav": true, "users": false, "api": 0}));
    browser.execute("location.hash = 'pending'", vec![]).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(browser.find("#pending").await.is_none() && browser.find("#signin").await.is_some());
    // A wrong key signs nothing in: the API's refusal is shown, and still nothing is seen.
    let stranger = TurnkeyP256ApiKey::generate();
    browser.fill("#org-id", &org).await;
    browser.click("details summary").await;
    browser.fill("#api-public", &hex::encode(stranger.compressed_public_key())).await;
    browser.fill("#api-private", &hex::encode(stranger.private_key())).await;
    browser.click("#apikey-signin").await;
    browser.wait_for("#error:not([hidden])").await;
    let refused = error_text(&browser).await;
    assert!(refused.starts_with("401") || refused.starts_with("403"), "{refused}");
    // The private key's field was cleared once the key was imported, signed in or not.
    assert_eq!(browser.execute("return document.querySelector('#api-private').value", vec![]).await, json!(""));
    assert!(browser.find("#users").await.is_none() && browser.find("#nav[hidden]").await.is_some());

    // ---- The root signs in with an API key: organization, creation, the log ---------------
    sign_in_with_key(&browser, &url, &org, &stack.api_public_key, &stack.api_private_key).await;
    timings.push(("organization", open(&browser, "organization").await));
    let users = browser.text("#users").await;
    for name in ["bob", "alice", hostile] {
        assert!(users.contains(name), "{name} in {users}");
    }
    assert!(browser.text("#quorum").await.starts_with("1 of 1"));
    let injected =
        browser.execute("return [document.querySelectorAll('#main img').length, document.title]", vec![]).await;
    assert_eq!(injected, json!([0, "Organization — Coffer console"]));
    browser.screenshot(&shot("organization")).await;

    timings.push(("create", open(&browser, "create").await));
    browser.fill("#user-name", "carol").await;
    browser.fill("#user-email", "carol@example.com").await;
    browser.click("#user-submit").await;
    browser.wait_for_text("#user-outcome", "COMPLETED").await;
    let carol_key = TurnkeyP256ApiKey::generate();
    browser.select("#apikey-user", &bob_id).await;
    browser.fill("#apikey-name", "bob laptop").await;
    browser.fill("#apikey-public", &hex::encode(carol_key.compressed_public_key())).await;
    browser.click("#apikey-submit").await;
    browser.wait_for_text("#apikey-outcome", "COMPLETED").await;
    browser.fill("#policy-name", "made in the console").await;
    browser.fill("#policy-condition", "activity.resource == 'POLICY'").await;
    browser.fill("#policy-consensus", &format!("approvers.any(user, user.id == '{alice_id}')")).await;
    browser.click("#policy-submit").await;
    browser.wait_for_text("#policy-outcome", "COMPLETED").await;
    browser.screenshot(&shot("create")).await;
    // Read back through the API: the user, the key (it stamps as bob) and the policy.
    let body = json!({"organizationId": org}).to_string();
    let listed = stack.post_raw("/public/v1/query/list_users", body.as_bytes(), Some(&root_key)).await;
    let carol =
        listed.json["users"].as_array().unwrap().iter().find(|u| u["userName"] == "carol").expect("carol").clone();
    assert_eq!(carol["userEmail"], "carol@example.com");
    let who = stack.post_raw("/public/v1/query/whoami", body.as_bytes(), Some(&carol_key)).await;
    assert_eq!((who.status, who.json["userId"].as_str()), (200, Some(bob_id.as_str())), "{}", who.text);
    let policies = stack.post_raw("/public/v1/query/list_policies", body.as_bytes(), Some(&root_key)).await;
    let made = policies.json["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policyName"] == "made in the console")
        .expect("policy")
        .clone();
    assert_eq!(
        (made["effect"].as_str(), made["condition"].as_str()),
        (Some("EFFECT_ALLOW"), Some("activity.resource == 'POLICY'"))
    );
    // A refusal is shown as the API gives it, and changes nothing.
    browser.fill("#policy-name", "broken").await;
    browser.fill("#policy-condition", "activity.resource ==").await;
    browser.click("#policy-submit").await;
    browser.wait_for("#error:not([hidden])").await;
    assert!(error_text(&browser).await.starts_with("400"), "{}", error_text(&browser).await);

    // The log: ten a page, newest first, older and newer, filtered by type.
    timings.push(("activities", open(&browser, "activities").await));
    let first_page = browser.texts("#activities tbody tr td:last-child").await;
    assert_eq!(first_page.len(), 10);
    click_to_page(&browser, "#older").await;
    let second_page = browser.texts("#activities tbody tr td:last-child").await;
    assert!(!second_page.is_empty() && second_page.iter().all(|id| !first_page.contains(id)), "{second_page:?}");
    click_to_page(&browser, "#newer").await;
    assert_eq!(browser.texts("#activities tbody tr td:last-child").await, first_page);
    browser.fill("#filter-type", "ACTIVITY_TYPE_CREATE_POLICY_V3").await;
    click_to_page(&browser, "#filter").await;
    let types = browser.texts("#activities tbody tr td:nth-child(2)").await;
    assert_eq!(types, vec!["CREATE_POLICY_V3"; 2], "the two policies made, and not the refused one");
    browser.screenshot(&shot("activities")).await;

    timings.push(("wallets", open(&browser, "wallets").await));
    assert!(browser.text("#main").await.contains(&eth));
    browser.screenshot(&shot("wallets")).await;
    timings.push(("webhooks", open(&browser, "webhooks").await));
    assert!(browser.text("#main").await.contains("audit feed"));
    browser.click(".deliveries-button").await;
    browser.wait_for(".deliveries").await;
    browser.screenshot(&shot("webhooks")).await;

    // ---- Bob (not root) asks the dry run which policy lets him make a wallet -----------------
    let bob_public = hex::encode(bob_key.compressed_public_key());
    let bob_private = hex::encode(bob_key.private_key());
    browser.click("#signout").await;
    browser.wait_for("#signin").await;
    sign_in_with_key(&browser, &url, &org, &bob_public, &bob_private).await;
    assert!(browser.text("#who").await.starts_with("bob"));
    timings.push(("policies", open(&browser, "policies").await));
    browser
        .fill(
            "#dry-run-activity",
            r#"{"type": "ACTIVITY_TYPE_CREATE_WALLET", "parameters": {"walletName": "w", "accounts": []}}"#,
        )
        .await;
    browser.click("#dry-run").await;
    browser.wait_for("#dry-run-decision").await;
    assert_eq!(browser.text("#dry-run-decision").await, "DECISION_ALLOW");
    let decided_by = browser.text("#dry-run-policies").await;
    assert!(decided_by.contains("bob makes wallets") && decided_by.contains("OUTCOME_ALLOW"), "{decided_by}");
    browser.screenshot(&shot("policies")).await;
    browser.fill("#dry-run-activity", r#"{"type": "ACTIVITY_TYPE_DELETE_USERS", "parameters": {"userIds": []}}"#).await;
    browser.click("#dry-run").await;
    browser.wait_for_text("#dry-run-decision", "DECISION_DENY").await;

    // ---- 2 of 2: alice's passkey, registered through the API, approves and rejects --------
    browser.click("#signout").await;
    browser.wait_for("#signin").await;
    let authenticator = browser.add_virtual_authenticator().await;
    let challenge = coffer_tests::passkey::b64url(b"console registration");
    let made = browser
        .execute_async(
            "const done = arguments[arguments.length - 1];
             const b64 = (b) => btoa(String.fromCharCode(...new Uint8Array(b))).replace(/\\+/g, '-').replace(/\\//g, '_').replace(/=+$/, '');
             navigator.credentials.create({publicKey: {
               challenge: new TextEncoder().encode('console registration'),
               rp: {id: 'localhost', name: 'Coffer'},
               user: {id: new TextEncoder().encode(arguments[0]), name: 'alice', displayName: 'alice'},
               pubKeyCredParams: [{type: 'public-key', alg: -7}],
               authenticatorSelection: {residentKey: 'required', userVerification: 'preferred'},
               attestation: 'none'}})
             .then(c => done({id: b64(c.rawId), clientDataJson: b64(c.response.clientDataJSON),
                              attestationObject: b64(c.response.attestationObject)}))
             .catch(e => done({error: String(e)}));",
            vec![json!(alice_id)],
        )
        .await;
    assert!(made.get("error").is_none(), "{made}");
    let alice = stack.client_with(alice_key);
    let passkey = AuthenticatorParamsV2 {
        authenticator_name: "alice's passkey".into(),
        challenge,
        attestation: Some(Attestation {
            credential_id: made["id"].as_str().unwrap().into(),
            client_data_json: made["clientDataJson"].as_str().unwrap().into(),
            attestation_object: made["attestationObject"].as_str().unwrap().into(),
            transports: vec![AuthenticatorTransport::Internal],
        }),
    };
    let intent = CreateAuthenticatorsIntentV2 { authenticators: vec![passkey], user_id: alice_id.clone() };
    alice.create_authenticators(org.clone(), alice.current_timestamp(), intent).await.expect("passkey registered");
    let signatures = |c: Vec<Value>| c[0]["signCount"].as_u64().unwrap();
    let registered = signatures(browser.credentials(&authenticator).await);

    // Alice joins the root quorum, whose threshold is still one.
    let intent = UpdateRootQuorumIntent { threshold: 1, user_ids: vec![stack.user_id.clone(), alice_id.clone()] };
    root.update_root_quorum(org.clone(), root.current_timestamp(), intent).await.unwrap();
    // While one root's word is a quorum, the passkey signs a dry run and a login that certifies a
    // key made in the tab; that key stamps the pages after it, the passkey nothing more.
    let who = sign_in_with_passkey(&browser, &url, &org).await;
    assert!(who.starts_with(&format!("alice ({alice_id})")) && who.ends_with("a session key for 15 minutes"), "{who}");
    open(&browser, "pending").await;
    open(&browser, "organization").await;
    assert_eq!(signatures(browser.credentials(&authenticator).await), registered + 2);
    let alice_keys = || async {
        let body = json!({"organizationId": org, "userId": alice_id}).to_string();
        let r = stack.post_raw("/public/v1/query/get_api_keys", body.as_bytes(), Some(&root_key)).await;
        r.json["apiKeys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["apiKeyName"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(alice_keys().await.len(), 2, "her key and the tab's session key");
    // Signing out deletes the tab's session key: no credential of hers outlives the tab.
    browser.click("#signout").await;
    browser.wait_for("#signin").await;
    assert_eq!(alice_keys().await, vec!["alice".to_string()]);

    // Root quorum 2 of 2 (root and alice); then three activities wait for alice's vote.
    let intent = UpdateRootQuorumIntent { threshold: 2, user_ids: vec![stack.user_id.clone(), alice_id.clone()] };
    root.update_root_quorum(org.clone(), root.current_timestamp(), intent).await.unwrap();
    let wallet = |name: &str| json!({"walletName": name, "accounts": []});
    let (approved, status) =
        submitted(&stack, &root_key, "create_wallet", "ACTIVITY_TYPE_CREATE_WALLET", wallet("approved")).await;
    assert_eq!(status, "ACTIVITY_STATUS_CONSENSUS_NEEDED");
    let (rejected, _) =
        submitted(&stack, &root_key, "create_wallet", "ACTIVITY_TYPE_CREATE_WALLET", wallet("rejected")).await;
    let (transfer, status) = submitted(&stack, &root_key, "sign_transaction", "ACTIVITY_TYPE_SIGN_TRANSACTION_V2", json!({
        "signWith": eth, "unsignedTransaction": hex::encode(eip1559(7, TOKEN, 0, &erc20_transfer(RECIPIENT, 250))), "type": "TRANSACTION_TYPE_ETHEREUM"})).await;
    assert_eq!(status, "ACTIVITY_STATUS_CONSENSUS_NEEDED");

    // Now a login of hers would itself wait for a vote: none is submitted, and her passkey
    // stamps every request, her votes included.
    let before = activity_count(&stack).await;
    let who = sign_in_with_passkey(&browser, &url, &org).await;
    assert!(
        who.starts_with(&format!("alice ({alice_id})")) && who.ends_with("your passkey for every request"),
        "{who}"
    );
    assert_eq!(activity_count(&stack).await, before, "no login waits for approval");
    timings.push(("pending", open(&browser, "pending").await));
    let pending = browser.text("#pending").await;
    for id in [&approved, &rejected, &transfer] {
        assert!(pending.contains(id.as_str()), "{id} in {pending}");
    }
    browser.screenshot(&shot("pending")).await;

    // The transfer, decoded as the transaction policies see it.
    timings.push(("activity", open(&browser, &format!("activity/{transfer}")).await));
    let tx = browser.text("#transaction").await;
    for needle in ["eth", TOKEN, "transfer(address,uint256)", &eth.to_lowercase()] {
        assert!(tx.contains(needle), "{needle} in {tx}");
    }
    let args = browser.text("#call-args").await;
    assert!(args.contains(RECIPIENT) && args.contains("250"), "{args}");
    browser.screenshot(&shot("activity-transaction")).await;

    // Approve: a confirmation names the fingerprint, then one stamped approve_activity.
    open(&browser, &format!("activity/{approved}")).await;
    browser.click("#approve").await;
    let confirm = browser.text("#vote").await;
    assert!(confirm.contains(activity(&stack, &approved).await["fingerprint"].as_str().unwrap()), "{confirm}");
    assert_eq!(
        activity(&stack, &approved).await["status"],
        "ACTIVITY_STATUS_CONSENSUS_NEEDED",
        "nothing before the confirmation"
    );
    browser.click("#confirm-vote").await;
    browser.wait_for_text("#activity-status", "COMPLETED").await;
    let a = root
        .get_activity(GetActivityRequest { organization_id: org.clone(), activity_id: approved.clone() })
        .await
        .unwrap()
        .activity
        .unwrap();
    assert_eq!(a.votes.len(), 2);
    assert!(a.votes.iter().any(|v| v.user_id == alice_id), "alice's vote is recorded");
    assert_eq!(activity(&stack, &approved).await["status"], "ACTIVITY_STATUS_COMPLETED");

    // Reject the other.
    open(&browser, &format!("activity/{rejected}")).await;
    browser.click("#reject").await;
    browser.click("#confirm-vote").await;
    browser.wait_for_text("#activity-status", "REJECTED").await;
    assert_eq!(activity(&stack, &rejected).await["status"], "ACTIVITY_STATUS_REJECTED");
    let names = stack.post_raw("/public/v1/query/list_wallets", body.as_bytes(), Some(&root_key)).await;
    let names: Vec<&str> =
        names.json["wallets"].as_array().unwrap().iter().map(|w| w["walletName"].as_str().unwrap()).collect();
    assert!(names.contains(&"approved") && !names.contains(&"rejected"), "{names:?}");
    // The transfer still waits: nothing was voted on it.
    assert_eq!(activity(&stack, &transfer).await["status"], "ACTIVITY_STATUS_CONSENSUS_NEEDED");

    println!("console: first load {first_load} bytes; pages interactive (ms, debug build): {timings:?}");
    browser.quit().await;

    // ---- A gateway not asked to serve the console has none --------------------------------
    let mut stack = stack;
    stack.set_env("COFFER_CONSOLE", "false");
    let (other, _gateway) = stack.spawn_gateway().await;
    let r = http.get(format!("{other}/console")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
}
