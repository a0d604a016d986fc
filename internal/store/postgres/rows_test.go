package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
)

// TestClaimAndAdmitWritesEachJobOnce: a claim of 32 jobs and their
// admissions in one transaction write 64 versions of the jobs' rows
// (claimed, then running), and 32 when the claim's rows are held
// (Tx.HoldClaims, as a claim that admits holds them): each job's row is
// written once, claimed and admitted together. PostgreSQL's own count
// of the transaction's updates says so.
func TestClaimAndAdmitWritesEachJobOnce(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	ctx := context.Background()
	location := queued(t, 64, "2")
	db, err := backend.Open(ctx, location, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, c := range []struct {
		held bool
		want int64
	}{{false, 64}, {true, 32}} {
		var updates int64
		err := db.WithTx(ctx, func(tx *store.Tx) error {
			// The backend's counts not yet reported (PostgreSQL 15's
			// "xact" figures) include earlier transactions': this one's are
			// the difference across it.
			before, err := postgres.XactUpdates(ctx, tx, "jobs")
			if err != nil {
				return err
			}
			if c.held {
				tx.HoldClaims()
			}
			claimed, err := tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: 32, ClaimPrefix: fmt.Sprint(c.held, "."), Worker: "w1",
				ClaimHost: "h", LeaseExpiresAtMS: 500, NowMS: 100})
			if err != nil || len(claimed) != 32 {
				return fmt.Errorf("claimed %d: %w", len(claimed), err)
			}
			for _, j := range claimed {
				if err := tx.JobSetRunning(ctx, &store.JobSetRunningParams{OperationID: j.OperationID, IfClaimID: j.ClaimID, Reserved: 1,
					ReserveShard: 0, TenantShard: 0, Admission: []byte(`{}`), LeaseExpiresAtMS: 600, NowMS: 100}); err != nil {
					return err
				}
			}
			if err := tx.WriteHeld(ctx); err != nil {
				return err
			}
			after, err := postgres.XactUpdates(ctx, tx, "jobs")
			updates = after - before
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if updates != c.want {
			t.Errorf("32 jobs claimed and admitted (rows held: %v) wrote %d versions of their rows, want %d", c.held, updates, c.want)
		}
	}
}
