package storetest

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/wire"
)

func testBatch(t *testing.T, s *suite) {
	f := s.setup(t)
	f.refused("one idempotency key twice", func(ctx context.Context, tx *store.Tx) error {
		return tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "other", Document: "x", CreatedMS: 2})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		b := must(tx.BatchGet(ctx, "b"))
		ops := must(tx.JobListByBatch(ctx, "b"))
		if b != (store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1}) || !reflect.DeepEqual(ops, []string{"op-1", "op-2", "op-3"}) {
			t.Fatalf("batch %+v, jobs %v", b, ops)
		}
		if _, err := tx.BatchGet(ctx, "nope"); !store.IsNotFound(err) {
			t.Fatalf("an absent batch: %v", err)
		}
		if none := must(tx.JobListByBatch(ctx, "nope")); len(none) != 0 {
			t.Fatalf("an absent batch's jobs: %v", none)
		}
		return nil
	})
}

func testJobMaxPosition(t *testing.T, s *suite) {
	f := s.setup(t)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if tail := must(tx.JobMaxPosition(ctx)); tail != 3 {
			t.Fatalf("queue tail %d", tail)
		}
		return nil
	})
	empty := &fixture{t: t, location: s.newLocation(t)}
	db, err := backend.Create(context.Background(), empty.location)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	empty.db = db
	empty.read(func(ctx context.Context, tx *store.Tx) error {
		if tail := must(tx.JobMaxPosition(ctx)); tail != 0 {
			t.Fatalf("an empty queue's tail %d", tail)
		}
		return nil
	})
}

func testJobInsertGet(t *testing.T, s *suite) {
	f := s.setup(t)
	j := f.job("op-2")
	want := store.Job{OperationID: "op-2", Position: 2, BatchKey: "b", Section: "summary", DocumentID: "doc-2", InputSHA256: "in",
		State: wire.Queued, ReserveShard: -1, CreatedAtMS: 1, UpdatedAtMS: 1, MaxAttempts: 3, BackoffBaseMS: 1000,
		BackoffCapMS: 60000, ClaimableAtMS: 1, ExpectedSHA256: "want-2", Priority: wire.DefaultPriority,
		Tenant: wire.DefaultTenant, TenantShard: -1}
	if !reflect.DeepEqual(j, want) {
		t.Fatalf("job\n%+v\nwant\n%+v", j, want)
	}
	// A priority given is kept; none (0) is the default.
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.DocumentInsert(ctx, "doc-8", 1); err != nil {
			return err
		}
		return tx.JobInsert(ctx, &store.JobInsertParams{OperationID: "op-8", Position: 8, BatchKey: "b", Section: "summary",
			DocumentID: "doc-8", InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1, Priority: 4})
	})
	if got := f.job("op-8").Priority; got != 4 {
		t.Fatalf("a job queued at priority 4 reads back at %d", got)
	}
	f.refused("a job whose document does not exist", func(ctx context.Context, tx *store.Tx) error {
		return tx.JobInsert(ctx, &store.JobInsertParams{OperationID: "op-9", Position: 9, BatchKey: "b", Section: "summary",
			DocumentID: "doc-9", InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1})
	})
	f.refused("one position twice", func(ctx context.Context, tx *store.Tx) error {
		if err := tx.DocumentInsert(ctx, "doc-9", 1); err != nil {
			return err
		}
		return tx.JobInsert(ctx, &store.JobInsertParams{OperationID: "op-9", Position: 3, BatchKey: "b", Section: "summary",
			DocumentID: "doc-9", InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.JobGet(ctx, "op-2", store.ForUpdate)); !reflect.DeepEqual(got, want) {
			t.Fatalf("locked read %+v", got)
		}
		if _, err := tx.JobGet(ctx, "nope", store.ForUpdate); !store.IsNotFound(err) {
			t.Fatalf("an absent job: %v", err)
		}
		return nil
	})
}

func testJobInsertMany(t *testing.T, s *suite) {
	// Each job as JobInsert queues it, its priority given or the default;
	// a job whose document does not exist refuses them all.
	f := s.setup(t)
	many := []store.JobInsertParams{
		{OperationID: "op-7", Position: 7, BatchKey: "b", Section: "terms", DocumentID: "doc-7", InputSHA256: "in-7", CreatedAtMS: 4,
			MaxAttempts: 5, BackoffBaseMS: 10, BackoffCapMS: 20, ExpectedSHA256: "want-7", Priority: 1, Tenant: "team-a"},
		{OperationID: "op-8", Position: 8, BatchKey: "b", Section: "links", DocumentID: "doc-8", InputSHA256: "in-8", CreatedAtMS: 4,
			MaxAttempts: 3, BackoffBaseMS: 1000, BackoffCapMS: 60000},
	}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.DocumentInsertMany(ctx, []string{"doc-7", "doc-8"}, 4); err != nil {
			return err
		}
		return tx.JobInsertMany(ctx, many)
	})
	for _, p := range many {
		want := store.Job{OperationID: p.OperationID, Position: p.Position, BatchKey: "b", Section: p.Section, DocumentID: p.DocumentID,
			InputSHA256: p.InputSHA256, State: wire.Queued, ReserveShard: -1, CreatedAtMS: 4, UpdatedAtMS: 4, MaxAttempts: p.MaxAttempts,
			BackoffBaseMS: p.BackoffBaseMS, BackoffCapMS: p.BackoffCapMS, ClaimableAtMS: 4, ExpectedSHA256: p.ExpectedSHA256,
			Priority: p.PriorityOrDefault(), Tenant: p.TenantOrDefault(), TenantShard: -1}
		if got := f.job(p.OperationID); !reflect.DeepEqual(got, want) {
			t.Fatalf("job\n%+v\nwant\n%+v", got, want)
		}
	}
	f.refused("a list holding a job without its document", func(ctx context.Context, tx *store.Tx) error {
		if err := tx.DocumentInsert(ctx, "doc-9", 1); err != nil {
			return err
		}
		return tx.JobInsertMany(ctx, []store.JobInsertParams{
			{OperationID: "op-9", Position: 9, BatchKey: "b", Section: "summary", DocumentID: "doc-9", InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1},
			{OperationID: "op-10", Position: 10, BatchKey: "b", Section: "summary", DocumentID: "doc-none", InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1}})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.JobGet(ctx, "op-9", store.NoLock); !store.IsNotFound(err) {
			t.Fatalf("a refused list left op-9: %v", err)
		}
		return nil
	})
}

func testJobGetMany(t *testing.T, s *suite) {
	// The jobs that exist, each as JobGet reads it, in operation id order;
	// where there are several writers, locked until the reader ends.
	f := s.setup(t)
	ctx := context.Background()
	first := must(f.db.Driver().BeginWrite(ctx))
	defer first.Rollback()
	got := must(first.JobGetMany(ctx, []string{"op-3", "nope", "op-1"}))
	want := []store.Job{must(first.JobGet(ctx, "op-1", store.NoLock)), must(first.JobGet(ctx, "op-3", store.NoLock))}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("jobs\n%+v\nwant\n%+v", got, want)
	}
	if none := must(first.JobGetMany(ctx, []string{"nope"})); len(none) != 0 {
		t.Fatalf("an absent job read as %+v", none)
	}
	if f.db.Driver().Writers() > 1 {
		second := must(f.db.Driver().BeginWrite(ctx)) // only the locked read is bounded: beginning may wait on a loaded machine
		defer second.Rollback()
		waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, err := second.JobGet(waitCtx, "op-3", store.ForUpdate); err == nil {
			t.Fatal("a locked read of a job read many went through while its reader held it")
		}
		second.Rollback()
	}
	first.Rollback()
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if j := must(tx.JobGet(ctx, "op-3", store.ForUpdate)); j.OperationID != "op-3" {
			t.Fatalf("after the reader ended: %+v", j)
		}
		return nil
	})
}

func testJobClaimMany(t *testing.T, s *suite) {
	f := s.setup(t)
	// op-1 backs off until 100: it is passed over before then, and the
	// first to claim after (claimable first, then queue order).
	f.write(func(ctx context.Context, tx *store.Tx) error {
		c := must(tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: 1, ClaimPrefix: "x.", Worker: "w0", ClaimHost: "h", LeaseExpiresAtMS: 50, NowMS: 5}))
		return tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: c[0].OperationID, IfState: wire.Claimed, Worker: "w0",
			Attempts: 1, ClaimableAtMS: 100, LastError: "boom", Reason: "retry", NowMS: 6})
	})
	for _, step := range []struct {
		nowMS int64
		max   int
		want  []string
	}{{50, 10, []string{"op-2", "op-3"}}, {99, 10, []string{}}, {100, 10, []string{"op-1"}}, {1000, 10, []string{}}} {
		var got []store.ClaimedJob
		f.write(func(ctx context.Context, tx *store.Tx) (err error) {
			got, err = tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: step.max, ClaimPrefix: fmt.Sprint("k", step.nowMS, "."),
				Worker: "w1", ClaimHost: "host-a", LeaseExpiresAtMS: step.nowMS + 30, NowMS: step.nowMS})
			return err
		})
		if !reflect.DeepEqual(claimedIDs(got), step.want) {
			t.Fatalf("at %d claimed %v, want %v", step.nowMS, claimedIDs(got), step.want)
		}
		for _, c := range got {
			stored := f.job(c.OperationID)
			wantClaim := fmt.Sprint("k", step.nowMS, ".", c.Position)
			if !reflect.DeepEqual(c.Job, stored) || c.BatchDocument != "text" || c.State != wire.Claimed || c.ClaimID != wantClaim ||
				c.Worker != "w1" || c.Owner != "w1" || c.ClaimHost != "host-a" || c.LeaseExpiresAtMS != step.nowMS+30 || c.UpdatedAtMS != step.nowMS {
				t.Fatalf("claimed %+v\nstored %+v", c, stored)
			}
			if c.OperationID == "op-1" && (c.Attempts != 1 || c.LastError != "boom" || c.Generation != 2) {
				t.Fatalf("a retried job lost its history: %+v", c)
			}
		}
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		as := must(tx.AssignmentList(ctx, "doc-2"))
		if len(as) != 1 || as[0].Owner != "w1" || as[0].Generation != 1 || as[0].AtMS != 50 {
			t.Fatalf("doc-2's assignments %+v", as)
		}
		return nil
	})

	// Priorities: claims take priority 1 first, then 2 (op-1 to op-3, the
	// default), then 4, each in the order its jobs became claimable; a
	// priority-1 job waiting out a backoff is passed over, and a claim
	// larger than one priority's jobs goes on into the next.
	p := s.setup(t)
	p.write(func(ctx context.Context, tx *store.Tx) error {
		for i, prio := range map[int]int64{4: 4, 5: 1, 6: 1, 7: 4} {
			doc := fmt.Sprint("doc-", i)
			if err := tx.DocumentInsert(ctx, doc, 1); err != nil {
				return err
			}
			if err := tx.JobInsert(ctx, &store.JobInsertParams{OperationID: fmt.Sprint("op-", i), Position: int64(i), BatchKey: "b",
				Section: "summary", DocumentID: doc, InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 3,
				BackoffBaseMS: 1000, BackoffCapMS: 60000, Priority: prio}); err != nil {
				return err
			}
		}
		c := must(tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: 1, ClaimPrefix: "x.", Worker: "w0", ClaimHost: "h", LeaseExpiresAtMS: 50, NowMS: 5}))
		if len(c) != 1 || c[0].OperationID != "op-5" || c[0].Priority != 1 {
			t.Fatalf("the first claim took %v, not priority 1's first job, op-5", claimedIDs(c))
		}
		return tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: "op-5", IfState: wire.Claimed, Worker: "w0",
			Attempts: 1, ClaimableAtMS: 100, LastError: "boom", Reason: "retry", NowMS: 6})
	})
	claimAt := func(max int, nowMS int64) []store.ClaimedJob {
		var got []store.ClaimedJob
		p.write(func(ctx context.Context, tx *store.Tx) (err error) {
			got, err = tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: max, ClaimPrefix: fmt.Sprint("p", nowMS, "."), Worker: "w1",
				ClaimHost: "h", LeaseExpiresAtMS: nowMS + 30, NowMS: nowMS})
			return err
		})
		return got
	}
	if got := claimAt(3, 50); !reflect.DeepEqual(claimedIDs(got), []string{"op-6", "op-1", "op-2"}) {
		t.Fatalf("by priority claimed %v, want op-6 (1), then op-1 and op-2 (2), with op-5 (1) backing off", claimedIDs(got))
	}
	if got := claimAt(10, 100); !reflect.DeepEqual(claimedIDs(got), []string{"op-5", "op-3", "op-4", "op-7"}) {
		t.Fatalf("by priority claimed %v, want op-5 (1, its backoff over), op-3 (2), op-4 and op-7 (4)", claimedIDs(got))
	}

	// Max bounds a claim; two write transactions open at once never claim
	// the same job: PostgreSQL passes over rows the first holds, SQLite's
	// one writer does not let the second begin until the first ends.
	g := s.setup(t)
	if got := g.claim("w1", 2, 50); !reflect.DeepEqual(claimedIDs(got), []string{"op-1", "op-2"}) {
		t.Fatalf("max 2 claimed %v", claimedIDs(got))
	}
	s.setup(t).takenOnce(func(ctx context.Context, c store.Conn, worker string) ([]store.ClaimedJob, error) {
		return c.JobClaimMany(ctx, &store.JobClaimManyParams{Max: 2, ClaimPrefix: worker + ".", Worker: worker, ClaimHost: "h", LeaseExpiresAtMS: 50, NowMS: 10})
	})
}

// takenOnce opens two write transactions at once, each taking two jobs of
// the fixture's three through take: PostgreSQL's second passes over the
// rows the first holds (it takes the one left), SQLite's one writer does
// not let the second begin until the first ends.
func (f *fixture) takenOnce(take func(ctx context.Context, c store.Conn, worker string) ([]store.ClaimedJob, error)) {
	t := f.t
	t.Helper()
	ctx := context.Background()
	first := must(f.db.Driver().BeginWrite(ctx))
	defer first.Rollback()
	one := must(take(ctx, first, "w1"))
	waitCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	second, err := f.db.Driver().BeginWrite(waitCtx)
	if err == nil {
		defer second.Rollback()
		var two []store.ClaimedJob
		two, err = take(waitCtx, second, "w2")
		if err == nil && (len(two) != 1 || slices.Contains(claimedIDs(one), two[0].OperationID)) {
			t.Fatalf("two open transactions took %v and %v", claimedIDs(one), claimedIDs(two))
		}
	}
	if f.db.Driver().Writers() > 1 && err != nil {
		t.Fatalf("the second transaction was blocked instead of passing over: %v", err)
	}
	if f.db.Driver().Writers() == 1 && err == nil {
		t.Fatal("a second writer began while the first was open")
	}
}

func testJobSetRunning(t *testing.T, s *suite) {
	f := s.setup(t)
	c := f.claim("w1", 1, 500)[0]
	admit := func(claim string) func(ctx context.Context, tx *store.Tx) error {
		return func(ctx context.Context, tx *store.Tx) error {
			return tx.JobSetRunning(ctx, &store.JobSetRunningParams{OperationID: c.OperationID, IfClaimID: claim, Reserved: 20,
				ReserveShard: 3, TenantShard: 5, ReserveCredential: "agent-1", Admission: []byte(`{"decision":"allow"}`), LeaseExpiresAtMS: 600, Reason: "admitted", NowMS: 11})
		}
	}
	f.guardFails("admitting under another claim", c.OperationID, admit("other"))
	f.write(admit(c.ClaimID))
	got := f.job(c.OperationID)
	want := c.Job
	want.State, want.Reserved, want.ReserveShard, want.TenantShard, want.AdmissionClaimID = wire.Running, 20, 3, 5, c.ClaimID
	want.ReserveCredential = "agent-1"
	want.Admission, want.LeaseExpiresAtMS, want.Reason, want.UpdatedAtMS = []byte(`{"decision":"allow"}`), 600, "admitted", 11
	want.StartedAtMS = 11 // claimed at 10 (f.claim), started now
	if c.ClaimedAtMS != 10 || !reflect.DeepEqual(got, want) {
		t.Fatalf("running\n%+v\nwant\n%+v", got, want)
	}
	f.guardFails("admitting a running job again", c.OperationID, admit(c.ClaimID))
}

func testJobSetRefused(t *testing.T, s *suite) {
	f := s.setup(t)
	c := f.claim("w1", 1, 500)[0]
	f.guardFails("refusing under another claim", c.OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetRefused(ctx, &store.JobSetRefusedParams{OperationID: c.OperationID, IfClaimID: "other", NowMS: 11})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetRefused(ctx, &store.JobSetRefusedParams{OperationID: c.OperationID, IfClaimID: c.ClaimID,
			Admission: []byte(`{"decision":"deny"}`), Reason: "over budget", NowMS: 11})
	})
	if j := f.job(c.OperationID); j.State != wire.Refused || j.Reserved != 0 || j.ReserveShard != -1 || j.TenantShard != -1 || j.AdmissionClaimID != c.ClaimID ||
		string(j.Admission) != `{"decision":"deny"}` || j.Reason != "over budget" || j.UpdatedAtMS != 11 || j.FinishedAtMS != 11 || j.StartedAtMS != 0 {
		t.Fatalf("refused %+v", j)
	}
}

func testJobRenewLease(t *testing.T, s *suite) {
	f := s.setup(t)
	c := f.claim("w1", 1, 500)[0]
	renew := func(claim string, until int64) func(ctx context.Context, tx *store.Tx) error {
		return func(ctx context.Context, tx *store.Tx) error {
			return tx.JobRenewLease(ctx, &store.JobRenewLeaseParams{OperationID: c.OperationID, IfClaimID: claim, LeaseExpiresAtMS: until, NowMS: 20})
		}
	}
	f.guardFails("renewing another claim's lease", c.OperationID, renew("other", 900))
	f.write(renew(c.ClaimID, 900)) // claimed
	if j := f.job(c.OperationID); j.LeaseExpiresAtMS != 900 || j.UpdatedAtMS != 20 || j.State != wire.Claimed {
		t.Fatalf("renewed %+v", j)
	}
	f.run() // op-2, running
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobCancel(ctx, &store.JobCancelParams{OperationID: c.OperationID, IfState: wire.Claimed, To: wire.CancelledBeforeDispatch, NowMS: 30})
	})
	f.guardFails("renewing a cancelled job's lease", c.OperationID, renew(c.ClaimID, 1000))
	r := f.job("op-2")
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobRenewLease(ctx, &store.JobRenewLeaseParams{OperationID: "op-2", IfClaimID: r.ClaimID, LeaseExpiresAtMS: 1200, NowMS: 40})
	})
	if j := f.job("op-2"); j.State != wire.Running || j.LeaseExpiresAtMS != 1200 {
		t.Fatalf("a running job's renewal %+v", j)
	}
}

func testJobComplete(t *testing.T, s *suite) {
	f := s.setup(t)
	j := f.run()
	f.guardFails("completing a job not in the state read", j.OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobComplete(ctx, &store.JobCompleteParams{OperationID: j.OperationID, IfState: wire.Unresolved, Reason: "x", NowMS: 20})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobComplete(ctx, &store.JobCompleteParams{OperationID: j.OperationID, IfState: wire.Running, Reason: "published", NowMS: 20})
	})
	got := f.job(j.OperationID)
	want := j
	want.State, want.Reserved, want.ReserveShard, want.Reason, want.UpdatedAtMS = wire.Completed, 0, -1, "published", 20
	want.TenantShard = -1
	want.FinishedAtMS = 20
	if j.StartedAtMS == 0 || !reflect.DeepEqual(got, want) {
		t.Fatalf("completed\n%+v\nwant\n%+v", got, want)
	}
}

func testJobCompleteMany(t *testing.T, s *suite) {
	// Several completions in one call are each what it would be alone,
	// and one guard that does not hold fails them all.
	f := s.setup(t)
	running := []store.Job{f.run(), f.run(), f.run()}
	complete := func(i int, from wire.JobState) store.JobCompleteParams {
		return store.JobCompleteParams{OperationID: running[i].OperationID, IfState: from, Reason: fmt.Sprint("published ", i), NowMS: 20}
	}
	f.guardFails("completing two, one not in the state read", running[0].OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobCompleteMany(ctx, []store.JobCompleteParams{complete(0, wire.Running), complete(1, wire.Claimed)})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobCompleteMany(ctx, []store.JobCompleteParams{complete(0, wire.Running), complete(1, wire.Running)})
	})
	for i := range 2 {
		want := running[i]
		want.State, want.Reserved, want.ReserveShard, want.TenantShard, want.ReserveCredential = wire.Completed, 0, -1, -1, ""
		want.Reason, want.UpdatedAtMS, want.FinishedAtMS = fmt.Sprint("published ", i), 20, 20
		if got := f.job(running[i].OperationID); !reflect.DeepEqual(got, want) {
			t.Fatalf("completed %d\n%+v\nwant\n%+v", i, got, want)
		}
	}
	if j := f.job(running[2].OperationID); j.State != wire.Running {
		t.Fatalf("a job not named was completed: %+v", j)
	}
	f.guardFails("completing a completed job again", running[2].OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobCompleteMany(ctx, []store.JobCompleteParams{complete(2, wire.Running), complete(0, wire.Running)})
	})
}

func testJobRequeue(t *testing.T, s *suite) {
	f := s.setup(t)
	j := f.run()
	f.guardFails("requeueing a job not in the state read", j.OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: j.OperationID, IfState: wire.Claimed, NowMS: 20})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: j.OperationID, IfState: wire.Running, Worker: "w1",
			Attempts: 1, ClaimableAtMS: 2000, LastError: "boom", Reason: "retrying", NowMS: 20})
	})
	got := f.job(j.OperationID)
	want := j
	want.State, want.ClaimID, want.ClaimHost, want.LeaseExpiresAtMS, want.Reserved, want.ReserveShard = wire.Queued, "", "", 0, 0, -1
	want.TenantShard = -1
	want.AdmissionClaimID, want.Admission, want.Attempts, want.ClaimableAtMS = "", nil, 1, 2000
	want.LastError, want.Reason, want.UpdatedAtMS = "boom", "retrying", 20
	want.ClaimedAtMS, want.StartedAtMS, want.FinishedAtMS = 0, 0, 0 // queued again: none of its times yet
	if j.ClaimedAtMS == 0 || j.StartedAtMS == 0 || !reflect.DeepEqual(got, want) {
		t.Fatalf("requeued\n%+v\nwant\n%+v", got, want)
	}
}

func testJobFail(t *testing.T, s *suite) {
	f := s.setup(t)
	j := f.run()
	f.guardFails("failing a job not in the state read", j.OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobFail(ctx, &store.JobFailParams{OperationID: j.OperationID, IfState: wire.Queued, NowMS: 20})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobFail(ctx, &store.JobFailParams{OperationID: j.OperationID, IfState: wire.Running, Attempts: 3,
			LastError: "boom", Reason: "out of attempts", NowMS: 20})
	})
	got := f.job(j.OperationID)
	want := j
	want.State, want.ClaimID, want.ClaimHost, want.LeaseExpiresAtMS, want.Reserved, want.ReserveShard = wire.Failed, "", "", 0, 0, -1
	want.TenantShard = -1
	want.Attempts, want.LastError, want.Reason, want.UpdatedAtMS = 3, "boom", "out of attempts", 20
	want.FinishedAtMS = 20
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("failed\n%+v\nwant\n%+v", got, want)
	}
}

func testJobSetUnresolved(t *testing.T, s *suite) {
	f := s.setup(t)
	c := f.claim("w9", 1, 50)[0]
	f.guardFails("a claimed job made unresolved", c.OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetUnresolved(ctx, &store.JobSetUnresolvedParams{OperationID: c.OperationID, Reason: "x", NowMS: 20})
	})
	j := f.run()
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetUnresolved(ctx, &store.JobSetUnresolvedParams{OperationID: j.OperationID, Reason: "lease expired", NowMS: 700})
	})
	got := f.job(j.OperationID)
	want := j
	want.State, want.Reason, want.UpdatedAtMS = wire.Unresolved, "lease expired", 700 // keeps its claim and reservation
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("unresolved\n%+v\nwant\n%+v", got, want)
	}
}

func testJobCancel(t *testing.T, s *suite) {
	f := s.setup(t)
	j := f.run()
	f.guardFails("cancelling a job not in the state read", j.OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobCancel(ctx, &store.JobCancelParams{OperationID: j.OperationID, IfState: wire.Claimed, To: wire.Cancelled, NowMS: 20})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobCancel(ctx, &store.JobCancelParams{OperationID: j.OperationID, IfState: wire.Running, To: wire.Cancelled, Reason: "operator", NowMS: 20})
	})
	got := f.job(j.OperationID)
	want := j // keeps its claim id, so its holder learns of it
	want.State, want.ClaimHost, want.LeaseExpiresAtMS, want.Reserved, want.ReserveShard = wire.Cancelled, "", 0, 0, -1
	want.TenantShard = -1
	want.Reason, want.UpdatedAtMS, want.FinishedAtMS = "operator", 20, 20
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("cancelled\n%+v\nwant\n%+v", got, want)
	}
}

func testJobList(t *testing.T, s *suite) {
	f := s.setup(t)
	f.claim("w1", 1, 50)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		all := must(tx.JobList(ctx))
		if !reflect.DeepEqual(ids(all), []string{"op-1", "op-2", "op-3"}) || all[0].State != wire.Claimed || all[0].Owner != "w1" {
			t.Fatalf("all %+v", all)
		}
		return nil
	})
}

func testJobListExpired(t *testing.T, s *suite) {
	f := s.setup(t)
	f.claim("w1", 1, 50) // op-1
	f.claim("w2", 1, 500)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for _, lock := range []store.Lock{store.NoLock, store.ForUpdate} {
			if got := ids(must(tx.JobListExpired(ctx, &store.JobListExpiredParams{NowMS: 100, Lock: lock}))); !reflect.DeepEqual(got, []string{"op-1"}) {
				t.Fatalf("expired at 100 (%v): %v", lock, got)
			}
		}
		if got := ids(must(tx.JobListExpired(ctx, &store.JobListExpiredParams{NowMS: 50, Lock: store.NoLock}))); len(got) != 0 {
			t.Fatalf("a lease ending at 50 expired at 50: %v", got)
		}
		return nil
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := ids(must(tx.JobListExpired(ctx, &store.JobListExpiredParams{NowMS: 1000, Lock: store.NoLock}))); !reflect.DeepEqual(got, []string{"op-1", "op-2"}) {
			t.Fatalf("expired at 1000, read-only: %v", got)
		}
		return nil
	})
}

func testJobListClaimedBy(t *testing.T, s *suite) {
	f := s.setup(t)
	f.claim("w1", 1, 50) // op-1 by host-w1
	f.claim("w3", 1, 50) // op-2 by host-w3
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if got := ids(must(tx.JobListClaimedBy(ctx, []string{"host-w1", "host-w3", "host-w2"}))); !reflect.DeepEqual(got, []string{"op-1", "op-2"}) {
			t.Fatalf("claimed by either: %v", got)
		}
		if got := ids(must(tx.JobListClaimedBy(ctx, []string{"host-w3", "elsewhere"}))); !reflect.DeepEqual(got, []string{"op-2"}) {
			t.Fatalf("claimed by host-w3: %v", got)
		}
		if none := must(tx.JobListClaimedBy(ctx, nil)); len(none) != 0 {
			t.Fatalf("claimed by no host: %+v", none)
		}
		return nil
	})
}

func testJobListClaimedUnder(t *testing.T, s *suite) {
	f := s.setup(t)
	f.claim("w1", 2, 50) // op-1, op-2 under "c-w1."
	f.write(func(ctx context.Context, tx *store.Tx) error {
		_, err := tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: 1, ClaimPrefix: "other.", Worker: "w1", ClaimHost: "h", LeaseExpiresAtMS: 50, NowMS: 10})
		return err
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		got := must(tx.JobListClaimedUnder(ctx, &store.JobListClaimedUnderParams{Worker: "w1", Prefix: "c-w1."}))
		if !reflect.DeepEqual(claimedIDs(got), []string{"op-1", "op-2"}) || got[0].BatchDocument != "text" || got[1].ClaimID != "c-w1.2" {
			t.Fatalf("claimed under c-w1.: %+v", got)
		}
		if other := must(tx.JobListClaimedUnder(ctx, &store.JobListClaimedUnderParams{Worker: "w2", Prefix: "c-w1."})); len(other) != 0 {
			t.Fatalf("another worker's claims: %+v", other)
		}
		return nil
	})
	// Decided under the claim (a claim that admits): op-1 admitted, op-2
	// refused; both still the key's, until op-1 completes.
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.JobSetRunning(ctx, &store.JobSetRunningParams{OperationID: "op-1", IfClaimID: "c-w1.1", ReserveShard: -1, TenantShard: -1,
			Admission: []byte(`{"decision":"allow"}`), LeaseExpiresAtMS: 600, Reason: "admitted", NowMS: 11}); err != nil {
			return err
		}
		return tx.JobSetRefused(ctx, &store.JobSetRefusedParams{OperationID: "op-2", IfClaimID: "c-w1.2", Admission: []byte(`{"decision":"deny"}`), Reason: "short", NowMS: 11})
	})
	listed := func() []store.ClaimedJob {
		var got []store.ClaimedJob
		f.write(func(ctx context.Context, tx *store.Tx) (err error) {
			got, err = tx.JobListClaimedUnder(ctx, &store.JobListClaimedUnderParams{Worker: "w1", Prefix: "c-w1."})
			return err
		})
		return got
	}
	if got := listed(); !reflect.DeepEqual(claimedIDs(got), []string{"op-1", "op-2"}) || got[0].State != wire.Running || got[1].State != wire.Refused ||
		string(got[1].Admission) != `{"decision":"deny"}` || got[0].BatchDocument != "text" {
		t.Fatalf("admitted and refused under c-w1.: %+v", got)
	}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobComplete(ctx, &store.JobCompleteParams{OperationID: "op-1", IfState: wire.Running, Reason: "published", NowMS: 20})
	})
	if got := listed(); !reflect.DeepEqual(claimedIDs(got), []string{"op-2"}) {
		t.Fatalf("after op-1 completed, under c-w1.: %v", claimedIDs(got))
	}
}

func testJobPending(t *testing.T, s *suite) {
	f := s.setup(t)
	pending := func() bool {
		var p bool
		f.read(func(ctx context.Context, tx *store.Tx) (err error) { p, err = tx.JobPending(ctx); return err })
		return p
	}
	if !pending() {
		t.Fatal("queued jobs are not pending")
	}
	for _, c := range f.claim("w1", 3, 50) {
		f.write(func(ctx context.Context, tx *store.Tx) error {
			return tx.JobCancel(ctx, &store.JobCancelParams{OperationID: c.OperationID, IfState: wire.Claimed, To: wire.CancelledBeforeDispatch, NowMS: 20})
		})
		if c.OperationID != "op-3" && !pending() {
			t.Fatalf("after cancelling %s, the claimed rest are not pending", c.OperationID)
		}
	}
	if pending() {
		t.Fatal("only cancelled jobs, yet pending")
	}
}

// testJobCountByState: the counts by state, completed ones among them
// (the rest of the jobs enqueued), committed and inside a transaction
// that has moved jobs.
func testJobCountByState(t *testing.T, s *suite) {
	f := s.setup(t)
	counts := func(tx *store.Tx, want map[wire.JobState]int64) {
		t.Helper()
		if got := must(tx.JobCountByState(context.Background())); !reflect.DeepEqual(got, want) {
			t.Fatalf("by state %v, want %v", got, want)
		}
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		counts(tx, map[wire.JobState]int64{wire.Queued: 3})
		return nil
	})
	j := f.run() // op-1
	f.claim("w2", 1, 50)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.JobComplete(ctx, &store.JobCompleteParams{OperationID: j.OperationID, IfState: wire.Running, Reason: "published", NowMS: 20}); err != nil {
			return err
		}
		counts(tx, map[wire.JobState]int64{wire.Completed: 1, wire.Claimed: 1, wire.Queued: 1})
		return tx.JobCancel(ctx, &store.JobCancelParams{OperationID: "op-3", IfState: wire.Queued, To: wire.CancelledBeforeDispatch, NowMS: 20})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		counts(tx, map[wire.JobState]int64{wire.Completed: 1, wire.Claimed: 1, wire.CancelledBeforeDispatch: 1})
		return nil
	})
}

func testJobPage(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		// op-2 claimed by worker-9; op-1 assigned to nobody at a new generation.
		if _, err := tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: 2, ClaimPrefix: "x.", Worker: "worker-9", ClaimHost: "h", LeaseExpiresAtMS: 50, NowMS: 10}); err != nil {
			return err
		}
		if err := tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: "op-1", IfState: wire.Claimed, Worker: "worker-9", NowMS: 10}); err != nil {
			return err
		}
		_, err := tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: "doc-1", Owner: "", Reason: "requeued", AtMS: 10})
		return err
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		for _, c := range []struct {
			f     store.JobFilter
			after int64
			limit int
			want  []string
		}{
			{store.JobFilter{}, 0, 10, []string{"op-1", "op-2", "op-3"}},
			{store.JobFilter{}, 0, 2, []string{"op-1", "op-2"}},
			{store.JobFilter{}, 2, 2, []string{"op-3"}},
			{store.JobFilter{}, 3, 2, []string{}},
			{store.JobFilter{State: wire.Queued}, 0, 10, []string{"op-1", "op-3"}},
			{store.JobFilter{State: wire.Queued}, 1, 10, []string{"op-3"}},
			{store.JobFilter{Section: "summary"}, 0, 10, []string{"op-1", "op-2", "op-3"}},
			{store.JobFilter{Section: "links"}, 0, 10, []string{}},
			{store.JobFilter{Owner: "worker-9"}, 0, 10, []string{"op-2"}},
			{store.JobFilter{OperationPrefix: "op-"}, 1, 10, []string{"op-2", "op-3"}},
			{store.JobFilter{OperationPrefix: "op-3"}, 0, 10, []string{"op-3"}},
			{store.JobFilter{OperationPrefix: "OP-3"}, 0, 10, []string{}},
			{store.JobFilter{OperationPrefix: "op_"}, 0, 10, []string{}}, // not a pattern
			{store.JobFilter{State: wire.Claimed, Owner: "worker-9", Section: "summary"}, 0, 10, []string{"op-2"}},
			{store.JobFilter{State: wire.Queued, OperationPrefix: "op-1"}, 0, 10, []string{"op-1"}},
		} {
			if got := ids(must(tx.JobPage(ctx, &store.JobPageParams{Filter: c.f, After: c.after, Limit: c.limit}))); !reflect.DeepEqual(got, c.want) {
				t.Errorf("%+v after %d, limit %d: %v, want %v", c.f, c.after, c.limit, got, c.want)
			}
		}
		return nil
	})
	// By tenant: a job of team-a among the default's.
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.DocumentInsert(ctx, "doc-4", 1); err != nil {
			return err
		}
		return tx.JobInsert(ctx, &store.JobInsertParams{OperationID: "op-4", Position: 4, BatchKey: "b", Section: "terms", DocumentID: "doc-4",
			InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1, Tenant: "team-a"})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		for _, c := range []struct {
			f    store.JobFilter
			want []string
		}{
			{store.JobFilter{Tenant: "team-a"}, []string{"op-4"}},
			{store.JobFilter{Tenant: wire.DefaultTenant}, []string{"op-1", "op-2", "op-3"}},
			{store.JobFilter{Tenant: "nobody"}, []string{}},
			{store.JobFilter{State: wire.Queued, Tenant: "team-a"}, []string{"op-4"}},
			{store.JobFilter{Owner: "worker-9", Tenant: "team-a"}, []string{}},
		} {
			if got := ids(must(tx.JobPage(ctx, &store.JobPageParams{Filter: c.f, Limit: 10}))); !reflect.DeepEqual(got, c.want) {
				t.Errorf("%+v: %v, want %v", c.f, got, c.want)
			}
		}
		return nil
	})
}

func testAttempts(t *testing.T, s *suite) {
	f := s.setup(t)
	mk := func(n int64, retryable bool) store.Attempt {
		return store.Attempt{OperationID: "op-1", ClaimID: fmt.Sprint("c-", n), Answer: []byte(`{"state":"queued"}`),
			Attempt: wire.Attempt{Attempt: n, Worker: "w", Generation: n, Reason: fmt.Sprint("reason ", n),
				Retryable: retryable, Outcome: "retry", Cost: 20 * n, AtMS: 100 + n}}
	}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.AttemptInsert(ctx, mk(2, false)); err != nil {
			return err
		}
		return tx.AttemptInsert(ctx, mk(1, true))
	})
	f.refused("one attempt number recorded twice", func(ctx context.Context, tx *store.Tx) error { return tx.AttemptInsert(ctx, mk(1, true)) })
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.AttemptList(ctx, "op-1")); !reflect.DeepEqual(got, []store.Attempt{mk(1, true), mk(2, false)}) {
			t.Fatalf("attempts %+v", got)
		}
		if none := must(tx.AttemptList(ctx, "op-2")); len(none) != 0 {
			t.Fatalf("another job's attempts: %+v", none)
		}
		return nil
	})
}

func testJobSetRunningMany(t *testing.T, s *suite) {
	// Several admissions in one call are each what it would be alone,
	// and one guard that does not hold fails them all.
	f := s.setup(t)
	c := f.claim("w1", 3, 500)
	admit := func(i int, claim string) store.JobSetRunningParams {
		return store.JobSetRunningParams{OperationID: c[i].OperationID, IfClaimID: claim, Reserved: 20, ReserveShard: int64(i), TenantShard: int64(i + 1),
			ReserveCredential: "agent-1", Admission: fmt.Appendf(nil, `{"n":%d}`, i), LeaseExpiresAtMS: 600 + int64(i), Reason: fmt.Sprint("admitted ", i), NowMS: 11}
	}
	f.guardFails("admitting two, one under another claim", c[0].OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetRunningMany(ctx, []store.JobSetRunningParams{admit(0, c[0].ClaimID), admit(1, "other")})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetRunningMany(ctx, []store.JobSetRunningParams{admit(0, c[0].ClaimID), admit(1, c[1].ClaimID)})
	})
	for i := range 2 {
		want := c[i].Job
		want.State, want.Reserved, want.ReserveShard, want.TenantShard, want.AdmissionClaimID = wire.Running, 20, int64(i), int64(i+1), c[i].ClaimID
		want.ReserveCredential, want.Admission, want.LeaseExpiresAtMS = "agent-1", fmt.Appendf(nil, `{"n":%d}`, i), 600+int64(i)
		want.Reason, want.UpdatedAtMS, want.StartedAtMS = fmt.Sprint("admitted ", i), 11, 11
		if got := f.job(c[i].OperationID); !reflect.DeepEqual(got, want) {
			t.Fatalf("running %d\n%+v\nwant\n%+v", i, got, want)
		}
	}
	if j := f.job(c[2].OperationID); j.State != wire.Claimed {
		t.Fatalf("a job not named was admitted: %+v", j)
	}
	f.guardFails("admitting a running job again", c[0].OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetRunningMany(ctx, []store.JobSetRunningParams{admit(2, c[2].ClaimID), admit(0, c[0].ClaimID)})
	})
}

func testJobSetRefusedMany(t *testing.T, s *suite) {
	f := s.setup(t)
	c := f.claim("w1", 2, 500)
	refuse := func(i int, claim string) store.JobSetRefusedParams {
		return store.JobSetRefusedParams{OperationID: c[i].OperationID, IfClaimID: claim, Admission: fmt.Appendf(nil, `{"deny":%d}`, i),
			Reason: fmt.Sprint("over budget ", i), NowMS: 11}
	}
	f.guardFails("refusing two, one under another claim", c[0].OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetRefusedMany(ctx, []store.JobSetRefusedParams{refuse(0, c[0].ClaimID), refuse(1, "other")})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetRefusedMany(ctx, []store.JobSetRefusedParams{refuse(0, c[0].ClaimID), refuse(1, c[1].ClaimID)})
	})
	for i := range 2 {
		j := f.job(c[i].OperationID)
		if j.State != wire.Refused || j.Reserved != 0 || j.ReserveShard != -1 || j.TenantShard != -1 || j.AdmissionClaimID != c[i].ClaimID ||
			string(j.Admission) != fmt.Sprintf(`{"deny":%d}`, i) || j.Reason != fmt.Sprint("over budget ", i) || j.UpdatedAtMS != 11 || j.FinishedAtMS != 11 {
			t.Fatalf("refused %d: %+v", i, j)
		}
	}
}
