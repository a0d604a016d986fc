-- A credential limited to some tenants claims only their jobs: their
-- names, comma-separated in name order (a tenant's name has no comma),
-- fixed when it is added; '' for a credential of every tenant.
ALTER TABLE credentials ADD COLUMN tenants TEXT NOT NULL DEFAULT '';
