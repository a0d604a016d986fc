package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/httpapi"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/wire"
)

// TestBatchRoutes: a batch call answers each item with the single call's
// status and body, items that do not decode included, and a replayed
// publication says so; a batch that is not one (no items, too many, a
// body over the limit, no credential) is refused whole, changing nothing.
func TestBatchRoutes(t *testing.T) {
	th := newTestHost(t, `{"document":"Batch text.","sections":["summary","terms","actions","links"],"allowance":60,"cost_per_report":20,"concurrency":2}`)
	rec := th.do("POST", "/v1/claims", th.worker, `{"max":4}`)
	var claimed wire.ClaimResult
	if err := json.Unmarshal(rec.Body.Bytes(), &claimed); err != nil || len(claimed.Jobs) != 4 {
		t.Fatalf("claim: %d %s", rec.Code, rec.Body)
	}
	jobs := claimed.Jobs
	ref := func(j wire.ClaimedJob) string {
		return fmt.Sprintf(`{"claim_id":%q,"generation":%d}`, j.Claim.ClaimID, j.Claim.Generation)
	}
	item := func(op, request string) string { return fmt.Sprintf(`{"operation_id":%q,"request":%s}`, op, request) }
	batch := func(path string, items ...string) wire.BatchResult {
		t.Helper()
		rec := th.do("POST", path, th.worker, `{"items":[`+strings.Join(items, ",")+`]}`)
		var res wire.BatchResult
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &res) != nil || len(res.Results) != len(items) {
			t.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
		}
		return res
	}
	code := func(r wire.ItemResult) wire.Code {
		var e wire.ErrorBody
		json.Unmarshal(r.Body, &e)
		return e.Error.Code
	}

	res := batch("/v1/dispatches",
		item(jobs[0].OperationID, ref(jobs[0])),
		item(jobs[1].OperationID, ref(jobs[1])),
		item("not-a-uuid", ref(jobs[2])),
		item(jobs[2].OperationID, `{"claim_id":"c"}`),
		item(jobs[3].OperationID, `{"claim_id":"other","generation":1}`),
		`{"operation_id":"x","request":{},"extra":1}`,
	)
	want := []struct {
		status int
		code   wire.Code
	}{{200, ""}, {200, ""}, {400, wire.CodeInvalid}, {400, wire.CodeInvalid}, {409, wire.CodeStaleClaim}, {400, wire.CodeInvalid}}
	for i, w := range want {
		if r := res.Results[i]; r.Status != w.status || code(r) != w.code {
			t.Errorf("dispatch item %d: %d %s, want %d %s", i, r.Status, r.Body, w.status, w.code)
		}
	}
	var adm wire.Admission
	if err := json.Unmarshal(res.Results[0].Body, &adm); err != nil || adm.Decision != wire.DecisionAllow || adm.Receipt.Signature == "" ||
		res.Results[0].OperationID != jobs[0].OperationID {
		t.Fatalf("an allowed item's answer: %s", res.Results[0].Body)
	}
	// The same item again is the single call's repeat: the same admission.
	single := th.do("POST", "/v1/jobs/"+jobs[0].OperationID+"/dispatch", th.worker, ref(jobs[0]))
	if single.Code != 200 || strings.TrimSpace(single.Body.String()) != string(res.Results[0].Body) {
		t.Fatalf("a single repeat answered %d %s; the batch %s", single.Code, single.Body, res.Results[0].Body)
	}

	publish := func(j wire.ClaimedJob, key string) string {
		body, err := sections.Body(j.OperationID, j.Section, j.InputSHA256, j.Input.Document)
		if err != nil {
			t.Fatal(err)
		}
		return item(j.OperationID, fmt.Sprintf(`{"operation_key":%q,"generation":%d,"expected_version":0,"body":%s}`, key, j.Claim.Generation, body))
	}
	res = batch("/v1/publications", publish(jobs[0], "k0"), publish(jobs[0], "k0"), publish(jobs[1], "k1"),
		item(jobs[1].OperationID, `{"operation_key":"k","generation":1,"expected_version":0,"body":[1]}`))
	var outcomes [3]wire.Outcome
	for i := range outcomes {
		if res.Results[i].Status != 200 || json.Unmarshal(res.Results[i].Body, &outcomes[i]) != nil {
			t.Fatalf("publication %d: %d %s", i, res.Results[i].Status, res.Results[i].Body)
		}
	}
	if outcomes[0].Status != wire.StatusPublished || res.Results[0].Replayed || outcomes[1] != outcomes[0] || !res.Results[1].Replayed ||
		outcomes[2].Status != wire.StatusPublished || res.Results[3].Status != 400 {
		t.Fatalf("publications: %+v", res.Results)
	}

	res = batch("/v1/heartbeats", item(jobs[0].OperationID, ref(jobs[0])), item(jobs[2].OperationID, ref(jobs[2])))
	var beat wire.HeartbeatResult
	if res.Results[0].Status != 409 || code(res.Results[0]) != wire.CodeStaleClaim || res.Results[1].Status != 200 ||
		json.Unmarshal(res.Results[1].Body, &beat) != nil || beat.LeaseExpiresAtMS == 0 {
		t.Fatalf("heartbeats of a completed and a claimed job: %+v", res.Results)
	}
	res = batch("/v1/failures", item(jobs[2].OperationID, fmt.Sprintf(`{"claim_id":%q,"generation":%d,"reason":"no","retryable":false}`,
		jobs[2].Claim.ClaimID, jobs[2].Claim.Generation)))
	var failed wire.FailResult
	if res.Results[0].Status != 200 || json.Unmarshal(res.Results[0].Body, &failed) != nil || failed.State != wire.Failed {
		t.Fatalf("failure: %+v", res.Results)
	}

	before, _ := th.host.Views().Snapshot(t.Context())
	for name, c := range map[string]struct {
		token, body string
		status      int
	}{
		"no items":      {th.worker, `{}`, 400},
		"empty":         {th.worker, `{"items":[]}`, 400},
		"too many":      {th.worker, `{"items":[` + strings.Repeat(item(jobs[3].OperationID, ref(jobs[3]))+",", 64) + item(jobs[3].OperationID, ref(jobs[3])) + `]}`, 400},
		"not an object": {th.worker, `[1]`, 400},
		"over the body limit": {th.worker, `{"items":[` + item(jobs[3].OperationID, `{"claim_id":"`+strings.Repeat("x", httpapi.MaxBatchBodyBytes)+`","generation":1}`) + `]}`,
			http.StatusRequestEntityTooLarge},
		"no credential":   {"", `{"items":[` + item(jobs[3].OperationID, ref(jobs[3])) + `]}`, 401},
		"operator's role": {th.operator, `{"items":[` + item(jobs[3].OperationID, ref(jobs[3])) + `]}`, 403},
	} {
		if rec := th.do("POST", "/v1/dispatches", c.token, c.body); rec.Code != c.status {
			t.Errorf("%s: %d %s, want %d", name, rec.Code, rec.Body, c.status)
		}
	}
	// A batch of publications is not canonicalized whole (each request is,
	// by its own decoder), yet a duplicate key in the envelope or an item,
	// or invalid UTF-8 anywhere, still refuses it whole.
	good := publish(jobs[1], "k1")
	for name, body := range map[string]string{
		"a duplicate envelope key": `{"items":[` + good + `],"items":[` + good + `]}`,
		"a duplicate item key":     `{"items":[{"operation_id":"` + jobs[1].OperationID + `","operation_id":"x","request":{}}]}`,
		"invalid UTF-8 in an item": `{"items":[` + good + ",{\"operation_id\":\"\xff\xfe\",\"request\":{}}]}",
		"invalid UTF-8 in a body":  `{"items":[` + strings.Replace(good, `"body":{`, "\"body\":{\"note\":\"\xff\",", 1) + `]}`,
	} {
		if rec := th.do("POST", "/v1/publications", th.worker, body); rec.Code != 400 || !strings.Contains(rec.Body.String(), "invalid_request") {
			t.Errorf("%s: %d %s, want 400 invalid_request", name, rec.Code, rec.Body)
		}
	}
	after, _ := th.host.Views().Snapshot(t.Context())
	if before.Accounting != after.Accounting || before.Events != after.Events {
		t.Fatalf("refused batches changed state: %+v / %+v", before.Accounting, after.Accounting)
	}
	// A duplicate key inside one publication refuses that item alone.
	res = batch("/v1/publications",
		item(jobs[1].OperationID, `{"operation_key":"d","operation_key":"e","generation":1,"expected_version":0,"body":{}}`),
		publish(jobs[0], "k0"))
	if res.Results[0].Status != 400 || code(res.Results[0]) != wire.CodeInvalid || res.Results[1].Status != 200 || !res.Results[1].Replayed {
		t.Fatalf("a publication with a duplicate key beside a replay: %+v", res.Results)
	}
}
