package budget_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
)

func setup(t *testing.T, allowance, cost int64) (*store.DB, string) {
	t.Helper()
	db, path := storetest.MustCreate(t)
	if err := db.WithTx(context.Background(), func(tx *store.Tx) error { return budget.Init(context.Background(), tx, allowance, cost) }); err != nil {
		t.Fatal(err)
	}
	return db, path
}

func get(t *testing.T, db *store.DB) budget.Accounting {
	t.Helper()
	var a budget.Accounting
	if err := db.Read(context.Background(), func(tx *store.Tx) (err error) { a, err = budget.Get(context.Background(), tx); return err }); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestReserveRace: 48 goroutines on three independent connections reserve
// 20 credits each from 210: exactly 10 succeed and nothing goes negative.
func TestReserveRace(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		first, path := setup(t, 210, 20) // cost_per_report 20
		handles := []*store.DB{first, storetest.MustOpen(t, path), storetest.MustOpen(t, path)}
		var granted atomic.Int64
		var wg sync.WaitGroup
		for i := range 48 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := handles[i%3].WithTx(ctx, func(tx *store.Tx) error {
					ok, a, err := budget.ReserveReport(ctx, tx)
					if a.Available < 0 {
						t.Errorf("available went negative: %+v", a)
					}
					if ok {
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
		a := get(t, first)
		if granted.Load() != 10 || a.Reserved != 200 || a.Available != 10 || a.Calls != 10 {
			t.Fatalf("granted %d, accounting %+v", granted.Load(), a)
		}
	})
}

func TestSettleAndRelease(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		db, _ := setup(t, 100, 20)
		err := db.WithTx(ctx, func(tx *store.Tx) error {
			budget.ReserveReport(ctx, tx)
			budget.ReserveReport(ctx, tx)
			if _, err := budget.Settle(ctx, tx, 20); err != nil {
				return err
			}
			_, err := budget.Release(ctx, tx, 20)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if a := get(t, db); a.Spent != 20 || a.Reserved != 0 || a.Available != 80 {
			t.Fatalf("%+v", a)
		}
		// Settling more than is reserved is refused and changes nothing.
		err = db.WithTx(ctx, func(tx *store.Tx) error { _, err := budget.Settle(ctx, tx, 5); return err })
		if err == nil {
			t.Fatal("settled credits that were never reserved")
		}
	})
}

func TestSetAllowance(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		db, _ := setup(t, 50, 20)
		set := func(expected, allowance int64) error {
			return db.WithTx(ctx, func(tx *store.Tx) error {
				_, err := budget.SetAllowance(ctx, tx, expected, allowance)
				return err
			})
		}
		db.WithTx(ctx, func(tx *store.Tx) error { _, _, err := budget.ReserveReport(ctx, tx); return err })
		if err := set(49, 100); fleet.ErrorCode(err) != fleet.CodeAllowanceConflict {
			t.Fatalf("stale expectation: %v", err)
		}
		if err := set(50, 19); fleet.ErrorCode(err) != fleet.CodeInvalid {
			t.Fatalf("below reserved: %v", err)
		}
		if err := set(50, 100); err != nil {
			t.Fatal(err)
		}
		if a := get(t, db); a.Allowance != 100 || a.Available != 80 {
			t.Fatalf("%+v", a)
		}
	})
}

// TestPricesCredits: usage converts to whole credits, rounded up, capped.
func TestPricesCredits(t *testing.T) {
	p := budget.Prices{PromptPer1K: 2, CompletionPer1K: 10}
	for _, c := range []struct {
		usage budget.Usage
		want  int64
	}{
		{budget.Usage{PromptTokens: 1200, CompletionTokens: 300}, 6}, // 2.4 + 3.0
		{budget.Usage{PromptTokens: 1000, CompletionTokens: 0}, 2},
		{budget.Usage{PromptTokens: 1, CompletionTokens: 0}, 1}, // a partial credit is a credit
		{budget.Usage{}, 0},
		{budget.Usage{PromptTokens: budget.MaxTokens, CompletionTokens: budget.MaxTokens}, budget.MaxCredits},
	} {
		if got := p.Credits(c.usage); got != c.want {
			t.Errorf("%+v: %d credits, want %d", c.usage, got, c.want)
		}
	}
	if (budget.Usage{PromptTokens: -1}).Valid() || (budget.Usage{CompletionTokens: budget.MaxTokens + 1}).Valid() {
		t.Error("an impossible usage passed as valid")
	}
}
