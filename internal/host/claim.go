package host

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/pause"
	"github.com/fleet/fleet/internal/jobs"
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
