-- The ERP acknowledges a delivery (DESIGN §5.13) with a Standard Webhooks signature made with its
-- endpoint's secret, and the edge serves that route: to verify the signature it opens the
-- endpoint's sealed secrets, with the master key it already holds to seal them at registration
-- and rotation. The edge reads the sealed columns; inference and the relay still cannot read the
-- table at all, and no role can write a ciphertext it did not seal (0007's column grants).
GRANT SELECT (master_key_id, nonce, ciphertext) ON webhook_secrets TO fatura_edge;

-- The delivery scheduler counts the deliveries received and not acknowledged within the window
-- across tenants; the partial index deliveries_unacknowledged (0010) leads with the tenant, for
-- the tenant's listing. This one serves the count and keeps it bounded.
CREATE INDEX deliveries_unacknowledged_since ON deliveries (delivered_at)
    WHERE state = 'delivered' AND acked_at IS NULL;
