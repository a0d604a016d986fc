package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/httpapi"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

// TestBadRequests: every bad request gets its documented 4xx and leaves the
// database exactly as it was.
func TestBadRequests(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	op, w1, w2 := credential(t, state, "operator"), credential(t, state, "worker-1"), credential(t, state, "worker-2")
	job := claimAs(t, h, w1)
	jobURL := h.URL + "/v1/jobs/" + job.OperationID
	ref := map[string]any{"claim_id": job.Claim.ClaimID, "generation": job.Claim.Generation}
	huge := `{"claim_id":"` + strings.Repeat("x", httpapi.MaxBodyBytes) + `","generation":1}`
	bigBody := map[string]any{"operation_key": "k", "generation": job.Claim.Generation, "expected_version": 0,
		"body": map[string]any{"x": strings.Repeat("y", 64<<10)}}

	cases := []struct {
		name, method, url, token string
		body                     any
		status                   int
		code                     wire.Code
	}{
		{"no credential", "POST", h.URL + "/v1/claims", "", nil, 401, "unauthorized"},
		{"unknown credential", "POST", h.URL + "/v1/claims", "fleet_not-a-real-token", nil, 401, "unauthorized"},
		{"worker on admin route", "GET", h.URL + "/admin/snapshot", w1, nil, 403, "forbidden"},
		{"operator on worker route", "POST", h.URL + "/v1/claims", op, nil, 403, "forbidden"},
		{"claims with a body", "POST", h.URL + "/v1/claims", w2, `{"worker":"worker-1"}`, 400, "invalid_request"},
		{"claims max 0", "POST", h.URL + "/v1/claims", w2, `{"max":0}`, 400, "invalid_request"},
		{"claims max over the batch limit", "POST", h.URL + "/v1/claims", w2, `{"max":65}`, 400, "invalid_request"},
		{"claims max not a whole number", "POST", h.URL + "/v1/claims", w2, `{"max":2.5}`, 400, "invalid_request"},
		{"claims admit not a boolean", "POST", h.URL + "/v1/claims", w2, `{"max":2,"admit":"yes"}`, 400, "invalid_request"},
		{"claims admit twice", "POST", h.URL + "/v1/claims", w2, `{"admit":true,"admit":false}`, 400, "invalid_request"},
		{"dispatch unknown field", "POST", jobURL + "/dispatch", w1, `{"claim_id":"c","generation":1,"caller":"worker-2"}`, 400, "invalid_request"},
		{"dispatch wrong type", "POST", jobURL + "/dispatch", w1, `{"claim_id":1,"generation":1}`, 400, "invalid_request"},
		{"dispatch missing generation", "POST", jobURL + "/dispatch", w1, `{"claim_id":"c"}`, 400, "invalid_request"},
		{"dispatch negative generation", "POST", jobURL + "/dispatch", w1, `{"claim_id":"c","generation":-1}`, 400, "invalid_request"},
		{"dispatch huge generation", "POST", jobURL + "/dispatch", w1, `{"claim_id":"c","generation":1e400}`, 400, "invalid_request"},
		{"malformed JSON", "POST", jobURL + "/dispatch", w1, `{"claim_id":`, 400, "invalid_request"},
		{"trailing garbage", "POST", jobURL + "/dispatch", w1, `{"claim_id":"c","generation":1} x`, 400, "invalid_request"},
		{"duplicate keys", "POST", jobURL + "/dispatch", w1, `{"claim_id":"c","claim_id":"d","generation":1}`, 400, "invalid_request"},
		{"invalid UTF-8", "POST", jobURL + "/dispatch", w1, "{\"claim_id\":\"\xff\",\"generation\":1}", 400, "invalid_request"},
		{"body over 132 KiB", "POST", jobURL + "/dispatch", w1, huge, 413, "body_too_large"},
		{"another worker's claim", "POST", jobURL + "/dispatch", w2, ref, 409, "stale_claim"},
		{"another worker's heartbeat", "POST", jobURL + "/heartbeat", w2, ref, 409, "stale_claim"},
		{"wrong claim id", "POST", jobURL + "/dispatch", w1, map[string]any{"claim_id": "nope", "generation": job.Claim.Generation}, 409, "stale_claim"},
		{"wrong generation", "POST", jobURL + "/dispatch", w1, map[string]any{"claim_id": job.Claim.ClaimID, "generation": 99}, 409, "stale_claim"},
		{"malformed operation id", "POST", h.URL + "/v1/jobs/not-a-uuid/dispatch", w1, ref, 400, "invalid_request"},
		{"path traversal id", "POST", h.URL + "/v1/jobs/..%2F..%2Fetc/dispatch", w1, ref, 400, "invalid_request"},
		{"unknown operation", "POST", h.URL + "/v1/jobs/01900000-0000-7000-8000-000000000000/dispatch", w1, ref, 404, "not_found"},
		{"publish body over 64 KiB", "POST", jobURL + "/publish", w1, bigBody, 400, "invalid_request"},
		{"publish owner field", "POST", jobURL + "/publish", w1, `{"operation_key":"k","generation":1,"expected_version":0,"body":{},"owner":"worker-1"}`, 400, "invalid_request"},
		{"publish body not object", "POST", jobURL + "/publish", w1, `{"operation_key":"k","generation":1,"expected_version":0,"body":"x"}`, 400, "invalid_request"},
		{"document bad id", "GET", h.URL + "/v1/documents/a%20b", w1, nil, 400, "invalid_request"},
		{"document unknown", "GET", h.URL + "/v1/documents/doc-none", w1, nil, 404, "not_found"},
		{"cancel unknown job", "POST", h.URL + "/admin/jobs/01900000-0000-7000-8000-000000000000/cancel", op, nil, 404, "not_found"},
		{"requeue a claimed job", "POST", h.URL + "/admin/jobs/" + job.OperationID + "/requeue", op, nil, 409, "state_conflict"},
		{"assign stale generation", "POST", h.URL + "/admin/documents/" + job.DocumentID + "/assign", op, map[string]any{"expected_generation": 0, "owner": "worker-2"}, 409, "assignment_conflict"},
		{"assign to a non-worker", "POST", h.URL + "/admin/documents/" + job.DocumentID + "/assign", op, map[string]any{"expected_generation": job.Claim.Generation, "owner": "operator"}, 400, "invalid_request"},
		{"allowance stale", "POST", h.URL + "/admin/allowance", op, map[string]any{"expected_allowance": 49, "allowance": 100}, 409, "allowance_conflict"},
		{"allowance negative", "POST", h.URL + "/admin/allowance", op, map[string]any{"expected_allowance": 50, "allowance": -1}, 400, "invalid_request"},
		{"allowance missing", "POST", h.URL + "/admin/allowance", op, `{"allowance":100}`, 400, "invalid_request"},
		{"reports bad section", "POST", h.URL + "/admin/reports", op, map[string]any{"document": "x", "sections": []string{"poem"}, "idempotency_key": "k"}, 400, "invalid_request"},
		{"reports blank document", "POST", h.URL + "/admin/reports", op, map[string]any{"document": "  ", "sections": []string{"summary"}, "idempotency_key": "k"}, 400, "invalid_request"},
		{"events bad after", "GET", h.URL + "/admin/events?after=-1", op, nil, 400, "invalid_request"},
		{"receipt bad id", "GET", h.URL + "/admin/receipts/rcpt-xyz", op, nil, 400, "invalid_request"},
		{"receipt unknown", "GET", h.URL + "/admin/receipts/rcpt-" + strings.Repeat("0", 64), op, nil, 404, "not_found"},
		{"no such route", "GET", h.URL + "/v2/nothing", op, nil, 404, "not_found"},
		{"wrong method", "DELETE", h.URL + "/admin/snapshot", op, nil, 404, "not_found"},
		{"garbage credential bytes", "POST", h.URL + "/v1/claims", "\xff\xfe garbage \u2603", nil, 401, "unauthorized"},
		{"basic auth instead of bearer", "GET", h.URL + "/admin/snapshot", "", nil, 401, "unauthorized"},
		{"over-long operation id", "POST", h.URL + "/v1/jobs/" + strings.Repeat("a", 10000) + "/dispatch", w1, ref, 400, "invalid_request"},
		{"uppercase operation id", "POST", h.URL + "/v1/jobs/" + strings.ToUpper(job.OperationID) + "/dispatch", w1, ref, 400, "invalid_request"},
		{"over-long document id", "GET", h.URL + "/v1/documents/" + strings.Repeat("d", 200), w1, nil, 400, "invalid_request"},
		{"dot-dot document id", "GET", h.URL + "/v1/documents/..", w1, nil, 400, "invalid_request"},
		{"over-long claim id", "POST", jobURL + "/heartbeat", w1, map[string]any{"claim_id": strings.Repeat("c", 200), "generation": 1}, 400, "invalid_request"},
		{"heartbeat null body", "POST", jobURL + "/heartbeat", w1, "null", 400, "invalid_request"},
		{"publish huge version", "POST", jobURL + "/publish", w1, `{"operation_key":"k","generation":1,"expected_version":9223372036854775808,"body":{}}`, 400, "invalid_request"},
		{"publish empty key", "POST", jobURL + "/publish", w1, `{"operation_key":"","generation":1,"expected_version":0,"body":{}}`, 400, "invalid_request"},
		{"publish over-long key", "POST", jobURL + "/publish", w1, map[string]any{"operation_key": strings.Repeat("k", 513), "generation": 1, "expected_version": 0, "body": map[string]any{}}, 400, "invalid_request"},
		{"publish invalid UTF-8 body", "POST", jobURL + "/publish", w1, "{\"operation_key\":\"k\",\"generation\":1,\"expected_version\":0,\"body\":{\"x\":\"\xc3\x28\"}}", 400, "invalid_request"},
		{"fail without a reason", "POST", jobURL + "/fail", w1, map[string]any{"claim_id": job.Claim.ClaimID, "generation": job.Claim.Generation, "reason": " ", "retryable": true}, 400, "invalid_request"},
		{"fail reason with control characters", "POST", jobURL + "/fail", w1, map[string]any{"claim_id": job.Claim.ClaimID, "generation": job.Claim.Generation, "reason": "a\x1bb", "retryable": true}, 400, "invalid_request"},
		{"fail reason over 1 KiB", "POST", jobURL + "/fail", w1, map[string]any{"claim_id": job.Claim.ClaimID, "generation": job.Claim.Generation, "reason": strings.Repeat("r", 1025), "retryable": true}, 400, "invalid_request"},
		{"fail negative usage", "POST", jobURL + "/fail", w1, map[string]any{"claim_id": job.Claim.ClaimID, "generation": job.Claim.Generation, "reason": "r", "usage": map[string]any{"prompt_tokens": -1, "completion_tokens": 0}}, 400, "invalid_request"},
		{"fail unknown field", "POST", jobURL + "/fail", w1, `{"claim_id":"c","generation":1,"reason":"r","force":true}`, 400, "invalid_request"},
		{"fail another's claim", "POST", jobURL + "/fail", w2, map[string]any{"claim_id": job.Claim.ClaimID, "generation": job.Claim.Generation, "reason": "r", "retryable": true}, 409, "stale_claim"},
		{"reports max_attempts 0", "POST", h.URL + "/admin/reports", op, map[string]any{"document": "d", "sections": []string{"links"}, "idempotency_key": "k", "max_attempts": 0}, 400, "invalid_request"},
		{"reports backoff cap below base", "POST", h.URL + "/admin/reports", op, map[string]any{"document": "d", "sections": []string{"links"}, "idempotency_key": "k", "backoff_base_ms": 5000, "backoff_cap_ms": 100}, 400, "invalid_request"},
		{"credential add without a name", "POST", h.URL + "/admin/credentials", op, `{}`, 400, "invalid_request"},
		{"credential add malformed name", "POST", h.URL + "/admin/credentials", op, map[string]any{"name": "a b/../c"}, 400, "invalid_request"},
		{"credential add unknown field", "POST", h.URL + "/admin/credentials", op, `{"name":"worker-8","role":"operator"}`, 400, "invalid_request"},
		{"credential add taken name", "POST", h.URL + "/admin/credentials", op, map[string]any{"name": "worker-1"}, 409, "state_conflict"},
		{"credential add the operator's name", "POST", h.URL + "/admin/credentials", op, map[string]any{"name": "operator"}, 409, "state_conflict"},
		{"credential add by a worker", "POST", h.URL + "/admin/credentials", w1, map[string]any{"name": "worker-8"}, 403, "forbidden"},
		{"pause reason of two lines", "POST", h.URL + "/admin/claims/pause", op, map[string]any{"reason": "a\nb"}, 400, "invalid_request"},
		{"pause unknown field", "POST", h.URL + "/admin/claims/pause", op, `{"reason":"r","hosts":["a"]}`, 400, "invalid_request"},
		{"pause by a worker", "POST", h.URL + "/admin/claims/pause", w1, nil, 403, "forbidden"},
		{"resume with a body", "POST", h.URL + "/admin/claims/resume", op, `{"force":true}`, 400, "invalid_request"},
		{"cancel with a body", "POST", h.URL + "/admin/jobs/" + job.OperationID + "/cancel", op, `{"force":true}`, 400, "invalid_request"},
		{"reconcile malformed id", "POST", h.URL + "/admin/jobs/x/reconcile", op, nil, 400, "invalid_request"},
		{"assign unknown field", "POST", h.URL + "/admin/documents/" + job.DocumentID + "/assign", op, `{"expected_generation":1,"owner":"worker-2","force":true}`, 400, "invalid_request"},
		{"assign wrong type", "POST", h.URL + "/admin/documents/" + job.DocumentID + "/assign", op, `{"expected_generation":"1","owner":"worker-2"}`, 400, "invalid_request"},
		{"assign unknown document", "POST", h.URL + "/admin/documents/doc-none/assign", op, map[string]any{"expected_generation": 0, "owner": "worker-2"}, 404, "not_found"},
		{"allowance huge", "POST", h.URL + "/admin/allowance", op, map[string]any{"expected_allowance": 50, "allowance": 1000001}, 400, "invalid_request"},
		{"allowance float", "POST", h.URL + "/admin/allowance", op, `{"expected_allowance":50,"allowance":60.5}`, 400, "invalid_request"},
		{"reports unknown field", "POST", h.URL + "/admin/reports", op, `{"document":"d","sections":["links"],"idempotency_key":"k","urgency":1}`, 400, "invalid_request"},
		{"reports priority 0", "POST", h.URL + "/admin/reports", op, `{"document":"d","sections":["links"],"idempotency_key":"k","priority":0}`, 400, "invalid_request"},
		{"reports priority 5", "POST", h.URL + "/admin/reports", op, `{"document":"d","sections":["links"],"idempotency_key":"k","priority":5}`, 400, "invalid_request"},
		{"reports priority a word", "POST", h.URL + "/admin/reports", op, `{"document":"d","sections":["links"],"idempotency_key":"k","priority":"high"}`, 400, "invalid_request"},
		{"reports priority a fraction", "POST", h.URL + "/admin/reports", op, `{"document":"d","sections":["links"],"idempotency_key":"k","priority":1.5}`, 400, "invalid_request"},
		{"jobs priority 9", "GET", h.URL + "/admin/jobs?priority=9", op, nil, 400, "invalid_request"},
		{"reports 65 sections", "POST", h.URL + "/admin/reports", op, map[string]any{"document": "d", "sections": make([]string, 65), "idempotency_key": "k"}, 400, "invalid_request"},
		{"reports document too long", "POST", h.URL + "/admin/reports", op, map[string]any{"document": strings.Repeat("a", 64001), "sections": []string{"links"}, "idempotency_key": "k"}, 400, "invalid_request"},
		{"reports reserved key", "POST", h.URL + "/admin/reports", op, map[string]any{"document": "d", "sections": []string{"links"}, "idempotency_key": "init"}, 400, "invalid_request"},
		{"reports body over 132 KiB", "POST", h.URL + "/admin/reports", op, map[string]any{"document": strings.Repeat("a", httpapi.MaxBodyBytes), "sections": []string{"links"}, "idempotency_key": "k"}, 413, "body_too_large"},
	}
	before := digest(t, state)
	t.Logf("%d hostile requests", len(cases))
	for _, c := range cases {
		r := call(t, c.method, c.url, c.token, c.body)
		if r.Status != c.status || r.code() != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, r.Status, r.Body, c.status, c.code)
			continue
		}
		var e struct{ Error struct{ Message string } }
		testkit.MustDecode(t, r.Body, &e)
		if e.Error.Message == "" {
			t.Errorf("%s: no message in %s", c.name, r.Body)
		}
		if after := digest(t, state); after != before {
			t.Fatalf("%s changed the database", c.name)
		}
	}
	// The claim still works after all that.
	mustStatus(t, call(t, "POST", jobURL+"/dispatch", w1, ref), 200)
}

// TestInvalidInputRefused: init refuses bad input.json values with a message
// naming the field and creates nothing.
func TestInvalidInputRefused(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		edit  func(m map[string]any)
		field string
	}{
		"unknown field":      {func(m map[string]any) { m["workers"] = 3 }, "workers"},
		"blank document":     {func(m map[string]any) { m["document"] = "   " }, "document"},
		"huge document":      {func(m map[string]any) { m["document"] = strings.Repeat("a", 64001) }, "document"},
		"no sections":        {func(m map[string]any) { m["sections"] = []string{} }, "sections"},
		"bad section":        {func(m map[string]any) { m["sections"] = []string{"summary", "poem"} }, "sections[1]"},
		"concurrency type":   {func(m map[string]any) { m["concurrency"] = "3" }, "concurrency"},
		"concurrency range":  {func(m map[string]any) { m["concurrency"] = 65 }, "concurrency"},
		"allowance range":    {func(m map[string]any) { m["allowance"] = 1000001 }, "allowance"},
		"cost zero":          {func(m map[string]any) { m["cost_per_report"] = 0 }, "cost_per_report"},
		"cancel range":       {func(m map[string]any) { m["cancel_index"] = 4 }, "cancel_index"},
		"lose ack negative":  {func(m map[string]any) { m["lose_ack_index"] = -1 }, "lose_ack_index"},
		"restart type":       {func(m map[string]any) { m["restart"] = "yes" }, "restart"},
		"mode":               {func(m map[string]any) { m["mode"] = "magic" }, "mode"},
		"max attempts range": {func(m map[string]any) { m["max_attempts"] = 101 }, "max_attempts"},
		"backoff negative":   {func(m map[string]any) { m["backoff_base_ms"] = -1 }, "backoff_base_ms"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "input.json")
			testkit.WriteFile(t, path, sampleInput(t, c.edit), 0o600)
			state := filepath.Join(dir, "state")
			out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "init", "--state", state, "--input", path).CombinedOutput()
			if err == nil || !strings.Contains(string(out), c.field) {
				t.Fatalf("init: %v: %s (want a refusal naming %s)", err, out, c.field)
			}
			if _, err := os.Stat(state); !os.IsNotExist(err) {
				t.Fatal("a refused init created the state directory")
			}
			runOut, err := exec.Command(filepath.Join(binDir, "fleet-run"), "--bin", binDir, "--input", path, "--runs", filepath.Join(dir, "runs")).CombinedOutput()
			if err == nil || !strings.Contains(string(runOut), c.field) {
				t.Fatalf("fleet-run: %v: %s", err, runOut)
			}
		})
	}
}

// TestLargestSectionsRun: adversarial documents at the size limit, through
// fleet-run (what ./run.sh execs). A document whose actions, links or
// summary section could not be published is refused before anything
// starts, naming the section and the limit; a document whose sections fit,
// though heavy in what JSON encoders escape (<, &, U+2028), runs to the end
// with every funded job completed and none unresolved.
func TestLargestSectionsRun(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, document string) (string, error) {
		dir := t.TempDir()
		path := filepath.Join(dir, "input.json")
		testkit.WriteFile(t, path, sampleInput(t, func(m map[string]any) {
			m["document"], m["allowance"], m["restart"] = document, 100, false
		}), 0o600)
		out, err := exec.Command(filepath.Join(binDir, "fleet-run"), "--bin", binDir, "--input", path, "--runs", filepath.Join(dir, "runs")).CombinedOutput()
		return string(out), err
	}
	over := map[string]string{
		"actions": strings.Repeat("- [ ] ab\n", 7100), // the 63,900-byte document
		"links":   strings.Repeat(strings.Repeat("http://a/\" ", 10)+"\n", 575),
		"summary": strings.Repeat(strings.Repeat("\"\x01", 7000)+"\n", 3),
	}
	for kind, doc := range over {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			out, err := run(t, doc)
			if err == nil || !strings.Contains(out, kind+" section") || !strings.Contains(out, "at most 65536 bytes") {
				t.Fatalf("fleet-run on a document whose %s section cannot be published: %v\n%s", kind, err, out)
			}
		})
	}
	t.Run("fits", func(t *testing.T) {
		t.Parallel()
		line := "- [ ] must " + strings.Repeat("<", 300) + " http://h/" + strings.Repeat("&", 200) + strings.Repeat("\u2028", 20) + "\n"
		doc := strings.Repeat(line, 100)
		out, err := run(t, doc)
		if err != nil {
			t.Fatalf("fleet-run: %v\n%s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if last := lines[len(lines)-1]; !strings.HasPrefix(last, `{"jobs":4,"completed":4,`) || !strings.Contains(last, `"unresolved":0`) {
			t.Fatalf("summary %s\n%s", last, out)
		}
	})
}
