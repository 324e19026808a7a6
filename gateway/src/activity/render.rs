//! The JSON shapes clients read: `Timestamp`, `Activity`, `Vote`, and the `User`, `ApiKey`,
//! `Authenticator` and `OauthProvider` objects (a vote carries its user and credential).

use serde_json::{json, Value};

use crate::store::{ActivityRecord, ApiKey, AuthenticatorRecord, Nanos, OauthProviderRecord, User};

/// `{"seconds": "...", "nanos": "..."}`, both strings.
pub fn timestamp(n: Nanos) -> Value {
    json!({ "seconds": (n / 1_000_000_000).to_string(), "nanos": (n % 1_000_000_000).to_string() })
}

/// Vote members kept for the enclave (the raw stamp of the vote), never rendered.
pub const VOTE_STAMP_HEADER: &str = "cofferStampHeader";
pub const VOTE_STAMP: &str = "cofferStamp";

/// Votes as clients see them: without the raw stamps kept for the enclave.
fn votes(votes: &Value) -> Value {
    match votes {
        Value::Array(list) => Value::Array(
            list.iter()
                .map(|v| {
                    let mut v = v.clone();
                    if let Some(m) = v.as_object_mut() {
                        m.remove(VOTE_STAMP_HEADER);
                        m.remove(VOTE_STAMP);
                    }
                    v
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The swagger `Activity` object. `can_vote` is whether the requesting user may still vote.
pub fn activity(a: &ActivityRecord, can_vote: bool) -> Value {
    let mut out = json!({
        "id": a.id,
        "organizationId": a.organization_id,
        "status": a.status,
        "type": a.activity_type,
        "intent": a.intent,
        "result": a.result,
        "votes": votes(&a.votes),
        "fingerprint": a.fingerprint,
        "canApprove": can_vote,
        "canReject": can_vote,
        "createdAt": timestamp(a.created_at),
        "updatedAt": timestamp(a.updated_at),
        "appProofs": a.app_proofs,
    });
    if let Some(f) = &a.failure {
        out["failure"] = f.clone();
    }
    out
}

/// The swagger `v1AppProof` object of an enclave proof.
pub fn app_proof(p: &coffer_proto::v1::AppProof) -> Value {
    json!({ "scheme": p.scheme, "publicKey": p.public_key, "proofPayload": p.proof_payload, "signature": p.signature })
}

/// The swagger `ApiKey` object.
pub fn api_key_json(k: &ApiKey) -> Value {
    let mut v = json!({
        "credential": { "publicKey": k.public_key, "type": k.credential_type },
        "apiKeyId": k.id,
        "apiKeyName": k.name,
        "createdAt": timestamp(k.created_at),
        "updatedAt": timestamp(k.updated_at),
    });
    if let Some(exp) = k.expiration_seconds {
        v["expirationSeconds"] = json!(exp.to_string());
    }
    v
}

/// The swagger `User` object as a vote carries it: the user with the given API keys only.
pub fn user_json(u: &User, api_keys: &[ApiKey]) -> Value {
    user_view(u, api_keys, &[], Vec::new(), Vec::new())
}

/// The swagger `User` object with its tags, passkeys and OAuth providers.
pub fn user_view(
    u: &User,
    api_keys: &[ApiKey],
    tag_ids: &[String],
    authenticators: Vec<Value>,
    oauth: Vec<Value>,
) -> Value {
    let mut v = json!({
        "userId": u.id,
        "userName": u.name,
        "authenticators": authenticators,
        "apiKeys": api_keys.iter().map(api_key_json).collect::<Vec<_>>(),
        "userTags": tag_ids,
        "oauthProviders": oauth,
        "createdAt": timestamp(u.created_at),
        "updatedAt": timestamp(u.updated_at),
        "mfaPolicies": [],
    });
    if let Some(e) = &u.email {
        v["userEmail"] = json!(e);
    }
    if let Some(p) = &u.phone_number {
        v["userPhoneNumber"] = json!(p);
    }
    v
}

/// The swagger `Authenticator` object.
pub fn authenticator_json(a: &AuthenticatorRecord) -> Value {
    json!({
        "transports": a.transports,
        "attestationType": a.attestation_type,
        "aaguid": a.aaguid,
        "credentialId": a.credential_id,
        "model": "",
        "credential": { "publicKey": a.public_key, "type": coffer_auth::webauthn::CREDENTIAL_TYPE },
        "authenticatorId": a.id,
        "authenticatorName": a.name,
        "createdAt": timestamp(a.created_at),
        "updatedAt": timestamp(a.updated_at),
    })
}

/// The swagger `OauthProvider` object.
pub fn oauth_provider_json(p: &OauthProviderRecord) -> Value {
    json!({
        "providerId": p.id,
        "providerName": p.name,
        "issuer": p.issuer,
        "audience": p.audience,
        "subject": p.subject,
        "createdAt": timestamp(p.created_at),
        "updatedAt": timestamp(p.updated_at),
    })
}
