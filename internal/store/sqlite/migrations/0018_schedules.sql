-- Recurring reports: a schedule submits its report at each slot of its
-- cron expression (UTC; @every for an interval). next_at_ms is its next
-- slot; a firing moves it on with a guard on its old value, so of hosts
-- racing one slot one wins, and the report each firing submits has a key
-- made of the schedule's name and the slot, so it is submitted once
-- whatever repeats. request is the report (POST /admin/reports without
-- its key), as JSON.
CREATE TABLE schedules (
    name          TEXT PRIMARY KEY,
    spec          TEXT NOT NULL,
    request       TEXT NOT NULL,
    paused        INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    next_at_ms    INTEGER NOT NULL,
    fired         INTEGER NOT NULL DEFAULT 0 CHECK (fired >= 0),
    last_slot_ms  INTEGER NOT NULL DEFAULT 0,
    created_at_ms INTEGER NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_at_ms) WHERE paused = 0;
