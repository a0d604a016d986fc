package mcpworker

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/wire"
)

// fakeHost answers a worker's calls for one job over real HTTP. While
// down, it hangs up on every publication without answering.
type fakeHost struct {
	mu           sync.Mutex
	down         bool
	publications []wire.PublishRequest // those that arrived, answered or not
}

func (f *fakeHost) serve(t *testing.T) *httptest.Server {
	job := wire.ClaimedJob{OperationID: "op-1", Section: "summary", DocumentID: "doc-1", InputSHA256: "abc",
		Input: wire.Input{Document: "text", Section: "summary"},
		Claim: wire.Claim{ClaimID: "claim-1", Generation: 1, LeaseExpiresAtMS: time.Now().Add(time.Minute).UnixMilli()}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		switch r.URL.Path {
		case "/v1/claims":
			json.NewEncoder(w).Encode(wire.ClaimResult{Job: &job, Jobs: []wire.ClaimedJob{job}})
		case "/v1/jobs/op-1/dispatch":
			json.NewEncoder(w).Encode(wire.Admission{Decision: wire.DecisionAllow, Receipt: wire.Receipt{ID: "r-1"}})
		case "/v1/jobs/op-1/heartbeat":
			json.NewEncoder(w).Encode(wire.HeartbeatResult{LeaseExpiresAtMS: job.Claim.LeaseExpiresAtMS})
		case "/v1/documents/doc-1":
			json.NewEncoder(w).Encode(wire.Document{ID: "doc-1", Generation: 1})
		case "/v1/jobs/op-1/publish":
			var req wire.PublishRequest
			body, _ := io.ReadAll(r.Body)
			if err := json.Unmarshal(body, &req); err != nil {
				t.Errorf("publication %s: %v", body, err)
			}
			f.publications = append(f.publications, req)
			if f.down {
				conn, _, _ := w.(http.Hijacker).Hijack()
				conn.Close()
				return
			}
			json.NewEncoder(w).Encode(wire.Outcome{Status: wire.StatusPublished, Version: 1, ReceiptID: "r-2"})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestUnansweredPublicationIsSentAgainAsItWas: a publication whose answer
// never comes within the outage is kept; the next publish_section sends
// that same request (its operation key and its text, not the new text),
// so what the host may have committed is answered from its retained
// outcome and never published twice.
func TestUnansweredPublicationIsSentAgainAsItWas(t *testing.T) {
	fake := &fakeHost{down: true}
	srv := fake.serve(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := New(ctx, Config{HostURL: srv.URL, Token: "t", Outage: 50 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if out, err := a.Take(ctx); err != nil || out.Status != "claimed" {
		t.Fatalf("take: %+v %v", out, err)
	}
	if _, err := a.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := a.Publish(ctx, PublishInput{Text: "the first text"})
	var te *ToolError
	if !errors.As(err, &te) || te.Code != codeUnreachable {
		t.Fatalf("publish while the host hangs up: %v", err)
	}
	if st := a.Status(); !st.Holding || !st.PublicationUnsure {
		t.Fatalf("status after an unanswered publication: %+v", st)
	}
	fake.mu.Lock()
	fake.down = false
	fake.mu.Unlock()
	out, err := a.Publish(ctx, PublishInput{Text: "another text"})
	if err != nil || out.Status != "published" || !out.ResentEarlier {
		t.Fatalf("publish once the host answers: %+v %v", out, err)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	first, last := fake.publications[0], fake.publications[len(fake.publications)-1]
	if len(fake.publications) < 2 || first.OperationKey != last.OperationKey || last.OperationKey != out.OperationKey ||
		string(first.Body) != string(last.Body) || !strings.Contains(string(last.Body), `"answer":"the first text"`) {
		t.Fatalf("the publications sent: %+v", fake.publications)
	}
	if st := a.Status(); st.Holding {
		t.Fatalf("still holding after the publication was answered: %+v", st)
	}
}

// TestUsageTakesBothCountsOrNeither: token counts settle a job's cost, so
// half a pair or a negative count is refused, naming the problem.
func TestUsageTakesBothCountsOrNeither(t *testing.T) {
	one, minus := int64(1), int64(-1)
	for _, c := range []struct {
		prompt, completion *int64
		want               string
	}{{&one, nil, "together"}, {nil, &one, "together"}, {&minus, &one, "negative"}} {
		if _, err := usage(c.prompt, c.completion); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("usage(%v, %v): %v, want an error saying %q", c.prompt, c.completion, err, c.want)
		}
	}
	if u, err := usage(&one, &one); err != nil || u == nil || u.PromptTokens != 1 || u.CompletionTokens != 1 {
		t.Errorf("usage(1, 1): %+v %v", u, err)
	}
	if u, err := usage(nil, nil); err != nil || u != nil {
		t.Errorf("usage(nil, nil): %+v %v", u, err)
	}
}
