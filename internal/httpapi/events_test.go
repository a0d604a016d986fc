package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/wire"
)

// TestEventFilters: GET /admin/events takes a job and a kind and answers
// the newest page of that job's events of that kind, each naming its job,
// read from the host's log rather than a client's copy of it; before pages
// back; a kind, bound or job it does not know is refused naming it.
func TestEventFilters(t *testing.T) {
	th := newTestHost(t, fourSections)
	_, claimed := claimJobs(t, th, 3, "", "")
	for _, j := range claimed.Jobs {
		if rec := th.do("POST", "/v1/jobs/"+j.OperationID+"/dispatch", th.worker,
			fmt.Sprintf(`{"claim_id":%q,"generation":%d}`, j.Claim.ClaimID, j.Claim.Generation)); rec.Code != 200 {
			t.Fatalf("dispatch: %d %s", rec.Code, rec.Body)
		}
	}
	first := claimed.Jobs[0]
	if rec := th.do("POST", "/v1/jobs/"+first.OperationID+"/publish", th.worker, publication(t, first, "k0", 0)); rec.Code != 200 {
		t.Fatalf("publish: %d %s", rec.Code, rec.Body)
	}
	page := func(query string) []wire.Event {
		t.Helper()
		rec := th.do("GET", "/admin/events"+query, th.operator, "")
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"events":[`) {
			t.Fatalf("GET /admin/events%s: %d %s", query, rec.Code, rec.Body)
		}
		var p wire.EventPage
		json.Unmarshal(rec.Body.Bytes(), &p)
		return p.Events
	}
	kinds := func(evs []wire.Event) string {
		var out []string
		for _, e := range evs {
			out = append(out, string(e.Kind))
		}
		return strings.Join(out, " ")
	}

	mine := page("?job=" + first.OperationID)
	if got := kinds(mine); got != "fleet.claimed call.allowed fleet.published" {
		t.Fatalf("the first job's events: %s", got)
	}
	for _, e := range mine {
		if e.OperationID != first.OperationID {
			t.Fatalf("event %d names job %q, want %s", e.Sequence, e.OperationID, first.OperationID)
		}
	}
	if got := page("?job=" + first.OperationID + "&kind=call.allowed"); len(got) != 1 || got[0].Sequence != mine[1].Sequence {
		t.Fatalf("the first job's allowed dispatch: %+v", got)
	}
	claims := page("?kind=fleet.claimed")
	if got := kinds(claims); got != "fleet.claimed fleet.claimed fleet.claimed" {
		t.Fatalf("the claims: %s", got)
	}
	older := page(fmt.Sprintf("?kind=fleet.claimed&before=%d&limit=1", claims[2].Sequence))
	if len(older) != 1 || older[0].Sequence != claims[1].Sequence {
		t.Fatalf("the newest claim before the last: %+v, want %d", older, claims[1].Sequence)
	}
	all := page("")
	for _, before := range []string{"1000000", "9223372036854775807"} {
		if newest := page("?limit=2&before=" + before); len(newest) != 2 || newest[1].Sequence != all[len(all)-1].Sequence {
			t.Fatalf("the two newest events before %s: %+v", before, newest)
		}
	}
	if got := page("?kind=fleet.cancelled"); len(got) != 0 {
		t.Fatalf("no job was cancelled: %+v", got)
	}

	for query, want := range map[string]string{
		"?kind=fleet.nothing": "fleet.nothing",
		"?before=0":           "before",
		"?before=x":           "before",
		"?limit=0":            "limit",
		"?limit=1001":         "limit",
		"?job=01234567-89ab-7def-8123-456789abcdef": "not found",
		"?job=not-a-uuid": "invalid_request", // malformed, as on every route that takes an operation id
	} {
		rec := th.do("GET", "/admin/events"+query, th.operator, "")
		if rec.Code/100 != 4 || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("GET /admin/events%s: %d %s, want a 4xx naming %q", query, rec.Code, rec.Body, want)
		}
	}
}
