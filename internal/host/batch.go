package host

import (
	"context"
	"encoding/json"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Batch calls: dispatch, heartbeat, publish and fail for many jobs in one
// request, each item run through the single call's transaction function
// in one write transaction (ledger.Batch says how).

// JobCall is one item of a batch call: the job and the single call's
// request.
type JobCall[R any] = ledger.JobCall[R]

// Answer is one item's outcome: Value, or the refusal Err the single call
// would have returned.
type Answer[T any] = ledger.Answer[T]

// DispatchMany is Dispatch for each item, in one transaction.
func (h *Host) DispatchMany(ctx context.Context, caller fleet.Caller, items []JobCall[wire.ClaimRef]) ([]Answer[json.RawMessage], error) {
	done, err := ledger.Batch(ctx, h.ledger, "dispatch-batch", ledger.BatchReads{Ops: ledger.Ops(items), Reserve: true}, func(tx *store.Tx, i int) (dispatched, error) {
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
	return ledger.Batch(ctx, h.ledger, "heartbeat-batch", ledger.BatchReads{Ops: ledger.Ops(items)}, func(tx *store.Tx, i int) (wire.HeartbeatResult, error) {
		return h.heartbeat(ctx, tx, caller, items[i].OperationID, items[i].Request)
	})
}
