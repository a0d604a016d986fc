package host

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// Batch calls: dispatch, heartbeat, publish and fail for many jobs in one
// request. A batch runs its items in order in one write transaction, each
// in a savepoint (store.Tx.Item), through the same transaction function as
// the single call, so every item gets exactly what it would get as a call
// of its own: its fence, its replay, the allowance's guard, its receipt
// and event, its refusal. One item's refusal leaves the others; anything
// else (a lost race, the database gone) fails the batch as a whole, which
// then commits nothing, as a single call's failure does.

// MaxBatchItems is the most items a batch call holds.
const MaxBatchItems = store.MaxItems

// JobCall is one item of a batch call: the job and the single call's
// request.
type JobCall[R any] struct {
	OperationID string
	Request     R
}

// Answer is one item's outcome: Value, or the refusal Err the single call
// would have returned.
type Answer[T any] struct {
	Value T
	Err   error
}

// isRefusal reports whether err is an item's own refusal (a typed error
// the single call answers with), not a failure of the whole transaction.
func isRefusal(err error) bool {
	var e *fleet.Error
	return errors.As(err, &e) && e.Code != wire.CodeUnavailable && e.Code != wire.CodeInternal
}

// batchReads is what a batch reads before its items run: each item's
// job (ops), the operation key each publication carries (keys, nil for
// other batches), for batches that settle reservations (hold) the
// allowance shards of the jobs' reservations, and for batches that make
// them (reserve) up to one per item, taken ahead.
type batchReads struct {
	ops, keys     []string
	hold, reserve bool
}

// batch runs fn for each item in one write transaction, each as an item
// of its own (point names the batch's crash points).
func batch[T any](ctx context.Context, h *Host, point string, reads batchReads,
	fn func(tx *store.Tx, i int) (T, error)) ([]Answer[T], error) {
	n := len(reads.ops)
	if n < 1 || n > MaxBatchItems {
		return nil, fleet.Errorf(wire.CodeInvalid, "a batch holds 1 to %d items, got %d", MaxBatchItems, n)
	}
	ctx = tracing.With(ctx, tracing.OperationIDs.StringSlice(reads.ops))
	return write(ctx, h, named[[]Answer[T]](point), func(tx *store.Tx) ([]Answer[T], error) {
		// The jobs first, in one order, as a single call locks its job
		// before any allowance shard.
		if err := tx.ReadAhead(ctx, reads.ops, reads.keys); err != nil {
			return nil, err
		}
		// Two batches settling on the same allowance shards in different
		// orders would each wait for the other (PostgreSQL, where the
		// allowance is sharded) until one gave up: take them in one order
		// next. Each item still decides from its own locked reads.
		if reads.hold {
			if err := tx.AccountingHold(ctx, reads.ops); err != nil {
				return nil, err
			}
		}
		if reads.reserve {
			if err := tx.AccountingReserveAhead(ctx, n); err != nil {
				return nil, err
			}
		}
		out := make([]Answer[T], n)
		for i := range n {
			var v T
			itemErr, fatal := tx.Item(ctx, i, func() (err error) {
				v, err = fn(tx, i)
				return err
			}, isRefusal)
			if fatal != nil {
				return nil, fatal
			}
			out[i] = Answer[T]{Value: v, Err: itemErr}
		}
		return out, tx.WriteHeld(ctx)
	})
}

// operationIDs are the jobs a batch's items name.
func operationIDs[R any](items []JobCall[R]) []string {
	ops := make([]string, len(items))
	for i, it := range items {
		ops[i] = it.OperationID
	}
	return ops
}

// DispatchMany is Dispatch for each item, in one transaction.
func (h *Host) DispatchMany(ctx context.Context, caller fleet.Caller, items []JobCall[wire.ClaimRef]) ([]Answer[json.RawMessage], error) {
	done, err := batch(ctx, h, "dispatch-batch", batchReads{ops: operationIDs(items), reserve: true}, func(tx *store.Tx, i int) (dispatched, error) {
		return h.dispatch(ctx, tx, caller, items[i].OperationID, items[i].Request)
	})
	if err != nil {
		return nil, err
	}
	out := make([]Answer[json.RawMessage], len(items))
	for i, a := range done {
		if out[i].Err = a.Err; a.Err == nil {
			out[i].Value, out[i].Err = h.answerDispatch(ctx, caller, items[i].OperationID, items[i].Request, a.Value)
		}
	}
	return out, nil
}

// HeartbeatMany is Heartbeat for each item, in one transaction.
func (h *Host) HeartbeatMany(ctx context.Context, caller fleet.Caller, items []JobCall[wire.ClaimRef]) ([]Answer[wire.HeartbeatResult], error) {
	return batch(ctx, h, "heartbeat-batch", batchReads{ops: operationIDs(items)}, func(tx *store.Tx, i int) (wire.HeartbeatResult, error) {
		return h.heartbeat(ctx, tx, caller, items[i].OperationID, items[i].Request)
	})
}

// FailMany is Fail for each item, in one transaction. An item whose
// request is not a valid failure is refused alone.
func (h *Host) FailMany(ctx context.Context, caller fleet.Caller, items []JobCall[wire.FailRequest]) ([]Answer[wire.FailResult], error) {
	done, err := batch(ctx, h, "fail-batch", batchReads{ops: operationIDs(items), hold: true}, func(tx *store.Tx, i int) (failed, error) {
		if err := validateFailure(items[i].Request); err != nil {
			return failed{}, err
		}
		return h.fail(ctx, tx, caller, items[i].OperationID, items[i].Request)
	})
	if err != nil {
		return nil, err
	}
	out := make([]Answer[wire.FailResult], len(items))
	for i, a := range done {
		if out[i].Err = a.Err; a.Err == nil {
			out[i].Value = h.answerFail(caller, items[i].OperationID, items[i].Request, a.Value)
		}
	}
	return out, nil
}

// PublishMany is Publish for each item, in one transaction. AckLost on any
// item means the lost acknowledgement fault drops the whole answer.
func (h *Host) PublishMany(ctx context.Context, caller fleet.Caller, items []JobCall[resource.Request]) ([]Answer[Publication], error) {
	usage, keys := make([]*wire.Usage, len(items)), make([]string, len(items))
	for i, it := range items {
		usage[i], keys[i] = budget.ReportedUsage(it.Request.Body), it.Request.OperationKey
	}
	reads := batchReads{ops: operationIDs(items), keys: keys, hold: true}
	done, err := batch(ctx, h, "publish-batch", reads, func(tx *store.Tx, i int) (Publication, error) {
		return h.publish(ctx, tx, caller, items[i].OperationID, items[i].Request, usage[i])
	})
	if err != nil {
		return nil, err
	}
	for i, a := range done {
		if a.Err == nil {
			h.notePublication(caller, items[i].OperationID, items[i].Request, a.Value)
		}
	}
	return done, nil
}
