package jobs_test

import (
	"context"
	"testing"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestSteps: a job's transitions inside a caller's transaction write the
// row and the caller's copy alike; a move CheckMove refuses writes
// nothing; an unknown job is not_found.
func TestSteps(t *testing.T) {
	db, _ := storetest.MustCreate(t)
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 100, CostPerReport: 20}); err != nil {
			return err
		}
		if err := tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1}); err != nil {
			return err
		}
		for i, op := range []string{"op-1", "op-2"} {
			if err := tx.DocumentInsert(ctx, "doc-"+op, 1); err != nil {
				return err
			}
			if err := tx.JobInsert(ctx, &store.JobInsertParams{OperationID: op, Position: int64(i + 1), BatchKey: "b",
				Section: "summary", DocumentID: "doc-" + op, InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 3,
				BackoffBaseMS: 1000, BackoffCapMS: 60000, ExpectedSHA256: "want"}); err != nil {
				return err
			}
		}
		return nil
	})
	read := func(op string) store.Job {
		var j store.Job
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) (err error) {
			j, err = jobs.Get(ctx, tx, op, store.NoLock)
			return err
		})
		return j
	}

	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		j, err := jobs.Get(ctx, tx, "op-1", store.ForUpdate)
		if err != nil {
			return err
		}
		if err := jobs.Cancel(ctx, tx, &j, wire.CancelledBeforeDispatch, "by a test"); err != nil {
			return err
		}
		if j.State != wire.CancelledBeforeDispatch || j.Reason != "by a test" {
			t.Fatalf("the caller's copy after Cancel: %+v", j)
		}
		// A cancelled job is not completed: refused, nothing written.
		if err := jobs.Complete(ctx, tx, &j, "no"); fleet.ErrorCode(err) != wire.CodeStateConflict {
			t.Fatalf("Complete of a cancelled job: %v", err)
		}
		return nil
	})
	if j := read("op-1"); j.State != wire.CancelledBeforeDispatch || j.Reason != "by a test" {
		t.Fatalf("op-1 as stored: %s (%s)", j.State, j.Reason)
	}

	// A queued job does not fail (it was never attempted): refused as a
	// state conflict, the row left queued.
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		j, err := jobs.Get(ctx, tx, "op-2", store.ForUpdate)
		if err != nil {
			return err
		}
		if err := jobs.Fail(ctx, tx, &j, "gave up"); fleet.ErrorCode(err) != wire.CodeStateConflict {
			t.Fatalf("Fail of a queued job: %v", err)
		}
		return nil
	})
	if j := read("op-2"); j.State != wire.Queued || j.Reason != "" {
		t.Fatalf("op-2 as stored: %s (%s)", j.State, j.Reason)
	}
	storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
		if _, err := jobs.Get(ctx, tx, "op-9", store.NoLock); fleet.ErrorCode(err) != wire.CodeNotFound {
			t.Fatalf("an unknown job: %v", err)
		}
		return nil
	})
}
