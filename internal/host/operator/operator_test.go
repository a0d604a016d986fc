package operator_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/operator"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestOperator, on both backends: reports are enqueued once under their
// key (a repeat answers the same jobs, another request under it is an
// operation conflict); the allowance moves only from the figure the
// operator saw; a bulk cancel takes every queued job as its own
// operation; an action or reason the operator cannot mean is refused and
// changes nothing.
func TestOperator(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
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
			return tx.TenantInsert(ctx, store.Tenant{Name: wire.DefaultTenant, Weight: 1, CreatedAtMS: 1})
		})
		o := operator.New(ledger.New(db, kernel), nil, jobs.DefaultPolicy)
		doc, key := "Fleet review. Workers renew their leases.", "batch-1"
		req := wire.ReportsRequest{Document: &doc, Sections: []string{"summary", "terms"}, IdempotencyKey: &key}
		first, err := o.SubmitReports(ctx, req)
		if err != nil || len(first.OperationIDs) != 2 || first.Replayed {
			t.Fatalf("submit: %+v (%v)", first, err)
		}
		again, err := o.SubmitReports(ctx, req)
		if err != nil || !again.Replayed || again.OperationIDs[0] != first.OperationIDs[0] {
			t.Fatalf("the same submission again: %+v (%v)", again, err)
		}
		other := "Another document."
		if _, err := o.SubmitReports(ctx, wire.ReportsRequest{Document: &other, Sections: req.Sections, IdempotencyKey: &key}); fleet.ErrorCode(err) != wire.CodeOperationConflict {
			t.Fatalf("another request under the key: %v", err)
		}
		// A key is one line of plain text: it is shown wherever its report
		// is, so a terminal's escape or a line break in it is refused.
		for _, bad := range []string{"batch\x1b[31m", "two\nlines", "\u202eright-to-left"} {
			if _, err := o.SubmitReports(ctx, wire.ReportsRequest{Document: &doc, Sections: req.Sections, IdempotencyKey: &bad}); fleet.ErrorCode(err) != wire.CodeInvalid ||
				!strings.Contains(err.Error(), "idempotency_key") {
				t.Fatalf("the key %q: %v, want invalid_request naming it", bad, err)
			}
		}

		stale, raised, seen := int64(90), int64(150), int64(100)
		if _, err := o.SetAllowance(ctx, wire.AllowanceRequest{ExpectedAllowance: &stale, Allowance: &raised}); fleet.ErrorCode(err) != wire.CodeAllowanceConflict {
			t.Fatalf("an allowance set from a figure it no longer has: %v", err)
		}
		if acct, err := o.SetAllowance(ctx, wire.AllowanceRequest{ExpectedAllowance: &seen, Allowance: &raised}); err != nil || acct.Allowance != 150 {
			t.Fatalf("the allowance raised: %+v (%v)", acct, err)
		}

		for _, bad := range []wire.BulkRequest{{Action: "delete"}, {Action: "cancel", Reason: "two\nlines"}} {
			if _, err := o.Bulk(ctx, bad); fleet.ErrorCode(err) != wire.CodeInvalid {
				t.Fatalf("bulk %+v: %v", bad, err)
			}
		}
		res, err := o.Bulk(ctx, wire.BulkRequest{Action: "cancel", Filter: wire.JobFilter{State: wire.Queued}, Reason: "not needed"})
		if err != nil || res.Done != 2 || len(res.Results) != 2 || res.Results[0].State != wire.CancelledBeforeDispatch {
			t.Fatalf("bulk cancel of the queued jobs: %+v (%v)", res, err)
		}
	})
}
