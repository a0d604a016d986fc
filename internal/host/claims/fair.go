package claims

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
)

// Claims are fair across tenants: a claim of N takes the claimable jobs of
// the tenants with queued work in proportion to their weights, by what
// each already has in flight (claimed or running) against its weight, so a
// tenant that submits ten jobs behind another's five thousand has them
// taken next (equal weights take turns); within a tenant, by priority,
// then in the order they became claimable. A fleet of one tenant claims as
// it did, in one statement, while that statement finds jobs.

// tenantWeights is this host's copy of the tenants' weights, read again
// once it is a second old: a tenant added elsewhere is claimed from here
// within a second. Fairness is not a bound anything relies on, so a copy
// that old is enough.
type tenantWeights struct {
	mu       sync.Mutex
	weights  map[string]int64
	loadedAt time.Time
}

const weightsFresh = time.Second

// load is the weights, read again when stale.
func (w *tenantWeights) load(ctx context.Context, db *store.DB) (map[string]int64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.weights != nil && db.Now().Sub(w.loadedAt) < weightsFresh {
		return w.weights, nil
	}
	// Bounded as a write transaction is: a database that does not answer
	// is an error (unavailable), not a claim that hangs.
	ctx, cancel := context.WithTimeout(ctx, store.TxDeadline)
	defer cancel()
	weights := map[string]int64{}
	err := db.Read(ctx, func(tx *store.Tx) error {
		all, err := tx.TenantList(ctx)
		for _, t := range all {
			weights[t.Name] = t.Weight
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	w.weights, w.loadedAt = weights, db.Now()
	return weights, nil
}

// served is the weights of the tenants the caller serves: every tenant's
// this host knows for a caller of all, else its own (weight 1 for one
// added within the second, not yet in this host's copy).
func served(weights map[string]int64, caller fleet.Caller) tenantSet {
	if caller.Tenants == nil {
		return tenantSet{weights: weights}
	}
	own := make(map[string]int64, len(caller.Tenants))
	for _, t := range caller.Tenants {
		own[t] = max(weights[t], 1)
	}
	return tenantSet{weights: own, only: true}
}

// tenantSet is the tenants a claim may take from, by weight; only: none
// but these (a limited caller's), else any with queued jobs.
type tenantSet struct {
	weights map[string]int64
	only    bool
}

// share divides a claim of n among the tenants waiting, one job at a time
// to the tenant whose jobs in flight (with those given it so far) are
// fewest for its weight, ties to the one first in name order; it answers
// each tenant's share, in the order the shares were first given.
func share(n int, waiting []string, weights, inFlight map[string]int64) (order []string, shares map[string]int) {
	shares = map[string]int{}
	if len(waiting) == 0 {
		return nil, shares
	}
	for range n {
		best := ""
		for _, t := range waiting {
			if best == "" || load(t, weights, inFlight, shares) < load(best, weights, inFlight, shares) {
				best = t
			}
		}
		if shares[best] == 0 {
			order = append(order, best)
		}
		shares[best]++
	}
	return order, shares
}

// load is a tenant's jobs in flight, with its share so far, per weight.
func load(t string, weights, inFlight map[string]int64, shares map[string]int) float64 {
	w := weights[t]
	if w < 1 {
		w = 1
	}
	return float64(inFlight[t]+int64(shares[t])) / float64(w)
}

// claimFairly claims up to max jobs across the tenants with queued work
// (fair.go's rule), each tenant's through claim, and only from the set's
// tenants when it names its only ones. It tries the set's tenants, in
// name order; a tenant that yields fewer than its share
// (its jobs backing off, held by another host's claim, or none) drops out
// and its shortfall is shared again among the rest. The first tenant that
// yields nothing has the tenants with queued jobs read (a seek each), so
// tenants with nothing queued cost a claim one statement between them,
// and those with work cost it nothing: the claim reads only the ranges it
// takes from.
func claimFairly(ctx context.Context, tx *store.Tx, tenants tenantSet, max int,
	claim func(tenant string, n int) ([]store.ClaimedJob, error)) ([]store.ClaimedJob, error) {
	weights := tenants.weights
	f := fairClaim{claim: claim, weights: weights, short: map[string]bool{}}
	if len(weights) == 1 {
		// One tenant as far as this host knows: its claim alone, unless it
		// falls short (a tenant added on another host within the second).
		for only := range weights {
			got, err := claim(only, max)
			if err != nil || len(got) == max {
				return got, err
			}
			f.out, f.short[only] = got, true
		}
	}
	var err error
	if f.inFlight, err = tx.JobInFlightByTenant(ctx); err != nil {
		return nil, err
	}
	candidates := slices.Sorted(maps.Keys(weights))
	waitingRead := false
	for len(f.out) < max {
		candidates = slices.DeleteFunc(candidates, func(t string) bool { return f.short[t] })
		if len(candidates) == 0 && waitingRead {
			break
		}
		emptied, err := f.round(max, candidates)
		if err != nil {
			return nil, err
		}
		if (emptied || len(candidates) == 0) && !waitingRead {
			// Some tenant had nothing: read which have work.
			if candidates, err = tx.JobTenantsQueued(ctx); err != nil {
				return nil, err
			}
			if tenants.only {
				candidates = slices.DeleteFunc(candidates, func(t string) bool { _, ok := weights[t]; return !ok })
			}
			waitingRead = true
		}
	}
	return f.out, nil
}

// fairClaim is one fair claim's progress.
type fairClaim struct {
	claim    func(tenant string, n int) ([]store.ClaimedJob, error)
	weights  map[string]int64
	inFlight map[string]int64
	short    map[string]bool // tenants that yielded fewer than their share
	out      []store.ClaimedJob
}

// round shares what is left of the claim among candidates and claims each
// share; emptied reports that a tenant yielded nothing.
func (f *fairClaim) round(max int, candidates []string) (emptied bool, err error) {
	order, shares := share(max-len(f.out), candidates, f.weights, f.inFlight)
	for _, t := range order {
		got, err := f.claim(t, shares[t])
		if err != nil {
			return false, err
		}
		f.out = append(f.out, got...)
		f.inFlight[t] += int64(len(got))
		if len(got) < shares[t] {
			f.short[t] = true
			emptied = emptied || len(got) == 0
		}
	}
	return emptied, nil
}
