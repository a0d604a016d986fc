package host_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/host/claims"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// TestCombinedClaims: claims that admit, arriving from several workers
// while another runs, are taken together in one transaction, and each is
// still its own worker's: its jobs' documents assigned to it under its
// claim ids, each job admitted (or refused) as its worker's, a claim left
// without a job told why, a claim whose caller went away while it waited
// taking nothing, and a repeat under a claim's key answering it again. The
// database's writes are held back while the first claim runs, so the rest
// wait for the one slot (CombinedClaims 1).
func TestCombinedClaims(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		// Five jobs and credits for four: the combined claims' last
		// admission is refused at the fleet.
		f := newState(t, 40, 10, 6, func(m map[string]any) {
			m["sections"] = []string{"summary", "terms", "actions", "links", "overview"}
		})
		h := f.openWith(t, host.Options{CombinedClaims: 1}, nil)
		before := h.DB().Stats().Operations
		release := holdTable(t, f, "assignments")

		type call struct {
			who  fleet.Caller
			max  int
			key  string
			gone bool // its caller goes away while it waits
		}
		calls := []call{{caller("worker-0"), 1, "", false},
			{caller("worker-1"), 2, "6f1c3a4e-0000-4000-8000-000000000001", false}, {caller("worker-2"), 1, "", false},
			{caller("worker-5"), 1, "", true},
			{caller("worker-3"), 1, "", false}, {caller("worker-4"), 1, "", false}}
		res, errs := make([]wire.ClaimResult, len(calls)), make([]error, len(calls))
		gone, leave := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i, c := range calls {
			cctx := ctx
			if c.gone {
				cctx = gone
			}
			wg.Go(func() {
				res[i], errs[i] = h.Claims().Take(cctx, c.who, claims.Ask{Max: c.max, Key: c.key, Admit: true})
			})
			// Each arrives after the one before is running or waiting, so
			// the slots are taken in the calls' order.
			waitClaims(t, h, fmt.Sprintf("claim %d to arrive", i), func(running, waiting int) bool {
				return running == 1 && waiting == i
			})
		}
		leave()
		waitClaims(t, h, "the gone caller's claim to leave the queue", func(_, waiting int) bool { return waiting == len(calls)-2 })
		release()
		wg.Wait()

		if !errors.Is(errs[3], context.Canceled) || len(res[3].Jobs) != 0 {
			t.Errorf("the claim whose caller went away: %+v, %v, want nothing and context.Canceled", res[3], errs[3])
		}
		// worker-0 alone, then worker-1 (2), worker-2, worker-3 and
		// worker-4 (1 each) together, in that order, for the four jobs left.
		want := []int{1, 2, 1, -1, 1, 0}
		denied := 0
		for i, c := range calls {
			if i == 3 {
				continue
			}
			if errs[i] != nil || len(res[i].Jobs) != want[i] {
				t.Fatalf("%s's claim: %d jobs, %v; want %d", c.who.ID, len(res[i].Jobs), errs[i], want[i])
			}
			for _, j := range res[i].Jobs {
				if c.key != "" && !strings.HasPrefix(j.Claim.ClaimID, c.key+".") {
					t.Errorf("%s's job %s claimed under %s, not its key", c.who.ID, j.OperationID, j.Claim.ClaimID)
				}
				st := jobState(t, h, j.OperationID)
				if st.Worker != c.who.ID || st.Owner != c.who.ID {
					t.Errorf("%s's job %s held by %s, its document %s's", c.who.ID, j.OperationID, st.Worker, st.Owner)
				}
				adm := j.Admission
				if adm == nil || adm.Receipt.Caller != c.who.ID || adm.Receipt.OperationID != j.OperationID {
					t.Fatalf("%s's job %s admitted %+v, want its own receipt", c.who.ID, j.OperationID, adm)
				}
				if adm.Decision == wire.DecisionDeny {
					denied++
					if adm.Level != wire.LevelFleet || st.State != "refused" {
						t.Errorf("%s's job %s refused at %q, now %s", c.who.ID, j.OperationID, adm.Level, st.State)
					}
				} else if st.State != "running" {
					t.Errorf("%s's admitted job %s is %s", c.who.ID, j.OperationID, st.State)
				}
			}
		}
		if denied != 1 {
			t.Errorf("%d admissions refused, want the one past the allowance", denied)
		}
		if q := res[5].Queue; q != wire.QueueWaiting {
			t.Errorf("worker-4, left without a job while others run: queue %q, want waiting", q)
		}
		after := h.DB().Stats().Operations
		if n := after["claim-admit"].Writes - before["claim-admit"].Writes; n != 2 {
			t.Errorf("%d claim transactions, want 2: one alone, one for the four that waited", n)
		}

		// worker-1's claim repeated under its key: the same jobs and
		// decisions.
		again, err := h.Claims().Take(ctx, calls[1].who, claims.Ask{Max: 2, Key: calls[1].key, Repeat: true, Admit: true})
		if err != nil || len(again.Jobs) != 2 {
			t.Fatalf("worker-1's repeated claim: %+v, %v", again, err)
		}
		for k, j := range again.Jobs {
			was := res[1].Jobs[k]
			if j.OperationID != was.OperationID || j.Admission == nil || j.Admission.Receipt.ID != was.Admission.Receipt.ID {
				t.Errorf("repeated claim's job %d: %s %+v, was %s %+v", k, j.OperationID, j.Admission, was.OperationID, was.Admission)
			}
		}
		f.verify(t)
	})
}

// waitClaims waits, up to 30 s, until ok holds of the host's combined
// claim transactions running and the claims waiting for one.
func waitClaims(t *testing.T, h *host.Host, what string, ok func(running, waiting int) bool) {
	t.Helper()
	c := h.Claims()
	for deadline := time.Now().Add(30 * time.Second); !ok(c.Running(), c.Waiting()); {
		if time.Now().After(deadline) {
			t.Fatalf("waited for %s: %d running, %d waiting", what, c.Running(), c.Waiting())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestClaimsCombinedOnPostgres: with the host's default options, claims
// that admit arriving while the host's one combined transaction runs go
// together in the next on PostgreSQL; on SQLite each is a write of its
// own, whenever it arrives.
func TestClaimsCombinedOnPostgres(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 1000, 10, 4)
		h := f.open(t)
		before := h.DB().Stats().Operations
		release := holdTable(t, f, "assignments")
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for i := range errs {
			who := caller(fmt.Sprint("worker-", i+1))
			wg.Go(func() {
				res, err := h.Claims().Take(ctx, who, claims.Ask{Max: 1, Admit: true})
				if err == nil && len(res.Jobs) != 1 {
					err = fmt.Errorf("%d jobs, want 1", len(res.Jobs))
				}
				errs[i] = err
			})
			if storetest.OnPostgres(t) {
				// The first holds the one slot, waiting for the database;
				// the others wait for it.
				waitClaims(t, h, fmt.Sprintf("claim %d to arrive", i), func(running, waiting int) bool {
					return running == 1 && waiting == i
				})
			}
		}
		release()
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("claim %d: %v", i, err)
			}
		}
		after := h.DB().Stats().Operations
		want := int64(4) // SQLite
		if storetest.OnPostgres(t) {
			want = 2
		}
		if n := after["claim-admit"].Writes - before["claim-admit"].Writes; n != want {
			t.Errorf("%d claim transactions, want %d", n, want)
		}
		f.verify(t)
	})
}

// TestCombinedClaimsTraced: a claim taken with others has its own
// fleet.claim-admit span, with fleet.combined, in its own request's trace;
// the transaction's span is in the trace of the request that ran it; a
// claim alone has the one span. Not parallel: it records every span the
// process makes.
func TestCombinedClaimsTraced(t *testing.T) {
	exporter := tracetest.NewInMemoryExporter()
	stop := tracing.Install(sdktrace.NewSimpleSpanProcessor(exporter), "fleet-test")
	t.Cleanup(func() { stop(context.Background()) })
	storetest.Each(t, func(t *testing.T) {
		exporter.Reset()
		ctx := context.Background()
		f := newState(t, 1000, 10, 3)
		h := f.openWith(t, host.Options{CombinedClaims: 1}, nil)
		release := holdTable(t, f, "assignments")
		requests := make([]trace.SpanID, 3)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i := range requests {
			rctx, request := tracing.Tracer().Start(ctx, fmt.Sprint("request ", i))
			requests[i] = request.SpanContext().SpanID()
			who := caller(fmt.Sprint("worker-", i+1))
			wg.Go(func() {
				defer request.End()
				_, errs[i] = h.Claims().Take(rctx, who, claims.Ask{Max: 1, Admit: true})
			})
			waitClaims(t, h, fmt.Sprintf("claim %d to arrive", i), func(running, waiting int) bool {
				return running == 1 && waiting == i
			})
		}
		release()
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("claim %d: %v", i, err)
			}
		}
		byParent := map[trace.SpanID][]tracetest.SpanStub{}
		for _, s := range exporter.GetSpans() {
			if s.Name == "fleet.claim-admit" {
				byParent[s.Parent.SpanID()] = append(byParent[s.Parent.SpanID()], s)
			}
		}
		// The first ran alone: its transaction's span only.
		if spans := byParent[requests[0]]; len(spans) != 1 || spanAttr(spans[0], "fleet.combined") != "" {
			t.Errorf("the claim alone: claim spans %+v; want one, not combined", spans)
		}
		// The two that waited: each its own combined span, and one of them
		// the transaction's too.
		transactions := 0
		for i := 1; i < 3; i++ {
			combined := 0
			for _, s := range byParent[requests[i]] {
				if spanAttr(s, "fleet.combined") == "2" && spanAttr(s, string(tracing.Worker)) == fmt.Sprint("worker-", i+1) {
					combined++
				} else {
					transactions++
				}
			}
			if combined != 1 {
				t.Errorf("claim %d has %d combined claim spans, want 1", i, combined)
			}
		}
		if transactions != 1 {
			t.Errorf("%d transaction spans among the combined claims' traces, want 1", transactions)
		}
	})
}
