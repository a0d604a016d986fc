-- When a job was last claimed, started (its dispatch allowed) and
-- finished (completed, failed, cancelled or refused), in Unix ms; 0 when
-- it has not been since it was last queued. Queue wait and run time are
-- read from them (the console, fleet_job_queue_wait_seconds and
-- fleet_job_run_seconds).
ALTER TABLE jobs ADD COLUMN claimed_at_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN started_at_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN finished_at_ms BIGINT NOT NULL DEFAULT 0;
