package operator

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// The operator's submissions: a report's jobs planned off the write path,
// then enqueued in one transaction with their documents and what waits
// for what.

// InitBatchKey is the batch the input's sections are enqueued under.
const InitBatchKey = "init"

// SubmitReports enqueues one job per section. An exact repeat of an
// idempotency key returns the same operation ids; the key with a different
// request is operation_conflict.
func (o *Operator) SubmitReports(ctx context.Context, req wire.ReportsRequest) (wire.ReportsResult, error) {
	if req.Document == nil || req.Sections == nil || req.IdempotencyKey == nil {
		return wire.ReportsResult{}, fleet.Errorf(wire.CodeInvalid, "document, sections and idempotency_key are required")
	}
	key := *req.IdempotencyKey
	if key == "" || len(key) > resource.MaxKeyBytes || key == InitBatchKey {
		return wire.ReportsResult{}, fleet.Errorf(wire.CodeInvalid, "idempotency_key must be 1 to %d bytes and not %q", resource.MaxKeyBytes, InitBatchKey)
	}
	if !wire.IsPlainText(key) { // it is shown wherever its report is: in a terminal, an escape would act
		return wire.ReportsResult{}, fleet.Errorf(wire.CodeInvalid, "idempotency_key must be one line of plain text, got %s", strconv.Quote(key))
	}
	r, err := o.Plan(req)
	if err != nil {
		return wire.ReportsResult{}, err
	}
	return ledger.Write(ctx, o.ledger, ledger.Named[wire.ReportsResult]("reports"), func(tx *store.Tx) (wire.ReportsResult, error) {
		return SubmitPlanned(ctx, tx, OperatorName, key, r)
	})
}

// SubmitPlanned enqueues a planned report under key in tx, for actor (the
// operator, or a schedule), with its event; a key used before answers
// what it enqueued then (the same request) or operation_conflict.
func SubmitPlanned(ctx context.Context, tx *store.Tx, actor, key string, r Planned) (res wire.ReportsResult, err error) {
	prior, err := tx.BatchGet(ctx, key)
	switch {
	case err == nil && prior.RequestSHA256 != r.digest:
		return res, fleet.Errorf(wire.CodeOperationConflict, "idempotency_key %s was used before with a different request", key)
	case err == nil:
		ops, err := tx.JobListByBatch(ctx, key)
		return wire.ReportsResult{OperationIDs: ops, Replayed: true}, err
	case !store.IsNotFound(err):
		return res, err
	}
	if _, err := tx.TenantGet(ctx, r.queue.Tenant); store.IsNotFound(err) {
		return res, fleet.Errorf(wire.CodeNotFound, "tenant %s not found (fleetctl tenant add makes one)", r.queue.Tenant)
	} else if err != nil {
		return res, err
	}
	ops, err := Enqueue(ctx, tx, store.Batch{Key: key, RequestSHA256: r.digest, Document: r.document}, r.planned, r.queue)
	if err != nil {
		return res, err
	}
	who := "The operator"
	if actor != OperatorName {
		who = actor
	}
	return wire.ReportsResult{OperationIDs: ops}, ledger.AppendEvent(ctx, tx, wire.EventEnqueued, actor,
		fmt.Sprintf("%s enqueued %d sections", who, len(ops)),
		map[string]any{"idempotency_key": key, "operation_ids": ops})
}

// Planned is a report's jobs and what they are queued with, known before
// its transaction.
type Planned struct {
	document string
	planned  []NewJob
	queue    Queue
	digest   string // the request's, for its idempotency key
}

// Queue is what a report's jobs are queued with.
type Queue struct {
	Policy   jobs.Policy
	Priority int64
	Tenant   string
}

// Plan checks a report's document, sections, dependencies, retry policy,
// priority and tenant's name and plans its jobs. It reads no state.
func (o *Operator) Plan(req wire.ReportsRequest) (Planned, error) {
	var r Planned
	var err error
	if req.Document == nil || req.Sections == nil {
		return r, fleet.Errorf(wire.CodeInvalid, "document and sections are required")
	}
	r.document = *req.Document
	if r.planned, err = PlanJobs(*req.Document, req.Sections, req.After); err != nil {
		return r, err
	}
	if r.queue.Policy, err = o.retry.With(req.RetryPolicy); err != nil {
		return r, err
	}
	if r.queue.Priority, err = jobs.Priority(req.Priority); err != nil {
		return r, err
	}
	r.queue.Tenant = wire.DefaultTenant
	if req.Tenant != nil {
		if err = budget.ValidateTenantName(*req.Tenant); err != nil {
			return r, err
		}
		r.queue.Tenant = *req.Tenant
	}
	r.digest, err = jobs.BatchDigest(*req.Document, req.Sections, req.RetryPolicy, req.Priority, req.Tenant, req.After)
	return r, err
}

// NewJob is a job to enqueue, with what can be known of it before its
// transaction: its id, its input's digest and the digest of the body a
// deterministic worker publishes for it (for a job that waits for others,
// known only once they have published: computed as it is queued), and
// the jobs it waits for and how many wait for it.
type NewJob struct {
	op, section, inputSHA256, expectedSHA256 string
	after                                    []string // operation ids
	dependents                               int64
}

// PlanJobs names one job per section and computes its digests, off the
// write path; after (a section's name to those it waits for) becomes each
// job's dependencies.
func PlanJobs(document string, sections []string, after map[string][]string) ([]NewJob, error) {
	if err := jobs.ValidateBatch(document, sections); err != nil {
		return nil, err
	}
	if err := jobs.ValidateAfter(sections, after); err != nil {
		return nil, err
	}
	planned := make([]NewJob, 0, len(sections))
	opOf := map[string]string{}
	for _, section := range sections {
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("operation id: %w", err)
		}
		op := id.String()
		opOf[section] = op
		sum, err := jobs.InputSHA256(wire.Input{Document: document, Section: section})
		if err != nil {
			return nil, err
		}
		nj := NewJob{op: op, section: section, inputSHA256: sum}
		if len(after[section]) == 0 {
			if nj.expectedSHA256, err = jobs.ExpectedDigest(op, section, sum, document, nil); err != nil {
				return nil, err
			}
		}
		planned = append(planned, nj)
	}
	for i := range planned {
		for _, dep := range after[planned[i].section] {
			planned[i].after = append(planned[i].after, opOf[dep])
		}
		for _, deps := range after {
			if slices.Contains(deps, planned[i].section) {
				planned[i].dependents++
			}
		}
	}
	return planned, nil
}

// Enqueue records a batch and its planned jobs, queued as q says (a job
// that waits for others blocked), each with its own unassigned document,
// and what waits for what, and returns their operation ids in order.
func Enqueue(ctx context.Context, tx *store.Tx, b store.Batch, planned []NewJob, q Queue) ([]string, error) {
	b.CreatedMS = tx.NowMS()
	if err := tx.BatchInsert(ctx, b); err != nil {
		return nil, err
	}
	// Positions are contiguous across hosts: number them under the log lock.
	if err := tx.LockLog(ctx); err != nil {
		return nil, err
	}
	position, err := tx.JobMaxPosition(ctx)
	if err != nil {
		return nil, err
	}
	// The documents, then the jobs, in one statement each.
	ops, docs := make([]string, len(planned)), make([]string, len(planned))
	queued := make([]store.JobInsertParams, len(planned))
	var deps []store.JobDependency
	for i, nj := range planned {
		position++
		ops[i], docs[i] = nj.op, "doc-"+nj.op
		queued[i] = store.JobInsertParams{OperationID: nj.op, Position: position, BatchKey: b.Key, Section: nj.section,
			DocumentID: docs[i], InputSHA256: nj.inputSHA256, CreatedAtMS: tx.NowMS(), MaxAttempts: q.Policy.MaxAttempts,
			BackoffBaseMS: q.Policy.BackoffBaseMS, BackoffCapMS: q.Policy.BackoffCapMS, ExpectedSHA256: nj.expectedSHA256,
			Priority: q.Priority, Tenant: q.Tenant, WaitingOn: int64(len(nj.after)), Dependents: nj.dependents}
		for _, dep := range nj.after {
			deps = append(deps, store.JobDependency{OperationID: nj.op, DependsOn: dep})
		}
	}
	if err := tx.DocumentInsertMany(ctx, docs, tx.NowMS()); err != nil {
		return nil, err
	}
	if err := tx.JobInsertMany(ctx, queued); err != nil {
		return nil, err
	}
	if len(deps) > 0 {
		if err := tx.JobDependencyInsertMany(ctx, deps); err != nil {
			return nil, err
		}
	}
	return ops, nil
}

// CancelReport cancels every job of the report (by its key) that can be:
// blocked, queued, claimed or running, each as Cancel cancels it, its own
// operation (its own transaction, receipt and event); the others, finished
// already, are left as they were. A job that finishes between the read of
// the report and its cancellation is left too.
func (o *Operator) CancelReport(ctx context.Context, key, reason string) (wire.ReportCancellation, error) {
	out := wire.ReportCancellation{Cancelled: []string{}, Unchanged: []string{}}
	var ops []string
	err := o.ledger.DB().Read(ctx, func(tx *store.Tx) error {
		if _, err := tx.BatchGet(ctx, key); store.IsNotFound(err) {
			return fleet.Errorf(wire.CodeNotFound, "no report with the key %.80q", key)
		} else if err != nil {
			return err
		}
		var err error
		ops, err = tx.JobListByBatch(ctx, key)
		return err
	})
	if err != nil {
		return out, err
	}
	for _, op := range ops {
		_, err := o.Cancel(ctx, op, reason)
		switch {
		case err == nil:
			out.Cancelled = append(out.Cancelled, op)
		case fleet.ErrorCode(err) == wire.CodeStateConflict:
			out.Unchanged = append(out.Unchanged, op)
		default:
			return out, err
		}
	}
	return out, nil
}

// Tenant is the tenant a planned report's jobs go to.
func (r Planned) Tenant() string { return r.queue.Tenant }
