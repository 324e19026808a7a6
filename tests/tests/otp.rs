//! One-time codes end to end, through a real SMTP server (aiosmtpd, started here) and the official
//! Rust client: the code arrives by mail, is encrypted to the enclave's target with the official
//! encryption crate, verifies once, and its token logs the user in once; a wrong code, an expired
//! code, the attempt limit, a reused token and the send limit are refused; the code is in no log
//! and not in the gateway's database.

use std::time::Duration;

use base64::Engine;
use coffer_proto::v1::RefusalReason as Reason;
use coffer_tests::smtp::{code_in, SmtpServer};
use coffer_tests::{submit, Stack};
use p256::ecdsa::signature::hazmat::PrehashVerifier;
use p256::ecdsa::signature::Signer;
use serde_json::{json, Value};
use sha2::Digest;
use turnkey_client::generated::immutable::common::v1::{ApiKeyCurve, ClientSignatureScheme};
use turnkey_client::generated::{
    ApiKeyParamsV2, ClientSignature, CreateReadOnlySessionIntent, CreateUsersIntentV4, GetWhoamiRequest,
    InitOtpAuthIntentV3, InitOtpIntentV3, OtpAuthIntent, OtpLoginIntentV2, StampLoginIntent, UserParamsV4,
    VerifyOtpIntentV2,
};
use turnkey_client::{TurnkeyClient, TurnkeyP256ApiKey};

type Client = TurnkeyClient<TurnkeyP256ApiKey>;

fn init(contact: &str, length: Option<i32>, alphanumeric: Option<bool>, seconds: Option<&str>) -> InitOtpIntentV3 {
    InitOtpIntentV3 {
        otp_type: "OTP_TYPE_EMAIL".into(),
        contact: contact.into(),
        app_name: "Coffer Test".into(),
        otp_length: length,
        email_customization: None,
        sms_customization: None,
        user_identifier: None,
        send_from_email_address: None,
        alphanumeric,
        send_from_email_sender_name: None,
        expiration_seconds: seconds.map(str::to_string),
        reply_to_email_address: None,
    }
}

/// The official client's import encryption (signature of the bundle checked against the stack's
/// signer key) of `{"otp_code", "public_key"}`: what `encryptOtpCodeToBundle` sends.
fn encrypted(stack: &Stack, bundle: &str, org: &str, code: &str, public_key: &str) -> String {
    let mut c = turnkey_enclave_encrypt::ImportClient::new(&stack.quorum_public_key());
    c.encrypt_secret_bundle(json!({ "otp_code": code, "public_key": public_key }).to_string(), bundle, org).unwrap()
}

fn verify(otp_id: &str, bundle: String) -> VerifyOtpIntentV2 {
    VerifyOtpIntentV2 { otp_id: otp_id.into(), encrypted_otp_bundle: bundle, expiration_seconds: None }
}

fn claims(jwt: &str) -> Value {
    let part = jwt.split('.').nth(1).unwrap();
    serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
}

/// The login the token's key signs (`{"login":{"publicKey"},"tokenId","type":"USAGE_TYPE_LOGIN"}`).
fn login(token: &str, session: &TurnkeyP256ApiKey) -> OtpLoginIntentV2 {
    let public_key = hex::encode(session.compressed_public_key());
    let message =
        json!({ "login": { "publicKey": public_key }, "tokenId": claims(token)["id"], "type": "USAGE_TYPE_LOGIN" })
            .to_string();
    let signer = p256::ecdsa::SigningKey::from_slice(&session.private_key()).unwrap();
    let signature: p256::ecdsa::Signature = signer.sign(message.as_bytes());
    OtpLoginIntentV2 {
        verification_token: token.into(),
        public_key: public_key.clone(),
        client_signature: Some(ClientSignature {
            public_key,
            scheme: ClientSignatureScheme::ApiP256,
            message,
            signature: hex::encode(signature.to_bytes()),
        }),
        expiration_seconds: None,
        invalidate_existing: None,
        session_profile_id: None,
    }
}

async fn add_user(root: &Client, org: &str, email: &str) -> String {
    let params = UserParamsV4 {
        user_name: email.split('@').next().unwrap().into(),
        user_email: Some(email.into()),
        user_phone_number: None,
        api_keys: vec![ApiKeyParamsV2 {
            api_key_name: "k".into(),
            public_key: hex::encode(TurnkeyP256ApiKey::generate().compressed_public_key()),
            curve_type: ApiKeyCurve::P256,
            expiration_seconds: None,
        }],
        authenticators: vec![],
        oauth_providers: vec![],
        user_tags: vec![],
    };
    root.create_users(org.into(), root.current_timestamp(), CreateUsersIntentV4 { users: vec![params] })
        .await
        .unwrap()
        .result
        .user_ids[0]
        .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn email_codes_log_in_once_and_nothing_else_gets_through() {
    let dir = std::env::temp_dir().join(format!("coffer-otp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let smtp = SmtpServer::start(&dir).await;
    let (sms_url, texts) = sms_receiver().await;
    let authorization = dir.join("sms-authorization");
    std::fs::write(&authorization, format!("{SMS_AUTHORIZATION}\n")).unwrap();
    let stack = Stack::start_with(&[
        ("COFFER_SMS_URL", &sms_url),
        ("COFFER_SMS_AUTHORIZATION_FILE", authorization.to_str().unwrap()),
        ("COFFER_SMTP_URL", &smtp.url()),
        ("COFFER_OTP_SENDS_PER_CONTACT_PER_HOUR", "4"),
        // Every proxy call here comes from one address, faster than a visitor's 20 a second.
        ("COFFER_AUTH_PROXY_RATE_LIMIT_PER_IP", "1000"),
        ("COFFER_AUTH_PROXY_OTP_SENDS_PER_IP_PER_HOUR", "40"),
        // 13 sign-ups come before `signups_per_address`, which spends the rest.
        ("COFFER_AUTH_PROXY_SIGNUPS_PER_IP_PER_HOUR", "16"),
        ("COFFER_LOG", "info"),
    ])
    .await;
    let (root, org) = (stack.client(), stack.organization_id.clone());
    let alice = add_user(&root, &org, "alice@example.test").await;
    let ts = || Stack::now_ms();
    first_versions(&stack, &smtp).await;
    invitations(&stack, &smtp).await;

    // The code arrives by mail (a MIME message, plain text and HTML, from the enclave's sender),
    // 9 Crockford base32 characters by default.
    let before = smtp.seen();
    let sent = root.init_otp(org.clone(), ts(), init("alice@example.test", None, None, None)).await.unwrap().result;
    let (code, mail) = smtp.code_for(&before, "alice@example.test");
    assert_eq!(code.len(), 9, "{code}");
    assert!(code.bytes().all(|b| b"0123456789ABCDEFGHJKMNPQRSTVWXYZ".contains(&b)), "{code}");
    assert!(mail.contains("multipart/alternative") && mail.contains("text/html"), "{mail}");
    assert!(mail.contains("From: Coffer <no-reply@localhost>"), "{mail}");
    assert!(mail.contains("Subject: Your Coffer Test code"), "{mail}");

    // Verified once: the token is signed by the published notarizer key (checked with p256 here)
    // and names the contact and the key the code was sent with.
    let session = TurnkeyP256ApiKey::generate();
    let session_hex = hex::encode(session.compressed_public_key());
    let bundle = encrypted(&stack, &sent.otp_encryption_target_bundle, &org, &code.to_lowercase(), &session_hex);
    let token = root
        .verify_otp(org.clone(), ts(), verify(&sent.otp_id, bundle.clone()))
        .await
        .unwrap()
        .result
        .verification_token;
    let c = claims(&token);
    assert_eq!(
        (c["contact"].as_str(), c["verification_type"].as_str()),
        (Some("alice@example.test"), Some("OTP_TYPE_EMAIL"))
    );
    assert_eq!(c["public_key"], session_hex);
    let exp: i64 = c["exp"].as_str().unwrap().parse().unwrap();
    assert!((exp - Stack::now_ms() as i64 - 3_600_000).abs() < 60_000, "a token lives an hour by default: {exp}");
    let keys: Value =
        reqwest::get(format!("{}/public/v1/discovery/keys", stack.base_url)).await.unwrap().json().await.unwrap();
    let notarizer = hex::decode(keys["notarizerPublicKey"].as_str().unwrap()).unwrap();
    let (signing_input, signature) = token.rsplit_once('.').unwrap();
    let signature = p256::ecdsa::Signature::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(signature).unwrap(),
    )
    .unwrap();
    p256::ecdsa::VerifyingKey::from_sec1_bytes(&notarizer)
        .unwrap()
        .verify_prehash(&sha2::Sha256::digest(signing_input.as_bytes()), &signature)
        .expect("the verification token verifies with the notarizer key");
    // The same code again (a new stamped body) is refused: a code verifies once.
    let again = encrypted(&stack, &sent.otp_encryption_target_bundle, &org, &code, &session_hex);
    stack.refused_for(
        root.verify_otp(org.clone(), ts(), verify(&sent.otp_id, again)).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        Reason::OtpInvalid,
    );

    // The token logs Alice in, and the session key stamps as her.
    let result = root.otp_login(org.clone(), ts(), login(&token, &session)).await.unwrap().result;
    assert_eq!(claims(&result.session)["user_id"], alice);
    let as_alice =
        stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(session.private_key()), None).unwrap());
    let who = as_alice.get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await.unwrap();
    assert_eq!(who.user_id, alice);
    // A read-only session of Alice's (the official client's create_read_only_session): queries
    // accept it as X-Session, as Alice; a submit does not, and neither does a forged one.
    let ro = as_alice.create_read_only_session(org.clone(), ts(), CreateReadOnlySessionIntent {}).await.unwrap().result;
    assert_eq!((ro.user_id.as_str(), ro.organization_id.as_str()), (alice.as_str(), org.as_str()));
    assert!(ro.session_expiry > (Stack::now_ms() / 1000) as u64, "{}", ro.session_expiry);
    assert_eq!(claims(&ro.session)["session_type"], "SESSION_TYPE_READ_ONLY");
    let with_session = |path: &str, session: &str| {
        let body = json!({ "organizationId": org, "type": "ACTIVITY_TYPE_CREATE_WALLET", "timestampMs": ts().to_string(),
            "parameters": { "walletName": "w", "accounts": [] } });
        reqwest::Client::new()
            .post(format!("{}{path}", stack.base_url))
            .header("X-Session", session)
            .body(body.to_string())
            .send()
    };
    let r = with_session("/public/v1/query/whoami", &ro.session).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["userId"], alice);
    let answer =
        |r: reqwest::Response| async move { (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null)) };
    let r = answer(with_session("/public/v1/submit/create_wallet", &ro.session).await.unwrap()).await;
    // A read-only session submits nothing (a submit needs a stamp).
    stack.refused_by_gateway(r, 401, "SIGNATURE_MISSING", "without a stamp");
    // (Forgeries, other organizations, expiry and deleted users: tests/tests/login.rs.)
    // Deleting the key that made the read-only session ends it.
    let keys = stack
        .post_raw(
            "/public/v1/query/get_api_keys",
            json!({ "organizationId": org, "userId": alice }).to_string().as_bytes(),
            Some(&stack.api_key()),
        )
        .await;
    let session_key_id = keys.json["apiKeys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["credential"]["publicKey"] == session_hex)
        .unwrap_or_else(|| panic!("the session key: {}", keys.text))["apiKeyId"]
        .clone();
    let r = submit(
        &stack,
        &stack.api_key(),
        &org,
        "delete_api_keys",
        "ACTIVITY_TYPE_DELETE_API_KEYS",
        json!({ "userId": alice, "apiKeyIds": [session_key_id] }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = answer(with_session("/public/v1/query/whoami", &ro.session).await.unwrap()).await;
    stack.refused_by_gateway(r, 401, "SESSION_INVALID", "the credential that made it is gone or expired");
    // Once: the same token with another key is refused.
    let other = TurnkeyP256ApiKey::generate();
    stack.refused_for(
        root.otp_login(org.clone(), ts(), login(&token, &other)).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        Reason::BindingMismatch,
    );

    // A wrong code is refused, and after three attempts (wrong or not) the code is dead.
    let before = smtp.seen();
    let sent =
        root.init_otp(org.clone(), ts(), init("alice@example.test", Some(6), Some(false), None)).await.unwrap().result;
    let (code, _) = smtp.code_for(&before, "alice@example.test");
    assert!(code.len() == 6 && code.bytes().all(|b| b.is_ascii_digit()), "{code}");
    // A code sent without the key its token will name is refused (such a token would be a bearer
    // token the gateway carries); this counts as one of the three attempts.
    let keyless = encrypted(&stack, &sent.otp_encryption_target_bundle, &org, &code, "");
    stack.refused_by_gateway(
        root.verify_otp(org.clone(), ts(), verify(&sent.otp_id, keyless)).await,
        400,
        "REQUEST_INVALID",
        "public_key is required",
    );
    let wrong = if code == "000000" { "000001" } else { "000000" };
    for _ in 0..2 {
        let b = encrypted(&stack, &sent.otp_encryption_target_bundle, &org, wrong, &session_hex);
        stack.refused_for(
            root.verify_otp(org.clone(), ts(), verify(&sent.otp_id, b)).await,
            403,
            "REQUEST_NOT_AUTHORIZED",
            Reason::OtpInvalid,
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let right = encrypted(&stack, &sent.otp_encryption_target_bundle, &org, &code, &session_hex);
    stack.refused_for(
        root.verify_otp(org.clone(), ts(), verify(&sent.otp_id, right)).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        Reason::OtpInvalid,
    );

    // An expired code is refused.
    let before = smtp.seen();
    let sent =
        root.init_otp(org.clone(), ts(), init("alice@example.test", None, None, Some("1"))).await.unwrap().result;
    let (code, _) = smtp.code_for(&before, "alice@example.test");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let b = encrypted(&stack, &sent.otp_encryption_target_bundle, &org, &code, &session_hex);
    stack.refused_for(
        root.verify_otp(org.clone(), ts(), verify(&sent.otp_id, b)).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        Reason::OtpInvalid,
    );

    // A record the enclave did not seal for this id does not open: the first otp's sealed record
    // is asked for under another id.
    let b = encrypted(&stack, &sent.otp_encryption_target_bundle, &org, &code, &session_hex);
    stack.refused_for(
        root.verify_otp(org.clone(), ts(), verify("00000000-0000-4000-8000-000000000000", b)).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        Reason::OtpInvalid,
    );

    // No account enumeration: an unknown contact gets the same answer. Sends per contact are
    // limited (4 an hour here): the fifth is refused, and nothing is sent for it.
    for i in 0..4 {
        let r = root.init_otp(org.clone(), ts(), init("nobody@example.test", None, None, None)).await.unwrap();
        assert!(!r.result.otp_id.is_empty(), "send {i}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let before = smtp.seen();
    stack.refused_for(
        root.init_otp(org.clone(), ts(), init("nobody@example.test", None, None, None)).await,
        429,
        "RATE_LIMIT_EXCEEDED",
        Reason::OtpRateLimited,
    );
    assert_eq!(smtp.seen(), before, "nothing is sent past the limit");
    // Sends are counted per userIdentifier too (4 here), whatever the contact.
    for i in 0..5 {
        let mut intent = init(&format!("device-{i}@example.test"), None, None, None);
        intent.user_identifier = Some("device-1".into());
        let r = root.init_otp(org.clone(), ts(), intent).await;
        if i < 4 {
            r.unwrap();
        } else {
            stack.refused_for(r, 429, "RATE_LIMIT_EXCEEDED", Reason::OtpRateLimited);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Alice already had three codes this hour: one more is allowed, the next is not.
    root.init_otp(org.clone(), ts(), init("alice@example.test", None, None, None)).await.unwrap();
    canonical_mailboxes(&stack, &root, &org).await;

    // Bad input changes nothing: a contact that is not an address, an SMS without a transport,
    // a sender domain the enclave does not allow.
    let mut bad = init("not-an-address", None, None, None);
    stack.refused_by_gateway(
        root.init_otp(org.clone(), ts(), bad.clone()).await,
        400,
        "REQUEST_INVALID",
        "contact: not an email address",
    );
    bad.contact = "carol@example.test".into();
    bad.send_from_email_address = Some("ceo@elsewhere.test".into());
    stack.refused_by_gateway(root.init_otp(org.clone(), ts(), bad).await, 400, "REQUEST_INVALID", "sender_domains");

    otp_auth_flow(&stack, &smtp).await;

    // No code reached a store or a process's output (codes are 6 to 9 characters; every code
    // sent so far is checked).
    let codes: Vec<String> = smtp.messages().iter().filter_map(|(_, m)| code_in(m)).collect();
    assert!(codes.len() >= 8, "{codes:?}");
    // Both tiers' stores, every enclave's and gateway's output (on SQLite and on PostgreSQL).
    for code in &codes {
        stack.assert_secret_absent(code).await;
    }
    let grace = add_user(&root, &org, "grace@example.test").await;
    email_credentials(&stack, &smtp, &grace).await;
    sms_login(&stack, &texts).await;
    proxy_flow(&stack, &smtp).await;
    drop(stack);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One auth proxy call as a browser makes it (no stamp, the configuration's id, an origin).
async fn proxy_post(stack: &Stack, config_id: &str, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/v1/{path}", stack.auth_proxy_port))
        .header("x-auth-proxy-config-id", config_id)
        .header("origin", APP)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

const APP: &str = "https://app.example";

/// The auth proxy's email login, as `@turnkey/core` drives it: otp_init_v2, the code encrypted to
/// the target bundle, otp_verify_v2, then otp_login_v2 with the token's client signature, which
/// finds the sub-organization whose user has the email and logs that user in.
async fn proxy_flow(stack: &Stack, smtp: &SmtpServer) {
    let (root, org) = (stack.api_key(), stack.organization_id.clone());
    let r = submit(stack, &root, &org, "enable_auth_proxy", "ACTIVITY_TYPE_ENABLE_AUTH_PROXY", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let config = json!({ "allowedOrigins": [APP], "allowedAuthMethods": ["email"], "otpLength": 6,
        "otpAlphanumeric": false });
    let r =
        submit(stack, &root, &org, "update_auth_proxy_config", "ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG", config).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let config_id =
        r.json["activity"]["result"]["updateAuthProxyConfigResult"]["configId"].as_str().unwrap().to_string();
    let sub = json!({ "subOrganizationName": "dave", "rootQuorumThreshold": 1, "rootUsers": [{ "userName": "dave",
        "userEmail": "dave@example.test", "apiKeys": [], "authenticators": [], "oauthProviders": [] }] });
    let r =
        submit(stack, &root, &org, "create_sub_organization", "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8", sub).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let created = &r.json["activity"]["result"]["createSubOrganizationResultV8"];
    let (sub_org, dave) = (created["subOrganizationId"].as_str().unwrap(), created["rootUserIds"][0].as_str().unwrap());

    let before = smtp.seen();
    let (status, init) = proxy_post(
        stack,
        &config_id,
        "otp_init_v2",
        json!({ "otpType": "OTP_TYPE_EMAIL", "contact": "dave@example.test" }),
    )
    .await;
    assert_eq!(status, 200, "{init}");
    let (code, _) = smtp.code_for(&before, "dave@example.test");
    assert!(code.len() == 6 && code.bytes().all(|b| b.is_ascii_digit()), "the configuration's otpLength: {code}");
    let session = TurnkeyP256ApiKey::generate();
    let session_hex = hex::encode(session.compressed_public_key());
    let bundle = encrypted(stack, init["otpEncryptionTargetBundle"].as_str().unwrap(), &org, &code, &session_hex);
    let (status, verified) =
        proxy_post(stack, &config_id, "otp_verify_v2", json!({ "otpId": init["otpId"], "encryptedOtpBundle": bundle }))
            .await;
    assert_eq!(status, 200, "{verified}");
    let token = verified["verificationToken"].as_str().unwrap();
    let intent = login(token, &session);
    let body = json!({ "verificationToken": token, "publicKey": intent.public_key,
        "clientSignature": serde_json::to_value(intent.client_signature.as_ref().unwrap()).unwrap() });
    // Never into the proxy's own organization, whose members an email alone must not reach.
    let mut own = body.clone();
    own["organizationId"] = json!(org);
    let (status, r) = proxy_post(stack, &config_id, "otp_login_v2", own).await;
    stack.refused_for((status, r.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::OrganizationMismatch);
    let (status, logged_in) = proxy_post(stack, &config_id, "otp_login_v2", body.clone()).await;
    assert_eq!(status, 200, "{logged_in}");
    let c = claims(logged_in["session"].as_str().unwrap());
    assert_eq!((c["user_id"].as_str(), c["organization_id"].as_str()), (Some(dave), Some(sub_org)));
    let as_dave = stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(session.private_key()), None).unwrap());
    assert_eq!(as_dave.get_whoami(GetWhoamiRequest { organization_id: sub_org.into() }).await.unwrap().user_id, dave);
    // The token is spent: the same login again (replacing the session, so that the gateway lets
    // the key through) is refused by the enclave.
    let mut body = body;
    body["invalidateExisting"] = json!(true);
    let (status, again) = proxy_post(stack, &config_id, "otp_login_v2", body).await;
    stack.refused_for((status, again.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::OtpInvalid);
    assert!(again["message"].as_str().unwrap().contains("already used"), "{again}");

    // Sign-up: an email only with its verification token (else anyone could take an address and
    // catch its owner's later logins), signed over by the token's key, once.
    let erin_key = TurnkeyP256ApiKey::generate();
    let erin_hex = hex::encode(erin_key.compressed_public_key());
    let api_keys = json!([{ "apiKeyName": "erin", "publicKey": erin_hex, "curveType": "API_KEY_CURVE_P256" }]);
    let signup = |token: Option<&str>, email: &str| {
        let mut body = json!({ "userEmail": email, "apiKeys": api_keys, "authenticators": [], "oauthProviders": [] });
        if let Some(t) = token {
            let usage = json!({ "signupV2": { "apiKeys": api_keys, "authenticators": [], "oauthProviders": [], "email": email },
                "tokenId": claims(t)["id"], "type": "USAGE_TYPE_SIGNUP" })
            .to_string();
            let signer = p256::ecdsa::SigningKey::from_slice(&erin_key.private_key()).unwrap();
            let signature: p256::ecdsa::Signature = signer.sign(usage.as_bytes());
            body["verificationToken"] = json!(t);
            body["clientSignature"] = json!({ "publicKey": erin_hex, "scheme": "CLIENT_SIGNATURE_SCHEME_API_P256",
                "message": usage, "signature": hex::encode(signature.to_bytes()) });
        }
        body
    };
    let (status, r) = proxy_post(stack, &config_id, "signup_v2", signup(None, "erin@example.test")).await;
    stack.refused_for((status, r.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::BindingMismatch);
    assert!(r["message"].as_str().unwrap().contains("verificationToken"), "{r}");
    // An email lookup needs the token of that email: without it, or with another address's, it
    // is refused; with it, it answers (nothing yet for Erin, Dave's sub-organization for Dave).
    let lookup = |email: &str, token: Option<&str>| {
        let mut b = json!({ "filterType": "EMAIL", "filterValue": email });
        if let Some(t) = token {
            b["verificationToken"] = json!(t);
        }
        b
    };
    let (status, r) = proxy_post(stack, &config_id, "account", lookup("dave@example.test", None)).await;
    stack.refused_by_gateway(
        (status, r.clone()),
        403,
        "REQUEST_NOT_AUTHORIZED",
        "needs the verificationToken of that contact",
    );
    let erin_token = token_for(stack, smtp, &config_id, &org, &erin_hex, "erin@example.test").await;
    let (status, r) = proxy_post(stack, &config_id, "account", lookup("dave@example.test", Some(&erin_token))).await;
    stack.refused_by_gateway(
        (status, r.clone()),
        403,
        "REQUEST_NOT_AUTHORIZED",
        "needs the verificationToken of that contact",
    );
    let (status, r) = proxy_post(stack, &config_id, "account", lookup("erin@example.test", Some(&erin_token))).await;
    assert_eq!((status, r), (200, json!({})));
    let (status, r) = proxy_post(
        stack,
        &config_id,
        "account",
        json!({ "filterType": "WALLET_ACCOUNT_ADDRESS", "filterValue": "0x00" }),
    )
    .await;
    stack.refused_by_gateway((status, r.clone()), 400, "REQUEST_INVALID", "invalid filter type");
    // A sign-up with a token has one root user: nobody can be added beside the verified one.
    let token = token_for(stack, smtp, &config_id, &org, &erin_hex, "erin@example.test").await;
    let mut two = json!({ "subOrganizationName": "two", "rootQuorumThreshold": 1, "verificationToken": token,
        "rootUsers": [
            { "userName": "erin", "userEmail": "erin@example.test", "apiKeys": api_keys, "authenticators": [], "oauthProviders": [] },
            { "userName": "mallory", "apiKeys": [{ "apiKeyName": "m", "curveType": "API_KEY_CURVE_P256",
                "publicKey": hex::encode(TurnkeyP256ApiKey::generate().compressed_public_key()) }], "authenticators": [], "oauthProviders": [] }] });
    two["clientSignature"] = signup(Some(&token), "erin@example.test")["clientSignature"].clone();
    let r =
        submit(stack, &root, &org, "create_sub_organization", "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8", two).await;
    stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", Reason::BindingMismatch);
    assert!(r.text.contains("one root user"), "{}", r.text);
    // Erin's token does not sign Frank up.
    let token = token_for(stack, smtp, &config_id, &org, &erin_hex, "erin@example.test").await;
    let (status, r) = proxy_post(stack, &config_id, "signup_v2", signup(Some(&token), "frank@example.test")).await;
    stack.refused_for((status, r.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::BindingMismatch);
    let token = token_for(stack, smtp, &config_id, &org, &erin_hex, "erin@example.test").await;
    let (status, r) = proxy_post(stack, &config_id, "signup_v2", signup(Some(&token), "erin@example.test")).await;
    assert_eq!(status, 200, "{r}");
    let (erin_org, erin) = (r["organizationId"].as_str().unwrap(), r["userId"].as_str().unwrap());
    let as_erin =
        stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(erin_key.private_key()), None).unwrap());
    assert_eq!(as_erin.get_whoami(GetWhoamiRequest { organization_id: erin_org.into() }).await.unwrap().user_id, erin);
    // Once.
    let (status, r) = proxy_post(stack, &config_id, "signup_v2", signup(Some(&token), "erin@example.test")).await;
    stack.refused_for((status, r.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::OtpInvalid);
    // Erin's key signed her sign-up: a PUBLIC_KEY lookup finds her organization by it.
    let by_key = |k: &str| json!({ "filterType": "PUBLIC_KEY", "filterValue": k });
    let (status, r) = proxy_post(stack, &config_id, "account", by_key(&erin_hex)).await;
    assert_eq!((status, r), (200, json!({ "organizationId": erin_org })));
    public_key_lookups(stack, &config_id).await;
    contact_squatting(stack, smtp, &config_id, &org).await;
    attested_token_login(stack, smtp, &config_id, &org, sub_org, dave).await;
    otp_sign_up_then_log_in(stack, smtp, &config_id, &org).await;
    proxy_app_name(stack, smtp, &config_id).await;
    phishing_relay(stack, smtp, &config_id).await;
    limits_charge_accepted_requests_only(stack, &config_id).await;
    signups_per_address(stack, &config_id).await;
    no_lookups_by_name(stack, &config_id).await;
    forged_tokens_answer_alike(stack, smtp, &config_id, &org).await;
    // One address sends at most 40 codes an hour through the proxy (this stack's setting), to
    // any contacts: the organization's allowance is not one visitor's.
    let mut refused_at = None;
    for i in 0..41 {
        let body = json!({ "otpType": "OTP_TYPE_EMAIL", "contact": format!("many-{i}@example.test") });
        let (status, r) = proxy_post(stack, &config_id, "otp_init_v2", body).await;
        if status == 429 {
            assert!(r["message"].as_str().unwrap().contains("one-time codes"), "{r}");
            refused_at = Some(i);
            break;
        }
        assert_eq!(status, 200, "{r}");
    }
    assert!(refused_at.is_some_and(|i| i > 0), "the address's hourly sends end: {refused_at:?}");
}

/// `stamp_login` stamped by a verification token's key (`X-Stamp-Attested`,
/// `STAMP_ATTESTED_SCHEME_P256_VERIFICATION_TOKEN`, what `@turnkey/core` 2.7's `loginWithOtp`
/// sends), signed by `key` over the body, for `organization_id`.
async fn attested_login(stack: &Stack, token: &str, key: &TurnkeyP256ApiKey, organization_id: &str) -> (u16, Value) {
    attested_login_with(stack, token, key, organization_id, false).await
}

/// [`attested_login`], replacing the user's earlier sessions when `invalidate_existing`.
async fn attested_login_with(
    stack: &Stack,
    token: &str,
    key: &TurnkeyP256ApiKey,
    organization_id: &str,
    invalidate_existing: bool,
) -> (u16, Value) {
    let key_hex = hex::encode(key.compressed_public_key());
    let body = json!({ "type": "ACTIVITY_TYPE_STAMP_LOGIN", "timestampMs": Stack::now_ms().to_string(),
        "organizationId": organization_id, "parameters": { "publicKey": key_hex, "expirationSeconds": "900",
        "invalidateExisting": invalidate_existing } })
    .to_string();
    let signer = p256::ecdsa::SigningKey::from_slice(&key.private_key()).unwrap();
    let signature: p256::ecdsa::Signature = signer.sign(body.as_bytes());
    let stamp = json!({ "publicKeyAttestation": token, "scheme": "STAMP_ATTESTED_SCHEME_P256_VERIFICATION_TOKEN",
        "publicKey": key_hex, "signature": hex::encode(signature.to_der().as_bytes()) });
    let r = reqwest::Client::new()
        .post(format!("{}/public/v1/submit/stamp_login", stack.base_url))
        .header("X-Stamp-Attested", coffer_tests::passkey::b64url(stamp.to_string().as_bytes()))
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The OTP login of `@turnkey/core` 2.7 and later: the verification token attests the key that
/// stamps a stamp_login, for the sub-organization or for the organization that verified the
/// token (routed to the sub-organization with the verified contact), which opens a session for
/// the user with the token's verified contact, once; not with a key the token does not name.
async fn attested_token_login(stack: &Stack, smtp: &SmtpServer, config_id: &str, org: &str, sub_org: &str, dave: &str) {
    // For the organization that verified the token (what `completeOtp` sends): routed to the
    // sub-organization with Dave's verified address.
    let key = TurnkeyP256ApiKey::generate();
    let token =
        token_for(stack, smtp, config_id, org, &hex::encode(key.compressed_public_key()), "dave@example.test").await;
    let (status, r) = attested_login(stack, &token, &key, org).await;
    assert_eq!(status, 200, "{r}");
    let c = claims(r["activity"]["result"]["stampLoginResult"]["session"].as_str().unwrap());
    assert_eq!((c["user_id"].as_str(), c["organization_id"].as_str()), (Some(dave), Some(sub_org)));
    assert_eq!(r["activity"]["organizationId"], sub_org, "the login is the sub-organization's activity");
    // For the sub-organization itself.
    let key = TurnkeyP256ApiKey::generate();
    let token =
        token_for(stack, smtp, config_id, org, &hex::encode(key.compressed_public_key()), "dave@example.test").await;
    let (status, r) = attested_login(stack, &token, &TurnkeyP256ApiKey::generate(), sub_org).await;
    stack.refused_by_gateway((status, r.clone()), 401, "SIGNATURE_INVALID", "does not name the stamp's public key"); // a key the token does not name
    let (status, r) = attested_login(stack, &token, &key, sub_org).await;
    assert_eq!(status, 200, "{r}");
    let session = r["activity"]["result"]["stampLoginResult"]["session"].as_str().unwrap();
    let c = claims(session);
    assert_eq!((c["user_id"].as_str(), c["organization_id"].as_str()), (Some(dave), Some(sub_org)));
    let as_dave = stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(key.private_key()), None).unwrap());
    assert_eq!(as_dave.get_whoami(GetWhoamiRequest { organization_id: sub_org.into() }).await.unwrap().user_id, dave);
    // Once: the token is spent. (The same login again, replacing the session, so that the gateway
    // lets the key through: the enclave refuses the token.)
    let (status, r) = attested_login_with(stack, &token, &key, sub_org, true).await;
    stack.refused_for((status, r.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::OtpInvalid);
    assert!(r["message"].as_str().unwrap().contains("already used"), "{r}");
}

/// `@turnkey/core`'s `signUpWithOtp`: a sign-up with the token (an address, no key), then a login
/// with the same token, routed from the proxy's organization; each use once.
async fn otp_sign_up_then_log_in(stack: &Stack, smtp: &SmtpServer, config_id: &str, org: &str) {
    let key = TurnkeyP256ApiKey::generate();
    let token =
        token_for(stack, smtp, config_id, org, &hex::encode(key.compressed_public_key()), "henry@example.test").await;
    let signup = json!({ "userName": "henry@example.test", "userEmail": "henry@example.test", "apiKeys": [],
        "authenticators": [], "oauthProviders": [], "verificationToken": token });
    let (status, r) = proxy_post(stack, config_id, "signup_v2", signed_by(&key, signup)).await;
    assert_eq!(status, 200, "{r}");
    let (henrys, henry) = (r["organizationId"].as_str().unwrap().to_string(), r["userId"].clone());
    // The sign-up's verified email finds its sub-organization (list_verified_suborgs); an address
    // nobody verified finds none, and only EMAIL and PHONE_NUMBER are filters.
    let verified = |filter_type: &str, value: &str| turnkey_client::generated::GetVerifiedSubOrgIdsRequest {
        organization_id: org.to_string(),
        filter_type: filter_type.into(),
        filter_value: value.into(),
        pagination_options: None,
    };
    let root = stack.client();
    let found = root.get_verified_sub_org_ids(verified("EMAIL", "henry@example.test")).await.unwrap();
    assert_eq!(found.organization_ids, std::slice::from_ref(&henrys));
    let none = root.get_verified_sub_org_ids(verified("EMAIL", "nobody@example.test")).await.unwrap();
    assert!(none.organization_ids.is_empty());
    let r = root.get_verified_sub_org_ids(verified("NAME", "henry")).await;
    coffer_tests::refused(r, 400, "REQUEST_INVALID", "EMAIL or PHONE_NUMBER");
    let (status, r) = attested_login(stack, &token, &key, org).await;
    assert_eq!(status, 200, "{r}");
    let c = claims(r["activity"]["result"]["stampLoginResult"]["session"].as_str().unwrap());
    assert_eq!((&c["user_id"], c["organization_id"].as_str()), (&henry, Some(henrys.as_str())));
    let (status, r) = attested_login_with(stack, &token, &key, org, true).await;
    stack.refused_for((status, r.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::OtpInvalid);
    // A visitor's sub-organization mails no invitations (they would go anywhere in the operator's
    // name): refused by the enclave before anything is sent or counted.
    let before = smtp.seen();
    let invitation = json!({ "invitations": [{ "receiverUserName": "x", "receiverUserEmail": "spam@example.test",
        "receiverUserTags": [], "accessType": "ACCESS_TYPE_API", "senderUserId": henry }] });
    let r = submit(stack, &key, &henrys, "create_invitations", "ACTIVITY_TYPE_CREATE_INVITATIONS", invitation).await;
    stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", Reason::CustomizationNotAllowed);
    assert_eq!(smtp.seen(), before, "nothing was mailed");
    // a login once
    contact_change_needs_its_code(stack, smtp, config_id, org, &key, &henrys, henry.as_str().unwrap()).await;
}

/// Henry (signed up with a verified email, logged in with `key`) changes his email: without a
/// verification token the new address is his word, and a code login to it finds nobody; with a
/// token of that very address (and only that one, once) it is verified, and the login finds him.
async fn contact_change_needs_its_code(
    stack: &Stack,
    smtp: &SmtpServer,
    config_id: &str,
    org: &str,
    key: &TurnkeyP256ApiKey,
    henrys: &str,
    henry: &str,
) {
    let key = TurnkeyP256ApiKey::from_strings(hex::encode(key.private_key()), None).unwrap();
    let key2 = TurnkeyP256ApiKey::generate();
    let key2_hex = hex::encode(key2.compressed_public_key());
    // Stamped by Henry's session key, the change carries the clientSignature of the token's key
    // (key2, which verified the code) over the change; `signed_by` None sends none.
    let change = |email: &str, token: Option<&str>, signed_by: Option<&TurnkeyP256ApiKey>| {
        let mut p = json!({ "userId": henry, "userEmail": email });
        if let Some(t) = token {
            p["verificationToken"] = json!(t);
        }
        if let (Some(t), Some(k)) = (token, signed_by) {
            let usage = json!({ "updateContact": { "userId": henry, "contact": email },
                "tokenId": claims(t)["id"], "type": "USAGE_TYPE_UPDATE_CONTACT" })
            .to_string();
            let signer = p256::ecdsa::SigningKey::from_slice(&k.private_key()).unwrap();
            let signature: p256::ecdsa::Signature = signer.sign(usage.as_bytes());
            p["clientSignature"] = json!({ "publicKey": hex::encode(k.compressed_public_key()),
                "scheme": "CLIENT_SIGNATURE_SCHEME_API_P256", "message": usage,
                "signature": hex::encode(signature.to_bytes()) });
        }
        submit(stack, &key, henrys, "update_user_email", "ACTIVITY_TYPE_UPDATE_USER_EMAIL", p)
    };
    let r = change("henry.new@example.test", None, None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let token = token_for(stack, smtp, config_id, org, &key2_hex, "henry.new@example.test").await;
    let (status, r) = attested_login(stack, &token, &key2, henrys).await;
    stack.refused_by_gateway(
        (status, r),
        401,
        "PUBLIC_KEY_NOT_FOUND",
        "no user of this organization has the verified email or phone number",
    );
    // A token of the new address verifies only that address, and only with its key's word: a
    // token alone (which the gateway, say, saw go by) verifies nothing.
    stack.refusals_accounted();
    let r = change("henry.other@example.test", Some(&token), Some(&key2)).await;
    stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", Reason::BindingMismatch);
    let r = change("henry.new@example.test", Some("not-a-token"), None).await;
    stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", Reason::OtpInvalid);
    let r = change("henry.new@example.test", Some(&token), None).await;
    stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", Reason::BindingMismatch);
    let r = change("henry.new@example.test", Some(&token), Some(&key)).await;
    stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", Reason::BindingMismatch);
    let r = change("henry.new@example.test", Some(&token), Some(&key2)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Once, for every use: neither this change again nor a login with it.
    let r = change("henry.new@example.test", Some(&token), Some(&key2)).await;
    stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", Reason::OtpInvalid);
    let (status, r) = attested_login(stack, &token, &key2, henrys).await;
    stack.refused_for((status, r), 403, "REQUEST_NOT_AUTHORIZED", Reason::OtpInvalid);
    // A new code of the new address logs Henry in.
    let key3 = TurnkeyP256ApiKey::generate();
    let token =
        token_for(stack, smtp, config_id, org, &hex::encode(key3.compressed_public_key()), "henry.new@example.test")
            .await;
    let (status, r) = attested_login(stack, &token, &key3, henrys).await;
    assert_eq!(status, 200, "{r}");
    let c = claims(r["activity"]["result"]["stampLoginResult"]["session"].as_str().unwrap());
    assert_eq!(c["user_id"], henry);
}

/// A visitor signs up with a key only, then sets someone else's address on their own user: the
/// address's owner, once verified by a code, is neither sent to nor logged into that
/// sub-organization (a contact is found, and logs in through the parent, only as the sign-up
/// gave it); the owner's own sign-up with the token is.
async fn contact_squatting(stack: &Stack, smtp: &SmtpServer, config_id: &str, org: &str) {
    let squatter = TurnkeyP256ApiKey::generate();
    let squatter_hex = hex::encode(squatter.compressed_public_key());
    let signup = json!({ "userName": "squatter", "apiKeys": [{ "apiKeyName": "k", "publicKey": squatter_hex,
        "curveType": "API_KEY_CURVE_P256" }], "authenticators": [], "oauthProviders": [] });
    let (status, r) = proxy_post(stack, config_id, "signup_v2", signed_by(&squatter, signup)).await;
    assert_eq!(status, 200, "{r}");
    let (squat_org, squat_user) = (r["organizationId"].as_str().unwrap(), r["userId"].as_str().unwrap());
    let squatter = TurnkeyP256ApiKey::from_strings(hex::encode(squatter.private_key()), None).unwrap();
    let r = submit(
        stack,
        &squatter,
        squat_org,
        "update_user",
        "ACTIVITY_TYPE_UPDATE_USER",
        json!({ "userId": squat_user, "userEmail": "gina@example.test" }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let gina = TurnkeyP256ApiKey::generate();
    let gina_hex = hex::encode(gina.compressed_public_key());
    let token = token_for(stack, smtp, config_id, org, &gina_hex, "gina@example.test").await;
    let first_token = token.clone();
    let lookup = json!({ "filterType": "EMAIL", "filterValue": "gina@example.test", "verificationToken": token });
    let (status, r) = proxy_post(stack, config_id, "account", lookup.clone()).await;
    assert_eq!((status, r), (200, json!({})), "the squatter's sub-organization is not Gina's account");
    let intent = login(&token, &gina);
    let body = json!({ "verificationToken": token, "publicKey": intent.public_key,
        "clientSignature": serde_json::to_value(intent.client_signature.as_ref().unwrap()).unwrap() });
    let (status, r) = proxy_post(stack, config_id, "otp_login_v2", body.clone()).await;
    stack.refused_by_gateway(
        (status, r.clone()),
        404,
        "REQUEST_INVALID",
        "no sub-organization of this auth proxy has a user with the verified contact",
    );
    let mut into_squat = body.clone();
    into_squat["organizationId"] = json!(squat_org);
    let (status, r) = proxy_post(stack, config_id, "otp_login_v2", into_squat).await;
    stack.refused_for((status, r.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::IdentityInvalid); // the enclave logs nobody into the squatter's user with Gina's token
    let (status, r) = attested_login(stack, &token, &gina, squat_org).await;
    stack.refused_by_gateway(
        (status, r.clone()),
        401,
        "PUBLIC_KEY_NOT_FOUND",
        "no user of this organization has the verified email or phone number",
    ); // nor does an attested stamp of her token
       // Gina's own sign-up, with her token: her address is found there.
    let api_keys = json!([{ "apiKeyName": "gina", "publicKey": gina_hex, "curveType": "API_KEY_CURVE_P256" }]);
    let token = token_for(stack, smtp, config_id, org, &gina_hex, "gina@example.test").await;
    let usage = json!({ "signupV2": { "apiKeys": api_keys, "authenticators": [], "oauthProviders": [],
        "email": "gina@example.test" }, "tokenId": claims(&token)["id"], "type": "USAGE_TYPE_SIGNUP" })
    .to_string();
    let signer = p256::ecdsa::SigningKey::from_slice(&gina.private_key()).unwrap();
    let signature: p256::ecdsa::Signature = signer.sign(usage.as_bytes());
    let signup = json!({ "userEmail": "gina@example.test", "apiKeys": api_keys, "authenticators": [],
        "oauthProviders": [], "verificationToken": token, "clientSignature": { "publicKey": gina_hex,
        "scheme": "CLIENT_SIGNATURE_SCHEME_API_P256", "message": usage, "signature": hex::encode(signature.to_bytes()) } });
    let (status, r) = proxy_post(stack, config_id, "signup_v2", signup).await;
    assert_eq!(status, 200, "{r}");
    let ginas = r["organizationId"].clone();
    let lookup = json!({ "filterType": "EMAIL", "filterValue": "gina@example.test", "verificationToken": token });
    let (status, r) = proxy_post(stack, config_id, "account", lookup).await;
    assert_eq!((status, r), (200, json!({ "organizationId": ginas })));

    // An attacker who holds the gateway's database marks the squatter's address verified there:
    // the gateway now routes Gina's unspent first token to the squatter, and the enclave, whose
    // own state says otherwise, logs nobody in (on SQLite and on PostgreSQL alike).
    let n = stack.tamper_store("UPDATE users SET contacts_verified = 1 WHERE id = $1", squat_user);
    assert_eq!(n, 1);
    let (status, r) = proxy_post(stack, config_id, "otp_login_v2", body).await;
    stack.refused_for((status, r.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::IdentityInvalid); // the enclave refuses the squatter's user
    let (status, r) = attested_login(stack, &first_token, &gina, squat_org).await;
    stack.refused_for((status, r.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::IdentityInvalid);
    // and the attested login into it
}

/// A proxy sign-up body (`apiKeys`, `authenticators`, `oauthProviders`, `userEmail`?) with the
/// clientSignature of `key` over it, as a client that proves it holds its key sends it.
fn signed_by(key: &TurnkeyP256ApiKey, mut body: Value) -> Value {
    let mut signup = json!({ "apiKeys": body["apiKeys"], "authenticators": body["authenticators"],
        "oauthProviders": body["oauthProviders"] });
    if let Some(email) = body.get("userEmail") {
        signup["email"] = email.clone();
    }
    let mut usage = json!({ "signupV2": signup, "type": "USAGE_TYPE_SIGNUP" });
    if let Some(t) = body.get("verificationToken").and_then(Value::as_str) {
        usage["tokenId"] = claims(t)["id"].clone();
    }
    let message = usage.to_string();
    let signer = p256::ecdsa::SigningKey::from_slice(&key.private_key()).unwrap();
    let signature: p256::ecdsa::Signature = signer.sign(message.as_bytes());
    body["clientSignature"] = json!({ "publicKey": hex::encode(key.compressed_public_key()),
        "scheme": "CLIENT_SIGNATURE_SCHEME_API_P256", "message": message, "signature": hex::encode(signature.to_bytes()) });
    body
}

/// A key must prove possession before it is registered or found. An anonymous sign-up registers
/// a lasting API key only with that key's signature over it (the enclave's proxy stamper refuses
/// one without), and a PUBLIC_KEY lookup finds a key only where it proved possession: a signed
/// sign-up, or a stamp_login it stamped there. A visitor may register someone's key as a
/// temporary one (what the passkey sign-up's login key is), but is never where it is found.
async fn public_key_lookups(stack: &Stack, config_id: &str) {
    let by_key = |k: &str| json!({ "filterType": "PUBLIC_KEY", "filterValue": k });
    let key_entry =
        |name: &str, k: &str| json!({ "apiKeyName": name, "publicKey": k, "curveType": "API_KEY_CURVE_P256" });
    let owner = TurnkeyP256ApiKey::generate();
    let owner_hex = hex::encode(owner.compressed_public_key());
    let squatter = TurnkeyP256ApiKey::generate();
    let squatter_hex = hex::encode(squatter.compressed_public_key());
    // The owner's key beside the squatter's, signed by the squatter only: refused.
    let squat = json!({ "userName": "squatter", "apiKeys": [key_entry("wallet", &owner_hex), key_entry("mine", &squatter_hex)],
        "authenticators": [], "oauthProviders": [] });
    let (status, r) = proxy_post(stack, config_id, "signup_v2", signed_by(&squatter, squat.clone())).await;
    stack.refused_for((status, r.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::BindingMismatch);
    assert!(r["message"].as_str().unwrap().contains("clientSignature"), "{r}");
    // Unsigned: refused too.
    let (status, r) = proxy_post(stack, config_id, "signup_v2", squat).await;
    stack.refused_for((status, r.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::BindingMismatch);
    // As a temporary key (60 s): registered, but not found by it.
    let mut temporary = key_entry("wallet", &owner_hex);
    temporary["expirationSeconds"] = json!("60");
    let squat = json!({ "userName": "squatter", "apiKeys": [temporary, key_entry("mine", &squatter_hex)],
        "authenticators": [], "oauthProviders": [] });
    let (status, r) = proxy_post(stack, config_id, "signup_v2", signed_by(&squatter, squat)).await;
    assert_eq!(status, 200, "{r}");
    let squatters = r["organizationId"].clone();
    let (status, r) = proxy_post(stack, config_id, "account", by_key(&owner_hex)).await;
    assert_eq!((status, r), (200, json!({})), "the squatter's organization is not found by the owner's key");
    let (status, r) = proxy_post(stack, config_id, "account", by_key(&squatter_hex)).await;
    assert_eq!((status, r), (200, json!({ "organizationId": squatters })), "the squatter's own signed key is");
    // The owner's sign-up, signed by the key it registers: found by it.
    let signup = json!({ "userName": "owner", "apiKeys": [key_entry("wallet", &owner_hex)], "authenticators": [],
        "oauthProviders": [] });
    let (status, r) = proxy_post(stack, config_id, "signup_v2", signed_by(&owner, signup)).await;
    assert_eq!(status, 200, "{r}");
    let owners = r["organizationId"].as_str().unwrap().to_string();
    let (status, r) = proxy_post(stack, config_id, "account", by_key(&owner_hex)).await;
    assert_eq!((status, r), (200, json!({ "organizationId": owners })));
    // The passkey sign-up's shape: an unsigned temporary key, found once it logs in there.
    let temporary = TurnkeyP256ApiKey::generate();
    let temporary_hex = hex::encode(temporary.compressed_public_key());
    let mut entry = key_entry("passkey-auth", &temporary_hex);
    entry["expirationSeconds"] = json!("60");
    let plain = json!({ "userName": "passkey", "apiKeys": [entry], "authenticators": [], "oauthProviders": [] });
    let (status, r) = proxy_post(stack, config_id, "signup_v2", plain).await;
    assert_eq!(status, 200, "{r}");
    let theirs = r["organizationId"].as_str().unwrap().to_string();
    let (status, r) = proxy_post(stack, config_id, "account", by_key(&temporary_hex)).await;
    assert_eq!((status, r), (200, json!({})));
    let as_temporary =
        stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(temporary.private_key()), None).unwrap());
    let session = hex::encode(TurnkeyP256ApiKey::generate().compressed_public_key());
    let login = StampLoginIntent {
        public_key: session,
        expiration_seconds: None,
        invalidate_existing: None,
        session_profile_id: None,
    };
    as_temporary.stamp_login(theirs.clone(), Stack::now_ms(), login).await.unwrap();
    let (status, r) = proxy_post(stack, config_id, "account", by_key(&temporary_hex)).await;
    assert_eq!((status, r), (200, json!({ "organizationId": theirs })));
}

/// A verification token for `contact` through the proxy, the code encrypted with `key_hex` bound.
async fn token_for(
    stack: &Stack,
    smtp: &SmtpServer,
    config_id: &str,
    org: &str,
    key_hex: &str,
    contact: &str,
) -> String {
    let before = smtp.seen();
    let (status, init) =
        proxy_post(stack, config_id, "otp_init_v2", json!({ "otpType": "OTP_TYPE_EMAIL", "contact": contact })).await;
    assert_eq!(status, 200, "{init}");
    let (code, _) = smtp.code_for(&before, contact);
    let bundle = encrypted(stack, init["otpEncryptionTargetBundle"].as_str().unwrap(), org, &code, key_hex);
    let (status, v) =
        proxy_post(stack, config_id, "otp_verify_v2", json!({ "otpId": init["otpId"], "encryptedOtpBundle": bundle }))
            .await;
    assert_eq!(status, 200, "{v}");
    v["verificationToken"].as_str().unwrap().to_string()
}

/// init_otp_auth and otp_auth with the official client: the code arrives by mail, otp_auth takes
/// it typed and answers a credential of Heidi's encrypted to the target key (opened with the
/// official decryption), which stamps as her. The code serves once and only otp_auth, and the
/// activity keeps it redacted.
async fn otp_auth_flow(stack: &Stack, smtp: &SmtpServer) {
    let (root, org) = (stack.client(), stack.organization_id.clone());
    let heidi = add_user(&root, &org, "heidi@example.test").await;
    let ts = || Stack::now_ms();
    let before = smtp.seen();
    let intent = InitOtpAuthIntentV3 {
        otp_type: "OTP_TYPE_EMAIL".into(),
        contact: "heidi@example.test".into(),
        otp_length: Some(6),
        app_name: "Coffer Test".into(),
        email_customization: None,
        sms_customization: None,
        user_identifier: None,
        send_from_email_address: None,
        alphanumeric: Some(false),
        send_from_email_sender_name: None,
        expiration_seconds: None,
        reply_to_email_address: None,
    };
    let intent_for_heidi = intent.clone();
    let sent = root.init_otp_auth(org.clone(), ts(), intent).await.unwrap().result;
    let (code, _) = smtp.code_for(&before, "heidi@example.test");
    assert!(code.len() == 6 && code.bytes().all(|b| b.is_ascii_digit()), "{code}");
    let mut target = turnkey_enclave_encrypt::AuthenticationClient::new();
    let target_key = target.target_public_key().unwrap();
    let auth = |otp_id: &str, code: &str| OtpAuthIntent {
        otp_id: otp_id.into(),
        otp_code: code.into(),
        target_public_key: target_key.clone(),
        api_key_name: None,
        expiration_seconds: Some("600".into()),
        invalidate_existing: None,
    };
    let wrong = if code == "000000" { "000001" } else { "000000" };
    stack.refused_for(
        root.otp_auth(org.clone(), ts(), auth(&sent.otp_id, wrong)).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        Reason::OtpInvalid,
    );
    let r = root.otp_auth(org.clone(), ts(), auth(&sent.otp_id, &code)).await.unwrap();
    assert_eq!(r.result.user_id, heidi);
    let secret = target.decrypt(&r.result.credential_bundle).unwrap();
    let key = TurnkeyP256ApiKey::from_strings(hex::encode(&secret), None).unwrap();
    let who = stack.client_with(key).get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await.unwrap();
    assert_eq!(who.user_id, heidi);
    // The credential is Heidi's API key of the OTP type, named as the hosted service names it.
    let keys = stack
        .post_raw(
            "/public/v1/query/get_api_keys",
            json!({ "organizationId": org, "userId": heidi }).to_string().as_bytes(),
            Some(&stack.api_key()),
        )
        .await;
    let stored = keys.json["apiKeys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["apiKeyId"] == r.result.api_key_id.as_str())
        .unwrap_or_else(|| panic!("the otp_auth key: {}", keys.text))
        .clone();
    assert_eq!(stored["credential"]["type"], "CREDENTIAL_TYPE_OTP_AUTH_KEY_P256", "{stored}");
    assert!(stored["apiKeyName"].as_str().unwrap().starts_with("OTP Auth - "), "{stored}");
    // Once.
    stack.refused_for(
        root.otp_auth(org.clone(), ts(), auth(&sent.otp_id, &code)).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        Reason::OtpInvalid,
    );
    // The activity as served keeps the code redacted.
    let activity = stack
        .post_raw(
            "/public/v1/query/get_activity",
            json!({ "organizationId": org, "activityId": r.activity_id }).to_string().as_bytes(),
            Some(&stack.api_key()),
        )
        .await;
    assert_eq!(activity.json["activity"]["intent"]["otpAuthIntent"]["otpCode"], "<redacted>", "{}", activity.text);
    assert!(!activity.text.contains(&format!("\"{code}\"")), "{}", activity.text);
    // The parent's credential runs both for a sub-organization (how the server SDK uses them).
    let r = submit(
        stack,
        &stack.api_key(),
        &org,
        "create_sub_organization",
        "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8",
        json!({ "subOrganizationName": "ivan's", "rootQuorumThreshold": 1, "rootUsers": [{ "userName": "ivan",
            "userEmail": "ivan@example.test", "apiKeys": [], "authenticators": [], "oauthProviders": [] }] }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let result = &r.json["activity"]["result"]["createSubOrganizationResultV8"];
    let (sub, ivan) = (result["subOrganizationId"].as_str().unwrap(), result["rootUserIds"][0].as_str().unwrap());
    let mut intent = InitOtpAuthIntentV3 { contact: "ivan@example.test".into(), ..intent_for_heidi };
    intent.alphanumeric = None;
    intent.otp_length = None;
    let before = smtp.seen();
    let sent = root.init_otp_auth(sub.into(), ts(), intent).await.unwrap().result;
    let (code, _) = smtp.code_for(&before, "ivan@example.test");
    // Crockford codes are read without case.
    let mut target = turnkey_enclave_encrypt::AuthenticationClient::new();
    let intent = OtpAuthIntent {
        otp_code: code.to_ascii_lowercase(),
        target_public_key: target.target_public_key().unwrap(),
        ..auth(&sent.otp_id, "")
    };
    let r = root.otp_auth(sub.into(), ts(), intent).await.unwrap();
    assert_eq!(r.result.user_id, ivan);
    let secret = target.decrypt(&r.result.credential_bundle).unwrap();
    let key = TurnkeyP256ApiKey::from_strings(hex::encode(&secret), None).unwrap();
    let who = stack.client_with(key).get_whoami(GetWhoamiRequest { organization_id: sub.into() }).await.unwrap();
    assert_eq!(who.user_id, ivan);

    // A code of init_otp does not serve otp_auth.
    let before = smtp.seen();
    let other =
        root.init_otp(org.clone(), ts(), init("heidi@example.test", Some(6), Some(false), None)).await.unwrap().result;
    let (other_code, _) = smtp.code_for(&before, "heidi@example.test");
    stack.refused_for(
        root.otp_auth(org.clone(), ts(), auth(&other.otp_id, &other_code)).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        Reason::OtpInvalid,
    );
}

/// The text between `start` and the next blank line of a message's (7-bit or quoted-printable)
/// text: the bundle an email carries.
fn bundle_in(message: &str, start: &str) -> String {
    let unfolded = message.replace("=\r\n", "").replace("=\n", "");
    let after = unfolded.split(start).nth(1).unwrap_or_else(|| panic!("no {start:?} in {message}"));
    after.trim_start().lines().next().unwrap().trim().to_string()
}

/// email_auth and init_user_email_recovery: the credential goes only to Grace's inbox,
/// encrypted to the target key (opened here with the official client's decryption), and stamps
/// as the user; the activity's answer holds no bundle.
async fn email_credentials(stack: &Stack, smtp: &SmtpServer, grace: &str) {
    let (root, org) = (stack.client(), stack.organization_id.clone());
    for (path, ty) in [
        ("email_auth", "ACTIVITY_TYPE_EMAIL_AUTH_V3"),
        ("init_user_email_recovery", "ACTIVITY_TYPE_INIT_USER_EMAIL_RECOVERY_V2"),
    ] {
        let mut target = turnkey_enclave_encrypt::AuthenticationClient::new();
        let before = smtp.seen();
        let body = json!({ "email": "grace@example.test", "targetPublicKey": target.target_public_key().unwrap(),
            "emailCustomization": { "appName": "Coffer Test" }, "expirationSeconds": "600" });
        let r = submit(stack, &stack.api_key(), &org, path, ty, body).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let result = &r.json["activity"]["result"];
        assert!(!r.text.contains("credentialBundle") && !r.text.contains("session\""), "{}", r.text);
        let user_id = result.as_object().unwrap().values().next().unwrap()["userId"].as_str().unwrap();
        assert_eq!(user_id, grace);
        let mails: Vec<String> = smtp
            .messages()
            .into_iter()
            .filter(|(f, m)| !before.contains(f) && m.contains("To: grace@example.test"))
            .map(|(_, m)| m)
            .collect();
        assert_eq!(mails.len(), 1, "{path}: one email");
        let bundle = bundle_in(&mails[0], "(paste it into the app that asked for it):");
        let secret = target.decrypt(&bundle).unwrap_or_else(|e| panic!("{path}: {e:?} {bundle}"));
        let key = TurnkeyP256ApiKey::from_strings(hex::encode(&secret), None).unwrap();
        let who = stack.client_with(key).get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await.unwrap();
        assert_eq!(who.user_id, grace, "{path}");
        if path == "init_user_email_recovery" {
            // The recovery credential adds a passkey (recover_user), and does nothing else.
            let key = TurnkeyP256ApiKey::from_strings(hex::encode(&secret), None).unwrap();
            let passkey = coffer_tests::passkey::Passkey::new();
            let authenticator = serde_json::to_value(passkey.register(
                "recovered",
                &coffer_tests::passkey::b64url(b"recovery-challenge"),
                "none",
            ))
            .unwrap();
            let r = submit(
                stack,
                &key,
                &org,
                "recover_user",
                "ACTIVITY_TYPE_RECOVER_USER",
                json!({ "userId": grace, "authenticator": authenticator }),
            )
            .await;
            assert_eq!(r.status, 200, "{}", r.text);
            let ids = &r.json["activity"]["result"]["recoverUserResult"]["authenticatorId"];
            assert_eq!(ids.as_array().map(Vec::len), Some(1), "{}", r.text);
            let r = submit(
                stack,
                &key,
                &org,
                "create_api_keys",
                "ACTIVITY_TYPE_CREATE_API_KEYS_V2",
                json!({ "userId": grace, "apiKeys": [{ "apiKeyName": "k", "curveType": "API_KEY_CURVE_P256",
                    "publicKey": hex::encode(TurnkeyP256ApiKey::generate().compressed_public_key()) }] }),
            )
            .await;
            stack.refused_by_gateway(
                &r,
                403,
                "REQUEST_NOT_AUTHORIZED",
                "a recovery credential may only submit recover_user",
            );
            assert!(r.text.contains("recovery credential"), "{}", r.text);
        }
    }
    // An address no user has: refused, nothing sent.
    let before = smtp.seen();
    let target = turnkey_enclave_encrypt::AuthenticationClient::new();
    let body = json!({ "email": "nobody@example.test", "targetPublicKey": target.target_public_key().unwrap(),
        "emailCustomization": { "appName": "Coffer Test" } });
    let r = submit(stack, &stack.api_key(), &org, "email_auth", "ACTIVITY_TYPE_EMAIL_AUTH_V3", body).await;
    stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", Reason::IdentityInvalid);
    assert_eq!(smtp.seen(), before);
    let _ = root;
}

/// The `Authorization` header the SMS provider expects (kept in a file the enclave reads).
const SMS_AUTHORIZATION: &str = "Basic Y29mZmVyOnNtcy10b2tlbg==";

/// What the SMS receiver got: each request's `Authorization` header and form body.
type Texts = std::sync::Arc<std::sync::Mutex<Vec<(String, std::collections::HashMap<String, String>)>>>;

/// A local HTTP SMS provider (Twilio-style form posts): records each request, answers 201.
async fn sms_receiver() -> (String, Texts) {
    use axum::http::HeaderMap;
    let texts: Texts = Default::default();
    let t = texts.clone();
    let app = axum::Router::new().route(
        "/sms",
        axum::routing::post(move |headers: HeaderMap, body: String| {
            let t = t.clone();
            async move {
                let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                let form = reqwest::Url::parse(&format!("http://x/?{body}"))
                    .unwrap()
                    .query_pairs()
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect();
                t.lock().unwrap().push((auth, form));
                (axum::http::StatusCode::CREATED, "{}")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/sms"), texts)
}

/// An SMS code logs in the user with that phone number (the provider got the enclave's
/// authorization and the code; the gateway never saw it).
async fn sms_login(stack: &Stack, texts: &Texts) {
    let (root, org) = (stack.client(), stack.organization_id.clone());
    let phone = "+15550001234";
    let params = UserParamsV4 {
        user_name: "henry".into(),
        user_email: None,
        user_phone_number: Some(phone.into()),
        api_keys: vec![],
        authenticators: vec![],
        oauth_providers: vec![],
        user_tags: vec![],
    };
    let henry = root
        .create_users(org.clone(), root.current_timestamp(), CreateUsersIntentV4 { users: vec![params] })
        .await
        .unwrap()
        .result
        .user_ids[0]
        .clone();
    let mut intent = init(phone, Some(6), Some(false), None);
    intent.otp_type = "OTP_TYPE_SMS".into();
    let sent = root.init_otp(org.clone(), Stack::now_ms(), intent).await.unwrap().result;
    let (auth, form) = texts.lock().unwrap().last().cloned().expect("one text");
    assert_eq!((auth.as_str(), form["To"].as_str()), (SMS_AUTHORIZATION, phone));
    let code = code_in(&form["Body"]).unwrap();
    assert!(code.len() == 6 && code.bytes().all(|b| b.is_ascii_digit()), "{form:?}");
    let session = TurnkeyP256ApiKey::generate();
    let session_hex = hex::encode(session.compressed_public_key());
    let bundle = encrypted(stack, &sent.otp_encryption_target_bundle, &org, &code, &session_hex);
    let token = root
        .verify_otp(org.clone(), Stack::now_ms(), verify(&sent.otp_id, bundle))
        .await
        .unwrap()
        .result
        .verification_token;
    assert_eq!(claims(&token)["verification_type"], "OTP_TYPE_SMS");
    let result = root.otp_login(org.clone(), Stack::now_ms(), login(&token, &session)).await.unwrap().result;
    assert_eq!(claims(&result.session)["user_id"], henry);
}

/// `@turnkey/core` 2.7.1's `verifyOtp` and `otpLogin` send `ACTIVITY_TYPE_VERIFY_OTP` and
/// `ACTIVITY_TYPE_OTP_LOGIN` with the current versions' parameters: they verify and log in, each
/// recorded under its own type with its own intent key; the first shape's plaintext `otpCode` is
/// refused with a 400 that names the field to send instead.
async fn first_versions(stack: &Stack, smtp: &SmtpServer) {
    let (root, org) = (stack.client(), stack.organization_id.clone());
    let iris = add_user(&root, &org, "iris@example.test").await;
    let before = smtp.seen();
    let sent = root.init_otp(org.clone(), Stack::now_ms(), init("iris@example.test", None, None, None)).await.unwrap();
    let (code, _) = smtp.code_for(&before, "iris@example.test");
    let session = TurnkeyP256ApiKey::generate();
    let bundle = encrypted(
        stack,
        &sent.result.otp_encryption_target_bundle,
        &org,
        &code,
        &hex::encode(session.compressed_public_key()),
    );
    let plain = json!({ "otpId": sent.result.otp_id, "otpCode": code });
    let r = submit(stack, &stack.api_key(), &org, "verify_otp", "ACTIVITY_TYPE_VERIFY_OTP", plain).await;
    stack.refused_by_gateway(&r, 400, "REQUEST_INVALID", "encryptedOtpBundle");
    let verify = json!({ "otpId": sent.result.otp_id, "encryptedOtpBundle": bundle });
    let r = submit(stack, &stack.api_key(), &org, "verify_otp", "ACTIVITY_TYPE_VERIFY_OTP", verify).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let activity = &r.json["activity"];
    assert_eq!(activity["type"], "ACTIVITY_TYPE_VERIFY_OTP");
    assert_eq!(activity["status"], "ACTIVITY_STATUS_COMPLETED");
    assert_eq!(activity["intent"]["verifyOtpIntent"]["otpId"], sent.result.otp_id, "{activity}");
    let token = activity["result"]["verifyOtpResult"]["verificationToken"].as_str().expect("a token").to_string();
    // Another type at the path is refused, naming the one expected.
    let r = submit(stack, &stack.api_key(), &org, "verify_otp", "ACTIVITY_TYPE_OTP_LOGIN", json!({})).await;
    coffer_tests::refused_raw(&r, 400, "REQUEST_INVALID", "expected ACTIVITY_TYPE_VERIFY_OTP_V2");
    let login = serde_json::to_value(login(&token, &session)).unwrap();
    let r = submit(stack, &stack.api_key(), &org, "otp_login", "ACTIVITY_TYPE_OTP_LOGIN", login).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let activity = &r.json["activity"];
    assert_eq!(
        (activity["type"].as_str(), activity["status"].as_str()),
        (Some("ACTIVITY_TYPE_OTP_LOGIN"), Some("ACTIVITY_STATUS_COMPLETED"))
    );
    assert!(activity["intent"]["otpLoginIntent"]["verificationToken"].is_string(), "{activity}");
    let jwt = activity["result"]["otpLoginResult"]["session"].as_str().expect("a session");
    assert_eq!(claims(jwt)["user_id"], iris);
}

/// One-time code limits count a mailbox, not its spellings: quoted, in capitals or with a `+tag`,
/// it is the same mailbox and shares its 4 codes an hour (this stack's setting).
async fn canonical_mailboxes(stack: &Stack, root: &Client, org: &str) {
    let ts = Stack::now_ms;
    for (i, spelling) in
        ["ivy@example.test", "IVY@Example.test", "ivy+1@example.test", "\"ivy\"@example.test"].iter().enumerate()
    {
        let r = root.init_otp(org.into(), ts(), init(spelling, None, None, None)).await;
        assert!(r.is_ok(), "send {i} to {spelling}: {:?}", r.err());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stack.refused_for(
        root.init_otp(org.into(), ts(), init("Ivy+2@example.test", None, None, None)).await,
        429,
        "RATE_LIMIT_EXCEEDED",
        Reason::OtpRateLimited,
    );
}

/// The name the auth proxy's codes carry is its configuration's `appName` as the enclave recorded
/// it from `update_auth_proxy_config` (checked there: a brand of at most 64 characters): a
/// visitor's `appName` is not used, and a gateway whose database was taken over and names another
/// app in its record of the configuration (a subject "Your ACCOUNT LOCKED - call …") gets no
/// send stamped. Leaves the configuration's appName "Acme Wallet" (which `phishing_relay` checks
/// the proxy's sign-ups are branded with).
async fn proxy_app_name(stack: &Stack, smtp: &SmtpServer, config_id: &str) {
    let (root, org) = (stack.api_key(), stack.organization_id.clone());
    let update = |app_name: Value| {
        let (root, org) = (&root, &org);
        async move {
            let p = json!({ "appName": app_name });
            submit(stack, root, org, "update_auth_proxy_config", "ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG", p).await
        }
    };
    let r = update(json!("  Acme Wallet ")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let before = smtp.seen();
    let body = json!({ "otpType": "OTP_TYPE_EMAIL", "contact": "brand-1@example.test", "appName": "Evil Bank" });
    let (status, r) = proxy_post(stack, config_id, "otp_init_v2", body).await;
    assert_eq!(status, 200, "{r}");
    let (_, mail) = smtp.code_for(&before, "brand-1@example.test");
    assert!(mail.contains("Subject: Your Acme Wallet code"), "{mail}");
    assert!(!mail.contains("Evil"), "{mail}");

    // The gateway's database, taken over, names another app in the configuration's record.
    let phishing = "Your ACCOUNT LOCKED - call +1 555 0100";
    let swap = |from: &str, to: &str| {
        format!(
            "UPDATE records SET data = replace(data, '\"appName\":\"{from}\"', '\"appName\":\"{to}\"') \
             WHERE kind = 'auth_proxy' AND id = $1"
        )
    };
    assert_eq!(stack.tamper_store(&swap("Acme Wallet", phishing), config_id), 1);
    let before = smtp.seen();
    let body = json!({ "otpType": "OTP_TYPE_EMAIL", "contact": "brand-2@example.test" });
    let (status, r) = proxy_post(stack, config_id, "otp_init_v2", body.clone()).await;
    stack.refused_for((status, r.clone()), 403, "REQUEST_NOT_AUTHORIZED", Reason::BindingMismatch);
    assert!(r["message"].as_str().unwrap().contains("\"Acme Wallet\""), "the refusal names the recorded name: {r}");
    assert_eq!(smtp.seen(), before, "nothing was sent under the gateway's name");
    // Put back, the record agrees with the enclave again and the proxy sends.
    assert_eq!(stack.tamper_store(&swap(phishing, "Acme Wallet"), config_id), 1);
    let (status, r) = proxy_post(stack, config_id, "otp_init_v2", body).await;
    assert_eq!(status, 200, "{r}");
    let (_, mail) = smtp.code_for(&before, "brand-2@example.test");
    assert!(mail.contains("Subject: Your Acme Wallet code"), "{mail}");
    // What is not a brand is refused where it is set, and the name stays.
    for bad in [json!("x".repeat(65)), json!("Acme\nWallet"), json!(7)] {
        let r = update(bad).await;
        stack.refused_by_gateway(&r, 400, "REQUEST_INVALID", "appName");
    }
}

/// A visitor signs up through the auth proxy and, as its sub-organization's root, asks for codes
/// that look like someone else's (a bank's name, logo, link, sender, reply-to) to any address:
/// the enclave refuses each customisation, naming the field; a plain code is sent under the
/// parent's name and counted against the parent's allowance.
async fn phishing_relay(stack: &Stack, smtp: &SmtpServer, config_id: &str) {
    let evil = TurnkeyP256ApiKey::generate();
    let evil_hex = hex::encode(evil.compressed_public_key());
    let signup = json!({ "userName": "mallory", "apiKeys": [{ "apiKeyName": "k", "publicKey": evil_hex,
        "curveType": "API_KEY_CURVE_P256" }], "authenticators": [], "oauthProviders": [] });
    let (status, r) = proxy_post(stack, config_id, "signup_v2", signed_by(&evil, signup)).await;
    assert_eq!(status, 200, "{r}");
    let evil_org = r["organizationId"].as_str().unwrap().to_string();
    let as_evil = stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(evil.private_key()), None).unwrap());
    let ts = Stack::now_ms;
    let plain = || {
        let mut i = init("victim@example.test", None, None, None);
        i.app_name = String::new();
        i
    };
    let before = smtp.seen();
    let mut bank = plain();
    bank.app_name = "Evil Bank Security".into();
    let mut reply = plain();
    reply.reply_to_email_address = Some("mallory@evil.test".into());
    let mut sender = plain();
    sender.send_from_email_sender_name = Some("Evil Bank".into());
    let mut from = plain();
    from.send_from_email_address = Some("security@localhost".into());
    let mut logo = plain();
    logo.email_customization = Some(turnkey_client::generated::EmailCustomizationParamsV2 {
        logo_url: Some("https://evil.test/logo.png".into()),
        magic_link_template: Some("https://evil.test/login?code=%s".into()),
        template_variables: None,
        template_id: None,
    });
    for (intent, field) in [
        (bank, "appName"),
        (reply, "replyToEmailAddress"),
        (sender, "sendFromEmailSenderName"),
        (from, "sendFromEmailAddress"),
        (logo, "emailCustomization"),
    ] {
        let r = as_evil.init_otp(evil_org.clone(), ts(), intent).await;
        let message = format!("{r:?}");
        stack.refused_for(r, 403, "REQUEST_NOT_AUTHORIZED", Reason::CustomizationNotAllowed);
        assert!(message.contains(field), "the refusal names {field}: {message}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(smtp.seen(), before, "nothing was sent for a refused customisation");
    // A plain code goes out under the parent's brand, not anything the visitor chose.
    as_evil.init_otp(evil_org.clone(), ts(), plain()).await.unwrap();
    let (_, mail) = smtp.code_for(&before, "victim@example.test");
    assert!(!mail.contains("Evil"), "{mail}");
    assert!(mail.contains("From: Coffer <no-reply@localhost>"), "{mail}");
    // The parent's brand is its auth proxy's appName as the enclave recorded it (proxy_app_name).
    assert!(mail.contains("Subject: Your Acme Wallet code"), "{mail}");
    // Through the proxy, the visitor's appName is not used either: the configuration's is.
    let before = smtp.seen();
    let body =
        json!({ "otpType": "OTP_TYPE_EMAIL", "contact": "victim2@example.test", "appName": "Evil Bank Security" });
    let (status, r) = proxy_post(stack, config_id, "otp_init_v2", body).await;
    assert_eq!(status, 200, "{r}");
    let (_, mail) = smtp.code_for(&before, "victim2@example.test");
    assert!(!mail.contains("Evil"), "{mail}");
}

/// `otp_login_v2` checks a verification token's signature before it looks its contact up, so a
/// forged token (a real one's claims with another contact, or no signature at all) is refused
/// alike whether its contact has an account (Henry) or not: the answers used to tell them apart
/// (the enclave's 403 for Henry, the gateway's 404 for nobody).
async fn forged_tokens_answer_alike(stack: &Stack, smtp: &SmtpServer, config_id: &str, org: &str) {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let key = TurnkeyP256ApiKey::generate();
    let genuine =
        token_for(stack, smtp, config_id, org, &hex::encode(key.compressed_public_key()), "forger@example.test").await;
    let parts: Vec<&str> = genuine.split('.').collect();
    let forge = |contact: &str, signature: &str| {
        let mut c = claims(&genuine);
        c["contact"] = json!(contact);
        format!("{}.{}.{signature}", parts[0], b64.encode(c.to_string()))
    };
    let attempt = |token: String, organization_id: Option<&str>| {
        let intent = login(&token, &key);
        let mut body = json!({ "verificationToken": token, "publicKey": intent.public_key,
            "clientSignature": serde_json::to_value(intent.client_signature.as_ref().unwrap()).unwrap() });
        if let Some(id) = organization_id {
            body["organizationId"] = json!(id);
        }
        proxy_post(stack, config_id, "otp_login_v2", body)
    };
    for signature in [parts[2], "", "AAAA"] {
        let known = attempt(forge("henry@example.test", signature), None).await;
        let unknown = attempt(forge("nobody-at-all@example.test", signature), None).await;
        assert_eq!(known, unknown, "a registered and an unknown contact are answered alike");
        stack.refused_by_gateway(known, 403, "REQUEST_NOT_AUTHORIZED", "not a valid verification token");
        // Checked first whatever the route: with an organization id too.
        let into = attempt(forge("henry@example.test", signature), Some(org)).await;
        stack.refused_by_gateway(into, 403, "REQUEST_NOT_AUTHORIZED", "not a valid verification token");
    }
}

/// An anonymous visitor finds no account by `USERNAME` or `NAME`: `@turnkey/core` sets the user
/// name to the email, so a user-name lookup would tell anyone which addresses have accounts (the
/// EMAIL lookup needs that contact's verification token). Henry signed up with his email as his
/// user name, Dave's sub-organization is named "dave": neither lookup answers.
async fn no_lookups_by_name(stack: &Stack, config_id: &str) {
    for (filter, value) in [("USERNAME", "henry@example.test"), ("NAME", "dave"), ("USERNAME", "nobody@example.test")] {
        let body = json!({ "filterType": filter, "filterValue": value });
        let (status, r) = proxy_post(stack, config_id, "account", body).await;
        let needle = format!("an anonymous lookup by {filter} is not served");
        stack.refused_by_gateway((status, r), 403, "REQUEST_NOT_AUTHORIZED", &needle);
    }
}

/// One address (its IPv4 /24, its IPv6 /64) signs up at most 16 times an hour through the proxy
/// (this stack's setting; the sign-ups above count): then a JSON 429 with `Retry-After`, so that
/// one visitor cannot spend the organization's sub-organizations for everyone. Calls with an
/// unknown configuration id spend none of it.
async fn signups_per_address(stack: &Stack, config_id: &str) {
    let signup = || {
        let key = TurnkeyP256ApiKey::generate();
        let body = json!({ "userName": "visitor", "apiKeys": [{ "apiKeyName": "k", "curveType": "API_KEY_CURVE_P256",
            "publicKey": hex::encode(key.compressed_public_key()) }], "authenticators": [], "oauthProviders": [] });
        signed_by(&key, body)
    };
    for _ in 0..20 {
        let (status, r) = proxy_post(stack, "00000000-0000-4000-8000-00000000dead", "signup_v2", signup()).await;
        stack.refused_by_gateway((status, r), 401, "UNAUTHENTICATED", "unknown or disabled auth proxy config id");
    }
    let mut refused_at = None;
    for i in 0..17 {
        let r = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/v1/signup_v2", stack.auth_proxy_port))
            .header("x-auth-proxy-config-id", config_id)
            .header("origin", APP)
            .body(signup().to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let retry_after = r.headers().get("retry-after").map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
        let body: Value = r.json().await.unwrap_or(Value::Null);
        if status == 429 {
            stack.refused_by_gateway((status, body), 429, "RATE_LIMIT_EXCEEDED", "address's sign-ups");
            // One comes back every 225 s (16 an hour).
            assert!(retry_after.is_some_and(|s| (1..=225).contains(&s)), "Retry-After: {retry_after:?}");
            refused_at = Some(i);
            break;
        }
        assert_eq!(status, 200, "{body}");
    }
    assert!(refused_at.is_some_and(|i| i > 0), "the address's hourly sign-ups end: {refused_at:?}");
}

/// Limits are charged only for requests that were otherwise accepted: calls with an unknown
/// configuration id spend none of the address's one-time code allowance (40 an hour here).
async fn limits_charge_accepted_requests_only(stack: &Stack, config_id: &str) {
    for i in 0..45 {
        let body = json!({ "otpType": "OTP_TYPE_EMAIL", "contact": format!("nobody-{i}@example.test") });
        let (status, r) = proxy_post(stack, "00000000-0000-4000-8000-00000000dead", "otp_init_v2", body).await;
        stack.refused_by_gateway((status, r), 401, "UNAUTHENTICATED", "unknown or disabled auth proxy config id");
    }
    // Nor do codes of a method the configuration does not allow.
    for _ in 0..45 {
        let body = json!({ "otpType": "OTP_TYPE_SMS", "contact": "+13214567890" });
        let (status, r) = proxy_post(stack, config_id, "otp_init_v2", body).await;
        stack.refused_by_gateway((status, r), 403, "REQUEST_NOT_AUTHORIZED", "sms login is not enabled");
    }
    let body = json!({ "otpType": "OTP_TYPE_EMAIL", "contact": "somebody@example.test" });
    let (status, r) = proxy_post(stack, config_id, "otp_init_v2", body).await;
    assert_eq!(status, 200, "the address's allowance is whole: {r}");
}

/// Enables the auth proxy of the stack's organization for email logins from [`APP`]: its config id.
async fn email_proxy(stack: &Stack) -> String {
    let (root, org) = (stack.api_key(), stack.organization_id.clone());
    let r = submit(stack, &root, &org, "enable_auth_proxy", "ACTIVITY_TYPE_ENABLE_AUTH_PROXY", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let config = json!({ "allowedOrigins": [APP], "allowedAuthMethods": ["email"] });
    let r =
        submit(stack, &root, &org, "update_auth_proxy_config", "ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG", config).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["activity"]["result"]["updateAuthProxyConfigResult"]["configId"].as_str().unwrap().to_string()
}

/// A signed proxy sign-up body of a fresh key, and that key.
fn visitor_signup() -> (TurnkeyP256ApiKey, Value) {
    let key = TurnkeyP256ApiKey::generate();
    let body = json!({ "userName": "visitor", "apiKeys": [{ "apiKeyName": "k", "curveType": "API_KEY_CURVE_P256",
        "publicKey": hex::encode(key.compressed_public_key()) }], "authenticators": [], "oauthProviders": [] });
    let signed = signed_by(&key, body);
    (key, signed)
}

/// The attack of issue 39's review: an anonymous visitor signs up and, with its sub-organization's
/// root key, calls `init_otp` directly on the API to a1@…, a2@… — before, every send was charged
/// only per contact and to the parent, so one sub-organization spent the parent's whole hourly
/// allowance (40 here) in seconds and the proxy's own `otp_init` answered 429 to real users for
/// the hour. Now a marked sub-organization sends 3 of its own (`sends_per_sub_organization_per_hour`,
/// this stack), and all of them together at most 25% of the parent's (10 of 40); the proxy keeps
/// the other 30. Decided by the enclave (typed refusal `OTP_RATE_LIMITED`).
#[tokio::test(flavor = "multi_thread")]
async fn proxy_sign_ups_cannot_spend_the_proxys_codes() {
    let mail = std::env::temp_dir().join(format!("coffer-otp-share-{}", std::process::id()));
    std::fs::create_dir_all(&mail).unwrap();
    let stack = Stack::start_with(&[
        ("COFFER_MAIL_DIR", mail.to_str().unwrap()),
        ("COFFER_OTP_SENDS_PER_ORGANIZATION_PER_HOUR", "40"),
        ("COFFER_OTP_SENDS_PER_SUB_ORGANIZATION_PER_HOUR", "3"),
        ("COFFER_AUTH_PROXY_OTP_SENDS_PER_IP_PER_HOUR", "100"),
        ("COFFER_AUTH_PROXY_RATE_LIMIT_PER_IP", "1000"),
        coffer_tests::AUDIT_LOG,
    ])
    .await;
    let config_id = email_proxy(&stack).await;
    let mut n = 0;
    let mut sent_by_subs = 0;
    let mut subs = 0;
    loop {
        let (key, body) = visitor_signup();
        let (status, r) = proxy_post(&stack, &config_id, "signup_v2", body).await;
        assert_eq!(status, 200, "{r}");
        subs += 1;
        let sub = r["organizationId"].as_str().unwrap().to_string();
        let as_sub = stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(key.private_key()), None).unwrap());
        let mut own = 0;
        let refused = loop {
            n += 1;
            let mut intent = init(&format!("a{n}@catchall.test"), None, None, None);
            intent.app_name = String::new();
            match as_sub.init_otp(sub.clone(), Stack::now_ms(), intent).await {
                Ok(_) => {
                    own += 1;
                    assert!(own <= 3, "a sub-organization sends 3 of its own an hour, not the parent's 40");
                }
                Err(e) => break Err::<(), _>(e),
            }
        };
        stack.refused_for(refused, 429, "RATE_LIMIT_EXCEEDED", Reason::OtpRateLimited);
        sent_by_subs += own;
        if own == 0 {
            break;
        }
        assert!(subs < 10, "the sub-organizations' share ends");
    }
    assert_eq!(sent_by_subs, 10, "every sub-organization together: 25% of the parent's 40");
    assert_eq!(subs, 5, "3 + 3 + 3 + 1, then a fresh sign-up has none");
    // The proxy's own login codes keep the other 30.
    for i in 0..30 {
        let body = json!({ "otpType": "OTP_TYPE_EMAIL", "contact": format!("real-user-{i}@example.test") });
        let (status, r) = proxy_post(&stack, &config_id, "otp_init_v2", body).await;
        assert_eq!(status, 200, "the proxy's send {i}: {r}");
    }
    let body = json!({ "otpType": "OTP_TYPE_EMAIL", "contact": "one-too-many@example.test" });
    let answer = proxy_post(&stack, &config_id, "otp_init_v2", body).await;
    stack.refused_for(answer, 429, "RATE_LIMIT_EXCEEDED", Reason::OtpRateLimited);
    drop(stack);
    let _ = std::fs::remove_dir_all(&mail);
}

/// A contact's own logins through the proxy keep their allowance whatever signed-up
/// sub-organizations send it: their direct `init_otp` counts per contact in a lane of its own.
/// Before, a visitor's sub-organization spent the contact's 3 (this stack) and the victim's next
/// proxy login was a 429 for the hour.
#[tokio::test(flavor = "multi_thread")]
async fn a_contact_keeps_its_proxy_logins_whatever_sub_organizations_send_it() {
    let mail = std::env::temp_dir().join(format!("coffer-otp-lane-{}", std::process::id()));
    std::fs::create_dir_all(&mail).unwrap();
    let stack = Stack::start_with(&[
        ("COFFER_MAIL_DIR", mail.to_str().unwrap()),
        ("COFFER_OTP_SENDS_PER_CONTACT_PER_HOUR", "3"),
        coffer_tests::AUDIT_LOG,
    ])
    .await;
    let config_id = email_proxy(&stack).await;
    let (key, body) = visitor_signup();
    let (status, r) = proxy_post(&stack, &config_id, "signup_v2", body).await;
    assert_eq!(status, 200, "{r}");
    let sub = r["organizationId"].as_str().unwrap().to_string();
    let as_sub = stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(key.private_key()), None).unwrap());
    let victim = "victim@example.test";
    for i in 0..3 {
        let mut intent = init(victim, None, None, None);
        intent.app_name = String::new();
        as_sub.init_otp(sub.clone(), Stack::now_ms(), intent).await.unwrap_or_else(|e| panic!("send {i}: {e:?}"));
    }
    let mut intent = init(victim, None, None, None);
    intent.app_name = String::new();
    let refused = as_sub.init_otp(sub.clone(), Stack::now_ms(), intent).await;
    stack.refused_for(refused, 429, "RATE_LIMIT_EXCEEDED", Reason::OtpRateLimited);
    // The victim's own logins: their 3 are untouched.
    for i in 0..3 {
        let body = json!({ "otpType": "OTP_TYPE_EMAIL", "contact": victim });
        let (status, r) = proxy_post(&stack, &config_id, "otp_init_v2", body).await;
        assert_eq!(status, 200, "the victim's login code {i}: {r}");
    }
    let body = json!({ "otpType": "OTP_TYPE_EMAIL", "contact": victim });
    let answer = proxy_post(&stack, &config_id, "otp_init_v2", body).await;
    stack.refused_for(answer, 429, "RATE_LIMIT_EXCEEDED", Reason::OtpRateLimited);
    drop(stack);
    let _ = std::fs::remove_dir_all(&mail);
}

/// One auth proxy call from the source address `from` (any 127/8 address reaches the loopback
/// listener): how clients of one /24 or /16 are told apart from others on one machine.
async fn proxy_post_from(stack: &Stack, from: &str, config_id: &str, path: &str, body: String) -> (u16, Value) {
    let client = reqwest::Client::builder().local_address(from.parse::<std::net::IpAddr>().ok()).build().unwrap();
    let r = client
        .post(format!("http://127.0.0.1:{}/v1/{path}", stack.auth_proxy_port))
        .header("x-auth-proxy-config-id", config_id)
        .header("origin", APP)
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// The proxy's per-second limits: five addresses of one /24 (127.0.0.2–6; an IPv6 /64 alike, see
/// `limits::address_group`) share one address group's 20 a second, and their public reads
/// (`wallet_kit_config`) and refused calls spend nothing of the configuration's 10 a second
/// (this stack), so a visitor elsewhere is served right after. Before, each address had its own
/// 20 and every request was charged to the configuration before its body was read: 100 reads a
/// second emptied the configuration's rate and every visitor got 429. Then sign-ups per range: 2 an
/// hour per /24 here, and 3 times that per /16 (`auth_proxy_range_factor`), so four /24s of one
/// /16 (as 65,536 /64s of one tunnel's /48) get 6, not 8.
#[tokio::test(flavor = "multi_thread")]
async fn proxy_limits_count_address_groups_and_ranges_and_only_work_for_the_configuration() {
    let stack = Stack::start_with(&[
        ("COFFER_AUTH_PROXY_RATE_LIMIT_PER_CONFIG", "10"),
        ("COFFER_AUTH_PROXY_RATE_LIMIT_PER_IP", "20"),
        ("COFFER_AUTH_PROXY_SIGNUPS_PER_IP_PER_HOUR", "2"),
        ("COFFER_AUTH_PROXY_RANGE_FACTOR", "3"),
        coffer_tests::AUDIT_LOG,
    ])
    .await;
    let config_id = email_proxy(&stack).await;
    let stack = std::sync::Arc::new(stack);
    let started = std::time::Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for a in 2..=6 {
        for i in 0..40 {
            let (stack, config_id) = (stack.clone(), config_id.clone());
            flood.spawn(async move {
                let from = format!("127.0.0.{a}");
                // Public reads, and calls refused before any work (a body that is no object).
                let (path, body) = if i % 2 == 0 { ("wallet_kit_config", "{}") } else { ("account", "[1]") };
                proxy_post_from(&stack, &from, &config_id, path, body.into()).await
            });
        }
    }
    let (mut served, mut limited) = (0, 0);
    while let Some(r) = flood.join_next().await {
        let (status, body) = r.unwrap();
        match status {
            200 | 400 => served += 1,
            _ => {
                stack.refused_by_gateway((status, body), 429, "RATE_LIMIT_EXCEEDED", "for this address,");
                limited += 1;
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(served + limited, 200);
    assert!(
        served as f64 <= 20.0 + 20.0 * elapsed + 1.0,
        "one /24 shares one group's 20 a second: {served} served in {elapsed:.2}s"
    );
    // A visitor elsewhere: the configuration's whole burst of work is there.
    for i in 0..10 {
        let key = hex::encode(TurnkeyP256ApiKey::generate().compressed_public_key());
        let body = json!({ "filterType": "PUBLIC_KEY", "filterValue": key }).to_string();
        let (status, r) = proxy_post_from(&stack, "127.1.0.1", &config_id, "account", body).await;
        assert_eq!(status, 200, "the visitor's lookup {i} after the flood: {r}");
    }

    // Sign-ups: 2 per /24, 6 per /16 (once the configuration's second, spent above, is back).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut accepted = 0;
    for c in 1..=4 {
        for _ in 0..2 {
            let from = format!("127.2.{c}.1");
            let (_, body) = visitor_signup();
            let (status, r) = proxy_post_from(&stack, &from, &config_id, "signup_v2", body.to_string()).await;
            if accepted < 6 {
                assert_eq!(status, 200, "sign-up {accepted} from {from}: {r}");
                accepted += 1;
            } else {
                stack.refused_by_gateway((status, r), 429, "RATE_LIMIT_EXCEEDED", "address range's sign-ups");
            }
        }
    }
    assert_eq!(accepted, 6);
    // Another /16 signs up as before.
    let (_, body) = visitor_signup();
    let (status, r) = proxy_post_from(&stack, "127.3.0.1", &config_id, "signup_v2", body.to_string()).await;
    assert_eq!(status, 200, "{r}");
}

/// A sign-up (a sub-organization anyone gets from the auth proxy) spends its own lane of its
/// top-level organization's replay share, and all sign-ups together spend only their part of it:
/// one visitor's fourth request is refused at a lane of 3 while another's go on; once the
/// sign-ups' 6 are spent a third visitor is refused before its first; the parent still works.
#[tokio::test(flavor = "multi_thread")]
async fn sign_ups_spend_their_own_lanes_of_the_replay_window_not_their_parents_share() {
    let stack = Stack::start_with(&[
        coffer_tests::AUDIT_LOG,
        ("COFFER_REPLAY_QUOTA_PER_ORGANIZATION", "40"),
        ("COFFER_REPLAY_QUOTA_PER_SIGNUP", "3"),
        ("COFFER_REPLAY_SIGNUPS_SHARE_PERCENT", "15"),
        ("COFFER_AUTH_PROXY_RATE_LIMIT_PER_IP", "1000"),
    ])
    .await;
    let (root, org) = (stack.api_key(), stack.organization_id.clone());
    let r = submit(&stack, &root, &org, "enable_auth_proxy", "ACTIVITY_TYPE_ENABLE_AUTH_PROXY", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let config = json!({ "allowedOrigins": [APP], "allowedAuthMethods": ["email"], "otpLength": 6,
        "otpAlphanumeric": false });
    let r =
        submit(&stack, &root, &org, "update_auth_proxy_config", "ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG", config).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let config_id =
        r.json["activity"]["result"]["updateAuthProxyConfigResult"]["configId"].as_str().unwrap().to_string();
    let mut visitors = Vec::new();
    for name in ["ann", "bob", "cat"] {
        let key = TurnkeyP256ApiKey::generate();
        let signup = json!({ "userName": name, "apiKeys": [{ "apiKeyName": "k",
            "publicKey": hex::encode(key.compressed_public_key()), "curveType": "API_KEY_CURVE_P256" }],
            "authenticators": [], "oauthProviders": [] });
        let (status, r) = proxy_post(&stack, &config_id, "signup_v2", signed_by(&key, signup)).await;
        assert_eq!(status, 200, "{r}");
        visitors.push((key, r["organizationId"].as_str().unwrap().to_string()));
    }
    async fn tag(stack: &Stack, key: &TurnkeyP256ApiKey, org: &str, n: usize) -> coffer_tests::RawResponse {
        let params = json!({ "userTagName": format!("tag-{n}"), "userIds": [] });
        submit(stack, key, org, "create_user_tag", "ACTIVITY_TYPE_CREATE_USER_TAG", params).await
    }
    let [(ann, ann_org), (bob, bob_org), (cat, cat_org)] = &visitors[..] else { unreachable!() };
    for n in 0..3 {
        let r = tag(&stack, ann, ann_org, n).await;
        assert_eq!(r.status, 200, "ann's {n}: {}", r.text);
    }
    let r = tag(&stack, ann, ann_org, 3).await;
    stack.refused_for(&r, 503, "RPC_CALL_ERROR", Reason::OrganizationReplayQuota);
    for n in 0..3 {
        let r = tag(&stack, bob, bob_org, n).await;
        assert_eq!(r.status, 200, "bob's {n}: {}", r.text);
    }
    // 6 of the sign-ups' 6: a visitor with an empty lane of its own is refused too.
    let r = tag(&stack, cat, cat_org, 0).await;
    stack.refused_for(&r, 503, "RPC_CALL_ERROR", Reason::OrganizationReplayQuota);
    // The parent's share (40) is far from spent: its own requests go on.
    let r = tag(&stack, &root, &org, 0).await;
    assert_eq!(r.status, 200, "the parent's: {}", r.text);
}

/// What an invitation's message says: its invitation id, acceptance code and encryption target
/// (the body is base64: the target is one long line).
fn invitation_mail(
    smtp: &SmtpServer,
    seen: &std::collections::HashSet<std::path::PathBuf>,
    to: &str,
) -> (String, String, String, String) {
    let new: Vec<String> = smtp
        .messages()
        .into_iter()
        .filter(|(f, m)| !seen.contains(f) && m.contains(&format!("To: {to}")))
        .map(|(_, m)| m)
        .collect();
    assert_eq!(new.len(), 1, "one invitation to {to}");
    let raw = new[0].replace("\r\n", "\n");
    let (headers, body) = raw.split_once("\n\n").unwrap();
    assert!(headers.contains("Subject: Your invitation"), "{headers}");
    let body: String = body.lines().map(str::trim).collect();
    let text = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(body).unwrap()).unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .trim()
            .to_string()
    };
    let bundle = text.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no target in {text}")).to_string();
    (field("Invitation:"), field("Acceptance code:"), bundle, text)
}

/// Invitations: made by a user with a policy for them (one without is refused by the enclave),
/// mailed by the enclave with nothing the inviter wrote, accepted once with the key the receiver
/// brings and the code encrypted with it, which then stamps as the new user; a wrong code, a key
/// that is not the brought one, a revoked invitation and a second acceptance are refused.
async fn invitations(stack: &Stack, smtp: &SmtpServer) {
    use turnkey_client::generated::immutable::common::v1::AccessType;
    use turnkey_client::generated::{
        CreateInvitationsIntent, CreateUserTagIntent, DeleteInvitationIntent, InvitationParams,
    };
    let (root, org) = (stack.client(), stack.organization_id.clone());
    let ts = || Stack::now_ms();
    let me = root.get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await.unwrap().user_id;
    let tag = root
        .create_user_tag(org.clone(), ts(), CreateUserTagIntent { user_tag_name: "invited".into(), user_ids: vec![] })
        .await
        .unwrap()
        .result
        .user_tag_id;
    let invite = |email: &str, sender: &str, access: AccessType| CreateInvitationsIntent {
        invitations: vec![InvitationParams {
            receiver_user_name: "Grace <b>Hopper</b>".into(),
            receiver_user_email: email.into(),
            receiver_user_tags: vec![tag.clone()],
            access_type: access,
            sender_user_id: sender.into(),
        }],
    };
    // A user without a policy for invitations is refused by the enclave.
    let (bob, bob_key) = coffer_tests::user_with_key(&root, &org, "bob").await;
    stack.refusals_accounted();
    let as_bob = stack.client_with(bob_key);
    stack.refused_for(
        as_bob.create_invitations(org.clone(), ts(), invite("x@example.test", &bob, AccessType::Api)).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        Reason::PolicyDenied,
    );
    // To an address a member has (an acceptance verifies it: logins by it would be ambiguous).
    stack.refused_for(
        root.create_invitations(org.clone(), ts(), invite("alice@example.test", &me, AccessType::Api)).await,
        400,
        "REQUEST_INVALID",
        Reason::TransitionRefused,
    );
    // Sent in another user's name: refused.
    let r = root.create_invitations(org.clone(), ts(), invite("x@example.test", &bob, AccessType::Api)).await;
    coffer_tests::refused(r, 400, "REQUEST_INVALID", "senderUserId");

    let before = smtp.seen();
    let made = root
        .create_invitations(org.clone(), ts(), invite("invited.grace@example.test", &me, AccessType::Api))
        .await
        .unwrap();
    let invitation = made.result.invitation_ids[0].clone();
    let (id, code, target, text) = invitation_mail(smtp, &before, "invited.grace@example.test");
    assert_eq!(id, invitation);
    assert_eq!(code.len(), 8, "{code}");
    assert!(!text.contains("Grace") && !text.contains("<b>"), "nothing the inviter wrote is sent: {text}");
    let get_organization = json!({ "organizationId": org }).to_string();
    let listed =
        stack.post_raw("/public/v1/query/get_organization", get_organization.as_bytes(), Some(&stack.api_key())).await;
    let invitations = &listed.json["organizationData"]["invitations"];
    assert_eq!(invitations[0]["invitationId"], invitation, "{listed:?}");
    assert_eq!(invitations[0]["status"], "INVITATION_STATUS_CREATED");
    assert_eq!(invitations[0]["receiverEmail"], "invited.grace@example.test");

    // Accepted with the key Grace brings, which stamps the acceptance and is encrypted with the code.
    let grace = TurnkeyP256ApiKey::generate();
    let grace_hex = hex::encode(grace.compressed_public_key());
    let accept = |key_hex: &str, bundle: String| {
        json!({ "invitationId": invitation, "userId": "", "encryptedOtpBundle": bundle,
            "apiKey": { "apiKeyName": "grace", "publicKey": key_hex } })
    };
    let ty = "ACTIVITY_TYPE_ACCEPT_INVITATION_V2";
    let wrong = encrypted(stack, &target, &org, "00000000", &grace_hex);
    let r = submit(stack, &grace, &org, "accept_invitation", ty, accept(&grace_hex, wrong)).await;
    coffer_tests::refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "acceptance code");
    // The right code, stamped by another key than the one brought: refused.
    let other = TurnkeyP256ApiKey::generate();
    let right = encrypted(stack, &target, &org, &code.to_lowercase(), &grace_hex);
    let r = submit(stack, &other, &org, "accept_invitation", ty, accept(&grace_hex, right.clone())).await;
    assert_eq!(r.status, 401, "{}", r.text);
    // The code encrypted with another key than the stamping one: refused.
    let other_hex = hex::encode(other.compressed_public_key());
    let r = submit(stack, &other, &org, "accept_invitation", ty, accept(&other_hex, right.clone())).await;
    coffer_tests::refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "acceptance code");
    let accepting = json!({"type": ty, "timestampMs": Stack::now_ms().to_string(), "organizationId": org,
        "parameters": accept(&grace_hex, right.clone())})
    .to_string();
    let path = "/public/v1/submit/accept_invitation";
    let r = stack.post_raw(path, accepting.as_bytes(), Some(&grace)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // The same bytes again (the client's poll, a retry) answer the same activity, the invitation gone.
    let again = stack.post_raw(path, accepting.as_bytes(), Some(&grace)).await;
    assert_eq!((again.status, &again.json["activity"]["id"]), (200, &r.json["activity"]["id"]), "{}", again.text);
    let activity = &r.json["activity"];
    assert_eq!(activity["status"], "ACTIVITY_STATUS_COMPLETED", "{activity}");
    let user_id = activity["result"]["acceptInvitationResult"]["userId"].as_str().unwrap().to_string();
    assert_eq!(activity["result"]["acceptInvitationResult"]["invitationId"], invitation);
    let grace_private = hex::encode(grace.private_key());
    let as_grace = stack.client_with(grace);
    let who = as_grace.get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await.unwrap();
    assert_eq!(who.user_id, user_id);
    let user = root
        .get_user(turnkey_client::generated::GetUserRequest { organization_id: org.clone(), user_id: user_id.clone() })
        .await
        .unwrap()
        .user
        .unwrap();
    assert_eq!(
        (user.user_name.as_str(), user.user_email.as_deref(), user.user_tags.clone()),
        ("Grace <b>Hopper</b>", Some("invited.grace@example.test"), vec![tag.clone()])
    );
    assert_eq!(stack.link_count(&org, activity["fingerprint"].as_str().unwrap(), "ACTIVITY_STATUS_COMPLETED"), 1);
    // Once: a second acceptance (a new body) is refused.
    let again = encrypted(stack, &target, &org, &code, &grace_hex);
    let grace = TurnkeyP256ApiKey::from_strings(grace_private, None).unwrap();
    let r = submit(stack, &grace, &org, "accept_invitation", ty, accept(&grace_hex, again)).await;
    coffer_tests::refused_raw(&r, 404, "REQUEST_INVALID", "no open invitation");
    let listed =
        stack.post_raw("/public/v1/query/get_organization", get_organization.as_bytes(), Some(&stack.api_key())).await;
    assert_eq!(listed.json["organizationData"]["invitations"], json!([]), "an accepted invitation goes");

    // Revoked, an invitation is accepted no more.
    let before = smtp.seen();
    let second = root
        .create_invitations(org.clone(), ts(), invite("invited.hopper@example.test", &me, AccessType::All))
        .await
        .unwrap();
    let second = second.result.invitation_ids[0].clone();
    let (_, code, target, _) = invitation_mail(smtp, &before, "invited.hopper@example.test");
    root.delete_invitation(org.clone(), ts(), DeleteInvitationIntent { invitation_id: second.clone() }).await.unwrap();
    let late = TurnkeyP256ApiKey::generate();
    let late_hex = hex::encode(late.compressed_public_key());
    let bundle = encrypted(stack, &target, &org, &code, &late_hex);
    let body = json!({ "invitationId": second, "encryptedOtpBundle": bundle, "apiKey": { "apiKeyName": "late", "publicKey": late_hex } });
    let r = submit(stack, &late, &org, "accept_invitation", ty, body).await;
    coffer_tests::refused_raw(&r, 404, "REQUEST_INVALID", "no open invitation");
    let _ = bob;
    email_events(stack, smtp).await;
}

/// `list_email_events`: what the enclave reported sending, by recipient (any case), newest first,
/// paged, filtered by type; each event's message id is the one the message carries.
async fn email_events(stack: &Stack, smtp: &SmtpServer) {
    use turnkey_client::generated::external::options::v1::Pagination;
    use turnkey_client::generated::ListEmailEventsRequest;
    let (root, org) = (stack.client(), stack.organization_id.clone());
    let list = |email: &str, event_type: &str, pagination: Option<Pagination>| ListEmailEventsRequest {
        organization_id: org.clone(),
        email: email.into(),
        event_type: event_type.into(),
        pagination_options: pagination,
    };
    let events = root.list_email_events(list("INVITED.GRACE@example.test", "", None)).await.unwrap().email_events;
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!((e.event_type.as_str(), e.to_address.as_str()), ("Send", "invited.grace@example.test"));
    assert_eq!((e.organization_id.as_str(), e.from_address.as_str()), (org.as_str(), "no-reply@localhost"));
    let carried =
        smtp.messages().into_iter().filter(|(_, m)| m.contains(&format!("Message-ID: {}", e.message_id))).count();
    assert_eq!(carried, 1, "the event's message id is its message's: {}", e.message_id);
    assert!(root
        .list_email_events(list("invited.grace@example.test", "SendFailure", None))
        .await
        .unwrap()
        .email_events
        .is_empty());
    // Two codes to one address: newest first, a page at a time.
    for _ in 0..2 {
        root.init_otp(org.clone(), Stack::now_ms(), init("events@example.test", None, None, None)).await.unwrap();
    }
    let all = root.list_email_events(list("events@example.test", "Send", None)).await.unwrap().email_events;
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all[0].created_at.parse::<u64>().unwrap() >= all[1].created_at.parse::<u64>().unwrap(), "newest first");
    let page = |limit: &str, before: &str, after: &str| {
        Some(Pagination { limit: limit.into(), before: before.into(), after: after.into() })
    };
    let first = root.list_email_events(list("events@example.test", "", page("1", "", ""))).await.unwrap().email_events;
    assert_eq!(first.iter().map(|e| &e.id).collect::<Vec<_>>(), vec![&all[0].id]);
    let next = root.list_email_events(list("events@example.test", "", page("1", "", &all[0].id))).await.unwrap();
    assert_eq!(next.email_events.iter().map(|e| &e.id).collect::<Vec<_>>(), vec![&all[1].id]);
    let back = root.list_email_events(list("events@example.test", "", page("5", &all[1].id, ""))).await.unwrap();
    assert_eq!(back.email_events.iter().map(|e| &e.id).collect::<Vec<_>>(), vec![&all[0].id]);
    // A request without a recipient is refused.
    let r = root.list_email_events(list("", "", None)).await;
    coffer_tests::refused(r, 400, "REQUEST_INVALID", "email is required");
}
