//! A local OIDC issuer for tests: openid-configuration and a JWKS on 127.0.0.1, ES256 tokens.

use base64::Engine;
use p256::ecdsa::signature::Signer;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// The public JWK (kid "k1", ES256) of `key`.
pub fn jwk(key: &p256::ecdsa::SigningKey) -> Value {
    let p = key.verifying_key().to_encoded_point(false);
    json!({"kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig",
        "x": b64url(p.x().unwrap()), "y": b64url(p.y().unwrap())})
}

/// An ES256 JWT over `claims`, signed by `key` (kid "k1").
pub fn es256_token(key: &p256::ecdsa::SigningKey, claims: &Value) -> String {
    let h = b64url(json!({"alg": "ES256", "kid": "k1", "typ": "JWT"}).to_string().as_bytes());
    let input = format!("{h}.{}", b64url(claims.to_string().as_bytes()));
    let sig: p256::ecdsa::Signature = key.sign(input.as_bytes());
    format!("{input}.{}", b64url(&sig.to_bytes()))
}

/// Serves `/.well-known/openid-configuration` and `/jwks` (holding `jwk`) on 127.0.0.1 until the
/// test's runtime ends; returns the issuer URL.
pub async fn issuer(jwk: Value) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let iss = issuer.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            let (iss, jwk) = (iss.clone(), jwk.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut n = 0;
                while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(m) => n += m,
                    }
                }
                let req = String::from_utf8_lossy(&buf[..n]);
                let (status, body) = match req.split_whitespace().nth(1).unwrap_or("") {
                    "/.well-known/openid-configuration" => {
                        ("200 OK", json!({"issuer": iss, "jwks_uri": format!("{iss}/jwks")}).to_string())
                    }
                    "/jwks" => ("200 OK", json!({"keys": [jwk]}).to_string()),
                    _ => ("404 Not Found", "{}".to_string()),
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    issuer
}
