package host

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/events"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
)

// CancelResult is the cancel endpoint's answer.
type CancelResult struct {
	State     jobs.State `json:"state"`
	ReceiptID *string    `json:"receipt_id"`
}

// Cancel cancels a job (SPEC section 9). Queued or claimed: it becomes
// cancelled_before_dispatch, with no receipt since nothing was admitted.
// Running: it becomes cancelled, its assignment is revoked at a new
// generation so a late publication is superseded, its reservation settles
// as spent (the admitted work may have run), and a receipt is signed. The
// claim id stays on the job so its holder learns of the cancellation.
func (h *Host) Cancel(ctx context.Context, op string) (CancelResult, error) {
	var res CancelResult
	err := h.write(ctx, named("cancel"), func(tx *store.Tx) error {
		j, err := jobs.Get(ctx, tx, op)
		if err != nil {
			return err
		}
		before, claimID := j.State, j.ClaimID
		switch j.State {
		case jobs.Queued, jobs.Claimed, jobs.Running:
		default:
			return fleet.Errorf(fleet.CodeStateConflict, "job %s is %s; only queued, claimed or running jobs can be cancelled", op, j.State)
		}
		if j.State != jobs.Queued {
			if err := jobs.RevokeAssignment(ctx, tx, &j, "cancelled"); err != nil {
				return err
			}
			j.ClaimID = claimID
		}
		data := map[string]any{"operation_id": op, "section": j.Section, "was": before}
		if before != jobs.Running {
			if err := jobs.Transition(ctx, tx, &j, jobs.CancelledBeforeDispatch, "cancelled by the operator before dispatch"); err != nil {
				return err
			}
		} else {
			acct, err := budget.Settle(ctx, tx, j.Reserved)
			if err != nil {
				return err
			}
			r, err := receipts.Issue(ctx, tx, h.kernel, receipts.Draft{Kind: receipts.KindCancellation, OperationID: op,
				Caller: OperatorName, Decision: string(jobs.Cancelled), Cost: j.Reserved, Accounting: acct})
			if err != nil {
				return err
			}
			j.Reserved = 0
			if err := jobs.Transition(ctx, tx, &j, jobs.Cancelled, "cancelled by the operator while running"); err != nil {
				return err
			}
			res.ReceiptID = &r.ID
			data["receipt_id"], data["accounting"] = r.ID, acct
		}
		res.State = j.State
		_, err = events.Append(ctx, tx, events.Cancelled, OperatorName,
			fmt.Sprintf("The operator cancelled the %s section (%s, was %s)", j.Section, j.State, before), data)
		return err
	})
	if err == nil {
		h.Log.Info("cancelled", "operation_id", op, "state", res.State, "receipt_id", res.ReceiptID)
	}
	return res, err
}

// RequeueResult is the requeue endpoint's answer.
type RequeueResult struct {
	State      jobs.State `json:"state"`
	Generation int64      `json:"generation"`
	ReceiptID  string     `json:"receipt_id"`
}

// Requeue puts a refused or unresolved job back in the queue at a new
// generation, revoking its assignment. An unresolved job's reservation
// settles as spent: its admitted work may have run.
func (h *Host) Requeue(ctx context.Context, op string) (RequeueResult, error) {
	var res RequeueResult
	err := h.write(ctx, named("requeue"), func(tx *store.Tx) error {
		j, err := jobs.Get(ctx, tx, op)
		if err != nil {
			return err
		}
		if j.State != jobs.Refused && j.State != jobs.Unresolved {
			return fleet.Errorf(fleet.CodeStateConflict, "job %s is %s; only refused or unresolved jobs can be requeued", op, j.State)
		}
		acct, err := budget.Settle(ctx, tx, j.Reserved)
		if err != nil {
			return err
		}
		r, err := receipts.Issue(ctx, tx, h.kernel, receipts.Draft{Kind: receipts.KindRequeue, OperationID: op,
			Caller: OperatorName, Decision: "requeued", Cost: j.Reserved, Accounting: acct})
		if err != nil {
			return err
		}
		was := j.State
		if err := jobs.RevokeAssignment(ctx, tx, &j, "requeued"); err != nil {
			return err
		}
		j.Reserved, j.Worker, j.AdmissionClaimID, j.Admission = 0, "", "", nil
		if err := jobs.Transition(ctx, tx, &j, jobs.Queued, "requeued by the operator"); err != nil {
			return err
		}
		res = RequeueResult{State: j.State, Generation: j.Generation, ReceiptID: r.ID}
		_, err = events.Append(ctx, tx, events.Requeued, OperatorName,
			fmt.Sprintf("The operator requeued the %s section (was %s)", j.Section, was),
			map[string]any{"operation_id": op, "was": was, "generation": j.Generation, "receipt_id": r.ID, "accounting": acct})
		return err
	})
	if err == nil {
		h.Log.Info("requeued", "operation_id", op, "generation", res.Generation, "receipt_id", res.ReceiptID)
	}
	return res, err
}

// Reconciliation is the reconcile endpoint's answer (SPEC section 9).
type Reconciliation struct {
	State                  jobs.State      `json:"state"`
	ReusedExistingEffect   bool            `json:"reused_existing_effect"`
	Outcome                json.RawMessage `json:"outcome,omitempty"`
	ReceiptID              string          `json:"receipt_id,omitempty"`
	Recovery               string          `json:"recovery,omitempty"`
	ReconciliationReceipt  string          `json:"reconciliation_receipt_id"`
	PublishedOperationKey  string          `json:"operation_key,omitempty"`
	PublicationDeliveries  int64           `json:"deliveries,omitempty"`
	PublishedMutationCount int64           `json:"mutations"`
}

// Reconcile resolves a job from what the resource committed, never by
// running anything: if a publication of its document committed, the job is
// completed (if it was not already) and the original outcome and receipt
// are returned; otherwise nothing changes and the answer says what an
// operator can do.
func (h *Host) Reconcile(ctx context.Context, op string) (Reconciliation, error) {
	var res Reconciliation
	err := h.write(ctx, named("reconcile"), func(tx *store.Tx) error {
		j, err := jobs.Get(ctx, tx, op)
		if err != nil {
			return err
		}
		published, found, err := publishedOperation(ctx, tx, j.DocumentID)
		if err != nil {
			return err
		}
		if res.PublishedMutationCount, err = resource.MutationCount(ctx, tx, j.DocumentID); err != nil {
			return err
		}
		decision := "no_known_effect"
		if found {
			var outcome resource.Outcome
			if err := json.Unmarshal(published.Outcome, &outcome); err != nil {
				return fmt.Errorf("reconcile %s: retained outcome: %w", op, err)
			}
			if j.State != jobs.Completed {
				// Publication completes its job in the same transaction, so
				// this only mends state written by an older or faulty build.
				if _, err := budget.Settle(ctx, tx, j.Reserved); err != nil {
					return err
				}
				j.Reserved = 0
				if err := jobs.Transition(ctx, tx, &j, jobs.Completed, "reconciled from the retained publication"); err != nil {
					return err
				}
			}
			decision = "reused_existing_effect"
			res.ReusedExistingEffect, res.Outcome, res.ReceiptID = true, published.Outcome, outcome.ReceiptID
			res.PublishedOperationKey, res.PublicationDeliveries = published.OperationKey, published.Deliveries
		} else {
			res.Recovery = recoveryAdvice(j.State)
		}
		res.State = j.State
		acct, err := budget.Get(ctx, tx)
		if err != nil {
			return err
		}
		r, err := receipts.Issue(ctx, tx, h.kernel, receipts.Draft{Kind: receipts.KindReconciliation, OperationID: op,
			Caller: OperatorName, Decision: decision, Accounting: acct})
		if err != nil {
			return err
		}
		res.ReconciliationReceipt = r.ID
		_, err = events.Append(ctx, tx, events.Reconciled, OperatorName,
			fmt.Sprintf("Reconciled the %s section: %s (%s)", j.Section, j.State, decision),
			map[string]any{"operation_id": op, "state": j.State, "reused_existing_effect": found,
				"receipt_id": res.ReceiptID, "reconciliation_receipt_id": r.ID})
		return err
	})
	if err == nil {
		h.Log.Info("reconciled", "operation_id", op, "state", res.State, "reused_existing_effect", res.ReusedExistingEffect,
			"receipt_id", res.ReceiptID, "reconciliation_receipt_id", res.ReconciliationReceipt)
	}
	return res, err
}

func publishedOperation(ctx context.Context, tx *store.Tx, documentID string) (resource.Operation, bool, error) {
	ops, err := resource.Operations(ctx, tx, documentID)
	if err != nil {
		return resource.Operation{}, false, err
	}
	for _, o := range ops {
		if o.Status == resource.StatusPublished {
			return o, true, nil
		}
	}
	return resource.Operation{}, false, nil
}

func recoveryAdvice(s jobs.State) string {
	switch s {
	case jobs.Refused:
		return "Admission was denied and no report exists. Raise the allowance and requeue to run it."
	case jobs.Unresolved:
		return "Admitted, but no publication is known; its worker may still publish. Requeue to run it again (its reservation settles as spent)."
	case jobs.Cancelled, jobs.CancelledBeforeDispatch:
		return "Cancelled by the operator; no report was published."
	default:
		return "In progress; nothing to recover. Reconcile again once it settles."
	}
}

// AssignRequest is an operator's compare-and-swap transfer of a document.
type AssignRequest struct {
	ExpectedGeneration *int64  `json:"expected_generation"`
	Owner              *string `json:"owner"`
}

// Assign transfers a document to a worker at the next generation if its
// generation is still the expected one. The old holder's claim and
// publications become stale.
func (h *Host) Assign(ctx context.Context, documentID string, req AssignRequest) (resource.Document, error) {
	if req.ExpectedGeneration == nil || req.Owner == nil {
		return resource.Document{}, fleet.Errorf(fleet.CodeInvalid, "expected_generation and owner are required")
	}
	var doc resource.Document
	err := h.write(ctx, named("assign"), func(tx *store.Tx) error {
		var role string
		err := tx.QueryRowContext(ctx, `SELECT role FROM credentials WHERE name = $1`, *req.Owner).Scan(&role)
		if errors.Is(err, sql.ErrNoRows) || role != RoleWorker {
			return fleet.Errorf(fleet.CodeInvalid, "owner %q is not a worker", *req.Owner)
		}
		if err != nil {
			return err
		}
		gen, err := resource.Assign(ctx, tx, documentID, *req.ExpectedGeneration, *req.Owner, "operator")
		if err != nil {
			return err
		}
		if doc, err = resource.Get(ctx, tx, documentID); err != nil {
			return err
		}
		_, err = events.Append(ctx, tx, events.Assigned, OperatorName,
			fmt.Sprintf("The operator assigned %s to %s at generation %d", documentID, *req.Owner, gen),
			map[string]any{"document_id": documentID, "owner": *req.Owner, "generation": gen})
		return err
	})
	if err == nil {
		h.Log.Info("assigned", "document_id", documentID, "worker", doc.Owner, "generation", doc.Generation)
	}
	return doc, err
}

// AllowanceRequest is an operator's compare-and-swap change of the allowance.
type AllowanceRequest struct {
	ExpectedAllowance *int64 `json:"expected_allowance"`
	Allowance         *int64 `json:"allowance"`
}

// SetAllowance changes the allowance if it is still the expected one.
func (h *Host) SetAllowance(ctx context.Context, req AllowanceRequest) (budget.Accounting, error) {
	if req.ExpectedAllowance == nil || req.Allowance == nil {
		return budget.Accounting{}, fleet.Errorf(fleet.CodeInvalid, "expected_allowance and allowance are required")
	}
	var acct budget.Accounting
	err := h.write(ctx, named("allowance"), func(tx *store.Tx) (err error) {
		if acct, err = budget.SetAllowance(ctx, tx, *req.ExpectedAllowance, *req.Allowance); err != nil {
			return err
		}
		_, err = events.Append(ctx, tx, events.AllowanceSet, OperatorName,
			fmt.Sprintf("The operator set the allowance from %d to %d", *req.ExpectedAllowance, acct.Allowance),
			map[string]any{"from": *req.ExpectedAllowance, "accounting": acct})
		return err
	})
	if err == nil {
		h.Log.Info("allowance changed", "allowance", acct.Allowance, "available", acct.Available)
	}
	return acct, err
}

// ReportsRequest enqueues more jobs.
type ReportsRequest struct {
	Document       *string  `json:"document"`
	Sections       []string `json:"sections"`
	IdempotencyKey *string  `json:"idempotency_key"`
}

// ReportsResult lists the operation ids of a batch in section order.
type ReportsResult struct {
	OperationIDs []string `json:"operation_ids"`
	Replayed     bool     `json:"replayed"`
}

// SubmitReports enqueues one job per section. An exact repeat of an
// idempotency key returns the same operation ids; the key with a different
// request is operation_conflict.
func (h *Host) SubmitReports(ctx context.Context, req ReportsRequest) (ReportsResult, error) {
	if req.Document == nil || req.Sections == nil || req.IdempotencyKey == nil {
		return ReportsResult{}, fleet.Errorf(fleet.CodeInvalid, "document, sections and idempotency_key are required")
	}
	key := *req.IdempotencyKey
	if key == "" || len(key) > resource.MaxKeyBytes || key == InitBatchKey {
		return ReportsResult{}, fleet.Errorf(fleet.CodeInvalid, "idempotency_key must be 1 to %d bytes and not %q", resource.MaxKeyBytes, InitBatchKey)
	}
	if err := jobs.ValidateBatch(*req.Document, req.Sections); err != nil {
		return ReportsResult{}, err
	}
	digest, err := batchDigest(*req.Document, req.Sections)
	if err != nil {
		return ReportsResult{}, err
	}
	var res ReportsResult
	err = h.write(ctx, named("reports"), func(tx *store.Tx) error {
		prior, ops, found, err := jobs.BatchJobs(ctx, tx, key)
		if err != nil {
			return err
		}
		if found {
			if prior != digest {
				return fleet.Errorf(fleet.CodeOperationConflict, "idempotency_key %s was used before with a different request", key)
			}
			res = ReportsResult{OperationIDs: ops, Replayed: true}
			return nil
		}
		queued, err := jobs.Enqueue(ctx, tx, key, digest, *req.Document, req.Sections)
		if err != nil {
			return err
		}
		res = ReportsResult{}
		for _, j := range queued {
			res.OperationIDs = append(res.OperationIDs, j.OperationID)
		}
		_, err = events.Append(ctx, tx, events.Enqueued, OperatorName,
			fmt.Sprintf("The operator enqueued %d sections", len(queued)),
			map[string]any{"idempotency_key": key, "operation_ids": res.OperationIDs})
		return err
	})
	return res, err
}

// Snapshot is the operator's overview.
type Snapshot struct {
	Jobs       []jobs.Job        `json:"jobs"`
	Accounting budget.Accounting `json:"accounting"`
	KernelKey  string            `json:"kernel_key"`
	Mutations  int64             `json:"mutations"`
	Events     int64             `json:"events"`
	Storage    store.Stats       `json:"storage"` // since this host started
	NowMS      int64             `json:"now_ms"`  // the host's clock, for lease countdowns
}

// Snapshot reads every job and the accounting in one consistent read.
func (h *Host) Snapshot(ctx context.Context) (Snapshot, error) {
	s := Snapshot{KernelKey: h.kernel.PublicKey, Storage: h.db.Stats()}
	err := h.db.Read(ctx, func(tx *store.Tx) (err error) {
		if s.Jobs, err = jobs.List(ctx, tx); err != nil {
			return err
		}
		newest, err := receipts.LatestByOperation(ctx, tx)
		if err != nil {
			return err
		}
		for i := range s.Jobs {
			s.Jobs[i].ReceiptID = newest[s.Jobs[i].OperationID]
		}
		s.NowMS = tx.NowMS()
		s.Accounting, s.Mutations, s.Events, err = readTotals(ctx, tx)
		return err
	})
	return s, err
}

// readTotals reads what the snapshot and the stats share: the accounting,
// how many mutations exist and the newest event's sequence.
func readTotals(ctx context.Context, tx *store.Tx) (acct budget.Accounting, mutations, lastEvent int64, err error) {
	if acct, err = budget.Get(ctx, tx); err != nil {
		return
	}
	if err = tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM mutations`).Scan(&mutations); err != nil {
		return
	}
	err = tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(sequence), 0) FROM events`).Scan(&lastEvent)
	return
}

// Stats is a cheap overview for dashboards and benchmarks: counts, not the
// job list, so its cost does not grow with the queue.
type Stats struct {
	Jobs       map[jobs.State]int64 `json:"jobs"`
	Accounting budget.Accounting    `json:"accounting"`
	Mutations  int64                `json:"mutations"`
	Events     int64                `json:"events"`
	Storage    store.Stats          `json:"storage"` // since this host started
}

// Stats counts jobs by state and reads the accounting.
func (h *Host) Stats(ctx context.Context) (Stats, error) {
	s := Stats{Jobs: map[jobs.State]int64{}, Storage: h.db.Stats()}
	err := h.db.Read(ctx, func(tx *store.Tx) (err error) {
		rows, err := tx.QueryContext(ctx, `SELECT state, COUNT(*) FROM jobs GROUP BY state`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var st jobs.State
			var n int64
			if err := rows.Scan(&st, &n); err != nil {
				return err
			}
			s.Jobs[st] = n
		}
		s.Accounting, s.Mutations, s.Events, err = readTotals(ctx, tx)
		return err
	})
	return s, err
}

// JobDetail is one job with everything known about it.
type JobDetail struct {
	jobs.Job
	Claim      *jobs.Claim          `json:"claim"`
	Input      jobs.Input           `json:"input"`
	Document   resource.Document    `json:"document"`
	Operations []resource.Operation `json:"operations"`
	Mutations  int64                `json:"mutations"`
	Receipts   []receipts.Receipt   `json:"receipts"`
}

// Job reads one job's detail.
func (h *Host) Job(ctx context.Context, op string) (JobDetail, error) {
	var d JobDetail
	err := h.db.Read(ctx, func(tx *store.Tx) (err error) {
		if d.Job, err = jobs.Get(ctx, tx, op); err != nil {
			return err
		}
		d.Claim = d.Job.CurrentClaim()
		if d.Input, err = jobs.InputOf(ctx, tx, d.Job); err != nil {
			return err
		}
		if d.Document, err = resource.Get(ctx, tx, d.DocumentID); err != nil {
			return err
		}
		if d.Operations, err = resource.Operations(ctx, tx, d.DocumentID); err != nil {
			return err
		}
		if d.Operations == nil {
			d.Operations = []resource.Operation{}
		}
		if d.Mutations, err = resource.MutationCount(ctx, tx, d.DocumentID); err != nil {
			return err
		}
		if d.Receipts, err = receipts.List(ctx, tx, op); err != nil {
			return err
		}
		if d.Receipts == nil {
			d.Receipts = []receipts.Receipt{}
		}
		return nil
	})
	return d, err
}

// Events lists up to limit events after sequence `after`.
func (h *Host) Events(ctx context.Context, after int64, limit int) ([]events.Event, error) {
	var out []events.Event
	err := h.db.Read(ctx, func(tx *store.Tx) (err error) {
		out, err = events.List(ctx, tx, after, limit)
		return err
	})
	return out, err
}

// CheckReceipt verifies one receipt's id, signature and chain link against
// this host's kernel key.
func (h *Host) CheckReceipt(ctx context.Context, id string) (receipts.Check, error) {
	var c receipts.Check
	err := h.db.Read(ctx, func(tx *store.Tx) (err error) {
		c, err = receipts.CheckOne(ctx, tx, id, h.kernel.PublicKey)
		return err
	})
	return c, err
}

// Receipt reads one receipt as stored (canonical JSON).
func (h *Host) Receipt(ctx context.Context, id string) (json.RawMessage, error) {
	var raw json.RawMessage
	err := h.db.Read(ctx, func(tx *store.Tx) (err error) {
		_, raw, err = receipts.Get(ctx, tx, id)
		return err
	})
	return raw, err
}
