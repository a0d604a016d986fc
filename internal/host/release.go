package host

import (
	"context"
	"fmt"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// Release gives a claimed or running job back from the worker holding it,
// unfinished (the worker is shutting down), in one transaction: the
// whole reservation goes back to available (nothing of the work took
// effect: the worker stopped it before publishing), the document's
// assignment is revoked at the next generation, and the job is queued
// again, claimable at once, its attempts not counted. A requeue receipt
// (decision released) and a fleet.released event record it. Only the
// current claim can release; a repeat after it committed finds its claim
// stale (stale_claim), which tells the worker the job is no longer its.
func (h *Host) Release(ctx context.Context, caller fleet.Caller, op string, ref wire.ClaimRef) (wire.ReleaseResult, error) {
	ctx = tracing.With(ctx, tracing.OperationID.String(op), tracing.ClaimID.String(ref.ClaimID),
		tracing.Generation.Int64(ref.Generation), tracing.Worker.String(caller.ID))
	res, err := ledger.Write(ctx, h.ledger, ledger.Named[wire.ReleaseResult]("release"), func(tx *store.Tx) (wire.ReleaseResult, error) {
		return h.release(ctx, tx, caller, op, ref)
	})
	if err == nil {
		h.Log.Info("released", "operation_id", op, "worker", caller.ID, "generation", res.Generation,
			"released", res.Released, "receipt_id", res.ReceiptID)
	}
	return res, err
}

// release is Release's transaction.
func (h *Host) release(ctx context.Context, tx *store.Tx, caller fleet.Caller, op string, ref wire.ClaimRef) (wire.ReleaseResult, error) {
	var res wire.ReleaseResult
	j, err := jobs.Get(ctx, tx, op, store.ForUpdate)
	if err != nil {
		return res, err
	}
	if err := jobs.CheckClaim(j, caller.ID, ref.ClaimID, ref.Generation, wire.Claimed, wire.Running); err != nil {
		return res, err
	}
	held, was := j.Reserved, j.State
	acct, err := tx.AccountingGet(ctx, store.NoLock)
	if err != nil {
		return res, err
	}
	if held > 0 {
		if acct, err = jobs.Spend(ctx, tx, &j, 0); err != nil {
			return res, err
		}
	}
	if err := jobs.RevokeAssignment(ctx, tx, &j, "released"); err != nil {
		return res, err
	}
	reason := fmt.Sprintf("released by %s, which stopped before finishing it", caller.ID)
	if err := jobs.Requeue(ctx, tx, &j, j.Worker, tx.NowMS(), reason); err != nil {
		return res, err
	}
	draft := receipts.Draft{Kind: wire.KindRequeue, OperationID: op, Caller: caller.ID, Decision: wire.DecisionReleased,
		Accounting: acct}
	if held > 0 { // nothing is reserved before dispatch, so nothing is given back
		draft.Reserved = &held
	}
	r, err := h.ledger.IssueReceipt(tx, draft)
	if err != nil {
		return res, err
	}
	res = wire.ReleaseResult{State: j.State, Generation: j.Generation, Released: held, ReceiptID: r.ID}
	return res, ledger.AppendEvent(ctx, tx, wire.EventReleased, caller.ID,
		fmt.Sprintf("%s gave the %s section back unfinished (was %s); it is queued again", caller.ID, j.Section, was),
		map[string]any{"operation_id": op, "was": was, "generation": j.Generation, "released": held, "receipt_id": r.ID, "accounting": acct})
}
