-- One inbox protocol for every consumer (services/common/inbox.py): the inboxes share their shape,
-- and an event id seen again with another payload goes to one quarantine, named by its inbox.

ALTER TABLE delivery_inbox ADD COLUMN event_type text;

CREATE TABLE inbox_quarantine (
    id               bigserial PRIMARY KEY,
    inbox            text NOT NULL,
    event_id         uuid NOT NULL,
    stored_digest    text NOT NULL,
    received_digest  text NOT NULL,
    payload          jsonb NOT NULL,
    received_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inbox_quarantine_event ON inbox_quarantine (event_id);

INSERT INTO inbox_quarantine (inbox, event_id, stored_digest, received_digest, payload, received_at)
SELECT 'execution_inbox', event_id, stored_digest, received_digest, payload, received_at
FROM execution_inbox_quarantine;

INSERT INTO inbox_quarantine (inbox, event_id, stored_digest, received_digest, payload, received_at)
SELECT 'delivery_inbox', q.event_id, coalesce(i.payload_digest, ''), q.payload_digest, q.payload, q.received_at
FROM delivery_quarantine q LEFT JOIN delivery_inbox i ON i.event_id = q.event_id;

DROP TABLE execution_inbox_quarantine;
DROP TABLE delivery_quarantine;
