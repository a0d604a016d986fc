package e2e

import (
	"os"
	"strconv"
	"testing"
)

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
	if got := int(metricValue(t, h, operator, "go_gc_gogc_percent")); got != want {
		t.Fatalf("the host collects at %d %%, want %d", got, want)
	}
	h.kill()
	h = startHostFrom(t, binDir+"/fleet-host", []string{"GOGC=150"}, state)
	if got := int(metricValue(t, h, operator, "go_gc_gogc_percent")); got != 150 {
		t.Fatalf("with GOGC=150 the host collects at %d %%, want 150", got)
	}
}
