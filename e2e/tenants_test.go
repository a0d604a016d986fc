package e2e

import (
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestTenantsAdmitAtEveryLevel: 300 jobs in three tenants (two capped, one
// with no allowance of its own) run by 12 worker processes, through two
// hosts on PostgreSQL (one on SQLite), against a fleet allowance that
// funds 200 of them. At every sample of every host's view, no level is
// past its allowance; exactly the fleet's 200 are admitted, no tenant past
// its own; every denial's receipt names the level that was short; and
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
			}
		}()
		var ws []*workerProcess
		for i := range workers {
			url := hosts[i%len(hosts)].URL
			if len(hosts) > 1 {
				url += "," + hosts[(i+1)%len(hosts)].URL
			}
			ws = append(ws, startWorker(t, url, state, fmt.Sprintf("worker-%d", i+1), "--work-delay", "5ms"))
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
		if completed != fleetReports || l.Fleet.Spent != fleetReports*cost {
			t.Fatalf("%d completed, fleet %+v; want the %d the fleet funds", completed, l.Fleet, fleetReports)
		}
		// Every denial names the level that was short: a tenant level only
		// for a capped tenant.
		levels := map[string]int{}
		for _, r := range storedReceipts(t, openDatabase(t, state, dbURL(dbArgs)), wire.KindAdmission) {
			if r.Decision != wire.DecisionDeny {
				continue
			}
			levels[r.Tenant+"/"+r.Level]++
			if r.Level != wire.LevelFleet && (r.Level != wire.LevelTenant || caps[r.Tenant] == nil) {
				t.Errorf("denial %s of tenant %s names level %q", r.ID, r.Tenant, r.Level)
			}
		}
		// Each tenant's jobs are queued after the one before's, so the first
		// capped tenant reaches its cap while the fleet still has room.
		denied, atTenant := 0, 0
		for key, n := range levels {
			denied += n
			if strings.HasSuffix(key, "/"+wire.LevelTenant) {
				atTenant += n
			}
		}
		if denied != 3*perTenant-fleetReports || atTenant == 0 {
			t.Fatalf("denials by tenant and level %v, want %d of them", levels, 3*perTenant-fleetReports)
		}
		for _, h := range hosts {
			h.kill()
		}
		if rep := verifyState(t, state, dbArgs...); !rep.OK || len(rep.Tenants) != 4 {
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
