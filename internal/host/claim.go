package host

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/pause"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// Claim leases up to max of the oldest queued jobs to the caller, each
// with a new claim id and its document assigned to the caller at the next
// generation, in one transaction.
func (h *Host) Claim(ctx context.Context, caller fleet.Caller, workerPID, max int) (wire.ClaimResult, error) {
	return h.ClaimKeyed(ctx, caller, workerPID, max, "", false)
}

// ClaimKeyed is Claim under a key the worker chose for this claim (a
// canonical UUID): the jobs' claim ids begin "key.". With repeat
// (the worker sends the same claim again after its answer did not
// arrive), the jobs the caller still holds claimed under the key are
// answered again rather than others claimed while those wait out their
// leases; only when it holds none is the claim made afresh.
func (h *Host) ClaimKeyed(ctx context.Context, caller fleet.Caller, workerPID, max int, key string, repeat bool) (wire.ClaimResult, error) {
	if max < 1 || max > wire.MaxClaimBatch {
		return wire.ClaimResult{}, fleet.Errorf(wire.CodeInvalid, "max must be 1 to %d, got %d", wire.MaxClaimBatch, max)
	}
	ctx = tracing.With(ctx, tracing.Worker.String(caller.ID))
	if err := h.registry.CheckInTouch(); err != nil {
		return wire.ClaimResult{}, err
	}
	// The first claim by a worker since this host started records it,
	// decided here, outside the transaction (which may run again): a
	// concurrent claim by the same worker sees the mark and records
	// nothing, and a failed claim unmarks it (so the event can be missed
	// when that races, never doubled).
	firstClaim := h.markSeen(caller.ID, true)
	out, err := ledger.Write(ctx, h.ledger, ledger.Named[claimed]("claim"), func(tx *store.Tx) (claimed, error) {
		if firstClaim {
			if err := ledger.AppendEvent(ctx, tx, wire.EventWorkerStarted, caller.ID,
				fmt.Sprintf("%s is asking for work", caller.ID), map[string]any{"worker": caller.ID, "pid": workerPID}); err != nil {
				return claimed{}, err
			}
		}
		return h.claim(ctx, tx, caller, max, key, repeat)
	})
	if err != nil {
		if firstClaim {
			h.markSeen(caller.ID, false)
		}
		return out.res, err
	}
	if out.replayed {
		h.Log.Info("claim repeated: its jobs answered again", "worker", caller.ID, "key", key, "jobs", len(out.res.Jobs))
		return out.res, nil
	}
	for _, j := range out.res.Jobs {
		h.Log.Info("claimed", "operation_id", j.OperationID, "worker", caller.ID,
			"generation", j.Claim.Generation, "claim_id", j.Claim.ClaimID)
	}
	for _, waited := range out.waited {
		h.metrics.Waited(waited)
		h.series.Observe("queue_wait", waited)
	}
	return out.res, nil
}

// claimed is a claim's answer, and whether it repeats an earlier one.
type claimed struct {
	res      wire.ClaimResult
	replayed bool
	// waited is how long each job claimed waited to be, from when it
	// became claimable: fleet_job_queue_wait_seconds.
	waited []time.Duration
}

// Jobs is how many jobs the claim took, for the storage counters.
func (c claimed) Jobs() int64 {
	if c.replayed {
		return 0
	}
	return int64(len(c.res.Jobs))
}

// claim is ClaimKeyed's transaction: a repeated keyed claim's jobs still
// held, or up to max newly claimed, or word of whether the queue may yet
// have some.
func (h *Host) claim(ctx context.Context, tx *store.Tx, caller fleet.Caller, max int, key string, repeat bool) (claimed, error) {
	if repeat && key != "" {
		prior, err := tx.JobListClaimedUnder(ctx, &store.JobListClaimedUnderParams{Worker: caller.ID, Prefix: key + "."})
		if err != nil || len(prior) > 0 {
			return claimed{res: claimResult(prior), replayed: true}, err
		}
	}
	if paused, err := pause.Paused(ctx, tx); err != nil || paused {
		res := claimResult(nil)
		res.Queue = wire.QueuePaused
		return claimed{res: res}, err
	}
	jobs, err := h.claimMany(ctx, tx, caller, key, max)
	if err != nil || len(jobs) > 0 {
		out := claimed{res: claimResult(jobs), waited: make([]time.Duration, len(jobs))}
		for i, j := range jobs {
			claimable := j.ClaimableAtMS
			if j.CreatedAtMS > claimable {
				claimable = j.CreatedAtMS
			}
			out.waited[i] = time.Duration(j.ClaimedAtMS-claimable) * time.Millisecond
		}
		return out, err
	}
	// Nothing claimable now; jobs still claimed, running or backing off
	// may yet be.
	pending, err := tx.JobPending(ctx)
	res := claimResult(nil)
	res.Queue = wire.QueueEmpty
	if pending {
		res.Queue = wire.QueueWaiting
	}
	return claimed{res: res}, err
}

// markSeen marks (or, after a failed first claim, unmarks) a worker as
// seen by this host, and reports whether marking it was new.
func (h *Host) markSeen(worker string, seen bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !seen {
		delete(h.seenWorkers, worker)
		return false
	}
	first := !h.seenWorkers[worker]
	h.seenWorkers[worker] = true
	return first
}

// claimResult is what a worker is told of the jobs it holds claimed.
func claimResult(claimed []store.ClaimedJob) wire.ClaimResult {
	res := wire.ClaimResult{Jobs: make([]wire.ClaimedJob, 0, len(claimed))}
	for _, j := range claimed {
		res.Jobs = append(res.Jobs, claimedJob(j.Job, wire.Input{Document: j.BatchDocument, Section: j.Section}))
	}
	if len(res.Jobs) > 0 {
		res.Job = &res.Jobs[0]
	}
	return res
}

// claimMany leases up to max of the oldest queued jobs (another host's
// claimer may hold some: the backend passes over them) in one operation,
// whose statements do not grow with max. Each claim id is the claim's own
// prefix (a new UUID, after "key." for a keyed claim) and the job's
// position.
func (h *Host) claimMany(ctx context.Context, tx *store.Tx, caller fleet.Caller, key string, max int) ([]store.ClaimedJob, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return nil, err
	}
	prefix := id.String() + "."
	if key != "" {
		prefix = key + "." + prefix // unique still: a repeat may claim afresh
	}
	claimed, err := tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: max, ClaimPrefix: prefix, Worker: caller.ID,
		ClaimHost: h.ID, LeaseExpiresAtMS: tx.Now.Add(h.Lease).UnixMilli(), NowMS: tx.NowMS()})
	if err != nil {
		return nil, err
	}
	for _, j := range claimed {
		if err := ledger.AppendEvent(ctx, tx, wire.EventClaimed, caller.ID,
			fmt.Sprintf("%s claimed the %s section", caller.ID, j.Section),
			map[string]any{"operation_id": j.OperationID, "section": j.Section, "claim_id": j.ClaimID, "generation": j.Generation, "host": h.ID}); err != nil {
			return nil, err
		}
	}
	return claimed, nil
}

// Dispatch asks the host to admit a claimed job against the allowance. In
// one transaction it checks the claim, reserves the cost (or denies), moves
// the job to running (or refused), signs the receipt and appends the event.
// A repeat with the claim that was dispatched returns the original decision
// while the job is still running or refused.
func (h *Host) Dispatch(ctx context.Context, caller fleet.Caller, op string, ref wire.ClaimRef) (json.RawMessage, error) {
	point := func(d dispatched) string {
		switch {
		case d.adm.Decision == "": // none made (the span's name until one is)
			return "dispatch"
		case d.receipt == nil:
			return "dispatch-repeat"
		}
		return "dispatch-" + string(d.adm.Decision)
	}
	ctx = tracing.With(ctx, tracing.OperationID.String(op), tracing.ClaimID.String(ref.ClaimID),
		tracing.Generation.Int64(ref.Generation), tracing.Worker.String(caller.ID))
	out, err := ledger.Write(ctx, h.ledger, point, func(tx *store.Tx) (dispatched, error) {
		return h.dispatch(ctx, tx, caller, op, ref)
	})
	if err != nil {
		return nil, err
	}
	return h.answerDispatch(ctx, caller, op, ref, out)
}

// dispatch is Dispatch's transaction.
func (h *Host) dispatch(ctx context.Context, tx *store.Tx, caller fleet.Caller, op string, ref wire.ClaimRef) (dispatched, error) {
	j, err := jobs.Get(ctx, tx, op, store.ForUpdate)
	if err != nil {
		return dispatched{}, err
	}
	if jobs.DispatchRepeat(j, caller.ID, ref) {
		var adm wire.Admission
		if err := json.Unmarshal(j.Admission, &adm); err != nil {
			return dispatched{}, fmt.Errorf("dispatch %s: retained admission: %w", op, err)
		}
		return dispatched{adm: adm}, nil
	}
	if err := jobs.CheckClaim(j, caller.ID, ref.ClaimID, ref.Generation, wire.Claimed); err != nil {
		return dispatched{}, err
	}
	return h.admit(ctx, tx, caller, j)
}

// answerDispatch counts and logs a committed admission and answers it: a
// repeat's answer holds its receipt as the log placed it.
func (h *Host) answerDispatch(ctx context.Context, caller fleet.Caller, op string, ref wire.ClaimRef, out dispatched) (json.RawMessage, error) {
	adm := out.adm
	switch {
	case out.receipt != nil:
		adm.Receipt = *out.receipt
		decision := string(adm.Decision)
		h.metrics.Admission(decision)
		if adm.Decision == wire.DecisionDeny {
			h.series.Refused()
		}
		h.Log.Info("admission", "operation_id", op, "worker", caller.ID, "generation", ref.Generation,
			"decision", decision, "receipt_id", adm.Receipt.ID, "available", adm.Accounting.Available)
	case adm.Receipt.Signature == "":
		// A repeat: the retained admission names its receipt (one retained
		// by an older build holds the whole receipt and is answered as is).
		raw, err := h.placedReceipt(ctx, adm.Receipt.ID)
		if err == nil {
			err = json.Unmarshal(raw, &adm.Receipt)
		}
		if err != nil {
			return nil, fmt.Errorf("dispatch %s: retained admission's receipt: %w", op, err)
		}
	}
	return json.Marshal(adm)
}

// placedReceipt reads a receipt that has committed, placing the log
// first if it is still pending: the host that decided it may have died
// between its commit and its sequencer's round, or be slow to place it,
// and any host's sequencer places every host's entries.
func (h *Host) placedReceipt(ctx context.Context, id string) (json.RawMessage, error) {
	raw, err := h.views.Receipt(ctx, id)
	if fleet.ErrorCode(err) != wire.CodeNotFound {
		return raw, err
	}
	if err := h.db.PlacePending(ctx); err != nil {
		return nil, err
	}
	return h.views.Receipt(ctx, id)
}

// dispatched is a dispatch's decision.
type dispatched struct {
	adm     wire.Admission
	receipt *wire.Receipt // as the log places it; nil for a repeat
}

// admit decides a claimed job's admission: it reserves the cost (or
// denies), signs the receipt, moves the job to running (or refused) with
// the admission retained for repeats, and appends the event.
func (h *Host) admit(ctx context.Context, tx *store.Tx, caller fleet.Caller, j store.Job) (dispatched, error) {
	var out dispatched
	r, err := tx.AccountingReserve(ctx)
	if err != nil {
		return out, err
	}
	acct := r.Accounting
	adm := wire.Admission{Decision: wire.DecisionAllow, Accounting: acct,
		Reason: fmt.Sprintf("reserved %d credits; %d of %d available", acct.CostPerReport, acct.Available, acct.Allowance)}
	cost, kind := acct.CostPerReport, wire.EventAllowed
	title := fmt.Sprintf("%s may write the %s section: %s", caller.ID, j.Section, adm.Reason)
	if !r.OK {
		adm.Decision, cost, kind = wire.DecisionDeny, 0, wire.EventDenied
		adm.Reason = fmt.Sprintf("allowance exhausted: %d credits available, %d needed", acct.Available, acct.CostPerReport)
		title = fmt.Sprintf("%s was refused the %s section: %s", caller.ID, j.Section, adm.Reason)
	}
	receipt, err := h.ledger.IssueReceipt(tx, receipts.Draft{Kind: wire.KindAdmission,
		OperationID: j.OperationID, Caller: caller.ID, Decision: adm.Decision, Cost: cost, Accounting: acct})
	if err != nil {
		return out, err
	}
	// The retained admission names its receipt; a repeat reads the
	// receipt as the log placed it.
	adm.Receipt = wire.Receipt{ID: receipt.ID}
	retained, err := json.Marshal(adm)
	if err != nil {
		return out, err
	}
	if r.OK {
		err = tx.JobSetRunning(ctx, &store.JobSetRunningParams{OperationID: j.OperationID, IfClaimID: j.ClaimID,
			Reserved: cost, ReserveShard: r.Shard, Admission: retained, LeaseExpiresAtMS: tx.Now.Add(h.Lease).UnixMilli(),
			Reason: adm.Reason, NowMS: tx.NowMS()})
	} else {
		err = tx.JobSetRefused(ctx, &store.JobSetRefusedParams{OperationID: j.OperationID, IfClaimID: j.ClaimID,
			Admission: retained, Reason: adm.Reason, NowMS: tx.NowMS()})
	}
	if err != nil {
		return out, err
	}
	out.adm, out.receipt = adm, receipt
	return out, ledger.AppendEvent(ctx, tx, kind, caller.ID, title, map[string]any{
		"operation_id": j.OperationID, "section": j.Section, "receipt_id": receipt.ID, "accounting": acct})
}

// Heartbeat renews the lease of the current claim of a claimed or running
// job. The holder of a claim whose job the operator cancelled learns it here
// (cancel_requested, nothing renewed); any other claim is stale.
func (h *Host) Heartbeat(ctx context.Context, caller fleet.Caller, op string, ref wire.ClaimRef) (wire.HeartbeatResult, error) {
	ctx = tracing.With(ctx, tracing.OperationID.String(op), tracing.ClaimID.String(ref.ClaimID),
		tracing.Generation.Int64(ref.Generation), tracing.Worker.String(caller.ID))
	return ledger.Write(ctx, h.ledger, ledger.Named[wire.HeartbeatResult]("heartbeat"), func(tx *store.Tx) (wire.HeartbeatResult, error) {
		return h.heartbeat(ctx, tx, caller, op, ref)
	})
}

// heartbeat is Heartbeat's transaction.
func (h *Host) heartbeat(ctx context.Context, tx *store.Tx, caller fleet.Caller, op string, ref wire.ClaimRef) (wire.HeartbeatResult, error) {
	j, err := jobs.Get(ctx, tx, op, store.ForUpdate)
	if err != nil {
		return wire.HeartbeatResult{}, err
	}
	if jobs.CancelledUnder(j, caller.ID, ref.ClaimID) {
		return wire.HeartbeatResult{CancelRequested: true}, nil
	}
	if err := jobs.CheckClaim(j, caller.ID, ref.ClaimID, ref.Generation, wire.Claimed, wire.Running); err != nil {
		return wire.HeartbeatResult{}, err
	}
	lease := tx.Now.Add(h.Lease).UnixMilli()
	return wire.HeartbeatResult{LeaseExpiresAtMS: lease}, tx.JobRenewLease(ctx, &store.JobRenewLeaseParams{
		OperationID: op, IfClaimID: j.ClaimID, LeaseExpiresAtMS: lease, NowMS: tx.NowMS()})
}

// claimedJob is what a worker is told of a job it holds claimed.
func claimedJob(j store.Job, input wire.Input) wire.ClaimedJob {
	return wire.ClaimedJob{OperationID: j.OperationID, Section: j.Section, DocumentID: j.DocumentID,
		InputSHA256: j.InputSHA256, Input: input, Claim: *j.CurrentClaim()}
}
