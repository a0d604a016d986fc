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
	"syscall"
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

	// The hosts share one state directory, so each is given its identity.
	hostArgs := func(id string) []string {
		return []string{"--database", database, "--lease", "3s", "--host-id", id, "--host-liveness", "5s"}
	}
	a := startHost(t, state, hostArgs("a")...)
	b := startHost(t, state, hostArgs("b")...)
	operator := credential(t, state, "operator")
	for i := range batches {
		mustStatus(t, call(t, "POST", []string{a.URL, b.URL}[i%2]+"/admin/reports", operator, map[string]any{
			"document": fmt.Sprintf("%sbatch %d\n", sampleDocument, i), "sections": []string{"summary", "terms", "actions", "links"},
			"idempotency_key": fmt.Sprintf("batch-%d", i)}), 200)
	}
	total := 4 * (batches + 1)

	// A host that starts beside live peers leaves their claims alone: a
	// claim taken through A still stands, at its generation, after host C
	// starts, and A still renews it.
	holder := credential(t, state, "worker-1")
	var held wire.ClaimResult
	mustStatus(t, call(t, "POST", a.URL+"/v1/claims", holder, nil), 200).decode(t, &held)
	if held.Job == nil {
		t.Fatal("no job to claim through host A")
	}
	c := startHost(t, state, hostArgs("c")...)
	var heldJob wire.JobDetail
	mustStatus(t, call(t, "GET", c.URL+"/admin/jobs/"+held.Job.OperationID, operator, nil), 200).decode(t, &heldJob)
	if heldJob.State != wire.Claimed || heldJob.ClaimHost != "a" || heldJob.Generation != held.Job.Claim.Generation {
		t.Fatalf("a live peer's claim after host C started: %s from %q at generation %d", heldJob.State, heldJob.ClaimHost, heldJob.Generation)
	}
	mustStatus(t, call(t, "POST", a.URL+"/v1/jobs/"+held.Job.OperationID+"/heartbeat", holder,
		wire.ClaimRef{ClaimID: held.Job.Claim.ClaimID, Generation: held.Job.Claim.Generation}), 200)
	if n := uncleanStopsOf(t, c, operator, ""); n != 0 {
		t.Fatalf("starting host C recorded %d unclean stops of live hosts", n)
	}
	c.cmd.Process.Signal(syscall.SIGTERM) // a clean stop; the held claim expires and is requeued by its lease
	<-c.done

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
	// B notices A is gone once A's liveness window passes, and says so once.
	waitFor(t, 30*time.Second, "host b to record host a's unclean stop", func() bool { return uncleanStopsOf(t, b, operator, "a") > 0 })
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
	if n := uncleanStopsOf(t, b, operator, "a"); n != 1 {
		t.Fatalf("host a's unclean stop was recorded %d times", n)
	}
	t.Logf("killed host A with %d of %d jobs settled; %d workers failed over; %d events", settledAtKill, total, failedOver, snap.Events)
}

// uncleanStopsOf counts the events, read through h, recording that host id
// (any host, with "") stopped without shutting down.
func uncleanStopsOf(t *testing.T, h *hostProcess, operator, id string) int {
	t.Helper()
	var page wire.EventPage
	mustStatus(t, call(t, "GET", h.URL+"/admin/events?after=0", operator, nil), 200).decode(t, &page)
	n := 0
	for _, e := range page.Events {
		var d struct {
			Clean bool
			Host  string
		}
		testkit.MustDecode(t, e.Data, &d)
		if e.Kind == wire.EventHostStopped && !d.Clean && (id == "" || d.Host == id) {
			n++
		}
	}
	return n
}
