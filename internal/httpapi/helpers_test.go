package httpapi_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/hosttest"
	"github.com/fleet/fleet/internal/httpapi"
	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/wire"
)

// testHost is a real host on a temp state with the real handler in front.
type testHost struct {
	host             *host.Host
	handler          http.Handler
	worker, operator string
	state            string
	jobs             []wire.Job
}

func newTestHost(tb testing.TB, inputJSON string) *testHost {
	tb.Helper()
	ctx := context.Background()
	state := filepath.Join(tb.TempDir(), "state")
	in, err := input.Parse([]byte(inputJSON))
	if err != nil {
		tb.Fatal(err)
	}
	if err := hosttest.Init(ctx, state, "", in); err != nil {
		tb.Fatal(err)
	}
	h, err := hosttest.Open(ctx, state, "")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Close() })
	if err := h.Start(ctx, "test"); err != nil {
		tb.Fatal(err)
	}
	th := &testHost{host: h, state: state,
		handler: httpapi.New(h, slog.New(slog.NewTextHandler(io.Discard, nil)), testLimits()).Handler()}
	th.worker, _ = statedir.ReadCredential(filepath.Join(state, "credentials", "worker-1"))
	th.operator, _ = statedir.ReadCredential(filepath.Join(state, "credentials", "operator"))
	snap, err := h.Views().Snapshot(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	th.jobs = snap.Jobs
	return th
}

// do sends one request through the handler.
func (th *testHost) do(method, path, token, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "http://fleet"+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	th.handler.ServeHTTP(rec, req)
	return rec
}

// testLimits are serve's defaults with a smaller request cap.
func testLimits() httpapi.Limits {
	l := httpapi.DefaultLimits()
	l.MaxInFlight = 64
	return l
}
