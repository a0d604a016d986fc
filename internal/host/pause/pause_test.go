package pause_test

import (
	"context"
	"testing"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/pause"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestSwitch, on both backends: a pause is read by every claim's check
// from its commit, signed and logged once; pausing paused claims or
// resuming running ones changes nothing and signs nothing; a reason that
// is not one line of plain text is refused.
func TestSwitch(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		db, _ := storetest.MustCreate(t)
		kernel, err := receipts.NewKernel()
		if err != nil {
			t.Fatal(err)
		}
		db.SetSealer(kernel)
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			return tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 100, CostPerReport: 20})
		})
		s := pause.New(ledger.New(db, kernel))
		paused := func() bool {
			var p bool
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) (err error) {
				p, err = pause.Paused(ctx, tx)
				return err
			})
			return p
		}
		if paused() {
			t.Fatal("a new state's claims are paused")
		}
		if _, err := s.Pause(ctx, "two\nlines"); fleet.ErrorCode(err) != wire.CodeInvalid {
			t.Fatalf("a reason of two lines: %v", err)
		}
		st, err := s.Pause(ctx, "incident 42")
		if err != nil || !st.Paused || !st.Changed || st.Reason != "incident 42" || st.ReceiptID == "" || !paused() {
			t.Fatalf("pause: %+v (%v)", st, err)
		}
		if again, err := s.Pause(ctx, "again"); err != nil || again.Changed || again.Reason != "incident 42" {
			t.Fatalf("pausing paused claims: %+v (%v)", again, err)
		}
		if st, err := s.Resume(ctx); err != nil || st.Paused || !st.Changed || paused() {
			t.Fatalf("resume: %+v (%v)", st, err)
		}
		if again, err := s.Resume(ctx); err != nil || again.Changed {
			t.Fatalf("resuming running claims: %+v (%v)", again, err)
		}
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			evs, err := tx.EventList(ctx, 0, 10)
			if err != nil || len(evs) != 2 || evs[0].Kind != wire.EventClaimsPaused || evs[1].Kind != wire.EventClaimsResumed {
				t.Fatalf("the log: %+v (%v)", evs, err)
			}
			return nil
		})
	})
}
