-- The SHA-256 of the canonical body a deterministic worker publishes for
-- the job, computed at enqueue so a publication is checked against it
-- without recomputing the section inside the write transaction ('' for
-- jobs from before, which are checked by recomputing).
ALTER TABLE jobs ADD COLUMN expected_sha256 TEXT NOT NULL DEFAULT '';
