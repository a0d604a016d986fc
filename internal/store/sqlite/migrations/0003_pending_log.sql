-- Log entries committed but not yet numbered: the event log and the
-- receipt chain are placed in commit order by the log's sequencer after the
-- transactions that wrote them commit, where several hosts write at once
-- (PostgreSQL). SQLite has one writer, which numbers in its own commit, so
-- these stay empty here; the tables exist so every backend has the same
-- operations.
CREATE TABLE pending_events (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    timestamp_ms INTEGER NOT NULL,
    kind         TEXT NOT NULL,
    actor        TEXT NOT NULL,
    title        TEXT NOT NULL,
    data         TEXT NOT NULL
);
CREATE TABLE pending_receipts (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    receipt_id TEXT NOT NULL UNIQUE,
    body       TEXT NOT NULL  -- the prepared receipt: id and decision, no place or signature yet
);
