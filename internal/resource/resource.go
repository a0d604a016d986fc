// Package resource is the report resource's documents and the requests
// made of them: a document with a version, an owner and an assignment
// generation; the assignment compare-and-swap; a publication request
// checked and its body made canonical before any transaction. How a
// publication is decided is the publication package's.
package resource

import (
	"context"
	"fmt"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// CreateDocument adds an unassigned document at version 0 with a null body.
func CreateDocument(ctx context.Context, tx *store.Tx, id string) error {
	if err := ValidateDocumentID(id); err != nil {
		return err
	}
	return tx.DocumentInsert(ctx, id, tx.NowMS())
}

// GetDocument reads a document; an unknown id is not_found. With
// store.ForUpdate, in a write transaction, the row stays locked until it
// ends.
func GetDocument(ctx context.Context, tx *store.Tx, id string, lock store.Lock) (wire.Document, error) {
	d, err := tx.DocumentGet(ctx, id, lock)
	if store.IsNotFound(err) {
		return d, fleet.Errorf(wire.CodeNotFound, "document %s not found", id)
	}
	return d, err
}

// Assign transfers a document to owner at the next generation if its
// generation is still expectedGeneration (compare-and-swap). A stale
// expectation is assignment_conflict and changes nothing. It returns the new
// generation. Assignment is an operator's act, never a worker tool.
func Assign(ctx context.Context, tx *store.Tx, id string, expectedGeneration int64, owner, reason string) (int64, error) {
	if err := validateKey("owner", owner, MaxCallerBytes); err != nil {
		return 0, err
	}
	if expectedGeneration < 0 {
		return 0, fleet.Errorf(wire.CodeInvalid, "expected_generation must be >= 0, got %d", expectedGeneration)
	}
	return setOwner(ctx, tx, id, &expectedGeneration, owner, reason)
}

// Revoke takes the document away from whoever holds it, at the next
// generation: every publication fenced by an older generation is superseded.
func Revoke(ctx context.Context, tx *store.Tx, id, reason string) (int64, error) {
	return setOwner(ctx, tx, id, nil, "", reason)
}

func setOwner(ctx context.Context, tx *store.Tx, id string, expected *int64, owner, reason string) (int64, error) {
	// The compare-and-swap is the write's own condition; only a miss reads
	// the document, to say why.
	a, err := tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: id, IfGeneration: expected, Owner: owner,
		Reason: reason, AtMS: tx.NowMS()})
	if err != nil {
		return 0, err
	}
	if !a.OK {
		doc, err := GetDocument(ctx, tx, id, store.NoLock)
		switch {
		case err != nil:
			return 0, err
		case expected == nil:
			return 0, fmt.Errorf("revoke document %s: the update matched no row", id)
		}
		return 0, fleet.Errorf(wire.CodeAssignmentConflict,
			"document %s is at generation %d, not the expected %d", id, doc.Generation, *expected)
	}
	return a.Generation, nil
}
