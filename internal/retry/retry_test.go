package retry

import (
	"testing"
	"time"
)

// TestWaitsGrowAndSpread: the waits double from first to the ceiling,
// each within half its interval either way, and two loops that start
// together do not wait alike (a fleet retries spread out, not in
// lockstep).
func TestWaitsGrowAndSpread(t *testing.T) {
	a, b := New(100*time.Millisecond, 2*time.Second), New(100*time.Millisecond, 2*time.Second)
	interval, differ := 100*time.Millisecond, 0
	for range 10 {
		wa, wb := a.NextBackOff(), b.NextBackOff()
		for _, w := range []time.Duration{wa, wb} {
			if lo, hi := interval/2, interval*3/2; w < lo || w > hi {
				t.Fatalf("a wait of %s for an interval of %s; want %s to %s", w, interval, lo, hi)
			}
		}
		if wa != wb {
			differ++
		}
		interval = min(2*interval, 2*time.Second)
	}
	if differ < 8 {
		t.Fatalf("two loops waited alike %d times in 10: no jitter", 10-differ)
	}
}
