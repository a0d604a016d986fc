package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
)

// TestWritesReadCommitted: a write transaction runs at READ COMMITTED
// whatever the database's default_transaction_isolation, since the write
// path counts on each statement seeing what committed before it (the
// sequencer's check runs after its lock so that it sees every round
// committed before; a guarded transition rereads a row another
// transaction changed). Reads keep their one snapshot.
func TestWritesReadCommitted(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	ctx := context.Background()
	server := newDatabaseDefaulting(t, "default_transaction_isolation", "serializable")
	db, err := backend.Create(ctx, storetest.NewPostgresLocationOn(t, server))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var write, read string
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) (err error) {
		write, err = postgres.TxSetting(ctx, tx, "transaction_isolation")
		return err
	})
	storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) (err error) {
		read, err = postgres.TxSetting(ctx, tx, "transaction_isolation")
		return err
	})
	if write != "read committed" || read != "repeatable read" {
		t.Fatalf("in a database that defaults to serializable, writes ran at %q and reads at %q, want read committed and repeatable read", write, read)
	}
}

// TestCommitsDurable: Fleet answers a write only once its commit is
// durable, so its sessions commit synchronously even in a database whose
// default is synchronous_commit = off (which acknowledges a commit before
// its WAL reaches the disk, and loses it if the server crashes then). A
// stronger default (remote_apply, for a synchronous standby) is kept.
func TestCommitsDurable(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	for _, c := range []struct{ database, want string }{{"off", "on"}, {"remote_apply", "remote_apply"}} {
		t.Run(c.database, func(t *testing.T) {
			ctx := context.Background()
			server := newDatabaseDefaulting(t, "synchronous_commit", c.database)
			db, err := backend.Create(ctx, storetest.NewPostgresLocationOn(t, server))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var got string
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) (err error) {
				got, err = postgres.TxSetting(ctx, tx, "synchronous_commit")
				return err
			})
			if got != c.want {
				t.Fatalf("in a database that defaults to synchronous_commit = %s, writes ran with %q, want %q", c.database, got, c.want)
			}
		})
	}
}

// TestMigrationsOutlastStatementTimeout: a migration may rewrite a large
// table (0023 rebuilt a 100,000-job schema's text indexes in half a
// second), so it runs without the statement_timeout a database sets for
// its sessions, as it already ran without their lock_timeout; otherwise
// serve would stop at the migration on a large enough database.
func TestMigrationsOutlastStatementTimeout(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	ctx := context.Background()
	location := storetest.NewPostgresLocationOn(t, newDatabaseDefaulting(t, "statement_timeout", "250ms"))
	db, err := backend.Create(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	slow := store.Migration{Version: len(postgres.Migrations()) + 1, Name: "slow", SQL: "SELECT pg_sleep(1)"}
	if err := postgres.ApplyMigration(ctx, location, slow); err != nil {
		t.Fatalf("a migration of a second in a database whose statements time out at 250 ms: %v", err)
	}
}

// newDatabaseDefaulting creates a UTF-8 database in the C locale on the
// test server whose sessions default setting to value, dropped at
// cleanup, and returns its URL.
func newDatabaseDefaulting(t *testing.T, setting, value string) string {
	t.Helper()
	ctx := context.Background()
	server := newLocaleDatabase(t, "ENCODING 'UTF8' LOCALE 'C'")
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{admin.Config().Database}.Sanitize()+" SET "+setting+" = '"+value+"'"); err != nil {
		t.Fatalf("a database whose sessions default %s to %s: %v", setting, value, err)
	}
	return server
}

// TestDropSchemaOutlastsLockTimeout: dropping a schema waits for a lock
// held on one of its tables for longer than the sessions' lock_timeout.
// Autovacuum, analyzing the tables a run just filled, yields to a waiting
// DROP only after deadlock_timeout (a second by default, as long as the
// sessions' lock_timeout), so a drop that gave up then left the schema
// behind: the tests' schemas and fleet-bench's, whose catalogs then grew.
func TestDropSchemaOutlastsLockTimeout(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	ctx := context.Background()
	server := storetest.PostgresURL()
	name := fmt.Sprintf("test_drop_%d", time.Now().UnixNano())
	location, err := postgres.CreateSchema(ctx, server, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { postgres.DropSchema(ctx, server, name) })
	db, err := backend.Create(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	holder, err := pgx.Connect(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE jobs IN ACCESS SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	// Another session watches: inside the holder's transaction the view
	// of pg_stat_activity would stay as first read.
	watcher, err := pgx.Connect(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close(ctx)
	dropped := make(chan error, 1)
	go func() { dropped <- postgres.DropSchema(ctx, server, name) }()
	// Hold the lock until the drop has waited past the sessions' bound.
	waiting := func() (n int) {
		if err := watcher.QueryRow(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query = 'DROP SCHEMA IF EXISTS ' || $1 || ' CASCADE'`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(10 * time.Second)
	for waiting() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the drop never waited for the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-dropped:
		t.Fatalf("the drop gave up while a lock was held on one of the schema's tables: %v", err)
	case <-time.After(postgres.LockTimeout + 500*time.Millisecond):
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-dropped; err != nil {
		t.Fatalf("the drop once the lock was free: %v", err)
	}
	var left int
	if err := watcher.QueryRow(ctx, `SELECT COUNT(*) FROM pg_namespace WHERE nspname = $1`, name).Scan(&left); err != nil || left != 0 {
		t.Fatalf("schema %s left after the drop: %d (%v)", name, left, err)
	}
}
