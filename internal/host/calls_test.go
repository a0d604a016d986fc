package host_test

// The calls workers and the operator make, each against the contract:
// publications bound to their jobs, credentials, the operator's
// endpoints, failures and retries, pages, keyed claims, dispatch repeats.

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

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
		added, err := a.Access().Add(ctx, "worker-9", access.Terms{})
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
			if _, err := b.Access().Add(ctx, name, access.Terms{}); fleet.ErrorCode(err) != wire.CodeStateConflict {
				t.Fatalf("adding %s again: %v, want state_conflict", name, err)
			}
		}
		if _, err := b.Access().Add(ctx, "no spaces", access.Terms{}); fleet.ErrorCode(err) != wire.CodeInvalid {
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
		doc, err := h.Views().Document(ctx, caller("worker-1"), snap.Jobs[0].DocumentID)
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
		after, err := h.Views().Document(ctx, caller("worker-1"), doc.ID)
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
		if err != nil || len(again.Jobs) != 2 || !reflect.DeepEqual(again.Jobs, first.Jobs) {
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
