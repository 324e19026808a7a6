//! Refusals: every rejected request is a gRPC-gateway `Status` JSON with the right HTTP status,
//! `Content-Type: application/json`, a typed `TurnkeyErrorDetail`, and changes nothing.

use coffer_tests::{refused_raw, RawResponse, Stack};
use serde_json::{json, Value};
use turnkey_api_key_stamper::{Stamp, TurnkeyP256ApiKey};

const NO_STAMP: &str =
    "cannot authenticate public API activity request without a stamp (X-Stamp/X-Stamp-Webauthn header)";
const BAD_SIGNATURE: &str = "could not verify api key signature";
const KEY_NOT_FOUND: &str = "could not find public key in organization or its parent organization";

/// [`refused_raw`] (status, content type, error shape, `turnkeyErrorCode`, message), and the
/// exact gRPC code too (for the statuses several codes could render as).
#[track_caller]
fn assert_error(r: &RawResponse, http: u16, grpc: i64, turnkey_code: &str, message: &str) {
    refused_raw(r, http, turnkey_code, message);
    assert_eq!(r.json["code"].as_i64(), Some(grpc), "gRPC code; body: {}", r.text);
}

/// The code of requests refused as malformed, unknown or out of place (`ApiError::invalid`,
/// `ApiError::not_found`).
const INVALID: &str = "REQUEST_INVALID";

/// Sends `body` with `method`, and with exactly the extra `headers` given (e.g. a stamp made
/// over other bytes).
async fn send(
    stack: &Stack,
    method: reqwest::Method,
    path: &str,
    body: Vec<u8>,
    headers: &[(String, String)],
) -> RawResponse {
    let mut req = reqwest::Client::new().request(method, format!("{}{}", stack.base_url, path)).body(body);
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    RawResponse { status, content_type, json, text }
}

fn submit_body(ty: &str, org: &str, timestamp_ms: u128, parameters: Value) -> String {
    json!({
        "type": ty,
        "timestampMs": timestamp_ms.to_string(),
        "organizationId": org,
        "parameters": parameters,
        "generateAppProofs": null,
    })
    .to_string()
}

fn eth_account(curve: &str, format: &str) -> Value {
    json!({"curve": curve, "pathFormat": "PATH_FORMAT_BIP32", "path": "m/44'/60'/0'/0/0", "addressFormat": format, "name": null})
}

fn wallet_params(name: &str) -> Value {
    json!({"walletName": name, "accounts": [eth_account("CURVE_SECP256K1", "ADDRESS_FORMAT_ETHEREUM")], "mnemonicLength": null})
}

fn sign_params(sign_with: &str, hash_function: &str) -> Value {
    json!({
        "signWith": sign_with,
        "payload": "hello",
        "encoding": "PAYLOAD_ENCODING_TEXT_UTF8",
        "hashFunction": hash_function,
        "externalSignerPubkey": null,
    })
}

async fn submit(stack: &Stack, key: &TurnkeyP256ApiKey, path: &str, ty: &str, org: &str, params: Value) -> RawResponse {
    let body = submit_body(ty, org, Stack::now_ms(), params);
    stack.post_raw(&format!("/public/v1/submit/{path}"), body.as_bytes(), Some(key)).await
}

async fn query(stack: &Stack, key: &TurnkeyP256ApiKey, path: &str, body: Value) -> RawResponse {
    stack.post_raw(&format!("/public/v1/query/{path}"), body.to_string().as_bytes(), Some(key)).await
}

/// Creates a one-account Ethereum wallet; returns its id and address.
async fn create_wallet(stack: &Stack, key: &TurnkeyP256ApiKey, org: &str, name: &str) -> (String, String) {
    let r = submit(stack, key, "create_wallet", "ACTIVITY_TYPE_CREATE_WALLET", org, wallet_params(name)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{}", r.text);
    let result = &r.json["activity"]["result"]["createWalletResult"];
    (result["walletId"].as_str().unwrap().to_string(), result["addresses"][0].as_str().unwrap().to_string())
}

/// (wallets, activities) of `org`, read with `key`; the activities exactly (every page).
async fn counts(stack: &Stack, key: &TurnkeyP256ApiKey, org: &str) -> (usize, usize) {
    let w = query(stack, key, "list_wallets", json!({"organizationId": org})).await;
    assert_eq!(w.status, 200, "{}", w.text);
    (w.json["wallets"].as_array().unwrap().len(), stack.activity_count(key, org).await)
}

/// Exports `wallet_id` for real: the positive control of "not exported" (the flag the checks
/// read does turn to true).
async fn export_for_real(stack: &Stack, key: &TurnkeyP256ApiKey, org: &str, wallet_id: &str) {
    assert!(!wallet_exported(stack, key, org, wallet_id).await);
    let params = json!({"walletId": wallet_id, "targetPublicKey": target_public_key(), "language": null});
    let r = submit(stack, key, "export_wallet", "ACTIVITY_TYPE_EXPORT_WALLET", org, params).await;
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{}", r.text);
    assert!(wallet_exported(stack, key, org, wallet_id).await, "an export sets the flag the checks read");
}

async fn wallet_exported(stack: &Stack, key: &TurnkeyP256ApiKey, org: &str, wallet_id: &str) -> bool {
    let r = query(stack, key, "get_wallet", json!({"organizationId": org, "walletId": wallet_id})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["wallet"]["exported"].as_bool().unwrap()
}

/// A P-256 public key (compressed SEC1 hex) usable as an export target.
fn target_public_key() -> String {
    hex::encode(TurnkeyP256ApiKey::generate().compressed_public_key())
}

#[tokio::test]
async fn authentication_refusals_change_nothing() {
    let stack = Stack::start().await;
    let key = stack.api_key();
    let org = stack.organization_id.clone();
    let (_, address) = create_wallet(&stack, &key, &org, "base").await;
    let before = counts(&stack, &key, &org).await;
    assert_eq!(before, (1, 1));

    let body = submit_body("ACTIVITY_TYPE_CREATE_WALLET", &org, Stack::now_ms(), wallet_params("w2"));
    let path = "/public/v1/submit/create_wallet";

    // No stamp at all: submit and query.
    let r = stack.post_raw(path, body.as_bytes(), None).await;
    assert_error(&r, 401, 16, "SIGNATURE_MISSING", NO_STAMP);
    assert_eq!(r.json["message"], NO_STAMP);
    let r = stack
        .post_raw("/public/v1/query/list_wallets", json!({"organizationId": org}).to_string().as_bytes(), None)
        .await;
    assert_error(&r, 401, 16, "SIGNATURE_MISSING", NO_STAMP);
    assert!(r.json.get("wallets").is_none());

    // A valid stamp by a key no organization knows.
    let stranger = TurnkeyP256ApiKey::generate();
    let r = stack.post_raw(path, body.as_bytes(), Some(&stranger)).await;
    assert_error(&r, 401, 16, "PUBLIC_KEY_NOT_FOUND", KEY_NOT_FOUND);
    let r = query(&stack, &stranger, "list_wallets", json!({"organizationId": org})).await;
    assert_error(&r, 401, 16, "PUBLIC_KEY_NOT_FOUND", KEY_NOT_FOUND);
    let r = stack
        .post_raw(
            "/public/v1/submit/sign_raw_payload",
            submit_body(
                "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
                &org,
                Stack::now_ms(),
                sign_params(&address, "HASH_FUNCTION_KECCAK256"),
            )
            .as_bytes(),
            Some(&stranger),
        )
        .await;
    assert_error(&r, 401, 16, "PUBLIC_KEY_NOT_FOUND", KEY_NOT_FOUND);

    // The root key's stamp over one body, sent with another (one character changed).
    let stamp = key.stamp(body.as_bytes()).unwrap();
    let tampered = body.replace("\"w2\"", "\"w3\"");
    assert_ne!(tampered, body);
    let r =
        send(&stack, reqwest::Method::POST, path, tampered.into_bytes(), &[(stamp.name.clone(), stamp.value.clone())])
            .await;
    assert_error(&r, 401, 16, "SIGNATURE_INVALID", BAD_SIGNATURE);
    assert_eq!(r.json["message"], BAD_SIGNATURE);
    // ... and with the body re-serialized (same JSON value, different bytes: an extra space).
    let reserialized = body.replacen('{', "{ ", 1);
    let r = send(
        &stack,
        reqwest::Method::POST,
        path,
        reserialized.into_bytes(),
        &[(stamp.name.clone(), stamp.value.clone())],
    )
    .await;
    assert_error(&r, 401, 16, "SIGNATURE_INVALID", BAD_SIGNATURE);
    // A header that is not a stamp at all.
    let r = send(
        &stack,
        reqwest::Method::POST,
        path,
        body.clone().into_bytes(),
        &[("X-Stamp".into(), "!!!not-base64!!!".into())],
    )
    .await;
    assert_error(&r, 401, 16, "SIGNATURE_INVALID", "malformed activity stamp");

    // The untouched body with that same stamp is accepted, once.
    let r = send(
        &stack,
        reqwest::Method::POST,
        path,
        body.clone().into_bytes(),
        &[(stamp.name.clone(), stamp.value.clone())],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(counts(&stack, &key, &org).await, (before.0 + 1, before.1 + 1));
}

#[tokio::test]
async fn envelope_and_parameter_refusals_change_nothing() {
    let stack = Stack::start().await;
    let key = stack.api_key();
    let org = stack.organization_id.clone();
    let (wallet_id, address) = create_wallet(&stack, &key, &org, "base").await;
    let before = counts(&stack, &key, &org).await;
    assert_eq!(before, (1, 1));
    let path = "/public/v1/submit/create_wallet";

    // Liveness window: 2 h old and 10 min ahead are refused.
    let now = Stack::now_ms();
    for (ts, what) in [(now - 2 * 3600 * 1000, "2 h old"), (now + 10 * 60 * 1000, "10 min ahead")] {
        let body = submit_body("ACTIVITY_TYPE_CREATE_WALLET", &org, ts, wallet_params(&format!("ts-{what}")));
        let r = stack.post_raw(path, body.as_bytes(), Some(&key)).await;
        assert_error(&r, 400, 3, INVALID, "timestampMs");
    }
    // Same for signing: a stale signature request is not executed.
    let body = submit_body(
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        &org,
        now - 2 * 3600 * 1000,
        sign_params(&address, "HASH_FUNCTION_KECCAK256"),
    );
    let r = stack.post_raw("/public/v1/submit/sign_raw_payload", body.as_bytes(), Some(&key)).await;
    assert_error(&r, 400, 3, INVALID, "timestampMs");

    // The wrong activity type for the path.
    let body = submit_body("ACTIVITY_TYPE_CREATE_PRIVATE_KEYS_V2", &org, Stack::now_ms(), wallet_params("wrong-type"));
    let r = stack.post_raw(path, body.as_bytes(), Some(&key)).await;
    assert_error(&r, 400, 3, INVALID, "ACTIVITY_TYPE_CREATE_PRIVATE_KEYS_V2");

    // Unknown enum values are named in the message.
    let params =
        json!({"walletName": "bogus-curve", "accounts": [eth_account("CURVE_BOGUS", "ADDRESS_FORMAT_ETHEREUM")]});
    let r = submit(&stack, &key, "create_wallet", "ACTIVITY_TYPE_CREATE_WALLET", &org, params).await;
    assert_error(&r, 400, 3, INVALID, "CURVE_BOGUS");
    assert!(r.json["message"].as_str().unwrap().contains("invalid curve"), "{}", r.text);
    let params =
        json!({"walletName": "bogus-format", "accounts": [eth_account("CURVE_SECP256K1", "ADDRESS_FORMAT_BOGUS")]});
    let r = submit(&stack, &key, "create_wallet", "ACTIVITY_TYPE_CREATE_WALLET", &org, params).await;
    assert_error(&r, 400, 3, INVALID, "ADDRESS_FORMAT_BOGUS");
    assert!(r.json["message"].as_str().unwrap().contains("invalid address format"), "{}", r.text);
    let r = submit(
        &stack,
        &key,
        "sign_raw_payload",
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        &org,
        sign_params(&address, "HASH_FUNCTION_BOGUS"),
    )
    .await;
    assert_error(&r, 400, 3, INVALID, "HASH_FUNCTION_BOGUS");
    assert!(r.json["message"].as_str().unwrap().contains("invalid hash function"), "{}", r.text);
    let params = json!({
        "privateKeys": [{"privateKeyName": "k", "curve": "CURVE_BOGUS", "privateKeyTags": [], "addressFormats": []}],
        "externalSignerPubkey": null,
    });
    let r = submit(&stack, &key, "create_private_keys", "ACTIVITY_TYPE_CREATE_PRIVATE_KEYS_V2", &org, params).await;
    assert_error(&r, 400, 3, INVALID, "CURVE_BOGUS");

    // Malformed JSON (correctly stamped) on a submit and a query path.
    let r = stack.post_raw(path, br#"{"type": "ACTIVITY_TYPE_CREATE_WALLET", "#, Some(&key)).await;
    assert_error(&r, 400, 3, INVALID, "bad request body");
    let r = stack.post_raw("/public/v1/query/list_wallets", b"not json", Some(&key)).await;
    assert_error(&r, 400, 3, INVALID, "bad request body");

    // 2 MiB body: 413, still a JSON error.
    let mut big = submit_body("ACTIVITY_TYPE_CREATE_WALLET", &org, Stack::now_ms(), wallet_params("big"));
    big.pop();
    big.push_str(&format!(",\"padding\":\"{}\"}}", "a".repeat(2 * 1024 * 1024)));
    let r = stack.post_raw(path, big.as_bytes(), Some(&key)).await;
    assert_error(&r, 413, 3, INVALID, "too large");

    // Nothing above changed anything.
    assert_eq!(counts(&stack, &key, &org).await, before);
    assert!(!wallet_exported(&stack, &key, &org, &wallet_id).await);

    // 30 min old is inside the gateway's one-hour window but outside the enclave's five
    // minutes: a key operation is refused by the enclave and nothing is recorded...
    let body =
        submit_body("ACTIVITY_TYPE_CREATE_WALLET", &org, Stack::now_ms() - 30 * 60 * 1000, wallet_params("half-hour"));
    let r = stack.post_raw(path, body.as_bytes(), Some(&key)).await;
    assert_error(&r, 403, 7, "REQUEST_NOT_AUTHORIZED", "enclave refused: stale or future timestampMs");
    assert_eq!(counts(&stack, &key, &org).await, before);
    // ...and so is a state change: it is decided by the enclave too.
    let policy = json!({"policyName": "half-hour", "effect": "EFFECT_ALLOW", "condition": "true", "consensus": "true", "notes": ""});
    let body = submit_body("ACTIVITY_TYPE_CREATE_POLICY_V3", &org, Stack::now_ms() - 30 * 60 * 1000, policy.clone());
    let r = stack.post_raw("/public/v1/submit/create_policy", body.as_bytes(), Some(&key)).await;
    assert_error(&r, 403, 7, "REQUEST_NOT_AUTHORIZED", "enclave refused: stale or future timestampMs");
    assert_eq!(counts(&stack, &key, &org).await, before);
    // A fresh one runs, exactly once.
    let body = submit_body("ACTIVITY_TYPE_CREATE_POLICY_V3", &org, Stack::now_ms(), policy);
    let r = stack.post_raw("/public/v1/submit/create_policy", body.as_bytes(), Some(&key)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{}", r.text);
    assert_eq!(counts(&stack, &key, &org).await, (before.0, before.1 + 1));
    let r = stack.post_raw("/public/v1/submit/create_policy", body.as_bytes(), Some(&key)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(counts(&stack, &key, &org).await, (before.0, before.1 + 1), "an identical body runs once");
    export_for_real(&stack, &key, &org, &wallet_id).await;
}

#[tokio::test]
async fn not_found_and_routing_errors_are_json() {
    let stack = Stack::start().await;
    let key = stack.api_key();
    let org = stack.organization_id.clone();
    let (wallet_id, _) = create_wallet(&stack, &key, &org, "base").await;
    let before = counts(&stack, &key, &org).await;
    assert_eq!(before, (1, 1));
    let unknown = "00000000-0000-4000-8000-00000000beef";

    let r = query(&stack, &key, "get_wallet", json!({"organizationId": org, "walletId": unknown})).await;
    assert_error(&r, 404, 5, INVALID, unknown);
    let params = json!({"walletId": unknown, "targetPublicKey": target_public_key(), "language": null});
    let r = submit(&stack, &key, "export_wallet", "ACTIVITY_TYPE_EXPORT_WALLET", &org, params).await;
    assert_error(&r, 404, 5, INVALID, unknown);
    let r = submit(
        &stack,
        &key,
        "sign_raw_payload",
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        &org,
        sign_params("0x000000000000000000000000000000000000dead", "HASH_FUNCTION_KECCAK256"),
    )
    .await;
    assert_error(&r, 404, 5, INVALID, "0x000000000000000000000000000000000000dead");
    let r = query(&stack, &key, "get_activity", json!({"organizationId": org, "activityId": unknown})).await;
    assert_error(&r, 404, 5, INVALID, unknown);
    // An organization that does not exist.
    let r = query(&stack, &key, "list_wallets", json!({"organizationId": unknown})).await;
    assert_error(&r, 404, 5, "ORGANIZATION_NOT_FOUND", "no organization found with the given ID");

    // Unknown endpoints (stamped) and a GET on a submit path.
    let body = submit_body("ACTIVITY_TYPE_CREATE_WALLET", &org, Stack::now_ms(), wallet_params("nope"));
    let r = stack.post_raw("/public/v1/submit/nope", body.as_bytes(), Some(&key)).await;
    assert_error(&r, 404, 5, INVALID, "nope");
    let r = stack
        .post_raw("/public/v1/query/nope", json!({"organizationId": org}).to_string().as_bytes(), Some(&key))
        .await;
    assert_error(&r, 404, 5, INVALID, "nope");
    let r = stack.post_raw("/public/v2/whatever", b"{}", Some(&key)).await;
    assert_error(&r, 404, 5, INVALID, "");
    let r = send(&stack, reqwest::Method::GET, "/public/v1/submit/create_wallet", vec![], &[]).await;
    assert_error(&r, 405, 3, INVALID, "POST");
    let r = send(&stack, reqwest::Method::GET, "/public/v1/query/list_wallets", vec![], &[]).await;
    assert_error(&r, 405, 3, INVALID, "POST");
    let big = format!("{{\"organizationId\":\"{org}\",\"padding\":\"{}\"}}", "a".repeat(2 * 1024 * 1024));
    let r = stack.post_raw("/public/v1/query/list_wallets", big.as_bytes(), Some(&key)).await;
    assert_error(&r, 413, 3, INVALID, "too large");

    // Errors hyper raises before any handler: a malformed request, oversized headers.
    let port: u16 = stack.base_url.rsplit(':').next().unwrap().parse().unwrap();
    let r = raw_http(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n").await;
    assert_error(&r, 400, 3, "REQUEST_INVALID", "malformed HTTP request");
    let huge =
        format!("POST /public/v1/query/list_wallets HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n", "a".repeat(70_000));
    let r = raw_http(port, huge.as_bytes()).await;
    assert_error(&r, 431, 3, "REQUEST_INVALID", "request header fields too large");
    let r = send(&stack, reqwest::Method::GET, "/readyz", vec![], &[]).await;
    assert_eq!((r.status, r.json["status"].as_str()), (200, Some("ready")), "{}", r.text);

    assert_eq!(counts(&stack, &key, &org).await, before);
    assert!(!wallet_exported(&stack, &key, &org, &wallet_id).await);
    export_for_real(&stack, &key, &org, &wallet_id).await;
}

/// Writes `request` on a fresh connection and reads the answer until the server closes it.
async fn raw_http(port: u16, request: &[u8]) -> RawResponse {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    conn.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), conn.read_to_end(&mut answer)).await.unwrap().unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let (head, text) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head: {answer}"));
    let status = head[9..12].parse().unwrap();
    let content_type =
        head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type: ").map(str::to_string));
    RawResponse { status, content_type, json: serde_json::from_str(text).unwrap_or(Value::Null), text: text.into() }
}

/// Sends `head` and then `padding` bytes, as a simple client does, and only then reads the answer.
/// The server answers long before the client is done sending; without a lingering close it
/// would close with the client's bytes unread, and the reset would destroy the answer.
async fn answer_after_sending(port: u16, head: Vec<u8>, padding: usize) -> Result<String, std::io::Error> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let sent = async {
        conn.write_all(&head).await?;
        let chunk = vec![b'a'; 64 * 1024];
        for _ in 0..padding.div_ceil(chunk.len()) {
            conn.write_all(&chunk).await?;
        }
        Ok::<(), std::io::Error>(())
    }
    .await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(20), conn.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection");
    match (sent, read) {
        (Ok(()), Ok(_)) => Ok(String::from_utf8_lossy(&answer).into_owned()),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// A 32 MiB body and a 1 MiB header get their JSON 413 and 431 although the client is still
/// sending when they are answered; a client that pipelines requests and never reads the answers
/// is closed after the write timeout instead of holding its connection and send queue.
#[tokio::test]
async fn oversized_requests_get_their_answer_and_a_client_that_never_reads_is_closed() {
    use tokio::io::AsyncWriteExt;
    let stack = Stack::start_with(&[("COFFER_WRITE_TIMEOUT_MS", "1000")]).await;
    let port: u16 = stack.base_url.rsplit(':').next().unwrap().parse().unwrap();

    let body = 32usize << 20;
    let head = format!(
        "POST /public/v1/query/list_wallets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {body}\r\n\r\n"
    );
    let answer = answer_after_sending(port, head.into_bytes(), body).await.expect("an answer, not a reset");
    assert!(answer.starts_with("HTTP/1.1 413"), "{}", &answer[..answer.len().min(300)]);
    assert!(answer.contains("too large"), "{answer}");

    let head = b"POST /public/v1/query/list_wallets HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    let answer = answer_after_sending(port, head, 1 << 20).await.expect("an answer, not a reset");
    assert!(answer.starts_with("HTTP/1.1 431"), "{}", &answer[..answer.len().min(300)]);
    assert!(answer.contains("request header fields too large"), "{answer}");

    // 50,000 pipelined requests whose answers (405s the router makes without any I/O, about
    // 12 MB) fill every buffer on the way back; the client never reads. Once the gateway's writes
    // make no progress for the write timeout it closes the connection, and the client's writes
    // fail; without the timeout they would block for as long as the client cares to wait.
    const PIPELINED: usize = 50_000;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
    let request = b"GET /public/v1/query/list_wallets HTTP/1.1\r\nHost: x\r\n\r\n";
    let started = std::time::Instant::now();
    let closed = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        if let Err(e) = conn.write_all(&request.repeat(PIPELINED)).await {
            return e;
        }
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            if let Err(e) = conn.write_all(request).await {
                return e;
            }
        }
    })
    .await;
    let error = closed.expect("the gateway closes a connection whose client never reads");
    assert!(
        matches!(error.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset),
        "{error:?} after {:?}",
        started.elapsed()
    );
    // The gateway goes on serving.
    let r = send(&stack, reqwest::Method::GET, "/readyz", vec![], &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

/// A stamped `whoami` and the answer's `Retry-After` header, if any.
async fn whoami_with_retry_after(
    stack: &Stack,
    key: &TurnkeyP256ApiKey,
    body: &Value,
) -> (RawResponse, Option<String>) {
    let body = body.to_string();
    let stamp = key.stamp(body.as_bytes()).unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{}/public/v1/query/whoami", stack.base_url))
        .header(stamp.name, stamp.value)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let header = |h: &str| resp.headers().get(h).map(|v| v.to_str().unwrap().to_string());
    let (content_type, retry_after) = (header("content-type"), header("retry-after"));
    let text = resp.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    (RawResponse { status, content_type, json, text }, retry_after)
}

/// Per-credential rate limits answer a JSON 429 with `Retry-After`, only to the credential over
/// its rate; the operations listener answers health, readiness and metrics on its own port.
#[tokio::test]
async fn rate_limits_are_per_credential_and_health_has_its_own_listener() {
    let ops_port = coffer_tests::free_port();
    let ops = format!("127.0.0.1:{ops_port}");
    let stack = Stack::start_with(&[("COFFER_RATE_LIMIT_PER_CREDENTIAL", "5"), ("COFFER_OPS_LISTEN", &ops)]).await;
    let key = stack.api_key();
    let org = stack.organization_id.clone();
    let whoami = json!({"organizationId": org});
    // Back-to-back requests until the credential is over its rate (the arithmetic, with an
    // injected clock, is unit-tested in gateway/src/limits.rs; here: that it happens at all, in
    // the right shape, and passes again later). However slow the machine, 5 per second cannot
    // keep up with requests sent as fast as they are answered for long.
    let mut statuses = Vec::new();
    let (limited, retry_after) = loop {
        assert!(statuses.len() < 500, "500 back-to-back requests and none over the rate: {statuses:?}");
        let (r, retry_after) = whoami_with_retry_after(&stack, &key, &whoami).await;
        statuses.push(r.status);
        if r.status == 429 {
            break (r, retry_after);
        }
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(retry_after, None, "a 200 has no Retry-After");
    };
    // The burst (5) passes whatever the timing: the bucket starts full.
    assert!(statuses.len() > 5 && statuses[..5].iter().all(|s| *s == 200), "{statuses:?}");
    assert_error(&limited, 429, 8, "RATE_LIMIT_EXCEEDED", "rate limit exceeded");
    let wait: u64 = retry_after
        .as_deref()
        .unwrap_or_else(|| panic!("a 429 without Retry-After: {}", limited.text))
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After is not whole seconds: {retry_after:?}"));
    assert!(wait >= 1, "Retry-After: {wait}");
    // The limit is charged to authenticated credentials: an unknown key still gets its 401.
    let stranger = TurnkeyP256ApiKey::generate();
    let r = query(&stack, &stranger, "whoami", whoami.clone()).await;
    assert_error(&r, 401, 16, "PUBLIC_KEY_NOT_FOUND", KEY_NOT_FOUND);
    // After the wait it asked for, the credential passes again.
    tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
    let r = query(&stack, &key, "whoami", whoami).await;
    assert_eq!(r.status, 200, "after Retry-After: {}", r.text);
    statuses.push(r.status);

    for path in ["/healthz", "/readyz"] {
        let r = reqwest::get(format!("http://{ops}{path}")).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    let r = reqwest::get(format!("http://{ops}/public/v1/query/whoami")).await.unwrap();
    assert_eq!(r.status(), 404, "the operations listener serves no API");

    // Metrics, on both listeners: requests by operation and status, activities, the enclave's
    // calls and the store's commits. Names a client makes up do not become label values.
    let (_, _) = create_wallet(&stack, &key, &org, "metrics-wallet").await;
    let r = query(&stack, &key, "no_such_query", json!({"organizationId": org})).await;
    assert_eq!(r.status, 404, "{}", r.text);
    let r = reqwest::get(format!("http://{ops}/metrics")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"));
    let text = r.text().await.unwrap();
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .parse()
            .unwrap()
    };
    let ok = statuses.iter().filter(|s| **s == 200).count() as f64;
    let limited = statuses.iter().filter(|s| **s == 429).count() as f64;
    assert_eq!(value(r#"coffer_http_requests_total{operation="query/whoami",status="200"}"#), ok);
    assert_eq!(value(r#"coffer_http_requests_total{operation="query/whoami",status="429"}"#), limited);
    assert_eq!(value(r#"coffer_http_requests_total{operation="query/whoami",status="401"}"#), 1.0);
    assert_eq!(value(r#"coffer_http_requests_total{operation="query/unknown",status="404"}"#), 1.0);
    assert!(!text.contains("no_such_query"), "a made-up path is not a label value");
    assert_eq!(
        value(
            r#"coffer_activities_total{activity_type="ACTIVITY_TYPE_CREATE_WALLET",status="ACTIVITY_STATUS_COMPLETED"}"#
        ),
        1.0
    );
    assert_eq!(value(r#"coffer_enclave_calls_total{method="CreateWallet",outcome="ok"}"#), 1.0);
    assert!(value("coffer_store_commit_seconds_count") >= 1.0);
    assert!(value("coffer_http_request_seconds_count{operation=\"query/whoami\"}") >= ok);
    assert!(!text.contains(&org), "no organization id in any label");
    let api = reqwest::get(format!("{}/metrics", stack.base_url)).await.unwrap();
    assert_eq!(api.status(), 200, "the API listener serves /metrics too");
}

#[tokio::test]
async fn organizations_are_isolated() {
    let stack = Stack::start().await;
    let key_a = stack.api_key();
    let org_a = stack.organization_id.clone();
    let (wallet_a, address_a) = create_wallet(&stack, &key_a, &org_a, "a-wallet").await;
    let activity_a = query(&stack, &key_a, "list_activities", json!({"organizationId": org_a})).await.json
        ["activities"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();

    // A second, unrelated organization in the same deployment, with its own key.
    let kp = stack.gateway_cli(&["keygen"]);
    let (pub_b, priv_b) = (kp["apiPublicKey"].as_str().unwrap(), kp["apiPrivateKey"].as_str().unwrap());
    let created = stack.gateway_cli(&["init-org", "--name", "org-b", "--api-public-key", pub_b]);
    let org_b = created["organizationId"].as_str().unwrap().to_string();
    assert_ne!(org_b, org_a);
    let key_b = TurnkeyP256ApiKey::from_strings(priv_b, Some(pub_b)).unwrap();
    let who = query(&stack, &key_b, "whoami", json!({"organizationId": org_b})).await;
    assert_eq!(who.status, 200, "{}", who.text);
    assert_eq!(who.json["organizationId"], org_b.as_str());

    let before_a = counts(&stack, &key_a, &org_a).await;
    let before_b = counts(&stack, &key_b, &org_b).await;
    assert_eq!(before_a, (1, 1));
    assert_eq!(before_b, (0, 0));

    // B's key addressing A: its key is not in A.
    let r = query(&stack, &key_b, "get_wallet", json!({"organizationId": org_a, "walletId": wallet_a})).await;
    assert_error(&r, 401, 16, "PUBLIC_KEY_NOT_FOUND", KEY_NOT_FOUND);
    assert!(r.json.get("wallet").is_none());
    let r = query(&stack, &key_b, "list_wallets", json!({"organizationId": org_a})).await;
    assert_error(&r, 401, 16, "PUBLIC_KEY_NOT_FOUND", KEY_NOT_FOUND);
    let r = submit(
        &stack,
        &key_b,
        "sign_raw_payload",
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        &org_a,
        sign_params(&address_a, "HASH_FUNCTION_KECCAK256"),
    )
    .await;
    assert_error(&r, 401, 16, "PUBLIC_KEY_NOT_FOUND", KEY_NOT_FOUND);
    let params = json!({"walletId": wallet_a, "targetPublicKey": target_public_key(), "language": null});
    let r = submit(&stack, &key_b, "export_wallet", "ACTIVITY_TYPE_EXPORT_WALLET", &org_a, params).await;
    assert_error(&r, 401, 16, "PUBLIC_KEY_NOT_FOUND", KEY_NOT_FOUND);

    // B's key in B, naming A's resources: they do not exist there.
    let r = query(&stack, &key_b, "get_wallet", json!({"organizationId": org_b, "walletId": wallet_a})).await;
    assert_error(&r, 404, 5, INVALID, &wallet_a);
    let r = query(&stack, &key_b, "list_wallet_accounts", json!({"organizationId": org_b, "walletId": wallet_a})).await;
    assert_error(&r, 404, 5, INVALID, &wallet_a);
    let r = query(&stack, &key_b, "get_activity", json!({"organizationId": org_b, "activityId": activity_a})).await;
    assert_error(&r, 404, 5, INVALID, &activity_a);
    let r = submit(
        &stack,
        &key_b,
        "sign_raw_payload",
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        &org_b,
        sign_params(&address_a, "HASH_FUNCTION_KECCAK256"),
    )
    .await;
    assert_error(&r, 404, 5, INVALID, &address_a);
    assert!(r.json.get("activity").is_none(), "{}", r.text);
    let params = json!({"walletId": wallet_a, "targetPublicKey": target_public_key(), "language": null});
    let r = submit(&stack, &key_b, "export_wallet", "ACTIVITY_TYPE_EXPORT_WALLET", &org_b, params).await;
    assert_error(&r, 404, 5, INVALID, &wallet_a);
    let r = submit(
        &stack,
        &key_b,
        "delete_wallets",
        "ACTIVITY_TYPE_DELETE_WALLETS",
        &org_b,
        json!({"walletIds": [wallet_a], "deleteWithoutExport": true}),
    )
    .await;
    assert_error(&r, 404, 5, INVALID, &wallet_a);

    // A's key cannot act in B either.
    let r =
        submit(&stack, &key_a, "create_wallet", "ACTIVITY_TYPE_CREATE_WALLET", &org_b, wallet_params("intruder")).await;
    assert_error(&r, 401, 16, "PUBLIC_KEY_NOT_FOUND", KEY_NOT_FOUND);

    // Nothing changed on either side; A's wallet was neither exported nor deleted.
    assert_eq!(counts(&stack, &key_a, &org_a).await, before_a);
    assert_eq!(counts(&stack, &key_b, &org_b).await, before_b);
    assert!(!wallet_exported(&stack, &key_a, &org_a, &wallet_a).await);
    // A's own key does what B's could not: the checks above would have seen it.
    export_for_real(&stack, &key_a, &org_a, &wallet_a).await;
    assert_eq!(counts(&stack, &key_a, &org_a).await, (before_a.0, before_a.1 + 1));
}
