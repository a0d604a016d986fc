package jobs

import (
	"context"
	"fmt"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// A job's named transitions, each taken inside the caller's write
// transaction after CheckMove allows it: the store's guarded write, and
// the same change made to the caller's copy of the job.

// Get reads a job (in a write transaction, locked until it ends when lock
// says so); an unknown operation id is not_found.
func Get(ctx context.Context, tx *store.Tx, op string, lock store.Lock) (store.Job, error) {
	j, err := tx.JobGet(ctx, op, lock)
	if store.IsNotFound(err) {
		return j, fleet.Errorf(wire.CodeNotFound, "job %s not found", op)
	}
	return j, err
}

// RevokeAssignment takes the job's document away from its holder at the
// next generation, so every claim and publication fenced by the old one
// is stale. The transition that follows drops the claim.
func RevokeAssignment(ctx context.Context, tx *store.Tx, j *store.Job, reason string) error {
	gen, err := resource.Revoke(ctx, tx, j.DocumentID, reason)
	if err != nil {
		return fmt.Errorf("revoke %s: %w", j.OperationID, err)
	}
	j.Generation, j.Owner = gen, ""
	return nil
}

// Requeue puts j back in the queue (its claim, reservation and admission
// dropped), counting attempts and the last error as given, claimable at
// claimableAtMS.
func Requeue(ctx context.Context, tx *store.Tx, j *store.Job, worker string, claimableAtMS int64, reason string) error {
	if err := CheckMove(*j, wire.Queued); err != nil {
		return err
	}
	err := tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: j.OperationID, IfState: j.State, Worker: worker,
		Attempts: j.Attempts, ClaimableAtMS: claimableAtMS, LastError: j.LastError, Reason: reason, NowMS: tx.NowMS()})
	j.State, j.Reason, j.Worker, j.ClaimableAtMS = wire.Queued, reason, worker, claimableAtMS
	return err
}

// Fail ends j failed, its claim and reservation dropped.
func Fail(ctx context.Context, tx *store.Tx, j *store.Job, reason string) error {
	if err := CheckMove(*j, wire.Failed); err != nil {
		return err
	}
	err := tx.JobFail(ctx, &store.JobFailParams{OperationID: j.OperationID, IfState: j.State, Attempts: j.Attempts,
		LastError: j.LastError, Reason: reason, NowMS: tx.NowMS()})
	j.State, j.Reason = wire.Failed, reason
	return err
}

// Cancel cancels j: it keeps its claim id, so the holder learns of it,
// but not its lease or reservation.
func Cancel(ctx context.Context, tx *store.Tx, j *store.Job, to wire.JobState, reason string) error {
	if err := CheckMove(*j, to); err != nil {
		return err
	}
	err := tx.JobCancel(ctx, &store.JobCancelParams{OperationID: j.OperationID, IfState: j.State, To: to, Reason: reason, NowMS: tx.NowMS()})
	j.State, j.Reason, j.Reserved = to, reason, 0
	return err
}

// Complete completes j, whose reservation has settled.
func Complete(ctx context.Context, tx *store.Tx, j *store.Job, reason string) error {
	if err := CheckMove(*j, wire.Completed); err != nil {
		return err
	}
	err := tx.JobComplete(ctx, &store.JobCompleteParams{OperationID: j.OperationID, IfState: j.State, Reason: reason, NowMS: tx.NowMS()})
	j.State, j.Reason, j.Reserved, j.FinishedAtMS = wire.Completed, reason, 0, tx.NowMS()
	return err
}

// Settle moves j's reservation to spent: the admitted work happened, or
// may have. The transition that follows records that j holds none.
func Settle(ctx context.Context, tx *store.Tx, j *store.Job) (wire.Accounting, error) {
	return Spend(ctx, tx, j, j.Reserved)
}

// Spend takes j's reservation out of reserved and adds toSpent of it to
// spent, at every level that holds it (its tenant, the credential whose
// own allowance holds a part, then the fleet: the order an admission
// reserves in); the rest goes back to available.
func Spend(ctx context.Context, tx *store.Tx, j *store.Job, toSpent int64) (wire.Accounting, error) {
	if j.Reserved > 0 {
		ok, err := tx.TenantMove(ctx, &store.TenantMoveParams{Tenant: j.Tenant, Shard: j.TenantShard, FromReserved: j.Reserved, ToSpent: toSpent})
		if err == nil && !ok {
			err = fmt.Errorf("settle %d credits: tenant %s holds fewer reserved than the job", j.Reserved, j.Tenant)
		}
		if err != nil {
			return wire.Accounting{}, err
		}
	}
	if j.Reserved > 0 && j.ReserveCredential != "" {
		ok, err := tx.CredentialMove(ctx, &store.CredentialMoveParams{Name: j.ReserveCredential, FromReserved: j.Reserved, ToSpent: toSpent})
		if err == nil && !ok {
			err = fmt.Errorf("settle %d credits: credential %s holds fewer reserved than the job", j.Reserved, j.ReserveCredential)
		}
		if err != nil {
			return wire.Accounting{}, err
		}
	}
	s, err := tx.AccountingMove(ctx, &store.AccountingMoveParams{Shard: j.ReserveShard, FromReserved: j.Reserved, ToSpent: toSpent})
	if err == nil && !s.OK {
		err = fmt.Errorf("settle %d credits: fewer credits reserved than the job holds", j.Reserved)
	}
	return s.Accounting, err
}
