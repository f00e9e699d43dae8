-- The inbox protocol (DESIGN §5.3): {inbox} is a consumer's inbox table, composed with psycopg.sql.

-- name: insert
INSERT INTO {inbox} (event_id, job_id, event_type, payload_digest)
VALUES (%(event_id)s, %(job_id)s, %(event_type)s, %(digest)s)
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id

-- name: insert_and_check
-- The insert and, in the same statement, a consumer's own check (the placeholder in the last line: a
-- boolean expression over the same parameters, seeing the database as the statement began), so
-- taking an event in and asking what it needs done are one round trip.
WITH taken AS (
    INSERT INTO {inbox} (event_id, job_id, event_type, payload_digest)
    VALUES (%(event_id)s, %(job_id)s, %(event_type)s, %(digest)s)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id
)
SELECT EXISTS (SELECT FROM taken) AS new, ({check}) AS checked

-- name: stored_digest
SELECT payload_digest FROM {inbox} WHERE event_id = %(event_id)s

-- name: quarantine
INSERT INTO inbox_quarantine (inbox, event_id, stored_digest, received_digest, payload)
VALUES (%(inbox_name)s, %(event_id)s, %(stored_digest)s, %(digest)s, %(payload)s)

-- name: insert_all_and_check
-- insert_and_check for several events in one statement (a consumer's group commit), in the order
-- given; an id given twice is inserted once. Returns the ids inserted, each with the consumer's
-- check, whose placeholders read the inserted row's columns (services/common/inbox.py,
-- take_all_and_check).
INSERT INTO {inbox} AS g (event_id, job_id, event_type, payload_digest)
SELECT * FROM unnest(%(event_ids)s::uuid[], %(job_ids)s::uuid[], %(event_types)s::text[], %(digests)s::text[])
ON CONFLICT (event_id) DO NOTHING
RETURNING g.event_id, ({check}) AS checked
