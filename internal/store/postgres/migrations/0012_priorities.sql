-- A job's priority, 1 (first) to 4; a report that gives none is 2. A claim
-- takes the claimable jobs by priority, then in the order they became
-- claimable: it reads each priority's claimable jobs through this index,
-- one short range each, so a queue of any length, or jobs of one
-- priority waiting out a backoff, cost a claim what they did before.
ALTER TABLE jobs ADD COLUMN priority BIGINT NOT NULL DEFAULT 2;
DROP INDEX jobs_claimable;
CREATE INDEX jobs_claimable ON jobs (state, priority, claimable_at_ms, position);
