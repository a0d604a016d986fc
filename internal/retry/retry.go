// Package retry is the one retry policy of every loop that waits before
// trying again (a worker's calls to its host, a model call, fleetctl's
// event stream, PostgreSQL's listener): exponential, doubling from a first
// wait to a ceiling, each wait jittered by half either way, so a fleet
// whose host restarts does not come back in lockstep.
package retry

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Jitter is how far each wait may fall either side of its interval.
const Jitter = 0.5

// New is a backoff from first, doubling up to ceiling (each wait within
// Jitter of its interval). Not safe for concurrent use: one per loop.
func New(first, ceiling time.Duration) *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{InitialInterval: first, RandomizationFactor: Jitter, Multiplier: 2, MaxInterval: ceiling}
}
