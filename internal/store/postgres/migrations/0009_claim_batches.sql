-- The SHA-256 of the canonical body a deterministic worker publishes for
-- the job, computed at enqueue so a publication is checked against it
-- without recomputing the section inside the write transaction ('' for
-- jobs from before, which are checked by recomputing).
ALTER TABLE jobs ADD COLUMN expected_sha256 TEXT NOT NULL DEFAULT '';

-- A guarded transition's statement is sent without waiting for its answer
-- (pipeline.go), so it checks its own guard: fleet_guard fails the
-- transaction unless exactly one row changed. The rows are locked by the
-- transaction that read them, so this only ever catches a bug.
CREATE FUNCTION fleet_guard(applied BIGINT, transition TEXT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
BEGIN
    IF applied <> 1 THEN
        RAISE EXCEPTION 'guard of % did not hold (% rows)', transition, applied USING ERRCODE = 'FLGRD';
    END IF;
    RETURN applied;
END
$$;
