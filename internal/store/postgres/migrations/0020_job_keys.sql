-- What pages, filters and lookups read of a job and no transition changes
-- (its position, document, section, tenant and priority) is kept and
-- indexed here, written once when the job is enqueued, by the statement
-- that inserts it. PostgreSQL writes each new version of a row an entry
-- in every index of its table (unless the update is HOT, which a change
-- of state never is: the state is indexed), so on jobs these three
-- indexes took an entry at every transition. The jobs table keeps the
-- columns, and indexes only its key and what transitions change:
-- jobs_by_state, jobs_claimable.
CREATE TABLE job_keys (
    position     BIGINT PRIMARY KEY,               -- enqueue order, as jobs.position
    operation_id TEXT NOT NULL,                    -- jobs' key (unique there)
    document_id  TEXT NOT NULL UNIQUE,
    section      TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    priority     BIGINT NOT NULL
);
CREATE INDEX job_keys_by_section ON job_keys (section, position);
INSERT INTO job_keys (position, operation_id, document_id, section, tenant, priority)
SELECT position, operation_id, document_id, section, tenant, priority FROM jobs;
ALTER TABLE jobs DROP CONSTRAINT jobs_position_key, DROP CONSTRAINT jobs_document_id_key;
DROP INDEX jobs_by_section;
