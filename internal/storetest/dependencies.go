package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// testDependencies: a report whose summary waits for its terms and links.
// A job inserted waiting is blocked, counts its dependents, and no claim
// takes it; each dependency's completion counts one fewer, and only the
// last names it; it is queued, with its input, only once it waits for
// none (ErrGuard before), claimable from then.
func testDependencies(t *testing.T, s *suite) {
	f := s.setup(t)
	jobs := []store.JobInsertParams{
		{OperationID: "op-d1", Position: 11, BatchKey: "b", Section: "terms", DocumentID: "doc-d1", InputSHA256: "in-1", CreatedAtMS: 4,
			MaxAttempts: 1, Dependents: 1},
		{OperationID: "op-d2", Position: 12, BatchKey: "b", Section: "links", DocumentID: "doc-d2", InputSHA256: "in-2", CreatedAtMS: 4,
			MaxAttempts: 1, Dependents: 1},
		{OperationID: "op-d3", Position: 13, BatchKey: "b", Section: "summary", DocumentID: "doc-d3", InputSHA256: "in-3", CreatedAtMS: 4,
			MaxAttempts: 1, WaitingOn: 2},
	}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.DocumentInsertMany(ctx, []string{"doc-d1", "doc-d2", "doc-d3"}, 4); err != nil {
			return err
		}
		if err := tx.JobInsertMany(ctx, jobs); err != nil {
			return err
		}
		return tx.JobDependencyInsertMany(ctx, []store.JobDependency{{OperationID: "op-d3", DependsOn: "op-d2"}, {OperationID: "op-d3", DependsOn: "op-d1"}})
	})
	if j := f.job("op-d3"); j.State != wire.Blocked || j.WaitingOn != 2 || j.Dependents != 0 {
		t.Fatalf("a job waiting for two: %+v", j)
	}
	if j := f.job("op-d1"); j.State != wire.Queued || j.WaitingOn != 0 || j.Dependents != 1 {
		t.Fatalf("a job one waits for: %+v", j)
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.JobDependencyList(ctx, "op-d3")); !reflect.DeepEqual(got, []string{"op-d1", "op-d2"}) {
			t.Fatalf("op-d3's dependencies: %v", got)
		}
		if got := must(tx.JobDependencyList(ctx, "op-d1")); len(got) != 0 {
			t.Fatalf("op-d1's dependencies: %v", got)
		}
		return nil
	})
	// Every claimable job is claimed (the fixture's and two of these), not
	// the blocked one.
	for _, c := range f.claim("w1", 10, 500) {
		if c.OperationID == "op-d3" {
			t.Fatal("a blocked job was claimed")
		}
	}
	unblock := func(ctx context.Context, tx *store.Tx) error {
		return tx.JobUnblock(ctx, &store.JobUnblockParams{OperationID: "op-d3", InputSHA256: "in-3b", ExpectedSHA256: "want-3",
			AfterJSON: `[{"section":"links"}]`, NowMS: 9})
	}
	f.guardFails("unblocking a job still waiting", "op-d3", unblock)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.JobReleaseDependents(ctx, &store.JobReleaseDependentsParams{DependsOn: "op-d1", NowMS: 20})); len(got) != 0 {
			return fmt.Errorf("after one of two dependencies: %v", got)
		}
		if got := must(tx.JobReleaseDependents(ctx, &store.JobReleaseDependentsParams{DependsOn: "op-none", NowMS: 20})); len(got) != 0 {
			return fmt.Errorf("a job nobody waits for: %v", got)
		}
		if got := must(tx.JobReleaseDependents(ctx, &store.JobReleaseDependentsParams{DependsOn: "op-d2", NowMS: 20})); !reflect.DeepEqual(got, []string{"op-d3"}) {
			return fmt.Errorf("after the second: %v", got)
		}
		return unblock(ctx, tx)
	})
	j := f.job("op-d3")
	if j.State != wire.Queued || j.WaitingOn != 0 || j.InputSHA256 != "in-3b" || j.ExpectedSHA256 != "want-3" ||
		j.AfterJSON != `[{"section":"links"}]` || j.ClaimableAtMS != 9 {
		t.Fatalf("the job once both completed: %+v", j)
	}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		// Released again (a completion counted twice would be a bug): a
		// queued job is not counted down.
		got := must(tx.JobReleaseDependents(ctx, &store.JobReleaseDependentsParams{DependsOn: "op-d2", NowMS: 40}))
		if len(got) != 0 {
			return fmt.Errorf("a queued job released again: %v", got)
		}
		return nil
	})
	if got := f.claim("w1", 10, 500); len(got) != 1 || got[0].OperationID != "op-d3" || got[0].InputSHA256 != "in-3b" {
		t.Fatalf("the claim after: %+v", got)
	}
	if err := f.writeErr(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobDependencyInsertMany(ctx, []store.JobDependency{{OperationID: "op-d3", DependsOn: "op-d1"}})
	}); err == nil || errors.Is(err, store.ErrGuard) {
		t.Fatalf("a dependency recorded twice: %v", err)
	}
}
