-- Statements for refused broker messages.

-- name: record_dead_letter
INSERT INTO dead_letters (queue, actor, message_id, reason, detail, body)
VALUES (%(queue)s, %(actor)s, %(message_id)s, %(reason)s, %(detail)s, %(body)s)
