-- Every text column compares byte by byte (COLLATE "C"), as SQLite's
-- text does, whatever locale the database was made in. In a database made
-- in a locale (the official container image makes en_US.utf8), each
-- comparison of a key went through the locale's rules: PostgreSQL's CPU a
-- job was 25-41 % higher in batches, and lists by name came out in
-- another order than on SQLite. A text column added later is declared
-- COLLATE "C" (TestTextComparesAsBytes checks them all). Changing a
-- column's collation rewrites no rows, only the indexes on it.
DO $$
DECLARE
    t RECORD;
BEGIN
    FOR t IN
        SELECT table_name, string_agg(format('ALTER COLUMN %I TYPE TEXT COLLATE "C"', column_name), ', ' ORDER BY column_name) AS columns
        FROM information_schema.columns c
        JOIN information_schema.tables USING (table_schema, table_name)
        WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' AND data_type = 'text'
            AND collation_name IS DISTINCT FROM 'C'
        GROUP BY table_name
    LOOP
        EXECUTE format('ALTER TABLE %I %s', t.table_name, t.columns);
    END LOOP;
END
$$;
