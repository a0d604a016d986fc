package postgres

import (
	"context"

	"github.com/fleet/fleet/internal/store"
)

// CreateAtVersion applies only the first version migrations to the empty
// schema a URL names, as an older build would have left it.
func CreateAtVersion(ctx context.Context, location string, version int) error {
	d, err := openPool(location)
	if err != nil {
		return err
	}
	defer d.Close()
	for _, m := range Migrations()[:version] {
		if err := d.migrateOne(ctx, m, true); err != nil {
			return err
		}
	}
	return nil
}

// Exec runs one statement on the schema a URL names.
func Exec(ctx context.Context, location, query string, args ...any) error {
	d, err := openPool(location)
	if err != nil {
		return err
	}
	defer d.Close()
	_, err = d.pool.ExecContext(ctx, query, args...)
	return err
}

// OpenDriver opens a bare driver on an existing schema, with no store.DB
// (so no sequencer) reading its Placed channel.
func OpenDriver(ctx context.Context, location string) (store.Driver, error) {
	d, err := openPool(location)
	if err != nil {
		return nil, err
	}
	if err := d.resolveChannel(ctx); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}
