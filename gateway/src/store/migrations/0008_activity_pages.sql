-- list_activities pages in the database: keyset pagination on (created_at, id), newest first,
-- so a page costs the same whatever the size of the organization's history.
CREATE INDEX IF NOT EXISTS activities_org_page ON activities(organization_id, created_at, id);
