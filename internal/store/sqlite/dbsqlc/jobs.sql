-- A job row is read with its document's assignment and version and its
-- retained publication outcome (JobRow in the backend). SQLite's one
-- writer excludes every other, so no read locks and a claim never meets a
-- row another transaction holds.

-- name: BatchInsert :exec
INSERT INTO batches (idempotency_key, request_sha256, document, created_at_ms)
VALUES (@idempotency_key, @request_sha256, @document, @created_at_ms);

-- name: BatchGet :one
SELECT * FROM batches WHERE idempotency_key = @idempotency_key;

-- name: JobMaxPosition :one
SELECT CAST(COALESCE(MAX(position), 0) AS INTEGER) FROM jobs;

-- A job waiting for others (waiting_on > 0) is blocked, else queued.
-- name: JobInsert :exec
INSERT INTO jobs (operation_id, position, batch_key, section, document_id, input_sha256, state,
    created_at_ms, updated_at_ms, claimable_at_ms, max_attempts, backoff_base_ms, backoff_cap_ms, expected_sha256, priority, tenant,
    waiting_on, dependents)
VALUES (@operation_id, @position, @batch_key, @section, @document_id, @input_sha256, CASE WHEN @waiting_on > 0 THEN 'blocked' ELSE 'queued' END,
    @created_at_ms, @updated_at_ms, @claimable_at_ms, @max_attempts, @backoff_base_ms, @backoff_cap_ms, @expected_sha256, @priority, @tenant,
    @waiting_on, @dependents);

-- A report's jobs, one statement: dbutil.JobRows, a JSON array of each
-- job's fields in its order (an array reads faster than an object here).
-- name: JobInsertMany :exec
INSERT INTO jobs (operation_id, position, batch_key, section, document_id, input_sha256, state,
    created_at_ms, updated_at_ms, claimable_at_ms, max_attempts, backoff_base_ms, backoff_cap_ms, expected_sha256, priority, tenant,
    waiting_on, dependents)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
    json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'),
    CASE WHEN json_extract(value, '$[13]') > 0 THEN 'blocked' ELSE 'queued' END,
    json_extract(value, '$[6]'), json_extract(value, '$[6]'), json_extract(value, '$[6]'),
    json_extract(value, '$[7]'), json_extract(value, '$[8]'), json_extract(value, '$[9]'),
    json_extract(value, '$[10]'), json_extract(value, '$[11]'), json_extract(value, '$[12]'),
    json_extract(value, '$[13]'), json_extract(value, '$[14]')
FROM jsonb_each(CAST(@jobs AS TEXT));

-- name: JobDependencyInsertMany :exec
INSERT INTO job_dependencies (operation_id, depends_on)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM jsonb_each(CAST(@deps AS TEXT));

-- A job's dependencies, by operation id.
-- name: JobDependencyList :many
SELECT depends_on FROM job_dependencies WHERE operation_id = @operation_id ORDER BY depends_on;

-- One dependency fewer for each blocked job waiting for depends_on (which
-- has just completed); those left waiting for none come back.
-- name: JobReleaseDependents :many
UPDATE jobs SET waiting_on = waiting_on - 1, updated_at_ms = @updated_at_ms
WHERE state = 'blocked' AND waiting_on > 0
    AND operation_id IN (SELECT operation_id FROM job_dependencies WHERE depends_on = @depends_on)
RETURNING operation_id, waiting_on;

-- name: JobUnblock :execrows
UPDATE jobs SET state = 'queued', input_sha256 = @input_sha256, expected_sha256 = @expected_sha256, after_json = @after_json,
    claimable_at_ms = @updated_at_ms, updated_at_ms = @updated_at_ms
WHERE operation_id = @operation_id AND state = 'blocked' AND waiting_on = 0;

-- name: JobGet :one
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.operation_id = @operation_id;

-- A batch's jobs in one statement, each as JobGet reads it.
-- name: JobGetMany :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.operation_id IN (sqlc.slice('operation_ids'))
ORDER BY j.operation_id;

-- The jobs of a claim move to claimed in one statement; each claim id is
-- the claim's prefix and the job's position. They are the first claimable
-- by priority, then in the order they became claimable: SQLite reads the
-- IN list's priorities in order, one short range of jobs_claimable each,
-- with no sort, so jobs of a priority waiting out a backoff are never
-- read (EXPLAIN QUERY PLAN: SEARCH USING INDEX jobs_claimable (state=?
-- AND priority=? AND claimable_at_ms<?)). The documents and their
-- assignments follow in one statement each (DocumentAssignMany,
-- AssignmentInsertMany).
-- RETURNING names the job's columns in the table's order (sqlc reads
-- RETURNING * with more after it wrongly here), so the row leads with the job's
-- (dbutil.Leading), then the batch's document.
-- name: JobClaimMany :many
UPDATE jobs SET state = 'claimed', claim_id = CAST(@claim_prefix AS TEXT) || position,
    worker = @worker, claim_host = @claim_host, lease_expires_at_ms = @lease_expires_at_ms, reason = '',
    claimed_at_ms = @updated_at_ms, started_at_ms = 0, finished_at_ms = 0, updated_at_ms = @updated_at_ms
WHERE operation_id IN (SELECT q.operation_id FROM jobs q
    WHERE q.state = 'queued' AND q.tenant = @tenant AND q.priority IN (1, 2, 3, 4) AND q.claimable_at_ms <= @claimable_by_ms
        AND NOT (CAST(@unless_paused AS INTEGER) AND EXISTS (
            SELECT 1 FROM settings s WHERE s.name = 'claims' AND json_extract(s.value, '$.paused') = 1))
    ORDER BY q.priority, q.claimable_at_ms, q.position LIMIT @max)
RETURNING operation_id, position, batch_key, section, document_id, input_sha256, state, claim_id, worker, lease_expires_at_ms, reserved, admission_claim_id, admission, reason, created_at_ms, updated_at_ms, claim_host, reserve_shard, attempts, max_attempts, backoff_base_ms, backoff_cap_ms, claimable_at_ms, last_error, expected_sha256, claimed_at_ms, started_at_ms, finished_at_ms, priority, tenant, tenant_shard, reserve_credential, waiting_on, dependents, after_json,
    (SELECT b.document FROM batches b WHERE b.idempotency_key = jobs.batch_key) AS batch_document;

-- JobClaimMany's pick, for a claim that admits: the jobs read, not
-- written (JobClaimWrite writes each once, admitted); those this
-- transaction picked before are still queued, so they are passed over by
-- name.
-- name: JobPickMany :many
SELECT j.*, (SELECT b.document FROM batches b WHERE b.idempotency_key = j.batch_key) AS batch_document
FROM jobs j
WHERE j.state = 'queued' AND j.tenant = @tenant AND j.priority IN (1, 2, 3, 4) AND j.claimable_at_ms <= @claimable_by_ms
    AND j.operation_id NOT IN (SELECT value FROM json_each(CAST(@exclude AS TEXT)))
    AND NOT (CAST(@unless_paused AS INTEGER) AND EXISTS (
        SELECT 1 FROM settings s WHERE s.name = 'claims' AND json_extract(s.value, '$.paused') = 1))
ORDER BY j.priority, j.claimable_at_ms, j.position LIMIT @max;

-- A job JobPickMany picked, written as the transaction left it (claimed,
-- and admitted or refused), if it is still queued.
-- name: JobClaimWrite :execrows
UPDATE jobs SET state = @state, claim_id = @claim_id, worker = @worker, claim_host = @claim_host,
    lease_expires_at_ms = @lease_expires_at_ms, reason = @reason, claimed_at_ms = @claimed_at_ms, started_at_ms = @started_at_ms,
    finished_at_ms = @finished_at_ms, reserved = @reserved, reserve_shard = @reserve_shard, tenant_shard = @tenant_shard,
    reserve_credential = @reserve_credential, admission_claim_id = @admission_claim_id, admission = @admission, updated_at_ms = @updated_at_ms
WHERE operation_id = @operation_id AND state = 'queued';

-- The named transitions: each is guarded by the state (and claim) its
-- caller read, and the caller checks that it changed one row.

-- name: JobSetRunning :execrows
UPDATE jobs SET state = 'running', started_at_ms = @updated_at_ms, reserved = @reserved, reserve_shard = @reserve_shard, tenant_shard = @tenant_shard, reserve_credential = @reserve_credential,
    admission_claim_id = claim_id, admission = @admission, lease_expires_at_ms = @lease_expires_at_ms,
    reason = @reason, updated_at_ms = @updated_at_ms
WHERE operation_id = @operation_id AND state = 'claimed' AND claim_id = @if_claim_id;

-- name: JobSetRefused :execrows
UPDATE jobs SET state = 'refused', finished_at_ms = @updated_at_ms, reserved = 0, reserve_shard = -1, tenant_shard = -1, reserve_credential = '',
    admission_claim_id = claim_id, admission = @admission, reason = @reason, updated_at_ms = @updated_at_ms
WHERE operation_id = @operation_id AND state = 'claimed' AND claim_id = @if_claim_id;

-- name: JobRenewLease :execrows
UPDATE jobs SET lease_expires_at_ms = @lease_expires_at_ms, updated_at_ms = @updated_at_ms
WHERE operation_id = @operation_id AND state IN ('claimed', 'running') AND claim_id = @if_claim_id;

-- name: JobComplete :execrows
UPDATE jobs SET state = 'completed', finished_at_ms = @updated_at_ms, reserved = 0, reserve_shard = -1, tenant_shard = -1, reserve_credential = '', reason = @reason, updated_at_ms = @updated_at_ms
WHERE operation_id = @operation_id AND state = @if_state;

-- name: JobRequeue :execrows
UPDATE jobs SET state = 'queued', claim_id = '', claim_host = '', lease_expires_at_ms = 0,
    claimed_at_ms = 0, started_at_ms = 0, finished_at_ms = 0,
    reserved = 0, reserve_shard = -1, tenant_shard = -1, reserve_credential = '', admission_claim_id = '', admission = '', worker = @worker,
    attempts = @attempts, claimable_at_ms = @claimable_at_ms, last_error = @last_error,
    reason = @reason, updated_at_ms = @updated_at_ms
WHERE operation_id = @operation_id AND state = @if_state;

-- name: JobFail :execrows
UPDATE jobs SET state = 'failed', finished_at_ms = @updated_at_ms, claim_id = '', claim_host = '', lease_expires_at_ms = 0,
    reserved = 0, reserve_shard = -1, tenant_shard = -1, reserve_credential = '', attempts = @attempts, last_error = @last_error,
    reason = @reason, updated_at_ms = @updated_at_ms
WHERE operation_id = @operation_id AND state = @if_state;

-- name: JobSetUnresolved :execrows
UPDATE jobs SET state = 'unresolved', reason = @reason, updated_at_ms = @updated_at_ms
WHERE operation_id = @operation_id AND state = 'running';

-- name: JobCancel :execrows
UPDATE jobs SET state = @to_state, finished_at_ms = @updated_at_ms, claim_host = '', lease_expires_at_ms = 0, reserved = 0, reserve_shard = -1, tenant_shard = -1, reserve_credential = '',
    reason = @reason, updated_at_ms = @updated_at_ms
WHERE operation_id = @operation_id AND state = @if_state;

-- name: JobList :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
ORDER BY j.position;

-- name: JobListByBatch :many
SELECT operation_id FROM jobs WHERE batch_key = @batch_key ORDER BY position;

-- name: JobListExpired :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.state IN ('claimed', 'running') AND j.lease_expires_at_ms < @now_ms
ORDER BY j.position;

-- The host ids are a JSON array.
-- name: JobListClaimedBy :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.state = 'claimed' AND j.claim_host IN (SELECT value FROM json_each(CAST(@host_ids AS TEXT)))
ORDER BY j.position;

-- A keyed claim's jobs its worker still holds: claimed, or decided by
-- the claim's admission (a claim that admits) and not yet finished.
-- name: JobListClaimedUnder :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, b.document AS batch_document
FROM jobs j JOIN documents d ON d.id = j.document_id JOIN batches b ON b.idempotency_key = j.batch_key
WHERE d.owner = @worker AND j.worker = @worker AND (j.state = 'claimed' OR j.state IN ('running', 'refused', 'unresolved') AND j.admission_claim_id = j.claim_id)
    AND substr(j.claim_id, 1, length(CAST(@prefix AS TEXT))) = CAST(@prefix AS TEXT)
ORDER BY j.position;

-- name: JobPending :one
SELECT EXISTS (SELECT 1 FROM jobs WHERE state IN ('queued', 'claimed', 'running'));

-- The jobs in one state, counted where jobs_by_state holds them. The
-- executor counts each state but completed, the state a fleet's history
-- grows in, so in one read transaction (one snapshot) and takes the
-- completed jobs as the rest of those enqueued: positions run from 1
-- without a gap (numbered by the one writer), so JobMaxPosition is how
-- many there are. A count reads the jobs not completed, not every job the
-- fleet has run; the sampler counts once a second. One statement a state
-- reads each state's range of the index alone, where one statement for
-- them all (IN, GROUP BY) took twice as long at 100,000 queued jobs.
-- name: JobCountInState :one
SELECT COUNT(*) FROM jobs WHERE state = @state;

-- The tenants with queued jobs, in name order: a seek of jobs_claimable
-- per tenant (a loose index scan), however many jobs each has.
-- name: JobTenantsQueued :many
WITH RECURSIVE t(tenant) AS (
    SELECT (SELECT MIN(j.tenant) FROM jobs j WHERE j.state = 'queued')
    UNION ALL
    SELECT (SELECT MIN(j.tenant) FROM jobs j WHERE j.state = 'queued' AND j.tenant > t.tenant) FROM t WHERE t.tenant IS NOT NULL
)
SELECT CAST(tenant AS TEXT) AS tenant FROM t WHERE tenant IS NOT NULL;

-- The tenant of a document's job (one job a document).
-- name: JobTenantOfDocument :one
SELECT tenant FROM jobs WHERE document_id = @document_id;

-- The jobs claimed or running, by tenant, from jobs_claimable alone.
-- name: JobInFlightByTenant :many
SELECT tenant, COUNT(*) AS jobs FROM jobs WHERE state IN ('claimed', 'running') GROUP BY tenant;

-- name: JobCountByTenant :many
SELECT tenant, state, COUNT(*) AS jobs FROM jobs GROUP BY tenant, state;

-- What each worker that has held a job is doing: the jobs it holds, those
-- it completed and failed since a time, and when it last moved one (a
-- claim, dispatch, heartbeat or publication updates the job). It reads
-- every job: an operator's view, not a hot path.
-- name: WorkerActivity :many
SELECT worker,
    CAST(SUM(CASE WHEN state IN ('claimed', 'running') THEN 1 ELSE 0 END) AS INTEGER) AS held,
    CAST(SUM(CASE WHEN state = 'completed' AND finished_at_ms >= @since_ms THEN 1 ELSE 0 END) AS INTEGER) AS completed,
    CAST(SUM(CASE WHEN state = 'failed' AND finished_at_ms >= @since_ms THEN 1 ELSE 0 END) AS INTEGER) AS failed,
    CAST(MAX(updated_at_ms) AS INTEGER) AS last_seen_ms
FROM jobs WHERE worker <> '' GROUP BY worker ORDER BY worker;

-- Pages: one query per filter an index serves (state, section, owner),
-- and one for any mix of filters and a search by operation id prefix,
-- which scans in queue order. The prefix is compared byte for byte (LIKE
-- ignores case here).

-- name: JobPage :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.position > @after ORDER BY j.position LIMIT @max;

-- name: JobPageByState :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.state = @state AND j.position > @after ORDER BY j.position LIMIT @max;

-- name: JobPageBySection :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.section = @section AND j.position > @after ORDER BY j.position LIMIT @max;

-- name: JobPageByOwner :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE d.owner = @owner AND j.position > @after ORDER BY j.position LIMIT @max;

-- name: JobPageFiltered :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.position > @after
    AND (CAST(@state AS TEXT) = '' OR j.state = @state)
    AND (CAST(@section AS TEXT) = '' OR j.section = @section)
    AND (CAST(@owner AS TEXT) = '' OR d.owner = @owner)
    AND (CAST(@priority AS INTEGER) = 0 OR j.priority = @priority)
    AND (CAST(@tenant AS TEXT) = '' OR j.tenant = @tenant)
    AND substr(j.operation_id, 1, length(CAST(@prefix AS TEXT))) = CAST(@prefix AS TEXT)
ORDER BY j.position LIMIT @max;

-- name: AttemptInsert :exec
INSERT INTO job_attempts (operation_id, attempt, claim_id, worker, generation, reason, retryable, outcome, cost, answer, at_ms)
VALUES (@operation_id, @attempt, @claim_id, @worker, @generation, @reason, @retryable, @outcome, @cost, @answer, @at_ms);

-- name: AttemptList :many
SELECT * FROM job_attempts WHERE operation_id = @operation_id ORDER BY attempt;
