-- Passkeys (WebAuthn authenticators) and OAuth providers of users. Both go away with their user
-- (ON DELETE CASCADE), so a deleted user's passkeys can never stamp again.
CREATE TABLE authenticators (
    id TEXT PRIMARY KEY,
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    credential_id TEXT NOT NULL,
    public_key TEXT NOT NULL,
    attestation_type TEXT NOT NULL,
    aaguid TEXT NOT NULL,
    transports TEXT NOT NULL,
    sign_count BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (organization_id, credential_id)
);
CREATE INDEX authenticators_user ON authenticators(user_id, created_at);
CREATE TABLE oauth_providers (
    id TEXT PRIMARY KEY,
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    issuer TEXT NOT NULL,
    audience TEXT NOT NULL,
    subject TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (organization_id, issuer, subject, audience)
);
CREATE INDEX oauth_providers_user ON oauth_providers(user_id, created_at);
