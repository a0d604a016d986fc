package host

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// ExpireLeases applies lease expiry: a claimed job goes back to the queue
// at a new generation, claimable at once, the lapse counting as a failed
// attempt (its last allowed one fails the job); a running job becomes
// unresolved and keeps its assignment, so a slow worker still alive can
// publish.
func (h *Host) ExpireLeases(ctx context.Context) (int, error) {
	// A cheap read first, so an idle host takes no write lock; the write
	// transaction below decides afresh from what it reads itself.
	var due []store.Job
	if err := h.db.Read(ctx, func(tx *store.Tx) (err error) {
		due, err = tx.JobListExpired(ctx, &store.JobListExpiredParams{NowMS: tx.NowMS(), Lock: store.NoLock})
		return err
	}); err != nil || len(due) == 0 {
		return 0, err
	}
	movedTo, err := ledger.Write(ctx, h.ledger, ledger.Named[[]wire.JobState]("lease-expiry"), func(tx *store.Tx) ([]wire.JobState, error) {
		expired, err := tx.JobListExpired(ctx, &store.JobListExpiredParams{NowMS: tx.NowMS(), Lock: store.ForUpdate})
		if err != nil {
			return nil, err
		}
		var movedTo []wire.JobState
		for i := range expired {
			j := &expired[i]
			worker := j.Worker
			if j.State == wire.Claimed {
				if err := h.lapseBeforeDispatch(ctx, tx, j); err != nil {
					return nil, err
				}
			} else if err := setUnresolved(ctx, tx, j, "lease expired while running; no publication is known"); err != nil {
				return nil, err
			}
			movedTo = append(movedTo, j.State)
			if err := ledger.AppendEvent(ctx, tx, wire.EventLeaseExpired, "host",
				fmt.Sprintf("%s's lease on %s expired; the job is %s", worker, j.Section, j.State),
				map[string]any{"operation_id": j.OperationID, "worker": worker, "state": j.State, "generation": j.Generation}); err != nil {
				return nil, err
			}
		}
		return movedTo, nil
	})
	if err != nil {
		return 0, err
	}
	for _, st := range movedTo {
		h.metrics.LeaseExpired(string(st))
		if st != wire.Unresolved { // a lapse before dispatch: a failed attempt
			h.metrics.Failure("lease_expired", string(st))
		}
		if st == wire.Failed {
			h.series.Failed()
		}
	}
	if len(movedTo) > 0 {
		h.Log.Info("leases expired", "jobs", len(movedTo))
	}
	return len(movedTo), nil
}

// lapseBeforeDispatch counts a claim whose lease ran out before dispatch
// as a failed attempt (the worker died or hung: a retry is worth it), and
// queues the job again at a new generation, or fails it when that was its
// last attempt. Nothing was reserved, so nothing settles.
func (h *Host) lapseBeforeDispatch(ctx context.Context, tx *store.Tx, j *store.Job) error {
	claimID, worker, generation := j.ClaimID, j.Worker, j.Generation
	if err := jobs.RevokeAssignment(ctx, tx, j, "lease expired"); err != nil {
		return err
	}
	const reason = "the lease expired before dispatch"
	j.Attempts++
	j.LastError = reason // claimable at once, in its old place (it was claimable to be claimed)
	outcome, why := wire.DecisionRetry, fmt.Sprintf("attempt %d of %d: %s", j.Attempts, j.MaxAttempts, reason)
	var err error
	if j.Attempts >= j.MaxAttempts {
		outcome = wire.DecisionFailed
		err = jobs.Fail(ctx, tx, j, why)
	} else {
		err = jobs.Requeue(ctx, tx, j, j.Worker, j.ClaimableAtMS, why)
	}
	if err != nil {
		return err
	}
	// No answer: nobody called, so a late fail under this claim is stale,
	// not a repeat.
	return tx.AttemptInsert(ctx, store.Attempt{OperationID: j.OperationID, ClaimID: claimID,
		Attempt: wire.Attempt{Attempt: j.Attempts, Worker: worker, Generation: generation, Reason: reason,
			Retryable: true, Outcome: string(outcome), AtMS: tx.NowMS()}})
}

// setUnresolved marks a running job whose lease lapsed unresolved; it
// keeps its assignment and reservation.
func setUnresolved(ctx context.Context, tx *store.Tx, j *store.Job, reason string) error {
	if err := jobs.CheckMove(*j, wire.Unresolved); err != nil {
		return err
	}
	err := tx.JobSetUnresolved(ctx, &store.JobSetUnresolvedParams{OperationID: j.OperationID, Reason: reason, NowMS: tx.NowMS()})
	j.State, j.Reason = wire.Unresolved, reason
	return err
}

// RunLeaseSweeper expires leases every interval until ctx ends.
func (h *Host) RunLeaseSweeper(ctx context.Context, interval time.Duration, onError func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := h.ExpireLeases(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, store.ErrClosed) {
				onError(err)
			}
		}
	}
}
