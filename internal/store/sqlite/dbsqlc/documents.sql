-- name: DocumentInsert :exec
INSERT INTO documents (id, version, body, owner, generation, updated_at_ms)
VALUES (@id, 0, 'null', '', 0, @updated_at_ms);

-- name: DocumentGet :one
SELECT id, version, generation, owner, body FROM documents WHERE id = @id;

-- if_generation -1 assigns whatever the generation.
-- name: DocumentAssign :one
UPDATE documents SET owner = @owner, generation = generation + 1, updated_at_ms = @updated_at_ms
WHERE id = @id AND (CAST(@if_generation AS INTEGER) < 0 OR generation = @if_generation) RETURNING generation;

-- A claim's documents, all at once: the ids are a JSON array.
-- Documents for a report's jobs, one statement: ids a JSON array.
-- name: DocumentInsertMany :exec
INSERT INTO documents (id, version, body, owner, generation, updated_at_ms)
SELECT value, 0, 'null', '', 0, @updated_at_ms FROM json_each(CAST(@ids AS TEXT));

-- name: DocumentAssignMany :many
UPDATE documents SET owner = @owner, generation = generation + 1, updated_at_ms = @updated_at_ms
WHERE id IN (SELECT value FROM json_each(CAST(@ids AS TEXT)))
RETURNING id, generation, version;

-- name: DocumentWrite :exec
UPDATE documents SET body = @body, version = @version, updated_at_ms = @updated_at_ms WHERE id = @id;

-- name: AssignmentInsert :exec
INSERT INTO assignments (document_id, generation, owner, reason, at_ms)
VALUES (@document_id, @generation, @owner, @reason, @at_ms);

-- Records the assignments of a claim's documents as they now stand.
-- name: AssignmentInsertMany :exec
INSERT INTO assignments (document_id, generation, owner, reason, at_ms)
SELECT id, generation, owner, @reason, @at_ms FROM documents
WHERE id IN (SELECT value FROM json_each(CAST(@ids AS TEXT)));

-- name: AssignmentList :many
SELECT * FROM assignments WHERE document_id = @document_id ORDER BY generation;

-- name: MutationInsert :exec
INSERT INTO mutations (document_id, version, operation_key, caller, at_ms)
VALUES (@document_id, @version, @operation_key, @caller, @at_ms);

-- A batch's mutations, one row per JSON array element.
-- name: MutationInsertMany :exec
INSERT INTO mutations (document_id, version, operation_key, caller, at_ms)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
    json_extract(value, '$[3]'), json_extract(value, '$[4]')
FROM jsonb_each(CAST(@rows AS TEXT));

-- name: MutationList :many
SELECT * FROM mutations WHERE document_id = @document_id ORDER BY version;

-- name: MutationCount :one
SELECT COUNT(*) FROM mutations WHERE document_id = @document_id;

-- name: MutationTotal :one
SELECT COUNT(*) FROM mutations;

-- name: MutationCountByDocument :many
SELECT document_id, COUNT(*) AS mutations FROM mutations GROUP BY document_id;

-- name: MutationRepeatedOperations :one
SELECT COUNT(*) FROM (SELECT 1 FROM mutations GROUP BY document_id, operation_key HAVING COUNT(*) > 1) AS dup;

-- name: OperationGet :one
SELECT * FROM operations WHERE document_id = @document_id AND operation_key = @operation_key;

-- The retained operations of a batch's documents under its keys: a
-- superset of its (document, key) pairs, which the caller matches.
-- name: OperationGetMany :many
SELECT * FROM operations WHERE document_id IN (sqlc.slice('document_ids')) AND operation_key IN (sqlc.slice('operation_keys'));

-- name: OperationCountDelivery :exec
UPDATE operations SET deliveries = deliveries + 1 WHERE document_id = @document_id AND operation_key = @operation_key;

-- name: OperationInsert :exec
INSERT INTO operations (document_id, operation_key, binding, caller, status, outcome, deliveries, created_at_ms)
VALUES (@document_id, @operation_key, @binding, @caller, @status, @outcome, @deliveries, @created_at_ms);

-- A batch's operation records, one row per JSON array element.
-- name: OperationInsertMany :exec
INSERT INTO operations (document_id, operation_key, binding, caller, status, outcome, deliveries, created_at_ms)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
    json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'),
    json_extract(value, '$[6]'), json_extract(value, '$[7]')
FROM jsonb_each(CAST(@rows AS TEXT));

-- name: OperationList :many
SELECT * FROM operations WHERE document_id = @document_id ORDER BY created_at_ms, operation_key;
