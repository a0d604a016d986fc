package publication

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/combine"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// Single publications that arrive together, from any workers, run as the
// items of one batch transaction (ledger.Batch), combined by package
// combine: each item keeps its own caller, fence, replay, receipt and
// refusal, and the statements and the commit are paid once for the batch.
// A batch holds up to wire.MaxBatchItems publications, each of a
// different job (a job's second publication waits for the next batch, as
// it would wait for the first's lock). A publication whose caller goes
// away while it waits is still written, as one whose caller went away
// after sending it may be.

// combined is one publication waiting for, or in, a combined batch.
type combined struct {
	ctx    context.Context // its request's, for its span
	since  time.Time
	caller fleet.Caller
	op     string
	req    resource.Request
	pub    Publication
	err    error
}

func newCombiner(pb *Publisher, inFlight int, patience time.Duration) *combine.Combiner[*combined] {
	return combine.New(combine.Config[*combined]{Slots: inFlight, Patience: patience, Fits: fitsBatch, Run: pb.runCombined})
}

// fitsBatch: a batch takes up to a batch call's items, each of its own job.
func fitsBatch(w *combined, batch []*combined) bool {
	return len(batch) < wire.MaxBatchItems && !slices.ContainsFunc(batch, func(b *combined) bool { return b.op == w.op })
}

// publishCombined answers one publication, run in whichever combined
// batch takes it.
func (pb *Publisher) publishCombined(ctx context.Context, caller fleet.Caller, op string, req resource.Request) (Publication, error) {
	w := &combined{ctx: ctx, since: time.Now(), caller: caller, op: op, req: req}
	if err := pb.combiner.Do(ctx, w); err != nil {
		return Publication{}, err
	}
	return w.pub, w.err
}

// runCombined publishes batch in one transaction. If the transaction
// fails as a whole, each publication runs alone, so that one item's
// failure is its own answer.
func (pb *Publisher) runCombined(ctx context.Context, batch []*combined) {
	// Each is answered, if only with this, even if the batch panics.
	for _, w := range batch {
		w.err = fmt.Errorf("publication %s: its combined transaction ended without an answer", w.op)
	}
	if len(batch) > 1 {
		callers := make([]fleet.Caller, len(batch))
		items := make([]ledger.JobCall[resource.Request], len(batch))
		for i, w := range batch {
			callers[i], items[i] = w.caller, ledger.JobCall[resource.Request]{OperationID: w.op, Request: w.req}
		}
		answers, err := pb.publishMany(ctx, callers, items)
		if err == nil {
			for i, a := range answers {
				batch[i].pub, batch[i].err = a.Value, a.Err
				batch[i].trace(len(batch))
			}
			return
		}
	}
	for _, w := range batch {
		w.pub, w.err = pb.publishAlone(ctx, w.caller, w.op, w.req)
	}
}

// trace records, in the publication's own trace, its span from arrival to
// answer: the batch's own span (fleet.publish-batch, naming every item's
// job) is in the trace of the request that ran it.
func (w *combined) trace(items int) {
	tracing.Since(w.ctx, "fleet.publish", w.since, w.err, tracing.OperationID.String(w.op), tracing.Generation.Int64(w.req.Generation),
		tracing.Worker.String(w.caller.ID), attribute.String("fleet.operation_key", w.req.OperationKey), attribute.Int("fleet.combined", items))
}
