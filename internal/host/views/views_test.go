package views_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/views"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestViews: what a state of three queued jobs shows: the snapshot and
// the stats agree, a page carries the jobs by state, a job and its
// document read whole, an unknown job, receipt, document or job's events
// is not_found, and the workers view names each worker credential, alive
// once seen within a lease.
func TestViews(t *testing.T) {
	ctx := context.Background()
	stateDir := t.TempDir()
	db, _ := storetest.MustCreate(t)
	kernel, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	db.SetSealer(kernel)
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 100, CostPerReport: 20}); err != nil {
			return err
		}
		if err := tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1}); err != nil {
			return err
		}
		for i, op := range []string{"op-1", "op-2", "op-3"} {
			if err := tx.DocumentInsert(ctx, "doc-"+op, 1); err != nil {
				return err
			}
			if err := tx.JobInsert(ctx, &store.JobInsertParams{OperationID: op, Position: int64(i + 1), BatchKey: "b",
				Section: "summary", DocumentID: "doc-" + op, InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 3,
				BackoffBaseMS: 1000, BackoffCapMS: 60000, ExpectedSHA256: "want"}); err != nil {
				return err
			}
		}
		return access.Insert(ctx, tx, stateDir, "worker-1", access.RoleWorker)
	})
	l := ledger.New(db, kernel)
	creds := access.New(l, stateDir)
	v := views.New(l, creds, time.Minute)

	snap, err := v.Snapshot(ctx)
	if err != nil || len(snap.Jobs) != 3 || snap.Accounting.Available != 100 {
		t.Fatalf("snapshot: %d jobs, %+v (%v)", len(snap.Jobs), snap.Accounting, err)
	}
	stats, err := v.Stats(ctx)
	if err != nil || stats.Jobs[wire.Queued] != 3 || stats.Accounting != snap.Accounting {
		t.Fatalf("stats: %+v (%v)", stats, err)
	}
	page, err := v.JobPage(ctx, wire.JobPageQuery{Limit: 2})
	if err != nil || len(page.Jobs) != 2 || page.Next == "" || page.Counts[wire.Queued] != 3 {
		t.Fatalf("the first page of two: %+v (%v)", page, err)
	}
	empty, err := v.JobPage(ctx, wire.JobPageQuery{State: wire.Failed})
	if err != nil || len(empty.Jobs) != 0 {
		t.Fatalf("a page that matches nothing: %+v (%v)", empty, err)
	}
	if _, err := v.JobPage(ctx, wire.JobPageQuery{State: "sleeping"}); fleet.ErrorCode(err) != wire.CodeInvalid {
		t.Fatalf("a page of no state: %v", err)
	}
	d, err := v.Job(ctx, "op-2")
	if err != nil || d.OperationID != "op-2" || d.State != wire.Queued || d.DocumentID != "doc-op-2" {
		t.Fatalf("job op-2: %+v (%v)", d, err)
	}
	for what, err := range map[string]error{
		"job": func() error { _, err := v.Job(ctx, "op-9"); return err }(),
		"document": func() error {
			_, err := v.Document(ctx, fleet.Caller{ID: "worker-1", Tenants: []string{"team-a"}}, "doc-9")
			return err
		}(),
		"receipt": func() error { _, err := v.Receipt(ctx, "rcpt-0000"); return err }(),
		"events": func() error {
			_, err := v.FindEvents(ctx, wire.EventQuery{Job: "op-9", Before: 10, Limit: 1})
			return err
		}(),
	} {
		if fleet.ErrorCode(err) != wire.CodeNotFound {
			t.Errorf("an unknown %s: %v", what, err)
		}
	}
	workers, err := v.Workers(ctx)
	if err != nil || len(workers.Workers) != 1 || workers.Workers[0].Name != "worker-1" || workers.Workers[0].Alive {
		t.Fatalf("the workers view before any call: %+v (%v)", workers, err)
	}
	if _, _, err := creds.Authenticate(ctx, mustToken(t, stateDir)); err != nil {
		t.Fatal(err)
	}
	if workers, err = v.Workers(ctx); err != nil || !workers.Workers[0].Alive || workers.Workers[0].LastSeenMS == 0 {
		t.Fatalf("the workers view once worker-1 called: %+v (%v)", workers, err)
	}
}

func mustToken(t *testing.T, stateDir string) string {
	t.Helper()
	tok, err := statedir.ReadCredential(statedir.CredentialPath(stateDir, "worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
