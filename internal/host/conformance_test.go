package host_test

// The host's conformance suite: claim, lease, cancel, reconcile, requeue,
// restart recovery and several hosts writing at once, run unchanged on
// SQLite and on PostgreSQL (storetest.Each).

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/host/publication"
	"github.com/fleet/fleet/internal/host/registry"
	"github.com/fleet/fleet/internal/hosttest"
	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/verify"
	"github.com/fleet/fleet/internal/wire"
)

const document = "Fleet review\n\nWorkers must renew their leases.\n- [ ] rotate credentials\nSee https://example.com/fleet for more.\n"

type fixture struct {
	state, database string
}

// newState initializes a state (4 sections, allowance and cost as given,
// workers worker-1..n) on the backend the test runs under.
func newState(t testing.TB, allowance, cost, workers int, edits ...func(map[string]any)) fixture {
	t.Helper()
	m := map[string]any{
		"document": document, "sections": []string{"summary", "terms", "actions", "links"},
		"concurrency": workers, "allowance": allowance, "cost_per_report": cost, "cancel_index": nil,
		"lose_ack_index": nil, "restart": false, "mode": "deterministic",
	}
	for _, edit := range edits {
		edit(m)
	}
	raw := testkit.MustJSON(t, m)
	in, err := input.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{state: filepath.Join(t.TempDir(), "state")}
	if storetest.OnPostgres(t) {
		f.database = storetest.NewLocation(t)
	}
	if err := hosttest.Init(context.Background(), f.state, f.database, in); err != nil {
		t.Fatal(err)
	}
	return f
}

// open opens and starts a host on the state under the state directory's
// own identity.
func (f fixture) open(t testing.TB) *host.Host { return f.openAs(t, "", nil) }

// openAs opens and starts a host on the state as host id (the directory's
// when ""), on clock when one is given.
func (f fixture) openAs(t testing.TB, id string, clock *storetest.Clock) *host.Host {
	t.Helper()
	return f.openWith(t, host.Options{ID: id}, clock)
}

// openWith opens and starts a host on the state with opts, on clock when
// one is given.
func (f fixture) openWith(t testing.TB, opts host.Options, clock *storetest.Clock) *host.Host {
	t.Helper()
	h, err := hosttest.OpenWith(context.Background(), f.state, f.database, backend.Options{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if clock != nil {
		h.DB().Now = clock.Now
	}
	if err := h.Start(context.Background(), "test"); err != nil {
		t.Fatal(err)
	}
	return h
}

// rawDatabase opens the state's database itself, beside its host: for a
// fixture's rows written directly, or what a test reads that no answer
// shows.
func (f fixture) rawDatabase(t testing.TB) *sql.DB {
	t.Helper()
	driver, dsn := "sqlite", "file:"+statedir.Location(f.state, "")+"?_pragma=busy_timeout(10000)"
	if f.database != "" {
		driver, dsn = "pgx", f.database
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func (f fixture) verify(t testing.TB) verify.Report {
	t.Helper()
	rep, err := hosttest.Verify(context.Background(), f.state, f.database)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || len(rep.Violations) != 0 {
		t.Fatalf("verify: %v", rep.Violations)
	}
	return rep
}

func caller(name string) fleet.Caller {
	return fleet.Caller{ID: name, CredentialSHA256: fleet.DigestHex([]byte("token-" + name))}
}

func claim(t *testing.T, h *host.Host, who fleet.Caller) wire.ClaimedJob {
	t.Helper()
	res, err := h.Claims().Claim(context.Background(), who, 0, 1)
	if err != nil || res.Job == nil {
		t.Fatalf("claim by %s: %+v, %v", who.ID, res, err)
	}
	return *res.Job
}

func refOf(j wire.ClaimedJob) wire.ClaimRef {
	return wire.ClaimRef{ClaimID: j.Claim.ClaimID, Generation: j.Claim.Generation}
}

func dispatch(t *testing.T, h *host.Host, who fleet.Caller, j wire.ClaimedJob) wire.Admission {
	t.Helper()
	raw, err := h.Admission().Dispatch(context.Background(), who, j.OperationID, refOf(j))
	if err != nil {
		t.Fatalf("dispatch %s: %v", j.OperationID, err)
	}
	var adm wire.Admission
	if err := json.Unmarshal(raw, &adm); err != nil {
		t.Fatal(err)
	}
	return adm
}

// canon checks req and canonicalizes its body, as the HTTP edge does.
func canon(t *testing.T, req wire.PublishRequest) resource.Request {
	t.Helper()
	r, err := resource.Normalize(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func publishReq(t *testing.T, h *host.Host, j wire.ClaimedJob, key string) wire.PublishRequest {
	t.Helper()
	raw, err := sections.Body(j.OperationID, j.Section, j.InputSHA256, j.Input.Document)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := h.Views().Document(context.Background(), caller("worker-1"), j.DocumentID)
	if err != nil {
		t.Fatal(err)
	}
	return wire.PublishRequest{OperationKey: key, Generation: j.Claim.Generation, ExpectedVersion: doc.Version, Body: raw}
}

func jobState(t *testing.T, h *host.Host, op string) wire.Job {
	t.Helper()
	d, err := h.Views().Job(context.Background(), op)
	if err != nil {
		t.Fatal(err)
	}
	return d.Job
}

func wantCode(t *testing.T, err error, code wire.Code) {
	t.Helper()
	if fleet.ErrorCode(err) != code {
		t.Fatalf("got %v, want %s", err, code)
	}
}

// TestLifecycle: claim, dispatch, publish, replay, stale claims, cancel
// before and after dispatch, heartbeat's cancel_requested, reconcile.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 50, 20, 2)
		h := f.open(t)
		w1, w2 := caller("worker-1"), caller("worker-2")

		a := claim(t, h, w1)
		if adm := dispatch(t, h, w1, a); adm.Decision != wire.DecisionAllow {
			t.Fatalf("admission %+v", adm)
		}
		if _, err := h.Claims().Heartbeat(ctx, w2, a.OperationID, refOf(a)); fleet.ErrorCode(err) != wire.CodeStaleClaim {
			t.Fatalf("another worker's heartbeat on a's claim: %v", err)
		}
		req := publishReq(t, h, a, "key-a")
		pub, err := h.Publications().Publish(ctx, w1, a.OperationID, canon(t, req))
		if err != nil || pub.Outcome.Status != wire.StatusPublished || pub.Outcome.Version != 1 {
			t.Fatalf("publish: %+v, %v", pub, err)
		}
		again, err := h.Publications().Publish(ctx, w1, a.OperationID, canon(t, req))
		if err != nil || !again.Replayed || string(again.Raw) != string(pub.Raw) {
			t.Fatalf("replay: %+v, %v", again, err)
		}
		if st := jobState(t, h, a.OperationID).State; st != wire.Completed {
			t.Fatalf("published job is %s", st)
		}

		// Cancelled while claimed: its claim is stale at dispatch.
		b := claim(t, h, w2)
		if res, err := h.Operator().Cancel(ctx, b.OperationID, ""); err != nil || res.State != wire.CancelledBeforeDispatch {
			t.Fatalf("cancel claimed: %+v, %v", res, err)
		}
		_, err = h.Admission().Dispatch(ctx, w2, b.OperationID, refOf(b))
		wantCode(t, err, wire.CodeStaleClaim)

		// Cancelled while running: the heartbeat says so and the publication
		// is superseded, its reservation released.
		c := claim(t, h, w2)
		if adm := dispatch(t, h, w2, c); adm.Decision != wire.DecisionAllow {
			t.Fatalf("admission of c %+v", adm)
		}
		if res, err := h.Operator().Cancel(ctx, c.OperationID, ""); err != nil || res.State != wire.Cancelled || res.ReceiptID == nil {
			t.Fatalf("cancel running: %+v, %v", res, err)
		}
		if hb, err := h.Claims().Heartbeat(ctx, w2, c.OperationID, refOf(c)); err != nil || !hb.CancelRequested {
			t.Fatalf("heartbeat after cancel: %+v, %v", hb, err)
		}
		if pub, err := h.Publications().Publish(ctx, w2, c.OperationID, canon(t, publishReq(t, h, c, "key-c"))); err != nil || pub.Outcome.Status != wire.StatusSuperseded {
			t.Fatalf("publish after cancel: %+v, %v", pub, err)
		}

		rec, err := h.Operator().Reconcile(ctx, a.OperationID, "")
		if err != nil || !rec.ReusedExistingEffect || rec.State != wire.Completed || rec.ReceiptID != pub.Outcome.ReceiptID {
			t.Fatalf("reconcile a: %+v, %v (publication receipt %s)", rec, err, pub.Outcome.ReceiptID)
		}
		rec, err = h.Operator().Reconcile(ctx, c.OperationID, "")
		if err != nil || rec.ReusedExistingEffect {
			t.Fatalf("reconcile c: %+v, %v", rec, err)
		}

		snap, err := h.Views().Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The cancelled running job's admission is spent: its worker may have
		// incurred the cost before it learned of the cancellation.
		if a := snap.Accounting; a.Spent != 40 || a.Reserved != 0 || a.Available != 10 || snap.Mutations != 1 {
			t.Fatalf("accounting %+v, mutations %d", a, snap.Mutations)
		}
		f.verify(t)
	})
}

// TestLeaseExpiry: a claimed job's lapsed lease requeues it at a new
// generation, fencing the old claim; a running job's makes it unresolved,
// which its slow worker can still complete, or an operator requeue.
func TestLeaseExpiry(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 2)
		h := f.open(t)
		clock := storetest.NewClock(time.Now())
		h.DB().Now = clock.Now
		w1, w2 := caller("worker-1"), caller("worker-2")

		a := claim(t, h, w1)
		clock.Advance(h.Lease - time.Millisecond)
		if n, err := h.Claims().ExpireLeases(ctx); err != nil || n != 0 {
			t.Fatalf("expired before the lease ended: %d, %v", n, err)
		}
		clock.Advance(2 * time.Millisecond)
		if n, err := h.Claims().ExpireLeases(ctx); err != nil || n != 1 {
			t.Fatalf("expire: %d, %v", n, err)
		}
		if j := jobState(t, h, a.OperationID); j.State != wire.Queued || j.Generation != a.Claim.Generation+1 {
			t.Fatalf("after expiry: %s at generation %d", j.State, j.Generation)
		}
		_, err := h.Admission().Dispatch(ctx, w1, a.OperationID, refOf(a))
		wantCode(t, err, wire.CodeStaleClaim)

		b := claim(t, h, w2) // the same job: revoked at expiry, assigned anew
		if b.OperationID != a.OperationID || b.Claim.Generation != a.Claim.Generation+2 {
			t.Fatalf("reclaimed %s at %d", b.OperationID, b.Claim.Generation)
		}
		dispatch(t, h, w2, b)
		clock.Advance(h.Lease + time.Millisecond)
		if n, err := h.Claims().ExpireLeases(ctx); err != nil || n != 1 {
			t.Fatalf("expire running: %d, %v", n, err)
		}
		if st := jobState(t, h, b.OperationID).State; st != wire.Unresolved {
			t.Fatalf("running job after expiry: %s", st)
		}
		pub, err := h.Publications().Publish(ctx, w2, b.OperationID, canon(t, publishReq(t, h, b, "slow")))
		if err != nil || pub.Outcome.Status != wire.StatusPublished {
			t.Fatalf("slow worker's publication: %+v, %v", pub, err)
		}
		if st := jobState(t, h, b.OperationID).State; st != wire.Completed {
			t.Fatalf("slow worker's job: %s", st)
		}

		c := claim(t, h, w1)
		dispatch(t, h, w1, c)
		clock.Advance(h.Lease + time.Millisecond)
		if n, err := h.Claims().ExpireLeases(ctx); err != nil || n != 1 {
			t.Fatalf("expire the third: %d, %v", n, err)
		}
		rq, err := h.Operator().Requeue(ctx, c.OperationID, "")
		if err != nil || rq.State != wire.Queued || rq.Generation != c.Claim.Generation+1 {
			t.Fatalf("requeue: %+v, %v", rq, err)
		}
		if pub, err := h.Publications().Publish(ctx, w1, c.OperationID, canon(t, publishReq(t, h, c, "too-late"))); err != nil || pub.Outcome.Status != wire.StatusSuperseded {
			t.Fatalf("publication after requeue: %+v, %v", pub, err)
		}
		f.verify(t)
	})
}

// TestRestartRecovery: a host that stops without shutting down (its
// process gone, its database as last committed) comes back with claimed
// jobs requeued at a new generation, running jobs kept, the kernel key and
// the accounting unchanged, and everything verifying.
func TestRestartRecovery(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 50, 20, 2)
		h := f.open(t)
		w1, w2 := caller("worker-1"), caller("worker-2")
		running := claim(t, h, w1)
		dispatch(t, h, w1, running)
		claimed := claim(t, h, w2)
		before, err := h.Views().Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h.Close() // no Stop: as if killed

		h2 := f.open(t)
		after, err := h2.Views().Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if after.KernelKey != before.KernelKey || after.Accounting != before.Accounting {
			t.Fatalf("restart changed kernel or accounting: %+v -> %+v", before.Accounting, after.Accounting)
		}
		if j := jobState(t, h2, claimed.OperationID); j.State != wire.Queued || j.Generation != claimed.Claim.Generation+1 {
			t.Fatalf("claimed job after restart: %s at %d", j.State, j.Generation)
		}
		if j := jobState(t, h2, running.OperationID); j.State != wire.Running {
			t.Fatalf("running job after restart: %s", j.State)
		}
		_, err = h2.Claims().Heartbeat(ctx, w2, claimed.OperationID, refOf(claimed))
		wantCode(t, err, wire.CodeStaleClaim)
		if pub, err := h2.Publications().Publish(ctx, w1, running.OperationID, canon(t, publishReq(t, h2, running, "after-restart"))); err != nil || pub.Outcome.Status != wire.StatusPublished {
			t.Fatalf("running job's publication after restart: %+v, %v", pub, err)
		}
		evs, err := h2.Views().Events(ctx, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var unclean bool
		for _, e := range evs {
			unclean = unclean || e.Kind == "fleet.host_stopped" && bytes.Contains(e.Data, []byte(`"clean":false`))
		}
		if !unclean {
			t.Fatal("no unclean-stop event after the restart")
		}
		f.verify(t)
	})
}

// TestHostsShareOneDatabase: two hosts on one database serve eight workers
// at once. Whatever the interleaving, each admitted job is published once,
// the allowance is never exceeded, and the receipts and events form one
// contiguous, verifying sequence.
func TestHostsShareOneDatabase(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		const workers, batches, cost = 8, 10, 20
		f := newState(t, 25*cost, cost, workers) // 44 jobs, 25 affordable
		hosts := []*host.Host{f.openAs(t, "a", nil), f.openAs(t, "b", nil)}
		for i := range batches {
			key := fmt.Sprintf("batch-%d", i)
			doc := fmt.Sprintf("%s\nbatch %d\n", document, i)
			if _, err := hosts[i%2].Operator().SubmitReports(ctx, wire.ReportsRequest{Document: &doc,
				Sections: []string{"summary", "terms", "actions", "links"}, IdempotencyKey: &key}); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		for i := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h, who := hosts[i%2], caller(fmt.Sprintf("worker-%d", i+1))
				for n := 0; ; n++ {
					res, err := h.Claims().Claim(ctx, who, 0, 1)
					if err != nil {
						t.Errorf("claim: %v", err)
						return
					}
					if res.Job == nil {
						return // empty: nothing is claimed or running anywhere either
					}
					j := *res.Job
					raw, err := h.Admission().Dispatch(ctx, who, j.OperationID, refOf(j))
					if err != nil {
						t.Errorf("dispatch: %v", err)
						return
					}
					var adm wire.Admission
					testkit.MustDecode(t, raw, &adm)
					if adm.Decision != wire.DecisionAllow {
						continue
					}
					data, _ := sections.Body(j.OperationID, j.Section, j.InputSHA256, j.Input.Document)
					pub, err := h.Publications().Publish(ctx, who, j.OperationID, canon(t, wire.PublishRequest{
						OperationKey: fmt.Sprintf("%s-%d", who.ID, n), Generation: j.Claim.Generation, ExpectedVersion: 0, Body: data}))
					if err != nil || pub.Outcome.Status != wire.StatusPublished {
						t.Errorf("publish %s: %+v, %v", j.OperationID, pub, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		snap, err := hosts[0].Views().Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		counts := map[wire.JobState]int{}
		for _, j := range snap.Jobs {
			counts[j.State]++
		}
		a := snap.Accounting
		if counts[wire.Completed] != 25 || counts[wire.Refused] != len(snap.Jobs)-25 || snap.Mutations != 25 ||
			a.Spent != 25*cost || a.Reserved != 0 || a.Available != 0 {
			t.Fatalf("states %v, mutations %d, accounting %+v", counts, snap.Mutations, a)
		}
		evs, err := hosts[1].Views().Events(ctx, 0, 10000)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range evs {
			if e.Sequence != int64(i+1) {
				t.Fatalf("event %d has sequence %d", i+1, e.Sequence)
			}
		}
		f.verify(t) // receipts signed and chained 1..n, accounting agrees with them
	})
}

// TestCancelRacesDispatch: an operator's cancel on one host and the
// worker's dispatch on another, at the same moment, on the same job. One
// decides first and the other sees its result: either the job was cancelled
// before dispatch (and the dispatch is stale) or it was admitted and then
// cancelled while running. Never both, and no reservation is left behind.
func TestCancelRacesDispatch(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		const rounds = 12
		f := newState(t, 20*rounds*4, 20, 1)
		hosts := []*host.Host{f.openAs(t, "a", nil), f.openAs(t, "b", nil)}
		for i := range rounds {
			key, doc := fmt.Sprintf("round-%d", i), fmt.Sprintf("%s\nround %d\n", document, i)
			if _, err := hosts[0].Operator().SubmitReports(ctx, wire.ReportsRequest{Document: &doc, Sections: []string{"summary"}, IdempotencyKey: &key}); err != nil {
				t.Fatal(err)
			}
		}
		w := caller("worker-1")
		for range rounds + 4 {
			j := claim(t, hosts[0], w)
			var cancelRes wire.CancelResult
			var cancelErr, dispatchErr error
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); cancelRes, cancelErr = hosts[0].Operator().Cancel(ctx, j.OperationID, "") }()
			go func() {
				defer wg.Done()
				_, dispatchErr = hosts[1].Admission().Dispatch(ctx, w, j.OperationID, refOf(j))
			}()
			wg.Wait()
			if cancelErr != nil {
				t.Fatalf("cancel: %v", cancelErr)
			}
			switch cancelRes.State {
			case wire.CancelledBeforeDispatch:
				wantCode(t, dispatchErr, wire.CodeStaleClaim)
			case wire.Cancelled:
				if dispatchErr != nil {
					t.Fatalf("cancelled while running, but the dispatch failed: %v", dispatchErr)
				}
			default:
				t.Fatalf("cancel left the job %s", cancelRes.State)
			}
		}
		snap, err := hosts[1].Views().Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if snap.Accounting.Reserved != 0 {
			t.Fatalf("a reservation was left behind: %+v", snap.Accounting)
		}
		f.verify(t)
	})
}

// TestUsageSettlement: with model_prices, a publication that reports usage
// settles what it cost (never more than reserved) and releases the rest in
// its own transaction; one without usage settles in full.
func TestUsageSettlement(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 50, 20, 1, func(m map[string]any) {
			m["mode"], m["model_prices"] = "model", map[string]float64{"prompt_per_1k": 2, "completion_per_1k": 10}
		})
		h := f.open(t)
		w := caller("worker-1")
		publish := func(body string) publication.Publication {
			t.Helper()
			j := claim(t, h, w)
			if adm := dispatch(t, h, w, j); adm.Decision != wire.DecisionAllow {
				t.Fatalf("admission %+v", adm)
			}
			req := publishReq(t, h, j, "k-"+j.OperationID)
			// A model worker's body: the job's names, its mode, the answer.
			var m map[string]any
			testkit.MustDecode(t, []byte(body), &m)
			m["operation_id"], m["input_sha256"], m["section"], m["mode"] = j.OperationID, j.InputSHA256, j.Section, "model"
			req.Body = testkit.MustJSON(t, m)
			pub, err := h.Publications().Publish(ctx, w, j.OperationID, canon(t, req))
			if err != nil || pub.Outcome.Status != wire.StatusPublished {
				t.Fatalf("publish: %+v, %v", pub, err)
			}
			return pub
		}
		publish(`{"answer":"x","usage":{"prompt_tokens":1200,"completion_tokens":300}}`) // 6 of 20
		snap, _ := h.Views().Snapshot(ctx)
		if a := snap.Accounting; a.Spent != 6 || a.Reserved != 0 || a.Available != 44 {
			t.Fatalf("after a 6-credit call: %+v", a)
		}
		publish(`{"answer":"x","usage":{"prompt_tokens":100000,"completion_tokens":0}}`) // 200, capped at 20
		publish(`{"answer":"no usage reported"}`)                                        // the full 20
		snap, _ = h.Views().Snapshot(ctx)
		if a := snap.Accounting; a.Spent != 46 || a.Reserved != 0 || a.Available != 4 {
			t.Fatalf("after capped and unreported calls: %+v", a)
		}
		d, err := h.Views().Job(ctx, snap.Jobs[0].OperationID)
		if err != nil {
			t.Fatal(err)
		}
		last := d.Receipts[len(d.Receipts)-1]
		if last.Kind != "publication" || last.Cost != 6 || last.Reserved == nil || *last.Reserved != 20 {
			t.Fatalf("publication receipt %+v", last)
		}
		f.verify(t)
	})
}

// TestUsageSettlementByModel: with model_prices a table by model, a
// publication's usage is priced at its model's prices; a model the table
// does not name (and no "*") settles the whole reservation; each receipt
// says which model and whether it was priced. A failure's usage is
// priced the same way, and one naming no model's name is refused.
func TestUsageSettlementByModel(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 1, func(m map[string]any) {
			m["mode"], m["model_prices"] = "model", map[string]any{
				"small": map[string]float64{"prompt_per_1k": 1, "completion_per_1k": 2},
				"large": map[string]float64{"prompt_per_1k": 5, "completion_per_1k": 15}}
		})
		h := f.open(t)
		w := caller("worker-1")
		admitted := func() wire.ClaimedJob {
			t.Helper()
			j := claim(t, h, w)
			if adm := dispatch(t, h, w, j); adm.Decision != wire.DecisionAllow {
				t.Fatalf("admission %+v", adm)
			}
			return j
		}
		publish := func(model string) wire.Receipt {
			t.Helper()
			j := admitted()
			req := publishReq(t, h, j, "k-"+j.OperationID)
			req.Body = testkit.MustJSON(t, map[string]any{"operation_id": j.OperationID, "input_sha256": j.InputSHA256,
				"section": j.Section, "mode": "model", "model": model, "answer": "x",
				"usage": map[string]int64{"prompt_tokens": 1000, "completion_tokens": 1000}})
			pub, err := h.Publications().Publish(ctx, w, j.OperationID, canon(t, req))
			if err != nil || pub.Outcome.Status != wire.StatusPublished {
				t.Fatalf("publish: %+v, %v", pub, err)
			}
			return receiptOf(t, h, pub.Outcome.ReceiptID)
		}
		for _, c := range []struct {
			model  string
			cost   int64
			priced bool
		}{{"small", 3, true}, {"large", 20, true}, {"unknown", 20, false}} {
			r := publish(c.model)
			if r.Cost != c.cost || r.Pricing == nil || r.Pricing.Model != c.model || r.Pricing.Priced != c.priced {
				t.Fatalf("%s: receipt cost %d, pricing %+v; want %d, priced %t", c.model, r.Cost, r.Pricing, c.cost, c.priced)
			}
		}
		// A failure's usage, priced at small's prices: 1 + 2 = 3.
		j := admitted()
		bad := wire.FailRequest{ClaimID: j.Claim.ClaimID, Generation: j.Claim.Generation, Reason: "the model stopped", Retryable: true,
			Usage: &wire.Usage{Model: strings.Repeat("m", 200), PromptTokens: 1000, CompletionTokens: 1000}}
		if _, err := h.Failures().Fail(ctx, w, j.OperationID, bad); fleet.ErrorCode(err) != wire.CodeInvalid {
			t.Fatalf("a failure naming a 200-byte model: %v", err)
		}
		good := bad
		good.Usage = &wire.Usage{Model: "small", PromptTokens: 1000, CompletionTokens: 1000}
		res, err := h.Failures().Fail(ctx, w, j.OperationID, good)
		if err != nil || res.Settled != 3 || res.Released != 17 {
			t.Fatalf("a failure priced at small's prices: %+v, %v", res, err)
		}
		if r := receiptOf(t, h, res.ReceiptID); r.Pricing == nil || *r.Pricing != (wire.Pricing{Model: "small", Priced: true}) {
			t.Fatalf("the failure's receipt pricing %+v", r.Pricing)
		}
		snap, _ := h.Views().Snapshot(ctx)
		if a := snap.Accounting; a.Spent != 3+20+20+3 || a.Reserved != 0 {
			t.Fatalf("accounting %+v", a)
		}
		f.verify(t)
	})
}

// receiptOf reads one receipt through the host.
func receiptOf(t *testing.T, h *host.Host, id string) wire.Receipt {
	t.Helper()
	raw, err := h.Views().Receipt(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var r wire.Receipt
	testkit.MustDecode(t, raw, &r)
	return r
}

// uncleanStops counts the events recording that host id stopped without
// shutting down.
func uncleanStops(t *testing.T, h *host.Host, id string) int {
	t.Helper()
	evs, err := h.Views().Events(context.Background(), 0, 10_000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		var d struct {
			Clean *bool
			Host  *string
		}
		testkit.MustDecode(t, e.Data, &d)
		if e.Kind == wire.EventHostStopped && d.Clean != nil && !*d.Clean && d.Host != nil && *d.Host == id {
			n++
		}
	}
	return n
}

// TestHostRegistry: hosts on one database know each other by identity. A
// host that starts beside a live peer leaves the peer's claims alone; a
// peer gone past the liveness window is recorded as stopped without
// shutting down, once, by a live host, and only its claims are requeued; a
// host restarting under its own identity requeues its own claims at once;
// a second process under a live host's identity takes it over, and the
// first learns so at its next beat.
func TestHostRegistry(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 3)
		clock := storetest.NewClock(time.Now())
		a := f.openAs(t, "a", clock)
		w1, w2 := caller("worker-1"), caller("worker-2")
		fromA := claim(t, a, w1)

		b := f.openAs(t, "b", clock)
		if j := jobState(t, b, fromA.OperationID); j.State != wire.Claimed || j.ClaimHost != "a" || j.Generation != fromA.Claim.Generation {
			t.Fatalf("a live peer's claim after another host started: %s from %q at %d", j.State, j.ClaimHost, j.Generation)
		}
		if _, err := a.Claims().Heartbeat(ctx, w1, fromA.OperationID, refOf(fromA)); err != nil {
			t.Fatalf("a live peer's claim was fenced: %v", err)
		}
		fromB := claim(t, b, w2)

		// A is killed (no Stop). Within the liveness window it is still a peer.
		a.Close()
		clock.Advance(registry.DefaultHostLiveness - time.Second)
		if err := b.Registry().Beat(ctx); err != nil {
			t.Fatal(err)
		}
		if n := uncleanStops(t, b, "a"); n != 0 || jobState(t, b, fromA.OperationID).State != wire.Claimed {
			t.Fatalf("host a retired before its liveness window passed (%d stops)", n)
		}
		clock.Advance(2 * time.Second)
		for range 2 {
			if err := b.Registry().Beat(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if n := uncleanStops(t, b, "a"); n != 1 {
			t.Fatalf("host a's unclean stop recorded %d times, want once", n)
		}
		if j := jobState(t, b, fromA.OperationID); j.State != wire.Queued || j.Generation != fromA.Claim.Generation+1 {
			t.Fatalf("a gone host's claim: %s at %d", j.State, j.Generation)
		}
		if j := jobState(t, b, fromB.OperationID); j.State != wire.Claimed {
			t.Fatalf("the live host's own claim: %s", j.State)
		}
		_, err := b.Claims().Heartbeat(ctx, w1, fromA.OperationID, refOf(fromA))
		wantCode(t, err, wire.CodeStaleClaim)

		// B is killed and started again at once under its own identity.
		b.Close()
		b2 := f.openAs(t, "b", clock)
		if n := uncleanStops(t, b2, "b"); n != 1 {
			t.Fatalf("host b's restart recorded %d unclean stops, want 1", n)
		}
		if j := jobState(t, b2, fromB.OperationID); j.State != wire.Queued || j.Generation != fromB.Claim.Generation+1 {
			t.Fatalf("a restarted host's own claim: %s at %d", j.State, j.Generation)
		}

		// A second process under b's identity takes it over.
		b3 := f.openAs(t, "b", clock)
		if err := b2.Registry().Beat(ctx); !errors.Is(err, registry.ErrTakenOver) {
			t.Fatalf("the first process under a taken-over identity: %v", err)
		}
		if err := b3.Registry().Beat(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b3.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		f.verify(t)
	})
}

// TestBatchedClaims: one claim leases up to max jobs in queue order, each
// with its own claim id, generation and lease and its own event; what is
// left goes to the next claim; max outside 1..64 is refused and changes
// nothing; each batched claim is dispatched and published like any other.
func TestBatchedClaims(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 2)
		h := f.open(t)
		w1, w2 := caller("worker-1"), caller("worker-2")
		for _, bad := range []int{0, -1, wire.MaxClaimBatch + 1} {
			_, err := h.Claims().Claim(ctx, w1, 0, bad)
			wantCode(t, err, wire.CodeInvalid)
		}
		first, err := h.Claims().Claim(ctx, w1, 0, 3)
		if err != nil || len(first.Jobs) != 3 || first.Job == nil || first.Job.OperationID != first.Jobs[0].OperationID {
			t.Fatalf("claim of 3: %+v, %v", first, err)
		}
		ids := map[string]bool{}
		for _, j := range first.Jobs {
			ids[j.Claim.ClaimID] = true
			if d := jobState(t, h, j.OperationID); d.State != wire.Claimed || d.Worker != "worker-1" || d.Generation != j.Claim.Generation {
				t.Fatalf("batched claim of %s: %s by %s at %d", j.OperationID, d.State, d.Worker, d.Generation)
			}
		}
		if len(ids) != 3 {
			t.Fatalf("three claims share ids: %v", ids)
		}
		rest, err := h.Claims().Claim(ctx, w2, 0, 3)
		if err != nil || len(rest.Jobs) != 1 {
			t.Fatalf("the rest of the queue: %+v, %v", rest, err)
		}
		if none, err := h.Claims().Claim(ctx, w2, 0, 3); err != nil || none.Job != nil || len(none.Jobs) != 0 || none.Queue != wire.QueueWaiting {
			t.Fatalf("an empty queue with claims out: %+v, %v", none, err)
		}
		evs, err := h.Views().Events(ctx, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		claimed := 0
		for _, e := range evs {
			if e.Kind == wire.EventClaimed {
				claimed++
			}
		}
		if claimed != 4 {
			t.Fatalf("%d claimed events for 4 claims", claimed)
		}
		for _, j := range first.Jobs {
			if adm := dispatch(t, h, w1, j); adm.Decision != wire.DecisionAllow {
				t.Fatalf("dispatch of a batched claim: %+v", adm)
			}
			if pub, err := h.Publications().Publish(ctx, w1, j.OperationID, canon(t, publishReq(t, h, j, "k-"+j.OperationID))); err != nil || pub.Outcome.Status != wire.StatusPublished {
				t.Fatalf("publication of a batched claim: %+v, %v", pub, err)
			}
		}
		f.verify(t)
	})
}

// TestFirstStartAfterRegistryMigration: a state last served by a build
// without the host registry, whose host crashed (its "serving" setting
// left at 1), records that crash once at its first start under the
// registry, as a restart, and requeues the claims it had left.
func TestFirstStartAfterRegistryMigration(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 1)
		db, err := backend.Open(ctx, statedir.Location(f.state, f.database), backend.Options{})
		if err != nil {
			t.Fatal(err)
		}
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			if err := tx.SettingPut(ctx, "serving", "1"); err != nil {
				return err
			}
			return tx.SettingPut(ctx, "serves", "2")
		})
		db.Close()

		h := f.openAs(t, "a", nil)
		if n := uncleanStops(t, h, ""); n != 1 {
			t.Fatalf("the pre-registry crash was recorded %d times", n)
		}
		evs, err := h.Views().Events(ctx, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if last := evs[len(evs)-1]; last.Kind != wire.EventHostRestarted {
			t.Fatalf("the first start under the registry is %s, want a restart", last.Kind)
		}
		h.Close()
		h2 := f.openAs(t, "a", nil)
		if n := uncleanStops(t, h2, ""); n != 1 {
			t.Fatalf("the pre-registry crash was recorded again (%d) at a later start", n)
		}
	})
}
