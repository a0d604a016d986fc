package host

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// ExpireLeases applies lease expiry: a claimed job goes back to the queue
// at a new generation; a running job becomes unresolved and keeps its
// assignment, so a slow worker still alive can publish.
func (h *Host) ExpireLeases(ctx context.Context) (int, error) {
	// A cheap read first, so an idle host takes no write lock; the write
	// transaction below decides afresh from what it reads itself.
	var due []wire.Job
	if err := h.db.Read(ctx, func(tx *store.Tx) (err error) {
		due, err = tx.JobListExpired(ctx, tx.NowMS(), store.NoLock)
		return err
	}); err != nil || len(due) == 0 {
		return 0, err
	}
	var movedTo []wire.JobState
	err := h.write(ctx, named("lease-expiry"), func(tx *store.Tx) error {
		expired, err := tx.JobListExpired(ctx, tx.NowMS(), store.ForUpdate)
		if err != nil {
			return err
		}
		movedTo = nil
		for i := range expired {
			j := &expired[i]
			worker := j.Worker
			if j.State == wire.Claimed {
				if err := revokeAssignment(ctx, tx, j, "lease expired"); err != nil {
					return err
				}
				if err := moveJob(ctx, tx, j, wire.Queued, "lease expired before dispatch"); err != nil {
					return err
				}
			} else if err := moveJob(ctx, tx, j, wire.Unresolved, "lease expired while running; no publication is known"); err != nil {
				return err
			}
			movedTo = append(movedTo, j.State)
			if err := appendEvent(ctx, tx, wire.EventLeaseExpired, "host",
				fmt.Sprintf("%s's lease on %s expired; the job is %s", worker, j.Section, j.State),
				map[string]any{"operation_id": j.OperationID, "worker": worker, "state": j.State, "generation": j.Generation}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, st := range movedTo {
		h.metrics.LeaseExpired(string(st))
	}
	if len(movedTo) > 0 {
		h.Log.Info("leases expired", "jobs", len(movedTo))
	}
	return len(movedTo), nil
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
