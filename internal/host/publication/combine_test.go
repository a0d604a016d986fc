package publication

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/resource"
)

// TestCombinerAnswersWhenItsBatchPanics: a batch that panics (here, a
// publisher with no ledger) still answers every publication in it with an
// error and frees its slot, so the publications after it are not left
// waiting for good. The panic itself goes on up the goroutine that ran
// the batch, as a single publication's would.
func TestCombinerAnswersWhenItsBatchPanics(t *testing.T) {
	c := newCombiner(&Publisher{}, 1)
	c.slots <- struct{}{} // the one slot busy, so both wait and go in one batch
	var wg sync.WaitGroup
	errs := make([]error, 2)
	panicked := make([]bool, 2)
	for i, op := range []string{"job-a", "job-b"} {
		wg.Go(func() {
			defer func() { panicked[i] = recover() != nil }()
			_, errs[i] = c.publish(context.Background(), fleet.Caller{ID: "worker-1"}, op, resource.Request{})
		})
	}
	for deadline := time.Now().Add(30 * time.Second); c.waiting() < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("%d publications waiting, want 2", c.waiting())
		}
		time.Sleep(time.Millisecond)
	}
	<-c.slots
	wg.Wait()
	if panicked[0] == panicked[1] {
		t.Fatalf("panicked: %v, want the one that ran the batch only", panicked)
	}
	for i := range errs {
		if !panicked[i] && errs[i] == nil {
			t.Errorf("publication %d: no error from a batch that panicked", i)
		}
	}
	select {
	case c.slots <- struct{}{}:
	default:
		t.Error("the slot is still taken after its batch panicked")
	}
}
