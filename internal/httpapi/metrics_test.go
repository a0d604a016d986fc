package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/httpapi"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestMetrics plays a known sequence and reads the metrics it must produce.
func TestMetrics(t *testing.T) {
	th := newTestHost(t, `{"document":"Metrics text.","sections":["summary","terms","actions","links"],"allowance":50,"cost_per_report":20,"concurrency":2}`)
	// Claims come 2 s after the jobs were enqueued, by the clock that
	// stamped them (not the test's start, which a loaded machine delays),
	// and the first job runs 3 s.
	var snap wire.Snapshot
	if err := json.Unmarshal(th.do("GET", "/admin/snapshot", th.operator, "").Body.Bytes(), &snap); err != nil || len(snap.Jobs) == 0 {
		t.Fatalf("snapshot: %v", err)
	}
	clock := storetest.NewClock(time.UnixMilli(snap.Jobs[0].CreatedAtMS).Add(2 * time.Second))
	th.host.DB().Now = clock.Now
	claim := func() wire.ClaimedJob {
		t.Helper()
		rec := th.do("POST", "/v1/claims", th.worker, "")
		var res wire.ClaimResult
		if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || res.Job == nil {
			t.Fatalf("claim: %d %s", rec.Code, rec.Body)
		}
		return *res.Job
	}
	dispatch := func(j wire.ClaimedJob) {
		t.Helper()
		body := fmt.Sprintf(`{"claim_id":%q,"generation":%d}`, j.Claim.ClaimID, j.Claim.Generation)
		if rec := th.do("POST", "/v1/jobs/"+j.OperationID+"/dispatch", th.worker, body); rec.Code != 200 {
			t.Fatalf("dispatch: %d %s", rec.Code, rec.Body)
		}
	}
	publish := func(j wire.ClaimedJob, key string) string {
		t.Helper()
		section, err := sections.Body(j.OperationID, j.Section, j.InputSHA256, j.Input.Document)
		if err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf(`{"operation_key":%q,"generation":%d,"expected_version":0,"body":%s}`, key, j.Claim.Generation, section)
		rec := th.do("POST", "/v1/jobs/"+j.OperationID+"/publish", th.worker, body)
		if rec.Code != 200 {
			t.Fatalf("publish: %d %s", rec.Code, rec.Body)
		}
		return rec.Body.String()
	}

	first := claim()
	dispatch(first) // allow
	clock.Advance(3 * time.Second)
	publish(first, "k1") // published
	publish(first, "k1") // replay
	publish(first, "k2") // superseded: the job is complete
	second := claim()    // stays running
	dispatch(second)     // allow
	third := claim()     // refused
	dispatch(third)      // deny: 10 credits left
	th.do("POST", "/v1/jobs/"+third.OperationID+"/dispatch", th.worker,
		fmt.Sprintf(`{"claim_id":%q,"generation":%d}`, third.Claim.ClaimID, third.Claim.Generation)) // a repeat counts nothing

	if rec := th.do("GET", "/metrics", th.worker, ""); rec.Code != 403 {
		t.Fatalf("/metrics with a worker credential: %d", rec.Code)
	}
	if rec := th.do("GET", "/metrics", "", ""); rec.Code != 401 {
		t.Fatalf("/metrics without a credential: %d", rec.Code)
	}
	rec := th.do("GET", "/metrics", th.operator, "")
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	text := rec.Body.String()
	for _, want := range []string{
		`fleet_admissions_total{decision="allow"} 2`,
		`fleet_admissions_total{decision="deny"} 1`,
		`fleet_publications_total{outcome="published"} 1`,
		`fleet_publications_total{outcome="superseded"} 1`,
		`fleet_publication_replays_total 1`,
		`fleet_jobs{state="completed"} 1`,
		`fleet_jobs{state="running"} 1`,
		`fleet_jobs{state="refused"} 1`,
		`fleet_jobs{state="queued"} 1`,
		`fleet_jobs{state="unresolved"} 0`,
		`fleet_credits{kind="spent"} 20`,
		`fleet_credits{kind="reserved"} 20`,
		`fleet_credits{kind="available"} 10`,
		`fleet_credits{kind="allowance"} 50`,
		// The tenant default holds every job here, with no allowance of
		// its own: its figures are the fleet's, and it has no allowance line.
		`fleet_tenant_credits{kind="spent",tenant="default"} 20`,
		`fleet_tenant_credits{kind="reserved",tenant="default"} 20`,
		`fleet_tenant_credits{kind="available",tenant="default"} 10`,
		`fleet_batch_reruns_total 0`, // SQLite never reruns a batch
		`fleet_http_request_duration_seconds_count{code="200",method="POST",route="/v1/claims"} 3`,
		`fleet_http_request_duration_seconds_count{code="200",method="POST",route="/v1/jobs/:op/publish"} 3`,
		`fleet_http_request_duration_seconds_count{code="403",method="GET",route="/metrics"} 1`,
		`fleet_state_scrape_error 0`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(text, `fleet_tenant_credits{kind="allowance",tenant="default"}`) {
		t.Error("a tenant with no allowance of its own has an allowance line")
	}
	// A tenant capped at 30 has its line; what it may still spend is the
	// fleet's 10.
	if rec := th.do("POST", "/admin/tenants", th.operator, `{"name":"team-a","allowance":30}`); rec.Code != 200 {
		t.Fatalf("add a tenant: %d %s", rec.Code, rec.Body)
	}
	text = th.do("GET", "/metrics", th.operator, "").Body.String()
	for _, want := range []string{`fleet_tenant_credits{kind="allowance",tenant="team-a"} 30`, `fleet_tenant_credits{kind="available",tenant="team-a"} 10`} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
	if !strings.Contains(text, "fleet_commit_duration_seconds_count ") || !strings.Contains(text, "fleet_commit_requests_sum ") {
		t.Error("metrics lack the commit histograms")
	}
	// Queue wait: three claims, the first 2 s after its job was enqueued,
	// the others 3 s later still; run time: one job, exactly 3 s
	// (the superseded publication after it completes nothing).
	value := func(name string) float64 {
		t.Helper()
		m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("metrics lack %s", name)
		}
		var v float64
		fmt.Sscan(m[1], &v)
		return v
	}
	if n, sum := value("fleet_job_queue_wait_seconds_count"), value("fleet_job_queue_wait_seconds_sum"); n != 3 || sum != 12 {
		t.Errorf("queue wait: %v claims, %v s in all; want 3 and 2+5+5", n, sum)
	}
	if n, sum := value("fleet_job_run_seconds_count"), value("fleet_job_run_seconds_sum"); n != 1 || sum != 3 {
		t.Errorf("run time: %v jobs, %v s in all; want 1 job of 3 s", n, sum)
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", text)
	}
}

// TestMetricsLabelsBounded: the request metric's labels come from fixed
// sets, so requests with made-up methods and paths (no credential needed)
// cannot grow the host's memory or its /metrics page one series at a time.
func TestMetricsLabelsBounded(t *testing.T) {
	th := newTestHost(t, `{"document":"Labels.","sections":["summary"],"allowance":50,"cost_per_report":20,"concurrency":1}`)
	series := func() int {
		t.Helper()
		rec := th.do("GET", "/metrics", th.operator, "")
		n := 0
		for _, line := range strings.Split(rec.Body.String(), "\n") {
			if strings.HasPrefix(line, "fleet_http_request_duration_seconds_count{") {
				n++
			}
		}
		return n
	}
	// Every kind of answer once: known routes and methods, 401, 404, 405.
	warm := func() {
		th.do("GET", "/healthz", "", "")
		th.do("POST", "/v1/claims", "", "")
		th.do("GET", "/no/such/route", "", "")
		th.do("PATCH", "/healthz", "", "")
		th.do("WEIRD", "/also/none", "", "")
		th.do("WEIRD", "/v1/jobs/x/dispatch", "", "")
		th.do("GET", "/metrics", th.operator, "")
	}
	warm()
	warm()
	before := series()
	rng := rand.New(rand.NewPCG(1, 2))
	letters := "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	for i := range 10_000 {
		method := make([]byte, 1+rng.IntN(40))
		for k := range method {
			method[k] = letters[rng.IntN(len(letters))]
		}
		path := fmt.Sprintf("/%x/%d", rng.Uint64(), i)
		if i%2 == 0 {
			path = "/v1/jobs/" + path[1:] + "/dispatch"
		}
		th.do(string(method), path, "", "")
	}
	if after := series(); after != before {
		t.Fatalf("random methods and paths made new series: %d before, %d after", before, after)
	}
}

// TestGrafanaDashboard: every query of the dashboard in docs/grafana names
// metrics the host exports. The host is driven through everything that
// makes a metric appear (an admission, a publication and its replay, a
// failed attempt, an expired lease, a refused request, commits), then
// scraped; a histogram's _bucket, _sum and _count count as its name.
func TestGrafanaDashboard(t *testing.T) {
	th := newTestHost(t, `{"document":"Dashboard text.","sections":["summary","terms","actions"],"allowance":100,"cost_per_report":20,"concurrency":2}`)
	clock := storetest.NewClock(time.Now())
	th.host.DB().Now = clock.Now
	claim := func() wire.ClaimedJob {
		t.Helper()
		var res wire.ClaimResult
		if err := json.Unmarshal(th.do("POST", "/v1/claims", th.worker, "").Body.Bytes(), &res); err != nil || res.Job == nil {
			t.Fatal("claim", err)
		}
		return *res.Job
	}
	ref := func(j wire.ClaimedJob) string {
		return fmt.Sprintf(`{"claim_id":%q,"generation":%d}`, j.Claim.ClaimID, j.Claim.Generation)
	}
	a := claim()
	th.do("POST", "/v1/jobs/"+a.OperationID+"/dispatch", th.worker, ref(a))
	body, _ := sections.Body(a.OperationID, a.Section, a.InputSHA256, a.Input.Document)
	pub := fmt.Sprintf(`{"operation_key":"k","generation":%d,"expected_version":0,"body":%s}`, a.Claim.Generation, body)
	th.do("POST", "/v1/jobs/"+a.OperationID+"/publish", th.worker, pub)
	th.do("POST", "/v1/jobs/"+a.OperationID+"/publish", th.worker, pub) // a replay
	b := claim()
	th.do("POST", "/v1/jobs/"+b.OperationID+"/fail", th.worker, fmt.Sprintf(`{"claim_id":%q,"generation":%d,"reason":"boom","retryable":true}`,
		b.Claim.ClaimID, b.Claim.Generation))
	claim() // left to lapse
	clock.Advance(th.host.Lease + time.Second)
	if _, err := th.host.Claims().ExpireLeases(context.Background()); err != nil {
		t.Fatal(err)
	}
	limits := testLimits()
	limits.WorkerRate, limits.WorkerBurst = 0.001, 1
	strict := httpapi.New(th.host, slog.New(slog.NewTextHandler(io.Discard, nil)), limits).Handler()
	for range 2 { // the second is over the rate
		req := httptest.NewRequest("GET", "http://fleet/v1/documents/none", nil)
		req.Header.Set("Authorization", "Bearer "+th.worker)
		strict.ServeHTTP(httptest.NewRecorder(), req)
	}
	exported := map[string]bool{}
	for _, line := range strings.Split(th.do("GET", "/metrics", th.operator, "").Body.String(), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			exported[f[2]] = true
			if f[3] == "histogram" {
				exported[f[2]+"_bucket"], exported[f[2]+"_sum"], exported[f[2]+"_count"] = true, true, true
			}
		}
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	raw, err := os.ReadFile("../../docs/grafana/fleet.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	queries := 0
	// A gauge of the whole database (every host exports the same value)
	// summed over hosts counts it once per host.
	summedGauge := regexp.MustCompile(`sum(\s*by\s*\([^)]*\))?\s*\(\s*(fleet_jobs|fleet_credits|fleet_claims_paused)\b`)
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			queries++
			// Every series is selected by the dashboard's host variable, so
			// one host's panels can be read apart from the others'.
			for _, sel := range regexp.MustCompile(`fleet_[a-z_]+(\{[^}]*\})?`).FindAllStringSubmatch(q.Expr, -1) {
				if !strings.Contains(sel[1], `instance=~"$instance"`) {
					t.Errorf("panel %q: %s is not selected by the instance variable", p.Title, sel[0])
				}
			}
			if summedGauge.MatchString(q.Expr) {
				t.Errorf("panel %q: %q sums a database-wide gauge over the hosts; take its max", p.Title, q.Expr)
			}
			names := regexp.MustCompile(`fleet_[a-z_]+`).FindAllString(q.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: %q names no Fleet metric", p.Title, q.Expr)
			}
			for _, n := range names {
				if !exported[n] {
					t.Errorf("panel %q: %s is not a metric the host exports", p.Title, n)
				}
			}
		}
	}
	if queries < 10 {
		t.Fatalf("the dashboard has %d queries", queries)
	}
	// What Grafana's dashboard schema requires of it, and what makes it
	// readable: the annotations list, and on every panel an id, a type, a
	// place, the data source and a unit; no two panels overlap.
	var schema struct {
		Annotations *struct {
			List []map[string]any `json:"list"`
		} `json:"annotations"`
		SchemaVersion int `json:"schemaVersion"`
		Panels        []struct {
			ID          int
			Type        string
			Title       string
			GridPos     *struct{ X, Y, W, H int } `json:"gridPos"`
			Datasource  map[string]string
			FieldConfig struct {
				Defaults struct{ Unit string }
			} `json:"fieldConfig"`
		}
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	if schema.Annotations == nil || schema.Annotations.List == nil || schema.SchemaVersion < 36 {
		t.Errorf("the dashboard lacks annotations.list or a schemaVersion: %+v", schema)
	}
	ids, cells := map[int]bool{}, map[[2]int]string{}
	for _, p := range schema.Panels {
		if p.ID == 0 || ids[p.ID] || p.Type == "" || p.GridPos == nil || p.Datasource["uid"] == "" || p.FieldConfig.Defaults.Unit == "" {
			t.Errorf("panel %d %q lacks an id of its own, a type, a place, a data source or a unit", p.ID, p.Title)
			continue
		}
		ids[p.ID] = true
		for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
			for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
				if other, taken := cells[[2]int{x, y}]; taken {
					t.Fatalf("panels %q and %q overlap", other, p.Title)
				}
				cells[[2]int{x, y}] = p.Title
			}
		}
	}
}

// TestMetricsStartAtZero: on a host that has done nothing yet, every
// labelled counter is exported at 0 for each of its known label values,
// so a dashboard reads 0 after a restart, not "No data".
func TestMetricsStartAtZero(t *testing.T) {
	th := newTestHost(t, `{"document":"Zero.","sections":["summary"],"allowance":50,"cost_per_report":20,"concurrency":1}`)
	scrape := th.do("GET", "/metrics", th.operator, "").Body.String()
	for _, series := range []string{
		`fleet_admissions_total{decision="allow"} 0`, `fleet_admissions_total{decision="deny"} 0`,
		`fleet_publications_total{outcome="published"} 0`, `fleet_publications_total{outcome="superseded"} 0`,
		`fleet_publications_total{outcome="version_conflict"} 0`, `fleet_publications_total{outcome="rejected"} 0`,
		`fleet_publication_replays_total 0`,
		`fleet_lease_expiries_total{state="queued"} 0`, `fleet_lease_expiries_total{state="unresolved"} 0`, `fleet_lease_expiries_total{state="failed"} 0`,
		`fleet_job_failures_total{class="retryable",then="queued"} 0`, `fleet_job_failures_total{class="retryable",then="failed"} 0`,
		`fleet_job_failures_total{class="permanent",then="failed"} 0`,
		`fleet_job_failures_total{class="lease_expired",then="queued"} 0`, `fleet_job_failures_total{class="lease_expired",then="failed"} 0`,
		`fleet_http_requests_refused_total{reason="busy"} 0`, `fleet_http_requests_refused_total{reason="rate_limited"} 0`, `fleet_http_requests_refused_total{reason="memory"} 0`,
		`fleet_console_sign_ins_total{outcome="ok"} 0`, `fleet_console_sign_ins_total{outcome="failed"} 0`, `fleet_console_sign_ins_total{outcome="throttled"} 0`,
	} {
		if !strings.Contains(scrape, "\n"+series+"\n") {
			t.Errorf("a fresh host does not export %s", series)
		}
	}
}

// TestWorkersSeenByTheirCalls: a worker that only calls the host (no job
// moved) shows as seen then, and alive, in the workers view; one that
// never called stays unseen; a lease later it is no longer alive.
func TestWorkersSeenByTheirCalls(t *testing.T) {
	th := newTestHost(t, `{"document":"Seen.","sections":["summary"],"allowance":50,"cost_per_report":20,"concurrency":2}`)
	clock := storetest.NewClock(time.Now())
	th.host.DB().Now = clock.Now
	if rec := th.do("GET", "/v1/documents/doc-none", th.worker, ""); rec.Code != 404 {
		t.Fatalf("a worker's call: %d %s", rec.Code, rec.Body)
	}
	view := func() map[string]wire.WorkerView {
		t.Helper()
		var ws wire.Workers
		if err := json.Unmarshal(th.do("GET", "/admin/workers", th.operator, "").Body.Bytes(), &ws); err != nil {
			t.Fatal(err)
		}
		out := map[string]wire.WorkerView{}
		for _, w := range ws.Workers {
			out[w.Name] = w
		}
		return out
	}
	v := view()
	if w := v["worker-1"]; !w.Alive || w.LastSeenMS != clock.Now().UnixMilli() || w.Held != 0 {
		t.Fatalf("worker-1 after a call: %+v", w)
	}
	if w := v["worker-2"]; w.Alive || w.LastSeenMS != 0 {
		t.Fatalf("worker-2, never seen: %+v", w)
	}
	clock.Advance(th.host.Lease + time.Second)
	if w := view()["worker-1"]; w.Alive {
		t.Fatalf("worker-1 a lease after its last call: %+v", w)
	}
}

// TestBatchCallsCharted (issue 34): a worker with several slots sends its
// dispatches and publications as batch calls, and the console's latency
// chart shows them as its dispatch and publish latencies.
func TestBatchCallsCharted(t *testing.T) {
	th := newTestHost(t, `{"document":"Chart text.","sections":["summary","terms"],"allowance":100,"cost_per_report":20,"concurrency":2}`)
	var claimed wire.ClaimResult
	if err := json.Unmarshal(th.do("POST", "/v1/claims", th.worker, `{"max":2}`).Body.Bytes(), &claimed); err != nil || len(claimed.Jobs) != 2 {
		t.Fatalf("claim: %v", err)
	}
	var dispatches, publications []string
	for _, j := range claimed.Jobs {
		dispatches = append(dispatches, fmt.Sprintf(`{"operation_id":%q,"request":{"claim_id":%q,"generation":%d}}`, j.OperationID, j.Claim.ClaimID, j.Claim.Generation))
		body, _ := sections.Body(j.OperationID, j.Section, j.InputSHA256, j.Input.Document)
		publications = append(publications, fmt.Sprintf(`{"operation_id":%q,"request":{"operation_key":"k-%s","generation":%d,"expected_version":0,"body":%s}}`,
			j.OperationID, j.OperationID, j.Claim.Generation, body))
	}
	for path, items := range map[string][]string{"/v1/dispatches": dispatches} {
		if rec := th.do("POST", path, th.worker, `{"items":[`+strings.Join(items, ",")+`]}`); rec.Code != 200 {
			t.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
		}
	}
	if rec := th.do("POST", "/v1/publications", th.worker, `{"items":[`+strings.Join(publications, ",")+`]}`); rec.Code != 200 {
		t.Fatalf("publications: %d %s", rec.Code, rec.Body)
	}
	th.host.Series().Tick(time.Now().Add(time.Second), map[wire.JobState]int64{}, wire.Accounting{})
	seen := map[string]bool{}
	for _, s := range th.host.Series().After(0) {
		for kind, l := range s.Latency {
			if l.N > 0 {
				seen[kind] = true
			}
		}
	}
	if !seen["dispatch"] || !seen["publish"] {
		t.Fatalf("latencies charted: %v; want dispatch and publish from the batch calls", seen)
	}
}
