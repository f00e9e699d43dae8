-- Dead letters: broker messages taken off their queue, with the reason and the whole message.

-- name: record
-- The same message refused again for the same reason while its dead letter is still open (its ack
-- was lost with a connection, and it came back) is the same dead letter.
WITH existing AS (
    SELECT id FROM dead_letters
    WHERE %(message_id)s::text IS NOT NULL AND message_id = %(message_id)s::text
      AND queue = %(queue)s AND reason = %(reason)s AND redriven_at IS NULL
    LIMIT 1
), inserted AS (
    INSERT INTO dead_letters (queue, actor, message_id, reason, detail, body, message, source)
    SELECT %(queue)s, %(actor)s, %(message_id)s, %(reason)s, %(detail)s, %(body)s, %(message)s, %(source)s
    WHERE NOT EXISTS (SELECT 1 FROM existing)
    RETURNING id
)
SELECT id FROM inserted UNION ALL SELECT id FROM existing

-- name: list
SELECT * FROM dead_letters
WHERE (%(since)s::timestamptz IS NULL OR at >= %(since)s::timestamptz)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(include_redriven)s OR redriven_at IS NULL)
ORDER BY at DESC, id DESC
LIMIT %(limit)s

-- name: get
SELECT * FROM dead_letters WHERE id = %(id)s

-- name: mark_redriven
UPDATE dead_letters SET redriven_at = now(), redrive_count = redrive_count + 1
WHERE id = %(id)s AND redriven_at IS NULL

-- name: request_redrive
UPDATE dead_letters
SET redrive_requested_at = coalesce(redrive_requested_at, now())
WHERE redriven_at IS NULL
  AND (%(ids)s::bigint[] IS NULL OR id = ANY (%(ids)s::bigint[]))
  AND (%(since)s::timestamptz IS NULL OR at >= %(since)s::timestamptz)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
RETURNING id, message IS NOT NULL AS sendable

-- name: pending_redrives
SELECT count(*) AS n FROM dead_letters
WHERE id = ANY (%(ids)s::bigint[]) AND redriven_at IS NULL AND message IS NOT NULL

-- name: requested_redrives
SELECT * FROM dead_letters
WHERE redrive_requested_at IS NOT NULL AND redriven_at IS NULL AND message IS NOT NULL
  AND queue = ANY (%(queues)s::text[])
ORDER BY redrive_requested_at, id
LIMIT %(limit)s

-- name: depth
SELECT queue, count(*) AS open, extract(epoch FROM now() - min(at))::float8 AS oldest_age_seconds
FROM dead_letters
WHERE redriven_at IS NULL
GROUP BY queue

-- name: prune
-- In bounded batches, so a long backlog of old rows never holds a long transaction.
DELETE FROM dead_letters
WHERE id IN (SELECT id FROM dead_letters
             WHERE at < now() - %(days)s::float8 * interval '1 day'
             ORDER BY at LIMIT 5000)
RETURNING id

-- name: check_ids
-- Which of the ids an operator named exist, and which of those were redriven already.
SELECT id, redriven_at FROM dead_letters WHERE id = ANY (%(ids)s::bigint[])
