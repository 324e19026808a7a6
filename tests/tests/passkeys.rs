//! End to end: passkeys registered with software authenticators (`none` and `packed`
//! self-attestation) stamping requests with `X-Stamp-Webauthn`, and OAuth providers verified
//! against a local OIDC issuer, through the official Rust client and raw HTTP.

use base64::Engine;
use coffer_tests::oidc;
use coffer_tests::passkey::{b64url, fresh_key, Passkey, ORIGIN};
use coffer_tests::{refused, refused_raw, RawResponse, Stack};
use serde_json::{json, Value};
use turnkey_client::generated::immutable::common::v1::CredentialType;
use turnkey_client::generated::immutable::webauthn::v1::AuthenticatorTransport;
use turnkey_client::generated::oauth_provider_params_v2::TokenOrClaims;
use turnkey_client::generated::{
    AuthenticatorParamsV2, CreateAuthenticatorsIntentV2, CreateOauthProvidersIntentV2, CreateUsersIntentV4,
    DeleteAuthenticatorsIntent, DeleteOauthProvidersIntent, DeleteUsersIntent, GetAuthenticatorRequest,
    GetAuthenticatorsRequest, GetOauthProvidersRequest, GetUserRequest, GetUsersRequest, OauthProviderParamsV2,
    OidcClaims, UserParamsV4,
};

/// POSTs `body` stamped with `X-Stamp-Webauthn: stamp`.
async fn post_webauthn(stack: &Stack, path: &str, body: &[u8], stamp: &str) -> RawResponse {
    let resp = reqwest::Client::new()
        .post(format!("{}{}", stack.base_url, path))
        .header("X-Stamp-Webauthn", stamp)
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    RawResponse { status, content_type, json, text }
}

fn whoami_body(org: &str) -> Vec<u8> {
    json!({ "organizationId": org }).to_string().into_bytes()
}

fn create_wallet_body(org: &str, name: &str) -> Vec<u8> {
    json!({
        "type": "ACTIVITY_TYPE_CREATE_WALLET",
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org,
        "parameters": {"walletName": name, "accounts": [{"curve": "CURVE_SECP256K1", "pathFormat": "PATH_FORMAT_BIP32",
            "path": "m/44'/60'/0'/0/0", "addressFormat": "ADDRESS_FORMAT_ETHEREUM"}]},
    })
    .to_string()
    .into_bytes()
}

async fn passkey_count(stack: &Stack) -> usize {
    let req =
        GetAuthenticatorsRequest { organization_id: stack.organization_id.clone(), user_id: stack.user_id.clone() };
    stack.client().get_authenticators(req).await.unwrap().authenticators.len()
}

async fn provider_count(stack: &Stack) -> usize {
    let req = GetOauthProvidersRequest {
        organization_id: stack.organization_id.clone(),
        user_id: Some(stack.user_id.clone()),
    };
    stack.client().get_oauth_providers(req).await.unwrap().oauth_providers.len()
}

async fn wallet_count(stack: &Stack) -> usize {
    let req = turnkey_client::generated::GetWalletsRequest { organization_id: stack.organization_id.clone() };
    stack.client().get_wallets(req).await.unwrap().wallets.len()
}

#[tokio::test]
async fn passkeys_register_stamp_and_are_deleted() {
    let stack = Stack::start().await;
    let client = stack.client();
    let org = stack.organization_id.clone();
    let (plain, packed) = (Passkey::new(), Passkey::new());

    // Register both through the official client: "none" and "packed" self-attestation.
    let challenge = b64url(b"registration challenge 1");
    let created = client
        .create_authenticators(
            org.clone(),
            client.current_timestamp(),
            CreateAuthenticatorsIntentV2 {
                authenticators: vec![
                    plain.register("laptop", &challenge, "none"),
                    packed.register("yubikey", &challenge, "packed"),
                ],
                user_id: stack.user_id.clone(),
            },
        )
        .await
        .unwrap();
    assert_eq!(created.result.authenticator_ids.len(), 2);

    let list = client
        .get_authenticators(GetAuthenticatorsRequest { organization_id: org.clone(), user_id: stack.user_id.clone() })
        .await
        .unwrap()
        .authenticators;
    assert_eq!(list.len(), 2);
    for (a, (pk, name, fmt)) in list.iter().zip([(&plain, "laptop", "none"), (&packed, "yubikey", "packed")]) {
        assert_eq!(a.authenticator_name, name);
        assert_eq!(a.attestation_type, fmt);
        assert_eq!(a.credential_id, pk.credential_id());
        assert_eq!(a.aaguid, "00000000-0000-0000-0000-000000000000");
        assert_eq!(a.transports, vec![AuthenticatorTransport::Internal, AuthenticatorTransport::Hybrid]);
        let cred = a.credential.as_ref().unwrap();
        assert_eq!(cred.public_key, pk.public_key_hex());
        assert_eq!(cred.r#type, CredentialType::WebauthnAuthenticator);
    }
    let one = client
        .get_authenticator(GetAuthenticatorRequest {
            organization_id: org.clone(),
            authenticator_id: created.result.authenticator_ids[1].clone(),
        })
        .await
        .unwrap()
        .authenticator
        .unwrap();
    assert_eq!(one.authenticator_name, "yubikey");
    let user = client
        .get_user(GetUserRequest { organization_id: org.clone(), user_id: stack.user_id.clone() })
        .await
        .unwrap()
        .user
        .unwrap();
    assert_eq!(user.authenticators.len(), 2);
    assert_eq!(user.api_keys.len(), 1);

    // A passkey stamps whoami and a create_wallet (raw HTTP, as @turnkey/webauthn-stamper does).
    for pk in [&plain, &packed] {
        let body = whoami_body(&org);
        let r = post_webauthn(&stack, "/public/v1/query/whoami", &body, &pk.stamp(&body, ORIGIN)).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json["userId"], stack.user_id);
        assert_eq!(r.json["organizationId"], org);
    }
    let body = create_wallet_body(&org, "passkey wallet");
    let r = post_webauthn(&stack, "/public/v1/submit/create_wallet", &body, &packed.stamp(&body, ORIGIN)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let activity = &r.json["activity"];
    assert_eq!(activity["status"], "ACTIVITY_STATUS_COMPLETED");
    assert_eq!(activity["votes"][0]["scheme"], "SIGNATURE_SCHEME_TK_WEBAUTHN");
    assert_eq!(activity["votes"][0]["publicKey"], packed.public_key_hex());
    assert_eq!(activity["votes"][0]["userId"], stack.user_id);
    assert_eq!(activity["votes"][0]["user"]["authenticators"][0]["credentialId"], packed.credential_id());
    assert_eq!(activity["result"]["createWalletResult"]["addresses"].as_array().unwrap().len(), 1);
    // The official client reads that activity (votes included) back.
    let got = client
        .get_activity(turnkey_client::generated::GetActivityRequest {
            organization_id: org.clone(),
            activity_id: activity["id"].as_str().unwrap().into(),
        })
        .await
        .unwrap()
        .activity
        .unwrap();
    assert_eq!(got.votes[0].scheme, "SIGNATURE_SCHEME_TK_WEBAUTHN");
    assert_eq!(wallet_count(&stack).await, 1);

    // Refusals change nothing: a tampered signature, a stamp over another body, an unknown
    // credential, a malformed header.
    let body = create_wallet_body(&org, "never");
    let mut stamp: Value = serde_json::from_str(&packed.stamp(&body, ORIGIN)).unwrap();
    let mut sig =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(stamp["signature"].as_str().unwrap()).unwrap();
    let n = sig.len();
    sig[n - 1] ^= 0x01;
    stamp["signature"] = json!(b64url(&sig));
    let r = post_webauthn(&stack, "/public/v1/submit/create_wallet", &body, &stamp.to_string()).await;
    refused_raw(&r, 401, "SIGNATURE_INVALID", "could not verify WebAuthN signature");
    let other_body = create_wallet_body(&org, "other");
    let r = post_webauthn(&stack, "/public/v1/submit/create_wallet", &body, &packed.stamp(&other_body, ORIGIN)).await;
    refused_raw(&r, 401, "SIGNATURE_INVALID", "could not verify WebAuthN signature");
    let stranger = Passkey::new();
    let r = post_webauthn(&stack, "/public/v1/submit/create_wallet", &body, &stranger.stamp(&body, ORIGIN)).await;
    refused_raw(
        &r,
        401,
        "CREDENTIAL_NOT_FOUND",
        "credential ID could not be found in organization or its parent organization",
    );
    let r = post_webauthn(&stack, "/public/v1/submit/create_wallet", &body, "{\"credentialId\":1}").await;
    refused_raw(&r, 401, "SIGNATURE_INVALID", "malformed WebAuthn stamp");
    assert_eq!(wallet_count(&stack).await, 1);

    // Registration refusals: a credential id already in the organization, a wrong challenge, a
    // forged packed signature. Nothing is added.
    let intent = |params: AuthenticatorParamsV2| CreateAuthenticatorsIntentV2 {
        authenticators: vec![params],
        user_id: stack.user_id.clone(),
    };
    let dup = client
        .create_authenticators(
            org.clone(),
            client.current_timestamp(),
            intent(plain.register("again", &challenge, "none")),
        )
        .await;
    refused(dup, 400, "REQUEST_INVALID", "already exists");
    let mut wrong = Passkey::new().register("wrong", &challenge, "none");
    wrong.challenge = b64url(b"another challenge");
    refused(
        client.create_authenticators(org.clone(), client.current_timestamp(), intent(wrong)).await,
        400,
        "REQUEST_INVALID",
        "challenge does not match",
    );
    // A packed self-attestation whose signature covers other client data does not verify.
    let mut forged = Passkey::new().register("forged", &challenge, "packed");
    forged.attestation.as_mut().unwrap().client_data_json = b64url(
        json!({"type": "webauthn.create", "challenge": challenge, "origin": "https://elsewhere.example"})
            .to_string()
            .as_bytes(),
    );
    refused(
        client.create_authenticators(org.clone(), client.current_timestamp(), intent(forged)).await,
        400,
        "REQUEST_INVALID",
        "does not verify",
    );
    assert_eq!(passkey_count(&stack).await, 2);

    // After delete_authenticators the passkey's stamp is refused; the other one still works.
    let deleted = client
        .delete_authenticators(
            org.clone(),
            client.current_timestamp(),
            DeleteAuthenticatorsIntent {
                user_id: stack.user_id.clone(),
                authenticator_ids: vec![created.result.authenticator_ids[0].clone()],
            },
        )
        .await
        .unwrap();
    assert_eq!(deleted.result.authenticator_ids, vec![created.result.authenticator_ids[0].clone()]);
    assert_eq!(passkey_count(&stack).await, 1);
    let body = whoami_body(&org);
    let r = post_webauthn(&stack, "/public/v1/query/whoami", &body, &plain.stamp(&body, ORIGIN)).await;
    refused_raw(&r, 401, "CREDENTIAL_NOT_FOUND", "credential ID could not be found");
    let r = post_webauthn(&stack, "/public/v1/query/whoami", &body, &packed.stamp(&body, ORIGIN)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Deleting it again: 404, nothing changes.
    refused(
        client
            .delete_authenticators(
                org.clone(),
                client.current_timestamp(),
                DeleteAuthenticatorsIntent {
                    user_id: stack.user_id.clone(),
                    authenticator_ids: vec![created.result.authenticator_ids[0].clone()],
                },
            )
            .await,
        404,
        "REQUEST_INVALID",
        "authenticator not found",
    );
    assert_eq!(passkey_count(&stack).await, 1);

    // Allowed origins (FEATURE_NAME_WEBAUTHN_ORIGINS).
    let feature = json!({
        "type": "ACTIVITY_TYPE_SET_ORGANIZATION_FEATURE",
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org,
        "parameters": {"name": "FEATURE_NAME_WEBAUTHN_ORIGINS", "value": "https://other.example, https://coffer.example"},
    })
    .to_string();
    let key = stack.api_key();
    let r = stack.post_raw("/public/v1/submit/set_organization_feature", feature.as_bytes(), Some(&key)).await;
    // The feature must be settable: a 404 (or anything but 200) fails the test, never a skip.
    assert_eq!(r.status, 200, "set_organization_feature FEATURE_NAME_WEBAUTHN_ORIGINS: {}", r.text);
    let body = whoami_body(&org);
    let r = post_webauthn(&stack, "/public/v1/query/whoami", &body, &packed.stamp(&body, "https://evil.example")).await;
    refused_raw(&r, 401, "UNAUTHENTICATED", "WebAuthn origin");
    // Both listed origins pass.
    for origin in [ORIGIN, "https://other.example"] {
        let r = post_webauthn(&stack, "/public/v1/query/whoami", &body, &packed.stamp(&body, origin)).await;
        assert_eq!(r.status, 200, "{origin}: {}", r.text);
    }
}

#[tokio::test]
async fn inline_passkey_on_create_users_goes_with_the_user() {
    let stack = Stack::start().await;
    let client = stack.client();
    let org = stack.organization_id.clone();
    let pk = Passkey::new();
    let created = client
        .create_users(
            org.clone(),
            client.current_timestamp(),
            CreateUsersIntentV4 {
                users: vec![UserParamsV4 {
                    user_name: "alice".into(),
                    user_email: None,
                    user_phone_number: None,
                    api_keys: vec![],
                    authenticators: vec![pk.register("alice's phone", &b64url(b"c"), "none")],
                    oauth_providers: vec![OauthProviderParamsV2 {
                        provider_name: "google".into(),
                        token_or_claims: Some(TokenOrClaims::OidcClaims(OidcClaims {
                            iss: "https://accounts.google.com".into(),
                            sub: "alice-sub".into(),
                            aud: "app".into(),
                        })),
                    }],
                    user_tags: vec![],
                }],
            },
        )
        .await
        .unwrap();
    let alice = created.result.user_ids[0].clone();
    let user = client
        .get_user(GetUserRequest { organization_id: org.clone(), user_id: alice.clone() })
        .await
        .unwrap()
        .user
        .unwrap();
    assert_eq!(user.authenticators.len(), 1);
    assert_eq!(user.authenticators[0].credential_id, pk.credential_id());
    assert_eq!(user.oauth_providers.len(), 1);
    assert_eq!(user.oauth_providers[0].subject, "alice-sub");

    let body = whoami_body(&org);
    let r = post_webauthn(&stack, "/public/v1/query/whoami", &body, &pk.stamp(&body, ORIGIN)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["userId"], alice);
    assert_eq!(r.json["username"], "alice");

    // A second user with the same passkey is refused whole: no user is created.
    let again = client
        .create_users(
            org.clone(),
            client.current_timestamp(),
            CreateUsersIntentV4 {
                users: vec![UserParamsV4 {
                    user_name: "mallory".into(),
                    user_email: None,
                    user_phone_number: None,
                    api_keys: vec![],
                    authenticators: vec![pk.register("copy", &b64url(b"c"), "none")],
                    oauth_providers: vec![],
                    user_tags: vec![],
                }],
            },
        )
        .await;
    refused(again, 400, "REQUEST_INVALID", "already exists");
    let users = client.get_users(GetUsersRequest { organization_id: org.clone() }).await.unwrap().users;
    assert_eq!(users.len(), 2);

    // Deleting the user takes its passkey with it.
    client
        .delete_users(org.clone(), client.current_timestamp(), DeleteUsersIntent { user_ids: vec![alice] })
        .await
        .unwrap();
    let r = post_webauthn(&stack, "/public/v1/query/whoami", &body, &pk.stamp(&body, ORIGIN)).await;
    refused_raw(&r, 401, "CREDENTIAL_NOT_FOUND", "credential ID could not be found");
    let providers = client
        .get_oauth_providers(GetOauthProvidersRequest { organization_id: org.clone(), user_id: None })
        .await
        .unwrap()
        .oauth_providers;
    assert!(providers.is_empty());
}

#[tokio::test]
async fn oauth_providers_verified_against_a_local_issuer() {
    let stack = Stack::start().await;
    let client = stack.client();
    let org = stack.organization_id.clone();
    let key = fresh_key();
    let issuer = oidc::issuer(oidc::jwk(&key)).await;
    let now = (Stack::now_ms() / 1000) as i64;
    let claims = |sub: &str, exp: i64| json!({"iss": issuer, "sub": sub, "aud": "coffer-app", "exp": exp, "iat": now});
    let intent = |token: String| CreateOauthProvidersIntentV2 {
        user_id: stack.user_id.clone(),
        oauth_providers: vec![OauthProviderParamsV2 {
            provider_name: "local".into(),
            token_or_claims: Some(TokenOrClaims::OidcToken(token)),
        }],
    };

    let created = client
        .create_oauth_providers(
            org.clone(),
            client.current_timestamp(),
            intent(oidc::es256_token(&key, &claims("u-1", now + 600))),
        )
        .await
        .unwrap();
    assert_eq!(created.result.provider_ids.len(), 1);
    let user = client
        .get_user(GetUserRequest { organization_id: org.clone(), user_id: stack.user_id.clone() })
        .await
        .unwrap()
        .user
        .unwrap();
    assert_eq!(user.oauth_providers.len(), 1);
    let p = &user.oauth_providers[0];
    assert_eq!(p.provider_id, created.result.provider_ids[0]);
    assert_eq!((p.provider_name.as_str(), p.issuer.as_str()), ("local", issuer.as_str()));
    assert_eq!((p.subject.as_str(), p.audience.as_str()), ("u-1", "coffer-app"));
    let users = client.get_users(GetUsersRequest { organization_id: org.clone() }).await.unwrap().users;
    assert_eq!(users[0].oauth_providers.len(), 1);
    assert_eq!(provider_count(&stack).await, 1);

    // The same identity again, an expired token, a token signed by another key, a token whose
    // issuer cannot be reached: 400, nothing changes.
    refused(
        client
            .create_oauth_providers(
                org.clone(),
                client.current_timestamp(),
                intent(oidc::es256_token(&key, &claims("u-1", now + 600))),
            )
            .await,
        400,
        "OAUTH_PROVIDER_ALREADY_EXISTS",
        "oauth provider already exists",
    );
    let expired = intent(oidc::es256_token(&key, &claims("u-2", now - 10)));
    refused(
        client.create_oauth_providers(org.clone(), client.current_timestamp(), expired).await,
        400,
        "INVALID_OIDC_TOKEN",
        "invalid OIDC token",
    );
    let other_key = fresh_key();
    let forged = intent(oidc::es256_token(&other_key, &claims("u-3", now + 600)));
    refused(
        client.create_oauth_providers(org.clone(), client.current_timestamp(), forged).await,
        400,
        "INVALID_OIDC_TOKEN",
        "invalid OIDC token",
    );
    let mut far = claims("u-4", now + 600);
    far["iss"] = json!("http://127.0.0.1:9");
    let unreachable = intent(oidc::es256_token(&key, &far));
    refused(
        client.create_oauth_providers(org.clone(), client.current_timestamp(), unreachable).await,
        400,
        "INVALID_OIDC_TOKEN",
        "invalid OIDC token",
    );
    // The raw error body carries the spec's code.
    let body = json!({
        "type": "ACTIVITY_TYPE_CREATE_OAUTH_PROVIDERS_V2",
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org,
        "parameters": {"userId": stack.user_id, "oauthProviders": [{"providerName": "x", "oidcToken": "not.a.jwt"}]},
    })
    .to_string();
    let r = stack.post_raw("/public/v1/submit/create_oauth_providers", body.as_bytes(), Some(&stack.api_key())).await;
    refused_raw(&r, 400, "INVALID_OIDC_TOKEN", "invalid OIDC token");
    assert_eq!(provider_count(&stack).await, 1);

    // Claims instead of a token, then delete_oauth_providers.
    let by_claims = client
        .create_oauth_providers(
            org.clone(),
            client.current_timestamp(),
            CreateOauthProvidersIntentV2 {
                user_id: stack.user_id.clone(),
                oauth_providers: vec![OauthProviderParamsV2 {
                    provider_name: "apple".into(),
                    token_or_claims: Some(TokenOrClaims::OidcClaims(OidcClaims {
                        iss: "https://appleid.apple.com".into(),
                        sub: "a-1".into(),
                        aud: "com.example".into(),
                    })),
                }],
            },
        )
        .await
        .unwrap();
    assert_eq!(provider_count(&stack).await, 2);
    let deleted = client
        .delete_oauth_providers(
            org.clone(),
            client.current_timestamp(),
            DeleteOauthProvidersIntent {
                user_id: stack.user_id.clone(),
                provider_ids: vec![created.result.provider_ids[0].clone()],
            },
        )
        .await
        .unwrap();
    assert_eq!(deleted.result.provider_ids, created.result.provider_ids);
    let req = GetOauthProvidersRequest { organization_id: org.clone(), user_id: Some(stack.user_id.clone()) };
    let left = client.get_oauth_providers(req).await.unwrap().oauth_providers;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].provider_id, by_claims.result.provider_ids[0]);
}
