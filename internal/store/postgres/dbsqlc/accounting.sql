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

-- The shards held, as they stand, with the others' sums as the statement
-- saw them. The jobs are read first, by their key, in any plan
-- (postgres/plans.go).
-- name: AccountingHold :many
WITH j AS MATERIALIZED (
    SELECT reserve_shard FROM jobs WHERE operation_id = ANY(sqlc.arg('operation_ids')::text[]) AND reserved > 0
), held AS (
    SELECT h.shard, h.allowance, h.spent, h.reserved, h.calls FROM accounting_shards h
    WHERE h.shard IN (SELECT j.reserve_shard FROM j)
    ORDER BY h.shard FOR UPDATE
)
SELECT held.shard, held.allowance, held.spent, held.reserved, held.calls,
    o.allowance AS others_allowance, o.spent AS others_spent, o.reserved AS others_reserved, o.calls AS others_calls, k.cost_per_report
FROM held, accounting_settings k, (
    SELECT COALESCE(SUM(x.allowance), 0)::bigint AS allowance, COALESCE(SUM(x.spent), 0)::bigint AS spent,
        COALESCE(SUM(x.reserved), 0)::bigint AS reserved, COALESCE(SUM(x.calls), 0)::bigint AS calls
    FROM accounting_shards x WHERE x.shard NOT IN (SELECT shard FROM held)) AS o
ORDER BY held.shard;

-- Settlements made on held shards, written at once.
-- name: AccountingMoveMany :exec
WITH d AS MATERIALIZED (
    SELECT unnest(sqlc.arg('shards')::bigint[]) AS shard, unnest(sqlc.arg('from_reserved')::bigint[]) AS from_reserved,
        unnest(sqlc.arg('to_spent')::bigint[]) AS to_spent
)
UPDATE accounting_shards s SET reserved = s.reserved - d.from_reserved, spent = s.spent + d.to_spent
FROM d WHERE s.shard = d.shard;

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

-- Up to most reservations at once, for a batch, on the shard no one holds
-- with the most room, each counted as a call: the figures are the
-- allowance's before them (the shard as read, the others as the statement
-- saw them).
-- name: AccountingReserveAhead :one
WITH picked AS (
    SELECT a.shard, LEAST(sqlc.arg('most')::bigint, (a.allowance - a.spent - a.reserved) / k.cost_per_report)::bigint AS take
    FROM accounting_shards a, accounting_settings k
    WHERE a.allowance - a.spent - a.reserved >= k.cost_per_report
    ORDER BY a.allowance - a.spent - a.reserved DESC LIMIT 1 FOR UPDATE OF a SKIP LOCKED
), u AS (
    UPDATE accounting_shards s SET reserved = s.reserved + p.take * c.cost_per_report, calls = s.calls + p.take
    FROM picked p, accounting_settings c WHERE s.shard = p.shard
    RETURNING s.shard, p.take, s.allowance, s.spent, s.reserved - p.take * c.cost_per_report AS reserved, s.calls - p.take AS calls
)
SELECT u.shard, u.take, (u.allowance + o.allowance)::bigint AS allowance, (u.spent + o.spent)::bigint AS spent,
    (u.reserved + o.reserved)::bigint AS reserved, (u.calls + o.calls)::bigint AS calls, k.cost_per_report
FROM u, accounting_settings k, (
    SELECT COALESCE(SUM(allowance), 0)::bigint AS allowance, COALESCE(SUM(spent), 0)::bigint AS spent,
        COALESCE(SUM(reserved), 0)::bigint AS reserved, COALESCE(SUM(calls), 0)::bigint AS calls
    FROM accounting_shards WHERE shard <> (SELECT shard FROM u)) AS o;

-- Gives back the reservations taken ahead and not handed out.
-- name: AccountingReserveReturn :exec
UPDATE accounting_shards SET reserved = reserved - sqlc.arg('unused')::bigint * (SELECT k.cost_per_report FROM accounting_settings k),
    calls = calls - sqlc.arg('unused')::bigint
WHERE shard = sqlc.arg('shard');

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
