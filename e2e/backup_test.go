package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/wire"
)

// TestBackupRestore: fleet-host backup copies a state's SQLite database
// while its host serves four workers publishing; every publication
// committed before the backup began is in the copy; restore makes a new
// state of it that verifies, and a host serving it continues the receipt
// chain and the event numbering while workers finish the rest (what was
// running at the backup requeued once unresolved), verify clean again. A backup to a file that exists, and a restore from a
// truncated or foreign file or into a directory that is not empty, are
// refused naming the problem, nothing changed.
func TestBackupRestore(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["sections"], m["concurrency"], m["allowance"], m["cost_per_report"] = []string{"summary"}, 4, 100_000, 1
	}))
	h := startHost(t, state, "--lease", "3s") // what runs at the backup lapses soon in the restore
	op := credential(t, state, "operator")
	for r := range 60 {
		mustStatus(t, call(t, "POST", h.URL+"/admin/reports", op, map[string]any{"document": sampleDocument,
			"sections": []string{"summary", "terms", "actions", "links"}, "idempotency_key": "b-" + string(rune('a'+r%26)) + string(rune('a'+r/26))}), 200)
	}
	var workers []*workerProcess
	for i := 1; i <= 4; i++ {
		workers = append(workers, startWorker(t, h.URL, state, "worker-"+string(rune('0'+i)), "--work-delay", "20ms"))
	}
	db := openDatabase(t, state, "")
	waitFor(t, 30*time.Second, "some publications", func() bool {
		return count(t, db, `SELECT COUNT(*) FROM jobs WHERE state = 'completed'`) >= 40
	})
	// Every publication committed before the backup begins.
	before := completedOperations(t, db)
	dir := t.TempDir()
	backup := filepath.Join(dir, "fleet.backup")
	hostCmd := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "fleet-host"), args...).CombinedOutput()
		return string(out), err
	}
	if out, err := hostCmd("backup", "--state", state, "--to", backup); err != nil || !strings.Contains(out, `"bytes"`) {
		t.Fatalf("backup while serving: %v\n%s", err, out)
	}
	if info, err := os.Stat(backup); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("the backup's mode: %v (%v)", info.Mode().Perm(), err)
	}
	if stillRunning := count(t, db, `SELECT COUNT(*) FROM jobs WHERE state IN ('queued', 'claimed', 'running')`); stillRunning == 0 {
		t.Fatal("the workers finished before the backup: it was not taken under load")
	}
	for _, w := range workers {
		w.wait(t, 90*time.Second)
	}
	h.kill()

	// Bad input, nothing changed.
	taken, _ := os.ReadFile(backup)
	if out, err := hostCmd("backup", "--state", state, "--to", backup); err == nil || !strings.Contains(out, "exists") {
		t.Fatalf("a backup over an existing file: %v\n%s", err, out)
	}
	if again, _ := os.ReadFile(backup); string(again) != string(taken) {
		t.Fatal("a refused backup changed the file it refused to overwrite")
	}
	if out, err := hostCmd("backup", "--state", dir, "--to", filepath.Join(dir, "none")); err == nil || !strings.Contains(out, "no SQLite database") {
		t.Fatalf("a backup of a directory with no database: %v\n%s", err, out)
	}
	truncated, foreign, full := filepath.Join(dir, "truncated"), filepath.Join(dir, "foreign"), filepath.Join(dir, "full")
	os.WriteFile(truncated, taken[:len(taken)/2], 0o600)
	os.WriteFile(foreign, []byte("not a database at all, just text\n"), 0o600)
	os.MkdirAll(filepath.Join(full, "something"), 0o700)
	for _, bad := range []struct{ from, into, says string }{
		{truncated, filepath.Join(dir, "r1"), "malformed"},
		{foreign, filepath.Join(dir, "r2"), "not a SQLite database"},
		{backup, full, "not empty"},
	} {
		out, err := hostCmd("restore", "--from", bad.from, "--state", bad.into)
		if err == nil || !strings.Contains(out, bad.says) {
			t.Fatalf("restore from %s into %s: %v\n%s", bad.from, bad.into, err, out)
		}
		if entries, _ := os.ReadDir(bad.into); bad.into != full && entries != nil {
			t.Fatalf("a refused restore left %s: %v", bad.into, entries)
		}
	}

	restored := filepath.Join(dir, "restored")
	if out, err := hostCmd("restore", "--from", backup, "--state", restored); err != nil {
		t.Fatalf("restore: %v\n%s", err, out)
	}
	if rep := verifyState(t, restored); !rep.OK {
		t.Fatalf("verify of the restored state: %+v", rep)
	}
	rdb := openDatabase(t, restored, "")
	for _, op := range before {
		if n := count(t, rdb, `SELECT COUNT(*) FROM jobs WHERE operation_id = $1 AND state = 'completed'`, op); n != 1 {
			t.Fatalf("publication %s, committed before the backup, is not in the restore", op)
		}
	}
	events := count(t, rdb, `SELECT COUNT(*) FROM events`)
	// A host on the restored state, the same tokens working: what was
	// claimed at the backup goes back to the queue, what was running is
	// unresolved once its lease lapses (its publication, if any, came
	// after the backup) and the operator requeues it; the rest is worked,
	// the chain and the numbering going on.
	rh := startHost(t, restored, "--lease", "2s")
	waitFor(t, 30*time.Second, "the restored claims to settle", func() bool {
		return count(t, rdb, `SELECT COUNT(*) FROM jobs WHERE state IN ('claimed', 'running')`) == 0
	})
	if out := operatorCtl(t, rh, state)("bulk", "requeue", "--state", "unresolved", "--yes"); !strings.Contains(out, "done") {
		t.Fatalf("requeueing what was running at the backup:\n%s", out)
	}
	for i := 1; i <= 2; i++ {
		startWorker(t, rh.URL, state, "worker-"+string(rune('0'+i))).wait(t, 90*time.Second)
	}
	var s wire.Snapshot
	mustStatus(t, call(t, "GET", rh.URL+"/admin/snapshot", op, nil), 200).decode(t, &s)
	rh.kill()
	for _, j := range s.Jobs {
		if j.State != wire.Completed {
			t.Fatalf("job %s on the restored state: %s", j.OperationID, j.State)
		}
	}
	if after := count(t, rdb, `SELECT COUNT(*) FROM events`); after <= events {
		t.Fatalf("events on the restored state: %d, then %d", events, after)
	}
	if rep := verifyState(t, restored); !rep.OK {
		t.Fatalf("verify after serving the restored state: %+v", rep)
	}
}
