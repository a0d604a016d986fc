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
}
