-- The allowance in shards (see ../accounting.go). Each guarded UPDATE of
-- one shard returns the allowance figures as they stand after it: the
-- shard as written, the others as the statement saw them.

-- name: AccountingSettingsInsert :exec
INSERT INTO accounting_settings (id, cost_per_report) VALUES (1, sqlc.arg('cost_per_report'));

-- name: AccountingShardsInsert :exec
INSERT INTO accounting_shards (shard, allowance, spent, reserved, calls)
SELECT g, 0, 0, 0, 0 FROM generate_series(0, sqlc.arg('shards')::bigint - 1) AS g;

-- name: AccountingGet :one
SELECT allowance, spent, reserved, calls, cost_per_report FROM accounting WHERE id = 1;

-- name: AccountingLockShards :many
SELECT shard FROM accounting_shards ORDER BY shard FOR UPDATE;

-- name: AccountingHold :many
SELECT shard FROM accounting_shards
WHERE shard IN (SELECT j.reserve_shard FROM jobs j WHERE j.operation_id = ANY(sqlc.arg('operation_ids')::text[]) AND j.reserved > 0)
ORDER BY shard FOR UPDATE;

-- Spreads the credits available under an allowance over the shards, a
-- reservation worth at a time, the remainder to shard 0. The caller
-- holds every shard.
-- name: AccountingSpread :exec
UPDATE accounting_shards SET allowance = spent + reserved
    + (SELECT k.cost_per_report FROM accounting_settings k) * (
        ((sqlc.arg('allowance')::bigint - (SELECT COALESCE(SUM(x.spent + x.reserved), 0)::bigint FROM accounting_shards x)) / (SELECT k.cost_per_report FROM accounting_settings k))
            / (SELECT COUNT(*) FROM accounting_shards x)
        + CASE WHEN shard < ((sqlc.arg('allowance')::bigint - (SELECT COALESCE(SUM(x.spent + x.reserved), 0)::bigint FROM accounting_shards x)) / (SELECT k.cost_per_report FROM accounting_settings k))
            % (SELECT COUNT(*) FROM accounting_shards x) THEN 1 ELSE 0 END)
    + CASE WHEN shard = 0 THEN (sqlc.arg('allowance')::bigint - (SELECT COALESCE(SUM(x.spent + x.reserved), 0)::bigint FROM accounting_shards x))
        % (SELECT k.cost_per_report FROM accounting_settings k) ELSE 0 END;

-- A reservation on a covering shard no one holds (a random one, so
-- reservations, and the settlements that look for them, spread).
-- name: AccountingReserveFree :one
WITH u AS (
    UPDATE accounting_shards s SET reserved = s.reserved + c.cost_per_report, calls = s.calls + 1
    FROM accounting_settings c
    WHERE s.allowance - s.spent - s.reserved >= c.cost_per_report AND s.shard = (
        SELECT a.shard FROM accounting_shards a, accounting_settings k
        WHERE a.allowance - a.spent - a.reserved >= k.cost_per_report
        ORDER BY random() LIMIT 1 FOR UPDATE OF a SKIP LOCKED)
    RETURNING s.shard, s.allowance, s.spent, s.reserved, s.calls
)
SELECT u.shard, (u.allowance + o.allowance)::bigint AS allowance, (u.spent + o.spent)::bigint AS spent,
    (u.reserved + o.reserved)::bigint AS reserved, (u.calls + o.calls)::bigint AS calls, k.cost_per_report
FROM u, accounting_settings k, (
    SELECT COALESCE(SUM(allowance), 0)::bigint AS allowance, COALESCE(SUM(spent), 0)::bigint AS spent,
        COALESCE(SUM(reserved), 0)::bigint AS reserved, COALESCE(SUM(calls), 0)::bigint AS calls
    FROM accounting_shards WHERE shard <> (SELECT shard FROM u)) AS o;

-- name: AccountingReserveCovering :many
SELECT a.shard FROM accounting_shards a, accounting_settings k
WHERE a.allowance - a.spent - a.reserved >= k.cost_per_report ORDER BY random() LIMIT 1;

-- A reservation on a given shard, waiting for it.
-- name: AccountingReserveOn :one
WITH u AS (
    UPDATE accounting_shards s SET reserved = s.reserved + c.cost_per_report, calls = s.calls + 1
    FROM accounting_settings c WHERE s.allowance - s.spent - s.reserved >= c.cost_per_report AND s.shard = sqlc.arg('shard')
    RETURNING s.shard, s.allowance, s.spent, s.reserved, s.calls
)
SELECT u.shard, (u.allowance + o.allowance)::bigint AS allowance, (u.spent + o.spent)::bigint AS spent,
    (u.reserved + o.reserved)::bigint AS reserved, (u.calls + o.calls)::bigint AS calls, k.cost_per_report
FROM u, accounting_settings k, (
    SELECT COALESCE(SUM(allowance), 0)::bigint AS allowance, COALESCE(SUM(spent), 0)::bigint AS spent,
        COALESCE(SUM(reserved), 0)::bigint AS reserved, COALESCE(SUM(calls), 0)::bigint AS calls
    FROM accounting_shards WHERE shard <> (SELECT shard FROM u)) AS o;

-- A settlement on a shard whose reservations cover it, no one holding it.
-- name: AccountingMoveFree :one
WITH u AS (
    UPDATE accounting_shards s SET reserved = s.reserved - sqlc.arg('from_reserved'), spent = s.spent + sqlc.arg('to_spent')
    WHERE s.reserved >= sqlc.arg('from_reserved') AND s.shard = (
        SELECT a.shard FROM accounting_shards a WHERE a.reserved >= sqlc.arg('from_reserved') ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING s.shard, s.allowance, s.spent, s.reserved, s.calls
)
SELECT u.shard, (u.allowance + o.allowance)::bigint AS allowance, (u.spent + o.spent)::bigint AS spent,
    (u.reserved + o.reserved)::bigint AS reserved, (u.calls + o.calls)::bigint AS calls, k.cost_per_report
FROM u, accounting_settings k, (
    SELECT COALESCE(SUM(allowance), 0)::bigint AS allowance, COALESCE(SUM(spent), 0)::bigint AS spent,
        COALESCE(SUM(reserved), 0)::bigint AS reserved, COALESCE(SUM(calls), 0)::bigint AS calls
    FROM accounting_shards WHERE shard <> (SELECT shard FROM u)) AS o;

-- name: AccountingMoveCovering :many
SELECT shard FROM accounting_shards WHERE reserved >= sqlc.arg('from_reserved') ORDER BY random() LIMIT 1;

-- A settlement on a given shard, waiting for it.
-- name: AccountingMoveOn :one
WITH u AS (
    UPDATE accounting_shards s SET reserved = s.reserved - sqlc.arg('from_reserved'), spent = s.spent + sqlc.arg('to_spent')
    WHERE s.reserved >= sqlc.arg('from_reserved') AND s.shard = sqlc.arg('shard')
    RETURNING s.shard, s.allowance, s.spent, s.reserved, s.calls
)
SELECT u.shard, (u.allowance + o.allowance)::bigint AS allowance, (u.spent + o.spent)::bigint AS spent,
    (u.reserved + o.reserved)::bigint AS reserved, (u.calls + o.calls)::bigint AS calls, k.cost_per_report
FROM u, accounting_settings k, (
    SELECT COALESCE(SUM(allowance), 0)::bigint AS allowance, COALESCE(SUM(spent), 0)::bigint AS spent,
        COALESCE(SUM(reserved), 0)::bigint AS reserved, COALESCE(SUM(calls), 0)::bigint AS calls
    FROM accounting_shards WHERE shard <> (SELECT shard FROM u)) AS o;

-- name: AccountingShardList :many
SELECT shard, reserved FROM accounting_shards ORDER BY shard;

-- name: AccountingShardSettle :exec
UPDATE accounting_shards SET reserved = reserved - sqlc.arg('from_reserved'), spent = spent + sqlc.arg('to_spent') WHERE shard = sqlc.arg('shard');
