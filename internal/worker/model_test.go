package worker

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const testKey = "sk-test-0123456789abcdef"

// fakeModel answers chat completions; handle decides each answer by the
// attempt's number (from 1).
func fakeModel(t *testing.T, handle func(n int64, w http.ResponseWriter, r *http.Request)) (*Model, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handle(calls.Add(1), w, r)
	}))
	t.Cleanup(srv.Close)
	return &Model{BaseURL: srv.URL, Key: testKey, Name: "test/model", Timeout: 5 * time.Second,
		HTTP: srv.Client(), Log: slog.New(slog.DiscardHandler), backoff: 10 * time.Millisecond}, &calls
}

func answer(w http.ResponseWriter, text string) {
	json.NewEncoder(w).Encode(map[string]any{"model": "test/model-2026", "choices": []any{
		map[string]any{"message": map[string]string{"role": "assistant", "content": text}}},
		"usage": map[string]int{"prompt_tokens": 1200, "completion_tokens": 300}})
}

func TestModelWrite(t *testing.T) {
	var got struct {
		Model    string
		Messages []chatMessage
	}
	var auth string
	m, calls := fakeModel(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		auth = r.Header.Get("Authorization")
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &got); err != nil {
			t.Errorf("the model endpoint got %q: %v", body, err) // not FailNow: this is the server's goroutine
		}
		answer(w, "Workers renew leases.")
	})
	a, err := m.Write(context.Background(), "summary", "Workers must renew their leases.")
	if err != nil {
		t.Fatal(err)
	}
	if a.Answer != "Workers renew leases." || a.Model != "test/model-2026" || a.Usage.PromptTokens != 1200 || a.Usage.CompletionTokens != 300 {
		t.Fatalf("answer %+v", a)
	}
	if calls.Load() != 1 || auth != "Bearer "+testKey || got.Model != "test/model" || len(got.Messages) != 2 ||
		!strings.Contains(got.Messages[1].Content, "Section: summary") || !strings.Contains(got.Messages[1].Content, "renew their leases") {
		t.Fatalf("request: calls %d, auth %q, %+v", calls.Load(), auth, got)
	}
}

// A 429 is retried after the Retry-After it names.
func TestModelRetriesTooManyRequests(t *testing.T) {
	m, calls := fakeModel(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":"slow down"}`, http.StatusTooManyRequests)
			return
		}
		answer(w, "ok")
	})
	started := time.Now()
	a, err := m.Write(context.Background(), "terms", "doc")
	if err != nil || a.Answer != "ok" || calls.Load() != 2 {
		t.Fatalf("answer %+v, %v after %d calls", a, err, calls.Load())
	}
	if waited := time.Since(started); waited < 900*time.Millisecond {
		t.Fatalf("retried after %s, before the Retry-After of 1 s", waited)
	}
}

// 5xx answers are retried a bounded number of times; the key never appears
// in the error, even when the server echoes it back.
func TestModelGivesUpAndRedacts(t *testing.T) {
	m, calls := fakeModel(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream broke; you sent "+r.Header.Get("Authorization"), http.StatusBadGateway)
	})
	_, err := m.Write(context.Background(), "links", "doc")
	if err == nil || calls.Load() != modelAttempts {
		t.Fatalf("err %v after %d calls, want failure after %d", err, calls.Load(), modelAttempts)
	}
	if strings.Contains(err.Error(), testKey) || !strings.Contains(err.Error(), "[redacted]") {
		t.Fatalf("error leaks or lost the redaction: %v", err)
	}
}

// A 4xx other than 429 is final.
func TestModelRefusalIsFinal(t *testing.T) {
	m, calls := fakeModel(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"bad key"}`, http.StatusUnauthorized)
	})
	if _, err := m.Write(context.Background(), "actions", "doc"); err == nil || calls.Load() != 1 {
		t.Fatalf("err %v after %d calls", err, calls.Load())
	}
}

// Cancelling the context cancels the call in flight.
func TestModelCancel(t *testing.T) {
	cancelled := make(chan struct{})
	m, _ := fakeModel(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)   // the server notices a hang-up only once the body is read
		<-r.Context().Done() // hang until the client goes away
		close(cancelled)
	})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err := m.Write(ctx, "summary", "doc"); err == nil {
		t.Fatal("a cancelled call succeeded")
	}
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the server never saw the request cancelled")
	}
}

func TestModelFromEnv(t *testing.T) {
	for _, k := range []string{"OPENROUTER_API_KEY", "OPENAI_API_KEY", "FLEET_MODEL_URL", "FLEET_MODEL", "FLEET_MODEL_TIMEOUT"} {
		t.Setenv(k, "")
	}
	if _, err := ModelFromEnv(nil); err == nil || !strings.Contains(err.Error(), "OPENROUTER_API_KEY or OPENAI_API_KEY") {
		t.Fatalf("without a key: %v", err)
	}
	t.Setenv("OPENAI_API_KEY", testKey)
	m, err := ModelFromEnv(nil)
	if err != nil || m.BaseURL != DefaultModelURL || m.Name != DefaultModel || m.Key != testKey {
		t.Fatalf("defaults: %+v, %v", m, err)
	}
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("FLEET_MODEL_URL", "http://127.0.0.1:11434/v1/")
	if m, err := ModelFromEnv(nil); err != nil || m.Key != "" || m.BaseURL != "http://127.0.0.1:11434/v1" {
		t.Fatalf("a local server without a key: %+v, %v", m, err)
	}
	t.Setenv("FLEET_MODEL_TIMEOUT", "soon")
	if _, err := ModelFromEnv(nil); err == nil {
		t.Fatal("a bad timeout was accepted")
	}
}
