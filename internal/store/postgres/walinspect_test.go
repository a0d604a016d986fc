package postgres_test

import (
	"context"
	"database/sql"
	"regexp"
	"testing"
)

// walRelation is a relation's file number in a WAL record's block
// reference ("blkref #0: rel 1663/5/16413 fork main blk 1").
var walRelation = regexp.MustCompile(`rel \d+/\d+/(\d+) fork main`)

// walPosition is where c's next WAL record will go: the start of what
// indexWrites reads.
func walPosition(t *testing.T, ctx context.Context, c *sql.Conn) string {
	t.Helper()
	if _, err := c.ExecContext(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect WITH SCHEMA public`); err != nil {
		t.Fatalf("pg_walinspect (PostgreSQL's contrib, created by a superuser): %v", err)
	}
	// indexWrites reads up to the flushed position, so this session's
	// commits must be flushed when they return, whatever the server's
	// default.
	if _, err := c.ExecContext(ctx, `SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	var lsn string
	if err := c.QueryRowContext(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// indexWrites counts, by index, the entries PostgreSQL's WAL holds for
// the indexes of table (in c's schema) since from: each B-tree record that
// inserts an entry, into a leaf page, a posting list or a page it splits
// (pg_walinspect). Other databases' and schemas' records are other files,
// so a busy server cannot add to the count.
func indexWrites(t *testing.T, ctx context.Context, c *sql.Conn, table, from string) map[string]int {
	t.Helper()
	names := map[string]string{} // file number to index name
	rows, err := c.QueryContext(ctx, `SELECT pg_relation_filenode(i.indexrelid)::text, ic.relname FROM pg_index i
		JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_class tc ON tc.oid = i.indrelid
		WHERE tc.relname = $1 AND tc.relnamespace = current_schema()::regnamespace`, table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var file, name string
		if err := rows.Scan(&file, &name); err != nil {
			t.Fatal(err)
		}
		names[file] = name
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatalf("no indexes on %s", table)
	}
	rows, err = c.QueryContext(ctx, `SELECT block_ref FROM public.pg_get_wal_records_info($1::pg_lsn, pg_current_wal_flush_lsn())
		WHERE resource_manager = 'Btree' AND record_type IN ('INSERT_LEAF', 'INSERT_POST', 'SPLIT_L', 'SPLIT_R')`, from)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	written := map[string]int{}
	for rows.Next() {
		var refs string
		if err := rows.Scan(&refs); err != nil {
			t.Fatal(err)
		}
		// A split names its new page too: the record is one entry.
		if m := walRelation.FindStringSubmatch(refs); m != nil && names[m[1]] != "" {
			written[names[m[1]]]++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return written
}
