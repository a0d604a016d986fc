-- The allowance shard holding a job's reservation (PostgreSQL's 0004 split
-- the allowance), so a settlement takes it back where it is. SQLite's one
-- accounting row is shard 0; -1 is "not known" (jobs from before).
ALTER TABLE jobs ADD COLUMN reserve_shard INTEGER NOT NULL DEFAULT -1;
