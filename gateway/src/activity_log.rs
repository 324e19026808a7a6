//! `coffer-gateway export-log` and `verify-log`: an organization's activity log exported through
//! the public API with an API key, and checked offline against the published proof key.

use std::path::Path;

use anyhow::Context;
use coffer_auth::proof::{self, AppProof, ExportedLog, LogFault, LogVerified};
use serde_json::{json, Value};
use zeroize::Zeroizing;

/// Links asked for per page (the gateway's most).
const PAGE: u64 = 1_000;

/// An API key's P-256 private key, read from a file (hex on its first line, as `keygen` prints
/// `apiPrivateKey`), never from argv. Zeroized on drop; printed as its public key only.
pub struct ApiKeyFile(p256::ecdsa::SigningKey);

impl std::fmt::Debug for ApiKeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeyFile({})", coffer_auth::operator::public_key_hex(&self.0))
    }
}

impl ApiKeyFile {
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text =
            Zeroizing::new(std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?);
        let line = text.lines().next().unwrap_or_default().trim();
        let bytes =
            Zeroizing::new(hex::decode(line).map_err(|_| anyhow::anyhow!("{} holds no hex key", path.display()))?);
        let key = p256::ecdsa::SigningKey::from_slice(&bytes)
            .map_err(|_| anyhow::anyhow!("{} holds no P-256 private key", path.display()))?;
        Ok(Self(key))
    }

    /// The `X-Stamp` header's value for `body`, stamped with this key.
    pub fn stamp(&self, body: &[u8]) -> String {
        coffer_auth::operator::stamp(&self.0, body)
    }
}

/// How long one query to the gateway may take, answer included.
const QUERY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A client for the gateway's queries: every request bounded by [`QUERY_TIMEOUT`].
pub fn client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder().timeout(QUERY_TIMEOUT).build().context("building the HTTP client")
}

/// `POST /public/v1/query/<path>` of the gateway at `base_url` with `body`, stamped with `key`:
/// the answer's status and JSON.
pub async fn query_answer(
    client: &reqwest::Client,
    base_url: &str,
    path: &str,
    body: &Value,
    key: &ApiKeyFile,
) -> anyhow::Result<(reqwest::StatusCode, Value)> {
    let url = format!("{}/public/v1/query/{path}", base_url.trim_end_matches('/'));
    let body = body.to_string();
    let response = client
        .post(&url)
        .header("X-Stamp", coffer_auth::operator::stamp(&key.0, body.as_bytes()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = response.status();
    let answer: Value = serde_json::from_slice(&response.bytes().await.with_context(|| format!("reading {path}"))?)
        .with_context(|| format!("the answer of {path} is not JSON"))?;
    Ok((status, answer))
}

/// [`query_answer`], an error naming the gateway's answer when it is not a success.
pub async fn query(
    client: &reqwest::Client,
    base_url: &str,
    path: &str,
    body: &Value,
    key: &ApiKeyFile,
) -> anyhow::Result<Value> {
    let (status, answer) = query_answer(client, base_url, path, body, key).await?;
    if !status.is_success() {
        anyhow::bail!("the gateway answered {path} with {status}: {answer}");
    }
    Ok(answer)
}

/// Reads the whole log of `organization_id` from the gateway at `base_url`: the head the enclave
/// signs first (for a nonce chosen here, so that the gateway cannot answer with an older head),
/// then every link up to it, with the activities as the API serves them (and the finished
/// activities no link names).
pub async fn export(base_url: &str, organization_id: &str, key: &ApiKeyFile) -> anyhow::Result<ExportedLog> {
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let client = client()?;
    let (mut head, mut head_seq, mut after) = (None, 0u64, 0u64);
    let (mut links, mut activities) = (Vec::new(), Vec::new());
    loop {
        let body = json!({ "organizationId": organization_id, "afterSeq": after.to_string(), "limit": PAGE.to_string(),
                "nonce": nonce });
        let mut page = query(&client, base_url, "coffer_list_activity_log", &body, key).await?;
        if head.is_none() {
            let h: AppProof = serde_json::from_value(page["head"].take()).context("the page has no signed head")?;
            head = Some(h);
            head_seq = page["headSeq"].as_str().and_then(|s| s.parse().ok()).context("the page has no headSeq")?;
            if let Value::Array(unlogged) = page["unlogged"].take() {
                activities.extend(unlogged);
            }
        }
        let Value::Array(entries) = page["links"].take() else { anyhow::bail!("the page has no links") };
        let count = entries.len();
        for mut e in entries {
            let seq: u64 = e["seq"].as_str().and_then(|s| s.parse().ok()).context("a link has no seq")?;
            if seq > head_seq {
                break;
            }
            links.push(serde_json::from_value::<AppProof>(e["link"].take()).context("a link is not a proof")?);
            if !e["activity"].is_null() {
                activities.push(e["activity"].take());
            }
            after = seq;
        }
        if (count as u64) < PAGE || after >= head_seq {
            break;
        }
    }
    let head = head.context("no head")?;
    Ok(ExportedLog { organization_id: organization_id.to_string(), nonce: Some(nonce), head, links, activities })
}

/// The proof key's point from `hex`: 65 bytes, or the 130 of an app proof's `publicKey`.
pub fn proof_key(hex_key: &str) -> anyhow::Result<[u8; 65]> {
    let bytes = hex::decode(hex_key.trim()).context("the proof key is not hex")?;
    let point = match bytes.len() {
        65 => &bytes[..],
        130 => &bytes[65..],
        n => anyhow::bail!("the proof key is {n} bytes: expected 65 (or 130, as app proofs name it)"),
    };
    point.try_into().context("the proof key")
}

/// Checks the exported log at `path` against `key`.
pub fn verify_file(path: &Path, key: &[u8; 65]) -> anyhow::Result<Result<LogVerified, LogFault>> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let log: ExportedLog = serde_json::from_slice(&text).context("the file is not an exported activity log")?;
    Ok(proof::verify_log(&log, key))
}
