-- Tenants: the teams sharing the fleet. Each holds its own figures (spent
-- in the current period, reserved) and may cap them with an allowance of
-- its own (NULL: only the fleet's allowance bounds it); a period ("",
-- day, week or month) starts spent again at 0 from period_start_ms. The
-- fleet's figures stay in accounting, the ceiling over every tenant.
CREATE TABLE tenants (
    name            TEXT PRIMARY KEY,
    allowance       INTEGER CHECK (allowance IS NULL OR allowance >= 0),
    spent           INTEGER NOT NULL DEFAULT 0 CHECK (spent >= 0),
    reserved        INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    weight          INTEGER NOT NULL DEFAULT 1 CHECK (weight >= 1),
    period          TEXT NOT NULL DEFAULT '' CHECK (period IN ('', 'day', 'week', 'month')),
    period_start_ms INTEGER NOT NULL DEFAULT 0,
    created_at_ms   INTEGER NOT NULL,
    CHECK (allowance IS NULL OR spent + reserved <= allowance)
);
-- An existing state's jobs and figures are the tenant default's, which
-- has no cap of its own: what the fleet admitted before, it admits.
INSERT INTO tenants (name, allowance, spent, reserved, created_at_ms)
    SELECT 'default', NULL, spent, reserved, 0 FROM accounting;
ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
-- Where the tenant's part of the job's reservation is held, where the
-- backend splits a tenant's figures (PostgreSQL); -1 when none is known.
ALTER TABLE jobs ADD COLUMN tenant_shard INTEGER NOT NULL DEFAULT -1;
