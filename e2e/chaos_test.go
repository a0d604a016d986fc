package e2e

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/wire"
)

// TestBudgetRace: 32 worker processes race for 40 jobs under an allowance
// for exactly 7. Exactly 7 are admitted and published; the rest are refused
// and nothing goes negative.
func TestBudgetRace(t *testing.T) {
	t.Parallel()
	const workers, jobCount, funded = 32, 40, 7
	sections := make([]string, jobCount)
	for i := range sections {
		sections[i] = jobs.Sections[i%len(jobs.Sections)]
	}
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["sections"], m["concurrency"], m["allowance"], m["cost_per_report"] = sections, workers, funded*20+19, 20
	}))
	h := startHost(t, state)
	var ws []*workerProcess
	for i := 1; i <= workers; i++ {
		ws = append(ws, startWorker(t, h.URL, state, fmt.Sprintf("worker-%d", i)))
	}
	for _, w := range ws {
		w.wait(t, 60*time.Second)
	}
	s := getSnapshot(t, h, credential(t, state, "operator"))
	completed, refused := 0, 0
	for _, j := range s.Jobs {
		switch j.State {
		case wire.Completed:
			completed++
		case wire.Refused:
			refused++
		default:
			t.Errorf("job %s is %s", j.OperationID, j.State)
		}
	}
	db := openDB(t, state)
	allows := count(t, db, `SELECT COUNT(*) FROM receipts WHERE kind = 'admission' AND body LIKE '%"decision":"allow"%'`)
	if completed != funded || refused != jobCount-funded || allows != funded || s.Mutations != funded {
		t.Fatalf("completed %d refused %d allow receipts %d mutations %d, want %d funded", completed, refused, allows, s.Mutations, funded)
	}
	if s.Accounting.Spent != funded*20 || s.Accounting.Available != 19 || s.Accounting.Reserved != 0 {
		t.Fatalf("accounting %+v", s.Accounting)
	}
	verifyState(t, state)
}

// TestHostKilledAtRandom: 8 workers run 20 jobs while the host is killed with
// SIGKILL at random moments and restarted on the same state and address,
// until every job settles. Afterwards verify passes, mutations equal
// completed jobs and no operation published twice.
func TestHostKilledAtRandom(t *testing.T) {
	t.Parallel()
	const workers, jobCount = 8, 20
	sections := make([]string, jobCount)
	for i := range sections {
		sections[i] = jobs.Sections[i%len(jobs.Sections)]
	}
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["sections"], m["concurrency"], m["allowance"] = sections, workers, 16*20 // 16 of 20 funded
	}))
	h := startHost(t, state, "--lease", "2s")
	addr := h.addr()
	var ws []*workerProcess
	for i := 1; i <= workers; i++ {
		// work-delay keeps jobs running long enough for kills to land mid-flight.
		ws = append(ws, startWorker(t, h.URL, state, fmt.Sprintf("worker-%d", i), "--work-delay", "200ms", "--outage", "60s"))
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	op := credential(t, state, "operator")
	kills := 0
	deadline := time.Now().Add(90 * time.Second)
	for {
		settled := true
		for _, w := range ws {
			select {
			case <-w.done:
			default:
				settled = false
			}
		}
		if settled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers still running after %d kills", kills)
		}
		time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
		if kills < 8 {
			h.kill()
			kills++
			h = startHost(t, state, "--lease", "2s", "--listen", addr)
		}
	}
	for _, w := range ws {
		w.wait(t, time.Second)
	}
	// A job whose worker lost track of it (a claim response dropped by a
	// kill, say) settles by lease expiry; give the sweeper time.
	waitSettled(t, h, op)
	s := getSnapshot(t, h, op)
	completed := 0
	for _, j := range s.Jobs {
		if j.State == wire.Completed {
			completed++
		}
	}
	rep := verifyState(t, state)
	db := openDB(t, state)
	twice := count(t, db, `SELECT COUNT(*) FROM (SELECT 1 FROM mutations GROUP BY document_id HAVING COUNT(*) > 1) AS d`)
	if int64(completed) != s.Mutations || rep.Mutations != s.Mutations || twice != 0 {
		t.Fatalf("completed %d, mutations %d, documents written twice %d", completed, s.Mutations, twice)
	}
	if s.Accounting.Spent+s.Accounting.Reserved > s.Accounting.Allowance {
		t.Fatalf("overspent: %+v", s.Accounting)
	}
	t.Logf("%d kills; %d of %d jobs completed; accounting %+v", kills, completed, jobCount, s.Accounting)
}
