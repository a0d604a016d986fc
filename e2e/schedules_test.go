package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/wire"
)

// TestFleetctlSchedules: fleetctl adds a recurring report to a real host
// (a cron expression in UTC; its next slot the expression's first after
// now), lists it, pauses, resumes and removes it; a schedule more often
// than once a minute, or one that cannot be parsed, is refused naming it,
// with nothing added. (Firings, on the injectable clock: TestSchedules.)
func TestFleetctlSchedules(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	ctl := operatorCtl(t, h, state)
	doc := filepath.Join(t.TempDir(), "notes.md")
	if err := os.WriteFile(doc, []byte(sampleDocument), 0o600); err != nil {
		t.Fatal(err)
	}
	out := ctl("schedule", "add", "weekly", "--cron", "0 9 * * 1", "--document", doc, "--sections", "overview,summary,terms",
		"--after", "overview=summary,terms")
	if !regexp.MustCompile(`(?m)^next\s+\d{4}-\d\d-\d\dT09:00:00(\.000)?Z$`).MatchString(out) {
		t.Fatalf("schedule add:\n%s", out)
	}
	// The schedule's view says whose allowance its reports spend and
	// what waits for what, as the table does.
	if !regexp.MustCompile(`(?m)^tenant\s+default$`).MatchString(out) || !regexp.MustCompile(`(?m)^after\s+overview=summary,terms$`).MatchString(out) {
		t.Fatalf("schedule add: no tenant or dependencies:\n%s", out)
	}
	if list := ctl("schedules"); !regexp.MustCompile(`(?m)^weekly\s+0 9 \* \* 1\s+overview,summary,terms\s+default\s+\S+\s+0\s+false$`).MatchString(list) {
		t.Fatalf("schedules:\n%s", list)
	}
	for _, bad := range []struct{ spec, says string }{{"@every 10s", "one firing a minute"}, {"61 * * * *", "not a cron expression"}} {
		cmd := exec.Command(filepath.Join(binDir, "fleetctl"), "--host", h.URL, "--credential", filepath.Join(state, "credentials", "operator"),
			"schedule", "add", "fast", "--cron", bad.spec, "--document", doc, "--sections", "summary")
		if msg, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(msg), bad.says) {
			t.Fatalf("schedule %q: %v\n%s", bad.spec, err, msg)
		}
	}
	if out := ctl("schedule", "pause", "weekly"); !regexp.MustCompile(`(?m)^paused\s+true$`).MatchString(out) {
		t.Fatalf("pause:\n%s", out)
	}
	if out := ctl("schedule", "resume", "weekly"); !regexp.MustCompile(`(?m)^paused\s+false$`).MatchString(out) {
		t.Fatalf("resume:\n%s", out)
	}
	ctl("schedule", "remove", "weekly")
	var l wire.SchedulesList
	if err := json.Unmarshal([]byte(ctl("--json", "schedules")), &l); err != nil || l.Schedules == nil || len(l.Schedules) != 0 {
		t.Fatalf("after remove: %+v (%v)", l, err)
	}
	if r := call(t, "DELETE", h.URL+"/admin/schedules/weekly", credential(t, state, "operator"), nil); r.Status != 404 {
		t.Fatalf("removing it again: %d %s", r.Status, r.Body)
	}
	// A schedule's reports take a retry policy, as submit's do.
	out = ctl("schedule", "add", "retried", "--cron", "@daily", "--document", doc, "--sections", "summary",
		"--max-attempts", "5", "--backoff-base", "2s", "--backoff-cap", "5m")
	if !regexp.MustCompile(`(?m)^retries\s+5 attempts, backoff 2s to 5m0s$`).MatchString(out) {
		t.Fatalf("schedule add with a retry policy:\n%s", out)
	}
	if err := json.Unmarshal([]byte(ctl("--json", "schedules")), &l); err != nil || len(l.Schedules) != 1 || l.Schedules[0].Report.MaxAttempts == nil ||
		*l.Schedules[0].Report.MaxAttempts != 5 || *l.Schedules[0].Report.BackoffBaseMS != 2000 || *l.Schedules[0].Report.BackoffCapMS != 300000 {
		t.Fatalf("the schedule's retry policy: %+v (%v)", l.Schedules, err)
	}
}
