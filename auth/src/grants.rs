//! The credentials a stamped activity grants: which (organization, user, type, public key) its
//! body adds. The enclave certifies a credential only when the stamped body grants it.

use serde_json::Value;

use crate::envelope::{derived_id, items, text, StampedActivity, SUB_ORGANIZATION_ID, USER_ID};
use crate::{webauthn, AuthError};

pub const CREATE_USERS: &str = "ACTIVITY_TYPE_CREATE_USERS_V4";
/// Users with API keys alone (`apiOnlyUsers`), whose keys name no curve: [`API_ONLY_CURVE`].
pub const CREATE_API_ONLY_USERS: &str = "ACTIVITY_TYPE_CREATE_API_ONLY_USERS";
/// The curve of an API key that names none (the first `ApiKeyParams`, `create_api_only_users`).
pub const API_ONLY_CURVE: &str = "API_KEY_CURVE_P256";
pub const CREATE_API_KEYS: &str = "ACTIVITY_TYPE_CREATE_API_KEYS_V2";
pub const CREATE_AUTHENTICATORS: &str = "ACTIVITY_TYPE_CREATE_AUTHENTICATORS_V2";
pub const CREATE_SUB_ORGANIZATION: &str = "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8";
pub const CREATE_OAUTH_PROVIDERS: &str = "ACTIVITY_TYPE_CREATE_OAUTH_PROVIDERS_V2";
/// `recover_user`: one passkey for the user, stamped by the recovery credential email sent.
pub const RECOVER_USER: &str = "ACTIVITY_TYPE_RECOVER_USER";
/// The credential `init_user_email_recovery` sends by email: it may submit `recover_user` only.
pub const RECOVERY_CREDENTIAL_TYPE: &str = "CREDENTIAL_TYPE_RECOVER_USER_KEY_P256";
/// `accept_invitation` (a Coffer path; `AcceptInvitationIntentV2` with `apiKey`): the invited
/// user, made with the API key the receiver brings, which stamps it.
pub const ACCEPT_INVITATION: &str = "ACTIVITY_TYPE_ACCEPT_INVITATION_V2";
/// The credential type of the key an invitation's acceptance is stamped with: never certified,
/// never stored; it stands for the invitation (its code checked by the enclave) while the
/// enclave decides the acceptance, the only activity it may submit.
pub const INVITATION_ACCEPTANCE: &str = "COFFER_INVITATION_ACCEPTANCE";

/// Whether a credential of `credential_type` may submit an activity of `activity_type`: every
/// credential may submit anything its policies allow, except a recovery credential, which may
/// only recover its user, and an invitation's acceptance key, which may only accept it. Checked by the gateway and the enclave alike.
pub fn credential_may_submit(credential_type: &str, activity_type: &str) -> bool {
    match credential_type {
        RECOVERY_CREDENTIAL_TYPE => activity_type == RECOVER_USER,
        INVITATION_ACCEPTANCE => activity_type == ACCEPT_INVITATION,
        _ => true,
    }
}

/// The credential type of an OAuth provider's certificate: its `public_key` is the identity hash
/// ([`crate::oidc::identity_hash`]) of (issuer, subject, audience).
pub const OAUTH_PROVIDER: &str = "COFFER_OAUTH_PROVIDER";
/// The credential type of a key a verification token attests (`X-Stamp-Attested`,
/// `STAMP_ATTESTED_SCHEME_P256_VERIFICATION_TOKEN`): never certified, never stored; it stands for
/// the token while the enclave decides the `stamp_login` it stamped.
pub const VERIFICATION_TOKEN: &str = "COFFER_VERIFICATION_TOKEN";
/// The credential type of a sub-organization's parent certificate: `organization_id` is the
/// sub-organization, `public_key` its parent's id, `user_id` empty. It lets the parent's
/// credentials submit login activities for the sub-organization.
pub const PARENT_ORGANIZATION: &str = "COFFER_PARENT_ORGANIZATION";

/// One credential a body adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub organization_id: String,
    pub user_id: String,
    /// `CREDENTIAL_TYPE_*`.
    pub credential_type: String,
    /// Lowercase hex, as stored and as stamps name it.
    pub public_key: String,
    pub expiration_seconds: Option<u64>,
}

/// Checks a public key against its `curveType`; returns it as lowercase hex and its credential
/// type. P-256 and secp256k1 keys are compressed SEC1 points (33 bytes), Ed25519 keys 32 bytes.
pub fn api_public_key(curve_type: &str, public_key: &str) -> Result<(String, &'static str), AuthError> {
    let hex_key = public_key.trim();
    let hex_key = hex_key.strip_prefix("0x").unwrap_or(hex_key).to_ascii_lowercase();
    let bytes = hex::decode(&hex_key).map_err(|_| AuthError::invalid("invalid api key public key: not hex"))?;
    let (ok, expected, credential_type) = match curve_type {
        "API_KEY_CURVE_P256" => (
            bytes.len() == 33 && p256::PublicKey::from_sec1_bytes(&bytes).is_ok(),
            "a compressed P-256 point (33 bytes, 66 hex characters)",
            "CREDENTIAL_TYPE_API_KEY_P256",
        ),
        "API_KEY_CURVE_SECP256K1" => (
            bytes.len() == 33 && k256::PublicKey::from_sec1_bytes(&bytes).is_ok(),
            "a compressed secp256k1 point (33 bytes, 66 hex characters)",
            "CREDENTIAL_TYPE_API_KEY_SECP256K1",
        ),
        "API_KEY_CURVE_ED25519" => (
            <[u8; 32]>::try_from(bytes.as_slice())
                .ok()
                .is_some_and(|b| ed25519_dalek::VerifyingKey::from_bytes(&b).is_ok()),
            "an Ed25519 public key (32 bytes, 64 hex characters)",
            "CREDENTIAL_TYPE_API_KEY_ED25519",
        ),
        other => {
            return Err(AuthError::invalid(format!(
                "invalid api key curve type: {other:?} (API_KEY_CURVE_P256, API_KEY_CURVE_SECP256K1 or API_KEY_CURVE_ED25519)"
            )))
        }
    };
    if !ok {
        return Err(AuthError::invalid(format!("invalid api key public key for {curve_type}: expected {expected}")));
    }
    Ok((hex_key, credential_type))
}

/// The longest `expirationSeconds` an API key may have (about 317 years): an expiry in
/// milliseconds then never wraps in either process's arithmetic (the gateway's stamp check, in
/// nanoseconds, saturates past the year 2262: both still see a key that has not expired)
/// (`coffer_org_rules::transition::MAX_API_KEY_EXPIRATION_SECONDS`).
pub const MAX_API_KEY_EXPIRATION_SECONDS: u64 = 10_000_000_000;

/// `expirationSeconds`: absent, or a positive whole number of seconds, at most
/// [`MAX_API_KEY_EXPIRATION_SECONDS`].
pub fn expiration(v: Option<&Value>) -> Result<Option<u64>, AuthError> {
    let parsed = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
        Some(Value::Number(n)) => n.as_u64(),
        Some(_) => None,
    };
    match parsed {
        Some(n) if n > 0 && n <= MAX_API_KEY_EXPIRATION_SECONDS => Ok(Some(n)),
        _ => Err(AuthError::invalid(format!(
            "invalid api key expiration: expirationSeconds must be a positive number of seconds, at most \
             {MAX_API_KEY_EXPIRATION_SECONDS}"
        ))),
    }
}

/// The API keys, OAuth identities and passkeys one user entry of a body adds.
fn user_grants(org: &str, user_id: &str, user: &Value, out: &mut Vec<Grant>) -> Result<(), AuthError> {
    for k in items(user, "apiKeys") {
        let (public_key, credential_type) = api_public_key(text(k, "curveType"), text(k, "publicKey"))?;
        out.push(Grant {
            organization_id: org.to_string(),
            user_id: user_id.to_string(),
            credential_type: credential_type.to_string(),
            public_key,
            expiration_seconds: expiration(k.get("expirationSeconds"))?,
        });
    }
    for p in items(user, "oauthProviders") {
        let (iss, sub, aud) = match (p.get("oidcToken").and_then(Value::as_str), p.get("oidcClaims")) {
            (Some(token), _) if !token.trim().is_empty() => crate::oidc::unverified_identity(token.trim())?,
            (_, Some(c)) => (text(c, "iss").to_string(), text(c, "sub").to_string(), text(c, "aud").to_string()),
            _ => return Err(AuthError::invalid("each oauth provider needs exactly one of oidcToken and oidcClaims")),
        };
        out.push(Grant {
            organization_id: org.to_string(),
            user_id: user_id.to_string(),
            credential_type: OAUTH_PROVIDER.to_string(),
            public_key: crate::oidc::identity_hash(&iss, &sub, &aud),
            expiration_seconds: None,
        });
    }
    for a in items(user, "authenticators") {
        let att = a.get("attestation").unwrap_or(&Value::Null);
        let reg = webauthn::verify_registration(
            text(att, "credentialId"),
            text(att, "clientDataJson"),
            text(att, "attestationObject"),
            text(a, "challenge"),
        )?;
        out.push(Grant {
            organization_id: org.to_string(),
            user_id: user_id.to_string(),
            credential_type: webauthn::CREDENTIAL_TYPE.to_string(),
            public_key: reg.public_key,
            expiration_seconds: None,
        });
    }
    Ok(())
}

/// The activity types that add credentials ([`granted_credentials`]).
pub const GRANTING_TYPES: &[&str] = &[
    CREATE_USERS,
    CREATE_API_ONLY_USERS,
    CREATE_API_KEYS,
    CREATE_AUTHENTICATORS,
    CREATE_SUB_ORGANIZATION,
    RECOVER_USER,
    CREATE_OAUTH_PROVIDERS,
    ACCEPT_INVITATION,
];

/// An API key of `create_api_only_users` as `create_users` lists it: its curve
/// [`API_ONLY_CURVE`] (a curve it names is ignored, as the first `ApiKeyParams` has none).
pub fn api_only_key(key: &Value) -> Value {
    let mut key = key.clone();
    if let Some(k) = key.as_object_mut() {
        k.insert("curveType".into(), Value::String(API_ONLY_CURVE.into()));
    }
    key
}

/// Every credential `activity` adds, with the organization and user it belongs to. Users a body
/// creates (and a sub-organization) get ids derived from its fingerprint ([`derived_id`]).
pub fn granted_credentials(activity: &StampedActivity) -> Result<Vec<Grant>, AuthError> {
    let p = &activity.parameters;
    let org = activity.organization_id.as_str();
    let fp = activity.fingerprint.as_str();
    let mut out = Vec::new();
    match activity.activity_type.as_str() {
        CREATE_API_KEYS | CREATE_AUTHENTICATORS | CREATE_OAUTH_PROVIDERS => {
            user_grants(org, text(p, "userId"), p, &mut out)?
        }
        RECOVER_USER => {
            let one = serde_json::json!({ "authenticators": [p.get("authenticator").cloned().unwrap_or(Value::Null)] });
            user_grants(org, text(p, "userId"), &one, &mut out)?
        }
        CREATE_USERS => {
            for (i, u) in items(p, "users").iter().enumerate() {
                user_grants(org, &derived_id(fp, USER_ID, i), u, &mut out)?;
            }
        }
        CREATE_API_ONLY_USERS => {
            for (i, u) in items(p, "apiOnlyUsers").iter().enumerate() {
                let keys: Vec<Value> = items(u, "apiKeys").iter().map(api_only_key).collect();
                let u = serde_json::json!({ "apiKeys": keys });
                user_grants(org, &derived_id(fp, USER_ID, i), &u, &mut out)?;
            }
        }
        ACCEPT_INVITATION => {
            let key = api_only_key(p.get("apiKey").unwrap_or(&Value::Null));
            let u = serde_json::json!({ "apiKeys": [key] });
            user_grants(org, &derived_id(fp, USER_ID, 0), &u, &mut out)?;
        }
        CREATE_SUB_ORGANIZATION => {
            let sub = derived_id(fp, SUB_ORGANIZATION_ID, 0);
            for (i, u) in items(p, "rootUsers").iter().enumerate() {
                user_grants(&sub, &derived_id(fp, USER_ID, i), u, &mut out)?;
            }
            out.push(Grant {
                organization_id: sub,
                user_id: String::new(),
                credential_type: PARENT_ORGANIZATION.to_string(),
                public_key: org.to_string(),
                expiration_seconds: None,
            });
        }
        _ => {}
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P256: &str = "0303b68b7daa21027d1b9ca5b7f6bd65aaa8d99573a8d1984d4168291fe9e3059c";

    fn activity(ty: &str, params: Value) -> StampedActivity {
        let body = serde_json::json!({"type": ty, "timestampMs": "1", "organizationId": "org", "parameters": params});
        StampedActivity::parse(body.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn an_expiration_is_1_to_the_bound() {
        use serde_json::json;
        for ok in [json!(1), json!(" 60 "), json!(MAX_API_KEY_EXPIRATION_SECONDS)] {
            assert!(expiration(Some(&ok)).unwrap().is_some(), "{ok}");
        }
        assert_eq!(expiration(None).unwrap(), None);
        assert_eq!(expiration(Some(&Value::Null)).unwrap(), None);
        for bad in [json!(0), json!("18446744073709551615"), json!(MAX_API_KEY_EXPIRATION_SECONDS + 1), json!(-1)] {
            assert!(expiration(Some(&bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_recovery_credential_only_recovers() {
        assert!(credential_may_submit(RECOVERY_CREDENTIAL_TYPE, RECOVER_USER));
        assert!(!credential_may_submit(RECOVERY_CREDENTIAL_TYPE, CREATE_API_KEYS));
        assert!(credential_may_submit("CREDENTIAL_TYPE_API_KEY_P256", CREATE_API_KEYS));
        assert!(credential_may_submit(INVITATION_ACCEPTANCE, ACCEPT_INVITATION));
        assert!(!credential_may_submit(INVITATION_ACCEPTANCE, CREATE_API_KEYS));
        let a = activity(RECOVER_USER, serde_json::json!({"userId": "u", "authenticator": {"attestation": {}}}));
        assert!(granted_credentials(&a).is_err(), "the one authenticator is verified like any other");
    }

    #[test]
    fn api_keys_users_and_sub_organizations() {
        let key = serde_json::json!({"apiKeyName": "k", "publicKey": P256.to_uppercase(), "curveType": "API_KEY_CURVE_P256", "expirationSeconds": "60"});
        let a = activity(CREATE_API_KEYS, serde_json::json!({"userId": "u", "apiKeys": [key]}));
        let g = granted_credentials(&a).unwrap();
        assert_eq!(
            g,
            vec![Grant {
                organization_id: "org".into(),
                user_id: "u".into(),
                credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
                public_key: P256.into(),
                expiration_seconds: Some(60),
            }]
        );
        let a = activity(
            CREATE_USERS,
            serde_json::json!({"users": [{"userName": "a"}, {"userName": "b", "apiKeys": [key]}]}),
        );
        let g = granted_credentials(&a).unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].user_id, derived_id(&a.fingerprint, USER_ID, 1));
        let a =
            activity(CREATE_SUB_ORGANIZATION, serde_json::json!({"rootUsers": [{"userName": "a", "apiKeys": [key]}]}));
        let g = granted_credentials(&a).unwrap();
        assert_eq!(g[0].organization_id, derived_id(&a.fingerprint, SUB_ORGANIZATION_ID, 0));
        assert_eq!(g[0].user_id, derived_id(&a.fingerprint, USER_ID, 0));
        // The sub-organization's parent certificate names the submitting organization.
        assert_eq!(
            g[1],
            Grant {
                organization_id: g[0].organization_id.clone(),
                user_id: String::new(),
                credential_type: PARENT_ORGANIZATION.into(),
                public_key: "org".into(),
                expiration_seconds: None,
            }
        );
        // Other activities grant nothing; a malformed key is refused.
        assert!(granted_credentials(&activity("ACTIVITY_TYPE_CREATE_POLICY_V3", serde_json::json!({})))
            .unwrap()
            .is_empty());
        let bad =
            serde_json::json!({"userId": "u", "apiKeys": [{"publicKey": "02", "curveType": "API_KEY_CURVE_P256"}]});
        assert!(granted_credentials(&activity(CREATE_API_KEYS, bad)).is_err());
    }

    #[test]
    fn oauth_identities_are_granted_by_their_hash() {
        let claims = serde_json::json!({"iss": "https://i", "sub": "s", "aud": "a"});
        let a = activity(
            CREATE_OAUTH_PROVIDERS,
            serde_json::json!({"userId": "u", "oauthProviders": [{"providerName": "p", "oidcClaims": claims}]}),
        );
        let g = granted_credentials(&a).unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!((g[0].credential_type.as_str(), g[0].user_id.as_str()), (OAUTH_PROVIDER, "u"));
        assert_eq!(g[0].public_key, crate::oidc::identity_hash("https://i", "s", "a"));
        // A token's identity is read from its claims (unverified: the stamp vouches for the body).
        use crate::webauthn::b64url;
        let token = format!(
            "{}.{}.{}",
            b64url(br#"{"alg":"RS256"}"#),
            b64url(br#"{"iss":"https://i","sub":"s","aud":["a"],"exp":1,"nbf":99999999999}"#),
            b64url(b"sig")
        );
        let a = activity(
            CREATE_USERS,
            serde_json::json!({"users": [{"userName": "x", "oauthProviders": [{"providerName": "p", "oidcToken": token}]}]}),
        );
        assert_eq!(granted_credentials(&a).unwrap()[0].public_key, crate::oidc::identity_hash("https://i", "s", "a"));
        let neither = serde_json::json!({"userId": "u", "oauthProviders": [{"providerName": "p"}]});
        assert!(granted_credentials(&activity(CREATE_OAUTH_PROVIDERS, neither)).is_err());
    }

    /// Untrusted bodies: every truncation and many byte flips of real bodies parse or fail
    /// cleanly, never panic, and a parsed body's grants are computed or refused cleanly too.
    #[test]
    fn mutated_bodies_never_panic() {
        let key = serde_json::json!({"apiKeyName": "k", "publicKey": P256, "curveType": "API_KEY_CURVE_P256", "expirationSeconds": 60});
        let bodies = [
            serde_json::json!({"type": CREATE_USERS, "timestampMs": "1", "organizationId": "o",
                "parameters": {"users": [{"userName": "a", "apiKeys": [key], "authenticators": [{"challenge": "x",
                "attestation": {"credentialId": "AA", "clientDataJson": "e30", "attestationObject": "oA"}}]}]}}),
            serde_json::json!({"type": CREATE_SUB_ORGANIZATION, "timestampMs": 2, "organizationId": "o",
                "parameters": {"rootUsers": [{"apiKeys": [key, key]}], "wallet": {"accounts": []}}}),
        ];
        let mut parsed = 0;
        for body in bodies {
            let bytes = body.to_string().into_bytes();
            crate::testing::for_each_mutation(&bytes, 0x9e37_79b9_7f4a_7c15, 4000, |b| {
                if let Ok(a) = StampedActivity::parse(b) {
                    parsed += 1;
                    let _ = granted_credentials(&a);
                }
            });
        }
        assert!(parsed > 100, "the mutations must also reach the grant parser ({parsed})");
    }
}
