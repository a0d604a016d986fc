package claims_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/claims"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/registry"
	"github.com/fleet/fleet/internal/metrics"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/series"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestClaims, on both backends: a claim takes the oldest queued jobs, at
// most max; a keyed claim sent again answers the jobs it holds; a
// heartbeat renews a claim's lease and refuses another's; a job given
// back is queued again at once; a lease that lapses before dispatch puts
// the job back in the queue, counting the attempt; an empty queue says so.
func TestClaims(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		db, _ := storetest.MustCreate(t)
		kernel, err := receipts.NewKernel()
		if err != nil {
			t.Fatal(err)
		}
		db.SetSealer(kernel)
		clock := storetest.NewClock(time.Now())
		db.Now = clock.Now
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			if err := tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 100, CostPerReport: 20}); err != nil {
				return err
			}
			if err := tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1}); err != nil {
				return err
			}
			for i, op := range []string{"op-1", "op-2", "op-3"} {
				if err := tx.DocumentInsert(ctx, "doc-"+op, 1); err != nil {
					return err
				}
				if err := tx.JobInsert(ctx, &store.JobInsertParams{OperationID: op, Position: int64(i + 1), BatchKey: "b",
					Section: "summary", DocumentID: "doc-" + op, InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 3,
					BackoffBaseMS: 1000, BackoffCapMS: 60000, ExpectedSHA256: "want"}); err != nil {
					return err
				}
			}
			return nil
		})
		l := ledger.New(db, kernel)
		r := registry.New(l, t.TempDir())
		r.ID = "host-a"
		m := metrics.New(func(context.Context) (metrics.Snapshot, error) { return metrics.Snapshot{}, nil })
		c := claims.New(l, m, series.New(), r, nil, 30*time.Second, 0)
		w := fleet.Caller{ID: "worker-1"}
		const key = "0192f3a4-5b6c-7d8e-9f01-23456789abcd"

		first, err := c.ClaimKeyed(ctx, w, 1, 2, key, false)
		if err != nil || len(first.Jobs) != 2 || first.Jobs[0].OperationID != "op-1" || first.Jobs[1].OperationID != "op-2" {
			t.Fatalf("a claim of two: %+v (%v)", first, err)
		}
		again, err := c.ClaimKeyed(ctx, w, 1, 2, key, true)
		if err != nil || len(again.Jobs) != 2 || again.Jobs[0].Claim != first.Jobs[0].Claim {
			t.Fatalf("the claim sent again: %+v (%v), want the jobs it holds", again, err)
		}
		ref := func(j wire.ClaimedJob) wire.ClaimRef {
			return wire.ClaimRef{ClaimID: j.Claim.ClaimID, Generation: j.Claim.Generation}
		}
		clock.Advance(10 * time.Second)
		beat, err := c.Heartbeat(ctx, w, "op-1", ref(first.Jobs[0]))
		if err != nil || beat.LeaseExpiresAtMS != clock.Now().Add(30*time.Second).UnixMilli() {
			t.Fatalf("a heartbeat: %+v (%v)", beat, err)
		}
		if _, err := c.Heartbeat(ctx, w, "op-1", ref(first.Jobs[1])); fleet.ErrorCode(err) != wire.CodeStaleClaim {
			t.Fatalf("a heartbeat under another job's claim: %v", err)
		}
		if _, err := c.Release(ctx, w, "op-2", ref(first.Jobs[1])); err != nil {
			t.Fatal(err)
		}
		// op-1's lease lapses (renewed 10 s in, for 30 s); op-2 and op-3
		// are queued.
		clock.Advance(31 * time.Second)
		if n, err := c.ExpireLeases(ctx); err != nil || n != 1 {
			t.Fatalf("leases expired: %d (%v), want op-1's", n, err)
		}
		all, err := c.Claim(ctx, w, 1, 10)
		if err != nil || len(all.Jobs) != 3 {
			t.Fatalf("a claim of every queued job: %+v (%v)", all, err)
		}
		none, err := c.Claim(ctx, w, 1, 1)
		if err != nil || len(none.Jobs) != 0 || none.Queue != wire.QueueWaiting {
			t.Fatalf("a claim with every job claimed: %+v (%v)", none, err)
		}
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			j, err := tx.JobGet(ctx, "op-1", store.NoLock)
			if err != nil || j.Attempts != 1 {
				t.Fatalf("op-1, its lease lapsed before dispatch: %d attempts (%v), want 1", j.Attempts, err)
			}
			return nil
		})
	})
}
