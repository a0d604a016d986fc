package host

import (
	"context"
	"math"
	"strconv"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/views"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// MaxBulkJobs is the most jobs one bulk call acts on; the answer's next
// cursor continues after them.
const MaxBulkJobs = 500

// Bulk cancels or requeues the jobs a filter selects (as GET /admin/jobs
// selects them), in queue order from the cursor after, at most MaxBulkJobs
// a call. Each job is its own operation, as if asked one by one: its own
// transaction, fence, receipt and event, or its own refusal (a job that
// left the state it was selected in since is refused, state_conflict, and
// changes nothing). With DryRun nothing is done: the answer counts the
// jobs the filter selects now, all of them.
func (h *Host) Bulk(ctx context.Context, req wire.BulkRequest) (wire.BulkResult, error) {
	if len(req.Reason) > wire.MaxReasonBytes || !wire.IsPlainText(req.Reason) {
		return wire.BulkResult{}, fleet.Errorf(wire.CodeInvalid, "reason must be at most %d bytes of one line of UTF-8 text without control, format or separator characters", wire.MaxReasonBytes)
	}
	var act func(ctx context.Context, op string) (wire.JobState, error)
	switch req.Action {
	case "cancel":
		act = func(ctx context.Context, op string) (wire.JobState, error) {
			res, err := h.Cancel(ctx, op, req.Reason)
			return res.State, err
		}
	case "requeue":
		act = func(ctx context.Context, op string) (wire.JobState, error) {
			res, err := h.Requeue(ctx, op, req.Reason)
			return res.State, err
		}
	case "reconcile":
		act = func(ctx context.Context, op string) (wire.JobState, error) {
			res, err := h.Reconcile(ctx, op, req.Reason)
			return res.State, err
		}
	default:
		return wire.BulkResult{}, fleet.Errorf(wire.CodeInvalid, "action must be cancel, requeue or reconcile, got %.40q", req.Action)
	}
	takes := bulkTakes[req.Action]
	f, after, _, err := views.JobPageFilter(wire.JobPageQuery{State: req.Filter.State, Section: req.Filter.Section,
		Owner: req.Filter.Owner, Q: req.Filter.Q, After: req.After})
	if err != nil {
		return wire.BulkResult{}, err
	}
	through, err := bulkThrough(req.Through)
	if err != nil {
		return wire.BulkResult{}, err
	}
	res := wire.BulkResult{Action: req.Action, Refused: map[wire.Code]int64{}, Results: []wire.BulkItem{}}
	for {
		limit := MaxBulkJobs // a call acts on one page; a dry run reads on
		var page []store.Job
		if err := h.db.Read(ctx, func(tx *store.Tx) (err error) {
			page, err = tx.JobPage(ctx, &store.JobPageParams{Filter: f, After: after, Limit: limit + 1})
			return err
		}); err != nil {
			return res, err
		}
		more := len(page) > limit
		if more {
			page = page[:limit]
		}
		for _, j := range page {
			if j.Position > through {
				return res, nil // arrived after what the operator confirmed
			}
			after = j.Position
			res.Matched++
			if takes[j.State] {
				res.Applicable++
			}
			if req.DryRun {
				res.Through = strconv.FormatInt(j.Position, 10)
				continue
			}
			item := wire.BulkItem{OperationID: j.OperationID}
			if item.State, err = act(ctx, j.OperationID); err != nil {
				code := fleet.ErrorCode(err)
				if code == wire.CodeInternal || code == wire.CodeUnavailable {
					return res, err // the host's trouble, not the job's: stop, and say how far it got
				}
				item.Error = &wire.ErrorDetail{Code: code, Message: fleet.ErrorMessage(err)}
				res.Refused[code]++
			} else {
				res.Done++
			}
			res.Results = append(res.Results, item)
		}
		switch {
		case !more:
			return res, nil
		case !req.DryRun:
			res.Next = strconv.FormatInt(after, 10)
			return res, nil
		}
	}
}

// bulkThrough reads a bulk call's Through: the last place in the queue it
// acts on (no limit when "").
func bulkThrough(through string) (int64, error) {
	if through == "" {
		return math.MaxInt64, nil
	}
	n, err := strconv.ParseInt(through, 10, 64)
	if err != nil || n < 0 {
		return 0, fleet.Errorf(wire.CodeInvalid, "through %.40q is not a place this host gave (through of a dry run)", through)
	}
	return n, nil
}

// bulkTakes are the states each bulk action takes a job in, for a dry
// run's count of what it would act on (the action itself refuses the
// others alone, as its single call does).
var bulkTakes = map[string]map[wire.JobState]bool{
	"cancel":    {wire.Queued: true, wire.Claimed: true, wire.Running: true},
	"requeue":   {wire.Refused: true, wire.Unresolved: true, wire.Failed: true},
	"reconcile": {wire.Unresolved: true},
}
