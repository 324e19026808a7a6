//! The evaluation context of one activity (spec 12.4): `activity`, `approvers`, `credentials`,
//! the wallet / private key / account it touches, `eth.eip_712`, `eth.eip_7702_authorization`
//! and `time.now`, built from the activity's intent parameters and the organization facts the
//! caller gathered ([`OrganizationFacts`]).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::eval::Val;

/// Unix time in nanoseconds.
pub type Nanos = i64;

/// Collected approvals older than this no longer count (spec 6: a 24 h window).
pub const VOTE_WINDOW_NANOS: Nanos = 24 * 3_600 * 1_000_000_000;

pub const VOTE_APPROVED: &str = "VOTE_SELECTION_APPROVED";
pub const VOTE_REJECTED: &str = "VOTE_SELECTION_REJECTED";

/// `ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2` → `SIGN_RAW_PAYLOAD`.
pub fn kind(activity_type: &str) -> String {
    let t = activity_type.strip_prefix("ACTIVITY_TYPE_").unwrap_or(activity_type);
    match t.rsplit_once("_V") {
        Some((base, v)) if !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()) => base.to_string(),
        _ => t.to_string(),
    }
}

/// The intent fields a policy may read as `activity.params` (spec 12.4), snake_case.
pub fn params(kind: &str, p: &Value) -> Value {
    let fields: &[(&str, &str)] = match kind {
        "SIGN_RAW_PAYLOAD" | "SIGN_RAW_PAYLOADS" => &[("hashFunction", "hash_function"), ("encoding", "encoding")],
        "SIGN_TRANSACTION" => &[("type", "type")],
        "DELETE_USERS" => &[("userIds", "user_ids")],
        "CREATE_API_KEYS" => &[("userId", "user_id")],
        "DELETE_API_KEYS" => &[("userId", "user_id"), ("apiKeyIds", "api_key_ids")],
        "UPDATE_WALLET" => &[("walletId", "wallet_id")],
        "INIT_OTP_AUTH" => &[("otpLength", "otp_length")],
        "UPDATE_WEBHOOK_ENDPOINT" | "DELETE_WEBHOOK_ENDPOINT" => &[("endpointId", "endpoint_id")],
        k if k.starts_with("EXPORT_") => &[("targetPublicKey", "target_public_key")],
        k if k.ends_with("_LOGIN") => &[("sessionProfileId", "session_profile_id")],
        _ => &[],
    };
    let mut out = Map::new();
    for (camel, snake) in fields {
        if let Some(v) = p.get(*camel) {
            out.insert(snake.to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// The votes that still count: `selection`, within the 24 h window.
pub fn live_votes<'a>(votes: &'a Value, selection: &str, now: Nanos) -> Vec<&'a Value> {
    votes
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|v| v["selection"] == selection)
                .filter(|v| {
                    let secs = v["createdAt"]["seconds"].as_str().and_then(|s| s.parse::<i64>().ok()).unwrap_or(0);
                    now.saturating_sub(secs.saturating_mul(1_000_000_000)) <= VOTE_WINDOW_NANOS
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Distinct user ids of the votes, in vote order.
pub fn voter_ids(votes: &[&Value]) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for v in votes {
        if let Some(id) = v["userId"].as_str() {
            if !ids.iter().any(|i| i == id) {
                ids.push(id.to_string());
            }
        }
    }
    ids
}

/// What the evaluator needs to know about one activity.
pub struct ActivityFacts<'a> {
    pub activity_type: &'a str,
    pub resource: &'a str,
    pub action: &'a str,
    /// The intent parameters (camelCase, nulls stripped).
    pub params: &'a Value,
    /// Approving votes still in their window.
    pub approvals: Vec<&'a Value>,
    pub now: Nanos,
}

/// A wallet as policies see it (`wallet`, `wallets`).
#[derive(Debug, Clone, PartialEq)]
pub struct WalletFacts {
    pub id: String,
    pub label: String,
    pub imported: bool,
    pub exported: bool,
}

/// A private key as policies see it (`private_key`).
#[derive(Debug, Clone, PartialEq)]
pub struct PrivateKeyFacts {
    pub id: String,
    pub label: String,
    pub tags: Vec<String>,
    pub imported: bool,
    pub exported: bool,
}

/// An approving user as policies see it (`approvers`).
#[derive(Debug, Clone, PartialEq)]
pub struct ApproverFacts {
    pub id: String,
    pub tags: Vec<String>,
    pub email: String,
    pub alias: String,
}

/// What the caller read about the organization for one activity: the approvers (in vote order)
/// and the wallet, account or private key the intent names. Missing facts stay `None`: a policy
/// naming them gets an evaluation error (spec 12.4).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OrganizationFacts {
    pub approvers: Vec<ApproverFacts>,
    /// The address of the wallet account the activity touches.
    pub wallet_account: Option<String>,
    pub wallet: Option<WalletFacts>,
    /// Every wallet the activity names (`walletIds`); `None` when it names none.
    pub wallets: Option<Vec<WalletFacts>>,
    pub private_key: Option<PrivateKeyFacts>,
    /// The transaction a `sign_transaction` signs, when it parsed.
    pub transaction: Option<TransactionFacts>,
    /// The EIP-712 or EIP-7702 payload a `sign_raw_payload` signs, when it parsed.
    pub payload: Option<PayloadFacts>,
}

/// An Ethereum payload being signed as policies see it: `eth.<name>` with `name` `eip_712` or
/// `eip_7702_authorization` (spec 12.4), typed (addresses lowercase, numbers numbers). Built by
/// `coffer-chain` from the parser the signer encodes it with, never from the raw JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct PayloadFacts {
    pub name: &'static str,
    pub facts: Val,
}

/// A transaction being signed as policies see it: `<root>.tx` with `root` one of `eth`,
/// `solana`, `tron` (spec 12.4). Built by `coffer-chain` and the caller's contract interfaces.
#[derive(Debug, Clone, PartialEq)]
pub struct TransactionFacts {
    pub root: &'static str,
    pub tx: BTreeMap<String, Val>,
}

fn wallet_json(w: &WalletFacts) -> Value {
    json!({ "id": w.id, "imported": w.imported, "exported": w.exported, "label": w.label })
}

fn private_key_json(k: &PrivateKeyFacts) -> Value {
    json!({ "id": k.id, "tags": k.tags, "imported": k.imported, "exported": k.exported, "label": k.label })
}

/// The credential a vote was stamped with, as `credentials` lists it.
fn vote_credential(v: &Value) -> Option<Value> {
    let user_id = v["userId"].as_str().unwrap_or_default();
    if let Some(k) = v["user"]["apiKeys"].as_array().and_then(|a| a.first()) {
        return Some(json!({
            "id": k["apiKeyId"], "user_id": user_id, "type": k["credential"]["type"],
            "public_key": k["credential"]["publicKey"], "credential_id": "",
        }));
    }
    v["user"]["authenticators"].as_array().and_then(|a| a.first()).map(|a| {
        json!({
            "id": a["authenticatorId"], "user_id": user_id, "type": a["credential"]["type"],
            "public_key": a["credential"]["publicKey"], "credential_id": a["credentialId"],
        })
    })
}

/// Builds the roots of a policy evaluation (everything but what is missing: a missing root or
/// field is an evaluation error, spec 12.4).
pub fn build(f: &ActivityFacts<'_>, org: &OrganizationFacts) -> BTreeMap<String, Val> {
    let p = f.params;
    let kind = kind(f.activity_type);
    let mut ctx = Map::new();
    ctx.insert(
        "activity".into(),
        json!({ "type": f.activity_type, "kind": kind, "resource": f.resource, "action": f.action, "params": params(&kind, p) }),
    );

    // approvers and their credentials
    let approvers = org
        .approvers
        .iter()
        .map(|a| json!({ "id": a.id, "tags": a.tags, "email": a.email, "alias": a.alias }))
        .collect();
    ctx.insert("approvers".into(), Value::Array(approvers));
    ctx.insert("credentials".into(), Value::Array(f.approvals.iter().filter_map(|v| vote_credential(v)).collect()));

    // the wallet, account or private key the activity touches
    if let Some(address) = &org.wallet_account {
        ctx.insert("wallet_account".into(), json!({ "address": address }));
    }
    if let Some(w) = &org.wallet {
        ctx.insert("wallet".into(), wallet_json(w));
    }
    if let Some(k) = &org.private_key {
        ctx.insert("private_key".into(), private_key_json(k));
    }
    match (&org.wallets, &org.wallet) {
        (Some(ws), _) => {
            ctx.insert("wallets".into(), Value::Array(ws.iter().map(wallet_json).collect()));
        }
        (None, Some(w)) => {
            ctx.insert("wallets".into(), json!([wallet_json(w)]));
        }
        (None, None) => {}
    }

    let mut roots = match Val::from_json(&Value::Object(ctx)) {
        Val::Map(m) => m,
        _ => BTreeMap::new(),
    };
    if let Some(p) = &org.payload {
        let root = roots.entry("eth".to_string()).or_insert_with(|| Val::Map(BTreeMap::new()));
        if let Val::Map(m) = root {
            m.insert(p.name.into(), p.facts.clone());
        }
    }
    if let Some(t) = &org.transaction {
        let root = roots.entry(t.root.to_string()).or_insert_with(|| Val::Map(BTreeMap::new()));
        if let Val::Map(m) = root {
            m.insert("tx".into(), Val::Map(t.tx.clone()));
        }
    }
    let mut time = BTreeMap::new();
    time.insert("now".to_string(), Val::Time(i128::from(f.now)));
    roots.insert("time".into(), Val::Map(time));
    roots
}

/// Managing one's own credentials is implicitly allowed (spec 12.2): API keys, passkeys and
/// OAuth providers of the submitter, the submitter's own user, and recovering it (`recover_user`
/// with the recovery credential email sent); and a read-only session of one's own.
pub fn own_credentials(activity_type: &str, params: &Value, submitter: &str) -> bool {
    let k = kind(activity_type);
    matches!(
        k.as_str(),
        "CREATE_API_KEYS"
            | "DELETE_API_KEYS"
            | "CREATE_AUTHENTICATORS"
            | "DELETE_AUTHENTICATORS"
            | "CREATE_OAUTH_PROVIDERS"
            | "DELETE_OAUTH_PROVIDERS"
            | "UPDATE_USER"
            | "UPDATE_USER_NAME"
            | "UPDATE_USER_EMAIL"
            | "UPDATE_USER_PHONE_NUMBER"
            | "RECOVER_USER"
    ) && params.get("userId").and_then(Value::as_str) == Some(submitter)
        // A read-only session reads as its submitter, which the submitter's credential can do.
        || k == "CREATE_READ_ONLY_SESSION"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_params() {
        assert_eq!(kind("ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2"), "SIGN_RAW_PAYLOAD");
        assert_eq!(kind("ACTIVITY_TYPE_SIGN_RAW_PAYLOADS"), "SIGN_RAW_PAYLOADS");
        assert_eq!(kind("ACTIVITY_TYPE_CREATE_USERS_V4"), "CREATE_USERS");
        assert_eq!(kind("ACTIVITY_TYPE_EXPORT_WALLET"), "EXPORT_WALLET");
        assert_eq!(kind("ACTIVITY_TYPE_SIGN_TRANSACTION_V2"), "SIGN_TRANSACTION");
        assert_eq!(kind("ACTIVITY_TYPE_SIGN_TRANSACTION"), "SIGN_TRANSACTION");
        let p = json!({"signWith": "0x1", "hashFunction": "HASH_FUNCTION_NO_OP", "encoding": "E", "payload": "x"});
        assert_eq!(params("SIGN_RAW_PAYLOAD", &p), json!({"hash_function": "HASH_FUNCTION_NO_OP", "encoding": "E"}));
        assert_eq!(params("EXPORT_WALLET", &json!({"targetPublicKey": "04"})), json!({"target_public_key": "04"}));
        assert_eq!(params("CREATE_WALLET", &json!({"walletName": "x"})), json!({}));
        assert!(own_credentials("ACTIVITY_TYPE_CREATE_API_KEYS_V2", &json!({"userId": "u"}), "u"));
        assert!(!own_credentials("ACTIVITY_TYPE_CREATE_API_KEYS_V2", &json!({"userId": "v"}), "u"));
        assert!(!own_credentials("ACTIVITY_TYPE_CREATE_WALLET", &json!({"userId": "u"}), "u"));
    }

    #[test]
    fn payload_facts_are_under_eth() {
        let f = ActivityFacts {
            activity_type: "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
            resource: "PRIVATE_KEY",
            action: "SIGN",
            params: &json!({"payload": "{}", "encoding": "PAYLOAD_ENCODING_EIP712"}),
            approvals: vec![],
            now: 0,
        };
        // The raw JSON is never a fact: only what the caller's parser built.
        assert!(!build(&f, &OrganizationFacts::default()).contains_key("eth"));
        let facts = Val::Map(BTreeMap::from([("chain_id".to_string(), Val::Int(0))]));
        let org = OrganizationFacts {
            payload: Some(PayloadFacts { name: "eip_7702_authorization", facts: facts.clone() }),
            ..Default::default()
        };
        let Some(Val::Map(eth)) = build(&f, &org).remove("eth") else { panic!("eth is a map") };
        assert_eq!(eth["eip_7702_authorization"], facts);
    }

    #[test]
    fn vote_window() {
        let now = 100 * 3_600 * 1_000_000_000i64;
        let votes = json!([
            {"userId": "a", "selection": VOTE_APPROVED, "createdAt": {"seconds": (now / 1_000_000_000).to_string()}},
            {"userId": "b", "selection": VOTE_APPROVED, "createdAt": {"seconds": ((now - VOTE_WINDOW_NANOS) / 1_000_000_000 - 1).to_string()}},
            {"userId": "c", "selection": VOTE_REJECTED, "createdAt": {"seconds": (now / 1_000_000_000).to_string()}},
            {"userId": "a", "selection": VOTE_APPROVED, "createdAt": {"seconds": (now / 1_000_000_000).to_string()}},
        ]);
        let live = live_votes(&votes, VOTE_APPROVED, now);
        assert_eq!(voter_ids(&live), vec!["a".to_string()]);
        assert_eq!(voter_ids(&live_votes(&votes, VOTE_REJECTED, now)), vec!["c".to_string()]);
    }
}
