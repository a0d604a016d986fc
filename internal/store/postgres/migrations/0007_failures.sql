-- The PostgreSQL form of sqlite/0007_failures.sql (no rebuild needed).
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('queued', 'claimed', 'running', 'completed',
    'refused', 'cancelled_before_dispatch', 'cancelled', 'unresolved', 'failed'));
ALTER TABLE jobs ADD COLUMN attempts BIGINT NOT NULL DEFAULT 0 CHECK (attempts >= 0);
ALTER TABLE jobs ADD COLUMN max_attempts BIGINT NOT NULL DEFAULT 3 CHECK (max_attempts >= 1);
ALTER TABLE jobs ADD COLUMN backoff_base_ms BIGINT NOT NULL DEFAULT 1000 CHECK (backoff_base_ms >= 0);
ALTER TABLE jobs ADD COLUMN backoff_cap_ms BIGINT NOT NULL DEFAULT 60000 CHECK (backoff_cap_ms >= 0);
ALTER TABLE jobs ADD COLUMN claimable_at_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN last_error TEXT NOT NULL DEFAULT '';
UPDATE jobs SET claimable_at_ms = created_at_ms;
CREATE INDEX jobs_claimable ON jobs (state, claimable_at_ms, position);

CREATE TABLE job_attempts (
    operation_id TEXT NOT NULL,
    attempt      BIGINT NOT NULL,
    claim_id     TEXT NOT NULL,
    worker       TEXT NOT NULL,
    generation   BIGINT NOT NULL,
    reason       TEXT NOT NULL,
    retryable    BIGINT NOT NULL CHECK (retryable IN (0, 1)),
    outcome      TEXT NOT NULL,
    cost         BIGINT NOT NULL,
    answer       TEXT NOT NULL,
    at_ms        BIGINT NOT NULL,
    PRIMARY KEY (operation_id, attempt)
);
