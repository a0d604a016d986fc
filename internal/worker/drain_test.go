package worker_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/wire"
	"github.com/fleet/fleet/internal/worker"
)

// TestClaimAnsweredAfterStopIsWorked: a worker told to stop while its
// claim is on its way still takes the claim's answer. The host committed
// it (with a claim that admits, the jobs are running and paid for), so
// the jobs it answers are worked within the drain, or handed back, never
// dropped with nothing to tell the host.
func TestClaimAnsweredAfterStopIsWorked(t *testing.T) {
	arrived, stopped := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	finished := map[string]string{} // operation id: publish or release
	var claims int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/v1/claims":
			mu.Lock()
			claims++
			first := claims == 1
			mu.Unlock()
			if !first {
				json.NewEncoder(w).Encode(wire.ClaimResult{Jobs: []wire.ClaimedJob{}, Queue: wire.QueueEmpty})
				return
			}
			close(arrived)
			<-stopped // the worker is told to stop with the claim committed and its answer on its way
			time.Sleep(100 * time.Millisecond)
			var res wire.ClaimResult
			for _, op := range []string{"op-1", "op-2"} {
				res.Jobs = append(res.Jobs, wire.ClaimedJob{OperationID: op, Section: "summary", DocumentID: "doc-" + op, InputSHA256: "x",
					Input:     wire.Input{Document: "A document.", Section: "summary"},
					Claim:     wire.Claim{ClaimID: "k." + op, Generation: 1, LeaseExpiresAtMS: time.Now().Add(30 * time.Second).UnixMilli()},
					Admission: &wire.Admission{Decision: wire.DecisionAllow, Reason: "reserved"}})
			}
			json.NewEncoder(w).Encode(res)
		case strings.HasSuffix(r.URL.Path, "/publish"), strings.HasSuffix(r.URL.Path, "/release"):
			parts := strings.Split(r.URL.Path, "/")
			mu.Lock()
			finished[parts[3]] = parts[4]
			mu.Unlock()
			if parts[4] == "publish" {
				json.NewEncoder(w).Encode(wire.Outcome{Status: wire.StatusPublished, Version: 1})
			} else {
				json.NewEncoder(w).Encode(wire.ReleaseResult{State: wire.Queued})
			}
		case strings.HasSuffix(r.URL.Path, "/heartbeat"):
			json.NewEncoder(w).Encode(wire.HeartbeatResult{LeaseExpiresAtMS: time.Now().Add(30 * time.Second).UnixMilli()})
		default:
			http.Error(w, `{"error":{"code":"not_found","message":"no such route in this test"}}`, http.StatusNotFound)
		}
	}))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- worker.New(worker.Config{HostURL: srv.URL, Token: "t", Slots: 2, Drain: 5 * time.Second, Outage: 5 * time.Second,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))}).Run(ctx)
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker never claimed")
	}
	cancel() // SIGTERM
	close(stopped)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the worker stopped with %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not stop")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(finished) != 2 {
		t.Fatalf("of the two jobs the claim answered, the worker published or handed back %v; want both", finished)
	}
}
