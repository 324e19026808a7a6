//! Activities that change no key material: decided over the organization's authority state and,
//! when their proposed changes are exactly what the stamped body asks for, applied to it.

use coffer_authority_state::subjects::{self, KEY_OPERATIONS};
use coffer_auth::envelope::derived_id;
use coffer_auth::grants::granted_credentials;
use coffer_authority_state::transition::{self, Grant, Input};
use coffer_authority_state::Change;
use coffer_proto::v1 as pb;

use crate::authority::{refuse, Authority};
use crate::error::{EnclaveError, RefusalReason};

/// Most changes one activity may propose.
const MAX_CHANGES: usize = 10_000;

/// Decides the stamped activity over its organization's state and applies the proposal.
pub(super) fn apply_activity(
    authority: &Authority,
    req: pb::ApplyActivityRequest,
) -> Result<pb::ApplyActivityResponse, EnclaveError> {
    let types: Vec<&str> =
        subjects::SUBJECTS.iter().map(|s| s.activity_type).filter(|t| !KEY_OPERATIONS.contains(t)).collect();
    let a = authority.authorize("apply_activity", req.auth.as_ref(), &types)?;
    if a.via_parent {
        return Err(refuse(
            &a,
            RefusalReason::OrganizationMismatch,
            "a parent organization's credential may not change a sub-organization",
        ));
    }
    let proposal: Vec<Change> = serde_json::from_slice(&req.proposal)
        .map_err(|e| EnclaveError::invalid(format!("the proposal is not a list of changes: {e}")))?;
    if proposal.len() > MAX_CHANGES {
        return Err(EnclaveError::invalid(format!("at most {MAX_CHANGES} changes per activity")));
    }
    let Some(decided) = &a.decided else {
        // Shadow mode, and the rules would have refused (logged): nothing is applied.
        return Ok(pb::ApplyActivityResponse::default());
    };
    let loaded = &decided.loaded;
    // What coffer-auth derives from the stamped body: new users' and the sub-organization's ids,
    // and the passkeys and OAuth identities it grants (parsed from attestations and tokens).
    let fingerprint = a.activity.fingerprint.clone();
    let derive_id = move |label: &str, i: usize| derived_id(&fingerprint, label, i);
    let grants: Vec<Grant> = granted_credentials(&a.activity)?
        .into_iter()
        .map(|g| Grant {
            organization_id: g.organization_id,
            user_id: g.user_id,
            credential_type: g.credential_type,
            public_key: g.public_key,
        })
        .collect();
    let input = Input {
        state: &loaded.state,
        activity_type: &a.activity.activity_type,
        params: &a.activity.parameters,
        proposal: &proposal,
        now_ms: crate::authority::now_ms(),
        derive_id: &derive_id,
        grants: &grants,
    };
    if let Err(e) = transition::check(&input) {
        if !authority.rules().enforces() {
            tracing::warn!(target: "coffer_audit", decision = "shadow_refuse", operation = a.operation, reason = %e,
                organization = %a.activity.organization_id, fingerprint = %a.activity.fingerprint, "enclave decision");
            return Ok(pb::ApplyActivityResponse::default());
        }
        return Err(refuse(&a, RefusalReason::TransitionMismatch, &e.to_string()));
    }
    let versions = if proposal.is_empty() {
        Vec::new()
    } else {
        match authority.rules().commit(&proposal, Some((&loaded.state.organization.id, loaded.state.version))) {
            Ok(v) => v,
            // Shadow mode: the state does not have everything yet (what an activity type without
            // a transition made); logged, and the gateway's decision stands.
            Err(e) if !authority.rules().enforces() => {
                tracing::warn!(target: "coffer_audit", decision = "shadow_refuse", operation = a.operation,
                    reason = %e, organization = %a.activity.organization_id,
                    fingerprint = %a.activity.fingerprint, "enclave decision");
                return Ok(pb::ApplyActivityResponse::default());
            }
            Err(EnclaveError::Refused { reason, message }) => return Err(refuse(&a, reason, &message)),
            Err(other) => return Err(other),
        }
    };
    let version =
        versions.iter().find(|(org, _)| org == &a.activity.organization_id).map_or(loaded.state.version, |(_, v)| *v);
    Ok(pb::ApplyActivityResponse { version, evaluation: decided.evaluation.outcomes_json().to_string() })
}
