package httpapi_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/wire"
)

// TestTenantRoutes: an operator creates tenants, changes one's allowance
// by compare-and-swap and lists them; a report goes to the tenant it
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
			b.WriteString(x.Name + ":" + allowance + ":" + x.Period + " ")
		}
		return b.String()
	}
	if got := list(); got != "default:none: " {
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
	} {
		rec := th.do(bad.method, bad.path, th.operator, bad.body)
		if rec.Code != bad.status || !strings.Contains(rec.Body.String(), bad.says) {
			t.Errorf("%s %s %s: %d %s, want %d naming %s", bad.method, bad.path, bad.body, rec.Code, rec.Body, bad.status, bad.says)
		}
	}
	if rec := th.do("POST", "/admin/tenants", th.worker, `{"name":"team-w"}`); rec.Code != 403 {
		t.Errorf("a worker creating a tenant: %d", rec.Code)
	}
	if got := list(); got != "default:none: team-a:40:day " {
		t.Fatalf("after the refusals: %q", got)
	}
	if rec := th.do("POST", "/admin/tenants/team-a/allowance", th.operator, `{"expected_allowance":40,"allowance":60}`); rec.Code != 200 {
		t.Fatalf("allowance: %d %s", rec.Code, rec.Body)
	}
	rec := th.do("POST", "/admin/reports", th.operator, `{"document":"d.","sections":["summary","terms"],"idempotency_key":"k2","tenant":"team-a"}`)
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
}
