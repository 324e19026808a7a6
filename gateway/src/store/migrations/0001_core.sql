-- Coffer schema v1. Portable SQL (SQLite and PostgreSQL): TEXT, BIGINT, BLOB/BYTEA via the
-- backend's migration text, no backend-specific functions. Timestamps are Unix nanoseconds.
CREATE TABLE organizations (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    parent_id TEXT REFERENCES organizations(id) ON DELETE CASCADE,
    root_quorum_threshold BIGINT NOT NULL,
    root_user_ids TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE TABLE users (
    id TEXT PRIMARY KEY,
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    email TEXT,
    phone_number TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX users_org ON users(organization_id);
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    public_key TEXT NOT NULL,
    credential_type TEXT NOT NULL,
    expiration_seconds BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (organization_id, public_key)
);
CREATE TABLE wallets (
    id TEXT PRIMARY KEY,
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    exported BIGINT NOT NULL,
    imported BIGINT NOT NULL,
    sealed_seed BLOB NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (organization_id, name)
);
CREATE TABLE wallet_accounts (
    id TEXT PRIMARY KEY,
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    wallet_id TEXT NOT NULL REFERENCES wallets(id) ON DELETE CASCADE,
    seq BIGINT NOT NULL,
    curve TEXT NOT NULL,
    path_format TEXT NOT NULL,
    path TEXT NOT NULL,
    address_format TEXT NOT NULL,
    address TEXT NOT NULL,
    public_key TEXT NOT NULL,
    exported BIGINT NOT NULL,
    sealed_key BLOB NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (wallet_id, path, address_format)
);
CREATE INDEX wallet_accounts_address ON wallet_accounts(organization_id, address);
CREATE INDEX wallet_accounts_wallet ON wallet_accounts(wallet_id, seq);
CREATE TABLE private_keys (
    id TEXT PRIMARY KEY,
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    curve TEXT NOT NULL,
    public_key TEXT NOT NULL,
    addresses TEXT NOT NULL,
    tags TEXT NOT NULL,
    exported BIGINT NOT NULL,
    imported BIGINT NOT NULL,
    sealed_key BLOB NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (organization_id, name)
);
CREATE TABLE private_key_addresses (
    private_key_id TEXT NOT NULL REFERENCES private_keys(id) ON DELETE CASCADE,
    organization_id TEXT NOT NULL,
    address TEXT NOT NULL,
    PRIMARY KEY (private_key_id, address)
);
CREATE INDEX private_key_addresses_lookup ON private_key_addresses(organization_id, address);
CREATE TABLE import_targets (
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    user_id TEXT NOT NULL,
    sealed_key BLOB NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (organization_id, user_id)
);
CREATE TABLE activities (
    id TEXT PRIMARY KEY,
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    activity_type TEXT NOT NULL,
    status TEXT NOT NULL,
    fingerprint TEXT NOT NULL UNIQUE,
    intent TEXT NOT NULL,
    result TEXT NOT NULL,
    votes TEXT NOT NULL,
    failure TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX activities_org ON activities(organization_id, created_at);
