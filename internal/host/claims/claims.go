// Package claims is who holds which job: a worker's claim of the oldest
// queued jobs (keyed, so a repeat answers what it holds), the heartbeat
// that renews a claim's lease, a job its worker gives back, and the
// sweeper that ends the leases that lapse.
package claims

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/combine"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/pause"
	"github.com/fleet/fleet/internal/host/registry"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/metrics"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/series"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// Claims leases jobs to workers.
type Claims struct {
	ledger   *ledger.Ledger
	metrics  *metrics.Metrics
	series   *series.Recorder
	registry *registry.Registry // this host: its identity, and whether it is in touch
	lease    time.Duration      // a claim's lease
	admitter Admitter           // a claim that admits its jobs
	// combiner, when set, runs claims that admit arriving together from
	// several workers in one transaction (combine.go).
	combiner *combine.Combiner[*waitingClaim]

	mu          sync.Mutex
	seenWorkers map[string]bool // workers that have claimed since this host started
	weights     tenantWeights   // the tenants' weights, for claims fair across them
}

// Admitter admits the jobs a claim takes, in the claim's transaction
// (package admission): AdmitClaimed decides each held job's admission
// exactly as its dispatch would, as callers[i]'s for held[i] (a job
// already decided under the claim keeps its decision), and the function
// it returns, called after the commit, answers each decision in held's
// order.
type Admitter interface {
	AdmitClaimed(ctx context.Context, tx *store.Tx, callers []fleet.Caller, held []store.Job) (func(context.Context) ([]wire.Admission, error), error)
}

// New leases through l, counting in m and s, as the host r registers,
// admitting through a when a claim asks; lease is the lease a claim has
// now. combine is how many combined transactions of claims that admit may
// run at once (combine.go); 0 runs each claim alone.
func New(l *ledger.Ledger, m *metrics.Metrics, s *series.Recorder, r *registry.Registry, a Admitter, lease time.Duration, combine int) *Claims {
	c := &Claims{ledger: l, metrics: m, series: s, registry: r, admitter: a, lease: lease, seenWorkers: map[string]bool{}}
	if combine > 0 {
		c.combiner = newCombiner(c, combine)
	}
	return c
}

// Ask is what a claim asks for: up to Max jobs; under Key (a canonical
// UUID the worker chose, or none), sent again when Repeat; each admitted
// in the claim's transaction when Admit. WorkerPID is the worker's
// process, for its first claim's event.
type Ask struct {
	Max       int
	Key       string
	Repeat    bool
	Admit     bool
	WorkerPID int
}

// Claim leases up to max of the oldest queued jobs to the caller, each
// with a new claim id and its document assigned to the caller at the next
// generation, in one transaction.
func (c *Claims) Claim(ctx context.Context, caller fleet.Caller, workerPID, max int) (wire.ClaimResult, error) {
	return c.ClaimKeyed(ctx, caller, workerPID, max, "", false)
}

// ClaimKeyed is Claim under a key the worker chose for this claim (a
// canonical UUID): the jobs' claim ids begin "key.". With repeat
// (the worker sends the same claim again after its answer did not
// arrive), the jobs the caller still holds claimed under the key are
// answered again rather than others claimed while those wait out their
// leases; only when it holds none is the claim made afresh.
func (c *Claims) ClaimKeyed(ctx context.Context, caller fleet.Caller, workerPID, max int, key string, repeat bool) (wire.ClaimResult, error) {
	return c.Take(ctx, caller, Ask{Max: max, Key: key, Repeat: repeat, WorkerPID: workerPID})
}

// Take is the claim ask asks for. With Admit, the one transaction that
// claims the jobs also admits each (or denies it) with exactly its
// dispatch's decision, receipt and event, and each job's answer carries
// its admission; a repeat answers the jobs with the decisions they had.
func (c *Claims) Take(ctx context.Context, caller fleet.Caller, ask Ask) (wire.ClaimResult, error) {
	if ask.Max < 1 || ask.Max > wire.MaxClaimBatch {
		return wire.ClaimResult{}, fleet.Errorf(wire.CodeInvalid, "max must be 1 to %d, got %d", wire.MaxClaimBatch, ask.Max)
	}
	ctx = tracing.With(ctx, tracing.Worker.String(caller.ID))
	if err := c.registry.CheckInTouch(); err != nil {
		return wire.ClaimResult{}, err
	}
	// The first claim by a worker since this host started records it,
	// decided here, outside the transaction (which may run again): a
	// concurrent claim by the same worker sees the mark and records
	// nothing, and a failed claim unmarks it (so the event can be missed
	// when that races, never doubled).
	firstClaim := c.markSeen(caller.ID, true)
	// The tenants' weights only order the claim (fairness is bounded by
	// nothing), so this host's copy is read before the transaction.
	weights, err := c.weights.load(ctx, c.ledger.DB())
	if err != nil {
		if firstClaim {
			c.markSeen(caller.ID, false)
		}
		return wire.ClaimResult{}, err
	}
	ca := claimAsk{Ask: ask, weights: weights}
	var out claimed
	if c.combiner != nil && combines(ask) {
		out, err = c.takeCombined(ctx, caller, ca, firstClaim)
	} else {
		out, err = c.takeAlone(ctx, caller, ca, firstClaim)
	}
	if err != nil {
		if firstClaim {
			c.markSeen(caller.ID, false)
		}
		return out.res, err
	}
	if out.admissions != nil {
		if err := out.answerAdmissions(ctx); err != nil {
			return wire.ClaimResult{}, err
		}
	}
	if out.replayed {
		c.ledger.Log.Info("claim repeated: its jobs answered again", "worker", caller.ID, "key", ask.Key, "jobs", len(out.res.Jobs))
		return out.res, nil
	}
	for _, j := range out.res.Jobs {
		c.ledger.Log.Info("claimed", "operation_id", j.OperationID, "worker", caller.ID,
			"generation", j.Claim.Generation, "claim_id", j.Claim.ClaimID)
	}
	for _, waited := range out.waited {
		c.metrics.Waited(waited)
		c.series.Observe("queue_wait", waited)
	}
	return out.res, nil
}

// takeAlone is one claim's transaction.
func (c *Claims) takeAlone(ctx context.Context, caller fleet.Caller, ask claimAsk, firstClaim bool) (claimed, error) {
	point := "claim"
	if ask.Admit {
		point = "claim-admit"
	}
	return ledger.Write(ctx, c.ledger, ledger.Named[claimed](point), func(tx *store.Tx) (claimed, error) {
		if ask.Admit {
			// Each job's row is written once, claimed and admitted
			// together, rather than claimed and then admitted.
			tx.HoldClaims()
		}
		if err := c.workerStarted(ctx, tx, caller, ask.WorkerPID, firstClaim); err != nil {
			return claimed{}, err
		}
		out, err := c.claim(ctx, tx, caller, ask)
		if err != nil || !ask.Admit || len(out.held) == 0 {
			return out, err
		}
		out.admissions, err = c.admitter.AdmitClaimed(ctx, tx, slices.Repeat([]fleet.Caller{caller}, len(out.held)), out.held)
		return out, err
	})
}

// workerStarted records a worker's first claim since this host started.
func (c *Claims) workerStarted(ctx context.Context, tx *store.Tx, caller fleet.Caller, pid int, firstClaim bool) error {
	if !firstClaim {
		return nil
	}
	return ledger.AppendEvent(ctx, tx, wire.EventWorkerStarted, caller.ID,
		fmt.Sprintf("%s is asking for work", caller.ID), map[string]any{"worker": caller.ID, "pid": pid})
}

// claimed is a claim's answer, and whether it repeats an earlier one.
type claimed struct {
	res      wire.ClaimResult
	replayed bool
	// waited is how long each job claimed waited to be, from when it
	// became claimable: fleet_job_queue_wait_seconds.
	waited []time.Duration
	// held are the jobs answered, and admissions, for a claim that
	// admits them, their admissions' answers once committed.
	held       []store.Job
	admissions func(context.Context) ([]wire.Admission, error)
}

// answerAdmissions puts each job's admission in the claim's answer.
func (c *claimed) answerAdmissions(ctx context.Context) error {
	adms, err := c.admissions(ctx)
	if err != nil {
		return err
	}
	for i := range c.res.Jobs {
		c.res.Jobs[i].Admission = &adms[i]
	}
	if len(c.res.Jobs) > 0 {
		c.res.Job = &c.res.Jobs[0]
	}
	return nil
}

// Jobs is how many jobs the claim took, for the storage counters.
func (c claimed) Jobs() int64 {
	if c.replayed {
		return 0
	}
	return int64(len(c.res.Jobs))
}

// claimAsk is what a claim asks for, fairly by the tenants' weights.
type claimAsk struct {
	Ask
	weights map[string]int64
}

// claim is ClaimKeyed's transaction: a repeated keyed claim's jobs still
// held, or up to max newly claimed, or word of whether the queue may yet
// have some.
func (c *Claims) claim(ctx context.Context, tx *store.Tx, caller fleet.Caller, ask claimAsk) (claimed, error) {
	if ask.Repeat && ask.Key != "" {
		prior, err := tx.JobListClaimedUnder(ctx, &store.JobListClaimedUnderParams{Worker: caller.ID, Prefix: ask.Key + "."})
		if !ask.Admit { // decided jobs are a claim that admits them's
			prior = slices.DeleteFunc(prior, func(j store.ClaimedJob) bool { return j.State != wire.Claimed })
		}
		if err != nil || len(prior) > 0 {
			return claimed{res: claimResult(prior), replayed: true, held: heldJobs(prior)}, err
		}
	}
	if err := pause.Hold(ctx, tx); err != nil {
		return claimed{}, err
	}
	jobs, err := c.claimMany(ctx, tx, caller, ask) // nothing while paused
	if err != nil || len(jobs) > 0 {
		return claimedJobs(jobs), err
	}
	res := claimResult(nil)
	res.Queue, err = queueState(ctx, tx, caller)
	return claimed{res: res}, err
}

// claimedJobs is the answer of a claim that took jobs.
func claimedJobs(jobs []store.ClaimedJob) claimed {
	out := claimed{res: claimResult(jobs), waited: make([]time.Duration, len(jobs)), held: heldJobs(jobs)}
	for i, j := range jobs {
		claimable := j.ClaimableAtMS
		if j.CreatedAtMS > claimable {
			claimable = j.CreatedAtMS
		}
		out.waited[i] = time.Duration(j.ClaimedAtMS-claimable) * time.Millisecond
	}
	return out
}

// queueState is what a claim that took nothing answers of the queue:
// paused, or whether jobs the caller may claim are still claimed,
// running or backing off (they may yet be claimable), or none.
func queueState(ctx context.Context, tx *store.Tx, caller fleet.Caller) (wire.Queue, error) {
	if paused, err := pause.Paused(ctx, tx); err != nil || paused {
		return wire.QueuePaused, err
	}
	pending, err := pendingFor(ctx, tx, caller)
	if pending {
		return wire.QueueWaiting, err
	}
	return wire.QueueEmpty, err
}

// pendingFor reports whether any job the caller may claim may still be
// claimable: of its tenants, for a caller limited to some (another
// tenant's backlog is not its to wait for).
func pendingFor(ctx context.Context, tx *store.Tx, caller fleet.Caller) (bool, error) {
	if caller.Tenants == nil {
		return tx.JobPending(ctx)
	}
	queued, err := tx.JobTenantsQueued(ctx)
	if err != nil || slices.ContainsFunc(queued, caller.Serves) {
		return err == nil, err
	}
	inFlight, err := tx.JobInFlightByTenant(ctx)
	for t, n := range inFlight {
		if n > 0 && caller.Serves(t) {
			return true, err
		}
	}
	return false, err
}

// markSeen marks (or, after a failed first claim, unmarks) a worker as
// seen by this host, and reports whether marking it was new.
func (c *Claims) markSeen(worker string, seen bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !seen {
		delete(c.seenWorkers, worker)
		return false
	}
	first := !c.seenWorkers[worker]
	c.seenWorkers[worker] = true
	return first
}

// heldJobs are the jobs of a claim's answer.
func heldJobs(claimed []store.ClaimedJob) []store.Job {
	held := make([]store.Job, len(claimed))
	for i, j := range claimed {
		held[i] = j.Job
	}
	return held
}

// claimResult is what a worker is told of the jobs it holds claimed.
func claimResult(claimed []store.ClaimedJob) wire.ClaimResult {
	res := wire.ClaimResult{Jobs: make([]wire.ClaimedJob, 0, len(claimed))}
	for _, j := range claimed {
		res.Jobs = append(res.Jobs, claimedJob(j.Job, jobs.InputOf(j.Job, j.BatchDocument)))
	}
	if len(res.Jobs) > 0 {
		res.Job = &res.Jobs[0]
	}
	return res
}

// claimMany leases up to max queued jobs of the tenants the caller
// serves, fairly across them (fair.go) and by priority then age within one (another host's claimer may hold
// some: the backend passes over them), in statements that do not grow
// with max (one for a fleet of one tenant), or none while claims are
// paused (read by the same statements, under pause.Hold). Each claim id is the claim's own
// prefix (a new UUID, after "key." for a keyed claim) and the job's
// position.
func (c *Claims) claimMany(ctx context.Context, tx *store.Tx, caller fleet.Caller, ask claimAsk) ([]store.ClaimedJob, error) {
	prefix, err := claimPrefix(ask.Key)
	if err != nil {
		return nil, err
	}
	claimed, err := claimFairly(ctx, tx, served(ask.weights, caller), ask.Max, func(tenant string, n int) ([]store.ClaimedJob, error) {
		return tx.JobClaimMany(ctx, &store.JobClaimManyParams{Tenant: tenant, Max: n, ClaimPrefix: prefix, Worker: caller.ID,
			ClaimHost: c.registry.ID, LeaseExpiresAtMS: tx.Now.Add(c.lease).UnixMilli(), NowMS: tx.NowMS(), UnlessPaused: true})
	})
	if err != nil {
		return nil, err
	}
	for _, j := range claimed {
		if err := c.appendClaimed(ctx, tx, caller, j); err != nil {
			return nil, err
		}
	}
	return claimed, nil
}

// claimPrefix is a new claim's prefix of its jobs' claim ids: a new UUID,
// after "key." for a keyed claim (unique still: a repeat may claim
// afresh), and a dot.
func claimPrefix(key string) (string, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	prefix := id.String() + "."
	if key != "" {
		prefix = key + "." + prefix
	}
	return prefix, nil
}

// appendClaimed appends a claimed job's event.
func (c *Claims) appendClaimed(ctx context.Context, tx *store.Tx, caller fleet.Caller, j store.ClaimedJob) error {
	return ledger.AppendJobEvent(ctx, tx, wire.EventClaimed, caller.ID,
		fmt.Sprintf("%s claimed the %s section", caller.ID, j.Section), j.OperationID,
		claimedData{OperationID: j.OperationID, Section: j.Section, ClaimID: j.ClaimID, Generation: j.Generation, Host: c.registry.ID})
}

// claimedData is a claim's event's data, its members in the order
// encoding/json writes a map's.
type claimedData struct {
	ClaimID     string `json:"claim_id"`
	Generation  int64  `json:"generation"`
	Host        string `json:"host"`
	OperationID string `json:"operation_id"`
	Section     string `json:"section"`
}

// Heartbeat renews the lease of the current claim of a claimed or running
// job. The holder of a claim whose job the operator cancelled learns it here
// (cancel_requested, nothing renewed); any other claim is stale.
func (c *Claims) Heartbeat(ctx context.Context, caller fleet.Caller, op string, ref wire.ClaimRef) (wire.HeartbeatResult, error) {
	ctx = tracing.With(ctx, tracing.OperationID.String(op), tracing.ClaimID.String(ref.ClaimID),
		tracing.Generation.Int64(ref.Generation), tracing.Worker.String(caller.ID))
	return ledger.Write(ctx, c.ledger, ledger.Named[wire.HeartbeatResult]("heartbeat"), func(tx *store.Tx) (wire.HeartbeatResult, error) {
		return c.heartbeat(ctx, tx, caller, op, ref)
	})
}

// heartbeat is Heartbeat's transaction.
func (c *Claims) heartbeat(ctx context.Context, tx *store.Tx, caller fleet.Caller, op string, ref wire.ClaimRef) (wire.HeartbeatResult, error) {
	j, err := jobs.Get(ctx, tx, op, store.ForUpdate)
	if err != nil {
		return wire.HeartbeatResult{}, err
	}
	if jobs.CancelledUnder(j, caller.ID, ref.ClaimID) {
		return wire.HeartbeatResult{CancelRequested: true}, nil
	}
	if err := jobs.CheckClaim(j, caller, ref.ClaimID, ref.Generation, wire.Claimed, wire.Running); err != nil {
		return wire.HeartbeatResult{}, err
	}
	lease := tx.Now.Add(c.lease).UnixMilli()
	return wire.HeartbeatResult{LeaseExpiresAtMS: lease}, tx.JobRenewLease(ctx, &store.JobRenewLeaseParams{
		OperationID: op, IfClaimID: j.ClaimID, LeaseExpiresAtMS: lease, NowMS: tx.NowMS()})
}

// claimedJob is what a worker is told of a job it holds claimed.
func claimedJob(j store.Job, input wire.Input) wire.ClaimedJob {
	// Not CurrentClaim: a repeated claim that admitted may answer a
	// refused job, whose claim is over but was this one.
	return wire.ClaimedJob{OperationID: j.OperationID, Section: j.Section, DocumentID: j.DocumentID,
		InputSHA256: j.InputSHA256, Input: input, Claim: wire.Claim{ClaimID: j.ClaimID, Generation: j.Generation, LeaseExpiresAtMS: j.LeaseExpiresAtMS},
		DocumentVersion: j.DocumentVersion}
}

// HeartbeatMany is Heartbeat for each item, in one transaction.
func (c *Claims) HeartbeatMany(ctx context.Context, caller fleet.Caller, items []ledger.JobCall[wire.ClaimRef]) ([]ledger.Answer[wire.HeartbeatResult], error) {
	return ledger.Batch(ctx, c.ledger, "heartbeat-batch", ledger.BatchReads{Ops: ledger.Ops(items)}, func(tx *store.Tx, i int) (wire.HeartbeatResult, error) {
		return c.heartbeat(ctx, tx, caller, items[i].OperationID, items[i].Request)
	})
}

// Release gives a claimed or running job back from the worker holding it,
// unfinished (the worker is shutting down), in one transaction: the
// whole reservation goes back to available (nothing of the work took
// effect: the worker stopped it before publishing), the document's
// assignment is revoked at the next generation, and the job is queued
// again, claimable at once, its attempts not counted. A requeue receipt
// (decision released) and a fleet.released event record it. Only the
// current claim can release; a repeat after it committed finds its claim
// stale (stale_claim), which tells the worker the job is no longer its.
func (c *Claims) Release(ctx context.Context, caller fleet.Caller, op string, ref wire.ClaimRef) (wire.ReleaseResult, error) {
	ctx = tracing.With(ctx, tracing.OperationID.String(op), tracing.ClaimID.String(ref.ClaimID),
		tracing.Generation.Int64(ref.Generation), tracing.Worker.String(caller.ID))
	res, err := ledger.Write(ctx, c.ledger, ledger.Named[wire.ReleaseResult]("release"), func(tx *store.Tx) (wire.ReleaseResult, error) {
		return c.release(ctx, tx, caller, op, ref)
	})
	if err == nil {
		c.ledger.Log.Info("released", "operation_id", op, "worker", caller.ID, "generation", res.Generation,
			"released", res.Released, "receipt_id", res.ReceiptID)
	}
	return res, err
}

// release is Release's transaction.
func (c *Claims) release(ctx context.Context, tx *store.Tx, caller fleet.Caller, op string, ref wire.ClaimRef) (wire.ReleaseResult, error) {
	var res wire.ReleaseResult
	j, err := jobs.Get(ctx, tx, op, store.ForUpdate)
	if err != nil {
		return res, err
	}
	if err := jobs.CheckClaim(j, caller, ref.ClaimID, ref.Generation, wire.Claimed, wire.Running); err != nil {
		return res, err
	}
	held, was := j.Reserved, j.State
	acct, err := tx.AccountingGet(ctx, store.NoLock)
	if err != nil {
		return res, err
	}
	if held > 0 {
		if acct, err = jobs.Spend(ctx, tx, &j, 0); err != nil {
			return res, err
		}
	}
	if err := jobs.RevokeAssignment(ctx, tx, &j, "released"); err != nil {
		return res, err
	}
	reason := fmt.Sprintf("released by %s, which stopped before finishing it", caller.ID)
	if err := jobs.Requeue(ctx, tx, &j, j.Worker, tx.NowMS(), reason); err != nil {
		return res, err
	}
	draft := receipts.Draft{Kind: wire.KindRequeue, OperationID: op, Caller: caller.ID, Decision: wire.DecisionReleased,
		Accounting: acct, Tenant: j.Tenant, Credential: j.ReserveCredential}
	if held > 0 { // nothing is reserved before dispatch, so nothing is given back
		draft.Reserved = &held
	}
	r, err := c.ledger.IssueReceipt(tx, draft)
	if err != nil {
		return res, err
	}
	res = wire.ReleaseResult{State: j.State, Generation: j.Generation, Released: held, ReceiptID: r.ID}
	return res, ledger.AppendEvent(ctx, tx, wire.EventReleased, caller.ID,
		fmt.Sprintf("%s gave the %s section back unfinished (was %s); it is queued again", caller.ID, j.Section, was),
		map[string]any{"operation_id": op, "was": was, "generation": j.Generation, "released": held, "receipt_id": r.ID, "accounting": acct})
}

// ExpireLeases applies lease expiry: a claimed job goes back to the queue
// at a new generation, claimable at once, the lapse counting as a failed
// attempt (its last allowed one fails the job); a running job becomes
// unresolved and keeps its assignment, so a slow worker still alive can
// publish.
func (c *Claims) ExpireLeases(ctx context.Context) (int, error) {
	// A cheap read first, so an idle host takes no write lock; the write
	// transaction below decides afresh from what it reads itself.
	var due []store.Job
	if err := c.ledger.DB().Read(ctx, func(tx *store.Tx) (err error) {
		due, err = tx.JobListExpired(ctx, &store.JobListExpiredParams{NowMS: tx.NowMS(), Lock: store.NoLock})
		return err
	}); err != nil || len(due) == 0 {
		return 0, err
	}
	movedTo, err := ledger.Write(ctx, c.ledger, ledger.Named[[]wire.JobState]("lease-expiry"), func(tx *store.Tx) ([]wire.JobState, error) {
		expired, err := tx.JobListExpired(ctx, &store.JobListExpiredParams{NowMS: tx.NowMS(), Lock: store.ForUpdate})
		if err != nil {
			return nil, err
		}
		var movedTo []wire.JobState
		for i := range expired {
			j := &expired[i]
			worker := j.Worker
			if j.State == wire.Claimed {
				if err := c.lapseBeforeDispatch(ctx, tx, j); err != nil {
					return nil, err
				}
			} else if err := setUnresolved(ctx, tx, j, "lease expired while running; no publication is known"); err != nil {
				return nil, err
			}
			movedTo = append(movedTo, j.State)
			if err := ledger.AppendEvent(ctx, tx, wire.EventLeaseExpired, "host",
				fmt.Sprintf("%s's lease on %s expired; the job is %s", worker, j.Section, j.State),
				map[string]any{"operation_id": j.OperationID, "worker": worker, "state": j.State, "generation": j.Generation}); err != nil {
				return nil, err
			}
		}
		return movedTo, nil
	})
	if err != nil {
		return 0, err
	}
	for _, st := range movedTo {
		c.metrics.LeaseExpired(string(st))
		if st != wire.Unresolved { // a lapse before dispatch: a failed attempt
			c.metrics.Failure("lease_expired", string(st))
		}
		if st == wire.Failed {
			c.series.Failed()
		}
	}
	if len(movedTo) > 0 {
		c.ledger.Log.Info("leases expired", "jobs", len(movedTo))
	}
	return len(movedTo), nil
}

// lapseBeforeDispatch counts a claim whose lease ran out before dispatch
// as a failed attempt (the worker died or hung: a retry is worth it), and
// queues the job again at a new generation, or fails it when that was its
// last attempt. Nothing was reserved, so nothing settles.
func (c *Claims) lapseBeforeDispatch(ctx context.Context, tx *store.Tx, j *store.Job) error {
	claimID, worker, generation := j.ClaimID, j.Worker, j.Generation
	if err := jobs.RevokeAssignment(ctx, tx, j, "lease expired"); err != nil {
		return err
	}
	const reason = "the lease expired before dispatch"
	j.Attempts++
	j.LastError = reason // claimable at once, in its old place (it was claimable to be claimed)
	outcome, why := wire.DecisionRetry, fmt.Sprintf("attempt %d of %d: %s", j.Attempts, j.MaxAttempts, reason)
	var err error
	if j.Attempts >= j.MaxAttempts {
		outcome = wire.DecisionFailed
		err = jobs.Fail(ctx, tx, j, why)
	} else {
		err = jobs.Requeue(ctx, tx, j, j.Worker, j.ClaimableAtMS, why)
	}
	if err != nil {
		return err
	}
	// No answer: nobody called, so a late fail under this claim is stale,
	// not a repeat.
	return tx.AttemptInsert(ctx, store.Attempt{OperationID: j.OperationID, ClaimID: claimID,
		Attempt: wire.Attempt{Attempt: j.Attempts, Worker: worker, Generation: generation, Reason: reason,
			Retryable: true, Outcome: string(outcome), AtMS: tx.NowMS()}})
}

// setUnresolved marks a running job whose lease lapsed unresolved; it
// keeps its assignment and reservation.
func setUnresolved(ctx context.Context, tx *store.Tx, j *store.Job, reason string) error {
	if err := jobs.CheckMove(*j, wire.Unresolved); err != nil {
		return err
	}
	err := tx.JobSetUnresolved(ctx, &store.JobSetUnresolvedParams{OperationID: j.OperationID, Reason: reason, NowMS: tx.NowMS()})
	j.State, j.Reason = wire.Unresolved, reason
	return err
}

// RunLeaseSweeper expires leases every interval until ctx ends.
func (c *Claims) RunLeaseSweeper(ctx context.Context, interval time.Duration, onError func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := c.ExpireLeases(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, store.ErrClosed) {
				onError(err)
			}
		}
	}
}
