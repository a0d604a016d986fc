package postgres_test

import (
	"context"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestTenantsMigration: a database from before tenants (schema 12) opens
// with one tenant, default, holding the fleet's figures and no allowance
// of its own, so its reservations settle and it admits what the fleet does.
func TestTenantsMigration(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	t.Run(storetest.Postgres, func(t *testing.T) {
		ctx := context.Background()
		location := storetest.NewLocation(t)
		if err := postgres.CreateAtVersion(ctx, location, 12); err != nil {
			t.Fatal(err)
		}
		if err := postgres.Exec(ctx, location, `INSERT INTO accounting_settings (id, cost_per_report) VALUES (1, 20);
			INSERT INTO accounting_shards (shard, allowance, spent, reserved, calls) SELECT g, CASE WHEN g = 0 THEN 200 ELSE 0 END,
				CASE WHEN g = 0 THEN 40 ELSE 0 END, CASE WHEN g = 0 THEN 60 ELSE 0 END, CASE WHEN g = 0 THEN 5 ELSE 0 END
			FROM generate_series(0, 31) AS g`); err != nil {
			t.Fatal(err)
		}
		checkTenantsMigrated(t, storetest.MustOpen(t, location))
	})
}

func checkTenantsMigrated(t *testing.T, db *store.DB) {
	t.Helper()
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		all, err := tx.TenantList(ctx)
		if err != nil || len(all) != 1 || all[0].Name != wire.DefaultTenant || all[0].Allowance != nil || all[0].Spent != 40 ||
			all[0].Reserved != 60 || all[0].Period != "" {
			t.Fatalf("tenants after the migration: %+v (%v)", all, err)
		}
		if ok, err := tx.TenantMove(ctx, &store.TenantMoveParams{Tenant: wire.DefaultTenant, Shard: -1, FromReserved: 60, ToSpent: 60}); err != nil || !ok {
			t.Fatalf("settling the old reservations at the tenant: %v %v", ok, err)
		}
		for range 5 {
			if r, err := tx.TenantReserve(ctx, wire.DefaultTenant); err != nil || !r.OK {
				t.Fatalf("reserving at the migrated tenant: %+v %v", r, err)
			}
		}
		return nil
	})
}
