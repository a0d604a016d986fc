-- The PostgreSQL form of sqlite/0018_schedules.sql.
CREATE TABLE schedules (
    name          TEXT PRIMARY KEY,
    spec          TEXT NOT NULL,
    request       TEXT NOT NULL,
    paused        BIGINT NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    next_at_ms    BIGINT NOT NULL,
    fired         BIGINT NOT NULL DEFAULT 0 CHECK (fired >= 0),
    last_slot_ms  BIGINT NOT NULL DEFAULT 0,
    created_at_ms BIGINT NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_at_ms) WHERE paused = 0;
