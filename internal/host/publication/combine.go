package publication

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// combiner runs single publications that arrive together, from any
// workers, as the items of one batch transaction (ledger.Batch): each
// item keeps its own caller, fence, replay, receipt and refusal, and the
// statements and the commit are paid once for the batch. At most
// inFlight batches run at a time. A publication that arrives while they
// all run waits: when a slot frees, one waiting caller takes it and runs
// everything waiting then as the next batch, so no caller runs more than
// one batch and each is answered as soon as its own batch commits.
type combiner struct {
	pb    *Publisher
	slots chan struct{}
	mu    sync.Mutex
	queue []*combined
}

// combined is one publication waiting for, or in, a combined batch.
type combined struct {
	ctx    context.Context // its request's, for its span
	since  time.Time
	caller fleet.Caller
	op     string
	req    resource.Request
	taken  chan struct{} // closed when a batch takes it
	done   chan struct{} // closed when pub and err are its answer
	pub    Publication
	err    error
}

func newCombiner(pb *Publisher, inFlight int) *combiner {
	return &combiner{pb: pb, slots: make(chan struct{}, inFlight)}
}

// publish answers one publication, run in whichever combined batch takes
// it. The batch commits whether or not the caller is still waiting, as a
// publication whose caller went away after sending it may.
func (c *combiner) publish(ctx context.Context, caller fleet.Caller, op string, req resource.Request) (Publication, error) {
	w := &combined{ctx: ctx, since: time.Now(), caller: caller, op: op, req: req, taken: make(chan struct{}), done: make(chan struct{})}
	c.mu.Lock()
	c.queue = append(c.queue, w)
	c.mu.Unlock()
	for {
		// Once a batch has taken it, a publication only waits: trying for
		// a slot then would run empty batches.
		select {
		case <-w.taken:
			<-w.done
			return w.pub, w.err
		default:
		}
		select {
		case <-w.taken:
		case c.slots <- struct{}{}:
			c.runNext(context.WithoutCancel(ctx))
		}
	}
}

// runNext runs what waits as the next batch, in the slot its caller took,
// and frees the slot however the batch ends.
func (c *combiner) runNext(ctx context.Context) {
	defer func() { <-c.slots }()
	if batch := c.take(); len(batch) > 0 {
		c.run(ctx, batch)
	}
}

// waiting is how many publications wait for a batch to take them.
func (c *combiner) waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// take removes up to a batch's worth of queued publications, each of a
// different job (a job's second publication waits for the next batch, as
// it would wait for the first's lock).
func (c *combiner) take() []*combined {
	c.mu.Lock()
	defer c.mu.Unlock()
	var batch []*combined
	seen := map[string]bool{}
	left := c.queue[:0]
	for _, w := range c.queue {
		if len(batch) < wire.MaxBatchItems && !seen[w.op] {
			seen[w.op] = true
			batch = append(batch, w)
			close(w.taken)
			continue
		}
		left = append(left, w)
	}
	clear(c.queue[len(left):])
	c.queue = left
	return batch
}

// run publishes batch in one transaction. If the transaction fails as a
// whole, each publication runs alone, so that one item's failure is its
// own answer.
func (c *combiner) run(ctx context.Context, batch []*combined) {
	// Each is answered, if only with this, even if the batch panics.
	for _, w := range batch {
		w.err = fmt.Errorf("publication %s: its combined transaction ended without an answer", w.op)
	}
	defer func() {
		for _, w := range batch {
			close(w.done)
		}
	}()
	if len(batch) > 1 {
		callers := make([]fleet.Caller, len(batch))
		items := make([]ledger.JobCall[resource.Request], len(batch))
		for i, w := range batch {
			callers[i], items[i] = w.caller, ledger.JobCall[resource.Request]{OperationID: w.op, Request: w.req}
		}
		answers, err := c.pb.publishMany(ctx, callers, items)
		if err == nil {
			for i, a := range answers {
				batch[i].pub, batch[i].err = a.Value, a.Err
				batch[i].trace(len(batch))
			}
			return
		}
	}
	for _, w := range batch {
		w.pub, w.err = c.pb.publishAlone(ctx, w.caller, w.op, w.req)
	}
}

// trace records, in the publication's own trace, its span from arrival to
// answer: the batch's own span (fleet.publish-batch, naming every item's
// job) is in the trace of the request that ran it.
func (w *combined) trace(items int) {
	if !tracing.Enabled() {
		return
	}
	_, span := tracing.Tracer().Start(w.ctx, "fleet.publish", trace.WithTimestamp(w.since), trace.WithAttributes(
		tracing.OperationID.String(w.op), tracing.Generation.Int64(w.req.Generation), tracing.Worker.String(w.caller.ID),
		attribute.String("fleet.operation_key", w.req.OperationKey), attribute.Int("fleet.combined", items)))
	tracing.End(span, w.err)
}
