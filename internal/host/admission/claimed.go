package admission

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// AdmitClaimed admits the jobs a claim holds, in the claim's transaction
// (a claim that admits: a job in two calls), each exactly as its
// dispatch would: a job still claimed is admitted or denied, with its
// receipt and event; one already decided under its claim (the claim
// repeated after its answer was lost) keeps its decision. The function
// returned answers each decision, in held's order, once the transaction
// has committed. callers[i] holds held[i]: claims made together (a pick
// for several) are admitted together, each job as its own caller's.
func (a *Admission) AdmitClaimed(ctx context.Context, tx *store.Tx, callers []fleet.Caller, held []store.Job) (func(context.Context) ([]wire.Admission, error), error) {
	if len(callers) != len(held) {
		return nil, fmt.Errorf("admit claimed jobs: %d callers for %d jobs", len(callers), len(held))
	}
	if err := reserveAhead(ctx, tx, held); err != nil {
		return nil, err
	}
	// The claim locked these jobs and each admission writes only its own:
	// the admissions are written in one statement at the end (PostgreSQL),
	// not one each.
	tx.HoldWrites()
	decided := make([]dispatched, len(held))
	for i, j := range held {
		var err error
		if jobs.DispatchRepeat(j, callers[i].ID, claimRef(j)) {
			decided[i], err = retained(j)
		} else {
			decided[i], err = a.admit(ctx, tx, callers[i], j)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := tx.WriteHeld(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) ([]wire.Admission, error) {
		out := make([]wire.Admission, len(held))
		for i, d := range decided {
			var err error
			if out[i], err = a.answer(ctx, callers[i], held[i].OperationID, claimRef(held[i]), d); err != nil {
				return nil, err
			}
		}
		return out, nil
	}, nil
}

// claimRef is the claim a job is held under.
func claimRef(j store.Job) wire.ClaimRef {
	return wire.ClaimRef{ClaimID: j.ClaimID, Generation: j.Generation}
}

// reserveAhead takes the reservations the claimed jobs' admissions may
// make at each tenant and at the fleet, as a batch of dispatches does
// (ledger.Batch); those not handed out go back at commit. For a claim of
// one tenant's jobs, one job's included, that is one statement where
// reserving as each admission goes would be one a level.
func reserveAhead(ctx context.Context, tx *store.Tx, held []store.Job) error {
	byTenant := map[string]int{}
	n := 0
	for _, j := range held {
		if j.State == wire.Claimed {
			byTenant[j.Tenant]++
			n++
		}
	}
	if n == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(byTenant))
	counts := make([]int, len(names))
	for i, name := range names {
		counts[i] = byTenant[name]
	}
	return tx.ReserveAhead(ctx, names, counts, n)
}
