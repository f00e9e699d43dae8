-- The reconciler: events published a while ago that a consumer's inbox never recorded.

-- name: unconsumed_events
-- {inbox} is the consumer's inbox table (an identifier, composed with psycopg.sql). An event whose
-- message is an open dead letter is an operator's to look at, not the reconciler's to re-drive.
SELECT o.event_id, o.event_type, o.payload, o.published_at
FROM outbox_events o
WHERE o.published_at IS NOT NULL
  AND o.published_at > coalesce(%(low)s::timestamptz, now() - make_interval(secs => %(horizon)s))
  AND o.published_at <= now() - make_interval(secs => %(grace)s)
  AND o.event_type = ANY (%(types)s::text[])
  AND NOT EXISTS (SELECT 1 FROM {inbox} i WHERE i.event_id = o.event_id)
  AND NOT EXISTS (SELECT 1 FROM dead_letters d
                  WHERE d.message_id = o.event_id::text AND d.redriven_at IS NULL)
ORDER BY o.published_at
LIMIT %(batch)s

-- name: settled_upto
SELECT now() - make_interval(secs => %(grace)s) AS upto
