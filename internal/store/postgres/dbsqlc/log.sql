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

-- A transaction's events and receipts for the sequencer, one row (sent
-- with its COMMIT), returning its id. An empty log writes no row.
-- name: PendingLogInsert :many
INSERT INTO pending_log (events, receipts, timestamps, kinds, actors, titles, data, operation_ids, bodies)
SELECT cardinality(sqlc.arg('timestamps')::bigint[]), cardinality(sqlc.arg('bodies')::text[]), sqlc.arg('timestamps')::bigint[],
    sqlc.arg('kinds')::text[], sqlc.arg('actors')::text[], sqlc.arg('titles')::text[], sqlc.arg('data')::text[],
    sqlc.arg('operation_ids')::text[], sqlc.arg('bodies')::text[]
WHERE cardinality(sqlc.arg('timestamps')::bigint[]) + cardinality(sqlc.arg('bodies')::text[]) > 0
RETURNING id;

-- The rows holding the oldest max pending events and max pending
-- receipts, each with how many of its events and receipts past those
-- placed are taken (the rest wait for the next round), then the placed
-- log heads, in one statement. Only the receipts travel: the host seals
-- them. The events stay where they are until PendingLogPlace copies them
-- into the log, so a round neither reads them out nor sends them back. A
-- row's receipts are read only if it is taken, and sliced where they are
-- used: a subscript would unpack an array stored compressed once an
-- element.
-- name: PendingLogList :many
WITH l AS (
    SELECT id, events - events_placed AS events_left, receipts - receipts_placed AS receipts_left, events_placed, receipts_placed, bodies
    FROM pending_log ORDER BY id LIMIT sqlc.arg('max')
), p AS (
    SELECT l.*, sum(events_left) OVER w - events_left AS events_before, sum(receipts_left) OVER w - receipts_left AS receipts_before
    FROM l WINDOW w AS (ORDER BY id)
)
SELECT 'p'::text AS tag, p.id, p.events_placed::bigint AS events_placed,
    LEAST(p.events_left, GREATEST(sqlc.arg('max') - p.events_before, 0))::bigint AS events_taken,
    p.receipts_placed::bigint AS receipts_placed, LEAST(p.receipts_left, GREATEST(sqlc.arg('max') - p.receipts_before, 0))::bigint AS receipts_taken,
    ''::text AS head_id, p.bodies
FROM p
WHERE p.events_before < sqlc.arg('max') OR p.receipts_before < sqlc.arg('max')
UNION ALL
SELECT 'h'::text, COALESCE((SELECT sequence FROM events ORDER BY sequence DESC LIMIT 1), 0)::bigint, 0::bigint, 0::bigint,
    COALESCE((SELECT sequence FROM receipts ORDER BY sequence DESC LIMIT 1), 0)::bigint, 0::bigint,
    COALESCE((SELECT id FROM receipts ORDER BY sequence DESC LIMIT 1), '')::text,
    '{}'::text[];

-- A round that knows what is pending, because its own process's last
-- round left the log and nothing has been placed since, places it without
-- listing it (sequencer.go). These two statements are its guards, sent
-- with its placement and commit in one round trip: each fails the
-- transaction unless what the round assumed holds. The log lock first, in
-- a statement of its own, so that the second one's snapshot is taken
-- after the lock is held.
-- name: PendingLogLockOrFail :exec
SELECT fleet_guard(pg_try_advisory_xact_lock(hashtext(current_schema() || '/log'))::int, 'the log lock');

-- The placed log still ends where the round's process last left it,
-- each of the rows is wholly pending (none of its entries placed, and as
-- many as the round places), and no other row is pending before the last
-- of them: a transaction that read another's writes commits after it, so
-- its row comes after the other's, and its entries are placed no sooner.
-- name: PendingLogExpect :exec
WITH u AS MATERIALIZED (
    SELECT unnest(sqlc.arg('rows')::bigint[]) AS id, unnest(sqlc.arg('events')::int[]) AS events,
        unnest(sqlc.arg('receipts')::int[]) AS receipts
)
SELECT fleet_guard(CASE WHEN
    COALESCE((SELECT sequence FROM events ORDER BY sequence DESC LIMIT 1), 0) = sqlc.arg('last_event')::bigint
    AND COALESCE((SELECT sequence FROM receipts ORDER BY sequence DESC LIMIT 1), 0) = sqlc.arg('last_receipt')::bigint
    AND COALESCE((SELECT id FROM receipts ORDER BY sequence DESC LIMIT 1), '') = sqlc.arg('last_receipt_id')::text
    AND (SELECT COUNT(*) FROM pending_log r JOIN u ON u.id = r.id
        WHERE r.id = ANY(sqlc.arg('rows')::bigint[]) AND r.events_placed = 0 AND r.receipts_placed = 0
            AND r.events = u.events AND r.receipts = u.receipts) = cardinality(sqlc.arg('rows')::bigint[])
    AND NOT EXISTS (SELECT 1 FROM pending_log o
        WHERE o.id < (SELECT max(x) FROM unnest(sqlc.arg('rows')::bigint[]) AS x) AND o.id <> ALL(sqlc.arg('rows')::bigint[]))
    THEN 1 ELSE 0 END, 'PendingLogExpect');

-- Which of the given pending ids (row << 20 | place) are still pending,
-- and the placed receipts among receipt_ids, in one statement. The rows
-- are also matched by = ANY(…) of their keys, so that the generic plan it
-- runs with (postgres/plans.go) reads them by key.
-- name: PendingLogLeft :many
SELECT 'e'::text AS tag, i.id::bigint AS id, ''::text AS body FROM unnest(sqlc.arg('events')::bigint[]) AS i(id)
    JOIN pending_log r ON r.id = i.id >> 20 AND (i.id & 1048575) > r.events_placed
    WHERE r.id = ANY(ARRAY(SELECT e >> 20 FROM unnest(sqlc.arg('events')::bigint[]) AS e))
UNION ALL
SELECT 'r'::text, i.id::bigint, '' FROM unnest(sqlc.arg('receipts')::bigint[]) AS i(id)
    JOIN pending_log r ON r.id = i.id >> 20 AND (i.id & 1048575) > r.receipts_placed
    WHERE r.id = ANY(ARRAY(SELECT e >> 20 FROM unnest(sqlc.arg('receipts')::bigint[]) AS e))
UNION ALL
SELECT 'p'::text, sequence, body FROM receipts WHERE id = ANY(sqlc.arg('receipt_ids')::text[]);

-- A sequencer round writes in one statement: the placed events, copied
-- from their pending rows (each row's events up to events_upto, numbered
-- from first_event in the order they were appended), the sealed
-- receipts, the pending rows they were counted placed up to the last of
-- each placed (deleted once all their entries are; found by key, = ANY,
-- as the rows a round took are few), and every host sequencer told at
-- commit. Every part reads the rows as they were before the statement.
-- name: PendingLogPlace :exec
WITH u AS (
    SELECT unnest(sqlc.arg('rows')::bigint[]) AS id, unnest(sqlc.arg('events_upto')::int[]) AS events_upto,
        unnest(sqlc.arg('receipts_upto')::int[]) AS receipts_upto
), e AS (
    INSERT INTO events (sequence, timestamp_ms, kind, actor, title, data, operation_id)
    SELECT sqlc.arg('first_event')::bigint - 1 + row_number() OVER (ORDER BY r.id, x.n), x.timestamp_ms, x.kind, x.actor, x.title, x.data, x.operation_id
    FROM pending_log r JOIN u ON u.id = r.id AND u.events_upto > r.events_placed
    CROSS JOIN LATERAL (SELECT generate_series(r.events_placed + 1, u.events_upto) AS n,
        unnest(r.timestamps[r.events_placed + 1 : u.events_upto]::bigint[]) AS timestamp_ms, unnest(r.kinds[r.events_placed + 1 : u.events_upto]::text[]) AS kind,
        unnest(r.actors[r.events_placed + 1 : u.events_upto]::text[]) AS actor, unnest(r.titles[r.events_placed + 1 : u.events_upto]::text[]) AS title,
        unnest(r.data[r.events_placed + 1 : u.events_upto]::text[]) AS data, unnest(r.operation_ids[r.events_placed + 1 : u.events_upto]::text[]) AS operation_id) x
    WHERE r.id = ANY(sqlc.arg('rows')::bigint[])
), r AS (
    INSERT INTO receipts (sequence, id, kind, operation_id, body)
    SELECT unnest(sqlc.arg('receipt_sequences')::bigint[]), unnest(sqlc.arg('receipt_ids')::text[]), unnest(sqlc.arg('receipt_kinds')::text[]), unnest(sqlc.arg('receipt_operation_ids')::text[]), unnest(sqlc.arg('receipt_bodies')::text[])
), deleted AS (
    DELETE FROM pending_log r
    USING u
    WHERE r.id = ANY(sqlc.arg('rows')::bigint[]) AND r.id = u.id
        AND GREATEST(r.events_placed, u.events_upto) = r.events AND GREATEST(r.receipts_placed, u.receipts_upto) = r.receipts
), counted AS (
    UPDATE pending_log r SET events_placed = GREATEST(r.events_placed, u.events_upto), receipts_placed = GREATEST(r.receipts_placed, u.receipts_upto)
    FROM u
    WHERE r.id = ANY(sqlc.arg('rows')::bigint[]) AND r.id = u.id
        AND NOT (GREATEST(r.events_placed, u.events_upto) = r.events AND GREATEST(r.receipts_placed, u.receipts_upto) = r.receipts)
)
SELECT pg_notify(sqlc.arg('channel')::text, sqlc.arg('instance')::text);
