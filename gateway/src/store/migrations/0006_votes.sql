-- Policy engine and approvals: one policy evaluation per vote, and Idempotency-Key headers.

-- get_policy_evaluations: the per-policy outcomes of each vote on an activity (JSON list of
-- {policyId, outcome}). No reference to the activity row: an activity's evaluation is written
-- in the same transaction, before its row.
CREATE TABLE IF NOT EXISTS policy_evaluations (
    id TEXT PRIMARY KEY,
    activity_id TEXT NOT NULL,
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    vote_id TEXT NOT NULL,
    evaluations TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS policy_evaluations_activity ON policy_evaluations(activity_id, created_at);

-- Idempotency-Key (Coffer's extension): a key names one activity per organization; the intent
-- hash (organization, type, parameters) tells a retry from a different request.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    intent_hash TEXT NOT NULL,
    activity_id TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (organization_id, key)
);
