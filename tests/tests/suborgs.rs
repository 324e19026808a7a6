//! End to end: sub-organizations — creation with root users, API keys and a wallet sealed to the
//! new organization, isolation between parent and sub-organizations, `list_suborgs` filters,
//! and deletion (export rule, the record kept in the parent's log, every row and sealed blob
//! gone), through the official Rust client against the real binaries.

use coffer_gateway::store::Store;
use coffer_tests::oidc;
use coffer_tests::{recover_eth_address, refused, Stack};
use serde_json::json;
use sha2::Digest;
use turnkey_client::generated::external::options::v1::Pagination;
use turnkey_client::generated::immutable::activity::v1::ActivityType;
use turnkey_client::generated::immutable::common::v1::{
    AddressFormat, ApiKeyCurve, Curve, HashFunction, PathFormat, PayloadEncoding,
};
use turnkey_client::generated::oauth_provider_params_v2::TokenOrClaims;
use turnkey_client::generated::{
    ApiKeyParamsV2, CreateSubOrganizationIntentV8, CreateSubOrganizationResultV8, CreateUsersIntentV4,
    CreateWalletIntent, DeleteSubOrganizationIntent, ExportWalletIntent, GetActivitiesRequest, GetActivityRequest,
    GetOrganizationConfigsRequest, GetSubOrgIdsRequest, GetUsersRequest, GetWalletAccountsRequest, GetWalletsRequest,
    GetWhoamiRequest, GetWhoamiResponse, OauthProviderParamsV2, OidcClaims, RootUserParamsV5, SignRawPayloadIntentV2,
    UserParamsV4, WalletAccountParams, WalletParams,
};
use turnkey_client::{TurnkeyClient, TurnkeyClientError, TurnkeyP256ApiKey};

type Client = TurnkeyClient<TurnkeyP256ApiKey>;

fn eth_account() -> WalletAccountParams {
    WalletAccountParams {
        curve: Curve::Secp256k1,
        path_format: PathFormat::Bip32,
        path: "m/44'/60'/0'/0/0".into(),
        address_format: AddressFormat::Ethereum,
        name: None,
    }
}

fn wallet(name: &str) -> WalletParams {
    WalletParams { wallet_name: name.into(), accounts: vec![eth_account()], mnemonic_length: None }
}

fn api_key(name: &str, key: &TurnkeyP256ApiKey) -> ApiKeyParamsV2 {
    ApiKeyParamsV2 {
        api_key_name: name.into(),
        public_key: hex::encode(key.compressed_public_key()),
        curve_type: ApiKeyCurve::P256,
        expiration_seconds: None,
    }
}

fn root_user(name: &str, email: Option<&str>, api_keys: Vec<ApiKeyParamsV2>) -> RootUserParamsV5 {
    RootUserParamsV5 {
        user_name: name.into(),
        user_email: email.map(String::from),
        user_phone_number: None,
        api_keys,
        authenticators: vec![],
        oauth_providers: vec![],
    }
}

fn intent(
    name: &str,
    root_users: Vec<RootUserParamsV5>,
    threshold: i32,
    wallet: Option<WalletParams>,
) -> CreateSubOrganizationIntentV8 {
    CreateSubOrganizationIntentV8 {
        sub_organization_name: name.into(),
        root_users,
        root_quorum_threshold: threshold,
        wallet,
        disable_email_recovery: None,
        disable_email_auth: None,
        disable_sms_auth: None,
        disable_otp_email_auth: None,
        verification_token: None,
        client_signature: None,
    }
}

async fn create(
    c: &Client,
    parent: &str,
    intent: CreateSubOrganizationIntentV8,
) -> Result<CreateSubOrganizationResultV8, TurnkeyClientError> {
    c.create_sub_organization(parent.into(), c.current_timestamp(), intent).await.map(|r| r.result)
}

async fn delete(c: &Client, org: &str, without_export: Option<bool>) -> Result<String, TurnkeyClientError> {
    c.delete_sub_organization(
        org.into(),
        c.current_timestamp(),
        DeleteSubOrganizationIntent { delete_without_export: without_export },
    )
    .await
    .map(|r| r.result.sub_organization_uuid)
}

async fn list_page(
    c: &Client,
    org: &str,
    filter_type: &str,
    filter_value: &str,
    page: Option<Pagination>,
) -> Result<Vec<String>, TurnkeyClientError> {
    c.get_sub_org_ids(GetSubOrgIdsRequest {
        organization_id: org.into(),
        filter_type: filter_type.into(),
        filter_value: filter_value.into(),
        pagination_options: page,
    })
    .await
    .map(|r| r.organization_ids)
}

async fn list(c: &Client, org: &str, filter_type: &str, filter_value: &str) -> Vec<String> {
    list_page(c, org, filter_type, filter_value, None).await.unwrap()
}

async fn whoami(c: &Client, org: &str) -> Result<GetWhoamiResponse, TurnkeyClientError> {
    c.get_whoami(GetWhoamiRequest { organization_id: org.into() }).await
}

async fn wallet_count(c: &Client, org: &str) -> Result<usize, TurnkeyClientError> {
    c.get_wallets(GetWalletsRequest { organization_id: org.into() }).await.map(|r| r.wallets.len())
}

/// The gateway's own database file, opened beside the running gateway (WAL mode allows it):
/// the deletion is checked in the rows themselves, not only through the API.
/// The stack's own store (SQLite or PostgreSQL), opened beside its gateway.
fn database(stack: &Stack) -> std::sync::Arc<dyn Store> {
    coffer_gateway::store::open(stack.store_url()).unwrap()
}

/// Rows of each table that belong to `org`, leaving out the empty tables.
fn rows(db: &std::sync::Arc<dyn Store>, org: &str) -> Vec<(String, i64)> {
    db.organization_footprint(org).unwrap().into_iter().filter(|(_, n)| *n > 0).collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Where any of `blobs` is still stored in the stack's own store: on SQLite the bytes of the
/// database file and its WAL (the file must exist; a WAL the gateway truncated is empty); on
/// PostgreSQL every row of every table of the database the gateway uses, rendered as text
/// (a `bytea` renders as lowercase hex), searched for each blob's hex. Names the places
/// ("coffer.db", "wallets", …) it was found in. Any other store, or a store that cannot be read,
/// fails the test: the absence check never passes without looking.
fn blob_locations(stack: &Stack, blobs: &[&[u8]]) -> Vec<String> {
    let url = stack.store_url().to_string();
    if url.starts_with("sqlite://") {
        let db = stack.database_path();
        let wal = db.with_file_name("coffer.db-wal");
        let main = std::fs::read(&db).unwrap_or_else(|e| panic!("reading {}: {e}", db.display()));
        assert!(!main.is_empty(), "{} is empty", db.display());
        let wal_bytes = match std::fs::read(&wal) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("reading {}: {e}", wal.display()),
        };
        [("coffer.db", main), ("coffer.db-wal", wal_bytes)]
            .into_iter()
            .filter(|(_, bytes)| blobs.iter().any(|b| contains(bytes, b)))
            .map(|(f, _)| f.to_string())
            .collect()
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let needles: Vec<String> = blobs.iter().map(hex::encode).collect();
        // Off the async runtime: the blocking client runs one of its own.
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connecting to the stack's database");
            let tables: Vec<String> = c
                .query(
                    "SELECT table_name::text FROM information_schema.tables \
                     WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY 1",
                    &[],
                )
                .expect("listing the tables")
                .iter()
                .map(|r| r.get(0))
                .collect();
            for t in ["wallets", "wallet_accounts", "organizations", "activities"] {
                assert!(tables.iter().any(|x| x == t), "no table {t} in the stack's database: {tables:?}");
            }
            let mut found = Vec::new();
            for t in &tables {
                for n in &needles {
                    let q = format!("SELECT count(*) FROM \"{t}\" AS r WHERE strpos(r::text, $1) > 0");
                    let hits: i64 =
                        c.query_one(q.as_str(), &[n]).unwrap_or_else(|e| panic!("searching {t}: {e}")).get(0);
                    if hits > 0 && !found.contains(t) {
                        found.push(t.clone());
                    }
                }
            }
            found
        })
        .join()
        .unwrap()
    } else {
        panic!("cannot look for the sealed blobs in the store {url:?}: neither sqlite:// nor postgres://")
    }
}

#[tokio::test]
async fn sub_organization_lifecycle_isolation_and_deletion() {
    let stack = Stack::start().await;
    let parent = stack.client();
    let p = stack.organization_id.clone();
    let db = database(&stack);

    // --- create: a root user holding an API key, and a wallet with an Ethereum account -------
    let alice_key = TurnkeyP256ApiKey::generate();
    let alice_pub = hex::encode(alice_key.compressed_public_key());
    let created = parent
        .create_sub_organization(
            p.clone(),
            parent.current_timestamp(),
            intent(
                "sub-alpha",
                vec![root_user("alice", Some("Alice@Example.com"), vec![api_key("alice-key", &alice_key)])],
                1,
                Some(wallet("alpha-wallet")),
            ),
        )
        .await
        .unwrap();
    let activity_id = created.activity_id.clone();
    let created = created.result;
    let s1 = created.sub_organization_id.clone();
    assert_eq!(created.root_user_ids.len(), 1);
    let alice_id = created.root_user_ids[0].clone();
    let w = created.wallet.clone().expect("wallet result");
    assert_eq!(w.addresses.len(), 1);
    let address = w.addresses[0].clone();
    assert!(address.starts_with("0x") && address.len() == 42, "{address}");
    // The creation is recorded in the parent's log.
    let a = parent
        .get_activity(GetActivityRequest { organization_id: p.clone(), activity_id: activity_id.clone() })
        .await
        .unwrap()
        .activity
        .unwrap();
    assert_eq!(a.organization_id, p);
    assert_eq!(a.r#type, ActivityType::CreateSubOrganizationV8);

    // The sub-organization's key: whoami names the sub-organization and its root user.
    let alice = stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(alice_key.private_key()), None).unwrap());
    let who = whoami(&alice, &s1).await.unwrap();
    assert_eq!(
        (who.organization_id.as_str(), who.organization_name.as_str(), who.user_id.as_str(), who.username.as_str()),
        (s1.as_str(), "sub-alpha", alice_id.as_str(), "alice")
    );
    // Its root quorum and login features.
    let configs = alice
        .get_organization_configs(GetOrganizationConfigsRequest { organization_id: s1.clone() })
        .await
        .unwrap()
        .configs
        .unwrap();
    let quorum = configs.quorum.unwrap();
    assert_eq!((quorum.threshold, quorum.user_ids.clone()), (1, vec![alice_id.clone()]));
    assert_eq!(configs.features.len(), 4, "{:?}", configs.features);

    // It signs with the sub-organization's wallet: the signature recovers to the address.
    let sig = alice
        .sign_raw_payload(
            s1.clone(),
            alice.current_timestamp(),
            SignRawPayloadIntentV2 {
                sign_with: address.clone(),
                payload: "hello sub-org".into(),
                encoding: PayloadEncoding::TextUtf8,
                hash_function: HashFunction::Keccak256,
                external_signer_pubkey: None,
            },
        )
        .await
        .unwrap()
        .result;
    let digest: [u8; 32] = sha3::Keccak256::digest(b"hello sub-org").into();
    assert_eq!(recover_eth_address(&digest, &sig.r, &sig.s, &sig.v), address.to_lowercase());

    // --- isolation ----------------------------------------------------------------------------
    // The parent reads the sub-organization's wallets, accounts and users...
    assert_eq!(wallet_count(&parent, &s1).await.unwrap(), 1);
    let accounts = parent
        .get_wallet_accounts(GetWalletAccountsRequest {
            organization_id: s1.clone(),
            wallet_id: Some(w.wallet_id.clone()),
            include_wallet_details: None,
            pagination_options: None,
        })
        .await
        .unwrap()
        .accounts;
    assert_eq!(accounts.iter().map(|a| a.address.as_str()).collect::<Vec<_>>(), [address.as_str()]);
    let users = parent.get_users(GetUsersRequest { organization_id: s1.clone() }).await.unwrap().users;
    assert_eq!(users.len(), 1);
    assert_eq!(users[0].user_email.as_deref(), Some("Alice@Example.com"));
    // ...but cannot act in it: 403, and nothing was created.
    let in_sub =
        CreateWalletIntent { wallet_name: "parent-made".into(), accounts: vec![eth_account()], mnemonic_length: None };
    refused(
        parent.create_wallet(s1.clone(), parent.current_timestamp(), in_sub.clone()).await,
        403,
        "REQUEST_NOT_AUTHORIZED",
        "request not authorized",
    );
    assert_eq!(wallet_count(&alice, &s1).await.unwrap(), 1);
    // The sub-organization's key is nobody in the parent: 401 for reads and acts alike.
    // (whoami is left out here: the spec lets it find a sub-organization's user from the parent's id.)
    refused(wallet_count(&alice, &p).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");
    refused(
        alice.create_wallet(p.clone(), alice.current_timestamp(), in_sub.clone()).await,
        401,
        "PUBLIC_KEY_NOT_FOUND",
        "could not find public key",
    );
    assert_eq!(wallet_count(&parent, &p).await.unwrap(), 0);

    // A second sub-organization: the two never see each other.
    let bob_key = TurnkeyP256ApiKey::generate();
    let bob_pub = hex::encode(bob_key.compressed_public_key());
    let s2 = create(
        &parent,
        &p,
        intent("sub-beta", vec![root_user("bob", None, vec![api_key("bob-key", &bob_key)])], 1, None),
    )
    .await
    .unwrap()
    .sub_organization_id;
    let bob = stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(bob_key.private_key()), None).unwrap());
    assert_eq!(whoami(&bob, &s2).await.unwrap().username, "bob");
    refused(whoami(&alice, &s2).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");
    refused(wallet_count(&alice, &s2).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");
    refused(whoami(&bob, &s1).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");
    refused(wallet_count(&bob, &s1).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");
    refused(
        bob.create_wallet(s1.clone(), bob.current_timestamp(), in_sub.clone()).await,
        401,
        "PUBLIC_KEY_NOT_FOUND",
        "could not find public key",
    );
    refused(wallet_count(&bob, &p).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");
    // A sub-organization cannot have sub-organizations of its own.
    refused(
        create(
            &bob,
            &s2,
            intent("nested", vec![root_user("n", None, vec![api_key("n", &TurnkeyP256ApiKey::generate())])], 1, None),
        )
        .await,
        400,
        "REQUEST_INVALID",
        "cannot have sub-organizations",
    );

    // --- list_suborgs -------------------------------------------------------------------------
    assert_eq!(list(&parent, &p, "", "").await, [s1.clone(), s2.clone()]);
    assert_eq!(list(&parent, &p, "NAME", "sub-alpha").await, vec![s1.clone()]);
    assert_eq!(list(&parent, &p, "NAME", "sub-beta").await, vec![s2.clone()]);
    assert_eq!(list(&parent, &p, "USERNAME", "bob").await, vec![s2.clone()]);
    assert_eq!(list(&parent, &p, "USERNAME", "alice").await, vec![s1.clone()]);
    assert_eq!(list(&parent, &p, "EMAIL", "alice@example.com").await, vec![s1.clone()]);
    assert_eq!(list(&parent, &p, "PUBLIC_KEY", &bob_pub).await, vec![s2.clone()]);
    assert_eq!(list(&parent, &p, "PUBLIC_KEY", &alice_pub).await, vec![s1.clone()]);
    assert_eq!(list(&parent, &p, "WALLET_ACCOUNT_ADDRESS", &address).await, vec![s1.clone()]);
    assert_eq!(list(&parent, &p, "WALLET_ACCOUNT_ADDRESS", &address.to_lowercase()).await, vec![s1.clone()]);
    for (ty, value) in [("NAME", "nobody"), ("USERNAME", "carol"), ("PUBLIC_KEY", stack.api_public_key.as_str())] {
        assert!(list(&parent, &p, ty, value).await.is_empty(), "{ty} {value}");
    }
    let page =
        |limit: &str, after: &str| Some(Pagination { limit: limit.into(), before: String::new(), after: after.into() });
    assert_eq!(list_page(&parent, &p, "", "", page("1", "")).await.unwrap(), vec![s1.clone()]);
    assert_eq!(list_page(&parent, &p, "", "", page("1", &s1)).await.unwrap(), vec![s2.clone()]);
    assert!(list_page(&parent, &p, "", "", page("1", &s2)).await.unwrap().is_empty());
    refused(list_page(&parent, &p, "", "", page("1", &p)).await, 400, "REQUEST_INVALID", "invalid pagination cursor");
    refused(list_page(&parent, &p, "COLOR", "blue", None).await, 400, "REQUEST_INVALID", "invalid filter type");
    refused(list_page(&parent, &p, "NAME", "", None).await, 400, "REQUEST_INVALID", "filterValue is required");
    // A sub-organization has none; its key cannot list the parent's.
    assert!(list(&alice, &s1, "", "").await.is_empty());
    refused(list_page(&alice, &p, "", "", None).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");

    // --- delete -------------------------------------------------------------------------------
    let before = rows(&db, &s1);
    let tables: Vec<&str> = before.iter().map(|(t, _)| t.as_str()).collect();
    for t in ["activities", "api_keys", "organizations", "records", "users", "wallet_accounts", "wallets"] {
        assert!(tables.contains(&t), "{t} missing from {before:?}");
    }
    let sealed_seed = db.wallet(&s1, &w.wallet_id).unwrap().sealed_seed;
    let sealed_account = db.accounts(&s1, Some(&w.wallet_id)).unwrap().remove(0).sealed_key;
    // The positive control for the absence check after the deletion: the blobs are found now.
    for blob in [&sealed_seed, &sealed_account] {
        assert!(blob.len() >= 32, "a sealed blob of {} bytes", blob.len());
        let at = blob_locations(&stack, &[blob]);
        assert!(!at.is_empty(), "the sealed blob {} is not found in the store before the deletion", hex::encode(blob));
    }
    let parent_activities = stack.activity_count(&stack.api_key(), &p).await;

    // Only a sub-organization can be deleted: the parent deleting itself is refused.
    refused(delete(&parent, &p, Some(true)).await, 400, "REQUEST_INVALID", "not a sub-organization");
    // The parent's key may not delete it (acting in the sub-organization): 403.
    refused(delete(&parent, &s1, Some(true)).await, 403, "REQUEST_NOT_AUTHORIZED", "request not authorized");
    // Only root users may: a user alice adds is refused with 403.
    let carol_key = TurnkeyP256ApiKey::generate();
    alice
        .create_users(
            s1.clone(),
            alice.current_timestamp(),
            CreateUsersIntentV4 {
                users: vec![UserParamsV4 {
                    user_name: "carol".into(),
                    user_email: None,
                    user_phone_number: None,
                    api_keys: vec![api_key("carol-key", &carol_key)],
                    authenticators: vec![],
                    oauth_providers: vec![],
                    user_tags: vec![],
                }],
            },
        )
        .await
        .unwrap();
    let carol = stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(carol_key.private_key()), None).unwrap());
    refused(delete(&carol, &s1, Some(true)).await, 403, "REQUEST_NOT_AUTHORIZED", "only root quorum users");
    let before = rows(&db, &s1);

    // The wallet was never exported: without the flag, 400 and nothing changes.
    refused(
        delete(&alice, &s1, None).await,
        400,
        "WALLET_ACCOUNT_NOT_EXPORTED",
        "wallet account has not been exported",
    );
    refused(
        delete(&alice, &s1, Some(false)).await,
        400,
        "WALLET_ACCOUNT_NOT_EXPORTED",
        "wallet account has not been exported",
    );
    assert_eq!(rows(&db, &s1), before);
    assert_eq!(whoami(&alice, &s1).await.unwrap().organization_id, s1);
    assert_eq!(list(&parent, &p, "", "").await, [s1.clone(), s2.clone()]);
    assert_eq!(stack.activity_count(&stack.api_key(), &p).await, parent_activities);

    // With deleteWithoutExport: gone.
    assert_eq!(delete(&alice, &s1, Some(true)).await.unwrap(), s1);
    assert_eq!(list(&parent, &p, "", "").await, vec![s2.clone()]);
    assert!(list(&parent, &p, "NAME", "sub-alpha").await.is_empty());
    assert!(list(&parent, &p, "WALLET_ACCOUNT_ADDRESS", &address).await.is_empty());
    // Its credentials open nothing: the organization is unknown, and the key unknown elsewhere.
    refused(whoami(&alice, &s1).await, 404, "ORGANIZATION_NOT_FOUND", "no organization found");
    refused(wallet_count(&parent, &s1).await, 404, "ORGANIZATION_NOT_FOUND", "no organization found");
    refused(whoami(&alice, &p).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");
    refused(whoami(&alice, &s2).await, 401, "PUBLIC_KEY_NOT_FOUND", "could not find public key");
    // The record of the deletion is in the parent's log.
    assert_eq!(stack.activity_count(&stack.api_key(), &p).await, parent_activities + 1);
    let deleted = parent
        .get_activities(GetActivitiesRequest {
            organization_id: p.clone(),
            filter_by_status: vec![],
            pagination_options: None,
            filter_by_type: vec![ActivityType::DeleteSubOrganization],
        })
        .await
        .unwrap()
        .activities;
    assert_eq!(deleted.len(), 1);
    assert_eq!(deleted[0].organization_id, p);
    assert_eq!(deleted[0].votes[0].user_id, alice_id);
    // Its history stays, readable by the parent: the signature alice made in it is still on
    // record, in the sub-organization's own log.
    let history = parent
        .get_activities(GetActivitiesRequest {
            organization_id: s1.clone(),
            filter_by_status: vec![],
            pagination_options: None,
            filter_by_type: vec![],
        })
        .await
        .unwrap()
        .activities;
    assert!(history.iter().all(|a| a.organization_id == s1), "{history:?}");
    let signed = history.iter().find(|a| a.r#type == ActivityType::SignRawPayloadV2).expect("the signing is on record");
    let one = parent
        .get_activity(GetActivityRequest { organization_id: s1.clone(), activity_id: signed.id.clone() })
        .await
        .unwrap()
        .activity
        .unwrap();
    assert_eq!(one.votes[0].user_id, alice_id);
    refused(
        alice
            .get_activities(GetActivitiesRequest {
                organization_id: s1.clone(),
                filter_by_status: vec![],
                pagination_options: None,
                filter_by_type: vec![],
            })
            .await,
        401,
        "PUBLIC_KEY_NOT_FOUND",
        "could not find public key",
    );
    // Nothing else of it is left: only its activities, their policy evaluations and its row as a
    // tombstone; and the sealed blobs are not in the files.
    let left = rows(&db, &s1);
    assert!(
        left.iter().all(|(t, _)| {
            ["activities", "activity_log", "organizations", "policy_evaluations"].contains(&t.as_str())
        }),
        "{left:?}"
    );
    assert_eq!(left.iter().find(|(t, _)| t == "activities").map(|(_, n)| *n), Some(history.len() as i64));
    assert!(db.wallet(&s1, &w.wallet_id).is_err());
    // (secure_delete zeroes the new page versions; the gateway then truncates the WAL, which
    // still held the frames written at creation, moments after the deletion commits.)
    // (On PostgreSQL the rows are searched, on SQLite the files.)
    let mut left = Vec::new();
    for _ in 0..100 {
        left = blob_locations(&stack, &[&sealed_seed, &sealed_account]);
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(left.is_empty(), "a sealed blob of the deleted sub-organization is still in {left:?}");
    // The other sub-organization and the parent are untouched.
    assert_eq!(whoami(&bob, &s2).await.unwrap().organization_id, s2);
    assert_eq!(whoami(&parent, &p).await.unwrap().organization_id, p);
}

#[tokio::test]
async fn refusals_oauth_root_users_and_exported_deletion() {
    let stack = Stack::start().await;
    let parent = stack.client();
    let p = stack.organization_id.clone();
    let db = database(&stack);
    let key = TurnkeyP256ApiKey::generate();
    let user = |name: &str| root_user(name, None, vec![api_key(name, &TurnkeyP256ApiKey::generate())]);

    // --- refused creations change nothing -----------------------------------------------------
    let parent_rows = rows(&db, &p);
    let parent_activities = stack.activity_count(&stack.api_key(), &p).await;
    refused(
        create(&parent, &p, intent("t0", vec![user("a")], 0, None)).await,
        400,
        "REQUEST_INVALID",
        "quorum threshold must be non-zero integer",
    );
    refused(
        create(&parent, &p, intent("t3", vec![user("a"), user("b")], 3, None)).await,
        400,
        "REQUEST_INVALID",
        "rootQuorumThreshold 3 > 2 root users",
    );
    refused(
        create(&parent, &p, intent("none", vec![], 1, None)).await,
        400,
        "REQUEST_INVALID",
        "at least one root user",
    );
    let mut bad_key = api_key("bad", &key);
    bad_key.public_key = "04deadbeef".into();
    refused(
        create(&parent, &p, intent("bad-key", vec![root_user("a", None, vec![bad_key])], 1, Some(wallet("w")))).await,
        400,
        "REQUEST_INVALID",
        "invalid api key public key",
    );
    // One key twice across root users.
    refused(
        create(
            &parent,
            &p,
            intent(
                "dup",
                vec![root_user("a", None, vec![api_key("k", &key)]), root_user("b", None, vec![api_key("k", &key)])],
                1,
                None,
            ),
        )
        .await,
        400,
        "CREDENTIAL_CONFLICT",
        "already exists",
    );
    refused(
        create(&parent, &p, intent("nobody", vec![root_user("a", None, vec![])], 1, None)).await,
        400,
        "REQUEST_INVALID",
        "no way to authenticate",
    );
    // An email is a way in only while an email login is enabled.
    let mut no_email_login = intent("no-email", vec![root_user("a", Some("a@example.com"), vec![])], 1, None);
    no_email_login.disable_email_auth = Some(true);
    no_email_login.disable_otp_email_auth = Some(true);
    refused(create(&parent, &p, no_email_login).await, 400, "REQUEST_INVALID", "no way to authenticate");
    refused(
        create(
            &parent,
            &p,
            intent("bad-email", vec![root_user("a", Some("not-an-email"), vec![api_key("k", &key)])], 1, None),
        )
        .await,
        400,
        "INVALID_EMAIL",
        "invalid email",
    );
    let mut bad_wallet = intent("bad-wallet", vec![user("a")], 1, Some(wallet("w")));
    bad_wallet.wallet.as_mut().unwrap().accounts[0].path = String::new();
    refused(create(&parent, &p, bad_wallet).await, 400, "REQUEST_INVALID", "path is required");
    // Raw JSON the client cannot send: a threshold that is not an integer.
    let body = json!({
        "type": "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8",
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": p,
        "parameters": {"subOrganizationName": "raw", "rootUsers": [{"userName": "a", "apiKeys": [], "authenticators": [], "oauthProviders": [], "userEmail": "a@example.com"}], "rootQuorumThreshold": "one"},
    })
    .to_string();
    let r = stack.post_raw("/public/v1/submit/create_sub_organization", body.as_bytes(), Some(&stack.api_key())).await;
    assert_eq!(
        (r.status, r.json["message"].as_str()),
        (400, Some("quorum threshold must be non-zero integer")),
        "{}",
        r.text
    );
    assert!(list(&parent, &p, "", "").await.is_empty());
    assert_eq!(rows(&db, &p), parent_rows);
    assert_eq!(stack.activity_count(&stack.api_key(), &p).await, parent_activities);

    // --- an email-only root user, and one known by an OAuth identity --------------------------
    let issuer_key =
        p256::ecdsa::SigningKey::from_slice(&sha2::Sha256::digest(format!("suborgs-{}", Stack::now_ms()))).unwrap();
    let issuer = oidc::issuer(oidc::jwk(&issuer_key)).await;
    let now = (Stack::now_ms() / 1000) as i64;
    let token = oidc::es256_token(
        &issuer_key,
        &json!({"iss": issuer, "sub": "user-7", "aud": "coffer-app", "exp": now + 600, "iat": now}),
    );
    let mut two = intent(
        "two-roots",
        vec![
            root_user("dana", Some("dana@example.com"), vec![]),
            RootUserParamsV5 {
                oauth_providers: vec![OauthProviderParamsV2 {
                    provider_name: "local".into(),
                    token_or_claims: Some(TokenOrClaims::OidcToken(token.clone())),
                }],
                ..root_user("erin", None, vec![api_key("erin", &key)])
            },
        ],
        2,
        None,
    );
    two.disable_sms_auth = Some(true);
    let s3 = create(&parent, &p, two).await.unwrap();
    assert_eq!(s3.root_user_ids.len(), 2);
    let s3 = s3.sub_organization_id;
    let erin = stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(key.private_key()), None).unwrap());
    assert_eq!(whoami(&erin, &s3).await.unwrap().username, "erin");
    let configs = parent
        .get_organization_configs(GetOrganizationConfigsRequest { organization_id: s3.clone() })
        .await
        .unwrap()
        .configs
        .unwrap();
    assert_eq!(configs.quorum.unwrap().threshold, 2);
    let names: Vec<String> =
        configs.features.iter().map(|f| serde_json::to_value(f.name).unwrap().as_str().unwrap().to_string()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(!names.contains(&"FEATURE_NAME_SMS_AUTH".to_string()), "{names:?}");
    assert_eq!(list(&parent, &p, "OIDC_TOKEN", &token).await, vec![s3.clone()]);
    assert_eq!(list(&parent, &p, "EMAIL", "DANA@example.com").await, vec![s3.clone()]);
    refused(
        list_page(&parent, &p, "OIDC_TOKEN", "not.a.jwt", None).await,
        400,
        "INVALID_OIDC_TOKEN",
        "invalid OIDC token",
    );
    // The same identity by claims, in another sub-organization: both are found.
    let claims = RootUserParamsV5 {
        oauth_providers: vec![OauthProviderParamsV2 {
            provider_name: "claims".into(),
            token_or_claims: Some(TokenOrClaims::OidcClaims(OidcClaims {
                iss: issuer.clone(),
                sub: "user-7".into(),
                aud: "coffer-app".into(),
            })),
        }],
        ..root_user("frank", None, vec![])
    };
    let s4 = create(&parent, &p, intent("by-claims", vec![claims], 1, None)).await.unwrap().sub_organization_id;
    assert_eq!(list(&parent, &p, "OIDC_TOKEN", &token).await, [s3.clone(), s4.clone()]);
    // Threshold 2: erin alone cannot delete it; it waits for the quorum and nothing changes.
    let before = rows(&db, &s3);
    match delete(&erin, &s3, Some(true)).await {
        Err(TurnkeyClientError::ActivityRequiresApproval(_)) => {}
        other => panic!("expected the activity to wait for the root quorum, got {other:?}"),
    }
    assert!(whoami(&erin, &s3).await.is_ok());
    // (The waiting activity is recorded with its submitter's policy evaluation.)
    let recorded = |t: &str| t == "activities" || t == "policy_evaluations";
    let after: Vec<(String, i64)> = rows(&db, &s3).into_iter().filter(|(t, _)| !recorded(t)).collect();
    assert_eq!(after, before.into_iter().filter(|(t, _)| !recorded(t)).collect::<Vec<_>>());

    // --- an exported wallet may be deleted without the flag -----------------------------------
    let gina_key = TurnkeyP256ApiKey::generate();
    let s5 = create(
        &parent,
        &p,
        intent("exported", vec![root_user("gina", None, vec![api_key("g", &gina_key)])], 1, Some(wallet("gw"))),
    )
    .await
    .unwrap();
    let wallet_id = s5.wallet.unwrap().wallet_id;
    let s5 = s5.sub_organization_id;
    let gina = stack.client_with(TurnkeyP256ApiKey::from_strings(hex::encode(gina_key.private_key()), None).unwrap());
    let mut target = turnkey_enclave_encrypt::ExportClient::new(&stack.quorum_public_key());
    let exported = gina
        .export_wallet(
            s5.clone(),
            gina.current_timestamp(),
            ExportWalletIntent { wallet_id, target_public_key: target.target_public_key().unwrap(), language: None },
        )
        .await
        .unwrap();
    let phrase = target.decrypt_wallet_mnemonic_phrase(&exported.result.export_bundle, &s5).unwrap();
    assert_eq!(phrase.split(' ').count(), 12);
    assert_eq!(delete(&gina, &s5, None).await.unwrap(), s5);
    // What is left is the export's record (with its policy evaluation) and the tombstone.
    let left = rows(&db, &s5);
    assert_eq!(
        left.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(),
        ["activities", "activity_log", "organizations", "policy_evaluations"]
    );
    assert_eq!(left[0].1, 1, "the export_wallet activity");
    assert_eq!(list(&parent, &p, "", "").await, [s3, s4]);
}
