package e2e

import (
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/statedir"
)

// litestreamPath is Litestream's binary, or the test is skipped (failed
// under FLEET_REQUIRE_LITESTREAM, as .ci/run sets it).
func litestreamPath(t *testing.T) string {
	return toolPath(t, "litestream", "Litestream", "FLEET_REQUIRE_LITESTREAM",
		"go install github.com/benbjohnson/litestream/cmd/litestream@"+litestreamVersion)
}

// litestreamVersion is the release the README's set-up and .ci/run name.
const litestreamVersion = "v0.5.18"

// litestreamSyncInterval is how often the test's replica is written.
const litestreamSyncInterval = time.Second

// TestLitestream: the real litestream replicates a host's state directory
// (the README's set-up, the host leaving checkpoints to it) to a local
// directory while four workers publish; a restore taken from the replica
// while they still publish becomes a new state (fleet-host restore) that
// verifies and holds every publication committed more than the replication
// interval before the restore began, and a host serving it finishes the
// rest, verify clean again. The host never truncated the log under
// Litestream.
func TestLitestream(t *testing.T) {
	t.Parallel()
	bin := litestreamPath(t)
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["sections"], m["concurrency"], m["allowance"], m["cost_per_report"] = []string{"summary"}, 4, 100_000, 1
	}))
	h := startHost(t, state, "--lease", "3s")
	dir := t.TempDir()
	config := filepath.Join(dir, "litestream.yml")
	os.WriteFile(config, []byte(litestreamConfig(filepath.Join(state, statedir.DatabaseFile), filepath.Join(dir, "replica"))), 0o600)
	replicate := exec.Command(bin, "replicate", "-config", config)
	var replicateLog strings.Builder
	replicate.Stdout, replicate.Stderr = &replicateLog, &replicateLog
	if err := replicate.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { replicate.Process.Kill(); replicate.Wait() })

	workers, db, before := publishUnderLoad(t, h.URL, state, "", "l-", 60, "150ms")
	time.Sleep(3 * litestreamSyncInterval)
	restoredDB := filepath.Join(dir, "restored.sqlite3")
	if out, err := exec.Command(bin, "restore", "-config", config, "-o", restoredDB, filepath.Join(state, statedir.DatabaseFile)).CombinedOutput(); err != nil {
		t.Fatalf("litestream restore: %v\n%s\nreplicate's log:\n%s", err, out, replicateLog.String())
	}
	if stillRunning := count(t, db, `SELECT COUNT(*) FROM jobs WHERE state IN ('queued', 'claimed', 'running')`); stillRunning == 0 {
		t.Fatal("the workers finished before the restore: it was not taken under load")
	}
	for _, w := range workers {
		w.wait(t, 120*time.Second)
	}
	h.kill()
	replicate.Process.Kill()
	replicate.Wait()
	// The host must never truncate the log under Litestream (what its
	// WAL restart would do). Litestream may still start a copy over when
	// the log restarts after its own checkpoint while the host writes
	// faster than it looks ("wal overwritten"): its cost, not a loss.
	log := replicateLog.String()
	if strings.Contains(log, "truncated by another process") {
		t.Fatalf("the host truncated the log under litestream\n%s", log)
	}
	t.Logf("litestream started its copy over %d times (its own checkpoints under load)", strings.Count(log, "snap=true reason="))
	if !strings.Contains(log, "mode=PASSIVE") {
		t.Fatalf("litestream never checkpointed beside the host's checkpointer\n%s", log)
	}

	restored := filepath.Join(dir, "restored")
	out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "restore", "--from", restoredDB, "--state", restored).CombinedOutput()
	if err != nil {
		t.Fatalf("fleet-host restore of litestream's copy: %v\n%s", err, out)
	}
	if rep := verifyState(t, restored); !rep.OK {
		t.Fatalf("verify of the restored state: %+v", rep)
	}
	checkRestored(t, openDatabase(t, restored, ""), before, fmt.Sprintf("restore by %s", 3*litestreamSyncInterval))
	finishRestored(t, restored, state, "", nil)
}

// litestreamConfig is the README's Litestream set-up with the test's paths,
// a one-second sync interval, Litestream's own checkpoints ten times as
// often as its default (so they interleave with the host's under the
// test's load), and its debug log, which gives the reason for every copy
// it starts over.
func litestreamConfig(database, replica string) string {
	return "logging:\n  level: debug\n" +
		"dbs:\n" +
		"  - path: " + database + "\n" +
		"    min-checkpoint-page-count: 100\n" +
		"    replica:\n" +
		"      type: file\n" +
		"      path: " + replica + "\n" +
		"      sync-interval: " + litestreamSyncInterval.String() + "\n"
}

// completedOperations lists the operation ids of the completed jobs.
func completedOperations(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT operation_id FROM jobs WHERE state = 'completed'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ops := []string{}
	for rows.Next() {
		var op string
		if err := rows.Scan(&op); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	return ops
}
