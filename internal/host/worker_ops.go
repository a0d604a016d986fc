package host

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/events"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
)

// ClaimedJob is what a worker receives with a claim.
type ClaimedJob struct {
	OperationID string     `json:"operation_id"`
	Section     string     `json:"section"`
	DocumentID  string     `json:"document_id"`
	InputSHA256 string     `json:"input_sha256"`
	Input       jobs.Input `json:"input"`
	Claim       jobs.Claim `json:"claim"`
}

// ClaimResult is the claim endpoint's answer: a job, or why there is none.
type ClaimResult struct {
	Job   *ClaimedJob `json:"job"`
	Queue string      `json:"queue,omitempty"` // "empty" | "waiting" when Job is nil
}

// Claim leases the oldest queued job to the caller.
func (h *Host) Claim(ctx context.Context, caller fleet.Caller, workerPID int) (ClaimResult, error) {
	var res ClaimResult
	firstClaim, markedHere := false, false
	err := h.write(ctx, named("claim"), func(tx *store.Tx) error {
		res = ClaimResult{}
		// Write transactions run one at a time, so marking here cannot race
		// another claim by the same worker; a failed transaction unmarks. A
		// rerun of this transaction (PostgreSQL) decides as the first did.
		h.mu.Lock()
		firstClaim = !h.seenWorkers[caller.ID] || markedHere
		h.seenWorkers[caller.ID] = true
		markedHere = markedHere || firstClaim
		h.mu.Unlock()
		if firstClaim {
			if _, err := events.Append(ctx, tx, events.WorkerStarted, caller.ID,
				fmt.Sprintf("%s is asking for work", caller.ID), map[string]any{"worker": caller.ID, "pid": workerPID}); err != nil {
				return err
			}
		}
		j, ok, err := jobs.ClaimNext(ctx, tx, caller.ID, h.Lease)
		if err != nil {
			return err
		}
		if !ok {
			res.Queue, err = jobs.QueueStatus(ctx, tx)
			return err
		}
		in, err := jobs.InputOf(ctx, tx, j)
		if err != nil {
			return err
		}
		claim := j.CurrentClaim()
		res.Job = &ClaimedJob{OperationID: j.OperationID, Section: j.Section, DocumentID: j.DocumentID,
			InputSHA256: j.InputSHA256, Input: in, Claim: *claim}
		_, err = events.Append(ctx, tx, events.Claimed, caller.ID,
			fmt.Sprintf("%s claimed the %s section", caller.ID, j.Section),
			map[string]any{"operation_id": j.OperationID, "section": j.Section, "claim_id": claim.ClaimID, "generation": claim.Generation})
		return err
	})
	if err != nil && markedHere {
		h.mu.Lock()
		delete(h.seenWorkers, caller.ID)
		h.mu.Unlock()
	}
	if err == nil && res.Job != nil {
		h.Log.Info("claimed", "operation_id", res.Job.OperationID, "worker", caller.ID,
			"generation", res.Job.Claim.Generation, "claim_id", res.Job.Claim.ClaimID)
	}
	return res, err
}

// ClaimRef is how a worker presents its claim.
type ClaimRef struct {
	ClaimID    string `json:"claim_id"`
	Generation int64  `json:"generation"`
}

// Admission is dispatch's answer, retained so a repeat returns it unchanged.
type Admission struct {
	Decision   string            `json:"decision"` // allow | deny
	Reason     string            `json:"reason"`
	Receipt    receipts.Receipt  `json:"receipt"`
	Accounting budget.Accounting `json:"accounting"`
}

// Dispatch asks the host to admit a claimed job against the allowance. In
// one transaction it checks the claim, reserves the cost (or denies), moves
// the job to running (or refused), signs the receipt and appends the event.
// A repeat with the claim that was dispatched returns the original decision
// while the job is still running or refused.
func (h *Host) Dispatch(ctx context.Context, caller fleet.Caller, op string, ref ClaimRef) (json.RawMessage, error) {
	var out json.RawMessage
	point := "dispatch-repeat"
	err := h.write(ctx, func() string { return point }, func(tx *store.Tx) error {
		j, err := jobs.Get(ctx, tx, op)
		if err != nil {
			return err
		}
		if (j.State == jobs.Running || j.State == jobs.Refused) && j.AdmissionClaimID == ref.ClaimID &&
			j.Worker == caller.ID && j.Generation == ref.Generation {
			out, point = j.Admission, "dispatch-repeat"
			return nil
		}
		if err := jobs.CheckClaim(j, caller.ID, ref.ClaimID, ref.Generation, jobs.Claimed); err != nil {
			return err
		}
		allowed, acct, err := budget.ReserveReport(ctx, tx)
		if err != nil {
			return err
		}
		adm := Admission{Decision: "allow", Accounting: acct,
			Reason: fmt.Sprintf("reserved %d credits; %d of %d available", acct.CostPerReport, acct.Available, acct.Allowance)}
		cost, next, kind := acct.CostPerReport, jobs.Running, events.Allowed
		if !allowed {
			adm.Decision, cost, next, kind = "deny", 0, jobs.Refused, events.Denied
			adm.Reason = fmt.Sprintf("allowance exhausted: %d credits available, %d needed", acct.Available, acct.CostPerReport)
		}
		point = "dispatch-" + adm.Decision
		if adm.Receipt, err = receipts.Issue(ctx, tx, h.kernel, receipts.Draft{Kind: receipts.KindAdmission,
			OperationID: op, Caller: caller.ID, Decision: adm.Decision, Cost: cost, Accounting: acct}); err != nil {
			return err
		}
		if out, err = json.Marshal(adm); err != nil {
			return err
		}
		j.Reserved, j.AdmissionClaimID, j.Admission = cost, ref.ClaimID, out
		if allowed {
			j.LeaseExpiresAtMS = tx.Now.Add(h.Lease).UnixMilli()
		}
		if err := jobs.Transition(ctx, tx, &j, next, adm.Reason); err != nil {
			return err
		}
		title := fmt.Sprintf("%s may write the %s section: %s", caller.ID, j.Section, adm.Reason)
		if !allowed {
			title = fmt.Sprintf("%s was refused the %s section: %s", caller.ID, j.Section, adm.Reason)
		}
		_, err = events.Append(ctx, tx, kind, caller.ID, title, map[string]any{
			"operation_id": op, "section": j.Section, "receipt_id": adm.Receipt.ID, "accounting": acct})
		return err
	})
	if decision, fresh := strings.CutPrefix(point, "dispatch-"); err == nil && fresh && decision != "repeat" {
		h.metrics.Admission(decision)
		var adm Admission
		json.Unmarshal(out, &adm)
		h.Log.Info("admission", "operation_id", op, "worker", caller.ID, "generation", ref.Generation,
			"decision", decision, "receipt_id", adm.Receipt.ID, "available", adm.Accounting.Available)
	}
	return out, err
}

// HeartbeatResult renews a lease and says whether the operator cancelled.
type HeartbeatResult struct {
	LeaseExpiresAtMS int64 `json:"lease_expires_at_ms"`
	CancelRequested  bool  `json:"cancel_requested"`
}

// Heartbeat renews the lease of the current claim of a claimed or running
// job. The holder of a claim whose job the operator cancelled learns it here
// (cancel_requested, nothing renewed); any other claim is stale.
func (h *Host) Heartbeat(ctx context.Context, caller fleet.Caller, op string, ref ClaimRef) (HeartbeatResult, error) {
	var res HeartbeatResult
	err := h.write(ctx, named("heartbeat"), func(tx *store.Tx) error {
		j, err := jobs.Get(ctx, tx, op)
		if err != nil {
			return err
		}
		if cancelledUnder(j, caller.ID, ref.ClaimID) {
			res = HeartbeatResult{CancelRequested: true}
			return nil
		}
		if err := jobs.CheckClaim(j, caller.ID, ref.ClaimID, ref.Generation, jobs.Claimed, jobs.Running); err != nil {
			return err
		}
		if err := jobs.Renew(ctx, tx, &j, h.Lease); err != nil {
			return err
		}
		res = HeartbeatResult{LeaseExpiresAtMS: j.LeaseExpiresAtMS}
		return nil
	})
	return res, err
}

// cancelledUnder reports whether the operator cancelled the job while this
// caller held this claim (the cancellation keeps the claim id on the job).
func cancelledUnder(j jobs.Job, caller, claimID string) bool {
	return (j.State == jobs.Cancelled || j.State == jobs.CancelledBeforeDispatch) &&
		claimID != "" && j.ClaimID == claimID && j.Worker == caller
}

// Publication is a publish call's result. AckLost is the fault injection of
// SPEC section 9: the HTTP layer must drop the response.
type Publication struct {
	resource.Result
	AckLost bool
}

// Publish runs the publication of SPEC section 6 for a job's document: the
// resource's transaction (replay, owner and generation, version, writes),
// with the job's completion, the settled reservation, the receipt and the
// event committed in it.
func (h *Host) Publish(ctx context.Context, caller fleet.Caller, op string, req resource.PublishRequest) (Publication, error) {
	var pub Publication
	err := h.write(ctx, named("publish"), func(tx *store.Tx) error {
		j, err := jobs.Get(ctx, tx, op)
		if err != nil {
			return err
		}
		part := &publication{h: h, job: &j, caller: caller, usage: reportedUsage(req.Body)}
		res, err := resource.Publish(ctx, tx, j.DocumentID, caller, req, part)
		if err != nil {
			return err
		}
		pub = Publication{Result: res, AckLost: part.ackLost}
		if res.Replayed {
			_, err := events.Append(ctx, tx, events.Replayed, caller.ID,
				fmt.Sprintf("%s repeated a publication of %s and got its retained outcome (%s)", caller.ID, j.Section, res.Outcome.Status),
				map[string]any{"operation_id": op, "operation_key": req.OperationKey, "outcome": json.RawMessage(res.Raw)})
			return err
		}
		return nil
	})
	switch {
	case err != nil:
	case pub.Replayed:
		h.metrics.Replay()
	default:
		h.metrics.Publication(string(pub.Outcome.Status))
	}
	if err == nil {
		h.Log.Info("publication", "operation_id", op, "worker", caller.ID, "generation", req.Generation,
			"status", pub.Outcome.Status, "version", pub.Outcome.Version, "receipt_id", pub.Outcome.ReceiptID,
			"replayed", pub.Replayed, "ack_lost", pub.AckLost)
	}
	return pub, err
}

// publication is the fleet's part in a resource publication.
type publication struct {
	h       *Host
	job     *jobs.Job
	caller  fleet.Caller
	usage   *budget.Usage // what a model worker says its call used, if it says
	ackLost bool
}

// reportedUsage reads {"usage":{"prompt_tokens":…,"completion_tokens":…}}
// from a published body. Anything else (no usage, or not a plausible one)
// is nil, and the publication settles its whole reservation.
func reportedUsage(body json.RawMessage) *budget.Usage {
	var b struct {
		Usage *budget.Usage `json:"usage"`
	}
	if json.Unmarshal(body, &b) != nil || b.Usage == nil || !b.Usage.Valid() {
		return nil
	}
	return b.Usage
}

// AssignmentHolds: only a running job (or an unresolved one, whose slow
// worker may still be alive) can be published; a refused, cancelled or
// completed job never again.
func (p *publication) AssignmentHolds(ctx context.Context, tx *store.Tx) (bool, error) {
	return p.job.State == jobs.Running || p.job.State == jobs.Unresolved, nil
}

func (p *publication) Decided(ctx context.Context, tx *store.Tx, o resource.Outcome) (string, error) {
	j := p.job
	var acct budget.Accounting
	var settled, released int64
	var reserved *int64
	var err error
	kind := events.Superseded
	if o.Status != resource.StatusPublished {
		if acct, err = budget.Get(ctx, tx); err != nil {
			return "", err
		}
	}
	switch o.Status {
	case resource.StatusPublished:
		// Settle the reservation: all of it, or with model prices what the
		// reported usage cost, never more than was reserved; the rest goes
		// back to available in this same transaction.
		kind, settled = events.Published, j.Reserved
		if p.h.prices != nil && p.usage != nil {
			settled = min(p.h.prices.Credits(*p.usage), j.Reserved)
		}
		released = j.Reserved - settled
		if acct, err = budget.Settle(ctx, tx, settled); err != nil {
			return "", err
		}
		if released > 0 {
			if acct, err = budget.Release(ctx, tx, released); err != nil {
				return "", err
			}
		}
		held := j.Reserved
		reserved = &held
		j.Reserved = 0
		if err := jobs.Transition(ctx, tx, j, jobs.Completed, "published"); err != nil {
			return "", err
		}
		if p.ackLost, err = p.h.losesAck(ctx, tx); err != nil {
			return "", err
		}
	case resource.StatusVersionConflict:
		kind = events.VersionConflict
	}
	r, err := receipts.Issue(ctx, tx, p.h.kernel, receipts.Draft{Kind: receipts.KindPublication,
		OperationID: j.OperationID, Caller: p.caller.ID, Decision: string(o.Status), Cost: settled, Reserved: reserved, Accounting: acct})
	if err != nil {
		return "", err
	}
	data := map[string]any{"operation_id": j.OperationID, "section": j.Section, "status": o.Status,
		"version": o.Version, "receipt_id": r.ID, "accounting": acct}
	if p.ackLost {
		data["fault"] = "lose_ack"
	}
	if reserved != nil {
		data["reserved"], data["settled"], data["released"] = *reserved, settled, released
		if p.usage != nil && p.h.prices != nil {
			data["usage"] = p.usage
		}
	}
	_, err = events.Append(ctx, tx, kind, p.caller.ID,
		fmt.Sprintf("%s's publication of %s: %s at version %d", p.caller.ID, j.Section, o.Status, o.Version), data)
	return r.ID, err
}

// losesAck reports whether the publication just written is the one whose
// acknowledgement the lose_ack_index fault drops: the N-th mutation of the
// state (0 = the first). Replays add no mutation, so it fires once. Only
// counted when the fault is configured.
func (h *Host) losesAck(ctx context.Context, tx *store.Tx) (bool, error) {
	if h.loseAck == nil {
		return false, nil
	}
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM mutations`).Scan(&n); err != nil {
		return false, fmt.Errorf("count mutations: %w", err)
	}
	return n-1 == *h.loseAck, nil
}

// Document reads a document for a worker.
func (h *Host) Document(ctx context.Context, id string) (resource.Document, error) {
	var d resource.Document
	err := h.db.Read(ctx, func(tx *store.Tx) (err error) {
		d, err = resource.Get(ctx, tx, id)
		return err
	})
	return d, err
}
