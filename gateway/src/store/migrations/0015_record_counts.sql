-- How many records of each kind an organization has, and a version that grows with every change
-- to them: kept by every write of `records`, so the policy cap and the compiled-policy caches read
-- one row instead of counting every policy on each request.
CREATE TABLE IF NOT EXISTS record_counts (
    organization_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    count INTEGER NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (organization_id, kind)
);
INSERT INTO record_counts (organization_id, kind, count, version)
    SELECT organization_id, kind, COUNT(*), 1 FROM records GROUP BY organization_id, kind;
