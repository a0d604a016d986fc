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
type heldWrites struct {
	mutations  []Mutation
	operations []StoredOperation
}

// heldMark is where the held writes stood when an item began.
type heldMark struct{ mutations, operations int }

func (h *heldWrites) mark() heldMark {
	return heldMark{mutations: len(h.mutations), operations: len(h.operations)}
}

// rollback drops what an item refused after m held.
func (h *heldWrites) rollback(m heldMark) {
	h.mutations, h.operations = h.mutations[:m.mutations], h.operations[:m.operations]
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
