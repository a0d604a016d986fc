-- The PostgreSQL form of sqlite/0017_dependencies.sql (no rebuild needed).
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('blocked', 'queued', 'claimed', 'running', 'completed',
    'refused', 'cancelled_before_dispatch', 'cancelled', 'unresolved', 'failed'));
ALTER TABLE jobs ADD COLUMN waiting_on BIGINT NOT NULL DEFAULT 0 CHECK (waiting_on >= 0);
ALTER TABLE jobs ADD COLUMN dependents BIGINT NOT NULL DEFAULT 0 CHECK (dependents >= 0);
ALTER TABLE jobs ADD COLUMN after_json TEXT NOT NULL DEFAULT '';

CREATE TABLE job_dependencies (
    operation_id TEXT NOT NULL,
    depends_on   TEXT NOT NULL,
    PRIMARY KEY (operation_id, depends_on)
);
CREATE INDEX job_dependencies_by_dependency ON job_dependencies (depends_on);
