-- Sections that wait for others. A job with dependencies is held in the
-- state `blocked` until every one of them has completed: waiting_on
-- counts those that have not, and the publication that completes the
-- last one queues it in the same transaction. dependents counts the jobs
-- that wait for this one, so the completion of a job nobody waits for
-- costs no statement. after_json is the dependencies' outputs a
-- dependent's input names (set as it is queued: sections, versions and
-- digests, covered by its input_sha256). SQLite cannot change a CHECK in
-- place, so the jobs table is rebuilt (nothing refers to it), as in 0007.
CREATE TABLE jobs_0017 (
    operation_id        TEXT PRIMARY KEY,
    position            INTEGER NOT NULL UNIQUE,
    batch_key           TEXT NOT NULL REFERENCES batches (idempotency_key),
    section             TEXT NOT NULL,
    document_id         TEXT NOT NULL UNIQUE REFERENCES documents (id),
    input_sha256        TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ('blocked', 'queued', 'claimed', 'running', 'completed',
                            'refused', 'cancelled_before_dispatch', 'cancelled', 'unresolved', 'failed')),
    claim_id            TEXT NOT NULL DEFAULT '',
    worker              TEXT NOT NULL DEFAULT '',
    lease_expires_at_ms INTEGER NOT NULL DEFAULT 0,
    reserved            INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    admission_claim_id  TEXT NOT NULL DEFAULT '',
    admission           TEXT NOT NULL DEFAULT '',
    reason              TEXT NOT NULL DEFAULT '',
    created_at_ms       INTEGER NOT NULL,
    updated_at_ms       INTEGER NOT NULL,
    claim_host          TEXT NOT NULL DEFAULT '',
    reserve_shard       INTEGER NOT NULL DEFAULT -1,
    attempts            INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts        INTEGER NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    backoff_base_ms     INTEGER NOT NULL DEFAULT 1000 CHECK (backoff_base_ms >= 0),
    backoff_cap_ms      INTEGER NOT NULL DEFAULT 60000 CHECK (backoff_cap_ms >= 0),
    claimable_at_ms     INTEGER NOT NULL DEFAULT 0,
    last_error          TEXT NOT NULL DEFAULT '',
    expected_sha256     TEXT NOT NULL DEFAULT '',
    claimed_at_ms       INTEGER NOT NULL DEFAULT 0,
    started_at_ms       INTEGER NOT NULL DEFAULT 0,
    finished_at_ms      INTEGER NOT NULL DEFAULT 0,
    priority            INTEGER NOT NULL DEFAULT 2,
    tenant              TEXT NOT NULL DEFAULT 'default',
    tenant_shard        INTEGER NOT NULL DEFAULT -1,
    reserve_credential  TEXT NOT NULL DEFAULT '',
    waiting_on          INTEGER NOT NULL DEFAULT 0 CHECK (waiting_on >= 0),
    dependents          INTEGER NOT NULL DEFAULT 0 CHECK (dependents >= 0),
    after_json          TEXT NOT NULL DEFAULT ''
);
INSERT INTO jobs_0017 (operation_id, position, batch_key, section, document_id, input_sha256, state, claim_id, worker,
        lease_expires_at_ms, reserved, admission_claim_id, admission, reason, created_at_ms, updated_at_ms, claim_host,
        reserve_shard, attempts, max_attempts, backoff_base_ms, backoff_cap_ms, claimable_at_ms, last_error,
        expected_sha256, claimed_at_ms, started_at_ms, finished_at_ms, priority, tenant, tenant_shard, reserve_credential)
    SELECT operation_id, position, batch_key, section, document_id, input_sha256, state, claim_id, worker,
        lease_expires_at_ms, reserved, admission_claim_id, admission, reason, created_at_ms, updated_at_ms, claim_host,
        reserve_shard, attempts, max_attempts, backoff_base_ms, backoff_cap_ms, claimable_at_ms, last_error,
        expected_sha256, claimed_at_ms, started_at_ms, finished_at_ms, priority, tenant, tenant_shard, reserve_credential
    FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_0017 RENAME TO jobs;
CREATE INDEX jobs_by_state ON jobs (state, position);
CREATE INDEX jobs_by_lease ON jobs (lease_expires_at_ms) WHERE state IN ('claimed', 'running');
CREATE INDEX jobs_by_section ON jobs (section, position);
CREATE INDEX jobs_claimable ON jobs (state, tenant, priority, claimable_at_ms, position);

-- Which job waits for which: a dependent's dependencies by its key, and
-- the jobs waiting for one by depends_on (read when it completes).
CREATE TABLE job_dependencies (
    operation_id TEXT NOT NULL,
    depends_on   TEXT NOT NULL,
    PRIMARY KEY (operation_id, depends_on)
);
CREATE INDEX job_dependencies_by_dependency ON job_dependencies (depends_on);
