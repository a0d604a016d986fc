package store

import "github.com/fleet/fleet/internal/wire"

// CountedStates are the states JobCountByState counts job by job: every
// state but completed, the one a fleet's history grows in.
var CountedStates = func() []string {
	var out []string
	for _, s := range wire.JobStates {
		if s != wire.Completed {
			out = append(out, string(s))
		}
	}
	return out
}()

// WithCompleted adds to counts, JobCountByState's counts of CountedStates,
// the completed jobs: those of the enqueued jobs counted in no other state.
func WithCompleted(counts map[wire.JobState]int64, enqueued int64) map[wire.JobState]int64 {
	for _, n := range counts {
		enqueued -= n
	}
	if enqueued > 0 {
		counts[wire.Completed] = enqueued
	}
	return counts
}

// SavedCounts is a count of jobs by state (JobCountByState's), taken at
// TakenMS by the clock of the host that took it.
type SavedCounts struct {
	Counts  map[wire.JobState]int64
	TakenMS int64
}
