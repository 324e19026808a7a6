-- Deleting a sub-organization keeps its activity history: an audit trail of what was signed and
-- exported must survive the organization. The organization row stays as a tombstone
-- (`deleted_at`, and the activity that deleted it), its activities and policy evaluations stay,
-- and the store removes its credentials, keys and records explicitly (Write::DeleteSubOrganization)
-- instead of migration 0005's trigger deleting the row and every other row with it.
ALTER TABLE organizations ADD COLUMN deleted_at BIGINT;
ALTER TABLE organizations ADD COLUMN deletion_activity_id TEXT;
DROP TRIGGER IF EXISTS organization_deletions_finish;
DROP TABLE IF EXISTS organization_deletions;
