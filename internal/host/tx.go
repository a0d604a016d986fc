package host

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/fleet/fleet/internal/crash"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// A write transaction (write), and the steps several operations take
// inside theirs.

// write runs fn in one write transaction, wakes watchers after commit and
// returns what fn decided. fn may run more than once (a rerun after a lost
// race on PostgreSQL): its result is the run that committed, and nothing
// outside the database changes inside it. point names the operation's
// crash points (see package crash): its ".before-commit" point is reached
// with every write made and nothing committed, its ".after-commit" point
// with everything committed and nothing answered. point is given the
// result, since some operations (dispatch) are named by what they decide.
func write[T any](ctx context.Context, h *Host, point func(T) string, fn func(tx *store.Tx) (T, error)) (T, error) {
	var span trace.Span = noop.Span{} // no span of its own while tracing is off
	if tracing.Enabled() {
		var zero T
		ctx, span = tracing.Start(ctx, "fleet."+point(zero))
	}
	var out T
	var statements int64
	var decided time.Time
	err := h.db.WithTx(ctx, func(tx *store.Tx) error {
		start := tx.Statements()
		var err error
		if out, err = fn(tx); err != nil {
			return err
		}
		statements = tx.Statements() - start
		decided = time.Now()
		crash.At(point(out) + ".before-commit")
		return nil
	})
	if tracing.Enabled() && !decided.IsZero() {
		// The commit: from the decision made to the transaction's end (a
		// group commit's wait for the others in it included).
		_, commit := tracing.Tracer().Start(ctx, "fleet.commit", trace.WithTimestamp(decided),
			trace.WithAttributes(attribute.Int64("fleet.statements", statements)))
		commit.End()
	}
	if tracing.Enabled() {
		if err == nil {
			span.SetName("fleet." + point(out)) // dispatch-allow, dispatch-deny, …
		}
		tracing.End(span, err)
	}
	if err != nil {
		var none T
		return none, err
	}
	var jobs int64
	if c, ok := any(out).(jobCounter); ok {
		jobs = c.jobs()
	}
	h.db.CountWrite(point(out), statements, jobs)
	crash.At(point(out) + ".after-commit")
	h.wake()
	if err := crash.Lost(point(out) + ".after-commit"); err != nil {
		return out, fleet.Errorf(wire.CodeUnavailable, "%v", err)
	}
	return out, nil
}

// jobCounter is a write's result that says how many jobs it took (a
// claim), for the storage counters.
type jobCounter interface{ jobs() int64 }

// named is a fixed crash-point name.
func named[T any](point string) func(T) string { return func(T) string { return point } }

// wake releases everyone waiting on Changed.
func (h *Host) wake() {
	h.mu.Lock()
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
}

// getJob reads a job (in a write transaction, locked until it ends); an
// unknown operation id is not_found.
func getJob(ctx context.Context, tx *store.Tx, op string, lock store.Lock) (store.Job, error) {
	j, err := tx.JobGet(ctx, op, lock)
	if store.IsNotFound(err) {
		return j, fleet.Errorf(wire.CodeNotFound, "job %s not found", op)
	}
	return j, err
}

// revokeAssignment takes the job's document away from its holder at the
// next generation, so every claim and publication fenced by the old one is
// stale. The transition that follows drops the claim.
func revokeAssignment(ctx context.Context, tx *store.Tx, j *store.Job, reason string) error {
	gen, err := resource.Revoke(ctx, tx, j.DocumentID, reason)
	if err != nil {
		return fmt.Errorf("revoke %s: %w", j.OperationID, err)
	}
	j.Generation, j.Owner = gen, ""
	return nil
}

// settle moves j's reservation to spent: the admitted work happened, or
// may have. The transition that follows records that j holds none.
func settle(ctx context.Context, tx *store.Tx, j *store.Job) (wire.Accounting, error) {
	return move(ctx, tx, j, j.Reserved)
}

// move takes j's reservation out of reserved and adds toSpent of it to
// spent; the rest goes back to available.
func move(ctx context.Context, tx *store.Tx, j *store.Job, toSpent int64) (wire.Accounting, error) {
	s, err := tx.AccountingMove(ctx, &store.AccountingMoveParams{Shard: j.ReserveShard, FromReserved: j.Reserved, ToSpent: toSpent})
	if err == nil && !s.OK {
		err = fmt.Errorf("settle %d credits: fewer credits reserved than the job holds", j.Reserved)
	}
	return s.Accounting, err
}

// requeue puts j back in the queue (its claim, reservation and admission
// dropped), counting attempts and the last error as given, claimable at
// claimableAtMS.
func requeue(ctx context.Context, tx *store.Tx, j *store.Job, worker string, claimableAtMS int64, reason string) error {
	if err := jobs.CheckMove(*j, wire.Queued); err != nil {
		return err
	}
	err := tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: j.OperationID, IfState: j.State, Worker: worker,
		Attempts: j.Attempts, ClaimableAtMS: claimableAtMS, LastError: j.LastError, Reason: reason, NowMS: tx.NowMS()})
	j.State, j.Reason, j.Worker, j.ClaimableAtMS = wire.Queued, reason, worker, claimableAtMS
	return err
}

// fail ends j failed, its claim and reservation dropped.
func fail(ctx context.Context, tx *store.Tx, j *store.Job, reason string) error {
	if err := jobs.CheckMove(*j, wire.Failed); err != nil {
		return err
	}
	err := tx.JobFail(ctx, &store.JobFailParams{OperationID: j.OperationID, IfState: j.State, Attempts: j.Attempts,
		LastError: j.LastError, Reason: reason, NowMS: tx.NowMS()})
	j.State, j.Reason = wire.Failed, reason
	return err
}

// cancel cancels j: it keeps its claim id, so the holder learns of it,
// but not its lease or reservation.
func cancel(ctx context.Context, tx *store.Tx, j *store.Job, to wire.JobState, reason string) error {
	if err := jobs.CheckMove(*j, to); err != nil {
		return err
	}
	err := tx.JobCancel(ctx, &store.JobCancelParams{OperationID: j.OperationID, IfState: j.State, To: to, Reason: reason, NowMS: tx.NowMS()})
	j.State, j.Reason, j.Reserved = to, reason, 0
	return err
}

// complete completes j, whose reservation has settled.
func complete(ctx context.Context, tx *store.Tx, j *store.Job, reason string) error {
	if err := jobs.CheckMove(*j, wire.Completed); err != nil {
		return err
	}
	err := tx.JobComplete(ctx, &store.JobCompleteParams{OperationID: j.OperationID, IfState: j.State, Reason: reason, NowMS: tx.NowMS()})
	j.State, j.Reason, j.Reserved, j.FinishedAtMS = wire.Completed, reason, 0, tx.NowMS()
	return err
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
	e := wire.Event{TimestampMS: tx.NowMS(), Kind: kind, Actor: actor, Title: title, Data: raw}
	// An event about a job names it in its data; the log indexes it too.
	if m, ok := data.(map[string]any); ok {
		e.OperationID, _ = m["operation_id"].(string)
	}
	return tx.AppendEvent(e)
}

// record is write for an operation that only records, and answers
// nothing but whether it committed (Start, Stop).
func (h *Host) record(ctx context.Context, point string, fn func(tx *store.Tx) error) error {
	_, err := write(ctx, h, named[struct{}](point), func(tx *store.Tx) (struct{}, error) { return struct{}{}, fn(tx) })
	return err
}
