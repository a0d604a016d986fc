-- The PostgreSQL form of sqlite/0016_credential_tenants.sql.
ALTER TABLE credentials ADD COLUMN tenants TEXT NOT NULL DEFAULT '';
