// Package e2e runs fleet scenarios with real host and worker processes over
// loopback HTTP, on real SQLite files.
package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/verify"
	"github.com/fleet/fleet/internal/wire"
)

var binDir string

// defaultParallel is how many of these tests run at once unless -parallel
// says otherwise: they wait on real host and worker processes far more
// than they use this process's CPU, so GOMAXPROCS (two on a small
// machine) leaves the machine idle.
const defaultParallel = "6"

func TestMain(m *testing.M) {
	flag.Parse()
	parallelGiven := false
	flag.Visit(func(f *flag.Flag) { parallelGiven = parallelGiven || f.Name == "test.parallel" })
	if !parallelGiven {
		flag.Set("test.parallel", defaultParallel)
	}
	dir, err := os.MkdirTemp("", "fleet-e2e-bin-")
	if err != nil {
		panic(err)
	}
	args := []string{"build", "-o", dir + "/"}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "../cmd/fleet-host", "../cmd/fleet-worker", "../cmd/fleet-run", "../cmd/fleetctl", "../cmd/fleet-mcp")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build binaries:", err)
		os.Exit(1)
	}
	crashArgs := append(append([]string{}, args...), "-tags", "crashpoints")
	crashArgs[2] = dir + "/crash/"
	build = exec.Command("go", append(crashArgs, "../cmd/fleet-host", "../cmd/fleet-worker")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build crash-point binaries:", err)
		os.Exit(1)
	}
	// Test tools, without the race detector whatever the tests run with.
	build = exec.Command("go", "build", "-o", dir+"/tools/", "./testdata/seedjobs")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build test tools:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const sampleDocument = "Fleet review\n\nWorkers must renew their leases.\n- [ ] rotate credentials\nSee https://example.com/fleet for more.\n"

// sampleInput is the input.json of the tests, with overrides.
func sampleInput(t *testing.T, edit func(m map[string]any)) []byte {
	t.Helper()
	m := map[string]any{
		"document": sampleDocument, "sections": []string{"summary", "terms", "actions", "links"},
		"concurrency": 3, "allowance": 50, "cost_per_report": 20, "cancel_index": nil,
		"lose_ack_index": nil, "restart": true, "mode": "deterministic",
	}
	if edit != nil {
		edit(m)
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// initState runs `fleet-host init` (with extra args, e.g. --database) and
// returns the state directory.
func initState(t *testing.T, inputJSON []byte, extra ...string) string {
	t.Helper()
	if _, err := input.Parse(inputJSON); err != nil {
		t.Fatalf("test input is invalid: %v", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "input.json")
	testkit.WriteFile(t, path, inputJSON, 0o600)
	state := filepath.Join(dir, "state")
	out, err := exec.Command(filepath.Join(binDir, "fleet-host"), append([]string{"init", "--state", state, "--input", path}, extra...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("init: %v: %s", err, out)
	}
	return state
}

type hostProcess struct {
	cmd       *exec.Cmd
	URL       string `json:"url"`
	PID       int    `json:"pid"`
	KernelKey string `json:"kernel_key"`
	done      chan struct{}
	log       *logBuffer
}

// startHost serves state; extra args go to serve. The process is killed at
// cleanup if still running.
func startHost(t *testing.T, state string, extra ...string) *hostProcess {
	t.Helper()
	return startHostFrom(t, filepath.Join(binDir, "fleet-host"), nil, state, extra...)
}

// startHostFrom serves state with a host binary and extra environment
// (crash points).
func startHostFrom(t *testing.T, binary string, env []string, state string, extra ...string) *hostProcess {
	t.Helper()
	args := append([]string{"serve", "--state", state}, extra...)
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h := &hostProcess{cmd: cmd, done: make(chan struct{}), log: &logBuffer{}}
	cmd.Stderr = h.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(h.done) }()
	t.Cleanup(func() {
		h.kill()
		if strings.Contains(h.log.String(), "DATA RACE") {
			t.Errorf("the host reported a data race:\n%s", h.log)
		}
	})
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		<-h.done
		t.Fatalf("host did not start: %v\n%s", err, h.log)
	}
	if err := json.Unmarshal(line, h); err != nil {
		t.Fatalf("ready line %q: %v", line, err)
	}
	return h
}

func (h *hostProcess) kill() {
	h.cmd.Process.Signal(syscall.SIGKILL)
	<-h.done
}

func (h *hostProcess) addr() string { return strings.TrimPrefix(h.URL, "http://") }

// operatorCtl runs fleetctl against h with the state's operator
// credential, failing the test when it fails, and answers its output.
func operatorCtl(t *testing.T, h *hostProcess, state string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		all := append([]string{"--host", h.URL, "--credential", filepath.Join(state, "credentials", "operator")}, args...)
		out, err := exec.Command(filepath.Join(binDir, "fleetctl"), all...).CombinedOutput()
		if err != nil {
			t.Fatalf("fleetctl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
}

// logBuffer collects a process's output; the process writes while a test
// may read.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

type workerProcess struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  *os.File
}

func startWorker(t *testing.T, url, state, name string, extra ...string) *workerProcess {
	t.Helper()
	return startWorkerFrom(t, filepath.Join(binDir, "fleet-worker"), nil, url, state, name, extra...)
}

// startWorkerFrom runs a worker binary with extra environment (crash points).
func startWorkerFrom(t *testing.T, binary string, env []string, url, state, name string, extra ...string) *workerProcess {
	t.Helper()
	args := append([]string{"--host", url, "--credential", filepath.Join(state, "credentials", name)}, extra...)
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	log, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &workerProcess{cmd: cmd, done: make(chan struct{}), log: log}
	go func() { w.err = cmd.Wait(); close(w.done) }()
	t.Cleanup(func() {
		w.cmd.Process.Kill()
		<-w.done
		log.Close()
		if data, _ := os.ReadFile(log.Name()); strings.Contains(string(data), "DATA RACE") {
			t.Errorf("worker %s reported a data race:\n%s", name, data)
		}
	})
	return w
}

func (w *workerProcess) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-w.done:
		if w.err != nil {
			data, _ := os.ReadFile(w.log.Name())
			t.Fatalf("worker exited with %v:\n%s", w.err, data)
		}
	case <-time.After(timeout):
		t.Fatalf("worker still running after %s", timeout)
	}
}

// failed waits for the worker to exit with an error whose log says
// what, and returns the log.
func (w *workerProcess) failed(t *testing.T, timeout time.Duration, says string) string {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(timeout):
		t.Fatalf("worker still running after %s", timeout)
	}
	data, _ := os.ReadFile(w.log.Name())
	if w.err == nil || !strings.Contains(string(data), says) {
		t.Fatalf("worker exited with %v, its log not saying %q:\n%s", w.err, says, data)
	}
	return string(data)
}

func credential(t *testing.T, state, name string) string {
	t.Helper()
	token, err := statedir.ReadCredential(filepath.Join(state, "credentials", name))
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// response is an HTTP answer.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// code is the error code of a refusal; "" when the body is not an error.
func (r response) code() wire.Code {
	var e wire.ErrorBody
	if json.Unmarshal(r.Body, &e) != nil {
		return ""
	}
	return e.Error.Code
}

func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decode %s: %v", r.Body, err)
	}
}

// call sends a request; body may be nil, a string (sent as is) or a value
// (sent as JSON).
func call(t *testing.T, method, url, token string, body any) response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: data}
}

func mustStatus(t *testing.T, r response, status int) response {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	return r
}

// openDB opens a state's database read-only for assertions.
func openDB(t *testing.T, state string) *sql.DB {
	return openDatabase(t, state, "")
}

// openDatabase opens a state's SQLite file, or the PostgreSQL database at
// url when it is set, for assertions.
func openDatabase(t *testing.T, state, url string) *sql.DB {
	t.Helper()
	driver, dsn := "sqlite", "file:"+filepath.Join(state, statedir.DatabaseFile)+"?_pragma=query_only(1)&_pragma=busy_timeout(10000)"
	if url != "" {
		driver, dsn = "pgx", url
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func count(t *testing.T, db *sql.DB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// digest hashes every row of every table but the host registry, to prove a
// request changed nothing.
func digest(t *testing.T, state string) string {
	t.Helper()
	db := openDB(t, state)
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		rows.Scan(&n)
		tables = append(tables, n)
	}
	rows.Close()
	h := sha256.New()
	for _, table := range tables {
		if table == "hosts" {
			continue // the host registry's liveness record is renewed every few seconds, whatever requests do
		}
		rows, err := db.Query(`SELECT * FROM ` + table + ` ORDER BY rowid`)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		for rows.Next() {
			rows.Scan(ptrs...)
			fmt.Fprintf(h, "%s:%v\n", table, vals)
		}
		rows.Close()
	}
	return hex.EncodeToString(h.Sum(nil))
}

type snapshot = wire.Snapshot

func getSnapshot(t *testing.T, h *hostProcess, op string) snapshot {
	t.Helper()
	var s snapshot
	mustStatus(t, call(t, "GET", h.URL+"/admin/snapshot", op, nil), 200).decode(t, &s)
	return s
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitSettled waits until no job is queued, claimed or running.
func waitSettled(t *testing.T, h *hostProcess, op string) {
	t.Helper()
	waitFor(t, 30*time.Second, "every job to settle", func() bool {
		for _, j := range getSnapshot(t, h, op).Jobs {
			if !j.State.Settled() {
				return false
			}
		}
		return true
	})
}

func verifyState(t *testing.T, state string, extra ...string) verify.Report {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "fleet-host"), append([]string{"verify", "--state", state}, extra...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var rep verify.Report
	if jerr := json.Unmarshal(out, &rep); jerr != nil {
		t.Fatalf("verify printed %q (%v, %v), and on stderr: %s", out, err, jerr, stderr.Bytes())
	}
	if err != nil || !rep.OK {
		t.Fatalf("verify failed (%v): %v", err, rep.Violations)
	}
	return rep
}

var httpClient = &http.Client{Timeout: 30 * time.Second}

func newRequest(method, url, token string, body []byte) (*http.Request, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return req, nil
}
