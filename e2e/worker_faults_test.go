package e2e

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/crash"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestWorkerKilled: a worker SIGKILLed after its claim, after its dispatch,
// or with its publication committed but unread. Other workers and the
// operator finish the fleet; the dead worker's job is published exactly
// once, and only the publication it committed before dying counts. After
// its claim is both a claim that admitted its job (the default: the job
// is running, as after a dispatch) and one that did not
// (--separate-dispatch: the job is claimed, its lapse an attempt).
func TestWorkerKilled(t *testing.T) {
	t.Parallel()
	for _, point := range append(slices.Clone(crash.WorkerPoints), "worker.after-claim/separate-dispatch") {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			point, separate := strings.CutSuffix(point, "/separate-dispatch")
			var args []string
			if separate {
				args = []string{"--separate-dispatch"}
			}
			admitted := point == "worker.after-dispatch" || point == "worker.after-claim" && !separate
			state := initState(t, sampleInput(t, func(m map[string]any) { m["allowance"] = 200 }))
			h := startHost(t, state, "--lease", "500ms")
			op := credential(t, state, "operator")
			dead := startWorkerFrom(t, filepath.Join(binDir, "crash", "fleet-worker"), []string{crash.EnvPoint + "=" + point},
				h.URL, state, "worker-1", args...)
			select {
			case <-dead.done:
			case <-time.After(20 * time.Second):
				t.Fatal("the worker never reached its crash point")
			}
			if ws, ok := dead.err.(*exec.ExitError); !ok || ws.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("worker ended with %v, want SIGKILL", dead.err)
			}
			startWorker(t, h.URL, state, "worker-2").wait(t, 30*time.Second)
			waitSettled(t, h, op)
			s := getSnapshot(t, h, op)
			for _, j := range s.Jobs {
				if j.State == wire.Unresolved {
					mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+j.OperationID+"/requeue", op, nil), 200)
				}
			}
			startWorker(t, h.URL, state, "worker-3").wait(t, 30*time.Second)
			s = getSnapshot(t, h, op)
			db := openDB(t, state)
			byDead := count(t, db, `SELECT COUNT(*) FROM mutations WHERE caller = 'worker-1'`)
			for _, j := range s.Jobs {
				if j.State != wire.Completed {
					t.Fatalf("job %s is %s", j.OperationID, j.State)
				}
			}
			switch point {
			case "worker.mid-publish":
				if byDead != 1 {
					t.Fatalf("the dead worker's committed publication: %d mutations", byDead)
				}
			default:
				if byDead != 0 {
					t.Fatalf("a dead worker wrote %d mutations", byDead)
				}
			}
			// A worker killed with its job admitted held a reservation;
			// requeue settled it as spent, so one report was paid for twice.
			wantSpent := int64(4 * 20)
			if admitted {
				wantSpent += 20
			}
			if s.Mutations != 4 || s.Accounting.Spent != wantSpent || s.Accounting.Reserved != 0 {
				t.Fatalf("mutations %d accounting %+v", s.Mutations, s.Accounting)
			}
			// A worker killed after its claim, before dispatch, cost its job
			// an attempt (its lease lapsed); the job still completed.
			if point == "worker.after-claim" && separate {
				lapsed := 0
				for _, j := range s.Jobs {
					var d wire.JobDetail
					mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+j.OperationID, op, nil), 200).decode(t, &d)
					if len(d.AttemptLog) == 1 && d.AttemptLog[0].Worker == "worker-1" && d.AttemptLog[0].Reason == "the lease expired before dispatch" {
						lapsed++
					}
				}
				if lapsed != 1 {
					t.Fatalf("%d jobs record the killed worker's lapsed claim as an attempt, want 1", lapsed)
				}
			}
			checkInvariants(t, state, "", h.KernelKey)
		})
	}
}

// TestPausedWorkerSuperseded: a worker paused past its lease while running,
// whose job the operator requeued and another worker completed, is
// superseded when it resumes and publishes; a worker paused while holding a
// claim finds it stale.
func TestPausedWorkerSuperseded(t *testing.T) {
	t.Parallel()
	t.Run("Running", func(t *testing.T) {
		t.Parallel()
		state := initState(t, sampleInput(t, func(m map[string]any) { m["sections"] = []string{"summary"} }))
		h := startHost(t, state, "--lease", "300ms")
		op := credential(t, state, "operator")
		slow := startWorker(t, h.URL, state, "worker-1", "--work-delay", "1500ms")
		waitFor(t, 10*time.Second, "running", func() bool { return getSnapshot(t, h, op).Jobs[0].State == wire.Running })
		slow.cmd.Process.Signal(syscall.SIGSTOP)
		waitFor(t, 10*time.Second, "unresolved", func() bool { return getSnapshot(t, h, op).Jobs[0].State == wire.Unresolved })
		mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+getSnapshot(t, h, op).Jobs[0].OperationID+"/requeue", op, nil), 200)
		startWorker(t, h.URL, state, "worker-2").wait(t, 30*time.Second)
		slow.cmd.Process.Signal(syscall.SIGCONT)
		slow.wait(t, 30*time.Second)
		db := openDB(t, state)
		if n := count(t, db, `SELECT COUNT(*) FROM mutations WHERE caller = 'worker-1'`); n != 0 {
			t.Fatal("the paused worker's write was accepted after its job was handed on")
		}
		if n := count(t, db, `SELECT COUNT(*) FROM operations WHERE caller = 'worker-1' AND status = 'superseded'`); n != 1 {
			t.Fatalf("%d superseded publications by the paused worker, want 1", n)
		}
		checkInvariants(t, state, "", h.KernelKey)
	})
	t.Run("Claimed", func(t *testing.T) {
		t.Parallel()
		state := initState(t, sampleInput(t, func(m map[string]any) { m["sections"] = []string{"summary"} }))
		h := startHost(t, state, "--lease", "300ms")
		w1, w2 := credential(t, state, "worker-1"), credential(t, state, "worker-2")
		paused := claimAs(t, h, w1)
		time.Sleep(600 * time.Millisecond) // past the lease: back to the queue
		taken := claimAs(t, h, w2)
		if taken.OperationID != paused.OperationID || taken.Claim.Generation <= paused.Claim.Generation {
			t.Fatalf("reclaimed %+v after %+v", taken, paused)
		}
		for _, path := range []string{"/dispatch", "/heartbeat"} {
			r := call(t, "POST", h.URL+"/v1/jobs/"+paused.OperationID+path, w1, refOf(paused))
			if r.Status != 409 || r.code() != wire.CodeStaleClaim {
				t.Fatalf("%s by the paused worker: %d %s", path, r.Status, r.Body)
			}
		}
		r := mustStatus(t, call(t, "POST", h.URL+"/v1/jobs/"+paused.OperationID+"/publish", w1,
			publishBody(t, paused, "paused", paused.Claim.Generation, 0)), 200)
		if !bytes.Contains(r.Body, []byte(`"status":"superseded"`)) {
			t.Fatalf("publication by the paused worker: %s", r.Body)
		}
	})
}

// TestWorkerSlots: a worker given four slots claims four jobs in one call,
// runs them at once, keeps its slots full as jobs finish, and stops when
// the queue is empty and its own jobs are done; every job completes and
// verifies.
func TestWorkerSlots(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["sections"] = []string{"summary", "terms", "actions", "links", "summary", "terms", "actions", "links", "summary"}
		m["concurrency"], m["allowance"], m["restart"], m["lose_ack_index"] = 1, 1000, false, nil
	}))
	h := startHost(t, state)
	w := startWorker(t, h.URL, state, "worker-1", "--slots", "4", "--batch-calls", "--work-delay", "300ms")
	w.wait(t, 60*time.Second)
	op := credential(t, state, "operator")
	snap := getSnapshot(t, h, op)
	for _, j := range snap.Jobs {
		if j.State != wire.Completed {
			t.Fatalf("job %s is %s after the worker finished", j.OperationID, j.State)
		}
	}
	var page wire.EventPage
	mustStatus(t, call(t, "GET", h.URL+"/admin/events?after=0", op, nil), 200).decode(t, &page)
	claimedBeforeFirstPublication := 0
	for _, e := range page.Events {
		if e.Kind == wire.EventPublished {
			break
		}
		if e.Kind == wire.EventClaimed {
			claimedBeforeFirstPublication++
		}
	}
	if claimedBeforeFirstPublication != 4 {
		t.Fatalf("%d jobs claimed before the first publication, want the worker's 4 slots", claimedBeforeFirstPublication)
	}
	// Its claims admitted their jobs (no dispatch at all), and with
	// --batch-calls its publications went as batch calls, none alone.
	var stats wire.Stats
	mustStatus(t, call(t, "GET", h.URL+"/admin/stats", op, nil), 200).decode(t, &stats)
	ops := stats.Storage.Operations
	for _, none := range []string{"dispatch-allow", "dispatch-deny", "dispatch-repeat", "dispatch-batch", "publish", "claim"} {
		if ops[none].Writes != 0 {
			t.Errorf("%d %s writes from a worker with 4 slots: %v", ops[none].Writes, none, ops)
		}
	}
	if ops["claim-admit"].Writes == 0 || ops["publish-batch"].Writes == 0 {
		t.Errorf("no claims that admit, or no batch calls: %v", ops)
	}
	verifyState(t, state)
}

// TestKilledAfterClaimCountsAttempt: a worker SIGKILLed right after its
// claim leaves the job claimed until the lease lapses; the lapse counts as
// a failed attempt (recorded with its reason), the job goes back to the
// queue, and another worker completes it. On both backends.
func TestKilledAfterClaimCountsAttempt(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		var dbArgs []string
		if storetest.OnPostgres(t) {
			dbArgs = []string{"--database", storetest.NewLocation(t)}
		}
		state := initState(t, sampleInput(t, func(m map[string]any) {
			m["sections"], m["max_attempts"] = []string{"summary"}, 2
		}), dbArgs...)
		h := startHost(t, state, append([]string{"--lease", "500ms"}, dbArgs...)...)
		op := credential(t, state, "operator")
		// A separate dispatch: a claim that admits leaves its job running,
		// whose lapse is TestWorkerKilled's after-claim-admitted case.
		dead := startWorkerFrom(t, filepath.Join(binDir, "crash", "fleet-worker"), []string{crash.EnvPoint + "=worker.after-claim"},
			h.URL, state, "worker-1", "--separate-dispatch")
		select {
		case <-dead.done:
		case <-time.After(20 * time.Second):
			t.Fatal("the worker never reached worker.after-claim")
		}
		startWorker(t, h.URL, state, "worker-2", "--outage", "10s").wait(t, 30*time.Second)
		job := getSnapshot(t, h, op).Jobs[0]
		var d wire.JobDetail
		mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+job.OperationID, op, nil), 200).decode(t, &d)
		if d.State != wire.Completed || d.Attempts != 1 || len(d.AttemptLog) != 1 ||
			d.AttemptLog[0].Worker != "worker-1" || d.AttemptLog[0].Reason != "the lease expired before dispatch" || d.AttemptLog[0].Cost != 0 {
			t.Fatalf("job %s after %d attempts, log %+v", d.State, d.Attempts, d.AttemptLog)
		}
		verifyState(t, state, dbArgs...)
	})
}
