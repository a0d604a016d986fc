package e2e

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/wire"
)

// jobsIn counts the snapshot's jobs by state.
func jobsIn(t *testing.T, h *hostProcess, operator string) map[wire.JobState]int {
	t.Helper()
	counts := map[wire.JobState]int{}
	for _, j := range getSnapshot(t, h, operator).Jobs {
		counts[j.State]++
	}
	return counts
}

// TestWorkerDrainsOnSIGTERM (issue 34): fleet-worker told to stop claims
// no more; the jobs it holds finish within --drain, or, past it, are
// handed back at once (queued again, their attempts not counted, nothing
// left reserved); either way it exits 0. (It used to print "context
// canceled" and leave its running jobs to go unresolved after their
// lease, holding their reservations until an operator reconciled them.)
func TestWorkerDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, delay, drain string
		want               map[wire.JobState]int
	}{
		{"FinishesWithinTheDrain", "2s", "30s", map[wire.JobState]int{wire.Completed: 2, wire.Queued: 2}},
		{"HandsBackPastTheDrain", "5m", "500ms", map[wire.JobState]int{wire.Queued: 4}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			state := initState(t, sampleInput(t, func(m map[string]any) { m["allowance"] = 1000 }))
			h := startHost(t, state)
			operator := credential(t, state, "operator")
			w := startWorker(t, h.URL, state, "worker-1", "--slots", "2", "--work-delay", c.delay, "--drain", c.drain)
			waitFor(t, 30*time.Second, "two jobs running", func() bool { return jobsIn(t, h, operator)[wire.Running] == 2 })
			before := map[string]wire.Job{}
			for _, j := range getSnapshot(t, h, operator).Jobs {
				before[j.OperationID] = j
			}
			stopped := time.Now()
			if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			w.wait(t, 60*time.Second)
			logText, _ := os.ReadFile(w.log.Name())
			if got := jobsIn(t, h, operator); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("after SIGTERM: %v; want %v\n%s", got, c.want, logText)
			}
			snap := getSnapshot(t, h, operator)
			if snap.Accounting.Reserved != 0 {
				t.Fatalf("%d credits still reserved after the worker stopped", snap.Accounting.Reserved)
			}
			if c.want[wire.Completed] == 0 {
				if took := time.Since(stopped); took > 20*time.Second {
					t.Fatalf("the worker took %s to hand its jobs back", took)
				}
				released := 0
				for _, j := range snap.Jobs {
					if b := before[j.OperationID]; b.State == wire.Running {
						released++
						if j.Attempts != 0 || j.Generation <= b.Generation || j.Reserved != 0 {
							t.Fatalf("a handed-back job: %+v (before: %+v)", j, b)
						}
					}
				}
				if released != 2 || !strings.Contains(string(logText), "handed the job back") {
					t.Fatalf("%d jobs handed back; want 2\n%s", released, logText)
				}
				var page wire.EventPage
				mustStatus(t, call(t, "GET", h.URL+"/admin/events?limit=500", operator, nil), 200).decode(t, &page)
				n := 0
				for _, e := range page.Events {
					if e.Kind == wire.EventReleased {
						n++
					}
				}
				if n != 2 {
					t.Fatalf("%d fleet.released events; want 2", n)
				}
			}
			// What is left runs to the end with another worker, and the
			// state verifies.
			startWorker(t, h.URL, state, "worker-2", "--slots", "4").wait(t, 60*time.Second)
			if got := jobsIn(t, h, operator); got[wire.Completed] != 4 {
				t.Fatalf("after a second worker: %v", got)
			}
			h.kill()
			if rep := verifyState(t, state); !rep.OK {
				t.Fatalf("verify: %+v", rep)
			}
		})
	}
}
