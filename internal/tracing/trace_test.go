package tracing_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet/fleet/internal/hosttest"
	"github.com/fleet/fleet/internal/httpapi"
	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/worker"
)

// TestOneJobIsOneTrace runs a real host over real HTTP and a real worker,
// with spans going to an in-memory exporter: the worker's job span, its
// calls, the host's request spans, its operation spans and their commits
// form one trace, each span the child of the one before, and the host's
// spans carry the operation id and the claim.
func TestOneJobIsOneTrace(t *testing.T) {
	ctx := context.Background()
	exporter := tracetest.NewInMemoryExporter()
	stop := tracing.Install(sdktrace.NewSimpleSpanProcessor(exporter), "fleet-test")
	defer stop(ctx)

	state := filepath.Join(t.TempDir(), "state")
	in, err := input.Parse([]byte(`{"document":"Trace me. It must hold.","sections":["summary"],"allowance":50,"concurrency":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := hosttest.Init(ctx, state, "", in); err != nil {
		t.Fatal(err)
	}
	h, err := hosttest.Open(ctx, state, "")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.Start(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewServer(tracing.Handler(httpapi.New(h, quiet, httpapi.DefaultLimits()).Handler(), "fleet-host"))
	defer srv.Close()
	token, err := statedir.ReadCredential(filepath.Join(state, "credentials", "worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	// A separate dispatch, so that the admission is one of the job's own
	// calls (a claim that admits is the claim's trace, before the job's).
	if err := worker.New(worker.Config{HostURL: srv.URL, Token: token, Slots: 1, SeparateDispatch: true, Log: quiet}).Run(ctx); err != nil {
		t.Fatal(err)
	}

	spans := exporter.GetSpans()
	byID := map[trace.SpanID]tracetest.SpanStub{}
	var job *tracetest.SpanStub
	for i, s := range spans {
		byID[s.SpanContext.SpanID()] = s
		if s.Name == "fleet-worker.job" {
			job = &spans[i]
		}
	}
	if job == nil {
		t.Fatalf("no job span among %d spans", len(spans))
	}
	op := attr(*job, string(tracing.OperationID))
	// Every host span of the job's operation is in the job's trace, and
	// its ancestors lead to the job span.
	want := map[string]bool{"fleet.dispatch-allow": false, "fleet.publish": false, "fleet.commit": false,
		"POST /v1/jobs/:op/dispatch": false, "POST /v1/jobs/:op/publish": false}
	for _, s := range spans {
		if s.SpanContext.TraceID() != job.SpanContext.TraceID() {
			if attr(s, string(tracing.OperationID)) == op {
				t.Errorf("span %s of the job's operation is in another trace", s.Name)
			}
			continue
		}
		if _, ok := want[s.Name]; ok {
			want[s.Name] = true
		}
		if !descends(s, job.SpanContext.SpanID(), byID) {
			t.Errorf("span %s of the job's trace does not descend from the job span", s.Name)
		}
		switch s.Name {
		case "fleet.dispatch-allow":
			if attr(s, string(tracing.OperationID)) != op || attr(s, string(tracing.ClaimID)) == "" {
				t.Errorf("the dispatch span lacks the operation id or the claim: %v", s.Attributes)
			}
		case "fleet.publish":
			if attr(s, string(tracing.OperationID)) != op {
				t.Errorf("the publish span lacks the operation id: %v", s.Attributes)
			}
		case "fleet.commit":
			if p := byID[s.Parent.SpanID()].Name; p != "fleet.dispatch-allow" && p != "fleet.publish" {
				t.Errorf("a commit span's parent is %q", p)
			}
		}
	}
	for name, seen := range want {
		if !seen {
			t.Errorf("the job's trace has no %s span", name)
		}
	}
	if t.Failed() {
		for _, s := range spans {
			t.Logf("%s trace %s parent %s", s.Name, s.SpanContext.TraceID(), byID[s.Parent.SpanID()].Name)
		}
	}
}

func attr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.Emit()
		}
	}
	return ""
}

// descends reports whether s is root or one of root's descendants.
func descends(s tracetest.SpanStub, root trace.SpanID, byID map[trace.SpanID]tracetest.SpanStub) bool {
	for range 20 {
		if s.SpanContext.SpanID() == root {
			return true
		}
		parent, ok := byID[s.Parent.SpanID()]
		if !ok {
			return false
		}
		s = parent
	}
	return false
}

// TestOffUnlessAsked: without an OTLP endpoint (or with OTEL_SDK_DISABLED)
// Setup installs nothing, and the handler and transport are the ones
// given, so tracing costs nothing while off.
func TestOffUnlessAsked(t *testing.T) {
	for _, env := range []map[string]string{
		{},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"},
	} {
		for _, v := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"} {
			t.Setenv(v, env[v])
		}
		stop, err := tracing.Setup(context.Background(), "fleet-test")
		if err != nil {
			t.Fatal(err)
		}
		handler := http.NotFoundHandler()
		if tracing.Requested() || tracing.Enabled() || fmt.Sprint(tracing.Handler(handler, "x")) != fmt.Sprint(handler) ||
			tracing.Transport(http.DefaultTransport) != http.DefaultTransport {
			t.Fatalf("with %v tracing is on", env)
		}
		stop(context.Background())
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	if !tracing.Requested() {
		t.Fatal("an OTLP endpoint did not ask for traces")
	}
}
