package host

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/fleet/fleet/internal/crash"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// A write transaction (write), and the steps several operations take
// inside theirs.

// write runs fn in one write transaction and wakes watchers after commit.
// point names the operation's crash points (see package crash): its
// ".before-commit" point is reached with every write made and nothing
// committed, its ".after-commit" point with everything committed and nothing
// answered. point is called after fn, since some operations (dispatch) are
// named by what they decide.
func (h *Host) write(ctx context.Context, point func() string, fn func(tx *store.Tx) error) error {
	err := h.db.WithTx(ctx, func(tx *store.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		crash.At(point() + ".before-commit")
		return nil
	})
	if err != nil {
		return err
	}
	crash.At(point() + ".after-commit")
	h.wake()
	if err := crash.Lost(point() + ".after-commit"); err != nil {
		return fleet.Errorf(wire.CodeUnavailable, "%v", err)
	}
	return nil
}

// named is a fixed crash-point name.
func named(point string) func() string { return func() string { return point } }

// wake releases everyone waiting on Changed.
func (h *Host) wake() {
	h.mu.Lock()
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
}

// getJob reads a job (in a write transaction, locked until it ends); an
// unknown operation id is not_found.
func getJob(ctx context.Context, tx *store.Tx, op string, lock store.Lock) (wire.Job, error) {
	j, err := tx.JobGet(ctx, op, lock)
	if store.IsNotFound(err) {
		return j, fleet.Errorf(wire.CodeNotFound, "job %s not found", op)
	}
	return j, err
}

// moveJob moves j to state `to` if the state machine allows it, and saves
// every field of j.
func moveJob(ctx context.Context, tx *store.Tx, j *wire.Job, to wire.JobState, reason string) error {
	if err := jobs.Transition(j, to, reason); err != nil {
		return err
	}
	return saveJob(ctx, tx, j)
}

func saveJob(ctx context.Context, tx *store.Tx, j *wire.Job) error {
	j.UpdatedAtMS = tx.NowMS()
	return tx.JobUpdate(ctx, *j)
}

// revokeAssignment takes the job's document away from its holder at the
// next generation, so every claim and publication fenced by the old one is
// stale, and drops the claim.
func revokeAssignment(ctx context.Context, tx *store.Tx, j *wire.Job, reason string) error {
	gen, err := resource.Revoke(ctx, tx, j.DocumentID, reason)
	if err != nil {
		return fmt.Errorf("revoke %s: %w", j.OperationID, err)
	}
	j.Generation, j.Owner, j.ClaimID, j.ClaimHost, j.LeaseExpiresAtMS = gen, "", "", "", 0
	return nil
}

// settle moves j's reservation to spent: the admitted work happened, or
// may have.
func settle(ctx context.Context, tx *store.Tx, j *wire.Job) (wire.Accounting, error) {
	return move(ctx, tx, j, j.Reserved)
}

// move takes j's reservation out of reserved and adds toSpent of it to
// spent; the rest goes back to available. j then holds none.
func move(ctx context.Context, tx *store.Tx, j *wire.Job, toSpent int64) (wire.Accounting, error) {
	fromReserved := j.Reserved
	acct, ok, err := tx.AccountingMove(ctx, j.ReserveShard, fromReserved, toSpent)
	j.Reserved, j.ReserveShard = 0, -1
	if err == nil && !ok {
		err = fmt.Errorf("settle %d credits: fewer credits reserved than the job holds", fromReserved)
	}
	return acct, err
}

// issueReceipt prepares the receipt of decision d and appends it to the
// chain. Its id is final at once, for the transaction to refer to; the rest
// (sequence, link, signature) is filled in when the log places it, by the
// time the write returns.
func (h *Host) issueReceipt(tx *store.Tx, d receipts.Draft) (*wire.Receipt, error) {
	return tx.AppendReceipt(h.kernel.Prepare(d, tx.NowMS()))
}

// appendEvent adds an event to the log, numbered when the transaction
// commits.
func appendEvent(ctx context.Context, tx *store.Tx, kind wire.EventKind, actor, title string, data any) error {
	raw, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("encode %s event: %w", kind, err)
	}
	return tx.AppendEvent(wire.Event{TimestampMS: tx.NowMS(), Kind: kind, Actor: actor, Title: title, Data: raw})
}
