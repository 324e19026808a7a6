-- Sub-organizations: finding a parent's sub-organizations, and deleting one.
-- Depends only on 0001-0004, and is idempotent (IF NOT EXISTS), so its place among the
-- migrations does not matter.

-- list_suborgs: a parent's sub-organizations in creation order, and the filters' lookups by
-- value (user name, email, phone number, passkey credential id, public key, wallet account
-- address, OAuth identity) across all of them.
CREATE INDEX IF NOT EXISTS organizations_parent ON organizations(parent_id, created_at, id);
CREATE INDEX IF NOT EXISTS users_name ON users(name);
CREATE INDEX IF NOT EXISTS users_email ON users(lower(email));
CREATE INDEX IF NOT EXISTS users_phone_number ON users(phone_number);
CREATE INDEX IF NOT EXISTS api_keys_public_key ON api_keys(public_key);
CREATE INDEX IF NOT EXISTS authenticators_credential_id ON authenticators(credential_id);
CREATE INDEX IF NOT EXISTS authenticators_public_key ON authenticators(public_key);
CREATE INDEX IF NOT EXISTS wallet_accounts_address_ci ON wallet_accounts(lower(address));
CREATE INDEX IF NOT EXISTS oauth_providers_identity ON oauth_providers(issuer, subject, audience);

-- delete_sub_organization is submitted in the sub-organization, and an activity is recorded
-- after its effects, referencing its organization: the sub-organization must still exist when
-- the activity row lands, and the record of its deletion must outlive it. So the activity's
-- write (Write::DeleteSubOrganization) checks the export rule and leaves a marker here; when
-- that activity's row is inserted, the trigger moves it to the parent's log and deletes the
-- sub-organization, whose rows in every table go with it (ON DELETE CASCADE; the marker too).
-- All of it happens in the activity's own savepoint: no recorded activity, no deletion.
CREATE TABLE IF NOT EXISTS organization_deletions (
    organization_id TEXT PRIMARY KEY REFERENCES organizations(id) ON DELETE CASCADE,
    parent_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    activity_id TEXT NOT NULL UNIQUE
);
CREATE TRIGGER IF NOT EXISTS organization_deletions_finish AFTER INSERT ON activities
FOR EACH ROW WHEN EXISTS (
    SELECT 1 FROM organization_deletions d WHERE d.activity_id = NEW.id AND d.organization_id = NEW.organization_id
)
BEGIN
    UPDATE activities
        SET organization_id = (SELECT d.parent_id FROM organization_deletions d WHERE d.activity_id = NEW.id)
        WHERE id = NEW.id;
    DELETE FROM organizations WHERE id = NEW.organization_id;
END;
