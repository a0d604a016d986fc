package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/crash"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

// TestCrashReleasesDependents: the publication that completes an
// overview's last dependency queues the overview in its transaction. A
// host killed just before that commit, or just after, single call or
// batch, and restarted: the overview is queued exactly once (one
// fleet.unblocked event), only after both its dependencies completed,
// and runs to completion; verify finds the state sound. On SQLite, and
// on PostgreSQL when FLEET_TEST_POSTGRES_URL is set.
func TestCrashReleasesDependents(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		for _, p := range []struct {
			point string
			hit   int
			args  []string
		}{
			{"publish", 2, nil},
			{"publish-batch", 1, []string{"--slots", "2", "--batch-calls", "--work-delay", "200ms"}},
		} {
			for _, when := range []string{"before-commit", "after-commit"} {
				point := p.point + "." + when
				t.Run(point, func(t *testing.T) {
					t.Parallel()
					crashDependents(t, point, p.hit, p.args)
				})
			}
		}
	})
}

func crashDependents(t *testing.T, point string, hit int, workerArgs []string) {
	c := newCrashHost(t, func(m map[string]any) {
		m["sections"], m["concurrency"], m["allowance"] = []string{"summary"}, 2, 1000
	})
	state, database := c.state, c.database
	c.ensureUp()
	op := credential(t, state, "operator")
	var snap wire.Snapshot
	testkit.MustDecode(t, c.call("GET", "/admin/snapshot", op, nil).Body, &snap)
	mustStatus(t, c.call("POST", "/admin/jobs/"+snap.Jobs[0].OperationID+"/cancel", op, nil), 200) // the sample's, out of the way
	var res wire.ReportsResult
	mustStatus(t, c.call("POST", "/admin/reports", op, map[string]any{"document": sampleDocument, "idempotency_key": "flow",
		"sections": []string{"overview", "summary", "terms"}, "after": map[string][]string{"overview": {"summary", "terms"}}}), 200).decode(t, &res)
	c.stop()
	if !c.start(crash.EnvPoint+"="+point, fmt.Sprintf("%s=%d", crash.EnvHit, hit)) {
		c.ensureUp()
	}
	w := startWorker(t, c.url(), state, "worker-1", append([]string{"--outage", "30s"}, workerArgs...)...)
	superviseUntil(t, c, 90*time.Second, func() bool {
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
	c.stop()
	checkInvariants(t, state, database, c.key)
	db := openDatabase(t, state, database)
	if n := count(t, db, `SELECT COUNT(*) FROM jobs WHERE batch_key = 'flow' AND state = 'completed'`); n != 3 {
		t.Fatalf("%d of the report's 3 jobs completed", n)
	}
	if n := count(t, db, `SELECT COUNT(*) FROM events WHERE kind = 'fleet.unblocked' AND operation_id = $1`, res.OperationIDs[0]); n != 1 {
		t.Fatalf("the overview was queued %d times", n)
	}
	if n := count(t, db, `SELECT COUNT(*) FROM jobs d, jobs o WHERE o.operation_id = $1 AND d.batch_key = 'flow'
		AND d.operation_id <> o.operation_id AND d.finished_at_ms > o.claimed_at_ms`, res.OperationIDs[0]); n != 0 {
		t.Fatalf("the overview was claimed before %d of its dependencies finished", n)
	}
}
