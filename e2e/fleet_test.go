package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

// TestSampleRun runs fleet-run (what ./run.sh execs) on the sample input and
// checks the summary, the run directory and the database it leaves.
func TestSampleRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	inputPath := filepath.Join(dir, "input.json")
	testkit.WriteFile(t, inputPath, sampleInput(t, func(m map[string]any) { m["lose_ack_index"] = 0 }), 0o600)
	cmd := exec.Command(filepath.Join(binDir, "fleet-run"), "--bin", binDir, "--input", inputPath, "--runs", filepath.Join(dir, "runs"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("fleet-run: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	want := `{"jobs":4,"completed":2,"refused":2,"cancelled":0,"unresolved":0,"failed":0,"spent":40,"reserved":0,"available":10,"mutations":2,"lost_ack_recovered":true,"restart_retained_accounting":true,"restart_retained_kernel_key":true,"receipts_verified":true,"stale_claim_refused":true}`
	if last != want {
		t.Fatalf("summary line\n got %s\nwant %s\n%s", last, want, out)
	}
	if !strings.Contains(string(out), "fleetctl: "+filepath.Join(binDir, "fleetctl")+" --host URL --credential ") {
		t.Fatalf("the run does not say how to open it in fleetctl:\n%s", out)
	}
	runs, _ := filepath.Glob(filepath.Join(dir, "runs", "*"))
	if len(runs) != 1 {
		t.Fatalf("run directories: %v", runs)
	}
	run := runs[0]
	for _, log := range []string{"host.log", "worker-1.log", "worker-2.log", "worker-3.log"} {
		if data, _ := os.ReadFile(filepath.Join(run, log)); strings.Contains(string(data), "DATA RACE") {
			t.Errorf("%s reports a data race:\n%s", log, data)
		}
	}
	if info, _ := os.Stat(run); info.Mode().Perm() != 0o700 {
		t.Fatalf("run directory mode %v", info.Mode().Perm())
	}
	summary, _ := os.ReadFile(filepath.Join(run, "summary.json"))
	if strings.TrimSpace(string(summary)) != want {
		t.Fatalf("summary.json %s", summary)
	}
	for _, f := range []string{"input.json", "events.ndjson", "host.log", "worker-1.log", "worker-2.log", "worker-3.log",
		"report.md", "state/fleet.sqlite3", "state/trusted-kernel.json", "state/credentials/operator"} {
		if _, err := os.Stat(filepath.Join(run, f)); err != nil {
			t.Errorf("run directory lacks %s", f)
		}
	}

	state := filepath.Join(run, "state")
	db := openDB(t, state)
	if n := count(t, db, `SELECT COUNT(*) FROM receipts WHERE kind = 'admission' AND body LIKE '%"decision":"deny"%'`); n != 2 {
		t.Errorf("%d deny receipts, want 2", n)
	}
	rows, _ := db.Query(`SELECT operation_id FROM jobs WHERE state = 'completed'`)
	var completed []string
	for rows.Next() {
		var op string
		rows.Scan(&op)
		completed = append(completed, op)
	}
	rows.Close()
	reports, _ := filepath.Glob(filepath.Join(run, "reports", "*.json"))
	if len(reports) != len(completed) || len(completed) != 2 {
		t.Fatalf("reports %v for completed jobs %v", reports, completed)
	}
	for _, op := range completed {
		if _, err := os.Stat(filepath.Join(run, "reports", op+".json")); err != nil {
			t.Errorf("no report file for completed job %s", op)
		}
	}
	// Three worker processes, three distinct pids.
	pids := map[float64]bool{}
	events, _ := os.ReadFile(filepath.Join(run, "events.ndjson"))
	for _, line := range bytes.Split(bytes.TrimSpace(events), []byte("\n")) {
		var e struct {
			Kind string
			Data map[string]any
		}
		testkit.MustDecode(t, line, &e)
		if e.Kind == "fleet.worker_started" {
			pids[e.Data["pid"].(float64)] = true
		}
	}
	if len(pids) != 3 {
		t.Fatalf("worker pids %v, want 3 distinct", pids)
	}
	verifyState(t, state)
}

// claimAs claims the next job with a worker credential over HTTP.
func claimAs(t *testing.T, h *hostProcess, token string) wire.ClaimedJob {
	t.Helper()
	var res wire.ClaimResult
	mustStatus(t, call(t, "POST", h.URL+"/v1/claims", token, nil), 200).decode(t, &res)
	if res.Job == nil {
		t.Fatalf("no job to claim (queue %s)", res.Queue)
	}
	return *res.Job
}

func refOf(j wire.ClaimedJob) wire.ClaimRef {
	return wire.ClaimRef{ClaimID: j.Claim.ClaimID, Generation: j.Claim.Generation}
}

// publishBody is a publication of job's section as the deterministic
// worker computes it (the only body the host takes for the job).
func publishBody(t *testing.T, job wire.ClaimedJob, key string, gen, version int64) map[string]any {
	t.Helper()
	body, err := sections.Body(job.OperationID, job.Section, job.InputSHA256, job.Input.Document)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{"operation_key": key, "generation": gen, "expected_version": version, "body": json.RawMessage(body)}
}

func TestCancelQueuedJob(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	op := credential(t, state, "operator")
	target := getSnapshot(t, h, op).Jobs[0].OperationID
	var res wire.CancelResult
	mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+target+"/cancel", op, nil), 200).decode(t, &res)
	if res.State != wire.CancelledBeforeDispatch || res.ReceiptID != nil {
		t.Fatalf("cancel: %+v", res)
	}
	var workers []*workerProcess
	for i := 1; i <= 3; i++ {
		workers = append(workers, startWorker(t, h.URL, state, fmt.Sprintf("worker-%d", i)))
	}
	waitSettled(t, h, op)
	// The workers are gone before the state is read: one still running may
	// yet repeat a publication whose answer was slow, which records its
	// replay and would move the digest taken around the second cancel.
	for _, w := range workers {
		w.wait(t, 30*time.Second)
	}
	s := getSnapshot(t, h, op)
	if s.Jobs[0].State != wire.CancelledBeforeDispatch {
		t.Fatalf("cancelled job became %s", s.Jobs[0].State)
	}
	db := openDB(t, state)
	if n := count(t, db, `SELECT COUNT(*) FROM receipts WHERE operation_id = $1`, target); n != 0 {
		t.Fatalf("%d receipts for a job cancelled before dispatch", n)
	}
	// Nothing spent for it: the other three share the allowance of 50.
	if s.Accounting.Spent != 40 || s.Mutations != 2 {
		t.Fatalf("accounting %+v mutations %d", s.Accounting, s.Mutations)
	}
	// A second cancel is refused and changes nothing.
	before := digest(t, state)
	r := mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+target+"/cancel", op, nil), 409)
	if r.code() != wire.CodeStateConflict || digest(t, state) != before {
		t.Fatalf("second cancel: %s", r.Body)
	}
}

func TestCancelRunningJob(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	op, w1 := credential(t, state, "operator"), credential(t, state, "worker-1")
	job := claimAs(t, h, w1)
	base := h.URL + "/v1/jobs/" + job.OperationID
	var adm wire.Admission
	mustStatus(t, call(t, "POST", base+"/dispatch", w1, refOf(job)), 200).decode(t, &adm)
	if adm.Decision != wire.DecisionAllow || adm.Accounting.Reserved != 20 {
		t.Fatalf("admission %+v", adm)
	}
	var res wire.CancelResult
	mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+job.OperationID+"/cancel", op, nil), 200).decode(t, &res)
	if res.State != wire.Cancelled || res.ReceiptID == nil {
		t.Fatalf("cancel: %+v", res)
	}
	// The worker learns it at its next heartbeat...
	var hb wire.HeartbeatResult
	mustStatus(t, call(t, "POST", base+"/heartbeat", w1, refOf(job)), 200).decode(t, &hb)
	if !hb.CancelRequested {
		t.Fatalf("heartbeat after cancel: %+v", hb)
	}
	// ...or at its publication, which is superseded.
	var out wire.Outcome
	mustStatus(t, call(t, "POST", base+"/publish", w1, publishBody(t, job, "late", job.Claim.Generation, 0)), 200).decode(t, &out)
	if out.Status != wire.StatusSuperseded {
		t.Fatalf("late publication: %s", out.Status)
	}
	s := getSnapshot(t, h, op)
	if s.Mutations != 0 || s.Accounting.Spent != 20 || s.Accounting.Reserved != 0 || s.Accounting.Available != 30 {
		t.Fatalf("after cancel: mutations %d accounting %+v", s.Mutations, s.Accounting)
	}
	db := openDB(t, state)
	if n := count(t, db, `SELECT COUNT(*) FROM receipts WHERE kind = 'cancellation' AND operation_id = $1`, job.OperationID); n != 1 {
		t.Fatalf("%d cancellation receipts", n)
	}
	verifyState(t, state)
}

func TestLostAcknowledgement(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["lose_ack_index"] = 0; m["sections"] = []string{"summary"} }))
	h := startHost(t, state)
	op, w1 := credential(t, state, "operator"), credential(t, state, "worker-1")
	job := claimAs(t, h, w1)
	base := h.URL + "/v1/jobs/" + job.OperationID
	mustStatus(t, call(t, "POST", base+"/dispatch", w1, refOf(job)), 200)

	req := publishBody(t, job, "the-key", job.Claim.Generation, 0)
	payload := testkit.MustJSON(t, req)
	httpReq, _ := newRequest("POST", base+"/publish", w1, payload)
	if resp, err := httpClient.Do(httpReq); err == nil {
		resp.Body.Close()
		t.Fatalf("the first publication was acknowledged (%d); its response should be lost", resp.StatusCode)
	}
	retry := mustStatus(t, call(t, "POST", base+"/publish", w1, payload), 200)
	if retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("retry was not answered from the retained outcome")
	}
	var detail wire.JobDetail
	mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+job.OperationID, op, nil), 200).decode(t, &detail)
	if detail.Mutations != 1 || string(detail.Outcome) != string(retry.Body) || detail.Operations[0].Deliveries != 2 {
		t.Fatalf("mutations %d, outcome %s vs retry %s, deliveries %d", detail.Mutations, detail.Outcome, retry.Body, detail.Operations[0].Deliveries)
	}
	// The host logs the decision as a structured line with its identifiers.
	var logged bool
	for _, line := range strings.Split(h.log.String(), "\n") {
		var l struct {
			Msg         string `json:"msg"`
			OperationID string `json:"operation_id"`
			Worker      string `json:"worker"`
			ReceiptID   string `json:"receipt_id"`
			Generation  int64  `json:"generation"`
			AckLost     bool   `json:"ack_lost"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "publication" && l.OperationID == job.OperationID &&
			l.Worker == "worker-1" && l.Generation == job.Claim.Generation && l.ReceiptID != "" && l.AckLost {
			logged = true
		}
	}
	if !logged {
		t.Fatalf("no structured publication log line for %s in:\n%s", job.OperationID, h.log)
	}
	// A third delivery is answered too, byte for byte.
	again := mustStatus(t, call(t, "POST", base+"/publish", w1, payload), 200)
	if !bytes.Equal(again.Body, retry.Body) {
		t.Fatalf("replays differ: %s vs %s", again.Body, retry.Body)
	}

	h.kill()
	h = startHost(t, state)
	var rec wire.Reconciliation
	mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+job.OperationID+"/reconcile", op, nil), 200).decode(t, &rec)
	var outcome struct {
		ReceiptID string `json:"receipt_id"`
	}
	testkit.MustDecode(t, retry.Body, &outcome)
	if !rec.ReusedExistingEffect || rec.ReceiptID != outcome.ReceiptID || rec.State != wire.Completed || rec.PublishedMutationCount != 1 {
		t.Fatalf("reconcile %+v, want the original receipt %s", rec, outcome.ReceiptID)
	}
	verifyState(t, state)
}

func TestStaleClaimAfterRestart(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	w1, w2 := credential(t, state, "worker-1"), credential(t, state, "worker-2")
	claimed := claimAs(t, h, w1)
	running := claimAs(t, h, w2)
	mustStatus(t, call(t, "POST", h.URL+"/v1/jobs/"+running.OperationID+"/dispatch", w2, refOf(running)), 200)

	h.kill()
	h = startHost(t, state)
	for _, path := range []string{"/dispatch", "/heartbeat"} {
		r := mustStatus(t, call(t, "POST", h.URL+"/v1/jobs/"+claimed.OperationID+path, w1, refOf(claimed)), 409)
		if r.code() != wire.CodeStaleClaim {
			t.Fatalf("%s with a pre-restart claim: %s", path, r.Body)
		}
	}
	// The claimed job went back to the queue at a new generation.
	var detail wire.JobDetail
	mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+claimed.OperationID, credential(t, state, "operator"), nil), 200).decode(t, &detail)
	if detail.State != wire.Queued || detail.Generation != claimed.Claim.Generation+1 {
		t.Fatalf("claimed job after restart: %s at generation %d", detail.State, detail.Generation)
	}
	// A running job keeps its lease across the restart.
	var hb wire.HeartbeatResult
	mustStatus(t, call(t, "POST", h.URL+"/v1/jobs/"+running.OperationID+"/heartbeat", w2, refOf(running)), 200).decode(t, &hb)
	if hb.CancelRequested || hb.LeaseExpiresAtMS <= time.Now().UnixMilli() {
		t.Fatalf("running job's heartbeat after restart: %+v", hb)
	}
}

// TestStaleWriter: the job is taken from worker A and given to B, once by an
// operator transfer and once by lease expiry and requeue. A, having reread
// the newest version, is superseded; B publishes once; A's replay of its
// attempt returns its original outcome.
func TestStaleWriter(t *testing.T) {
	t.Parallel()
	t.Run("OperatorAssign", func(t *testing.T) {
		t.Parallel()
		state := initState(t, sampleInput(t, nil))
		h := startHost(t, state)
		op, a, b := credential(t, state, "operator"), credential(t, state, "worker-1"), credential(t, state, "worker-2")
		job := claimAs(t, h, a)
		base := h.URL + "/v1/jobs/" + job.OperationID
		mustStatus(t, call(t, "POST", base+"/dispatch", a, refOf(job)), 200)
		mustStatus(t, call(t, "POST", h.URL+"/admin/documents/"+job.DocumentID+"/assign", op,
			map[string]any{"expected_generation": job.Claim.Generation, "owner": "worker-2"}), 200)
		r := mustStatus(t, call(t, "POST", h.URL+"/admin/documents/"+job.DocumentID+"/assign", op,
			map[string]any{"expected_generation": job.Claim.Generation, "owner": "worker-3"}), 409)
		if r.code() != wire.CodeAssignmentConflict {
			t.Fatalf("stale assign: %s", r.Body)
		}
		playStaleWriter(t, h, state, job, a, b)
	})
	t.Run("LeaseExpiryAndRequeue", func(t *testing.T) {
		t.Parallel()
		state := initState(t, sampleInput(t, nil))
		h := startHost(t, state, "--lease", "300ms")
		op, a, b := credential(t, state, "operator"), credential(t, state, "worker-1"), credential(t, state, "worker-2")
		job := claimAs(t, h, a)
		base := h.URL + "/v1/jobs/" + job.OperationID
		mustStatus(t, call(t, "POST", base+"/dispatch", a, refOf(job)), 200)
		waitFor(t, 10*time.Second, "the lease to expire", func() bool {
			var d wire.JobDetail
			mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+job.OperationID, op, nil), 200).decode(t, &d)
			return d.State == wire.Unresolved
		})
		mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+job.OperationID+"/requeue", op, nil), 200)
		// Other queued jobs come first; B claims until it holds A's job.
		var bJob wire.ClaimedJob
		for bJob.OperationID != job.OperationID {
			bJob = claimAs(t, h, b)
		}
		mustStatus(t, call(t, "POST", base+"/dispatch", b, refOf(bJob)), 200)
		stop := make(chan struct{})
		defer close(stop)
		go func() { // keep B's short lease alive
			for {
				select {
				case <-stop:
					return
				case <-time.After(80 * time.Millisecond):
					call(t, "POST", base+"/heartbeat", b, refOf(bJob))
				}
			}
		}()
		playStaleWriter(t, h, state, job, a, b)
	})
}

func playStaleWriter(t *testing.T, h *hostProcess, state string, job wire.ClaimedJob, a, b string) {
	t.Helper()
	base := h.URL + "/v1/jobs/" + job.OperationID
	var doc struct{ Version, Generation int64 }
	mustStatus(t, call(t, "GET", h.URL+"/v1/documents/"+job.DocumentID, a, nil), 200).decode(t, &doc)
	before := digestOfDocument(t, state, job.DocumentID)
	stale := publishBody(t, job, "a-stale", doc.Generation, doc.Version)
	first := mustStatus(t, call(t, "POST", base+"/publish", a, stale), 200)
	if !bytes.Contains(first.Body, []byte(`"superseded"`)) {
		t.Fatalf("stale writer: %s", first.Body)
	}
	if after := digestOfDocument(t, state, job.DocumentID); after != before {
		t.Fatal("a superseded writer changed the document")
	}
	good := mustStatus(t, call(t, "POST", base+"/publish", b, publishBody(t, job, "b-1", doc.Generation, doc.Version)), 200)
	if !bytes.Contains(good.Body, []byte(`"published"`)) {
		t.Fatalf("current owner: %s", good.Body)
	}
	replay := mustStatus(t, call(t, "POST", base+"/publish", a, stale), 200)
	if !bytes.Equal(replay.Body, first.Body) || replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("A's replay %s, want %s replayed", replay.Body, first.Body)
	}
	// B cannot publish the job a second time under a new key.
	again := mustStatus(t, call(t, "POST", base+"/publish", b, publishBody(t, job, "b-2", doc.Generation, doc.Version+1)), 200)
	if !bytes.Contains(again.Body, []byte(`"superseded"`)) {
		t.Fatalf("second publication of a completed job: %s", again.Body)
	}
	db := openDB(t, state)
	if n := count(t, db, `SELECT COUNT(*) FROM mutations WHERE document_id = $1`, job.DocumentID); n != 1 {
		t.Fatalf("%d mutations, want 1", n)
	}
	if n := count(t, db, `SELECT COUNT(*) FROM mutations WHERE caller = 'worker-1'`); n != 0 {
		t.Fatal("the stale writer wrote")
	}
	verifyState(t, state)
}

func digestOfDocument(t *testing.T, state, id string) string {
	t.Helper()
	db := openDB(t, state)
	var version, gen int64
	var body, owner string
	if err := db.QueryRow(`SELECT version, generation, body, owner FROM documents WHERE id = $1`, id).Scan(&version, &gen, &body, &owner); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(version, gen, body, owner, count(t, db, `SELECT COUNT(*) FROM mutations WHERE document_id = $1`, id))
}
