package e2e

import (
	"database/sql"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/storetest"
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
	// Every publication committed before the backup begins.
	workers, db, before := publishUnderLoad(t, h.URL, state, "", "b-", 60, "50ms")
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
	checkRestored(t, rdb, before, "backup")
	events := count(t, rdb, `SELECT COUNT(*) FROM events`)
	// A host on the restored state, the same tokens working: the chain and
	// the numbering go on.
	finishRestored(t, restored, state, "", nil)
	if after := count(t, rdb, `SELECT COUNT(*) FROM events`); after <= events {
		t.Fatalf("events on the restored state: %d, then %d", events, after)
	}
}

// TestPostgresDumpRestore: pg_dump copies a PostgreSQL state's schema
// while two hosts serve it to four workers publishing; pg_restore brings
// the dump into a new database (the README's commands); verify passes on
// it, every publication committed before the dump began is there, its
// figures add up (spent within what was published before and what the
// fleet spent in the end, a call's price for each call made or reserved),
// and a host serving it finishes the rest, nothing left reserved, verify
// clean again.
func TestPostgresDumpRestore(t *testing.T) {
	t.Parallel()
	server := storetest.PostgresURL()
	if server == "" {
		t.Skip("SKIPPED the PostgreSQL backup: set " + storetest.EnvPostgres + " (.ci/run starts one)")
	}
	for _, tool := range []string{"pg_dump", "pg_restore", "psql"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not on PATH: Debian's postgresql-client-15 has it", tool)
		}
	}
	database := newPostgresDatabase(t, server)
	schema, connection := splitSearchPath(t, database)
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["sections"], m["concurrency"], m["allowance"], m["cost_per_report"] = []string{"summary"}, 4, 100_000, 1
	}), "--database", database)
	hosts := []*hostProcess{
		startHost(t, state, "--database", database, "--host-id", "a", "--lease", "3s"),
		startHost(t, state, "--database", database, "--host-id", "b", "--lease", "3s"),
	}
	op := credential(t, state, "operator")
	workers, db, before := publishUnderLoad(t, hosts[0].URL+","+hosts[1].URL, state, database, "p-", 50, "150ms")
	dump := filepath.Join(t.TempDir(), "fleet.dump")
	if out, err := exec.Command("pg_dump", "--format=custom", "--schema="+schema, "--file="+dump, connection).CombinedOutput(); err != nil {
		t.Fatalf("pg_dump of the live fleet: %v\n%s", err, out)
	}
	if stillRunning := count(t, db, `SELECT COUNT(*) FROM jobs WHERE state IN ('queued', 'claimed', 'running')`); stillRunning == 0 {
		t.Fatal("the workers finished before the dump: it was not taken under load")
	}
	for _, w := range workers {
		w.wait(t, 120*time.Second)
	}
	var original wire.Snapshot
	mustStatus(t, call(t, "GET", hosts[0].URL+"/admin/snapshot", op, nil), 200).decode(t, &original)
	for _, h := range hosts {
		h.kill()
	}

	restoredURL := newPostgresDatabaseFrom(t, connection, dump, schema)
	if rep := verifyState(t, state, "--database", restoredURL); !rep.OK {
		t.Fatalf("verify of the restored schema: %+v", rep)
	}
	checkRestored(t, openDatabase(t, state, restoredURL), before, "dump")
	s := finishRestored(t, state, state, restoredURL, func(rh *hostProcess) {
		var atDump wire.Snapshot
		mustStatus(t, call(t, "GET", rh.URL+"/admin/snapshot", op, nil), 200).decode(t, &atDump)
		if a := atDump.Accounting; a.Allowance != original.Accounting.Allowance || a.Spent < int64(len(before)) || a.Spent > original.Accounting.Spent ||
			a.Spent+a.Reserved+a.Available != a.Allowance || a.Spent+a.Reserved != a.Calls*a.CostPerReport {
			t.Fatalf("figures as restored: %+v; the original fleet's at the end: %+v, %d published before the dump", a, original.Accounting, len(before))
		}
	})
	// Model calls made after the dump are made again (the restore has no
	// record of them), so the restored fleet spends at least as much.
	if a := s.Accounting; a.Spent < original.Accounting.Spent || a.Reserved != 0 || a.Spent != a.Calls*a.CostPerReport {
		t.Fatalf("figures after finishing on the restore: %+v; the original fleet's: %+v", a, original.Accounting)
	}
}

// splitSearchPath separates a test database URL's schema (its search_path)
// from the connection string pg_dump and psql take.
func splitSearchPath(t *testing.T, database string) (schema, connection string) {
	t.Helper()
	u, err := url.Parse(database)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	schema = q.Get("search_path")
	q.Del("search_path")
	u.RawQuery = q.Encode()
	return schema, u.String()
}

// newPostgresDatabaseFrom creates a database on the server of connection,
// restores the dump into it (pg_restore cannot rename a schema, so the
// schema keeps its name in a database of its own), drops it at cleanup
// and returns its URL.
func newPostgresDatabaseFrom(t *testing.T, connection, dump, schema string) string {
	t.Helper()
	name := "restored_" + schema
	if out, err := exec.Command("psql", connection, "-v", "ON_ERROR_STOP=1", "-c", "CREATE DATABASE "+name).CombinedOutput(); err != nil {
		t.Fatalf("create database %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		exec.Command("psql", connection, "-c", "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)").Run()
	})
	u, _ := url.Parse(connection)
	u.Path = "/" + name
	if out, err := exec.Command("pg_restore", "--exit-on-error", "--no-owner", "--dbname="+u.String(), dump).CombinedOutput(); err != nil {
		t.Fatalf("pg_restore: %v\n%s", err, out)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestBackupToADirectoryWithoutSpaceOrWrite: a backup into a directory
// whose file system is full, or mounted read-only, is refused naming the
// problem, leaving no file there; the state is untouched (verify clean).
// The file systems are small tmpfs mounts, which need root (as CI runs).
func TestBackupToADirectoryWithoutSpaceOrWrite(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	dir := t.TempDir()
	full, readOnly := filepath.Join(dir, "full"), filepath.Join(dir, "read-only")
	for _, m := range []struct{ path, options string }{{full, "size=16k"}, {readOnly, "ro,size=1m"}} {
		os.MkdirAll(m.path, 0o700)
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", m.options, "tmpfs", m.path).CombinedOutput(); err != nil {
			if os.Geteuid() != 0 {
				t.Skipf("SKIPPED: mounting a small tmpfs needs root (CI runs as root): %v %s", err, out)
			}
			t.Fatalf("mount a tmpfs at %s: %v\n%s", m.path, err, out)
		}
		t.Cleanup(func() { exec.Command("umount", m.path).Run() })
	}
	for _, c := range []struct{ into, says string }{{full, "no space left"}, {readOnly, "read-only file system"}} {
		out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "backup", "--state", state, "--to", filepath.Join(c.into, "fleet.backup")).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.says) {
			t.Fatalf("a backup into %s: %v\n%s", c.into, err, out)
		}
		if entries, _ := os.ReadDir(c.into); len(entries) != 0 {
			t.Fatalf("a refused backup left %v in %s", entries, c.into)
		}
	}
	verifyState(t, state)
}

// publishUnderLoad submits reports of the four sample sections (keys
// under prefix) to the first of hosts (comma-separated) and starts four
// workers on hosts, each computation stretched by delay, then waits for 40
// jobs to complete. It returns the workers, the state's database and the
// jobs completed by then.
func publishUnderLoad(t *testing.T, hosts, state, database, prefix string, reports int, delay string) ([]*workerProcess, *sql.DB, []string) {
	t.Helper()
	first, _, _ := strings.Cut(hosts, ",")
	op := credential(t, state, "operator")
	for r := range reports {
		mustStatus(t, call(t, "POST", first+"/admin/reports", op, map[string]any{"document": sampleDocument,
			"sections": []string{"summary", "terms", "actions", "links"}, "idempotency_key": prefix + string(rune('a'+r%26)) + string(rune('a'+r/26))}), 200)
	}
	var workers []*workerProcess
	for i := 1; i <= 4; i++ {
		workers = append(workers, startWorker(t, hosts, state, "worker-"+string(rune('0'+i)), "--work-delay", delay))
	}
	db := openDatabase(t, state, database)
	waitFor(t, 60*time.Second, "some publications", func() bool {
		return count(t, db, `SELECT COUNT(*) FROM jobs WHERE state = 'completed'`) >= 40
	})
	return workers, db, completedOperations(t, db)
}

// checkRestored fails unless every publication of before is completed in
// the restored database.
func checkRestored(t *testing.T, rdb *sql.DB, before []string, copied string) {
	t.Helper()
	for _, op := range before {
		if n := count(t, rdb, `SELECT COUNT(*) FROM jobs WHERE operation_id = $1 AND state = 'completed'`, op); n != 1 {
			t.Fatalf("publication %s, committed before the %s, is not in the restore", op, copied)
		}
	}
}

// finishRestored serves a restored state (restored; its database at
// database, "" for the directory's SQLite file) with the workers' and the
// operator's credentials of state: what was claimed at the copy goes back
// to the queue, what was running is unresolved once its lease lapses (its
// publication, if any, came after the copy) and the operator requeues it,
// and a worker finishes the rest. Every job ends completed and verify is
// clean; atStart runs once the host serves. It returns the last snapshot.
func finishRestored(t *testing.T, restored, state, database string, atStart func(*hostProcess)) wire.Snapshot {
	t.Helper()
	args := []string{"--lease", "2s"}
	if database != "" {
		args = append(args, "--database", database, "--host-id", "a")
	}
	rh := startHost(t, restored, args...)
	if atStart != nil {
		atStart(rh)
	}
	rdb := openDatabase(t, restored, database)
	waitFor(t, 30*time.Second, "the restored claims to settle", func() bool {
		return count(t, rdb, `SELECT COUNT(*) FROM jobs WHERE state IN ('claimed', 'running')`) == 0
	})
	if out := operatorCtl(t, rh, state)("bulk", "requeue", "--state", "unresolved", "--yes"); !strings.Contains(out, "done") {
		t.Fatalf("requeueing what was running at the copy:\n%s", out)
	}
	startWorker(t, rh.URL, state, "worker-1").wait(t, 90*time.Second)
	var s wire.Snapshot
	mustStatus(t, call(t, "GET", rh.URL+"/admin/snapshot", credential(t, state, "operator"), nil), 200).decode(t, &s)
	rh.kill()
	for _, j := range s.Jobs {
		if j.State != wire.Completed {
			t.Fatalf("job %s on the restore: %s", j.OperationID, j.State)
		}
	}
	var extra []string
	if database != "" {
		extra = []string{"--database", database}
	}
	if rep := verifyState(t, restored, extra...); !rep.OK {
		t.Fatalf("verify after serving the restore: %+v", rep)
	}
	return s
}
