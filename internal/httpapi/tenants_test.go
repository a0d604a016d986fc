package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/wire"
)

// TestTenantRoutes: an operator creates tenants, changes one's allowance
// by compare-and-swap and its weight, and lists them; a report goes to the tenant it
// names. Bad input is a 4xx naming the problem, and the tenants stay as
// they were; a worker may do none of it.
func TestTenantRoutes(t *testing.T) {
	th := newTestHost(t, fourSections)
	list := func() string {
		t.Helper()
		rec := th.do("GET", "/admin/tenants", th.operator, "")
		if rec.Code != 200 {
			t.Fatalf("list: %d %s", rec.Code, rec.Body)
		}
		var l wire.TenantsList
		if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, x := range l.Tenants {
			allowance := "none"
			if x.Allowance != nil {
				raw, _ := json.Marshal(*x.Allowance)
				allowance = string(raw)
			}
			fmt.Fprintf(&b, "%s:%s:%s:%d ", x.Name, allowance, x.Period, x.Weight)
		}
		return b.String()
	}
	if got := list(); got != "default:none::1 " {
		t.Fatalf("a new state's tenants: %q", got)
	}
	if rec := th.do("POST", "/admin/tenants", th.operator, `{"name":"team-a","allowance":40,"period":"day","weight":2}`); rec.Code != 200 {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	for _, bad := range []struct {
		method, path, body string
		status             int
		says               string
	}{
		{"POST", "/admin/tenants", `{"name":"team-a"}`, 409, "exists"},
		{"POST", "/admin/tenants", `{"name":"team-b","period":"fortnight"}`, 400, "period"},
		{"POST", "/admin/tenants", `{"name":"team-b","allowance":-5}`, 400, "allowance"},
		{"POST", "/admin/tenants", `{"name":"team-b","allowance":99999999999}`, 400, "allowance"},
		{"POST", "/admin/tenants", `{"name":"../x"}`, 400, "name"},
		{"POST", "/admin/tenants", `{"name":"team-b","colour":"red"}`, 400, "colour"},
		{"POST", "/admin/tenants/team-a/allowance", `{"expected_allowance":41,"allowance":50}`, 409, "not the expected"},
		{"POST", "/admin/tenants/nobody/allowance", `{"allowance":50}`, 404, "nobody"},
		{"POST", "/admin/tenants/team-a/allowance", `{"expected_allowance":40,"allowance":-1}`, 400, "allowance"},
		{"POST", "/admin/reports", `{"document":"d.","sections":["summary"],"idempotency_key":"k1","tenant":"nobody"}`, 404, "tenant nobody"},
		{"POST", "/admin/reports", `{"document":"d.","sections":["summary"],"idempotency_key":"k1","tenant":"Bad Name"}`, 400, "tenant"},
		{"POST", "/admin/credentials", `{"name":"agent-9","allowance":-1}`, 400, "allowance"},
		{"GET", "/admin/jobs?tenant=Bad%20Name", "", 400, "tenant's name"},
		{"POST", "/admin/credentials", `{"name":"agent-9","allowance":1000001}`, 400, "allowance"},
		{"POST", "/admin/tenants/team-a/weight", `{}`, 400, "weight is required"},
		{"POST", "/admin/tenants/team-a/weight", `{"weight":0}`, 400, "weight must be 1 to 1000"},
		{"POST", "/admin/tenants/team-a/weight", `{"weight":"3"}`, 400, "weight"},
		{"POST", "/admin/tenants/nobody/weight", `{"weight":3}`, 404, "nobody"},
		{"POST", "/admin/tenants/Bad%20Name/weight", `{"weight":3}`, 400, "tenant's name"},
	} {
		rec := th.do(bad.method, bad.path, th.operator, bad.body)
		if rec.Code != bad.status || !strings.Contains(rec.Body.String(), bad.says) {
			t.Errorf("%s %s %s: %d %s, want %d naming %s", bad.method, bad.path, bad.body, rec.Code, rec.Body, bad.status, bad.says)
		}
	}
	if rec := th.do("POST", "/admin/tenants", th.worker, `{"name":"team-w"}`); rec.Code != 403 {
		t.Errorf("a worker creating a tenant: %d", rec.Code)
	}
	if rec := th.do("POST", "/admin/tenants/team-a/weight", th.worker, `{"weight":9}`); rec.Code != 403 {
		t.Errorf("a worker setting a tenant's weight: %d", rec.Code)
	}
	if got := list(); got != "default:none::1 team-a:40:day:2 " {
		t.Fatalf("after the refusals: %q", got)
	}
	rec := th.do("POST", "/admin/tenants/team-a/weight", th.operator, `{"weight":5}`)
	var weighed wire.Tenant
	if err := json.Unmarshal(rec.Body.Bytes(), &weighed); rec.Code != 200 || err != nil || weighed.Weight != 5 || *weighed.Allowance != 40 {
		t.Fatalf("weight: %d %s", rec.Code, rec.Body)
	}
	if got := list(); got != "default:none::1 team-a:40:day:5 " {
		t.Fatalf("after the weight's change: %q", got)
	}
	if rec := th.do("POST", "/admin/tenants/team-a/allowance", th.operator, `{"expected_allowance":40,"allowance":60}`); rec.Code != 200 {
		t.Fatalf("allowance: %d %s", rec.Code, rec.Body)
	}
	rec = th.do("POST", "/admin/reports", th.operator, `{"document":"d.","sections":["summary","terms"],"idempotency_key":"k2","tenant":"team-a"}`)
	if rec.Code != 200 {
		t.Fatalf("submit: %d %s", rec.Code, rec.Body)
	}
	var res wire.ReportsResult
	json.Unmarshal(rec.Body.Bytes(), &res)
	for _, op := range res.OperationIDs {
		var d wire.JobDetail
		json.Unmarshal(th.do("GET", "/admin/jobs/"+op, th.operator, "").Body.Bytes(), &d)
		if d.Job.Tenant != "team-a" {
			t.Fatalf("job %s is in tenant %q, want team-a", op, d.Job.Tenant)
		}
	}
	rec = th.do("GET", "/admin/tenants", th.operator, "")
	var l wire.TenantsList
	json.Unmarshal(rec.Body.Bytes(), &l)
	if l.Tenants[1].Jobs["queued"] != 2 || l.Tenants[0].Jobs["queued"] != 4 || *l.Tenants[1].Allowance != 60 {
		t.Fatalf("tenants: %s", rec.Body)
	}
	// A change's answer never shows the tenant's jobs other than they
	// are: team-a has two queued, not none.
	rec = th.do("POST", "/admin/tenants/team-a/allowance", th.operator, `{"expected_allowance":60,"allowance":80}`)
	var changed map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &changed); rec.Code != 200 || err != nil || string(changed["allowance"]) != "80" {
		t.Fatalf("allowance: %d %s", rec.Code, rec.Body)
	}
	if jobs, ok := changed["jobs"]; ok && string(jobs) != `{"queued":2}` {
		t.Fatalf("the changed tenant's jobs: %s, where it has 2 queued", jobs)
	}
}

// TestCredentialForSomeTenants: POST /admin/credentials with "tenants"
// limits the credential to them; a tenant that does not exist is 404 and
// a bad name 400, with no credential added; the credential claims only
// its tenants' jobs and is forbidden another tenant's document and job.
func TestCredentialForSomeTenants(t *testing.T) {
	th := newTestHost(t, fourSections)
	th.do("POST", "/admin/tenants", th.operator, `{"name":"team-a"}`)
	credentials := func() []wire.Credential {
		t.Helper()
		var l struct{ Credentials []wire.Credential }
		json.Unmarshal(th.do("GET", "/admin/credentials", th.operator, "").Body.Bytes(), &l)
		return l.Credentials
	}
	before := len(credentials())
	for _, bad := range []struct {
		body   string
		status int
		says   string
	}{
		{`{"name":"agent-9","tenants":["team-a","team-z"]}`, 404, "tenant team-z not found"},
		{`{"name":"agent-9","tenants":["Team A"]}`, 400, "tenant's name"},
		{`{"name":"agent-9","tenants":"team-a"}`, 400, "tenants"},
	} {
		if rec := th.do("POST", "/admin/credentials", th.operator, bad.body); rec.Code != bad.status || !strings.Contains(rec.Body.String(), bad.says) {
			t.Errorf("%s: %d %s, want %d naming %s", bad.body, rec.Code, rec.Body, bad.status, bad.says)
		}
	}
	if n := len(credentials()); n != before {
		t.Fatalf("%d credentials after the refusals, were %d", n, before)
	}
	rec := th.do("POST", "/admin/credentials", th.operator, `{"name":"agent-a","tenants":["team-a"]}`)
	var added wire.CredentialChange
	if err := json.Unmarshal(rec.Body.Bytes(), &added); rec.Code != 200 || err != nil || len(added.Credential.Tenants) != 1 {
		t.Fatalf("add agent-a: %d %s", rec.Code, rec.Body)
	}
	for _, c := range credentials() {
		if c.Tenants == nil || (c.Name == "agent-a") != (len(c.Tenants) == 1) {
			t.Fatalf("credential %s's tenants: %#v", c.Name, c.Tenants)
		}
	}
	if rec := th.do("POST", "/admin/credentials", th.operator, `{"name":"all-9"}`); !strings.Contains(rec.Body.String(), `"tenants":[]`) {
		t.Fatalf("a credential of every tenant: %s", rec.Body)
	}
	// Only default's jobs are queued: agent-a has none to wait for.
	if rec := th.do("POST", "/v1/claims", added.Token, `{"max":4}`); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"jobs":[]`) ||
		!strings.Contains(rec.Body.String(), `"queue":"empty"`) {
		t.Fatalf("agent-a's claim: %d %s", rec.Code, rec.Body)
	}
	rec = th.do("POST", "/v1/claims", th.worker, `{"max":1}`)
	var res wire.ClaimResult
	if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || res.Job == nil {
		t.Fatalf("worker's claim: %d %s", rec.Code, rec.Body)
	}
	if rec := th.do("GET", "/v1/documents/"+res.Job.DocumentID, added.Token, ""); rec.Code != 403 || !strings.Contains(rec.Body.String(), `"forbidden"`) {
		t.Fatalf("agent-a reading default's document: %d %s", rec.Code, rec.Body)
	}
	ref := fmt.Sprintf(`{"claim_id":%q,"generation":%d}`, res.Job.Claim.ClaimID, res.Job.Claim.Generation)
	if rec := th.do("POST", "/v1/jobs/"+res.Job.OperationID+"/dispatch", added.Token, ref); rec.Code != 403 {
		t.Fatalf("agent-a dispatching default's job: %d %s", rec.Code, rec.Body)
	}
	if rec := th.do("POST", "/v1/jobs/"+res.Job.OperationID+"/dispatch", th.worker, ref); rec.Code != 200 {
		t.Fatalf("its holder dispatching it: %d %s", rec.Code, rec.Body)
	}
}
