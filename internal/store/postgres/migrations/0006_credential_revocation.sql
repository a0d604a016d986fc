-- The PostgreSQL form of sqlite/0006_credential_revocation.sql.
ALTER TABLE credentials ADD COLUMN revoked_at_ms BIGINT NOT NULL DEFAULT 0;
