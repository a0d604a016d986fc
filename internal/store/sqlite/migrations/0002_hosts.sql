-- Each host that serves the state, by a stable identity, with its
-- liveness: a starting host requeues only the claims of hosts that are
-- gone, and records a crash per host.
CREATE TABLE hosts (
    id            TEXT PRIMARY KEY,             -- serve --host-id, or the state's host-id file
    instance      TEXT NOT NULL,                -- the serving process; another process under the id takes it over
    url           TEXT NOT NULL,
    started_at_ms INTEGER NOT NULL,
    seen_at_ms    INTEGER NOT NULL,             -- renewed while it serves
    serving       INTEGER NOT NULL CHECK (serving IN (0, 1))  -- 1 from start to a clean stop
);

-- The host that issued a job's current claim ('' before this migration).
ALTER TABLE jobs ADD COLUMN claim_host TEXT NOT NULL DEFAULT '';
