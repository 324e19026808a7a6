-- Social login: an OAuth provider carries the enclave's certificate binding its identity
-- (issuer, subject, audience) to its organization and user, so the enclave certifies a session
-- key for an OIDC login only to a user the organization attached that identity to. A row without
-- one (empty, attached before this migration) still answers queries but cannot log in.
ALTER TABLE oauth_providers ADD COLUMN certificate BLOB NOT NULL DEFAULT x'';
-- The auth proxy finds its configuration by the id a browser sends (X-Auth-Proxy-Config-Id),
-- without knowing the organization.
CREATE INDEX records_kind_id ON records(kind, id);
