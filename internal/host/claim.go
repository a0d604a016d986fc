package host

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
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
	if err := h.checkInTouch(); err != nil {
		return wire.ClaimResult{}, err
	}
	var res wire.ClaimResult
	firstClaim, markedHere, replayed := false, false, false
	err := h.write(ctx, named("claim"), func(tx *store.Tx) error {
		res, replayed = wire.ClaimResult{Jobs: []wire.ClaimedJob{}}, false
		if repeat && key != "" {
			prior, err := tx.JobListClaimedUnder(ctx, caller.ID, key+".")
			if err != nil {
				return err
			}
			for _, j := range prior {
				b, err := tx.BatchGet(ctx, j.Batch)
				if err != nil {
					return err
				}
				res.Jobs = append(res.Jobs, claimedJob(j, wire.Input{Document: b.Document, Section: j.Section}))
			}
			if replayed = len(res.Jobs) > 0; replayed {
				res.Job = &res.Jobs[0]
				return nil
			}
		}
		// The first claim by a worker since this host started records it. A
		// concurrent claim by the same worker sees the mark and records
		// nothing; a failed transaction unmarks (so the event can be missed
		// when that races, never doubled). A rerun of this transaction
		// (PostgreSQL) decides as the first did.
		h.mu.Lock()
		firstClaim = !h.seenWorkers[caller.ID] || markedHere
		h.seenWorkers[caller.ID] = true
		markedHere = markedHere || firstClaim
		h.mu.Unlock()
		if firstClaim {
			if err := appendEvent(ctx, tx, wire.EventWorkerStarted, caller.ID,
				fmt.Sprintf("%s is asking for work", caller.ID), map[string]any{"worker": caller.ID, "pid": workerPID}); err != nil {
				return err
			}
		}
		for len(res.Jobs) < max {
			job, err := h.claimNext(ctx, tx, caller, key)
			if store.IsNotFound(err) {
				break
			}
			if err != nil {
				return err
			}
			res.Jobs = append(res.Jobs, job)
		}
		if len(res.Jobs) > 0 {
			res.Job = &res.Jobs[0]
			return nil
		}
		// Nothing claimable now; jobs still claimed, running or backing off
		// may yet be.
		pending, err := tx.JobPending(ctx)
		res.Queue = wire.QueueEmpty
		if pending {
			res.Queue = wire.QueueWaiting
		}
		return err
	})
	if err != nil && markedHere {
		h.mu.Lock()
		delete(h.seenWorkers, caller.ID)
		h.mu.Unlock()
	}
	if err == nil && replayed {
		h.Log.Info("claim repeated: its jobs answered again", "worker", caller.ID, "key", key, "jobs", len(res.Jobs))
	} else if err == nil {
		for _, j := range res.Jobs {
			h.Log.Info("claimed", "operation_id", j.OperationID, "worker", caller.ID,
				"generation", j.Claim.Generation, "claim_id", j.Claim.ClaimID)
		}
	}
	return res, err
}

// claimNext leases the oldest queued job (another host's claimer may hold
// the first: the backend passes over it) under a new claim id, which
// begins "key." for a keyed claim; store.ErrNotFound when none is.
func (h *Host) claimNext(ctx context.Context, tx *store.Tx, caller fleet.Caller, key string) (wire.ClaimedJob, error) {
	j, input, err := tx.JobNextQueued(ctx, tx.NowMS())
	if err != nil {
		return wire.ClaimedJob{}, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return wire.ClaimedJob{}, err
	}
	claimID := id.String()
	if key != "" {
		claimID = key + "." + claimID // unique still: a repeat may claim afresh
	}
	if j.Generation, err = resource.Assign(ctx, tx, j.DocumentID, j.Generation, caller.ID, "claim"); err != nil {
		return wire.ClaimedJob{}, fmt.Errorf("claim %s: %w", j.OperationID, err)
	}
	j.Owner, j.Worker, j.ClaimID, j.ClaimHost = caller.ID, caller.ID, claimID, h.ID
	j.LeaseExpiresAtMS = tx.Now.Add(h.Lease).UnixMilli()
	if err := moveJob(ctx, tx, &j, wire.Claimed, ""); err != nil {
		return wire.ClaimedJob{}, err
	}
	claim := j.CurrentClaim()
	return claimedJob(j, input),
		appendEvent(ctx, tx, wire.EventClaimed, caller.ID,
			fmt.Sprintf("%s claimed the %s section", caller.ID, j.Section),
			map[string]any{"operation_id": j.OperationID, "section": j.Section, "claim_id": claim.ClaimID, "generation": claim.Generation, "host": h.ID})
}

// Dispatch asks the host to admit a claimed job against the allowance. In
// one transaction it checks the claim, reserves the cost (or denies), moves
// the job to running (or refused), signs the receipt and appends the event.
// A repeat with the claim that was dispatched returns the original decision
// while the job is still running or refused.
func (h *Host) Dispatch(ctx context.Context, caller fleet.Caller, op string, ref wire.ClaimRef) (json.RawMessage, error) {
	var adm wire.Admission
	var receipt *wire.Receipt // as the log places it
	point := "dispatch-repeat"
	err := h.write(ctx, func() string { return point }, func(tx *store.Tx) error {
		adm, receipt, point = wire.Admission{}, nil, "dispatch-repeat"
		j, err := getJob(ctx, tx, op, store.ForUpdate)
		if err != nil {
			return err
		}
		if jobs.DispatchRepeat(j, caller.ID, ref) {
			if err := json.Unmarshal(j.Admission, &adm); err != nil {
				return fmt.Errorf("dispatch %s: retained admission: %w", op, err)
			}
			return nil
		}
		if err := jobs.CheckClaim(j, caller.ID, ref.ClaimID, ref.Generation, wire.Claimed); err != nil {
			return err
		}
		acct, shard, allowed, err := tx.AccountingReserve(ctx)
		if err != nil {
			return err
		}
		adm = wire.Admission{Decision: wire.DecisionAllow, Accounting: acct,
			Reason: fmt.Sprintf("reserved %d credits; %d of %d available", acct.CostPerReport, acct.Available, acct.Allowance)}
		cost, next, kind := acct.CostPerReport, wire.Running, wire.EventAllowed
		if !allowed {
			adm.Decision, cost, next, kind = wire.DecisionDeny, 0, wire.Refused, wire.EventDenied
			adm.Reason = fmt.Sprintf("allowance exhausted: %d credits available, %d needed", acct.Available, acct.CostPerReport)
		}
		point = "dispatch-" + string(adm.Decision)
		if receipt, err = h.issueReceipt(tx, receipts.Draft{Kind: wire.KindAdmission,
			OperationID: op, Caller: caller.ID, Decision: adm.Decision, Cost: cost, Accounting: acct}); err != nil {
			return err
		}
		// The retained admission names its receipt; a repeat reads the
		// receipt as the log placed it.
		adm.Receipt = wire.Receipt{ID: receipt.ID}
		retained, err := json.Marshal(adm)
		if err != nil {
			return err
		}
		j.Reserved, j.ReserveShard, j.AdmissionClaimID, j.Admission = cost, shard, ref.ClaimID, retained
		if allowed {
			j.LeaseExpiresAtMS = tx.Now.Add(h.Lease).UnixMilli()
		}
		if err := moveJob(ctx, tx, &j, next, adm.Reason); err != nil {
			return err
		}
		title := fmt.Sprintf("%s may write the %s section: %s", caller.ID, j.Section, adm.Reason)
		if !allowed {
			title = fmt.Sprintf("%s was refused the %s section: %s", caller.ID, j.Section, adm.Reason)
		}
		return appendEvent(ctx, tx, kind, caller.ID, title, map[string]any{
			"operation_id": op, "section": j.Section, "receipt_id": receipt.ID, "accounting": acct})
	})
	if err != nil {
		return nil, err
	}
	switch {
	case receipt != nil:
		adm.Receipt = *receipt
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
		raw, err := h.Receipt(ctx, adm.Receipt.ID)
		if err == nil {
			err = json.Unmarshal(raw, &adm.Receipt)
		}
		if err != nil {
			return nil, fmt.Errorf("dispatch %s: retained admission's receipt: %w", op, err)
		}
	}
	return json.Marshal(adm)
}

// Heartbeat renews the lease of the current claim of a claimed or running
// job. The holder of a claim whose job the operator cancelled learns it here
// (cancel_requested, nothing renewed); any other claim is stale.
func (h *Host) Heartbeat(ctx context.Context, caller fleet.Caller, op string, ref wire.ClaimRef) (wire.HeartbeatResult, error) {
	var res wire.HeartbeatResult
	err := h.write(ctx, named("heartbeat"), func(tx *store.Tx) error {
		j, err := getJob(ctx, tx, op, store.ForUpdate)
		if err != nil {
			return err
		}
		if jobs.CancelledUnder(j, caller.ID, ref.ClaimID) {
			res = wire.HeartbeatResult{CancelRequested: true}
			return nil
		}
		if err := jobs.CheckClaim(j, caller.ID, ref.ClaimID, ref.Generation, wire.Claimed, wire.Running); err != nil {
			return err
		}
		j.LeaseExpiresAtMS = tx.Now.Add(h.Lease).UnixMilli()
		res = wire.HeartbeatResult{LeaseExpiresAtMS: j.LeaseExpiresAtMS}
		return saveJob(ctx, tx, &j)
	})
	return res, err
}

// claimedJob is what a worker is told of a job it holds claimed.
func claimedJob(j wire.Job, input wire.Input) wire.ClaimedJob {
	return wire.ClaimedJob{OperationID: j.OperationID, Section: j.Section, DocumentID: j.DocumentID,
		InputSHA256: j.InputSHA256, Input: input, Claim: *j.CurrentClaim()}
}
