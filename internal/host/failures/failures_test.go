package failures_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/failures"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/metrics"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/series"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestRefusals: a failure that is not one (no claim, no reason, a reason
// that is not one line of plain text or is too long, implausible usage)
// is invalid_request, one for a job that does not exist not_found, and
// one under a claim the job does not hold stale_claim; none writes
// anything, alone or as a batch item beside the others.
func TestRefusals(t *testing.T) {
	ctx := context.Background()
	db, _ := storetest.MustCreate(t)
	kernel, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	db.SetSealer(kernel)
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 100, CostPerReport: 20}); err != nil {
			return err
		}
		if err := tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1}); err != nil {
			return err
		}
		if err := tx.DocumentInsert(ctx, "doc-1", 1); err != nil {
			return err
		}
		return tx.JobInsert(ctx, &store.JobInsertParams{OperationID: "op-1", Position: 1, BatchKey: "b", Section: "summary",
			DocumentID: "doc-1", InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 3, BackoffBaseMS: 1000, BackoffCapMS: 60000,
			ExpectedSHA256: "want"})
	})
	m := metrics.New(func(context.Context) (metrics.Snapshot, error) { return metrics.Snapshot{}, nil })
	f := failures.New(ledger.New(db, kernel), m, series.New(), nil)
	w := fleet.Caller{ID: "worker-1"}
	claim := func(r wire.FailRequest) wire.FailRequest {
		r.ClaimID, r.Generation = "c-1", 1
		return r
	}
	negative := int64(-1)
	for _, c := range []struct {
		name string
		op   string
		req  wire.FailRequest
		code wire.Code
	}{
		{"no claim", "op-1", wire.FailRequest{Reason: "x"}, wire.CodeInvalid},
		{"no reason", "op-1", claim(wire.FailRequest{}), wire.CodeInvalid},
		{"two lines", "op-1", claim(wire.FailRequest{Reason: "a\nb"}), wire.CodeInvalid},
		{"too long", "op-1", claim(wire.FailRequest{Reason: strings.Repeat("x", wire.MaxReasonBytes+1)}), wire.CodeInvalid},
		{"negative usage", "op-1", claim(wire.FailRequest{Reason: "x", Usage: &wire.Usage{PromptTokens: negative}}), wire.CodeInvalid},
		{"unknown job", "op-9", claim(wire.FailRequest{Reason: "x"}), wire.CodeNotFound},
		{"not its claim", "op-1", claim(wire.FailRequest{Reason: "x"}), wire.CodeStaleClaim},
	} {
		if _, err := f.Fail(ctx, w, c.op, c.req); fleet.ErrorCode(err) != c.code {
			t.Errorf("%s: %v, want %s", c.name, err, c.code)
		}
		answers, err := f.FailMany(ctx, w, []ledger.JobCall[wire.FailRequest]{{OperationID: c.op, Request: c.req}})
		if err != nil || len(answers) != 1 || fleet.ErrorCode(answers[0].Err) != c.code {
			t.Errorf("%s as a batch item: %+v (%v), want %s", c.name, answers, err, c.code)
		}
	}
	storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
		j, err := tx.JobGet(ctx, "op-1", store.NoLock)
		evs, _ := tx.EventList(ctx, 0, 10)
		if err != nil || j.State != wire.Queued || j.Attempts != 0 || len(evs) != 0 {
			t.Fatalf("after only refusals: %s with %d attempts, %d events (%v)", j.State, j.Attempts, len(evs), err)
		}
		return nil
	})
}
