-- The PostgreSQL form of sqlite/0005_reserve_shard.sql.
ALTER TABLE jobs ADD COLUMN reserve_shard BIGINT NOT NULL DEFAULT -1;
