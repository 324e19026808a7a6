//! The enclave crashes (SIGKILL) under a running gateway: key operations fail cleanly with 503
//! JSON and record nothing, reads keep working, and everything recovers once it is back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coffer_tests::{recover_eth_address, refused_raw, settled, RawResponse, Stack};
use serde_json::{json, Value};
use sha2::Digest;
use turnkey_api_key_stamper::{Stamp, TurnkeyP256ApiKey};

/// A 503 "enclave unavailable" refusal in the gRPC-gateway error shape (code 14,
/// `RPC_CALL_ERROR`).
#[track_caller]
fn assert_unavailable(r: &RawResponse) {
    refused_raw(r, 503, "RPC_CALL_ERROR", "enclave unavailable");
}

/// A count the test's clients raise and the test waits on: phases end on what happened (so many
/// requests signed), not after a guessed while.
#[derive(Clone)]
struct Count(Arc<tokio::sync::watch::Sender<usize>>);

impl Count {
    fn new() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(0)))
    }

    fn add(&self) {
        self.0.send_modify(|n| *n += 1);
    }

    fn get(&self) -> usize {
        *self.0.borrow()
    }

    /// Waits until the count reaches `n`; fails the test, saying `what`, after 30 s.
    async fn reach(&self, n: usize, what: &str) {
        let mut changes = self.0.subscribe();
        let reached = tokio::time::timeout(Duration::from_secs(30), changes.wait_for(|c| *c >= n)).await;
        assert!(matches!(reached, Ok(Ok(_))), "{what}: {} of {n} after 30 s", self.get());
    }
}

/// The ids of `activities` (as [`Stack::activities`] lists them).
fn ids(activities: &[Value]) -> std::collections::BTreeSet<String> {
    activities.iter().map(|a| a["id"].as_str().unwrap().to_string()).collect()
}

/// The exact number of activities in `org` once it has stopped changing for 300 ms (a late write
/// would be counted).
async fn settled_count(stack: &Stack, key: &TurnkeyP256ApiKey, org: &str) -> usize {
    settled("the activity count", || stack.activity_count(key, org), Duration::from_millis(300)).await
}

/// Checks a completed sign_raw_payload over `message` (KECCAK256) recovers to `address`.
#[track_caller]
fn assert_signed_by(r: &RawResponse, message: &str, address: &str) {
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{}", r.text);
    let sig = &r.json["activity"]["result"]["signRawPayloadResult"];
    let digest: [u8; 32] = sha3::Keccak256::digest(message.as_bytes()).into();
    let recovered = recover_eth_address(
        &digest,
        sig["r"].as_str().unwrap(),
        sig["s"].as_str().unwrap(),
        sig["v"].as_str().unwrap(),
    );
    assert_eq!(recovered, address.to_lowercase());
}

fn submit_body(ty: &str, org: &str, parameters: Value) -> String {
    json!({
        "type": ty,
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org,
        "parameters": parameters,
        "generateAppProofs": null,
    })
    .to_string()
}

fn sign_body(org: &str, address: &str, message: &str) -> String {
    submit_body(
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        org,
        json!({
            "signWith": address,
            "payload": message,
            "encoding": "PAYLOAD_ENCODING_TEXT_UTF8",
            "hashFunction": "HASH_FUNCTION_KECCAK256",
            "externalSignerPubkey": null,
        }),
    )
}

/// POSTs a stamped body without borrowing the `Stack` (for spawned tasks).
async fn post(base_url: &str, path: &str, body: String, key: &TurnkeyP256ApiKey) -> RawResponse {
    coffer_tests::post_to(base_url, path, body.as_bytes(), Some(key)).await
}

async fn create_eth_wallet(stack: &Stack, key: &TurnkeyP256ApiKey) -> String {
    let params = json!({
        "walletName": "w",
        "accounts": [{"curve": "CURVE_SECP256K1", "pathFormat": "PATH_FORMAT_BIP32", "path": "m/44'/60'/0'/0/0", "addressFormat": "ADDRESS_FORMAT_ETHEREUM", "name": null}],
        "mnemonicLength": null,
    });
    let body = submit_body("ACTIVITY_TYPE_CREATE_WALLET", &stack.organization_id, params);
    let r = stack.post_raw("/public/v1/submit/create_wallet", body.as_bytes(), Some(key)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["activity"]["result"]["createWalletResult"]["addresses"][0].as_str().unwrap().to_string()
}

async fn healthz(stack: &Stack) -> RawResponse {
    let resp = reqwest::get(format!("{}/healthz", stack.base_url)).await.unwrap();
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    RawResponse { status, content_type, json, text }
}

#[tokio::test]
async fn enclave_crash_fails_cleanly_and_recovers() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut stack = Stack::start().await;
        let key = stack.api_key();
        let org = stack.organization_id.clone();
        let address = create_eth_wallet(&stack, &key).await;
        let before = stack.activity_count(&key, &stack.organization_id).await;
        assert_eq!(before, 1);

        stack.kill_enclave();

        let failed = sign_body(&org, &address, "after-crash");
        let r = stack.post_raw("/public/v1/submit/sign_raw_payload", failed.as_bytes(), Some(&key)).await;
        assert_unavailable(&r);
        assert!(r.json.get("activity").is_none(), "{}", r.text);
        // The identical bytes again (how the Rust client polls) while it is still down: the same
        // clean answer, not a remembered activity.
        let r = stack.post_raw("/public/v1/submit/sign_raw_payload", failed.as_bytes(), Some(&key)).await;
        assert_unavailable(&r);
        let r = stack.post_raw("/public/v1/discovery/enclave_signer", b"", None).await;
        assert_eq!(r.status, 405, "{}", r.text);
        let d = reqwest::get(format!("{}/public/v1/discovery/enclave_signer", stack.base_url)).await.unwrap();
        assert_eq!(d.status().as_u16(), 503);
        assert_eq!(d.headers()["content-type"], "application/json");
        assert_eq!(d.json::<Value>().await.unwrap()["code"], 14);
        // Wallet creation needs the enclave too.
        let params = json!({"walletName": "while-down", "accounts": [], "mnemonicLength": null});
        let r = stack
            .post_raw(
                "/public/v1/submit/create_wallet",
                submit_body("ACTIVITY_TYPE_CREATE_WALLET", &org, params).as_bytes(),
                Some(&key),
            )
            .await;
        assert_unavailable(&r);

        let h = healthz(&stack).await;
        assert_unavailable(&h);
        assert!(h.json["message"].as_str().unwrap().contains("enclave"), "{}", h.text);

        // Reads need only the store: they keep working, and show nothing was recorded (every
        // page, once nothing changes any more; the oracle saw the wallet's activity above).
        assert_eq!(settled_count(&stack, &key, &org).await, before);
        let w = stack
            .post_raw(
                "/public/v1/query/list_wallets",
                json!({"organizationId": org}).to_string().as_bytes(),
                Some(&key),
            )
            .await;
        assert_eq!(w.status, 200, "{}", w.text);
        assert_eq!(w.json["wallets"].as_array().unwrap().len(), 1);

        stack.start_enclave();
        stack.wait_healthy().await;
        let h = healthz(&stack).await;
        assert_eq!(h.status, 200, "{}", h.text);
        assert_eq!(h.json["status"], "ok");

        // The same request, freshly timestamped, now succeeds with a valid signature.
        let r = stack
            .post_raw(
                "/public/v1/submit/sign_raw_payload",
                sign_body(&org, &address, "after-crash").as_bytes(),
                Some(&key),
            )
            .await;
        assert_signed_by(&r, "after-crash", &address);
        assert_eq!(stack.activity_count(&key, &stack.organization_id).await, before + 1);
        // So do the very bytes that failed: nothing was recorded for them, so they execute now.
        let r = stack.post_raw("/public/v1/submit/sign_raw_payload", failed.as_bytes(), Some(&key)).await;
        assert_signed_by(&r, "after-crash", &address);
        assert_eq!(stack.activity_count(&key, &stack.organization_id).await, before + 2);

        // The official client works again too.
        let client = stack.client();
        let sig = client
            .sign_raw_payload(
                org.clone(),
                client.current_timestamp(),
                turnkey_client::generated::SignRawPayloadIntentV2 {
                    sign_with: address.clone(),
                    payload: "via-client".into(),
                    encoding: turnkey_client::generated::immutable::common::v1::PayloadEncoding::TextUtf8,
                    hash_function: turnkey_client::generated::immutable::common::v1::HashFunction::Keccak256,
                    external_signer_pubkey: None,
                },
            )
            .await
            .unwrap()
            .result;
        let digest: [u8; 32] = sha3::Keccak256::digest(b"via-client").into();
        assert_eq!(recover_eth_address(&digest, &sig.r, &sig.s, &sig.v), address.to_lowercase());
        assert_eq!(stack.activity_count(&key, &stack.organization_id).await, before + 3);
    })
    .await
    .expect("test took longer than 60 s (a request hung)");
}

#[tokio::test]
async fn concurrent_signing_during_enclave_kill() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut stack = Stack::start().await;
        let key = stack.api_key();
        let org = stack.organization_id.clone();
        let address = create_eth_wallet(&stack, &key).await;
        let before = ids(&stack.activities(&key, &org).await);
        assert_eq!(before.len(), 1, "the wallet's activity: {before:?}");

        // Twenty requests, one every 5 ms; the enclave is killed once a few have completed, so
        // some finish before the kill, some are in flight during it and the rest start after it.
        let done = Count::new();
        let (base, sk, pk) = (stack.base_url.clone(), stack.api_private_key.clone(), stack.api_public_key.clone());
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let (base, org, address, sk, pk) = (base.clone(), org.clone(), address.clone(), sk.clone(), pk.clone());
                let done = done.clone();
                tokio::spawn(async move {
                    let key = TurnkeyP256ApiKey::from_strings(&sk, Some(&pk)).unwrap();
                    tokio::time::sleep(Duration::from_millis(5 * i as u64)).await;
                    let message = format!("concurrent-{i}");
                    let started = Instant::now();
                    let path = "/public/v1/submit/sign_raw_payload";
                    let r = post(&base, path, sign_body(&org, &address, &message), &key).await;
                    let finished = Instant::now();
                    done.add();
                    (message, r, started, finished)
                })
            })
            .collect();
        done.reach(3, "requests answered before the kill").await;
        let kill_started = Instant::now();
        stack.kill_enclave();
        let kill_done = Instant::now();

        let (mut ok, mut unavailable, mut in_flight) = (0, 0, 0);
        let mut expected = before.clone();
        for t in tasks {
            let (message, r, started, finished) = t.await.unwrap();
            if finished < kill_started {
                assert_eq!(r.status, 200, "{message} completed before the kill: {}", r.text);
            }
            if started > kill_done {
                assert_eq!(r.status, 503, "{message} was sent after the kill: {}", r.text);
            }
            if started <= kill_done && finished >= kill_started {
                in_flight += 1;
            }
            match r.status {
                200 => {
                    assert_signed_by(&r, &message, &address);
                    assert!(expected.insert(r.json["activity"]["id"].as_str().unwrap().to_string()), "{}", r.text);
                    ok += 1;
                }
                503 => {
                    assert_unavailable(&r);
                    unavailable += 1;
                }
                other => panic!("{message}: unexpected status {other}: {}", r.text),
            }
        }
        // However the twenty fell around the kill (each also waits for its activity log link, so
        // all may have been sent before it): requests sent once it is done fail.
        for i in 0..3 {
            let message = format!("after-the-kill-{i}");
            let r = post(&base, "/public/v1/submit/sign_raw_payload", sign_body(&org, &address, &message), &key).await;
            assert_eq!(r.status, 503, "{message} was sent after the kill: {}", r.text);
            assert_unavailable(&r);
            unavailable += 1;
        }
        eprintln!("concurrent kill: ok={ok} unavailable={unavailable} in flight at the kill={in_flight}");
        assert_eq!(ok + unavailable, 23);
        assert!(ok >= 3, "requests completed before the kill succeed: ok={ok}");
        assert!(unavailable >= 3, "requests after the kill fail: unavailable={unavailable}");
        // Exactly the successful signatures were recorded: once settled, the activities are the
        // wallet's and one per 200, nothing for a 503.
        assert_eq!(settled_count(&stack, &key, &org).await, before.len() + ok);
        assert_eq!(ids(&stack.activities(&key, &org).await), expected);

        stack.start_enclave();
        stack.wait_healthy().await;
        let r = stack
            .post_raw(
                "/public/v1/submit/sign_raw_payload",
                sign_body(&org, &address, "recovered").as_bytes(),
                Some(&key),
            )
            .await;
        assert_signed_by(&r, "recovered", &address);
        assert_eq!(stack.activity_count(&key, &org).await, before.len() + ok + 1);
    })
    .await
    .expect("test took longer than 60 s (a request hung)");
}

/// An enclave killed under policy writes, on both stores: every 200 is a policy both sides
/// hold, the gateway shows nothing the enclave did not commit, and the running gateway catches up
/// by itself with what the enclave committed while its answer was lost: then the gateway's records
/// and the enclave's signed state agree, and `rebuild` finds nothing to repair.
#[tokio::test]
async fn an_enclave_killed_under_writes_leaves_the_gateway_showing_only_what_it_committed() {
    for store in ["sqlite", "postgres"] {
        tokio::time::timeout(Duration::from_secs(60), async {
            let mut stack = Stack::start_on(store, &[]).await;
            let (org, base) = (stack.organization_id.clone(), stack.base_url.clone());
            let (sk, pk) = (stack.api_private_key.clone(), stack.api_public_key.clone());
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let done = Count::new();
            let tasks: Vec<_> = (0..6)
                .map(|c| {
                    let (org, base, stop, done) = (org.clone(), base.clone(), stop.clone(), done.clone());
                    let key = TurnkeyP256ApiKey::from_strings(&sk, Some(&pk)).unwrap();
                    tokio::spawn(async move {
                        let mut acknowledged = Vec::new();
                        let mut n = 0;
                        while !stop.load(Ordering::SeqCst) {
                            n += 1;
                            let params = json!({"policyName": format!("crash-{c}-{n}"), "effect": "EFFECT_ALLOW",
                                "condition": "activity.type == 'ACTIVITY_TYPE_NONE'", "consensus": "true", "notes": ""});
                            let body = submit_body("ACTIVITY_TYPE_CREATE_POLICY_V3", &org, params);
                            let r = post(&base, "/public/v1/submit/create_policy", body, &key).await;
                            match r.status {
                                200 => {
                                    let id = r.json["activity"]["result"]["createPolicyResult"]["policyId"].as_str();
                                    acknowledged.push(id.unwrap_or_else(|| panic!("{}", r.text)).to_string());
                                    done.add();
                                }
                                // The enclave is down (or was, when the request reached it).
                                503 => tokio::time::sleep(Duration::from_millis(5)).await,
                                other => panic!("unexpected {other}: {}", r.text),
                            }
                        }
                        acknowledged
                    })
                })
                .collect();
            done.reach(20, "policies written before the kill").await;
            stack.kill_enclave();
            tokio::time::sleep(Duration::from_millis(200)).await;
            stack.start_enclave();
            stack.wait_healthy().await;
            let after = done.get();
            done.reach(after + 10, "policies written after the restart").await;
            stop.store(true, Ordering::SeqCst);
            let mut acknowledged = Vec::new();
            for t in tasks {
                acknowledged.extend(t.await.unwrap());
            }
            // A change whose enclave call got no answer is caught up by the running gateway once
            // the enclave answers again: until then the only differences are policies the enclave
            // committed (none acknowledged), then none.
            let proof_key = stack.proof_key().await;
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut seen = 0;
            loop {
                let (status, diff) = stack.state_command("diff-state", &proof_key, &[]);
                let differences = diff["differences"].as_array().unwrap_or_else(|| panic!("{diff}"));
                for d in differences {
                    assert!(d["gateway"].is_null() && d["kind"] == "policy", "{store}: not what the enclave committed: {d}");
                    assert!(!acknowledged.iter().any(|id| d["id"] == id.as_str()), "{store}: an acknowledged policy: {d}");
                }
                seen = seen.max(differences.len());
                if status == Some(0) {
                    break;
                }
                assert!(Instant::now() < deadline, "{store}: the gateway did not catch up in 20 s: {diff}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let (status, rebuilt) = stack.state_command("rebuild", &proof_key, &[]);
            assert_eq!((status, rebuilt["repaired"].as_array().map(Vec::len)), (Some(0), Some(0)), "{store}: {rebuilt}");
            // Every acknowledged policy is the gateway's, so the enclave's (the two agree).
            let list = json!({"organizationId": org}).to_string();
            let r = stack.post_raw("/public/v1/query/list_policies", list.as_bytes(), Some(&stack.api_key())).await;
            let listed: Vec<&str> =
                r.json["policies"].as_array().unwrap().iter().filter_map(|p| p["policyId"].as_str()).collect();
            for id in &acknowledged {
                assert!(listed.contains(&id.as_str()), "{store}: acknowledged policy {id} is not listed");
            }
            eprintln!(
                "{store}: enclave kill under writes: {} acknowledged, {} committed by the enclave alone seen before the catch-up",
                acknowledged.len(),
                seen
            );
        })
        .await
        .expect("test took longer than 60 s (a request hung)");
    }
}

/// Overload is answered at once, not queued: with one read slot held by a client that sends its
/// body slowly, the next read gets a JSON 503 with `Retry-After`, other classes and `/healthz`
/// are unaffected, and the slow client gets a JSON 408 once the body read timeout passes.
#[tokio::test]
async fn overload_is_shed_at_once_and_slow_bodies_time_out() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stack =
        Stack::start_with(&[("COFFER_MAX_IN_FLIGHT_READS", "1"), ("COFFER_BODY_READ_TIMEOUT_MS", "1500")]).await;
    let key = stack.api_key();
    let org = stack.organization_id.clone();
    let query = json!({"organizationId": org}).to_string();
    let addr = stack.base_url.trim_start_matches("http://").to_string();

    // A client that sends its headers and one byte of a 100-byte body, then stalls. (`started`
    // precedes the connection, so the gateway's body timer cannot start before it.)
    let head = format!(
        "POST /public/v1/query/list_wallets HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    let first_try = Instant::now();
    let mut started = Instant::now();
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow.write_all(head.as_bytes()).await.unwrap();

    // Once the gateway holds the read slot for it, the next read is shed: reads are sent until
    // one is (the event that the slot is held), each answered at once, served or shed, never
    // queued behind the slow body (a queued one would be served once it times out, not shed).
    let http = reqwest::Client::new();
    let (shed, retry_after) = loop {
        let stamp = key.stamp(query.as_bytes()).unwrap();
        let r = http
            .post(format!("{}/public/v1/query/list_wallets", stack.base_url))
            .header(stamp.name, stamp.value)
            .body(query.clone())
            .send()
            .await
            .unwrap();
        let (status, content_type, retry_after) = (
            r.status().as_u16(),
            r.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()),
            r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string()),
        );
        let text = r.text().await.unwrap();
        let r = RawResponse { status, content_type, json: serde_json::from_str(&text).unwrap_or(Value::Null), text };
        if r.status != 200 {
            break (r, retry_after);
        }
        // Served: the slow request has not reached its slot yet, or it reached the gateway while
        // one of these reads held the slot and was itself shed at once (then a new slow request
        // is sent), or it has already timed out, which ends the test: its slot was never seen held.
        let mut buf = [0u8; 4096];
        match slow.try_read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Ok(n) if String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 503") => {
                started = Instant::now();
                slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
                slow.write_all(head.as_bytes()).await.unwrap();
            }
            other => panic!("the slow request was answered before any read was shed: {other:?}"),
        }
        assert!(first_try.elapsed() < Duration::from_secs(30), "no read was shed in 30 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(retry_after.as_deref(), Some("1"));
    refused_raw(&shed, 503, "RPC_CALL_ERROR", "overloaded: too many");
    assert!(shed.json["message"].as_str().unwrap().starts_with("overloaded"), "{}", shed.text);

    // Other classes and the health check have their own budget.
    let policy = json!({"type": "ACTIVITY_TYPE_CREATE_POLICY_V3", "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org, "parameters": {"policyName": "p", "effect": "EFFECT_ALLOW", "condition": "true",
        "consensus": "true", "notes": ""}});
    let w = post(&stack.base_url, "/public/v1/submit/create_policy", policy.to_string(), &key).await;
    assert_eq!(w.status, 200, "{}", w.text);
    assert_eq!(healthz(&stack).await.status, 200);

    // The stalled body times out with a JSON 408, and its slot is free again.
    let mut answer = Vec::new();
    let read_answer = async {
        let mut buf = [0u8; 4096];
        loop {
            let n = slow.read(&mut buf).await.unwrap();
            answer.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&answer);
            if n == 0 || text.split_once("\r\n\r\n").is_some_and(|(_, body)| body.trim_end().ends_with('}')) {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read_answer).await.expect("an answer within the timeout");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request body not received within 1500 ms"), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(1500), "not before the timeout");
    let ok = post(&stack.base_url, "/public/v1/query/list_wallets", query, &key).await;
    assert_eq!(ok.status, 200, "{}", ok.text);
}

/// Connections cannot be held without sending: an idle connection and one cut off mid-headers are
/// closed after the header read timeout, and past the per-address cap a new connection gets a
/// JSON 503 at once; once the idle ones are gone, requests are served again.
#[tokio::test]
async fn idle_and_excess_connections_are_closed_or_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stack =
        Stack::start_with(&[("COFFER_MAX_CONNECTIONS_PER_IP", "2"), ("COFFER_HEADER_READ_TIMEOUT_MS", "1000")]).await;
    let addr = stack.base_url.trim_start_matches("http://").to_string();
    let started = Instant::now();
    // Open silent connections until one is refused. (Connections the harness made may still be
    // closing, so which one is refused is found, not assumed.)
    let mut open = Vec::new();
    let mut refused = None;
    for _ in 0..6 {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let mut buf = vec![0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(400), conn.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                buf.truncate(n);
                let mut rest = Vec::new();
                tokio::time::timeout(Duration::from_secs(2), conn.read_to_end(&mut rest)).await.unwrap().unwrap();
                buf.extend(rest);
                refused = Some(String::from_utf8_lossy(&buf).to_string());
                break;
            }
            _ => open.push(conn),
        }
    }
    let answer = refused.expect("a connection past the per-address cap is refused");
    assert!(!open.is_empty() && open.len() <= 2, "{} connections were admitted", open.len());
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("content-type: application/json") || answer.contains("Content-Type: application/json"));
    assert!(answer.contains("Retry-After: 1"), "{answer}");
    let json: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(json["code"], 14, "{json}");

    // An admitted connection that stays silent, and one that stops mid-headers, are closed by the
    // server after the timeout, unanswered.
    open[0].write_all(b"GET /healthz HTTP/1.1\r\nHost: coffer\r\nX-Slow:").await.unwrap();
    for conn in &mut open {
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut buf)).await.expect("closed").ok();
        assert!(!String::from_utf8_lossy(&buf).contains("200 OK"), "no answer to an incomplete request");
    }
    assert!(started.elapsed() >= Duration::from_millis(900), "not before the timeout");
    assert_eq!(healthz(&stack).await.status, 200, "served again once the places are free");
}

/// The gateway crashes (SIGKILL) while sixteen clients write activities (signatures and
/// policies): after a restart every activity a client got a 200 for is there, COMPLETED, and
/// the only others are ones whose requests were in flight at the kill.
#[tokio::test]
async fn gateway_kill_9_under_load_loses_no_acknowledged_activity() {
    const CLIENTS: usize = 16;
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut stack = Stack::start().await;
        let key = stack.api_key();
        let org = stack.organization_id.clone();
        let address = create_eth_wallet(&stack, &key).await;
        let before: Vec<String> =
            stack.activities(&key, &org).await.iter().map(|a| a["id"].as_str().unwrap().to_string()).collect();

        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Activities acknowledged, and clients with two acknowledged (each is then in its loop).
        let (acked_count, going) = (Count::new(), Count::new());
        let (base, sk, pk) = (stack.base_url.clone(), stack.api_private_key.clone(), stack.api_public_key.clone());
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (base, org, address, sk, pk) = (base.clone(), org.clone(), address.clone(), sk.clone(), pk.clone());
                let (stop, acked_count, going) = (stop.clone(), acked_count.clone(), going.clone());
                tokio::spawn(async move {
                    let key = TurnkeyP256ApiKey::from_strings(&sk, Some(&pk)).unwrap();
                    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
                    // (activity id, type) of each 200; how many requests got no answer.
                    let (mut acked, mut unanswered) = (Vec::new(), 0usize);
                    let mut n = 0;
                    while !stop.load(Ordering::SeqCst) {
                        n += 1;
                        // Every fourth client writes policies (no enclave), the rest sign.
                        let (path, body) = if c % 4 == 3 {
                            let params = json!({"policyName": format!("kill-{c}-{n}"), "effect": "EFFECT_ALLOW",
                                "condition": "activity.type == 'ACTIVITY_TYPE_NONE'", "consensus": "true", "notes": ""});
                            ("/public/v1/submit/create_policy", submit_body("ACTIVITY_TYPE_CREATE_POLICY_V3", &org, params))
                        } else {
                            ("/public/v1/submit/sign_raw_payload", sign_body(&org, &address, &format!("kill-{c}-{n}")))
                        };
                        let stamp = key.stamp(body.as_bytes()).unwrap();
                        let sent = http.post(format!("{base}{path}")).header(stamp.name, stamp.value).body(body).send();
                        let answer = match sent.await {
                            Ok(r) => {
                                let status = r.status().as_u16();
                                r.text().await.map(|t| (status, t))
                            }
                            Err(e) => Err(e),
                        };
                        match answer {
                            Ok((200, text)) => {
                                let v: Value = serde_json::from_str(&text).unwrap();
                                let a = &v["activity"];
                                assert_eq!(a["status"], "ACTIVITY_STATUS_COMPLETED", "{text}");
                                acked.push((a["id"].as_str().unwrap().to_string(), a["type"].clone()));
                                acked_count.add();
                                if acked.len() == 2 {
                                    going.add();
                                }
                            }
                            Ok((status, text)) => panic!("{path}: unexpected {status}: {text}"),
                            // Cut off by the kill: it may or may not have been recorded.
                            Err(_) => unanswered += 1,
                        }
                    }
                    (acked, unanswered)
                })
            })
            .collect();
        // Once every client has two activities acknowledged (each sends back to back, so each has
        // one in flight) and forty are, crash the gateway.
        going.reach(CLIENTS, "clients with two activities acknowledged").await;
        acked_count.reach(40, "activities acknowledged").await;
        stop.store(true, Ordering::SeqCst);
        stack.kill_gateway();
        let mut acked = Vec::new();
        let mut unanswered = 0;
        for t in tasks {
            let (a, u) = t.await.unwrap();
            acked.extend(a);
            unanswered += u;
        }
        assert!(unanswered <= CLIENTS, "at most one request per client was cut off: {unanswered}");
        // The enclave finishes the calls the dead gateway left in flight (on a loaded machine this
        // can outlast the restart): its policies stop changing before the gateway comes back, so
        // that the catch-up below sees what the enclave committed (the gateway's second pass
        // covers a restart faster than that in production).
        let mut seen = (stack.authority_entry_count(&org, "policy"), Instant::now());
        let settle = Instant::now() + Duration::from_secs(20);
        while seen.1.elapsed() < Duration::from_millis(1_000) && Instant::now() < settle {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = stack.authority_entry_count(&org, "policy");
            if now != seen.0 {
                seen = (now, Instant::now());
            }
        }

        // The restarted gateway logs its catch-up with the enclave.
        stack.set_env("COFFER_LOG", "warn,coffer_gateway::catch_up=info");
        stack.start_gateway();
        stack.wait_healthy().await;
        let after = stack.activities(&key, &org).await;
        let listed: std::collections::HashMap<String, Value> =
            after.iter().map(|a| (a["id"].as_str().unwrap().to_string(), a.clone())).collect();
        assert_eq!(listed.len(), after.len(), "no activity is listed twice");
        for (id, ty) in &acked {
            assert!(listed.contains_key(id), "acknowledged activity {id} is missing after the crash");
            let q = json!({"organizationId": org, "activityId": id}).to_string();
            let r = stack.post_raw("/public/v1/query/get_activity", q.as_bytes(), Some(&key)).await;
            assert_eq!(r.status, 200, "{id}: {}", r.text);
            assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{id}: {}", r.text);
            assert_eq!(&r.json["activity"]["type"], ty, "{id}: {}", r.text);
        }
        let acked_ids: std::collections::HashSet<&str> = acked.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(acked_ids.len(), acked.len(), "each 200 named its own activity");
        let extra: Vec<&Value> = after
            .iter()
            .filter(|a| {
                let id = a["id"].as_str().unwrap();
                !acked_ids.contains(id) && !before.iter().any(|b| b == id)
            })
            .collect();
        eprintln!(
            "gateway kill: acknowledged={} cut off={unanswered} recorded but unacknowledged={}",
            acked.len(),
            extra.len()
        );
        assert_eq!(after.len(), before.len() + acked.len() + extra.len());
        assert!(extra.len() <= unanswered, "only requests in flight at the kill may be recorded unanswered");
        for a in &extra {
            assert_eq!(a["status"], "ACTIVITY_STATUS_COMPLETED", "a recorded activity is complete: {a}");
        }

        // The restarted gateway serves as before.
        let r = stack
            .post_raw(
                "/public/v1/submit/sign_raw_payload",
                sign_body(&org, &address, "after-restart").as_bytes(),
                Some(&key),
            )
            .await;
        assert_signed_by(&r, "after-restart", &address);

        // The gateway's records converge to the enclave's state by themselves: a policy the
        // enclave applied while the gateway died (its answer lost) is made the gateway's by the
        // restarted gateway's catch-up, which logs what it did; then the two agree and `rebuild`
        // finds nothing to repair.
        let log = stack.dir.join("gateway.log");
        let deadline = Instant::now() + Duration::from_secs(20);
        let caught_up = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let summary = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|l| l["fields"]["message"] == "caught up with the enclave");
            if let Some(line) = summary {
                break line["fields"].clone();
            }
            assert!(Instant::now() < deadline, "the restarted gateway did not catch up in 20 s: {text}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let field = |name: &str| caught_up[name].as_u64().unwrap_or_else(|| panic!("{caught_up}")) as usize;
        let (repairs, left) = (field("repairs"), field("left"));
        assert_eq!(left, 0, "{caught_up}");
        assert!(repairs <= unanswered, "{caught_up}");
        // A repair the start could not make (the state moved while it was read: a link of a
        // request cut off by the kill landing) is made by the gateway's later passes.
        let proof_key = stack.proof_key().await;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, diff) = stack.state_command("diff-state", &proof_key, &[]);
            if (status, diff["differences"].as_array().map(Vec::len)) == (Some(0), Some(0)) {
                break;
            }
            assert!(field("deferred") > 0 && Instant::now() < deadline, "{caught_up}: {diff}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let (status, rebuilt) = stack.state_command("rebuild", &proof_key, &[]);
        assert_eq!((status, rebuilt["repaired"].as_array().map(Vec::len)), (Some(0), Some(0)), "{rebuilt}");
        eprintln!("gateway kill: {repairs} committed by the enclave alone, caught up by the restarted gateway: {caught_up}");
    })
    .await
    .expect("test took longer than 60 s (a request hung)");
}

/// A burst of 300 signing requests, each on its own connection and released at once, against
/// eight signing slots: each is answered within 10 s, either signed or shed with a JSON 503 and
/// `Retry-After`; shed requests record nothing.
#[tokio::test]
async fn signing_burst_is_signed_or_shed_promptly() {
    const BURST: usize = 300;
    tokio::time::timeout(Duration::from_secs(60), async {
        let stack = Stack::start_with(&[("COFFER_MAX_IN_FLIGHT_SIGNING", "8")]).await;
        let key = stack.api_key();
        let org = stack.organization_id.clone();
        let address = create_eth_wallet(&stack, &key).await;
        let before = ids(&stack.activities(&key, &org).await);
        assert_eq!(before.len(), 1, "the wallet's activity: {before:?}");

        let barrier = Arc::new(tokio::sync::Barrier::new(BURST + 1));
        let url = format!("{}/public/v1/submit/sign_raw_payload", stack.base_url);
        let tasks: Vec<_> = (0..BURST)
            .map(|i| {
                let message = format!("burst-{i}");
                let body = sign_body(&org, &address, &message);
                let stamp = key.stamp(body.as_bytes()).unwrap();
                let (barrier, url) = (barrier.clone(), url.clone());
                tokio::spawn(async move {
                    // Its own client, so its own connection.
                    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
                    barrier.wait().await;
                    let started = Instant::now();
                    let r = http.post(url).header(stamp.name, stamp.value).body(body).send().await.unwrap();
                    let status = r.status().as_u16();
                    let header = |h: &str| r.headers().get(h).map(|v| v.to_str().unwrap().to_string());
                    let (content_type, retry_after) = (header("content-type"), header("retry-after"));
                    let text = r.text().await.unwrap();
                    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
                    (message, RawResponse { status, content_type, json, text }, retry_after, started.elapsed())
                })
            })
            .collect();
        barrier.wait().await;
        let (mut signed, mut shed, mut slowest) = (0, 0, Duration::ZERO);
        let mut expected = before.clone();
        for t in tasks {
            let (message, r, retry_after, took) = t.await.unwrap();
            assert!(took < Duration::from_secs(10), "{message} answered after {took:?}: {}", r.text);
            slowest = slowest.max(took);
            match r.status {
                200 => {
                    assert_signed_by(&r, &message, &address);
                    assert!(expected.insert(r.json["activity"]["id"].as_str().unwrap().to_string()), "{}", r.text);
                    signed += 1;
                }
                503 => {
                    refused_raw(&r, 503, "RPC_CALL_ERROR", "overloaded: too many");
                    assert!(r.json["message"].as_str().unwrap().starts_with("overloaded"), "{}", r.text);
                    assert_eq!(retry_after.as_deref(), Some("1"), "{}", r.text);
                    shed += 1;
                }
                other => panic!("{message}: unexpected status {other}: {}", r.text),
            }
        }
        eprintln!("signing burst: signed={signed} shed={shed} slowest={slowest:?}");
        assert!(signed >= 8, "the slots sign: signed={signed}");
        assert!(shed >= 1, "{BURST} at once exceed 8 slots: nothing was shed");
        // Exactly the signed ones were recorded (once settled), none of the shed ones.
        assert_eq!(settled_count(&stack, &key, &org).await, before.len() + signed);
        assert_eq!(ids(&stack.activities(&key, &org).await), expected);
        assert_eq!(healthz(&stack).await.status, 200);
    })
    .await
    .expect("test took longer than 60 s (a request hung)");
}

/// Starts a second enclave on the stack's token and restarts the gateway with both enclaves:
/// the second one's socket and process (the caller kills it).
async fn second_enclave(stack: &mut Stack) -> (std::path::PathBuf, std::process::Child) {
    let socket = stack.dir.join("enclave2.sock");
    let child = stack.spawn_enclave(&socket);
    coffer_tests::wait_accepting(&socket).await;
    stack.kill_gateway();
    let sockets = format!("{},{}", stack.enclave_socket().display(), socket.display());
    stack.set_env("COFFER_ENCLAVE_SOCKETS", &sockets);
    stack.start_gateway();
    stack.wait_healthy().await;
    (socket, child)
}

/// Two enclaves on one token and one authority store behind one gateway: signing goes on while
/// either one is killed and after it comes back. A request in flight on the dead one is sent to
/// the other, which refuses to run it a second time (the replay window is shared): the client gets
/// a 503 to send it anew, and nothing else fails.
#[tokio::test]
async fn two_enclaves_one_killed_under_load_the_other_signs() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let mut stack = Stack::start().await;
        let key = stack.api_key();
        let org = stack.organization_id.clone();
        let address = create_eth_wallet(&stack, &key).await;
        let (second_socket, mut second) = second_enclave(&mut stack).await;
        let before = ids(&stack.activities(&key, &org).await);
        assert_eq!(before.len(), 1, "the wallet's activity: {before:?}");

        // Eight clients sign back to back while the enclaves are killed and restarted in turn. The
        // phase says which enclaves are up, as the test sets it: 0 both, 1 only the second (the
        // first killed), 2 both again (set before the first restarts), 3 only the first (set once
        // the second is dead). A request sent and answered in one phase was signed in it; each
        // phase ends once some were.
        const BOTH: usize = 0;
        const ONLY_SECOND: usize = 1;
        const BOTH_AGAIN: usize = 2;
        const ONLY_FIRST: usize = 3;
        let phase = Arc::new(AtomicUsize::new(BOTH));
        let signed_in: [Count; 4] = std::array::from_fn(|_| Count::new());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (base, sk, pk) = (stack.base_url.clone(), stack.api_private_key.clone(), stack.api_public_key.clone());
        let clients: Vec<_> = (0..8)
            .map(|c| {
                let (base, org, address, sk, pk, stop) =
                    (base.clone(), org.clone(), address.clone(), sk.clone(), pk.clone(), stop.clone());
                let (phase, signed_in) = (phase.clone(), signed_in.clone());
                tokio::spawn(async move {
                    let key = TurnkeyP256ApiKey::from_strings(&sk, Some(&pk)).unwrap();
                    let mut results = Vec::new();
                    let mut n = 0;
                    while !stop.load(Ordering::SeqCst) {
                        let message = format!("failover-{c}-{n}");
                        n += 1;
                        let sent_in = phase.load(Ordering::SeqCst);
                        let r = post(
                            &base,
                            "/public/v1/submit/sign_raw_payload",
                            sign_body(&org, &address, &message),
                            &key,
                        )
                        .await;
                        let answered_in = phase.load(Ordering::SeqCst);
                        if r.status == 200 && sent_in == answered_in {
                            signed_in[sent_in].add();
                        }
                        results.push((message, r, sent_in, answered_in));
                    }
                    results
                })
            })
            .collect();
        const SOME: usize = 8;
        signed_in[BOTH].reach(SOME, "signed with both enclaves up").await;
        stack.kill_enclave();
        phase.store(ONLY_SECOND, Ordering::SeqCst);
        signed_in[ONLY_SECOND].reach(SOME, "signed with only the second enclave up").await;
        phase.store(BOTH_AGAIN, Ordering::SeqCst);
        stack.start_enclave();
        coffer_tests::wait_accepting(&stack.enclave_socket()).await;
        signed_in[BOTH_AGAIN].reach(SOME, "signed with both enclaves up again").await;
        let _ = second.kill();
        let _ = second.wait();
        phase.store(ONLY_FIRST, Ordering::SeqCst);
        signed_in[ONLY_FIRST].reach(SOME, "signed with only the first enclave up").await;
        stop.store(true, Ordering::SeqCst);

        // Every request was signed (none failed), and some were answered while only the second
        // enclave was up, and some while only the first was.
        let (mut ok, mut by_second, mut by_first, mut unknown) = (0, 0, 0, 0);
        let mut expected = before.clone();
        for c in clients {
            for (message, r, sent_in, answered_in) in c.await.unwrap() {
                // A request in flight on an enclave when it was killed: the enclaves share one
                // replay window, so the other refuses to run it again, and the client is told to
                // send it anew (nothing was recorded).
                if r.status == 503 && r.text.contains("was not run again") {
                    unknown += 1;
                    continue;
                }
                assert_signed_by(&r, &message, &address);
                assert!(expected.insert(r.json["activity"]["id"].as_str().unwrap().to_string()), "{}", r.text);
                ok += 1;
                by_second += usize::from(sent_in == ONLY_SECOND && answered_in == ONLY_SECOND);
                by_first += usize::from(sent_in == ONLY_FIRST && answered_in == ONLY_FIRST);
            }
        }
        eprintln!(
            "two enclaves: {ok} signed, {by_second} with only the second up, {by_first} with only the first, \
             {unknown} in flight at a kill"
        );
        assert!(unknown <= 16, "at most the 8 clients' requests in flight at each of the two kills: {unknown}");
        assert!(by_second >= SOME && by_first >= SOME, "{by_second} / {by_first}");
        // Each signature recorded exactly once: every page, once settled, holds the wallet's
        // activity and one per signature, nothing else.
        assert_eq!(settled_count(&stack, &key, &org).await, before.len() + ok);
        assert_eq!(ids(&stack.activities(&key, &org).await), expected);
        // Each enclave was counted unreachable while it was down.
        let metrics = reqwest::get(format!("{}/metrics", stack.base_url)).await.unwrap().text().await.unwrap();
        for socket in [stack.enclave_socket(), second_socket.clone()] {
            let line = format!("coffer_enclave_unreachable_total{{enclave=\"{}\"}}", socket.display());
            assert!(metrics.lines().any(|l| l.starts_with(&line)), "{line} in {metrics}");
        }
    })
    .await
    .expect("test took longer than 90 s (a request hung)");
}

/// A stamped body with a timestamp of its own (concurrent bodies must differ to be distinct
/// requests).
fn body_at(ty: &str, org: &str, timestamp_ms: u128, parameters: Value) -> String {
    json!({"type": ty, "timestampMs": timestamp_ms.to_string(), "organizationId": org, "parameters": parameters})
        .to_string()
}

/// Sends each `(gateway, path, body)` at once; the answers in order.
async fn all_at_once(requests: Vec<(String, &'static str, String)>, key: &TurnkeyP256ApiKey) -> Vec<RawResponse> {
    let start = Arc::new(tokio::sync::Barrier::new(requests.len()));
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|(base, path, body)| {
            let (start, key) = (start.clone(), TurnkeyP256ApiKey::from_bytes(key.private_key(), None).unwrap());
            tokio::spawn(async move {
                start.wait().await;
                post(&base, path, body, &key).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

async fn wallet_names(base: &str, key: &TurnkeyP256ApiKey, org: &str) -> Vec<String> {
    let r = post(base, "/public/v1/query/list_wallets", json!({"organizationId": org}).to_string(), key).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["wallets"].as_array().unwrap().iter().map(|w| w["walletName"].as_str().unwrap().to_string()).collect()
}

/// Two gateways on one PostgreSQL database drive one organization at once: one request sent
/// sixteen times through both is one activity and one wallet; sixteen requests for one wallet
/// name make one wallet; two approvals of one pending activity, one through each gateway,
/// execute it once.
#[tokio::test]
async fn two_gateways_on_postgres_agree_on_fingerprints_names_and_approvals() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let stack = Stack::start_on("postgres", &[]).await;
        let (second, second_gateway) = stack.spawn_gateway().await;
        let gateways = [stack.base_url.clone(), second.clone()];
        let key = stack.api_key();
        let org = stack.organization_id.clone();
        let via = |i: usize| gateways[i % 2].clone();

        // One request, sixteen times, half through each gateway.
        let body = body_at(
            "ACTIVITY_TYPE_CREATE_WALLET",
            &org,
            Stack::now_ms(),
            json!({"walletName": "once", "accounts": []}),
        );
        let answers =
            all_at_once((0..16).map(|i| (via(i), "/public/v1/submit/create_wallet", body.clone())).collect(), &key)
                .await;
        let ids: std::collections::BTreeSet<&str> = answers
            .iter()
            .map(|r| {
                assert_eq!(r.status, 200, "{}", r.text);
                r.json["activity"]["id"].as_str().unwrap()
            })
            .collect();
        assert_eq!(ids.len(), 1, "one activity for one request: {ids:?}");

        // Sixteen different requests for one wallet name.
        let t0 = Stack::now_ms();
        let contested = (0..16)
            .map(|i| {
                let body = body_at(
                    "ACTIVITY_TYPE_CREATE_WALLET",
                    &org,
                    t0 + i as u128,
                    json!({"walletName": "contested", "accounts": []}),
                );
                (via(i), "/public/v1/submit/create_wallet", body)
            })
            .collect();
        let answers = all_at_once(contested, &key).await;
        let won = answers.iter().filter(|r| r.status == 200).count();
        assert_eq!(won, 1, "{:?}", answers.iter().map(|r| (r.status, r.text.clone())).collect::<Vec<_>>());
        for r in answers.iter().filter(|r| r.status != 200) {
            // The name check or the store's constraint, whichever sees the winner first.
            refused_raw(r, 400, "REQUEST_INVALID", "");
            assert!(r.text.contains("unique") || r.text.contains("already"), "{}", r.text);
        }
        let mut names = wallet_names(&second, &key, &org).await;
        names.sort();
        assert_eq!(names, ["contested", "once"]);

        // A root quorum of two: the root's wallet waits; alice approves it through both gateways
        // at once (two distinct approvals); it is created once.
        let alice = TurnkeyP256ApiKey::generate();
        let users = json!({"users": [{"userName": "alice", "userEmail": null, "userPhoneNumber": null,
            "apiKeys": [{"apiKeyName": "alice", "publicKey": hex::encode(alice.compressed_public_key()),
                "curveType": "API_KEY_CURVE_P256", "expirationSeconds": null}],
            "authenticators": [], "oauthProviders": [], "userTags": []}]});
        let r = post(
            &gateways[0],
            "/public/v1/submit/create_users",
            body_at("ACTIVITY_TYPE_CREATE_USERS_V4", &org, Stack::now_ms(), users),
            &key,
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let alice_id = r.json["activity"]["result"]["createUsersResult"]["userIds"][0].as_str().unwrap().to_string();
        let quorum = json!({"threshold": 2, "userIds": [stack.user_id, alice_id]});
        let r = post(
            &gateways[1],
            "/public/v1/submit/update_root_quorum",
            body_at("ACTIVITY_TYPE_UPDATE_ROOT_QUORUM", &org, Stack::now_ms(), quorum),
            &key,
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let body = body_at(
            "ACTIVITY_TYPE_CREATE_WALLET",
            &org,
            Stack::now_ms(),
            json!({"walletName": "approved", "accounts": []}),
        );
        let r = post(&gateways[0], "/public/v1/submit/create_wallet", body, &key).await;
        assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_CONSENSUS_NEEDED", "{}", r.text);
        let (pending, fingerprint) =
            (r.json["activity"]["id"].as_str().unwrap().to_string(), r.json["activity"]["fingerprint"].clone());
        let t0 = Stack::now_ms();
        let approvals = (0..2)
            .map(|i| {
                let body = body_at(
                    "ACTIVITY_TYPE_APPROVE_ACTIVITY",
                    &org,
                    t0 + i as u128,
                    json!({"fingerprint": fingerprint}),
                );
                (via(i), "/public/v1/submit/approve_activity", body)
            })
            .collect();
        let answers = all_at_once(approvals, &alice).await;
        // One run: the approval that lost the race answers with the run the other made (the same
        // activity and wallet), or is refused; never a second wallet.
        let completed: Vec<&Value> = answers
            .iter()
            .filter(|r| r.json["activity"]["status"] == "ACTIVITY_STATUS_COMPLETED")
            .map(|r| &r.json["activity"])
            .collect();
        let texts = answers.iter().map(|r| r.text.clone()).collect::<Vec<_>>();
        assert!(!completed.is_empty(), "{texts:?}");
        assert!(
            completed.iter().all(|a| a["id"] == pending.as_str() && a["result"] == completed[0]["result"]),
            "{texts:?}"
        );
        let names = wallet_names(&gateways[1], &key, &org).await;
        assert_eq!(names.iter().filter(|n| *n == "approved").count(), 1, "{names:?}");
        let q = json!({"organizationId": org, "activityId": pending}).to_string();
        let r = post(&gateways[0], "/public/v1/query/get_activity", q, &key).await;
        assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{}", r.text);
        assert_eq!(r.json["activity"]["votes"].as_array().map(Vec::len), Some(2), "{}", r.text);
        drop(second_gateway);
    })
    .await
    .expect("test took longer than 90 s (a request hung)");
}

/// Two gateways and two enclaves on PostgreSQL under signing load: an enclave is killed, then a
/// gateway; the clients of the dead gateway move to the other one. Every 200 is a signature by
/// the account, the only failures are requests in flight at the gateway's kill, and every
/// acknowledged activity is on record through the surviving gateway.
#[tokio::test]
async fn on_postgres_an_enclave_and_a_gateway_die_under_load_and_nothing_acknowledged_is_lost() {
    const CLIENTS: usize = 8;
    tokio::time::timeout(Duration::from_secs(90), async {
        let mut stack = Stack::start_on("postgres", &[]).await;
        let key = stack.api_key();
        let org = stack.organization_id.clone();
        let address = create_eth_wallet(&stack, &key).await;
        let (_, mut second_enclave) = second_enclave(&mut stack).await;
        let (second, second_gateway) = stack.spawn_gateway().await;

        // The phase, as the test sets it: 0 all up, 1 the first enclave killed, 2 the first
        // gateway killed too. Signatures sent and answered in one phase are counted in it, and a
        // client's first in phase 2 (necessarily through the second gateway) once; each phase
        // ends on those counts.
        const ALL_UP: usize = 0;
        const ENCLAVE_DOWN: usize = 1;
        const GATEWAY_DOWN: usize = 2;
        let phase = Arc::new(AtomicUsize::new(ALL_UP));
        let signed_in: [Count; 3] = std::array::from_fn(|_| Count::new());
        let moved = Count::new();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (sk, pk) = (stack.api_private_key.clone(), stack.api_public_key.clone());
        let gateways = [stack.base_url.clone(), second.clone()];
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (gateways, org, address, sk, pk, stop) =
                    (gateways.clone(), org.clone(), address.clone(), sk.clone(), pk.clone(), stop.clone());
                let (phase, signed_in, moved) = (phase.clone(), signed_in.clone(), moved.clone());
                tokio::spawn(async move {
                    let key = TurnkeyP256ApiKey::from_strings(&sk, Some(&pk)).unwrap();
                    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
                    let (mut signed, mut cut_off, mut on) = (Vec::new(), 0usize, c % 2);
                    let mut n = 0;
                    while !stop.load(Ordering::SeqCst) {
                        n += 1;
                        let message = format!("scale-{c}-{n}");
                        let body = sign_body(&org, &address, &message);
                        let stamp = key.stamp(body.as_bytes()).unwrap();
                        let sent_in = phase.load(Ordering::SeqCst);
                        let sent = http
                            .post(format!("{}/public/v1/submit/sign_raw_payload", gateways[on]))
                            .header(stamp.name, stamp.value)
                            .body(body)
                            .send()
                            .await;
                        match sent {
                            Ok(r) => {
                                let status = r.status().as_u16();
                                let text = r.text().await.unwrap_or_default();
                                let json = serde_json::from_str(&text).unwrap_or(Value::Null);
                                let r = RawResponse { status, content_type: Some("application/json".into()), json, text };
                                // In flight on the enclave when it was killed: the other enclave
                                // shares the replay window and will not run it again, so the
                                // client is told to send it anew (nothing was recorded).
                                if r.status == 503 && r.text.contains("was not run again") {
                                    cut_off += 1;
                                    continue;
                                }
                                assert_signed_by(&r, &message, &address);
                                let answered_in = phase.load(Ordering::SeqCst);
                                if sent_in == answered_in {
                                    signed_in[sent_in].add();
                                    if sent_in == GATEWAY_DOWN && !signed.iter().any(|(_, _, p)| *p == GATEWAY_DOWN) {
                                        moved.add();
                                    }
                                }
                                let id = r.json["activity"]["id"].as_str().unwrap().to_string();
                                signed.push((id, on, if sent_in == answered_in { sent_in } else { usize::MAX }));
                            }
                            // The gateway died: what was in flight may or may not be on record; the
                            // client goes to the other gateway, as behind a load balancer.
                            Err(_) => {
                                cut_off += 1;
                                on = 1 - on;
                            }
                        }
                    }
                    (signed, cut_off)
                })
            })
            .collect();
        const SOME: usize = 8;
        signed_in[ALL_UP].reach(SOME, "signed with everything up").await;
        stack.kill_enclave();
        phase.store(ENCLAVE_DOWN, Ordering::SeqCst);
        signed_in[ENCLAVE_DOWN].reach(SOME, "signed after the first enclave's kill").await;
        stack.kill_gateway();
        phase.store(GATEWAY_DOWN, Ordering::SeqCst);
        let gateway_down = Instant::now();
        moved.reach(CLIENTS, "clients that signed after the first gateway's kill").await;
        stop.store(true, Ordering::SeqCst);

        let (mut signed, mut cut_off) = (Vec::new(), 0);
        for c in clients {
            let (s, u) = c.await.unwrap();
            signed.extend(s);
            cut_off += u;
        }
        let on_second = signed.iter().filter(|(_, g, _)| *g == 1).count();
        let after_the_kill = signed.iter().filter(|(_, _, p)| *p == GATEWAY_DOWN).count();
        eprintln!(
            "two gateways, two enclaves on PostgreSQL: {} signed ({on_second} by the second gateway, {after_the_kill} after the first's kill), {cut_off} cut off, {:?} after the kill",
            signed.len(),
            gateway_down.elapsed()
        );
        assert!(
            cut_off <= 2 * CLIENTS,
            "only requests in flight at the enclave's or the gateway's kill fail: {cut_off}"
        );
        // Every client, those of the dead gateway too, signed through the surviving one after the
        // kill (the phase ended on it), and nothing was signed through the dead one after it.
        assert_eq!(moved.get(), CLIENTS);
        assert!(
            signed.iter().all(|(_, g, p)| *p != GATEWAY_DOWN || *g == 1),
            "signed through the dead gateway after its kill"
        );
        // Everything acknowledged is on record, completed, as the other gateway reads it.
        for (id, _, _) in &signed {
            let q = json!({"organizationId": org, "activityId": id}).to_string();
            let r = post(&second, "/public/v1/query/get_activity", q, &key).await;
            assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{id}: {}", r.text);
        }
        drop(second_gateway);
        let _ = second_enclave.kill();
        let _ = second_enclave.wait();
    })
    .await
    .expect("test took longer than 90 s (a request hung)");
}

/// An enclave over TCP: it serves a gateway that presents a certificate of the enclaves' CA
/// (the gateway signs through it with the Unix-socket enclave gone), and refuses a connection
/// without a client certificate, with one from another CA, and in plaintext.
#[tokio::test]
async fn an_enclave_over_tcp_serves_only_clients_with_a_certificate_of_its_ca() {
    use coffer_proto::v1::{enclave_client::EnclaveClient, GetSignerPublicKeyRequest};
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    tokio::time::timeout(Duration::from_secs(90), async {
        let mut stack = Stack::start().await;
        let key = stack.api_key();
        let org = stack.organization_id.clone();
        let address = create_eth_wallet(&stack, &key).await;
        let pki = coffer_tests::tls::Pki::generate(&stack.dir.join("pki"));
        let port = coffer_tests::free_port();
        let p = |name: &str| pki.path(name).display().to_string();
        // The enclave's TCP listener (the variables are the enclave's; the gateway reads others).
        stack.set_env("COFFER_ENCLAVE_TCP_LISTEN", &format!("127.0.0.1:{port}"));
        stack.set_env("COFFER_ENCLAVE_TLS_CERT", &p("enclave.pem"));
        stack.set_env("COFFER_ENCLAVE_TLS_KEY", &p("enclave.key"));
        stack.set_env("COFFER_ENCLAVE_TLS_CLIENT_CA", &p("ca.pem"));
        let mut tcp_enclave = stack.spawn_enclave(&stack.dir.join("enclave-tcp.sock"));
        let t = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(t.elapsed() < Duration::from_secs(30), "the enclave's TCP listener did not open");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The gateway reaches only the TCP enclave; the Unix-socket one is gone.
        stack.kill_enclave();
        stack.kill_gateway();
        let url = format!("https://localhost:{port}");
        stack.set_env("COFFER_ENCLAVE_URLS", &url);
        stack.set_env("COFFER_ENCLAVE_CLIENT_TLS_CA", &p("ca.pem"));
        stack.set_env("COFFER_ENCLAVE_CLIENT_TLS_CERT", &p("gateway.pem"));
        stack.set_env("COFFER_ENCLAVE_CLIENT_TLS_KEY", &p("gateway.key"));
        stack.start_gateway();
        stack.wait_healthy().await;
        let r =
            post(&stack.base_url, "/public/v1/submit/sign_raw_payload", sign_body(&org, &address, "over tcp"), &key)
                .await;
        assert_signed_by(&r, "over tcp", &address);

        // Straight at the enclave's port: only the gateway's certificate gets an answer.
        let ca = Certificate::from_pem(std::fs::read(pki.path("ca.pem")).unwrap());
        let identity = |name: &str| {
            Identity::from_pem(
                std::fs::read(pki.path(&format!("{name}.pem"))).unwrap(),
                std::fs::read(pki.path(&format!("{name}.key"))).unwrap(),
            )
        };
        let ask = |tls: Option<ClientTlsConfig>, url: String| async move {
            let mut endpoint = Endpoint::from_shared(url).unwrap().connect_timeout(Duration::from_secs(5));
            if let Some(tls) = tls {
                endpoint = endpoint.tls_config(tls).unwrap();
            }
            match endpoint.connect().await {
                Ok(channel) => EnclaveClient::new(channel)
                    .get_signer_public_key(GetSignerPublicKeyRequest {})
                    .await
                    .map(|r| r.into_inner().public_key)
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        };
        let base = ClientTlsConfig::new().ca_certificate(ca.clone()).domain_name("localhost");
        let signer = ask(Some(base.clone().identity(identity("gateway"))), url.clone()).await;
        assert_eq!(hex::encode(signer.expect("the gateway's certificate is accepted")), stack.signer_public_key);
        assert!(ask(Some(base.clone()), url.clone()).await.is_err(), "no client certificate");
        assert!(ask(Some(base.identity(identity("rogue"))), url.clone()).await.is_err(), "another CA's certificate");
        assert!(ask(None, format!("http://127.0.0.1:{port}")).await.is_err(), "plaintext");
        let _ = tcp_enclave.kill();
        let _ = tcp_enclave.wait();
    })
    .await
    .expect("test took longer than 90 s (a request hung)");
}

/// Where a request's path is cut (`coffer_process::crash_point`), which process dies there, and
/// whether the enclave had committed the change by then.
const CRASH_POINTS: &[(&str, Process, bool)] = &[
    // (No point between a stamp's spending and its work: a state change's stamp, its replay entry
    // and its allow, is spent in the transaction that applies the change, a key use's in the one
    // that links it.)
    // A state change decided and staged, its group's transaction not begun: nothing kept, its
    // stamp included (the same body is taken again).
    ("enclave-before-state-commit", Process::Enclave, false),
    // A state change committed with its stamp spent, not linked, not answered.
    ("enclave-after-state-commit", Process::Enclave, true),
    // Linked in its call, not answered.
    ("enclave-after-link", Process::Enclave, true),
    // The enclave's answer received, nothing recorded.
    ("gateway-after-enclave-answer", Process::Gateway, true),
    // Recorded, not answered.
    ("gateway-after-commit", Process::Gateway, true),
];

#[derive(Clone, Copy, PartialEq, Debug)]
enum Process {
    Enclave,
    Gateway,
}

/// POSTs a stamped body; `None` when the connection dies before an answer (the gateway crashed).
async fn post_or_cut(base_url: &str, path: &str, body: &str, key: &TurnkeyP256ApiKey) -> Option<RawResponse> {
    let stamp = key.stamp(body.as_bytes()).unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{base_url}{path}"))
        .header(stamp.name, stamp.value)
        .body(body.to_string())
        .send()
        .await
        .ok()?;
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.ok()?;
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Some(RawResponse { status, content_type, json, text })
}

/// The activity the gateway records for the stamped `body` (its id derived from the body), if any.
async fn recorded(stack: &Stack, body: &str) -> Option<Value> {
    let fingerprint = coffer_auth::envelope::StampedActivity::parse(body.as_bytes()).unwrap().fingerprint;
    let id = coffer_auth::envelope::derived_id(&fingerprint, coffer_auth::envelope::ACTIVITY_ID, 0);
    let query = json!({"organizationId": stack.organization_id, "activityId": id}).to_string();
    let r = stack.post_raw("/public/v1/query/get_activity", query.as_bytes(), Some(&stack.api_key())).await;
    (r.status == 200).then(|| r.json["activity"].clone())
}

/// Kill -9 at chosen points of the request's path (issue 40's matrix; on the run's store, so on
/// both with the PostgreSQL pass): a policy write and a signature, each cut at every point of its
/// path, in the enclave or in the gateway. Nothing cut is acknowledged; once the dead process is
/// back, the gateway converges by itself to the enclave's state (`diff-state` finds nothing,
/// within 20 s), shows the policy exactly when the enclave committed it, shows an activity only
/// as the enclave did it (a signature recorded before the crash is the enclave's, and recovers to
/// the account), and signs again.
#[tokio::test]
async fn a_crash_at_each_point_of_the_path_leaves_the_gateway_converging_to_the_enclave() {
    for &(point, process, committed) in CRASH_POINTS {
        tokio::time::timeout(Duration::from_secs(90), async {
            let armed = std::env::temp_dir().join(format!("coffer-crash-point-{}", uuid::Uuid::new_v4()));
            let mut stack = Stack::start_with(&[("COFFER_CRASH_POINT_FILE", armed.to_str().unwrap())]).await;
            let key = stack.api_key();
            let org = stack.organization_id.clone();
            let address = create_eth_wallet(&stack, &key).await;
            let proof_key = stack.proof_key().await;
            let policy = |name: &str| {
                let params = json!({"policyName": name, "effect": "EFFECT_ALLOW",
                    "condition": "activity.type == 'ACTIVITY_TYPE_NONE'", "consensus": "true", "notes": ""});
                submit_body("ACTIVITY_TYPE_CREATE_POLICY_V3", &org, params)
            };
            let cases = [
                ("create_policy", policy(&format!("cut-{point}"))),
                ("sign_raw_payload", sign_body(&org, &address, &format!("cut at {point}"))),
            ];
            for (path, body) in cases {
                // Signing changes no state: no state commit to cut.
                if path == "sign_raw_payload" && point.contains("state-commit") {
                    continue;
                }
                std::fs::write(&armed, point).unwrap();
                let answer = post_or_cut(&stack.base_url, &format!("/public/v1/submit/{path}"), &body, &key).await;
                assert!(!armed.exists(), "{point} {path}: the point was not reached");
                match process {
                    Process::Gateway => {
                        assert!(answer.is_none(), "{point} {path}: answered {answer:?}");
                        stack.kill_gateway();
                        stack.start_gateway();
                    }
                    Process::Enclave => {
                        assert_unavailable(&answer.unwrap_or_else(|| panic!("{point} {path}: no answer")));
                        stack.kill_enclave();
                        stack.start_enclave();
                    }
                }
                stack.wait_healthy().await;
                // The gateway converges by itself.
                let deadline = Instant::now() + Duration::from_secs(20);
                loop {
                    let (status, diff) = stack.state_command("diff-state", &proof_key, &[]);
                    if status == Some(0) {
                        break;
                    }
                    assert!(Instant::now() < deadline, "{point} {path}: the gateway did not converge in 20 s: {diff}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                let activity = recorded(&stack, &body).await;
                let status = activity.as_ref().map(|a| a["status"].as_str().unwrap_or_default().to_string());
                if path == "create_policy" {
                    let list = json!({"organizationId": org}).to_string();
                    let r = stack.post_raw("/public/v1/query/list_policies", list.as_bytes(), Some(&key)).await;
                    let name = format!("cut-{point}");
                    let shown = r.json["policies"].as_array().unwrap().iter().any(|p| p["policyName"] == name.as_str());
                    assert_eq!(shown, committed, "{point}: the policy shown is not what the enclave committed");
                    if !committed {
                        // Its stamp was not spent either: the same body is taken, once.
                        let again =
                            stack.post_raw("/public/v1/submit/create_policy", body.as_bytes(), Some(&key)).await;
                        assert_eq!(again.status, 200, "{point}: the same body again: {}", again.text);
                        let r = stack.post_raw("/public/v1/query/list_policies", list.as_bytes(), Some(&key)).await;
                        let shown =
                            r.json["policies"].as_array().unwrap().iter().any(|p| p["policyName"] == name.as_str());
                        assert!(shown, "{point}: the policy taken again is not shown");
                        continue;
                    }
                }
                if point == "gateway-after-commit" {
                    // Recorded before the crash: as the enclave did it.
                    assert_eq!(status.as_deref(), Some("ACTIVITY_STATUS_COMPLETED"), "{point} {path}");
                    if path == "sign_raw_payload" {
                        let message = format!("cut at {point}");
                        let r = RawResponse {
                            status: 200,
                            content_type: Some("application/json".into()),
                            json: json!({"activity": activity.clone().unwrap()}),
                            text: String::new(),
                        };
                        assert_signed_by(&r, &message, &address);
                    }
                } else {
                    // Never recorded completed: its answer never reached the gateway's records.
                    assert_ne!(status.as_deref(), Some("ACTIVITY_STATUS_COMPLETED"), "{point} {path}: {activity:?}");
                }
            }
            // Up again: a new signature.
            let after = sign_body(&org, &address, "after");
            let r = stack.post_raw("/public/v1/submit/sign_raw_payload", after.as_bytes(), Some(&key)).await;
            assert_signed_by(&r, "after", &address);
            let _ = std::fs::remove_file(&armed);
        })
        .await
        .unwrap_or_else(|_| panic!("{point}: not done in 90 s"));
    }
}
