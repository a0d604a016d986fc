package combine_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/host/combine"
)

// recorder is a room whose first batch waits for release, and which
// records every batch it runs.
type recorder struct {
	mu      sync.Mutex
	batches [][]string
	release chan struct{}
	once    sync.Once
}

func (r *recorder) run(_ context.Context, batch []string) {
	r.once.Do(func() { <-r.release })
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, slices.Clone(batch))
}

// distinct lets an item join a batch that does not hold it yet, up to
// three items.
func distinct(item string, batch []string) bool {
	return len(batch) < 3 && !slices.Contains(batch, item)
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("waited for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRequestsThatWaitRunTogether: requests that arrive while the one
// slot runs wait, then go as one batch as far as they fit, the rest in the
// next; each Do returns once its own batch has run.
func TestRequestsThatWaitRunTogether(t *testing.T) {
	r := &recorder{release: make(chan struct{})}
	c := combine.New(combine.Config[string]{Slots: 1, Fits: distinct, Run: r.run})
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	do := func(item string) { wg.Go(func() { errs <- c.Do(context.Background(), item) }) }
	do("a")
	waitFor(t, "a to hold the slot alone", func() bool { return c.Running() == 1 && c.Waiting() == 0 })
	for i, item := range []string{"b", "c", "b", "d", "e"} {
		do(item)
		waitFor(t, item+" to wait", func() bool { return c.Waiting() == i+1 })
	}
	close(r.release)
	wg.Wait()
	want := [][]string{{"a"}, {"b", "c", "d"}, {"b", "e"}}
	if !slices.EqualFunc(r.batches, want, slices.Equal) {
		t.Errorf("batches %v, want %v", r.batches, want)
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a request answered %v", err)
		}
	}
	if c.Running() != 0 || c.Waiting() != 0 {
		t.Errorf("%d running and %d waiting after every batch ran", c.Running(), c.Waiting())
	}
}

// TestGoneCallers: with DropGone, a request whose caller goes away while
// it waits is answered with the context's error and never runs; without
// it, the request runs all the same.
func TestGoneCallers(t *testing.T) {
	for _, dropGone := range []bool{true, false} {
		r := &recorder{release: make(chan struct{})}
		c := combine.New(combine.Config[string]{Slots: 1, Fits: distinct, Run: r.run, DropGone: dropGone})
		var wg sync.WaitGroup
		wg.Go(func() { _ = c.Do(context.Background(), "a") })
		waitFor(t, "a to hold the slot", func() bool { return c.Running() == 1 })
		ctx, cancel := context.WithCancel(context.Background())
		var goneErr error
		wg.Go(func() { goneErr = c.Do(ctx, "gone") })
		waitFor(t, "gone to wait", func() bool { return c.Waiting() == 1 })
		cancel()
		if dropGone {
			waitFor(t, "gone to leave the queue", func() bool { return c.Waiting() == 0 })
		}
		close(r.release)
		wg.Wait()
		ran := slices.ContainsFunc(r.batches, func(b []string) bool { return slices.Contains(b, "gone") })
		if dropGone && (ran || !errors.Is(goneErr, context.Canceled)) {
			t.Errorf("dropping: the gone caller's request ran %v, answered %v; want not run, context.Canceled", ran, goneErr)
		}
		if !dropGone && (!ran || goneErr != nil) {
			t.Errorf("not dropping: the gone caller's request ran %v, answered %v; want run, nil", ran, goneErr)
		}
	}
}

// TestBatchThatPanics: a batch that panics still lets every request in it
// return and frees its slot; the panic goes on up the goroutine that ran
// the batch.
func TestBatchThatPanics(t *testing.T) {
	hold := make(chan struct{})
	var first sync.Once
	c := combine.New(combine.Config[string]{Slots: 1, Fits: distinct, Run: func(_ context.Context, batch []string) {
		first.Do(func() { <-hold })
		if slices.Contains(batch, "b") {
			panic("batch b")
		}
	}})
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Do(context.Background(), "a") })
	waitFor(t, "a to hold the slot", func() bool { return c.Running() == 1 })
	panicked := make([]bool, 2)
	for i, item := range []string{"b", "c"} {
		wg.Go(func() {
			defer func() { panicked[i] = recover() != nil }()
			_ = c.Do(context.Background(), item)
		})
	}
	waitFor(t, "b and c to wait", func() bool { return c.Waiting() == 2 })
	close(hold)
	wg.Wait()
	if panicked[0] == panicked[1] {
		t.Fatalf("panicked: %v, want the one that ran the batch only", panicked)
	}
	if c.Running() != 0 {
		t.Fatal("the slot is still taken after its batch panicked")
	}
	if err := c.Do(context.Background(), "d"); err != nil {
		t.Fatalf("a request after the panic: %v", err)
	}
}

// TestPatienceBeforeAFurtherSlot: with two slots and patience, a request
// that arrives while a batch runs waits for it, the second slot free,
// until its patience has passed; then it takes the second slot with
// whatever waits by then. Without patience it takes it at once.
func TestPatienceBeforeAFurtherSlot(t *testing.T) {
	r := &recorder{release: make(chan struct{})}
	run := func(ctx context.Context, batch []string) { // only a's batch waits for release
		if slices.Contains(batch, "a") {
			r.run(ctx, batch)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.batches = append(r.batches, slices.Clone(batch))
	}
	patience := make(chan time.Time)
	asked := make(chan time.Duration, 4)
	c := combine.New(combine.Config[string]{Slots: 2, Patience: 2 * time.Millisecond, Fits: distinct, Run: run,
		After: func(d time.Duration) <-chan time.Time { asked <- d; return patience }})
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Do(context.Background(), "a") })
	waitFor(t, "a to hold the first slot", func() bool { return c.Running() == 1 && c.Waiting() == 0 })
	for i, item := range []string{"b", "c"} {
		wg.Go(func() { _ = c.Do(context.Background(), item) })
		waitFor(t, item+" to wait", func() bool { return c.Waiting() == i+1 })
	}
	select {
	case d := <-asked:
		if d != 2*time.Millisecond {
			t.Fatalf("patience asked of the clock: %v, want 2ms", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no request asked the clock for its patience")
	}
	if c.Running() != 1 || c.Waiting() != 2 {
		t.Fatalf("before patience passed: %d running, %d waiting; want a alone running, b and c waiting", c.Running(), c.Waiting())
	}
	patience <- time.Time{} // one waiter's patience passes: it starts b and c in the second slot
	waitFor(t, "b and c to run beside a", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.batches) == 1
	})
	r.mu.Lock()
	second := slices.Clone(r.batches[0])
	r.mu.Unlock()
	if !slices.Equal(second, []string{"b", "c"}) || c.Waiting() != 0 {
		t.Fatalf("the second slot ran %v with %d left waiting, a still running; want [b c]", second, c.Waiting())
	}
	close(r.release)
	wg.Wait()

	// Without patience the second slot is taken at once.
	r = &recorder{release: make(chan struct{})}
	c = combine.New(combine.Config[string]{Slots: 2, Fits: distinct, Run: r.run})
	wg.Go(func() { _ = c.Do(context.Background(), "a") })
	waitFor(t, "a to hold the first slot", func() bool { return c.Running() == 1 })
	wg.Go(func() { _ = c.Do(context.Background(), "b") })
	waitFor(t, "b to run beside a at once", func() bool { return c.Running() == 2 })
	close(r.release)
	wg.Wait()
}
