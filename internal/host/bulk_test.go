package host_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestBulk: a bulk action acts on exactly the jobs its filter selects, in
// queue order, each as its own operation (a job no longer in a state the
// action takes is refused alone, and left as it was), at most
// operator.MaxBulkJobs a call with a cursor to go on; a dry run only counts.
func TestBulk(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 2)
		h := f.openAs(t, "", storetest.NewClock(time.Now()))
		sections := make([]string, 60)
		for i := range sections {
			sections[i] = []string{"summary", "terms", "actions", "links"}[i%4]
		}
		doc := "Bulk text. It must hold."
		for r := range 10 { // 600 jobs more, 150 of them links
			key := fmt.Sprint("bulk-", r)
			if _, err := h.Operator().SubmitReports(ctx, wire.ReportsRequest{Document: &doc, Sections: sections, IdempotencyKey: &key}); err != nil {
				t.Fatal(err)
			}
		}
		held := claim(t, h, caller("worker-1")) // claimed: cancel takes it too

		dry, err := h.Operator().Bulk(ctx, wire.BulkRequest{Action: "cancel", Filter: wire.JobFilter{Section: "links"}, DryRun: true})
		if err != nil || dry.Matched != 151 || dry.Done != 0 || len(dry.Results) != 0 {
			t.Fatalf("dry run: %+v, %v; want 151 links jobs counted, none acted on", dry, err)
		}
		var all []wire.BulkItem
		after, calls := "", 0
		for {
			res, err := h.Operator().Bulk(ctx, wire.BulkRequest{Action: "cancel", Filter: wire.JobFilter{State: wire.Queued}, After: after})
			if err != nil {
				t.Fatal(err)
			}
			calls++
			all = append(all, res.Results...)
			if len(res.Results) > 500 || res.Done != int64(len(res.Results)) {
				t.Fatalf("call %d: %d results, %d done", calls, len(res.Results), res.Done)
			}
			if after = res.Next; after == "" {
				break
			}
		}
		if calls != 2 || len(all) != 604-1 {
			t.Fatalf("%d calls cancelled %d queued jobs", calls, len(all))
		}
		for _, it := range all {
			if it.State != wire.CancelledBeforeDispatch || it.OperationID == held.OperationID {
				t.Fatalf("a queued job cancelled into %+v", it)
			}
		}
		// Requeue takes refused, unresolved and failed jobs only: every
		// cancelled one is refused, alone, and stays cancelled.
		req, err := h.Operator().Bulk(ctx, wire.BulkRequest{Action: "requeue", Filter: wire.JobFilter{Section: "links"}})
		if err != nil || req.Done != 0 || req.Refused[wire.CodeStateConflict] != 151 || req.Results[0].Error == nil {
			t.Fatalf("requeueing cancelled jobs: %+v, %v", req, err)
		}
		if st := jobState(t, h, held.OperationID).State; st != wire.Claimed {
			t.Fatalf("the claimed job, outside every filter used, is %s", st)
		}
		for _, bad := range []wire.BulkRequest{{Action: "delete"}, {Action: "cancel", Filter: wire.JobFilter{State: "sleeping"}},
			{Action: "cancel", After: "x"}} {
			if _, err := h.Operator().Bulk(ctx, bad); fleet.ErrorCode(err) != wire.CodeInvalid {
				t.Fatalf("%+v: %v", bad, err)
			}
		}
		f.verify(t)
	})
}
