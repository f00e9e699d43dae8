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
