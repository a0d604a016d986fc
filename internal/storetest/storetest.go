// Package storetest gives tests a fresh Fleet database on each backend:
// SQLite in a temp dir always, and PostgreSQL in a schema of its own when
// FLEET_TEST_POSTGRES_URL names a server.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/store/postgres"
)

// EnvPostgres names the PostgreSQL server the conformance suite's second
// half runs on, e.g. postgres://fleet@127.0.0.1:54329/postgres?sslmode=disable.
// .ci/run starts a throwaway one and sets it.
const EnvPostgres = "FLEET_TEST_POSTGRES_URL"

// Backend names, which are also the subtest names Each makes.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
)

// PostgresURL is the server to test on, or "".
func PostgresURL() string { return os.Getenv(EnvPostgres) }

// Each runs fn as a subtest on every backend: the same test, unchanged,
// against SQLite and against PostgreSQL. Without FLEET_TEST_POSTGRES_URL the
// PostgreSQL half is skipped, and says so.
func Each(t *testing.T, fn func(t *testing.T)) {
	t.Helper()
	t.Run(SQLite, fn)
	if PostgresURL() == "" {
		t.Run(Postgres, func(t *testing.T) {
			t.Skip("SKIPPED the PostgreSQL half: set " + EnvPostgres + " to a server (.ci/run starts one)")
		})
		return
	}
	t.Run(Postgres, fn)
}

// OnPostgres reports whether tb runs under Each's PostgreSQL half.
func OnPostgres(tb testing.TB) bool {
	return slices.Contains(strings.Split(tb.Name(), "/"), Postgres) && PostgresURL() != ""
}

// NewLocation returns where a new database for tb can be created: a path in
// tb's temp dir, or under the PostgreSQL half a URL whose search_path is a
// new empty schema (dropped at cleanup).
func NewLocation(tb testing.TB) string {
	tb.Helper()
	if !OnPostgres(tb) {
		return filepath.Join(tb.TempDir(), "fleet.sqlite3")
	}
	return NewPostgresLocation(tb)
}

// NewPostgresLocation returns the URL of a new empty schema on the server
// FLEET_TEST_POSTGRES_URL names, dropped at cleanup.
func NewPostgresLocation(tb testing.TB) string {
	tb.Helper()
	return NewPostgresLocationOn(tb, PostgresURL())
}

// NewPostgresLocationOn returns the URL of a new empty schema in the
// database server names, dropped at cleanup.
func NewPostgresLocationOn(tb testing.TB, server string) string {
	tb.Helper()
	suffix := make([]byte, 8)
	rand.Read(suffix)
	name := "test_" + hex.EncodeToString(suffix)
	ctx := context.Background()
	url, err := postgres.CreateSchema(ctx, server, name)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := postgres.DropSchema(ctx, server, name); err != nil {
			tb.Logf("drop schema %s: %v", name, err)
		}
	})
	return url
}

// MustCreate creates a database for tb and closes it at cleanup. It returns
// the database and its location, for MustOpen.
func MustCreate(tb testing.TB) (*store.DB, string) {
	tb.Helper()
	location := NewLocation(tb)
	db, err := backend.Create(context.Background(), location)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db, location
}

// MustOpen opens another handle (its own connections) on a location.
func MustOpen(tb testing.TB, location string) *store.DB {
	tb.Helper()
	db, err := backend.Open(context.Background(), location, backend.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// Write runs fn in one write transaction on db and fails tb on error.
func Write(tb testing.TB, db *store.DB, fn func(ctx context.Context, tx *store.Tx) error) {
	tb.Helper()
	ctx := context.Background()
	if err := db.WithTx(ctx, func(tx *store.Tx) error { return fn(ctx, tx) }); err != nil {
		tb.Fatal(err)
	}
}

// Read runs fn in one read transaction on db and fails tb on error.
func Read(tb testing.TB, db *store.DB, fn func(ctx context.Context, tx *store.Tx) error) {
	tb.Helper()
	ctx := context.Background()
	if err := db.Read(ctx, func(tx *store.Tx) error { return fn(ctx, tx) }); err != nil {
		tb.Fatal(err)
	}
}

// Clock is a clock a test moves by hand: set db.Now = clock.Now before the
// first write, then Advance instead of sleeping.
type Clock struct{ ms atomic.Int64 }

// NewClock starts a clock at start.
func NewClock(start time.Time) *Clock {
	c := &Clock{}
	c.ms.Store(start.UnixMilli())
	return c
}

// Now is the clock's time.
func (c *Clock) Now() time.Time { return time.UnixMilli(c.ms.Load()) }

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }
