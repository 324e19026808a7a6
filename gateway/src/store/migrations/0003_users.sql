-- User tag memberships. A user tag is a record of kind 'user_tag'; this table is the one source
-- of truth for which users carry it. A row goes away with its user or its tag (foreign keys).
-- (Private-key tag memberships live in private_keys.tags.)
CREATE TABLE user_tags (
    organization_id TEXT NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    tag_kind TEXT NOT NULL DEFAULT 'user_tag' CHECK (tag_kind = 'user_tag'),
    tag_id TEXT NOT NULL,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    PRIMARY KEY (tag_id, user_id),
    FOREIGN KEY (organization_id, tag_kind, tag_id) REFERENCES records(organization_id, kind, id) ON DELETE CASCADE
);
CREATE INDEX user_tags_user ON user_tags(user_id);
CREATE INDEX user_tags_org ON user_tags(organization_id);
CREATE INDEX api_keys_user ON api_keys(user_id);
