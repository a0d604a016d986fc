package ledger

import (
	"context"
	"errors"

	"github.com/fleet/fleet/internal/fleet"
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

// JobCall is one item of a batch call: the job and the single call's
// request.
type JobCall[R any] struct {
	OperationID string
	Request     R
}

// Ops are the jobs a batch's items name.
func Ops[R any](items []JobCall[R]) []string {
	ops := make([]string, len(items))
	for i, it := range items {
		ops[i] = it.OperationID
	}
	return ops
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

// BatchReads is what a batch reads before its items run: each item's job
// (Ops), the operation key each publication carries (Keys, nil for other
// batches), for batches that settle reservations (Hold) the allowance
// shards of the jobs' reservations, and for batches that make them
// (Reserve) up to one per item, taken ahead.
type BatchReads struct {
	Ops, Keys     []string
	Hold, Reserve bool
}

// Batch runs fn for each item in one write transaction, each as an item
// of its own (point names the batch's crash points). The HTTP edge bounds
// the items (wire.MaxBatchItems).
func Batch[T any](ctx context.Context, l *Ledger, point string, reads BatchReads,
	fn func(tx *store.Tx, i int) (T, error)) ([]Answer[T], error) {
	n := len(reads.Ops)
	ctx = tracing.With(ctx, tracing.OperationIDs.StringSlice(reads.Ops))
	return Write(ctx, l, Named[[]Answer[T]](point), func(tx *store.Tx) ([]Answer[T], error) {
		// The jobs first, in one order, as a single call locks its job
		// before any allowance shard.
		if err := tx.ReadAhead(ctx, reads.Ops, reads.Keys); err != nil {
			return nil, err
		}
		// Two batches settling on the same allowance shards in different
		// orders would each wait for the other (PostgreSQL, where the
		// allowance is sharded) until one gave up: take them in one order
		// next. Each item still decides from its own locked reads.
		if reads.Hold {
			if err := tx.AccountingHold(ctx, reads.Ops); err != nil {
				return nil, err
			}
		}
		if reads.Reserve {
			names, counts := tx.TenantsAhead()
			if err := tx.ReserveAhead(ctx, names, counts, n); err != nil {
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
