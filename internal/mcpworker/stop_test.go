package mcpworker

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/wire"
)

// TestClaimAnsweredAfterTakeIsCutShortIsReleased: take_job's claim is on
// its way when the call is cut short (fleet-mcp stopped, or the agent
// cancelled the call). The host committed it, so with a claim that
// admits the job is running and paid for under this worker's claim;
// nobody will be told of it, so it is handed back at once (released: the
// reservation returned, no attempt counted), not left to its lease, after
// which it would be unresolved and need the operator.
func TestClaimAnsweredAfterTakeIsCutShortIsReleased(t *testing.T) {
	arrived, cut := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var released []wire.ClaimRef
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/claims":
			close(arrived)
			<-cut // the call is cut short with the claim committed and its answer on its way
			job := wire.ClaimedJob{OperationID: "op-1", Section: "summary", DocumentID: "doc-1", InputSHA256: "abc",
				Input:     wire.Input{Document: "text", Section: "summary"},
				Claim:     wire.Claim{ClaimID: "k.1", Generation: 1, LeaseExpiresAtMS: time.Now().Add(time.Minute).UnixMilli()},
				Admission: &wire.Admission{Decision: wire.DecisionAllow, Reason: "reserved", Receipt: wire.Receipt{ID: "r-1"}}}
			json.NewEncoder(w).Encode(wire.ClaimResult{Job: &job, Jobs: []wire.ClaimedJob{job}})
		case "/v1/jobs/op-1/release":
			var ref wire.ClaimRef
			if err := json.Unmarshal(body, &ref); err != nil {
				t.Errorf("release %s: %v", body, err)
			}
			mu.Lock()
			released = append(released, ref)
			mu.Unlock()
			json.NewEncoder(w).Encode(wire.ReleaseResult{State: wire.Queued, Generation: 2})
		case "/v1/jobs/op-1/heartbeat":
			json.NewEncoder(w).Encode(wire.HeartbeatResult{LeaseExpiresAtMS: time.Now().Add(time.Minute).UnixMilli()})
		default:
			http.Error(w, `{"error":{"code":"not_found","message":"no such route in this test"}}`, http.StatusNotFound)
		}
	}))
	defer srv.Close()

	life, stop := context.WithCancel(context.Background())
	defer stop()
	a := New(life, Config{HostURL: srv.URL, Token: "t", Outage: 5 * time.Second, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	call, cancel := context.WithCancel(life)
	taken := make(chan error, 1)
	go func() {
		_, err := a.Take(call)
		taken <- err
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("take_job never claimed")
	}
	cancel()
	close(cut)
	select {
	case err := <-taken:
		if err == nil {
			t.Fatal("take_job cut short answered as if the agent would see it")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("take_job did not return")
	}
	a.Close(context.Background())
	mu.Lock()
	defer mu.Unlock()
	if len(released) != 1 || released[0] != (wire.ClaimRef{ClaimID: "k.1", Generation: 1}) {
		t.Fatalf("the job the cut-short claim took was handed back %v times (%v); want once, under its claim", len(released), released)
	}
}
