//! The verification token's format, one place for both processes: an ES256 JWT the enclave's
//! notarizer signs for a right one-time code, with its own `kid` and `token_type` so that no
//! other token the notarizer signs (a session) is ever read as one; its claims are the
//! interface's six strings (`id`, `verification_type`, `contact`, `organization_id`, `public_key`,
//! `exp` in milliseconds). The gateway checks one against the published notarizer key for
//! lookups; the enclave checks and spends it for what it grants.

use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The token's JWT `kid`.
pub const TOKEN_KID: &str = "coffer-otp-verification-v1";
/// The token's `token_type` claim.
pub const TOKEN_TYPE: &str = "COFFER_OTP_VERIFICATION";

/// A verification token's claims, once its signature and expiry are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedToken {
    pub id: String,
    pub contact: String,
    pub verification_type: String,
    pub public_key: String,
    /// The organization whose `verify_otp` issued it.
    pub organization_id: String,
    pub expires_ms: i64,
}

/// Whether `v` is a phone number as users are created with and codes are sent to: E.164, `+`
/// and 4 to 15 digits.
pub fn is_e164(v: &str) -> bool {
    v.strip_prefix('+').is_some_and(|d| (4..=15).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The domains of Gmail, whose mailboxes ignore the dots of their local part: `v.ictim@gmail.com`
/// and `victim@googlemail.com` are `victim@gmail.com`'s inbox.
const GMAIL_DOMAINS: [&str; 2] = ["gmail.com", "googlemail.com"];

/// The mailbox or phone number one-time code limits count, one rule for both processes: an email
/// address unquoted (`"victim"@example.com`), without its `+tag` (`victim+1@…`), in lower case,
/// its domain without a final dot and in its ASCII form (an internationalized domain is the
/// punycode its mail is delivered to, `exämple.com` is `xn--exmple-cua.com`; one that is not a
/// valid IDNA domain is refused), a Gmail address without the dots of its local part and with
/// `googlemail.com` read as `gmail.com`; a phone number in E.164 with the spaces, dashes, dots
/// and brackets people type removed. `None` for anything else (an address with no `@`, an empty
/// part, whitespace or control characters). The code still goes to the contact as given: only
/// its spellings share one allowance.
pub fn canonical_contact(contact: &str) -> Option<String> {
    let contact = contact.trim();
    let Some((local, domain)) = contact.rsplit_once('@') else {
        let phone: String = contact.chars().filter(|c| !matches!(c, ' ' | '-' | '.' | '(' | ')')).collect();
        return is_e164(&phone).then_some(phone);
    };
    let local = match local.strip_prefix('"').and_then(|l| l.strip_suffix('"')) {
        // A quoted local part: its backslash escapes read as the characters they escape.
        Some(quoted) => {
            let mut out = String::with_capacity(quoted.len());
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => out.push(chars.next()?),
                    '"' => return None,
                    c => out.push(c),
                }
            }
            // An `@` or `"` inside quotes (legal, but no provider's mailbox) would make a
            // canonical form that is not its own: refused like an unquoted one.
            if out.contains(['"', '@']) {
                return None;
            }
            out
        }
        None if local.contains(['"', '@']) => return None,
        None => local.to_string(),
    };
    let mut local = local.split('+').next().unwrap_or_default().to_lowercase();
    let bad = |s: &str| s.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control());
    if bad(domain) {
        return None;
    }
    // UTS 46 (what mail software resolves a Unicode domain with): mapped (case, width, the
    // ideographic full stop), then punycode. An ASCII domain is only lowercased.
    let domain = if domain.is_ascii() { domain.to_ascii_lowercase() } else { idna::domain_to_ascii(domain).ok()? };
    let mut domain = domain.strip_suffix('.').unwrap_or(&domain).to_string();
    if GMAIL_DOMAINS.contains(&domain.as_str()) {
        local.retain(|c| c != '.');
        domain = GMAIL_DOMAINS[0].to_string();
    }
    if bad(&local) || bad(&domain) {
        return None;
    }
    Some(format!("{local}@{domain}"))
}

/// The signing input (`header.claims`, base64url) of a token with `claims` (`token_type` added)
/// and the SHA-256 digest the notarizer signs; the token is the input, `.`, and the signature
/// `r ‖ s` base64url ([`assemble`]).
pub fn signing_input(claims: &Value) -> (String, [u8; 32]) {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut claims = claims.clone();
    claims["token_type"] = json!(TOKEN_TYPE);
    let header = json!({ "alg": "ES256", "typ": "JWT", "kid": TOKEN_KID });
    let input = format!("{}.{}", b64.encode(header.to_string()), b64.encode(claims.to_string()));
    let digest = Sha256::digest(input.as_bytes()).into();
    (input, digest)
}

/// The token from its signing input and the notarizer's `r ‖ s` signature.
pub fn assemble(input: &str, signature: &[u8; 64]) -> String {
    format!("{input}.{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature))
}

/// The claims of `token` read without checking anything (only to find where its user is).
pub fn unverified_claims(token: &str) -> Option<Value> {
    let part = token.trim().split('.').nth(1)?;
    serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part).ok()?).ok()
}

/// Checks `token` against the notarizer's public key (SEC1): signed as a verification token, and
/// unexpired at `now_ms`. `None` for anything else, whatever the reason.
pub fn verify(token: &str, notarizer_public: &[u8], now_ms: i64) -> Option<VerifiedToken> {
    use p256::ecdsa::signature::hazmat::PrehashVerifier;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut parts = token.trim().split('.');
    let (Some(h), Some(c), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return None;
    };
    let header: Value = serde_json::from_slice(&b64.decode(h).ok()?).ok()?;
    if header.get("alg").and_then(Value::as_str) != Some("ES256")
        || header.get("kid").and_then(Value::as_str) != Some(TOKEN_KID)
    {
        return None;
    }
    let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(notarizer_public).ok()?;
    let signature = p256::ecdsa::Signature::from_slice(&b64.decode(s).ok()?).ok()?;
    let digest: [u8; 32] = Sha256::digest(format!("{h}.{c}").as_bytes()).into();
    key.verify_prehash(&digest, &signature).ok()?;
    let claims: Value = serde_json::from_slice(&b64.decode(c).ok()?).ok()?;
    if claims.get("token_type").and_then(Value::as_str) != Some(TOKEN_TYPE) {
        return None;
    }
    let text = |k: &str| claims.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let expires_ms = text("exp").parse::<i64>().ok()?;
    if now_ms >= expires_ms {
        return None;
    }
    Some(VerifiedToken {
        id: text("id"),
        contact: text("contact"),
        verification_type: text("verification_type"),
        public_key: text("public_key"),
        organization_id: text("organization_id"),
        expires_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mailbox_counts_once_whatever_its_spelling() {
        for spelling in [
            "victim@example.com",
            "\"victim\"@example.com",
            "VICTIM@Example.COM",
            "victim+1@example.com",
            "victim+promo+2@example.com.",
            "  victim@example.com ",
            "\"vic\\tim\"@example.com",
            "\"Victim+x\"@EXAMPLE.com",
        ] {
            assert_eq!(canonical_contact(spelling).as_deref(), Some("victim@example.com"), "{spelling}");
        }
        assert_eq!(canonical_contact("other@example.com").as_deref(), Some("other@example.com"));
        // Dots count outside Gmail.
        assert_eq!(canonical_contact("vic.tim@example.com").as_deref(), Some("vic.tim@example.com"));
        assert_eq!(canonical_contact("victim@example.org").as_deref(), Some("victim@example.org"));
        for bad in [
            "",
            "@example.com",
            "victim@",
            "+tag@example.com",
            "a b@example.com",
            "\"a\"b\"@x.test",
            "a\"b@x.test",
            "\"a\\\"@x.test",
            "\"vic@tim\"@example.com",
            "\"vic\\@tim\"@example.com",
            "\"vic\\\"tim\"@example.com",
            "victim",
            "v\u{0}@x.test",
        ] {
            assert_eq!(canonical_contact(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_gmail_inbox_counts_once_with_or_without_dots() {
        // Issue 39 follow-up: Gmail delivers `v.i.c.t.i.m@gmail.com` and `victim@googlemail.com`
        // to `victim@gmail.com`, and each had its own allowance.
        for spelling in [
            "victim@gmail.com",
            "v.i.c.t.i.m@gmail.com",
            "Vic.Tim+promo@GMail.com.",
            "victim@googlemail.com",
            "vic.tim@GoogleMail.COM",
            "\"v.ictim+x\"@gmail.com",
            "victim@ｇｍａｉｌ.com",
        ] {
            assert_eq!(canonical_contact(spelling).as_deref(), Some("victim@gmail.com"), "{spelling}");
        }
        assert_eq!(canonical_contact("...@gmail.com"), None, "nothing but dots is no mailbox");
        assert_eq!(canonical_contact("victim@gmail.co").as_deref(), Some("victim@gmail.co"));
        assert_eq!(canonical_contact("vic.tim@mail.gmail.com").as_deref(), Some("vic.tim@mail.gmail.com"));
    }

    #[test]
    fn an_internationalized_domain_counts_in_its_ascii_form() {
        // Issue 39 follow-up: `victim@exämple.com` and `victim@xn--exmple-cua.com` are one inbox
        // (mail to the first is delivered to the second) and had two allowances.
        for spelling in [
            "victim@xn--exmple-cua.com",
            "victim@XN--EXMPLE-CUA.COM",
            "victim@exämple.com",
            "Victim+1@EXÄMPLE.com",
            "victim@exämple.com.",
            "victim@exämple。com",
            "victim@ｅｘäｍｐｌｅ.com",
            "victim@exa\u{308}mple.com",
            "victim@ex\u{200b}ämple.com",
        ] {
            assert_eq!(canonical_contact(spelling).as_deref(), Some("victim@xn--exmple-cua.com"), "{spelling}");
        }
        // The local part keeps its Unicode (SMTPUTF8 mailboxes), in lower case.
        assert_eq!(canonical_contact("JÖRG@bücher.de").as_deref(), Some("jörg@xn--bcher-kva.de"));
        // Not a domain IDNA can deliver to: refused, not counted under a spelling of its own.
        for bad in ["victim@xn--a.com\u{e9}", "victim@\u{e9}\u{fffd}.com"] {
            assert_eq!(canonical_contact(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_phone_number_counts_in_e164() {
        for spelling in ["+13214567890", "+1 321 456 7890", "+1 (321) 456-7890", "+1.321.456.7890"] {
            assert_eq!(canonical_contact(spelling).as_deref(), Some("+13214567890"), "{spelling}");
        }
        for bad in ["13214567890", "+1 321 456 789a", "+", "++13214567890", "+1234567890123456"] {
            assert_eq!(canonical_contact(bad), None, "{bad:?}");
        }
    }
    use p256::ecdsa::signature::hazmat::PrehashSigner;

    fn token(key: &p256::ecdsa::SigningKey, claims: Value) -> String {
        let (input, digest) = signing_input(&claims);
        let sig: p256::ecdsa::Signature = key.sign_prehash(&digest).unwrap();
        assemble(&input, &sig.to_bytes().into())
    }

    #[test]
    fn a_token_verifies_only_with_its_key_kid_type_and_time() {
        let key = p256::ecdsa::SigningKey::from_slice(&[7; 32]).unwrap();
        let public = key.verifying_key().to_encoded_point(false);
        let claims = json!({ "id": "t1", "contact": "a@b.test", "verification_type": "OTP_TYPE_EMAIL",
            "public_key": "", "organization_id": "o", "exp": "2000" });
        let t = token(&key, claims.clone());
        let v = verify(&t, public.as_bytes(), 1999).unwrap();
        assert_eq!((v.id.as_str(), v.contact.as_str(), v.expires_ms), ("t1", "a@b.test", 2000));
        assert!(verify(&t, public.as_bytes(), 2000).is_none(), "expired");
        let other = p256::ecdsa::SigningKey::from_slice(&[8; 32]).unwrap();
        assert!(verify(&t, other.verifying_key().to_encoded_point(false).as_bytes(), 0).is_none());
        // The same claims signed as a session JWT would be (another kid, no token_type): refused.
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let input = format!(
            "{}.{}",
            b64.encode(json!({"alg":"ES256","typ":"JWT"}).to_string()),
            b64.encode(claims.to_string())
        );
        let sig: p256::ecdsa::Signature = key.sign_prehash(&Sha256::digest(input.as_bytes())).unwrap();
        assert!(verify(&assemble(&input, &sig.to_bytes().into()), public.as_bytes(), 0).is_none());
        // One changed claim: refused.
        let mut parts: Vec<String> = t.split('.').map(str::to_string).collect();
        parts[1] = b64.encode(
            json!({ "id": "t1", "contact": "x@b.test", "verification_type": "OTP_TYPE_EMAIL",
            "public_key": "", "exp": "2000", "token_type": TOKEN_TYPE })
            .to_string(),
        );
        assert!(verify(&parts.join("."), public.as_bytes(), 0).is_none());
        assert_eq!(unverified_claims(&t).unwrap()["contact"], "a@b.test");
    }
}
