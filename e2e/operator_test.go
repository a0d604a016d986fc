package e2e

import (
	"bufio"
	"database/sql"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

func TestSubmitReports(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	op := credential(t, state, "operator")
	req := map[string]any{"document": "More text. It must be short.", "sections": []string{"actions", "actions"}, "idempotency_key": "batch-2"}
	var first, again wire.ReportsResult
	mustStatus(t, call(t, "POST", h.URL+"/admin/reports", op, req), 200).decode(t, &first)
	mustStatus(t, call(t, "POST", h.URL+"/admin/reports", op, req), 200).decode(t, &again)
	if len(first.OperationIDs) != 2 || strings.Join(first.OperationIDs, ",") != strings.Join(again.OperationIDs, ",") || !again.Replayed {
		t.Fatalf("first %+v, repeat %+v", first, again)
	}
	req["sections"] = []string{"links"}
	r := mustStatus(t, call(t, "POST", h.URL+"/admin/reports", op, req), 409)
	if r.code() != wire.CodeOperationConflict {
		t.Fatalf("changed request under the same key: %s", r.Body)
	}
	if n := len(getSnapshot(t, h, op).Jobs); n != 6 {
		t.Fatalf("%d jobs, want 6", n)
	}
}

// TestRequeueUnresolved: a running job whose lease expires becomes
// unresolved and keeps its reservation; requeue settles it as spent and a
// new worker can run the job.
func TestRequeueUnresolved(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["allowance"] = 100 }))
	h := startHost(t, state, "--lease", "300ms")
	op, w1 := credential(t, state, "operator"), credential(t, state, "worker-1")
	job := claimAs(t, h, w1)
	mustStatus(t, call(t, "POST", h.URL+"/v1/jobs/"+job.OperationID+"/dispatch", w1, refOf(job)), 200)
	waitFor(t, 10*time.Second, "unresolved", func() bool {
		return getSnapshot(t, h, op).Jobs[0].State == wire.Unresolved
	})
	s := getSnapshot(t, h, op)
	if s.Accounting.Reserved != 20 {
		t.Fatalf("unresolved job's reservation: %+v", s.Accounting)
	}
	var rec wire.Reconciliation
	mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+job.OperationID+"/reconcile", op, nil), 200).decode(t, &rec)
	if rec.ReusedExistingEffect || rec.State != wire.Unresolved || rec.Recovery == "" {
		t.Fatalf("reconcile of an unresolved job: %+v", rec)
	}
	mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+job.OperationID+"/requeue", op, nil), 200)
	s = getSnapshot(t, h, op)
	if s.Jobs[0].State != wire.Queued || s.Accounting.Spent != 20 || s.Accounting.Reserved != 0 {
		t.Fatalf("after requeue: %s %+v", s.Jobs[0].State, s.Accounting)
	}
	startWorker(t, h.URL, state, "worker-2").wait(t, 30*time.Second)
	s = getSnapshot(t, h, op)
	if s.Jobs[0].State != wire.Completed || s.Mutations != 4 || s.Accounting.Spent != 100 {
		t.Fatalf("after the rerun: %s, %d mutations, %+v", s.Jobs[0].State, s.Mutations, s.Accounting)
	}
	verifyState(t, state)
}

// TestCredentialsAddWhileServing: a credential added to a serving host's
// state lets a new worker join.
func TestCredentialsAddWhileServing(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "credentials", "add", "--state", state, "--name", "worker-9").CombinedOutput()
	if err != nil {
		t.Fatalf("credentials add: %v %s", err, out)
	}
	info, err := os.Stat(filepath.Join(state, "credentials", "worker-9"))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("credential file: %v %v", info, err)
	}
	out, err = exec.Command(filepath.Join(binDir, "fleet-host"), "credentials", "add", "--state", state, "--name", "worker-9").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "already exists") {
		t.Fatalf("duplicate name: %v %s", err, out)
	}
	time.Sleep(1100 * time.Millisecond) // the host rereads credentials at most once a second
	claimAs(t, h, credential(t, state, "worker-9"))
	db := openDB(t, state)
	var stored string
	db.QueryRow(`SELECT sha256 FROM credentials WHERE name = 'worker-9'`).Scan(&stored)
	if len(stored) != 64 || strings.Contains(stored, credential(t, state, "worker-9")) {
		t.Fatalf("database keeps %q, want only a digest", stored)
	}
}

func TestEventStream(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	op := credential(t, state, "operator")
	req, _ := http.NewRequest("GET", h.URL+"/admin/events/stream?after=0", nil)
	req.Header.Set("Authorization", "Bearer "+op)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	seen := func(kind string) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case l := <-lines:
				if l == "event: "+kind {
					return
				}
			case <-timeout:
				t.Fatalf("no %s event on the stream", kind)
			}
		}
	}
	seen("fleet.host_started")
	target := getSnapshot(t, h, op).Jobs[1].OperationID
	mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+target+"/cancel", op, nil), 200)
	seen("fleet.cancelled") // pushed as it commits, not on reconnect
}

func TestServeRefusesBadState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	serve := func(state string) string {
		out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "serve", "--state", state).CombinedOutput()
		if err == nil {
			t.Fatalf("serve %s started", state)
		}
		return string(out)
	}
	if out := serve(filepath.Join(dir, "missing")); !strings.Contains(out, "no state at "+filepath.Join(dir, "missing")) {
		t.Fatalf("missing state: %s", out)
	}
	foreign := filepath.Join(dir, "foreign")
	os.Mkdir(foreign, 0o700)
	db, _ := sql.Open("sqlite", filepath.Join(foreign, statedir.DatabaseFile))
	db.Exec(`CREATE TABLE t (x)`)
	db.Close()
	if out := serve(foreign); !strings.Contains(out, "not a Fleet database") {
		t.Fatalf("foreign database: %s", out)
	}
	state := initState(t, sampleInput(t, nil))
	db, _ = sql.Open("sqlite", filepath.Join(state, statedir.DatabaseFile))
	db.Exec(`PRAGMA user_version = 42`)
	db.Close()
	if out := serve(state); !strings.Contains(out, "unknown schema version 42") {
		t.Fatalf("future schema: %s", out)
	}
	// init refuses a non-empty directory.
	out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "init", "--state", state, "--input", "/dev/null").CombinedOutput()
	if err == nil {
		t.Fatalf("init over existing state: %s", out)
	}
}

// TestVerifyDetectsTampering: verify fails, naming the problem, when a
// receipt, the accounting, a tenant's figures or a job's place in the
// queue are altered behind the host's back.
func TestVerifyDetectsTampering(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	startWorker(t, h.URL, state, "worker-1").wait(t, 30*time.Second)
	h.kill()
	verifyState(t, state)
	tamper := func(stmt, want string) {
		t.Helper()
		db, _ := sql.Open("sqlite", filepath.Join(state, statedir.DatabaseFile))
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
		db.Close()
		out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "verify", "--state", state).Output()
		if err == nil || !strings.Contains(string(out), want) {
			t.Fatalf("verify after %q: %v %s (want %q)", stmt, err, out, want)
		}
	}
	tamper(`UPDATE receipts SET body = replace(body, '"cost":20', '"cost":2') WHERE sequence = 1`, "id does not match")
	tamper(`UPDATE accounting SET spent = spent - 20, allowance = allowance`, "spent is")
	tamper(`UPDATE tenants SET spent = spent + 20 WHERE name = 'default'`, "tenant default's spent is 60 but its receipts settle 40")
	// The counts by state take the completed jobs as the rest of those
	// enqueued (the highest position): a gap would count one too many.
	tamper(`UPDATE jobs SET position = 5 WHERE position = 4`, "job positions are not 1 to 4 without a gap: no job at 4")
	tamper(`UPDATE jobs SET position = 5 WHERE position = 5`, "the counts by state map[completed:3 refused:2] are not the jobs' map[completed:2 refused:2]")
}

// TestSlowWorkerCompletesUnresolvedJob: a worker paused past its lease while
// running leaves its job unresolved with the assignment kept; resumed, it
// publishes and the job completes, once.
func TestSlowWorkerCompletesUnresolvedJob(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["sections"] = []string{"summary"} }))
	h := startHost(t, state, "--lease", "300ms")
	op := credential(t, state, "operator")
	w := startWorker(t, h.URL, state, "worker-1", "--work-delay", "1500ms")
	waitFor(t, 10*time.Second, "the job to run", func() bool { return getSnapshot(t, h, op).Jobs[0].State == wire.Running })
	w.cmd.Process.Signal(syscall.SIGSTOP)
	waitFor(t, 10*time.Second, "the lease to expire", func() bool { return getSnapshot(t, h, op).Jobs[0].State == wire.Unresolved })
	w.cmd.Process.Signal(syscall.SIGCONT)
	w.wait(t, 30*time.Second)
	s := getSnapshot(t, h, op)
	if s.Jobs[0].State != wire.Completed || s.Mutations != 1 || s.Accounting.Spent != 20 || s.Accounting.Reserved != 0 {
		t.Fatalf("after the slow worker resumed: %s, %d mutations, %+v", s.Jobs[0].State, s.Mutations, s.Accounting)
	}
	verifyState(t, state)
}

// TestCredentialCommands: `fleet-host credentials revoke|rotate|list` on a
// state a host is serving take effect in that host within about a second
// (it rereads the credentials every second), and the operator API does the
// same; a worker credential cannot call it.
func TestCredentialCommands(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	op := credential(t, state, "operator")
	cli := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command(filepath.Join(binDir, "fleet-host"), append([]string{"credentials"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("credentials %v: %v\n%s", args, err, out)
		}
		return out
	}
	fresh := filepath.Join(t.TempDir(), "fresh")
	inputPath := filepath.Join(t.TempDir(), "input.json")
	testkit.WriteFile(t, inputPath, sampleInput(t, nil), 0o600)
	if out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "init", "--state", fresh, "--input", inputPath).CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "4 jobs queued") || !strings.Contains(string(out), "next: fleet-host serve --state "+fresh) {
		t.Fatalf("init says nothing of what it made or what to run next: %v\n%s", err, out)
	}
	if out := cli("add", "--state", state, "--name", "worker-9"); !strings.Contains(string(out), "next: fleet-worker --host URL --credential "+filepath.Join(state, "credentials", "worker-9")) {
		t.Fatalf("credentials add says nothing of what to run next:\n%s", out)
	}
	answers := func(token string) int {
		return call(t, "GET", h.URL+"/v1/documents/no-such-document", token, nil).Status
	}
	w1, w2, w3 := credential(t, state, "worker-1"), credential(t, state, "worker-2"), credential(t, state, "worker-3")

	var change wire.CredentialChange
	testkit.MustDecode(t, cli("revoke", "--state", state, "--name", "worker-2"), &change)
	if !change.Changed || change.ReceiptID == "" {
		t.Fatalf("revoke: %+v", change)
	}
	waitFor(t, 3*time.Second, "the host to refuse the revoked credential", func() bool { return answers(w2) == 401 })

	testkit.MustDecode(t, cli("rotate", "--state", state, "--name", "worker-1"), &change)
	if change.Token == "" || credential(t, state, "worker-1") != change.Token {
		t.Fatalf("rotate: %+v", change)
	}
	waitFor(t, 3*time.Second, "the host to take the rotated token only", func() bool {
		return answers(w1) == 401 && answers(change.Token) == 404
	})

	// The operator API: a worker may not, the operator may.
	mustStatus(t, call(t, "POST", h.URL+"/admin/credentials/worker-3/revoke", w3, nil), 403)
	mustStatus(t, call(t, "POST", h.URL+"/admin/credentials/Not%20A%20Name/revoke", op, nil), 400)
	mustStatus(t, call(t, "POST", h.URL+"/admin/credentials/nobody/revoke", op, nil), 404)
	mustStatus(t, call(t, "POST", h.URL+"/admin/credentials/worker-3/revoke", op, nil), 200)
	if answers(w3) != 401 {
		t.Fatal("the host that revoked worker-3 still takes it")
	}
	var list struct{ Credentials []wire.Credential }
	testkit.MustDecode(t, cli("list", "--state", state), &list)
	revoked := 0
	for _, c := range list.Credentials {
		if c.RevokedAtMS != 0 {
			revoked++
		}
	}
	if revoked != 2 {
		t.Fatalf("credentials list %+v, want worker-2 and worker-3 revoked", list.Credentials)
	}
	verifyState(t, state)
}

// TestWorkerWaitsOutAPause: a worker started while claims are paused
// (without --follow) neither exits nor claims; it says so, and once the
// operator resumes it runs the queue to the end.
func TestWorkerWaitsOutAPause(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	op := credential(t, state, "operator")
	mustStatus(t, call(t, "POST", h.URL+"/admin/claims/pause", op, map[string]any{"reason": "maintenance"}), 200)
	w := startWorker(t, h.URL, state, "worker-1")
	waitFor(t, 10*time.Second, "the worker to see the pause", func() bool {
		data, _ := os.ReadFile(w.log.Name())
		return strings.Contains(string(data), "claims paused by the operator")
	})
	// It keeps asking (three claims answered paused), and stays.
	claimsRe := regexp.MustCompile(`fleet_http_request_duration_seconds_count\{code="200",method="POST",route="/v1/claims"\} (\d+)`)
	waitFor(t, 10*time.Second, "the worker to ask again while paused", func() bool {
		m := claimsRe.FindStringSubmatch(string(call(t, "GET", h.URL+"/metrics", op, nil).Body))
		n := 0
		if m != nil {
			n, _ = strconv.Atoi(m[1])
		}
		return n >= 3
	})
	select {
	case <-w.done:
		data, _ := os.ReadFile(w.log.Name())
		t.Fatalf("the worker exited while claims were paused:\n%s", data)
	default:
	}
	for _, j := range getSnapshot(t, h, op).Jobs {
		if j.State != wire.Queued {
			t.Fatalf("job %s is %s while claims are paused", j.OperationID, j.State)
		}
	}
	mustStatus(t, call(t, "POST", h.URL+"/admin/claims/resume", op, nil), 200)
	w.wait(t, 30*time.Second)
	for _, j := range getSnapshot(t, h, op).Jobs {
		if !j.State.Settled() {
			t.Fatalf("after the resumption job %s is %s", j.OperationID, j.State)
		}
	}
}
