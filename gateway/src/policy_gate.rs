//! The gateway's side of the policy engine: it reads from the store the facts `coffer-policy`
//! evaluates (policies, approvers, the wallet or key an activity touches) and applies the
//! root-quorum rules around the engine's decision.

use coffer_policy::context::{
    self, ActivityFacts, ApproverFacts, OrganizationFacts, PrivateKeyFacts, WalletFacts, VOTE_APPROVED,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use coffer_policy::decision::{self, CompiledPolicy, Decision, Evaluation, PolicySource};
use serde_json::Value;

use crate::error::ApiError;
use crate::store::{found, Nanos, Organization, PrivateKey, SignWithKey, Store, StoreError, Wallet, WalletAccount};

const NOT_AUTHORIZED: &str = "request not authorized";
const ROOT_ONLY: &str = "request not authorized: only root quorum users may submit this activity";

/// What the root-quorum rule decides for a root-quorum-only activity with only its submitter's
/// vote: it runs when the threshold is 1 and waits above 1 ([`evaluate`] is the general rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootQuorum {
    Run,
    ConsensusNeeded,
}

/// Only root users may submit root-quorum-only activities (others: 403).
pub fn root_quorum(org: &Organization, user_id: &str) -> Result<RootQuorum, ApiError> {
    if !org.root_user_ids.iter().any(|u| u == user_id) {
        return Err(ApiError::forbidden(ROOT_ONLY));
    }
    Ok(if org.root_quorum_threshold > 1 { RootQuorum::ConsensusNeeded } else { RootQuorum::Run })
}

/// What an activity type is to the policy engine: the type, its policy resource and action
/// (spec 12.4), and whether only the root quorum decides it.
#[derive(Debug, Clone, Copy)]
pub struct Subject {
    pub activity_type: &'static str,
    pub resource: &'static str,
    pub action: &'static str,
    pub root_quorum: bool,
}

/// What the policy engine needs to know about an activity and its votes.
pub struct Proposal<'a> {
    pub subject: Subject,
    /// Intent parameters (nulls stripped).
    pub params: &'a Value,
    /// Every vote so far, the new one included.
    pub votes: &'a Value,
    /// The user who submitted it.
    pub submitter: &'a str,
    pub now: Nanos,
}

/// Decides an activity (spec 12.2): root-quorum-only activities need the root quorum and
/// nothing else; others go through the organization's policies. A root user's activity that
/// the root quorum could still approve waits for it rather than being denied.
pub fn evaluate(store: &dyn Store, org: &Organization, p: &Proposal<'_>) -> Result<Evaluation, StoreError> {
    let approvals = context::live_votes(p.votes, VOTE_APPROVED, p.now);
    let voters = context::voter_ids(&approvals);
    let roots = voters.iter().filter(|v| org.root_user_ids.contains(v)).count() as i64;
    let met = roots >= org.root_quorum_threshold.max(1);
    if met {
        return Ok(Evaluation::root(Decision::Allow, "ROOT_QUORUM"));
    }
    if p.subject.root_quorum {
        return Ok(if roots > 0 {
            Evaluation::root(Decision::ConsensusNeeded, "ROOT_QUORUM_PENDING")
        } else {
            Evaluation::root(Decision::Deny, "ROOT_QUORUM_ONLY")
        });
    }
    let set = policy_set(store, &org.id)?;
    let policies = set.applicable(p.subject.activity_type, p.subject.resource, p.subject.action);
    let facts = ActivityFacts {
        activity_type: p.subject.activity_type,
        resource: p.subject.resource,
        action: p.subject.action,
        params: p.params,
        approvals,
        now: p.now,
    };
    let org_facts = organization_facts(store, &org.id, p.params, &voters)?;
    let ctx = context::build(&facts, &org_facts);
    let implicit = context::own_credentials(p.subject.activity_type, p.params, p.submitter);
    let mut e = decision::decide(&policies, &ctx, false, implicit);
    if e.decision == Decision::Deny && roots > 0 {
        // The root quorum bypasses every policy: more root votes can still run it.
        e.decision = Decision::ConsensusNeeded;
        e.reason = "ROOT_QUORUM_PENDING";
    }
    Ok(e)
}

/// The 403 of a denied activity.
pub fn denied(e: &Evaluation) -> ApiError {
    if e.reason == "ROOT_QUORUM_ONLY" {
        ApiError::forbidden(ROOT_ONLY)
    } else {
        ApiError::forbidden(NOT_AUTHORIZED)
    }
}

/// An organization's policies, compiled, with an index by the activity type their condition
/// requires (`coffer_policy::scope`).
pub struct PolicySet {
    /// `records_version` of the policies this set was built from.
    version: (i64, i64),
    policies: Vec<Arc<CompiledPolicy>>,
    /// Activity type → positions of the policies that require it.
    by_type: HashMap<String, Vec<usize>>,
    /// Positions of the policies that require no particular type.
    any_type: Vec<usize>,
}

impl PolicySet {
    fn new(version: (i64, i64), policies: Vec<Arc<CompiledPolicy>>) -> Self {
        let (mut by_type, mut any_type) = (HashMap::<String, Vec<usize>>::new(), Vec::new());
        for (i, p) in policies.iter().enumerate() {
            match &p.scope.types {
                Some(types) => types.iter().for_each(|t| by_type.entry(t.clone()).or_default().push(i)),
                None => any_type.push(i),
            }
        }
        Self { version, policies, by_type, any_type }
    }

    /// The policies that can apply to an activity, in the organization's order: the ones left out
    /// could only come out "condition false" (or an error), which no decision counts, so the
    /// decision is the same and the cost follows the policies that can apply.
    pub fn applicable(&self, activity_type: &str, resource: &str, action: &str) -> Vec<&CompiledPolicy> {
        let typed = self.by_type.get(activity_type).map(Vec::as_slice).unwrap_or_default();
        let mut positions: Vec<usize> = typed.iter().chain(&self.any_type).copied().collect();
        positions.sort_unstable();
        positions.dedup();
        positions
            .into_iter()
            .map(|i| self.policies[i].as_ref())
            .filter(|p| p.scope.admits(activity_type, resource, action))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.policies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }
}

/// Organization → its policy set; (organization, policy id) → the policy compiled from its
/// current source.
#[derive(Default)]
struct PolicyCache {
    sets: HashMap<String, Arc<PolicySet>>,
    compiled: HashMap<(String, String), Arc<CompiledPolicy>>,
}

/// Most compiled policies kept; past it the cache starts over (a cold cache costs parsing only).
const COMPILED_POLICY_CACHE: usize = 100_000;

/// The organization's policy set. Each submission asks the store only for the set's version (an
/// index walk); the policies are read and indexed again only when one was added, changed or
/// removed, and each is parsed once per stored version.
pub fn policy_set(store: &dyn Store, org: &str) -> Result<Arc<PolicySet>, StoreError> {
    static CACHE: OnceLock<Mutex<PolicyCache>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(PolicyCache::default()));
    let poisoned = || StoreError::Backend("policy cache lock poisoned".into());
    let version = store.records_version(org, "policy")?;
    if let Some(set) = cache.lock().map_err(|_| poisoned())?.sets.get(org) {
        if set.version == version {
            return Ok(set.clone());
        }
    }
    // Read outside the lock; a concurrent change only means a rebuild on the next call.
    let records = store.records(org, "policy")?;
    let version = (records.len() as i64, records.iter().map(|r| r.updated_at).max().unwrap_or(0));
    let mut cache = cache.lock().map_err(|_| poisoned())?;
    if cache.compiled.len() + records.len() > COMPILED_POLICY_CACHE {
        cache.compiled.clear();
        cache.sets.clear();
    }
    let policies = records
        .iter()
        .map(|r| {
            let source = PolicySource::from_json(&r.id, &r.name, &r.data);
            let key = (org.to_string(), r.id.clone());
            match cache.compiled.get(&key) {
                Some(c) if c.source == source => c.clone(),
                _ => {
                    let compiled = Arc::new(CompiledPolicy::compile(source));
                    cache.compiled.insert(key, compiled.clone());
                    compiled
                }
            }
        })
        .collect();
    let set = Arc::new(PolicySet::new(version, policies));
    cache.sets.insert(org.to_string(), set.clone());
    Ok(set)
}

fn wallet_facts(w: &Wallet) -> WalletFacts {
    WalletFacts { id: w.id.clone(), label: w.name.clone(), imported: w.imported, exported: w.exported }
}

fn private_key_facts(k: &PrivateKey) -> PrivateKeyFacts {
    PrivateKeyFacts {
        id: k.id.clone(),
        label: k.name.clone(),
        tags: k.tags.clone(),
        imported: k.imported,
        exported: k.exported,
    }
}

/// Reads what the policies of one activity may name: its approvers, and the wallet, account or
/// private key its parameters touch (`signWith` resolved by [`crate::store::sign_with_key`]).
pub fn organization_facts(
    store: &dyn Store,
    org: &str,
    params: &Value,
    voters: &[String],
) -> Result<OrganizationFacts, StoreError> {
    let mut facts = OrganizationFacts::default();
    for id in voters {
        let Some(u) = found(store.user(org, id))? else { continue };
        facts.approvers.push(ApproverFacts {
            tags: store.user_tags_of(org, id)?,
            email: u.email.unwrap_or_default(),
            alias: u.name,
            id: u.id,
        });
    }
    let text = |k: &str| params.get(k).and_then(Value::as_str);
    let put_account = |facts: &mut OrganizationFacts, a: WalletAccount| -> Result<(), StoreError> {
        facts.wallet = found(store.wallet(org, &a.wallet_id))?.as_ref().map(wallet_facts).or(facts.wallet.take());
        facts.wallet_account = Some(a.address);
        Ok(())
    };
    // The signer's Ethereum address, for `eth.tx.from`.
    let mut signer = None;
    if let Some(sw) = text("signWith") {
        match crate::store::sign_with_key(store, org, sw)? {
            Some(SignWithKey::Account(a)) => {
                signer = (a.address_format == "ADDRESS_FORMAT_ETHEREUM").then(|| a.address.clone());
                put_account(&mut facts, a)?
            }
            Some(SignWithKey::PrivateKey { key, .. }) => {
                signer =
                    key.addresses.iter().find(|e| e.format == "ADDRESS_FORMAT_ETHEREUM").map(|e| e.address.clone());
                facts.private_key = Some(private_key_facts(&key))
            }
            None => {}
        }
    }
    if let Some(address) = text("address") {
        if let Some(a) = found(store.account_by_address(org, address))? {
            put_account(&mut facts, a)?;
        }
    }
    if let Some(id) = text("walletId") {
        if let Some(w) = found(store.wallet(org, id))? {
            facts.wallet = Some(wallet_facts(&w));
        }
    }
    if let Some(id) = text("privateKeyId") {
        if let Some(k) = found(store.private_key(org, id))? {
            facts.private_key = Some(private_key_facts(&k));
        }
    }
    facts.transaction = crate::tx_facts::transaction_facts(store, org, params, signer.as_deref())?;
    if let Some(ids) = params.get("walletIds").and_then(Value::as_array) {
        let mut ws = Vec::new();
        for id in ids.iter().filter_map(Value::as_str) {
            if let Some(w) = found(store.wallet(org, id))? {
                ws.push(wallet_facts(&w));
            }
        }
        facts.wallets = Some(ws);
    }
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::{Record, SqliteStore, Write};

    #[test]
    fn policies_are_compiled_once_per_version() {
        let dir = std::env::temp_dir().join(format!("coffer-policy-cache-{}", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&dir.join("coffer.db")).unwrap();
        let org = Organization {
            id: "org".into(),
            name: "org".into(),
            parent_id: None,
            root_quorum_threshold: 1,
            root_user_ids: vec![],
            created_at: 0,
            updated_at: 0,
        };
        let policy = |condition: &str, at: i64| {
            Write::PutRecord(Record {
                organization_id: "org".into(),
                kind: "policy".into(),
                id: "p1".into(),
                name: "p".into(),
                data: json!({"effect": "EFFECT_ALLOW", "condition": condition, "consensus": "", "time": ""}),
                created_at: 1,
                updated_at: at,
            })
        };
        store.apply(&[Write::InsertOrganization(org), policy("true", 1)]).unwrap();
        let first = policy_set(&store, "org").unwrap();
        let again = policy_set(&store, "org").unwrap();
        assert_eq!(first.len(), 1);
        assert!(Arc::ptr_eq(&first, &again), "an unchanged policy set is not read or parsed again");
        store.apply(&[policy("false", 2)]).unwrap();
        let changed = policy_set(&store, "org").unwrap();
        assert!(!Arc::ptr_eq(&first.policies[0], &changed.policies[0]));
        assert_eq!(changed.policies[0].source.condition, "false");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_index_leaves_out_only_policies_that_cannot_apply() {
        let compile = |id: &str, effect: &str, condition: &str| {
            Arc::new(CompiledPolicy::compile(PolicySource {
                id: id.into(),
                name: id.into(),
                effect: effect.into(),
                condition: condition.into(),
                consensus: String::new(),
                time: String::new(),
            }))
        };
        let sign = "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2";
        let set = PolicySet::new(
            (4, 1),
            vec![
                compile("deny-sign", "EFFECT_DENY", &format!("activity.type == '{sign}'")),
                compile("allow-wallets", "EFFECT_ALLOW", "activity.resource == 'WALLET'"),
                compile("allow-all", "EFFECT_ALLOW", "true"),
                compile("broken", "EFFECT_ALLOW", "activity.type == "),
            ],
        );
        let ids = |ps: Vec<&CompiledPolicy>| ps.iter().map(|p| p.source.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(set.applicable(sign, "PRIVATE_KEY", "SIGN")), ["deny-sign", "allow-all", "broken"]);
        assert_eq!(
            ids(set.applicable("ACTIVITY_TYPE_CREATE_WALLET", "WALLET", "CREATE")),
            ["allow-wallets", "allow-all", "broken"]
        );
        assert_eq!(ids(set.applicable("ACTIVITY_TYPE_CREATE_USERS", "USER", "CREATE")), ["allow-all", "broken"]);
    }
}
