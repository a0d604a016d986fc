-- The log: SQLite's one writer numbers events and receipts in its own
-- commit, so the pending tables are only exercised by the conformance
-- suite here. Lists of rows and ids travel as JSON arrays.

-- name: ReceiptHead :one
SELECT sequence, id FROM receipts ORDER BY sequence DESC LIMIT 1;

-- The receipts' bodies travel as one BLOB, each row naming its body's
-- 1-based offset and length, so that a body (canonical JSON) is neither
-- escaped into the rows' JSON nor parsed back out of it.
-- name: ReceiptInsertMany :exec
INSERT INTO receipts (sequence, id, kind, operation_id, body)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
    json_extract(value, '$[3]'),
    CAST(substr(CAST(@bodies AS BLOB), json_extract(value, '$[4]'), json_extract(value, '$[5]')) AS TEXT)
FROM jsonb_each(CAST(@rows AS TEXT));

-- name: ReceiptGet :one
SELECT body FROM receipts WHERE id = @id;

-- name: ReceiptGetMany :many
SELECT body FROM receipts WHERE id IN (SELECT value FROM json_each(CAST(@ids AS TEXT))) ORDER BY sequence;

-- name: ReceiptList :many
SELECT body FROM receipts ORDER BY sequence;

-- name: ReceiptListByOperation :many
SELECT body FROM receipts WHERE operation_id = @operation_id ORDER BY sequence;

-- name: ReceiptNewestByOperation :many
SELECT r.operation_id, r.id FROM receipts r
JOIN (SELECT operation_id, MAX(sequence) AS newest FROM receipts GROUP BY operation_id) m
    ON m.operation_id = r.operation_id AND m.newest = r.sequence;

-- name: ReceiptIDsOf :many
SELECT operation_id, id FROM receipts
WHERE operation_id IN (SELECT value FROM json_each(CAST(@operation_ids AS TEXT))) ORDER BY sequence;

-- The events' data travel as one BLOB, as the receipts' bodies do.
-- name: EventInsertMany :exec
INSERT INTO events (sequence, timestamp_ms, kind, actor, title, data, operation_id)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
    json_extract(value, '$[3]'), json_extract(value, '$[4]'),
    CAST(substr(CAST(@data AS BLOB), json_extract(value, '$[5]'), json_extract(value, '$[6]')) AS TEXT),
    json_extract(value, '$[7]')
FROM jsonb_each(CAST(@rows AS TEXT));

-- name: EventLast :one
SELECT CAST(COALESCE(MAX(sequence), 0) AS INTEGER) FROM events;

-- name: EventList :many
SELECT * FROM events WHERE sequence > @after ORDER BY sequence LIMIT @max;

-- The newest pages, each read backwards through an index from before.
-- name: EventListBefore :many
SELECT * FROM events WHERE sequence > @after AND sequence < @before ORDER BY sequence DESC LIMIT @max;

-- name: EventListOfKind :many
SELECT * FROM events WHERE kind = @kind AND sequence > @after AND sequence < @before
ORDER BY sequence DESC LIMIT @max;

-- name: EventListOfJob :many
SELECT * FROM events WHERE operation_id = @operation_id AND sequence > @after AND sequence < @before
    AND (CAST(@kind AS TEXT) = '' OR kind = CAST(@kind AS TEXT))
ORDER BY sequence DESC LIMIT @max;

-- name: EventHead :one
SELECT COUNT(*) AS events, CAST(COALESCE(MAX(sequence), 0) AS INTEGER) AS newest FROM events;

-- name: PendingEventInsert :one
INSERT INTO pending_events (timestamp_ms, kind, actor, title, data, operation_id)
VALUES (@timestamp_ms, @kind, @actor, @title, @data, @operation_id) RETURNING id;

-- name: PendingReceiptInsert :one
INSERT INTO pending_receipts (receipt_id, body) VALUES (@receipt_id, @body) RETURNING id;

-- name: PendingEventList :many
SELECT id FROM pending_events ORDER BY id LIMIT @max;

-- The pending events with these ids, copied into the log numbered from
-- first in the order they were appended.
-- name: PendingEventPlace :exec
INSERT INTO events (sequence, timestamp_ms, kind, actor, title, data, operation_id)
SELECT CAST(@first AS INTEGER) - 1 + row_number() OVER (ORDER BY id), timestamp_ms, kind, actor, title, data, operation_id
FROM pending_events WHERE id IN (SELECT value FROM json_each(CAST(@ids AS TEXT)));

-- name: PendingReceiptList :many
SELECT id, body FROM pending_receipts ORDER BY id LIMIT @max;

-- name: PendingEventLeft :many
SELECT id FROM pending_events WHERE id IN (SELECT value FROM json_each(CAST(@ids AS TEXT)));

-- name: PendingReceiptLeft :many
SELECT id FROM pending_receipts WHERE id IN (SELECT value FROM json_each(CAST(@ids AS TEXT)));

-- name: PendingEventDelete :exec
DELETE FROM pending_events WHERE id IN (SELECT value FROM json_each(CAST(@ids AS TEXT)));

-- name: PendingReceiptDelete :exec
DELETE FROM pending_receipts WHERE id IN (SELECT value FROM json_each(CAST(@ids AS TEXT)));
