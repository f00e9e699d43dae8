-- Queries of extraction batches (migration 0013). The items themselves are written by the single
-- job's `accept_job` (services/acceptance/sql/acceptance.sql), once per item.

-- name: batch_by_key
SELECT id, tenant_id, request_hash, state, total, accepted, priority, created_at
FROM extraction_batches
WHERE tenant_id = %(tenant_id)s AND idempotency_key = %(idempotency_key)s

-- name: insert_batch
-- Nothing when a request with the same key came first; the caller then reads that batch.
INSERT INTO extraction_batches (id, tenant_id, idempotency_key, request_hash, total, priority)
VALUES (%(batch_id)s, %(tenant_id)s, %(idempotency_key)s, %(request_hash)s, %(total)s, %(priority)s)
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
RETURNING id

-- name: items_written
-- The last statement of each chunk's transaction: its new items are counted, and the chunk that
-- completes the batch makes it `running`.
UPDATE extraction_batches
SET accepted = accepted + %(written)s,
    state = CASE WHEN state = 'accepting' AND accepted + %(written)s >= total THEN 'running' ELSE state END,
    updated_at = now()
WHERE id = %(batch_id)s
RETURNING state, accepted

-- name: jobs_by_keys
-- The jobs already holding any of these keys (a resumed batch's written items, or a conflict).
SELECT idempotency_key, id, request_hash, batch_id, batch_index
FROM extraction_jobs
WHERE tenant_id = %(tenant_id)s AND idempotency_key = ANY (%(keys)s::text[])

-- name: documents_by_ref
SELECT id, version, size_bytes, sha256
FROM documents
WHERE tenant_id = %(tenant_id)s
  AND (id, version) IN (SELECT * FROM unnest(%(ids)s::uuid[], %(versions)s::integer[]))

-- name: get_batch
-- The batch and its counts: at most 16 counter rows, however many items it has.
SELECT b.id, b.tenant_id, b.state, b.total, b.accepted, b.priority, b.created_at, b.completed_at,
       now() AS now,
       coalesce(sum(c.succeeded), 0)::integer AS succeeded,
       coalesce(sum(c.review_required), 0)::integer AS review_required,
       coalesce(sum(c.failed), 0)::integer AS failed,
       coalesce(sum(c.rejected), 0)::integer AS rejected,
       coalesce(sum(c.cancelled), 0)::integer AS cancelled
FROM extraction_batches b
LEFT JOIN batch_counters c ON c.batch_id = b.id
WHERE b.id = %(batch_id)s AND b.tenant_id = %(tenant_id)s
GROUP BY b.id

-- name: batch_items
-- A page of items in index order, after the cursor's index.
SELECT id, batch_index, idempotency_key, state, state_version, result, decided_by, review_reasons,
       error_class, error_message
FROM extraction_jobs
WHERE batch_id = %(batch_id)s AND tenant_id = %(tenant_id)s AND batch_index > %(after)s
ORDER BY batch_index
LIMIT %(limit)s

-- name: batch_items_in_states
SELECT id, batch_index, idempotency_key, state, state_version, result, decided_by, review_reasons,
       error_class, error_message
FROM extraction_jobs
WHERE batch_id = %(batch_id)s AND tenant_id = %(tenant_id)s AND batch_index > %(after)s
  AND state = ANY (%(states)s::text[])
ORDER BY batch_index
LIMIT %(limit)s

-- name: close_finished_batches
-- The relay's sweep: running batches whose items are all final, closed by the same function the
-- item trigger calls (it finds nothing to do for a batch another closer got to first).
SELECT count(*) FILTER (WHERE fatura_close_batch(b.id)) AS closed
FROM (SELECT id FROM extraction_batches r
      WHERE r.state = 'running'
        AND r.total <= (SELECT coalesce(sum(c.succeeded + c.failed + c.rejected + c.cancelled), 0)
                        FROM batch_counters c WHERE c.batch_id = r.id)
      ORDER BY r.created_at
      LIMIT %(limit)s) b
