-- Several gateways share one outbox: a delivery's lease names the gateway holding it, so a
-- gateway starting again takes back only what it held (another gateway's leases lapse on their
-- own), and a retry waiting for its time holds no lease at all.
ALTER TABLE webhook_deliveries ADD COLUMN leased_by TEXT;
