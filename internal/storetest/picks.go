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

// A claim that admits picks its jobs without writing them and writes each
// once, claimed and admitted (held.go): these check that what it leaves is
// exactly what a claim and then its admissions leave.

// pickParams is the claim the pick tests make, at nowMS 10.
func pickParams(max int) *store.JobClaimManyParams {
	return &store.JobClaimManyParams{Max: max, ClaimPrefix: "c-w1.", Worker: "w1", ClaimHost: "host-w1", LeaseExpiresAtMS: 500, NowMS: 10}
}

func testJobPickMany(t *testing.T, s *suite) {
	// The pick answers what the claim would have, leaves the rows queued,
	// passes over those named, and assigns and records the documents.
	claimed := s.setup(t).claim("w1", 3, 500)
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		two := must(tx.JobPickMany(ctx, pickParams(2), nil))
		if !reflect.DeepEqual(two, claimed[:2]) {
			t.Fatalf("picked\n%+v\nwhere the claim answered\n%+v", two, claimed[:2])
		}
		if j := must(tx.JobGet(ctx, "op-1", store.ForUpdate)); j.State != wire.Queued || j.ClaimID != "" {
			t.Fatalf("a picked job's row was written: %+v", j)
		}
		rest := must(tx.JobPickMany(ctx, pickParams(5), []string{"op-1", "op-2"}))
		if !reflect.DeepEqual(rest, claimed[2:]) {
			t.Fatalf("picked past op-1 and op-2\n%+v\nwant\n%+v", rest, claimed[2:])
		}
		return nil
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		as := must(tx.AssignmentList(ctx, "doc-3"))
		if len(as) != 1 || as[0].Owner != "w1" || as[0].Generation != 1 || as[0].Reason != "claim" || as[0].AtMS != 10 {
			t.Fatalf("doc-3's assignments %+v", as)
		}
		return nil
	})

	// Another transaction's pick passes over the rows a pick holds.
	s.setup(t).takenOnce(func(ctx context.Context, c store.Conn, worker string) ([]store.ClaimedJob, error) {
		return c.JobPickMany(ctx, &store.JobClaimManyParams{Max: 2, ClaimPrefix: worker + ".", Worker: worker, ClaimHost: "h", LeaseExpiresAtMS: 50, NowMS: 10}, nil)
	})
}

func testJobClaimWriteMany(t *testing.T, s *suite) {
	running := func(c store.ClaimedJob) *store.JobSetRunningParams {
		return &store.JobSetRunningParams{OperationID: c.OperationID, IfClaimID: c.ClaimID, Reserved: 20, ReserveShard: 3, TenantShard: 5,
			ReserveCredential: "agent-1", Admission: []byte(`{"decision":"allow"}`), LeaseExpiresAtMS: 600, Reason: "admitted", NowMS: 10}
	}
	refused := func(c store.ClaimedJob) *store.JobSetRefusedParams {
		return &store.JobSetRefusedParams{OperationID: c.OperationID, IfClaimID: c.ClaimID, Admission: []byte(`{"decision":"deny"}`),
			Reason: "over budget", NowMS: 10}
	}
	// Twice: claimed, then the first admitted, the second refused, the
	// third left claimed; once: the same, the claim's rows held
	// (HoldClaims). A claim of one is written by a statement of its own on
	// PostgreSQL, so both sizes are compared.
	decide := func(ctx context.Context, tx *store.Tx, c []store.ClaimedJob) error {
		if err := tx.JobSetRunning(ctx, running(c[0])); err != nil || len(c) < 2 {
			return err
		}
		return tx.JobSetRefused(ctx, refused(c[1]))
	}
	for _, n := range []int{1, 3} {
		twice := s.setup(t)
		twice.write(func(ctx context.Context, tx *store.Tx) error {
			return decide(ctx, tx, must(tx.JobClaimMany(ctx, pickParams(n))))
		})
		once := s.setup(t)
		once.write(func(ctx context.Context, tx *store.Tx) error {
			tx.HoldClaims()
			c := must(tx.JobClaimMany(ctx, pickParams(min(n, 2))))
			c = append(c, must(tx.JobClaimMany(ctx, pickParams(n-len(c))))...) // the next pick passes over those held
			if len(c) != n {
				t.Fatalf("the held claims took %v, want %d", claimedIDs(c), n)
			}
			return decide(ctx, tx, c)
		})
		for _, op := range []string{"op-1", "op-2", "op-3"} {
			if a, b := twice.job(op), once.job(op); !reflect.DeepEqual(a, b) {
				t.Fatalf("%s of %d written once\n%+v\nwritten twice\n%+v", op, n, b, a)
			}
		}
	}

	// An admission under another claim than the pick's fails the
	// transaction, as the admission's own guard would.
	g := s.setup(t)
	err := g.writeErr(func(ctx context.Context, tx *store.Tx) error {
		tx.HoldClaims()
		c := must(tx.JobClaimMany(ctx, pickParams(1)))
		p := running(c[0])
		p.IfClaimID = "other"
		return tx.JobSetRunning(ctx, p)
	})
	if !errors.Is(err, store.ErrGuard) {
		t.Fatalf("an admission under another claim: %v", err)
	}
	if j := g.job("op-1"); j.State != wire.Queued {
		t.Fatalf("a failed claim left op-1 %s", j.State)
	}
	// A job no longer queued is not written.
	done := g.claim("w1", 1, 500)
	g.guardFails("writing a claimed job as picked", done[0].OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobClaimWriteMany(ctx, []store.Job{done[0].Job})
	})
}

func testClaimUnlessPaused(t *testing.T, s *suite) {
	// A claim asked to take nothing while claims are paused reads the
	// pause in its own statement: with the claims setting paused it takes
	// and assigns nothing, whether it writes the jobs or only picks them;
	// with it resumed, or when not asked, it claims as usual. (Counted in
	// the transaction, checked after it: a test that stops inside SQLite's
	// one writer would stop the writer.)
	unless := func(max int) *store.JobClaimManyParams {
		p := pickParams(max)
		p.UnlessPaused = true
		return p
	}
	for _, c := range []struct {
		setting string
		paused  bool
	}{{`{"paused":true,"reason":"maintenance","by":"operator","at_ms":5}`, true}, {`{"paused":false,"at_ms":6}`, false}, {"", false}} {
		f := s.setup(t)
		var picked, claimed, asked []store.ClaimedJob
		f.write(func(ctx context.Context, tx *store.Tx) error {
			if c.setting != "" {
				if err := tx.SettingPut(ctx, store.ClaimsSetting, c.setting); err != nil {
					return err
				}
			}
			var err error
			if picked, err = tx.JobPickMany(ctx, unless(2), nil); err != nil {
				return err
			}
			if claimed, err = tx.JobClaimMany(ctx, unless(2)); err != nil {
				return err
			}
			asked, err = tx.JobPickMany(ctx, pickParams(1), nil)
			return err
		})
		want := 2
		if c.paused {
			want = 0
		}
		if len(picked) != want || len(claimed) != want {
			t.Fatalf("with claims %q, a claim unless paused picked %d and claimed %d jobs, want %d each", c.setting, len(picked), len(claimed), want)
		}
		if len(asked) != 1 {
			t.Fatalf("with claims %q, a claim not asked to heed the pause picked %d jobs, want 1", c.setting, len(asked))
		}
		if !c.paused {
			continue
		}
		var doc1, doc2 []store.Assignment
		f.read(func(ctx context.Context, tx *store.Tx) (err error) {
			if doc1, err = tx.AssignmentList(ctx, "doc-1"); err == nil {
				doc2, err = tx.AssignmentList(ctx, "doc-2")
			}
			return err
		})
		if len(doc1) != 1 || len(doc2) != 0 {
			t.Fatalf("while paused doc-1 was assigned %d times, want once (by the claim not asked to heed the pause), and doc-2 %d, want 0", len(doc1), len(doc2))
		}
	}
}

func testPickForOwners(t *testing.T, s *suite) {
	// A pick for several claims at once gives its jobs to their owners,
	// one an owner, across picks of the same transaction; the documents
	// are assigned and the assignments recorded to each job's owner, and
	// the held rows are written for them.
	owners := []store.ClaimOwner{{Worker: "w1", ClaimPrefix: "k1."}, {Worker: "w2", ClaimPrefix: "k2."}, {Worker: "w2", ClaimPrefix: "k2."}}
	f := s.setup(t)
	var picked []store.ClaimedJob
	f.write(func(ctx context.Context, tx *store.Tx) error {
		p := pickParams(2)
		p.Owners = owners
		first, err := tx.JobPickMany(ctx, p, nil)
		if err != nil {
			return err
		}
		p = pickParams(1)
		p.Owners = owners[2:]
		rest, err := tx.JobPickMany(ctx, p, []string{"op-1", "op-2"})
		picked = append(first, rest...)
		return err
	})
	// Which job goes to which owner is the backend's: each owner gets one,
	// under its own prefix, and its document is assigned to it.
	prefixes := map[string]string{"w1": "k1.", "w2": "k2."}
	checkOwned := func(what string, jobs []store.Job) {
		t.Helper()
		got := map[string]int{}
		for _, j := range jobs {
			got[j.Worker]++
			if p, ok := prefixes[j.Worker]; !ok || j.ClaimID != fmt.Sprint(p, j.Position) || j.Owner != j.Worker || j.State != wire.Claimed {
				t.Fatalf("%s: %s for %s under %s (%s), owner %s", what, j.OperationID, j.Worker, j.ClaimID, j.State, j.Owner)
			}
		}
		if len(jobs) != 3 || got["w1"] != 1 || got["w2"] != 2 {
			t.Fatalf("%s: %d jobs, by worker %v; want w1 1 and w2 2", what, len(jobs), got)
		}
	}
	held := make([]store.Job, len(picked))
	for i, j := range picked {
		held[i] = j.Job
		if j.Generation != 1 || j.ClaimHost != "host-w1" || j.LeaseExpiresAtMS != 500 {
			t.Fatalf("picked %+v", j.Job)
		}
	}
	checkOwned("picked", held)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		for _, j := range picked {
			as := must(tx.AssignmentList(ctx, j.DocumentID))
			if len(as) != 1 || as[0].Owner != j.Worker || as[0].Generation != 1 || as[0].Reason != "claim" {
				return fmt.Errorf("%s's assignments %+v, want one to %s", j.DocumentID, as, j.Worker)
			}
			if d := must(tx.DocumentGet(ctx, j.DocumentID, store.NoLock)); d.Owner != j.Worker || d.Generation != 1 {
				return fmt.Errorf("%s is %s's at %d, want %s's at 1", j.DocumentID, d.Owner, d.Generation, j.Worker)
			}
		}
		return nil
	})

	g := s.setup(t)
	g.write(func(ctx context.Context, tx *store.Tx) error {
		tx.HoldClaims()
		p := pickParams(3)
		p.Owners = owners
		_, err := tx.JobClaimMany(ctx, p)
		return err
	})
	checkOwned("written", []store.Job{g.job("op-1"), g.job("op-2"), g.job("op-3")})

	// A claim that writes its rows in its own statement is one worker's:
	// asked for several, it fails and takes nothing.
	h := s.setup(t)
	err := h.refused("a claim that writes its rows, for several owners", func(ctx context.Context, tx *store.Tx) error {
		p := pickParams(1)
		p.Owners = owners
		_, err := tx.JobClaimMany(ctx, p)
		return err
	})
	if j := h.job("op-1"); j.State != wire.Queued {
		t.Fatalf("the refused claim (%v) left op-1 %s", err, j.State)
	}
}
