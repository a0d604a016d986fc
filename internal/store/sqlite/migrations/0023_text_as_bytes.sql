-- PostgreSQL's 0023_text_as_bytes makes every text column compare byte by
-- byte (COLLATE "C"), whatever locale its database was made in. SQLite's
-- text already does (its BINARY collation, the default), so nothing here
-- changes; this migration keeps the two backends' schema versions in step.
SELECT 1;
