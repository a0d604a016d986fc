package client_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fleet/fleet/internal/client"
)

func TestDo(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("Authorization") != "Bearer tok" || r.Header.Get("X-Extra") != "1" {
			http.Error(w, "bad headers", http.StatusTeapot)
			return
		}
		if r.URL.Path == "/refuse" {
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"error":{"code":"stale_claim","message":"not yours"}}`)
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.Write(body) // echo
	}))
	defer srv.Close()
	ctx, extra := context.Background(), http.Header{"X-Extra": {"1"}}

	resp, err := client.Do(ctx, srv.Client(), srv.URL, "tok", "POST", "/echo", map[string]int{"a": 1}, extra)
	var got map[string]int
	if err != nil || resp.Decode(&got) != nil || got["a"] != 1 || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("echo: %+v, %v", resp, err)
	}
	if resp, err := client.Do(ctx, srv.Client(), srv.URL, "tok", "POST", "/echo", []byte(`{"raw":true}`), extra); err != nil || string(resp.Body) != `{"raw":true}` {
		t.Fatalf("raw body: %s, %v", resp.Body, err)
	}
	_, err = client.Do(ctx, srv.Client(), srv.URL, "tok", "POST", "/refuse", nil, extra)
	if !client.IsCode(err, "stale_claim") || err.Error() != "409 stale_claim: not yours" {
		t.Fatalf("refusal: %v", err)
	}
}
