// Package operator is the operator's actions on jobs and the allowance:
// cancel, requeue and reconcile a job (with the operator's reason), the
// same for every job a filter selects (each its own operation), reassign
// a document, set the allowance, and submit reports; each decided in its
// own transaction with its receipt and event.
package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/host/dependents"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/publication"
	"github.com/fleet/fleet/internal/host/views"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// OperatorName is the caller of the operator's events and receipts.
const OperatorName = access.OperatorName

// Operator acts for the operator.
type Operator struct {
	ledger    *ledger.Ledger
	publisher *publication.Publisher // a reconciliation binds the body a job's document holds
	retry     jobs.Policy            // the state's default retry policy, for reports that give none
}

// New acts through l; p binds bodies; retry is the state's default policy.
func New(l *ledger.Ledger, p *publication.Publisher, retry jobs.Policy) *Operator {
	return &Operator{ledger: l, publisher: p, retry: retry}
}

// Cancel cancels a job. Blocked, queued or claimed: it becomes
// cancelled_before_dispatch, with no receipt since nothing was admitted.
// Running: it becomes cancelled, its assignment is revoked at a new
// generation so a late publication is superseded, its reservation settles
// as spent (the admitted work may have run), and a receipt is signed. The
// claim id stays on the job so its holder learns of the cancellation. The
// operator's reason (one line of plain text, checked by the caller; "" for
// none) is kept in the event.
func (o *Operator) Cancel(ctx context.Context, op, reason string) (wire.CancelResult, error) {
	res, err := ledger.Write(ctx, o.ledger, ledger.Named[wire.CancelResult]("cancel"), func(tx *store.Tx) (res wire.CancelResult, err error) {
		j, err := jobs.Get(ctx, tx, op, store.ForUpdate)
		if err != nil {
			return res, err
		}
		before := j.State
		switch j.State {
		case wire.Blocked, wire.Queued, wire.Claimed, wire.Running:
		default:
			return res, fleet.Errorf(wire.CodeStateConflict, "job %s is %s; only blocked, queued, claimed or running jobs can be cancelled", op, j.State)
		}
		if j.State != wire.Queued && j.State != wire.Blocked {
			if err := jobs.RevokeAssignment(ctx, tx, &j, "cancelled"); err != nil {
				return res, err
			}
		}
		data := map[string]any{"operation_id": op, "section": j.Section, "was": before}
		if before != wire.Running {
			if err := jobs.Cancel(ctx, tx, &j, wire.CancelledBeforeDispatch, "cancelled by the operator before dispatch"); err != nil {
				return res, err
			}
		} else {
			held := j.Reserved
			acct, err := jobs.Settle(ctx, tx, &j)
			if err != nil {
				return res, err
			}
			r, err := o.ledger.IssueReceipt(tx, receipts.Draft{Kind: wire.KindCancellation, OperationID: op,
				Caller: OperatorName, Decision: wire.DecisionCancelled, Cost: held, Accounting: acct, Tenant: j.Tenant, Credential: j.ReserveCredential})
			if err != nil {
				return res, err
			}
			if err := jobs.Cancel(ctx, tx, &j, wire.Cancelled, "cancelled by the operator while running"); err != nil {
				return res, err
			}
			res.ReceiptID = &r.ID
			data["receipt_id"], data["accounting"] = r.ID, acct
		}
		res.State = j.State
		res.CancellationRequested = before != wire.Queued && before != wire.Blocked
		return res, ledger.AppendEvent(ctx, tx, wire.EventCancelled, OperatorName,
			because(fmt.Sprintf("The operator cancelled the %s section (%s, was %s)", j.Section, j.State, before), reason, data), data)
	})
	if err == nil {
		o.ledger.Log.Info("cancelled", "operation_id", op, "state", res.State, "receipt_id", res.ReceiptID)
	}
	return res, err
}

// Requeue puts a refused or unresolved job back in the queue at a new
// generation, revoking its assignment. An unresolved job's reservation
// settles as spent: its admitted work may have run. The operator's reason,
// if any, is kept in the event.
func (o *Operator) Requeue(ctx context.Context, op, reason string) (wire.RequeueResult, error) {
	res, err := ledger.Write(ctx, o.ledger, ledger.Named[wire.RequeueResult]("requeue"), func(tx *store.Tx) (res wire.RequeueResult, err error) {
		j, err := jobs.Get(ctx, tx, op, store.ForUpdate)
		if err != nil {
			return res, err
		}
		if j.State != wire.Refused && j.State != wire.Unresolved && j.State != wire.Failed {
			return res, fleet.Errorf(wire.CodeStateConflict, "job %s is %s; only refused, unresolved or failed jobs can be requeued", op, j.State)
		}
		held := j.Reserved
		acct, err := jobs.Settle(ctx, tx, &j)
		if err != nil {
			return res, err
		}
		r, err := o.ledger.IssueReceipt(tx, receipts.Draft{Kind: wire.KindRequeue, OperationID: op,
			Caller: OperatorName, Decision: wire.DecisionRequeued, Cost: held, Accounting: acct, Tenant: j.Tenant, Credential: j.ReserveCredential})
		if err != nil {
			return res, err
		}
		was := j.State
		if err := jobs.RevokeAssignment(ctx, tx, &j, "requeued"); err != nil {
			return res, err
		}
		// A requeued job starts over: its attempts reset, claimable at once
		// in its old place, nobody's.
		j.Attempts = 0
		if err := jobs.Requeue(ctx, tx, &j, "", min(j.ClaimableAtMS, tx.NowMS()), "requeued by the operator"); err != nil {
			return res, err
		}
		res = wire.RequeueResult{State: j.State, Generation: j.Generation, ReceiptID: r.ID}
		data := map[string]any{"operation_id": op, "was": was, "generation": j.Generation, "receipt_id": r.ID, "accounting": acct}
		return res, ledger.AppendEvent(ctx, tx, wire.EventRequeued, OperatorName,
			because(fmt.Sprintf("The operator requeued the %s section (was %s)", j.Section, was), reason, data), data)
	})
	if err == nil {
		o.ledger.Log.Info("requeued", "operation_id", op, "generation", res.Generation, "receipt_id", res.ReceiptID)
	}
	return res, err
}

// Reconcile resolves a job from what the resource committed, never by
// running anything: if a publication of its document committed, the job is
// completed (if it was not already) and the original outcome and receipt
// are returned; otherwise nothing changes and the answer says what an
// operator can do. The operator's reason, if any, is kept in the event of a
// new reconciliation.
func (o *Operator) Reconcile(ctx context.Context, op, reason string) (wire.Reconciliation, error) {
	res, err := ledger.Write(ctx, o.ledger, ledger.Named[wire.Reconciliation]("reconcile"), func(tx *store.Tx) (wire.Reconciliation, error) {
		return o.reconcile(ctx, tx, op, reason)
	})
	if err == nil {
		o.ledger.Log.Info("reconciled", "operation_id", op, "state", res.State, "reused_existing_effect", res.ReusedExistingEffect,
			"receipt_id", res.ReceiptID, "reconciliation_receipt_id", res.ReconciliationReceipt)
	}
	return res, err
}

// reconcile is Reconcile's transaction.
func (o *Operator) reconcile(ctx context.Context, tx *store.Tx, op, reason string) (wire.Reconciliation, error) {
	j, err := jobs.Get(ctx, tx, op, store.ForUpdate)
	if err != nil {
		return wire.Reconciliation{}, err
	}
	if j.State.Active() && j.LeaseExpiresAtMS > tx.NowMS() {
		return wire.Reconciliation{}, fleet.Errorf(wire.CodeStillRunning, "the worker is still executing: job %s is %s under %s's lease until %d (unix ms); reconcile once it ends or lapses",
			op, j.State, j.Worker, j.LeaseExpiresAtMS)
	}
	// A settled job unchanged since its last reconciliation gets that
	// reconciliation again, not a new signature each call.
	last, err := lastReconciliation(ctx, tx, j)
	if err != nil {
		return wire.Reconciliation{}, err
	}
	res, decision, err := o.resolveFromPublication(ctx, tx, &j)
	if err != nil {
		return res, err
	}
	res.State = j.State
	if last != "" {
		res.ReconciliationReceipt = last
		return res, nil
	}
	acct, err := tx.AccountingGet(ctx, store.NoLock)
	if err != nil {
		return res, err
	}
	r, err := o.ledger.IssueReceipt(tx, receipts.Draft{Kind: wire.KindReconciliation, OperationID: op,
		Caller: OperatorName, Decision: decision, Accounting: acct, Tenant: j.Tenant, Credential: j.ReserveCredential})
	if err != nil {
		return res, err
	}
	res.ReconciliationReceipt = r.ID
	data := map[string]any{"operation_id": op, "state": j.State, "reused_existing_effect": res.ReusedExistingEffect,
		"receipt_id": res.ReceiptID, "reconciliation_receipt_id": r.ID}
	return res, ledger.AppendEvent(ctx, tx, wire.EventReconciled, OperatorName,
		because(fmt.Sprintf("Reconciled the %s section: %s (%s)", j.Section, j.State, decision), reason, data), data)
}

// resolveFromPublication looks for a committed publication of j's
// document that is j's own effect (its body checked as a publication is).
// Found: j completes if it had not (publication completes its job in the
// same transaction, so this only mends state an older or faulty build
// wrote), and the original outcome is reused. Not found: the answer says
// what an operator can do.
func (o *Operator) resolveFromPublication(ctx context.Context, tx *store.Tx, j *store.Job) (wire.Reconciliation, wire.Decision, error) {
	var res wire.Reconciliation
	published, found, err := publishedOperation(ctx, tx, j.DocumentID)
	if err != nil {
		return res, "", err
	}
	if res.PublishedMutationCount, err = tx.MutationCount(ctx, j.DocumentID); err != nil {
		return res, "", err
	}
	if found {
		doc, err := tx.DocumentGet(ctx, j.DocumentID, store.NoLock)
		if err != nil {
			return res, "", err
		}
		binding, err := o.publisher.Bind(ctx, tx, *j, doc.Body)
		if err != nil {
			return res, "", err
		}
		res.Binding, found = &binding, binding.Matches
		if found {
			res.Artifact = json.RawMessage(doc.Body)
		}
	}
	if !found {
		res.Recovery = jobs.RecoveryAdvice(j.State)
		return res, wire.DecisionNoKnownEffect, nil
	}
	var outcome wire.Outcome
	if err := json.Unmarshal(published.Outcome, &outcome); err != nil {
		return res, "", fmt.Errorf("reconcile %s: retained outcome: %w", j.OperationID, err)
	}
	if j.State != wire.Completed {
		if _, err := jobs.Settle(ctx, tx, j); err != nil {
			return res, "", err
		}
		if err := jobs.Complete(ctx, tx, j, "reconciled from the retained publication"); err != nil {
			return res, "", err
		}
		if err := dependents.Release(ctx, tx, OperatorName, *j); err != nil {
			return res, "", err
		}
	}
	res.ReusedExistingEffect, res.Outcome, res.ReceiptID = true, published.Outcome, outcome.ReceiptID
	res.PublishedOperationKey, res.PublicationDeliveries = published.OperationKey, published.Deliveries
	return res, wire.DecisionReusedExistingEffect, nil
}

// lastReconciliation is the id of the job's last reconciliation receipt if
// the job is settled and nothing has happened to it since ("" otherwise):
// that receipt is its newest, and the job was not updated after it.
func lastReconciliation(ctx context.Context, tx *store.Tx, j store.Job) (string, error) {
	if !j.State.Settled() {
		return "", nil
	}
	all, err := tx.ReceiptList(ctx, j.OperationID)
	if err != nil || len(all) == 0 {
		return "", err
	}
	var newest wire.Receipt
	if err := json.Unmarshal(all[len(all)-1], &newest); err != nil {
		return "", fmt.Errorf("reconcile %s: newest receipt: %w", j.OperationID, err)
	}
	if newest.Kind != wire.KindReconciliation || j.UpdatedAtMS > newest.IssuedAtMS {
		return "", nil
	}
	return newest.ID, nil
}

// publishedOperation is the document's retained publication that
// committed, if any.
func publishedOperation(ctx context.Context, tx *store.Tx, documentID string) (wire.Operation, bool, error) {
	ops, err := tx.OperationList(ctx, documentID)
	if err != nil {
		return wire.Operation{}, false, err
	}
	for _, o := range ops {
		if o.Status == wire.StatusPublished {
			return o, true, nil
		}
	}
	return wire.Operation{}, false, nil
}

// Assign transfers a document to a worker at the next generation if its
// generation is still the expected one. The old holder's claim and
// publications become stale.
func (o *Operator) Assign(ctx context.Context, documentID string, req wire.AssignRequest) (wire.Document, error) {
	if req.ExpectedGeneration == nil || req.Owner == nil {
		return wire.Document{}, fleet.Errorf(wire.CodeInvalid, "expected_generation and owner are required")
	}
	doc, err := ledger.Write(ctx, o.ledger, ledger.Named[wire.Document]("assign"), func(tx *store.Tx) (doc wire.Document, err error) {
		cred, err := tx.CredentialGet(ctx, *req.Owner, store.NoLock)
		switch {
		case store.IsNotFound(err) || err == nil && cred.Role != access.RoleWorker:
			return doc, fleet.Errorf(wire.CodeInvalid, "owner %.80q is not a worker", *req.Owner)
		case err != nil:
			return doc, err
		case cred.RevokedMS != 0:
			// Its claims would be refused at once: the document would sit
			// with an owner that can never publish it.
			return doc, fleet.Errorf(wire.CodeInvalid, "owner %.80q is a worker whose credential was revoked", *req.Owner)
		}
		if err := checkServes(ctx, tx, cred, documentID); err != nil {
			return doc, err
		}
		gen, err := resource.Assign(ctx, tx, documentID, *req.ExpectedGeneration, *req.Owner, "operator")
		if err != nil {
			return doc, err
		}
		if doc, err = resource.GetDocument(ctx, tx, documentID, store.NoLock); err != nil {
			return doc, err
		}
		return doc, ledger.AppendEvent(ctx, tx, wire.EventAssigned, OperatorName,
			fmt.Sprintf("The operator assigned %s to %s at generation %d", documentID, *req.Owner, gen),
			map[string]any{"document_id": documentID, "owner": *req.Owner, "generation": gen})
	})
	if err == nil {
		o.ledger.Log.Info("assigned", "document_id", documentID, "worker", doc.Owner, "generation", doc.Generation)
	}
	return doc, err
}

// checkServes refuses to make a worker limited to some tenants the owner
// of another tenant's document: it could neither claim its job nor may it
// read it.
func checkServes(ctx context.Context, tx *store.Tx, cred store.Credential, documentID string) error {
	if cred.Tenants == nil {
		return nil
	}
	tenant, err := tx.JobTenantOfDocument(ctx, documentID)
	if store.IsNotFound(err) {
		return nil // no job has it (no such document: the assignment says so)
	}
	if err != nil {
		return err
	}
	if !slices.Contains(cred.Tenants, tenant) {
		return fleet.Errorf(wire.CodeInvalid, "owner %s serves only tenants %s; document %s is tenant %s's",
			cred.Name, strings.Join(cred.Tenants, ", "), documentID, tenant)
	}
	return nil
}

// SetAllowance changes the allowance if it is still the expected one
// (compare-and-swap). The new allowance may not fall below what is spent
// and reserved.
func (o *Operator) SetAllowance(ctx context.Context, req wire.AllowanceRequest) (wire.Accounting, error) {
	if req.ExpectedAllowance == nil || req.Allowance == nil {
		return wire.Accounting{}, fleet.Errorf(wire.CodeInvalid, "expected_allowance and allowance are required")
	}
	if err := budget.ValidateAllowance(*req.Allowance); err != nil {
		return wire.Accounting{}, err
	}
	acct, err := ledger.Write(ctx, o.ledger, ledger.Named[wire.Accounting]("allowance"), func(tx *store.Tx) (acct wire.Accounting, err error) {
		if acct, err = tx.AccountingGet(ctx, store.ForUpdate); err != nil {
			return acct, err
		}
		if acct.Allowance != *req.ExpectedAllowance {
			return acct, fleet.Errorf(wire.CodeAllowanceConflict, "allowance is %d, not the expected %d", acct.Allowance, *req.ExpectedAllowance)
		}
		if *req.Allowance < acct.Spent+acct.Reserved {
			return acct, fleet.Errorf(wire.CodeInvalid, "allowance %d is below spent + reserved (%d)", *req.Allowance, acct.Spent+acct.Reserved)
		}
		if acct, err = tx.AccountingSetAllowance(ctx, *req.Allowance); err != nil {
			return acct, err
		}
		return acct, ledger.AppendEvent(ctx, tx, wire.EventAllowanceSet, OperatorName,
			fmt.Sprintf("The operator set the allowance from %d to %d", *req.ExpectedAllowance, acct.Allowance),
			map[string]any{"from": *req.ExpectedAllowance, "accounting": acct})
	})
	if err == nil {
		o.ledger.Log.Info("allowance changed", "allowance", acct.Allowance, "available", acct.Available)
	}
	return acct, err
}

// because is an operator's event title with the reason they gave, which
// also goes in the event's data; without one, the title as it is.
func because(title, reason string, data map[string]any) string {
	if reason == "" {
		return title
	}
	data["reason"] = reason
	return title + ": " + reason
}

// MaxBulkJobs is the most jobs one bulk call acts on; the answer's next
// cursor continues after them.
const MaxBulkJobs = 500

// Bulk cancels or requeues the jobs a filter selects (as GET /admin/jobs
// selects them), in queue order from the cursor after, at most MaxBulkJobs
// a call. Each job is its own operation, as if asked one by one: its own
// transaction, fence, receipt and event, or its own refusal (a job that
// left the state it was selected in since is refused, state_conflict, and
// changes nothing). With DryRun nothing is done: the answer counts the
// jobs the filter selects now, all of them.
func (o *Operator) Bulk(ctx context.Context, req wire.BulkRequest) (wire.BulkResult, error) {
	if len(req.Reason) > wire.MaxReasonBytes || !wire.IsPlainText(req.Reason) {
		return wire.BulkResult{}, fleet.Errorf(wire.CodeInvalid, "reason must be at most %d bytes of one line of UTF-8 text without control, format or separator characters", wire.MaxReasonBytes)
	}
	act, err := o.bulkAction(req.Action, req.Reason)
	if err != nil {
		return wire.BulkResult{}, err
	}
	f, after, _, err := views.JobPageFilter(wire.JobPageQuery{State: req.Filter.State, Section: req.Filter.Section,
		Owner: req.Filter.Owner, Priority: req.Filter.Priority, Tenant: req.Filter.Tenant, Q: req.Filter.Q, After: req.After})
	if err != nil {
		return wire.BulkResult{}, err
	}
	through, err := bulkThrough(req.Through)
	if err != nil {
		return wire.BulkResult{}, err
	}
	run := bulkRun{req: req, act: act, takes: bulkTakes[req.Action], through: through,
		res: wire.BulkResult{Action: req.Action, Refused: map[wire.Code]int64{}, Results: []wire.BulkItem{}}}
	for {
		limit := MaxBulkJobs // a call acts on one page; a dry run reads on
		var page []store.Job
		if err := o.ledger.DB().Read(ctx, func(tx *store.Tx) (err error) {
			page, err = tx.JobPage(ctx, &store.JobPageParams{Filter: f, After: after, Limit: limit + 1})
			return err
		}); err != nil {
			return run.res, err
		}
		more := len(page) > limit
		if more {
			page = page[:limit]
		}
		for _, j := range page {
			if j.Position > through {
				return run.res, nil // arrived after what the operator confirmed
			}
			after = j.Position
			if err := run.take(ctx, j); err != nil {
				return run.res, err
			}
		}
		switch {
		case !more:
			return run.res, nil
		case !req.DryRun:
			run.res.Next = strconv.FormatInt(after, 10)
			return run.res, nil
		}
	}
}

// bulkAct is a bulk action on one job: the state it left the job in.
type bulkAct func(ctx context.Context, op string) (wire.JobState, error)

// bulkAction is the single call a bulk action makes for each job.
func (o *Operator) bulkAction(action, reason string) (bulkAct, error) {
	switch action {
	case "cancel":
		return func(ctx context.Context, op string) (wire.JobState, error) {
			res, err := o.Cancel(ctx, op, reason)
			return res.State, err
		}, nil
	case "requeue":
		return func(ctx context.Context, op string) (wire.JobState, error) {
			res, err := o.Requeue(ctx, op, reason)
			return res.State, err
		}, nil
	case "reconcile":
		return func(ctx context.Context, op string) (wire.JobState, error) {
			res, err := o.Reconcile(ctx, op, reason)
			return res.State, err
		}, nil
	}
	return nil, fleet.Errorf(wire.CodeInvalid, "action must be cancel, requeue or reconcile, got %.40q", action)
}

// bulkRun is one bulk call's progress through the jobs its filter selects.
type bulkRun struct {
	req     wire.BulkRequest
	act     bulkAct
	takes   map[wire.JobState]bool
	through int64
	res     wire.BulkResult
}

// take counts a selected job and, unless this is a dry run, acts on it. A
// refusal is the job's and is counted; an error is the host's trouble, not
// the job's, and stops the call where it got to.
func (r *bulkRun) take(ctx context.Context, j store.Job) error {
	r.res.Matched++
	if r.takes[j.State] {
		r.res.Applicable++
	}
	if r.req.DryRun {
		r.res.Through = strconv.FormatInt(j.Position, 10)
		return nil
	}
	item := wire.BulkItem{OperationID: j.OperationID}
	state, err := r.act(ctx, j.OperationID)
	item.State = state
	if err != nil {
		code := fleet.ErrorCode(err)
		if code == wire.CodeInternal || code == wire.CodeUnavailable {
			return err
		}
		item.Error = &wire.ErrorDetail{Code: code, Message: fleet.ErrorMessage(err)}
		r.res.Refused[code]++
	} else {
		r.res.Done++
	}
	r.res.Results = append(r.res.Results, item)
	return nil
}

// bulkThrough reads a bulk call's Through: the last place in the queue it
// acts on (no limit when "").
func bulkThrough(through string) (int64, error) {
	if through == "" {
		return math.MaxInt64, nil
	}
	n, err := strconv.ParseInt(through, 10, 64)
	if err != nil || n < 0 {
		return 0, fleet.Errorf(wire.CodeInvalid, "through %.40q is not a place this host gave (through of a dry run)", through)
	}
	return n, nil
}

// bulkTakes are the states each bulk action takes a job in, for a dry
// run's count of what it would act on (the action itself refuses the
// others alone, as its single call does).
var bulkTakes = map[string]map[wire.JobState]bool{
	"cancel":    {wire.Queued: true, wire.Claimed: true, wire.Running: true},
	"requeue":   {wire.Refused: true, wire.Unresolved: true, wire.Failed: true},
	"reconcile": {wire.Unresolved: true},
}
