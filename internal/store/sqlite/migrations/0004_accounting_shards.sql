-- PostgreSQL's 0004 splits the allowance into shards, so that concurrent
-- writers do not queue on one row. SQLite has one writer, which holds the
-- whole database anyway: its accounting stays one row. This migration
-- only keeps the two backends' schema versions in step.
SELECT 1;
