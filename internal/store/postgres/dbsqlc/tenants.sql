-- Tenants in shards (migration 0013, ../tenants.go), as the fleet's
-- allowance is: each guarded UPDATE of one shard returns the tenant's
-- figures as they stand after it, the shard as written, the others as
-- the statement saw them. A shard's allowance is NULL when the tenant has
-- none of its own.

-- name: TenantInsert :exec
WITH t AS (
    INSERT INTO tenants (name, allowance, weight, period, period_start_ms, created_at_ms)
    VALUES (sqlc.arg('name'), sqlc.narg('allowance')::bigint, sqlc.arg('weight'), sqlc.arg('period'), sqlc.arg('period_start_ms'), sqlc.arg('created_at_ms'))
    RETURNING name, allowance
)
INSERT INTO tenant_shards (tenant, shard, allowance, spent, reserved)
SELECT t.name, g, CASE WHEN t.allowance IS NULL THEN NULL WHEN g = 0 THEN t.allowance ELSE 0 END, 0, 0
FROM t, generate_series(0, sqlc.arg('shards')::bigint - 1) AS g;

-- name: TenantGet :one
SELECT t.name, t.allowance, COALESCE(SUM(s.spent), 0)::bigint AS spent, COALESCE(SUM(s.reserved), 0)::bigint AS reserved,
    t.weight, t.period, t.period_start_ms, t.created_at_ms
FROM tenants t JOIN tenant_shards s ON s.tenant = t.name
WHERE t.name = sqlc.arg('name')
GROUP BY t.name;

-- name: TenantList :many
SELECT t.name, t.allowance, COALESCE(SUM(s.spent), 0)::bigint AS spent, COALESCE(SUM(s.reserved), 0)::bigint AS reserved,
    t.weight, t.period, t.period_start_ms, t.created_at_ms
FROM tenants t JOIN tenant_shards s ON s.tenant = t.name
GROUP BY t.name ORDER BY t.name;

-- name: TenantLockShards :many
SELECT shard FROM tenant_shards WHERE tenant = sqlc.arg('tenant') ORDER BY shard FOR UPDATE;

-- Sets a tenant's allowance (NULL for none) and spreads what it leaves
-- available over the shards, a reservation worth at a time, the
-- remainder to shard 0, as AccountingSpread does. The caller holds
-- every shard of the tenant and has checked that it covers what they hold.
-- name: TenantSpread :exec
WITH t AS (
    UPDATE tenants SET allowance = sqlc.narg('allowance')::bigint WHERE name = sqlc.arg('tenant') RETURNING name
), f AS (
    SELECT (SELECT k.cost_per_report FROM accounting_settings k) AS cost, COUNT(*) AS n,
        sqlc.narg('allowance')::bigint - COALESCE(SUM(x.spent + x.reserved), 0)::bigint AS free
    FROM tenant_shards x WHERE x.tenant = sqlc.arg('tenant')
)
UPDATE tenant_shards s SET allowance = CASE WHEN f.free IS NULL THEN NULL ELSE
    s.spent + s.reserved + f.cost * ((f.free / f.cost) / f.n + CASE WHEN s.shard < (f.free / f.cost) % f.n THEN 1 ELSE 0 END)
    + CASE WHEN s.shard = 0 THEN f.free % f.cost ELSE 0 END END
FROM f, t WHERE s.tenant = t.name;

-- name: TenantSetWeight :one
UPDATE tenants SET weight = sqlc.arg('weight') WHERE name = sqlc.arg('name') RETURNING name;

-- A reservation on a covering shard of the tenant no one holds (a random one).
-- name: TenantReserveFree :one
WITH u AS (
    UPDATE tenant_shards s SET reserved = s.reserved + c.cost_per_report
    FROM accounting_settings c
    WHERE s.tenant = sqlc.arg('tenant') AND (s.allowance IS NULL OR s.allowance - s.spent - s.reserved >= c.cost_per_report) AND s.shard = (
        SELECT a.shard FROM tenant_shards a, accounting_settings k
        WHERE a.tenant = sqlc.arg('tenant') AND (a.allowance IS NULL OR a.allowance - a.spent - a.reserved >= k.cost_per_report)
        ORDER BY random() LIMIT 1 FOR UPDATE OF a SKIP LOCKED)
    RETURNING s.shard, s.spent, s.reserved
)
SELECT u.shard, t.name, t.allowance, (u.spent + o.spent)::bigint AS spent, (u.reserved + o.reserved)::bigint AS reserved,
    t.weight, t.period, t.period_start_ms, t.created_at_ms
FROM u, tenants t, (SELECT COALESCE(SUM(spent), 0)::bigint AS spent, COALESCE(SUM(reserved), 0)::bigint AS reserved
    FROM tenant_shards x WHERE x.tenant = sqlc.arg('tenant') AND x.shard <> (SELECT u.shard FROM u)) AS o
WHERE t.name = sqlc.arg('tenant');

-- name: TenantReserveCovering :many
SELECT a.shard FROM tenant_shards a, accounting_settings k
WHERE a.tenant = sqlc.arg('tenant') AND (a.allowance IS NULL OR a.allowance - a.spent - a.reserved >= k.cost_per_report)
ORDER BY random() LIMIT 1;

-- A reservation on a given shard of the tenant, waiting for it.
-- name: TenantReserveOn :one
WITH u AS (
    UPDATE tenant_shards s SET reserved = s.reserved + c.cost_per_report
    FROM accounting_settings c
    WHERE s.tenant = sqlc.arg('tenant') AND s.shard = sqlc.arg('shard')
        AND (s.allowance IS NULL OR s.allowance - s.spent - s.reserved >= c.cost_per_report)
    RETURNING s.shard, s.spent, s.reserved
)
SELECT u.shard, t.name, t.allowance, (u.spent + o.spent)::bigint AS spent, (u.reserved + o.reserved)::bigint AS reserved,
    t.weight, t.period, t.period_start_ms, t.created_at_ms
FROM u, tenants t, (SELECT COALESCE(SUM(spent), 0)::bigint AS spent, COALESCE(SUM(reserved), 0)::bigint AS reserved
    FROM tenant_shards x WHERE x.tenant = sqlc.arg('tenant') AND x.shard <> (SELECT u.shard FROM u)) AS o
WHERE t.name = sqlc.arg('tenant');

-- A settlement on a shard of the tenant whose reservations cover it, no one holding it.
-- name: TenantMoveFree :one
WITH u AS (
    UPDATE tenant_shards s SET reserved = s.reserved - sqlc.arg('from_reserved'), spent = s.spent + sqlc.arg('to_spent')
    WHERE s.tenant = sqlc.arg('tenant') AND s.reserved >= sqlc.arg('from_reserved') AND s.shard = (
        SELECT a.shard FROM tenant_shards a WHERE a.tenant = sqlc.arg('tenant') AND a.reserved >= sqlc.arg('from_reserved')
        ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING s.shard, s.spent, s.reserved
)
SELECT u.shard, u.spent, u.reserved FROM u;

-- name: TenantMoveCovering :many
SELECT shard FROM tenant_shards WHERE tenant = sqlc.arg('tenant') AND reserved >= sqlc.arg('from_reserved') ORDER BY random() LIMIT 1;

-- A settlement on a given shard of the tenant, waiting for it.
-- name: TenantMoveOn :one
UPDATE tenant_shards SET reserved = reserved - sqlc.arg('from_reserved'), spent = spent + sqlc.arg('to_spent')
WHERE tenant = sqlc.arg('tenant') AND shard = sqlc.arg('shard') AND reserved >= sqlc.arg('from_reserved')
RETURNING shard, spent, reserved;

-- A job's settlement on the shard its part was reserved on, which holds
-- it: sent without waiting for an answer (../pipeline.go), so it checks
-- its own guard, failing the transaction unless it moved it.
-- name: TenantMoveHeld :exec
WITH moved AS (
    UPDATE tenant_shards SET reserved = reserved - sqlc.arg('from_reserved'), spent = spent + sqlc.arg('to_spent')
    WHERE tenant = sqlc.arg('tenant') AND shard = sqlc.arg('shard') AND reserved >= sqlc.arg('from_reserved')
    RETURNING 1
)
SELECT fleet_guard((SELECT COUNT(*) FROM moved), 'TenantMove');

-- Settlements at tenant shards the transaction holds (AccountingHold),
-- summed by shard: one statement for a batch's, rather than one each.
-- They were decided on the held figures; the guard fails the transaction
-- should any shard not hold what they take off.
-- name: TenantMoveMany :exec
WITH d AS MATERIALIZED (
    SELECT unnest(sqlc.arg('tenants')::text[]) AS tenant, unnest(sqlc.arg('shards')::bigint[]) AS shard,
        unnest(sqlc.arg('from_reserved')::bigint[]) AS from_reserved, unnest(sqlc.arg('to_spent')::bigint[]) AS to_spent
), moved AS (
    UPDATE tenant_shards s SET reserved = s.reserved - d.from_reserved, spent = s.spent + d.to_spent
    FROM d
    WHERE s.tenant = d.tenant AND s.shard = d.shard AND s.reserved >= d.from_reserved
    RETURNING 1
)
SELECT fleet_guard(CASE WHEN (SELECT COUNT(*) FROM moved) = cardinality(sqlc.arg('tenants')::text[]) THEN 1 ELSE 0 END, 'TenantMoveMany');

-- name: TenantShardList :many
SELECT shard, reserved FROM tenant_shards WHERE tenant = sqlc.arg('tenant') ORDER BY shard;

-- name: TenantShardSettle :exec
UPDATE tenant_shards SET reserved = reserved - sqlc.arg('from_reserved'), spent = spent + sqlc.arg('to_spent')
WHERE tenant = sqlc.arg('tenant') AND shard = sqlc.arg('shard');

-- The guard of a new period: the one transaction that finds the period
-- it ends still current moves it.
-- name: TenantPeriodMove :one
UPDATE tenants SET period_start_ms = sqlc.arg('period_start_ms')
WHERE name = sqlc.arg('name') AND period_start_ms = sqlc.arg('if_period_start_ms')
RETURNING name;

-- Spent starts again at 0 on every shard of the tenant, which this locks
-- in order; what the ended period spent comes back.
-- name: TenantSpentReset :one
WITH old AS (
    SELECT x.shard, x.spent FROM tenant_shards x WHERE x.tenant = sqlc.arg('tenant') ORDER BY x.shard FOR UPDATE
), z AS (
    UPDATE tenant_shards s SET spent = 0 FROM old WHERE s.tenant = sqlc.arg('tenant') AND s.shard = old.shard
    RETURNING old.spent
)
SELECT COALESCE(SUM(z.spent), 0)::bigint AS ended_spent FROM z;

-- Locks the tenants' shards holding these jobs' reservations, in order
-- (AccountingHold, before the fleet's). The jobs are read first, by their
-- key, in any plan (postgres/plans.go).
-- name: TenantHold :many
WITH j AS MATERIALIZED (
    SELECT tenant, tenant_shard FROM jobs WHERE operation_id = ANY(sqlc.arg('operation_ids')::text[]) AND reserved > 0
)
SELECT s.tenant, s.shard, s.reserved FROM tenant_shards s
WHERE (s.tenant, s.shard) IN (SELECT j.tenant, j.tenant_shard FROM j)
ORDER BY s.tenant, s.shard FOR UPDATE OF s;

-- Up to most reservations at once at a tenant, for a batch, on its shard
-- no one holds with the most room (any, for a tenant with no allowance of
-- its own): the figures are the tenant's before them (the shard as read,
-- the others as the statement saw them).
-- name: TenantReserveAhead :one
WITH picked AS (
    SELECT a.shard, CASE WHEN a.allowance IS NULL THEN sqlc.arg('most')::bigint
        ELSE LEAST(sqlc.arg('most')::bigint, (a.allowance - a.spent - a.reserved) / k.cost_per_report) END::bigint AS take
    FROM tenant_shards a, accounting_settings k
    WHERE a.tenant = sqlc.arg('tenant') AND (a.allowance IS NULL OR a.allowance - a.spent - a.reserved >= k.cost_per_report)
    ORDER BY COALESCE(a.allowance - a.spent - a.reserved, 0) DESC, random() LIMIT 1 FOR UPDATE OF a SKIP LOCKED
), u AS (
    UPDATE tenant_shards s SET reserved = s.reserved + p.take * c.cost_per_report
    FROM picked p, accounting_settings c WHERE s.tenant = sqlc.arg('tenant') AND s.shard = p.shard
    RETURNING s.shard, p.take, s.spent, s.reserved - p.take * c.cost_per_report AS reserved
)
SELECT u.shard, u.take, t.name, t.allowance, (u.spent + o.spent)::bigint AS spent, (u.reserved + o.reserved)::bigint AS reserved,
    t.weight, t.period, t.period_start_ms, t.created_at_ms, k.cost_per_report
FROM u, tenants t, accounting_settings k, (SELECT COALESCE(SUM(spent), 0)::bigint AS spent, COALESCE(SUM(reserved), 0)::bigint AS reserved
    FROM tenant_shards x WHERE x.tenant = sqlc.arg('tenant') AND x.shard <> (SELECT u.shard FROM u)) AS o
WHERE t.name = sqlc.arg('tenant');

-- TenantReserveAhead at_tenant times at a tenant and AccountingReserveAhead
-- at_fleet times at the fleet, in one statement: a claim that admits its
-- jobs takes both levels in one round trip. Either part may take none
-- (its columns null). Neither pick waits for a shard (SKIP LOCKED), so the
-- two parts' order cannot deadlock with a transaction that takes the
-- tenant's shards before the fleet's.
-- name: LevelsReserveAhead :one
WITH tpicked AS (
    SELECT a.shard, CASE WHEN a.allowance IS NULL THEN sqlc.arg('at_tenant')::bigint
        ELSE LEAST(sqlc.arg('at_tenant')::bigint, (a.allowance - a.spent - a.reserved) / k.cost_per_report) END::bigint AS take
    FROM tenant_shards a, accounting_settings k
    WHERE a.tenant = sqlc.arg('tenant') AND (a.allowance IS NULL OR a.allowance - a.spent - a.reserved >= k.cost_per_report)
    ORDER BY COALESCE(a.allowance - a.spent - a.reserved, 0) DESC, random() LIMIT 1 FOR UPDATE OF a SKIP LOCKED
), tu AS (
    UPDATE tenant_shards s SET reserved = s.reserved + p.take * c.cost_per_report
    FROM tpicked p, accounting_settings c WHERE s.tenant = sqlc.arg('tenant') AND s.shard = p.shard
    RETURNING s.shard, p.take, s.spent, s.reserved - p.take * c.cost_per_report AS reserved
), at_tenant AS (
    SELECT tu.shard, tu.take, n.name, n.allowance, (tu.spent + o.spent)::bigint AS spent, (tu.reserved + o.reserved)::bigint AS reserved,
        n.weight, n.period, n.period_start_ms, n.created_at_ms
    FROM tu, tenants n, (SELECT COALESCE(SUM(spent), 0)::bigint AS spent, COALESCE(SUM(reserved), 0)::bigint AS reserved
        FROM tenant_shards x WHERE x.tenant = sqlc.arg('tenant') AND x.shard <> (SELECT tu.shard FROM tu)) AS o
    WHERE n.name = sqlc.arg('tenant')
), fpicked AS (
    SELECT b.shard, LEAST(sqlc.arg('at_fleet')::bigint, (b.allowance - b.spent - b.reserved) / m.cost_per_report)::bigint AS take
    FROM accounting_shards b, accounting_settings m
    WHERE b.allowance - b.spent - b.reserved >= m.cost_per_report
    ORDER BY b.allowance - b.spent - b.reserved DESC LIMIT 1 FOR UPDATE OF b SKIP LOCKED
), fu AS (
    UPDATE accounting_shards s SET reserved = s.reserved + p.take * c.cost_per_report, calls = s.calls + p.take
    FROM fpicked p, accounting_settings c WHERE s.shard = p.shard
    RETURNING s.shard, p.take, s.allowance, s.spent, s.reserved - p.take * c.cost_per_report AS reserved, s.calls - p.take AS calls
), at_fleet AS (
    SELECT fu.shard, fu.take, (fu.allowance + o.allowance)::bigint AS allowance, (fu.spent + o.spent)::bigint AS spent,
        (fu.reserved + o.reserved)::bigint AS reserved, (fu.calls + o.calls)::bigint AS calls
    FROM fu, (
        SELECT COALESCE(SUM(allowance), 0)::bigint AS allowance, COALESCE(SUM(spent), 0)::bigint AS spent,
            COALESCE(SUM(reserved), 0)::bigint AS reserved, COALESCE(SUM(calls), 0)::bigint AS calls
        FROM accounting_shards WHERE shard <> (SELECT shard FROM fu)) AS o
)
SELECT k.cost_per_report,
    t.shard AS tenant_shard, t.take AS tenant_take, t.name AS tenant_name, t.allowance AS tenant_allowance, t.spent AS tenant_spent,
    t.reserved AS tenant_reserved, t.weight AS tenant_weight, t.period AS tenant_period, t.period_start_ms AS tenant_period_start_ms,
    t.created_at_ms AS tenant_created_at_ms,
    f.shard AS fleet_shard, f.take AS fleet_take, f.allowance AS fleet_allowance, f.spent AS fleet_spent, f.reserved AS fleet_reserved,
    f.calls AS fleet_calls
FROM accounting_settings k LEFT JOIN at_tenant t ON true LEFT JOIN at_fleet f ON true;

-- Gives back a tenant's reservations taken ahead and not handed out.
-- name: TenantReserveReturn :exec
UPDATE tenant_shards SET reserved = reserved - sqlc.arg('unused')::bigint * (SELECT k.cost_per_report FROM accounting_settings k)
WHERE tenant = sqlc.arg('tenant') AND shard = sqlc.arg('shard');
