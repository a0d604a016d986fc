// Package hosttest opens hosts for tests as the fleet-host command does:
// it chooses the backend (store/backend) that the host package, which
// links no database driver, is handed.
package hosttest

import (
	"context"

	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/verify"
)

// Init is fleet-host init: a new state from in, its database the SQLite
// file in stateDir, or database (a postgres:// URL) when set.
func Init(ctx context.Context, stateDir, database string, in input.Input) error {
	location, err := backend.StateLocation(stateDir, database)
	if err != nil {
		return err
	}
	return host.Init(ctx, stateDir, func(ctx context.Context) (*store.DB, error) { return backend.Create(ctx, location) }, in)
}

// Open is fleet-host serve's opening of a state.
func Open(ctx context.Context, stateDir, database string, opts ...backend.Options) (*host.Host, error) {
	var o backend.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	return OpenWith(ctx, stateDir, database, o, host.Options{})
}

// OpenWith is Open with the host's options (its lease, identity,
// liveness) as a command would choose them.
func OpenWith(ctx context.Context, stateDir, database string, o backend.Options, ho host.Options) (*host.Host, error) {
	db, err := backend.OpenState(ctx, stateDir, database, o)
	if err != nil {
		return nil, err
	}
	return host.Open(ctx, stateDir, db, ho)
}

// Verify is fleet-host verify: the state checked whole, read-only.
func Verify(ctx context.Context, stateDir, database string) (verify.Report, error) {
	location, err := backend.StateLocation(stateDir, database)
	if err != nil {
		return verify.Report{}, err
	}
	db, err := backend.OpenReadOnly(ctx, location)
	if err != nil {
		return verify.Report{}, err
	}
	defer db.Close()
	return verify.State(ctx, stateDir, db)
}
