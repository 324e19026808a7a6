//! Social login and sessions end to end, with a local fake OAuth 2.0 provider: OAuth 2.0
//! credentials (the client secret encrypted to Coffer's TLS-fetcher key), the code exchange in the
//! enclave, Coffer's OIDC token verified by an independent JOSE library against the published
//! JWKS, oauth_login / stamp_login / read-write sessions whose keys stamp until they expire, and
//! a parent organization logging a sub-organization's user in, and read-only sessions (`X-Session`)
//! refused each for its own reason.

#[allow(dead_code)]
mod independent;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use coffer_proto::v1::RefusalReason;
use coffer_tests::{refused, refused_raw, submit, RawResponse, Stack};
use p256::elliptic_curve::sec1::ToEncodedPoint;
use serde_json::{json, Value};
use sha2::Digest;
use turnkey_client::generated::immutable::common::v1::Oauth2Provider;
use turnkey_client::generated::{
    CreateOauth2CredentialIntent, CreateReadOnlySessionIntent, DeleteOauth2CredentialIntent,
    GetOauth2CredentialRequest, GetWhoamiRequest, ListOauth2CredentialsRequest, Oauth2AuthenticateIntent,
    OauthLoginIntent, StampLoginIntent, UpdateOauth2CredentialIntent,
};
use turnkey_client::{TurnkeyClientError, TurnkeyP256ApiKey};

const CLIENT_ID: &str = "coffer-test-client";
const CLIENT_SECRET: &str = "s3cret-client-secret-of-the-app";
const AUTH_CODE: &str = "code-123";
const VERIFIER: &str = "pkce-verifier-abcdefghijklmnopqrstuvwxyz-0123456789";
const REDIRECT: &str = "https://app.example/callback";
const BEARER: &str = "provider-bearer-token-xyz";
const X_USER: &str = "x-user-1001";

/// What the fake provider saw, for assertions.
#[derive(Default)]
struct Seen {
    token_requests: usize,
}

/// A fake X: `POST /token` checks HTTP Basic client authentication and the PKCE exchange,
/// `GET /me` checks the bearer token and answers X's user shape.
async fn fake_x() -> (String, Arc<Mutex<Seen>>) {
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{get, post};
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    let token = move |headers: HeaderMap, body: String| {
        let s = s.clone();
        async move {
            s.lock().unwrap().token_requests += 1;
            let basic = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{CLIENT_ID}:{CLIENT_SECRET}"))
            );
            if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(basic.as_str()) {
                return (
                    StatusCode::UNAUTHORIZED,
                    r#"{"error":"invalid_client","error_description":"bad client"}"#.to_string(),
                );
            }
            let form: HashMap<String, String> = reqwest::Url::parse(&format!("http://x/?{body}"))
                .unwrap()
                .query_pairs()
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            let want = [
                ("grant_type", "authorization_code"),
                ("code", AUTH_CODE),
                ("code_verifier", VERIFIER),
                ("redirect_uri", REDIRECT),
                ("client_id", CLIENT_ID),
            ];
            if want.iter().any(|(k, v)| form.get(*k).map(String::as_str) != Some(*v)) {
                return (
                    StatusCode::BAD_REQUEST,
                    r#"{"error":"invalid_grant","error_description":"code mismatch"}"#.to_string(),
                );
            }
            (StatusCode::OK, json!({"token_type": "bearer", "access_token": BEARER, "expires_in": 7200}).to_string())
        }
    };
    let me = |headers: HeaderMap| async move {
        if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {BEARER}")) {
            return (StatusCode::UNAUTHORIZED, "{}".to_string());
        }
        (StatusCode::OK, json!({"data": {"id": X_USER, "name": "Ada", "username": "ada"}}).to_string())
    };
    let app = axum::Router::new().route("/token", post(token)).route("/me", get(me));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

async fn stack_with_fake_x() -> (Stack, Arc<Mutex<Seen>>) {
    let (base, seen) = fake_x().await;
    let token = format!("{base}/token");
    let me = format!("{base}/me");
    let stack =
        Stack::start_with(&[("COFFER_OAUTH2_X_TOKEN_URL", &token), ("COFFER_OAUTH2_X_USERINFO_URL", &me)]).await;
    (stack, seen)
}

async fn get_json(stack: &Stack, path: &str) -> Value {
    let r = reqwest::get(format!("{}{path}", stack.base_url)).await.unwrap();
    assert_eq!(r.status(), 200, "{path}");
    r.json().await.unwrap()
}

/// The client secret encrypted to the published TLS-fetcher key, as `encryptOauth2ClientSecret`
/// does.
async fn encrypted_secret(stack: &Stack, secret: &str) -> String {
    let keys = get_json(stack, "/public/v1/discovery/keys").await;
    let fetcher: [u8; 65] =
        hex::decode(keys["tlsFetcherEncryptPublicKey"].as_str().unwrap()).unwrap().try_into().unwrap();
    let envelope = coffer_crypto::qos::seal_quorum_envelope(secret.as_bytes(), &fetcher, &[0x42; 32]).unwrap();
    hex::encode(envelope)
}

/// A session key and the nonce that binds an OIDC token to it (sha256 of its hex).
fn session_key() -> (TurnkeyP256ApiKey, String, String) {
    let key = TurnkeyP256ApiKey::generate();
    let public = hex::encode(key.compressed_public_key());
    let nonce = hex::encode(sha2::Sha256::digest(public.as_bytes()));
    (key, public, nonce)
}

/// A session JWT's claims, once its signature verifies (`jsonwebtoken`, see
/// `independent::verify_session_jwt`) with the notarizer key the gateway publishes.
async fn session_claims(stack: &Stack, jwt: &str) -> Value {
    let keys = get_json(stack, "/public/v1/discovery/keys").await;
    independent::verify_session_jwt(jwt, keys["notarizerPublicKey"].as_str().expect("a notarizerPublicKey"))
}

/// An OIDC token Coffer issued, verified by `jsonwebtoken` against the JWKS the gateway
/// publishes (ES256, Coffer's issuer, audience `CLIENT_ID`); its claims.
async fn coffer_oidc_claims(stack: &Stack, token: &str) -> Value {
    let jwks = get_json(stack, "/.well-known/jwks.json").await;
    let header = jsonwebtoken::decode_header(token).unwrap();
    let set: jsonwebtoken::jwk::JwkSet = serde_json::from_value(jwks).unwrap();
    let key = set.find(header.kid.as_deref().unwrap()).expect("the token's kid is in the JWKS");
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    validation.set_audience(&[CLIENT_ID]);
    validation.set_issuer(&[stack.base_url.as_str()]);
    jsonwebtoken::decode::<Value>(token, &jsonwebtoken::DecodingKey::from_jwk(key).unwrap(), &validation)
        .expect("Coffer's OIDC token verifies against its JWKS")
        .claims
}

#[tokio::test]
async fn oauth2_credentials_code_exchange_oidc_token_and_oauth_login() {
    let (stack, seen) = stack_with_fake_x().await;
    let client = stack.client();
    let org = stack.organization_id.clone();

    // Discovery: the keys, the issuer's configuration and its JWKS, no stamp needed.
    let keys = get_json(&stack, "/public/v1/discovery/keys").await;
    assert_eq!(keys["oidcIssuer"], stack.base_url);
    assert_eq!(keys["oidcJwksUri"], format!("{}/.well-known/jwks.json", stack.base_url));
    assert_eq!(keys["enclaveSignerPublicKey"], stack.signer_public_key);
    for k in ["notarizerPublicKey", "tlsFetcherEncryptPublicKey"] {
        let point = hex::decode(keys[k].as_str().unwrap()).unwrap();
        assert!(p256::PublicKey::from_sec1_bytes(&point).is_ok() && point.len() == 65, "{k}");
    }
    let config = get_json(&stack, "/.well-known/openid-configuration").await;
    assert_eq!(config["issuer"], stack.base_url);
    let jwks = get_json(&stack, config["jwks_uri"].as_str().unwrap().trim_start_matches(&stack.base_url)).await;

    // A secret that does not open with Coffer's key is refused and nothing is stored.
    let garbage = CreateOauth2CredentialIntent {
        provider: Oauth2Provider::X,
        client_id: CLIENT_ID.into(),
        encrypted_client_secret: hex::encode([7u8; 120]),
    };
    refused(
        client.create_oauth2_credential(org.clone(), Stack::now_ms(), garbage).await,
        400,
        "REQUEST_INVALID",
        "encryptedClientSecret",
    );
    let list = client.list_oauth2_credentials(ListOauth2CredentialsRequest { organization_id: org.clone() }).await;
    assert!(list.unwrap().oauth2_credentials.is_empty());

    let create = CreateOauth2CredentialIntent {
        provider: Oauth2Provider::X,
        client_id: CLIENT_ID.into(),
        encrypted_client_secret: encrypted_secret(&stack, CLIENT_SECRET).await,
    };
    let created = client.create_oauth2_credential(org.clone(), Stack::now_ms(), create).await.unwrap();
    let credential_id = created.result.oauth2_credential_id;
    let got = client
        .get_oauth2_credential(GetOauth2CredentialRequest {
            organization_id: org.clone(),
            oauth2_credential_id: credential_id.clone(),
        })
        .await
        .unwrap()
        .oauth2_credential
        .unwrap();
    assert_eq!((got.client_id.as_str(), got.provider), (CLIENT_ID, Oauth2Provider::X));
    assert!(!got.encrypted_client_secret.contains(CLIENT_SECRET));

    // A wrong code fails at the provider: the error names the provider's answer, not the secret.
    let (session, session_public, nonce) = session_key();
    let intent = |code: &str| Oauth2AuthenticateIntent {
        oauth2_credential_id: credential_id.clone(),
        auth_code: code.into(),
        redirect_uri: REDIRECT.into(),
        code_verifier: VERIFIER.into(),
        nonce: nonce.clone(),
        bearer_token_target_public_key: None,
    };
    let wrong = client.oauth2_authenticate(org.clone(), Stack::now_ms(), intent("wrong-code")).await;
    let shown = format!("{wrong:?}");
    assert!(shown.contains("invalid_grant") && !shown.contains(CLIENT_SECRET), "{shown}");
    refused(wrong, 400, "REQUEST_INVALID", "provider X");
    assert!(!stack.enclave_log().contains(CLIENT_SECRET), "the secret must never be logged");

    // The right code: Coffer's OIDC token, verified by jsonwebtoken against the published JWKS.
    let token =
        client.oauth2_authenticate(org.clone(), Stack::now_ms(), intent(AUTH_CODE)).await.unwrap().result.oidc_token;
    assert_eq!(seen.lock().unwrap().token_requests, 2);
    let header = jsonwebtoken::decode_header(&token).unwrap();
    let jwk: jsonwebtoken::jwk::JwkSet = serde_json::from_value(jwks.clone()).unwrap();
    let key = jwk.find(header.kid.as_deref().unwrap()).expect("the token's kid is in the JWKS");
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    validation.set_audience(&[CLIENT_ID]);
    validation.set_issuer(&[stack.base_url.as_str()]);
    let verified =
        jsonwebtoken::decode::<Value>(&token, &jsonwebtoken::DecodingKey::from_jwk(key).unwrap(), &validation)
            .unwrap()
            .claims;
    assert_eq!(verified["sub"], X_USER);
    assert_eq!(verified["nonce"], nonce);
    assert_eq!(verified["preferred_username"], "ada");
    assert_eq!(verified["exp"].as_i64().unwrap() - verified["iat"].as_i64().unwrap(), 900);
    assert!(verified.get("encrypted_bearer_token").is_none());

    // A wrong client secret fails at the provider: the error names it, never the secret.
    let update = |secret: String| UpdateOauth2CredentialIntent {
        oauth2_credential_id: credential_id.clone(),
        provider: Oauth2Provider::X,
        client_id: CLIENT_ID.into(),
        encrypted_client_secret: secret,
    };
    const WRONG: &str = "wrong-secret-value-123";
    client
        .update_oauth2_credential(org.clone(), Stack::now_ms(), update(encrypted_secret(&stack, WRONG).await))
        .await
        .unwrap();
    let wrong = client.oauth2_authenticate(org.clone(), Stack::now_ms(), intent(AUTH_CODE)).await;
    let shown = format!("{wrong:?}");
    assert!(shown.contains("invalid_client") && !shown.contains(WRONG), "{shown}");
    refused(wrong, 400, "REQUEST_INVALID", "provider X");
    client
        .update_oauth2_credential(org.clone(), Stack::now_ms(), update(encrypted_secret(&stack, CLIENT_SECRET).await))
        .await
        .unwrap();

    // With a target key, the bearer token travels encrypted to it in the token.
    let target = p256::SecretKey::from_slice(&[0x11; 32]).unwrap();
    let target_hex = hex::encode(target.public_key().to_encoded_point(false).as_bytes());
    let with_bearer =
        Oauth2AuthenticateIntent { bearer_token_target_public_key: Some(target_hex), ..intent(AUTH_CODE) };
    let token2 = client.oauth2_authenticate(org.clone(), Stack::now_ms(), with_bearer).await.unwrap().result.oidc_token;
    let sealed = coffer_oidc_claims(&stack, &token2).await["encrypted_bearer_token"].as_str().unwrap().to_string();
    let bearer = independent::open_credential_bundle(&sealed, &[0x11; 32]);
    assert_eq!(bearer.as_slice(), BEARER.as_bytes());

    // Attach the identity to the root user (Coffer's own token, verified without a fetch), then
    // log in with it: a session JWT signed by the notarizer, whose key stamps as the root user.
    let attach = json!({"userId": stack.user_id, "oauthProviders": [{"providerName": "x", "oidcToken": token}]});
    let r = submit(
        &stack,
        &stack.api_key(),
        &org,
        "create_oauth_providers",
        "ACTIVITY_TYPE_CREATE_OAUTH_PROVIDERS_V2",
        attach,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let login = OauthLoginIntent {
        oidc_token: token.clone(),
        public_key: session_public.clone(),
        expiration_seconds: Some("600".into()),
        invalidate_existing: None,
        session_profile_id: None,
    };
    let jwt = client.oauth_login(org.clone(), Stack::now_ms(), login).await.unwrap().result.session;
    // Verified with jsonwebtoken against the published notarizer key (not coffer_crypto).
    let claims = independent::verify_session_jwt(&jwt, keys["notarizerPublicKey"].as_str().unwrap());
    assert_eq!(claims["user_id"], stack.user_id);
    assert_eq!(claims["organization_id"], org);
    assert_eq!(claims["public_key"], session_public);
    assert_eq!(claims["session_type"], "SESSION_TYPE_READ_WRITE");
    let whoami =
        stack.client_with(session).get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await.unwrap();
    assert_eq!(whoami.user_id, stack.user_id);

    // The token binds one key: another key with the same token is refused.
    let (_, other_public, _) = session_key();
    let replay = OauthLoginIntent {
        oidc_token: token,
        public_key: other_public,
        expiration_seconds: None,
        invalidate_existing: None,
        session_profile_id: None,
    };
    stack.refusals_accounted();
    let r = client.oauth_login(org.clone(), Stack::now_ms(), replay).await;
    refused_by_enclave(&stack, r, 400, "REQUEST_INVALID", "nonce", RefusalReason::IdentityInvalid);

    // The first OAuth login (`oauth`, no Rust client method): a token whose nonce binds the
    // target key gets a new key of the user, made by the enclave and encrypted to the target
    // (opened with the test's own HPKE), stored as an OAuth key; the same token's nonce binds no
    // other target.
    let target = p256::SecretKey::from_slice(&[0x33; 32]).unwrap();
    let target_hex = hex::encode(target.public_key().to_encoded_point(false).as_bytes());
    let target_nonce = hex::encode(sha2::Sha256::digest(target_hex.as_bytes()));
    let bound = Oauth2AuthenticateIntent { nonce: target_nonce, ..intent(AUTH_CODE) };
    let token = client.oauth2_authenticate(org.clone(), Stack::now_ms(), bound).await.unwrap().result.oidc_token;
    let p = json!({"oidcToken": token, "targetPublicKey": target_hex, "apiKeyName": "legacy oauth"});
    let r = submit(&stack, &stack.api_key(), &org, "oauth", "ACTIVITY_TYPE_OAUTH", p).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let result = &r.json["activity"]["result"]["oauthResult"];
    assert_eq!(result["userId"], stack.user_id.as_str(), "{}", r.text);
    let secret = independent::open_credential_bundle(result["credentialBundle"].as_str().unwrap(), &[0x33; 32]);
    let legacy = TurnkeyP256ApiKey::from_strings(hex::encode(secret.as_slice()), None).unwrap();
    let body = json!({"organizationId": org, "apiKeyId": result["apiKeyId"]});
    let got = stack.post_raw("/public/v1/query/get_api_key", body.to_string().as_bytes(), Some(&stack.api_key())).await;
    assert_eq!(
        got.json["apiKey"]["credential"]["publicKey"],
        hex::encode(legacy.compressed_public_key()),
        "{}",
        got.text
    );
    assert_eq!(got.json["apiKey"]["credential"]["type"], "CREDENTIAL_TYPE_OAUTH_KEY_P256");
    assert_eq!(got.json["apiKey"]["apiKeyName"], "legacy oauth");
    let whoami = stack.client_with(legacy).get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await.unwrap();
    assert_eq!(whoami.user_id, stack.user_id);
    let other =
        hex::encode(p256::SecretKey::from_slice(&[0x44; 32]).unwrap().public_key().to_encoded_point(false).as_bytes());
    let p = json!({"oidcToken": token, "targetPublicKey": other});
    stack.refusals_accounted();
    let r = submit(&stack, &stack.api_key(), &org, "oauth", "ACTIVITY_TYPE_OAUTH", p).await;
    refused_raw(&r, 400, "REQUEST_INVALID", "nonce is not the SHA-256 of the targetPublicKey");
    stack.refused_for(&r, 400, "REQUEST_INVALID", RefusalReason::IdentityInvalid);

    // Deleted: gone from reads, and no code is exchanged with it.
    let delete = DeleteOauth2CredentialIntent { oauth2_credential_id: credential_id.clone() };
    client.delete_oauth2_credential(org.clone(), Stack::now_ms(), delete).await.unwrap();
    let get = GetOauth2CredentialRequest { organization_id: org.clone(), oauth2_credential_id: credential_id.clone() };
    refused(client.get_oauth2_credential(get).await, 404, "OAUTH2_CREDENTIAL_NOT_FOUND", "oauth2 credential not found");
    let list = client.list_oauth2_credentials(ListOauth2CredentialsRequest { organization_id: org.clone() }).await;
    assert!(list.unwrap().oauth2_credentials.is_empty());
    let requests = seen.lock().unwrap().token_requests;
    refused(
        client.oauth2_authenticate(org.clone(), Stack::now_ms(), intent(AUTH_CODE)).await,
        404,
        "OAUTH2_CREDENTIAL_NOT_FOUND",
        "not found",
    );
    assert_eq!(seen.lock().unwrap().token_requests, requests, "nothing reached the provider");
}

/// A submission stamped the way `@turnkey/core`'s `loginWithOauth` stamps: `X-Stamp-Attested`,
/// the session key's signature with the OIDC token that attests it.
async fn attested_submit(
    stack: &Stack,
    org: String,
    path: &str,
    ty: &str,
    params: Value,
    token: String,
    key: TurnkeyP256ApiKey,
) -> RawResponse {
    use p256::ecdsa::signature::Signer;
    let body =
        json!({"type": ty, "timestampMs": Stack::now_ms().to_string(), "organizationId": org, "parameters": params})
            .to_string();
    let signing = p256::ecdsa::SigningKey::from_slice(&key.private_key()).unwrap();
    let signature: p256::ecdsa::Signature = signing.sign(body.as_bytes());
    let stamp = json!({"publicKeyAttestation": token, "scheme": "STAMP_ATTESTED_SCHEME_P256_OIDC",
        "publicKey": hex::encode(key.compressed_public_key()), "signature": hex::encode(signature.to_der().as_bytes())});
    let r = reqwest::Client::new()
        .post(format!("{}/public/v1/submit/{path}", stack.base_url))
        .header("X-Stamp-Attested", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(stamp.to_string()))
        .body(body)
        .send()
        .await
        .unwrap();
    raw(r).await
}

async fn stamp_login(
    stack: &Stack,
    key: &TurnkeyP256ApiKey,
    public: &str,
    seconds: &str,
    invalidate: bool,
) -> RawResponse {
    let p = json!({"publicKey": public, "expirationSeconds": seconds, "invalidateExisting": invalidate});
    submit(stack, key, &stack.organization_id, "stamp_login", "ACTIVITY_TYPE_STAMP_LOGIN", p).await
}

#[tokio::test]
async fn stamp_login_sessions_expire_and_invalidate_existing_removes_earlier_ones() {
    let stack = Stack::start().await;
    let root = stack.api_key();
    let org = stack.organization_id.clone();
    let whoami = |key: TurnkeyP256ApiKey| {
        let client = stack.client_with(key);
        let org = org.clone();
        async move { client.get_whoami(GetWhoamiRequest { organization_id: org }).await }
    };

    let copy = |k: &TurnkeyP256ApiKey| TurnkeyP256ApiKey::from_strings(hex::encode(k.private_key()), None).unwrap();
    // A 2-second session stamps, then fails with 401 "expired".
    let (short, short_public, _) = session_key();
    let r = stamp_login(&stack, &root, &short_public, "2", false).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let jwt = r.json["activity"]["result"]["stampLoginResult"]["session"].as_str().unwrap().to_string();
    let claims = session_claims(&stack, &jwt).await;
    assert_eq!(
        (claims["user_id"].as_str(), claims["public_key"].as_str()),
        (Some(stack.user_id.as_str()), Some(short_public.as_str()))
    );
    let exp = claims["exp"].as_u64().unwrap();
    let now = (Stack::now_ms() / 1000) as u64;
    assert!((now..=now + 3).contains(&exp), "exp {exp} now {now}");
    assert_eq!(
        whoami(TurnkeyP256ApiKey::from_strings(hex::encode(short.private_key()), None).unwrap()).await.unwrap().user_id,
        stack.user_id
    );
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let short_again = copy(&short);
    refused(whoami(short).await, 401, "API_KEY_EXPIRED", "expired");

    // Too long: refused by the enclave's maximum, nothing recorded.
    let (_, long_public, _) = session_key();
    let before = stack.activity_count(&root, &org).await;
    let r = stamp_login(&stack, &root, &long_public, "604801", false).await;
    refused_raw(&r, 400, "REQUEST_INVALID", "expirationSeconds");
    assert_eq!(stack.activity_count(&root, &org).await, before);

    // invalidateExisting removes the earlier session keys, not the API key.
    let (first, first_public, _) = session_key();
    assert_eq!(stamp_login(&stack, &root, &first_public, "600", false).await.status, 200);
    let first_copy = TurnkeyP256ApiKey::from_strings(hex::encode(first.private_key()), None).unwrap();
    assert!(whoami(first_copy).await.is_ok());
    // That login removed the user's expired session, in the enclave's state and in the
    // gateway's records alike: it is no longer a key at all.
    refused(whoami(short_again).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");
    let (second, second_public, _) = session_key();
    assert_eq!(stamp_login(&stack, &root, &second_public, "600", true).await.status, 200);
    // A key that is already a credential: refused (the root API key, or the live session key
    // without invalidateExisting), and nothing recorded.
    let before = stack.activity_count(&root, &org).await;
    for (key, invalidate) in [(stack.api_public_key.clone(), true), (second_public.clone(), false)] {
        let r = stamp_login(&stack, &root, &key, "600", invalidate).await;
        refused_raw(&r, 400, "REQUEST_INVALID", "already a credential");
    }
    assert_eq!(stack.activity_count(&root, &org).await, before);
    refused(whoami(first).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");
    assert!(whoami(copy(&second)).await.is_ok());
    assert!(whoami(stack.api_key()).await.is_ok());

    // A session key may itself log in again (a stamp_login by the session's user): stamped by
    // the live session key `second`, not by the API key, it opens a third session for the same
    // user whose JWT verifies and whose key stamps; `second` stays (no invalidateExisting).
    let (third, third_public, _) = session_key();
    let before = stack.activities(&root, &org).await.len();
    let r = stamp_login(&stack, &second, &third_public, "600", false).await;
    assert_eq!(r.status, 200, "a session key logging in again: {}", r.text);
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{}", r.text);
    let jwt = r.json["activity"]["result"]["stampLoginResult"]["session"].as_str().unwrap().to_string();
    let claims = session_claims(&stack, &jwt).await;
    assert_eq!(
        (claims["user_id"].as_str(), claims["organization_id"].as_str(), claims["public_key"].as_str()),
        (Some(stack.user_id.as_str()), Some(org.as_str()), Some(third_public.as_str()))
    );
    let activities = stack.activities(&root, &org).await;
    assert_eq!(activities.len(), before + 1);
    assert_eq!(activities[0]["type"], "ACTIVITY_TYPE_STAMP_LOGIN", "{}", activities[0]);
    assert_eq!(whoami(third).await.unwrap().user_id, stack.user_id);
    assert_eq!(whoami(copy(&second)).await.unwrap().user_id, stack.user_id);

    let client = stack.client();
    let (_, bad_public, _) = session_key();
    let bad = StampLoginIntent {
        public_key: bad_public[..20].to_string(),
        expiration_seconds: None,
        invalidate_existing: None,
        session_profile_id: None,
    };
    refused(client.stamp_login(org.clone(), Stack::now_ms(), bad).await, 400, "REQUEST_INVALID", "publicKey");
    session_profiles(&stack).await;
}

/// Session profiles: made through the activity path and read back; a login that names one gets
/// a session no longer than the profile's lifetime, whose JWT carries the profile's name as its
/// `session_type`, its id and its scope; a login naming no profile of the organization is refused.
async fn session_profiles(stack: &Stack) {
    use turnkey_client::generated::{CreateSessionProfileIntent, GetSessionProfileRequest, GetSessionProfilesRequest};
    let (client, org) = (stack.client(), stack.organization_id.clone());
    let intent = |name: &str, scope: &str, seconds: Option<&str>| CreateSessionProfileIntent {
        session_profile_name: name.into(),
        scope: scope.into(),
        expiration_seconds: seconds.map(String::from),
        notes: Some("signing only".into()),
    };
    let scope = "activity.type == 'ACTIVITY_TYPE_CREATE_USER_TAG'";
    let made = client
        .create_session_profile(org.clone(), client.current_timestamp(), intent("signer", scope, Some("60")))
        .await;
    let id = made.unwrap().result.session_profile_id;
    let r = client
        .create_session_profile(org.clone(), client.current_timestamp(), intent("bad", "activity.resource ==", None))
        .await;
    refused(r, 400, "REQUEST_INVALID", "invalid scope");
    let read = client
        .get_session_profile(GetSessionProfileRequest { organization_id: org.clone(), session_profile_id: id.clone() })
        .await
        .unwrap()
        .session_profile
        .unwrap();
    assert_eq!(
        (read.session_profile_name.as_str(), read.scope.as_str(), read.expiration_seconds.as_deref()),
        ("signer", scope, Some("60"))
    );
    let all = client.get_session_profiles(GetSessionProfilesRequest { organization_id: org.clone() }).await.unwrap();
    assert_eq!(all.session_profiles.len(), 1);

    // A login asking for an hour under the profile gets its minute, and the profile's claims.
    let (scoped, public, _) = session_key();
    let p = json!({"publicKey": public, "expirationSeconds": "3600", "sessionProfileId": id});
    let r = submit(stack, &stack.api_key(), &org, "stamp_login", "ACTIVITY_TYPE_STAMP_LOGIN", p).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let jwt = r.json["activity"]["result"]["stampLoginResult"]["session"].as_str().unwrap().to_string();
    let claims = session_claims(stack, &jwt).await;
    let now = (Stack::now_ms() / 1000) as u64;
    let exp = claims["exp"].as_u64().unwrap();
    assert!((now..=now + 61).contains(&exp), "exp {exp} now {now}");
    assert_eq!(
        (claims["session_type"].as_str(), claims["session_profile_id"].as_str(), claims["scope"].as_str()),
        (Some("signer"), Some(id.as_str()), Some(scope))
    );
    // The session does what its scope allows, and the enclave refuses the rest, though its user
    // is the root quorum; it still reads.
    let tag = json!({"userTagName": "by the session", "userIds": []});
    let r = submit(stack, &scoped, &org, "create_user_tag", "ACTIVITY_TYPE_CREATE_USER_TAG", tag).await;
    assert_eq!(r.status, 200, "{}", r.text);
    stack.refusals_accounted();
    let key_tag = json!({"privateKeyTagName": "not in scope", "privateKeyIds": []});
    let r =
        submit(stack, &scoped, &org, "create_private_key_tag", "ACTIVITY_TYPE_CREATE_PRIVATE_KEY_TAG", key_tag).await;
    refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "request not authorized");
    stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", RefusalReason::PolicyDenied);
    let refusals = stack.audit("refuse", "apply_activity");
    let last = refusals.last().expect("the enclave's refusal");
    assert!(last["reason"].as_str().unwrap_or_default().starts_with("SESSION_PROFILE_SCOPE"), "{last}");
    // Nor does it vote: an activity waiting for the root's approval (Bob's tag, under a policy
    // that needs it) is neither rejected nor approved by the scoped session, and the root's own
    // key then approves it.
    let bob_key = TurnkeyP256ApiKey::generate();
    let bob = json!({"users": [{"userName": "bob", "userTags": [], "authenticators": [], "oauthProviders": [],
        "apiKeys": [{"apiKeyName": "bob", "publicKey": hex::encode(bob_key.compressed_public_key()), "curveType": "API_KEY_CURVE_P256"}]}]});
    let r = submit(stack, &stack.api_key(), &org, "create_users", "ACTIVITY_TYPE_CREATE_USERS_V4", bob).await;
    let bob_id = r.json["activity"]["result"]["createUsersResult"]["userIds"][0].as_str().unwrap().to_string();
    let policy = json!({"policyName": "bob tags with the root's approval", "effect": "EFFECT_ALLOW",
        "condition": "activity.type == 'ACTIVITY_TYPE_CREATE_USER_TAG'",
        "consensus": format!("approvers.any(user, user.id == '{}')", stack.user_id), "notes": ""});
    let r = submit(stack, &stack.api_key(), &org, "create_policy", "ACTIVITY_TYPE_CREATE_POLICY_V3", policy).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let tag = json!({"userTagName": "bob's", "userIds": [bob_id]});
    let r = submit(stack, &bob_key, &org, "create_user_tag", "ACTIVITY_TYPE_CREATE_USER_TAG", tag).await;
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_CONSENSUS_NEEDED", "{}", r.text);
    let fingerprint = r.json["activity"]["fingerprint"].as_str().unwrap().to_string();
    let scoped_copy = TurnkeyP256ApiKey::from_strings(hex::encode(scoped.private_key()), None).unwrap();
    for (path, ty) in
        [("reject_activity", "ACTIVITY_TYPE_REJECT_ACTIVITY"), ("approve_activity", "ACTIVITY_TYPE_APPROVE_ACTIVITY")]
    {
        stack.refusals_accounted();
        let r = submit(stack, &scoped_copy, &org, path, ty, json!({"fingerprint": fingerprint})).await;
        stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", RefusalReason::NotApproved);
    }
    let r = submit(
        stack,
        &stack.api_key(),
        &org,
        "approve_activity",
        "ACTIVITY_TYPE_APPROVE_ACTIVITY",
        json!({"fingerprint": fingerprint}),
    )
    .await;
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{}", r.text);
    let whoami = stack.client_with(scoped).get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await;
    assert_eq!(whoami.unwrap().user_id, stack.user_id);
    let (_, public, _) = session_key();
    let p = json!({"publicKey": public, "sessionProfileId": "00000000-0000-4000-8000-000000000000"});
    let r = submit(stack, &stack.api_key(), &org, "stamp_login", "ACTIVITY_TYPE_STAMP_LOGIN", p).await;
    refused_raw(&r, 400, "REQUEST_INVALID", "sessionProfileId names no session profile");
}

#[tokio::test]
async fn read_write_session_bundle_opens_with_the_target_key_and_a_parent_logs_a_sub_organization_user_in() {
    let (stack, _) = stack_with_fake_x().await;
    let root = stack.api_key();
    let org = stack.organization_id.clone();

    // create_read_write_session: the enclave makes the key and encrypts it to the target key.
    let target = p256::SecretKey::from_slice(&[0x22; 32]).unwrap();
    let target_hex = hex::encode(target.public_key().to_encoded_point(false).as_bytes());
    let p = json!({"targetPublicKey": target_hex, "apiKeyName": "browser session", "expirationSeconds": "900"});
    let r =
        submit(&stack, &root, &org, "create_read_write_session", "ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2", p).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let result = &r.json["activity"]["result"]["createReadWriteSessionResultV2"];
    assert_eq!(result["userId"], stack.user_id);
    assert_eq!(result["organizationId"], org);
    assert_eq!(result["organizationName"], "e2e");
    // Opened by the test's own HPKE (not coffer_crypto); checked below against the stored key.
    let secret = independent::open_credential_bundle(result["credentialBundle"].as_str().unwrap(), &[0x22; 32]);
    let session = TurnkeyP256ApiKey::from_strings(hex::encode(secret.as_slice()), None).unwrap();
    let api_key_id = result["apiKeyId"].as_str().unwrap();
    let body = json!({"organizationId": org, "apiKeyId": api_key_id});
    let got = stack.post_raw("/public/v1/query/get_api_key", body.to_string().as_bytes(), Some(&root)).await;
    assert_eq!(
        got.json["apiKey"]["credential"]["publicKey"],
        hex::encode(session.compressed_public_key()),
        "{}",
        got.text
    );
    assert_eq!(got.json["apiKey"]["credential"]["type"], "CREDENTIAL_TYPE_READ_WRITE_SESSION_KEY_P256");
    assert_eq!(got.json["apiKey"]["apiKeyName"], "browser session");
    let whoami =
        stack.client_with(session).get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await.unwrap();
    assert_eq!(whoami.user_id, stack.user_id);

    // A sub-organization whose root user has an X identity (attached by claims).
    let claims = json!({"iss": stack.base_url, "sub": X_USER, "aud": CLIENT_ID});
    let sub = json!({"subOrganizationName": "player-1", "rootQuorumThreshold": 1, "rootUsers": [{"userName": "player",
        "apiKeys": [], "authenticators": [], "oauthProviders": [{"providerName": "x", "oidcClaims": claims}]}]});
    let r =
        submit(&stack, &root, &org, "create_sub_organization", "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8", sub).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let sub_result = &r.json["activity"]["result"]["createSubOrganizationResultV8"];
    let sub_org = sub_result["subOrganizationId"].as_str().unwrap().to_string();
    let player = sub_result["rootUserIds"][0].as_str().unwrap().to_string();

    // The parent's app exchanges the code (in the parent) and logs the player in (in the sub-org).
    let create = CreateOauth2CredentialIntent {
        provider: Oauth2Provider::X,
        client_id: CLIENT_ID.into(),
        encrypted_client_secret: encrypted_secret(&stack, CLIENT_SECRET).await,
    };
    let client = stack.client();
    let credential_id = client
        .create_oauth2_credential(org.clone(), Stack::now_ms(), create)
        .await
        .unwrap()
        .result
        .oauth2_credential_id;
    let (player_key, player_public, nonce) = session_key();
    let exchange = Oauth2AuthenticateIntent {
        oauth2_credential_id: credential_id,
        auth_code: AUTH_CODE.into(),
        redirect_uri: REDIRECT.into(),
        code_verifier: VERIFIER.into(),
        nonce,
        bearer_token_target_public_key: None,
    };
    let token = client.oauth2_authenticate(org.clone(), Stack::now_ms(), exchange).await.unwrap().result.oidc_token;
    let p = json!({"oidcToken": token, "publicKey": player_public});
    let r = submit(&stack, &root, &sub_org, "oauth_login", "ACTIVITY_TYPE_OAUTH_LOGIN", p).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let jwt = r.json["activity"]["result"]["oauthLoginResult"]["session"].as_str().unwrap();
    let claims = session_claims(&stack, jwt).await;
    assert_eq!(
        (claims["user_id"].as_str(), claims["organization_id"].as_str()),
        (Some(player.as_str()), Some(sub_org.as_str()))
    );
    let whoami =
        stack.client_with(player_key).get_whoami(GetWhoamiRequest { organization_id: sub_org.clone() }).await.unwrap();
    assert_eq!(whoami.user_id, player);

    // @turnkey/core's loginWithOauth: stamp_login stamped by the new session key itself, attested
    // by an OIDC token whose nonce binds that key (X-Stamp-Attested), in the sub-organization.
    let (attested_key, attested_public, nonce) = session_key();
    let exchange = Oauth2AuthenticateIntent {
        oauth2_credential_id: client
            .list_oauth2_credentials(ListOauth2CredentialsRequest { organization_id: org.clone() })
            .await
            .unwrap()
            .oauth2_credentials[0]
            .oauth2_credential_id
            .clone(),
        auth_code: AUTH_CODE.into(),
        redirect_uri: REDIRECT.into(),
        code_verifier: VERIFIER.into(),
        nonce,
        bearer_token_target_public_key: None,
    };
    let attesting = client.oauth2_authenticate(org.clone(), Stack::now_ms(), exchange).await.unwrap().result.oidc_token;
    let attested_post = |path: &'static str, ty: &'static str, params: Value, token: String, key: TurnkeyP256ApiKey| {
        attested_submit(&stack, sub_org.clone(), path, ty, params, token, key)
    };
    let copy = |k: &TurnkeyP256ApiKey| TurnkeyP256ApiKey::from_strings(hex::encode(k.private_key()), None).unwrap();
    // Only stamp_login: anything else is refused.
    let r = attested_post(
        "create_wallet",
        "ACTIVITY_TYPE_CREATE_WALLET",
        json!({"walletName": "w", "accounts": []}),
        attesting.clone(),
        copy(&attested_key),
    )
    .await;
    refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "an attested stamp (X-Stamp-Attested) may only submit stamp_login");
    // A token bound to another key: refused.
    let (other, _, _) = session_key();
    let r = attested_post(
        "stamp_login",
        "ACTIVITY_TYPE_STAMP_LOGIN",
        json!({"publicKey": hex::encode(other.compressed_public_key())}),
        attesting.clone(),
        copy(&other),
    )
    .await;
    refused_raw(&r, 401, "SIGNATURE_INVALID", "the OIDC token's nonce is not the SHA-256 of the stamp's public key");
    let r = attested_post(
        "stamp_login",
        "ACTIVITY_TYPE_STAMP_LOGIN",
        json!({"publicKey": attested_public, "expirationSeconds": "900"}),
        attesting,
        copy(&attested_key),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let jwt = r.json["activity"]["result"]["stampLoginResult"]["session"].as_str().unwrap();
    assert_eq!(session_claims(&stack, jwt).await["user_id"], player);
    let whoami = stack
        .client_with(attested_key)
        .get_whoami(GetWhoamiRequest { organization_id: sub_org.clone() })
        .await
        .unwrap();
    assert_eq!(whoami.user_id, player);

    // Still "parents read, not act" for everything else.
    let r = submit(
        &stack,
        &root,
        &sub_org,
        "create_policy",
        "ACTIVITY_TYPE_CREATE_POLICY_V3",
        json!({"policyName": "p", "effect": "EFFECT_ALLOW", "consensus": "true", "condition": "true"}),
    )
    .await;
    refused_raw(&r, 403, "REQUEST_NOT_AUTHORIZED", "may read a sub-organization but not act in it");
}

/// One auth proxy call as a browser makes it.
async fn proxy_post(
    stack: &Stack,
    path: &str,
    config_id: Option<&str>,
    origin: Option<&str>,
    body: &str,
) -> reqwest::Response {
    let mut req =
        reqwest::Client::new().post(format!("http://127.0.0.1:{}{path}", stack.auth_proxy_port)).body(body.to_string());
    if let Some(id) = config_id {
        // Any case: HTTP header names are case-insensitive.
        req = req.header("x-AUTH-proxy-config-ID", id);
    }
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn the_auth_proxy_serves_login_settings_cors_and_the_proxied_oauth_flow() {
    let (base, _) = fake_x().await;
    let (token_url, me_url) = (format!("{base}/token"), format!("{base}/me"));
    let stack = Stack::start_with(&[
        ("COFFER_OAUTH2_X_TOKEN_URL", &token_url),
        ("COFFER_OAUTH2_X_USERINFO_URL", &me_url),
        ("COFFER_AUTH_PROXY_RATE_LIMIT_PER_CONFIG", "15"),
        ("COFFER_AUTH_PROXY_RATE_LIMIT_PER_IP", "0"),
    ])
    .await;
    let root = stack.api_key();
    let org = stack.organization_id.clone();
    const APP: &str = "https://app.example";

    // Before anything is configured: an unknown config id is a JSON 401.
    let r = proxy_post(&stack, "/v1/wallet_kit_config", Some("no-such-config"), None, "{}").await;
    refused_raw(&raw(r).await, 401, "UNAUTHENTICATED", "unknown or disabled auth proxy config id");

    let r = submit(&stack, &root, &org, "enable_auth_proxy", "ACTIVITY_TYPE_ENABLE_AUTH_PROXY", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let proxy_user = r.json["activity"]["result"]["enableAuthProxyResult"]["userId"].as_str().unwrap().to_string();
    let r = submit(&stack, &root, &org, "enable_auth_proxy", "ACTIVITY_TYPE_ENABLE_AUTH_PROXY", json!({})).await;
    refused_raw(&r, 400, "REQUEST_INVALID", "the auth proxy is already enabled");
    for (bad, needle) in [
        (json!({"allowedAuthMethods": ["telepathy"]}), "invalid allowedAuthMethods entry \"telepathy\""),
        (json!({"allowedOrigins": ["*"]}), "invalid allowedOrigins entry \"*\""),
        (json!({"otpLength": 3}), "invalid otpLength: 6 to 9"),
    ] {
        let r = submit(
            &stack,
            &root,
            &org,
            "update_auth_proxy_config",
            "ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG",
            bad.clone(),
        )
        .await;
        refused_raw(&r, 400, "REQUEST_INVALID", needle);
    }
    let settings = json!({
        "allowedOrigins": [APP],
        "allowedAuthMethods": ["passkey", "email"],
        "walletKitSettings": {"enabledSocialProviders": ["x", "discord"], "oauthClientIds": {"x": CLIENT_ID}, "oauthRedirectUrl": REDIRECT},
        "sessionExpirationSeconds": 1200,
        "otpLength": 8,
    });
    let r = submit(&stack, &root, &org, "update_auth_proxy_config", "ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG", settings)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let config_id =
        r.json["activity"]["result"]["updateAuthProxyConfigResult"]["configId"].as_str().unwrap().to_string();
    let body = json!({"organizationId": org});
    let got =
        stack.post_raw("/public/v1/query/coffer_get_auth_proxy_config", body.to_string().as_bytes(), Some(&root)).await;
    assert_eq!(got.json["authProxyConfig"]["configId"], config_id, "{}", got.text);
    assert_eq!(got.json["authProxyConfig"]["userId"], proxy_user);
    assert!(!got.text.contains("sealedKey"));
    let configs =
        stack.post_raw("/public/v1/query/get_organization_configs", body.to_string().as_bytes(), Some(&root)).await;
    assert!(configs.text.contains("FEATURE_NAME_AUTH_PROXY"), "{}", configs.text);

    // wallet_kit_config: no body at all, as @turnkey/core sends it, from an allowed origin. The
    // configuration sets no otpAlphanumeric: the interface's default (alphanumeric) is served.
    let r = proxy_post(&stack, "/v1/wallet_kit_config", Some(&config_id), Some(APP), "").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], APP);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"enabledProviders": ["passkey", "email", "x", "discord"], "sessionExpirationSeconds": "1200",
               "organizationId": org, "oauthClientIds": {"x": CLIENT_ID}, "oauthRedirectUrl": REDIRECT,
               "otpAlphanumeric": true, "otpLength": "8"})
    );
    let r = proxy_post(&stack, "/v1/wallet_kit_client_params", Some(&config_id), None, "{}").await;
    assert_eq!(r.json::<Value>().await.unwrap(), json!({}));
    let r = proxy_post(&stack, "/v1/wallet_kit_config", Some(&config_id), None, "[1]").await;
    refused_raw(&raw(r).await, 400, "REQUEST_INVALID", "the request body must be a JSON object");
    let huge = format!("{{\"x\":\"{}\"}}", "a".repeat(100 * 1024));
    let r = proxy_post(&stack, "/v1/wallet_kit_config", Some(&config_id), None, &huge).await;
    refused_raw(&raw(r).await, 413, "REQUEST_INVALID", "request body too large");
    // Another origin: refused, and never a wildcard.
    let r = proxy_post(&stack, "/v1/wallet_kit_config", Some(&config_id), Some("https://evil.example"), "{}").await;
    assert!(r.headers().get("access-control-allow-origin").is_none());
    refused_raw(
        &raw(r).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "origin https://evil.example is not allowed by this auth proxy configuration",
    );
    // Preflights carry no config id: allowed for an origin an enabled config lists.
    let preflight = |origin: &'static str| {
        reqwest::Client::new()
            .request(reqwest::Method::OPTIONS, format!("http://127.0.0.1:{}/v1/oauth_login", stack.auth_proxy_port))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "content-type,x-auth-proxy-config-id")
            .send()
    };
    let r = preflight(APP).await.unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(r.headers()["access-control-allow-origin"], APP);
    let allowed = r.headers()["access-control-allow-headers"].to_str().unwrap().to_ascii_lowercase();
    assert!(
        allowed.contains("x-auth-proxy-config-id")
            && allowed.contains("content-type")
            && allowed.contains("x-captcha-token")
    );
    let r = preflight("https://evil.example").await.unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    refused_raw(
        &raw(r).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "origin https://evil.example is not allowed by any auth proxy configuration",
    );
    // The first otp_verify sends the code in plaintext, which the gateway never takes.
    let r =
        proxy_post(&stack, "/v1/otp_verify", Some(&config_id), Some(APP), r#"{"otpId":"x","otpCode":"123456"}"#).await;
    refused_raw(&raw(r).await, 501, "REQUEST_INVALID", "use otp_verify_v2");
    let r = proxy_post(&stack, "/v1/otp_init_v2", Some(&config_id), Some(APP), "{}").await;
    refused_raw(&raw(r).await, 400, "REQUEST_INVALID", "otpType is required");

    // The proxied OAuth flow: an X credential, a player sub-organization with that identity.
    let create = CreateOauth2CredentialIntent {
        provider: Oauth2Provider::X,
        client_id: CLIENT_ID.into(),
        encrypted_client_secret: encrypted_secret(&stack, CLIENT_SECRET).await,
    };
    stack.client().create_oauth2_credential(org.clone(), Stack::now_ms(), create).await.unwrap();
    let claims = json!({"iss": stack.base_url, "sub": X_USER, "aud": CLIENT_ID});
    let sub = json!({"subOrganizationName": "player-2", "rootQuorumThreshold": 1, "rootUsers": [{"userName": "player",
        "apiKeys": [], "authenticators": [], "oauthProviders": [{"providerName": "x", "oidcClaims": claims}]}]});
    let r =
        submit(&stack, &root, &org, "create_sub_organization", "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8", sub).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let sub_org = r.json["activity"]["result"]["createSubOrganizationResultV8"]["subOrganizationId"]
        .as_str()
        .unwrap()
        .to_string();
    let player =
        r.json["activity"]["result"]["createSubOrganizationResultV8"]["rootUserIds"][0].as_str().unwrap().to_string();

    let (player_key, player_public, nonce) = session_key();
    let exchange = json!({"provider": "OAUTH2_PROVIDER_X", "authCode": AUTH_CODE, "redirectUri": REDIRECT,
        "codeVerifier": VERIFIER, "nonce": nonce, "clientId": CLIENT_ID});
    let r = proxy_post(&stack, "/v1/oauth2_authenticate", Some(&config_id), Some(APP), &exchange.to_string()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], APP);
    let token = r.json::<Value>().await.unwrap()["oidcToken"].as_str().unwrap().to_string();
    let unknown_client = json!({"provider": "OAUTH2_PROVIDER_DISCORD", "authCode": AUTH_CODE, "redirectUri": REDIRECT,
        "codeVerifier": VERIFIER, "nonce": nonce, "clientId": CLIENT_ID});
    let r = proxy_post(&stack, "/v1/oauth2_authenticate", Some(&config_id), None, &unknown_client.to_string()).await;
    refused_raw(&raw(r).await, 404, "OAUTH2_CREDENTIAL_NOT_FOUND", "no oauth2 credential for OAUTH2_PROVIDER_DISCORD");

    let r = proxy_post(
        &stack,
        "/v1/account",
        Some(&config_id),
        None,
        &json!({"filterType": "OIDC_TOKEN", "filterValue": token}).to_string(),
    )
    .await;
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"organizationId": sub_org}));
    let r = proxy_post(
        &stack,
        "/v1/account",
        Some(&config_id),
        None,
        &json!({"filterType": "EMAIL", "filterValue": "nobody@example.com"}).to_string(),
    )
    .await;
    // An email lookup needs the verification token of the address (tests/tests/otp.rs).
    refused_raw(&raw(r).await, 403, "REQUEST_NOT_AUTHORIZED", "an EMAIL lookup needs the verificationToken");
    let r = proxy_post(
        &stack,
        "/v1/account",
        Some(&config_id),
        None,
        &json!({"filterType": "USERNAME", "filterValue": "nobody"}).to_string(),
    )
    .await;
    // Nor a lookup by user name, which `@turnkey/core` sets to the email (tests/tests/otp.rs).
    refused_raw(&raw(r).await, 403, "REQUEST_NOT_AUTHORIZED", "an anonymous lookup by USERNAME is not served");

    let r = proxy_post(
        &stack,
        "/v1/oauth_login",
        Some(&config_id),
        Some(APP),
        &json!({"oidcToken": token, "publicKey": player_public}).to_string(),
    )
    .await;
    assert_eq!(r.status(), 200);
    let jwt = r.json::<Value>().await.unwrap()["session"].as_str().unwrap().to_string();
    let session = session_claims(&stack, &jwt).await;
    assert_eq!(
        (session["user_id"].as_str(), session["organization_id"].as_str()),
        (Some(player.as_str()), Some(sub_org.as_str()))
    );
    let lifetime = session["exp"].as_i64().unwrap() - (Stack::now_ms() / 1000) as i64;
    assert!((1190..=1200).contains(&lifetime), "the config's session length: {lifetime}");
    let whoami =
        stack.client_with(player_key).get_whoami(GetWhoamiRequest { organization_id: sub_org.clone() }).await.unwrap();
    assert_eq!(whoami.user_id, player);
    // Both proxied calls are activities of the proxy user.
    let list = |o: &str| json!({"organizationId": o, "filterByType": ["ACTIVITY_TYPE_OAUTH2_AUTHENTICATE", "ACTIVITY_TYPE_OAUTH_LOGIN"]});
    let a = stack.post_raw("/public/v1/query/list_activities", list(&org).to_string().as_bytes(), Some(&root)).await;
    assert!(
        a.json["activities"].as_array().unwrap().iter().any(|x| x["votes"][0]["userId"] == proxy_user),
        "{}",
        a.text
    );
    let a =
        stack.post_raw("/public/v1/query/list_activities", list(&sub_org).to_string().as_bytes(), Some(&root)).await;
    assert_eq!(a.json["activities"].as_array().unwrap().len(), 1, "{}", a.text);

    // A burst past the config's rate (15 per second), all 40 calls at once: some are refused
    // with a JSON 429 (RATE_LIMIT_EXCEEDED) and a Retry-After, and after waiting that long the
    // call passes again. Existence, not a count: how many pass depends on the machine's speed.
    // Calls that do work for a visitor (a lookup), not the public wallet_kit_config, which is
    // never charged to the configuration.
    let url = format!("http://127.0.0.1:{}/v1/account", stack.auth_proxy_port);
    let lookup = json!({"filterType": "PUBLIC_KEY", "filterValue": "02".to_string() + &"ab".repeat(32)}).to_string();
    let mut burst = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let (url, id, lookup) = (url.clone(), config_id.clone(), lookup.clone());
        burst.spawn(async move {
            let r = reqwest::Client::new()
                .post(url)
                .header("x-auth-proxy-config-id", id)
                .body(lookup)
                .send()
                .await
                .unwrap();
            let header = |name: &str| r.headers().get(name).map(|v| v.to_str().unwrap().to_string());
            let (retry_after, content_type) = (header("retry-after"), header("content-type"));
            let status = r.status().as_u16();
            let text = r.text().await.unwrap();
            (retry_after, RawResponse { status, content_type, json: Value::Null, text })
        });
    }
    let mut wait = 0;
    let mut limited = 0;
    while let Some(joined) = burst.join_next().await {
        let (retry_after, r) = joined.unwrap();
        if r.status == 200 {
            continue;
        }
        refused_raw(&r, 429, "RATE_LIMIT_EXCEEDED", "rate limit exceeded for this auth proxy configuration");
        let secs: u64 = retry_after.expect("a 429 carries Retry-After").parse().expect("Retry-After in whole seconds");
        assert!(secs >= 1, "Retry-After: {secs}");
        wait = wait.max(secs);
        limited += 1;
    }
    assert!(limited > 0, "40 calls at once must pass a limit of 15 per second");
    // The public settings are served meanwhile: they spend nothing of the configuration's rate.
    for _ in 0..40 {
        let r = proxy_post(&stack, "/v1/wallet_kit_config", Some(&config_id), None, "{}").await;
        assert_eq!(r.status(), 200, "wallet_kit_config: {:?}", r.text().await);
    }
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let r = proxy_post(&stack, "/v1/account", Some(&config_id), None, &lookup).await;
    assert_eq!(r.status(), 200, "after Retry-After: {:?}", r.text().await);

    // Disabled: the config id no longer opens anything.
    let r = submit(&stack, &root, &org, "disable_auth_proxy", "ACTIVITY_TYPE_DISABLE_AUTH_PROXY", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = proxy_post(&stack, "/v1/wallet_kit_config", Some(&config_id), None, "{}").await;
    refused_raw(&raw(r).await, 401, "UNAUTHENTICATED", "unknown or disabled auth proxy config id");
}

/// [`refused`] (status, error code and message) and the enclave's typed reason
/// ([`Stack::refused_for`]: its new audit refusal lines name `reason`) of one official-client answer.
#[track_caller]
fn refused_by_enclave<T: std::fmt::Debug>(
    stack: &Stack,
    r: Result<T, TurnkeyClientError>,
    status: u16,
    code: &str,
    needle: &str,
    reason: RefusalReason,
) {
    let (got, body) = match r {
        Err(TurnkeyClientError::UnexpectedHttpStatus(got, body)) => (got, body),
        other => panic!("expected HTTP {status} ({code}, {needle:?}), got {other:?}"),
    };
    refused(Err::<(), _>(TurnkeyClientError::UnexpectedHttpStatus(got, body.clone())), status, code, needle);
    stack.refused_for(Err::<(), _>(TurnkeyClientError::UnexpectedHttpStatus(got, body)), status, code, reason);
}

/// A raw answer read to the end (status, content type, JSON body), for [`refused_raw`].
async fn raw(r: reqwest::Response) -> RawResponse {
    let status = r.status().as_u16();
    let content_type = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    let text = r.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    RawResponse { status, content_type, json, text }
}

/// `query/<path>` for `org` as a read-only session's holder sends it: `X-Session`, no stamp.
async fn x_session_query(stack: &Stack, path: &str, org: &str, session: &str) -> RawResponse {
    let r = reqwest::Client::new()
        .post(format!("{}/public/v1/query/{path}", stack.base_url))
        .header("X-Session", session)
        .body(json!({ "organizationId": org }).to_string())
        .send()
        .await
        .unwrap();
    raw(r).await
}

/// `whoami` with `session` as `X-Session` answers 200 with this user of this organization.
#[track_caller]
fn reads_as(r: &RawResponse, user: &str, org: &str) {
    assert_eq!(r.status, 200, "the X-Session should read: {}", r.text);
    assert_eq!((r.json["userId"].as_str(), r.json["organizationId"].as_str()), (Some(user), Some(org)), "{}", r.text);
}

/// The gateway's refusal of an `X-Session` for `why` (a 401 `SESSION_INVALID` naming it).
#[track_caller]
fn session_refused(r: &RawResponse, why: &str) {
    refused_raw(r, 401, "SESSION_INVALID", &format!("read-only session (X-Session): {why}"));
}

/// The session JWT's claims as `jsonwebtoken` reads and validates them: `exp` required and not
/// past (no leeway). The signature is not this check's (Turnkey's session JWTs are ES256 over a
/// digest, which `independent::verify_session_jwt` verifies).
fn jsonwebtoken_claims(jwt: &str) -> Result<Value, jsonwebtoken::errors::Error> {
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    validation.insecure_disable_signature_validation();
    validation.leeway = 0;
    validation.validate_aud = false;
    validation.set_required_spec_claims(&["exp"]);
    jsonwebtoken::decode::<Value>(jwt, &jsonwebtoken::DecodingKey::from_secret(&[]), &validation).map(|d| d.claims)
}

/// `header.payload` of `jwt` signed by `key` the way the notarizer signs session JWTs (ECDSA
/// P-256 over SHA-256(SHA-256(`header.payload`)), `r ‖ s` base64url): a genuine signature,
/// another key's.
fn signed_by(jwt: &str, key: &p256::ecdsa::SigningKey) -> String {
    use p256::ecdsa::signature::hazmat::PrehashSigner;
    let (input, _) = jwt.rsplit_once('.').unwrap();
    let digest = sha2::Sha256::digest(sha2::Sha256::digest(input.as_bytes()));
    let signature: p256::ecdsa::Signature = key.sign_prehash(&digest).unwrap();
    format!("{input}.{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature.to_bytes()))
}

/// A read-only session (`create_read_only_session`, the official client) is a bearer credential
/// for queries (`X-Session`): a JWT the enclave's notarizer signs, which the gateway checks (the
/// enclave is not asked; reads are the gateway's). It reads as its user, and it is refused, each
/// for its own reason named in the 401, when it is a read-write session's JWT, signed by another
/// key, for another organization, expired, of a deleted user, or made by a deleted key. Each
/// refusal has its twin that reads: the same token before the change, or the same claims with
/// the notarizer's signature. One stack for all cases.
#[tokio::test]
async fn x_session_reads_as_its_user_and_is_refused_for_each_reason() {
    let stack = Stack::start().await;
    let root = stack.api_key();
    let client = stack.client();
    let org = stack.organization_id.clone();
    let ts = Stack::now_ms;
    let now_secs = || (Stack::now_ms() / 1000) as i64;
    // The key a client trusts session JWTs by: the notarizer's, published with the others.
    let notarizer = get_json(&stack, "/public/v1/discovery/keys").await["notarizerPublicKey"]
        .as_str()
        .expect("a notarizerPublicKey")
        .to_string();

    // A session that expires in 8 s (a Coffer parameter: the official client's intent is
    // empty), made first so that it runs out while the other cases are checked.
    let made = now_secs();
    let p = json!({"expirationSeconds": "8"});
    let r = submit(&stack, &root, &org, "create_read_only_session", "ACTIVITY_TYPE_CREATE_READ_ONLY_SESSION", p).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let short = r.json["activity"]["result"]["createReadOnlySessionResult"]["session"].as_str().unwrap().to_string();
    let short_exp = independent::verify_session_jwt(&short, &notarizer)["exp"].as_i64().unwrap();
    assert!((made + 8..=now_secs() + 8).contains(&short_exp), "exp {short_exp}, made at {made}");
    reads_as(&x_session_query(&stack, "whoami", &org, &short).await, &stack.user_id, &org);

    // The official client's read-only session, verified with jsonwebtoken against the published
    // notarizer key; its claims name the root user, this organization and the stamping key, and
    // it lives the default 900 s.
    let before = now_secs();
    let ro = client.create_read_only_session(org.clone(), ts(), CreateReadOnlySessionIntent {}).await.unwrap().result;
    let claims = independent::verify_session_jwt(&ro.session, &notarizer);
    assert_eq!(claims["session_type"], "SESSION_TYPE_READ_ONLY");
    assert_eq!(claims["user_id"], stack.user_id);
    assert_eq!(claims["organization_id"], org);
    assert_eq!(claims["public_key"], stack.api_public_key);
    let exp = claims["exp"].as_i64().unwrap();
    assert!((before + 900..=now_secs() + 900).contains(&exp), "exp {exp}, made at {before}");
    assert_eq!(ro.session_expiry, exp as u64);
    assert_eq!((ro.user_id.as_str(), ro.organization_id.as_str()), (stack.user_id.as_str(), org.as_str()));
    assert_eq!(ro.organization_name, "e2e");
    assert_eq!(jsonwebtoken_claims(&ro.session).expect("jsonwebtoken validates exp"), claims);
    // It reads as the root user of this organization.
    let who = x_session_query(&stack, "whoami", &org, &ro.session).await;
    reads_as(&who, &stack.user_id, &org);
    assert_eq!(
        (who.json["organizationName"].as_str(), who.json["username"].as_str()),
        (Some("e2e"), Some(ro.username.as_str()))
    );

    // A read-write session's JWT: genuine (the notarizer's, this user and organization, its key
    // live and stamping), but not a read-only session. create_read_write_session answers no JWT
    // (a credential bundle); stamp_login's session is the read-write JWT a client holds.
    let target = p256::SecretKey::from_slice(&[0x33; 32]).unwrap();
    let p = json!({"targetPublicKey": hex::encode(target.public_key().to_encoded_point(false).as_bytes())});
    let r =
        submit(&stack, &root, &org, "create_read_write_session", "ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2", p).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let rw_result = &r.json["activity"]["result"]["createReadWriteSessionResultV2"];
    assert!(rw_result["credentialBundle"].is_string() && rw_result.get("session").is_none(), "{}", r.text);
    let (rw_key, rw_public, _) = session_key();
    let r = stamp_login(&stack, &root, &rw_public, "600", false).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let rw = r.json["activity"]["result"]["stampLoginResult"]["session"].as_str().unwrap().to_string();
    let rw_claims = independent::verify_session_jwt(&rw, &notarizer);
    assert_eq!(
        (rw_claims["session_type"].as_str(), rw_claims["user_id"].as_str(), rw_claims["organization_id"].as_str()),
        (Some("SESSION_TYPE_READ_WRITE"), Some(stack.user_id.as_str()), Some(org.as_str()))
    );
    let who = stack.client_with(rw_key).get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await.unwrap();
    assert_eq!(who.user_id, stack.user_id);
    session_refused(&x_session_query(&stack, "whoami", &org, &rw).await, "not a read-only session");

    // The read-only session's own claims signed by another P-256 key, in the notarizer's scheme:
    // the signature verifies with that key, and the gateway refuses it for its signer.
    let other = p256::ecdsa::SigningKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
    let forged = signed_by(&ro.session, &other);
    let other_public = hex::encode(other.verifying_key().to_encoded_point(false).as_bytes());
    assert_eq!(independent::verify_session_jwt(&forged, &other_public), claims);
    assert_ne!(forged, ro.session);
    session_refused(&x_session_query(&stack, "whoami", &org, &forged).await, "not signed by the notarizer");

    // Another organization's genuine session (org B, made by init-org like any organization):
    // it reads org B as org B's user, and not org A (whose parent B is not).
    let kp = stack.gateway_cli(&["keygen"]);
    let (pub_b, priv_b) = (kp["apiPublicKey"].as_str().unwrap(), kp["apiPrivateKey"].as_str().unwrap());
    let created = stack.gateway_cli(&["init-org", "--name", "org-b", "--api-public-key", pub_b]);
    let (org_b, user_b) = (created["organizationId"].as_str().unwrap(), created["userId"].as_str().unwrap());
    let client_b = stack.client_with(TurnkeyP256ApiKey::from_strings(priv_b, Some(pub_b)).unwrap());
    let ro_b = client_b
        .create_read_only_session(org_b.to_string(), ts(), CreateReadOnlySessionIntent {})
        .await
        .unwrap()
        .result;
    let claims_b = independent::verify_session_jwt(&ro_b.session, &notarizer);
    assert_eq!((claims_b["organization_id"].as_str(), claims_b["user_id"].as_str()), (Some(org_b), Some(user_b)));
    reads_as(&x_session_query(&stack, "whoami", org_b, &ro_b.session).await, user_b, org_b);
    session_refused(&x_session_query(&stack, "whoami", &org, &ro_b.session).await, "a session of another organization");
    for path in ["list_users", "list_wallets"] {
        session_refused(&x_session_query(&stack, path, &org, &ro_b.session).await, "a session of another organization");
    }
    // A sub-organization's session does not read its parent; the parent's reads the child.
    let sub_key = TurnkeyP256ApiKey::generate();
    let sub = json!({"subOrganizationName": "child", "rootQuorumThreshold": 1, "rootUsers": [{"userName": "child-root",
        "apiKeys": [{"apiKeyName": "k", "curveType": "API_KEY_CURVE_P256", "publicKey": hex::encode(sub_key.compressed_public_key())}],
        "authenticators": [], "oauthProviders": []}]});
    let r =
        submit(&stack, &root, &org, "create_sub_organization", "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8", sub).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let sub_result = &r.json["activity"]["result"]["createSubOrganizationResultV8"];
    let (sub_org, sub_user) =
        (sub_result["subOrganizationId"].as_str().unwrap(), sub_result["rootUserIds"][0].as_str().unwrap());
    let ro_sub = stack
        .client_with(sub_key)
        .create_read_only_session(sub_org.to_string(), ts(), CreateReadOnlySessionIntent {})
        .await
        .unwrap()
        .result;
    reads_as(&x_session_query(&stack, "whoami", sub_org, &ro_sub.session).await, sub_user, sub_org);
    session_refused(
        &x_session_query(&stack, "whoami", &org, &ro_sub.session).await,
        "a session of another organization",
    );
    let parent_reads = x_session_query(&stack, "list_users", sub_org, &ro.session).await;
    assert_eq!(parent_reads.status, 200, "{}", parent_reads.text);
    assert!(
        parent_reads.json["users"].as_array().unwrap().iter().any(|u| u["userId"] == sub_user),
        "{}",
        parent_reads.text
    );

    // A user with two keys and a read-only session made by each: deleting one key ends its
    // session (the other reads on), deleting the user ends the other.
    let (k1, k2) = (TurnkeyP256ApiKey::generate(), TurnkeyP256ApiKey::generate());
    let api_key = |name: &str, k: &TurnkeyP256ApiKey| json!({"apiKeyName": name, "curveType": "API_KEY_CURVE_P256", "publicKey": hex::encode(k.compressed_public_key())});
    let p = json!({"users": [{"userName": "reader", "apiKeys": [api_key("k1", &k1), api_key("k2", &k2)],
        "authenticators": [], "oauthProviders": [], "userTags": []}]});
    let r = submit(&stack, &root, &org, "create_users", "ACTIVITY_TYPE_CREATE_USERS_V4", p).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let reader = r.json["activity"]["result"]["createUsersResult"]["userIds"][0].as_str().unwrap().to_string();
    let k1_public = hex::encode(k1.compressed_public_key());
    let k1_client = stack.client_with(k1);
    let by_k1 = k1_client.create_read_only_session(org.clone(), ts(), CreateReadOnlySessionIntent {}).await.unwrap();
    let by_k1 = by_k1.result.session;
    let k2_client = stack.client_with(k2);
    let by_k2 = k2_client.create_read_only_session(org.clone(), ts(), CreateReadOnlySessionIntent {}).await.unwrap();
    let by_k2 = by_k2.result.session;
    for s in [&by_k1, &by_k2] {
        assert_eq!(independent::verify_session_jwt(s, &notarizer)["user_id"], reader);
        reads_as(&x_session_query(&stack, "whoami", &org, s).await, &reader, &org);
    }
    let keys = stack
        .post_raw(
            "/public/v1/query/get_api_keys",
            json!({"organizationId": org, "userId": reader}).to_string().as_bytes(),
            Some(&root),
        )
        .await;
    let k1_id = keys.json["apiKeys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["credential"]["publicKey"] == k1_public)
        .unwrap_or_else(|| panic!("k1: {}", keys.text))["apiKeyId"]
        .clone();
    let p = json!({"userId": reader, "apiKeyIds": [k1_id]});
    let r = submit(&stack, &root, &org, "delete_api_keys", "ACTIVITY_TYPE_DELETE_API_KEYS", p).await;
    assert_eq!(r.status, 200, "{}", r.text);
    session_refused(
        &x_session_query(&stack, "whoami", &org, &by_k1).await,
        "the credential that made it is gone or expired",
    );
    reads_as(&x_session_query(&stack, "whoami", &org, &by_k2).await, &reader, &org);
    assert_eq!(k2_client.get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await.unwrap().user_id, reader);
    let p = json!({"userIds": [reader]});
    let r = submit(&stack, &root, &org, "delete_users", "ACTIVITY_TYPE_DELETE_USERS", p).await;
    assert_eq!(r.status, 200, "{}", r.text);
    session_refused(&x_session_query(&stack, "whoami", &org, &by_k2).await, "its user no longer exists");

    // The high-S twin of a genuine session, (r, n - s): the same claims and a signature that
    // verifies as well with a plain ECDSA check. The enclave issues only low-S signatures and the
    // gateway refuses the twin, so one session is one string.
    let (input, signature) = ro.session.rsplit_once('.').unwrap();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let signature = p256::ecdsa::Signature::from_slice(&b64.decode(signature).unwrap()).unwrap();
    assert!(signature.normalize_s().is_none(), "the enclave's session signature is low-S: {}", ro.session);
    let twin = p256::ecdsa::Signature::from_scalars(signature.r(), -*signature.s()).unwrap();
    let twin_jwt = format!("{input}.{}", b64.encode(twin.to_bytes()));
    assert_eq!(independent::verify_session_jwt(&twin_jwt, &notarizer), claims, "(r, n - s) verifies too");
    session_refused(&x_session_query(&stack, "whoami", &org, &twin_jwt).await, "not signed by the notarizer");

    // The short session, polled until the gateway refuses it: it read only before its exp and
    // is refused as expired from then on (RFC 7519: not on or after exp), as jsonwebtoken says.
    loop {
        let sent = Stack::now_ms() as i64;
        let r = x_session_query(&stack, "whoami", &org, &short).await;
        let received = Stack::now_ms() as i64;
        if r.status == 200 {
            assert!(sent < short_exp * 1000, "read at {sent} ms, after its exp {short_exp}");
            reads_as(&r, &stack.user_id, &org);
            assert!(received < (short_exp + 5) * 1000, "still reading 5 s past its exp");
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        assert!(received >= short_exp * 1000, "refused at {received} ms, before its exp {short_exp}: {}", r.text);
        session_refused(&r, "expired");
        break;
    }
    while now_secs() <= short_exp {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    match jsonwebtoken_claims(&short) {
        Err(e) => assert_eq!(*e.kind(), jsonwebtoken::errors::ErrorKind::ExpiredSignature),
        Ok(c) => panic!("jsonwebtoken still takes the short session: {c}"),
    }
    session_refused(&x_session_query(&stack, "whoami", &org, &short).await, "expired");
    // The others still read: what was refused was each token, not the reader.
    reads_as(&x_session_query(&stack, "whoami", &org, &ro.session).await, &stack.user_id, &org);
}

/// A read-only session names the credential that made it by id (`credential_id`), not by public
/// key: deleting the API key and adding the same public key back (a new API key id) does not
/// revive it (401 `SESSION_INVALID`, refused by the gateway alone), while a session the re-added
/// key makes reads as usual.
#[tokio::test]
async fn x_session_is_not_revived_by_adding_its_public_key_back() {
    let stack = Stack::start().await;
    let root = stack.api_key();
    let org = stack.organization_id.clone();
    let ts = Stack::now_ms;
    let notarizer = get_json(&stack, "/public/v1/discovery/keys").await["notarizerPublicKey"]
        .as_str()
        .expect("a notarizerPublicKey")
        .to_string();
    let key = TurnkeyP256ApiKey::generate();
    let public = hex::encode(key.compressed_public_key());
    let api_key = json!({"apiKeyName": "k", "curveType": "API_KEY_CURVE_P256", "publicKey": public});
    let p = json!({"users": [{"userName": "reader", "apiKeys": [api_key.clone()], "authenticators": [],
        "oauthProviders": [], "userTags": []}]});
    let r = submit(&stack, &root, &org, "create_users", "ACTIVITY_TYPE_CREATE_USERS_V4", p).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let reader = r.json["activity"]["result"]["createUsersResult"]["userIds"][0].as_str().unwrap().to_string();
    let key_id = |keys: &RawResponse| -> String {
        keys.json["apiKeys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["credential"]["publicKey"] == public)
            .unwrap_or_else(|| panic!("the key: {}", keys.text))["apiKeyId"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let api_keys = || async {
        let body = json!({"organizationId": org, "userId": reader}).to_string();
        stack.post_raw("/public/v1/query/get_api_keys", body.as_bytes(), Some(&root)).await
    };
    let first_id = key_id(&api_keys().await);

    // The key's read-only session reads.
    let client = stack.client_with(key);
    let old = client.create_read_only_session(org.clone(), ts(), CreateReadOnlySessionIntent {}).await.unwrap();
    let old = old.result.session;
    reads_as(&x_session_query(&stack, "whoami", &org, &old).await, &reader, &org);

    // Delete the key, add the same public key back: a new API key id.
    let p = json!({"userId": reader, "apiKeyIds": [first_id]});
    let r = submit(&stack, &root, &org, "delete_api_keys", "ACTIVITY_TYPE_DELETE_API_KEYS", p).await;
    assert_eq!(r.status, 200, "{}", r.text);
    stack.refused_by_gateway(
        &x_session_query(&stack, "whoami", &org, &old).await,
        401,
        "SESSION_INVALID",
        "the credential that made it is gone or expired",
    );
    let p = json!({"userId": reader, "apiKeys": [api_key]});
    let r = submit(&stack, &root, &org, "create_api_keys", "ACTIVITY_TYPE_CREATE_API_KEYS_V2", p).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let second_id = key_id(&api_keys().await);
    assert_ne!(second_id, first_id);

    // The old session stays dead, for every query; the re-added key's own session reads.
    for path in ["whoami", "list_users", "list_wallets"] {
        stack.refused_by_gateway(
            &x_session_query(&stack, path, &org, &old).await,
            401,
            "SESSION_INVALID",
            "read-only session (X-Session): the credential that made it is gone or expired",
        );
    }
    let new = client.create_read_only_session(org.clone(), ts(), CreateReadOnlySessionIntent {}).await.unwrap();
    let new = new.result.session;
    reads_as(&x_session_query(&stack, "whoami", &org, &new).await, &reader, &org);

    // Each session names its credential by id, and keeps public_key (what the SDKs decode).
    for (session, id) in [(&old, &first_id), (&new, &second_id)] {
        let claims = independent::verify_session_jwt(session, &notarizer);
        assert_eq!(
            (claims["credential_id"].as_str(), claims["public_key"].as_str()),
            (Some(id.as_str()), Some(public.as_str())),
            "{claims}"
        );
    }
}
