-- A transaction's pending log is one row, not a row for each of its
-- events and receipts: each entry was written twice (pending, then
-- placed) with an index entry each time, and deleted once. Now the
-- pending write is one row a transaction, its entries in arrays, in the
-- order they were appended. A sequencer round places the oldest entries
-- first, up to its limit, so it places a prefix of each row's events and
-- of its receipts: the row counts how many (events_placed,
-- receipts_placed) until it is all placed and deleted. An entry's pending
-- id is its row's id times 2^20 plus its place in the row (from 1).
-- pending_receipts held each receipt id unique while it waited; the
-- arrays cannot. A receipt's id is a digest over its body, which carries
-- a random 64-bit nonce, and receipts.id is unique where it is placed.
CREATE TABLE pending_log (
    id              BIGSERIAL PRIMARY KEY,
    events          INT NOT NULL CHECK (events >= 0),
    receipts        INT NOT NULL CHECK (receipts >= 0),
    events_placed   INT NOT NULL DEFAULT 0,
    receipts_placed INT NOT NULL DEFAULT 0,
    timestamps      BIGINT[] NOT NULL,
    kinds           TEXT[] NOT NULL,
    actors          TEXT[] NOT NULL,
    titles          TEXT[] NOT NULL,
    data            TEXT[] NOT NULL,
    operation_ids   TEXT[] NOT NULL,
    bodies          TEXT[] NOT NULL, -- prepared receipts (dbutil.EncodePendingReceipt)
    CHECK (events + receipts > 0 AND events < 1048576 AND receipts < 1048576),
    CHECK (events_placed BETWEEN 0 AND events AND receipts_placed BETWEEN 0 AND receipts)
);
-- A transaction's arrays are stored compressed: lz4 takes a fraction of
-- the CPU of the default (pglz) for the same text.
ALTER TABLE pending_log ALTER COLUMN timestamps SET COMPRESSION lz4, ALTER COLUMN kinds SET COMPRESSION lz4,
    ALTER COLUMN actors SET COMPRESSION lz4, ALTER COLUMN titles SET COMPRESSION lz4, ALTER COLUMN data SET COMPRESSION lz4,
    ALTER COLUMN operation_ids SET COMPRESSION lz4, ALTER COLUMN bodies SET COMPRESSION lz4;
-- What waits from before: each entry a row of its own, events first (each
-- kind is placed in its own order).
INSERT INTO pending_log (events, receipts, timestamps, kinds, actors, titles, data, operation_ids, bodies)
SELECT 1, 0, ARRAY[timestamp_ms], ARRAY[kind], ARRAY[actor], ARRAY[title], ARRAY[data], ARRAY[operation_id], '{}'
FROM pending_events ORDER BY id;
INSERT INTO pending_log (events, receipts, timestamps, kinds, actors, titles, data, operation_ids, bodies)
SELECT 0, 1, '{}', '{}', '{}', '{}', '{}', '{}', ARRAY[body]
FROM pending_receipts ORDER BY id;
DROP TABLE pending_events;
DROP TABLE pending_receipts;
