//! OIDC token (JWT) verification, one implementation for the gateway and the enclave: RS256 /
//! ES256 signatures against the issuer's JWKS found through `{iss}/.well-known/openid-configuration`
//! (or a JWKS the caller holds, for Coffer's own issuer), `exp` in the future, `iss`/`sub`/`aud`
//! present; and the identity hash an OAuth provider's certificate binds.

use std::time::Duration;

use p256::ecdsa::signature::Verifier;
use serde::Deserialize;
use serde_json::Value;

use crate::webauthn::b64url_decode;
use crate::AuthError;

/// The largest discovery document or JWKS accepted from an issuer.
const MAX_DOCUMENT: usize = 256 * 1024;
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The OAuth 2.0 providers whose codes Coffer exchanges (`Oauth2Provider` of the SDK).
pub const OAUTH2_PROVIDERS: &[&str] = &["OAUTH2_PROVIDER_X", "OAUTH2_PROVIDER_DISCORD"];

/// 400 `INVALID_OIDC_TOKEN`: "invalid OIDC token: <why>".
pub fn invalid(detail: impl std::fmt::Display) -> AuthError {
    AuthError { turnkey_code: "INVALID_OIDC_TOKEN", ..AuthError::invalid(format!("invalid OIDC token: {detail}")) }
}

/// The hex SHA-256 of an OAuth identity (issuer, subject, audience, each length-prefixed): what an
/// OAuth provider's enclave certificate binds in place of a public key.
pub fn identity_hash(iss: &str, sub: &str, aud: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"coffer-oauth-identity-v1");
    for part in [iss, sub, aud] {
        h.update((part.len() as u32).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// The (issuer, subject, audience) of a token, read without verifying it: for the grants of a
/// stamped body that attaches the identity (the stamping credential vouches for the body; the
/// gateway verified the token when it accepted it).
pub fn unverified_identity(token: &str) -> Result<(String, String, String), AuthError> {
    let mut jwt = split(token)?;
    if let Some(o) = jwt.payload.as_object_mut() {
        o.remove("nbf");
    }
    let c = claims(&jwt.payload, i64::MIN)?;
    Ok((c.iss, c.sub, c.aud))
}

/// The claims Coffer keeps from a verified token.
#[derive(Debug, Clone, PartialEq)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    /// The audience (the first one when the token lists several).
    pub aud: String,
    pub exp: i64,
    /// `nonce`, or `tknonce` when `nonce` is absent.
    pub nonce: Option<String>,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
}

/// A JWT split into its parts; nothing is verified yet.
struct Jwt {
    header: Header,
    payload: Value,
    signing_input: Vec<u8>,
    signature: Vec<u8>,
}

fn split(token: &str) -> Result<Jwt, AuthError> {
    let parts: Vec<&str> = token.trim().split('.').collect();
    let [h, p, s] = parts.as_slice() else {
        return Err(invalid("not a JWT (expected three dot-separated parts)"));
    };
    let header: Header = b64url_decode(h)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| invalid("malformed JWT header"))?;
    let payload: Value = b64url_decode(p)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(Value::is_object)
        .ok_or_else(|| invalid("malformed JWT payload"))?;
    let signature = b64url_decode(s).ok_or_else(|| invalid("malformed JWT signature"))?;
    Ok(Jwt { header, payload, signing_input: format!("{h}.{p}").into_bytes(), signature })
}

/// Checks the registered claims at `now` (Unix seconds): `exp` in the future, `nbf` (if any)
/// not ahead by more than a minute, and non-empty `iss`, `sub`, `aud`.
fn claims(payload: &Value, now: i64) -> Result<Claims, AuthError> {
    let text = |k: &str| payload.get(k).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
    let iss = text("iss").ok_or_else(|| invalid("missing iss claim"))?;
    let sub = text("sub").ok_or_else(|| invalid("missing sub claim"))?;
    let aud = match payload.get("aud") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Array(a)) => a
            .first()
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| invalid("missing aud claim"))?,
        _ => return Err(invalid("missing aud claim")),
    };
    let exp = payload.get("exp").and_then(Value::as_f64).ok_or_else(|| invalid("missing exp claim"))? as i64;
    if exp <= now {
        return Err(invalid("token has expired"));
    }
    if let Some(nbf) = payload.get("nbf").and_then(Value::as_f64) {
        if nbf as i64 > now + 60 {
            return Err(invalid("token is not valid yet (nbf)"));
        }
    }
    Ok(Claims { iss, sub, aud, exp, nonce: text("nonce").or_else(|| text("tknonce")) })
}

/// Verifies the JWT signature with a key of `jwks` (`{"keys": [...]}`): the key named by `kid`
/// (any key of the right type when the token has none). RS256 and ES256 only.
fn verify_signature(jwt: &Jwt, jwks: &Value) -> Result<(), AuthError> {
    let kty = match jwt.header.alg.as_str() {
        "RS256" => "RSA",
        "ES256" => "EC",
        other => return Err(invalid(format!("unsupported signing algorithm {other:?} (RS256 or ES256)"))),
    };
    let keys = jwks.get("keys").and_then(Value::as_array).ok_or_else(|| invalid("the issuer's JWKS has no keys"))?;
    let field = |k: &Value, f: &str| k.get(f).and_then(Value::as_str).map(str::to_string);
    let candidates: Vec<&Value> = keys
        .iter()
        .filter(|k| field(k, "kty").as_deref() == Some(kty))
        .filter(|k| jwt.header.kid.is_none() || field(k, "kid") == jwt.header.kid)
        .filter(|k| !matches!(field(k, "alg"), Some(a) if a != jwt.header.alg))
        .filter(|k| !matches!(field(k, "use"), Some(u) if u != "sig"))
        .collect();
    if candidates.is_empty() {
        return Err(invalid("no key of the issuer's JWKS matches the token's kid and alg"));
    }
    let bytes = |k: &Value, f: &str| field(k, f).and_then(|v| b64url_decode(&v));
    let ok = candidates.iter().any(|k| match kty {
        "RSA" => match (bytes(k, "n"), bytes(k, "e")) {
            (Some(n), Some(e)) => ring::signature::RsaPublicKeyComponents { n, e }
                .verify(&ring::signature::RSA_PKCS1_2048_8192_SHA256, &jwt.signing_input, &jwt.signature)
                .is_ok(),
            _ => false,
        },
        _ => {
            let (Some(x), Some(y)) = (bytes(k, "x"), bytes(k, "y")) else { return false };
            if field(k, "crv").as_deref() != Some("P-256") || x.len() != 32 || y.len() != 32 {
                return false;
            }
            let sec1 = [&[0x04][..], &x, &y].concat();
            let (Ok(vk), Ok(sig)) =
                (p256::ecdsa::VerifyingKey::from_sec1_bytes(&sec1), p256::ecdsa::Signature::from_slice(&jwt.signature))
            else {
                return false;
            };
            vk.verify(&jwt.signing_input, &sig).is_ok()
        }
    });
    if ok {
        Ok(())
    } else {
        Err(invalid("signature does not verify with the issuer's keys"))
    }
}

/// An HTTP client for issuers' documents: no redirects, bounded time, and a `User-Agent` naming
/// the process that fetches (`coffer-gateway/<version>`, `coffer-enclave/<version>`).
pub fn http_client(user_agent: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(FETCH_TIMEOUT)
        .connect_timeout(FETCH_TIMEOUT)
        .user_agent(user_agent)
        .build()
        .unwrap_or_default()
}

/// How the keys of an issuer other than Coffer's own are fetched: with which client, and from
/// which issuers at all (`None`: any issuer, the gateway's rule; `Some`: only those listed,
/// compared without a trailing `/`, the enclave's rule).
#[derive(Clone, Copy)]
pub struct Fetch<'a> {
    pub client: &'a reqwest::Client,
    pub allowed: Option<&'a [String]>,
}

/// Whether `iss` is one of `allowed` (both compared without a trailing `/`).
pub fn issuer_listed(allowed: &[String], iss: &str) -> bool {
    let iss = iss.trim_end_matches('/');
    allowed.iter().any(|a| a.trim_end_matches('/') == iss)
}

/// The rule for every URL Coffer fetches from on a login's behalf (OIDC issuers, OAuth 2.0
/// providers): `https`, or `http` to a loopback host (local issuers and providers in development
/// and tests). Redirects are never followed.
pub fn https_or_loopback(url: &str) -> Result<reqwest::Url, String> {
    let u = reqwest::Url::parse(url).map_err(|_| format!("{url:?} is not a URL"))?;
    let host = u.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let loopback =
        host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    match u.scheme() {
        "https" => Ok(u),
        "http" if loopback => Ok(u),
        _ => Err(format!("{url:?} must be an https URL (http only to a loopback host)")),
    }
}

fn fetchable(url: &str) -> Result<reqwest::Url, AuthError> {
    https_or_loopback(url).map_err(invalid)
}

async fn fetch_json(http: &reqwest::Client, url: &str) -> Result<Value, AuthError> {
    let u = fetchable(url)?;
    let unreachable = |e: &dyn std::fmt::Display| invalid(format!("could not fetch {url}: {e}"));
    let mut resp = http.get(u).send().await.map_err(|e| unreachable(&e))?;
    if !resp.status().is_success() {
        return Err(unreachable(&format!("HTTP {}", resp.status().as_u16())));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| unreachable(&e))? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_DOCUMENT {
            return Err(unreachable(&format!("document larger than {MAX_DOCUMENT} bytes")));
        }
    }
    serde_json::from_slice(&body).map_err(|_| unreachable(&"not JSON"))
}

/// The issuer's signing keys: discovery document → `jwks_uri` → JWKS.
async fn issuer_keys(http: &reqwest::Client, iss: &str) -> Result<Value, AuthError> {
    let base = iss.trim_end_matches('/');
    let config = fetch_json(http, &format!("{base}/.well-known/openid-configuration")).await?;
    let issuer = config.get("issuer").and_then(Value::as_str).unwrap_or_default();
    if issuer.trim_end_matches('/') != base {
        return Err(invalid(format!("the discovery document's issuer {issuer:?} is not the token's iss")));
    }
    let jwks_uri = config
        .get("jwks_uri")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("the discovery document has no jwks_uri"))?;
    fetch_json(http, jwks_uri).await
}

fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// Verifies `token` against `jwks` at `now` (Unix seconds): structure, registered claims, then the
/// signature. No network; what [`verify`] does once it has the issuer's keys.
pub fn verify_with_jwks(token: &str, jwks: &Value, now: i64) -> Result<Claims, AuthError> {
    let jwt = split(token)?;
    let claims = claims(&jwt.payload, now)?;
    if !matches!(jwt.header.alg.as_str(), "RS256" | "ES256") {
        return Err(invalid(format!("unsupported signing algorithm {:?} (RS256 or ES256)", jwt.header.alg)));
    }
    verify_signature(&jwt, jwks)?;
    Ok(claims)
}

/// An ES256 issuer key (uncompressed P-256 point) as a JWK.
pub fn es256_jwk(point: &[u8], kid: &str) -> Value {
    use crate::webauthn::b64url;
    let (x, y) = match point {
        [0x04, rest @ ..] if rest.len() == 64 => (b64url(&rest[..32]), b64url(&rest[32..])),
        _ => (String::new(), String::new()),
    };
    serde_json::json!({ "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": kid, "x": x, "y": y })
}

/// Coffer's own issuer: its `iss` and its JWKS, held without a network fetch.
pub struct OwnIssuer<'a> {
    pub issuer: &'a str,
    pub jwks: &'a Value,
}

/// The claims of `token` at `now` (Unix seconds), checked for everything that needs no key:
/// structure, registered claims (`exp` in the future) and a supported algorithm. Its signature is
/// NOT verified: for deciding, before anything is fetched, whether the token's issuer and
/// identity are worth fetching keys for.
pub fn unverified_claims(token: &str, now: i64) -> Result<Claims, AuthError> {
    let jwt = split(token)?;
    let claims = claims(&jwt.payload, now)?;
    if !matches!(jwt.header.alg.as_str(), "RS256" | "ES256") {
        return Err(invalid(format!("unsupported signing algorithm {:?} (RS256 or ES256)", jwt.header.alg)));
    }
    Ok(claims)
}

/// Verifies `token` completely: structure, claims, then the signature with the issuer's keys —
/// `own`'s JWKS for Coffer's own tokens (no network fetch), the issuer's published JWKS for any
/// other issuer `fetch` allows (an issuer it does not allow is refused before any fetch).
pub async fn verify(token: &str, own: Option<OwnIssuer<'_>>, fetch: Fetch<'_>) -> Result<Claims, AuthError> {
    let now = now_secs();
    // Structure, claims and algorithm first: nothing is fetched for a token that cannot pass.
    let claims = unverified_claims(token, now)?;
    match own {
        Some(own) if own.issuer == claims.iss => verify_with_jwks(token, own.jwks, now),
        _ => {
            if fetch.allowed.is_some_and(|allowed| !issuer_listed(allowed, &claims.iss)) {
                return Err(invalid("the token's issuer is not one this deployment trusts"));
            }
            verify_with_jwks(token, &issuer_keys(fetch.client, &claims.iss).await?, now)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webauthn::b64url;
    use p256::ecdsa::signature::Signer;
    use serde_json::json;

    /// A 2048-bit RSA key (PKCS#1 DER, base64), made with `openssl genpkey` for these tests only.
    const RSA_PKCS1: &str = "MIIEowIBAAKCAQEA3JJWYzp/N5EmRcDbea/4C1FSt75pqXKzp9IE6NyzTinKwMsJWj4fp6I7UoNBYIf/QOYwZFsncRx0k2QlVN/tz4YYeYzPe4n7oIWQjAntl1SevGWFMi7m6kvV1EfSQy3pykM88G3SpN0hdxTMHtYnTwzgv9a/o9Fcbr5U8jzs435ywOn26bpcu+KNIVoS4GovKD3ledQNy2mPTDEcxKB9XS91quZVfOHbDB1y5/1nq5eGNBaNcs7tGVYbKCL+nqSMQnIazkPW0Q2TLTSjw4d3BkNn+bF1VTWtPGdfbUkhktuQc/CyhiomH9f9BI+9dgcZYW0ONbXoYVs/6ACW8Z2+PQIDAQABAoIBAAUFWxcQ0/2GqH7fqCn/IfUr/uc02+s3Xl88biUuL5y2DH9SqoirL7BIBp6sYzbDJxcp8OxlO3gdLuAotZrW1W8rEm/jOdk057fx4mZLAZAMz+eM+LkO4phvF9PTELZmcKh3MFzEEI6f2VerGbG9VpFmQyV1dND8qTnSIP/kotB+MQ9IpUIqy6Ezq/odsACzx8hsFx6ubJzj/Er+X/d1Jl6p+ROQNx4Wmuc8DNoVy5KQ/mDx2VhO3n6x46A0C5b1kE0kOPw+FSsO3ITvnc1T/uLFJbCteSh5OXGDgLktxi9wHtznnC4ETBbNVvMrK+4qFMZtk3hHOc8Z6ySL04U3bTcCgYEA8x9HLTEPcsNTW2MDLcXU5vW/g4q527uZqpUr6+8vE+HqsxQTp6lL/joyAFkob0Ug7rJzDRGHyFO8ZUY/qmDGXJCmjOG6tbSs3h5nhJ1PGQBD3e0sdYydEPuZZi6jdhBlaUt5WXl1wZVbCLFCRDFOebgMlQ12zfKf/LqqEYgE++sCgYEA6EFGfO74V0CqcrsbpMW8LkeCCUFn7/+i2GRO9RaS/VkBBbUeH7BXJNWIBL0cPlKhyZiJdEilIQOncNNjEHViEvktUQpL+AukP1/UsD9WVQamfDU31eS68d6od3u1ewZIzHZvU0d7X9yyerAA5OPvsHoZBN2JtMKTo07rfOkw7HcCgYABQP4K+5/KxbseU4pmqAiLEGVmdkazHWqTeKV7WAZ0IcwmFEptqO/dZctwOQV+XWroED+Lp7V9kQD9vLkDVfBv9ccGHvvph/8EPj/mbTFFPb0b3edGy+zbc5C8+CybpUYAnwUHMxsqXmzTxKZE18RB2HMoKaOdOE0e7o+F+5+a9QKBgCdEIe6tWD8oJ6kOCTZqV85bOJjn/fKNfbKoAtFc56z9hza30Ef7QEBx+XUTo9rFjaTPrS2DuqdCPuTMWEtIDTS3+/lfjEh7b2FnikXh726gmTUWqkH3UcPiqQjKWXxbK6OlwlyKEUm7vlEPwJbyEmv7uI8iBU4SN3O8vAN6SVMxAoGBAMV0gCBpTiW0OhHyJCn/xESoIyW5Tp2eejpD4+F0Zln8CkCguZA2NWpC4WVlmKEVXhDQTbqQDmnEtWHJnt1Ns3oWn0IKPNlibYhhaI2GNTFbxDVSl2+S0K5hStcYYFvO7L58fdho24vmWMZhqTu+fIVWRCydvrmfyLn5NpvbBpiz";

    fn token(alg: &str, kid: &str, claims: &Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
        let h = b64url(json!({"alg": alg, "kid": kid, "typ": "JWT"}).to_string().as_bytes());
        let p = b64url(claims.to_string().as_bytes());
        let input = format!("{h}.{p}");
        format!("{input}.{}", b64url(&sign(input.as_bytes())))
    }

    fn ec_key(seed: u8) -> (p256::ecdsa::SigningKey, Value) {
        let sk = p256::ecdsa::SigningKey::from_slice(&[seed; 32]).unwrap();
        let p = sk.verifying_key().to_encoded_point(false);
        let jwk = json!({"kty": "EC", "crv": "P-256", "kid": "ec1", "alg": "ES256", "use": "sig",
            "x": b64url(p.x().unwrap()), "y": b64url(p.y().unwrap())});
        (sk, jwk)
    }

    fn good_claims() -> Value {
        json!({"iss": "https://issuer.example", "sub": "user-1", "aud": "client-1", "exp": now_secs() + 600,
            "iat": now_secs(), "nonce": "abc"})
    }

    #[test]
    fn es256_verifies_and_a_wrong_key_does_not() {
        let (sk, jwk) = ec_key(1);
        let t = token("ES256", "ec1", &good_claims(), |m| {
            let s: p256::ecdsa::Signature = sk.sign(m);
            s.to_bytes().to_vec()
        });
        let jwt = split(&t).unwrap();
        verify_signature(&jwt, &json!({"keys": [jwk]})).unwrap();
        let c = claims(&jwt.payload, now_secs()).unwrap();
        assert_eq!((c.iss.as_str(), c.sub.as_str(), c.aud.as_str()), ("https://issuer.example", "user-1", "client-1"));
        assert_eq!(c.nonce.as_deref(), Some("abc"));
        let (_, other) = ec_key(2);
        let e = verify_signature(&jwt, &json!({"keys": [other]})).unwrap_err();
        assert_eq!((e.code, e.turnkey_code), (crate::Code::InvalidArgument, "INVALID_OIDC_TOKEN"));
        assert!(e.message.starts_with("invalid OIDC token"));
        // kid mismatch: no candidate key.
        let mut renamed = ec_key(1).1;
        renamed["kid"] = json!("other");
        assert!(verify_signature(&jwt, &json!({"keys": [renamed]})).unwrap_err().message.contains("kid"));
    }

    #[test]
    fn rs256_verifies() {
        use base64::Engine;
        let der = base64::engine::general_purpose::STANDARD.decode(RSA_PKCS1).unwrap();
        let kp = ring::signature::RsaKeyPair::from_der(&der).unwrap();
        let comps = ring::signature::RsaPublicKeyComponents::<Vec<u8>>::from(kp.public());
        let jwk = json!({"kty": "RSA", "kid": "r1", "n": b64url(&comps.n), "e": b64url(&comps.e)});
        let sign = |m: &[u8]| {
            let mut sig = vec![0; kp.public().modulus_len()];
            kp.sign(&ring::signature::RSA_PKCS1_SHA256, &ring::rand::SystemRandom::new(), m, &mut sig).unwrap();
            sig
        };
        let t = token("RS256", "r1", &good_claims(), sign);
        let jwt = split(&t).unwrap();
        verify_signature(&jwt, &json!({"keys": [ec_key(1).1, jwk]})).unwrap();
        // A tampered payload fails.
        let parts: Vec<&str> = t.split('.').collect();
        let mut c = good_claims();
        c["sub"] = json!("someone-else");
        let forged = format!("{}.{}.{}", parts[0], b64url(c.to_string().as_bytes()), parts[2]);
        assert!(verify_signature(&split(&forged).unwrap(), &json!({"keys": [jwk]})).is_err());
    }

    /// Untrusted tokens: every truncation and thousands of byte flips of a valid token verify or
    /// fail cleanly with INVALID_OIDC_TOKEN, never panic, and a flipped token never verifies
    /// with another identity than it names.
    #[test]
    fn mutated_tokens_never_panic() {
        let (sk, jwk) = ec_key(4);
        let jwks = json!({ "keys": [jwk] });
        let t = token("ES256", "ec1", &good_claims(), |m| {
            let s: p256::ecdsa::Signature = sk.sign(m);
            s.to_bytes().to_vec()
        });
        let now = now_secs();
        assert!(verify_with_jwks(&t, &jwks, now).is_ok());
        let check = |b: &[u8]| {
            let Ok(text) = std::str::from_utf8(b) else { return };
            match verify_with_jwks(text, &jwks, now) {
                Ok(c) => assert_eq!(unverified_identity(text).unwrap(), (c.iss, c.sub, c.aud)),
                Err(e) => assert_eq!(e.turnkey_code, "INVALID_OIDC_TOKEN"),
            }
        };
        crate::testing::for_each_mutation(t.as_bytes(), 0x2545_f491_4f6c_dd1d, 4000, check);
    }

    #[test]
    fn claims_are_checked() {
        let now = now_secs();
        let mut c = good_claims();
        c["exp"] = json!(now - 1);
        assert!(claims(&c, now).unwrap_err().message.contains("expired"));
        for k in ["iss", "sub", "aud", "exp"] {
            let mut c = good_claims();
            c.as_object_mut().unwrap().remove(k);
            assert!(claims(&c, now).unwrap_err().message.contains(k), "{k}");
        }
        let mut c = good_claims();
        c["aud"] = json!(["a1", "a2"]);
        c.as_object_mut().unwrap().remove("nonce");
        c["tknonce"] = json!("t");
        let got = claims(&c, now).unwrap();
        assert_eq!((got.aud.as_str(), got.nonce.as_deref()), ("a1", Some("t")));
        let mut c = good_claims();
        c["nbf"] = json!(now + 3600);
        assert!(claims(&c, now).is_err());
    }

    #[test]
    fn issuer_lists_and_unverified_claims() {
        let allowed = ["https://accounts.google.com".to_string(), "http://127.0.0.1:9000/".to_string()];
        assert!(issuer_listed(&allowed, "https://accounts.google.com/"));
        assert!(issuer_listed(&allowed, "http://127.0.0.1:9000"));
        assert!(!issuer_listed(&allowed, "http://127.0.0.1:9001"));
        assert!(!issuer_listed(&allowed, "https://accounts.google.com.evil"));
        assert!(!issuer_listed(&[], "https://accounts.google.com"));
        // Claims are read (and checked) without any key; a bad signature does not matter yet.
        let t = token("ES256", "k", &good_claims(), |_| vec![0; 64]);
        assert_eq!(unverified_claims(&t, now_secs()).unwrap().iss, "https://issuer.example");
        let mut expired = good_claims();
        expired["exp"] = json!(now_secs() - 1);
        assert!(unverified_claims(&token("ES256", "k", &expired, |_| vec![0; 64]), now_secs()).is_err());
        assert!(unverified_claims(&token("HS256", "k", &good_claims(), |_| vec![0; 64]), now_secs()).is_err());
    }

    #[test]
    fn malformed_tokens_and_urls() {
        for t in ["", "a.b", "a.b.c.d", "!!.e30.AA", "e30.!!.AA"] {
            assert_eq!(split(t).err().map(|e| e.turnkey_code), Some("INVALID_OIDC_TOKEN"), "{t}");
        }
        let (_, jwk) = ec_key(1);
        let t = token("HS256", "ec1", &good_claims(), |_| vec![1, 2]);
        assert!(verify_signature(&split(&t).unwrap(), &json!({"keys": [jwk]})).unwrap_err().message.contains("HS256"));
        assert!(fetchable("https://accounts.google.com").is_ok());
        assert!(fetchable("http://127.0.0.1:8080/x").is_ok());
        assert!(fetchable("http://localhost/x").is_ok());
        assert!(fetchable("http://issuer.example").is_err());
        assert!(fetchable("file:///etc/passwd").is_err());
        assert!(fetchable("not a url").is_err());
    }
}
