package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
	"time"

	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestTracesOverOTLP: with OTEL_EXPORTER_OTLP_ENDPOINT set, the host and
// a worker (real processes) send their spans over OTLP/HTTP to it, each
// under its service name, sharing trace ids (the worker's calls carry its
// trace context).
func TestTracesOverOTLP(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	traces := map[string]map[string]bool{} // service -> trace ids (hex)
	collectorSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req collector.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			service := ""
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					service = a.GetValue().GetStringValue()
				}
			}
			if traces[service] == nil {
				traces[service] = map[string]bool{}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					traces[service][string(s.TraceId)] = true
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(nil)
	}))
	defer collectorSrv.Close()
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + collectorSrv.URL, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_BSP_SCHEDULE_DELAY=100"}

	state := initState(t, sampleInput(t, nil))
	h := startHostFrom(t, binDir+"/fleet-host", env, state)
	startWorkerFrom(t, binDir+"/fleet-worker", env, h.URL, state, "worker-1").wait(t, 30*time.Second)
	h.cmd.Process.Signal(syscall.SIGTERM) // a clean stop flushes the host's spans
	select {
	case <-h.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the host did not stop")
	}
	mu.Lock()
	defer mu.Unlock()
	hostTraces, workerTraces := traces["fleet-host"], traces["fleet-worker"]
	shared := 0
	for id := range workerTraces {
		if hostTraces[id] {
			shared++
		}
	}
	if len(hostTraces) == 0 || len(workerTraces) == 0 || shared == 0 {
		t.Fatalf("traces by service: host %d, worker %d, shared %d (services seen: %v)", len(hostTraces), len(workerTraces), shared, keys(traces))
	}

}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
