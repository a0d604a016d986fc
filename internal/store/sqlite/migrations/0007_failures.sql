-- Failures and retries: a job's attempts and retry policy, the time it
-- becomes claimable (a retry waits out its backoff), the last error, the
-- terminal state `failed`, and every attempt's record. SQLite cannot
-- change a CHECK in place, so the jobs table is rebuilt (nothing refers
-- to it).
CREATE TABLE jobs_0007 (
    operation_id        TEXT PRIMARY KEY,
    position            INTEGER NOT NULL UNIQUE,
    batch_key           TEXT NOT NULL REFERENCES batches (idempotency_key),
    section             TEXT NOT NULL,
    document_id         TEXT NOT NULL UNIQUE REFERENCES documents (id),
    input_sha256        TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ('queued', 'claimed', 'running', 'completed',
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
    claimable_at_ms     INTEGER NOT NULL DEFAULT 0,  -- not claimed before (a retry's backoff)
    last_error          TEXT NOT NULL DEFAULT ''
);
INSERT INTO jobs_0007 (operation_id, position, batch_key, section, document_id, input_sha256, state, claim_id, worker,
        lease_expires_at_ms, reserved, admission_claim_id, admission, reason, created_at_ms, updated_at_ms, claim_host,
        reserve_shard, claimable_at_ms)
    SELECT operation_id, position, batch_key, section, document_id, input_sha256, state, claim_id, worker,
        lease_expires_at_ms, reserved, admission_claim_id, admission, reason, created_at_ms, updated_at_ms, claim_host,
        reserve_shard, created_at_ms
    FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_0007 RENAME TO jobs;
CREATE INDEX jobs_by_state ON jobs (state, position);
CREATE INDEX jobs_by_lease ON jobs (lease_expires_at_ms) WHERE state IN ('claimed', 'running');
-- Claims take the queued job that became claimable first: a job backing
-- off sorts after every claimable one, so no claim scans past it.
CREATE INDEX jobs_claimable ON jobs (state, claimable_at_ms, position);

CREATE TABLE job_attempts (
    operation_id TEXT NOT NULL,
    attempt      INTEGER NOT NULL,                -- 1, 2, …
    claim_id     TEXT NOT NULL,
    worker       TEXT NOT NULL,
    generation   INTEGER NOT NULL,
    reason       TEXT NOT NULL,
    retryable    INTEGER NOT NULL CHECK (retryable IN (0, 1)),
    outcome      TEXT NOT NULL,                   -- retry or failed
    cost         INTEGER NOT NULL,                -- credits the attempt settled as spent
    answer       TEXT NOT NULL,                   -- the fail call's answer, for repeats
    at_ms        INTEGER NOT NULL,
    PRIMARY KEY (operation_id, attempt)
);
