package claims

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/combine"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/pause"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// Claims that admit, arriving together from workers that serve the same
// tenants, run as one transaction, combined by package combine: one pick
// for all of them (a statement a tenant, not a claim), each job going to
// one claim's worker under that claim's ids (store.ClaimOwner), each
// admitted as its worker's (its own caller, credential cap and receipt),
// and one commit. A repeated claim, which answers what its key holds, and
// a claim of combineBelow jobs or more always run alone. A claim whose
// caller goes away before a transaction takes it is dropped: nothing is
// leased that nobody would receive.

// waitingClaim is one claim waiting for, or in, a combined transaction.
type waitingClaim struct {
	ctx        context.Context // its request's, for its span
	since      time.Time
	caller     fleet.Caller
	ask        claimAsk
	firstClaim bool
	out        claimed
	err        error
}

func newCombiner(c *Claims, inFlight int) *combine.Combiner[*waitingClaim] {
	return combine.New(combine.Config[*waitingClaim]{Slots: inFlight, Fits: fitsTogether, Run: c.runCombined, DropGone: true})
}

// combineBelow is the least claim that runs alone even where claims are
// combined: a claim of that many jobs already shares its statements and
// its commit among them, and holding it for a combined transaction's slot
// cost batches of 32 a tenth of their throughput (BENCHMARKS.md).
const combineBelow = 8

// combines reports whether a claim may wait to be taken with others: a
// first send of a claim that admits fewer than combineBelow jobs.
func combines(ask Ask) bool {
	return ask.Admit && !ask.Repeat && ask.Max < combineBelow
}

// maxCombinedJobs bounds the jobs one combined transaction may claim.
const maxCombinedJobs = wire.MaxClaimBatch

// fitsTogether: claims combine with others that may take the same jobs
// (their callers serve the same tenants), up to maxCombinedJobs asked
// between them.
func fitsTogether(w *waitingClaim, batch []*waitingClaim) bool {
	jobs := w.ask.Max
	for _, b := range batch {
		jobs += b.ask.Max
	}
	return tenantsKey(w.caller) == tenantsKey(batch[0].caller) && jobs <= maxCombinedJobs
}

// takeCombined answers one claim, in whichever combined transaction
// takes it.
func (c *Claims) takeCombined(ctx context.Context, caller fleet.Caller, ask claimAsk, firstClaim bool) (claimed, error) {
	w := &waitingClaim{ctx: ctx, since: time.Now(), caller: caller, ask: ask, firstClaim: firstClaim}
	if err := c.combiner.Do(ctx, w); err != nil {
		return claimed{}, err
	}
	return w.out, w.err
}

// tenantsKey names the tenants a caller's claims may take from.
func tenantsKey(caller fleet.Caller) string {
	if caller.Tenants == nil {
		return "*"
	}
	return strings.Join(slices.Sorted(slices.Values(caller.Tenants)), "\x00")
}

// runCombined claims for batch in one transaction. If the transaction
// fails before its commit (its own statements failed: nothing was
// written), each claim runs alone, so that one claim's failure is its own
// answer. If it fails at or after its commit, which may have taken
// effect, every claim is answered with that error, as a claim alone would
// be; each worker's repeat under its key runs alone and answers what it
// holds.
func (c *Claims) runCombined(ctx context.Context, batch []*waitingClaim) {
	// Each is answered, if only with this, even if the transaction panics.
	for _, w := range batch {
		w.err = fmt.Errorf("claim by %s: its combined transaction ended without an answer", w.caller.ID)
	}
	if len(batch) > 1 {
		outs, decided, err := c.takeTogether(ctx, batch)
		if err == nil || decided {
			for i, w := range batch {
				w.err = err
				if err == nil {
					w.out = outs[i]
				}
				w.trace(len(batch))
			}
			return
		}
	}
	for _, w := range batch {
		w.out, w.err = c.takeAlone(ctx, w.caller, w.ask, w.firstClaim)
	}
}

// trace records, in the claim's own trace, its span from arrival to
// answer: the transaction's own span is in the trace of the request that
// ran it.
func (w *waitingClaim) trace(claims int) {
	tracing.Since(w.ctx, "fleet.claim-admit", w.since, w.err, tracing.Worker.String(w.caller.ID), attribute.Int("fleet.combined", claims))
}

// claimedTogether is a combined transaction's answers, in its claims'
// order.
type claimedTogether []claimed

// Jobs is how many jobs the claims took, for the storage counters.
func (t claimedTogether) Jobs() int64 {
	var n int64
	for _, c := range t {
		n += c.Jobs()
	}
	return n
}

// takeTogether is the combined transaction: each claim's first-claim
// event, one fair pick for all of them with every job owned by one claim,
// the claimed events, and each job admitted as its claim's worker's.
// decided reports that the transaction's last run decided everything, so
// that an error came at or after its commit.
func (c *Claims) takeTogether(ctx context.Context, batch []*waitingClaim) (out claimedTogether, decided bool, err error) {
	out, err = ledger.Write(ctx, c.ledger, ledger.Named[claimedTogether]("claim-admit"), func(tx *store.Tx) (claimedTogether, error) {
		decided = false // a run again after a lost race decides afresh
		out, err := c.claimTogether(ctx, tx, batch)
		decided = err == nil
		return out, err
	})
	return out, decided, err
}

// claimTogether is takeTogether's transaction.
func (c *Claims) claimTogether(ctx context.Context, tx *store.Tx, batch []*waitingClaim) (claimedTogether, error) {
	tx.HoldClaims()
	out := make(claimedTogether, len(batch))
	for _, w := range batch {
		if err := c.workerStarted(ctx, tx, w.caller, w.ask.WorkerPID, w.firstClaim); err != nil {
			return out, err
		}
	}
	if err := pause.Hold(ctx, tx); err != nil {
		return out, err
	}
	var owners []store.ClaimOwner
	byPrefix := map[string]int{}
	for i, w := range batch {
		prefix, err := claimPrefix(w.ask.Key)
		if err != nil {
			return out, err
		}
		byPrefix[prefix] = i
		for range w.ask.Max {
			owners = append(owners, store.ClaimOwner{Worker: w.caller.ID, ClaimPrefix: prefix})
		}
	}
	used := 0
	picked, err := claimFairly(ctx, tx, served(batch[0].ask.weights, batch[0].caller), len(owners), func(tenant string, n int) ([]store.ClaimedJob, error) {
		got, err := tx.JobClaimMany(ctx, &store.JobClaimManyParams{Tenant: tenant, Max: n, Owners: owners[used : used+n],
			ClaimHost: c.registry.ID, LeaseExpiresAtMS: tx.Now.Add(c.lease).UnixMilli(), NowMS: tx.NowMS(), UnlessPaused: true})
		used += len(got)
		return got, err
	})
	if err != nil {
		return out, err
	}
	byClaim := make([][]store.ClaimedJob, len(batch))
	callers := make([]fleet.Caller, len(picked))
	for i, j := range picked {
		claim := byPrefix[j.ClaimID[:strings.LastIndexByte(j.ClaimID, '.')+1]]
		byClaim[claim] = append(byClaim[claim], j)
		callers[i] = batch[claim].caller
		if err := c.appendClaimed(ctx, tx, callers[i], j); err != nil {
			return out, err
		}
	}
	for i, jobs := range byClaim {
		out[i] = claimedJobs(jobs)
	}
	if len(picked) > 0 {
		admitted, err := c.admitter.AdmitClaimed(ctx, tx, callers, heldJobs(picked))
		if err != nil {
			return out, err
		}
		splitAdmissions(out, byClaim, picked, admitted)
	}
	if slices.ContainsFunc(byClaim, func(jobs []store.ClaimedJob) bool { return len(jobs) == 0 }) {
		queue, err := queueState(ctx, tx, batch[0].caller)
		if err != nil {
			return out, err
		}
		for i := range out {
			if len(byClaim[i]) == 0 {
				out[i].res.Queue = queue
			}
		}
	}
	return out, nil
}

// splitAdmissions gives each claim the answers of its own jobs'
// admissions, out of those of every job picked.
func splitAdmissions(each []claimed, byClaim [][]store.ClaimedJob, picked []store.ClaimedJob, admitted func(context.Context) ([]wire.Admission, error)) {
	at := make(map[string]int, len(picked))
	for i, j := range picked {
		at[j.OperationID] = i
	}
	var once sync.Once
	var all []wire.Admission
	var err error
	for i, jobs := range byClaim {
		if len(jobs) == 0 {
			continue
		}
		each[i].admissions = func(ctx context.Context) ([]wire.Admission, error) {
			once.Do(func() { all, err = admitted(ctx) })
			if err != nil {
				return nil, err
			}
			own := make([]wire.Admission, len(jobs))
			for k, j := range jobs {
				own[k] = all[at[j.OperationID]]
			}
			return own, nil
		}
	}
}

// Waiting is how many claims wait for a combined transaction to take them
// (none where claims are not combined).
func (c *Claims) Waiting() int {
	if c.combiner == nil {
		return 0
	}
	return c.combiner.Waiting()
}

// Running is how many combined transactions hold a slot now (none where
// claims are not combined).
func (c *Claims) Running() int {
	if c.combiner == nil {
		return 0
	}
	return c.combiner.Running()
}
