package e2e

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// gcPercent is the host's garbage collector target as its /metrics says.
func gcPercent(t *testing.T, h *hostProcess, operator string) int {
	t.Helper()
	metrics := string(mustStatus(t, call(t, "GET", h.URL+"/metrics", operator, nil), 200).Body)
	for _, line := range strings.Split(metrics, "\n") {
		if rest, ok := strings.CutPrefix(line, "go_gc_gogc_percent "); ok {
			n, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int(n)
		}
	}
	t.Fatal("no go_gc_gogc_percent in /metrics")
	return 0
}

// TestHostCollectsAt200: a serving host sets its garbage collector's
// target to 200 % growth, and an operator's GOGC wins over it.
func TestHostCollectsAt200(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	operator := credential(t, state, "operator")
	want := 200
	if v, ok := os.LookupEnv("GOGC"); ok { // the host inherits this test's environment
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("GOGC=%q in the test's environment", v)
		}
		want = n
	}
	h := startHost(t, state)
	if got := gcPercent(t, h, operator); got != want {
		t.Fatalf("the host collects at %d %%, want %d", got, want)
	}
	h.kill()
	h = startHostFrom(t, binDir+"/fleet-host", []string{"GOGC=150"}, state)
	if got := gcPercent(t, h, operator); got != 150 {
		t.Fatalf("with GOGC=150 the host collects at %d %%, want 150", got)
	}
}
