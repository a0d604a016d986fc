package registry_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/registry"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestRegistry, on both backends: two hosts register; one that goes
// unseen past the liveness window is retired by the other's prompt beat
// (its unclean stop recorded once), learns it at its own next beat and
// serves again; a second process under a live host's identity takes it
// over, and the first's beat says so; a clean stop is recorded.
func TestRegistry(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		db, location := storetest.MustCreate(t)
		kernel, err := receipts.NewKernel()
		if err != nil {
			t.Fatal(err)
		}
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			return tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 100, CostPerReport: 20})
		})
		clock := storetest.NewClock(time.Now())
		host := func(id string) *registry.Registry {
			db := storetest.MustOpen(t, location)
			db.Now = clock.Now
			db.SetSealer(kernel)
			r := registry.New(ledger.New(db, kernel), t.TempDir())
			r.ID = id
			if err := r.Start(ctx, "http://"+id); err != nil {
				t.Fatal(err)
			}
			return r
		}
		stops := func() (clean, unclean int, rejoined int) {
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				evs, err := tx.EventList(ctx, 0, 100)
				for _, e := range evs {
					switch {
					case e.Kind == wire.EventHostStopped && strings.Contains(string(e.Data), `"clean":true`):
						clean++
					case e.Kind == wire.EventHostStopped:
						unclean++
					case e.Kind == wire.EventHostRestarted:
						rejoined++
					}
				}
				return err
			})
			return
		}
		a, b := host("a"), host("b")
		// b beats on time (every fifth of the window), a not at all.
		for range 6 {
			clock.Advance(registry.DefaultHostLiveness / 5)
			if err := b.Beat(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if _, unclean, _ := stops(); unclean != 1 {
			t.Fatalf("after a went unseen past the window and b beat: %d unclean stops, want 1", unclean)
		}
		if err := b.Beat(ctx); err != nil {
			t.Fatal(err)
		}
		if err := a.Beat(ctx); err != nil {
			t.Fatalf("a, taken for gone, beating again: %v", err)
		}
		if _, unclean, rejoined := stops(); unclean != 1 || rejoined != 1 {
			t.Fatalf("a retired once and rejoined once: %d unclean stops, %d rejoined", unclean, rejoined)
		}
		a2 := host("a")
		if err := a.Beat(ctx); !errors.Is(err, registry.ErrTakenOver) {
			t.Fatalf("a's beat after another process took its identity over: %v", err)
		}
		if err := a2.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if clean, _, _ := stops(); clean != 1 {
			t.Fatalf("%d clean stops, want a2's", clean)
		}
	})
}
