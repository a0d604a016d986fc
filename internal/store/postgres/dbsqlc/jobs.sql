-- A job row is read with its document assignment and version and its
-- retained publication outcome (JobRow in the backend). Several hosts
-- write at once, so a read a write will follow locks the job and its
-- document together (FOR UPDATE OF j, d) and claims and sweeps pass over
-- rows another transaction holds (SKIP LOCKED).

-- name: BatchInsert :exec
INSERT INTO batches (idempotency_key, request_sha256, document, created_at_ms)
VALUES (sqlc.arg('idempotency_key'), sqlc.arg('request_sha256'), sqlc.arg('document'), sqlc.arg('created_at_ms'));

-- name: BatchGet :one
SELECT * FROM batches WHERE idempotency_key = sqlc.arg('idempotency_key');

-- name: JobMaxPosition :one
SELECT COALESCE(MAX(position), 0)::bigint FROM job_keys;

-- A report's jobs, one statement: dbutil.JobRows, a JSON array of each
-- job's fields in its order. Each job's keys (job_keys) go in with it.
-- A job waiting for others (waiting_on > 0) is blocked, else queued.
-- name: JobInsertMany :exec
WITH keys AS (
    INSERT INTO job_keys (position, operation_id, document_id, section, tenant, priority)
    SELECT (j->>1)::bigint, j->>0, j->>4, j->>3, j->>12, (j->>11)::bigint FROM jsonb_array_elements(sqlc.arg('jobs')::jsonb) AS j
)
INSERT INTO jobs (operation_id, position, batch_key, section, document_id, input_sha256, state,
    created_at_ms, updated_at_ms, claimable_at_ms, max_attempts, backoff_base_ms, backoff_cap_ms, expected_sha256, priority, tenant,
    waiting_on, dependents)
SELECT j->>0, (j->>1)::bigint, j->>2, j->>3, j->>4, j->>5, CASE WHEN (j->>13)::bigint > 0 THEN 'blocked' ELSE 'queued' END,
    (j->>6)::bigint, (j->>6)::bigint, (j->>6)::bigint, (j->>7)::bigint, (j->>8)::bigint, (j->>9)::bigint, j->>10, (j->>11)::bigint, j->>12,
    (j->>13)::bigint, (j->>14)::bigint
FROM jsonb_array_elements(sqlc.arg('jobs')::jsonb) AS j;

-- name: JobInsert :exec
WITH keys AS (
    INSERT INTO job_keys (position, operation_id, document_id, section, tenant, priority)
    VALUES (sqlc.arg('position'), sqlc.arg('operation_id'), sqlc.arg('document_id'), sqlc.arg('section'), sqlc.arg('tenant'), sqlc.arg('priority'))
)
INSERT INTO jobs (operation_id, position, batch_key, section, document_id, input_sha256, state,
    created_at_ms, updated_at_ms, claimable_at_ms, max_attempts, backoff_base_ms, backoff_cap_ms, expected_sha256, priority, tenant,
    waiting_on, dependents)
VALUES (sqlc.arg('operation_id'), sqlc.arg('position'), sqlc.arg('batch_key'), sqlc.arg('section'), sqlc.arg('document_id'), sqlc.arg('input_sha256'),
    CASE WHEN sqlc.arg('waiting_on')::bigint > 0 THEN 'blocked' ELSE 'queued' END,
    sqlc.arg('created_at_ms'), sqlc.arg('created_at_ms'), sqlc.arg('created_at_ms'), sqlc.arg('max_attempts'), sqlc.arg('backoff_base_ms'), sqlc.arg('backoff_cap_ms'), sqlc.arg('expected_sha256'), sqlc.arg('priority'), sqlc.arg('tenant'),
    sqlc.arg('waiting_on')::bigint, sqlc.arg('dependents')::bigint);

-- name: JobDependencyInsertMany :exec
INSERT INTO job_dependencies (operation_id, depends_on)
SELECT d->>0, d->>1 FROM jsonb_array_elements(sqlc.arg('deps')::jsonb) AS d;

-- A job's dependencies, by operation id.
-- name: JobDependencyList :many
SELECT depends_on FROM job_dependencies WHERE operation_id = sqlc.arg('operation_id') ORDER BY depends_on;

-- One dependency fewer for each blocked job waiting for depends_on (which
-- has just completed); those left waiting for none come back. The
-- dependents are locked in operation id order, the order batches take
-- jobs in.
-- name: JobReleaseDependents :many
WITH d AS (
    SELECT j.operation_id FROM jobs j
    WHERE j.operation_id IN (SELECT operation_id FROM job_dependencies WHERE depends_on = sqlc.arg('depends_on'))
        AND j.state = 'blocked' AND j.waiting_on > 0
    ORDER BY j.operation_id FOR UPDATE
)
UPDATE jobs SET waiting_on = jobs.waiting_on - 1, updated_at_ms = sqlc.arg('updated_at_ms')
FROM d WHERE jobs.operation_id = d.operation_id
RETURNING jobs.operation_id, jobs.waiting_on;

-- name: JobUnblock :exec
WITH moved AS (
    UPDATE jobs SET state = 'queued', input_sha256 = sqlc.arg('input_sha256'), expected_sha256 = sqlc.arg('expected_sha256'),
        after_json = sqlc.arg('after_json'), claimable_at_ms = sqlc.arg('updated_at_ms'), updated_at_ms = sqlc.arg('updated_at_ms')
    WHERE operation_id = sqlc.arg('operation_id') AND state = 'blocked' AND waiting_on = 0
    RETURNING 1
)
SELECT fleet_guard((SELECT COUNT(*) FROM moved), 'JobUnblock');

-- name: JobGet :one
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.operation_id = sqlc.arg('operation_id');

-- name: JobGetForUpdate :one
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.operation_id = sqlc.arg('operation_id')
FOR UPDATE OF j, d;

-- A batch's jobs in one statement, locked in operation id order (the
-- order every batch takes them in), then their documents in id order,
-- each as JobGetForUpdate reads it. The documents and operations are
-- looked up by the jobs' document ids as an array, which their indexes
-- answer whatever the planner's statistics: joined, a fresh or small
-- table was scanned whole for every batch.
-- name: JobGetMany :many
WITH j AS (
    SELECT * FROM jobs WHERE operation_id = ANY(sqlc.arg('operation_ids')::text[])
    ORDER BY operation_id FOR UPDATE
), d AS (
    SELECT id, generation, owner, version FROM documents WHERE id = ANY(ARRAY(SELECT document_id FROM j))
    ORDER BY id FOR UPDATE
), o AS (
    SELECT document_id, outcome FROM operations
    WHERE document_id = ANY(ARRAY(SELECT document_id FROM j)) AND status = 'published'
)
SELECT j.*, d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM j JOIN d ON d.id = j.document_id LEFT JOIN o ON o.document_id = j.document_id
ORDER BY j.operation_id;

-- A whole claim in one statement: the jobs to claimed (each claim id is
-- the claim prefix and the job position), their documents to the
-- worker at the next generation, and the assignments recorded. Only the
-- jobs are picked: joined to their documents before the limit, every
-- queued job's document was read for each claim. Their documents are
-- locked as they are updated (a queued job no one holds has a document
-- no one holds). The jobs are the first claimable by priority, then in
-- the order they became claimable: one short range of jobs_claimable per
-- priority, locked as the claim takes them, each range passing locked
-- rows as before (a single scan in priority order would pass every job of
-- a priority waiting out a backoff).
-- With unless_paused the claim takes nothing while claims are paused
-- (store.ClaimsSetting), an uncorrelated test PostgreSQL makes once, before
-- it reads a job: a claim reads the pause without a round trip of its own.
-- name: JobClaimMany :many
WITH picked AS (
    SELECT q.operation_id, q.document_id
    FROM unnest('{1,2,3,4}'::bigint[]) AS p(priority)
    CROSS JOIN LATERAL (
        SELECT j.operation_id, j.document_id FROM jobs j
        WHERE j.state = 'queued' AND j.tenant = sqlc.arg('tenant')::text AND j.priority = p.priority AND j.claimable_at_ms <= sqlc.arg('now_ms')
            AND NOT (sqlc.arg('unless_paused')::boolean AND EXISTS (
                SELECT 1 FROM settings s WHERE s.name = 'claims' AND s.value::jsonb @> '{"paused": true}'))
        ORDER BY j.claimable_at_ms, j.position LIMIT sqlc.arg('max')
        FOR UPDATE OF j SKIP LOCKED
    ) q
    LIMIT sqlc.arg('max')
), claimed AS (
    UPDATE jobs c SET state = 'claimed', claim_id = sqlc.arg('claim_prefix')::text || c.position, worker = sqlc.arg('worker'),
        claim_host = sqlc.arg('claim_host'), lease_expires_at_ms = sqlc.arg('lease_expires_at_ms'), reason = '',
        claimed_at_ms = sqlc.arg('now_ms'), started_at_ms = 0, finished_at_ms = 0, updated_at_ms = sqlc.arg('now_ms')
    FROM picked WHERE c.operation_id = picked.operation_id
    RETURNING c.*
), assigned AS (
    UPDATE documents a SET owner = sqlc.arg('worker'), generation = a.generation + 1, updated_at_ms = sqlc.arg('now_ms')
    FROM picked WHERE a.id = picked.document_id
    RETURNING a.id, a.generation, a.version
), recorded AS (
    INSERT INTO assignments (document_id, generation, owner, reason, at_ms)
    SELECT assigned.id, assigned.generation, sqlc.arg('worker'), 'claim', sqlc.arg('now_ms') FROM assigned
)
SELECT claimed.*, assigned.generation, assigned.version, b.document AS batch_document
FROM claimed JOIN assigned ON assigned.id = claimed.document_id JOIN batches b ON b.idempotency_key = claimed.batch_key;

-- JobClaimMany's pick, for a claim that admits: the jobs locked, their
-- documents assigned and the assignments recorded, the job rows not
-- written (JobClaimWriteMany writes each once, admitted). The jobs this
-- transaction picked before are still queued and its own to lock, so
-- they are passed over by name. A pick for several claims at once names
-- their workers in owners: the slot-th job picked (numbered as the pick
-- yields them, so that nothing is sorted) goes to owners[slot], else (no
-- owners) every one to worker. The documents' update returns the picked
-- jobs with their documents' figures: joined to them afterwards, the
-- picked jobs were read again for each one (a nested loop).
-- name: JobPickMany :many
WITH picked AS (
    SELECT q.*
    FROM unnest('{1,2,3,4}'::bigint[]) AS p(priority)
    CROSS JOIN LATERAL (
        SELECT j.* FROM jobs j
        WHERE j.state = 'queued' AND j.tenant = sqlc.arg('tenant')::text AND j.priority = p.priority AND j.claimable_at_ms <= sqlc.arg('now_ms')
            AND NOT (sqlc.arg('unless_paused')::boolean AND EXISTS (
                SELECT 1 FROM settings s WHERE s.name = 'claims' AND s.value::jsonb @> '{"paused": true}'))
            AND j.operation_id <> ALL (sqlc.arg('exclude')::text[])
        ORDER BY j.claimable_at_ms, j.position LIMIT sqlc.arg('max')
        FOR UPDATE OF j SKIP LOCKED
    ) q
    LIMIT sqlc.arg('max')
), slotted AS (
    SELECT picked.*, row_number() OVER () AS slot FROM picked
), assigned AS (
    UPDATE documents a SET owner = COALESCE((sqlc.arg('owners')::text[])[slotted.slot], sqlc.arg('worker')::text),
        generation = a.generation + 1, updated_at_ms = sqlc.arg('now_ms')
    FROM slotted WHERE a.id = slotted.document_id
    RETURNING slotted.*, a.generation, a.version, a.owner
), recorded AS (
    INSERT INTO assignments (document_id, generation, owner, reason, at_ms)
    SELECT assigned.document_id, assigned.generation, assigned.owner, 'claim', sqlc.arg('now_ms') FROM assigned
)
SELECT assigned.*, b.document AS batch_document
FROM assigned JOIN batches b ON b.idempotency_key = assigned.batch_key;

-- Jobs JobPickMany picked, written once as the transaction left them
-- (claimed, and admitted or refused): every one must still be queued.
-- operation_id = ANY(…), with the join, reads the jobs by their key in any
-- plan, even a generic one made on a young table (postgres/plans.go); so
-- do JobSetRunningMany's and JobCompleteMany's. The state each job must
-- be in comes with the batch's rows (if_state): compared with a constant,
-- it was a filter of the jobs' scan, which the planner then expected to
-- find one job, and read the batch's rows again for each job it found.
-- name: JobClaimWriteMany :exec
WITH d AS MATERIALIZED (
    SELECT unnest(sqlc.arg('operation_ids')::text[]) AS operation_id, unnest(sqlc.arg('states')::text[]) AS state,
        unnest(sqlc.arg('claim_ids')::text[]) AS claim_id, unnest(sqlc.arg('workers')::text[]) AS worker,
        unnest(sqlc.arg('claim_hosts')::text[]) AS claim_host, unnest(sqlc.arg('lease_expires_at_ms')::bigint[]) AS lease_expires_at_ms,
        unnest(sqlc.arg('reasons')::text[]) AS reason, unnest(sqlc.arg('claimed_at_ms')::bigint[]) AS claimed_at_ms,
        unnest(sqlc.arg('started_at_ms')::bigint[]) AS started_at_ms, unnest(sqlc.arg('finished_at_ms')::bigint[]) AS finished_at_ms,
        unnest(sqlc.arg('reserved')::bigint[]) AS reserved, unnest(sqlc.arg('reserve_shards')::bigint[]) AS reserve_shard,
        unnest(sqlc.arg('tenant_shards')::bigint[]) AS tenant_shard, unnest(sqlc.arg('reserve_credentials')::text[]) AS reserve_credential,
        unnest(sqlc.arg('admission_claim_ids')::text[]) AS admission_claim_id, unnest(sqlc.arg('admissions')::text[]) AS admission,
        unnest(sqlc.arg('updated_at_ms')::bigint[]) AS updated_at_ms, 'queued'::text AS if_state
), moved AS (
    UPDATE jobs j SET state = d.state, claim_id = d.claim_id, worker = d.worker, claim_host = d.claim_host,
        lease_expires_at_ms = d.lease_expires_at_ms, reason = d.reason, claimed_at_ms = d.claimed_at_ms, started_at_ms = d.started_at_ms,
        finished_at_ms = d.finished_at_ms, reserved = d.reserved, reserve_shard = d.reserve_shard, tenant_shard = d.tenant_shard,
        reserve_credential = d.reserve_credential, admission_claim_id = d.admission_claim_id, admission = d.admission, updated_at_ms = d.updated_at_ms
    FROM d WHERE j.operation_id = d.operation_id AND j.operation_id = ANY(sqlc.arg('operation_ids')::text[]) AND j.state || '' = d.if_state
    RETURNING 1
)
SELECT fleet_guard(CASE WHEN (SELECT COUNT(*) FROM moved) = cardinality(sqlc.arg('operation_ids')::text[]) THEN 1 ELSE 0 END, 'JobClaimWriteMany');

-- JobClaimWriteMany for one job: a claim of one (a worker's single call)
-- is most claims, and the planner plans the array form afresh for each
-- execution at more than its cost (about 220 µs, pg_stat_statements'
-- total_plan_time), where this one plans in a few.
-- name: JobClaimWrite :exec
WITH moved AS (
    UPDATE jobs SET state = sqlc.arg('state'), claim_id = sqlc.arg('claim_id'), worker = sqlc.arg('worker'), claim_host = sqlc.arg('claim_host'),
        lease_expires_at_ms = sqlc.arg('lease_expires_at_ms'), reason = sqlc.arg('reason'), claimed_at_ms = sqlc.arg('claimed_at_ms'),
        started_at_ms = sqlc.arg('started_at_ms'), finished_at_ms = sqlc.arg('finished_at_ms'), reserved = sqlc.arg('reserved'),
        reserve_shard = sqlc.arg('reserve_shard'), tenant_shard = sqlc.arg('tenant_shard'), reserve_credential = sqlc.arg('reserve_credential'),
        admission_claim_id = sqlc.arg('admission_claim_id'), admission = sqlc.arg('admission'), updated_at_ms = sqlc.arg('updated_at_ms')
    WHERE operation_id = sqlc.arg('operation_id') AND state || '' = 'queued'
    RETURNING 1
)
SELECT fleet_guard((SELECT COUNT(*) FROM moved), 'JobClaimWrite');

-- The named transitions: each is guarded by the state (and claim) its
-- caller read, and fails its transaction (fleet_guard) unless it changed
-- exactly one row, since it is sent without waiting for an answer. The
-- guard compares state || '', which no index holds: compared as state,
-- statistics taken before any job was in flight made the planner read the
-- job through an index led by its state (jobs_by_lease, jobs_claimable),
-- every in-flight job's entry for each transition, rather than by its key
-- (TestHotPathPlans).

-- name: JobSetRunning :exec
WITH moved AS (
    UPDATE jobs SET state = 'running', started_at_ms = sqlc.arg('updated_at_ms'), reserved = sqlc.arg('reserved'), reserve_shard = sqlc.arg('reserve_shard'), tenant_shard = sqlc.arg('tenant_shard'), reserve_credential = sqlc.arg('reserve_credential'),
        admission_claim_id = claim_id, admission = sqlc.arg('admission'), lease_expires_at_ms = sqlc.arg('lease_expires_at_ms'),
        reason = sqlc.arg('reason'), updated_at_ms = sqlc.arg('updated_at_ms')
    WHERE operation_id = sqlc.arg('operation_id') AND state || '' = 'claimed' AND claim_id = sqlc.arg('if_claim_id')
    RETURNING 1
)
SELECT fleet_guard((SELECT COUNT(*) FROM moved), 'JobSetRunning');

-- name: JobSetRefused :exec
WITH moved AS (
    UPDATE jobs SET state = 'refused', finished_at_ms = sqlc.arg('updated_at_ms'), reserved = 0, reserve_shard = -1, tenant_shard = -1, reserve_credential = '',
        admission_claim_id = claim_id, admission = sqlc.arg('admission'), reason = sqlc.arg('reason'), updated_at_ms = sqlc.arg('updated_at_ms')
    WHERE operation_id = sqlc.arg('operation_id') AND state || '' = 'claimed' AND claim_id = sqlc.arg('if_claim_id')
    RETURNING 1
)
SELECT fleet_guard((SELECT COUNT(*) FROM moved), 'JobSetRefused');

-- JobSetRunning and JobSetRefused for several jobs (a batch's admissions),
-- each row guarded as alone: the guard fails the transaction unless every
-- one changed.
-- name: JobSetRunningMany :exec
WITH d AS MATERIALIZED (
    SELECT unnest(sqlc.arg('operation_ids')::text[]) AS operation_id, unnest(sqlc.arg('if_claim_ids')::text[]) AS if_claim_id,
        unnest(sqlc.arg('reserved')::bigint[]) AS reserved, unnest(sqlc.arg('reserve_shards')::bigint[]) AS reserve_shard,
        unnest(sqlc.arg('tenant_shards')::bigint[]) AS tenant_shard, unnest(sqlc.arg('reserve_credentials')::text[]) AS reserve_credential,
        unnest(sqlc.arg('admissions')::text[]) AS admission, unnest(sqlc.arg('lease_expires_at_ms')::bigint[]) AS lease_expires_at_ms,
        unnest(sqlc.arg('reasons')::text[]) AS reason, 'claimed'::text AS if_state
), moved AS (
    UPDATE jobs j SET state = 'running', started_at_ms = sqlc.arg('updated_at_ms'), reserved = d.reserved, reserve_shard = d.reserve_shard,
        tenant_shard = d.tenant_shard, reserve_credential = d.reserve_credential, admission_claim_id = j.claim_id, admission = d.admission,
        lease_expires_at_ms = d.lease_expires_at_ms, reason = d.reason, updated_at_ms = sqlc.arg('updated_at_ms')
    FROM d WHERE j.operation_id = d.operation_id AND j.operation_id = ANY(sqlc.arg('operation_ids')::text[]) AND j.state || '' = d.if_state AND j.claim_id = d.if_claim_id
    RETURNING 1
)
SELECT fleet_guard(CASE WHEN (SELECT COUNT(*) FROM moved) = cardinality(sqlc.arg('operation_ids')::text[]) THEN 1 ELSE 0 END, 'JobSetRunningMany');

-- name: JobSetRefusedMany :exec
WITH d AS MATERIALIZED (
    SELECT unnest(sqlc.arg('operation_ids')::text[]) AS operation_id, unnest(sqlc.arg('if_claim_ids')::text[]) AS if_claim_id,
        unnest(sqlc.arg('admissions')::text[]) AS admission, unnest(sqlc.arg('reasons')::text[]) AS reason, 'claimed'::text AS if_state
), moved AS (
    UPDATE jobs j SET state = 'refused', finished_at_ms = sqlc.arg('updated_at_ms'), reserved = 0, reserve_shard = -1, tenant_shard = -1, reserve_credential = '',
        admission_claim_id = j.claim_id, admission = d.admission, reason = d.reason, updated_at_ms = sqlc.arg('updated_at_ms')
    FROM d WHERE j.operation_id = d.operation_id AND j.state || '' = d.if_state AND j.claim_id = d.if_claim_id
    RETURNING 1
)
SELECT fleet_guard(CASE WHEN (SELECT COUNT(*) FROM moved) = cardinality(sqlc.arg('operation_ids')::text[]) THEN 1 ELSE 0 END, 'JobSetRefusedMany');

-- name: JobRenewLease :exec
WITH moved AS (
    UPDATE jobs SET lease_expires_at_ms = sqlc.arg('lease_expires_at_ms'), updated_at_ms = sqlc.arg('updated_at_ms')
    WHERE operation_id = sqlc.arg('operation_id') AND state || '' IN ('claimed', 'running') AND claim_id = sqlc.arg('if_claim_id')
    RETURNING 1
)
SELECT fleet_guard((SELECT COUNT(*) FROM moved), 'JobRenewLease');

-- name: JobComplete :exec
WITH moved AS (
    UPDATE jobs SET state = 'completed', finished_at_ms = sqlc.arg('updated_at_ms'), reserved = 0, reserve_shard = -1, tenant_shard = -1, reserve_credential = '', reason = sqlc.arg('reason'), updated_at_ms = sqlc.arg('updated_at_ms')
    WHERE operation_id = sqlc.arg('operation_id') AND state || '' = sqlc.arg('if_state')
    RETURNING 1
)
SELECT fleet_guard((SELECT COUNT(*) FROM moved), 'JobComplete');

-- JobComplete for several jobs (a batch's publications), each row guarded
-- as alone: the guard fails the transaction unless every one changed.
-- name: JobCompleteMany :exec
WITH d AS MATERIALIZED (
    SELECT unnest(sqlc.arg('operation_ids')::text[]) AS operation_id, unnest(sqlc.arg('if_states')::text[]) AS if_state,
        unnest(sqlc.arg('reasons')::text[]) AS reason
), moved AS (
    UPDATE jobs j SET state = 'completed', finished_at_ms = sqlc.arg('updated_at_ms'), reserved = 0, reserve_shard = -1, tenant_shard = -1, reserve_credential = '',
        reason = d.reason, updated_at_ms = sqlc.arg('updated_at_ms')
    FROM d WHERE j.operation_id = d.operation_id AND j.operation_id = ANY(sqlc.arg('operation_ids')::text[]) AND j.state || '' = d.if_state
    RETURNING 1
)
SELECT fleet_guard(CASE WHEN (SELECT COUNT(*) FROM moved) = cardinality(sqlc.arg('operation_ids')::text[]) THEN 1 ELSE 0 END, 'JobCompleteMany');

-- name: JobRequeue :exec
WITH moved AS (
    UPDATE jobs SET state = 'queued', claim_id = '', claim_host = '', lease_expires_at_ms = 0,
    claimed_at_ms = 0, started_at_ms = 0, finished_at_ms = 0,
        reserved = 0, reserve_shard = -1, tenant_shard = -1, reserve_credential = '', admission_claim_id = '', admission = '', worker = sqlc.arg('worker'),
        attempts = sqlc.arg('attempts'), claimable_at_ms = sqlc.arg('claimable_at_ms'), last_error = sqlc.arg('last_error'),
        reason = sqlc.arg('reason'), updated_at_ms = sqlc.arg('updated_at_ms')
    WHERE operation_id = sqlc.arg('operation_id') AND state || '' = sqlc.arg('if_state')
    RETURNING 1
)
SELECT fleet_guard((SELECT COUNT(*) FROM moved), 'JobRequeue');

-- name: JobFail :exec
WITH moved AS (
    UPDATE jobs SET state = 'failed', finished_at_ms = sqlc.arg('updated_at_ms'), claim_id = '', claim_host = '', lease_expires_at_ms = 0,
        reserved = 0, reserve_shard = -1, tenant_shard = -1, reserve_credential = '', attempts = sqlc.arg('attempts'), last_error = sqlc.arg('last_error'),
        reason = sqlc.arg('reason'), updated_at_ms = sqlc.arg('updated_at_ms')
    WHERE operation_id = sqlc.arg('operation_id') AND state || '' = sqlc.arg('if_state')
    RETURNING 1
)
SELECT fleet_guard((SELECT COUNT(*) FROM moved), 'JobFail');

-- name: JobSetUnresolved :exec
WITH moved AS (
    UPDATE jobs SET state = 'unresolved', reason = sqlc.arg('reason'), updated_at_ms = sqlc.arg('updated_at_ms')
    WHERE operation_id = sqlc.arg('operation_id') AND state || '' = 'running'
    RETURNING 1
)
SELECT fleet_guard((SELECT COUNT(*) FROM moved), 'JobSetUnresolved');

-- name: JobCancel :exec
WITH moved AS (
    UPDATE jobs SET state = sqlc.arg('to_state'), finished_at_ms = sqlc.arg('updated_at_ms'), claim_host = '', lease_expires_at_ms = 0, reserved = 0, reserve_shard = -1, tenant_shard = -1, reserve_credential = '',
        reason = sqlc.arg('reason'), updated_at_ms = sqlc.arg('updated_at_ms')
    WHERE operation_id = sqlc.arg('operation_id') AND state || '' = sqlc.arg('if_state')
    RETURNING 1
)
SELECT fleet_guard((SELECT COUNT(*) FROM moved), 'JobCancel');

-- Every job in queue order: job_keys' key is that order.
-- name: JobList :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM job_keys k JOIN jobs j ON j.operation_id = k.operation_id
    JOIN documents d ON d.id = k.document_id
    LEFT JOIN operations o ON o.document_id = k.document_id AND o.status = 'published'
ORDER BY k.position;

-- name: JobListByBatch :many
SELECT operation_id FROM jobs WHERE batch_key = sqlc.arg('batch_key') ORDER BY position;

-- name: JobListExpired :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.state IN ('claimed', 'running') AND j.lease_expires_at_ms < sqlc.arg('now_ms')
ORDER BY j.position;

-- name: JobListExpiredForUpdate :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.state IN ('claimed', 'running') AND j.lease_expires_at_ms < sqlc.arg('now_ms')
ORDER BY j.position
FOR UPDATE OF j, d SKIP LOCKED;

-- name: JobListClaimedBy :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN documents d ON d.id = j.document_id
    LEFT JOIN operations o ON o.document_id = j.document_id AND o.status = 'published'
WHERE j.state = 'claimed' AND j.claim_host = ANY(sqlc.arg('host_ids')::text[])
ORDER BY j.position
FOR UPDATE OF j, d SKIP LOCKED;

-- A keyed claim's jobs its worker still holds: claimed, or decided by
-- the claim's admission (a claim that admits) and not yet finished.
-- name: JobListClaimedUnder :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, b.document AS batch_document
FROM documents d JOIN job_keys k ON k.document_id = d.id JOIN jobs j ON j.operation_id = k.operation_id
    JOIN batches b ON b.idempotency_key = j.batch_key
WHERE d.owner = sqlc.arg('worker') AND j.worker = sqlc.arg('worker') AND (j.state = 'claimed' OR j.state IN ('running', 'refused', 'unresolved') AND j.admission_claim_id = j.claim_id)
    AND substr(j.claim_id, 1, length(sqlc.arg('prefix')::text)) = sqlc.arg('prefix')::text
ORDER BY j.position
FOR UPDATE OF j, d;

-- name: JobPending :one
SELECT EXISTS (SELECT 1 FROM jobs WHERE state IN ('queued', 'claimed', 'running'));

-- The jobs in each of the states given (every state but completed),
-- counted where jobs_by_state holds them, and, as state '', how many jobs
-- were enqueued: positions run from 1 without a gap (numbered under the
-- log lock), so that is the highest. The completed jobs, the state a
-- fleet's history grows in, are the rest (the executor subtracts), so a
-- count reads the jobs not completed, not every job the fleet has run;
-- the sampler counts once a second on every host. One statement: one
-- snapshot.
-- name: JobCountByState :many
SELECT state::text AS state, COUNT(*)::bigint AS jobs FROM jobs WHERE state = ANY(sqlc.arg('states')::text[]) GROUP BY state
UNION ALL
SELECT '', COALESCE(MAX(position), 0)::bigint FROM job_keys;

-- The tenants with queued jobs, in name order: a seek of jobs_claimable
-- per tenant (a loose index scan), however many jobs each has.
-- name: JobTenantsQueued :many
WITH RECURSIVE t(tenant) AS (
    SELECT (SELECT MIN(j.tenant) FROM jobs j WHERE j.state = 'queued')
    UNION ALL
    SELECT (SELECT MIN(j.tenant) FROM jobs j WHERE j.state = 'queued' AND j.tenant > t.tenant) FROM t WHERE t.tenant IS NOT NULL
)
SELECT tenant::text AS tenant FROM t WHERE tenant IS NOT NULL;

-- The tenant of a document's job (one job a document).
-- name: JobTenantOfDocument :one
SELECT j.tenant FROM job_keys k JOIN jobs j ON j.operation_id = k.operation_id WHERE k.document_id = sqlc.arg('document_id');

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
    SUM(CASE WHEN state IN ('claimed', 'running') THEN 1 ELSE 0 END)::bigint AS held,
    SUM(CASE WHEN state = 'completed' AND finished_at_ms >= sqlc.arg('since_ms') THEN 1 ELSE 0 END)::bigint AS completed,
    SUM(CASE WHEN state = 'failed' AND finished_at_ms >= sqlc.arg('since_ms') THEN 1 ELSE 0 END)::bigint AS failed,
    MAX(updated_at_ms)::bigint AS last_seen_ms
FROM jobs WHERE worker <> '' GROUP BY worker ORDER BY worker;

-- Pages: each filter is optional (); the planner picks the index the
-- filters given allow: job_keys' for queue order and the section (whose
-- rows hold every filter but the state and the owner), documents_by_owner
-- for the owner. The prefix is compared byte for byte: a range would
-- follow the collation, which may skip the hyphens. A page filtered by
-- state is JobPageByState.
-- name: JobPage :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM job_keys k JOIN jobs j ON j.operation_id = k.operation_id
    JOIN documents d ON d.id = k.document_id
    LEFT JOIN operations o ON o.document_id = k.document_id AND o.status = 'published'
WHERE k.position > sqlc.arg('after')
    AND (sqlc.arg('section')::text = '' OR k.section = sqlc.arg('section')::text)
    AND (sqlc.arg('owner')::text = '' OR d.owner = sqlc.arg('owner')::text)
    AND (sqlc.arg('priority')::bigint = 0 OR k.priority = sqlc.arg('priority')::bigint)
    AND (sqlc.arg('tenant')::text = '' OR k.tenant = sqlc.arg('tenant')::text)
    AND substr(k.operation_id, 1, length(sqlc.arg('prefix')::text)) = sqlc.arg('prefix')::text
ORDER BY k.position LIMIT sqlc.arg('max');

-- JobPage with a state: jobs_by_state's range of it, in queue order, each
-- job's keys by their key, the position. One statement for both, joined
-- on the position as well as the operation id so that either table's
-- order could serve, made the planner take the two join conditions as
-- independent and expect about one row: filtered by tenant, it read every
-- job and sorted them (TestHotPathPlans).
-- name: JobPageByState :many
SELECT sqlc.embed(j), d.generation, d.owner, d.version, COALESCE(o.outcome, '') AS outcome
FROM jobs j JOIN job_keys k ON k.position = j.position
    JOIN documents d ON d.id = k.document_id
    LEFT JOIN operations o ON o.document_id = k.document_id AND o.status = 'published'
WHERE j.state = sqlc.arg('state')::text AND j.position > sqlc.arg('after')
    AND (sqlc.arg('section')::text = '' OR k.section = sqlc.arg('section')::text)
    AND (sqlc.arg('owner')::text = '' OR d.owner = sqlc.arg('owner')::text)
    AND (sqlc.arg('priority')::bigint = 0 OR k.priority = sqlc.arg('priority')::bigint)
    AND (sqlc.arg('tenant')::text = '' OR k.tenant = sqlc.arg('tenant')::text)
    AND substr(k.operation_id, 1, length(sqlc.arg('prefix')::text)) = sqlc.arg('prefix')::text
ORDER BY j.position LIMIT sqlc.arg('max');

-- name: AttemptInsert :exec
INSERT INTO job_attempts (operation_id, attempt, claim_id, worker, generation, reason, retryable, outcome, cost, answer, at_ms)
VALUES (sqlc.arg('operation_id'), sqlc.arg('attempt'), sqlc.arg('claim_id'), sqlc.arg('worker'), sqlc.arg('generation'), sqlc.arg('reason'), sqlc.arg('retryable'), sqlc.arg('outcome'), sqlc.arg('cost'), sqlc.arg('answer'), sqlc.arg('at_ms'));

-- name: AttemptList :many
SELECT * FROM job_attempts WHERE operation_id = sqlc.arg('operation_id') ORDER BY attempt;
