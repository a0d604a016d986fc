-- The PostgreSQL form of sqlite/0003_pending_log.sql. Transactions from any
-- host append here without a shared lock; the sequencer (whichever host
-- holds the log's advisory lock) moves entries into events and receipts in
-- the order they became visible, numbering, linking and signing them.
CREATE TABLE pending_events (
    id           BIGSERIAL PRIMARY KEY,
    timestamp_ms BIGINT NOT NULL,
    kind         TEXT NOT NULL,
    actor        TEXT NOT NULL,
    title        TEXT NOT NULL,
    data         TEXT NOT NULL
);
CREATE TABLE pending_receipts (
    id         BIGSERIAL PRIMARY KEY,
    receipt_id TEXT NOT NULL UNIQUE,
    body       TEXT NOT NULL
);
