package host_test

// The host's conformance suite: claim, lease, cancel, reconcile, requeue,
// restart recovery and several hosts writing at once, run unchanged on
// SQLite and on PostgreSQL (storetest.Each).

import (
	"bytes"
	"context"
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
	"github.com/fleet/fleet/internal/host/access"
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
	h, err := hosttest.Open(context.Background(), f.state, f.database)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	h.ID = id
	if clock != nil {
		h.DB().Now = clock.Now
	}
	if err := h.Start(context.Background(), "test"); err != nil {
		t.Fatal(err)
	}
	return h
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
	doc, err := h.Views().Document(context.Background(), j.DocumentID)
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

// TestPublicationBoundToJob: a publication's body names its job (operation
// id and input digest) and, in a deterministic state, is the section the
// host computes for that input. Anything else, from the job's own current
// claim, is rejected in the publishing transaction: a retained outcome
// with a reason and a receipt, the job still running, nothing spent. The
// right body then publishes, and reconcile shows the binding it checked.
func TestPublicationBoundToJob(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 50, 20, 1)
		h := f.open(t)
		w := caller("worker-1")
		j := claim(t, h, w)
		other := claim(t, h, w)
		if adm := dispatch(t, h, w, j); adm.Decision != wire.DecisionAllow {
			t.Fatalf("admission %+v", adm)
		}
		right := publishReq(t, h, j, "right")
		var fields map[string]any
		testkit.MustDecode(t, right.Body, &fields)
		with := func(key string, value any) json.RawMessage {
			m := map[string]any{}
			for k, v := range fields {
				m[k] = v
			}
			m[key] = value
			return testkit.MustJSON(t, m)
		}
		for name, c := range map[string]struct {
			body json.RawMessage
			says string
		}{
			"unrelated":                      {json.RawMessage(`{"x":1}`), "operation_id"},
			"another job":                    {with("operation_id", other.OperationID), other.OperationID},
			"another input":                  {with("input_sha256", fmt.Sprintf("%064d", 7)), "input_sha256"},
			"another section":                {with("section", "links"), "section"},
			"another result":                 {with("result", map[string]any{"paragraphs": 99, "words": 1, "first_lines": []string{}}), "result"},
			"model in a deterministic state": {with("mode", "model"), "mode"},
		} {
			req := right
			req.OperationKey, req.Body = "wrong-"+name, c.body
			pub, err := h.Publications().Publish(ctx, w, j.OperationID, canon(t, req))
			if err != nil || pub.Outcome.Status != wire.StatusRejected || !strings.Contains(pub.Outcome.Reason, c.says) || pub.Outcome.ReceiptID == "" {
				t.Fatalf("%s: %+v, %v; want rejected naming %q, with a receipt", name, pub.Outcome, err, c.says)
			}
			again, err := h.Publications().Publish(ctx, w, j.OperationID, canon(t, req))
			if err != nil || !again.Replayed || again.Outcome != pub.Outcome {
				t.Fatalf("%s: a repeat got %+v, %v; want the retained rejection", name, again, err)
			}
		}
		snap, _ := h.Views().Snapshot(ctx)
		for _, sj := range snap.Jobs {
			if sj.OperationID == j.OperationID && sj.State != wire.Running {
				t.Fatalf("after rejections the job is %s", sj.State)
			}
		}
		if a := snap.Accounting; a.Spent != 0 || a.Reserved != 20 {
			t.Fatalf("rejections moved credits: %+v", a)
		}
		pub, err := h.Publications().Publish(ctx, w, j.OperationID, canon(t, right))
		if err != nil || pub.Outcome.Status != wire.StatusPublished {
			t.Fatalf("the right body: %+v, %v", pub, err)
		}
		rec, err := h.Operator().Reconcile(ctx, j.OperationID, "")
		if err != nil {
			t.Fatal(err)
		}
		if b := rec.Binding; b == nil || b.OperationID != j.OperationID || b.InputSHA256 != j.InputSHA256 ||
			b.Section != j.Section || !b.Matches {
			t.Fatalf("reconcile's binding %+v, want the job's, matching", rec.Binding)
		}
		f.verify(t)
	})
}

// TestCredentialRevokeAndRotate: a revoked or rotated credential stops
// working at once on the host that changed it and within a second on every
// other host serving the state; the change is signed and logged; the
// revoked worker's claim is left to expire; the operator credential can be
// rotated but not revoked.
func TestCredentialRevokeAndRotate(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 50, 20, 3)
		clock := storetest.NewClock(time.Now())
		a, b := f.openAs(t, "a", clock), f.openAs(t, "b", clock)
		token := func(name string) string {
			t.Helper()
			tok, err := statedir.ReadCredential(filepath.Join(f.state, "credentials", name))
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}
		accepts := func(h *host.Host, tok string) bool {
			t.Helper()
			_, _, err := h.Access().Authenticate(ctx, tok)
			if err != nil && fleet.ErrorCode(err) != wire.CodeUnauthorized {
				t.Fatal(err)
			}
			return err == nil
		}
		w2, w1 := token("worker-2"), token("worker-1")
		if !accepts(a, w2) || !accepts(b, w2) || !accepts(b, w1) {
			t.Fatal("a credential in force was refused")
		}
		held := claim(t, a, caller("worker-2"))

		revoked, err := a.Access().Revoke(ctx, "worker-2")
		if err != nil || !revoked.Changed || revoked.ReceiptID == "" || revoked.Credential.RevokedAtMS == 0 {
			t.Fatalf("revoke: %+v, %v", revoked, err)
		}
		if accepts(a, w2) {
			t.Fatal("the host that revoked it still accepts the credential")
		}
		// Its holder is told it was revoked, not that it is unknown; a
		// token never issued is still unknown.
		if _, _, err := a.Access().Authenticate(ctx, w2); err == nil || !strings.Contains(err.Error(), "credential worker-2 was revoked at ") {
			t.Fatalf("a revoked credential's refusal: %v", err)
		}
		if _, _, err := a.Access().Authenticate(ctx, "fleet_never-issued"); err == nil || err.Error() != "unauthorized: unknown credential" {
			t.Fatalf("an unknown credential's refusal: %v", err)
		}
		clock.Advance(time.Second)
		if accepts(b, w2) {
			t.Fatal("another host still accepts a credential revoked a second ago")
		}
		again, err := b.Access().Revoke(ctx, "worker-2")
		if err != nil || again.Changed || again.ReceiptID != "" {
			t.Fatalf("revoking again: %+v, %v; want nothing changed", again, err)
		}
		if _, err := a.Access().Rotate(ctx, "worker-2"); fleet.ErrorCode(err) != wire.CodeStateConflict {
			t.Fatalf("rotating a revoked credential: %v", err)
		}
		if d, err := a.Views().Job(ctx, held.OperationID); err != nil || d.State != wire.Claimed || d.Worker != "worker-2" {
			t.Fatalf("the revoked worker's claim: %+v, %v; want it left claimed", d, err)
		}

		rotated, err := b.Access().Rotate(ctx, "worker-1")
		if err != nil || !rotated.Changed || rotated.Token == "" || rotated.Token == w1 {
			t.Fatalf("rotate: %+v, %v", rotated, err)
		}
		if token("worker-1") != rotated.Token {
			t.Fatal("the credential file does not hold the new token")
		}
		if accepts(b, w1) || !accepts(b, rotated.Token) {
			t.Fatal("after rotating, the host still takes the old token or refuses the new one")
		}
		clock.Advance(time.Second)
		if accepts(a, w1) || !accepts(a, rotated.Token) {
			t.Fatal("a second after rotating, another host takes the old token or refuses the new one")
		}

		if _, err := a.Access().Revoke(ctx, host.OperatorName); fleet.ErrorCode(err) != wire.CodeInvalid {
			t.Fatalf("revoking the operator credential: %v", err)
		}
		if _, err := a.Access().Revoke(ctx, "nobody"); fleet.ErrorCode(err) != wire.CodeNotFound {
			t.Fatalf("revoking an unknown credential: %v", err)
		}
		// Added while serving: the token comes back once and is written
		// to its file; every host takes it within a second; a name taken
		// (even by a revoked credential) or malformed is refused.
		added, err := a.Access().Add(ctx, "worker-9")
		if err != nil || !added.Changed || added.Token == "" || added.ReceiptID == "" || added.Credential.Role != access.RoleWorker {
			t.Fatalf("add: %+v, %v", added, err)
		}
		if token("worker-9") != added.Token || !accepts(a, added.Token) {
			t.Fatal("the added credential's file or token is wrong")
		}
		clock.Advance(time.Second)
		if !accepts(b, added.Token) {
			t.Fatal("a second after adding it, another host refuses the new credential")
		}
		for _, name := range []string{"worker-9", "worker-2", host.OperatorName} {
			if _, err := b.Access().Add(ctx, name); fleet.ErrorCode(err) != wire.CodeStateConflict {
				t.Fatalf("adding %s again: %v, want state_conflict", name, err)
			}
		}
		if _, err := b.Access().Add(ctx, "no spaces"); fleet.ErrorCode(err) != wire.CodeInvalid {
			t.Fatalf("adding a malformed name: %v", err)
		}
		list, err := a.Access().List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range list {
			if (c.Name == "worker-2") != (c.RevokedAtMS != 0) {
				t.Fatalf("credentials %+v", list)
			}
		}
		evs, err := a.Views().Events(ctx, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var changes []string
		for _, e := range evs {
			if e.Kind == wire.EventCredential {
				changes = append(changes, e.Title)
			}
		}
		if len(changes) != 3 {
			t.Fatalf("credential events %q, want a revocation, a rotation and an addition", changes)
		}
		f.verify(t)
	})
}

// TestOperatorEndpointsAsSeeded: the operator endpoints answer as the seed
// design's do. Cancelling a running job says the cancellation was
// requested; reconciling a job whose worker holds a live lease is refused
// (still_running, no receipt); reconciling a settled job that has not
// changed since its last reconciliation returns that reconciliation's
// receipt instead of signing another; and the answer carries the
// published artifact beside the outcome.
func TestOperatorEndpointsAsSeeded(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 2)
		clock := storetest.NewClock(time.Now())
		h := f.openAs(t, "", clock)
		w := caller("worker-1")
		receiptsOf := func(op string) int {
			t.Helper()
			d, err := h.Views().Job(ctx, op)
			if err != nil {
				t.Fatal(err)
			}
			return len(d.Receipts)
		}

		running := claim(t, h, w)
		dispatch(t, h, w, running)
		before := receiptsOf(running.OperationID)
		if _, err := h.Operator().Reconcile(ctx, running.OperationID, ""); fleet.ErrorCode(err) != wire.CodeStillRunning {
			t.Fatalf("reconciling a job under a live lease: %v, want still_running", err)
		}
		if receiptsOf(running.OperationID) != before {
			t.Fatal("a refused reconciliation signed a receipt")
		}
		cancelled, err := h.Operator().Cancel(ctx, running.OperationID, "")
		if err != nil || !cancelled.CancellationRequested || cancelled.State != wire.Cancelled {
			t.Fatalf("cancel a running job: %+v, %v", cancelled, err)
		}

		done := claim(t, h, w)
		dispatch(t, h, w, done)
		req := publishReq(t, h, done, "k")
		if pub, err := h.Publications().Publish(ctx, w, done.OperationID, canon(t, req)); err != nil || pub.Outcome.Status != wire.StatusPublished {
			t.Fatalf("publish: %+v, %v", pub, err)
		}
		first, err := h.Operator().Reconcile(ctx, done.OperationID, "")
		if err != nil || !first.ReusedExistingEffect || first.ReconciliationReceipt == "" {
			t.Fatalf("reconcile: %+v, %v", first, err)
		}
		stored, err := resource.Normalize(req) // the body as stored: canonical
		if err != nil {
			t.Fatal(err)
		}
		if string(first.Artifact) != string(stored.Body) {
			t.Fatalf("artifact %s, want the published body %s", first.Artifact, stored.Body)
		}
		clock.Advance(time.Minute)
		n := receiptsOf(done.OperationID)
		again, err := h.Operator().Reconcile(ctx, done.OperationID, "")
		if err != nil || again.ReconciliationReceipt != first.ReconciliationReceipt || receiptsOf(done.OperationID) != n {
			t.Fatalf("reconciling an unchanged job again: %+v, %v; want the first reconciliation's receipt %s and no new one",
				again, err, first.ReconciliationReceipt)
		}

		// A lease that ran out is no longer a live worker: reconcile answers,
		// and a requeue (a change) makes the next reconciliation a new one.
		late := claim(t, h, w)
		dispatch(t, h, w, late)
		clock.Advance(h.Lease + time.Second)
		if _, err := h.Claims().ExpireLeases(ctx); err != nil {
			t.Fatal(err)
		}
		one, err := h.Operator().Reconcile(ctx, late.OperationID, "")
		if err != nil || one.State != wire.Unresolved || one.ReusedExistingEffect {
			t.Fatalf("reconcile an unresolved job: %+v, %v", one, err)
		}
		if _, err := h.Operator().Requeue(ctx, late.OperationID, ""); err != nil {
			t.Fatal(err)
		}
		two, err := h.Operator().Reconcile(ctx, late.OperationID, "")
		if err != nil || two.ReconciliationReceipt == one.ReconciliationReceipt {
			t.Fatalf("reconciling after a requeue: %+v, %v; want a new reconciliation", two, err)
		}
		f.verify(t)
	})
}

// TestFailAndRetry: a worker's failed attempt settles what it cost and
// queues the job again at a new generation, not claimable before its
// backoff; a repeat of the call gets the same answer and any other claim
// is stale; a lease that runs out before dispatch counts as an attempt;
// the last attempt fails the job, keeping every reason; requeue starts it
// over.
func TestFailAndRetry(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 2, func(m map[string]any) {
			m["sections"], m["max_attempts"], m["backoff_base_ms"], m["backoff_cap_ms"] = []string{"summary"}, 3, 1000, 4000
		})
		clock := storetest.NewClock(time.Now())
		h := f.openAs(t, "", clock)
		w1, w2 := caller("worker-1"), caller("worker-2")
		fail := func(who fleet.Caller, j wire.ClaimedJob, req wire.FailRequest) wire.FailResult {
			t.Helper()
			req.ClaimID, req.Generation = j.Claim.ClaimID, j.Claim.Generation
			res, err := h.Failures().Fail(ctx, who, j.OperationID, req)
			if err != nil {
				t.Fatalf("fail: %v", err)
			}
			return res
		}
		noClaim := func() {
			t.Helper()
			if res, err := h.Claims().Claim(ctx, w2, 0, 1); err != nil || res.Job != nil {
				t.Fatalf("claimed a job still backing off: %+v, %v", res.Job, err)
			}
		}

		first := claim(t, h, w1)
		dispatch(t, h, w1, first)
		start := clock.Now().UnixMilli()
		r1 := fail(w1, first, wire.FailRequest{Reason: "model answered 500 five times", Retryable: true})
		if r1.State != wire.Queued || r1.Attempt != 1 || r1.MaxAttempts != 3 || r1.Settled != 20 || r1.Released != 0 ||
			r1.ClaimableAtMS < start+500 || r1.ClaimableAtMS > start+1000 || r1.ReceiptID == "" {
			t.Fatalf("first failure: %+v", r1)
		}
		if again := fail(w1, first, wire.FailRequest{Reason: "model answered 500 five times", Retryable: true}); again != r1 {
			t.Fatalf("a repeated fail got %+v, want %+v", again, r1)
		}
		if _, err := h.Failures().Fail(ctx, w1, first.OperationID, wire.FailRequest{ClaimID: "another", Generation: first.Claim.Generation,
			Reason: "x", Retryable: true}); fleet.ErrorCode(err) != wire.CodeStaleClaim {
			t.Fatalf("a fail under another claim: %v", err)
		}
		if _, err := h.Claims().Heartbeat(ctx, w1, first.OperationID, refOf(first)); fleet.ErrorCode(err) != wire.CodeStaleClaim {
			t.Fatalf("the failed attempt's heartbeat: %v", err)
		}
		noClaim()
		clock.Advance(time.Duration(r1.ClaimableAtMS-start) * time.Millisecond)

		second := claim(t, h, w2)
		if second.OperationID != first.OperationID || second.Claim.Generation <= first.Claim.Generation {
			t.Fatalf("the retry: %+v", second)
		}
		dispatch(t, h, w2, second)
		at := clock.Now().UnixMilli()
		r2 := fail(w2, second, wire.FailRequest{Reason: "the section could not be computed", Retryable: true, NoEffect: true})
		if r2.State != wire.Queued || r2.Attempt != 2 || r2.Settled != 0 || r2.Released != 20 ||
			r2.ClaimableAtMS < at+1000 || r2.ClaimableAtMS > at+2000 {
			t.Fatalf("second failure (no effect, backoff doubled): %+v", r2)
		}
		noClaim()
		clock.Advance(2 * time.Second)

		// The third attempt's worker dies after its claim: the lease runs
		// out before dispatch, its last attempt.
		third := claim(t, h, w1)
		clock.Advance(h.Lease + time.Second)
		if n, err := h.Claims().ExpireLeases(ctx); err != nil || n != 1 {
			t.Fatalf("expire: %d, %v", n, err)
		}
		d, err := h.Views().Job(ctx, third.OperationID)
		if err != nil {
			t.Fatal(err)
		}
		if d.State != wire.Failed || d.Attempts != 3 || len(d.AttemptLog) != 3 || d.AttemptLog[0].Reason != "model answered 500 five times" ||
			d.AttemptLog[2].Reason != "the lease expired before dispatch" || d.LastError != "the lease expired before dispatch" {
			t.Fatalf("after the last attempt: %s, %d attempts, log %+v", d.State, d.Attempts, d.AttemptLog)
		}
		if _, err := h.Failures().Fail(ctx, w1, third.OperationID, wire.FailRequest{ClaimID: third.Claim.ClaimID, Generation: third.Claim.Generation,
			Reason: "late", Retryable: true}); fleet.ErrorCode(err) != wire.CodeStaleClaim {
			t.Fatalf("a late fail from the lapsed claim: %v", err)
		}
		snap, _ := h.Views().Snapshot(ctx)
		if a := snap.Accounting; a.Spent != 20 || a.Reserved != 0 || a.Available != 80 {
			t.Fatalf("accounting after three attempts: %+v", a)
		}
		f.verify(t)

		rq, err := h.Operator().Requeue(ctx, third.OperationID, "")
		if err != nil || rq.State != wire.Queued {
			t.Fatalf("requeue a failed job: %+v, %v", rq, err)
		}
		again := claim(t, h, w2)
		if d, _ := h.Views().Job(ctx, again.OperationID); d.Attempts != 0 {
			t.Fatalf("a requeued job keeps %d attempts", d.Attempts)
		}
		f.verify(t)
	})
}

// TestJobPagesUnderInserts: paging through the jobs while reports are
// submitted skips no job that existed when paging began and repeats none;
// pages come in queue order; filters and counts agree with the snapshot.
func TestJobPagesUnderInserts(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 2)
		clock := storetest.NewClock(time.Now())
		h := f.openAs(t, "", clock)
		submit := func(i int) {
			key, doc := fmt.Sprintf("batch-%d", i), fmt.Sprintf("%s\nbatch %d\n", document, i)
			if _, err := h.Operator().SubmitReports(ctx, wire.ReportsRequest{Document: &doc,
				Sections: []string{"summary", "terms", "actions", "links"}, IdempotencyKey: &key}); err != nil {
				t.Error(err)
			}
		}
		for i := range 5 {
			submit(i)
		}
		claim(t, h, caller("worker-1"))
		before, _ := h.Views().Snapshot(ctx)

		done := make(chan struct{})
		go func() { // reports keep arriving while the client pages
			defer close(done)
			for i := 5; i < 25; i++ {
				submit(i)
			}
		}()
		seen := map[string]bool{}
		var last int64
		after, pages := "", 0
		for {
			page, err := h.Views().JobPage(ctx, wire.JobPageQuery{After: after, Limit: 3})
			if err != nil {
				t.Fatal(err)
			}
			pages++
			for _, j := range page.Jobs {
				if seen[j.OperationID] || j.Position <= last {
					t.Fatalf("page %d repeats %s or goes back (position %d after %d)", pages, j.OperationID, j.Position, last)
				}
				seen[j.OperationID], last = true, j.Position
			}
			if page.Next == "" {
				break
			}
			after = page.Next
		}
		<-done
		for _, j := range before.Jobs {
			if !seen[j.OperationID] {
				t.Fatalf("job %s (position %d) existed before paging began and was skipped", j.OperationID, j.Position)
			}
		}
		if pages < len(before.Jobs)/3 {
			t.Fatalf("%d pages for %d jobs", pages, len(before.Jobs))
		}

		claimed, err := h.Views().JobPage(ctx, wire.JobPageQuery{State: wire.Claimed, Section: "summary"})
		if err != nil || len(claimed.Jobs) != 1 || claimed.Jobs[0].State != wire.Claimed || claimed.Next != "" {
			t.Fatalf("claimed summaries: %+v, %v", claimed, err)
		}
		owned, err := h.Views().JobPage(ctx, wire.JobPageQuery{Owner: "worker-1", Q: claimed.Jobs[0].OperationID[:13]})
		if err != nil || len(owned.Jobs) != 1 || owned.Jobs[0].OperationID != claimed.Jobs[0].OperationID {
			t.Fatalf("worker-1's jobs by an id's start: %+v, %v", owned.Jobs, err)
		}
		// Counts are read at most once a second: a batch submitted within
		// the second shows in the next second's.
		clock.Advance(time.Second)
		snap, _ := h.Views().Snapshot(ctx)
		now, err := h.Views().JobPage(ctx, wire.JobPageQuery{Limit: 1})
		if err != nil || now.Counts[wire.Queued] != int64(len(snap.Jobs)-1) || now.Counts[wire.Claimed] != 1 {
			t.Fatalf("counts %v, %v, for %d jobs", now.Counts, err, len(snap.Jobs))
		}
		submit(99)
		if same, _ := h.Views().JobPage(ctx, wire.JobPageQuery{Limit: 1}); same.Counts[wire.Queued] != now.Counts[wire.Queued] {
			t.Fatalf("counts read again within the second: %v", same.Counts)
		}
		clock.Advance(time.Second)
		if later, _ := h.Views().JobPage(ctx, wire.JobPageQuery{Limit: 1}); later.Counts[wire.Queued] != now.Counts[wire.Queued]+4 {
			t.Fatalf("counts a second later %v, want %d queued", later.Counts, now.Counts[wire.Queued]+4)
		}
		for _, bad := range []wire.JobPageQuery{{State: "sleeping"}, {Section: "poem"}, {After: "x"}, {Limit: wire.MaxJobPage + 1}} {
			if _, err := h.Views().JobPage(ctx, bad); fleet.ErrorCode(err) != wire.CodeInvalid {
				t.Errorf("%+v: %v, want invalid_request", bad, err)
			}
		}
	})
}

// TestFailAnswerRetained: a fail whose answer was lost and that is sent
// again under the same claim gets the answer it had, even after another
// worker has claimed the retried job and failed it in turn (issue 21,
// item 5: it used to be stale_claim, since only the last attempt was read).
func TestFailAnswerRetained(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 2, func(m map[string]any) {
			m["sections"], m["max_attempts"], m["backoff_base_ms"], m["backoff_cap_ms"] = []string{"summary"}, 5, 0, 0
		})
		h := f.open(t)
		w1, w2 := caller("worker-1"), caller("worker-2")
		first := claim(t, h, w1)
		dispatch(t, h, w1, first)
		lost := wire.FailRequest{ClaimID: first.Claim.ClaimID, Generation: first.Claim.Generation,
			Reason: "model answered 500", Retryable: true}
		r1, err := h.Failures().Fail(ctx, w1, first.OperationID, lost)
		if err != nil || r1.State != wire.Queued || r1.Attempt != 1 {
			t.Fatalf("first fail: %+v, %v", r1, err)
		}
		second := claim(t, h, w2)
		if second.OperationID != first.OperationID {
			t.Fatalf("worker-2 claimed %s, not the retried job", second.OperationID)
		}
		r2, err := h.Failures().Fail(ctx, w2, second.OperationID, wire.FailRequest{ClaimID: second.Claim.ClaimID,
			Generation: second.Claim.Generation, Reason: "timed out", Retryable: true})
		if err != nil || r2.Attempt != 2 {
			t.Fatalf("second fail: %+v, %v", r2, err)
		}
		again, err := h.Failures().Fail(ctx, w1, first.OperationID, lost)
		if err != nil || again != r1 {
			t.Fatalf("worker-1's repeated fail after worker-2's: %+v, %v; want its retained answer %+v", again, err, r1)
		}
		// The retained answer is the claim holder's alone.
		if _, err := h.Failures().Fail(ctx, w2, first.OperationID, lost); fleet.ErrorCode(err) != wire.CodeStaleClaim {
			t.Fatalf("another worker presenting worker-1's claim: %v", err)
		}
		if d, _ := h.Views().Job(ctx, first.OperationID); d.Attempts != 2 {
			t.Fatalf("the repeat changed the job: %d attempts", d.Attempts)
		}
		f.verify(t)
	})
}

// TestAssignToRevokedWorker: the operator cannot hand a document to a
// worker whose credential was revoked, nor to one that does not exist;
// the document is left as it was (issue 21, item 6).
func TestAssignToRevokedWorker(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 50, 20, 3)
		h := f.open(t)
		snap, err := h.Views().Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := h.Views().Document(ctx, snap.Jobs[0].DocumentID)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.Access().Revoke(ctx, "worker-3"); err != nil {
			t.Fatal(err)
		}
		for _, owner := range []string{"worker-3", "worker-9", host.OperatorName} {
			gen := doc.Generation
			_, err := h.Operator().Assign(ctx, doc.ID, wire.AssignRequest{ExpectedGeneration: &gen, Owner: &owner})
			if fleet.ErrorCode(err) != wire.CodeInvalid || !strings.Contains(fleet.ErrorMessage(err), owner) {
				t.Fatalf("assigning to %s: %v; want invalid_request naming it", owner, err)
			}
		}
		after, err := h.Views().Document(ctx, doc.ID)
		if err != nil || after.Generation != doc.Generation || after.Owner != doc.Owner {
			t.Fatalf("the document after refused assignments: %+v, %v; was %+v", after, err, doc)
		}
		gen, owner := doc.Generation, "worker-1"
		if _, err := h.Operator().Assign(ctx, doc.ID, wire.AssignRequest{ExpectedGeneration: &gen, Owner: &owner}); err != nil {
			t.Fatalf("assigning to a worker in force: %v", err)
		}
	})
}

// TestFailReasonPlainText: a reason that could pass for other output when
// printed (a line break, a bidi override, a zero-width character) is
// refused as invalid_request and changes nothing (issue 21, item 7).
func TestFailReasonPlainText(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 2, func(m map[string]any) { m["sections"] = []string{"summary"} })
		h := f.open(t)
		w1 := caller("worker-1")
		j := claim(t, h, w1)
		for _, reason := range []string{
			"boom\n  99  12:00:00.000  fleet.completed   operator  The operator approved",
			"boom\r\nforged", "tab\there", "line\u2028separator", "para\u2029graph",
			"evil \u202egnp.exe", "zero\u200bwidth", "joiner\u200d", "bom\ufeff", "\u2066isolate\u2069",
		} {
			_, err := h.Failures().Fail(ctx, w1, j.OperationID, wire.FailRequest{ClaimID: j.Claim.ClaimID, Generation: j.Claim.Generation,
				Reason: reason, Retryable: true})
			if fleet.ErrorCode(err) != wire.CodeInvalid {
				t.Errorf("reason %q: %v; want invalid_request", reason, err)
			}
		}
		if d, _ := h.Views().Job(ctx, j.OperationID); d.Attempts != 0 || d.State != wire.Claimed {
			t.Fatalf("refused fails changed the job: %s, %d attempts", d.State, d.Attempts)
		}
		if _, err := h.Failures().Fail(ctx, w1, j.OperationID, wire.FailRequest{ClaimID: j.Claim.ClaimID, Generation: j.Claim.Generation,
			Reason: "naïve café: the model said «non» (HTTP 500) — 日本語", Retryable: true}); err != nil {
			t.Fatalf("plain text in other scripts: %v", err)
		}
	})
}

// TestKeyedClaimRepeat: a keyed claim sent again with repeat answers the
// jobs its caller still holds under the key, and claims nothing more; a
// repeat whose jobs are gone (or that never committed) claims afresh; a
// key is the caller's own.
func TestKeyedClaimRepeat(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 2)
		h := f.open(t)
		w1, w2 := caller("worker-1"), caller("worker-2")
		const key = "0d5e3a2c-1111-4e6f-9a3b-2c4d5e6f7a8b"
		first, err := h.Claims().ClaimKeyed(ctx, w1, 0, 2, key, false)
		if err != nil || len(first.Jobs) != 2 || !strings.HasPrefix(first.Jobs[0].Claim.ClaimID, key+".") ||
			!strings.HasPrefix(first.Jobs[1].Claim.ClaimID, key+".") || first.Jobs[0].Claim.ClaimID == first.Jobs[1].Claim.ClaimID {
			t.Fatalf("keyed claim: %+v, %v", first, err)
		}
		again, err := h.Claims().ClaimKeyed(ctx, w1, 0, 2, key, true)
		if err != nil || len(again.Jobs) != 2 || again.Jobs[0] != first.Jobs[0] || again.Jobs[1] != first.Jobs[1] {
			t.Fatalf("the repeat: %+v, %v; want the first answer %+v", again.Jobs, err, first.Jobs)
		}
		if other, err := h.Claims().ClaimKeyed(ctx, w2, 0, 1, key, true); err != nil || len(other.Jobs) != 1 ||
			other.Jobs[0].OperationID == first.Jobs[0].OperationID || other.Jobs[0].OperationID == first.Jobs[1].OperationID {
			t.Fatalf("another worker repeating worker-1's key: %+v, %v; want a job of its own", other.Jobs, err)
		}
		snap, _ := h.Views().Snapshot(ctx)
		claimed := 0
		for _, j := range snap.Jobs {
			if j.State == wire.Claimed {
				claimed++
			}
		}
		if claimed != 3 {
			t.Fatalf("%d jobs claimed; want 3 (the repeat claimed nothing more)", claimed)
		}
		dispatch(t, h, w1, first.Jobs[0])
		dispatch(t, h, w1, first.Jobs[1])
		if fresh, err := h.Claims().ClaimKeyed(ctx, w1, 0, 1, key, true); err != nil || len(fresh.Jobs) != 1 ||
			!strings.HasPrefix(fresh.Jobs[0].Claim.ClaimID, key+".") || fresh.Jobs[0].OperationID == first.Jobs[0].OperationID {
			t.Fatalf("a repeat whose jobs moved on: %+v, %v; want a fresh claim", fresh.Jobs, err)
		}
	})
}

// TestDispatchRepeatBeforeItsReceiptIsPlaced: a dispatch committed on one
// host whose receipt its sequencer has not placed yet (the host died
// between the two, or is slow) and repeated on another host gets the
// admission, its receipt placed and signed, not not_found. PostgreSQL only:
// with one writer the log is placed in the deciding commit.
func TestDispatchRepeatBeforeItsReceiptIsPlaced(t *testing.T) {
	t.Parallel()
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: only a backend with several writers places its log after commit; set " + storetest.EnvPostgres)
	}
	t.Run(storetest.Postgres, func(t *testing.T) {
		ctx := context.Background()
		f := newState(t, 100, 20, 1)
		a, b := f.openAs(t, "a", nil), f.openAs(t, "b", nil)
		w := caller("worker-1")
		j := claim(t, a, w)
		// Hold the log lock, so no sequencer can place anything.
		holder, err := a.DB().Driver().BeginWrite(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback()
		if err := holder.LockLog(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := holder.JobMaxPosition(ctx); err != nil { // a query sends what the pipeline holds
			t.Fatal(err)
		}
		first := make(chan error, 1)
		go func() {
			_, err := a.Admission().Dispatch(ctx, w, j.OperationID, refOf(j))
			first <- err
		}()
		// The dispatch commits, and waits for its receipt to be placed.
		for {
			var running bool
			storetest.Read(t, b.DB(), func(ctx context.Context, tx *store.Tx) error {
				got, err := tx.JobGet(ctx, j.OperationID, store.NoLock)
				running = got.State == wire.Running
				return err
			})
			if running {
				break
			}
			select {
			case err := <-first:
				t.Fatalf("the dispatch returned before its receipt could be placed: %v", err)
			case <-time.After(10 * time.Millisecond):
			}
		}
		repeat := make(chan error, 1)
		var adm wire.Admission
		go func() {
			raw, err := b.Admission().Dispatch(ctx, w, j.OperationID, refOf(j))
			if err == nil {
				err = json.Unmarshal(raw, &adm)
			}
			repeat <- err
		}()
		select {
		case err := <-repeat:
			t.Fatalf("the repeat answered before the receipt was placed: %+v, %v", adm, err)
		case <-time.After(300 * time.Millisecond):
		}
		holder.Rollback() // the log lock is free: the entries get placed
		if err := <-repeat; err != nil || adm.Decision != wire.DecisionAllow || adm.Receipt.Signature == "" || adm.Receipt.Sequence == 0 {
			t.Fatalf("the repeat: %+v, %v", adm, err)
		}
		if err := <-first; err != nil {
			t.Fatal(err)
		}
	})
}
