package e2e

import (
	"slices"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/crash"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

// TestCrashRollover: a tenant's period rolls over in the transaction of
// the admission that finds it due (a claim's that admits). A host killed just before that
// transaction commits, or just after, and restarted (its clock a day
// ahead, as a crash-point build allows) leaves one rollover receipt, its
// cost what the ended day spent, the day's reservations carried over, and
// a state verify finds sound: on SQLite, and on PostgreSQL when
// FLEET_TEST_POSTGRES_URL is set.
func TestCrashRollover(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		// At a claim that admits, the workers' way: a separate dispatch
		// starts the period in the same code (admission.reserveLevels).
		for _, when := range []string{"before-commit", "after-commit"} {
			t.Run(when, func(t *testing.T) {
				t.Parallel()
				crashRollover(t, "claim-admit."+when)
			})
		}
	})
}

func crashRollover(t *testing.T, point string) {
	c := newCrashHost(t, func(m map[string]any) {
		m["sections"], m["concurrency"], m["allowance"] = []string{"summary"}, 2, 200
	})
	state, database := c.state, c.database
	c.ensureUp()
	op := credential(t, state, "operator")
	// Today: team-r may spend 40, two reports' worth; of three sections
	// the third is refused at the tenant's level.
	mustStatus(t, c.call("POST", "/admin/tenants", op, map[string]any{"name": "team-r", "allowance": 40, "period": "day"}), 200)
	mustStatus(t, c.call("POST", "/admin/reports", op, map[string]any{"document": sampleDocument,
		"sections": []string{"summary", "terms", "actions"}, "idempotency_key": "r", "tenant": "team-r"}), 200)
	startWorker(t, c.url(), state, "worker-1").wait(t, 60*time.Second)
	var snap wire.Snapshot
	testkit.MustDecode(t, c.call("GET", "/admin/snapshot", op, nil).Body, &snap)
	refused := slices.IndexFunc(snap.Jobs, func(j wire.Job) bool { return j.Tenant == "team-r" && j.State == wire.Refused })
	if refused < 0 {
		t.Fatalf("no job of team-r was refused: %+v", snap.Jobs)
	}
	// Tomorrow, with a host that dies at the admission's commit: the
	// refused job, queued again, is admitted in the new day.
	c.stop()
	c.env = []string{crash.EnvClockAhead + "=24h"}
	if !c.start(crash.EnvPoint+"="+point, crash.EnvHit+"=1") {
		c.ensureUp()
	}
	mustStatus(t, c.call("POST", "/admin/jobs/"+snap.Jobs[refused].OperationID+"/requeue", op, nil), 200)
	w := startWorker(t, c.url(), state, "worker-2", "--outage", "30s")
	superviseUntil(t, c, 60*time.Second, func() bool {
		select {
		case <-w.done:
			return true
		default:
			return false
		}
	})
	settle(t, c, op)
	if !c.crashed(point) {
		t.Fatalf("the scenario never reached crash point %s", point)
	}
	var list wire.TenantsList
	testkit.MustDecode(t, c.call("GET", "/admin/tenants", op, nil).Body, &list)
	c.stop()
	checkInvariants(t, state, database, c.key)

	rollovers := storedReceipts(t, openDatabase(t, state, database), wire.KindRollover)
	if len(rollovers) != 1 || rollovers[0].Tenant != "team-r" || rollovers[0].Cost != 40 {
		t.Fatalf("rollover receipts %+v, want one for team-r's 40 spent", rollovers)
	}
	i := slices.IndexFunc(list.Tenants, func(x wire.Tenant) bool { return x.Name == "team-r" })
	if i < 0 || list.Tenants[i].Spent != 20 || list.Tenants[i].Reserved != 0 || list.Tenants[i].Jobs["completed"] != 3 {
		t.Fatalf("team-r after the new day: %+v", list.Tenants)
	}
}
