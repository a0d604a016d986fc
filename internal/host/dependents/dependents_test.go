package dependents_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/dependents"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

const document = "Fleet notes. The fleet renews its leases.\nSee https://example.com/fleet\n"

// complete runs op through claimed and running to completed, its document
// written with body, as a publication would, and answers it as completed.
func complete(ctx context.Context, tx *store.Tx, op string, body string) (store.Job, error) {
	claimed, err := tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: 1, ClaimPrefix: "c-" + op + ".", Worker: "w1", ClaimHost: "h",
		LeaseExpiresAtMS: tx.NowMS() + 60_000, NowMS: tx.NowMS()})
	if err != nil || len(claimed) != 1 || claimed[0].OperationID != op {
		return store.Job{}, err
	}
	if err := tx.JobSetRunning(ctx, &store.JobSetRunningParams{OperationID: op, IfClaimID: claimed[0].ClaimID, ReserveShard: -1,
		TenantShard: -1, LeaseExpiresAtMS: tx.NowMS() + 60_000, Reason: "admitted", NowMS: tx.NowMS()}); err != nil {
		return store.Job{}, err
	}
	if err := tx.DocumentWrite(ctx, &store.DocumentWriteParams{ID: "doc-" + op, Body: []byte(body), Version: 1, AtMS: tx.NowMS()}); err != nil {
		return store.Job{}, err
	}
	if err := tx.JobComplete(ctx, &store.JobCompleteParams{OperationID: op, IfState: wire.Running, Reason: "published", NowMS: tx.NowMS()}); err != nil {
		return store.Job{}, err
	}
	return tx.JobGet(ctx, op, store.ForUpdate)
}

// TestRelease, on both backends: an overview waiting for terms and links
// stays blocked when terms completes, and when links completes is queued
// with its input naming both outputs in section order (version and
// digest), its input digest covering them, and the digest of the body a
// deterministic worker computes from them.
func TestRelease(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		db, _ := storetest.MustCreate(t)
		kernel, err := receipts.NewKernel()
		if err != nil {
			t.Fatal(err)
		}
		db.SetSealer(kernel)
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			if err := tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "sha", Document: document, CreatedMS: 1}); err != nil {
				return err
			}
			if err := tx.DocumentInsertMany(ctx, []string{"doc-terms", "doc-links", "doc-overview"}, 1); err != nil {
				return err
			}
			if err := tx.JobInsertMany(ctx, []store.JobInsertParams{
				{OperationID: "terms", Position: 1, BatchKey: "b", Section: "terms", DocumentID: "doc-terms", InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1, Dependents: 1},
				{OperationID: "links", Position: 2, BatchKey: "b", Section: "links", DocumentID: "doc-links", InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1, Dependents: 1},
				{OperationID: "overview", Position: 3, BatchKey: "b", Section: "overview", DocumentID: "doc-overview", InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1, WaitingOn: 2},
			}); err != nil {
				return err
			}
			return tx.JobDependencyInsertMany(ctx, []store.JobDependency{{OperationID: "overview", DependsOn: "terms"}, {OperationID: "overview", DependsOn: "links"}})
		})
		terms, links := `{"result":{"terms":[{"count":2,"word":"fleet"}]}}`, `{"result":{"links":["https://example.com/fleet"]}}`
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			j, err := complete(ctx, tx, "terms", terms)
			if err != nil {
				return err
			}
			return dependents.Release(ctx, tx, "w1", j)
		})
		var overview store.Job
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) (err error) {
			overview, err = tx.JobGet(ctx, "overview", store.NoLock)
			return err
		})
		if overview.State != wire.Blocked || overview.WaitingOn != 1 {
			t.Fatalf("the overview once terms completed: %+v", overview)
		}
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			j, err := complete(ctx, tx, "links", links)
			if err != nil {
				return err
			}
			if err := dependents.Release(ctx, tx, "w1", j); err != nil {
				return err
			}
			overview, err = tx.JobGet(ctx, "overview", store.NoLock)
			return err
		})
		in := jobs.InputOf(overview, document)
		if overview.State != wire.Queued || len(in.After) != 2 || in.After[0].Section != "links" || in.After[1].Section != "terms" ||
			in.After[0].Version != 1 || in.After[0].OutputSHA256 != digest(links) || in.After[1].OutputSHA256 != digest(terms) {
			t.Fatalf("the overview once both completed: %+v, input %+v", overview, in.After)
		}
		sum, err := jobs.InputSHA256(in)
		if err != nil || sum != overview.InputSHA256 {
			t.Fatalf("the overview's input digest %s, its input's %s (%v)", overview.InputSHA256, sum, err)
		}
		outputs := []sections.Output{{Section: "links", Body: json.RawMessage(links)}, {Section: "terms", Body: json.RawMessage(terms)}}
		want, err := jobs.ExpectedDigest("overview", "overview", sum, document, outputs)
		if err != nil || want != overview.ExpectedSHA256 {
			t.Fatalf("the overview's expected digest %s, want %s (%v)", overview.ExpectedSHA256, want, err)
		}
		body, err := sections.BodyAfter("overview", "overview", sum, document, outputs)
		var pub struct {
			Result struct {
				From []map[string]string `json:"from"`
			} `json:"result"`
		}
		if err != nil || json.Unmarshal(body, &pub) != nil || len(pub.Result.From) != 2 ||
			pub.Result.From[0]["line"] != "1 links" || pub.Result.From[1]["line"] != "terms: fleet" {
			t.Fatalf("the overview's body: %s (%v)", body, err)
		}
	})
}

func digest(body string) string { return fleet.DigestHex([]byte(body)) }
