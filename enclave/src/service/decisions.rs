//! Decisions asked without work: `DecideActivity` (a stamped activity, decided as its call would
//! decide it), `DryRunActivity` (the policy dry run) and `ListAllowed` (the decision log's allows).

use coffer_proto::v1 as pb;
use serde_json::{json, Value};

use crate::admission::Admission;
use crate::decider::VerifiedVote;
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::Hsm;

/// The largest parameters a dry run evaluates (an activity's bound).
const MAX_DRY_RUN_PARAMETERS: usize = crate::link_request::MAX_ACTIVITY_BYTES;

pub(super) fn decide_activity(
    _hsm: &Hsm,
    admission: &Admission,
    req: pb::DecideActivityRequest,
) -> Result<pb::DecideActivityResponse, EnclaveError> {
    let parent = Some(req.parent_certificate.as_slice()).filter(|c| !c.is_empty());
    // What the calls it stands in for take: no vote (a vote is no activity the policies decide),
    // and a parent organization's credential only for an activity a parent may submit for its
    // sub-organization (logins, the one-time code before a login).
    use crate::admission::{APPROVE_ACTIVITY, REJECT_ACTIVITY};
    let types: Vec<&str> = match parent {
        Some(_) => crate::sessions::parent_may_submit().collect(),
        None => coffer_org_rules::subjects::SUBJECTS
            .iter()
            .map(|s| s.activity_type)
            .filter(|t| ![APPROVE_ACTIVITY, REJECT_ACTIVITY].contains(t))
            .collect(),
    };
    let evaluation = admission.decide_ahead(req.auth.as_ref(), &types, parent)?;
    Ok(pb::DecideActivityResponse { evaluation })
}

pub(super) fn dry_run_activity(
    _hsm: &Hsm,
    admission: &Admission,
    req: pb::DryRunActivityRequest,
) -> Result<pb::DryRunActivityResponse, EnclaveError> {
    if req.parameters.len() > MAX_DRY_RUN_PARAMETERS {
        return Err(EnclaveError::invalid(format!("parameters: at most {MAX_DRY_RUN_PARAMETERS} bytes")));
    }
    let params: Value = serde_json::from_slice(&req.parameters)
        .ok()
        .filter(Value::is_object)
        .ok_or_else(|| EnclaveError::invalid("parameters must be a JSON object"))?;
    let certificate = admission
        .genuine_certificate(&req.certificate)
        .filter(|c| c.organization_id == req.organization_id)
        .ok_or_else(|| {
            EnclaveError::refused(
                RefusalReason::CertificateInvalid,
                "the credential's certificate is not one this enclave issued to the organization",
            )
        })?;
    let credential = VerifiedVote {
        user_id: certificate.user_id,
        public_key: certificate.public_key,
        credential_type: certificate.credential_type,
        session_scope: certificate.session_scope,
        at_ms: 0,
    };
    let (e, transaction) = admission.dry_run(&req.organization_id, credential, &req.activity_type, &params)?;
    let policies: Vec<Value> = e
        .outcomes
        .iter()
        .map(|o| {
            json!({
                "policyId": &*o.policy_id,
                "policyName": &*o.policy_name,
                "effect": &*o.effect,
                "outcome": o.outcome,
                "decidingClause": o.clause,
                "detail": o.detail,
            })
        })
        .collect();
    Ok(pb::DryRunActivityResponse {
        decision: e.decision.as_str().to_string(),
        reason: e.reason.to_string(),
        policies: serde_json::to_vec(&policies).map_err(|e| EnclaveError::Internal(e.to_string()))?,
        transaction: transaction.map(|t| transaction_json(&t)).unwrap_or_default(),
    })
}

const MAX_DRY_RUN_TRANSACTION: usize = coffer_org_rules::facts::MAX_SHOWN_TRANSACTION_BYTES;

/// A transaction's facts as JSON `{root, tx}`, within [`MAX_DRY_RUN_TRANSACTION`]: past it, the
/// largest facts (the call data, a decoded argument, ...; each argument of `contract_call_args`
/// on its own) are each replaced by a note of their size, largest first, until it fits.
fn transaction_json(t: &coffer_policy::context::TransactionFacts) -> Vec<u8> {
    const ARGS: &str = "contract_call_args";
    // (fact, argument of `contract_call_args`, value, its size as JSON)
    let mut facts: Vec<(String, Option<String>, Value, usize)> = Vec::new();
    let mut tx = serde_json::Map::new();
    for (k, v) in &t.tx {
        match (k.as_str(), v.to_json()) {
            (ARGS, Value::Object(args)) => {
                tx.insert(ARGS.into(), json!({}));
                for (name, v) in args {
                    let size = v.to_string().len();
                    facts.push((k.clone(), Some(name), v, size));
                }
            }
            (_, v) => {
                let size = v.to_string().len();
                facts.push((k.clone(), None, v, size));
            }
        }
    }
    let weight = |(k, arg, _, n): &(String, Option<String>, Value, usize)| {
        k.len() + arg.as_ref().map_or(0, |a| a.len() + 4) + n + 4
    };
    let mut total: usize = facts.iter().map(weight).sum();
    facts.sort_by_key(|f| std::cmp::Reverse(f.3));
    for f in facts.iter_mut() {
        if total <= MAX_DRY_RUN_TRANSACTION - 64 {
            break;
        }
        let before = weight(f);
        f.2 = Value::String(format!("(not shown: {} bytes)", f.3));
        f.3 = f.2.to_string().len();
        total = total - before + weight(f);
    }
    for (k, arg, v, _) in facts {
        match arg {
            Some(name) => {
                if let Some(Value::Object(args)) = tx.get_mut(&k) {
                    args.insert(name, v);
                }
            }
            None => {
                tx.insert(k, v);
            }
        }
    }
    json!({ "root": t.root, "tx": tx }).to_string().into_bytes()
}

/// Most decisions one `ListAllowed` call reads.
const MAX_ALLOWED_LISTED: usize = 10_000;

/// `ListAllowed`: the allows of the decision log at or after `since_ms`, oldest first.
pub(super) fn list_allowed(
    admission: &Admission,
    req: &pb::ListAllowedRequest,
) -> Result<pb::ListAllowedResponse, EnclaveError> {
    let limit = (req.limit as usize).clamp(1, MAX_ALLOWED_LISTED);
    let store = admission.store();
    let decisions = store.decisions(req.since_ms, limit)?;
    let (scanned, last_at_ms) = (decisions.len() as u32, decisions.last().map_or(req.since_ms, |d| d.at_ms));
    let mut allowed = Vec::new();
    for d in decisions {
        if d.outcome != crate::store::OUTCOME_ALLOW || d.fingerprint.is_empty() {
            continue;
        }
        if store.decided(&d.organization_id, &d.fingerprint)?.logged != crate::store::LoggedDecision::Authorized {
            continue;
        }
        allowed.push(pb::AllowedActivity {
            at_ms: d.at_ms,
            organization_id: d.organization_id,
            fingerprint: d.fingerprint,
            activity_type: d.activity_type,
        });
    }
    Ok(pb::ListAllowedResponse { allowed, scanned, last_at_ms })
}

#[cfg(test)]
mod tests {
    use super::*;
    use coffer_policy::eval::Val;

    #[test]
    fn a_transaction_too_large_to_show_keeps_its_small_facts() {
        let facts = coffer_policy::context::TransactionFacts {
            root: "eth",
            tx: [
                ("to".to_string(), Val::Str("0xabc".into())),
                ("data".to_string(), Val::Str(format!("0x{}", "ab".repeat(100_000)))),
                ("value".to_string(), Val::Int(5)),
            ]
            .into(),
        };
        let shown = transaction_json(&facts);
        assert!(shown.len() <= MAX_DRY_RUN_TRANSACTION, "{}", shown.len());
        let v: Value = serde_json::from_slice(&shown).unwrap();
        assert_eq!(v, json!({"root": "eth", "tx": {"to": "0xabc", "value": 5, "data": "(not shown: 200004 bytes)"}}));
    }

    #[test]
    fn a_large_argument_is_hidden_alone() {
        let args = Val::Map(
            [
                ("to".to_string(), Val::Str("0x44".into())),
                ("blob".to_string(), Val::Str(format!("0x{}", "cd".repeat(50_000)))),
            ]
            .into(),
        );
        let facts = coffer_policy::context::TransactionFacts {
            root: "eth",
            tx: [("contract_call_args".to_string(), args), ("function_name".to_string(), Val::Str("f".into()))].into(),
        };
        let v: Value = serde_json::from_slice(&transaction_json(&facts)).unwrap();
        assert_eq!(
            v["tx"],
            json!({"function_name": "f", "contract_call_args": {"to": "0x44", "blob": "(not shown: 100004 bytes)"}})
        );
    }
}
