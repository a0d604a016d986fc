-- The PostgreSQL form of sqlite/0014_credential_allowances.sql. A capped
-- credential's figures are one row: only its own admissions and
-- settlements write it.
ALTER TABLE credentials ADD COLUMN allowance BIGINT CHECK (allowance IS NULL OR allowance >= 0);
ALTER TABLE credentials ADD COLUMN spent BIGINT NOT NULL DEFAULT 0 CHECK (spent >= 0);
ALTER TABLE credentials ADD COLUMN reserved BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0);
ALTER TABLE credentials ADD CONSTRAINT credentials_within_allowance CHECK (allowance IS NULL OR spent + reserved <= allowance);
ALTER TABLE jobs ADD COLUMN reserve_credential TEXT NOT NULL DEFAULT '';
