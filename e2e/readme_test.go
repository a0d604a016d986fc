package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/wire"
)

// quickstartBlocks returns the README's Quickstart section's shell
// blocks, as written.
func quickstartBlocks(t *testing.T) []string {
	t.Helper()
	return readmeBlocks(t, "Quickstart", "sh")
}

// readmeBlocks returns the code blocks of one language in the README's
// section with the heading, as written.
func readmeBlocks(t *testing.T, heading, lang string) []string {
	t.Helper()
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("the README has no %s section", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```"+lang+"\n(.*?)```").FindAllStringSubmatch(section, -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// serveBlock runs a README block whose last command serves on port, in a
// shell of its own killed with everything it started at cleanup, and
// returns once the host is ready.
func serveBlock(t *testing.T, script, port string) {
	t.Helper()
	host := exec.Command("bash", "-euo", "pipefail", "-c", script)
	host.Dir = ".."
	host.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, _ := host.StdoutPipe()
	hostLog := &logBuffer{}
	host.Stderr = hostLog
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-host.Process.Pid, syscall.SIGKILL); host.Wait() })
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var line struct{ URL string }
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.URL == "http://127.0.0.1:"+port {
			return
		}
	}
	t.Fatalf("the block did not serve on %s:\n%s", port, hostLog.String())
}

// TestReadmeQuickstart runs the README's quickstart as written: the first
// block in one shell (its last command serves), the second in another once
// the host is ready. Only the port, the state directory and where the
// binaries are change: this test's own, so it runs beside others.
func TestReadmeQuickstart(t *testing.T) {
	t.Parallel()
	blocks := quickstartBlocks(t)
	if len(blocks) != 2 || !strings.Contains(blocks[0], "serve") {
		t.Fatalf("the quickstart has %d blocks, want the host's and the second terminal's:\n%q", len(blocks), blocks)
	}
	port, dir := freePort(t), filepath.Join(t.TempDir(), "quick")
	local := strings.NewReplacer("go build -o bin/ ./cmd/...", "# built by TestMain", "bin/", binDir+"/",
		"/tmp/fleet-quick", dir, "127.0.0.1:8080", "127.0.0.1:"+port)
	serveBlock(t, local.Replace(blocks[0]), port)
	second := exec.Command("bash", "-euo", "pipefail", "-c", local.Replace(blocks[1]))
	second.Dir = ".."
	second.Env = os.Environ()
	out, err := second.CombinedOutput()
	if err != nil {
		t.Fatalf("the second block: %v\n%s", err, out)
	}
	for _, want := range []string{"queued", "completed", "refused", `"jobs"`, "newest events"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the second block's output lacks %q:\n%s", want, out)
		}
	}
	// What the README says the runs did: two of the sample's four
	// completed and two refused, then the three submitted completed.
	counts := map[wire.JobState]int{}
	for _, j := range getSnapshot(t, &hostProcess{URL: "http://127.0.0.1:" + port}, credential(t, dir, "operator")).Jobs {
		counts[j.State]++
	}
	if counts[wire.Completed] != 5 || counts[wire.Refused] != 2 || len(counts) != 2 {
		t.Fatalf("after the quickstart: %v, want 5 completed and 2 refused\n%s", counts, out)
	}
}

// TestReadmeContents: the README's table of contents lists its sections
// and subsections, in order, each linking to its heading.
func TestReadmeContents(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	_, rest, _ := strings.Cut(text, "\n## Contents\n")
	toc, _, _ := strings.Cut(rest, "\n## ")
	var listed, headings []string
	for _, m := range regexp.MustCompile(`(?m)^ *- \[(.+?)\]\(#([a-z0-9-]+)\)$`).FindAllStringSubmatch(toc, -1) {
		listed = append(listed, m[1])
		if anchor := strings.ReplaceAll(regexp.MustCompile(`[^a-z0-9 -]`).ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-"); anchor != m[2] {
			t.Errorf("%q links to #%s, not #%s", m[1], m[2], anchor)
		}
	}
	for _, m := range regexp.MustCompile("(?m)^#{2,3} (.+)$").FindAllStringSubmatch(text, -1) {
		if m[1] != "Contents" {
			headings = append(headings, m[1])
		}
	}
	if fmt.Sprint(listed) != fmt.Sprint(headings) {
		t.Fatalf("contents %q\nheadings %q", listed, headings)
	}
}

// TestReadmeSeveralTeams runs the README's "Several teams" lines, as
// written, against a real host: the tenants they add hold the terms they
// name and the changes made after (support's weight from 2 to 3), the
// report goes to its tenant, and the tenants view shows it.
func TestReadmeSeveralTeams(t *testing.T) {
	t.Parallel()
	blocks := readmeBlocks(t, "Several teams", "sh")
	if len(blocks) != 1 {
		t.Fatalf("the section has %d shell blocks, want 1", len(blocks))
	}
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	dir := t.TempDir()
	run := exec.Command("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(blocks[0], "bin/", binDir+"/"))
	run.Dir = dir
	run.Env = append(os.Environ(), "FLEET_HOST="+h.URL, "FLEET_CREDENTIAL="+filepath.Join(state, "credentials", "operator"))
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("the block: %v\n%s", err, out)
	}
	var l wire.TenantsList
	mustStatus(t, call(t, "GET", h.URL+"/admin/tenants", credential(t, state, "operator"), nil), 200).decode(t, &l)
	got := map[string]wire.Tenant{}
	for _, x := range l.Tenants {
		got[x.Name] = x
	}
	if r := got["research"]; r.Allowance == nil || *r.Allowance != 8000 || r.Period != "month" || r.Jobs["queued"] != 2 {
		t.Fatalf("research after the README's lines: %+v\n%s", r, out)
	}
	if s := got["support"]; s.Allowance == nil || *s.Allowance != 200 || s.Period != "day" || s.Weight != 3 {
		t.Fatalf("support after the README's lines: %+v\n%s", s, out)
	}
	if !strings.Contains(string(out), "TENANT") {
		t.Fatalf("the block's output lacks the tenants table:\n%s", out)
	}
	var creds struct{ Credentials []wire.Credential }
	mustStatus(t, call(t, "GET", h.URL+"/admin/credentials", credential(t, state, "operator"), nil), 200).decode(t, &creds)
	capped, limited := false, false
	for _, c := range creds.Credentials {
		capped = capped || c.Name == "agent-7" && c.Allowance != nil && *c.Allowance == 300
		limited = limited || c.Name == "research-1" && slices.Equal(c.Tenants, []string{"research"})
	}
	if !capped || !limited {
		t.Fatalf("no agent-7 with an allowance of 300, or no research-1 of research alone: %+v", creds.Credentials)
	}
}

// TestReadmeSectionsThatWait runs the README's "Sections that wait for
// others" lines, as written, against a real host: the overview is blocked
// behind its three sections, which are queued, and a worker then runs
// all four, the overview last; then its "Recurring reports" lines, which
// add a schedule and pause it.
func TestReadmeSectionsThatWait(t *testing.T) {
	t.Parallel()
	blocks := readmeBlocks(t, "Sections that wait for others", "sh")
	if len(blocks) != 2 {
		t.Fatalf("the section has %d shell blocks, want 2 (its own, and Recurring reports')", len(blocks))
	}
	state := initState(t, sampleInput(t, func(m map[string]any) { m["allowance"] = 1000 }))
	h := startHost(t, state)
	dir := t.TempDir()
	runBlock := func(block string) []byte {
		t.Helper()
		run := exec.Command("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(block, "bin/", binDir+"/"))
		run.Dir = dir
		run.Env = append(os.Environ(), "FLEET_HOST="+h.URL, "FLEET_CREDENTIAL="+filepath.Join(state, "credentials", "operator"))
		out, err := run.CombinedOutput()
		if err != nil {
			t.Fatalf("the block: %v\n%s", err, out)
		}
		return out
	}
	out := runBlock(blocks[0])
	op := credential(t, state, "operator")
	var page wire.JobPage
	mustStatus(t, call(t, "GET", h.URL+"/admin/jobs?limit=100", op, nil), 200).decode(t, &page)
	if page.Counts[wire.Blocked] != 1 || page.Counts[wire.Queued] != 4+3 || !strings.Contains(string(out), "└── terms") {
		t.Fatalf("after the README's lines: %v\n%s", page.Counts, out)
	}
	startWorker(t, h.URL, state, "worker-1").wait(t, 60*time.Second)
	mustStatus(t, call(t, "GET", h.URL+"/admin/jobs?limit=100&section=overview", op, nil), 200).decode(t, &page)
	if len(page.Jobs) != 1 || page.Jobs[0].State != wire.Completed {
		t.Fatalf("the overview after a worker's run: %+v", page.Jobs)
	}
	// Recurring reports: the schedule added, listed and paused.
	out = runBlock(blocks[1])
	var l wire.SchedulesList
	mustStatus(t, call(t, "GET", h.URL+"/admin/schedules", op, nil), 200).decode(t, &l)
	if len(l.Schedules) != 1 || l.Schedules[0].Name != "weekly" || !l.Schedules[0].Paused || !strings.Contains(string(out), "NEXT") {
		t.Fatalf("after the recurring reports' lines: %+v\n%s", l.Schedules, out)
	}
}
