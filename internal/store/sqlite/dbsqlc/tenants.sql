-- Tenants (migration 0013): each a row with its figures. A write
-- transaction decides reservations and settlements in the process, with
-- their guards, and applies them once (TenantApply, ../ahead.go), as it
-- does the fleet's allowance's.

-- name: TenantInsert :exec
INSERT INTO tenants (name, allowance, spent, reserved, weight, period, period_start_ms, created_at_ms)
VALUES (@name, @allowance, 0, 0, @weight, @period, @period_start_ms, @created_at_ms);

-- name: TenantGet :one
SELECT * FROM tenants WHERE name = @name;

-- name: TenantList :many
SELECT * FROM tenants ORDER BY name;

-- name: TenantSetAllowance :one
UPDATE tenants SET allowance = @allowance
WHERE name = @name AND (CAST(@allowance AS INTEGER) IS NULL OR spent + reserved <= @allowance)
RETURNING *;

-- name: TenantSetWeight :one
UPDATE tenants SET weight = @weight WHERE name = @name RETURNING *;

-- A new period: spent starts again at 0, once, by the one transaction
-- that finds the period it ends still current (the caller read what it
-- ended first, under the one writer's lock).
-- name: TenantRollover :one
UPDATE tenants SET spent = 0, period_start_ms = @period_start_ms
WHERE name = @name AND period_start_ms = @if_period_start_ms
RETURNING *;

-- The reservations and settlements a transaction decided in the process
-- (../ahead.go), written at once; the CHECKs still guard them.
-- name: TenantApply :exec
UPDATE tenants SET reserved = reserved + @reserved, spent = spent + @spent WHERE name = @name;
