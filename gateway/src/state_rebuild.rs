//! `coffer-gateway rebuild`: repairs the gateway's records of an organization from the state the
//! enclave signs (compared with the gateway's store itself), in one transaction of that store,
//! and lists what it leaves for an operator: key material and what only the gateway keeps.
//!
//! The enclave's state is the truth for every item it holds; a repair never adds power (the
//! enclave decides every activity over its own state, whatever these records say), it makes the
//! gateway show what the enclave enforces. Wallets, accounts and private keys are never rewritten
//! or deleted here: their sealed material lives only in the gateway's store.

use serde::Serialize;
use serde_json::{json, Value};

use crate::record_kinds::{
    OAUTH2_CREDENTIAL, POLICY, PRIVATE_KEY_TAG, SMART_CONTRACT_INTERFACE, USER_TAG, WEBHOOK_ENDPOINT,
};
use coffer_auth::state_proof::SignedState;

use crate::state_diff::{Difference, GatewayAnswers, StateDiff};
use crate::store::{Nanos, Record, Store, Write};

/// One repair, as the report lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Repair {
    pub kind: String,
    pub id: String,
    /// `inserted`, `updated` or `deleted` (the gateway's record).
    pub action: &'static str,
}

/// A difference left as it is, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Left {
    pub kind: String,
    pub id: String,
    pub reason: &'static str,
}

/// What a rebuild plans: the writes, in the order they must apply, what they repair, and what
/// is left.
#[derive(Debug, Default)]
pub struct Plan {
    pub writes: Vec<Write>,
    pub repaired: Vec<Repair>,
    pub left: Vec<Left>,
}

const KEY_MATERIAL: &str =
    "key material and its metadata are the gateway's sealed records: compare with the signed state and restore the gateway's store from a backup";
const ONLY_IN_ENCLAVE: &str =
    "the enclave has it and the gateway does not: the gateway's record (its certificate or details) cannot be made from the signed state";
const NOT_REPAIRED: &str = "this difference is not repaired by rebuild: correct it through the API";

/// One rebuild of an organization: the comparison it planned from, the plan, and, when it was
/// applied, the comparison after it.
pub struct Rebuilt {
    pub before: StateDiff,
    pub plan: Plan,
    pub after: Option<anyhow::Result<StateDiff>>,
}

/// Compares `organization_id`'s signed state (`sign` asks for it, verified, for a fresh nonce)
/// with `store` itself, plans the repairs and, with `apply`, applies them in one transaction
/// unless the state moved meanwhile (signed again just before), then compares again. What
/// `coffer-gateway rebuild` and the gateway's catch-up both do.
pub async fn rebuild<F, Fut>(
    store: &dyn Store,
    organization_id: &str,
    sign: F,
    apply: bool,
    quiet: &(dyn Fn() -> bool + Sync),
) -> anyhow::Result<Rebuilt>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<SignedState>>,
{
    let compare = |signed: &SignedState| -> anyhow::Result<StateDiff> {
        Ok(crate::state_diff::compare(signed, &GatewayAnswers::from_store(store, organization_id)?))
    };
    let signed = sign().await?;
    let before = compare(&signed)?;
    let plan = plan(store, &before, crate::store::now_nanos())?;
    if !apply || plan.writes.is_empty() {
        return Ok(Rebuilt { before, plan, after: None });
    }
    let again = sign().await?;
    if (again.version, again.log.seq) != (signed.version, signed.log.seq) {
        anyhow::bail!(
            "the organization changed while it was read (the enclave's state went from version {} to {}, its log \
             from {} to {}): nothing repaired; run it again with the organization quiet",
            signed.version,
            again.version,
            signed.log.seq,
            again.log.seq
        );
    }
    // Nothing of the organization between its enclave call and its commit here (which would
    // commit over the repair, or under it).
    if !quiet() {
        anyhow::bail!("an activity of the organization is running: nothing repaired; run it again");
    }
    store.apply(&plan.writes)?;
    let after = Some(compare(&again));
    Ok(Rebuilt { before, plan, after })
}

/// The writes that make the gateway's records of `diff`'s organization state what the enclave
/// signed, reading the records they keep details of (a policy's notes and times) from `store`.
/// Refused when the gateway's store has a link of the organization's activity log past the one
/// the state was signed at: the enclave's state is older than the gateway's records (its store
/// restored from a backup, or activities since the state was read), and repairing from it would
/// delete what came after.
pub fn plan(store: &dyn Store, diff: &StateDiff, now: Nanos) -> anyhow::Result<Plan> {
    let org = diff.organization_id.as_str();
    if !diff.shown_twice.is_empty() || !diff.unknown_kinds.is_empty() {
        anyhow::bail!(
            "the comparison is not one to act on (items shown twice: {:?}; kinds not known: {:?}): nothing repaired",
            diff.shown_twice,
            diff.unknown_kinds
        );
    }
    // The gateway's link at the signed position, if it has one, is the enclave's: else the two
    // logs forked (the enclave tier restored from a backup, then written to).
    if let Some(at) = diff.log_seq.checked_sub(1).map(|before| store.activity_log(org, before, 1)).transpose()? {
        if let Some(link) = at.first().filter(|l| l.seq == diff.log_seq) {
            let head = serde_json::from_str::<coffer_auth::proof::AppProof>(&link.link)
                .ok()
                .and_then(|p| serde_json::from_str::<Value>(&p.proof_payload).ok())
                .and_then(|payload| coffer_auth::proof::LogLink::from_payload(&payload).ok())
                .map(|l| l.head);
            if head.as_deref() != Some(diff.log_head.as_str()) {
                anyhow::bail!(
                    "the gateway's link {} of the organization's activity log is not the one the enclave's state was \
                     signed at: the two logs forked (the enclave tier restored from a backup?): nothing repaired",
                    diff.log_seq
                );
            }
        }
    }
    if let Some(newer) = store.activity_log(org, diff.log_seq, 1)?.first() {
        anyhow::bail!(
            "the enclave's state was signed at link {} of the organization's activity log and the gateway's store has \
             link {}: the enclave's state is older than the gateway's records (restored from a backup, or activities \
             ran since): nothing repaired; run it again with the organization quiet, or restore both tiers together",
            diff.log_seq,
            newer.seq
        );
    }
    let mut plan = Plan::default();
    // Each step's writes, in this order: the root quorum first (a user leaving it can then be
    // deleted), then every deletion (a name an inserted record takes may be a deleted one's),
    // then tags before the users that carry them.
    let (mut quorum, mut tags, mut records, mut users) = (vec![], vec![], vec![], vec![]);
    let (mut credentials, mut gone_users, mut gone_tags, mut gone_records) = (vec![], vec![], vec![], vec![]);
    for d in &diff.differences {
        let Difference { kind, id, enclave, gateway } = d;
        let mut repaired = |action: &'static str| {
            plan.repaired.push(Repair { kind: kind.clone(), id: id.clone(), action });
        };
        match (kind.as_str(), enclave, gateway) {
            ("organization", Some(e), Some(g)) => {
                if e["rootQuorum"] != g["rootQuorum"] {
                    let user_ids = strings(&e["rootQuorum"]["userIds"]);
                    let threshold = e["rootQuorum"]["threshold"].as_i64().unwrap_or_default();
                    quorum.push(Write::SetRootQuorum {
                        organization_id: org.into(),
                        threshold,
                        user_ids,
                        updated_at: now,
                    });
                    repaired("updated");
                }
                if e["features"] != g["features"] || e["authProxyEnabled"] != g["authProxyEnabled"] {
                    plan.left.push(Left { kind: kind.clone(), id: id.clone(), reason: NOT_REPAIRED });
                }
            }
            ("policy", Some(e), gateway) => {
                let kept = match gateway {
                    Some(_) => Some(store.record(org, POLICY, id)?),
                    None => None,
                };
                records.push(Write::PutRecord(policy_record(org, id, e, kept, now)));
                repaired(if gateway.is_some() { "updated" } else { "inserted" });
            }
            ("policy", None, Some(_)) => {
                gone_records.push(Write::DeleteRecords {
                    organization_id: org.into(),
                    kind: POLICY.into(),
                    ids: vec![id.clone()],
                });
                repaired("deleted");
            }
            ("user_tag" | "private_key_tag", Some(e), None) => {
                let name = e["name"].as_str().unwrap_or_default().to_string();
                let record = Record {
                    organization_id: org.into(),
                    kind: tag_kind(kind).into(),
                    id: id.clone(),
                    name,
                    data: json!({}),
                    created_at: now,
                    updated_at: now,
                };
                tags.push(Write::PutRecord(record));
                repaired("inserted");
            }
            ("user_tag" | "private_key_tag", Some(e), Some(_)) => {
                let new_name = e["name"].as_str().map(str::to_string);
                tags.push(Write::UpdateTag {
                    organization_id: org.into(),
                    kind: tag_kind(kind).into(),
                    id: id.clone(),
                    new_name,
                    add: vec![],
                    remove: vec![],
                    updated_at: now,
                });
                repaired("updated");
            }
            ("user_tag" | "private_key_tag", None, Some(_)) => {
                gone_tags.push(Write::DeleteTags {
                    organization_id: org.into(),
                    kind: tag_kind(kind).into(),
                    ids: vec![id.clone()],
                });
                repaired("deleted");
            }
            ("user", Some(e), Some(g)) => {
                // Only what differs: a contact set again as it was would unverify it.
                let text = |m: &str| (e[m] != g[m]).then(|| e[m].as_str().unwrap_or_default().to_string());
                users.push(Write::UpdateUser {
                    organization_id: org.into(),
                    id: id.clone(),
                    name: text("name"),
                    email: text("email"),
                    phone_number: text("phoneNumber"),
                    tag_ids: (e["tags"] != g["tags"]).then(|| strings(&e["tags"])),
                    updated_at: now,
                });
                repaired("updated");
            }
            ("user", None, Some(_)) => {
                gone_users.push(Write::DeleteUsers { organization_id: org.into(), ids: vec![id.clone()] });
                repaired("deleted");
            }
            ("credential", None, Some(g)) => {
                let user_id = g["userId"].as_str().unwrap_or_default().to_string();
                let (organization_id, ids) = (org.to_string(), vec![id.clone()]);
                credentials.push(match g["class"].as_str() {
                    Some("authenticator") => Write::DeleteAuthenticators { organization_id, user_id, ids },
                    Some("oauthProvider") => Write::DeleteOauthProviders { organization_id, user_id, ids },
                    _ => Write::DeleteApiKeys { organization_id, user_id, ids },
                });
                repaired("deleted");
            }
            ("contract_interface" | "webhook_endpoint" | "oauth2_credential", None, Some(_)) => {
                let kind = match kind.as_str() {
                    "contract_interface" => SMART_CONTRACT_INTERFACE,
                    "webhook_endpoint" => WEBHOOK_ENDPOINT,
                    _ => OAUTH2_CREDENTIAL,
                };
                gone_records.push(Write::DeleteRecords {
                    organization_id: org.into(),
                    kind: kind.into(),
                    ids: vec![id.clone()],
                });
                repaired("deleted");
            }
            ("wallet" | "account" | "private_key", _, _) => {
                plan.left.push(Left { kind: kind.clone(), id: id.clone(), reason: KEY_MATERIAL })
            }
            (_, Some(_), None) => plan.left.push(Left { kind: kind.clone(), id: id.clone(), reason: ONLY_IN_ENCLAVE }),
            _ => plan.left.push(Left { kind: kind.clone(), id: id.clone(), reason: NOT_REPAIRED }),
        }
    }
    for step in [quorum, gone_records, credentials, gone_users, gone_tags, tags, records, users] {
        plan.writes.extend(step);
    }
    Ok(plan)
}

/// The gateway's record of a policy as the enclave states it (`e`: name, effect, condition,
/// consensus, time), keeping the notes and creation time of the record it replaces.
fn policy_record(org: &str, id: &str, e: &Value, kept: Option<Record>, now: Nanos) -> Record {
    // Absent expressions as the API's handlers store them (null), present ones as text.
    let expression = |m: &str| match e[m].as_str().unwrap_or_default() {
        "" => Value::Null,
        text => json!(text),
    };
    let notes = kept.as_ref().map(|r| r.data["notes"].clone()).filter(Value::is_string).unwrap_or_else(|| json!(""));
    let mut data = json!({ "effect": e["effect"], "notes": notes, "condition": expression("condition"),
        "consensus": expression("consensus") });
    if let Some(time) = e["time"].as_str().filter(|t| !t.is_empty()) {
        data["time"] = json!(time);
    }
    Record {
        organization_id: org.into(),
        kind: POLICY.into(),
        id: id.into(),
        name: e["name"].as_str().unwrap_or_default().into(),
        data,
        created_at: kept.map_or(now, |r| r.created_at),
        updated_at: now,
    }
}

fn tag_kind(kind: &str) -> &'static str {
    if kind == "user_tag" {
        USER_TAG
    } else {
        PRIVATE_KEY_TAG
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diff(differences: Vec<Difference>) -> StateDiff {
        StateDiff {
            organization_id: "o".into(),
            enclave_version: 1,
            signed_at_ms: 0,
            log_seq: 0,
            log_head: String::new(),
            compared: 0,
            differences,
            shown_twice: vec![],
            unknown_kinds: vec![],
        }
    }

    /// An empty store in a directory of its own (removed by the caller).
    fn store() -> (std::path::PathBuf, crate::store::SqliteStore) {
        let dir = std::env::temp_dir().join(format!("coffer-rebuild-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = crate::store::SqliteStore::open(&dir.join("coffer.db")).unwrap();
        (dir, store)
    }

    fn d(kind: &str, id: &str, enclave: Option<Value>, gateway: Option<Value>) -> Difference {
        Difference { kind: kind.into(), id: id.into(), enclave, gateway }
    }

    #[test]
    fn key_material_is_never_rewritten_and_what_only_the_enclave_has_is_left() {
        let (dir, store) = store();
        let differences = vec![
            d("wallet", "w", None, Some(json!({}))),
            d("account", "a", Some(json!({"address": "0x1"})), Some(json!({"address": "0x2"}))),
            d("private_key", "k", Some(json!({})), None),
            d("credential", "c", Some(json!({"class": "apiKey"})), None),
            d("user", "u", Some(json!({"name": "n"})), None),
        ];
        let plan = plan(&store, &diff(differences), 1).unwrap();
        let _ = std::fs::remove_dir_all(dir);
        assert!(plan.writes.is_empty() && plan.repaired.is_empty(), "{:?}", plan.writes);
        let reasons: Vec<(&str, &str)> = plan.left.iter().map(|l| (l.id.as_str(), l.reason)).collect();
        assert_eq!(
            reasons,
            [
                ("w", KEY_MATERIAL),
                ("a", KEY_MATERIAL),
                ("k", KEY_MATERIAL),
                ("c", ONLY_IN_ENCLAVE),
                ("u", ONLY_IN_ENCLAVE)
            ]
        );
    }

    #[test]
    fn a_state_older_than_the_gateways_log_repairs_nothing() {
        let (dir, store) = store();
        let link = |seq: u64| {
            let link = coffer_auth::proof::LogLink {
                organization_id: "o".into(),
                seq: seq.to_string(),
                activity_id: format!("a{seq}"),
                fingerprint: format!("f{seq}"),
                activity_type: "ACTIVITY_TYPE_CREATE_POLICY_V3".into(),
                status: "ACTIVITY_STATUS_COMPLETED".into(),
                activity_digest: "d".into(),
                previous: format!("h{}", seq - 1),
                head: format!("h{seq}"),
            };
            let proof = json!({ "scheme": "s", "publicKey": "k", "proofPayload": link.payload(0), "signature": "" });
            Write::InsertLogLink {
                organization_id: "o".into(),
                seq,
                activity_id: format!("a{seq}"),
                link: proof.to_string(),
            }
        };
        crate::store::Store::apply(&store, &[link(1), link(2)]).unwrap();
        let mut older = diff(vec![d("policy", "p", None, Some(json!({})))]);
        (older.log_seq, older.log_head) = (1, "h1".into());
        let e = plan(&store, &older, 1).unwrap_err().to_string();
        assert!(e.contains("signed at link 1") && e.contains("has link 2"), "{e}");
        (older.log_seq, older.log_head) = (2, "h2".into());
        assert_eq!(plan(&store, &older, 1).unwrap().repaired.len(), 1, "as new as the gateway's log: repaired");
        // The same position on another chain: forked.
        older.log_head = "another".into();
        let e = plan(&store, &older, 1).unwrap_err().to_string();
        assert!(e.contains("forked"), "{e}");
        // Ahead of the gateway's log (links the gateway never recorded): repaired.
        (older.log_seq, older.log_head) = (5, "h5".into());
        assert_eq!(plan(&store, &older, 1).unwrap().repaired.len(), 1);
        // Not a comparison to act on.
        older.shown_twice = vec!["policy p".into()];
        assert!(plan(&store, &older, 1).unwrap_err().to_string().contains("shown twice"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_quorum_goes_first_then_deletions_then_inserts() {
        let (dir, store) = store();
        let quorum = |ids: &[&str]| json!({ "rootQuorum": { "threshold": 1, "userIds": ids }, "features": {} });
        let differences = vec![
            d("user_tag", "gone-tag", None, Some(json!({"name": "x"}))),
            d("user", "gone-user", None, Some(json!({}))),
            d("user_tag", "new-tag", Some(json!({"name": "t"})), None),
            d("policy", "p", Some(json!({"name": "p", "effect": "EFFECT_ALLOW", "condition": "true"})), None),
            d("organization", "o", Some(quorum(&["r"])), Some(quorum(&["r", "gone-user"]))),
        ];
        let plan = plan(&store, &diff(differences), 7).unwrap();
        let _ = std::fs::remove_dir_all(dir);
        let order: Vec<&str> = plan
            .writes
            .iter()
            .map(|w| match w {
                Write::SetRootQuorum { .. } => "quorum",
                Write::PutRecord(r) if r.kind == USER_TAG => "tag",
                Write::PutRecord(r) if r.kind == POLICY => "policy",
                Write::DeleteUsers { .. } => "delete user",
                Write::DeleteTags { .. } => "delete tag",
                _ => "other",
            })
            .collect();
        assert_eq!(order, ["quorum", "delete user", "delete tag", "tag", "policy"]);
        let Write::PutRecord(policy) = &plan.writes[4] else { unreachable!() };
        assert_eq!(
            (policy.name.as_str(), &policy.data),
            ("p", &json!({"effect": "EFFECT_ALLOW", "notes": "", "condition": "true", "consensus": null}))
        );
        assert!(plan.left.is_empty());
    }
}
