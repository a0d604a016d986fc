package storetest

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

func testAccountingInsertGet(t *testing.T, s *suite) {
	f := s.setup(t)
	f.refused("a second allowance", func(ctx context.Context, tx *store.Tx) error {
		return tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 5, CostPerReport: 1})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for _, lock := range []store.Lock{store.NoLock, store.ForUpdate} {
			if a := must(tx.AccountingGet(ctx, lock)); a != (wire.Accounting{Unit: "credits", Allowance: 100, Available: 100, CostPerReport: 20}) {
				t.Fatalf("accounting (%v) %+v", lock, a)
			}
		}
		return nil
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if a := must(tx.AccountingGet(ctx, store.NoLock)); a.Allowance != 100 {
			t.Fatalf("read-only accounting %+v", a)
		}
		return nil
	})
}

func testAccountingReserve(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for i := range 6 {
			r := must(tx.AccountingReserve(ctx))
			if r.OK != (i < 5) || r.Accounting.Reserved != int64(min(i+1, 5))*20 || r.Accounting.Calls != int64(min(i+1, 5)) ||
				r.Accounting.Available < 0 || r.OK && r.Shard < 0 || !r.OK && r.Shard != -1 {
				t.Fatalf("reservation %d: %+v", i, r)
			}
		}
		return nil
	})
	testAccountingReserveSavepoints(t, s)
	// 48 requests on two handles (hosts) reserve 20 each from 100:
	// exactly 5 succeed, never negative.
	f = s.setup(t)
	other := f.open()
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			err := []*store.DB{f.db, other}[i%2].WithTx(ctx, func(tx *store.Tx) error {
				r, err := tx.AccountingReserve(ctx)
				if r.Accounting.Available < 0 {
					t.Errorf("available went negative: %+v", r)
				}
				if r.OK {
					granted.Add(1)
				}
				return err
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	f.read(func(ctx context.Context, tx *store.Tx) error {
		a := must(tx.AccountingGet(ctx, store.NoLock))
		if granted.Load() != 5 || a.Reserved != 100 || a.Available != 0 || a.Calls != 5 {
			t.Fatalf("granted %d, accounting %+v", granted.Load(), a)
		}
		return nil
	})
}

// testAccountingReserveSavepoints: within one write transaction, a
// reservation or settlement rolled back to its savepoint is undone, one
// released with its savepoint is kept, a read sees what the transaction
// decided, and the commit writes it.
func testAccountingReserveSavepoints(t *testing.T, s *suite) {
	f := s.setup(t)
	ctx := context.Background()
	c := must(f.db.Driver().BeginWrite(ctx))
	defer c.Rollback()
	must(c.AccountingReserve(ctx))
	for _, undo := range []bool{true, false} {
		if err := c.Savepoint(ctx, "item"); err != nil {
			t.Fatal(err)
		}
		if r := must(c.AccountingReserve(ctx)); !r.OK || r.Accounting.Reserved != 40 || r.Accounting.Calls != 2 {
			t.Fatalf("in the savepoint: %+v", r)
		}
		if m := must(c.AccountingMove(ctx, &store.AccountingMoveParams{Shard: -1, FromReserved: 20, ToSpent: 5})); !m.OK ||
			m.Accounting.Reserved != 20 || m.Accounting.Spent != 5 {
			t.Fatalf("settled in the savepoint: %+v", m)
		}
		if undo {
			if err := c.RollbackTo(ctx, "item"); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Release(ctx, "item"); err != nil {
			t.Fatal(err)
		}
	}
	want := wire.Accounting{Unit: "credits", Allowance: 100, Spent: 5, Reserved: 20, Available: 75, Calls: 2, CostPerReport: 20}
	if a := must(c.AccountingGet(ctx, store.ForUpdate)); a != want {
		t.Fatalf("read in the transaction after a savepoint rolled back and one released: %+v, want %+v", a, want)
	}
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if a := must(tx.AccountingGet(ctx, store.NoLock)); a != want {
			t.Fatalf("after commit: %+v, want %+v", a, want)
		}
		return nil
	})
}

func testAccountingMove(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		var shards []int64
		for range 5 {
			shards = append(shards, must(tx.AccountingReserve(ctx)).Shard)
		}
		// Settle 20 of one reservation as spent and release another's 20,
		// from any shard.
		m := must(tx.AccountingMove(ctx, &store.AccountingMoveParams{Shard: -1, FromReserved: 40, ToSpent: 20}))
		if a := m.Accounting; !m.OK || a.Spent != 20 || a.Reserved != 60 || a.Available != 20 || a.Calls != 5 {
			t.Fatalf("move: %+v", m)
		}
		// Settling where a reservation was made.
		m = must(tx.AccountingMove(ctx, &store.AccountingMoveParams{Shard: shards[4], FromReserved: 20, ToSpent: 20}))
		if a := m.Accounting; !m.OK || a.Spent != 40 || a.Reserved != 40 {
			t.Fatalf("move on the reserving shard %d: %+v", shards[4], m)
		}
		// Moving more than is reserved is refused and changes nothing.
		m = must(tx.AccountingMove(ctx, &store.AccountingMoveParams{Shard: -1, FromReserved: 41, ToSpent: 41}))
		if m.OK || m.Accounting.Reserved != 40 || m.Accounting.Spent != 40 {
			t.Fatalf("over-move: %+v", m)
		}
		return nil
	})
}

func testAccountingSetAllowance(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		a := must(tx.AccountingSetAllowance(ctx, 150))
		if a != (wire.Accounting{Unit: "credits", Allowance: 150, Available: 150, CostPerReport: 20}) {
			t.Fatalf("%+v", a)
		}
		return nil
	})
	// The database's own check refuses an allowance below what is held.
	f.refused("an allowance below what is reserved", func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.AccountingReserve(ctx); err != nil {
			return err
		}
		_, err := tx.AccountingSetAllowance(ctx, 10)
		return err
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if a := must(tx.AccountingGet(ctx, store.NoLock)); a.Allowance != 150 || a.Reserved != 0 {
			t.Fatalf("after the refusal: %+v", a)
		}
		return nil
	})
}

func testAccountingHold(t *testing.T, s *suite) {
	// The shard holding a job's reservation is the holder's until it ends:
	// where the allowance is sharded (several writers) a settlement on it
	// waits; with one writer it is a no-op. The figures never change.
	f := s.setup(t)
	ctx := context.Background()
	j := f.run() // op-1, holding 20 on its shard
	first := must(f.db.Driver().BeginWrite(ctx))
	defer first.Rollback()
	if err := first.AccountingHold(ctx, []string{j.OperationID, "op-2", "nope", j.OperationID}); err != nil { // unreserved, unknown and repeated jobs are fine
		t.Fatal(err)
	}
	if a := must(first.AccountingGet(ctx, store.NoLock)); a.Reserved != 20 || a.Available != 80 {
		t.Fatalf("holding changed the figures: %+v", a)
	}
	if f.db.Driver().Writers() > 1 {
		waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		second := must(f.db.Driver().BeginWrite(ctx)) // only the settlement is bounded: beginning may wait on a loaded machine
		defer second.Rollback()
		if _, err := second.AccountingMove(waitCtx, &store.AccountingMoveParams{Shard: j.ReserveShard, FromReserved: 20, ToSpent: 20}); err == nil {
			t.Fatal("a settlement on a held shard went through while it was held")
		}
		second.Rollback()
	}
	first.Rollback()
	if f.db.Driver().Writers() > 1 {
		// The tenant's shard holding the job's part is held too (by a
		// holder of its own: one left idle longer than the server allows
		// is ended, and its locks with it).
		holder := must(f.db.Driver().BeginWrite(ctx))
		defer holder.Rollback()
		if err := holder.AccountingHold(ctx, []string{j.OperationID}); err != nil {
			t.Fatal(err)
		}
		waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		other := must(f.db.Driver().BeginWrite(ctx))
		defer other.Rollback()
		// The settlement may wait to go out with the next statement.
		ok, err := other.TenantMove(waitCtx, &store.TenantMoveParams{Tenant: j.Tenant, Shard: j.TenantShard, FromReserved: 20, ToSpent: 20})
		if err == nil {
			_, err = other.TenantGet(waitCtx, j.Tenant)
		}
		if err == nil {
			t.Fatalf("a settlement on a held tenant shard went through while it was held (%v)", ok)
		}
		other.Rollback()
		holder.Rollback()
	}
	// Once the holder ends, the same settlement goes through.
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if m := must(tx.AccountingMove(ctx, &store.AccountingMoveParams{Shard: j.ReserveShard, FromReserved: 20, ToSpent: 20})); !m.OK || m.Accounting.Spent != 20 {
			t.Fatalf("settling after the hold ended: %+v", m)
		}
		return nil
	})

	// The holder's own settlements on the held shard are what they would
	// be alone, a savepoint rolled back undoes one, a settlement of more
	// than is reserved is refused, and commit writes them.
	f = s.setup(t)
	j = f.run()
	holder := must(f.db.Driver().BeginWrite(ctx))
	defer holder.Rollback()
	settle := func(from, spent int64) store.Settlement {
		return must(holder.AccountingMove(ctx, &store.AccountingMoveParams{Shard: j.ReserveShard, FromReserved: from, ToSpent: spent}))
	}
	if err := holder.AccountingHold(ctx, []string{j.OperationID}); err != nil {
		t.Fatal(err)
	}
	rolledBack(t, holder, func() {
		if m := settle(20, 20); !m.OK || m.Accounting.Spent != 20 || m.Accounting.Reserved != 0 {
			t.Fatalf("settling while holding: %+v", m)
		}
	})
	if a := must(holder.AccountingGet(ctx, store.NoLock)); a.Reserved != 20 || a.Spent != 0 {
		t.Fatalf("a settlement rolled back to its savepoint stayed: %+v", a)
	}
	if m := settle(20, 5); !m.OK || m.Accounting != (wire.Accounting{Allowance: 100, Spent: 5, Available: 95, Calls: 1, CostPerReport: 20, Unit: "credits"}) {
		t.Fatalf("settling part while holding: %+v", m)
	}
	if m := settle(20, 20); m.OK {
		t.Fatalf("a second settlement of one reservation went through: %+v", m)
	}
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if a := must(tx.AccountingGet(ctx, store.NoLock)); a.Spent != 5 || a.Reserved != 0 || a.Available != 95 {
			t.Fatalf("after the holder committed: %+v", a)
		}
		return nil
	})
	testTenantMoveHeld(t, s)
}

func testAccountingReserveAhead(t *testing.T, s *suite) {
	// Reservations taken ahead hand out exactly what reserving one at a
	// time would, figures and all, including past those taken ahead and
	// after a savepoint rolled back; what was not handed out goes back at
	// commit, leaving the allowance as the reservations made alone would.
	ctx := context.Background()
	reserve := func(c store.Conn, n int) (out []wire.Accounting) {
		for range n {
			r := must(c.AccountingReserve(ctx))
			if !r.OK || r.Shard < 0 {
				t.Fatalf("reservation refused: %+v", r)
			}
			out = append(out, r.Accounting)
		}
		return out
	}
	for _, takeAhead := range []int{3, 7, 10} {
		f := s.setup(t)
		f.write(func(ctx context.Context, tx *store.Tx) error {
			_, err := tx.AccountingSetAllowance(ctx, 10_000) // shards of many reservations each
			return err
		})
		alone := must(f.db.Driver().BeginWrite(ctx))
		defer alone.Rollback()
		want := reserve(alone, 7)
		wantAfter := must(alone.AccountingGet(ctx, store.NoLock))
		if err := alone.Rollback(); err != nil {
			t.Fatal(err)
		}
		c := must(f.db.Driver().BeginWrite(ctx))
		defer c.Rollback() // a failure ends the test with it open
		if err := c.AccountingReserveAhead(ctx, takeAhead); err != nil {
			t.Fatal(err)
		}
		got := reserve(c, 2)
		rolledBack(t, c, func() { reserve(c, 1) }) // handed out again below
		got = append(got, reserve(c, 5)...)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("taking %d ahead, reservations\n%+v\nwant\n%+v", takeAhead, got, want)
		}
		commitAsHosts(t, c)
		f.read(func(ctx context.Context, tx *store.Tx) error {
			if after := must(tx.AccountingGet(ctx, store.NoLock)); after != wantAfter {
				t.Fatalf("taking %d ahead, the allowance after the rest went back: %+v, want %+v", takeAhead, after, wantAfter)
			}
			return nil
		})
	}
	// Once those taken ahead are all handed out, a settlement in the same
	// transaction is the allowance's as usual: 40 reserved in all, 20 of
	// them on the shard reserved ahead and 20 on another (op-1's), settle
	// together.
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		_, err := tx.AccountingSetAllowance(ctx, 10_000)
		return err
	})
	f.run() // op-1 holds 20
	c := must(f.db.Driver().BeginWrite(ctx))
	defer c.Rollback()
	if err := c.AccountingReserveAhead(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r := must(c.AccountingReserve(ctx))
	if !r.OK || r.Accounting.Reserved != 40 {
		t.Fatalf("the reservation taken ahead: %+v", r)
	}
	// Named by the shard the reservation came from, which holds only 20.
	if m := must(c.AccountingMove(ctx, &store.AccountingMoveParams{Shard: r.Shard, FromReserved: 40, ToSpent: 40})); !m.OK {
		t.Fatalf("settling all 40 reserved after reserving ahead: %+v", m)
	}
	if err := c.Commit(); err != nil {
		t.Fatalf("committing a settlement after reserving ahead: %v", err)
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if a := must(tx.AccountingGet(ctx, store.NoLock)); a.Spent != 40 || a.Reserved != 0 {
			t.Fatalf("after the settlement: %+v", a)
		}
		return nil
	})
}
