//! User and credential JSON shapes.

use serde_json::{json, Value};

use crate::activity::render::timestamp;
use crate::store::{ApiKey, User};

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

/// The swagger `User` object.
pub fn user_json(u: &User, api_keys: &[ApiKey]) -> Value {
    let mut v = json!({
        "userId": u.id,
        "userName": u.name,
        "authenticators": [],
        "apiKeys": api_keys.iter().map(api_key_json).collect::<Vec<_>>(),
        "userTags": [],
        "oauthProviders": [],
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
