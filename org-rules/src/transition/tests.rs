//! Each transition: the changes it computes from the stamped body are the ones the handler's
//! records stand for (and apply), and not one with a security-relevant field changed.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::*;
use crate::effect::Effect;
use crate::model::{
    Account, ContractInterface, Credential, Named, OrgState, Organization, Policy, PrivateKey, Tag, User, Wallet,
};

const NOW: i64 = 1_000_000;

fn state() -> OrgState {
    let mut s = OrgState::new(Organization {
        id: "o".into(),
        root_quorum_threshold: 1,
        root_user_ids: vec!["r".into()],
        ..Default::default()
    });
    for u in ["r", "u"] {
        s.apply(&Effect::PutUser { user: User { id: u.into(), name: u.into(), ..Default::default() } }).unwrap();
    }
    s
}

fn derive(label: &str, n: usize) -> String {
    format!("{label}-{n}")
}

fn c(effect: Effect) -> Change {
    Change { organization_id: "o".into(), effect }
}

/// What the enclave's own work made for the activity (none by default).
#[derive(Default)]
struct Work {
    wallet_addresses: Vec<String>,
    auth_proxy_key_issued: bool,
}

/// Whether the changes `expected` computes are `changes`: `Err(None)` when they differ,
/// `Err(Some(_))` when the body is refused.
fn run(
    s: &OrgState,
    ty: &str,
    params: &Value,
    changes: &[Change],
    grants: &[Grant],
) -> Result<(), Option<TransitionError>> {
    run_with(s, ty, params, changes, grants, &Work::default())
}

fn run_with(
    s: &OrgState,
    ty: &str,
    params: &Value,
    changes: &[Change],
    grants: &[Grant],
    w: &Work,
) -> Result<(), Option<TransitionError>> {
    let input = Input {
        state: s,
        activity_type: ty,
        params,
        now_ms: NOW,
        derive_id: &derive,
        grants,
        wallet_addresses: &w.wallet_addresses,
        auth_proxy_key_issued: w.auth_proxy_key_issued,
    };
    match expected(&input) {
        Ok(got) if got == changes => Ok(()),
        Ok(_) => Err(None),
        Err(e) => Err(Some(e)),
    }
}

/// The id of the `n`th credential of `kind` the body lists for `user`.
fn kid(kind: CredentialKind, user: &str, n: usize) -> String {
    derive(&credential_id_label(kind, user), n)
}

/// Applies changes: this organization's changes to `s`, a new organization's to a new state.
fn apply(s: &OrgState, changes: &[Change]) {
    let mut states: BTreeMap<String, OrgState> = BTreeMap::new();
    states.insert(s.organization.id.clone(), s.clone());
    for ch in changes {
        let st = states.entry(ch.organization_id.clone()).or_default();
        st.apply(&ch.effect).unwrap_or_else(|e| panic!("{ch:?}: {e}"));
    }
}

/// `good` is what the body asks and applies; no `(why, bad)` is.
fn case(s: &OrgState, ty: &str, params: Value, grants: &[Grant], good: Vec<Change>, bad: Vec<(&str, Vec<Change>)>) {
    case_with(s, ty, params, grants, &Work::default(), good, bad)
}

fn case_with(
    s: &OrgState,
    ty: &str,
    params: Value,
    grants: &[Grant],
    w: &Work,
    good: Vec<Change>,
    bad: Vec<(&str, Vec<Change>)>,
) {
    assert_eq!(run_with(s, ty, &params, &good, grants, w), Ok(()), "{ty}");
    apply(s, &good);
    for (why, changes) in bad {
        assert!(run_with(s, ty, &params, &changes, grants, w).is_err(), "{ty}: {why} was computed");
    }
    // Nothing at all, and one change too many, are not it either.
    assert!(run_with(s, ty, &params, &[], grants, w).is_err(), "{ty}: no changes");
    let mut more = good.clone();
    more.push(c(Effect::SetRootQuorum { threshold: 1, user_ids: vec!["u".into()] }));
    assert!(run_with(s, ty, &params, &more, grants, w).is_err(), "{ty}: an extra change");
}

/// `changes` with `f` applied to its change `n`.
fn with(changes: &[Change], n: usize, f: impl FnOnce(&mut Change)) -> Vec<Change> {
    let mut out = changes.to_vec();
    f(&mut out[n]);
    out
}

fn cred(ch: &mut Change) -> &mut Credential {
    match &mut ch.effect {
        Effect::AddCredential { credential } => credential,
        other => panic!("not a credential: {other:?}"),
    }
}

fn key(id: &str, user: &str, pk: &str) -> Effect {
    Effect::AddCredential {
        credential: Credential {
            id: id.into(),
            user_id: user.into(),
            kind: CredentialKind::ApiKey,
            credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
            public_key: pk.into(),
            expires_at_ms: 0,
        },
    }
}

fn granted(org: &str, user: &str, ty: &str, pk: &str) -> Grant {
    Grant { organization_id: org.into(), user_id: user.into(), credential_type: ty.into(), public_key: pk.into() }
}

fn passkey(id: &str, user: &str, pk: &str) -> Effect {
    Effect::AddCredential {
        credential: Credential {
            id: id.into(),
            user_id: user.into(),
            kind: CredentialKind::Passkey,
            credential_type: WEBAUTHN_CREDENTIAL_TYPE.into(),
            public_key: pk.into(),
            expires_at_ms: 0,
        },
    }
}

fn identity(id: &str, user: &str, hash: &str) -> Effect {
    Effect::AddCredential {
        credential: Credential {
            id: id.into(),
            user_id: user.into(),
            kind: CredentialKind::OauthIdentity,
            credential_type: OAUTH_CREDENTIAL_TYPE.into(),
            public_key: hash.into(),
            expires_at_ms: 0,
        },
    }
}

fn policy(id: &str, effect: &str) -> Effect {
    Effect::PutPolicy {
        policy: Policy {
            id: id.into(),
            name: "n".into(),
            effect: effect.into(),
            condition: "true".into(),
            consensus: String::new(),
            time: String::new(),
        },
    }
}

#[test]
fn every_type_with_a_transition_is_an_activity_type() {
    for ty in TYPES {
        assert!(known(ty), "{ty}");
        assert!(crate::subjects::subject(ty).is_some(), "{ty}");
    }
    let with_transition = crate::subjects::SUBJECTS.iter().filter(|s| known(s.activity_type)).count();
    assert_eq!(with_transition, TYPES.len());
}

#[test]
fn the_changes_are_what_the_body_asks() {
    let s = state();
    let body = json!({"policyName": "n", "effect": "EFFECT_ALLOW", "condition": "true", "notes": ""});
    let ty = "ACTIVITY_TYPE_CREATE_POLICY_V3";
    let good = vec![c(policy("policy-0", "EFFECT_ALLOW"))];
    let named = vec![c(policy("p1", "EFFECT_ALLOW"))];
    let bad = vec![("another effect", vec![c(policy("policy-0", "EFFECT_DENY"))]), ("an id the gateway named", named)];
    case(&s, ty, body, &[], good, bad);
    // A type with no transition changes nothing.
    let sign = "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2";
    assert_eq!(run(&s, sign, &json!({}), &[], &[]), Ok(()));
    assert!(run(&s, sign, &json!({}), &[c(policy("p", "EFFECT_ALLOW"))], &[]).is_err());
}

#[test]
fn policies_are_the_bodys() {
    let mut s = state();
    let ty = "ACTIVITY_TYPE_CREATE_POLICIES";
    let body = json!({"policies": [
        {"policyName": "n", "effect": "EFFECT_ALLOW", "condition": "true", "notes": ""},
        {"policyName": "n", "effect": "EFFECT_DENY", "condition": "true", "notes": ""},
    ]});
    let good = vec![c(policy("policy-0", "EFFECT_ALLOW")), c(policy("policy-1", "EFFECT_DENY"))];
    let same_id = with(&good, 1, |ch| {
        if let Effect::PutPolicy { policy } = &mut ch.effect {
            policy.id = "policy-0".into();
        }
    });
    case(
        &s,
        ty,
        body,
        &[],
        good.clone(),
        vec![("one id twice", same_id), ("swapped", vec![good[1].clone(), good[0].clone()])],
    );

    s.apply(&policy("policy-0", "EFFECT_ALLOW")).unwrap();
    let ty = "ACTIVITY_TYPE_UPDATE_POLICY_V2";
    let body = json!({"policyId": "policy-0", "policyEffect": "EFFECT_DENY", "policyCondition": ""});
    let mut p = s.policies["policy-0"].clone();
    p.effect = "EFFECT_DENY".into();
    p.condition = String::new();
    let good = vec![c(Effect::PutPolicy { policy: p.clone() })];
    let mut kept = p.clone();
    kept.condition = "true".into();
    case(&s, ty, body, &[], good, vec![("condition kept", vec![c(Effect::PutPolicy { policy: kept })])]);

    let ty = "ACTIVITY_TYPE_DELETE_POLICIES";
    let good = vec![c(Effect::DeletePolicies { ids: vec!["policy-0".into()] })];
    let other = vec![c(Effect::DeletePolicies { ids: vec!["policy-1".into()] })];
    case(&s, ty, json!({"policyIds": ["policy-0"]}), &[], good.clone(), vec![("another policy", other)]);
    case(&s, "ACTIVITY_TYPE_DELETE_POLICY", json!({"policyId": "policy-0"}), &[], good, vec![]);
}

#[test]
fn root_quorum_is_the_bodys() {
    let s = state();
    let ty = "ACTIVITY_TYPE_UPDATE_ROOT_QUORUM";
    let good = vec![c(Effect::SetRootQuorum { threshold: 1, user_ids: vec!["r".into(), "u".into()] })];
    let bad = vec![c(Effect::SetRootQuorum { threshold: 1, user_ids: vec!["u".into()] })];
    case(&s, ty, json!({"threshold": " 1", "userIds": ["r", "u"]}), &[], good, vec![("another quorum", bad)]);
    let none = json!({"threshold": 3, "userIds": ["r", "u"]});
    assert!(matches!(run(&s, ty, &none, &[], &[]), Err(Some(TransitionError::Invalid { .. }))));
}

#[test]
fn an_api_key_is_the_one_in_the_body() {
    let s = state();
    let ty = "ACTIVITY_TYPE_CREATE_API_KEYS_V2";
    let body = json!({"userId": "r", "apiKeys": [{"apiKeyName": "k", "publicKey": " 0x02AB", "curveType": "API_KEY_CURVE_P256"}]});
    let k1 = kid(CredentialKind::ApiKey, "r", 0);
    let good = vec![c(key(&k1, "r", "02ab"))];
    case(
        &s,
        ty,
        body,
        &[],
        good.clone(),
        vec![
            ("another key", vec![c(key(&k1, "r", "02cd"))]),
            ("another user", vec![c(key(&k1, "u", "02ab"))]),
            ("an id the gateway named", vec![c(key("k1", "r", "02ab"))]),
            ("another type", with(&good, 0, |ch| cred(ch).credential_type = "CREDENTIAL_TYPE_API_KEY_ED25519".into())),
            ("an expiry", with(&good, 0, |ch| cred(ch).expires_at_ms = 5)),
            ("another organization", with(&good, 0, |ch| ch.organization_id = "x".into())),
        ],
    );
    // The expiry is now + expirationSeconds, on the enclave's clock.
    let body = json!({"userId": "r", "apiKeys": [{"apiKeyName": "k", "publicKey": "02ab", "curveType": "API_KEY_CURVE_P256", "expirationSeconds": "60"}]});
    let at = |ms: u64| with(&good, 0, |ch| cred(ch).expires_at_ms = ms);
    case(
        &s,
        ty,
        body,
        &[],
        at(NOW as u64 + 60_000),
        vec![("a later expiry", at(NOW as u64 + 60_030)), ("none", at(0))],
    );
    // An expiry that is not 1 to the bound is refused, whatever it would wrap to.
    for bad in [json!("18446744073709551615"), json!(MAX_API_KEY_EXPIRATION_SECONDS + 1), json!("0"), json!("soon")] {
        let body = json!({"userId": "r", "apiKeys": [{"apiKeyName": "k", "publicKey": "02ab", "curveType": "API_KEY_CURVE_P256", "expirationSeconds": bad}]});
        assert!(matches!(run(&s, ty, &body, &good, &[]), Err(Some(TransitionError::Invalid { .. }))), "{bad}");
    }
}

#[test]
fn credentials_are_removed_by_kind() {
    let mut s = state();
    s.apply(&key("k1", "u", "02ab")).unwrap();
    s.apply(&Effect::AddCredential {
        credential: Credential {
            id: "s1".into(),
            user_id: "u".into(),
            kind: CredentialKind::Session,
            credential_type: "CREDENTIAL_TYPE_READ_WRITE_SESSION_KEY_P256".into(),
            public_key: "02cc".into(),
            expires_at_ms: 10,
        },
    })
    .unwrap();
    s.apply(&passkey("a1", "u", "03aa")).unwrap();
    s.apply(&identity("o1", "u", "hash")).unwrap();
    let remove = |kind, ids: &[&str]| {
        vec![c(Effect::RemoveCredentials {
            user_id: "u".into(),
            kind,
            ids: ids.iter().map(|s| s.to_string()).collect(),
        })]
    };
    // Deleting API keys deletes session keys too (delete_api_keys lists both).
    case(
        &s,
        "ACTIVITY_TYPE_DELETE_API_KEYS",
        json!({"userId": "u", "apiKeyIds": ["k1", "s1", "k1"]}),
        &[],
        remove(CredentialKind::ApiKey, &["k1", "s1"]),
        vec![("another key", remove(CredentialKind::ApiKey, &["k1"]))],
    );
    case(
        &s,
        "ACTIVITY_TYPE_DELETE_AUTHENTICATORS",
        json!({"userId": "u", "authenticatorIds": ["a1"]}),
        &[],
        remove(CredentialKind::Passkey, &["a1"]),
        vec![("another kind", remove(CredentialKind::ApiKey, &["a1"]))],
    );
    case(
        &s,
        "ACTIVITY_TYPE_DELETE_OAUTH_PROVIDERS",
        json!({"userId": "u", "providerIds": ["o1"]}),
        &[],
        remove(CredentialKind::OauthIdentity, &["o1"]),
        vec![("another user", {
            let mut p = remove(CredentialKind::OauthIdentity, &["o1"]);
            if let Effect::RemoveCredentials { user_id, .. } = &mut p[0].effect {
                *user_id = "r".into();
            }
            p
        })],
    );
}

#[test]
fn passkeys_and_oauth_identities_are_the_granted_ones() {
    let s = state();
    let grants = [
        granted("o", "u", WEBAUTHN_CREDENTIAL_TYPE, "03aa"),
        granted("o", "u", WEBAUTHN_CREDENTIAL_TYPE, "03bb"),
        granted("o", "u", OAUTH_CREDENTIAL_TYPE, "hash"),
    ];
    let ty = "ACTIVITY_TYPE_CREATE_AUTHENTICATORS_V2";
    let body = json!({"userId": "u", "authenticators": [{"authenticatorName": "a"}, {"authenticatorName": "b"}]});
    let (a1, a2) = (kid(CredentialKind::Passkey, "u", 0), kid(CredentialKind::Passkey, "u", 1));
    let good = vec![c(passkey(&a1, "u", "03aa")), c(passkey(&a2, "u", "03bb"))];
    case(
        &s,
        ty,
        body.clone(),
        &grants,
        good.clone(),
        vec![
            ("another public key", with(&good, 1, |ch| cred(ch).public_key = "03cc".into())),
            ("another user", with(&good, 0, |ch| cred(ch).user_id = "r".into())),
            ("one id twice", with(&good, 1, |ch| cred(ch).id = a1.clone())),
            ("one missing", good[..1].to_vec()),
        ],
    );
    // A body and grants that disagree are refused.
    assert!(matches!(run(&s, ty, &body, &good, &grants[..1]), Err(Some(TransitionError::Invalid { .. }))));

    let ty = "ACTIVITY_TYPE_CREATE_OAUTH_PROVIDERS_V2";
    let body = json!({"userId": "u", "oauthProviders": [{"providerName": "g", "oidcClaims": {}}]});
    let p1 = kid(CredentialKind::OauthIdentity, "u", 0);
    let good = vec![c(identity(&p1, "u", "hash"))];
    case(
        &s,
        ty,
        body,
        &grants,
        good.clone(),
        vec![
            ("another identity", with(&good, 0, |ch| cred(ch).public_key = "other".into())),
            ("as a passkey", vec![c(passkey(&p1, "u", "hash"))]),
        ],
    );
}

#[test]
fn create_users_makes_the_derived_users_with_the_bodys_credentials() {
    let mut s = state();
    s.apply(&Effect::PutTag { kind: TagKind::User, tag: Tag { id: "t1".into(), name: "t".into() } }).unwrap();
    let ty = "ACTIVITY_TYPE_CREATE_USERS_V4";
    let body = json!({"users": [
        {"userName": "alice", "userEmail": "a@x.io", "userTags": ["t1", "t1"],
         "apiKeys": [{"apiKeyName": "k", "publicKey": "02AB", "curveType": "API_KEY_CURVE_P256"}],
         "authenticators": [{"authenticatorName": "a"}],
         "oauthProviders": [{"providerName": "g"}]},
        {"userName": "bob"},
    ]});
    let (u0, u1) = (derive(USER_ID, 0), derive(USER_ID, 1));
    let grants = [
        granted("o", &u0, "CREDENTIAL_TYPE_API_KEY_P256", "02ab"),
        granted("o", &u0, OAUTH_CREDENTIAL_TYPE, "hash"),
        granted("o", &u0, WEBAUTHN_CREDENTIAL_TYPE, "03aa"),
    ];
    let user = |id: &str, name: &str, email: &str| {
        c(Effect::PutUser {
            user: User { id: id.into(), name: name.into(), email: email.into(), tag_ids: vec![], ..User::default() },
        })
    };
    let good = vec![
        user(&u0, "alice", "a@x.io"),
        c(key(&kid(CredentialKind::ApiKey, &u0, 0), &u0, "02ab")),
        c(Effect::UpdateUser {
            id: u0.clone(),
            name: None,
            email: None,
            phone_number: None,
            tag_ids: Some(vec!["t1".into()]),
        }),
        c(passkey(&kid(CredentialKind::Passkey, &u0, 0), &u0, "03aa")),
        c(identity(&kid(CredentialKind::OauthIdentity, &u0, 0), &u0, "hash")),
        user(&u1, "bob", ""),
    ];
    case(
        &s,
        ty,
        body,
        &grants,
        good.clone(),
        vec![
            ("another user id", with(&good, 5, |ch| ch.effect = user("u9", "bob", "").effect)),
            ("an existing user id", with(&good, 5, |ch| ch.effect = user("u", "bob", "").effect)),
            ("another name", with(&good, 0, |ch| ch.effect = user(&u0, "mallory", "a@x.io").effect)),
            ("another email", with(&good, 0, |ch| ch.effect = user(&u0, "alice", "m@x.io").effect)),
            ("another API key", with(&good, 1, |ch| cred(ch).public_key = "02cd".into())),
            ("an API key of another user", with(&good, 1, |ch| cred(ch).user_id = u1.clone())),
            ("another passkey", with(&good, 3, |ch| cred(ch).public_key = "03cc".into())),
            ("another identity", with(&good, 4, |ch| cred(ch).public_key = "other".into())),
            ("an extra credential", {
                let mut p = good.clone();
                p.insert(6, c(key("k9", &u1, "02ee")));
                p
            }),
            ("no tags", {
                let mut p = good.clone();
                p.remove(2);
                p
            }),
            (
                "a root tag",
                with(&good, 2, |ch| {
                    ch.effect = Effect::UpdateUser {
                        id: u0.clone(),
                        name: None,
                        email: None,
                        phone_number: None,
                        tag_ids: Some(vec!["t2".into()]),
                    }
                }),
            ),
        ],
    );
}

#[test]
fn update_user_is_the_bodys() {
    let s = state();
    let ty = "ACTIVITY_TYPE_UPDATE_USER";
    let body = json!({"userId": "u", "userName": "n", "userEmail": "", "userTagIds": []});
    let good = vec![c(Effect::UpdateUser {
        id: "u".into(),
        name: Some("n".into()),
        email: Some(String::new()),
        phone_number: None,
        tag_ids: None,
    })];
    let other = vec![c(Effect::UpdateUser {
        id: "r".into(),
        name: Some("n".into()),
        email: Some(String::new()),
        phone_number: None,
        tag_ids: None,
    })];
    let email_kept = vec![c(Effect::UpdateUser {
        id: "u".into(),
        name: Some("n".into()),
        email: None,
        phone_number: None,
        tag_ids: None,
    })];
    case(&s, ty, body, &[], good, vec![("another user", other), ("the email kept", email_kept)]);
    // One field each: the name, the email, the phone number; nothing else changes.
    let update = |name: Option<&str>, email: Option<&str>, phone: Option<&str>| {
        vec![c(Effect::UpdateUser {
            id: "u".into(),
            name: name.map(Into::into),
            email: email.map(Into::into),
            phone_number: phone.map(Into::into),
            tag_ids: None,
        })]
    };
    let ty = "ACTIVITY_TYPE_UPDATE_USER_NAME";
    let good = update(Some("m"), None, None);
    case(
        &s,
        ty,
        json!({"userId": "u", "userName": "m"}),
        &[],
        good,
        vec![("the email too", update(Some("m"), Some(""), None))],
    );
    let none = Work::default();
    let refused = |params: Value| run_with(&s, ty, &params, &update(Some(" "), None, None), &[], &none).is_err();
    assert!(refused(json!({"userId": "u", "userName": " "})), "an empty name");
    assert!(refused(json!({"userId": "nobody", "userName": " "})), "no such user");
    let ty = "ACTIVITY_TYPE_UPDATE_USER_EMAIL";
    let good = update(None, Some("new@example.com"), None);
    case(
        &s,
        ty,
        json!({"userId": "u", "userEmail": "new@example.com"}),
        &[],
        good,
        vec![("the name too", update(Some("n"), Some("new@example.com"), None))],
    );
    let ty = "ACTIVITY_TYPE_UPDATE_USER_PHONE_NUMBER";
    let good = update(None, None, Some(""));
    case(
        &s,
        ty,
        json!({"userId": "u", "userPhoneNumber": ""}),
        &[],
        good,
        vec![("the email instead", update(None, Some(""), None))],
    );
    let ty = "ACTIVITY_TYPE_DELETE_USERS";
    let good = vec![c(Effect::DeleteUsers { ids: vec!["u".into()] })];
    case(
        &s,
        ty,
        json!({"userIds": ["u", "u"]}),
        &[],
        good,
        vec![("another user", vec![c(Effect::DeleteUsers { ids: vec!["r".into()] })])],
    );
}

#[test]
fn the_organization_is_renamed_to_a_name_that_is_not_blank() {
    let s = state();
    let ty = "ACTIVITY_TYPE_UPDATE_ORGANIZATION_NAME";
    let good = vec![c(Effect::SetOrganizationName { name: "Acme".into() })];
    let other = vec![c(Effect::SetOrganizationName { name: "acme".into() })];
    case(&s, ty, json!({"organizationName": "Acme"}), &[], good, vec![("another name", other)]);
    let blank = vec![c(Effect::SetOrganizationName { name: " ".into() })];
    assert!(run_with(&s, ty, &json!({"organizationName": " "}), &blank, &[], &Work::default()).is_err());
}

#[test]
fn tags_are_the_bodys() {
    let mut s = state();
    let ty = "ACTIVITY_TYPE_CREATE_USER_TAG";
    let tag =
        |id: &str, name: &str| c(Effect::PutTag { kind: TagKind::User, tag: Tag { id: id.into(), name: name.into() } });
    let members = |id: &str, add: &[&str]| {
        c(Effect::UpdateTag {
            kind: TagKind::User,
            id: id.into(),
            new_name: None,
            add: add.iter().map(|s| s.to_string()).collect(),
            remove: vec![],
        })
    };
    // The membership update is there even when the body lists no members.
    case(
        &s,
        ty,
        json!({"userTagName": "t"}),
        &[],
        vec![tag("tag-0", "t"), members("tag-0", &[])],
        vec![
            ("without members", vec![tag("tag-0", "t")]),
            ("an id the gateway named", vec![tag("t1", "t"), members("t1", &[])]),
        ],
    );
    case(
        &s,
        ty,
        json!({"userTagName": "t", "userIds": ["u"]}),
        &[],
        vec![tag("tag-0", "t"), members("tag-0", &["u"])],
        vec![
            ("another member", vec![tag("tag-0", "t"), members("tag-0", &["r"])]),
            ("another tag", vec![tag("tag-0", "t"), members("t0", &["u"])]),
        ],
    );
    s.apply(&tag("tag-0", "t").effect).unwrap();
    let ty = "ACTIVITY_TYPE_UPDATE_USER_TAG";
    let update = |name: Option<&str>, add: &[&str], remove: &[&str]| {
        vec![c(Effect::UpdateTag {
            kind: TagKind::User,
            id: "tag-0".into(),
            new_name: name.map(str::to_string),
            add: add.iter().map(|s| s.to_string()).collect(),
            remove: remove.iter().map(|s| s.to_string()).collect(),
        })]
    };
    case(
        &s,
        ty,
        json!({"userTagId": "tag-0", "newUserTagName": "t2", "addUserIds": ["u", "u"], "removeUserIds": []}),
        &[],
        update(Some("t2"), &["u"], &[]),
        vec![("another member", update(Some("t2"), &["r"], &[])), ("another name", update(Some("x"), &["u"], &[]))],
    );
    let both = json!({"userTagId": "tag-0", "addUserIds": ["u"], "removeUserIds": ["u"]});
    assert!(matches!(run(&s, ty, &both, &[], &[]), Err(Some(TransitionError::Invalid { .. }))));
    let ty = "ACTIVITY_TYPE_DELETE_USER_TAGS";
    let del = |id: &str| vec![c(Effect::DeleteTags { kind: TagKind::User, ids: vec![id.into()] })];
    case(&s, ty, json!({"userTagIds": ["tag-0"]}), &[], del("tag-0"), vec![("another tag", del("t2"))]);

    // Private-key tags name private keys.
    s.apply(&Effect::PutPrivateKey { private_key: PrivateKey { id: "k".into(), ..Default::default() } }).unwrap();
    let ty = "ACTIVITY_TYPE_CREATE_PRIVATE_KEY_TAG";
    let good = vec![
        c(Effect::PutTag { kind: TagKind::PrivateKey, tag: Tag { id: "tag-0".into(), name: "p".into() } }),
        c(Effect::UpdateTag {
            kind: TagKind::PrivateKey,
            id: "tag-0".into(),
            new_name: None,
            add: vec!["k".into()],
            remove: vec![],
        }),
    ];
    let as_user_tag = with(&good, 0, |ch| {
        ch.effect = Effect::PutTag { kind: TagKind::User, tag: Tag { id: "tag-0".into(), name: "p".into() } }
    });
    case(
        &s,
        ty,
        json!({"privateKeyTagName": "p", "privateKeyIds": ["k"]}),
        &[],
        good,
        vec![("a user tag", as_user_tag)],
    );
}

#[test]
fn records_name_what_the_body_names() {
    let mut s = state();
    let ty = "ACTIVITY_TYPE_CREATE_SMART_CONTRACT_INTERFACE";
    let interface = |address: &str| ContractInterface {
        id: "smart-contract-interface-0".into(),
        address: address.into(),
        interface_type: "SMART_CONTRACT_INTERFACE_TYPE_ETHEREUM".into(),
        body: "[]".into(),
    };
    let body = json!({"smartContractAddress": "0xabc", "smartContractInterface": "[]", "type": "SMART_CONTRACT_INTERFACE_TYPE_ETHEREUM", "label": "l"});
    let put = |i| vec![c(Effect::PutContractInterface { interface: i })];
    case(&s, ty, body, &[], put(interface("0xabc")), vec![("another address", put(interface("0xdef")))]);
    s.apply(&put(interface("0xabc"))[0].effect).unwrap();
    let del = |id: &str| vec![c(Effect::DeleteContractInterfaces { ids: vec![id.into()] })];
    case(
        &s,
        "ACTIVITY_TYPE_DELETE_SMART_CONTRACT_INTERFACE",
        json!({"smartContractInterfaceId": "smart-contract-interface-0"}),
        &[],
        del("smart-contract-interface-0"),
        vec![("another", del("i2"))],
    );

    let hook = |id: &str, url: &str| {
        vec![c(Effect::PutWebhookEndpoint { endpoint: Named { id: id.into(), value: url.into() } })]
    };
    let ty = "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT";
    case(
        &s,
        ty,
        json!({"url": "https://a.example/h", "name": "n"}),
        &[],
        hook("webhook-endpoint-0", "https://a.example/h"),
        vec![("another URL", hook("webhook-endpoint-0", "https://evil.example/h"))],
    );
    s.apply(&hook("webhook-endpoint-0", "https://a.example/h")[0].effect).unwrap();
    let ty = "ACTIVITY_TYPE_UPDATE_WEBHOOK_ENDPOINT";
    case(
        &s,
        ty,
        json!({"endpointId": "webhook-endpoint-0", "name": "m"}),
        &[],
        hook("webhook-endpoint-0", "https://a.example/h"),
        vec![("another URL", hook("webhook-endpoint-0", "https://evil.example/h"))],
    );
    case(
        &s,
        ty,
        json!({"endpointId": "webhook-endpoint-0", "url": "https://b.example/h"}),
        &[],
        hook("webhook-endpoint-0", "https://b.example/h"),
        vec![("the old URL", hook("webhook-endpoint-0", "https://a.example/h"))],
    );
    let del = |id: &str| vec![c(Effect::DeleteWebhookEndpoints { ids: vec![id.into()] })];
    case(
        &s,
        "ACTIVITY_TYPE_DELETE_WEBHOOK_ENDPOINT",
        json!({"endpointId": "webhook-endpoint-0"}),
        &[],
        del("webhook-endpoint-0"),
        vec![("another", del("w2"))],
    );

    let cred2 = |id: &str, v: &str| {
        vec![c(Effect::PutOauth2Credential { credential: Named { id: id.into(), value: v.into() } })]
    };
    let ty = "ACTIVITY_TYPE_CREATE_OAUTH2_CREDENTIAL";
    let body = json!({"provider": "OAUTH2_PROVIDER_X", "clientId": "c/1", "encryptedClientSecret": "e"});
    case(
        &s,
        ty,
        body,
        &[],
        cred2("oauth2-credential-0", "OAUTH2_PROVIDER_X/c/1"),
        vec![("another client", cred2("oauth2-credential-0", "OAUTH2_PROVIDER_X/c2"))],
    );
    s.apply(&cred2("oauth2-credential-0", "OAUTH2_PROVIDER_X/c/1")[0].effect).unwrap();
    let ty = "ACTIVITY_TYPE_UPDATE_OAUTH2_CREDENTIAL";
    let body = json!({"oauth2CredentialId": "oauth2-credential-0", "provider": "OAUTH2_PROVIDER_DISCORD", "clientId": "", "encryptedClientSecret": ""});
    case(
        &s,
        ty,
        body,
        &[],
        cred2("oauth2-credential-0", "OAUTH2_PROVIDER_DISCORD/c/1"),
        vec![("unchanged", cred2("oauth2-credential-0", "OAUTH2_PROVIDER_X/c/1"))],
    );
    let del = |id: &str| vec![c(Effect::DeleteOauth2Credentials { ids: vec![id.into()] })];
    case(
        &s,
        "ACTIVITY_TYPE_DELETE_OAUTH2_CREDENTIAL",
        json!({"oauth2CredentialId": "oauth2-credential-0"}),
        &[],
        del("oauth2-credential-0"),
        vec![("another", del("c2"))],
    );
}

#[test]
fn features_and_the_auth_proxy() {
    let mut s = state();
    let set = |name: &str, value: &str| c(Effect::SetFeature { name: name.into(), value: value.into() });
    let ty = "ACTIVITY_TYPE_SET_ORGANIZATION_FEATURE";
    case(
        &s,
        ty,
        json!({"name": "FEATURE_NAME_WEBAUTHN_ORIGINS", "value": "https://a"}),
        &[],
        vec![set("FEATURE_NAME_WEBAUTHN_ORIGINS", "https://a")],
        vec![("another value", vec![set("FEATURE_NAME_WEBAUTHN_ORIGINS", "https://evil")])],
    );
    case(
        &s,
        ty,
        json!({"name": "FEATURE_NAME_EMAIL_AUTH"}),
        &[],
        vec![set("FEATURE_NAME_EMAIL_AUTH", "")],
        vec![("another feature", vec![set("FEATURE_NAME_SMS_AUTH", "")])],
    );
    let ty = "ACTIVITY_TYPE_REMOVE_ORGANIZATION_FEATURE";
    let remove = |name: &str| vec![c(Effect::RemoveFeature { name: name.into() })];
    case(
        &s,
        ty,
        json!({"name": "FEATURE_NAME_EMAIL_AUTH"}),
        &[],
        remove("FEATURE_NAME_EMAIL_AUTH"),
        vec![("another", remove("FEATURE_NAME_SMS_AUTH"))],
    );

    // Enabling the first time: the proxy's user, its policy, the flag and the feature.
    let ty = "ACTIVITY_TYPE_ENABLE_AUTH_PROXY";
    let proxy_policy = |user: &str| Policy {
        id: "policy-0".into(),
        name: AUTH_PROXY_POLICY_NAME.into(),
        effect: "EFFECT_ALLOW".into(),
        condition: AUTH_PROXY_POLICY_CONDITION.into(),
        consensus: auth_proxy_policy_consensus(user),
        time: String::new(),
    };
    let enable = vec![c(Effect::SetAuthProxy { enabled: true }), set(AUTH_PROXY_FEATURE, "")];
    let mut first = vec![
        c(Effect::PutUser {
            user: User { id: "user-0".into(), name: AUTH_PROXY_USER_NAME.into(), ..Default::default() },
        }),
        c(Effect::PutPolicy { policy: proxy_policy("user-0") }),
    ];
    first.extend(enable.clone());
    let mut any = proxy_policy("user-0");
    any.consensus = "true".into();
    let issued = Work { auth_proxy_key_issued: true, ..Work::default() };
    // Without the key the enclave issued for it, no proxy user and no policy.
    assert_eq!(run(&s, ty, &json!({}), &enable, &[]), Ok(()));
    case_with(
        &s,
        ty,
        json!({}),
        &[],
        &issued,
        first.clone(),
        vec![
            (
                "a policy for another user",
                with(&first, 1, |ch| ch.effect = Effect::PutPolicy { policy: proxy_policy("u") }),
            ),
            ("a looser policy", with(&first, 1, |ch| ch.effect = Effect::PutPolicy { policy: any })),
            (
                "an existing user",
                with(&first, 0, |ch| {
                    ch.effect = Effect::PutUser {
                        user: User { id: "u".into(), name: AUTH_PROXY_USER_NAME.into(), ..Default::default() },
                    }
                }),
            ),
        ],
    );
    for ch in &first {
        s.apply(&ch.effect).unwrap();
    }
    assert!(run_with(&s, ty, &json!({}), &enable, &[], &issued).is_err(), "already enabled");
    let ty = "ACTIVITY_TYPE_DISABLE_AUTH_PROXY";
    let disable =
        vec![c(Effect::SetAuthProxy { enabled: false }), c(Effect::RemoveFeature { name: AUTH_PROXY_FEATURE.into() })];
    case(
        &s,
        ty,
        json!({}),
        &[],
        disable.clone(),
        vec![("still enabled", vec![c(Effect::SetAuthProxy { enabled: true })])],
    );
    let ty = "ACTIVITY_TYPE_UPDATE_AUTH_PROXY_CONFIG";
    case(
        &s,
        ty,
        json!({"allowedOrigins": []}),
        &[],
        vec![c(Effect::SetAuthProxy { enabled: true })],
        vec![("disabling", vec![c(Effect::SetAuthProxy { enabled: false })])],
    );
    // Its appName, trimmed, is the name the proxy's codes carry: the body's, not another.
    let named = |n: &str| c(Effect::SetAuthProxyAppName { app_name: n.into() });
    case(
        &s,
        ty,
        json!({"appName": " Acme Wallet "}),
        &[],
        vec![c(Effect::SetAuthProxy { enabled: true }), named("Acme Wallet")],
        vec![
            ("another name", vec![c(Effect::SetAuthProxy { enabled: true }), named("Your ACCOUNT LOCKED")]),
            ("no name", vec![c(Effect::SetAuthProxy { enabled: true })]),
        ],
    );
    for bad in [json!("x".repeat(65)), json!("Acme\u{7}Wallet"), json!(["Acme"])] {
        let p = json!({ "appName": bad });
        assert!(run(&s, ty, &p, &[c(Effect::SetAuthProxy { enabled: true })], &[]).is_err(), "{p}");
    }
    let mut named_state = s.clone();
    named_state.apply(&named("Acme Wallet").effect).unwrap();
    assert_eq!(crate::transition::proxy_app_name(&named_state.organization), "Acme Wallet");
    assert_eq!(crate::transition::proxy_app_name(&s.organization), crate::transition::DEFAULT_AUTH_PROXY_APP_NAME);
    for ch in &disable {
        s.apply(&ch.effect).unwrap();
    }
    // Enabling again: the flag and the feature only, no second user or policy.
    let ty = "ACTIVITY_TYPE_ENABLE_AUTH_PROXY";
    let again = with(&first, 0, |ch| {
        ch.effect =
            Effect::PutUser { user: User { id: "py".into(), name: AUTH_PROXY_USER_NAME.into(), ..Default::default() } }
    });
    case_with(&s, ty, json!({}), &[], &issued, enable, vec![("a second proxy user", again)]);
}

#[test]
fn ip_allowlists_are_a_top_level_organizations_with_parsed_rules() {
    use crate::model::{IpAllowlist, IpRule};
    let mut s = state();
    let key = "02abcd".to_string();
    s.apply(&self::key("k1", "r", &key)).unwrap();
    let ty = "ACTIVITY_TYPE_SET_IP_ALLOWLIST";
    let list = |enabled: bool, rules: &[(&str, &str)]| IpAllowlist {
        enabled,
        on_evaluation_error: "DENY".into(),
        rules: rules.iter().map(|(c, l)| IpRule { cidr: c.to_string(), label: l.to_string() }).collect(),
    };
    let put = |key: &str, l: IpAllowlist| vec![c(Effect::PutIpAllowlist { key: key.into(), allowlist: l })];
    let body =
        json!({"rules": [{"cidr": " 10.0.0.0/8 ", "label": "office"}, {"cidr": "2001:db8::/32"}], "enabled": true});
    let good = put("", list(true, &[("10.0.0.0/8", "office"), ("2001:db8::/32", "")]));
    case(
        &s,
        ty,
        body,
        &[],
        good,
        vec![("disabled", put("", list(false, &[("10.0.0.0/8", "office"), ("2001:db8::/32", "")])))],
    );
    // A new list left without `enabled` is off; an API key's is always on.
    case(&s, ty, json!({"rules": []}), &[], put("", list(false, &[])), vec![]);
    case(
        &s,
        ty,
        json!({"publicKey": key.to_uppercase(), "rules": [], "enabled": false}),
        &[],
        put(&key, list(true, &[])),
        vec![],
    );
    for bad in [
        json!({"rules": [{"cidr": "10.0.0.0/33"}]}),
        json!({"rules": [{"cidr": "example.com"}]}),
        json!({"rules": [], "onEvaluationError": "MAYBE"}),
        json!({"publicKey": "02ff", "rules": []}),
        json!({"rules": [{"cidr": "10.0.0.0/8", "label": "a\nb"}]}),
    ] {
        assert!(run(&s, ty, &bad, &put("", list(false, &[])), &[]).is_err(), "{bad}");
    }
    let ty = "ACTIVITY_TYPE_REMOVE_IP_ALLOWLIST";
    assert!(
        run(&s, ty, &json!({}), &[c(Effect::RemoveIpAllowlist { key: "".into() })], &[]).is_err(),
        "none to remove"
    );
    s.apply(&Effect::PutIpAllowlist { key: "".into(), allowlist: list(true, &[]) }).unwrap();
    case(&s, ty, json!({}), &[], vec![c(Effect::RemoveIpAllowlist { key: "".into() })], vec![]);
    // A sub-organization has none.
    s.organization.parent_id = Some("parent".into());
    assert!(run(&s, "ACTIVITY_TYPE_SET_IP_ALLOWLIST", &json!({"rules": []}), &put("", list(false, &[])), &[]).is_err());
}

#[test]
fn a_session_profile_has_a_name_a_scope_that_parses_and_a_bounded_lifetime() {
    use crate::model::SessionProfile;
    let s = state();
    let ty = "ACTIVITY_TYPE_CREATE_SESSION_PROFILE";
    let id = derive(SESSION_PROFILE_ID, 0);
    let put = |name: &str, seconds: Option<u64>| {
        let profile = SessionProfile {
            name: name.into(),
            scope: "true".into(),
            expiration_seconds: seconds,
            notes: String::new(),
        };
        vec![c(Effect::PutSessionProfile { id: id.clone(), profile })]
    };
    let body = json!({"sessionProfileName": "ro", "scope": "true", "expirationSeconds": "600"});
    case(&s, ty, body, &[], put("ro", Some(600)), vec![("no lifetime", put("ro", None))]);
    for bad in [
        json!({"sessionProfileName": " ", "scope": "true"}),
        json!({"sessionProfileName": "ro", "scope": ""}),
        json!({"sessionProfileName": "ro", "scope": "activity.type =="}),
        json!({"sessionProfileName": "ro", "scope": "true", "expirationSeconds": "0"}),
        json!({"sessionProfileName": "ro", "scope": "true", "expirationSeconds": "31536001"}),
    ] {
        assert!(run(&s, ty, &bad, &put("ro", None), &[]).is_err(), "{bad}");
    }
}

#[test]
fn a_contact_set_with_its_verification_token_is_verified_if_the_other_one_is() {
    let mut s = state();
    let user = |id: &str, email: &str, phone: &str, verified: bool| User {
        id: id.into(),
        name: id.into(),
        email: email.into(),
        phone_number: phone.into(),
        contacts_verified: verified,
        ..Default::default()
    };
    s.apply(&Effect::PutUser { user: user("u1", "a@b.example", "", true) }).unwrap();
    s.apply(&Effect::PutUser { user: user("u2", "c@d.example", "+14155550100", false) }).unwrap();
    let ty = "ACTIVITY_TYPE_UPDATE_USER_EMAIL";
    let update = |id: &str, email: &str| {
        c(Effect::UpdateUser {
            id: id.into(),
            name: None,
            email: Some(email.into()),
            phone_number: None,
            tag_ids: None,
        })
    };
    let mark = |id: &str| c(Effect::MarkContactsVerified { id: id.into() });
    let body =
        |id: &str, email: &str, token: &str| json!({"userId": id, "userEmail": email, "verificationToken": token});
    // u1 has no phone number: the token verifies it again.
    let good = vec![update("u1", "n@b.example"), mark("u1")];
    case(&s, ty, body("u1", "n@b.example", "t"), &[], good, vec![("unverified", vec![update("u1", "n@b.example")])]);
    // Without a token, or to remove the address, it is not verified.
    case(&s, ty, body("u1", "n@b.example", ""), &[], vec![update("u1", "n@b.example")], vec![]);
    case(
        &s,
        ty,
        body("u1", "", "t"),
        &[],
        vec![update("u1", "")],
        vec![("verified", vec![update("u1", ""), mark("u1")])],
    );
    // u2's phone number was never verified: a verified email does not make it so.
    case(&s, ty, body("u2", "n@d.example", "t"), &[], vec![update("u2", "n@d.example")], vec![]);
    let mut after = s.clone();
    after
        .apply(&Effect::UpdateUser {
            id: "u1".into(),
            name: None,
            email: Some("x@y.example".into()),
            phone_number: None,
            tag_ids: None,
        })
        .unwrap();
    assert!(!after.users["u1"].contacts_verified);
    after.apply(&Effect::MarkContactsVerified { id: "u1".into() }).unwrap();
    assert!(after.users["u1"].contacts_verified);
}

#[test]
fn a_wallet_is_renamed_and_its_accounts_deleted_once_exported_unless_the_body_says_otherwise() {
    let mut s = state();
    s.apply(&Effect::PutWallet { wallet: Wallet { id: "w1".into(), ..Default::default() } }).unwrap();
    s.apply(&Effect::PutWallet { wallet: Wallet { id: "w2".into(), ..Default::default() } }).unwrap();
    s.apply(&Effect::MarkWalletExported { id: "w1".into() }).unwrap();
    let account = |id: &str, wallet_id: &str| Account {
        id: id.into(),
        wallet_id: wallet_id.into(),
        address: format!("0x{id}"),
        address_format: "ADDRESS_FORMAT_ETHEREUM".into(),
        exported: false,
    };
    let accounts = vec![account("a1", "w1"), account("a2", "w2"), account("a3", "w2")];
    s.apply(&Effect::PutAccounts { accounts }).unwrap();
    s.apply(&Effect::MarkAccountExported { id: "a3".into() }).unwrap();

    let ty = "ACTIVITY_TYPE_UPDATE_WALLET";
    let rename = |id: &str, label: &str| vec![c(Effect::RenameWallet { id: id.into(), label: label.into() })];
    case(
        &s,
        ty,
        json!({"walletId": "w2", "walletName": "cold"}),
        &[],
        rename("w2", "cold"),
        vec![("another wallet", rename("w1", "cold"))],
    );
    for bad in [
        json!({"walletId": "w2", "walletName": " "}),
        json!({"walletId": "w9", "walletName": "x"}),
        json!({"walletId": "w2", "walletName": "a\nb"}),
    ] {
        assert!(run(&s, ty, &bad, &rename("w2", "x"), &[]).is_err(), "{bad}");
    }

    let ty = "ACTIVITY_TYPE_DELETE_WALLET_ACCOUNTS";
    let del = |ids: &[&str]| vec![c(Effect::DeleteAccounts { ids: ids.iter().map(|s| s.to_string()).collect() })];
    // a1's wallet was exported, a3 itself was: both go without the flag; a2 needs it.
    case(&s, ty, json!({"walletAccountIds": ["a1", "a3"]}), &[], del(&["a1", "a3"]), vec![("fewer", del(&["a1"]))]);
    assert!(matches!(
        run(&s, ty, &json!({"walletAccountIds": ["a2"]}), &del(&["a2"]), &[]),
        Err(Some(TransitionError::Invalid { .. }))
    ));
    case(
        &s,
        ty,
        json!({"walletAccountIds": ["a2"], "deleteWithoutExport": true}),
        &[],
        del(&["a2"]),
        vec![("another", del(&["a3"]))],
    );
    for bad in [
        json!({"walletAccountIds": []}),
        json!({"walletAccountIds": ["a1", "a1"]}),
        json!({"walletAccountIds": ["zz"], "deleteWithoutExport": true}),
    ] {
        assert!(run(&s, ty, &bad, &del(&["a1"]), &[]).is_err(), "{bad}");
    }
    // Another wallet's name, or a body naming another wallet than the accounts', is refused.
    let mut named = s.clone();
    named.apply(&Effect::RenameWallet { id: "w1".into(), label: "cold".into() }).unwrap();
    let r = run(&named, "ACTIVITY_TYPE_UPDATE_WALLET", &json!({"walletId": "w2", "walletName": "cold"}), &[], &[]);
    assert!(r.is_err(), "a second wallet named cold");
    let decoy = json!({"walletAccountIds": ["a2"], "walletId": "w1", "deleteWithoutExport": true});
    assert!(run(&s, ty, &decoy, &del(&["a2"]), &[]).is_err(), "accounts of another wallet than the body names");
    // Applied: the accounts are gone, their ids retired, their addresses no longer index them.
    let mut after = s.clone();
    after.apply(&Effect::DeleteAccounts { ids: vec!["a2".into()] }).unwrap();
    assert!(!after.accounts.contains_key("a2") && after.accounts.contains_key("a3"));
    assert!(after.retired_key_ids.contains_key("a2"));
    assert!(after.account_by_address("0xa2").is_none() && after.account_by_address("0xa3").is_some());
    assert!(after.apply(&Effect::DeleteAccounts { ids: vec!["a2".into()] }).is_err());
}

#[test]
fn keys_are_deleted_only_once_exported_unless_the_body_says_otherwise() {
    let mut s = state();
    s.apply(&Effect::PutWallet { wallet: Wallet { id: "w1".into(), ..Default::default() } }).unwrap();
    s.apply(&Effect::PutWallet { wallet: Wallet { id: "w2".into(), ..Default::default() } }).unwrap();
    s.apply(&Effect::MarkWalletExported { id: "w1".into() }).unwrap();
    s.apply(&Effect::PutPrivateKey { private_key: PrivateKey { id: "k1".into(), ..Default::default() } }).unwrap();
    let ty = "ACTIVITY_TYPE_DELETE_WALLETS";
    let del = |ids: &[&str]| vec![c(Effect::DeleteWallets { ids: ids.iter().map(|s| s.to_string()).collect() })];
    case(&s, ty, json!({"walletIds": ["w1"]}), &[], del(&["w1"]), vec![("another wallet", del(&["w2"]))]);
    assert!(matches!(
        run(&s, ty, &json!({"walletIds": ["w2"]}), &del(&["w2"]), &[]),
        Err(Some(TransitionError::Invalid { .. }))
    ));
    case(
        &s,
        ty,
        json!({"walletIds": ["w2"], "deleteWithoutExport": true}),
        &[],
        del(&["w2"]),
        vec![("both", del(&["w1", "w2"]))],
    );
    let ty = "ACTIVITY_TYPE_DELETE_PRIVATE_KEYS";
    let del = |ids: &[&str]| vec![c(Effect::DeletePrivateKeys { ids: ids.iter().map(|s| s.to_string()).collect() })];
    assert!(run(&s, ty, &json!({"privateKeyIds": ["k1"]}), &del(&["k1"]), &[]).is_err());
    case(
        &s,
        ty,
        json!({"privateKeyIds": ["k1"], "deleteWithoutExport": true}),
        &[],
        del(&["k1"]),
        vec![("another", del(&["k2"]))],
    );
}

#[test]
fn a_sub_organization_is_the_derived_one_with_the_bodys_root_users() {
    let s = state();
    let ty = "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8";
    let body = json!({
        "subOrganizationName": "sub",
        "rootQuorumThreshold": 1,
        "rootUsers": [
            {"userName": "alice", "apiKeys": [{"apiKeyName": "k", "publicKey": "02ab", "curveType": "API_KEY_CURVE_P256"}],
             "authenticators": [{"authenticatorName": "a"}]},
            {"userName": "bob", "userEmail": "b@x.io", "oauthProviders": [{"providerName": "g"}]},
        ],
        "disableSmsAuth": true,
        "disableEmailRecovery": false,
        "wallet": {"walletName": "w", "accounts": [{"curve": "CURVE_SECP256K1", "pathFormat": "PATH_FORMAT_BIP32", "path": "m/44'/60'/0'/0/0", "addressFormat": "ADDRESS_FORMAT_ETHEREUM"}]},
    });
    let sub = derive(SUB_ORGANIZATION_ID, 0);
    let (u0, u1) = (derive(USER_ID, 0), derive(USER_ID, 1));
    let grants = [
        granted(&sub, &u0, "CREDENTIAL_TYPE_API_KEY_P256", "02ab"),
        granted(&sub, &u0, WEBAUTHN_CREDENTIAL_TYPE, "03aa"),
        granted(&sub, &u1, OAUTH_CREDENTIAL_TYPE, "hash"),
        granted(&sub, "", "COFFER_PARENT_ORGANIZATION", "o"),
    ];
    let sc = |effect: Effect| Change { organization_id: sub.clone(), effect };
    let user = |id: &str, name: &str, email: &str| {
        sc(Effect::PutUser {
            user: User {
                id: id.into(),
                name: name.into(),
                email: email.into(),
                tag_ids: vec![],
                contacts_verified: true,
                ..User::default()
            },
        })
    };
    let organization = Organization {
        id: sub.clone(),
        name: "sub".into(),
        parent_id: Some("o".into()),
        root_quorum_threshold: 1,
        root_user_ids: vec![u0.clone(), u1.clone()],
        ..Default::default()
    };
    let feature = |name: &str| sc(Effect::SetFeature { name: name.into(), value: String::new() });
    let account = Account {
        id: "wallet-account-0".into(),
        wallet_id: "wallet-0".into(),
        address: "0xabc".into(),
        address_format: "ADDRESS_FORMAT_ETHEREUM".into(),
        exported: false,
    };
    let good = vec![
        sc(Effect::CreateOrganization { organization: organization.clone() }),
        user(&u0, "alice", ""),
        sc(key(&kid(CredentialKind::ApiKey, &u0, 0), &u0, "02ab")),
        sc(passkey(&kid(CredentialKind::Passkey, &u0, 0), &u0, "03aa")),
        user(&u1, "bob", "b@x.io"),
        sc(identity(&kid(CredentialKind::OauthIdentity, &u1, 0), &u1, "hash")),
        feature("FEATURE_NAME_EMAIL_RECOVERY"),
        feature("FEATURE_NAME_EMAIL_AUTH"),
        feature("FEATURE_NAME_OTP_EMAIL_AUTH"),
        sc(Effect::PutWallet { wallet: Wallet { id: "wallet-0".into(), label: "w".into(), ..Default::default() } }),
        sc(Effect::PutAccounts { accounts: vec![account.clone()] }),
    ];
    let org_with = |f: &dyn Fn(&mut Organization)| {
        let mut o = organization.clone();
        f(&mut o);
        with(&good, 0, |ch| ch.effect = Effect::CreateOrganization { organization: o })
    };
    let work = Work { wallet_addresses: vec!["0xabc".into()], ..Work::default() };
    case_with(
        &s,
        ty,
        body.clone(),
        &grants,
        &work,
        good.clone(),
        vec![
            ("another organization id", org_with(&|o| o.id = "evil".into())),
            ("another parent", org_with(&|o| o.parent_id = None)),
            ("another quorum", org_with(&|o| o.root_user_ids = vec![u0.clone()])),
            ("another threshold", org_with(&|o| o.root_quorum_threshold = 2)),
            ("marked as the auth proxy's sign-up, unasked", org_with(&|o| o.auth_proxy_signup = true)),
            ("a root user elsewhere", with(&good, 1, |ch| ch.organization_id = "o".into())),
            ("another API key", with(&good, 2, |ch| cred(ch).public_key = "02cd".into())),
            ("another passkey", with(&good, 3, |ch| cred(ch).public_key = "03cc".into())),
            ("an identity for another user", with(&good, 5, |ch| cred(ch).user_id = u0.clone())),
            ("SMS auth on", {
                let mut p = good.clone();
                p.insert(9, feature("FEATURE_NAME_SMS_AUTH"));
                p
            }),
            (
                "another wallet name",
                with(&good, 9, |ch| {
                    ch.effect = Effect::PutWallet {
                        wallet: Wallet { id: "wallet-0".into(), label: "x".into(), ..Default::default() },
                    }
                }),
            ),
            (
                "an imported wallet",
                with(&good, 9, |ch| {
                    ch.effect = Effect::PutWallet {
                        wallet: Wallet { id: "wallet-0".into(), label: "w".into(), imported: true, exported: false },
                    }
                }),
            ),
            ("the wallet in the parent", with(&good, 9, |ch| ch.organization_id = "o".into())),
            ("accounts in the parent", with(&good, 10, |ch| ch.organization_id = "o".into())),
            (
                "an account of another wallet",
                with(&good, 10, |ch| {
                    let mut a = account.clone();
                    a.wallet_id = "w0".into();
                    ch.effect = Effect::PutAccounts { accounts: vec![a] };
                }),
            ),
            (
                "another address format",
                with(&good, 10, |ch| {
                    let mut a = account.clone();
                    a.address_format = "ADDRESS_FORMAT_SOLANA".into();
                    ch.effect = Effect::PutAccounts { accounts: vec![a] };
                }),
            ),
            ("no accounts", good[..10].to_vec()),
        ],
    );
    // A body that marks the sub-organization as the auth proxy's sign-up: the flag, and only then.
    let mut marked_body = body.clone();
    marked_body[crate::transition::AUTH_PROXY_SIGNUP] = json!(true);
    let marked = org_with(&|o| o.auth_proxy_signup = true);
    assert_eq!(run_with(&s, ty, &marked_body, &marked, &grants, &work), Ok(()));
    assert!(run_with(&s, ty, &marked_body, &good, &grants, &work).is_err(), "an unmarked marked sign-up");
    marked_body[crate::transition::AUTH_PROXY_SIGNUP] = json!("true");
    assert!(run_with(&s, ty, &marked_body, &marked, &grants, &work).is_err(), "only true marks");
    // The addresses are the enclave's, one for each account the body lists.
    for addresses in [vec![], vec!["0xabc".to_string(), "0xdef".into()], vec![String::new()]] {
        let w = Work { wallet_addresses: addresses, ..Work::default() };
        assert!(matches!(run_with(&s, ty, &body, &good, &grants, &w), Err(Some(TransitionError::Invalid { .. }))));
    }
    let w = Work { wallet_addresses: vec!["0xdef".into()], ..Work::default() };
    assert_eq!(run_with(&s, ty, &body, &good, &grants, &w), Err(None), "another address");
    // A sub-organization cannot have sub-organizations.
    let mut child = s.clone();
    child.organization.parent_id = Some("p".into());
    assert!(matches!(run_with(&child, ty, &body, &good, &grants, &work), Err(Some(TransitionError::Invalid { .. }))));
}

#[test]
fn a_sub_organization_is_deleted_from_inside_with_its_keys_exported() {
    let mut s = state();
    let ty = "ACTIVITY_TYPE_DELETE_SUB_ORGANIZATION";
    let good = vec![c(Effect::DeleteOrganization)];
    assert!(run(&s, ty, &json!({}), &good, &[]).is_err(), "not a sub-organization");
    s.organization.parent_id = Some("p".into());
    let elsewhere = vec![Change { organization_id: "p".into(), effect: Effect::DeleteOrganization }];
    case(&s, ty, json!({}), &[], good.clone(), vec![("the parent", elsewhere)]);
    s.apply(&Effect::PutPrivateKey { private_key: PrivateKey { id: "k".into(), ..Default::default() } }).unwrap();
    assert!(matches!(run(&s, ty, &json!({}), &good, &[]), Err(Some(TransitionError::Invalid { .. }))));
    assert_eq!(run(&s, ty, &json!({"deleteWithoutExport": true}), &good, &[]), Ok(()));
}

#[test]
fn invitations_are_made_as_their_bodies_say_and_go_once_accepted_or_revoked() {
    use crate::model::Invitation;
    let mut s = state();
    s.apply(&Effect::PutTag { kind: crate::effect::TagKind::User, tag: Tag { id: "t".into(), name: "t".into() } })
        .unwrap();
    let ty = "ACTIVITY_TYPE_CREATE_INVITATIONS";
    let params = |email: &str, tags: Value, access: &str, sender: &str| {
        json!({"invitations": [{"receiverUserName": "Ada", "receiverUserEmail": email, "receiverUserTags": tags,
            "accessType": access, "senderUserId": sender}]})
    };
    let invited = |status: &str| Invitation {
        receiver_user_name: "Ada".into(),
        receiver_email: "ada@example.com".into(),
        receiver_user_tags: vec!["t".into()],
        access_type: "ACCESS_TYPE_API".into(),
        sender_user_id: "u".into(),
        status: status.into(),
    };
    let id = derive(INVITATION_ID, 0);
    let put = |status: &str| c(Effect::PutInvitation { id: id.clone(), invitation: invited(status) });
    let body = params("ada@example.com", json!(["t", "t"]), "ACCESS_TYPE_API", "u");
    let other = |status: &str| {
        c(Effect::PutInvitation {
            id: id.clone(),
            invitation: Invitation { access_type: "ACCESS_TYPE_ALL".into(), ..invited(status) },
        })
    };
    case(&s, ty, body, &[], vec![put(INVITATION_CREATED)], vec![("another access", vec![other(INVITATION_CREATED)])]);
    for bad in [
        params("not an email", json!([]), "ACCESS_TYPE_API", "u"),
        params("ada@example.com", json!(["no-such-tag"]), "ACCESS_TYPE_API", "u"),
        params("ada@example.com", json!([]), "ACCESS_TYPE_ROOT", "u"),
        params("ada@example.com", json!([]), "ACCESS_TYPE_API", "nobody"),
        params("ada@example.com", json!(vec!["t"; MAX_INVITATION_TAGS + 1]), "ACCESS_TYPE_API", "u"),
        json!({"invitations": []}),
    ] {
        assert!(run(&s, ty, &bad, &[put(INVITATION_CREATED)], &[]).is_err(), "{bad}");
    }
    // A receiver a user has the email of, or twice in one body: refused (an acceptance verifies
    // the email, and two users with one verified email would make logins by it ambiguous).
    let mut with_ada = s.clone();
    with_ada
        .apply(&Effect::PutUser {
            user: User { id: "ada".into(), name: "ada".into(), email: "ADA@example.com".into(), ..Default::default() },
        })
        .unwrap();
    let body = params("ada@example.com", json!(["t"]), "ACCESS_TYPE_API", "u");
    assert!(run(&with_ada, ty, &body, &[put(INVITATION_CREATED)], &[]).is_err(), "a user has the email");
    let mut twice = params("ada@example.com", json!(["t"]), "ACCESS_TYPE_API", "u");
    let again = twice["invitations"][0].clone();
    twice["invitations"].as_array_mut().unwrap().push(again);
    assert!(run(&s, ty, &twice, &[put(INVITATION_CREATED)], &[]).is_err(), "one receiver twice");
    s.apply(&put(INVITATION_CREATED).effect).unwrap();
    assert!(run(&s, ty, &body, &[put(INVITATION_CREATED)], &[]).is_err(), "an open invitation has the email");

    // Accepted: the invited user (derived id), its tags, the brought key, its email verified.
    let ty = "ACTIVITY_TYPE_ACCEPT_INVITATION_V2";
    let user = derive(USER_ID, 0);
    let body = json!({"invitationId": id, "userId": "", "apiKey": {"apiKeyName": "k", "publicKey": "02aa"}});
    let accepted = vec![
        c(Effect::PutUser {
            user: User { id: user.clone(), name: "Ada".into(), email: "ada@example.com".into(), ..Default::default() },
        }),
        c(Effect::AddCredential {
            credential: Credential {
                id: kid(CredentialKind::ApiKey, &user, 0),
                user_id: user.clone(),
                kind: CredentialKind::ApiKey,
                credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
                public_key: "02aa".into(),
                expires_at_ms: 0,
            },
        }),
        c(Effect::UpdateUser {
            id: user.clone(),
            name: None,
            email: None,
            phone_number: None,
            tag_ids: Some(vec!["t".into()]),
        }),
        c(Effect::MarkContactsVerified { id: user.clone() }),
        c(Effect::RemoveInvitation { id: id.clone() }),
    ];
    let unverified: Vec<Change> =
        accepted.iter().filter(|ch| !matches!(ch.effect, Effect::MarkContactsVerified { .. })).cloned().collect();
    case(&s, ty, body.clone(), &[], accepted.clone(), vec![("not verified", unverified)]);
    assert!(run(&s, ty, &json!({"invitationId": id}), &accepted, &[]).is_err(), "no key");
    let mut taken = s.clone();
    taken
        .apply(&Effect::PutUser {
            user: User { id: "ada".into(), name: "ada".into(), email: "ada@example.com".into(), ..Default::default() },
        })
        .unwrap();
    assert!(run(&taken, ty, &body, &accepted, &[]).is_err(), "a user has the email now");
    // Revoked (or accepted), it is accepted no more; a web-only one is not accepted with a key.
    let ty_delete = "ACTIVITY_TYPE_DELETE_INVITATION";
    let remove = c(Effect::RemoveInvitation { id: id.clone() });
    case(&s, ty_delete, json!({"invitationId": id}), &[], vec![remove.clone()], vec![]);
    let mut revoked = s.clone();
    revoked.apply(&remove.effect).unwrap();
    assert!(revoked.organization.invitations.is_empty());
    assert!(run(&revoked, ty, &body, &accepted, &[]).is_err(), "revoked");
    assert!(run(&revoked, ty_delete, &json!({"invitationId": id}), std::slice::from_ref(&remove), &[]).is_err());
    let mut web = revoked.clone();
    web.apply(&Effect::PutInvitation {
        id: id.clone(),
        invitation: Invitation { access_type: WEB_ONLY.into(), ..invited(INVITATION_CREATED) },
    })
    .unwrap();
    assert!(run(&web, ty, &body, &accepted, &[]).is_err(), "web only");
}
