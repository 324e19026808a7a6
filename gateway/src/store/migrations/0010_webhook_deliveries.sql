-- Webhook deliveries: an outbox written in the transaction that records an activity or changes
-- its status, one row per (event, endpoint), kept until delivered or given up; and every attempt.
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    id TEXT PRIMARY KEY,                    -- the event id, stable across retries
    organization_id TEXT NOT NULL,          -- the endpoint's organization
    endpoint_id TEXT NOT NULL,
    activity_organization_id TEXT NOT NULL,
    activity_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    body TEXT NOT NULL,                     -- the activity JSON as of the event
    status TEXT NOT NULL,                   -- PENDING, DELIVERED, FAILED
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    last_status_code INTEGER,
    last_error TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries(status, next_attempt_at);
CREATE INDEX IF NOT EXISTS webhook_deliveries_endpoint ON webhook_deliveries(organization_id, endpoint_id, created_at);
CREATE TABLE IF NOT EXISTS webhook_attempts (
    delivery_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    at BIGINT NOT NULL,
    status_code INTEGER,
    error TEXT,
    duration_ms BIGINT NOT NULL,
    PRIMARY KEY (delivery_id, attempt)
);
