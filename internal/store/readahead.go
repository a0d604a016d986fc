package store

import (
	"context"
	"fmt"
	"maps"
	"slices"
)

// readAhead holds what a batch request read for its items before they
// ran, each row served once, to the item's own read of it.
type readAhead struct {
	jobs map[string]Job
	// ops holds every (document, key) pair read: nil when there was none.
	ops map[OperationRef]*StoredOperation
}

// ReadAhead reads the jobs a batch request's items name (operationIDs,
// item by item), and with keys (keys[i] the operation key item i's
// publication carries) the operations retained under them, one statement
// each, instead of one read per item. On PostgreSQL the jobs are locked
// as they are read, in operation id order, the order every batch takes
// them in, and the reads each cost a round trip, which a batch would
// otherwise pay per item with every lock it holds waiting on it.
//
// Each item then reads its own job (JobGet) and operation (OperationGet)
// as it would alone, and gets what was read ahead: the row as it stands,
// since the job and its document are locked and no earlier item can have
// written them. That holds because an item writes only its own job, its
// document and its document's operations: when two items name one job or
// two jobs share a document, nothing is kept and every item reads for
// itself. A row is served once; a second read goes to the database.
func (tx *Tx) ReadAhead(ctx context.Context, operationIDs []string, keys []string) error {
	tx.ahead, tx.held = nil, nil
	if keys != nil && len(keys) != len(operationIDs) {
		return fmt.Errorf("read ahead: %d operation keys for %d jobs", len(keys), len(operationIDs))
	}
	jobs, err := tx.Executor.JobGetMany(ctx, operationIDs)
	if err != nil {
		return err
	}
	named := make(map[string]bool, len(operationIDs))
	for _, op := range operationIDs {
		if named[op] {
			return nil
		}
		named[op] = true
	}
	ahead := &readAhead{jobs: make(map[string]Job, len(jobs))}
	documents := make(map[string]bool, len(jobs))
	for _, j := range jobs {
		if documents[j.DocumentID] {
			return nil
		}
		documents[j.DocumentID] = true
		ahead.jobs[j.OperationID] = j
	}
	if keys != nil {
		if ahead.ops, err = tx.operationsAhead(ctx, operationIDs, keys, ahead.jobs); err != nil {
			return err
		}
	}
	tx.ahead, tx.held = ahead, &heldWrites{}
	return nil
}

// operationsAhead reads the operations retained under keys[i] on the
// document of item i's job: every pair asked, nil where there is none.
func (tx *Tx) operationsAhead(ctx context.Context, operationIDs, keys []string, jobs map[string]Job) (map[OperationRef]*StoredOperation, error) {
	asked := make(map[OperationRef]*StoredOperation, len(keys))
	refs := make([]OperationRef, 0, len(keys))
	for i, op := range operationIDs {
		if j, ok := jobs[op]; ok && keys[i] != "" {
			r := OperationRef{DocumentID: j.DocumentID, Key: keys[i]}
			asked[r] = nil
			refs = append(refs, r)
		}
	}
	if len(refs) == 0 {
		return asked, nil
	}
	found, err := tx.Executor.OperationGetMany(ctx, refs)
	if err != nil {
		return nil, err
	}
	for _, o := range found {
		r := OperationRef{DocumentID: o.DocumentID, Key: o.OperationKey}
		if _, ok := asked[r]; ok {
			asked[r] = &o
		}
	}
	return asked, nil
}

// JobGet is the Executor's, served from what was read ahead when it can,
// with what the request holds to write (a completion) applied.
func (tx *Tx) JobGet(ctx context.Context, operationID string, lock Lock) (Job, error) {
	if tx.ahead != nil {
		if j, ok := tx.ahead.jobs[operationID]; ok {
			delete(tx.ahead.jobs, operationID)
			return j, nil
		}
	}
	j, err := tx.Executor.JobGet(ctx, operationID, lock)
	if err == nil && tx.held != nil {
		j = tx.held.asHeld(j)
	}
	return j, err
}

// OperationGet is the Executor's, served from what was read ahead when it
// can.
func (tx *Tx) OperationGet(ctx context.Context, documentID, key string) (StoredOperation, error) {
	if tx.ahead != nil {
		r := OperationRef{DocumentID: documentID, Key: key}
		if o, ok := tx.ahead.ops[r]; ok {
			delete(tx.ahead.ops, r)
			if o == nil {
				return StoredOperation{}, fmt.Errorf("look up operation %s: %w", key, ErrNotFound)
			}
			return *o, nil
		}
	}
	return tx.Executor.OperationGet(ctx, documentID, key)
}

// TenantsAhead counts the jobs read ahead by tenant (names in order): the
// reservations a batch of dispatches may make at each.
func (tx *Tx) TenantsAhead() (names []string, counts []int) {
	if tx.ahead == nil {
		return nil, nil
	}
	byTenant := map[string]int{}
	for _, j := range tx.ahead.jobs {
		byTenant[j.Tenant]++
	}
	names = slices.Sorted(maps.Keys(byTenant))
	for _, n := range names {
		counts = append(counts, byTenant[n])
	}
	return names, counts
}

// ReserveAhead takes ahead the reservations a transaction's admissions
// may make (a batch's, a claim's that admits, a dispatch's alone):
// counts[i] at tenant names[i], in names' order, then n at the fleet, as
// an admission takes the levels. The last tenant's and the fleet's go in one
// statement (LevelsReserveAhead).
func (tx *Tx) ReserveAhead(ctx context.Context, names []string, counts []int, n int) error {
	if len(names) == 0 {
		return tx.AccountingReserveAhead(ctx, n)
	}
	last := len(names) - 1
	for i := range last {
		if err := tx.TenantReserveAhead(ctx, names[i], counts[i]); err != nil {
			return err
		}
	}
	return tx.LevelsReserveAhead(ctx, names[last], counts[last], n)
}
