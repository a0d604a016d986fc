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

// TestPublishAtTheClaimedVersion: a worker publishes at the document
// version its claim answered, without reading the document first; should
// the version have moved all the same (a host that answers none), the
// host's version_conflict sends it to read the document and publish once
// more at the version it read.
func TestPublishAtTheClaimedVersion(t *testing.T) {
	for _, c := range []struct {
		name          string
		claimed, doc  int64
		wantPublishes []int64
		wantReads     int
	}{
		{"the claimed version holds", 3, 3, []int64{3}, 0},
		{"the version moved", 0, 5, []int64{0, 5}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			var publishes []int64
			reads, claims := 0, 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				data, _ := io.ReadAll(r.Body)
				w.Header().Set("Content-Type", "application/json")
				mu.Lock()
				defer mu.Unlock()
				switch {
				case r.URL.Path == "/v1/claims":
					claims++
					if claims > 1 {
						json.NewEncoder(w).Encode(wire.ClaimResult{Jobs: []wire.ClaimedJob{}, Queue: wire.QueueEmpty})
						return
					}
					json.NewEncoder(w).Encode(wire.ClaimResult{Jobs: []wire.ClaimedJob{{OperationID: "op-1", Section: "summary", DocumentID: "doc-1",
						InputSHA256: "x", Input: wire.Input{Document: "A document.", Section: "summary"}, DocumentVersion: c.claimed,
						Claim:     wire.Claim{ClaimID: "k.1", Generation: 1, LeaseExpiresAtMS: time.Now().Add(30 * time.Second).UnixMilli()},
						Admission: &wire.Admission{Decision: wire.DecisionAllow}}}})
				case r.URL.Path == "/v1/documents/doc-1":
					reads++
					json.NewEncoder(w).Encode(wire.Document{ID: "doc-1", Version: c.doc, Generation: 1})
				case strings.HasSuffix(r.URL.Path, "/publish"):
					var req wire.PublishRequest
					json.Unmarshal(data, &req)
					publishes = append(publishes, req.ExpectedVersion)
					status := wire.StatusPublished
					if req.ExpectedVersion != c.doc {
						status = wire.StatusVersionConflict
					}
					json.NewEncoder(w).Encode(wire.Outcome{Status: status, Version: c.doc})
				case strings.HasSuffix(r.URL.Path, "/heartbeat"):
					json.NewEncoder(w).Encode(wire.HeartbeatResult{LeaseExpiresAtMS: time.Now().Add(30 * time.Second).UnixMilli()})
				default:
					http.Error(w, `{"error":{"code":"not_found","message":"no such route in this test"}}`, http.StatusNotFound)
				}
			}))
			defer srv.Close()
			err := worker.New(worker.Config{HostURL: srv.URL, Token: "t", Slots: 1, Outage: 5 * time.Second,
				Log: slog.New(slog.NewTextHandler(io.Discard, nil))}).Run(context.Background())
			mu.Lock()
			defer mu.Unlock()
			if err != nil || len(publishes) != len(c.wantPublishes) || reads != c.wantReads {
				t.Fatalf("publications at %v after %d reads (%v); want at %v after %d", publishes, reads, err, c.wantPublishes, c.wantReads)
			}
			for i, v := range c.wantPublishes {
				if publishes[i] != v {
					t.Fatalf("publications at %v; want %v", publishes, c.wantPublishes)
				}
			}
		})
	}
}
