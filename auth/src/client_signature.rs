//! Client signatures: a key's P-256 signature over one use of it (a login or a sign-up with a
//! verification token, a sign-up that proves it holds the key it registers), as `@turnkey/core`
//! makes them: `{publicKey, scheme, message, signature}` with the message the use as JSON.

use serde_json::{json, Value};

use crate::envelope::text;

/// The use a sign-up's client signature covers, from a `create_sub_organization` body: its
/// first root user as `{"signupV2": {apiKeys, authenticators, oauthProviders, email?,
/// phoneNumber?}, "tokenId"?, "type": "USAGE_TYPE_SIGNUP"}` (`tokenId` when a verification
/// token comes with it).
pub fn signup_usage(p: &Value, token_id: Option<&str>) -> Value {
    let user = p.get("rootUsers").and_then(|u| u.get(0)).cloned().unwrap_or(Value::Null);
    let list = |k: &str| user.get(k).cloned().filter(Value::is_array).unwrap_or_else(|| json!([]));
    let mut signup = json!({ "apiKeys": list("apiKeys"), "authenticators": list("authenticators"), "oauthProviders": list("oauthProviders") });
    for (k, to) in [("userEmail", "email"), ("userPhoneNumber", "phoneNumber")] {
        if !text(&user, k).is_empty() {
            signup[to] = json!(text(&user, k));
        }
    }
    let mut usage = json!({ "signupV2": signup, "type": "USAGE_TYPE_SIGNUP" });
    if let Some(id) = token_id {
        usage["tokenId"] = json!(id);
    }
    usage
}

/// What a verification token's key signs to set the contact it verified on a user (Coffer's own
/// usage, `update_user_email` / `update_user_phone_number` not stamped by that key):
/// `{"updateContact": {"userId", "contact"}, "tokenId", "type": "USAGE_TYPE_UPDATE_CONTACT"}`.
pub fn update_contact_usage(user_id: &str, contact: &str, token_id: &str) -> Value {
    json!({ "updateContact": { "userId": user_id, "contact": contact }, "tokenId": token_id, "type": "USAGE_TYPE_UPDATE_CONTACT" })
}

/// The body's `clientSignature` (in `p`) is `key_hex`'s (compressed P-256, lowercase hex) over
/// `usage`: the message, parsed, must be exactly it; P-256 over SHA-256 of its bytes, `r ‖ s` hex.
pub fn check(p: &Value, key_hex: &str, usage: &Value) -> Result<(), &'static str> {
    let sig = p.get("clientSignature").ok_or("clientSignature is required")?;
    let signer = text(sig, "publicKey").trim();
    if !signer.strip_prefix("0x").unwrap_or(signer).eq_ignore_ascii_case(key_hex) {
        return Err("clientSignature.publicKey is not the key this use needs");
    }
    if !matches!(text(sig, "scheme"), "" | "CLIENT_SIGNATURE_SCHEME_API_P256") {
        return Err("clientSignature.scheme must be CLIENT_SIGNATURE_SCHEME_API_P256");
    }
    if serde_json::from_str::<Value>(text(sig, "message")).ok().as_ref() != Some(usage) {
        return Err("clientSignature.message is not this use of the key (its parameters, tokenId and type)");
    }
    let key = hex::decode(key_hex)
        .ok()
        .and_then(|b| p256::ecdsa::VerifyingKey::from_sec1_bytes(&b).ok())
        .ok_or("clientSignature.publicKey is not a P-256 key")?;
    let signature = hex::decode(text(sig, "signature").trim().trim_start_matches("0x"))
        .ok()
        .and_then(|b| p256::ecdsa::Signature::from_slice(&b).ok())
        .ok_or("clientSignature.signature is not r ‖ s hex")?;
    use p256::ecdsa::signature::Verifier;
    key.verify(text(sig, "message").as_bytes(), &signature).map_err(|_| "clientSignature does not verify with its key")
}

/// The API key a sign-up (a `create_sub_organization` body) proves it holds, if any: one of
/// its one root user's P-256 `apiKeys` (a quorum of 1) whose `clientSignature` covers this
/// sign-up ([`signup_usage`]). With a `verificationToken` the use names the token's id, read here
/// unverified: whoever grants the token verifies and spends it.
pub fn proven_signup_key(p: &Value) -> Option<String> {
    // The signature covers one root user's lists: with anyone else beside that user, or a
    // quorum of more, a replay of it could put the key where its holder is not alone.
    let users = p.get("rootUsers")?.as_array()?;
    let threshold = p.get("rootQuorumThreshold");
    let threshold_one = threshold.and_then(Value::as_i64) == Some(1) || threshold.and_then(Value::as_str) == Some("1");
    if users.len() != 1 || !threshold_one {
        return None;
    }
    let signer = text(p.get("clientSignature")?, "publicKey").trim();
    let key = signer.strip_prefix("0x").unwrap_or(signer).to_ascii_lowercase();
    let keys = p.get("rootUsers")?.get(0)?.get("apiKeys")?.as_array()?;
    let listed = keys.iter().any(|k| {
        let pk = text(k, "publicKey").trim();
        pk.strip_prefix("0x").unwrap_or(pk).eq_ignore_ascii_case(&key) && text(k, "curveType") == "API_KEY_CURVE_P256"
    });
    if !listed {
        return None;
    }
    let token_id = match text(p, "verificationToken").trim() {
        "" => None,
        t => Some(crate::verification_token::unverified_claims(t)?.get("id")?.as_str()?.to_string()),
    };
    check(p, &key, &signup_usage(p, token_id.as_deref())).ok()?;
    Some(key)
}

/// How long an API key a sign-up registers without proving it holds it may live: the temporary
/// key `@turnkey/core`'s passkey sign-up logs in with once (60 s). Such a key is never found by
/// an anonymous lookup (it proves nothing), and is gone before anyone could be sent to it.
pub const UNPROVEN_KEY_MOST_SECONDS: u64 = 300;

/// The first API key of a sign-up's root users that lasts (no `expirationSeconds`, or more than
/// [`UNPROVEN_KEY_MOST_SECONDS`]) without the sign-up proving its holder signed it
/// ([`proven_signup_key`]): what an anonymous sign-up may not register, since a visitor could
/// register someone else's key beside a passkey of their own.
pub fn unproven_lasting_key(p: &Value) -> Option<String> {
    let proven = proven_signup_key(p);
    let users = p.get("rootUsers").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    users
        .iter()
        .flat_map(|u| u.get("apiKeys").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default())
        .find_map(|k| {
            let pk = text(k, "publicKey").trim();
            let pk = pk.strip_prefix("0x").unwrap_or(pk).to_ascii_lowercase();
            let seconds = match k.get("expirationSeconds") {
                Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
                Some(v) => v.as_u64(),
                None => None,
            };
            let short = seconds.is_some_and(|s| s <= UNPROVEN_KEY_MOST_SECONDS);
            (!short && proven.as_deref() != Some(pk.as_str())).then_some(pk)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer;

    fn signed_signup(signer: &p256::ecdsa::SigningKey, listed: &str) -> Value {
        let key = hex::encode(signer.verifying_key().to_encoded_point(true).as_bytes());
        let mut p = json!({ "subOrganizationName": "s", "rootQuorumThreshold": 1, "rootUsers": [{ "userName": "u",
            "apiKeys": [{ "apiKeyName": "w", "publicKey": listed, "curveType": "API_KEY_CURVE_P256" }],
            "authenticators": [], "oauthProviders": [] }] });
        let message = signup_usage(&p, None).to_string();
        let signature: p256::ecdsa::Signature = signer.sign(message.as_bytes());
        p["clientSignature"] = json!({ "publicKey": key, "scheme": "CLIENT_SIGNATURE_SCHEME_API_P256",
            "message": message, "signature": hex::encode(signature.to_bytes()) });
        p
    }

    #[test]
    fn a_sign_up_proves_only_the_key_that_signed_it() {
        let owner = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
        let owner_key = hex::encode(owner.verifying_key().to_encoded_point(true).as_bytes());
        let p = signed_signup(&owner, &owner_key);
        assert_eq!(proven_signup_key(&p), Some(owner_key.clone()));
        // Someone else's signature over a sign-up that lists the owner's key proves nothing.
        let squatter = p256::ecdsa::SigningKey::from_slice(&[9u8; 32]).unwrap();
        assert_eq!(proven_signup_key(&signed_signup(&squatter, &owner_key)), None);
        // The owner's signature of another sign-up (another passkey beside the key) proves nothing.
        let mut replayed = p.clone();
        replayed["rootUsers"][0]["authenticators"] = json!([{ "authenticatorName": "squatter's" }]);
        assert_eq!(proven_signup_key(&replayed), None);
        // Not with a second root user beside the one the signature covers.
        let mut crowded = p.clone();
        crowded["rootUsers"].as_array_mut().unwrap().push(json!({ "userName": "mallory", "apiKeys": [] }));
        assert_eq!(proven_signup_key(&crowded), None);
        // No signature, no proof.
        let mut bare = p.clone();
        bare.as_object_mut().unwrap().remove("clientSignature");
        assert_eq!(proven_signup_key(&bare), None);
        // What an anonymous sign-up may register: a proven key, or one that expires soon.
        assert_eq!(unproven_lasting_key(&p), None);
        assert_eq!(unproven_lasting_key(&bare), Some(owner_key.clone()));
        bare["rootUsers"][0]["apiKeys"][0]["expirationSeconds"] = json!("60");
        assert_eq!(unproven_lasting_key(&bare), None);
        bare["rootUsers"][0]["apiKeys"][0]["expirationSeconds"] = json!("301");
        assert_eq!(unproven_lasting_key(&bare), Some(owner_key));
    }
}
