// Package storetest gives tests a fresh Fleet database in a temp dir.
package storetest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/fleet/fleet/internal/store"
)

// MustCreate creates a database in tb's temp dir and closes it at cleanup.
func MustCreate(tb testing.TB) (*store.DB, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "fleet.sqlite3")
	db, err := store.Create(context.Background(), path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db, path
}

// MustOpen opens another handle (its own connections) on path.
func MustOpen(tb testing.TB, path string) *store.DB {
	tb.Helper()
	db, err := store.Open(context.Background(), path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}
