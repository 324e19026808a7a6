-- Proofs: the app proofs an activity returned (JSON array), and each organization's activity log
-- as the enclave signed it, one row per link: position, the activity it names, the signed link.
ALTER TABLE activities ADD COLUMN app_proofs TEXT;
CREATE TABLE IF NOT EXISTS activity_log (
    organization_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    activity_id TEXT NOT NULL,
    link TEXT NOT NULL,
    PRIMARY KEY (organization_id, seq)
);
-- Which link names an activity (the export's unlogged activities, a row's link).
CREATE INDEX IF NOT EXISTS activity_log_activity ON activity_log(organization_id, activity_id);
