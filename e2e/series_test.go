package e2e

import (
	"syscall"
	"testing"
	"time"
)

// seriesSamples is the host's samples' times (unix seconds).
func seriesSamples(t *testing.T, h *hostProcess, operator string) []int64 {
	t.Helper()
	var res struct {
		Samples []struct {
			T int64 `json:"t"`
		} `json:"samples"`
	}
	mustStatus(t, call(t, "GET", h.URL+"/admin/series", operator, nil), 200).decode(t, &res)
	times := make([]int64, 0, len(res.Samples))
	for _, s := range res.Samples {
		times = append(times, s.T)
	}
	return times
}

// TestChartsKeepTheirHour (issue 34): the console's charts draw the hour
// before a host stopped when it serves the state again (the samples are
// kept in its state directory), not an empty chart.
func TestChartsKeepTheirHour(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	operator := credential(t, state, "operator")
	h := startHost(t, state)
	waitFor(t, 20*time.Second, "three samples", func() bool { return len(seriesSamples(t, h, operator)) >= 3 })
	before := seriesSamples(t, h, operator)
	h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the host did not stop on SIGTERM")
	}
	h = startHost(t, state)
	after := seriesSamples(t, h, operator)
	if len(after) < len(before) || after[0] != before[0] {
		t.Fatalf("after a restart the series starts at %v (%d samples); before it, at %d (%d samples)", after, len(after), before[0], len(before))
	}
}
