package worker

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/client"
)

// TestClientSendsAgainAfterRequestTimeout: a 408 (the host did not get the
// body in time) is sent again, with the same body, like a 5xx; any other
// 4xx is final.
func TestClientSendsAgainAfterRequestTimeout(t *testing.T) {
	var calls atomic.Int64
	var mu sync.Mutex
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(data))
		mu.Unlock()
		switch calls.Add(1) {
		case 1:
			w.WriteHeader(http.StatusRequestTimeout)
			io.WriteString(w, `{"error":{"code":"request_timeout","message":"read request body: the body did not arrive in time"}}`)
		case 2:
			io.WriteString(w, `{"status":"published"}`)
		default:
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"error":{"code":"stale_claim","message":"no"}}`)
		}
	}))
	defer srv.Close()
	c := &Client{BaseURL: srv.URL, Token: "t", Outage: 5 * time.Second, HTTP: srv.Client(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	resp, err := c.Do(context.Background(), "POST", "/v1/jobs/x/publish", map[string]string{"operation_key": "k"})
	mu.Lock()
	same := len(bodies) == 2 && bodies[0] == bodies[1]
	mu.Unlock()
	if err != nil || string(resp.Body) != `{"status":"published"}` || calls.Load() != 2 || !same {
		t.Fatalf("after a 408: %s, %v, %d calls, the same body sent again: %v", resp.Body, err, calls.Load(), same)
	}
	_, err = c.Do(context.Background(), "POST", "/v1/jobs/x/publish", map[string]string{"operation_key": "k"})
	if !client.IsCode(err, "stale_claim") || calls.Load() != 3 {
		t.Fatalf("a 409 was not final: %v after %d calls", err, calls.Load())
	}
}

// TestClientSpreadsAndReturnsHome: workers whose own host fails spread
// over the others, and each tries its own again homeReturn later, staying
// there once it answers.
func TestClientSpreadsAndReturnsHome(t *testing.T) {
	var homeUp atomic.Bool
	served := make([]atomic.Int64, 3)
	var urls []string
	for i := range served {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if i == 0 && !homeUp.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			served[i].Add(1)
			io.WriteString(w, `{}`)
		}))
		defer srv.Close()
		urls = append(urls, srv.URL)
	}
	now := time.Unix(1000, 0)
	var clients []*Client
	for range 40 {
		c := &Client{BaseURL: strings.Join(urls, ","), Token: "t", Outage: time.Minute, HTTP: http.DefaultClient,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now }}
		if _, err := c.Do(context.Background(), "POST", "/v1/claims", nil); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	if served[0].Load() != 0 || served[1].Load() < 5 || served[2].Load() < 5 {
		t.Fatalf("with the own host down, the others served %d and %d of 40; want them spread", served[1].Load(), served[2].Load())
	}
	homeUp.Store(true)
	now = now.Add(homeReturn + time.Second)
	for _, c := range clients {
		for range 2 {
			if _, err := c.Do(context.Background(), "POST", "/v1/claims", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if served[0].Load() != 80 {
		t.Fatalf("back up, the own host served %d of 80 requests", served[0].Load())
	}
}

// TestClientMaxThrottle: 429s are waited out as they ask until MaxThrottle
// has been spent waiting; then the last is the call's error.
func TestClientMaxThrottle(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "0") // waited as the shortest pause, 100 ms
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"code":"rate_limited","message":"slow down"}}`)
	}))
	defer srv.Close()
	c := &Client{BaseURL: srv.URL, Token: "t", Outage: time.Minute, MaxThrottle: 250 * time.Millisecond,
		HTTP: srv.Client(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	_, err := c.Do(context.Background(), http.MethodGet, "/v1/documents/d", nil)
	if !client.IsCode(err, "rate_limited") || calls.Load() != 3 {
		t.Fatalf("after %d calls: %v, want the third 429 as the error", calls.Load(), err)
	}
}

// TestOutageBoundsAHungHost (issue 34): a host that takes requests and
// never answers is given up on after Outage, not after a whole request
// timeout (10 s) or two.
func TestOutageBoundsAHungHost(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c := &Client{BaseURL: srv.URL, Token: "t", Outage: 500 * time.Millisecond, HTTP: srv.Client(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	started := time.Now()
	_, err := c.Do(context.Background(), "POST", "/v1/jobs/x/publish", map[string]string{"operation_key": "k"})
	if took := time.Since(started); err == nil || !strings.Contains(err.Error(), "unreachable") || took > 4*time.Second {
		t.Fatalf("a hung host with an outage of 500ms: %v after %s", err, took)
	}
}
