//! `coffer-gateway diff-state`: the organization's state as the enclave signs it, compared item
//! by item with what the gateway's queries answer, so a gateway database edited under a running
//! gateway (which shows other policies, keys, users or addresses than the enclave enforces) is
//! caught.
//!
//! What it cannot catch: a taken-over gateway *process* sees this tool's requests and can answer
//! them consistently with the signed state while showing others something else. Against that,
//! the signed state itself (`--state-out`) is the view to trust.

use std::collections::BTreeMap;

use anyhow::Context;
use coffer_auth::proof::AppProof;
use coffer_auth::state_proof::{self, SignedState};
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::activity_log::{client, query, query_answer, ApiKeyFile};

/// Items asked for per page of a list (the gateway's most).
const PAGE: usize = 1_000;
/// Accounts asked for per page (`list_wallet_accounts` pages by at most 100).
const ACCOUNT_PAGE: usize = 100;
/// Most pages read of one list: past it the gateway is answering without end.
const MAX_PAGES: usize = 10_000;
/// How far apart an API key's expiry may be as the enclave and the gateway state it: each
/// computes it from its own clock when the key is made.
const EXPIRY_TOLERANCE_MS: i64 = 60_000;
/// Kinds of the enclave's state the gateway's queries do not show (so none is compared).
const NOT_SHOWN: [&str; 1] = ["retired_key_id"];

/// An item as one side states it: kind (the enclave's names: `user`, `credential`, `policy`,
/// ...) and id, then the members both sides can state, normalized.
type View = BTreeMap<(String, String), Value>;

/// One item the two sides state differently (`None`: that side has no such item).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Difference {
    pub kind: String,
    pub id: String,
    pub enclave: Option<Value>,
    pub gateway: Option<Value>,
}

/// The comparison: the enclave's signed state (its version and when it was signed), how many
/// items were compared, every difference, the items the gateway showed more than once, and the
/// kinds of the enclave's state this tool does not know (each a reason to distrust the result).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StateDiff {
    pub organization_id: String,
    pub enclave_version: u64,
    pub signed_at_ms: i64,
    /// The organization's activity log when the state was signed (links, head): what an export
    /// of the log up to then ends at.
    pub log_seq: u64,
    pub log_head: String,
    pub compared: usize,
    pub differences: Vec<Difference>,
    pub shown_twice: Vec<String>,
    pub unknown_kinds: Vec<String>,
}

impl StateDiff {
    /// The two sides agree on everything compared, and everything was compared.
    pub fn agrees(&self) -> bool {
        self.differences.is_empty() && self.shown_twice.is_empty() && self.unknown_kinds.is_empty()
    }
}

/// Asks the gateway at `base_url` for the organization's state as the enclave signs it (for a
/// nonce chosen here), checks it against the proof key `proof_key`, then reads the same items
/// through the gateway's own queries and compares them. Also answers the verified state.
pub async fn diff(
    base_url: &str,
    organization_id: &str,
    key: &ApiKeyFile,
    proof_key: &[u8; 65],
) -> anyhow::Result<(StateDiff, SignedState)> {
    let signed = signed_state(base_url, organization_id, key, proof_key).await?;
    let answers = GatewayAnswers::read(&client()?, base_url, organization_id, key).await?;
    Ok((compare(&signed, &answers), signed))
}

/// The organization's state as the enclave signs it for a nonce chosen here, asked of the
/// gateway at `base_url` and checked against the proof key `proof_key`.
pub async fn signed_state(
    base_url: &str,
    organization_id: &str,
    key: &ApiKeyFile,
    proof_key: &[u8; 65],
) -> anyhow::Result<SignedState> {
    let client = client()?;
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let body = json!({ "organizationId": organization_id, "nonce": nonce });
    let mut answer = query(&client, base_url, "coffer_get_organization_state", &body, key).await?;
    let proof: AppProof = serde_json::from_value(answer["state"].take()).context("the answer has no signed state")?;
    let state = answer["stateJson"].as_str().context("the answer has no stateJson")?;
    state_proof::verify(&proof, state.as_bytes(), proof_key, organization_id, &nonce)
        .map_err(|e| anyhow::anyhow!("the organization's state does not verify: {e}"))
}

/// What the gateway's queries answered, each list whole.
#[derive(Debug, Default)]
pub struct GatewayAnswers {
    pub configs: Value,
    /// `coffer_get_auth_proxy_config`'s `authProxyConfig` (null: never enabled).
    pub auth_proxy: Value,
    pub users: Vec<Value>,
    pub policies: Vec<Value>,
    pub user_tags: Vec<Value>,
    pub private_key_tags: Vec<Value>,
    pub wallets: Vec<Value>,
    pub accounts: Vec<Value>,
    pub private_keys: Vec<Value>,
    pub contract_interfaces: Vec<Value>,
    pub webhook_endpoints: Vec<Value>,
    pub oauth2_credentials: Vec<Value>,
}

impl GatewayAnswers {
    async fn read(client: &reqwest::Client, base: &str, org: &str, key: &ApiKeyFile) -> anyhow::Result<Self> {
        let reader = Reader { client, base, org, key };
        let just_org = json!({ "organizationId": org });
        let configs = query(client, base, "get_organization_configs", &just_org, key).await?;
        let oauth2 = query(client, base, "list_oauth2_credentials", &just_org, key).await?;
        let auth_proxy = match query_answer(client, base, "coffer_get_auth_proxy_config", &just_org, key).await? {
            (status, answer) if status.is_success() => answer["authProxyConfig"].clone(),
            (reqwest::StatusCode::NOT_FOUND, _) => Value::Null,
            (status, answer) => {
                anyhow::bail!("the gateway answered coffer_get_auth_proxy_config with {status}: {answer}")
            }
        };
        Ok(Self {
            configs: configs["configs"].clone(),
            auth_proxy,
            users: reader.list_all("list_users", "users", "userId", PAGE).await?,
            policies: reader.list_all("list_policies", "policies", "policyId", PAGE).await?,
            user_tags: reader.list_all("list_user_tags", "userTags", "tagId", PAGE).await?,
            private_key_tags: reader.list_all("list_private_key_tags", "privateKeyTags", "tagId", PAGE).await?,
            wallets: reader.list_all("list_wallets", "wallets", "walletId", PAGE).await?,
            accounts: reader.list_all("list_wallet_accounts", "accounts", "walletAccountId", ACCOUNT_PAGE).await?,
            private_keys: reader.list_all("list_private_keys", "privateKeys", "privateKeyId", PAGE).await?,
            contract_interfaces: reader
                .list_all("list_smart_contract_interfaces", "smartContractInterfaces", "smartContractInterfaceId", PAGE)
                .await?,
            webhook_endpoints: reader
                .list_all("list_webhook_endpoints", "webhookEndpoints", "endpointId", PAGE)
                .await?,
            oauth2_credentials: oauth2["oauth2Credentials"].as_array().cloned().unwrap_or_default(),
        })
    }
}

impl GatewayAnswers {
    /// The same answers read from the gateway's store itself, rendered as its queries render
    /// them: what `rebuild` compares with, so that what it repairs is what the store it writes
    /// holds (not what a gateway process answers).
    pub fn from_store(s: &dyn crate::store::Store, org: &str) -> Result<Self, crate::store::StoreError> {
        use crate::ops;
        use crate::record_kinds::{
            AUTH_PROXY, OAUTH2_CREDENTIAL, POLICY, PRIVATE_KEY_TAG, SMART_CONTRACT_INTERFACE, USER_TAG,
            WEBHOOK_ENDPOINT,
        };
        use crate::store::Page;
        let organization = s.organization(org)?;
        let records = |kind: &str, render: fn(&crate::store::Record) -> Value| {
            s.records_page(org, kind, &Page::ALL).map(|all| all.iter().map(render).collect::<Vec<_>>())
        };
        Ok(Self {
            configs: ops::organization::configs_json(s, &organization)?,
            auth_proxy: s.records(org, AUTH_PROXY)?.first().map(ops::proxy_config::config_json).unwrap_or(Value::Null),
            users: ops::users::users_json(s, org, &s.users_page(org, &Page::ALL)?)?,
            policies: records(POLICY, ops::policies::policy_json)?,
            user_tags: records(USER_TAG, ops::tags::tag_json)?,
            private_key_tags: records(PRIVATE_KEY_TAG, ops::tags::tag_json)?,
            wallets: s.wallets_page(org, &Page::ALL)?.iter().map(ops::wallets::wallet_json).collect(),
            accounts: s
                .accounts_page(org, None, &Page::ALL)?
                .iter()
                .map(|a| ops::wallets::account_json(a, None))
                .collect(),
            private_keys: s.private_keys_page(org, &Page::ALL)?.iter().map(ops::keys::private_key_json).collect(),
            contract_interfaces: records(SMART_CONTRACT_INTERFACE, ops::contracts::interface_json)?,
            webhook_endpoints: records(WEBHOOK_ENDPOINT, crate::webhook_endpoint::endpoint_json)?,
            oauth2_credentials: s.records(org, OAUTH2_CREDENTIAL)?.iter().map(ops::oauth2::credential_json).collect(),
        })
    }
}

/// Where the gateway's lists are read from, and as whom.
struct Reader<'a> {
    client: &'a reqwest::Client,
    base: &'a str,
    org: &'a str,
    key: &'a ApiKeyFile,
}

impl Reader<'_> {
    /// Every item of a paged list, page after page (`after` the last id) until a short page; at
    /// most [`MAX_PAGES`], and each page must move on (a last id it had not ended a page with).
    async fn list_all(&self, path: &str, member: &str, id: &str, page: usize) -> anyhow::Result<Vec<Value>> {
        let mut all: Vec<Value> = Vec::new();
        let mut cursors = std::collections::HashSet::new();
        for _ in 0..MAX_PAGES {
            let mut options = json!({ "limit": page.to_string() });
            if let Some(last) = all.last().and_then(|v| v[id].as_str()) {
                if !cursors.insert(last.to_string()) {
                    anyhow::bail!("{path} pages back to where it was: it answers without end");
                }
                options["after"] = json!(last);
            }
            let body = json!({ "organizationId": self.org, "paginationOptions": options });
            let mut answer = query(self.client, self.base, path, &body, self.key).await?;
            let Value::Array(items) = answer[member].take() else { anyhow::bail!("{path} answered no {member} list") };
            let count = items.len();
            all.extend(items);
            if count < page {
                return Ok(all);
            }
        }
        anyhow::bail!("{path} answered more than {MAX_PAGES} full pages")
    }
}

/// Compares the enclave's signed state with the gateway's answers.
pub fn compare(signed: &SignedState, answers: &GatewayAnswers) -> StateDiff {
    let (enclave, unknown_kinds) = enclave_view(signed);
    let (gateway, shown_twice) = gateway_view(&signed.organization_id, answers);
    let mut differences = Vec::new();
    let keys: std::collections::BTreeSet<&(String, String)> = enclave.keys().chain(gateway.keys()).collect();
    for k in &keys {
        let (e, g) = (enclave.get(*k), gateway.get(*k));
        let agree = match (e, g) {
            (Some(e), Some(g)) => same(&k.0, e, g),
            _ => false,
        };
        if !agree {
            differences.push(Difference {
                kind: k.0.clone(),
                id: k.1.clone(),
                enclave: e.cloned(),
                gateway: g.cloned(),
            });
        }
    }
    StateDiff {
        organization_id: signed.organization_id.clone(),
        enclave_version: signed.version,
        signed_at_ms: signed.timestamp_ms,
        log_seq: signed.log.seq,
        log_head: signed.log.head.clone(),
        compared: keys.len(),
        differences,
        shown_twice,
        unknown_kinds,
    }
}

/// Whether the two sides state an item of `kind` alike: exactly, but for a credential's expiry,
/// which each side computed from its own clock.
fn same(kind: &str, enclave: &Value, gateway: &Value) -> bool {
    if kind != "credential" {
        return enclave == gateway;
    }
    let expiry = |v: &Value| v["expiresAtMs"].as_i64().unwrap_or_default();
    let rest = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("expiresAtMs");
        }
        v
    };
    let (e, g) = (expiry(enclave), expiry(gateway));
    let expiries_agree = (e == 0 && g == 0) || (e != 0 && g != 0 && (e - g).abs() <= EXPIRY_TOLERANCE_MS);
    expiries_agree && rest(enclave) == rest(gateway)
}

fn text(v: &Value, member: &str) -> Value {
    Value::String(v.get(member).and_then(Value::as_str).unwrap_or_default().to_string())
}

fn flag(v: &Value, member: &str) -> Value {
    Value::Bool(v.get(member).and_then(Value::as_bool).unwrap_or(false))
}

/// The strings of an array, sorted (order carries no meaning in these sets).
fn sorted(v: &Value) -> Value {
    let mut items: Vec<String> =
        v.as_array().into_iter().flatten().filter_map(Value::as_str).map(String::from).collect();
    items.sort();
    json!(items)
}

/// Addresses `[{format, address}]`, sorted.
fn addresses(v: &Value) -> Value {
    let mut items: Vec<(String, String)> = v
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| (a["format"].as_str().unwrap_or_default().into(), a["address"].as_str().unwrap_or_default().into()))
        .collect();
    items.sort();
    Value::Array(items.into_iter().map(|(format, address)| json!({ "format": format, "address": address })).collect())
}

/// A credential's kind as both sides can state it: an API key (a session key is one), a passkey
/// or an OAuth identity; another kind is stated as itself (and so never matches).
fn credential_class(kind: &str) -> String {
    match kind {
        "api_key" | "session" => "apiKey".into(),
        "passkey" => "authenticator".into(),
        "oauth_identity" => "oauthProvider".into(),
        other => format!("unknown:{other}"),
    }
}

/// The kinds [`enclave_view`] compares.
const COMPARED: [&str; 12] = [
    "organization",
    "user",
    "credential",
    "policy",
    "user_tag",
    "private_key_tag",
    "wallet",
    "account",
    "private_key",
    "contract_interface",
    "webhook_endpoint",
    "oauth2_credential",
];

/// The enclave's items, as both sides can state them, and the kinds of its state this tool does
/// not know.
fn enclave_view(signed: &SignedState) -> (View, Vec<String>) {
    let mut view = View::new();
    let mut put = |kind: &str, id: &str, value: Value| {
        view.insert((kind.to_string(), id.to_string()), value);
    };
    // The organization's one entry (its id is the kind's name, not the organization's).
    for o in signed.kind("organization").values() {
        let features: Map<String, Value> = o["features"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, value)| (name.clone(), json!(value.as_str().unwrap_or_default())))
            .collect();
        let quorum = json!({ "threshold": o["root_quorum_threshold"].as_i64().unwrap_or_default(),
            "userIds": sorted(&o["root_user_ids"]) });
        let org = json!({ "rootQuorum": quorum, "features": features,
            "authProxyEnabled": flag(o, "auth_proxy_enabled") });
        put("organization", &signed.organization_id, org);
    }
    for (id, u) in signed.kind("user") {
        let user = json!({ "name": text(&u, "name"), "email": text(&u, "email"),
            "phoneNumber": text(&u, "phone_number"), "tags": sorted(&u["tag_ids"]) });
        put("user", &id, user);
    }
    for (id, c) in signed.kind("credential") {
        let credential = json!({ "userId": text(&c, "user_id"), "class": credential_class(c["kind"].as_str().unwrap_or_default()),
            "credentialType": text(&c, "credential_type"), "publicKey": text(&c, "public_key"),
            "expiresAtMs": c["expires_at_ms"].as_i64().unwrap_or_default() });
        put("credential", &id, credential);
    }
    for (id, p) in signed.kind("policy") {
        let policy = json!({ "name": text(&p, "name"), "effect": text(&p, "effect"), "condition": text(&p, "condition"),
            "consensus": text(&p, "consensus"), "time": text(&p, "time") });
        put("policy", &id, policy);
    }
    for kind in ["user_tag", "private_key_tag"] {
        for (id, t) in signed.kind(kind) {
            put(kind, &id, json!({ "name": text(&t, "name") }));
        }
    }
    for (id, w) in signed.kind("wallet") {
        let wallet =
            json!({ "name": text(&w, "label"), "imported": flag(&w, "imported"), "exported": flag(&w, "exported") });
        put("wallet", &id, wallet);
    }
    for (id, a) in signed.kind("account") {
        let account = json!({ "walletId": text(&a, "wallet_id"), "address": text(&a, "address"),
            "addressFormat": text(&a, "address_format") });
        put("account", &id, account);
    }
    for (id, k) in signed.kind("private_key") {
        let key = json!({ "name": text(&k, "label"), "tags": sorted(&k["tags"]), "imported": flag(&k, "imported"),
            "exported": flag(&k, "exported"), "addresses": addresses(&k["addresses"]) });
        put("private_key", &id, key);
    }
    for (id, i) in signed.kind("contract_interface") {
        let interface = json!({ "address": text(&i, "address"), "type": text(&i, "interface_type"),
            "body": text(&i, "body") });
        put("contract_interface", &id, interface);
    }
    for (id, e) in signed.kind("webhook_endpoint") {
        put("webhook_endpoint", &id, json!({ "url": text(&e, "value") }));
    }
    for (id, c) in signed.kind("oauth2_credential") {
        put("oauth2_credential", &id, json!({ "value": text(&c, "value") }));
    }
    let unknown = signed
        .entries
        .keys()
        .filter(|k| !COMPARED.contains(&k.as_str()) && !NOT_SHOWN.contains(&k.as_str()))
        .cloned()
        .collect();
    (view, unknown)
}

/// When an API key stops authenticating as the gateway renders it (`createdAt` plus
/// `expirationSeconds`), in ms since the epoch; 0: never.
fn gateway_expiry(key: &Value) -> i64 {
    let Some(seconds) = key["expirationSeconds"].as_str().and_then(|s| s.parse::<i64>().ok()) else { return 0 };
    let created = &key["createdAt"];
    let number = |m: &str| created[m].as_str().and_then(|s| s.parse::<i64>().ok()).unwrap_or_default();
    (number("seconds") * 1000 + number("nanos") / 1_000_000).saturating_add(seconds.saturating_mul(1000))
}

/// The gateway's answers, as both sides can state them, and the items it showed more than once.
fn gateway_view(organization_id: &str, a: &GatewayAnswers) -> (View, Vec<String>) {
    let mut view = View::new();
    let mut twice = Vec::new();
    let mut put = |kind: &str, id: &str, value: Value| {
        if view.insert((kind.to_string(), id.to_string()), value).is_some() {
            twice.push(format!("{kind} {id}"));
        }
    };
    let mut features: Map<String, Value> = Map::new();
    for f in a.configs["features"].as_array().into_iter().flatten() {
        let name = f["name"].as_str().unwrap_or_default().to_string();
        if features.insert(name.clone(), text(f, "value")).is_some() {
            put("feature", &name, Value::Null);
        }
    }
    let quorum = &a.configs["quorum"];
    let quorum = json!({ "threshold": quorum["threshold"].as_i64().unwrap_or_default(),
        "userIds": sorted(&quorum["userIds"]) });
    let org = json!({ "rootQuorum": quorum, "features": features, "authProxyEnabled": flag(&a.auth_proxy, "enabled") });
    put("organization", organization_id, org);
    for u in &a.users {
        let user_id = u["userId"].as_str().unwrap_or_default();
        let user = json!({ "name": text(u, "userName"), "email": text(u, "userEmail"),
            "phoneNumber": text(u, "userPhoneNumber"), "tags": sorted(&u["userTags"]) });
        put("user", user_id, user);
        let credential = |class: &str, credential_type: Value, public_key: Value, expires_at_ms: i64| {
            json!({ "userId": user_id, "class": class, "credentialType": credential_type, "publicKey": public_key,
                "expiresAtMs": expires_at_ms })
        };
        for k in u["apiKeys"].as_array().into_iter().flatten() {
            let id = k["apiKeyId"].as_str().unwrap_or_default();
            let c = &k["credential"];
            put("credential", id, credential("apiKey", text(c, "type"), text(c, "publicKey"), gateway_expiry(k)));
        }
        for k in u["authenticators"].as_array().into_iter().flatten() {
            let id = k["authenticatorId"].as_str().unwrap_or_default();
            let c = &k["credential"];
            put("credential", id, credential("authenticator", text(c, "type"), text(c, "publicKey"), 0));
        }
        for p in u["oauthProviders"].as_array().into_iter().flatten() {
            let id = p["providerId"].as_str().unwrap_or_default();
            let s = |m: &str| p[m].as_str().unwrap_or_default().to_string();
            let identity = coffer_auth::oidc::identity_hash(&s("issuer"), &s("subject"), &s("audience"));
            let oauth = json!(coffer_auth::grants::OAUTH_PROVIDER);
            put("credential", id, credential("oauthProvider", oauth, json!(identity), 0));
        }
    }
    for p in &a.policies {
        let policy = json!({ "name": text(p, "policyName"), "effect": text(p, "effect"),
            "condition": text(p, "condition"), "consensus": text(p, "consensus"), "time": text(p, "time") });
        put("policy", p["policyId"].as_str().unwrap_or_default(), policy);
    }
    for (kind, tags) in [("user_tag", &a.user_tags), ("private_key_tag", &a.private_key_tags)] {
        for t in tags {
            put(kind, t["tagId"].as_str().unwrap_or_default(), json!({ "name": text(t, "tagName") }));
        }
    }
    for w in &a.wallets {
        let wallet = json!({ "name": text(w, "walletName"), "imported": flag(w, "imported"),
            "exported": flag(w, "exported") });
        put("wallet", w["walletId"].as_str().unwrap_or_default(), wallet);
    }
    for x in &a.accounts {
        let account = json!({ "walletId": text(x, "walletId"), "address": text(x, "address"),
            "addressFormat": text(x, "addressFormat") });
        put("account", x["walletAccountId"].as_str().unwrap_or_default(), account);
    }
    for k in &a.private_keys {
        let key = json!({ "name": text(k, "privateKeyName"), "tags": sorted(&k["privateKeyTags"]),
            "imported": flag(k, "imported"), "exported": flag(k, "exported"), "addresses": addresses(&k["addresses"]) });
        put("private_key", k["privateKeyId"].as_str().unwrap_or_default(), key);
    }
    for i in &a.contract_interfaces {
        let interface = json!({ "address": text(i, "smartContractAddress"), "type": text(i, "type"),
            "body": text(i, "smartContractInterface") });
        put("contract_interface", i["smartContractInterfaceId"].as_str().unwrap_or_default(), interface);
    }
    for e in &a.webhook_endpoints {
        put("webhook_endpoint", e["endpointId"].as_str().unwrap_or_default(), json!({ "url": text(e, "url") }));
    }
    for c in &a.oauth2_credentials {
        let provider = c["provider"].as_str().unwrap_or_default();
        let client_id = c["clientId"].as_str().unwrap_or_default();
        let value = coffer_org_rules::transition::oauth2_credential_value(provider, client_id);
        put("oauth2_credential", c["oauth2CredentialId"].as_str().unwrap_or_default(), json!({ "value": value }));
    }
    // A feature shown twice was recorded as a `feature` item above: not an item of the view.
    view.retain(|(kind, _), _| kind != "feature");
    (view, twice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(entries: Value) -> SignedState {
        SignedState {
            organization_id: "org".into(),
            version: 3,
            timestamp_ms: 1,
            log: coffer_auth::state_proof::LogPosition { seq: 0, head: String::new() },
            entries: entries.as_object().cloned().unwrap(),
        }
    }

    fn agreeing() -> (SignedState, GatewayAnswers) {
        let state = signed(json!({
            "organization": { "organization": { "id": "org", "name": "o", "root_quorum_threshold": 1,
                "root_user_ids": ["u1"], "features": { "FEATURE_NAME_WEBHOOK": "https://x" } } },
            "user": { "u1": { "id": "u1", "name": "root", "email": "r@x.io", "tag_ids": ["t2", "t1"] } },
            "credential": {
                "k1": { "id": "k1", "user_id": "u1", "kind": "api_key",
                    "credential_type": "CREDENTIAL_TYPE_API_KEY_P256", "public_key": "02aa", "expires_at_ms": 0 },
                "s1": { "id": "s1", "user_id": "u1", "kind": "session",
                    "credential_type": "CREDENTIAL_TYPE_READ_WRITE_SESSION_KEY_P256", "public_key": "02cc",
                    "expires_at_ms": 1_000_900_030 } },
            "policy": { "p1": { "id": "p1", "name": "allow", "effect": "EFFECT_ALLOW", "condition": "true",
                "consensus": "", "time": "" } },
            "wallet": { "w1": { "id": "w1", "label": "main", "exported": true } },
            "account": { "a1": { "id": "a1", "wallet_id": "w1", "address": "0xabc",
                "address_format": "ADDRESS_FORMAT_ETHEREUM" } },
            "retired_key_id": { "w0": "wallet" },
        }));
        let answers = GatewayAnswers {
            configs: json!({ "features": [{ "name": "FEATURE_NAME_WEBHOOK", "value": "https://x" }],
                "quorum": { "threshold": 1, "userIds": ["u1"] } }),
            users: vec![json!({ "userId": "u1", "userName": "root", "userEmail": "r@x.io", "userTags": ["t1", "t2"],
                "apiKeys": [
                    { "apiKeyId": "k1", "credential": { "publicKey": "02aa", "type": "CREDENTIAL_TYPE_API_KEY_P256" } },
                    { "apiKeyId": "s1", "credential": { "publicKey": "02cc",
                        "type": "CREDENTIAL_TYPE_READ_WRITE_SESSION_KEY_P256" },
                        "createdAt": { "seconds": "1000000", "nanos": "0" }, "expirationSeconds": "900" },
                ],
                "authenticators": [], "oauthProviders": [] })],
            policies: vec![json!({ "policyId": "p1", "policyName": "allow", "effect": "EFFECT_ALLOW",
                "condition": "true", "consensus": "", "notes": "" })],
            wallets: vec![json!({ "walletId": "w1", "walletName": "main", "exported": true, "imported": false })],
            accounts: vec![json!({ "walletAccountId": "a1", "walletId": "w1", "address": "0xabc",
                "addressFormat": "ADDRESS_FORMAT_ETHEREUM" })],
            ..Default::default()
        };
        (state, answers)
    }

    #[test]
    fn agreeing_sides_have_no_difference() {
        let (state, answers) = agreeing();
        let diff = compare(&state, &answers);
        assert!(diff.agrees(), "{diff:?}");
        assert_eq!((diff.compared, diff.enclave_version), (7, 3));
    }

    #[test]
    fn every_kind_of_lie_is_a_difference() {
        let (state, answers) = agreeing();
        // A policy hidden, a policy the enclave never had, a credential's key swapped, an account's
        // address swapped, the quorum raised, a session shown as lasting a day longer.
        let mut lying = answers;
        lying.policies = vec![json!({ "policyId": "p9", "policyName": "deny", "effect": "EFFECT_DENY" })];
        lying.users[0]["apiKeys"][0]["credential"]["publicKey"] = json!("02bb");
        lying.users[0]["apiKeys"][1]["expirationSeconds"] = json!("87300");
        lying.accounts[0]["address"] = json!("0xdef");
        lying.configs["quorum"]["threshold"] = json!(2);
        let diff = compare(&state, &lying);
        let found: Vec<(&str, &str, bool, bool)> = diff
            .differences
            .iter()
            .map(|d| (d.kind.as_str(), d.id.as_str(), d.enclave.is_some(), d.gateway.is_some()))
            .collect();
        assert_eq!(
            found,
            vec![
                ("account", "a1", true, true),
                ("credential", "k1", true, true),
                ("credential", "s1", true, true),
                ("organization", "org", true, true),
                ("policy", "p1", true, false),
                ("policy", "p9", false, true),
            ]
        );
        assert_eq!(diff.differences[0].enclave.as_ref().unwrap()["address"], "0xabc");
        assert_eq!(diff.differences[0].gateway.as_ref().unwrap()["address"], "0xdef");
        assert!(!diff.agrees());
    }

    #[test]
    fn an_item_shown_twice_or_a_kind_not_known_is_no_agreement() {
        let (state, answers) = agreeing();
        // The true account last, a made-up one first: the comparison would see only the last.
        let mut twice = answers;
        let mut fake = twice.accounts[0].clone();
        fake["address"] = json!("0xdef");
        twice.accounts.insert(0, fake);
        let diff = compare(&state, &twice);
        assert_eq!((diff.differences.len(), diff.shown_twice.clone()), (0, vec!["account a1".to_string()]));
        assert!(!diff.agrees());

        let (mut state, answers) = agreeing();
        state.entries.insert("spending_limit".into(), json!({ "l1": {} }));
        let diff = compare(&state, &answers);
        assert_eq!(diff.unknown_kinds, vec!["spending_limit".to_string()]);
        assert!(!diff.agrees());
        // A credential of a kind this tool does not know never matches.
        assert_eq!(credential_class("hardware_token"), "unknown:hardware_token");
    }
}
