-- The top-level organization each delivery's endpoint is charged to (the endpoint's
-- organization, or its parent for a sub-organization's endpoint): the outbox read leaves out the
-- deliveries of a top-level organization whose share of the delivery workers is in use, however
-- many endpoints and sign-ups it spreads its backlog over. Empty for deliveries enqueued before
-- (charged to the endpoint's organization).
ALTER TABLE webhook_deliveries ADD COLUMN top_level_id TEXT NOT NULL DEFAULT '';
