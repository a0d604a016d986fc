// Package failures is a failed attempt: what it cost settled and the rest
// released, the attempt counted with its reason, and the job queued again
// after its backoff or failed, signed and logged in one transaction; a
// repeat under the same claim answered as before.
package failures

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/metrics"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/series"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// Failures records failed attempts.
type Failures struct {
	ledger  *ledger.Ledger
	metrics *metrics.Metrics
	series  *series.Recorder
	prices  budget.PriceTable // with model prices, an attempt's reported usage is what it spent
}

// New records failures through l, counting them in m and s; prices is the
// state's model prices, nil for none.
func New(l *ledger.Ledger, m *metrics.Metrics, s *series.Recorder, prices budget.PriceTable) *Failures {
	return &Failures{ledger: l, metrics: m, series: s, prices: prices}
}

// Fail records that the current claim's attempt failed, in one transaction:
// it settles what the attempt cost (nothing if it had no effect; with model
// prices the reported usage; else its whole reservation) and releases the
// rest, counts the attempt with its reason, and either queues the job
// again at a new generation, not claimable before its backoff, or, when
// no attempt is left or the failure is not worth retrying, fails it. A
// receipt and an event record it. A repeat under the same claim gets the
// same answer; any other claim is stale_claim.
func (f *Failures) Fail(ctx context.Context, caller fleet.Caller, op string, req wire.FailRequest) (wire.FailResult, error) {
	if err := validateFailure(req); err != nil {
		return wire.FailResult{}, err
	}
	ctx = tracing.With(ctx, tracing.OperationID.String(op), tracing.ClaimID.String(req.ClaimID),
		tracing.Generation.Int64(req.Generation), tracing.Worker.String(caller.ID))
	out, err := ledger.Write(ctx, f.ledger, ledger.Named[failed]("fail"), func(tx *store.Tx) (failed, error) {
		return f.fail(ctx, tx, caller, op, req)
	})
	if err != nil {
		return wire.FailResult{}, err
	}
	return f.answerFail(caller, op, req, out), nil
}

// failed is a fail's answer, and whether it repeats an earlier one.
type failed struct {
	res    wire.FailResult
	repeat bool
}

// fail is Fail's transaction.
func (f *Failures) fail(ctx context.Context, tx *store.Tx, caller fleet.Caller, op string, req wire.FailRequest) (failed, error) {
	j, err := jobs.Get(ctx, tx, op, store.ForUpdate)
	if err != nil {
		return failed{}, err
	}
	if answer, found, err := failAnswered(ctx, tx, caller, op, req); err != nil || found {
		return failed{res: answer, repeat: found}, err
	}
	if err := jobs.CheckClaim(j, caller, req.ClaimID, req.Generation, wire.Claimed, wire.Running); err != nil {
		return failed{}, err
	}
	res, err := f.recordFailure(ctx, tx, caller, j, req)
	return failed{res: res}, err
}

// answerFail counts and logs a committed failure, and answers it.
func (f *Failures) answerFail(caller fleet.Caller, op string, req wire.FailRequest, out failed) wire.FailResult {
	if out.repeat {
		return out.res
	}
	res := out.res
	class := "permanent"
	if req.Retryable {
		class = "retryable"
	}
	f.metrics.Failure(class, string(res.State))
	if res.State == wire.Failed {
		f.series.Failed()
	}
	f.ledger.Log.Info("attempt failed", "operation_id", op, "worker", caller.ID, "generation", req.Generation,
		"attempt", res.Attempt, "state", res.State, "receipt_id", res.ReceiptID, "reason", req.Reason)
	return res
}

// failAnswered finds the answer a fail under this claim was already given.
// A claim fails at most once, so an attempt recorded under it is this
// request's own, answered before (its answer lost): the answer it had,
// whatever happened to the job since.
func failAnswered(ctx context.Context, tx *store.Tx, caller fleet.Caller, op string, req wire.FailRequest) (wire.FailResult, bool, error) {
	attempts, err := tx.AttemptList(ctx, op)
	if err != nil {
		return wire.FailResult{}, false, err
	}
	for _, a := range attempts {
		if len(a.Answer) > 0 && a.ClaimID == req.ClaimID && a.Worker == caller.ID && a.Generation == req.Generation {
			var res wire.FailResult
			return res, true, json.Unmarshal(a.Answer, &res)
		}
	}
	return wire.FailResult{}, false, nil
}

// recordFailure settles what the failed attempt cost and releases the
// rest, revokes the assignment, queues the job again after its backoff or
// fails it, signs the receipt, records the attempt with its answer and
// appends the event.
func (f *Failures) recordFailure(ctx context.Context, tx *store.Tx, caller fleet.Caller, j store.Job, req wire.FailRequest) (wire.FailResult, error) {
	var res wire.FailResult
	held, attempt := j.Reserved, j.Attempts+1
	settled, pricing := settledOnFailure(held, f.prices, req)
	acct, err := tx.AccountingGet(ctx, store.NoLock)
	if err != nil {
		return res, err
	}
	if held > 0 {
		if acct, err = jobs.Spend(ctx, tx, &j, settled); err != nil {
			return res, err
		}
	}
	if err := jobs.RevokeAssignment(ctx, tx, &j, "failed"); err != nil {
		return res, err
	}
	retry := req.Retryable && attempt < j.MaxAttempts
	j.Attempts, j.LastError = attempt, req.Reason
	decision, kind := wire.DecisionFailed, wire.EventFailed
	reason := fmt.Sprintf("attempt %d of %d failed: %s", attempt, j.MaxAttempts, req.Reason)
	if retry {
		decision, kind = wire.DecisionRetry, wire.EventRetry
		res.ClaimableAtMS = tx.NowMS() + policyOf(j).Backoff(attempt, rand.Float64())
		err = jobs.Requeue(ctx, tx, &j, j.Worker, res.ClaimableAtMS, reason)
	} else {
		err = jobs.Fail(ctx, tx, &j, reason)
	}
	if err != nil {
		return res, err
	}
	draft := receipts.Draft{Kind: wire.KindFailure, OperationID: j.OperationID, Caller: caller.ID, Decision: decision,
		Cost: settled, Accounting: acct, Tenant: j.Tenant, Credential: j.ReserveCredential}
	if held > 0 { // nothing is reserved before dispatch, so nothing settles
		draft.Reserved, draft.Pricing = &held, pricing
	}
	r, err := f.ledger.IssueReceipt(tx, draft)
	if err != nil {
		return res, err
	}
	res.State, res.Attempt, res.MaxAttempts, res.ReceiptID = j.State, attempt, j.MaxAttempts, r.ID
	res.Settled, res.Released = settled, held-settled
	answer, err := json.Marshal(res)
	if err != nil {
		return res, err
	}
	if err := tx.AttemptInsert(ctx, store.Attempt{OperationID: j.OperationID, ClaimID: req.ClaimID, Answer: answer,
		Attempt: wire.Attempt{Attempt: attempt, Worker: caller.ID, Generation: req.Generation, Reason: req.Reason,
			Retryable: req.Retryable, Outcome: string(decision), Cost: settled, AtMS: tx.NowMS()}}); err != nil {
		return res, err
	}
	title := fmt.Sprintf("%s's attempt %d at the %s section failed (%s); it will be retried", caller.ID, attempt, j.Section, req.Reason)
	if !retry {
		title = fmt.Sprintf("The %s section failed after %d attempt(s): %s", j.Section, attempt, req.Reason)
	}
	data := map[string]any{"operation_id": j.OperationID, "section": j.Section,
		"attempt": attempt, "max_attempts": j.MaxAttempts, "reason": req.Reason, "retryable": req.Retryable,
		"claimable_at_ms": res.ClaimableAtMS, "receipt_id": r.ID, "settled": res.Settled, "released": res.Released,
		"accounting": acct}
	if draft.Pricing != nil {
		data["pricing"] = draft.Pricing
	}
	return res, ledger.AppendEvent(ctx, tx, kind, caller.ID, title, data)
}

// settledOnFailure is what a failed attempt holding held credits spends,
// and how it was priced: nothing if it had no effect; with model prices
// the reported usage at its model's prices (all of it for a model they do
// not price); else all of it.
func settledOnFailure(held int64, prices budget.PriceTable, req wire.FailRequest) (int64, *wire.Pricing) {
	if req.NoEffect {
		return 0, nil
	}
	settled, _, pricing := budget.Settlement(held, prices, req.Usage)
	return settled, pricing
}

// policyOf is a job's own retry policy.
func policyOf(j store.Job) jobs.Policy {
	return jobs.Policy{MaxAttempts: j.MaxAttempts, BackoffBaseMS: j.BackoffBaseMS, BackoffCapMS: j.BackoffCapMS}
}

// validateFailure refuses a reason that is empty, too long, or not plain
// text (it is shown to operators and kept in the log).
func validateFailure(req wire.FailRequest) error {
	switch {
	case req.ClaimID == "" || len(req.ClaimID) > 128:
		return fleet.Errorf(wire.CodeInvalid, "claim_id is required (at most 128 bytes)")
	case req.Generation < 0:
		return fleet.Errorf(wire.CodeInvalid, "generation must be >= 0, got %d", req.Generation)
	case strings.TrimSpace(req.Reason) == "" || len(req.Reason) > wire.MaxReasonBytes:
		return fleet.Errorf(wire.CodeInvalid, "reason is required, at most %d bytes", wire.MaxReasonBytes)
	case !wire.IsPlainText(req.Reason):
		return fleet.Errorf(wire.CodeInvalid, "reason must be one line of UTF-8 text without control, format or separator characters (line breaks, tabs, bidi controls, zero-width characters)")
	case req.Usage != nil && !budget.ValidUsage(*req.Usage):
		return fleet.Errorf(wire.CodeInvalid, "usage holds negative or implausible token counts")
	}
	return budget.CheckUsage(req.Usage)
}

// FailMany is Fail for each item, in one transaction. An item whose
// request is not a valid failure is refused alone.
func (f *Failures) FailMany(ctx context.Context, caller fleet.Caller, items []ledger.JobCall[wire.FailRequest]) ([]ledger.Answer[wire.FailResult], error) {
	done, err := ledger.Batch(ctx, f.ledger, "fail-batch", ledger.BatchReads{Ops: ledger.Ops(items), Hold: true}, func(tx *store.Tx, i int) (failed, error) {
		if err := validateFailure(items[i].Request); err != nil {
			return failed{}, err
		}
		return f.fail(ctx, tx, caller, items[i].OperationID, items[i].Request)
	})
	if err != nil {
		return nil, err
	}
	out := make([]ledger.Answer[wire.FailResult], len(items))
	for i, a := range done {
		if out[i].Err = a.Err; a.Err == nil {
			out[i].Value = f.answerFail(caller, items[i].OperationID, items[i].Request, a.Value)
		}
	}
	return out, nil
}
