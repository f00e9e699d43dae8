-- Batched delivery claims (issue 14): one wake-up may claim several due deliveries of an endpoint
-- and send them one after another over one connection. Every row of such a batch names the
-- delivery whose wake-up claimed it, so an endpoint's concurrency cap counts concurrent senders
-- (requests that can be open at once), not the deliveries queued behind them in a batch.
ALTER TABLE deliveries ADD COLUMN sender uuid;
