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

// TestTenantReservationsShareAShard: a transaction's reservations at one
// tenant go to the one shard it already holds, so a batch holds one of
// the tenant's shards, not most of them, and the other batches reserve
// beside it rather than waiting on it (before, each picked a random free
// shard: 32 reservations held most of the 16).
func TestTenantReservationsShareAShard(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	t.Run(storetest.Postgres, func(t *testing.T) {
		db, _ := storetest.MustCreate(t)
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			if err := tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 1000, CostPerReport: 1}); err != nil {
				return err
			}
			return tx.TenantInsert(ctx, store.Tenant{Name: wire.DefaultTenant, Weight: 1, CreatedAtMS: 1})
		})
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			shards := map[int64]bool{}
			for range 32 {
				r, err := tx.TenantReserve(ctx, wire.DefaultTenant)
				if err != nil || !r.OK {
					t.Fatalf("reserving at the tenant: %+v %v", r, err)
				}
				shards[r.Shard] = true
			}
			if len(shards) != 1 {
				t.Fatalf("32 reservations in one transaction took %d of the tenant's shards: %v", len(shards), shards)
			}
			return nil
		})
	})
}
