-- The PostgreSQL form of sqlite/0013_tenants.sql. A tenant's figures are
-- held in shards, as the fleet's are (0004): a single row would be locked
-- by every admission and settlement of the tenant until its commit, and
-- the tenant default, which every job of a one-team fleet is in, would
-- queue every write of every host behind the one before it.
CREATE TABLE tenants (
    name            TEXT PRIMARY KEY,
    allowance       BIGINT CHECK (allowance IS NULL OR allowance >= 0),
    weight          BIGINT NOT NULL DEFAULT 1 CHECK (weight >= 1),
    period          TEXT NOT NULL DEFAULT '' CHECK (period IN ('', 'day', 'week', 'month')),
    period_start_ms BIGINT NOT NULL DEFAULT 0,
    created_at_ms   BIGINT NOT NULL
);
-- A capped tenant's shards' allowances add up to its allowance; an
-- uncapped tenant's are NULL.
CREATE TABLE tenant_shards (
    tenant    TEXT NOT NULL REFERENCES tenants (name),
    shard     BIGINT NOT NULL CHECK (shard >= 0),
    allowance BIGINT CHECK (allowance IS NULL OR allowance >= 0),
    spent     BIGINT NOT NULL CHECK (spent >= 0),
    reserved  BIGINT NOT NULL CHECK (reserved >= 0),
    PRIMARY KEY (tenant, shard),
    CHECK (allowance IS NULL OR spent + reserved <= allowance)
);
INSERT INTO tenants (name, allowance, created_at_ms) SELECT 'default', NULL, 0 FROM accounting_settings;
INSERT INTO tenant_shards (tenant, shard, allowance, spent, reserved)
    SELECT 'default', g, NULL, CASE WHEN g = 0 THEN a.spent ELSE 0 END, CASE WHEN g = 0 THEN a.reserved ELSE 0 END
    FROM accounting a, generate_series(0, 15) AS g;
ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE jobs ADD COLUMN tenant_shard BIGINT NOT NULL DEFAULT -1;
