package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/fleet/fleet/internal/httpapi"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/wire"
)

const fourSections = `{"document":"Hostile text.","sections":["summary","terms","actions","links"],"allowance":100,"cost_per_report":20,"concurrency":2}`

// claimJobs claims up to max jobs, under key when it is not "".
func claimJobs(t *testing.T, th *testHost, max int, key, repeat string) (int, wire.ClaimResult) {
	t.Helper()
	body := fmt.Sprintf(`{"max":%d}`, max)
	if key != "" {
		body = fmt.Sprintf(`{"max":%d,"key":%q}`, max, key)
	}
	req := httptest.NewRequest("POST", "http://fleet/v1/claims", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+th.worker)
	if repeat != "" {
		req.Header.Set(wire.HeaderRepeat, repeat)
	}
	rec := httptest.NewRecorder()
	th.handler.ServeHTTP(rec, req)
	var res wire.ClaimResult
	if rec.Code == 200 {
		if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil {
			t.Fatal(err)
		}
	}
	return rec.Code, res
}

func operationIDs(jobs []wire.ClaimedJob) []string {
	ops := make([]string, 0, len(jobs))
	for _, j := range jobs {
		ops = append(ops, j.OperationID)
	}
	sort.Strings(ops)
	return ops
}

// publication is a publish request for j's true body, padded by pad bytes
// of an extra member.
func publication(t *testing.T, j wire.ClaimedJob, key string, pad int) string {
	t.Helper()
	body, err := sections.Body(j.OperationID, j.Section, j.InputSHA256, j.Input.Document)
	if err != nil {
		t.Fatal(err)
	}
	request := fmt.Sprintf(`{"operation_key":%q,"generation":%d,"expected_version":0,"body":%s}`, key, j.Claim.Generation, body)
	if pad > 0 {
		request = strings.Replace(request, `{"operation_key"`, `{`+strings.Repeat(" ", pad)+`"operation_key"`, 1)
	}
	return request
}

// TestRepeatHeaderIsTrueOrFalse (issue 33, item 7): Fleet-Repeat: false is
// a first send, claiming afresh; a value that is neither is refused.
func TestRepeatHeaderIsTrueOrFalse(t *testing.T) {
	th := newTestHost(t, fourSections)
	key := uuid.NewString()
	_, first := claimJobs(t, th, 2, key, "")
	if len(first.Jobs) != 2 {
		t.Fatalf("first claim: %+v", first)
	}
	_, again := claimJobs(t, th, 2, key, "false")
	if len(again.Jobs) != 2 || strings.Join(operationIDs(again.Jobs), ",") == strings.Join(operationIDs(first.Jobs), ",") {
		t.Fatalf("Fleet-Repeat: false answered the held jobs %v again; want two other jobs", operationIDs(again.Jobs))
	}
	_, repeated := claimJobs(t, th, 2, key, "true")
	if len(repeated.Jobs) != 4 {
		t.Fatalf("Fleet-Repeat: true answered %d jobs; want the 4 held under the key", len(repeated.Jobs))
	}
	before, _ := th.host.Views().Snapshot(t.Context())
	for _, v := range []string{"yes", "1", "TRUE", " true"} {
		if status, _ := claimJobs(t, th, 1, uuid.NewString(), v); status != 400 {
			t.Fatalf("Fleet-Repeat: %q answered %d; want 400", v, status)
		}
	}
	if after, _ := th.host.Views().Snapshot(t.Context()); fmt.Sprint(after.Jobs) != fmt.Sprint(before.Jobs) {
		t.Fatal("a refused claim changed the jobs")
	}
}

// TestRepeatedClaimWhilePaused (issue 33, item 8): after a pause a new
// claim answers no job and "paused"; a keyed claim sent again answers the
// jobs granted to it before the pause, which the caller already holds,
// and grants none.
func TestRepeatedClaimWhilePaused(t *testing.T) {
	th := newTestHost(t, fourSections)
	key := uuid.NewString()
	_, first := claimJobs(t, th, 2, key, "")
	if rec := th.do("POST", "/admin/claims/pause", th.operator, `{"reason":"test"}`); rec.Code != 200 {
		t.Fatalf("pause: %d %s", rec.Code, rec.Body)
	}
	if _, fresh := claimJobs(t, th, 2, uuid.NewString(), ""); len(fresh.Jobs) != 0 || fresh.Queue != wire.QueuePaused {
		t.Fatalf("a new claim while paused: %+v", fresh)
	}
	_, repeated := claimJobs(t, th, 4, key, "true")
	if fmt.Sprint(operationIDs(repeated.Jobs)) != fmt.Sprint(operationIDs(first.Jobs)) {
		t.Fatalf("the repeated claim answered %v; want the jobs it was granted, %v", operationIDs(repeated.Jobs), operationIDs(first.Jobs))
	}
	if _, other := claimJobs(t, th, 2, uuid.NewString(), "true"); len(other.Jobs) != 0 || other.Queue != wire.QueuePaused {
		t.Fatalf("a repeat of a claim that holds nothing while paused: %+v", other)
	}
}

// TestBatchItemBodyLimit (issue 33, item 4): a publication over the single
// call's body limit is 413 body_too_large alone and as a batch item, and
// the item's neighbours are answered as alone.
func TestBatchItemBodyLimit(t *testing.T) {
	th := newTestHost(t, fourSections)
	_, claimed := claimJobs(t, th, 2, "", "")
	for _, j := range claimed.Jobs {
		if rec := th.do("POST", "/v1/jobs/"+j.OperationID+"/dispatch", th.worker,
			fmt.Sprintf(`{"claim_id":%q,"generation":%d}`, j.Claim.ClaimID, j.Claim.Generation)); rec.Code != 200 {
			t.Fatalf("dispatch: %d %s", rec.Code, rec.Body)
		}
	}
	padded := publication(t, claimed.Jobs[0], "k0", 200<<10)
	if rec := th.do("POST", "/v1/jobs/"+claimed.Jobs[0].OperationID+"/publish", th.worker, padded); rec.Code != 413 {
		t.Fatalf("a 200 KiB publication alone: %d %s", rec.Code, rec.Body)
	}
	rec := th.do("POST", "/v1/publications", th.worker, fmt.Sprintf(`{"items":[{"operation_id":%q,"request":%s},{"operation_id":%q,"request":%s}]}`,
		claimed.Jobs[0].OperationID, padded, claimed.Jobs[1].OperationID, publication(t, claimed.Jobs[1], "k1", 0)))
	var res wire.BatchResult
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &res) != nil || len(res.Results) != 2 {
		t.Fatalf("batch: %d %s", rec.Code, rec.Body)
	}
	var e wire.ErrorBody
	if json.Unmarshal(res.Results[0].Body, &e); res.Results[0].Status != 413 || e.Error.Code != wire.CodeBodyTooLarge {
		t.Fatalf("the 200 KiB item: %d %s; want 413 body_too_large", res.Results[0].Status, res.Results[0].Body)
	}
	var out wire.Outcome
	if json.Unmarshal(res.Results[1].Body, &out); res.Results[1].Status != 200 || out.Status != wire.StatusPublished {
		t.Fatalf("its neighbour: %d %s", res.Results[1].Status, res.Results[1].Body)
	}
}

// TestLostAckInBatch (issue 33, item 3): with lose_ack_index 1, the second
// publication's answer is dropped when it is committed as a batch item, as
// it is for a single call: the connection closes with no answer, the
// event says so, and the batch sent again is answered as replays.
func TestLostAckInBatch(t *testing.T) {
	th := newTestHost(t, `{"document":"Hostile text.","sections":["summary","terms","actions"],"allowance":100,"cost_per_report":20,"concurrency":2,"lose_ack_index":1}`)
	_, claimed := claimJobs(t, th, 3, "", "")
	for _, j := range claimed.Jobs {
		if rec := th.do("POST", "/v1/jobs/"+j.OperationID+"/dispatch", th.worker,
			fmt.Sprintf(`{"claim_id":%q,"generation":%d}`, j.Claim.ClaimID, j.Claim.Generation)); rec.Code != 200 {
			t.Fatalf("dispatch: %d %s", rec.Code, rec.Body)
		}
	}
	srv := httptest.NewServer(th.handler)
	defer srv.Close()
	send := func(body string) (*http.Response, error) {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/publications", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+th.worker)
		return srv.Client().Do(req)
	}
	first := publication(t, claimed.Jobs[0], "k0", 0)
	if rec := th.do("POST", "/v1/jobs/"+claimed.Jobs[0].OperationID+"/publish", th.worker, first); rec.Code != 200 {
		t.Fatalf("the first publication: %d %s", rec.Code, rec.Body)
	}
	batch := fmt.Sprintf(`{"items":[{"operation_id":%q,"request":%s},{"operation_id":%q,"request":%s}]}`,
		claimed.Jobs[1].OperationID, publication(t, claimed.Jobs[1], "k1", 0), claimed.Jobs[2].OperationID, publication(t, claimed.Jobs[2], "k2", 0))
	if resp, err := send(batch); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("the batch holding the second publication was answered %d %s; want its answer dropped", resp.StatusCode, body)
	}
	rec := th.do("GET", "/admin/events", th.operator, "")
	var page wire.EventPage
	json.Unmarshal(rec.Body.Bytes(), &page)
	faults := 0
	for _, e := range page.Events {
		if strings.Contains(string(e.Data), `"fault":"`+wire.FaultLoseAck+`"`) {
			faults++
		}
	}
	if faults != 1 {
		t.Fatalf("%d events name the lost acknowledgement; want 1", faults)
	}
	resp, err := send(batch)
	if err != nil {
		t.Fatalf("the batch sent again: %v", err)
	}
	var res wire.BatchResult
	json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(res.Results) != 2 || !res.Results[0].Replayed || !res.Results[1].Replayed {
		t.Fatalf("the batch sent again: %d %+v", resp.StatusCode, res)
	}
}

// TestEveryListIsAnArray (issue 33, item 5; issue 34): every GET route,
// on views that match nothing, answers JSON in which no value is null
// but the few documented as nullable objects.
func TestEveryListIsAnArray(t *testing.T) {
	th := newTestHost(t, fourSections)
	srv := httpapi.New(th.host, slog.New(slog.NewTextHandler(io.Discard, nil)), testLimits())
	op := th.jobs[0].OperationID
	rec := th.do("POST", "/v1/claims", th.worker, "")
	var claimed wire.ClaimResult
	json.Unmarshal(rec.Body.Bytes(), &claimed)
	receipt := ""
	if rec := th.do("POST", "/v1/jobs/"+claimed.Job.OperationID+"/dispatch", th.worker,
		fmt.Sprintf(`{"claim_id":%q,"generation":%d}`, claimed.Job.Claim.ClaimID, claimed.Job.Claim.Generation)); rec.Code == 200 {
		var adm wire.Admission
		json.Unmarshal(rec.Body.Bytes(), &adm)
		receipt = adm.Receipt.ID
	}
	// Each GET route's paths to ask: its empty views first.
	paths := map[string][]string{
		"/admin/jobs":     {"/admin/jobs?state=failed", "/admin/jobs?owner=nobody", "/admin/jobs?q=ffffffff", "/admin/jobs?priority=4", "/admin/jobs"},
		"/admin/jobs/:op": {"/admin/jobs/" + op},
		"/admin/events": {"/admin/events?after=1000000", "/admin/events", "/admin/events?kind=fleet.cancelled",
			"/admin/events?job=" + op + "&kind=fleet.published"},
		"/admin/receipts/:id":              {"/admin/receipts/" + receipt},
		"/admin/receipts/:id/verification": {"/admin/receipts/" + receipt + "/verification"},
		"/v1/documents/:id":                {"/v1/documents/" + th.jobs[0].DocumentID},
		"/admin/reports/:key":              {"/admin/reports/init"},
	}
	// A schedule, whose report leaves out what it does not name (an empty
	// list of schedules: TestFleetctlSchedules).
	if rec := th.do("POST", "/admin/schedules", th.operator, `{"name":"weekly","schedule":"0 9 * * 1","report":{"document":"d.","sections":["summary"]}}`); rec.Code != 200 {
		t.Fatalf("a schedule: %d %s", rec.Code, rec.Body)
	}
	skip := map[string]bool{"/": true, "/console/*": true, "/metrics": true, "/admin/events/stream": true, "/favicon.ico": true, "/console/session": true}
	// Values that are null by the contract: objects, never lists.
	nullable := map[string]bool{"job": true, "document": true, "claim": true, "receipt": true, "body": true, "outcome": true, "reason": true, "prev": true,
		"allowance": true} // a tenant with no allowance of its own
	for _, r := range srv.Handler().(*echo.Echo).Routes() {
		if r.Method != "GET" || skip[r.Path] {
			continue
		}
		asks := paths[r.Path]
		if asks == nil {
			if strings.Contains(r.Path, ":") {
				t.Errorf("route %s has no path to ask in this test", r.Path)
				continue
			}
			asks = []string{r.Path}
		}
		for _, path := range asks {
			token := th.operator
			if strings.HasPrefix(path, "/v1/") {
				token = th.worker
			}
			rec := th.do("GET", path, token, "")
			if rec.Code != 200 {
				t.Errorf("GET %s: %d %s", path, rec.Code, rec.Body)
				continue
			}
			var v any
			if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
				t.Errorf("GET %s: %v", path, err)
				continue
			}
			for _, where := range nulls(v, "") {
				if !nullable[where[strings.LastIndex(where, ".")+1:]] {
					t.Errorf("GET %s: %s is null", path, where)
				}
			}
		}
	}
}

// nulls lists where v holds a null, as dotted paths.
func nulls(v any, at string) []string {
	var found []string
	switch v := v.(type) {
	case nil:
		return []string{at}
	case map[string]any:
		for k, e := range v {
			found = append(found, nulls(e, at+"."+k)...)
		}
	case []any:
		for i, e := range v {
			found = append(found, nulls(e, fmt.Sprintf("%s[%d]", at, i))...)
		}
	}
	return found
}

// TestBulkActsThroughWhatWasCounted (issue 33, item 9): an action sent
// with its dry run's through acts on the jobs counted and confirmed, never
// on jobs that arrived in between.
func TestBulkActsThroughWhatWasCounted(t *testing.T) {
	th := newTestHost(t, fourSections)
	bulk := func(body string) wire.BulkResult {
		t.Helper()
		rec := th.do("POST", "/admin/jobs/bulk", th.operator, body)
		var res wire.BulkResult
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &res) != nil {
			t.Fatalf("bulk %s: %d %s", body, rec.Code, rec.Body)
		}
		return res
	}
	dry := bulk(`{"action":"cancel","filter":{"state":"queued"},"dry_run":true}`)
	if dry.Matched != 4 || dry.Through == "" {
		t.Fatalf("dry run: %+v", dry)
	}
	if rec := th.do("POST", "/admin/reports", th.operator, `{"document":"Arrived later.","sections":["summary","terms"],"idempotency_key":"later"}`); rec.Code != 200 {
		t.Fatalf("submit: %d %s", rec.Code, rec.Body)
	}
	done := bulk(fmt.Sprintf(`{"action":"cancel","filter":{"state":"queued"},"through":%q}`, dry.Through))
	if done.Matched != 4 || done.Done != 4 || done.Next != "" {
		t.Fatalf("the action through the dry run's count: %+v; want the 4 counted", done)
	}
	if left := bulk(`{"action":"cancel","filter":{"state":"queued"},"dry_run":true}`); left.Matched != 2 {
		t.Fatalf("%d queued jobs left; want the 2 that arrived after the count", left.Matched)
	}
	if rec := th.do("POST", "/admin/jobs/bulk", th.operator, `{"action":"cancel","filter":{},"through":"x"}`); rec.Code != 400 {
		t.Fatalf("a through this host never gave: %d %s", rec.Code, rec.Body)
	}
}

// TestBulkCountsWhatItAppliesTo (issue 34): a dry run counts the jobs the
// action would act on apart from all those the filter selects, and
// reconcile is a bulk action too.
func TestBulkCountsWhatItAppliesTo(t *testing.T) {
	th := newTestHost(t, fourSections)
	for action, applicable := range map[string]int64{"requeue": 0, "cancel": 4, "reconcile": 0} {
		rec := th.do("POST", "/admin/jobs/bulk", th.operator, fmt.Sprintf(`{"action":%q,"filter":{},"dry_run":true}`, action))
		var res wire.BulkResult
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &res) != nil || res.Matched != 4 || res.Applicable != applicable {
			t.Fatalf("a dry run of %s over 4 queued jobs: %d %s; want 4 matched, %d applicable", action, rec.Code, rec.Body, applicable)
		}
	}
	if rec := th.do("POST", "/admin/jobs/bulk", th.operator, `{"action":"delete","filter":{}}`); rec.Code != 400 {
		t.Fatalf("an unknown action: %d %s", rec.Code, rec.Body)
	}
}

// TestBulkReason (issue 34): the operator's reason for a bulk action goes
// in each job's event; a reason that is not one line of plain text is
// refused before anything is done.
func TestBulkReason(t *testing.T) {
	th := newTestHost(t, fourSections)
	if rec := th.do("POST", "/admin/jobs/bulk", th.operator, `{"action":"cancel","filter":{},"reason":"two\nlines"}`); rec.Code != 400 {
		t.Fatalf("a reason of two lines: %d %s", rec.Code, rec.Body)
	}
	if snap, _ := th.host.Views().Snapshot(t.Context()); snap.Jobs[0].State != wire.Queued {
		t.Fatal("a refused bulk call changed a job")
	}
	if rec := th.do("POST", "/admin/jobs/bulk", th.operator, `{"action":"cancel","filter":{},"reason":"the report was withdrawn"}`); rec.Code != 200 {
		t.Fatalf("bulk cancel: %d %s", rec.Code, rec.Body)
	}
	var page wire.EventPage
	json.Unmarshal(th.do("GET", "/admin/events", th.operator, "").Body.Bytes(), &page)
	n := 0
	for _, e := range page.Events {
		if e.Kind == wire.EventCancelled {
			if !strings.HasSuffix(e.Title, ": the report was withdrawn") || !strings.Contains(string(e.Data), `"reason":"the report was withdrawn"`) {
				t.Fatalf("a cancellation's event without the reason: %+v", e)
			}
			n++
		}
	}
	if n != 4 {
		t.Fatalf("%d cancellation events; want 4", n)
	}
}
