package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

// TestMultiHost: two hosts on one PostgreSQL database, sixteen workers split
// between them (each knowing both, its own first). Host A is SIGKILLed
// mid-run; its workers fail over to B and the run finishes there. The
// invariants of docs/api.md hold across both: one publication per completed
// job, spent within the allowance, receipts that verify as one chain, and
// one contiguous event sequence.
func TestMultiHost(t *testing.T) {
	t.Parallel()
	server := storetest.PostgresURL()
	if server == "" {
		t.Skip("SKIPPED the multi-host test: it needs PostgreSQL; set " + storetest.EnvPostgres + " (.ci/run starts one)")
	}
	ctx := context.Background()
	suffix := make([]byte, 6)
	rand.Read(suffix)
	schema := "multihost_" + hex.EncodeToString(suffix)
	database, err := postgres.CreateSchema(ctx, server, schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { postgres.DropSchema(ctx, server, schema) })

	const workers, batches, cost, affordable = 16, 12, 10, 40
	dir := t.TempDir()
	inputPath := filepath.Join(dir, "input.json")
	testkit.WriteFile(t, inputPath, sampleInput(t, func(m map[string]any) {
		m["concurrency"], m["allowance"], m["cost_per_report"], m["restart"] = workers, affordable*cost, cost, false
	}), 0o600)
	state := filepath.Join(dir, "state")
	if out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "init", "--state", state, "--input", inputPath,
		"--database", database).CombinedOutput(); err != nil {
		t.Fatalf("init: %v: %s", err, out)
	}
	if _, err := os.Stat(filepath.Join(state, "fleet.sqlite3")); err == nil {
		t.Fatal("init --database made a SQLite file anyway")
	}

	a := startHost(t, state, "--database", database, "--lease", "3s")
	b := startHost(t, state, "--database", database, "--lease", "3s")
	operator := credential(t, state, "operator")
	for i := range batches {
		mustStatus(t, call(t, "POST", []string{a.URL, b.URL}[i%2]+"/admin/reports", operator, map[string]any{
			"document": fmt.Sprintf("%sbatch %d\n", sampleDocument, i), "sections": []string{"summary", "terms", "actions", "links"},
			"idempotency_key": fmt.Sprintf("batch-%d", i)}), 200)
	}
	total := 4 * (batches + 1)

	var ws []*workerProcess
	for i := range workers {
		hosts := a.URL + "," + b.URL
		if i%2 == 1 {
			hosts = b.URL + "," + a.URL
		}
		ws = append(ws, startWorker(t, hosts, state, fmt.Sprintf("worker-%d", i+1), "--work-delay", "150ms", "--outage", "90s"))
	}

	// Kill A once the run is under way, not before and not after.
	waitFor(t, 60*time.Second, "some jobs to complete", func() bool {
		n := 0
		for _, j := range getSnapshot(t, b, operator).Jobs {
			if j.State == wire.Completed {
				n++
			}
		}
		return n >= 6
	})
	a.kill()
	settledAtKill := 0
	for _, j := range getSnapshot(t, b, operator).Jobs {
		if j.State.Settled() {
			settledAtKill++
		}
	}
	if settledAtKill >= total {
		t.Fatalf("the run had finished before host A was killed (%d of %d settled)", settledAtKill, total)
	}
	for _, w := range ws {
		w.wait(t, 120*time.Second)
	}

	snap := getSnapshot(t, b, operator)
	counts := map[wire.JobState]int{}
	for _, j := range snap.Jobs {
		counts[j.State]++
	}
	acct := snap.Accounting
	if len(snap.Jobs) != total || counts[wire.Completed] != affordable || counts[wire.Refused] != total-affordable {
		t.Fatalf("states after the run: %v (of %d)", counts, len(snap.Jobs))
	}
	if snap.Mutations != int64(affordable) || acct.Spent != affordable*cost || acct.Reserved != 0 || acct.Spent > acct.Allowance {
		t.Fatalf("mutations %d, accounting %+v", snap.Mutations, acct)
	}
	rep := verifyState(t, state, "--database", database) // receipts, one chain, events 1..n, one mutation per job
	if rep.Events != snap.Events {
		t.Fatalf("verify saw %d events, the host %d", rep.Events, snap.Events)
	}
	var failedOver int
	for _, w := range ws {
		data, _ := os.ReadFile(w.log.Name())
		if strings.Contains(string(data), "failing over") {
			failedOver++
		}
	}
	if failedOver == 0 {
		t.Fatal("no worker failed over from the killed host")
	}
	t.Logf("killed host A with %d of %d jobs settled; %d workers failed over; %d events", settledAtKill, total, failedOver, snap.Events)
}
