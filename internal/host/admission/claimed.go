package admission

import (
	"context"
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
// has committed.
func (a *Admission) AdmitClaimed(ctx context.Context, tx *store.Tx, caller fleet.Caller, held []store.Job) (func(context.Context) ([]wire.Admission, error), error) {
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
		if jobs.DispatchRepeat(j, caller.ID, claimRef(j)) {
			decided[i], err = retained(j)
		} else {
			decided[i], err = a.admit(ctx, tx, caller, j)
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
			if out[i], err = a.answer(ctx, caller, held[i].OperationID, claimRef(held[i]), d); err != nil {
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
// make at each tenant and at the fleet in one statement each, as a batch
// of dispatches does (ledger.Batch), the tenants first as an admission
// takes the levels; those not handed out go back at commit.
func reserveAhead(ctx context.Context, tx *store.Tx, held []store.Job) error {
	byTenant := map[string]int{}
	for _, j := range held {
		if j.State == wire.Claimed {
			byTenant[j.Tenant]++
		}
	}
	n := 0
	for _, c := range byTenant {
		n += c
	}
	if n < 2 { // one reservation is one statement either way
		return nil
	}
	for _, name := range slices.Sorted(maps.Keys(byTenant)) {
		if err := tx.TenantReserveAhead(ctx, name, byTenant[name]); err != nil {
			return err
		}
	}
	return tx.AccountingReserveAhead(ctx, n)
}
