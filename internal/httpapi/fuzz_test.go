package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/wire"
)

type route struct {
	method, path string // {} is the fuzzed parameter
	operator     bool
}

var routes = []route{
	{"POST", "/v1/claims", false},
	{"POST", "/v1/jobs/{}/dispatch", false},
	{"POST", "/v1/jobs/{}/heartbeat", false},
	{"POST", "/v1/jobs/{}/publish", false},
	{"GET", "/v1/documents/{}", false},
	{"GET", "/admin/jobs/{}", true},
	{"POST", "/admin/reports", true},
	{"POST", "/admin/jobs/{}/cancel", true},
	{"POST", "/admin/jobs/{}/reconcile", true},
	{"POST", "/admin/jobs/{}/requeue", true},
	{"POST", "/admin/documents/{}/assign", true},
	{"POST", "/admin/allowance", true},
	{"GET", "/admin/events?after={}", true},
	{"GET", "/admin/receipts/{}", true},
	{"GET", "/admin/snapshot", true},
	{"GET", "/metrics", true},
	{"POST", "/admin/credentials", true},
	{"POST", "/admin/claims/pause", true},
	{"POST", "/admin/claims/resume", true},
	{"GET", "/admin/workers", true},
	{"POST", "/admin/jobs/bulk", true},
	{"POST", "/v1/jobs/{}/release", false},
	{"GET", "/admin/events?job={}", true},
	{"GET", "/admin/events?before=9&kind={}", true},
	{"POST", "/admin/tenants", true},
	{"POST", "/admin/tenants/{}/allowance", true},
	{"GET", "/admin/tenants", true},
	{"POST", "/admin/tenants/{}/weight", true},
}

var knownCodes = map[string]bool{}

func init() {
	for _, c := range wire.Codes {
		knownCodes[string(c)] = true
	}
}

// FuzzHostAPI sends fuzzed requests (route, path parameter, body) through
// the real handler to a real host on a temp database. No request may fail
// with a 5xx, every error carries a known code, and the accounting never
// goes negative. "@job" and "@doc" in the parameter stand for a real
// operation id and document id, so fuzzing reaches past the not_found path.
func FuzzHostAPI(f *testing.F) {
	ctx := context.Background()
	th := newTestHost(f, `{"document":"Fuzz text. It must hold.\n- [ ] a task https://x.example","sections":["summary","terms","actions","links"],"allowance":60,"concurrency":2}`)
	h, handler, worker, operator := th.host, th.handler, th.worker, th.operator
	job, doc := th.jobs[0].OperationID, th.jobs[0].DocumentID

	f.Add(uint8(0), "", []byte(``))
	// Reconciling the job just claimed: still_running (seeds run in order).
	f.Add(uint8(8), "@job", []byte(``))
	f.Add(uint8(1), "@job", []byte(`{"claim_id":"x","generation":1}`))
	f.Add(uint8(2), "@job", []byte(`{"claim_id":"x","generation":0}`))
	f.Add(uint8(3), "@job", []byte(`{"operation_key":"k","generation":1,"expected_version":0,"body":{"a":1}}`))
	f.Add(uint8(4), "@doc", []byte(``))
	f.Add(uint8(6), "", []byte(`{"document":"d","sections":["links"],"idempotency_key":"k"}`))
	f.Add(uint8(7), "@job", []byte(``))
	f.Add(uint8(10), "@doc", []byte(`{"expected_generation":0,"owner":"worker-2"}`))
	f.Add(uint8(11), "", []byte(`{"expected_allowance":60,"allowance":80}`))
	f.Add(uint8(12), "3", []byte(``))
	f.Add(uint8(13), "rcpt-00", []byte(``))
	f.Add(uint8(1), "../../admin/snapshot", []byte(`{"claim_id":"x","generation":1,"generation":2}`))

	f.Fuzz(func(t *testing.T, which uint8, param string, body []byte) {
		r := routes[int(which)%len(routes)]
		param = strings.NewReplacer("@job", job, "@doc", doc).Replace(param)
		target := strings.Replace(r.path, "{}", url.PathEscape(param), 1)
		if strings.Contains(r.path, "?") {
			target = strings.Replace(r.path, "{}", url.QueryEscape(param), 1)
		}
		req := httptest.NewRequest(r.method, "http://fleet"+target, bytes.NewReader(body))
		token := worker
		if r.operator {
			token = operator
		}
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %s %q: %d %s", r.method, target, body, rec.Code, rec.Body)
		}
		if rec.Code >= 400 {
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || !knownCodes[e.Error.Code] || e.Error.Message == "" {
				t.Fatalf("%s %s: error body %s", r.method, target, rec.Body)
			}
		}
		s, err := h.Views().Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if a := s.Accounting; a.Available < 0 || a.Spent+a.Reserved > a.Allowance {
			t.Fatalf("accounting broken after %s %s: %+v", r.method, target, a)
		}
	})
}
