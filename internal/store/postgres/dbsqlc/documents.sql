-- Documents for a report's jobs, one statement.
-- name: DocumentInsertMany :exec
INSERT INTO documents (id, version, body, owner, generation, updated_at_ms)
SELECT id, 0, 'null', '', 0, sqlc.arg('updated_at_ms') FROM unnest(sqlc.arg('ids')::text[]) AS id;

-- name: DocumentInsert :exec
INSERT INTO documents (id, version, body, owner, generation, updated_at_ms)
VALUES (sqlc.arg('id'), 0, 'null', '', 0, sqlc.arg('updated_at_ms'));

-- name: DocumentGet :one
SELECT id, version, generation, owner, body FROM documents WHERE id = sqlc.arg('id');

-- name: DocumentGetForUpdate :one
SELECT id, version, generation, owner, body FROM documents WHERE id = sqlc.arg('id') FOR UPDATE;

-- An assignment and its record, in one statement; if_generation -1
-- assigns whatever the generation.
-- name: DocumentAssign :many
WITH assigned AS (
    UPDATE documents SET owner = sqlc.arg('owner'), generation = generation + 1, updated_at_ms = sqlc.arg('at_ms')
    WHERE id = sqlc.arg('id') AND (sqlc.arg('if_generation')::bigint < 0 OR generation = sqlc.arg('if_generation')::bigint)
    RETURNING id, generation, owner
), recorded AS (
    INSERT INTO assignments (document_id, generation, owner, reason, at_ms)
    SELECT id, generation, owner, sqlc.arg('reason'), sqlc.arg('at_ms') FROM assigned
)
SELECT generation FROM assigned;

-- name: DocumentWrite :exec
UPDATE documents SET body = sqlc.arg('body'), version = sqlc.arg('version'), updated_at_ms = sqlc.arg('updated_at_ms') WHERE id = sqlc.arg('id');

-- A batch's document writes; id = ANY(…) reads the documents by their key
-- in any plan (postgres/plans.go).
-- name: DocumentWriteMany :exec
WITH w AS MATERIALIZED (
    SELECT unnest(sqlc.arg('ids')::text[]) AS id, unnest(sqlc.arg('bodies')::text[]) AS body,
        unnest(sqlc.arg('versions')::bigint[]) AS version, unnest(sqlc.arg('updated_at_ms')::bigint[]) AS updated_at_ms
)
UPDATE documents d SET body = w.body, version = w.version, updated_at_ms = w.updated_at_ms
FROM w WHERE d.id = w.id AND d.id = ANY(sqlc.arg('ids')::text[]);

-- name: AssignmentList :many
SELECT * FROM assignments WHERE document_id = sqlc.arg('document_id') ORDER BY generation;

-- name: MutationInsert :exec
INSERT INTO mutations (document_id, version, operation_key, caller, at_ms)
VALUES (sqlc.arg('document_id'), sqlc.arg('version'), sqlc.arg('operation_key'), sqlc.arg('caller'), sqlc.arg('at_ms'));

-- A batch's mutations, a row per array element.
-- name: MutationInsertMany :exec
INSERT INTO mutations (document_id, version, operation_key, caller, at_ms)
SELECT unnest(sqlc.arg('document_ids')::text[]), unnest(sqlc.arg('versions')::bigint[]), unnest(sqlc.arg('operation_keys')::text[]),
    unnest(sqlc.arg('callers')::text[]), unnest(sqlc.arg('at_ms')::bigint[]);

-- name: MutationList :many
SELECT * FROM mutations WHERE document_id = sqlc.arg('document_id') ORDER BY version;

-- name: MutationCount :one
SELECT COUNT(*) FROM mutations WHERE document_id = sqlc.arg('document_id');

-- name: MutationTotal :one
SELECT COUNT(*) FROM mutations;

-- name: MutationCountByDocument :many
SELECT document_id, COUNT(*) AS mutations FROM mutations GROUP BY document_id;

-- name: MutationRepeatedOperations :one
SELECT COUNT(*) FROM (SELECT 1 FROM mutations GROUP BY document_id, operation_key HAVING COUNT(*) > 1) AS dup;

-- name: OperationGet :one
SELECT * FROM operations WHERE document_id = sqlc.arg('document_id') AND operation_key = sqlc.arg('operation_key');

-- The retained operations of a batch's (document, key) pairs.
-- Matched by document_id = ANY as well, so that its generic plan reads
-- operations by key whatever their number when it was planned.
-- name: OperationGetMany :many
SELECT o.* FROM operations o
WHERE o.document_id = ANY(sqlc.arg('document_ids')::text[]) AND (o.document_id, o.operation_key) IN (
    SELECT unnest(sqlc.arg('document_ids')::text[]), unnest(sqlc.arg('operation_keys')::text[]));

-- name: OperationCountDelivery :exec
UPDATE operations SET deliveries = deliveries + 1 WHERE document_id = sqlc.arg('document_id') AND operation_key = sqlc.arg('operation_key');

-- name: OperationInsert :exec
INSERT INTO operations (document_id, operation_key, binding, caller, status, outcome, deliveries, created_at_ms)
VALUES (sqlc.arg('document_id'), sqlc.arg('operation_key'), sqlc.arg('binding'), sqlc.arg('caller'), sqlc.arg('status'), sqlc.arg('outcome'), sqlc.arg('deliveries'), sqlc.arg('created_at_ms'));

-- A batch's operation records, a row per array element.
-- name: OperationInsertMany :exec
INSERT INTO operations (document_id, operation_key, binding, caller, status, outcome, deliveries, created_at_ms)
SELECT unnest(sqlc.arg('document_ids')::text[]), unnest(sqlc.arg('operation_keys')::text[]), unnest(sqlc.arg('bindings')::text[]),
    unnest(sqlc.arg('callers')::text[]), unnest(sqlc.arg('statuses')::text[]), unnest(sqlc.arg('outcomes')::text[]),
    unnest(sqlc.arg('deliveries')::bigint[]), unnest(sqlc.arg('created_at_ms')::bigint[]);

-- name: OperationList :many
SELECT * FROM operations WHERE document_id = sqlc.arg('document_id') ORDER BY created_at_ms, operation_key;
