// Package backend opens a Fleet database on the backend its location names:
// a postgres:// URL is PostgreSQL, anything else a SQLite file.
package backend

import (
	"context"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/store/sqlite"
)

// Options tune how a database is opened (SQLite's synchronous setting).
type Options = sqlite.Options

// Create makes a new database: at a path by exclusive creation, or in an
// empty PostgreSQL schema named by a URL.
func Create(ctx context.Context, location string) (*store.DB, error) {
	if store.IsURL(location) {
		return postgres.Create(ctx, location)
	}
	return sqlite.Create(ctx, location)
}

// Open opens an existing Fleet database, migrating an older schema forward.
func Open(ctx context.Context, location string, opts Options) (*store.DB, error) {
	if store.IsURL(location) {
		return postgres.Open(ctx, location, false)
	}
	return sqlite.Open(ctx, location, false, opts)
}

// OpenReadOnly opens an existing Fleet database for inspection only, e.g.
// `fleet-host verify` while a host serves the same state. It never migrates.
func OpenReadOnly(ctx context.Context, location string) (*store.DB, error) {
	if store.IsURL(location) {
		return postgres.Open(ctx, location, true)
	}
	return sqlite.Open(ctx, location, true, Options{})
}

// SchemaVersion is the newest schema this build understands (the same on
// both backends; a test checks).
func SchemaVersion() int { return len(sqlite.Migrations()) }
