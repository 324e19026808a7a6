-- The messages the enclave sent for each organization (its mail results, never their content):
-- what `query/list_email_events` lists, newest first, by recipient.
CREATE TABLE IF NOT EXISTS email_events (
    organization_id TEXT NOT NULL,
    id TEXT NOT NULL,
    to_address TEXT NOT NULL,
    event_type TEXT NOT NULL,
    message_id TEXT NOT NULL,
    from_address TEXT NOT NULL,
    timestamp_ms BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (organization_id, id)
);
CREATE INDEX IF NOT EXISTS email_events_recipient ON email_events(organization_id, to_address, created_at, id);
CREATE INDEX IF NOT EXISTS email_events_age ON email_events(organization_id, created_at);
