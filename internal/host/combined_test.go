package host_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/host/publication"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// TestCombinedPublications: single publications that arrive while another
// runs are run together as one batch transaction, and each still gets its
// own caller's answer: its fence (another worker's publication of a job is
// superseded), its replay, its refusal (a key bound to another request).
// The database's writes are held back while the first publication runs,
// so the rest wait for the one slot (CombinedPublications 1). Each
// publication's span is in its own request's trace. Not parallel: it
// records every span the process makes.
func TestCombinedPublications(t *testing.T) {
	exporter := tracetest.NewInMemoryExporter()
	stop := tracing.Install(sdktrace.NewSimpleSpanProcessor(exporter), "fleet-test")
	t.Cleanup(func() { stop(context.Background()) })
	storetest.Each(t, func(t *testing.T) {
		exporter.Reset()
		ctx := context.Background()
		f := newState(t, 1000, 10, 2, func(m map[string]any) {
			m["sections"] = []string{"summary", "terms", "actions", "links", "overview"}
		})
		h := f.openWith(t, host.Options{CombinedPublications: 1}, nil)
		w1, w2 := caller("worker-1"), caller("worker-2")
		var jobs []wire.ClaimedJob
		for range 5 {
			j := claim(t, h, w1)
			dispatch(t, h, w1, j)
			jobs = append(jobs, j)
		}
		// Job 3's key k3 is bound first, to a request that expects another
		// version.
		stale := publishReq(t, h, jobs[3], "k3")
		stale.ExpectedVersion += 5
		if pub, err := h.Publications().Publish(ctx, w1, jobs[3].OperationID, canon(t, stale)); err != nil ||
			pub.Outcome.Status != wire.StatusVersionConflict {
			t.Fatalf("publish job 3 expecting another version: %+v, %v", pub, err)
		}
		before := h.DB().Stats().Operations

		release := holdWrites(t, f)
		type call struct {
			who fleet.Caller
			job int
			key string
		}
		calls := []call{{w1, 0, "k0"}, {w1, 1, "k1"}, {w1, 1, "k1"}, {w2, 2, "k2"}, {w1, 3, "k3"}, {w1, 4, "k4"}}
		pubs, errs := make([]publication.Publication, len(calls)), make([]error, len(calls))
		requests := make([]trace.SpanID, len(calls))
		// Their callers go away while they wait: each is written all the
		// same, the one that runs the batch included.
		gone, leave := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i, c := range calls {
			req := canon(t, publishReq(t, h, jobs[c.job], c.key))
			rctx, request := tracing.Tracer().Start(gone, fmt.Sprint("request ", i))
			requests[i] = request.SpanContext().SpanID()
			wg.Go(func() {
				defer request.End()
				pubs[i], errs[i] = h.Publications().Publish(rctx, c.who, jobs[c.job].OperationID, req)
			})
			if i == 0 {
				// The first holds the slot alone, waiting for the database,
				// before the others arrive: they then wait for it.
				waitPublications(t, h, "the first publication to hold the slot alone", func(running, waiting int) bool {
					return running == 1 && waiting == 0
				})
			}
		}
		waitPublications(t, h, fmt.Sprintf("%d publications waiting for a batch", len(calls)-1), func(_, waiting int) bool {
			return waiting >= len(calls)-1
		})
		leave()
		release()
		wg.Wait()

		for _, i := range []int{0, 5} {
			if errs[i] != nil || pubs[i].Outcome.Status != wire.StatusPublished {
				t.Errorf("job %d: %+v, %v, want published", calls[i].job, pubs[i].Outcome, errs[i])
			}
		}
		// Job 1's two identical requests: one published, one replayed, the
		// same answer.
		for i := 1; i <= 2; i++ {
			if errs[i] != nil {
				t.Fatalf("publish job 1: %v", errs[i])
			}
		}
		if pubs[1].Replayed == pubs[2].Replayed || string(pubs[1].Raw) != string(pubs[2].Raw) ||
			pubs[1].Outcome.Status != wire.StatusPublished {
			t.Errorf("job 1's two requests: %+v and %+v, want one published and one replayed, alike", pubs[1], pubs[2])
		}
		// Worker 2 holds no claim on job 2: its own caller, not the
		// batch's first, is what the fence checks.
		if errs[3] != nil || pubs[3].Outcome.Status != wire.StatusSuperseded {
			t.Errorf("worker 2's publication of worker 1's job: %+v, %v, want superseded", pubs[3].Outcome, errs[3])
		}
		// Job 3's key, bound to another request: refused, and the job still
		// runs.
		wantCode(t, errs[4], wire.CodeOperationConflict)
		if state := jobState(t, h, jobs[3].OperationID).State; state != "running" {
			t.Errorf("job 3 after its refused publication: %s, want running", state)
		}

		// Six publications in at most three transactions, one of them a
		// combined batch: the first alone, then the five that waited (job
		// 1's second request alone after its first's batch, unless the
		// first ran alone).
		after := h.DB().Stats().Operations
		batches := after["publish-batch"].Writes - before["publish-batch"].Writes
		alone := after["publish"].Writes - before["publish"].Writes
		if batches != 1 || alone < 1 || alone > 2 {
			t.Errorf("%d combined batches and %d publications alone, want 1 and 1 or 2", batches, alone)
		}
		// Each request has its publication's span, and one of them the
		// combined batch's.
		spans := map[trace.SpanID][]tracetest.SpanStub{}
		for _, s := range exporter.GetSpans() {
			spans[s.Parent.SpanID()] = append(spans[s.Parent.SpanID()], s)
		}
		var batchSpans, combinedSpans int
		for i, id := range requests {
			var publish int
			for _, s := range spans[id] {
				switch s.Name {
				case "fleet.publish":
					publish++
					if op := spanAttr(s, string(tracing.OperationID)); op != jobs[calls[i].job].OperationID {
						t.Errorf("request %d's publish span names job %q", i, op)
					}
					if spanAttr(s, "fleet.combined") != "" {
						combinedSpans++
					}
				case "fleet.publish-batch":
					batchSpans++
				}
			}
			if publish != 1 {
				t.Errorf("request %d has %d publish spans, want 1", i, publish)
			}
		}
		if batchSpans != 1 || combinedSpans < 4 {
			t.Errorf("%d batch spans and %d publish spans of a combined batch, want 1 and 4 or 5", batchSpans, combinedSpans)
		}
		f.verify(t)
	})
}

// TestPublicationsCombinedOnPostgres: with the host's default options,
// single publications that wait while the host's two combined
// transactions run go together in the next on PostgreSQL; on SQLite each
// is a write of its own, whenever it arrives.
func TestPublicationsCombinedOnPostgres(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		f := newState(t, 1000, 10, 2)
		h := f.open(t)
		w1 := caller("worker-1")
		var reqs []resource.Request
		var ops []string
		for range 4 {
			j := claim(t, h, w1)
			dispatch(t, h, w1, j)
			reqs, ops = append(reqs, canon(t, publishReq(t, h, j, "k-"+j.Section))), append(ops, j.OperationID)
		}
		before := h.DB().Stats().Operations
		release := holdWrites(t, f)
		errs := make([]error, len(reqs))
		var wg sync.WaitGroup
		for i := range reqs {
			wg.Go(func() { _, errs[i] = h.Publications().Publish(ctx, w1, ops[i], reqs[i]) })
			if i < 2 && storetest.OnPostgres(t) {
				// The first two each hold one of the host's two slots alone,
				// waiting for the database, before the other two arrive.
				waitPublications(t, h, fmt.Sprintf("publication %d to hold a slot alone", i), func(running, waiting int) bool {
					return running == i+1 && waiting == 0
				})
			}
		}
		if storetest.OnPostgres(t) {
			waitPublications(t, h, "two publications waiting for a batch", func(_, waiting int) bool { return waiting >= 2 })
		}
		release()
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("publication %d: %v", i, err)
			}
		}
		after := h.DB().Stats().Operations
		batches := after["publish-batch"].Writes - before["publish-batch"].Writes
		alone := after["publish"].Writes - before["publish"].Writes
		want := [2]int64{0, 4} // SQLite
		if storetest.OnPostgres(t) {
			want = [2]int64{1, 2}
		}
		if batches != want[0] || alone != want[1] {
			t.Errorf("%d combined transactions and %d publications alone, want %d and %d", batches, alone, want[0], want[1])
		}
		f.verify(t)
	})
}

func spanAttr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.Emit()
		}
	}
	return ""
}

// holdWrites holds back every publication's write from beside the host
// until release: on PostgreSQL a lock on the mutations table that each
// publication's insert waits for (its lock_timeout reruns it meanwhile), on
// SQLite the write lock.
// waitPublications waits, up to 30 s, until ok holds of the host's
// combined batches running and the publications waiting for one.
func waitPublications(t *testing.T, h *host.Host, what string, ok func(running, waiting int) bool) {
	t.Helper()
	pb := h.Publications()
	for deadline := time.Now().Add(30 * time.Second); !ok(pb.Running(), pb.Waiting()); {
		if time.Now().After(deadline) {
			t.Fatalf("waited for %s: %d batches running, %d publications waiting", what, pb.Running(), pb.Waiting())
		}
		time.Sleep(time.Millisecond)
	}
}

func holdWrites(t *testing.T, f fixture) (release func()) {
	t.Helper()
	return holdTable(t, f, "mutations")
}

// holdTable is holdWrites with the lock, on PostgreSQL, on table.
func holdTable(t *testing.T, f fixture, table string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := f.rawDatabase(t).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	begin := []string{"BEGIN IMMEDIATE"}
	if f.database != "" {
		begin = []string{"BEGIN", "LOCK TABLE " + table + " IN EXCLUSIVE MODE"}
	}
	for _, q := range begin {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatal(fmt.Errorf("%s: %w", q, err))
		}
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
				t.Error(err)
			}
			if err := conn.Close(); err != nil && err != sql.ErrConnDone {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	return release
}
