package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
	"github.com/gowebpki/jcs"
)

// TestDependenciesAcrossWorkers: 300 reports of five sections, each
// overview waiting for the other four, worked by 8 fleet-worker processes
// with --slots 4 (on PostgreSQL, 150 across two hosts): no overview is claimed
// before its last dependency's publication committed (by the jobs' times
// and by the event log's order), no job is left blocked, every overview
// is bound to its dependencies' outputs as published, and verify is
// clean.
func TestDependenciesAcrossWorkers(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		// 300 reports on SQLite (1,500 jobs: the longest test of the suite
		// under the race detector at 500); on PostgreSQL, where the race to
		// check is across two hosts, 150, to keep the suite's time on two
		// cores.
		reports, workers := 300, 8
		var dbArgs []string
		if storetest.OnPostgres(t) {
			dbArgs, reports = []string{"--database", storetest.NewLocation(t)}, 150
		}
		state := initState(t, sampleInput(t, func(m map[string]any) {
			m["sections"], m["concurrency"], m["allowance"], m["cost_per_report"] = []string{"summary"}, workers, 1_000_000, 1
		}), dbArgs...)
		hosts := []*hostProcess{startHost(t, state, append(dbArgs, "--host-id", "a")...)}
		if len(dbArgs) > 0 {
			hosts = append(hosts, startHost(t, state, append(dbArgs, "--host-id", "b")...))
		}
		op := credential(t, state, "operator")
		overviews := submitWorkflows(t, hosts, op, reports)

		var ws []*workerProcess
		for i := range workers {
			ws = append(ws, startWorker(t, hosts[i%len(hosts)].URL, state, fmt.Sprintf("worker-%d", i+1), "--slots", "4"))
		}
		for _, w := range ws {
			w.wait(t, 4*time.Minute)
		}

		db := openDatabase(t, state, dbURL(dbArgs))
		if n := count(t, db, `SELECT COUNT(*) FROM jobs WHERE state <> 'completed'`); n != 0 {
			t.Fatalf("%d jobs not completed (blocked: %d)", n, count(t, db, `SELECT COUNT(*) FROM jobs WHERE state = 'blocked'`))
		}
		// Each overview was claimed after its four dependencies finished,
		// and its events say so in order: each dependency's publication,
		// then the unblocking (in the last one's transaction), then its
		// claim.
		seq := map[string]map[wire.EventKind]int64{}
		rows, err := db.Query(`SELECT operation_id, kind, sequence FROM events WHERE kind IN ('fleet.published', 'fleet.unblocked', 'fleet.claimed')`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var job string
			var kind wire.EventKind
			var s int64
			if err := rows.Scan(&job, &kind, &s); err != nil {
				t.Fatal(err)
			}
			if seq[job] == nil {
				seq[job] = map[wire.EventKind]int64{}
			}
			seq[job][kind] = s
		}
		rows.Close()
		for overview, deps := range overviews {
			var claimedAt int64
			if err := db.QueryRow(`SELECT claimed_at_ms FROM jobs WHERE operation_id = $1`, overview).Scan(&claimedAt); err != nil {
				t.Fatal(err)
			}
			unblocked, claimed := seq[overview][wire.EventUnblocked], seq[overview][wire.EventClaimed]
			if unblocked == 0 || claimed <= unblocked {
				t.Fatalf("overview %s: unblocked at event %d, claimed at %d", overview, unblocked, claimed)
			}
			for _, dep := range deps {
				var finishedAt int64
				if err := db.QueryRow(`SELECT finished_at_ms FROM jobs WHERE operation_id = $1`, dep).Scan(&finishedAt); err != nil {
					t.Fatal(err)
				}
				if finishedAt > claimedAt || seq[dep][wire.EventPublished] == 0 || seq[dep][wire.EventPublished] > unblocked {
					t.Fatalf("overview %s claimed at %d ms (event %d), its dependency %s finished at %d ms (published at event %d)",
						overview, claimedAt, unblocked, dep, finishedAt, seq[dep][wire.EventPublished])
				}
			}
		}
		checkBound(t, hosts[0], op, overviews, 20)
		for _, h := range hosts {
			h.kill()
		}
		if rep := verifyState(t, state, dbArgs...); !rep.OK {
			t.Fatalf("verify: %+v", rep)
		}
	})
}

// submitWorkflows submits n reports of five sections, the overview
// waiting for the other four, across the hosts, and answers each
// overview's dependencies.
func submitWorkflows(t *testing.T, hosts []*hostProcess, op string, n int) map[string][]string {
	t.Helper()
	overviews := map[string][]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := g; r < n; r += 4 {
				var res wire.ReportsResult
				mustStatus(t, call(t, "POST", hosts[r%len(hosts)].URL+"/admin/reports", op, map[string]any{
					"document": fmt.Sprintf("%sWorkflow %d.\n", sampleDocument, r), "idempotency_key": fmt.Sprintf("flow-%d", r),
					"sections": []string{"overview", "summary", "terms", "actions", "links"},
					"after":    map[string][]string{"overview": {"summary", "terms", "actions", "links"}}}), 200).decode(t, &res)
				mu.Lock()
				overviews[res.OperationIDs[0]] = res.OperationIDs[1:]
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return overviews
}

// checkBound reads up to n overviews' details: each input names its four
// dependencies' outputs as their documents hold them, and its body says
// one line for each.
func checkBound(t *testing.T, h *hostProcess, op string, overviews map[string][]string, n int) {
	t.Helper()
	for overview := range overviews {
		if n--; n < 0 {
			return
		}
		var d wire.JobDetail
		mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+overview, op, nil), 200).decode(t, &d)
		if len(d.Input.After) != 4 || len(d.Dependencies) != 4 {
			t.Fatalf("overview %s: input %+v, dependencies %+v", overview, d.Input.After, d.Dependencies)
		}
		for _, out := range d.Input.After {
			var dep wire.JobDetail
			mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+out.OperationID, op, nil), 200).decode(t, &dep)
			// As stored: canonical JSON (the answer's encoder may escape
			// what canonical JSON leaves as it is).
			canon, err := jcs.Transform(dep.Document.Body)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(canon)
			if dep.Document.Version != out.Version || hex.EncodeToString(sum[:]) != out.OutputSHA256 {
				t.Fatalf("overview %s names %s at version %d, digest %s; it is at %d, %x", overview, out.Section, out.Version,
					out.OutputSHA256, dep.Document.Version, sum)
			}
		}
		var body struct {
			Result struct {
				From []map[string]string `json:"from"`
			} `json:"result"`
		}
		if err := json.Unmarshal(d.Document.Body, &body); err != nil || len(body.Result.From) != 4 || body.Result.From[0]["section"] != "actions" {
			t.Fatalf("overview %s's body: %s (%v)", overview, d.Document.Body, err)
		}
	}
}

// TestFleetctlAfter: fleetctl submits a report whose summary waits for
// two sections; its job view says what it waits for, and the jobs list
// shows it blocked; a bad --after is refused naming it, nothing queued.
func TestFleetctlAfter(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	ctl := operatorCtl(t, h, state)
	doc := filepath.Join(t.TempDir(), "notes.md")
	if err := os.WriteFile(doc, []byte(sampleDocument), 0o600); err != nil {
		t.Fatal(err)
	}
	out := ctl("--json", "submit", "--document", doc, "--sections", "summary,terms,links", "--after", "summary=terms,links", "--key", "k1")
	var res wire.ReportsResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.OperationIDs) != 3 {
		t.Fatalf("submit --after: %v\n%s", err, out)
	}
	view := ctl("job", res.OperationIDs[0])
	if !regexp.MustCompile(`(?m)^state\s+blocked$`).MatchString(view) ||
		!regexp.MustCompile(`(?m)^waits for\s+terms \S+ \(queued\)$`).MatchString(view) {
		t.Fatalf("the summary's view:\n%s", view)
	}
	if list := ctl("jobs", "--state", "blocked"); !strings.Contains(list, res.OperationIDs[0][:8]) {
		t.Fatalf("jobs --state blocked:\n%s", list)
	}
	// The report as a tree: the summary, then the two it waits for.
	tree := ctl("report", "k1")
	if !regexp.MustCompile(`(?m)^summary\s+blocked\s+\S+\s+waits for 2\n├── links\s+queued\s+\S+\n└── terms\s+queued\s+\S+$`).MatchString(tree) {
		t.Fatalf("report k1:\n%s", tree)
	}
	var report wire.Report
	if err := json.Unmarshal([]byte(ctl("--json", "report", "k1")), &report); err != nil || len(report.Sections) != 3 ||
		strings.Join(report.Sections[0].After, ",") != "links,terms" || report.Sections[1].After == nil {
		t.Fatalf("report k1 as JSON: %+v (%v)", report, err)
	}
	// Cancelled as a whole: every job, the blocked one included; nothing
	// is held.
	var cancelled wire.ReportCancellation
	if err := json.Unmarshal([]byte(ctl("--json", "report", "k1", "--cancel")), &cancelled); err != nil || len(cancelled.Cancelled) != 3 ||
		len(cancelled.Unchanged) != 0 {
		t.Fatalf("report k1 --cancel: %+v (%v)", cancelled, err)
	}
	// Again, as a table: each job a line, nothing left to cancel.
	if again := ctl("report", "k1", "--cancel"); strings.Count(again, "\nunchanged ") != 3 || strings.Contains(again, "[") ||
		!strings.Contains(again, "0 cancelled, 3 unchanged") {
		t.Fatalf("report k1 --cancel again:\n%s", again)
	}
	if err := json.Unmarshal([]byte(ctl("--json", "report", "k1")), &report); err != nil {
		t.Fatal(err)
	}
	for _, s := range report.Sections {
		if s.State != wire.CancelledBeforeDispatch {
			t.Fatalf("after the report's cancellation: %+v", report.Sections)
		}
	}
	if r := call(t, "GET", h.URL+"/admin/reports/nope", credential(t, state, "operator"), nil); r.Status != 404 {
		t.Fatalf("an unknown report: %d %s", r.Status, r.Body)
	}
	bad := exec.Command(filepath.Join(binDir, "fleetctl"), "--host", h.URL, "--credential", filepath.Join(state, "credentials", "operator"),
		"submit", "--document", doc, "--sections", "summary,terms", "--after", "summary=terms", "--after", "terms=summary", "--key", "k2")
	if msg, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(msg), "ring") {
		t.Fatalf("a ring through fleetctl: %v\n%s", err, msg)
	}
	var page wire.JobPage
	mustStatus(t, call(t, "GET", h.URL+"/admin/jobs?limit=100", credential(t, state, "operator"), nil), 200).decode(t, &page)
	if len(page.Jobs) != 4+3 {
		t.Fatalf("%d jobs after the ring was refused", len(page.Jobs))
	}
}

// TestWorkflowSample runs examples/workflow.json as ./run.sh does: its
// summary waits for the three other sections, and the run's summary
// line says the summary was claimed only after they were published and
// was computed from their outputs. An input whose summary's claim came
// too early could not say so: the check reads the jobs' times and
// outputs, not the input.
func TestWorkflowSample(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out, err := exec.Command(filepath.Join(binDir, "fleet-run"), "--bin", binDir, "--input", "../examples/workflow.json",
		"--runs", filepath.Join(dir, "runs")).CombinedOutput()
	if err != nil {
		t.Fatalf("fleet-run: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := `{"jobs":4,"completed":4,"refused":0,"cancelled":0,"unresolved":0,"failed":0,"spent":80,"reserved":0,"available":20,"mutations":4,"lost_ack_recovered":null,"restart_retained_accounting":null,"restart_retained_kernel_key":null,"receipts_verified":true,"stale_claim_refused":null,"waited_for_dependencies":true,"computed_from_outputs":true}`
	if last := lines[len(lines)-1]; last != want {
		t.Fatalf("summary line\n got %s\nwant %s\n%s", last, want, out)
	}
	if !strings.Contains(string(out), "fleet.unblocked") {
		t.Fatalf("the timeline shows no section queued after those it waited for:\n%s", out)
	}
}
