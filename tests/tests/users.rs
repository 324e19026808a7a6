//! End to end: users, API keys (curves, expiry, deletion) and user / private-key tags, through
//! the official Rust client against the real binaries.

use std::time::Duration;

use coffer_tests::{refused, Stack};
use turnkey_client::generated::external::data::v1::{TagType, User};
use turnkey_client::generated::immutable::common::v1::{AddressFormat, ApiKeyCurve, CredentialType, Curve};
use turnkey_client::generated::{
    ApiKeyParamsV2, CreateApiKeysIntentV2, CreatePrivateKeyTagIntent, CreatePrivateKeysIntentV2, CreateUserTagIntent,
    CreateUsersIntentV4, DeleteApiKeysIntent, DeletePrivateKeyTagsIntent, DeleteUserTagsIntent, DeleteUsersIntent,
    GetApiKeyRequest, GetApiKeysRequest, GetPrivateKeyRequest, GetUserRequest, GetUsersRequest, GetWhoamiRequest,
    ListPrivateKeyTagsRequest, ListUserTagsRequest, PrivateKeyParams, UpdatePrivateKeyTagIntent, UpdateUserIntent,
    UpdateUserTagIntent, UserParamsV4,
};
use turnkey_client::{TurnkeyClient, TurnkeyClientError, TurnkeyP256ApiKey, TurnkeySecp256k1ApiKey};

const UNKNOWN_ID: &str = "00000000-0000-4000-8000-000000000000";

fn p256_params(name: &str, key: &TurnkeyP256ApiKey, expiration: Option<&str>) -> ApiKeyParamsV2 {
    ApiKeyParamsV2 {
        api_key_name: name.into(),
        public_key: hex::encode(key.compressed_public_key()),
        curve_type: ApiKeyCurve::P256,
        expiration_seconds: expiration.map(String::from),
    }
}

fn user_params(name: &str, api_keys: Vec<ApiKeyParamsV2>, tags: Vec<String>) -> UserParamsV4 {
    UserParamsV4 {
        user_name: name.into(),
        user_email: None,
        user_phone_number: None,
        api_keys,
        authenticators: vec![],
        oauth_providers: vec![],
        user_tags: tags,
    }
}

async fn user<S: turnkey_api_key_stamper::Stamp>(c: &TurnkeyClient<S>, org: &str, id: &str) -> User {
    c.get_user(GetUserRequest { organization_id: org.into(), user_id: id.into() }).await.unwrap().user.unwrap()
}

async fn users<S: turnkey_api_key_stamper::Stamp>(c: &TurnkeyClient<S>, org: &str) -> Vec<User> {
    c.get_users(GetUsersRequest { organization_id: org.into() }).await.unwrap().users
}

async fn key_count<S: turnkey_api_key_stamper::Stamp>(c: &TurnkeyClient<S>, org: &str) -> usize {
    c.get_api_keys(GetApiKeysRequest { organization_id: org.into(), user_id: None }).await.unwrap().api_keys.len()
}

async fn whoami<S: turnkey_api_key_stamper::Stamp>(
    c: &TurnkeyClient<S>,
    org: &str,
) -> Result<String, TurnkeyClientError> {
    c.get_whoami(GetWhoamiRequest { organization_id: org.into() }).await.map(|w| w.user_id)
}

/// The "admins" tag still has its name and only user `a`.
async fn assert_admins_only_a<S: turnkey_api_key_stamper::Stamp>(
    c: &TurnkeyClient<S>,
    org: &str,
    admins: &str,
    a: &str,
    b: &str,
) {
    let tags = c.list_user_tags(ListUserTagsRequest { organization_id: org.into() }).await.unwrap().user_tags;
    assert_eq!(tags.iter().find(|t| t.tag_id == admins).unwrap().tag_name, "admins");
    assert_eq!(user(c, org, a).await.user_tags, vec![admins.to_string()]);
    assert!(user(c, org, b).await.user_tags.is_empty());
}

async fn key_tags<S: turnkey_api_key_stamper::Stamp>(c: &TurnkeyClient<S>, org: &str, id: String) -> Vec<String> {
    let req = GetPrivateKeyRequest { organization_id: org.into(), private_key_id: id };
    c.get_private_key(req).await.unwrap().private_key.unwrap().private_key_tags
}

#[tokio::test]
async fn users_and_api_keys_end_to_end() {
    let stack = Stack::start().await;
    let root = stack.client();
    let org = stack.organization_id.clone();

    // A second user with an email, a phone number and a P-256 key.
    let alice_key = TurnkeyP256ApiKey::generate();
    let alice_pk = hex::encode(alice_key.compressed_public_key());
    let mut params = user_params("alice", vec![p256_params("laptop", &alice_key, None)], vec![]);
    params.user_email = Some("alice@example.com".into());
    params.user_phone_number = Some("+13214567890".into());
    let created = root
        .create_users(org.clone(), root.current_timestamp(), CreateUsersIntentV4 { users: vec![params] })
        .await
        .unwrap();
    assert_eq!(created.result.user_ids.len(), 1);
    let alice_id = created.result.user_ids[0].clone();

    let u = user(&root, &org, &alice_id).await;
    assert_eq!((u.user_name.as_str(), u.user_email.as_deref()), ("alice", Some("alice@example.com")));
    assert_eq!(u.user_phone_number.as_deref(), Some("+13214567890"));
    assert_eq!(u.api_keys.len(), 1);
    let cred = u.api_keys[0].credential.as_ref().unwrap();
    assert_eq!((cred.public_key.as_str(), cred.r#type), (alice_pk.as_str(), CredentialType::ApiKeyP256));
    assert_eq!(u.api_keys[0].api_key_name, "laptop");
    assert_eq!(u.api_keys[0].expiration_seconds, None);
    assert!(u.user_tags.is_empty() && u.authenticators.is_empty() && u.oauth_providers.is_empty());
    assert!(u.created_at.is_some() && u.updated_at.is_some());
    let all = users(&root, &org).await;
    assert_eq!(all.len(), 2);
    assert!(all.iter().any(|u| u.user_id == stack.user_id && u.api_keys.len() == 1));

    // Alice's own client works and is Alice.
    let alice = stack.client_with(alice_key);
    assert_eq!(whoami(&alice, &org).await.unwrap(), alice_id);

    // A secp256k1 key for Alice, used through the official client.
    let k1 = TurnkeySecp256k1ApiKey::generate();
    let k1_added = alice
        .create_api_keys(
            org.clone(),
            alice.current_timestamp(),
            CreateApiKeysIntentV2 {
                api_keys: vec![ApiKeyParamsV2 {
                    api_key_name: "k1".into(),
                    public_key: hex::encode(k1.compressed_public_key()),
                    curve_type: ApiKeyCurve::Secp256k1,
                    expiration_seconds: None,
                }],
                user_id: alice_id.clone(),
            },
        )
        .await
        .unwrap();
    let k1_id = k1_added.result.api_key_ids[0].clone();
    let k1_client = TurnkeyClient::builder().api_key(k1).base_url(stack.base_url.clone()).build().unwrap();
    assert_eq!(whoami(&k1_client, &org).await.unwrap(), alice_id);
    let got = root
        .get_api_key(GetApiKeyRequest { organization_id: org.clone(), api_key_id: k1_id.clone() })
        .await
        .unwrap()
        .api_key
        .unwrap();
    assert_eq!(got.credential.unwrap().r#type, CredentialType::ApiKeySecp256k1);

    // A key that lasts 2 seconds: it works, then it is refused as expired.
    let short = TurnkeyP256ApiKey::generate();
    let short_added = root
        .create_api_keys(
            org.clone(),
            root.current_timestamp(),
            CreateApiKeysIntentV2 {
                api_keys: vec![p256_params("short", &short, Some("2"))],
                user_id: alice_id.clone(),
            },
        )
        .await
        .unwrap();
    let short_id = short_added.result.api_key_ids[0].clone();
    let short_client = stack.client_with(short);
    assert_eq!(whoami(&short_client, &org).await.unwrap(), alice_id);
    let got = root
        .get_api_key(GetApiKeyRequest { organization_id: org.clone(), api_key_id: short_id.clone() })
        .await
        .unwrap()
        .api_key
        .unwrap();
    assert_eq!((got.api_key_name.as_str(), got.expiration_seconds), ("short", Some(2)));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let expired = whoami(&short_client, &org).await;
    refused(expired, 401, "API_KEY_EXPIRED", "expired api key");
    refused(whoami(&short_client, &org).await, 401, "API_KEY_EXPIRED", "expired api key");
    let alices =
        root.get_api_keys(GetApiKeysRequest { organization_id: org.clone(), user_id: Some(alice_id.clone()) }).await;
    assert_eq!(alices.unwrap().api_keys.len(), 3);
    assert_eq!(key_count(&root, &org).await, 4);

    // Refusals change nothing: no key, no user, no activity. (The oracles see what there is:
    // four keys, two users, the activities so far.)
    let activities = stack.activities(&stack.api_key(), &org).await;
    assert_eq!(users(&root, &org).await.len(), 2);
    let add = |params: ApiKeyParamsV2, user_id: &str| CreateApiKeysIntentV2 {
        api_keys: vec![params],
        user_id: user_id.to_string(),
    };
    let fresh = TurnkeyP256ApiKey::generate();
    refused(
        root.create_api_keys(org.clone(), root.current_timestamp(), add(p256_params("x", &fresh, None), UNKNOWN_ID))
            .await,
        404,
        "REQUEST_INVALID",
        "user not found",
    );
    let mut bad = p256_params("bad", &fresh, None);
    bad.public_key = format!("04{}", &bad.public_key[2..]);
    refused(
        root.create_api_keys(org.clone(), root.current_timestamp(), add(bad, &alice_id)).await,
        400,
        "REQUEST_INVALID",
        "invalid api key public key",
    );
    let mut wrong_curve = p256_params("ed", &fresh, None);
    wrong_curve.curve_type = ApiKeyCurve::Ed25519;
    refused(
        root.create_api_keys(org.clone(), root.current_timestamp(), add(wrong_curve, &alice_id)).await,
        400,
        "REQUEST_INVALID",
        "invalid api key public key for API_KEY_CURVE_ED25519",
    );
    for exp in ["0", "soon"] {
        refused(
            root.create_api_keys(
                org.clone(),
                root.current_timestamp(),
                add(p256_params("e", &fresh, Some(exp)), &alice_id),
            )
            .await,
            400,
            "REQUEST_INVALID",
            "invalid api key expiration",
        );
    }
    let dup = ApiKeyParamsV2 { public_key: alice_pk.clone(), ..p256_params("again", &fresh, None) };
    refused(
        root.create_api_keys(org.clone(), root.current_timestamp(), add(dup, &stack.user_id)).await,
        400,
        "CREDENTIAL_CONFLICT",
        &format!("api key public key already exists in this organization: {alice_pk}"),
    );
    // One bad key in a batch refuses the whole batch.
    let batch = CreateApiKeysIntentV2 {
        api_keys: vec![p256_params("ok", &fresh, None), p256_params("no", &TurnkeyP256ApiKey::generate(), Some("0"))],
        user_id: alice_id.clone(),
    };
    refused(
        root.create_api_keys(org.clone(), root.current_timestamp(), batch).await,
        400,
        "REQUEST_INVALID",
        "invalid api key expiration",
    );
    assert_eq!(key_count(&root, &org).await, 4);
    refused(
        root.get_user(GetUserRequest { organization_id: org.clone(), user_id: UNKNOWN_ID.into() }).await,
        404,
        "REQUEST_INVALID",
        "user not found",
    );
    refused(
        root.get_api_key(GetApiKeyRequest { organization_id: org.clone(), api_key_id: UNKNOWN_ID.into() }).await,
        404,
        "REQUEST_INVALID",
        "api key not found",
    );
    refused(
        root.delete_users(
            org.clone(),
            root.current_timestamp(),
            DeleteUsersIntent { user_ids: vec![UNKNOWN_ID.into()] },
        )
        .await,
        404,
        "REQUEST_INVALID",
        "user not found",
    );
    refused(
        root.delete_users(
            org.clone(),
            root.current_timestamp(),
            DeleteUsersIntent { user_ids: vec![alice_id.clone(), stack.user_id.clone()] },
        )
        .await,
        400,
        "REQUEST_INVALID",
        "cannot delete a root quorum member",
    );
    refused(
        root.delete_api_keys(
            org.clone(),
            root.current_timestamp(),
            DeleteApiKeysIntent { user_id: stack.user_id.clone(), api_key_ids: vec![k1_id.clone()] },
        )
        .await,
        404,
        "REQUEST_INVALID",
        "api key not found",
    );
    let mut bad_email = user_params("bob", vec![], vec![]);
    bad_email.user_email = Some("not-an-email".into());
    refused(
        root.create_users(org.clone(), root.current_timestamp(), CreateUsersIntentV4 { users: vec![bad_email] }).await,
        400,
        "INVALID_EMAIL",
        "invalid email: \"not-an-email\"",
    );
    assert_eq!(users(&root, &org).await.len(), 2);
    assert_eq!(key_count(&root, &org).await, 4);
    assert_eq!(stack.activities(&stack.api_key(), &org).await, activities);

    // Update: name and email change, tags (an empty list) stay as they are.
    let before = user(&root, &org, &alice_id).await;
    root.update_user(
        org.clone(),
        root.current_timestamp(),
        UpdateUserIntent {
            user_id: alice_id.clone(),
            user_name: Some("alice-2".into()),
            user_email: Some("alice2@example.com".into()),
            user_tag_ids: vec![],
            user_phone_number: None,
        },
    )
    .await
    .unwrap();
    let after = user(&root, &org, &alice_id).await;
    assert_eq!((after.user_name.as_str(), after.user_email.as_deref()), ("alice-2", Some("alice2@example.com")));
    assert_eq!(after.user_phone_number.as_deref(), Some("+13214567890"));
    assert_eq!(after.created_at, before.created_at);
    assert_eq!(after.api_keys.len(), 3);
    refused(
        root.update_user(
            org.clone(),
            root.current_timestamp(),
            UpdateUserIntent {
                user_id: UNKNOWN_ID.into(),
                user_name: Some("x".into()),
                user_email: None,
                user_tag_ids: vec![],
                user_phone_number: None,
            },
        )
        .await,
        404,
        "REQUEST_INVALID",
        "user not found",
    );

    // Deleting a key: that key stops working, the others do not.
    let del = alice
        .delete_api_keys(
            org.clone(),
            alice.current_timestamp(),
            DeleteApiKeysIntent { user_id: alice_id.clone(), api_key_ids: vec![k1_id.clone()] },
        )
        .await
        .unwrap();
    assert_eq!(del.result.api_key_ids, vec![k1_id.clone()]);
    refused(whoami(&k1_client, &org).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");
    assert_eq!(whoami(&alice, &org).await.unwrap(), alice_id);

    // Deleting the user: its keys stop working at once.
    let gone = root
        .delete_users(org.clone(), root.current_timestamp(), DeleteUsersIntent { user_ids: vec![alice_id.clone()] })
        .await
        .unwrap();
    assert_eq!(gone.result.user_ids, vec![alice_id.clone()]);
    refused(whoami(&alice, &org).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");
    let left = users(&root, &org).await;
    assert_eq!(left.iter().map(|u| u.user_id.as_str()).collect::<Vec<_>>(), vec![stack.user_id.as_str()]);
    assert_eq!(key_count(&root, &org).await, 1);
    refused(
        root.get_api_key(GetApiKeyRequest { organization_id: org.clone(), api_key_id: short_id }).await,
        404,
        "REQUEST_INVALID",
        "api key not found",
    );
}

#[tokio::test]
async fn user_and_private_key_tags_with_atomic_updates() {
    let stack = Stack::start().await;
    let c = stack.client();
    let org = stack.organization_id.clone();
    let ts = || c.current_timestamp();

    let made = c
        .create_users(
            org.clone(),
            ts(),
            CreateUsersIntentV4 { users: vec![user_params("a", vec![], vec![]), user_params("b", vec![], vec![])] },
        )
        .await
        .unwrap();
    let (a, b) = (made.result.user_ids[0].clone(), made.result.user_ids[1].clone());

    let admins = c
        .create_user_tag(
            org.clone(),
            ts(),
            CreateUserTagIntent { user_tag_name: "admins".into(), user_ids: vec![a.clone()] },
        )
        .await
        .unwrap()
        .result;
    assert_eq!(admins.user_ids, vec![a.clone()]);
    let admins = admins.user_tag_id;
    let ops = c
        .create_user_tag(org.clone(), ts(), CreateUserTagIntent { user_tag_name: "ops".into(), user_ids: vec![] })
        .await
        .unwrap()
        .result
        .user_tag_id;
    refused(
        c.create_user_tag(org.clone(), ts(), CreateUserTagIntent { user_tag_name: "admins".into(), user_ids: vec![] })
            .await,
        400,
        "REQUEST_INVALID",
        "user tag name must be unique",
    );
    refused(
        c.create_user_tag(
            org.clone(),
            ts(),
            CreateUserTagIntent { user_tag_name: "new".into(), user_ids: vec![UNKNOWN_ID.into()] },
        )
        .await,
        404,
        "REQUEST_INVALID",
        "user not found",
    );
    let list = || c.list_user_tags(ListUserTagsRequest { organization_id: org.clone() });
    let tags = list().await.unwrap().user_tags;
    assert_eq!(tags.iter().map(|t| t.tag_name.as_str()).collect::<Vec<_>>(), vec!["admins", "ops"]);
    assert!(tags.iter().all(|t| t.tag_type == TagType::User && t.created_at.is_some()));
    assert_eq!(user(&c, &org, &a).await.user_tags, vec![admins.clone()]);
    assert!(user(&c, &org, &b).await.user_tags.is_empty());

    // Atomicity: a rename clashing with "ops" plus adding b fails whole.
    let update = |name: Option<&str>, add: Vec<String>, remove: Vec<String>| UpdateUserTagIntent {
        user_tag_id: admins.clone(),
        new_user_tag_name: name.map(String::from),
        add_user_ids: add,
        remove_user_ids: remove,
    };
    refused(
        c.update_user_tag(org.clone(), ts(), update(Some("ops"), vec![b.clone()], vec![])).await,
        400,
        "REQUEST_INVALID",
        "user tag name must be unique",
    );
    // ... and so does a valid rename plus an unknown user.
    refused(
        c.update_user_tag(
            org.clone(),
            ts(),
            update(Some("admins-2"), vec![b.clone(), UNKNOWN_ID.into()], vec![a.clone()]),
        )
        .await,
        404,
        "REQUEST_INVALID",
        "user not found",
    );
    assert_admins_only_a(&c, &org, &admins, &a, &b).await;
    refused(
        c.update_user_tag(
            org.clone(),
            ts(),
            UpdateUserTagIntent {
                user_tag_id: UNKNOWN_ID.into(),
                new_user_tag_name: Some("x".into()),
                add_user_ids: vec![],
                remove_user_ids: vec![],
            },
        )
        .await,
        404,
        "REQUEST_INVALID",
        "user tag not found",
    );
    assert_admins_only_a(&c, &org, &admins, &a, &b).await;

    // A valid update does all three.
    let r = c.update_user_tag(org.clone(), ts(), update(Some("admins-2"), vec![b.clone()], vec![a.clone()])).await;
    assert_eq!(r.unwrap().result.user_tag_id, admins);
    assert!(user(&c, &org, &a).await.user_tags.is_empty());
    assert_eq!(user(&c, &org, &b).await.user_tags, vec![admins.clone()]);
    assert!(list().await.unwrap().user_tags.iter().any(|t| t.tag_id == admins && t.tag_name == "admins-2"));

    // update_user with tag ids replaces the user's tags; an unknown tag changes nothing.
    let set_tags = |user_id: &str, tags: Vec<String>| UpdateUserIntent {
        user_id: user_id.into(),
        user_name: None,
        user_email: None,
        user_tag_ids: tags,
        user_phone_number: None,
    };
    c.update_user(org.clone(), ts(), set_tags(&b, vec![ops.clone()])).await.unwrap();
    assert_eq!(user(&c, &org, &b).await.user_tags, vec![ops.clone()]);
    refused(
        c.update_user(org.clone(), ts(), set_tags(&b, vec![admins.clone(), UNKNOWN_ID.into()])).await,
        404,
        "REQUEST_INVALID",
        "user tag not found",
    );
    assert_eq!(user(&c, &org, &b).await.user_tags, vec![ops.clone()]);

    // create_users with tags; deleting a tag removes it from its users.
    let cu = c
        .create_users(
            org.clone(),
            ts(),
            CreateUsersIntentV4 { users: vec![user_params("c", vec![], vec![admins.clone(), ops.clone()])] },
        )
        .await
        .unwrap()
        .result
        .user_ids[0]
        .clone();
    assert_eq!(user(&c, &org, &cu).await.user_tags, vec![admins.clone(), ops.clone()]);
    refused(
        c.delete_user_tags(
            org.clone(),
            ts(),
            DeleteUserTagsIntent { user_tag_ids: vec![admins.clone(), UNKNOWN_ID.into()] },
        )
        .await,
        404,
        "REQUEST_INVALID",
        "user tag not found",
    );
    assert_eq!(list().await.unwrap().user_tags.len(), 2);
    let del = c
        .delete_user_tags(org.clone(), ts(), DeleteUserTagsIntent { user_tag_ids: vec![admins.clone()] })
        .await
        .unwrap()
        .result;
    assert_eq!(del.user_tag_ids, vec![admins.clone()]);
    assert_eq!(del.user_ids, vec![cu.clone()]);
    assert_eq!(user(&c, &org, &cu).await.user_tags, vec![ops.clone()]);
    // Deleting a user drops its memberships.
    c.delete_users(org.clone(), ts(), DeleteUsersIntent { user_ids: vec![b.clone()] }).await.unwrap();
    let del = c
        .delete_user_tags(org.clone(), ts(), DeleteUserTagsIntent { user_tag_ids: vec![ops.clone()] })
        .await
        .unwrap()
        .result;
    assert_eq!(del.user_ids, vec![cu.clone()]);
    assert!(list().await.unwrap().user_tags.is_empty());
    assert!(users(&c, &org).await.iter().all(|u| u.user_tags.is_empty()));

    // Private-key tags.
    let keys = c
        .create_private_keys(
            org.clone(),
            ts(),
            CreatePrivateKeysIntentV2 {
                private_keys: ["k1", "k2"]
                    .into_iter()
                    .map(|n| PrivateKeyParams {
                        private_key_name: n.into(),
                        curve: Curve::Secp256k1,
                        private_key_tags: vec![],
                        address_formats: vec![AddressFormat::Ethereum],
                    })
                    .collect(),
                external_signer_pubkey: None,
                external_signer_wrapping_key_id: None,
            },
        )
        .await
        .unwrap()
        .result
        .private_keys;
    let (k1, k2) = (keys[0].private_key_id.clone(), keys[1].private_key_id.clone());
    let hot = c
        .create_private_key_tag(
            org.clone(),
            ts(),
            CreatePrivateKeyTagIntent { private_key_tag_name: "hot".into(), private_key_ids: vec![k1.clone()] },
        )
        .await
        .unwrap()
        .result;
    assert_eq!(hot.private_key_ids, vec![k1.clone()]);
    let hot = hot.private_key_tag_id;
    assert_eq!(key_tags(&c, &org, k1.clone()).await, vec![hot.clone()]);
    // A second tag; a name twice within the kind is refused.
    c.create_private_key_tag(
        org.clone(),
        ts(),
        CreatePrivateKeyTagIntent { private_key_tag_name: "cold".into(), private_key_ids: vec![] },
    )
    .await
    .unwrap();
    refused(
        c.create_private_key_tag(
            org.clone(),
            ts(),
            CreatePrivateKeyTagIntent { private_key_tag_name: "hot".into(), private_key_ids: vec![] },
        )
        .await,
        400,
        "REQUEST_INVALID",
        "private key tag name must be unique",
    );
    let pk_update = |name: Option<&str>, add: Vec<String>, remove: Vec<String>| UpdatePrivateKeyTagIntent {
        private_key_tag_id: hot.clone(),
        new_private_key_tag_name: name.map(String::from),
        add_private_key_ids: add,
        remove_private_key_ids: remove,
    };
    refused(
        c.update_private_key_tag(org.clone(), ts(), pk_update(Some("cold"), vec![k2.clone()], vec![k1.clone()])).await,
        400,
        "REQUEST_INVALID",
        "private key tag name must be unique",
    );
    refused(
        c.update_private_key_tag(
            org.clone(),
            ts(),
            pk_update(Some("warm"), vec![k2.clone(), UNKNOWN_ID.into()], vec![]),
        )
        .await,
        404,
        "REQUEST_INVALID",
        "private key not found",
    );
    assert_eq!(key_tags(&c, &org, k1.clone()).await, vec![hot.clone()]);
    assert!(key_tags(&c, &org, k2.clone()).await.is_empty());
    let pk_list = || c.list_private_key_tags(ListPrivateKeyTagsRequest { organization_id: org.clone() });
    let names = pk_list().await.unwrap().private_key_tags;
    assert_eq!(names.iter().map(|t| t.tag_name.as_str()).collect::<Vec<_>>(), vec!["hot", "cold"]);
    assert!(names.iter().all(|t| t.tag_type == TagType::PrivateKey));

    c.update_private_key_tag(org.clone(), ts(), pk_update(Some("warm"), vec![k2.clone()], vec![k1.clone()]))
        .await
        .unwrap();
    assert!(key_tags(&c, &org, k1.clone()).await.is_empty());
    assert_eq!(key_tags(&c, &org, k2.clone()).await, vec![hot.clone()]);
    assert!(pk_list().await.unwrap().private_key_tags.iter().any(|t| t.tag_id == hot && t.tag_name == "warm"));
    let del = c
        .delete_private_key_tags(
            org.clone(),
            ts(),
            DeletePrivateKeyTagsIntent { private_key_tag_ids: vec![hot.clone()] },
        )
        .await
        .unwrap()
        .result;
    assert_eq!((del.private_key_tag_ids, del.private_key_ids), (vec![hot.clone()], vec![k2.clone()]));
    assert!(key_tags(&c, &org, k2).await.is_empty());
    assert_eq!(pk_list().await.unwrap().private_key_tags.len(), 1);
}

#[tokio::test]
async fn a_users_name_email_and_phone_number_change_one_at_a_time() {
    use turnkey_client::generated::{UpdateUserEmailIntent, UpdateUserNameIntent, UpdateUserPhoneNumberIntent};
    let stack = Stack::start().await;
    let root = stack.client();
    let org = stack.organization_id.clone();
    let alice_key = TurnkeyP256ApiKey::generate();
    let mut params = user_params("alice", vec![p256_params("laptop", &alice_key, None)], vec![]);
    params.user_email = Some("alice@example.com".into());
    params.user_phone_number = Some("+13214567890".into());
    let alice_id = root
        .create_users(org.clone(), root.current_timestamp(), CreateUsersIntentV4 { users: vec![params] })
        .await
        .unwrap()
        .result
        .user_ids[0]
        .clone();

    // Each changes its one field and answers the user's id, in the client's result shape.
    let named = root
        .update_user_name(
            org.clone(),
            root.current_timestamp(),
            UpdateUserNameIntent { user_id: alice_id.clone(), user_name: "Alice B.".into() },
        )
        .await
        .unwrap();
    assert_eq!(named.result.user_id, alice_id);
    let emailed = root
        .update_user_email(
            org.clone(),
            root.current_timestamp(),
            UpdateUserEmailIntent {
                user_id: alice_id.clone(),
                user_email: "alice@new.example".into(),
                verification_token: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(emailed.result.user_id, alice_id);
    let u = user(&root, &org, &alice_id).await;
    assert_eq!(
        (u.user_name.as_str(), u.user_email.as_deref(), u.user_phone_number.as_deref()),
        ("Alice B.", Some("alice@new.example"), Some("+13214567890"))
    );
    // An empty phone number clears it; a malformed one is refused and changes nothing.
    root.update_user_phone_number(
        org.clone(),
        root.current_timestamp(),
        UpdateUserPhoneNumberIntent {
            user_id: alice_id.clone(),
            user_phone_number: String::new(),
            verification_token: None,
        },
    )
    .await
    .unwrap();
    let r = root
        .update_user_phone_number(
            org.clone(),
            root.current_timestamp(),
            UpdateUserPhoneNumberIntent {
                user_id: alice_id.clone(),
                user_phone_number: "call me".into(),
                verification_token: None,
            },
        )
        .await;
    assert!(matches!(r, Err(TurnkeyClientError::UnexpectedHttpStatus(400, _))), "{r:?}");
    let r = root
        .update_user_name(
            org.clone(),
            root.current_timestamp(),
            UpdateUserNameIntent { user_id: UNKNOWN_ID.into(), user_name: "ghost".into() },
        )
        .await;
    assert!(matches!(r, Err(TurnkeyClientError::UnexpectedHttpStatus(404 | 400, _))), "{r:?}");
    let u = user(&root, &org, &alice_id).await;
    assert_eq!((u.user_name.as_str(), u.user_phone_number.as_deref()), ("Alice B.", None));

    // Alice may rename herself; renaming the root user, with no policy allowing her, is refused
    // by the enclave and changes nothing.
    let alice_public = hex::encode(alice_key.compressed_public_key());
    let alice_again =
        TurnkeyP256ApiKey::from_strings(hex::encode(alice_key.private_key()), Some(alice_public)).unwrap();
    let alice = stack.client_with(alice_key);
    alice
        .update_user_name(
            org.clone(),
            alice.current_timestamp(),
            UpdateUserNameIntent { user_id: alice_id.clone(), user_name: "Al".into() },
        )
        .await
        .unwrap();
    let body = serde_json::json!({
        "type": "ACTIVITY_TYPE_UPDATE_USER_NAME",
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org,
        "parameters": { "userId": stack.user_id, "userName": "taken over" },
    })
    .to_string();
    stack.refusals_accounted();
    let r = stack.post_raw("/public/v1/submit/update_user_name", body.as_bytes(), Some(&alice_again)).await;
    stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", coffer_proto::v1::RefusalReason::PolicyDenied);
    assert_eq!(user(&root, &org, &alice_id).await.user_name, "Al");
    assert_eq!(user(&root, &org, &stack.user_id).await.user_name, "root");

    // The same bytes again are the same activity.
    let body = serde_json::json!({
        "type": "ACTIVITY_TYPE_UPDATE_USER_EMAIL",
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org,
        "parameters": { "userId": alice_id, "userEmail": "" },
    })
    .to_string();
    let first = stack.post_raw("/public/v1/submit/update_user_email", body.as_bytes(), Some(&stack.api_key())).await;
    let again = stack.post_raw("/public/v1/submit/update_user_email", body.as_bytes(), Some(&stack.api_key())).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.json["activity"]["id"], again.json["activity"]["id"]);
    assert_eq!(first.json["activity"]["result"]["updateUserEmailResult"]["userId"], alice_id.as_str());
    assert_eq!(first.json["activity"]["intent"]["updateUserEmailIntent"]["userId"], alice_id.as_str());
    assert_eq!(user(&root, &org, &alice_id).await.user_email, None);
    api_only_users(&stack, &alice_again).await;
}

/// `create_api_only_users` (no method in the Rust client: its request types, posted stamped):
/// users with P-256 API keys alone, whose keys stamp at once; a user without a policy is refused
/// by the enclave; bad names and emails change nothing.
async fn api_only_users(stack: &Stack, alice: &TurnkeyP256ApiKey) {
    use turnkey_client::generated::immutable::activity::api::ApiKeyParams;
    use turnkey_client::generated::immutable::activity::v1::{ApiOnlyUserParams, CreateApiOnlyUsersIntent};
    let org = stack.organization_id.clone();
    let ci_key = TurnkeyP256ApiKey::generate();
    let intent = |name: &str, email: Option<&str>, key: &TurnkeyP256ApiKey| {
        serde_json::to_value(CreateApiOnlyUsersIntent {
            api_only_users: vec![ApiOnlyUserParams {
                user_name: name.into(),
                user_email: email.map(String::from),
                user_tags: vec![],
                api_keys: vec![ApiKeyParams {
                    api_key_name: "deploy".into(),
                    public_key: hex::encode(key.compressed_public_key()),
                    expiration_seconds: Some("3600".into()),
                }],
            }],
        })
        .unwrap()
    };
    let ty = "ACTIVITY_TYPE_CREATE_API_ONLY_USERS";
    stack.refusals_accounted();
    let r = coffer_tests::submit(stack, alice, &org, "create_api_only_users", ty, intent("ci", None, &ci_key)).await;
    stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", coffer_proto::v1::RefusalReason::PolicyDenied);
    for (name, email, needle) in
        [("ci\nfake log line", None, "control characters"), ("ci", Some("not-an-address"), "invalid email")]
    {
        let r = coffer_tests::submit(
            stack,
            &stack.api_key(),
            &org,
            "create_api_only_users",
            ty,
            intent(name, email, &ci_key),
        )
        .await;
        assert_eq!(r.status, 400, "{}", r.text);
        assert!(r.text.contains(needle), "{}", r.text);
    }
    let r = coffer_tests::submit(
        stack,
        &stack.api_key(),
        &org,
        "create_api_only_users",
        ty,
        intent("ci", Some("ci@example.com"), &ci_key),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let activity = &r.json["activity"];
    assert_eq!(activity["type"], ty);
    let user_id = activity["result"]["createApiOnlyUsersResult"]["userIds"][0].as_str().expect("a user id").to_string();
    assert_eq!(activity["intent"]["createApiOnlyUsersIntent"]["apiOnlyUsers"][0]["userName"], "ci");
    // The new key stamps as the new user, with no authenticator, a P-256 key that expires.
    let ci = stack.client_with(ci_key);
    let whoami = ci.get_whoami(GetWhoamiRequest { organization_id: org.clone() }).await.unwrap();
    assert_eq!(whoami.user_id, user_id);
    let u = user(&stack.client(), &org, &user_id).await;
    assert_eq!((u.user_name.as_str(), u.user_email.as_deref()), ("ci", Some("ci@example.com")));
    assert!(u.authenticators.is_empty());
    assert_eq!(u.api_keys.len(), 1);
    assert_eq!(u.api_keys[0].credential.as_ref().unwrap().r#type, CredentialType::ApiKeyP256);
    assert!(u.api_keys[0].expiration_seconds.is_some());
}
