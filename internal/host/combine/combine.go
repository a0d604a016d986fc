// Package combine runs requests that arrive together, from any callers,
// as one batch: on PostgreSQL a host pays a transaction's statements, its
// pending-log row and its commit once for them rather than once each.
// The rooms that combine (publication, claims) say what a batch may hold
// and run it; this package only decides who waits and who runs.
//
// At most Slots batches run at a time; with Patience, a request takes a
// slot after the first only once it has waited that long. A request that
// arrives while they all run waits: when a slot frees, one waiting caller takes it and runs
// everything waiting then that fits as the next batch, so no caller runs
// more than one batch and each request is answered as soon as its own
// batch has run.
package combine

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Config is what a room combines and how.
type Config[T any] struct {
	// Slots is how many batches may run at once (at least 1).
	Slots int
	// Patience is how long a request waits while a batch runs before it
	// may start another in a further slot (0: at once). The first slot is
	// taken at once.
	Patience time.Duration
	// After is the clock Patience is measured on (time.After when nil).
	After func(time.Duration) <-chan time.Time
	// Fits reports whether item may join batch, the items taken before it
	// (never empty: the first request waiting always starts a batch).
	Fits func(item T, batch []T) bool
	// Run runs batch and answers each of its items (in the items
	// themselves). Its context is the caller's that took the slot, not
	// cancelled with it: a batch is not abandoned for one caller.
	Run func(ctx context.Context, batch []T)
	// DropGone drops a request whose caller's context ends before a batch
	// takes it (Do answers the context's error). Otherwise it is run all
	// the same.
	DropGone bool
}

// Combiner is one room's requests waiting for, or in, a batch.
type Combiner[T any] struct {
	cfg   Config[T]
	first chan struct{} // the slot taken at once
	more  chan struct{} // the further slots, taken after Patience
	mu    sync.Mutex
	queue []*entry[T]
}

// entry is one request waiting for, or in, a batch.
type entry[T any] struct {
	ctx   context.Context
	item  T
	taken chan struct{} // closed when a batch takes it, or it is dropped
	done  chan struct{} // closed when its batch has run, or it is dropped
	gone  bool          // dropped: its caller went away first
}

// New is a combiner of cfg's requests.
func New[T any](cfg Config[T]) *Combiner[T] {
	if cfg.After == nil {
		cfg.After = time.After
	}
	return &Combiner[T]{cfg: cfg, first: make(chan struct{}, 1), more: make(chan struct{}, max(cfg.Slots, 1)-1)}
}

// Do returns once a batch has run item (Run answered it), or, with
// DropGone, with ctx's error when its caller went away before a batch took
// it.
func (c *Combiner[T]) Do(ctx context.Context, item T) error {
	e := &entry[T]{ctx: ctx, item: item, taken: make(chan struct{}), done: make(chan struct{})}
	c.mu.Lock()
	c.queue = append(c.queue, e)
	c.mu.Unlock()
	var gone <-chan struct{}
	if c.cfg.DropGone {
		gone = ctx.Done()
	}
	var more chan struct{} // nil until the request may take a further slot
	var patient <-chan time.Time
	switch {
	case cap(c.more) == 0:
	case c.cfg.Patience <= 0:
		more = c.more
	default:
		patient = c.cfg.After(c.cfg.Patience)
	}
	for {
		// Once a batch has taken it, a request only waits: trying for a
		// slot then would run empty batches.
		select {
		case <-e.taken:
			<-e.done
			if e.gone {
				return ctx.Err()
			}
			return nil
		default:
		}
		select {
		case <-e.taken:
		case c.first <- struct{}{}:
			c.runNext(context.WithoutCancel(ctx), c.first)
		case more <- struct{}{}:
			c.runNext(context.WithoutCancel(ctx), more)
		case <-patient:
			more, patient = c.more, nil
		case <-gone:
			if c.drop(e) {
				return ctx.Err()
			}
			gone = nil // taken first: its batch answers it
		}
	}
}

// drop removes e from the queue unless a batch took it first.
func (c *Combiner[T]) drop(e *entry[T]) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.queue, e)
	if i < 0 {
		return false
	}
	c.queue = slices.Delete(c.queue, i, i+1)
	return true
}

// runNext runs what waits as the next batch, in the slot its caller took,
// and frees the slot however the batch ends (a panic included: it goes on
// up the caller's goroutine, as a request's own would).
func (c *Combiner[T]) runNext(ctx context.Context, slot chan struct{}) {
	defer func() { <-slot }()
	batch := c.take()
	if len(batch) == 0 {
		return
	}
	defer func() {
		for _, e := range batch {
			close(e.done)
		}
	}()
	items := make([]T, len(batch))
	for i, e := range batch {
		items[i] = e.item
	}
	c.cfg.Run(ctx, items)
}

// take removes the requests the next batch runs, in the order they
// arrived, and with DropGone answers those whose callers went away.
func (c *Combiner[T]) take() []*entry[T] {
	c.mu.Lock()
	defer c.mu.Unlock()
	var batch []*entry[T]
	var items []T
	left := c.queue[:0]
	for _, e := range c.queue {
		switch {
		case c.cfg.DropGone && e.ctx.Err() != nil:
			e.gone = true
			close(e.taken)
			close(e.done)
		case len(batch) == 0 || c.cfg.Fits(e.item, items):
			batch, items = append(batch, e), append(items, e.item)
			close(e.taken)
		default:
			left = append(left, e)
		}
	}
	clear(c.queue[len(left):])
	c.queue = left
	return batch
}

// Waiting is how many requests wait for a batch to take them.
func (c *Combiner[T]) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// Running is how many batches hold a slot now.
func (c *Combiner[T]) Running() int { return len(c.first) + len(c.more) }
