package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/httpapi"
	"github.com/fleet/fleet/internal/wire"
)

// fromAddress is a client whose connections come from the loopback
// address ip, as a caller on another machine would from its own.
func fromAddress(ip string) *http.Client {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dialer.DialContext}}
}

// signInFrom sends a console sign-in from client and answers its status.
func signInFrom(t *testing.T, client *http.Client, h *hostProcess, token string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", h.URL+"/console/session", strings.NewReader(fmt.Sprintf(`{"credential":%q}`, token)))
	req.Header.Set("Origin", h.URL)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestSignInNoLockout (issue 33, item 2): failed sign-ins from twelve
// addresses spend every failure budget the host has, and the operator's
// correct credential still signs in, from a fresh address and from one
// whose own budget is spent; a wrong credential stays throttled.
func TestSignInNoLockout(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	for a := range 12 {
		client := fromAddress(fmt.Sprintf("127.0.0.%d", 2+a))
		for i := range 12 {
			if status := signInFrom(t, client, h, fmt.Sprintf("fleet_guess_%d_%d", a, i)); status != 401 && status != 429 {
				t.Fatalf("a guess answered %d", status)
			}
		}
	}
	operator := credential(t, state, "operator")
	// The budgets refill as time passes (the host's a failure a second), so
	// on a loaded machine a token may have come back since the last guess:
	// a few guesses in a row must meet the throttle, and none sign in.
	throttled := func(what, ip, token string) {
		t.Helper()
		for range 5 {
			switch status := signInFrom(t, fromAddress(ip), h, token); status {
			case 429:
				return
			case 401:
			default:
				t.Fatalf("%s answered %d; want 401 or 429", what, status)
			}
		}
		t.Fatalf("%s: five in a row, none throttled (429)", what)
	}
	throttled("a guess from a fresh address after the host's budget is spent", "127.0.0.99", "fleet_one_more_guess")
	throttled("a guess from a spent address", "127.0.0.2", "fleet_and_another")
	for _, ip := range []string{"127.0.0.100", "127.0.0.2"} {
		if status := signInFrom(t, fromAddress(ip), h, operator); status != 200 {
			t.Fatalf("the operator's credential from %s after the failures answered %d; want 200", ip, status)
		}
	}
	throttled("a worker's credential at the console while throttled", "127.0.0.100", credential(t, state, "worker-1"))
}

// peakMemory is a process's peak resident memory (VmHWM), in bytes.
func peakMemory(t *testing.T, pid int) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kib << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}

// TestBodyMemoryBounded (issue 33, item 1): batch bodies at the largest
// size, made of millions of small JSON values (the shape that made a host
// hold some 90 times a body), sent four at a time with one worker's
// credential, raise the host's peak memory by a small multiple of what
// was sent; and with --body-memory at its least, bodies past it are 503
// with Retry-After while the others are answered.
func TestBodyMemoryBounded(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	worker := credential(t, state, "worker-1")
	op := uuid.NewString()
	ones := strings.Repeat("1,", (httpapi.MaxBatchBodyBytes-400)/2) + "1"
	failures := []byte(`{"items":[{"operation_id":"` + op + `","request":{"claim_id":"c","generation":1,"reason":"x","retryable":true,"junk":[` + ones + `]}}]}`)
	item := `{"operation_id":"` + op + `","request":{"operation_key":"k","generation":1,"expected_version":0,"body":{"a":[` +
		strings.Repeat("1,", (httpapi.MaxBodyBytes-200)/2) + `1]}}}`
	publications := []byte(`{"items":[` + strings.Repeat(item+",", 62) + item + `]}`)
	if len(failures) > httpapi.MaxBatchBodyBytes || len(publications) > httpapi.MaxBatchBodyBytes {
		t.Fatalf("bodies of %d and %d bytes are over the limit", len(failures), len(publications))
	}
	// Decoding millions of values takes seconds, and many times that under
	// the race detector on a busy machine: wait for the answer, which is
	// what the test asks about, not for a deadline.
	patient := &http.Client{Timeout: 5 * time.Minute}
	send := func(h *hostProcess, body []byte) (int, string) {
		req, _ := newRequest("POST", h.URL+"/v1/"+map[bool]string{true: "failures", false: "publications"}[bytes.Equal(body, failures)], worker, body)
		resp, err := patient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	// Each shape four at once, twice.
	attack := func(h *hostProcess, body []byte) map[int]int {
		statuses := map[int]int{}
		var mu sync.Mutex
		for range 2 {
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					status, retryAfter := send(h, body)
					mu.Lock()
					defer mu.Unlock()
					statuses[status]++
					if status == 503 && retryAfter == "" {
						t.Error("a 503 without Retry-After")
					}
				})
			}
			wg.Wait()
		}
		return statuses
	}

	h := startHost(t, state)
	before := peakMemory(t, h.PID)
	for _, body := range [][]byte{failures, publications} {
		if statuses := attack(h, body); statuses[200] != 8 {
			t.Fatalf("with room for every body: %v; want 8 answered", statuses)
		}
	}
	// What four bodies at once may make the host hold: the factor charged
	// for each byte, and room for the race detector's shadow of it.
	sent := int64(4 * len(failures))
	bound := sent * httpapi.BodyMemoryFactor
	if raceEnabled {
		bound *= 3
	}
	grew := peakMemory(t, h.PID) - before
	t.Logf("peak memory grew by %d MiB for four bodies of %d KiB at once (bound %d MiB)", grew>>20, len(failures)>>10, bound>>20)
	if grew > bound {
		t.Fatalf("the host's peak memory grew by %d MiB for four bodies of %d KiB at once; want at most %d MiB", grew>>20, len(failures)>>10, bound>>20)
	}
	h.kill()

	// With room for one largest body: a client that declared one and
	// sends it slowly holds the room, and another largest body is refused
	// 503 with Retry-After until it lets go.
	h = startHost(t, state, "--body-memory", strconv.Itoa(httpapi.MinBodyMemory>>20), "--body-timeout", "60s")
	slow, err := net.Dial("tcp", h.addr())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(slow, "POST /v1/failures HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n{\"items\":[",
		h.addr(), worker, httpapi.MaxBatchBodyBytes)
	waitFor(t, 20*time.Second, "a body refused while another holds the room", func() bool {
		status, _ := send(h, failures)
		return status == 503
	})
	slow.Close()
	waitFor(t, 20*time.Second, "the body answered once the room is free", func() bool {
		status, _ := send(h, failures)
		return status == 200
	})
	metrics := string(call(t, "GET", h.URL+"/metrics", credential(t, state, "operator"), nil).Body)
	if strings.Contains(metrics, `fleet_http_requests_refused_total{reason="memory"} 0`+"\n") {
		t.Fatal("the refusals are not counted")
	}
}

// TestMCPStdioMalformedLines (issue 33, item 6): lines on fleet-mcp's
// stdin that are not JSON-RPC messages each get the error JSON-RPC
// defines (parse error or invalid request), a truncated object does not
// swallow the next message, and the session keeps serving with its
// admitted job still held.
func TestMCPStdioMalformedLines(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["mode"], m["allowance"] = "model", 1000 }))
	h := startHost(t, state)
	cmd := exec.Command(filepath.Join(binDir, "fleet-mcp"), "--host", h.URL, "--credential", filepath.Join(state, "credentials", "worker-1"))
	cmd.Stderr = mcpLog(t, "worker-1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	type answer struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	send := func(line string) { fmt.Fprintln(stdin, line) }
	next := func() answer {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("fleet-mcp's stdout ended: %v", lines.Err())
		}
		var a answer
		if err := json.Unmarshal(lines.Bytes(), &a); err != nil {
			t.Fatalf("fleet-mcp wrote %q: %v", lines.Text(), err)
		}
		return a
	}
	callTool := func(id int, tool string) answer {
		t.Helper()
		send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":{}}}`, id, tool))
		a := next()
		if a.Error != nil || string(a.ID) != strconv.Itoa(id) {
			t.Fatalf("%s: %+v", tool, a)
		}
		return a
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`)
	if a := next(); a.Error != nil || a.Result == nil {
		t.Fatalf("initialize: %+v", a)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	callTool(2, "take_job")
	if a := callTool(3, "begin_work"); !strings.Contains(string(a.Result), "allow") {
		t.Fatalf("begin_work: %s", a.Result)
	}

	for _, c := range []struct {
		line string
		code int
		id   string
	}{
		{`not json`, -32700, "null"},
		{`{"jsonrpc":"1.0","id":5,"method":"tools/list"}`, -32600, "5"},
		{`[]`, -32600, "null"},
		{`42`, -32600, "null"},
		{`{"jsonrpc":"2.0","id":1e400,"method":"tools/list"}`, -32600, "null"},
		{`{"jsonrpc":"2.0","id":7,"method":"tools/list"`, -32700, "null"},
	} {
		send(c.line)
		if a := next(); a.Error == nil || a.Error.Code != c.code || string(a.ID) != c.id {
			t.Fatalf("%s: answered %+v; want error %d to id %s", c.line, a, c.code, c.id)
		}
	}
	send(`{"jsonrpc":"2.0","id":8,"method":"tools/list"}`)
	if a := next(); a.Error != nil || string(a.ID) != "8" || !strings.Contains(string(a.Result), "take_job") {
		t.Fatalf("the message after the malformed ones: %+v", a)
	}
	if a := callTool(9, "status"); !strings.Contains(string(a.Result), `"admitted":true`) {
		t.Fatalf("status after the malformed lines: %s", a.Result)
	}
	page := mustStatus(t, call(t, "GET", h.URL+"/admin/jobs?state=running", credential(t, state, "operator"), nil), 200)
	var jobs wire.JobPage
	page.decode(t, &jobs)
	if len(jobs.Jobs) != 1 {
		t.Fatalf("%d jobs running after the malformed lines; want the agent's one", len(jobs.Jobs))
	}
}
