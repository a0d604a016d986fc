-- The allowance in shards (see accounting.go): a single row would be held
-- by every reservation and settlement until its commit, so every write of
-- every host would wait for the one before it to reach disk. Each shard
-- keeps the old row's CHECKs; the shards' allowances add up to the
-- allowance. The accounting view sums them, so anything that read the old
-- table reads the same figures.
CREATE TABLE accounting_settings (
    id              BIGINT PRIMARY KEY CHECK (id = 1),
    cost_per_report BIGINT NOT NULL CHECK (cost_per_report >= 1)
);
INSERT INTO accounting_settings (id, cost_per_report) SELECT id, cost_per_report FROM accounting;

CREATE TABLE accounting_shards (
    shard     BIGINT PRIMARY KEY CHECK (shard >= 0),
    allowance BIGINT NOT NULL CHECK (allowance >= 0),
    spent     BIGINT NOT NULL CHECK (spent >= 0),
    reserved  BIGINT NOT NULL CHECK (reserved >= 0),
    calls     BIGINT NOT NULL CHECK (calls >= 0),
    CHECK (spent + reserved <= allowance)
);
-- An existing allowance moves whole into shard 0; the first reservation
-- that finds no other shard covering it spreads the available credits.
INSERT INTO accounting_shards (shard, allowance, spent, reserved, calls)
    SELECT 0, allowance, spent, reserved, calls FROM accounting;
INSERT INTO accounting_shards (shard, allowance, spent, reserved, calls)
    SELECT g, 0, 0, 0, 0 FROM generate_series(1, 31) AS g WHERE EXISTS (SELECT 1 FROM accounting);
DROP TABLE accounting;

CREATE VIEW accounting AS
    SELECT c.id, s.allowance, s.spent, s.reserved, s.calls, c.cost_per_report
    FROM accounting_settings c,
         (SELECT COALESCE(SUM(allowance), 0)::BIGINT AS allowance, COALESCE(SUM(spent), 0)::BIGINT AS spent,
                 COALESCE(SUM(reserved), 0)::BIGINT AS reserved, COALESCE(SUM(calls), 0)::BIGINT AS calls
          FROM accounting_shards) AS s;
