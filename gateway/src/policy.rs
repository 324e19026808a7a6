//! The gateway's side of the policy engine: it reads from the store the facts `coffer-policy`
//! evaluates (policies, approvers, the wallet or key an activity touches) and applies the
//! root-quorum rules around the engine's decision.

use coffer_policy::context::{
    self, ActivityFacts, ApproverFacts, OrganizationFacts, PrivateKeyFacts, WalletFacts, VOTE_APPROVED,
};
use coffer_policy::decision::{self, Decision, Evaluation, PolicySource};
use serde_json::Value;

use crate::activity::registry::Operation;
use crate::error::ApiError;
use crate::store::{Nanos, Organization, PrivateKey, SignWithKey, Store, StoreError, Wallet, WalletAccount};

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

/// What the policy engine needs to know about an activity and its votes.
pub struct Proposal<'a> {
    pub op: &'static Operation,
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
    if p.op.root_quorum {
        return Ok(if roots > 0 {
            Evaluation::root(Decision::ConsensusNeeded, "ROOT_QUORUM_PENDING")
        } else {
            Evaluation::root(Decision::Deny, "ROOT_QUORUM_ONLY")
        });
    }
    let policies = policy_sources(store, &org.id)?;
    let facts = ActivityFacts {
        activity_type: p.op.activity_type,
        resource: p.op.resource,
        action: p.op.action,
        params: p.params,
        approvals,
        now: p.now,
    };
    let org_facts = organization_facts(store, &org.id, p.params, &voters)?;
    let ctx = context::build(&facts, &org_facts);
    let implicit = context::own_credentials(p.op.activity_type, p.params, p.submitter);
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

/// The organization's policies as the engine reads them.
pub fn policy_sources(store: &dyn Store, org: &str) -> Result<Vec<PolicySource>, StoreError> {
    Ok(store.records(org, "policy")?.iter().map(|r| PolicySource::from_json(&r.id, &r.name, &r.data)).collect())
}

fn found<T>(r: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(StoreError::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
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
    let tags = if voters.is_empty() { Vec::new() } else { store.user_tag_members(org)? };
    for id in voters {
        let Some(u) = found(store.user(org, id))? else { continue };
        facts.approvers.push(ApproverFacts {
            tags: tags.iter().filter(|(_, uid)| uid == id).map(|(t, _)| t.clone()).collect(),
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
    if let Some(sw) = text("signWith") {
        match crate::store::sign_with_key(store, org, sw)? {
            Some(SignWithKey::Account(a)) => put_account(&mut facts, a)?,
            Some(SignWithKey::PrivateKey { key, .. }) => facts.private_key = Some(private_key_facts(&key)),
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
