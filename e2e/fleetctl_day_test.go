package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/wire"
)

// TestFleetctlOperatorsDay (issue 34): what an operator looks for in
// fleetctl after a run: the workers, times as times, a job's published
// text, --json on every command as one JSON value and nothing more, and
// credentials add taking --name as fleet-host does.
func TestFleetctlOperatorsDay(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	startWorker(t, h.URL, state, "worker-1").wait(t, 60*time.Second)
	must := func(args ...string) string {
		t.Helper()
		all := append([]string{"--host", h.URL, "--credential", filepath.Join(state, "credentials", "operator")}, args...)
		out, err := exec.Command(filepath.Join(binDir, "fleetctl"), all...).Output()
		if err != nil {
			t.Fatalf("fleetctl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	var completed wire.Job
	for _, j := range getSnapshot(t, h, credential(t, state, "operator")).Jobs {
		if j.State == wire.Completed {
			completed = j
		}
	}
	stamp := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z`)

	t.Run("Workers", func(t *testing.T) {
		out := must("workers")
		// Alive (seen within a lease), last seen, none held, the two it
		// completed, none failed, not revoked.
		if !regexp.MustCompile(`(?m)^worker-1\s+(true|false)\s+` + stamp.String() + `\s+0\s+2\s+0\s+-\s*$`).MatchString(out) {
			t.Fatalf("workers:\n%s", out)
		}
		var ws wire.Workers
		if err := json.Unmarshal([]byte(must("--json", "workers")), &ws); err != nil || len(ws.Workers) == 0 {
			t.Fatalf("--json workers: %v", err)
		}
	})
	t.Run("JobTimesAndText", func(t *testing.T) {
		out := must("job", completed.OperationID)
		for _, field := range []string{"created", "claimed", "started", "finished"} {
			if !regexp.MustCompile(`(?m)^` + field + `\s+` + stamp.String()).MatchString(out) {
				t.Fatalf("job lacks its %s time:\n%s", field, out)
			}
		}
		if !regexp.MustCompile(`(?m)^published\s+\{.*"operation_id":"` + completed.OperationID).MatchString(out) {
			t.Fatalf("job lacks its published text:\n%s", out)
		}
		receipt := must("receipt", "show", completed.ReceiptID)
		if !regexp.MustCompile(`(?m)^issued_at_ms\s+\d+ \(` + stamp.String() + `\)`).MatchString(receipt) {
			t.Fatalf("receipt show lacks its time:\n%s", receipt)
		}
	})
	t.Run("JSONIsOneValue", func(t *testing.T) {
		snapshot := filepath.Join(t.TempDir(), "snap.json")
		for _, args := range [][]string{{"pause", "--reason", "a test"}, {"resume"}, {"stats"}, {"snapshot", "-o", snapshot},
			{"job", completed.OperationID}, {"credentials"}} {
			out := must(append([]string{"--json"}, args...)...)
			var v any
			if err := json.Unmarshal([]byte(out), &v); err != nil || strings.HasSuffix(out, "\n\n") || !strings.HasSuffix(out, "\n") {
				t.Fatalf("fleetctl --json %v printed %q (%v); want one JSON value and a newline", args, out, err)
			}
		}
	})
	t.Run("CredentialsAddName", func(t *testing.T) {
		out := must("credentials", "add", "--name", "worker-9")
		if !hasRow(out, "credential", "worker-9") {
			t.Fatalf("credentials add --name:\n%s", out)
		}
	})
	t.Run("EventsOfAJobAndKind", func(t *testing.T) {
		events := func(args ...string) []wire.Event {
			t.Helper()
			var out []wire.Event
			for _, line := range strings.Split(strings.TrimSpace(must(append([]string{"--json", "events"}, args...)...)), "\n") {
				var e wire.Event
				if err := json.Unmarshal([]byte(line), &e); err != nil {
					t.Fatalf("events %v printed %q: %v", args, line, err)
				}
				out = append(out, e)
			}
			return out
		}
		var kinds []string
		for _, e := range events("--job", completed.OperationID) {
			if e.OperationID != completed.OperationID {
				t.Fatalf("events --job printed another job's event: %+v", e)
			}
			kinds = append(kinds, string(e.Kind))
		}
		if got := strings.Join(kinds, " "); got != "fleet.claimed call.allowed fleet.published" {
			t.Fatalf("events --job: %s", got)
		}
		claims := events("--kind", "fleet.claimed")
		for _, e := range claims {
			if e.Kind != wire.EventClaimed {
				t.Fatalf("events --kind fleet.claimed printed %+v", e)
			}
		}
		if newest := events("--kind", "fleet.claimed", "--limit", "1"); len(newest) != 1 || newest[0].Sequence != claims[len(claims)-1].Sequence {
			t.Fatalf("events --kind fleet.claimed --limit 1: %+v, want the newest of %d", newest, len(claims))
		}
		bad := exec.Command(filepath.Join(binDir, "fleetctl"), "--host", h.URL, "--credential",
			filepath.Join(state, "credentials", "operator"), "events", "--kind", "fleet.claimed", "--limit", "0")
		if out, err := bad.CombinedOutput(); bad.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "--limit") {
			t.Fatalf("events --limit 0: exit %d, %v: %s", bad.ProcessState.ExitCode(), err, out)
		}

		// Following a kind prints the newest of it, then only new ones.
		var followed logBuffer
		follow := exec.Command(filepath.Join(binDir, "fleetctl"), "--host", h.URL, "--credential",
			filepath.Join(state, "credentials", "operator"), "events", "--follow", "--kind", "fleet.credential")
		follow.Stdout = &followed
		if err := follow.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { follow.Process.Kill(); follow.Wait() }()
		waitFor(t, 20*time.Second, "the newest credential event", func() bool { return strings.Contains(followed.String(), "worker-9") })
		must("pause", "--reason", "between two credentials")
		must("resume")
		must("credentials", "add", "worker-10")
		waitFor(t, 20*time.Second, "the new credential event", func() bool { return strings.Contains(followed.String(), "worker-10") })
		if out := followed.String(); strings.Contains(out, "claims_") || strings.Count(out, "\n") != 2 {
			t.Fatalf("events --follow --kind fleet.credential printed:\n%s", out)
		}
	})
}
