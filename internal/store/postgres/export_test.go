package postgres

import (
	"context"
	"maps"
	"slices"

	"github.com/fleet/fleet/internal/store"
)

// CreateAtVersion applies only the first version migrations to the empty
// schema a URL names, as an older build would have left it.
func CreateAtVersion(ctx context.Context, location string, version int) error {
	return MigrateBetween(ctx, location, 0, version)
}

// MigrateBetween applies migrations from+1 to to, as a newer build would
// to a schema an older one left at from.
func MigrateBetween(ctx context.Context, location string, from, to int) error {
	d, err := openPool(location)
	if err != nil {
		return err
	}
	defer d.Close()
	for _, m := range Migrations()[from:to] {
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

// XactUpdates is how many row versions tx's connection has written to
// table, HOT or not, that it has not yet reported to the statistics:
// this transaction's and any earlier ones' still held.
func XactUpdates(ctx context.Context, tx *store.Tx, table string) (int64, error) {
	var n int64
	err := tx.Executor.(*conn).pipe.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_updated(to_regclass($1))`, table).Scan(&n)
	return n, err
}

// GenericPlans names the statements that run with generic plans, or may.
func GenericPlans() []string { return slices.Sorted(maps.Keys(statementPlans)) }

// PreparedPlans is how many times c's connection has planned the prepared
// statement named name (sqlc's name) generically and for its arguments.
func PreparedPlans(ctx context.Context, c store.Conn, name string) (generic, custom int64, err error) {
	err = c.(*conn).pipe.QueryRow(ctx, `SELECT COALESCE(SUM(generic_plans), 0)::bigint, COALESCE(SUM(custom_plans), 0)::bigint
		FROM pg_prepared_statements WHERE statement LIKE $1`, "-- name: "+name+" %").Scan(&generic, &custom)
	return generic, custom, err
}

// GenericPlanSetting is the SELECT that puts a transaction in the mode of
// statementPlans' generic statements.
func GenericPlanSetting() string { return "SELECT " + planSetting(planGeneric) }

// PoolConnsOpened is how many connections d's pool has opened.
func PoolConnsOpened(d store.Driver) int64 { return d.(*driver).conns.Stat().NewConnsCount() }

// TxSetting is a setting as tx's session shows it (transaction_isolation,
// synchronous_commit).
func TxSetting(ctx context.Context, tx *store.Tx, name string) (string, error) {
	var value string
	err := tx.Executor.(*conn).pipe.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&value)
	return value, err
}

// ApplyMigration applies m to the schema a URL names as a newer build's
// migration would be applied.
func ApplyMigration(ctx context.Context, location string, m store.Migration) error {
	d, err := openPool(location)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.migrateOne(ctx, m, false)
}
