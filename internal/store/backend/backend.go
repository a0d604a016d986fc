// Package backend opens a Fleet database on the backend its location names:
// a postgres:// URL is PostgreSQL, anything else a SQLite file. Only the
// commands (and test support) import it: they choose the database and hand
// the store to the host, verify and resource, which link no driver.
package backend

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/fleet/fleet/internal/statedir"
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

// StateLocation is where a state's database is: the SQLite file in
// stateDir, or database, which must then be a postgres:// URL (--database).
func StateLocation(stateDir, database string) (string, error) {
	if database != "" && !store.IsURL(database) {
		return "", fmt.Errorf("--database must be a postgres:// URL, got %q", database)
	}
	return statedir.Location(stateDir, database), nil
}

// ExistingStateLocation is StateLocation for a state that must exist.
// Without database, a state directory holding no SQLite database is most
// likely a state kept in PostgreSQL, and the error says how to open it.
func ExistingStateLocation(stateDir, database string) (string, error) {
	location, err := StateLocation(stateDir, database)
	if err != nil || database != "" {
		return location, err
	}
	if _, err := os.Stat(stateDir); errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("no state at %s (fleet-host init makes one)", stateDir)
	}
	if _, err := os.Stat(location); errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%s holds no SQLite database (%s): a state kept in PostgreSQL is opened with --database (or FLEET_DATABASE)",
			stateDir, filepath.Base(location))
	}
	return location, nil
}

// OpenState opens the database of an existing state (see
// ExistingStateLocation).
func OpenState(ctx context.Context, stateDir, database string, opts Options) (*store.DB, error) {
	location, err := ExistingStateLocation(stateDir, database)
	if err != nil {
		return nil, err
	}
	return Open(ctx, location, opts)
}
