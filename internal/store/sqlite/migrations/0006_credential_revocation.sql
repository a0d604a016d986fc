-- When a credential was revoked (0: it is in force). Revoked credentials
-- keep their row, so the record of who held what stays.
ALTER TABLE credentials ADD COLUMN revoked_at_ms INTEGER NOT NULL DEFAULT 0;
