-- Records an organization owns that need no table of their own (policies, tags, contract
-- interfaces, features, TVC apps, ...): a kind, an id, a name unique per kind, JSON data.
CREATE TABLE records (
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    name TEXT NOT NULL,
    data TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (organization_id, kind, id),
    UNIQUE (organization_id, kind, name)
);
CREATE INDEX records_org ON records(organization_id, kind, created_at);
