-- The PostgreSQL form of sqlite/0002_hosts.sql.
CREATE TABLE hosts (
    id            TEXT PRIMARY KEY,
    instance      TEXT NOT NULL,
    url           TEXT NOT NULL,
    started_at_ms BIGINT NOT NULL,
    seen_at_ms    BIGINT NOT NULL,
    serving       BIGINT NOT NULL CHECK (serving IN (0, 1))
);

ALTER TABLE jobs ADD COLUMN claim_host TEXT NOT NULL DEFAULT '';
