package e2e

import (
	"database/sql"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestTenantsAdmitAtEveryLevel: 300 jobs in three tenants (two capped, one
// with no allowance of its own) run by 12 worker processes, one of them an
// agent whose credential has a cap of its own, through two hosts on
// PostgreSQL (one on SQLite), against a fleet allowance that funds 200 of
// them. At every sample of every host's view, no level is past its
// allowance; the fleet admits no more than its 200 (all 200 when it was
// the fleet that ran out), no tenant past its own, the agent no more than
// its cap; every denial's receipt names the level that was short; and
// verify finds every level's figures equal to its receipts.
func TestTenantsAdmitAtEveryLevel(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		const workers, cost, fleetReports, perTenant = 12, 10, 200, 100
		caps := map[string]*int64{"team-1": ptr64(50 * cost), "team-2": ptr64(80 * cost), "team-3": nil}
		var dbArgs []string
		if storetest.OnPostgres(t) {
			dbArgs = []string{"--database", storetest.NewLocation(t)}
		}
		state := initState(t, sampleInput(t, func(m map[string]any) {
			m["sections"], m["concurrency"], m["allowance"], m["cost_per_report"], m["restart"] = []string{"summary"}, workers, fleetReports*cost, cost, false
		}), dbArgs...)
		hosts := []*hostProcess{startHost(t, state, append(dbArgs, "--host-id", "a")...)}
		if len(dbArgs) > 0 {
			hosts = append(hosts, startHost(t, state, append(dbArgs, "--host-id", "b")...))
		}
		op := credential(t, state, "operator")
		// The sample's one job is the tenant default's: cancel it, so the
		// fleet's 200 go to the three tenants.
		var snap wire.Snapshot
		mustStatus(t, call(t, "GET", hosts[0].URL+"/admin/snapshot", op, nil), 200).decode(t, &snap)
		mustStatus(t, call(t, "POST", hosts[0].URL+"/admin/jobs/"+snap.Jobs[0].OperationID+"/cancel", op, nil), 200)
		for _, name := range slices.Sorted(maps.Keys(caps)) {
			allowance := caps[name]
			req := map[string]any{"name": name}
			if allowance != nil {
				req["allowance"] = *allowance
			}
			mustStatus(t, call(t, "POST", hosts[0].URL+"/admin/tenants", op, req), 200)
			for r := range perTenant / 4 {
				mustStatus(t, call(t, "POST", hosts[r%len(hosts)].URL+"/admin/reports", op, map[string]any{
					"document": fmt.Sprintf("%s%s's report %d\n", sampleDocument, name, r), "sections": []string{"summary", "terms", "actions", "links"},
					"idempotency_key": fmt.Sprintf("%s-%d", name, r), "tenant": name}), 200)
			}
		}

		// One of the twelve workers is an agent capped at three reports,
		// known to every host before it starts.
		const agent, agentCap = "agent-1", 3 * cost
		mustStatus(t, call(t, "POST", hosts[0].URL+"/admin/credentials", op, map[string]any{"name": agent, "allowance": agentCap}), 200)
		agentToken := credential(t, state, agent)
		for _, h := range hosts {
			waitFor(t, 10*time.Second, "every host to know the agent", func() bool {
				return call(t, "GET", h.URL+"/v1/documents/none", agentToken, nil).Status != 401
			})
		}

		// Sample every host's view of every level while the workers run.
		stop, samples := make(chan struct{}), atomic.Int64{}
		var sampler sync.WaitGroup
		sampler.Add(1)
		go func() {
			defer sampler.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				var l wire.TenantsList
				r := call(t, "GET", hosts[i%len(hosts)].URL+"/admin/tenants", op, nil)
				if r.Status != 200 {
					continue
				}
				r.decode(t, &l)
				samples.Add(1)
				if f := l.Fleet; f.Spent+f.Reserved > f.Allowance {
					t.Errorf("the fleet past its allowance: %+v", f)
				}
				for _, x := range l.Tenants {
					if x.Allowance != nil && x.Spent+x.Reserved > *x.Allowance {
						t.Errorf("tenant %s past its allowance: %+v", x.Name, x)
					}
				}
				var creds struct{ Credentials []wire.Credential }
				if r := call(t, "GET", hosts[i%len(hosts)].URL+"/admin/credentials", op, nil); r.Status == 200 {
					r.decode(t, &creds)
				}
				for _, c := range creds.Credentials {
					if c.Allowance != nil && c.Spent+c.Reserved > *c.Allowance {
						t.Errorf("credential %s past its allowance: %+v", c.Name, c)
					}
				}
			}
		}()
		var ws []*workerProcess
		for i := range workers {
			url := hosts[i%len(hosts)].URL
			if len(hosts) > 1 {
				url += "," + hosts[(i+1)%len(hosts)].URL
			}
			name := fmt.Sprintf("worker-%d", i+1)
			if i == 0 { // started first, so it takes its share
				name = agent
			}
			ws = append(ws, startWorker(t, url, state, name, "--work-delay", "5ms"))
		}
		for _, w := range ws {
			w.wait(t, 120*time.Second)
		}
		close(stop)
		sampler.Wait()
		if samples.Load() < 5 {
			t.Fatalf("only %d samples of the tenants' figures", samples.Load())
		}

		var l wire.TenantsList
		mustStatus(t, call(t, "GET", hosts[0].URL+"/admin/tenants", op, nil), 200).decode(t, &l)
		completed := 0
		for _, x := range l.Tenants {
			n := int(x.Jobs["completed"])
			completed += n
			if cap := caps[x.Name]; cap != nil && int64(n)*cost > *cap || x.Reserved != 0 || x.Spent != int64(n)*cost {
				t.Errorf("tenant %s: %d completed, %+v", x.Name, n, x)
			}
		}
		if completed > fleetReports || l.Fleet.Spent != int64(completed)*cost {
			t.Fatalf("%d completed, fleet %+v; the fleet funds %d", completed, l.Fleet, fleetReports)
		}
		// Every denial names the level that was short: a tenant level only
		// for a capped tenant.
		levels := map[string]int{}
		for _, r := range storedReceipts(t, openDatabase(t, state, dbURL(dbArgs)), wire.KindAdmission) {
			if r.Decision != wire.DecisionDeny {
				continue
			}
			levels[r.Tenant+"/"+r.Level]++
			switch {
			case r.Level == wire.LevelTenant && caps[r.Tenant] != nil, r.Level == wire.LevelFleet:
			case r.Level == wire.LevelCredential && r.Caller == agent:
			default:
				t.Errorf("denial %s of tenant %s to %s names level %q", r.ID, r.Tenant, r.Caller, r.Level)
			}
		}
		// Each tenant's jobs are queued after the one before's, so the first
		// capped tenant reaches its cap while the fleet still has room.
		denied, at := 0, map[string]int{}
		for key, n := range levels {
			denied += n
			at[key[strings.LastIndex(key, "/")+1:]] += n
		}
		// Every job was decided once; when the fleet ran out, it admitted
		// all it funds.
		if denied != 3*perTenant-completed || at[wire.LevelTenant] == 0 || at[wire.LevelCredential] == 0 ||
			(at[wire.LevelFleet] > 0 && completed != fleetReports) {
			t.Fatalf("%d completed; denials by tenant and level %v", completed, levels)
		}
		for _, h := range hosts {
			h.kill()
		}
		if rep := verifyState(t, state, dbArgs...); !rep.OK || len(rep.Tenants) != 4 || len(rep.Credentials) != 1 || rep.Credentials[0].Spent > agentCap {
			t.Fatalf("verify: %+v", rep)
		}
	})
}

func ptr64(v int64) *int64 { return &v }

// dbURL is the --database of dbArgs, or "" for the state's SQLite file.
func dbURL(dbArgs []string) string {
	if len(dbArgs) == 2 {
		return dbArgs[1]
	}
	return ""
}

// storedReceipts reads the stored receipts of a kind, in chain order.
func storedReceipts(t *testing.T, db *sql.DB, kind wire.ReceiptKind) []wire.Receipt {
	t.Helper()
	rows, err := db.Query(`SELECT body FROM receipts WHERE kind = $1 ORDER BY sequence`, string(kind))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []wire.Receipt
	for rows.Next() {
		var body []byte
		if err := rows.Scan(&body); err != nil {
			t.Fatal(err)
		}
		r, err := receipts.Decode(body)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAgentCap: a credential added with an allowance of its own (an
// agent's cap, through fleetctl) runs a real worker: it is admitted up to
// its cap and refused past it, naming the credential, while the fleet
// still has room; another worker takes the rest; verify checks the
// credential's figures against the receipts that name it.
func TestAgentCap(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["sections"], m["allowance"], m["cost_per_report"] = []string{"summary", "terms", "actions", "links"}, 200, 20
	}))
	h := startHost(t, state)
	ctl := operatorCtl(t, h, state)
	if out := ctl("credentials", "add", "agent-1", "--allowance", "40"); !strings.Contains(out, "allowance") {
		t.Fatalf("credentials add --allowance:\n%s", out)
	}
	startWorker(t, h.URL, state, "agent-1").wait(t, 60*time.Second)
	op := credential(t, state, "operator")
	var list struct{ Credentials []wire.Credential }
	mustStatus(t, call(t, "GET", h.URL+"/admin/credentials", op, nil), 200).decode(t, &list)
	i := slices.IndexFunc(list.Credentials, func(c wire.Credential) bool { return c.Name == "agent-1" })
	if i < 0 || list.Credentials[i].Allowance == nil || *list.Credentials[i].Allowance != 40 || list.Credentials[i].Spent != 40 ||
		list.Credentials[i].Reserved != 0 {
		t.Fatalf("agent-1 after its run: %+v", list.Credentials)
	}
	if out := ctl("credentials"); !strings.Contains(out, "ALLOWANCE") {
		t.Fatalf("credentials:\n%s", out)
	}
	denied := 0
	for _, r := range storedReceipts(t, openDatabase(t, state, ""), wire.KindAdmission) {
		if r.Decision == wire.DecisionDeny {
			denied++
			if r.Level != wire.LevelCredential || r.Caller != "agent-1" {
				t.Errorf("denial %s: level %q caller %s", r.ID, r.Level, r.Caller)
			}
		}
	}
	if denied != 2 {
		t.Fatalf("%d denials, want the 2 past agent-1's 40", denied)
	}
	// The refused jobs, queued again, go to a worker with no cap of its own.
	ctl("bulk", "requeue", "--state", "refused", "--yes")
	startWorker(t, h.URL, state, "worker-1").wait(t, 60*time.Second)
	s := getSnapshot(t, h, op)
	if s.Accounting.Spent != 80 || s.Accounting.Reserved != 0 {
		t.Fatalf("the fleet after both workers: %+v", s.Accounting)
	}
	h.kill()
	if rep := verifyState(t, state); !rep.OK || len(rep.Credentials) != 1 || rep.Credentials[0].Spent != 40 {
		t.Fatalf("verify: %+v", rep)
	}
	// What each level may still reserve, as the host reckons it: the
	// tenant default, with no allowance of its own, the fleet's 120; the
	// agent, at its cap, none.
	if rep := verifyState(t, state); len(rep.Tenants) != 1 || rep.Tenants[0].Available != 120 || rep.Credentials[0].Available != 0 {
		t.Fatalf("verify's figures: tenants %+v, credentials %+v; want default's available 120 (the fleet's), agent-1's 0", rep.Tenants, rep.Credentials)
	}
	// The credential's figures altered behind the host's back: verify says so.
	db, err := sql.Open("sqlite", filepath.Join(state, statedir.DatabaseFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE credentials SET spent = spent - 20 WHERE name = 'agent-1'`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "verify", "--state", state).Output()
	if err == nil || !strings.Contains(string(out), "credential agent-1's spent is 20 but its receipts settle 40") {
		t.Fatalf("verify after the credential's spent was altered: %v %s", err, out)
	}
}

// TestCredentialForTenants: a credential fleetctl adds for one tenant
// works only that tenant's jobs: a real worker on it completes them and
// exits, leaving the other tenants' queued for a worker of every tenant.
func TestCredentialForTenants(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["sections"], m["allowance"], m["cost_per_report"] = []string{"summary", "terms"}, 1000, 10
	}))
	h := startHost(t, state)
	ctl := operatorCtl(t, h, state)
	doc := filepath.Join(t.TempDir(), "notes.md")
	if err := os.WriteFile(doc, []byte(sampleDocument), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"team-a", "team-b"} {
		ctl("tenant", "add", tenant)
		ctl("submit", "--document", doc, "--sections", "summary,terms,actions", "--tenant", tenant, "--key", tenant+"-1")
	}
	if out := ctl("credentials", "add", "team-a-1", "--tenant", "team-a"); !regexp.MustCompile(`tenants\s+team-a\n`).MatchString(out) {
		t.Fatalf("credentials add --tenant:\n%s", out)
	}
	startWorker(t, h.URL, state, "team-a-1").wait(t, 60*time.Second)
	op := credential(t, state, "operator")
	byTenant := func() map[string]map[string]int64 {
		var l wire.TenantsList
		mustStatus(t, call(t, "GET", h.URL+"/admin/tenants", op, nil), 200).decode(t, &l)
		out := map[string]map[string]int64{}
		for _, x := range l.Tenants {
			out[x.Name] = x.Jobs
		}
		return out
	}
	if got := byTenant(); got["team-a"]["completed"] != 3 || got["team-b"]["queued"] != 3 || got["default"]["queued"] != 2 {
		t.Fatalf("after team-a-1's run, jobs by tenant: %v", got)
	}
	if out := ctl("credentials"); !regexp.MustCompile(`(?m)^team-a-1\s.*\steam-a$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^worker-1\s.*\sall$`).MatchString(out) {
		t.Fatalf("credentials:\n%s", out)
	}
	startWorker(t, h.URL, state, "worker-1").wait(t, 60*time.Second)
	if got := byTenant(); got["team-b"]["completed"] != 3 || got["default"]["completed"] != 2 {
		t.Fatalf("after worker-1's run, jobs by tenant: %v", got)
	}
	h.kill()
	if rep := verifyState(t, state); !rep.OK {
		t.Fatalf("verify: %+v", rep)
	}
}
