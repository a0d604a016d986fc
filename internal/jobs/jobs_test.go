package jobs_test

import (
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// TestTransitions walks the whole state machine: every pair of states is
// allowed exactly when the table in docs/api.md says so, and a refused move
// is state_conflict and leaves the job as it was.
func TestTransitions(t *testing.T) {
	allowed := map[wire.JobState][]wire.JobState{
		wire.Blocked:    {wire.Queued, wire.CancelledBeforeDispatch},
		wire.Queued:     {wire.Claimed, wire.CancelledBeforeDispatch},
		wire.Claimed:    {wire.Running, wire.Refused, wire.Queued, wire.CancelledBeforeDispatch, wire.Failed},
		wire.Running:    {wire.Completed, wire.Cancelled, wire.Unresolved, wire.Queued, wire.Failed},
		wire.Refused:    {wire.Queued},
		wire.Unresolved: {wire.Completed, wire.Queued},
		wire.Failed:     {wire.Queued},
	}
	for _, from := range wire.JobStates {
		for _, to := range wire.JobStates {
			want := false
			for _, s := range allowed[from] {
				want = want || s == to
			}
			err := jobs.CheckMove(store.Job{OperationID: "op", State: from}, to)
			switch {
			case want && err != nil:
				t.Errorf("%s -> %s: refused (%v)", from, to, err)
			case !want && fleet.ErrorCode(err) != wire.CodeStateConflict:
				t.Errorf("%s -> %s: allowed (%v)", from, to, err)
			}
			if jobs.CanMove(from, to) != want {
				t.Errorf("CanMove(%s, %s) = %v", from, to, !want)
			}
		}
	}
	if !wire.Failed.Settled() {
		t.Error("failed does not count as settled")
	}
	// Terminal states have no way out; settled ones are terminal or unresolved.
	for _, s := range []wire.JobState{wire.Completed, wire.Cancelled, wire.CancelledBeforeDispatch} {
		if len(allowed[s]) != 0 || !s.Settled() {
			t.Errorf("%s is not terminal", s)
		}
	}
	for _, s := range []wire.JobState{wire.Queued, wire.Claimed, wire.Running} {
		if s.Settled() {
			t.Errorf("%s counts as settled", s)
		}
	}
}

// TestCheckClaim: only the current claim, presented by its holder at its
// generation, in an allowed state, passes; anything else is stale_claim,
// and a job of a tenant its caller does not serve is forbidden.
func TestCheckClaim(t *testing.T) {
	j := store.Job{OperationID: "op", State: wire.Running, ClaimID: "c1", Generation: 3, Worker: "w1", Tenant: "team-a"}
	w1 := fleet.Caller{ID: "w1"}
	if err := jobs.CheckClaim(j, w1, "c1", 3, wire.Claimed, wire.Running); err != nil {
		t.Fatalf("the current claim: %v", err)
	}
	if err := jobs.CheckClaim(j, fleet.Caller{ID: "w1", Tenants: []string{"team-a", "team-c"}}, "c1", 3, wire.Running); err != nil {
		t.Fatalf("the current claim, its holder serving its tenant: %v", err)
	}
	err := jobs.CheckClaim(j, fleet.Caller{ID: "w1", Tenants: []string{"team-b"}}, "c1", 3, wire.Running)
	if fleet.ErrorCode(err) != wire.CodeForbidden || !strings.Contains(fleet.ErrorMessage(err), "team-b") || strings.Contains(fleet.ErrorMessage(err), "team-a") {
		t.Fatalf("a job of a tenant its caller does not serve: %v; want forbidden naming only the caller's tenants", err)
	}
	for name, c := range map[string]struct {
		job           store.Job
		caller, claim string
		generation    int64
		states        []wire.JobState
	}{
		"other worker":     {j, "w2", "c1", 3, []wire.JobState{wire.Running}},
		"other claim":      {j, "w1", "c0", 3, []wire.JobState{wire.Running}},
		"older generation": {j, "w1", "c1", 2, []wire.JobState{wire.Running}},
		"state not wanted": {j, "w1", "c1", 3, []wire.JobState{wire.Claimed}},
		"claim dropped":    {store.Job{OperationID: "op", State: wire.Queued, Generation: 3, Worker: "w1"}, "w1", "", 3, []wire.JobState{wire.Queued}},
		"job finished":     {store.Job{OperationID: "op", State: wire.Completed, ClaimID: "c1", Generation: 3, Worker: "w1"}, "w1", "c1", 3, []wire.JobState{wire.Completed}},
	} {
		if err := jobs.CheckClaim(c.job, fleet.Caller{ID: c.caller}, c.claim, c.generation, c.states...); fleet.ErrorCode(err) != wire.CodeStaleClaim {
			t.Errorf("%s: %v, want stale_claim", name, err)
		}
	}
}

// TestCancelledUnderAndRepeat: a cancelled job's last claim holder learns of
// the cancellation, nobody else; a dispatch repeats only with the claim
// that was decided.
func TestCancelledUnderAndRepeat(t *testing.T) {
	j := store.Job{State: wire.Cancelled, ClaimID: "c1", Worker: "w1"}
	if !jobs.CancelledUnder(j, "w1", "c1") || jobs.CancelledUnder(j, "w2", "c1") || jobs.CancelledUnder(j, "w1", "") {
		t.Fatal("cancellation reported to the wrong claim")
	}
	if j.State = wire.Running; jobs.CancelledUnder(j, "w1", "c1") {
		t.Fatal("a running job reported as cancelled")
	}
	d := store.Job{State: wire.Refused, AdmissionClaimID: "c1", Worker: "w1", Generation: 2}
	if !jobs.DispatchRepeat(d, "w1", wire.ClaimRef{ClaimID: "c1", Generation: 2}) ||
		jobs.DispatchRepeat(d, "w1", wire.ClaimRef{ClaimID: "c2", Generation: 2}) ||
		jobs.DispatchRepeat(d, "w1", wire.ClaimRef{ClaimID: "c1", Generation: 3}) {
		t.Fatal("dispatch repeat misjudged")
	}
	if d.State = wire.Queued; jobs.DispatchRepeat(d, "w1", wire.ClaimRef{ClaimID: "c1", Generation: 2}) {
		t.Fatal("a requeued job repeated its old decision")
	}
	for s, want := range map[wire.JobState]bool{wire.Running: true, wire.Unresolved: true, wire.Claimed: false,
		wire.Refused: false, wire.Completed: false, wire.Cancelled: false} {
		if jobs.Publishable(s) != want {
			t.Errorf("Publishable(%s) = %v", s, !want)
		}
	}
}

func TestValidateBatch(t *testing.T) {
	if err := jobs.ValidateBatch("text", []string{"summary", "links"}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		doc      string
		sections []string
		says     string
	}{
		"blank":         {"  \n", []string{"summary"}, "blank"},
		"too long":      {strings.Repeat("a", jobs.MaxDocumentBytes+1), []string{"summary"}, "limit"},
		"NUL":           {"a\x00b", []string{"summary"}, "NUL character at byte offset 1"},
		"no sections":   {"text", nil, "sections"},
		"too many":      {"text", make([]string, jobs.MaxSections+1), "sections"},
		"unknown":       {"text", []string{"summary", "poem"}, `sections[1] is "poem"`},
		"invalid UTF-8": {"ab\xffc", []string{"summary"}, "not valid UTF-8 (the first bad byte is at offset 2)"},
	} {
		err := jobs.ValidateBatch(c.doc, c.sections)
		if fleet.ErrorCode(err) != wire.CodeInvalid || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want invalid_request naming %q", name, err, c.says)
		}
	}
}

// adversarial returns a document of about n bytes that makes kind's section
// as large as a document of that size can (its published body well over
// the publication limit at the document limit), built from line as many
// times as fits.
func adversarial(kind string, n int) string {
	var unit string
	switch kind {
	case "actions":
		unit = "- [ ] ab\n" // the document: a task line each
	case "links":
		unit = "http://a/\" " // a link each, with a quote to escape
	case "summary":
		// Three first lines of quotes and control characters, which JSON
		// escapes (a control character takes six bytes).
		line := strings.Repeat("\"\x01", n/3/3)
		return line + "\n" + line + "\n" + line + "\n"
	case "terms":
		// Twelve long words: the section keeps the twelve most frequent.
		var b strings.Builder
		for i := 0; b.Len() < n-n/12; i++ {
			b.WriteString(strings.Repeat(string(rune('a'+i%26)), n/13) + " ")
		}
		return b.String()
	}
	return strings.Repeat(unit, n/len(unit))
}

// TestValidateBatchSectionsFit: a valid batch is one whose every section
// can be published. A document whose section would make a publication
// over the limit (the 63,899-byte document of 7,100 task lines
// made a 78,303-byte actions body) is refused naming the section and the
// limit; the same document's other sections are accepted.
func TestValidateBatchSectionsFit(t *testing.T) {
	for _, kind := range []string{"actions", "links", "summary"} {
		doc := adversarial(kind, jobs.MaxDocumentBytes)
		if len(doc) > jobs.MaxDocumentBytes {
			t.Fatalf("%s: test document of %d bytes is over the limit", kind, len(doc))
		}
		err := jobs.ValidateBatch(doc, []string{"terms", kind})
		if fleet.ErrorCode(err) != wire.CodeInvalid || !strings.Contains(err.Error(), kind+" section") ||
			!strings.Contains(err.Error(), "65536") {
			t.Errorf("%s: %v, want invalid_request naming the section and the limit", kind, err)
		}
	}
	// Terms keeps twelve words whatever the document; at the limit it fits.
	if err := jobs.ValidateBatch(adversarial("terms", jobs.MaxDocumentBytes), []string{"terms"}); err != nil {
		t.Errorf("terms at the document limit: %v", err)
	}
	if err := jobs.ValidateBatch(adversarial("actions", jobs.MaxDocumentBytes), []string{"summary", "terms", "links"}); err != nil {
		t.Errorf("the other sections of the actions document: %v", err)
	}
}
