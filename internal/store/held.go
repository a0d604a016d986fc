package store

import (
	"context"
	"fmt"
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
type heldWrites struct {
	mutations  []Mutation
	operations []StoredOperation
	running    []JobSetRunningParams
	refused    []JobSetRefusedParams
}

// heldMark is where the held writes stood when an item began.
type heldMark struct{ mutations, operations, running, refused int }

func (h *heldWrites) mark() heldMark {
	return heldMark{mutations: len(h.mutations), operations: len(h.operations), running: len(h.running), refused: len(h.refused)}
}

// rollback drops what an item refused after m held.
func (h *heldWrites) rollback(m heldMark) {
	h.mutations, h.operations = h.mutations[:m.mutations], h.operations[:m.operations]
	h.running, h.refused = h.running[:m.running], h.refused[:m.refused]
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
