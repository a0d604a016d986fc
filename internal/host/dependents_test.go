package host_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// runJob claims the next job as who, dispatches and publishes what a
// deterministic worker computes for it (from the outputs its input names),
// and answers it.
func runJob(t *testing.T, h *host.Host, who fleet.Caller) wire.ClaimedJob {
	t.Helper()
	ctx := context.Background()
	j := claim(t, h, who)
	if adm := dispatch(t, h, who, j); adm.Decision != wire.DecisionAllow {
		t.Fatalf("admission of %s: %+v", j.Section, adm)
	}
	var outputs []sections.Output
	for _, dep := range j.Input.After {
		doc, err := h.Views().Document(ctx, who, dep.DocumentID)
		if err != nil || doc.Version != dep.Version || fleet.DigestHex(doc.Body) != dep.OutputSHA256 {
			t.Fatalf("%s's output for %s: version %d, digest %s (%v); its input names %+v", dep.Section, j.Section, doc.Version,
				fleet.DigestHex(doc.Body), err, dep)
		}
		outputs = append(outputs, sections.Output{Section: dep.Section, Body: doc.Body})
	}
	body, err := sections.BodyAfter(j.OperationID, j.Section, j.InputSHA256, j.Input.Document, outputs)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := h.Views().Document(ctx, who, j.DocumentID)
	if err != nil {
		t.Fatal(err)
	}
	req := wire.PublishRequest{OperationKey: "key-" + j.OperationID, Generation: j.Claim.Generation, ExpectedVersion: doc.Version, Body: body}
	pub, err := h.Publications().Publish(ctx, who, j.OperationID, canon(t, req))
	if err != nil || pub.Outcome.Status != wire.StatusPublished {
		t.Fatalf("publish %s: %+v, %v", j.Section, pub, err)
	}
	return j
}

// summaryAfterTwo opens a host with the sample's jobs claimed out of the
// way and submits a report (under key) whose summary waits for its terms
// and links: the state, the host, its worker and the summary's operation
// id.
func summaryAfterTwo(t *testing.T, key string) (fixture, *host.Host, fleet.Caller, string) {
	t.Helper()
	f := newState(t, 1_000_000, 1, 2)
	h := f.open(t)
	claimTenants(t, h, 4)
	doc := document
	res, err := h.Operator().SubmitReports(context.Background(), wire.ReportsRequest{Document: &doc,
		Sections: []string{"summary", "terms", "links"}, IdempotencyKey: &key, After: map[string][]string{"summary": {"terms", "links"}}})
	if err != nil {
		t.Fatal(err)
	}
	return f, h, caller("worker-1"), res.OperationIDs[0]
}

// TestDependenciesPublishedInOneBatch, on both backends: a summary that
// waits for two sections is queued when one batch publishes both, its
// input naming both outputs: the batch's second publication reads the
// first's job back as completed, though its completion is held to the
// batch's end.
func TestDependenciesPublishedInOneBatch(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		_, h, w, summary := summaryAfterTwo(t, "deps-batch")
		var calls []ledger.JobCall[resource.Request]
		for range 2 {
			j := claim(t, h, w)
			if adm := dispatch(t, h, w, j); adm.Decision != wire.DecisionAllow {
				t.Fatalf("admission of %s: %+v", j.Section, adm)
			}
			body, err := sections.Body(j.OperationID, j.Section, j.InputSHA256, j.Input.Document)
			if err != nil {
				t.Fatal(err)
			}
			calls = append(calls, ledger.JobCall[resource.Request]{OperationID: j.OperationID,
				Request: canon(t, wire.PublishRequest{OperationKey: "key-" + j.OperationID, Generation: j.Claim.Generation, Body: body})})
		}
		answers, err := h.Publications().PublishMany(ctx, w, calls)
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range answers {
			if a.Err != nil || a.Value.Outcome.Status != wire.StatusPublished {
				t.Fatalf("publication %d: %+v, %v", i, a.Value, a.Err)
			}
		}
		d, err := h.Views().Job(ctx, summary)
		if err != nil || d.State != wire.Queued || d.WaitingOn != 0 || len(d.Input.After) != 2 ||
			d.Input.After[0].Section != "links" || d.Input.After[1].Section != "terms" {
			t.Fatalf("the summary once one batch published both: %+v, %v", d, err)
		}
		if last := runJob(t, h, w); last.OperationID != summary {
			t.Fatalf("the job run after the batch: %+v", last)
		}
	})
}

// TestDependencies, on both backends: a summary that waits for two other
// sections is blocked, never claimed, until the publication of the second
// queues it in its transaction, with its input naming both outputs; its
// deterministic body, computed from them, is the one the host binds it
// to. A dependency cancelled leaves its dependent blocked, the detail
// saying which and why; the blocked job can be cancelled. A ring is
// refused with nothing enqueued.
func TestDependencies(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f, h, w, summary := summaryAfterTwo(t, "deps-1")
		d, err := h.Views().Job(ctx, summary)
		if err != nil || d.State != wire.Blocked || d.WaitingOn != 2 || len(d.Dependencies) != 2 {
			t.Fatalf("the summary as submitted: %+v, %v", d, err)
		}
		// A blocked job is left as it is by a reconciliation (nothing was
		// published), and is not requeued.
		if rec, err := h.Operator().Reconcile(ctx, summary, ""); err != nil || rec.State != wire.Blocked || rec.ReusedExistingEffect {
			t.Fatalf("reconciling the blocked summary: %+v, %v", rec, err)
		}
		if _, err := h.Operator().Requeue(ctx, summary, ""); fleet.ErrorCode(err) != wire.CodeStateConflict {
			t.Fatalf("requeueing the blocked summary: %v", err)
		}
		first := runJob(t, h, w)
		if d := jobState(t, h, summary); d.State != wire.Blocked || d.WaitingOn != 1 {
			t.Fatalf("the summary after %s published: %+v", first.Section, d)
		}
		// Another publication of the completed section (a new key) does
		// not publish, and does not count it again.
		again := wire.PublishRequest{OperationKey: "key-again", Generation: first.Claim.Generation, ExpectedVersion: 1,
			Body: json.RawMessage(`{"operation_id":"` + first.OperationID + `"}`)}
		if pub, err := h.Publications().Publish(ctx, w, first.OperationID, canon(t, again)); err != nil || pub.Outcome.Status == wire.StatusPublished {
			t.Fatalf("publishing %s again: %+v, %v", first.Section, pub, err)
		}
		if d := jobState(t, h, summary); d.State != wire.Blocked || d.WaitingOn != 1 {
			t.Fatalf("the summary after %s was published again: %+v", first.Section, d)
		}
		second := runJob(t, h, w)
		if first.OperationID == summary || second.OperationID == summary {
			t.Fatal("the summary was claimed while blocked")
		}
		d, err = h.Views().Job(ctx, summary)
		if err != nil || d.State != wire.Queued || d.WaitingOn != 0 || len(d.Input.After) != 2 ||
			d.Input.After[0].Section != "links" || d.Input.After[1].Section != "terms" || d.Input.After[0].Version != 1 {
			t.Fatalf("the summary once both published: %+v, %v", d, err)
		}
		events, err := h.Views().FindEvents(ctx, wire.EventQuery{Kind: wire.EventUnblocked, Before: 1 << 62, Limit: 10})
		if err != nil || len(events) != 1 || events[0].OperationID != summary || events[0].Actor != "worker-1" {
			t.Fatalf("the unblocking events: %+v, %v", events, err)
		}
		last := runJob(t, h, w)
		if last.OperationID != summary || last.InputSHA256 != d.InputSHA256 {
			t.Fatalf("the third job run: %+v", last)
		}
		done, err := h.Views().Job(ctx, summary)
		if err != nil || done.State != wire.Completed {
			t.Fatalf("the summary after its publication: %+v, %v", done, err)
		}
		var body struct {
			Result struct {
				From []map[string]string `json:"from"`
			} `json:"result"`
		}
		if err := json.Unmarshal(done.Document.Body, &body); err != nil || len(body.Result.From) != 2 ||
			body.Result.From[0]["section"] != "links" || !strings.HasPrefix(body.Result.From[1]["line"], "terms: ") {
			t.Fatalf("the summary's body: %s (%v)", done.Document.Body, err)
		}

		// A dependency cancelled: its dependent stays blocked, and says why.
		doc, key := document, "deps-2"
		res, err := h.Operator().SubmitReports(ctx, wire.ReportsRequest{Document: &doc, Sections: []string{"actions", "summary"},
			IdempotencyKey: &key, After: map[string][]string{"summary": {"actions"}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.Operator().Cancel(ctx, res.OperationIDs[0], "not needed"); err != nil {
			t.Fatal(err)
		}
		d, err = h.Views().Job(ctx, res.OperationIDs[1])
		if err != nil || d.State != wire.Blocked || len(d.Dependencies) != 1 || d.Dependencies[0].State != wire.CancelledBeforeDispatch ||
			!strings.Contains(d.Dependencies[0].Reason, "cancelled by the operator") {
			t.Fatalf("a summary whose dependency was cancelled: %+v, %v", d, err)
		}
		if c, err := h.Operator().Cancel(ctx, res.OperationIDs[1], ""); err != nil || c.State != wire.CancelledBeforeDispatch {
			t.Fatalf("cancelling the blocked summary: %+v, %v", c, err)
		}

		// A dependency that fails for good: its dependent stays blocked;
		// requeued by the operator and completed, its dependent runs.
		key = "deps-4"
		res, err = h.Operator().SubmitReports(ctx, wire.ReportsRequest{Document: &doc, Sections: []string{"links", "overview"},
			IdempotencyKey: &key, After: map[string][]string{"overview": {"links"}}})
		if err != nil {
			t.Fatal(err)
		}
		failing := claim(t, h, w)
		if failing.OperationID != res.OperationIDs[0] {
			t.Fatalf("claimed %s, not the links section", failing.Section)
		}
		if _, err := h.Failures().Fail(ctx, w, failing.OperationID, wire.FailRequest{ClaimID: failing.Claim.ClaimID,
			Generation: failing.Claim.Generation, Reason: "the source is gone", NoEffect: true}); err != nil {
			t.Fatal(err)
		}
		d, err = h.Views().Job(ctx, res.OperationIDs[1])
		if err != nil || d.State != wire.Blocked || d.Dependencies[0].State != wire.Failed {
			t.Fatalf("an overview whose dependency failed: %+v, %v", d, err)
		}
		if _, err := h.Operator().Requeue(ctx, failing.OperationID, ""); err != nil {
			t.Fatal(err)
		}
		if again := runJob(t, h, w); again.OperationID != failing.OperationID {
			t.Fatalf("ran %s, not the requeued links", again.Section)
		}
		if overview := runJob(t, h, w); overview.OperationID != res.OperationIDs[1] || len(overview.Input.After) != 1 {
			t.Fatalf("ran %+v, not the overview", overview)
		}

		// A report cancelled while a section runs and another waits for it:
		// both cancelled, the running one's reservation settled, nothing
		// left reserved.
		key = "deps-5"
		res, err = h.Operator().SubmitReports(ctx, wire.ReportsRequest{Document: &doc, Sections: []string{"terms", "overview"},
			IdempotencyKey: &key, After: map[string][]string{"overview": {"terms"}}})
		if err != nil {
			t.Fatal(err)
		}
		running := claim(t, h, w)
		if adm := dispatch(t, h, w, running); adm.Decision != wire.DecisionAllow || running.OperationID != res.OperationIDs[0] {
			t.Fatalf("the terms section's admission: %+v", adm)
		}
		cancelled, err := h.Operator().CancelReport(ctx, key, "")
		if err != nil || len(cancelled.Cancelled) != 2 || len(cancelled.Unchanged) != 0 {
			t.Fatalf("cancelling the report: %+v, %v", cancelled, err)
		}
		if d := jobState(t, h, res.OperationIDs[0]); d.State != wire.Cancelled || d.Reserved != 0 {
			t.Fatalf("the running section after the report's cancellation: %+v", d)
		}
		if d := jobState(t, h, res.OperationIDs[1]); d.State != wire.CancelledBeforeDispatch {
			t.Fatalf("the blocked section after the report's cancellation: %+v", d)
		}
		if st, err := h.Views().Stats(ctx); err != nil || st.Accounting.Reserved != 0 {
			t.Fatalf("reserved after the report's cancellation: %+v, %v", st.Accounting, err)
		}

		// A ring: refused, nothing enqueued.
		key = "deps-3"
		_, err = h.Operator().SubmitReports(ctx, wire.ReportsRequest{Document: &doc, Sections: []string{"summary", "terms"},
			IdempotencyKey: &key, After: map[string][]string{"summary": {"terms"}, "terms": {"summary"}}})
		if fleet.ErrorCode(err) != wire.CodeInvalid || !strings.Contains(fleet.ErrorMessage(err), "ring") {
			t.Fatalf("a ring: %v", err)
		}
		if page, err := h.Views().JobPage(ctx, wire.JobPageQuery{Limit: 100}); err != nil || len(page.Jobs) != 4+3+2+2+2 {
			t.Fatalf("jobs after the ring was refused: %d (%v)", len(page.Jobs), err)
		}
		f.verify(t)
	})
}
