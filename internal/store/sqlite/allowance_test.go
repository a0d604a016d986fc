package sqlite_test

import (
	"context"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestAllowanceWrittenAtCommit: the one writer decides a transaction's
// reservations and settlements at the fleet's allowance in the process, as
// it does at tenants: 32 of each run one statement (the row read at the
// first), and the commit writes the row as they left it.
func TestAllowanceWrittenAtCommit(t *testing.T) {
	t.Parallel()
	db, _ := storetest.MustCreate(t)
	ctx := context.Background()
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		return tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 1000, CostPerReport: 20})
	})
	c, err := db.Driver().BeginWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Rollback()
	before := c.Statements()
	for i := range 32 {
		r, err := c.AccountingReserve(ctx)
		if err != nil || !r.OK || r.Accounting.Reserved != 20 || r.Accounting.Calls != int64(i+1) {
			t.Fatalf("reservation %d: %+v, %v", i, r, err)
		}
		m, err := c.AccountingMove(ctx, &store.AccountingMoveParams{Shard: r.Shard, FromReserved: 20, ToSpent: 20})
		if err != nil || !m.OK || m.Accounting.Spent != int64(20*(i+1)) || m.Accounting.Reserved != 0 {
			t.Fatalf("settlement %d: %+v, %v", i, m, err)
		}
	}
	if n := c.Statements() - before; n > 1 {
		t.Errorf("32 reservations and 32 settlements ran %d statements; want 1, the allowance read once", n)
	}
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
	want := wire.Accounting{Unit: "credits", Allowance: 1000, Spent: 640, Available: 360, Calls: 32, CostPerReport: 20}
	storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
		if a, err := tx.AccountingGet(ctx, store.NoLock); err != nil || a != want {
			t.Fatalf("after commit: %+v, %v; want %+v", a, err, want)
		}
		return nil
	})
}

// TestAllowanceSettlementPastItsChecks: a settlement the allowance row's
// CHECKs would refuse (more spent than the allowance) is an error, as the
// UPDATE's constraint failure was, and changes nothing.
func TestAllowanceSettlementPastItsChecks(t *testing.T) {
	t.Parallel()
	db, _ := storetest.MustCreate(t)
	ctx := context.Background()
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		return tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 100, CostPerReport: 20})
	})
	c, err := db.Driver().BeginWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Rollback()
	if r, err := c.AccountingReserve(ctx); err != nil || !r.OK {
		t.Fatalf("reservation: %+v, %v", r, err)
	}
	if m, err := c.AccountingMove(ctx, &store.AccountingMoveParams{Shard: -1, FromReserved: 20, ToSpent: 200}); err == nil || m.OK {
		t.Fatalf("200 spent of an allowance of 100: %+v, %v; want an error", m, err)
	}
	want := wire.Accounting{Unit: "credits", Allowance: 100, Reserved: 20, Available: 80, Calls: 1, CostPerReport: 20}
	if a, err := c.AccountingGet(ctx, store.NoLock); err != nil || a != want {
		t.Fatalf("after the refused settlement: %+v, %v; want %+v", a, err, want)
	}
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
	storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
		if a, err := tx.AccountingGet(ctx, store.NoLock); err != nil || a != want {
			t.Fatalf("after commit: %+v, %v; want %+v", a, err, want)
		}
		return nil
	})
}
