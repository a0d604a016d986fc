package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/faultproxy"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

// TestFleetctl drives the operator CLI against a real host.
func TestFleetctl(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	ctl := func(args ...string) (string, error) {
		all := append([]string{"--host", h.URL, "--credential", filepath.Join(state, "credentials", "operator")}, args...)
		out, err := exec.Command(filepath.Join(binDir, "fleetctl"), all...).CombinedOutput()
		return string(out), err
	}
	must := func(t *testing.T, args ...string) string {
		t.Helper()
		out, err := ctl(args...)
		if err != nil {
			t.Fatalf("fleetctl %v: %v\n%s", args, err, out)
		}
		return out
	}

	// The scenario's steps run in order on one host, each reading what
	// those before it left.
	var (
		snap   wire.Snapshot // the four jobs as first listed
		target string        // the job cancelled, then reconciled
		queued wire.Job      // the job whose document is assigned
		change wire.CredentialChange
	)
	t.Run("a wrong host is a usage error", func(t *testing.T) {
		// Where --host is wrong, the error says how: no scheme, or a server
		// that is not a Fleet host; both are usage errors (exit 2).
		usage := func(t *testing.T, host, want string) {
			t.Helper()
			cmd := exec.Command(filepath.Join(binDir, "fleetctl"), "--host", host, "--credential", filepath.Join(state, "credentials", "operator"), "jobs")
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), want) {
				t.Fatalf("fleetctl --host %s: %v\n%s\nwant exit 2 saying %q", host, err, out, want)
			}
		}
		bare := strings.TrimPrefix(h.URL, "http://")
		usage(t, bare, fmt.Sprintf("--host %q has no scheme; did you mean http://%s?", bare, bare))
		notFleet := httptest.NewServer(http.NotFoundHandler())
		defer notFleet.Close()
		usage(t, notFleet.URL, "404 Not Found, not a Fleet host's answer: 404 page not found")
	})
	t.Run("jobs and their pages", func(t *testing.T) {
		table := must(t, "jobs")
		if !strings.Contains(table, "SECTION") || !strings.Contains(table, "ATTEMPTS") || strings.Count(table, "0/3") != 4 ||
			!strings.Contains(table, "4 shown; all jobs: 4 queued") || strings.Contains(table, "more:") {
			t.Fatalf("jobs table:\n%s", table)
		}
		// Pages: three, then the rest after the cursor; --all pages through.
		if page := must(t, "jobs", "--limit", "3"); !strings.Contains(page, "3 shown") || !strings.Contains(page, "more: fleetctl jobs --after ") {
			t.Fatalf("a page of 3:\n%s", page)
		}
		if every := must(t, "jobs", "--limit", "3", "--all"); !strings.Contains(every, "4 shown") || strings.Contains(every, "more:") {
			t.Fatalf("--all:\n%s", every)
		}
		if terms := must(t, "jobs", "--state", "queued", "--section", "terms"); !strings.Contains(terms, "1 shown") || strings.Count(terms, "terms") != 1 {
			t.Fatalf("queued terms:\n%s", terms)
		}
		if out, err := ctl("jobs", "--state", "sleeping"); err == nil || !strings.Contains(out, "invalid_request") {
			t.Fatalf("an unknown state: %v\n%s", err, out)
		}
		if err := json.Unmarshal([]byte(must(t, "--json", "jobs")), &snap); err != nil || len(snap.Jobs) != 4 {
			t.Fatalf("jobs --json: %v", err)
		}
		// A filter that selects nothing is an empty list, as the host
		// answers it, not null.
		for _, args := range [][]string{{"--json", "jobs", "--state", "failed"}, {"--json", "jobs", "--state", "failed", "--all"}} {
			var none struct{ Jobs json.RawMessage }
			if out := must(t, args...); json.Unmarshal([]byte(out), &none) != nil || string(none.Jobs) != "[]" {
				t.Fatalf("fleetctl %v: jobs %s, want []\n%s", args, none.Jobs, out)
			}
		}
		target = snap.Jobs[3].OperationID
	})
	t.Run("cancel and the job view", func(t *testing.T) {
		if out := must(t, "cancel", target); !strings.Contains(out, "cancelled_before_dispatch") {
			t.Fatalf("cancel:\n%s", out)
		}
		if out, err := ctl("cancel", target); err == nil || !strings.Contains(out, "state_conflict") {
			t.Fatalf("second cancel: %v\n%s", err, out)
		}
		var detail wire.JobDetail
		if err := json.Unmarshal([]byte(must(t, "--json", "job", target)), &detail); err != nil || detail.State != wire.CancelledBeforeDispatch {
			t.Fatalf("job --json: %v %s", err, detail.State)
		}
		if out := must(t, "job", target); !strings.Contains(out, "cancelled_before_dispatch") || !strings.Contains(out, detail.DocumentID) {
			t.Fatalf("job:\n%s", out)
		}
		// The view names the report the job is of, the key fleetctl report
		// takes, and says nothing of an outcome it has not had.
		if out := must(t, "job", target); !regexp.MustCompile(`(?m)^report +init$`).MatchString(out) || strings.Contains(out, "outcome") {
			t.Fatalf("job: want its report, init, and no outcome line\n%s", out)
		}
	})
	t.Run("assign", func(t *testing.T) {
		// assign: the document of a queued job to worker-2, at its current
		// generation; again at the old generation is assignment_conflict.
		queued = snap.Jobs[2]
		if out := must(t, "assign", queued.DocumentID, "--owner", "worker-2"); !strings.Contains(out, "worker-2") || !strings.Contains(out, "generation") {
			t.Fatalf("assign:\n%s", out)
		}
		// The job's view names the document's new owner.
		if out := must(t, "job", queued.OperationID); !strings.Contains(out, "owner worker-2)") {
			t.Fatalf("job after assign:\n%s", out)
		}
		if out, err := ctl("assign", queued.DocumentID, "--owner", "worker-3", "--expected-generation", "0"); err == nil || !strings.Contains(out, "assignment_conflict") {
			t.Fatalf("a stale assign: %v\n%s", err, out)
		}
	})
	t.Run("credentials listed and revoked", func(t *testing.T) {
		// credentials: listed, one revoked.
		if out := must(t, "credentials"); !strings.Contains(out, "worker-3") || !strings.Contains(out, "operator") || !strings.Contains(out, "REVOKED") {
			t.Fatalf("credentials:\n%s", out)
		}
		// A change is shown as an add is, a line a field, not the
		// credential as one line of JSON.
		if out := must(t, "credentials", "revoke", "worker-3"); !hasRow(out, "credential", "worker-3") || !hasRow(out, "changed", "true") ||
			!regexp.MustCompile(`(?m)^revoked +\d{4}-\d\d-\d\dT`).MatchString(out) || strings.Contains(out, "{") {
			t.Fatalf("credentials revoke:\n%s", out)
		}
		out := must(t, "credentials", "rotate", "worker-2")
		if !hasRow(out, "credential", "worker-2") || !regexp.MustCompile(`(?m)^token +\S{20,}$`).MatchString(out) || strings.Contains(out, "{") ||
			!strings.Contains(out, "credentials/worker-2 in the serving host's state directory") {
			t.Fatalf("credentials rotate:\n%s", out)
		}
	})
	t.Run("credentials added", func(t *testing.T) {
		// credentials add: over the API, its token printed once and written to
		// its file; the worker can claim with it at once.
		added := must(t, "--json", "credentials", "add", "worker-9")
		if err := json.Unmarshal([]byte(added), &change); err != nil || change.Token == "" || change.ReceiptID == "" {
			t.Fatalf("credentials add: %v\n%s", err, added)
		}
		if credential(t, state, "worker-9") != change.Token {
			t.Fatal("the added credential's file does not hold its token")
		}
		mustStatus(t, call(t, "GET", h.URL+"/v1/documents/"+queued.DocumentID, change.Token, nil), 200)
		if out, err := ctl("credentials", "add", "worker-9"); exitCode(err) != 1 || !strings.Contains(out, "state_conflict") {
			t.Fatalf("adding worker-9 again: exit %d\n%s", exitCode(err), out)
		}
	})
	t.Run("receipts shown and verified", func(t *testing.T) {
		// receipt show and verify: checked here against trusted-kernel.json;
		// against another key it does not verify (exit 3).
		if out := must(t, "receipt", "show", change.ReceiptID); !hasRow(out, "decision", "added") || !hasRow(out, "operation_id", "credential:worker-9") {
			t.Fatalf("receipt show:\n%s", out)
		}
		trusted := filepath.Join(state, "trusted-kernel.json")
		if out := must(t, "receipt", "verify", change.ReceiptID, "--trusted-kernel", trusted); !hasRow(out, "signature valid", "true") ||
			!strings.Contains(out, "checked here with") || strings.Contains(out, "false") {
			t.Fatalf("receipt verify:\n%s", out)
		}
		other := filepath.Join(t.TempDir(), "other-kernel.json")
		testkit.WriteFile(t, other, []byte(`{"algorithm":"ed25519","public_key":"`+strings.Repeat("ab", 32)+`"}`), 0o600)
		if out, err := ctl("receipt", "verify", change.ReceiptID, "--trusted-kernel", other); exitCode(err) != 3 || !strings.Contains(out, "not the trusted one") {
			t.Fatalf("verify against another key: exit %d\n%s", exitCode(err), out)
		}
		if out, err := ctl("receipt", "show", "rcpt-"+strings.Repeat("0", 64)); exitCode(err) != 1 || !strings.Contains(out, "not_found") {
			t.Fatalf("an unknown receipt: exit %d\n%s", exitCode(err), out)
		}
	})
	t.Run("pause and resume", func(t *testing.T) {
		// pause and resume: claims answer paused on the worker's route, the
		// stats and watch say so, and after resume a claim gets its job.
		if out := must(t, "pause", "--reason", "incident 42"); !hasRow(out, "claims", "paused") || !hasRow(out, "changed", "true") {
			t.Fatalf("pause:\n%s", out)
		}
		var pausedClaim wire.ClaimResult
		mustStatus(t, call(t, "POST", h.URL+"/v1/claims", change.Token, nil), 200).decode(t, &pausedClaim)
		if pausedClaim.Job != nil || pausedClaim.Queue != wire.QueuePaused {
			t.Fatalf("a claim while paused: %+v", pausedClaim)
		}
		if out := must(t, "stats"); !strings.Contains(out, "paused since") || !strings.Contains(out, "incident 42") {
			t.Fatalf("stats while paused:\n%s", out)
		}
		if out := must(t, "watch", "--count", "1"); !strings.Contains(out, "CLAIMS PAUSED") {
			t.Fatalf("watch while paused:\n%s", out)
		}
		if out := must(t, "resume"); !hasRow(out, "claims", "running") || !hasRow(out, "changed", "true") {
			t.Fatalf("resume:\n%s", out)
		}
		if out := must(t, "resume"); !hasRow(out, "changed", "false") {
			t.Fatalf("resume again:\n%s", out)
		}
	})
	t.Run("bulk", func(t *testing.T) {
		// bulk: counted with --dry-run, refused without --yes, then done; a
		// job the action does not take is refused alone.
		if out := must(t, "bulk", "requeue", "--state", "cancelled_before_dispatch", "--dry-run"); !hasRow(out, "matched", "1") {
			t.Fatalf("bulk --dry-run:\n%s", out)
		}
		if out, err := ctl("bulk", "requeue", "--state", "cancelled_before_dispatch"); exitCode(err) != 2 || !strings.Contains(out, "--yes") {
			t.Fatalf("bulk without --yes: exit %d\n%s", exitCode(err), out)
		}
		if out := must(t, "bulk", "requeue", "--state", "cancelled_before_dispatch", "--yes"); !hasRow(out, "matched", "1") || !hasRow(out, "refused state_conflict", "1") {
			t.Fatalf("bulk cancel of refused jobs:\n%s", out)
		}
	})
	t.Run("stats and snapshot", func(t *testing.T) {
		// stats and snapshot.
		if out := must(t, "stats"); !strings.Contains(out, "allowance") || !strings.Contains(out, "commits") || !strings.Contains(out, "queued") {
			t.Fatalf("stats:\n%s", out)
		}
		exported := filepath.Join(t.TempDir(), "snap.json")
		must(t, "snapshot", "--output", exported)
		var exportedSnap wire.Snapshot
		if data, err := os.ReadFile(exported); err != nil || json.Unmarshal(data, &exportedSnap) != nil || len(exportedSnap.Jobs) != 4 {
			t.Fatalf("snapshot --output: %v, %d jobs", err, len(exportedSnap.Jobs))
		}
	})
	t.Run("a failed attempt in the job view", func(t *testing.T) {
		// A failed attempt shows in the job's view: claim one, fail it.
		w1 := credential(t, state, "worker-1")
		failing := claimAs(t, h, w1)
		mustStatus(t, call(t, "POST", h.URL+"/v1/jobs/"+failing.OperationID+"/fail", w1, map[string]any{
			"claim_id": failing.Claim.ClaimID, "generation": failing.Claim.Generation, "reason": "the endpoint said 401", "retryable": true}), 200)
		if out := must(t, "job", failing.OperationID); !strings.Contains(out, "1 failed of 3") || !strings.Contains(out, "last error") ||
			!strings.Contains(out, "attempt") || !strings.Contains(out, "the endpoint said 401") {
			t.Fatalf("job after a failed attempt:\n%s", out)
		}
	})
	t.Run("allowance", func(t *testing.T) {
		if out := must(t, "allowance", "120"); !hasRow(out, "allowance", "120") {
			t.Fatalf("allowance:\n%s", out)
		}
		if a := getSnapshot(t, h, credential(t, state, "operator")).Accounting; a.Allowance != 120 {
			t.Fatalf("allowance is %d after fleetctl allowance 120", a.Allowance)
		}
	})
	t.Run("submit", func(t *testing.T) {
		doc := filepath.Join(t.TempDir(), "doc.txt")
		testkit.WriteFile(t, doc, []byte("More work. It must happen.\n"), 0o600)
		out := must(t, "submit", "--document", doc, "--sections", "actions,links", "--key", "k1")
		if strings.Count(out, "queued") != 2 {
			t.Fatalf("submit:\n%s", out)
		}
		if again := must(t, "submit", "--document", doc, "--sections", "actions,links", "--key", "k1"); again != out {
			t.Fatalf("resubmitting the same key gave\n%s\nnot\n%s", again, out)
		}
		// submit with a retry policy: the job carries it.
		var retried wire.ReportsResult
		if err := json.Unmarshal([]byte(must(t, "--json", "submit", "--document", doc, "--sections", "terms", "--max-attempts", "5",
			"--backoff-base", "2s", "--backoff-cap", "5m")), &retried); err != nil || len(retried.OperationIDs) != 1 {
			t.Fatalf("submit with a retry policy: %v", err)
		}
		var retriedJob wire.JobDetail
		if err := json.Unmarshal([]byte(must(t, "--json", "job", retried.OperationIDs[0])), &retriedJob); err != nil ||
			retriedJob.MaxAttempts != 5 || retriedJob.BackoffBaseMS != 2000 || retriedJob.BackoffCapMS != 300000 {
			t.Fatalf("the job of a submit with a retry policy: %v %+v", err, retriedJob.Job)
		}
		if out, err := ctl("submit", "--document", doc, "--sections", "terms", "--backoff-base", "1500us"); exitCode(err) != 2 {
			t.Fatalf("a backoff under a millisecond's grain: exit %d\n%s", exitCode(err), out)
		}
		if out := must(t, "reconcile", target); !hasRow(out, "reused_existing_effect", "false") {
			t.Fatalf("reconcile:\n%s", out)
		}
	})
	t.Run("priorities", func(t *testing.T) {
		// A report at priority 1 is claimed before the jobs queued earlier
		// at the default 2; the jobs view shows and filters priorities; a
		// priority out of 1 to 4 is refused, naming the range.
		doc := filepath.Join(t.TempDir(), "urgent.txt")
		testkit.WriteFile(t, doc, []byte("Urgent. It must go first.\n"), 0o600)
		var urgent wire.ReportsResult
		if err := json.Unmarshal([]byte(must(t, "--json", "submit", "--document", doc, "--sections", "summary", "--priority", "1")), &urgent); err != nil ||
			len(urgent.OperationIDs) != 1 {
			t.Fatalf("submit --priority 1: %v", err)
		}
		if out := must(t, "jobs", "--priority", "1"); !strings.Contains(out, "1 shown") || !strings.Contains(out, urgent.OperationIDs[0]) ||
			!strings.Contains(out, "PRIORITY") {
			t.Fatalf("jobs --priority 1:\n%s", out)
		}
		if out := must(t, "job", urgent.OperationIDs[0]); !hasRow(out, "priority", "1") {
			t.Fatalf("job of priority 1:\n%s", out)
		}
		if got := claimAs(t, h, credential(t, state, "worker-2")); got.OperationID != urgent.OperationIDs[0] {
			t.Fatalf("a claim took %s (%s), not the priority-1 job %s", got.OperationID, got.Section, urgent.OperationIDs[0])
		}
		for _, bad := range [][]string{{"submit", "--document", doc, "--sections", "summary", "--priority", "5"}, {"jobs", "--priority", "0"}} {
			if out, err := ctl(bad...); exitCode(err) != 1 || !strings.Contains(out, "invalid_request") || !strings.Contains(out, "priority must be") {
				t.Fatalf("fleetctl %v: exit %d\n%s", bad, exitCode(err), out)
			}
		}
	})
	t.Run("tenants", func(t *testing.T) {
		// A tenant added with its terms, its allowance raised by
		// compare-and-swap, its weight changed, a report submitted to it: its
		// jobs carry it and the tenants view counts them. A duplicate, an
		// unknown tenant, a weight out of range and a period that is none of
		// the three are refused, naming the problem.
		// The period's start, a time in Unix ms, is shown as a time too, as
		// every such field is.
		if out := must(t, "tenant", "add", "research", "--allowance", "40", "--period", "month", "--weight", "2"); !hasRow(out, "name", "research") ||
			!hasRow(out, "allowance", "40") || !hasRow(out, "period", "month") ||
			!regexp.MustCompile(`(?m)^period_start_ms +\d+ \(\d{4}-\d\d-01T00:00:00\.000Z\)$`).MatchString(out) {
			t.Fatalf("tenant add:\n%s", out)
		}
		if out := must(t, "tenant", "allowance", "research", "60"); !hasRow(out, "allowance", "60") {
			t.Fatalf("tenant allowance:\n%s", out)
		}
		if out := must(t, "tenant", "weight", "research", "3"); !hasRow(out, "weight", "3") || !hasRow(out, "allowance", "60") {
			t.Fatalf("tenant weight:\n%s", out)
		}
		doc := filepath.Join(t.TempDir(), "research.txt")
		testkit.WriteFile(t, doc, []byte("Research notes. They must be read.\n"), 0o600)
		var res wire.ReportsResult
		if err := json.Unmarshal([]byte(must(t, "--json", "submit", "--document", doc, "--sections", "summary,terms", "--tenant", "research")), &res); err != nil ||
			len(res.OperationIDs) != 2 {
			t.Fatalf("submit --tenant: %v", err)
		}
		if out := must(t, "job", res.OperationIDs[0]); !hasRow(out, "tenant", "research") {
			t.Fatalf("the job of a tenant's report:\n%s", out)
		}
		var page wire.JobPage
		if err := json.Unmarshal([]byte(must(t, "--json", "jobs", "--tenant", "research")), &page); err != nil || len(page.Jobs) != 2 ||
			page.Jobs[0].Tenant != "research" {
			t.Fatalf("jobs --tenant research: %v %+v", err, page.Jobs)
		}
		if out := must(t, "bulk", "cancel", "--tenant", "research", "--dry-run"); !hasRow(out, "matched", "2") {
			t.Fatalf("bulk --tenant --dry-run:\n%s", out)
		}
		out := must(t, "tenants")
		row := func(name string) []string {
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) > 0 && f[0] == name {
					return f
				}
			}
			return nil
		}
		// TENANT ALLOWANCE SPENT RESERVED AVAILABLE PERIOD SINCE WEIGHT QUEUED ...
		if r := row("research"); len(r) != 11 || r[1] != "60" || r[4] != "60" || r[5] != "month" || r[7] != "3" || r[8] != "2" {
			t.Fatalf("tenants:\n%s", out)
		}
		if r := row("default"); len(r) != 11 || r[1] != "fleet's" || r[5] != "-" {
			t.Fatalf("tenants:\n%s", out)
		}
		var l wire.TenantsList
		if err := json.Unmarshal([]byte(must(t, "--json", "tenants")), &l); err != nil || len(l.Tenants) != 2 || l.Tenants[1].Jobs["queued"] != 2 ||
			l.Tenants[1].Weight != 3 {
			t.Fatalf("tenants --json: %v %+v", err, l)
		}
		for _, bad := range []struct {
			args []string
			says string
		}{
			{[]string{"tenant", "add", "research"}, "exists"},
			{[]string{"tenant", "add", "ops", "--period", "fortnight"}, "period must be"},
			{[]string{"tenant", "allowance", "nobody", "10"}, "tenant nobody not found"},
			{[]string{"tenant", "weight", "nobody", "2"}, "tenant nobody not found"},
			{[]string{"tenant", "weight", "research", "0"}, "weight must be 1 to 1000"},
			{[]string{"submit", "--document", doc, "--sections", "summary", "--tenant", "nobody"}, "tenant nobody not found"},
		} {
			if out, err := ctl(bad.args...); exitCode(err) != 1 || !strings.Contains(out, bad.says) {
				t.Fatalf("fleetctl %v: exit %d\n%s", bad.args, exitCode(err), out)
			}
		}
	})
	t.Run("reconcile and events", func(t *testing.T) {
		events := must(t, "events")
		for _, kind := range []string{"fleet.started", "fleet.cancelled", "fleet.allowance_changed", "fleet.enqueued", "fleet.reconciled"} {
			if !strings.Contains(events, kind) {
				t.Errorf("events lack %s:\n%s", kind, events)
			}
		}
	})
	t.Run("events follow", func(t *testing.T) {
		// --follow streams: start it, cause an event, see it arrive.
		last := getSnapshot(t, h, credential(t, state, "operator")).Events
		follow := exec.Command(filepath.Join(binDir, "fleetctl"), "--host", h.URL, "--credential",
			filepath.Join(state, "credentials", "operator"), "events", "--follow", "--after", fmt.Sprint(last))
		stdout, _ := follow.StdoutPipe()
		if err := follow.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { follow.Process.Kill(); follow.Wait() }()
		lines := make(chan string, 10)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		time.Sleep(300 * time.Millisecond) // let the stream connect
		must(t, "cancel", snap.Jobs[2].OperationID)
		select {
		case l := <-lines:
			if !strings.Contains(l, "fleet.cancelled") {
				t.Fatalf("followed event: %s", l)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("events --follow printed nothing after a cancel")
		}
	})
	t.Run("a bad job id", func(t *testing.T) {
		if out, err := ctl("job", "not-a-uuid"); err == nil || !strings.Contains(out, "invalid_request") || exitCode(err) != 1 {
			t.Fatalf("bad id: %v\n%s (want exit 1: the host refused)", err, out)
		}
	})
	t.Run("watch", func(t *testing.T) {
		// watch: one frame of counts, the allowance, rates and events.
		if out := must(t, "watch", "--count", "1"); !strings.Contains(out, "jobs       ") || !strings.Contains(out, "allowance  ") ||
			!strings.Contains(out, "per second over the last") || !strings.Contains(out, "fleet.cancelled") {
			t.Fatalf("watch:\n%s", out)
		}
		// watch --json: a line of JSON a frame.
		var frame struct {
			Jobs          map[wire.JobState]int64 `json:"jobs"`
			Accounting    *wire.Accounting        `json:"accounting"`
			CompletedPerS *float64                `json:"completed_per_s"`
			Events        []wire.Event            `json:"events"`
		}
		if out := must(t, "--json", "watch", "--count", "1"); json.Unmarshal([]byte(out), &frame) != nil || frame.Accounting == nil ||
			frame.CompletedPerS == nil || len(frame.Jobs) == 0 || len(frame.Events) == 0 {
			t.Fatalf("watch --json:\n%s", out)
		}
		// A negative count is a usage mistake, not a watch until
		// interrupted.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, filepath.Join(binDir, "fleetctl"), "--host", h.URL, "--credential", filepath.Join(state, "credentials", "operator"),
			"watch", "--count", "-1").CombinedOutput()
		if exitCode(err) != 2 || !strings.Contains(string(out), "--count must be 0 (until interrupted) or more, got -1") {
			t.Fatalf("watch --count -1: exit %d\n%s", exitCode(err), out)
		}
	})
	t.Run("help, completion, usage and environment", func(t *testing.T) {
		// Every command has --help with examples; completion scripts; usage
		// mistakes exit 2; FLEET_HOST and FLEET_CREDENTIAL stand for the flags.
		for _, cmd := range []string{"jobs", "job", "cancel", "reconcile", "requeue", "allowance", "events", "submit", "assign", "credentials", "watch",
			"receipt", "stats", "snapshot", "pause", "resume", "bulk"} {
			out, err := exec.Command(filepath.Join(binDir, "fleetctl"), cmd, "--help").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "Examples:") || !strings.Contains(string(out), "fleetctl "+cmd) {
				t.Errorf("fleetctl %s --help: %v\n%s", cmd, err, out)
			}
		}
		if out, err := exec.Command(filepath.Join(binDir, "fleetctl"), "completion", "bash").Output(); err != nil || !strings.Contains(string(out), "fleetctl") {
			t.Fatalf("completion bash: %v", err)
		}
		for _, bad := range [][]string{{"frobnicate"}, {"jobs", "--bogus"}, {"job"}, {"allowance", "lots"}, {"tenant", "weight", "research", "heavy"}} {
			if out, err := ctl(bad...); exitCode(err) != 2 {
				t.Errorf("fleetctl %v: exit %d, want 2 (a usage mistake)\n%s", bad, exitCode(err), out)
			}
		}
		env := exec.Command(filepath.Join(binDir, "fleetctl"), "jobs", "--limit", "1")
		env.Env = append(os.Environ(), "FLEET_HOST="+h.URL, "FLEET_CREDENTIAL="+filepath.Join(state, "credentials", "operator"))
		if out, err := env.CombinedOutput(); err != nil || !strings.Contains(string(out), "1 shown") {
			t.Fatalf("with FLEET_HOST and FLEET_CREDENTIAL: %v\n%s", err, out)
		}
	})
}

// exitCode is a finished command's exit status (0 when err is nil).
func exitCode(err error) int {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// hasRow reports whether a line of a table holds exactly these fields.
func hasRow(table string, fields ...string) bool {
	for _, line := range strings.Split(table, "\n") {
		if strings.Join(strings.Fields(line), " ") == strings.Join(fields, " ") {
			return true
		}
	}
	return false
}

// TestFleetctlFollowReconnects: events --follow rides out a dropped
// connection, saying so on stderr, and resumes after the last event it
// printed: nothing printed twice, nothing skipped. When the host ends the
// stream because its credential was rotated, it says why and exits 1 (the
// reconnection is refused).
func TestFleetctlFollowReconnects(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	proxy, err := faultproxy.Start(h.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	operator := credential(t, state, "operator")
	follow := exec.Command(filepath.Join(binDir, "fleetctl"), "--host", "http://"+proxy.Addr(), "--credential",
		filepath.Join(state, "credentials", "operator"), "events", "--follow")
	stdout, _ := follow.StdoutPipe()
	var stderr logBuffer
	follow.Stderr = &stderr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- follow.Wait() }()
	defer follow.Process.Kill()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var seen []string
	until := func(kind string) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("events --follow stopped before %s; printed:\n%s\nstderr:\n%s", kind, strings.Join(seen, "\n"), stderr.String())
				}
				seen = append(seen, l)
				if strings.Contains(l, kind) {
					return
				}
			case <-deadline:
				t.Fatalf("events --follow printed no %s; printed:\n%s\nstderr:\n%s", kind, strings.Join(seen, "\n"), stderr.String())
			}
		}
	}
	until("fleet.started")
	for i, allowance := range []int{70, 90} {
		proxy.Reset()
		waitFor(t, 10*time.Second, "fleetctl to say the stream ended", func() bool {
			return strings.Count(stderr.String(), "the event stream ended") > i
		})
		current := getSnapshot(t, h, operator).Accounting.Allowance
		mustStatus(t, call(t, "POST", h.URL+"/admin/allowance", operator, map[string]any{"expected_allowance": current, "allowance": allowance}), 200)
		until("fleet.allowance_changed")
	}
	sequences := map[string]bool{}
	for _, l := range seen {
		seq := strings.Fields(l)[0]
		if sequences[seq] {
			t.Fatalf("event %s printed twice:\n%s", seq, strings.Join(seen, "\n"))
		}
		sequences[seq] = true
	}
	if !strings.Contains(stderr.String(), "reconnecting in ") {
		t.Fatalf("stderr: %s", stderr.String())
	}

	// Rotating the operator credential ends the stream; the reconnection
	// is refused, and fleetctl says why and exits 1.
	mustStatus(t, call(t, "POST", h.URL+"/admin/credentials/operator/rotate", operator, nil), 200)
	select {
	case err := <-exited:
		if exitCode(err) != 1 || !strings.Contains(stderr.String(), "rotated or revoked") || !strings.Contains(stderr.String(), "unauthorized") {
			t.Fatalf("after the rotation: exit %d, stderr:\n%s", exitCode(err), stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("events --follow still running after its credential was rotated; stderr:\n%s", stderr.String())
	}
}
