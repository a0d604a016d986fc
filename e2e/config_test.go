package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/wire"
)

// referencePath is the configuration reference, generated from the
// commands (FLEET_UPDATE_REFERENCE=1 go test ./e2e -run TestConfigurationReference
// rewrites it).
const referencePath = "../docs/configuration.md"

const referenceHeader = `# Configuration reference

Every flag of every command of fleet-host, fleet-worker, fleetctl and fleet-mcp, with
its default and the environment variable that may set it instead (a flag
given on the command line wins), and the variables no flag stands for
(the developer tools fleet-run, fleet-bench and resource-exercise have
their own -help). Generated from the commands themselves:
` + "`FLEET_UPDATE_REFERENCE=1 go test ./e2e -run TestConfigurationReference`" + `
rewrites this file, and the same test fails when it is out of date.

`

// otherVariables are those read outside the four commands' flags: by
// run.sh and fleet-run, by builds with crash points, and by the tests.
// Kept here, beside the reference they end, since no command declares them.
const otherVariables = `## Other variables

| variable | read by | meaning |
| --- | --- | --- |
| ` + "`FLEET_DATABASE`" + ` | run.sh (fleet-run), and fleet-host as --database's variable | a postgres:// URL: run on PostgreSQL (fleet-run gives each run a schema of its own and hands it to the hosts it starts) |
| ` + "`FLEET_CRASH_AT`, `FLEET_CRASH_HIT`, `FLEET_CRASH_SIGNAL`" + ` | fleet-host and fleet-worker built with ` + "`-tags crashpoints`" + ` only | the crash point to stop at, at which hit, and how (kill, STOP, or an error after commit): the crash suite's |
| ` + "`FLEET_CLOCK_AHEAD`" + ` | fleet-host built with ` + "`-tags crashpoints`" + ` only | a Go duration (` + "`24h`" + `) the host's clock runs ahead by, so a test can run it past a tenant's period (` + "`TestCrashRollover`" + `) |
| ` + "`FLEET_TEST_POSTGRES_URL`" + ` | go test | a PostgreSQL server for the PostgreSQL half of the tests (skipped, and said so, without it) |
| ` + "`FLEET_REQUIRE_BROWSER`, `FLEET_CHROMIUM`" + ` | go test ./e2e | fail rather than skip the browser tests without Chromium; which Chromium to drive |
| ` + "`FLEET_REQUIRE_NODE`" + ` | go test ./e2e -run TestMCPFromTypeScript | fail rather than skip the TypeScript MCP client's test without Node and npm, or when npm cannot fetch the SDK |
| ` + "`FLEET_REQUIRE_PROMETHEUS`" + ` | go test ./e2e -run TestDashboardOnPrometheus | fail rather than skip the dashboard's test against a real Prometheus without one on PATH |
| ` + "`FLEET_REQUIRE_LITESTREAM`" + ` | go test ./e2e -run TestLitestream | fail rather than skip the replication test without litestream on PATH |
| ` + "`FLEET_REQUIRE_CADDY`" + ` | go test ./e2e -run TestTLSProxy | fail rather than skip the TLS proxy's test without caddy on PATH |
| ` + "`FLEET_CONSOLE_SCREENSHOT`" + ` | go test ./e2e -run TestConsoleAt100kJobs | where to write the console's screenshot (docs/console.png in the README) |
| ` + "`FLEET_SOAK`" + ` | go test ./e2e | how long TestSoak injects faults (default 60 s), and a duration for TestCrashSoak, which runs only when it is set (e.g. 10m), half of it on each backend when ` + "`FLEET_TEST_POSTGRES_URL`" + ` is set |
| ` + "`FLEET_UPDATE_REFERENCE`" + ` | go test ./e2e -run TestConfigurationReference | rewrite this file |
`

// TestConfigurationReference: docs/configuration.md is exactly what the
// commands say of themselves.
func TestConfigurationReference(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString(referenceHeader)
	for _, bin := range []string{"fleet-host", "fleet-worker", "fleetctl", "fleet-mcp"} {
		out, err := exec.Command(filepath.Join(binDir, bin), "config-reference").Output()
		if err != nil {
			t.Fatalf("%s config-reference: %v", bin, err)
		}
		fmt.Fprintf(&b, "## %s\n\n%s", bin, out)
	}
	b.WriteString(otherVariables)
	want := strings.TrimRight(b.String(), "\n") + "\n"
	if os.Getenv("FLEET_UPDATE_REFERENCE") == "1" {
		if err := os.WriteFile(referencePath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(referencePath)
	if err != nil || string(got) != want {
		t.Fatalf("%s is not what the commands say (%v); regenerate it: FLEET_UPDATE_REFERENCE=1 go test ./e2e -run TestConfigurationReference", referencePath, err)
	}
	for _, v := range []string{"FLEET_STATE", "FLEET_LISTEN", "FLEET_DATABASE", "FLEET_HOST", "FLEET_CREDENTIAL", "FLEET_SLOTS", "FLEET_MODEL_URL", "OPENROUTER_API_KEY", "FLEET_CREDENTIAL_FILE", "FLEET_HEARTBEAT_CEILING"} {
		if !strings.Contains(want, "`"+v+"`") {
			t.Errorf("the reference does not name %s", v)
		}
	}
}

// TestCommandsHelpAndEnvironment: --help exits 0 with examples for every
// command of fleet-host, fleet-worker and fleet-mcp; a usage mistake exits 2 naming
// the flag and its variable; a variable stands for its flag, and a flag
// given wins over it.
func TestCommandsHelpAndEnvironment(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"fleet-host", "--help"}, {"fleet-host", "init", "--help"}, {"fleet-host", "serve", "--help"},
		{"fleet-host", "credentials", "add", "--help"}, {"fleet-host", "credentials", "list", "--help"}, {"fleet-host", "verify", "--help"},
		{"fleet-worker", "--help"}, {"fleet-mcp", "--help"}} {
		out, err := exec.Command(filepath.Join(binDir, args[0]), args[1:]...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Examples:") || !strings.Contains(string(out), "Flags:") {
			t.Errorf("%v: %v\n%s", args, err, out)
		}
	}
	usage := func(want string, env []string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, args[0]), args[1:]...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if exitCode(err) != 2 || !strings.Contains(string(out), want) {
			t.Errorf("%v: exit %d, want 2 saying %q:\n%s", args, exitCode(err), want, out)
		}
	}
	usage("serve: --state (or FLEET_STATE) is required", nil, "fleet-host", "serve")
	usage(`FLEET_LEASE="soon"`, []string{"FLEET_LEASE=soon"}, "fleet-host", "serve", "--state", t.TempDir())
	usage("--host (or FLEET_HOST), --credential (or FLEET_CREDENTIAL) are required", []string{"FLEET_HOST=", "FLEET_CREDENTIAL="}, "fleet-worker")
	usage("--slots must be 1 to 64", []string{"FLEET_SLOTS=99"}, "fleet-worker", "--host", "http://127.0.0.1:1", "--credential", "x")
	usage(`unknown command "frobnicate"`, nil, "fleet-host", "frobnicate")
	// A limit out of range is a usage mistake naming the one flag given.
	usage("serve: --max-tenants must be at least 1, got 0", nil, "fleet-host", "serve", "--state", t.TempDir(), "--max-tenants", "0")
	usage("serve: --header-timeout must be positive, got -1s", []string{"FLEET_HEADER_TIMEOUT=-1s"}, "fleet-host", "serve", "--state", t.TempDir())
	usage("serve: --body-memory must be at least", nil, "fleet-host", "serve", "--state", t.TempDir(), "--body-memory", "1")
	usage("serve: --worker-rate must be 0 (no limit) or positive, got -1", nil, "fleet-host", "serve", "--state", t.TempDir(), "--worker-rate", "-1")
	usage("serve: --lease must be positive (or 0, the state's), got -5s", nil, "fleet-host", "serve", "--state", t.TempDir(), "--lease", "-5s")
	usage(`serve: --listen "bogus" is not HOST:PORT`, nil, "fleet-host", "serve", "--state", t.TempDir(), "--listen", "bogus")
	usage("--host (or FLEET_HOST), --credential (or FLEET_CREDENTIAL) are required", []string{"FLEET_HOST=", "FLEET_CREDENTIAL=", "FLEET_CREDENTIAL_FILE="}, "fleet-mcp")
	usage("--heartbeat-ceiling must be positive", []string{"FLEET_HEARTBEAT_CEILING=0s"}, "fleet-mcp", "--host", "http://127.0.0.1:1", "--credential", "x")
	// An outage of none (or less) was taken for a minute, silently.
	usage("--outage must be positive, got 0s", []string{"FLEET_OUTAGE=0s"}, "fleet-worker", "--host", "http://127.0.0.1:1", "--credential", "x")
	usage("--outage must be positive, got -1s", nil, "fleet-mcp", "--host", "http://127.0.0.1:1", "--credential", "x", "--outage", "-1s")
	usage("--work-delay must be 0 (none) or positive, got -1s", nil, "fleet-worker", "--host", "http://127.0.0.1:1", "--credential", "x", "--work-delay", "-1s")
	// A host without its scheme was retried until the outage gave up, a
	// parse error each time (fleet-worker), or taken (fleet-mcp).
	usage(`--host "127.0.0.1:1" has no scheme; did you mean http://127.0.0.1:1?`, nil, "fleet-worker", "--host", "127.0.0.1:1", "--credential", "x")
	usage(`--host "127.0.0.1:2" has no scheme; did you mean http://127.0.0.1:2?`, nil, "fleet-worker", "--host", "http://127.0.0.1:1,127.0.0.1:2", "--credential", "x")
	usage(`--host "127.0.0.1:1" has no scheme; did you mean http://127.0.0.1:1?`, nil, "fleet-mcp", "--host", "127.0.0.1:1", "--credential", "x")
	// FLEET_CREDENTIAL_FILE names fleet-mcp's credential when nothing else does.
	mcpCmd := exec.Command(filepath.Join(binDir, "fleet-mcp"))
	mcpCmd.Env = append(os.Environ(), "FLEET_HOST=http://127.0.0.1:1", "FLEET_CREDENTIAL=", "FLEET_CREDENTIAL_FILE=/nonexistent/worker-9")
	if out, err := mcpCmd.CombinedOutput(); exitCode(err) != 1 || !strings.Contains(string(out), "/nonexistent/worker-9") {
		t.Errorf("fleet-mcp with FLEET_CREDENTIAL_FILE: exit %d:\n%s", exitCode(err), out)
	}

	// The host serves from FLEET_STATE on FLEET_LISTEN's fixed port; a
	// worker finds it from FLEET_HOST and FLEET_CREDENTIAL; --listen given
	// wins over FLEET_LISTEN.
	state := initState(t, sampleInput(t, nil))
	port := freePort(t)
	serve := exec.Command(filepath.Join(binDir, "fleet-host"), "serve")
	serve.Env = append(os.Environ(), "FLEET_STATE="+state, "FLEET_LISTEN=127.0.0.1:"+port)
	stdout, _ := serve.StdoutPipe()
	var log logBuffer
	serve.Stderr = &log
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { serve.Process.Kill(); serve.Wait() }()
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	var ready struct{ URL string }
	if err != nil || json.Unmarshal(line, &ready) != nil || ready.URL != "http://127.0.0.1:"+port {
		t.Fatalf("serve from the environment: %v %q\n%s", err, line, log.String())
	}
	worker := exec.Command(filepath.Join(binDir, "fleet-worker"))
	worker.Env = append(os.Environ(), "FLEET_HOST="+ready.URL, "FLEET_CREDENTIAL="+filepath.Join(state, "credentials", "worker-1"), "FLEET_SLOTS=4")
	if out, err := worker.CombinedOutput(); err != nil {
		t.Fatalf("a worker from the environment: %v\n%s", err, out)
	}
	completed := 0
	for _, j := range getSnapshot(t, &hostProcess{URL: ready.URL}, credential(t, state, "operator")).Jobs {
		if !j.State.Settled() {
			t.Fatalf("after the worker, job %s is %s", j.OperationID, j.State)
		}
		if j.State == wire.Completed {
			completed++
		}
	}
	if completed == 0 {
		t.Fatal("the worker from the environment completed nothing")
	}

	other := exec.Command(filepath.Join(binDir, "fleet-host"), "serve", "--listen", "127.0.0.1:0")
	other.Env = append(os.Environ(), "FLEET_STATE="+initState(t, sampleInput(t, nil)), "FLEET_LISTEN=127.0.0.1:"+port)
	stdout, _ = other.StdoutPipe()
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	line, err = bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil || json.Unmarshal(line, &ready) != nil || ready.URL == "http://127.0.0.1:"+port {
		t.Fatalf("--listen did not win over FLEET_LISTEN: %v %q", err, line)
	}
}

// freePort is a loopback port free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}
