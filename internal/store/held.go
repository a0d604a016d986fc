package store

import (
	"context"
	"fmt"

	"github.com/fleet/fleet/internal/wire"
)

// heldWrites are a batch request's mutations and operation records, held
// from its items' writes to the request's end and written there in one
// statement per kind instead of one per item.
//
// Holding them is sound for the reason reading ahead is (Tx.ReadAhead):
// they are held only when the items name distinct jobs of distinct
// documents, an item writes only its own document's mutations and
// operations, and nothing in an item reads them back after writing them.
// They are written as the request's function ends, before any other
// request sharing the transaction (SQLite's group commit) runs; the
// database's own guards (one mutation per operation key, one record per
// key) hold on the written rows, and a violation fails the request whole,
// as a failed statement of an item does.
//
// A batch's admissions (JobSetRunning, JobSetRefused) are held the same
// way: an item admits only its own job, reads nothing of it back after,
// and each transition keeps its guard (state and claim id) in the one
// statement that writes them all, which fails the request whole should
// any guard not hold, as the single statement would.
//
// A batch's publications hold their jobs' completions (JobComplete) and
// their documents' writes (DocumentWrite) the same way, each kind written
// in one statement (JobCompleteMany, DocumentWriteMany). What waits for a
// completed job reads it and its document back within the request (its
// dependents' inputs name its output): JobGet and DocumentGet answer them
// as held.
//
// A claim that admits holds its jobs' rows too (HoldClaims): the claim
// picks and locks them without writing them, and each is written once,
// claimed and admitted (or refused) in one row version, rather than
// claimed and then admitted in two. Nothing in the claim's transaction
// reads a picked job back before WriteHeld.
type heldWrites struct {
	mutations  []Mutation
	operations []StoredOperation
	running    []JobSetRunningParams
	refused    []JobSetRefusedParams
	completed  []JobCompleteParams
	documents  []DocumentWriteParams
	// pickClaims: JobClaimMany picks (JobPickMany) and picked holds the
	// jobs it picked, as claimed, to write once.
	pickClaims bool
	picked     []Job
}

// heldMark is where the held writes stood when an item began.
type heldMark struct{ mutations, operations, running, refused, completed, documents, picked int }

func (h *heldWrites) mark() heldMark {
	return heldMark{mutations: len(h.mutations), operations: len(h.operations), running: len(h.running), refused: len(h.refused),
		completed: len(h.completed), documents: len(h.documents), picked: len(h.picked)}
}

// rollback drops what an item refused after m held.
func (h *heldWrites) rollback(m heldMark) {
	h.mutations, h.operations = h.mutations[:m.mutations], h.operations[:m.operations]
	h.running, h.refused = h.running[:m.running], h.refused[:m.refused]
	h.completed, h.documents, h.picked = h.completed[:m.completed], h.documents[:m.documents], h.picked[:m.picked]
}

// HoldWrites holds this request's admissions, mutations and operation
// records to its end (WriteHeld), as a batch whose reads went ahead
// does: for a request that admits several jobs it has just claimed and
// locked (a claim that admits), each written by no one else.
func (tx *Tx) HoldWrites() {
	if tx.held == nil {
		tx.held = &heldWrites{}
	}
}

// HoldClaims holds this request's writes (HoldWrites) and its claims'
// job rows as well: JobClaimMany then picks its jobs (JobPickMany) and
// WriteHeld writes each once, with its admission if the request made one.
// For a claim that admits, whose admissions read nothing of the jobs'
// rows back.
func (tx *Tx) HoldClaims() {
	tx.HoldWrites()
	tx.held.pickClaims = true
}

// JobClaimMany is the Executor's, or its pick when the request holds its
// claims (HoldClaims).
func (tx *Tx) JobClaimMany(ctx context.Context, p *JobClaimManyParams) ([]ClaimedJob, error) {
	if tx.held == nil || !tx.held.pickClaims {
		if len(p.Owners) > 0 {
			// The claim's one statement writes one worker's claims.
			return nil, fmt.Errorf("claim for %d owners: only a pick (HoldClaims) serves several", len(p.Owners))
		}
		return tx.Executor.JobClaimMany(ctx, p)
	}
	picked := make([]string, len(tx.held.picked))
	for i, j := range tx.held.picked {
		picked[i] = j.OperationID
	}
	claimed, err := tx.Executor.JobPickMany(ctx, p, picked)
	for _, c := range claimed {
		tx.held.picked = append(tx.held.picked, c.Job)
	}
	return claimed, err
}

// apply is what JobSetRunning does to j, claimed under p.IfClaimID.
func (p *JobSetRunningParams) apply(j *Job) {
	j.State, j.StartedAtMS, j.Reserved, j.ReserveShard, j.TenantShard = wire.Running, p.NowMS, p.Reserved, p.ReserveShard, p.TenantShard
	j.ReserveCredential, j.AdmissionClaimID, j.Admission = p.ReserveCredential, j.ClaimID, p.Admission
	j.LeaseExpiresAtMS, j.Reason, j.UpdatedAtMS = p.LeaseExpiresAtMS, p.Reason, p.NowMS
}

// apply is what JobSetRefused does to j, claimed under p.IfClaimID.
func (p *JobSetRefusedParams) apply(j *Job) {
	j.State, j.FinishedAtMS, j.Reserved, j.ReserveShard, j.TenantShard, j.ReserveCredential = wire.Refused, p.NowMS, 0, -1, -1, ""
	j.AdmissionClaimID, j.Admission, j.Reason, j.UpdatedAtMS = j.ClaimID, p.Admission, p.Reason, p.NowMS
}

// admitPicked applies the held admissions of picked jobs to them, each
// guarded as its statement would be (still claimed, under its claim),
// and keeps held only those of other jobs.
func (h *heldWrites) admitPicked() error {
	at := make(map[string]*Job, len(h.picked))
	for i := range h.picked {
		at[h.picked[i].OperationID] = &h.picked[i]
	}
	pickedUnder := func(op, ifClaim string) (*Job, error) {
		j := at[op]
		if j != nil && (j.State != wire.Claimed || j.ClaimID != ifClaim) {
			return nil, fmt.Errorf("admit %s under %s: %w", op, ifClaim, ErrGuard)
		}
		return j, nil
	}
	running := h.running[:0]
	for _, p := range h.running {
		j, err := pickedUnder(p.OperationID, p.IfClaimID)
		if err != nil {
			return err
		}
		if j == nil {
			running = append(running, p)
		} else {
			p.apply(j)
		}
	}
	refused := h.refused[:0]
	for _, p := range h.refused {
		j, err := pickedUnder(p.OperationID, p.IfClaimID)
		if err != nil {
			return err
		}
		if j == nil {
			refused = append(refused, p)
		} else {
			p.apply(j)
		}
	}
	h.running, h.refused = running, refused
	return nil
}

// JobSetRunning is the Executor's, held to the request's end when it
// holds its writes.
func (tx *Tx) JobSetRunning(ctx context.Context, p *JobSetRunningParams) error {
	if tx.held != nil {
		tx.held.running = append(tx.held.running, *p)
		return nil
	}
	return tx.Executor.JobSetRunning(ctx, p)
}

// JobSetRefused is the Executor's, held to the request's end when it
// holds its writes.
func (tx *Tx) JobSetRefused(ctx context.Context, p *JobSetRefusedParams) error {
	if tx.held != nil {
		tx.held.refused = append(tx.held.refused, *p)
		return nil
	}
	return tx.Executor.JobSetRefused(ctx, p)
}

// JobComplete is the Executor's, held to the request's end when it holds
// its writes.
func (tx *Tx) JobComplete(ctx context.Context, p *JobCompleteParams) error {
	if tx.held != nil {
		tx.held.completed = append(tx.held.completed, *p)
		return nil
	}
	return tx.Executor.JobComplete(ctx, p)
}

// apply is what JobComplete does to j, in the state p read.
func (p *JobCompleteParams) apply(j *Job) {
	j.State, j.FinishedAtMS, j.Reserved, j.ReserveShard, j.TenantShard, j.ReserveCredential = wire.Completed, p.NowMS, 0, -1, -1, ""
	j.Reason, j.UpdatedAtMS = p.Reason, p.NowMS
}

// asHeld is j as the request's held completions and document writes
// leave it.
func (h *heldWrites) asHeld(j Job) Job {
	for i := range h.completed {
		if p := &h.completed[i]; p.OperationID == j.OperationID && p.IfState == j.State {
			p.apply(&j)
		}
	}
	for _, p := range h.documents {
		if p.ID == j.DocumentID {
			j.DocumentVersion = p.Version
		}
	}
	return j
}

// DocumentWrite is the Executor's, held to the request's end when it
// holds its writes.
func (tx *Tx) DocumentWrite(ctx context.Context, p *DocumentWriteParams) error {
	if tx.held != nil {
		tx.held.documents = append(tx.held.documents, *p)
		return nil
	}
	return tx.Executor.DocumentWrite(ctx, p)
}

// DocumentGet is the Executor's, with the request's held writes of the
// document applied.
func (tx *Tx) DocumentGet(ctx context.Context, id string, lock Lock) (wire.Document, error) {
	d, err := tx.Executor.DocumentGet(ctx, id, lock)
	if err == nil && tx.held != nil {
		for _, p := range tx.held.documents {
			if p.ID == id {
				d.Body, d.Version = p.Body, p.Version
			}
		}
	}
	return d, err
}

// MutationInsert is the Executor's, held to the request's end in a batch
// whose reads went ahead.
func (tx *Tx) MutationInsert(ctx context.Context, ms ...Mutation) error {
	if tx.held != nil {
		tx.held.mutations = append(tx.held.mutations, ms...)
		return nil
	}
	return tx.Executor.MutationInsert(ctx, ms...)
}

// OperationInsert is the Executor's, held to the request's end in a batch
// whose reads went ahead.
func (tx *Tx) OperationInsert(ctx context.Context, os ...StoredOperation) error {
	if tx.held != nil {
		tx.held.operations = append(tx.held.operations, os...)
		return nil
	}
	return tx.Executor.OperationInsert(ctx, os...)
}

// WriteHeld writes what the request held, one statement per kind, and
// stops holding: a batch calls it as its function ends, so its statements
// count as the request's; the transaction calls it after the function in
// any case.
func (tx *Tx) WriteHeld(ctx context.Context) error {
	h := tx.held
	if h == nil {
		return nil
	}
	tx.held = nil
	if len(h.picked) > 0 {
		if err := h.admitPicked(); err != nil {
			return err
		}
		if err := tx.Executor.JobClaimWriteMany(ctx, h.picked); err != nil {
			return fmt.Errorf("write a claim's jobs: %w", err)
		}
	}
	if len(h.running) > 0 {
		if err := tx.Executor.JobSetRunningMany(ctx, h.running); err != nil {
			return fmt.Errorf("write a batch's admissions: %w", err)
		}
	}
	if len(h.refused) > 0 {
		if err := tx.Executor.JobSetRefusedMany(ctx, h.refused); err != nil {
			return fmt.Errorf("write a batch's refusals: %w", err)
		}
	}
	if len(h.completed) > 0 {
		if err := tx.Executor.JobCompleteMany(ctx, h.completed); err != nil {
			return fmt.Errorf("write a batch's completions: %w", err)
		}
	}
	if len(h.documents) > 0 {
		if err := tx.Executor.DocumentWriteMany(ctx, h.documents); err != nil {
			return fmt.Errorf("write a batch's documents: %w", err)
		}
	}
	if err := tx.Executor.MutationInsert(ctx, h.mutations...); err != nil {
		return fmt.Errorf("write a batch's mutations: %w", err)
	}
	if err := tx.Executor.OperationInsert(ctx, h.operations...); err != nil {
		return fmt.Errorf("write a batch's operation records: %w", err)
	}
	return nil
}

// MutationTotal is the Executor's, counting the mutations a batch holds
// as written: an item after them must see the total its single call
// would (the lose_ack_index fault counts it).
func (tx *Tx) MutationTotal(ctx context.Context) (int64, error) {
	n, err := tx.Executor.MutationTotal(ctx)
	if tx.held != nil {
		n += int64(len(tx.held.mutations))
	}
	return n, err
}
