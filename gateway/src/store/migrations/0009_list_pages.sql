-- Every list pages in the database: keyset pagination on each list's order, so a page costs the
-- same whatever the organization holds; and the policy set's version (count, latest change) is an
-- index walk.
CREATE INDEX IF NOT EXISTS users_org_page ON users(organization_id, created_at, id);
CREATE INDEX IF NOT EXISTS api_keys_org_page ON api_keys(organization_id, created_at, id);
CREATE INDEX IF NOT EXISTS wallets_org_page ON wallets(organization_id, created_at, id);
CREATE INDEX IF NOT EXISTS private_keys_org_page ON private_keys(organization_id, created_at, id);
CREATE INDEX IF NOT EXISTS wallet_accounts_org_page ON wallet_accounts(organization_id, created_at, wallet_id, seq);
CREATE INDEX IF NOT EXISTS records_org_page ON records(organization_id, kind, created_at, id);
CREATE INDEX IF NOT EXISTS records_org_version ON records(organization_id, kind, updated_at);
