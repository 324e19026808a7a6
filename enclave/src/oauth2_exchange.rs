//! Social login inside the enclave: the OAuth 2.0 code exchange with the provider (endpoints from
//! the enclave's configuration only), the user endpoint, and the OIDC token Coffer signs.

use serde_json::{json, Map, Value};
use zeroize::Zeroizing;

use crate::config::{provider_url, LoginSettings};
use crate::error::EnclaveError;

/// How long the OIDC tokens Coffer issues live.
pub const OIDC_TOKEN_LIFETIME_SECS: i64 = 15 * 60;
/// The largest provider answer read.
const MAX_PROVIDER_ANSWER: usize = 64 * 1024;

pub const PROVIDER_X: &str = coffer_auth::oidc::OAUTH2_PROVIDERS[0];
pub const PROVIDER_DISCORD: &str = coffer_auth::oidc::OAUTH2_PROVIDERS[1];

/// A provider's display name and endpoints.
struct Provider<'a> {
    name: &'static str,
    token_url: &'a str,
    userinfo_url: &'a str,
}

fn provider<'a>(settings: &'a LoginSettings, provider: &str) -> Result<Provider<'a>, EnclaveError> {
    match provider {
        PROVIDER_X => {
            Ok(Provider { name: "X", token_url: &settings.x_token_url, userinfo_url: &settings.x_userinfo_url })
        }
        PROVIDER_DISCORD => Ok(Provider {
            name: "Discord",
            token_url: &settings.discord_token_url,
            userinfo_url: &settings.discord_userinfo_url,
        }),
        other => {
            check_provider(other)?;
            Err(EnclaveError::Internal("an OAuth 2.0 provider without endpoints".into()))
        }
    }
}

/// Checks a provider name of a stamped body.
pub fn check_provider(name: &str) -> Result<(), EnclaveError> {
    if coffer_auth::oidc::OAUTH2_PROVIDERS.contains(&name) {
        return Ok(());
    }
    Err(EnclaveError::invalid(format!(
        "unsupported OAuth 2.0 provider {name:?} (OAUTH2_PROVIDER_X or OAUTH2_PROVIDER_DISCORD)"
    )))
}

fn http() -> &'static reqwest::Client {
    crate::egress::client()
}

/// What the code exchange and the user endpoint gave.
pub struct ProviderUser {
    /// The provider's user id (X `data.id`, Discord `id`).
    pub subject: String,
    pub email: Option<String>,
    pub name: Option<String>,
    pub preferred_username: Option<String>,
    /// The provider's bearer token; only ever leaves encrypted.
    pub bearer_token: Zeroizing<String>,
}

/// The parameters of one code exchange, from the stamped body.
pub struct CodeExchange<'a> {
    pub provider: &'a str,
    pub client_id: &'a str,
    pub client_secret: &'a str,
    pub auth_code: &'a str,
    pub redirect_uri: &'a str,
    pub code_verifier: &'a str,
}

/// A short, printable excerpt of a provider's answer, without the client secret.
fn provider_answer(body: &[u8], secret: &str) -> String {
    let text = String::from_utf8_lossy(body);
    let v: Option<Value> = serde_json::from_slice(body).ok();
    let excerpt = match v.as_ref() {
        Some(v) => {
            let field = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
            match (field("error"), field("error_description").or_else(|| field("message")).or_else(|| field("detail")))
            {
                (Some(e), Some(d)) => format!("{e}: {d}"),
                (Some(e), None) | (None, Some(e)) => e,
                (None, None) => text.chars().take(200).collect(),
            }
        }
        None => text.chars().take(200).collect(),
    };
    let excerpt: String = excerpt.chars().filter(|c| !c.is_control()).take(200).collect();
    if !secret.is_empty() && excerpt.contains(secret) {
        return excerpt.replace(secret, "[redacted]");
    }
    excerpt
}

/// Sends `request` and reads a bounded JSON answer; a 4xx is the caller's fault (400 naming the
/// provider's answer), anything else that is not a 2xx is the provider's (502).
async fn call(
    provider: &str,
    what: &str,
    request: reqwest::RequestBuilder,
    secret: &str,
) -> Result<Value, EnclaveError> {
    let mut resp = request.send().await.map_err(|e| {
        EnclaveError::Upstream(format!("{provider} {what}: could not reach the provider ({})", reqwest_reason(&e)))
    })?;
    let status = resp.status();
    let mut body = Vec::new();
    while let Some(chunk) =
        resp.chunk().await.map_err(|e| EnclaveError::Upstream(format!("{provider} {what}: {}", reqwest_reason(&e))))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_PROVIDER_ANSWER {
            return Err(EnclaveError::Upstream(format!(
                "{provider} {what}: answer larger than {MAX_PROVIDER_ANSWER} bytes"
            )));
        }
    }
    if status.is_client_error() {
        return Err(EnclaveError::invalid(format!(
            "OAuth 2.0 provider {provider} refused the {what}: HTTP {} {}",
            status.as_u16(),
            provider_answer(&body, secret)
        )));
    }
    if !status.is_success() {
        return Err(EnclaveError::Upstream(format!(
            "OAuth 2.0 provider {provider} failed the {what}: HTTP {} {}",
            status.as_u16(),
            provider_answer(&body, secret)
        )));
    }
    serde_json::from_slice(&body)
        .map_err(|_| EnclaveError::Upstream(format!("OAuth 2.0 provider {provider} answered the {what} with no JSON")))
}

/// Why a request failed, without the URL's query (reqwest's Display includes the URL).
fn reqwest_reason(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    }
}

fn text_at(v: &Value, path: &[&str]) -> Option<String> {
    let mut cur = v;
    for k in path {
        cur = cur.get(*k)?;
    }
    match cur {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Exchanges the authorization code (PKCE, client authentication by HTTP Basic) and reads the
/// provider's user endpoint with the bearer token.
pub async fn exchange(settings: &LoginSettings, x: &CodeExchange<'_>) -> Result<ProviderUser, EnclaveError> {
    let p = provider(settings, x.provider)?;
    let token_url = provider_url(p.token_url).map_err(EnclaveError::Internal)?;
    let userinfo_url = provider_url(p.userinfo_url).map_err(EnclaveError::Internal)?;
    let form = [
        ("grant_type", "authorization_code"),
        ("code", x.auth_code),
        ("redirect_uri", x.redirect_uri),
        ("code_verifier", x.code_verifier),
        ("client_id", x.client_id),
    ];
    let request = http().post(token_url).basic_auth(x.client_id, Some(x.client_secret)).form(&form);
    let token = call(p.name, "code exchange", request, x.client_secret).await?;
    let bearer = Zeroizing::new(
        token
            .get("access_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| EnclaveError::Upstream(format!("OAuth 2.0 provider {} returned no access_token", p.name)))?
            .to_string(),
    );
    drop(token);
    let user =
        call(p.name, "user request", http().get(userinfo_url).bearer_auth(bearer.as_str()), x.client_secret).await?;
    let (subject, email, name, preferred_username) = match x.provider {
        PROVIDER_X => (
            text_at(&user, &["data", "id"]),
            text_at(&user, &["data", "confirmed_email"]),
            text_at(&user, &["data", "name"]),
            text_at(&user, &["data", "username"]),
        ),
        _ => (
            text_at(&user, &["id"]),
            text_at(&user, &["email"]).filter(|_| user.get("verified").and_then(Value::as_bool) != Some(false)),
            text_at(&user, &["global_name"]),
            text_at(&user, &["username"]),
        ),
    };
    let subject = subject
        .ok_or_else(|| EnclaveError::Upstream(format!("OAuth 2.0 provider {}'s user answer has no user id", p.name)))?;
    Ok(ProviderUser { subject, email, name, preferred_username, bearer_token: bearer })
}

/// The claims of Coffer's OIDC token for `user` (ES256, 15 minutes).
pub fn oidc_claims(
    issuer: &str,
    audience: &str,
    nonce: &str,
    user: &ProviderUser,
    now_secs: i64,
    encrypted_bearer_token: Option<String>,
) -> Value {
    let mut claims = Map::new();
    claims.insert("iss".into(), json!(issuer));
    claims.insert("sub".into(), json!(user.subject));
    claims.insert("aud".into(), json!(audience));
    claims.insert("nonce".into(), json!(nonce));
    claims.insert("iat".into(), json!(now_secs));
    claims.insert("exp".into(), json!(now_secs + OIDC_TOKEN_LIFETIME_SECS));
    for (k, v) in [("email", &user.email), ("name", &user.name), ("preferred_username", &user.preferred_username)] {
        if let Some(v) = v {
            claims.insert(k.into(), json!(v));
        }
    }
    if let Some(t) = encrypted_bearer_token {
        claims.insert("encrypted_bearer_token".into(), json!(t));
    }
    Value::Object(claims)
}

/// A compact ES256 JWT: `header.payload` signed by `sign` over SHA-256 of the signing input
/// (raw r ‖ s, base64url).
pub fn es256_jwt(
    kid: &str,
    claims: &Value,
    sign: impl FnOnce(&[u8; 32]) -> Result<[u8; 64], EnclaveError>,
) -> Result<String, EnclaveError> {
    use base64::Engine;
    use sha2::Digest;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = json!({ "alg": "ES256", "typ": "JWT", "kid": kid });
    let input = format!("{}.{}", b64.encode(header.to_string()), b64.encode(claims.to_string()));
    let digest: [u8; 32] = sha2::Sha256::digest(input.as_bytes()).into();
    let signature = sign(&digest)?;
    Ok(format!("{input}.{}", b64.encode(signature)))
}

/// The issuer key's JWKS `kid`: `coffer-oidc-` + 16 hex digits of SHA-256 of its point.
pub fn oidc_key_id(public_key: &[u8; 65]) -> String {
    use sha2::Digest;
    format!("coffer-oidc-{}", hex::encode(&sha2::Sha256::digest(public_key)[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::hazmat::PrehashSigner;

    #[test]
    fn provider_urls_are_https_or_loopback_http() {
        assert!(provider_url("https://api.x.com/2/oauth2/token").is_ok());
        assert!(provider_url("http://127.0.0.1:9/token").is_ok());
        assert!(provider_url("http://localhost/token").is_ok());
        assert!(provider_url("http://[::1]:8/token").is_ok());
        assert!(provider_url("http://example.com/token").is_err());
        assert!(provider_url("ftp://127.0.0.1/").is_err());
        assert!(provider_url("not a url").is_err());
        for url in [
            LoginSettings::default().x_token_url,
            LoginSettings::default().x_userinfo_url,
            LoginSettings::default().discord_token_url,
            LoginSettings::default().discord_userinfo_url,
        ] {
            assert!(url.starts_with("https://") && provider_url(&url).is_ok(), "{url}");
        }
    }

    #[test]
    fn provider_answers_name_the_error_and_never_the_secret() {
        let a = provider_answer(br#"{"error":"invalid_client","error_description":"bad s3cret-xyz"}"#, "s3cret-xyz");
        assert_eq!(a, "invalid_client: bad [redacted]");
        assert_eq!(provider_answer(b"plain\ntext", "k"), "plaintext");
        assert!(provider_answer(&[b'a'; 5000], "zz").len() <= 200);
    }

    #[test]
    fn es256_tokens_verify_with_the_public_key() {
        let sk = p256::ecdsa::SigningKey::from_slice(&[3u8; 32]).unwrap();
        let point: [u8; 65] = sk.verifying_key().to_encoded_point(false).as_bytes().try_into().unwrap();
        let user = ProviderUser {
            subject: "42".into(),
            email: None,
            name: Some("N".into()),
            preferred_username: Some("n".into()),
            bearer_token: Zeroizing::new("b".into()),
        };
        let claims = oidc_claims("http://127.0.0.1:1", "client", "abc", &user, 1000, None);
        assert_eq!(claims["exp"], 1900);
        assert!(claims.get("email").is_none() && claims.get("encrypted_bearer_token").is_none());
        let kid = oidc_key_id(&point);
        let jwt = es256_jwt(&kid, &claims, |d| {
            let s: p256::ecdsa::Signature = sk.sign_prehash(d).unwrap();
            Ok(s.to_bytes().into())
        })
        .unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header: Value = serde_json::from_slice(&b64.decode(parts[0]).unwrap()).unwrap();
        assert_eq!(header, json!({"alg": "ES256", "typ": "JWT", "kid": kid}));
        let sig = p256::ecdsa::Signature::from_slice(&b64.decode(parts[2]).unwrap()).unwrap();
        use p256::ecdsa::signature::Verifier;
        sk.verifying_key().verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig).unwrap();
    }
}
