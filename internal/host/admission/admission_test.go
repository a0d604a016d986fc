package admission_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/host/admission"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/views"
	"github.com/fleet/fleet/internal/metrics"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/series"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestAdmission, on both backends: with room for one report, the first
// claimed job is allowed (reserved, running, a signed receipt) and the
// second denied (refused); a repeat of the first answers its retained
// admission with the receipt as placed; a claim the job does not hold is
// stale, an unknown job not_found.
func TestAdmission(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		db, _ := storetest.MustCreate(t)
		kernel, err := receipts.NewKernel()
		if err != nil {
			t.Fatal(err)
		}
		db.SetSealer(kernel)
		var claimed []store.ClaimedJob
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			if err := tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 20, CostPerReport: 20}); err != nil {
				return err
			}
			if err := tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1}); err != nil {
				return err
			}
			for i, op := range []string{"op-1", "op-2"} {
				if err := tx.DocumentInsert(ctx, "doc-"+op, 1); err != nil {
					return err
				}
				if err := tx.JobInsert(ctx, &store.JobInsertParams{OperationID: op, Position: int64(i + 1), BatchKey: "b",
					Section: "summary", DocumentID: "doc-" + op, InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 3,
					BackoffBaseMS: 1000, BackoffCapMS: 60000, ExpectedSHA256: "want"}); err != nil {
					return err
				}
			}
			var err error
			claimed, err = tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: 2, ClaimPrefix: "c.", Worker: "worker-1",
				ClaimHost: "h", LeaseExpiresAtMS: tx.NowMS() + 60_000, NowMS: tx.NowMS()})
			return err
		})
		if len(claimed) != 2 {
			t.Fatalf("%d jobs claimed for the test", len(claimed))
		}
		l := ledger.New(db, kernel)
		m := metrics.New(func(context.Context) (metrics.Snapshot, error) { return metrics.Snapshot{}, nil })
		a := admission.New(l, m, series.New(), views.New(l, access.New(l, t.TempDir()), time.Minute),
			time.Minute)
		w := fleet.Caller{ID: "worker-1"}
		ref := func(j store.ClaimedJob) wire.ClaimRef {
			c := j.CurrentClaim()
			return wire.ClaimRef{ClaimID: c.ClaimID, Generation: c.Generation}
		}
		admit := func(j store.ClaimedJob) wire.Admission {
			t.Helper()
			raw, err := a.Dispatch(ctx, w, j.OperationID, ref(j))
			if err != nil {
				t.Fatal(err)
			}
			var adm wire.Admission
			json.Unmarshal(raw, &adm)
			return adm
		}
		first := admit(claimed[0])
		if first.Decision != wire.DecisionAllow || first.Receipt.Signature == "" || first.Accounting.Reserved != 20 {
			t.Fatalf("the first: %+v", first)
		}
		if second := admit(claimed[1]); second.Decision != wire.DecisionDeny || second.Accounting.Reserved != 20 {
			t.Fatalf("the second: %+v", second)
		}
		if again := admit(claimed[0]); again.Decision != wire.DecisionAllow || again.Receipt != first.Receipt {
			t.Fatalf("the first again: %+v, want its retained admission", again)
		}
		if _, err := a.Dispatch(ctx, w, "op-1", wire.ClaimRef{ClaimID: "another", Generation: 1}); fleet.ErrorCode(err) != wire.CodeStaleClaim {
			t.Fatalf("another claim: %v", err)
		}
		if _, err := a.Dispatch(ctx, w, "op-9", ref(claimed[0])); fleet.ErrorCode(err) != wire.CodeNotFound {
			t.Fatalf("an unknown job: %v", err)
		}
		for _, want := range []struct {
			op    string
			state wire.JobState
		}{{"op-1", wire.Running}, {"op-2", wire.Refused}} {
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				if j, err := tx.JobGet(ctx, want.op, store.NoLock); err != nil || j.State != want.state {
					t.Fatalf("%s is %s (%v), want %s", want.op, j.State, err, want.state)
				}
				return nil
			})
		}
	})
}
