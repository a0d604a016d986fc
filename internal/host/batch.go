package host

import (
	"context"

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

// HeartbeatMany is Heartbeat for each item, in one transaction.
func (h *Host) HeartbeatMany(ctx context.Context, caller fleet.Caller, items []JobCall[wire.ClaimRef]) ([]Answer[wire.HeartbeatResult], error) {
	return ledger.Batch(ctx, h.ledger, "heartbeat-batch", ledger.BatchReads{Ops: ledger.Ops(items)}, func(tx *store.Tx, i int) (wire.HeartbeatResult, error) {
		return h.heartbeat(ctx, tx, caller, items[i].OperationID, items[i].Request)
	})
}
