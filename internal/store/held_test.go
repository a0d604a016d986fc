package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// queueJobs queues a job for each of ops, op i+1 on document doc-i+1.
func queueJobs(t *testing.T, db *store.DB, ops []string) {
	t.Helper()
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1}); err != nil {
			return err
		}
		for i, op := range ops {
			doc := fmt.Sprint("doc-", i+1)
			if err := tx.DocumentInsert(ctx, doc, 1); err != nil {
				return err
			}
			if err := tx.JobInsert(ctx, &store.JobInsertParams{OperationID: op, Position: int64(i + 1), BatchKey: "b",
				Section: "summary", DocumentID: doc, InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 3,
				BackoffBaseMS: 1000, BackoffCapMS: 60000, ExpectedSHA256: "want"}); err != nil {
				return err
			}
		}
		return nil
	})
}

// TestHeldWrites: in a batch whose reads went ahead, the items' mutations
// and operation records are written at its end, one statement per kind,
// and an item refused after writing leaves none of its own.
func TestHeldWrites(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		db, _ := storetest.MustCreate(t)
		ops := []string{"op-1", "op-2", "op-3"}
		queueJobs(t, db, ops)
		refused := errors.New("refused")
		record := func(doc, key string) (store.Mutation, store.StoredOperation) {
			return store.Mutation{DocumentID: doc, Version: 1, OperationKey: key, Caller: "w", AtMS: 5},
				store.StoredOperation{Binding: []byte(`{}`), CreatedMS: 5, Operation: wire.Operation{DocumentID: doc,
					OperationKey: key, Caller: "w", Status: wire.StatusPublished, Outcome: json.RawMessage(`{"version":1}`), Deliveries: 1}}
		}
		var itemStatements, heldStatements int64
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			if err := tx.ReadAhead(ctx, ops, []string{"k1", "k2", "k3"}); err != nil {
				return err
			}
			before := tx.Statements()
			for i, op := range ops {
				itemErr, fatal := tx.Item(ctx, i, func() error {
					j, err := tx.JobGet(ctx, op, store.ForUpdate)
					if err != nil {
						return err
					}
					key := fmt.Sprint("k", i+1)
					if _, err := tx.OperationGet(ctx, j.DocumentID, key); !store.IsNotFound(err) {
						return fmt.Errorf("operation %s read ahead as %v", key, err)
					}
					m, o := record(j.DocumentID, key)
					if err := tx.MutationInsert(ctx, m); err != nil {
						return err
					}
					if err := tx.OperationInsert(ctx, o); err != nil {
						return err
					}
					if i == 1 {
						return refused
					}
					return nil
				}, func(err error) bool { return errors.Is(err, refused) })
				if fatal != nil || (itemErr != nil) != (i == 1) {
					t.Fatalf("item %d: %v, %v", i, itemErr, fatal)
				}
			}
			itemStatements = tx.Statements() - before
			if err := tx.WriteHeld(ctx); err != nil {
				return err
			}
			heldStatements = tx.Statements() - before - itemStatements
			return nil
		})
		if heldStatements != 2 {
			t.Errorf("the held writes took %d statements, want 2 (one per kind)", heldStatements)
		}
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			for i := range ops {
				doc := fmt.Sprint("doc-", i+1)
				ms, err := tx.MutationList(ctx, doc)
				if err != nil {
					return err
				}
				os, err := tx.OperationList(ctx, doc)
				if err != nil {
					return err
				}
				m, o := record(doc, fmt.Sprint("k", i+1))
				if i == 1 {
					if len(ms) != 0 || len(os) != 0 {
						t.Errorf("the refused item left %+v, %+v", ms, os)
					}
					continue
				}
				if len(ms) != 1 || ms[0] != m || len(os) != 1 || os[0].OperationKey != o.OperationKey || string(os[0].Outcome) != string(o.Outcome) {
					t.Errorf("item %d wrote %+v, %+v", i, ms, os)
				}
			}
			return nil
		})
		t.Logf("items ran %d statements (their savepoints), the held writes %d", itemStatements, heldStatements)
	})
}

// TestHeldCompletions: in a batch whose reads went ahead, the items' job
// completions and document writes are written at its end, one statement
// per kind on PostgreSQL (a statement a row on SQLite); a later read of a
// completed job or its document in the request sees them as written, and
// an item refused after writing leaves its job and document as they were.
func TestHeldCompletions(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		db, _ := storetest.MustCreate(t)
		ops := []string{"op-1", "op-2", "op-3"}
		queueJobs(t, db, ops)
		refused := errors.New("refused")
		var itemStatements, heldStatements int64
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			if err := tx.ReadAhead(ctx, ops, nil); err != nil {
				return err
			}
			before := tx.Statements()
			for i, op := range ops {
				itemErr, fatal := tx.Item(ctx, i, func() error {
					j, err := tx.JobGet(ctx, op, store.ForUpdate)
					if err != nil {
						return err
					}
					if err := tx.JobComplete(ctx, &store.JobCompleteParams{OperationID: op, IfState: j.State, Reason: "published", NowMS: 7}); err != nil {
						return err
					}
					if err := tx.DocumentWrite(ctx, &store.DocumentWriteParams{ID: j.DocumentID, Body: []byte(`{"n":1}`), Version: 1, AtMS: 7}); err != nil {
						return err
					}
					if i == 1 {
						return refused
					}
					return nil
				}, func(err error) bool { return errors.Is(err, refused) })
				if fatal != nil || (itemErr != nil) != (i == 1) {
					t.Fatalf("item %d: %v, %v", i, itemErr, fatal)
				}
			}
			// What waits for a completed job reads it back (its dependents'
			// outputs): completed, though not yet written.
			for i, op := range ops {
				j, err := tx.JobGet(ctx, op, store.NoLock)
				if err != nil {
					return err
				}
				if want := map[bool]wire.JobState{true: wire.Queued, false: wire.Completed}[i == 1]; j.State != want {
					t.Errorf("%s read back in the request as %s, want %s", op, j.State, want)
				}
				d, err := tx.DocumentGet(ctx, j.DocumentID, store.NoLock)
				if err != nil {
					return err
				}
				if want := map[bool]int64{true: 0, false: 1}[i == 1]; d.Version != want || j.DocumentVersion != want {
					t.Errorf("%s's document read back in the request at version %d (the job says %d), want %d", op, d.Version, j.DocumentVersion, want)
				}
			}
			itemStatements = tx.Statements() - before
			if err := tx.WriteHeld(ctx); err != nil {
				return err
			}
			heldStatements = tx.Statements() - before - itemStatements
			return nil
		})
		// On PostgreSQL one statement each, and the switch to their generic
		// plans (postgres.statementPlans).
		if want := map[bool]int64{true: 3, false: 4}[storetest.OnPostgres(t)]; heldStatements != want {
			t.Errorf("the held completions and document writes took %d statements, want %d", heldStatements, want)
		}
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			for i, op := range ops {
				j, err := tx.JobGet(ctx, op, store.NoLock)
				if err != nil {
					return err
				}
				want := wire.Completed
				if i == 1 {
					want = wire.Queued
				}
				if j.State != want || (want == wire.Completed && (j.Reason != "published" || j.FinishedAtMS != 7 || j.DocumentVersion != 1)) ||
					(want == wire.Queued && j.DocumentVersion != 0) {
					t.Errorf("%s after the batch: %+v", op, j)
				}
			}
			return nil
		})
	})
}
