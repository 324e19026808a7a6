//! Votes on activities awaiting consensus, and the policy evaluations each vote records.

use super::db::{args, json_text, Dialect};
use crate::store::error::{Conflict, ConflictKind, StoreError};
use crate::store::model::{Nanos, PolicyEvaluationRecord};
use crate::store::write::CONSENSUS_MOVED;

/// See `Write::UpdateConsensusActivity`.
#[allow(clippy::too_many_arguments)]
pub fn update_consensus_activity<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    id: &str,
    expected_votes: usize,
    status: &str,
    result: &serde_json::Value,
    votes: &serde_json::Value,
    failure: Option<&serde_json::Value>,
    updated_at: Nanos,
    app_proofs: &[serde_json::Value],
) -> Result<(), StoreError> {
    // A compare-and-set: with two gateways, the second update waits for the first's
    // row lock and then finds the row no longer matching.
    let n = db.execute(
        &format!(
            "UPDATE activities SET status = ?1, result = ?2, votes = ?3, failure = ?4, updated_at = ?5,
                            app_proofs = ?9
                     WHERE id = ?6 AND organization_id = ?7 AND status = 'ACTIVITY_STATUS_CONSENSUS_NEEDED'
                       AND {} = ?8",
            D::VOTE_COUNT
        ),
        args![
            status,
            json_text(result),
            json_text(votes),
            failure.map(json_text),
            updated_at,
            id,
            organization_id,
            expected_votes as i64,
            super::activities::proofs_text(app_proofs)
        ],
    )?;
    if n != 1 {
        return Err(StoreError::Conflict(Conflict::new(ConflictKind::ConsensusMoved, CONSENSUS_MOVED)));
    }
    // An approved deletion of this organization: its record goes to the parent's log.
    let parent = db.query_opt(
        "SELECT parent_id FROM organizations WHERE id = ?1 AND deletion_activity_id = ?2",
        args![organization_id, id],
        |r| r.opt_text(0),
    )?;
    if let Some(Some(parent)) = parent {
        db.execute("UPDATE activities SET organization_id = ?1 WHERE id = ?2", args![parent, id])?;
    }
    Ok(())
}

pub fn insert_policy_evaluation<D: Dialect>(db: &mut D, e: &PolicyEvaluationRecord) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO policy_evaluations (id, activity_id, organization_id, vote_id, evaluations, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        args![e.id, e.activity_id, e.organization_id, e.vote_id, e.evaluations, e.created_at],
    )?;
    Ok(())
}

pub fn policy_evaluations<D: Dialect>(
    db: &mut D,
    org: &str,
    activity_id: &str,
) -> Result<Vec<PolicyEvaluationRecord>, StoreError> {
    let sql = format!(
        "SELECT id, activity_id, organization_id, vote_id, evaluations, created_at FROM policy_evaluations
         WHERE organization_id = ?1 AND activity_id = ?2 ORDER BY created_at, {}",
        D::INSERTION_ORDER
    );
    db.query(&sql, args![org, activity_id], |r| {
        Ok(PolicyEvaluationRecord {
            id: r.text(0)?,
            activity_id: r.text(1)?,
            organization_id: r.text(2)?,
            vote_id: r.text(3)?,
            evaluations: r.text(4)?,
            created_at: r.int(5)?,
        })
    })
}
