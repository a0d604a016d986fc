-- The log. Each host transactions append events and prepared receipts
-- to the pending tables, and the sequencer places them (../log.go). Every
-- host rounds take turns on the log lock, so each step is one statement.

-- name: ReceiptHead :one
SELECT sequence, id FROM receipts ORDER BY sequence DESC LIMIT 1;

-- name: ReceiptInsertMany :exec
INSERT INTO receipts (sequence, id, kind, operation_id, body)
SELECT unnest(sqlc.arg('sequences')::bigint[]), unnest(sqlc.arg('ids')::text[]), unnest(sqlc.arg('kinds')::text[]), unnest(sqlc.arg('operation_ids')::text[]), unnest(sqlc.arg('bodies')::text[]);

-- name: ReceiptGet :one
SELECT body FROM receipts WHERE id = sqlc.arg('id');

-- name: ReceiptGetMany :many
SELECT body FROM receipts WHERE id = ANY(sqlc.arg('ids')::text[]) ORDER BY sequence;

-- name: ReceiptList :many
SELECT body FROM receipts ORDER BY sequence;

-- name: ReceiptListByOperation :many
SELECT body FROM receipts WHERE operation_id = sqlc.arg('operation_id') ORDER BY sequence;

-- name: ReceiptNewestByOperation :many
SELECT DISTINCT ON (operation_id) operation_id, id FROM receipts ORDER BY operation_id, sequence DESC;

-- name: ReceiptIDsOf :many
SELECT operation_id, id FROM receipts WHERE operation_id = ANY(sqlc.arg('operation_ids')::text[]) ORDER BY sequence;

-- name: EventInsertMany :exec
INSERT INTO events (sequence, timestamp_ms, kind, actor, title, data, operation_id)
SELECT unnest(sqlc.arg('sequences')::bigint[]), unnest(sqlc.arg('timestamps')::bigint[]), unnest(sqlc.arg('kinds')::text[]), unnest(sqlc.arg('actors')::text[]), unnest(sqlc.arg('titles')::text[]), unnest(sqlc.arg('data')::text[]), unnest(sqlc.arg('operation_ids')::text[]);

-- name: EventLast :one
SELECT COALESCE(MAX(sequence), 0)::bigint FROM events;

-- name: EventList :many
SELECT * FROM events WHERE sequence > sqlc.arg('after') ORDER BY sequence LIMIT sqlc.arg('max');

-- The newest pages, each read backwards through an index from before.
-- name: EventListBefore :many
SELECT * FROM events WHERE sequence > sqlc.arg('after') AND sequence < sqlc.arg('before')
ORDER BY sequence DESC LIMIT sqlc.arg('max');

-- name: EventListOfKind :many
SELECT * FROM events WHERE kind = sqlc.arg('kind') AND sequence > sqlc.arg('after') AND sequence < sqlc.arg('before')
ORDER BY sequence DESC LIMIT sqlc.arg('max');

-- name: EventListOfJob :many
SELECT * FROM events WHERE operation_id = sqlc.arg('operation_id') AND sequence > sqlc.arg('after') AND sequence < sqlc.arg('before')
    AND (sqlc.arg('kind')::text = '' OR kind = sqlc.arg('kind')::text)
ORDER BY sequence DESC LIMIT sqlc.arg('max');

-- name: EventHead :one
SELECT COUNT(*) AS events, COALESCE(MAX(sequence), 0)::bigint AS newest FROM events;

-- A transaction events and receipts for the sequencer, in one statement
-- (sent with its COMMIT), returning their pending ids tagged e or r.
-- name: PendingLogInsert :many
WITH e AS (
    INSERT INTO pending_events (timestamp_ms, kind, actor, title, data, operation_id)
    SELECT unnest(sqlc.arg('timestamps')::bigint[]), unnest(sqlc.arg('kinds')::text[]), unnest(sqlc.arg('actors')::text[]), unnest(sqlc.arg('titles')::text[]), unnest(sqlc.arg('data')::text[]), unnest(sqlc.arg('operation_ids')::text[])
    RETURNING id
), r AS (
    INSERT INTO pending_receipts (receipt_id, body)
    SELECT unnest(sqlc.arg('receipt_ids')::text[]), unnest(sqlc.arg('bodies')::text[])
    RETURNING id
)
SELECT 'e'::text AS tag, id FROM e UNION ALL SELECT 'r'::text, id FROM r;

-- Both pending tables and the placed log heads, in one statement.
-- name: PendingLogList :many
SELECT 'e'::text AS tag, id, timestamp_ms, kind, actor, title, data, operation_id FROM (SELECT * FROM pending_events ORDER BY id LIMIT sqlc.arg('max')) AS pe
UNION ALL
SELECT 'r'::text, id, 0::bigint, ''::text, ''::text, ''::text, body, ''::text FROM (SELECT * FROM pending_receipts ORDER BY id LIMIT sqlc.arg('max')) AS pr
UNION ALL
SELECT 'h'::text, COALESCE((SELECT MAX(sequence) FROM events), 0)::bigint,
    COALESCE((SELECT sequence FROM receipts ORDER BY sequence DESC LIMIT 1), 0)::bigint, ''::text, ''::text, ''::text,
    COALESCE((SELECT id FROM receipts ORDER BY sequence DESC LIMIT 1), '')::text, ''::text;

-- name: PendingLogLeft :many
SELECT 'e'::text AS tag, id, ''::text AS body FROM pending_events WHERE id = ANY(sqlc.arg('events')::bigint[])
UNION ALL
SELECT 'r'::text, id, '' FROM pending_receipts WHERE id = ANY(sqlc.arg('receipts')::bigint[])
UNION ALL
SELECT 'p'::text, sequence, body FROM receipts WHERE id = ANY(sqlc.arg('receipt_ids')::text[]);

-- A sequencer round writes in one statement: the placed events and
-- sealed receipts, the pending entries they were removed, and every
-- host sequencer told at commit.
-- name: PendingLogPlace :exec
WITH e AS (
    INSERT INTO events (sequence, timestamp_ms, kind, actor, title, data, operation_id)
    SELECT unnest(sqlc.arg('sequences')::bigint[]), unnest(sqlc.arg('timestamps')::bigint[]), unnest(sqlc.arg('kinds')::text[]), unnest(sqlc.arg('actors')::text[]), unnest(sqlc.arg('titles')::text[]), unnest(sqlc.arg('data')::text[]), unnest(sqlc.arg('operation_ids')::text[])
), r AS (
    INSERT INTO receipts (sequence, id, kind, operation_id, body)
    SELECT unnest(sqlc.arg('receipt_sequences')::bigint[]), unnest(sqlc.arg('receipt_ids')::text[]), unnest(sqlc.arg('receipt_kinds')::text[]), unnest(sqlc.arg('receipt_operation_ids')::text[]), unnest(sqlc.arg('receipt_bodies')::text[])
), de AS (
    DELETE FROM pending_events WHERE id = ANY(sqlc.arg('pending_events')::bigint[])
), dr AS (
    DELETE FROM pending_receipts WHERE id = ANY(sqlc.arg('pending_receipts')::bigint[])
)
SELECT pg_notify(sqlc.arg('channel')::text, sqlc.arg('instance')::text);
