package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/wire"
)

// attackers keeps n connections to addr, each given to hold until it
// returns, and opened again while stop has not been called.
func attackers(addr string, n int, hold func(ctx context.Context, conn net.Conn)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				conn, err := net.Dial("tcp", addr)
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				hold(ctx, conn)
				conn.Close()
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// slowBodies keeps n connections open that send a request's headers and
// a few bytes of a body they promise to be longer, then stop, as an
// attacker holding request slots would; a closed connection is opened
// again. stop ends them.
func slowBodies(addr string, n int, request func(body int) string) (stop func()) {
	return attackers(addr, n, func(ctx context.Context, conn net.Conn) {
		fmt.Fprint(conn, request(1000))
		fmt.Fprint(conn, `{"a":`) // and nothing more
		go func() { <-ctx.Done(); conn.Close() }()
		buf := make([]byte, 512)
		for {
			if _, err := conn.Read(buf); err != nil {
				break // the host answered and closed, or cut it off
			}
		}
		conn.Close()
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	})
}

// TestSlowBodyAttack: 300 connections without a credential and 300 with
// one worker's credential, each sending headers and then a body that never
// finishes, hold no slot that the other workers need: they claim, dispatch
// and publish every job meanwhile, and nothing is left unresolved.
func TestSlowBodyAttack(t *testing.T) {
	state := initState(t, sampleInput(t, func(m map[string]any) { m["allowance"] = 200 }))
	h := startHost(t, state)
	op := credential(t, state, "operator")
	stolen := credential(t, state, "worker-3")
	anonymous := slowBodies(h.addr(), 300, func(n int) string {
		return fmt.Sprintf("POST /console/session HTTP/1.1\r\nHost: %s\r\nOrigin: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
			h.addr(), h.URL, n)
	})
	defer anonymous()
	credentialed := slowBodies(h.addr(), 300, func(n int) string {
		return fmt.Sprintf("POST /v1/jobs/%s/dispatch HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
			uuid.NewString(), h.addr(), stolen, n)
	})
	defer credentialed()

	ws := []*workerProcess{
		startWorker(t, h.URL, state, "worker-1", "--work-delay", "300ms", "--outage", "5s"),
		startWorker(t, h.URL, state, "worker-2", "--work-delay", "300ms", "--outage", "5s"),
	}
	// The operator and health checks are served through it too.
	mustStatus(t, call(t, "GET", h.URL+"/healthz", "", nil), 200)
	mustStatus(t, call(t, "GET", h.URL+"/admin/stats", op, nil), 200)
	for _, w := range ws {
		w.wait(t, 90*time.Second)
	}
	anonymous()
	credentialed()
	for _, j := range getSnapshot(t, h, op).Jobs {
		if j.State != wire.Completed {
			t.Errorf("job %s (%s) ended %s: %s", j.OperationID, j.Section, j.State, j.Reason)
		}
	}
	if r := verifyState(t, state); !r.OK {
		t.Fatalf("verify: %+v", r.Violations)
	}
}

// TestSlowBodyCutOff: a body that does not arrive within --body-timeout of
// its headers ends the request with a 408 request_timeout naming the read, freeing its
// slot, instead of holding it for the server's 30 s read timeout.
func TestSlowBodyCutOff(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state, "--body-timeout", "300ms")
	conn, err := net.Dial("tcp", h.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/claims HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"max\":",
		h.addr(), credential(t, state, "worker-1"))
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer := make([]byte, 4096)
	n, _ := io.ReadAtLeast(conn, answer, 12)
	if got := string(answer[:n]); !strings.HasPrefix(got, "HTTP/1.1 408") || !strings.Contains(got, "request_timeout") || !strings.Contains(got, "read request body") {
		t.Fatalf("a body that stalled was answered %q", got)
	}
}

// TestWorkerRateLimit: a worker credential over --worker-rate is 429
// rate_limited with Retry-After (other credentials unaffected), the
// refusals are counted, and a worker held to that rate rides through them
// and finishes its jobs.
func TestWorkerRateLimit(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["allowance"] = 200 }))
	h := startHost(t, state, "--worker-rate", "4", "--worker-burst", "4")
	hog := credential(t, state, "worker-3")
	var limited response
	for range 12 {
		r := call(t, "GET", h.URL+"/v1/documents/no-such-document", hog, nil)
		if r.Status == 429 {
			limited = r
			break
		}
	}
	if limited.Status != 429 || limited.code() != wire.CodeRateLimited || limited.Header.Get("Retry-After") == "" {
		t.Fatalf("12 requests at once over a rate of 4 a second: %d %s", limited.Status, limited.Body)
	}
	op := credential(t, state, "operator")
	if r := call(t, "GET", h.URL+"/metrics", op, nil); !strings.Contains(string(r.Body), `fleet_http_requests_refused_total{reason="rate_limited"}`) {
		t.Fatal("the refusal is not in the metrics")
	}
	w := startWorker(t, h.URL, state, "worker-1", "--outage", "5s")
	w.wait(t, 60*time.Second)
	for _, j := range getSnapshot(t, h, op).Jobs {
		if j.State != wire.Completed {
			t.Errorf("job %s ended %s: %s", j.Section, j.State, j.Reason)
		}
	}
	data, _ := os.ReadFile(w.log.Name())
	if !strings.Contains(string(data), "rate limited") {
		t.Fatalf("the worker was never held to the rate, so the test proves nothing:\n%s", data)
	}
}
