package postgres_test

import (
	"context"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
)

// TestAccountingShardsMigration: a database whose allowance is one row
// (schema 3) opens at schema 4 with the same figures, held in shards, and
// grants exactly what was available. Credits available only in pieces
// smaller than a reservation, on different shards, are spread so that a
// reservation they cover together is granted; the whole still refuses past
// the allowance.
func TestAccountingShardsMigration(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	t.Run(storetest.Postgres, func(t *testing.T) {
		ctx := context.Background()
		location := storetest.NewLocation(t)
		if err := postgres.CreateAtVersion(ctx, location, 3); err != nil {
			t.Fatal(err)
		}
		if err := postgres.Exec(ctx, location, `INSERT INTO accounting (id, allowance, spent, reserved, calls, cost_per_report)
			VALUES (1, 200, 40, 60, 5, 20)`); err != nil {
			t.Fatal(err)
		}
		db := storetest.MustOpen(t, location)
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			a, err := tx.AccountingGet(ctx, store.NoLock)
			if err != nil || a.Allowance != 200 || a.Spent != 40 || a.Reserved != 60 || a.Calls != 5 || a.Available != 100 || a.CostPerReport != 20 {
				t.Fatalf("migrated accounting %+v (%v)", a, err)
			}
			return nil
		})
		granted := 0
		for range 7 {
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				r, err := tx.AccountingReserve(ctx)
				a, ok := r.Accounting, r.OK
				if ok {
					granted++
				}
				if a.Available < 0 {
					t.Fatalf("went negative: %+v", a)
				}
				return err
			})
		}
		// The old reservations settle on shard 0, where the migration put them.
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			s, err := tx.AccountingMove(ctx, &store.AccountingMoveParams{Shard: -1, FromReserved: 60, ToSpent: 60})
			a, ok := s.Accounting, s.OK
			if err != nil || !ok || a.Spent != 100 || a.Reserved != 100 || a.Available != 0 || a.Calls != 10 {
				t.Fatalf("after settling the old reservations: %v %+v (%v)", ok, a, err)
			}
			return nil
		})
		if granted != 5 {
			t.Fatalf("granted %d of 100 available credits at 20", granted)
		}
		if err := postgres.Exec(ctx, location, `UPDATE accounting_shards SET allowance = allowance + 10 WHERE shard IN (7, 9)`); err != nil {
			t.Fatal(err)
		}
		for i, want := range []bool{true, false} {
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				r, err := tx.AccountingReserve(ctx)
				a, ok := r.Accounting, r.OK
				if err != nil || ok != want || a.Allowance != 220 || a.Available != 0 {
					t.Fatalf("reservation %d from two pieces of 10: %v %+v (%v)", i, ok, a, err)
				}
				return nil
			})
		}
	})
}
