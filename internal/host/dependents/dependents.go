// Package dependents is what waits for a job. When a job completes, in
// the transaction that completes it, each job waiting for it counts one
// dependency fewer, and each left waiting for none is queued with its
// input complete: its dependencies' outputs (sections, versions and the
// digests of their bodies), which its input digest covers, so what it
// publishes is bound to exactly what it was computed from.
package dependents

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Release runs as j completes, in its transaction, for caller (whose
// publication, or the operator's reconciliation, completed it). A job
// nobody waits for costs no statement.
func Release(ctx context.Context, tx *store.Tx, caller string, j store.Job) error {
	if j.Dependents == 0 {
		return nil
	}
	ready, err := tx.JobReleaseDependents(ctx, &store.JobReleaseDependentsParams{DependsOn: j.OperationID, NowMS: tx.NowMS()})
	if err != nil {
		return err
	}
	for _, op := range ready {
		if err := unblock(ctx, tx, caller, op, j); err != nil {
			return err
		}
	}
	return nil
}

// unblock queues op, whose last dependency (last) has just completed.
func unblock(ctx context.Context, tx *store.Tx, caller, op string, last store.Job) error {
	d, err := tx.JobGet(ctx, op, store.ForUpdate)
	if err != nil {
		return err
	}
	after, outputs, err := Outputs(ctx, tx, op)
	if err != nil {
		return err
	}
	batch, err := tx.BatchGet(ctx, d.BatchKey)
	if err != nil {
		return fmt.Errorf("queue %s: %w", op, err)
	}
	sum, err := jobs.InputSHA256(wire.Input{Document: batch.Document, Section: d.Section, After: after})
	if err != nil {
		return err
	}
	expected, err := jobs.ExpectedDigest(op, d.Section, sum, batch.Document, outputs)
	if err != nil {
		return err
	}
	afterJSON, err := json.Marshal(after)
	if err != nil {
		return err
	}
	if err := tx.JobUnblock(ctx, &store.JobUnblockParams{OperationID: op, InputSHA256: sum, ExpectedSHA256: expected,
		AfterJSON: string(afterJSON), NowMS: tx.NowMS()}); err != nil {
		return err
	}
	return ledger.AppendEvent(ctx, tx, wire.EventUnblocked, caller,
		fmt.Sprintf("The %s section is queued: %s, the last section it waited for, completed", d.Section, last.Section),
		map[string]any{"operation_id": op, "section": d.Section, "after": after, "completed": last.OperationID})
}

// Outputs reads the published outputs of the jobs op waits for, in
// section order: as its input names them, and as a deterministic worker
// computes from them. Each must have completed.
func Outputs(ctx context.Context, tx *store.Tx, op string) ([]wire.DependencyOutput, []sections.Output, error) {
	deps, err := tx.JobDependencyList(ctx, op)
	if err != nil {
		return nil, nil, err
	}
	after := make([]wire.DependencyOutput, 0, len(deps))
	bodies := map[string]json.RawMessage{}
	for _, dep := range deps {
		j, err := tx.JobGet(ctx, dep, store.NoLock)
		if err != nil {
			return nil, nil, err
		}
		if j.State != wire.Completed {
			return nil, nil, fmt.Errorf("queue %s: %s, which it waits for, is %s", op, dep, j.State)
		}
		doc, err := tx.DocumentGet(ctx, j.DocumentID, store.NoLock)
		if err != nil {
			return nil, nil, err
		}
		sum := sha256.Sum256(doc.Body)
		after = append(after, wire.DependencyOutput{Section: j.Section, OperationID: dep, DocumentID: j.DocumentID,
			Version: doc.Version, OutputSHA256: hex.EncodeToString(sum[:])})
		bodies[dep] = doc.Body
	}
	slices.SortFunc(after, func(a, b wire.DependencyOutput) int { return cmp.Compare(a.Section, b.Section) })
	outputs := make([]sections.Output, len(after))
	for i, a := range after {
		outputs[i] = sections.Output{Section: a.Section, Body: bodies[a.OperationID]}
	}
	return after, outputs, nil
}
