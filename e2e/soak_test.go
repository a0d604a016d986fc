package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/wire"
)

// The soak: three hosts on one PostgreSQL, each behind its own fault
// proxy, six workers and a submitter running throughout, and one fault at
// a time at random: a host's link frozen, reset or slowed, its process
// paused or killed and restarted, or (on a PostgreSQL of the soak's own,
// where the server binaries are installed) the database restarted with
// pg_ctl -m immediate. FLEET_SOAK sets how long faults are injected
// (default 60 s; e.g. FLEET_SOAK=20m by hand).
//
// Checked throughout: spent + reserved never above the allowance, at every
// sample; some host answers the operator within soakUnansweredBound (a
// sample tries each host for a second; on a machine this loaded, all
// three can miss one); publications never stop for longer than
// soakStallBound while work is pending and the database is up (one host
// is sick at a time, so two hosts are always healthy). Checked at the end: verify is clean, one
// publication per completed job, and every publication a worker was told
// of is in the database.

const (
	soakStallBound      = 10 * time.Second
	soakUnansweredBound = 3 * time.Second
)

func soakDuration(t *testing.T) time.Duration {
	if v := os.Getenv("FLEET_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("FLEET_SOAK=%q: %v", v, err)
		}
		return d
	}
	return 60 * time.Second
}

func TestSoak(t *testing.T) {
	t.Parallel()
	ids := []string{"a", "b", "c"}
	edit := func(m map[string]any) { m["allowance"], m["cost_per_report"] = 1000000, 1 }
	kinds := []string{"freeze", "pause", "reset", "delay", "kill"}
	var c *cluster
	server, restartDatabase := privatePostgres(t)
	if server != "" {
		c = newClusterOn(t, server, ids, edit)
		kinds = append(kinds, "db-restart")
	} else {
		t.Log("no PostgreSQL server binaries here: the soak runs on the shared server, without restarting it")
		c = newCluster(t, ids, edit)
	}
	listen := map[string]string{}
	start := func(id string) {
		args := []string{}
		if addr := listen[id]; addr != "" {
			args = []string{"--listen", addr}
		}
		h := c.startWith(id, args...)
		if listen[id] == "" { // set before anything reads it; a restart keeps the address
			listen[id] = h.addr()
		}
	}
	for _, id := range ids {
		start(id)
	}
	urls := func(first int) string {
		var list []string
		for i := range ids {
			list = append(list, "http://"+listen[ids[(first+i)%len(ids)]])
		}
		return strings.Join(list, ",")
	}
	var workers []*workerProcess
	for i := range 6 {
		workers = append(workers, startWorker(t, urls(i%3), c.state, fmt.Sprintf("worker-%d", i%3+1),
			"--follow", "--slots", "2", "--work-delay", "100ms", "--outage", "10m"))
	}

	// Requests from the test itself go to whichever host answers first.
	quick := &http.Client{Timeout: time.Second}
	// anyHost answers the first host's 200, or, when none answered so,
	// what each host did (r.Body then says so, for the violation).
	anyHost := func(method, path string, body []byte) (response, bool) {
		var tried []string
		for _, i := range rand.Perm(len(ids)) {
			req, _ := newRequest(method, "http://"+listen[ids[i]]+path, c.operator, body)
			resp, err := quick.Do(req)
			if err != nil {
				tried = append(tried, fmt.Sprintf("%s: %v", ids[i], err))
				continue
			}
			r := response{Status: resp.StatusCode}
			r.Body, _ = readAll(resp)
			if r.Status == 200 {
				return r, true
			}
			tried = append(tried, fmt.Sprintf("%s: %d %.200s", ids[i], r.Status, r.Body))
		}
		return response{Body: []byte(strings.Join(tried, "; "))}, false
	}
	var fault atomic.Value // the fault under way, for a violation's message
	fault.Store("none")

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var violations []string
	violate := func(format string, args ...any) {
		mu.Lock()
		violations = append(violations, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	// The submitter.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			body, _ := json.Marshal(map[string]any{"document": fmt.Sprintf("%sbatch %d\n", sampleDocument, i),
				"sections": []string{"summary", "terms", "actions", "links"}, "idempotency_key": fmt.Sprintf("soak-%d", i)})
			for ctx.Err() == nil {
				if _, ok := anyHost("POST", "/admin/reports", body); ok {
					break
				}
			}
			time.Sleep(400 * time.Millisecond)
		}
	}()
	// The sampler.
	var samples, longestStall int64
	var databaseDown atomic.Bool // a restart of the database is under way: nothing is expected of the hosts
	wg.Add(1)
	go func() {
		defer wg.Done()
		lastMutations, lastChange, lastAnswer := int64(-1), time.Now(), time.Now()
		for ctx.Err() == nil {
			time.Sleep(250 * time.Millisecond)
			if databaseDown.Load() {
				lastChange, lastAnswer = time.Now(), time.Now() // the bounds hold while the database is healthy
				continue
			}
			r, ok := anyHost("GET", "/admin/stats", nil)
			if !ok {
				t.Logf("no host answered /admin/stats at %s during %s: %s", time.Now().Format(time.TimeOnly), fault.Load(), r.Body)
				if unanswered := time.Since(lastAnswer); unanswered > soakUnansweredBound {
					violate("no host answered /admin/stats for %s, at %s during %s: %s", unanswered.Round(time.Millisecond),
						time.Now().Format(time.TimeOnly), fault.Load(), r.Body)
					lastAnswer = time.Now()
				}
				continue
			}
			lastAnswer = time.Now()
			var s wire.Stats
			if json.Unmarshal(r.Body, &s) != nil {
				continue
			}
			mu.Lock()
			samples++
			mu.Unlock()
			if a := s.Accounting; a.Spent+a.Reserved > a.Allowance {
				violate("spent %d + reserved %d over the allowance %d", a.Spent, a.Reserved, a.Allowance)
			}
			pending := s.Jobs[wire.Queued]+s.Jobs[wire.Claimed]+s.Jobs[wire.Running] > 0
			if s.Mutations != lastMutations || !pending {
				lastMutations, lastChange = s.Mutations, time.Now()
			} else if stalled := time.Since(lastChange); stalled > soakStallBound {
				violate("no publication for %s with work pending (at %s)", stalled, time.Now().Format(time.TimeOnly))
				lastChange = time.Now()
			} else {
				mu.Lock()
				longestStall = max(longestStall, int64(stalled))
				mu.Unlock()
			}
		}
	}()

	// recovered is how long host id takes, once healed, to answer an
	// operator's read through its database again.
	recovered := func(id string) time.Duration {
		healed := time.Now()
		for time.Since(healed) < 30*time.Second {
			req, _ := newRequest("GET", "http://"+listen[id]+"/admin/stats", c.operator, nil)
			if resp, err := quick.Do(req); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		return time.Since(healed)
	}
	recovery := map[string]time.Duration{} // the longest, by kind of fault

	t.Run("faults one at a time, sampled throughout", func(t *testing.T) {
		defer func() { stop(); wg.Wait() }() // the submitter and sampler end with this step, failed or not
		// The faults, one host at a time.
		faults := map[string]int{}
		deadline := time.Now().Add(soakDuration(t))
		for time.Now().Before(deadline) {
			id := ids[rand.IntN(len(ids))]
			p, h := c.proxies[id], c.hosts[id]
			hold := time.Duration(2000+rand.IntN(4000)) * time.Millisecond
			kind := kinds[rand.IntN(len(kinds))]
			fault.Store(kind + " of " + id)
			switch kind {
			case "db-restart":
				databaseDown.Store(true)
				if err := restartDatabase(); err != nil {
					t.Fatal(err)
				}
				faults[kind]++
				restarted := recovered(id) // a host reaching the database again
				recovery[kind] = max(recovery[kind], restarted)
				databaseDown.Store(false)
			case "freeze":
				p.Freeze()
				time.Sleep(hold)
				p.Thaw()
				faults[kind]++
			case "pause":
				syscall.Kill(h.PID, syscall.SIGSTOP)
				time.Sleep(hold)
				syscall.Kill(h.PID, syscall.SIGCONT)
				faults[kind]++
			case "reset":
				p.Reset()
				faults[kind]++
			case "delay":
				p.SetDelay(time.Duration(200+rand.IntN(300)) * time.Millisecond)
				time.Sleep(hold)
				p.SetDelay(0)
				faults[kind]++
			case "kill":
				h.kill()
				time.Sleep(hold)
				start(id)
				faults[kind]++
			}
			recovery[kind] = max(recovery[kind], recovered(id))
			fault.Store("the 2 s after " + kind + " of " + id)
			time.Sleep(2 * time.Second) // settled before the next
		}
		stop()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		t.Logf("faults %v; %d samples; longest stretch without a publication while work was pending %s; longest recovery of the sick host by fault %v",
			faults, samples, time.Duration(longestStall), recovery)
		for _, v := range violations {
			t.Error(v)
		}
	})
	t.Run("every job settles", func(t *testing.T) {
		// Heal and let the queue drain.
		waitFor(t, 90*time.Second, "every job to settle", func() bool {
			r, ok := anyHost("GET", "/admin/stats", nil)
			var s wire.Stats
			return ok && json.Unmarshal(r.Body, &s) == nil && s.Jobs[wire.Queued]+s.Jobs[wire.Claimed]+s.Jobs[wire.Running] == 0
		})
		for _, w := range workers {
			w.cmd.Process.Kill()
			<-w.done
		}
	})
	t.Run("verify clean, one publication per completed job", func(t *testing.T) {
		rep := verifyState(t, c.state, "--database", c.database)
		r, _ := anyHost("GET", "/admin/stats", nil)
		var s wire.Stats
		json.Unmarshal(r.Body, &s)
		if s.Mutations != s.Jobs[wire.Completed] {
			t.Errorf("%d publications for %d completed jobs", s.Mutations, s.Jobs[wire.Completed])
		}
		t.Logf("%d jobs completed, verify %+v", s.Jobs[wire.Completed], rep.OK)
	})
	t.Run("every publication a worker was told of is in the database", func(t *testing.T) {
		told := 0
		for _, w := range workers {
			f, err := os.Open(w.log.Name())
			if err != nil {
				t.Fatal(err)
			}
			lines := bufio.NewScanner(f)
			lines.Buffer(make([]byte, 1<<20), 1<<20)
			for lines.Scan() {
				var line struct {
					Msg       string `json:"msg"`
					Status    string `json:"status"`
					ReceiptID string `json:"receipt_id"`
				}
				if json.Unmarshal(lines.Bytes(), &line) != nil || line.Msg != "publication answered" || line.Status != "published" {
					continue
				}
				told++
				if r, ok := anyHost("GET", "/admin/receipts/"+line.ReceiptID, nil); !ok || r.Status != 200 {
					t.Errorf("a worker was told of publication %s, which the database does not hold", line.ReceiptID)
				}
			}
			f.Close()
		}
		t.Logf("%d publications a worker was told of", told)
		if told == 0 {
			t.Fatal("no worker was told of a publication: the soak proves nothing")
		}
	})
}

// privatePostgres starts a PostgreSQL cluster of the test's own with
// .ci/postgres.sh, so that the soak can restart it (pg_ctl -m immediate)
// without disturbing the tests that share the CI's server. It returns ""
// where no server binaries are installed.
func privatePostgres(t *testing.T) (url string, restart func() error) {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(bins) == 0 {
		return "", nil
	}
	sort.Strings(bins)
	pgCtl := bins[len(bins)-1]
	dir, err := os.MkdirTemp("", "fleet-soak-pg-") // not t.TempDir: the server's user must reach it
	if err != nil {
		t.Fatal(err)
	}
	asServer := func(name string, args ...string) *exec.Cmd {
		if os.Geteuid() == 0 { // initdb and the server refuse to run as root
			return exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
		}
		return exec.Command(name, args...)
	}
	out, err := exec.Command("../.ci/postgres.sh", dir).Output()
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("start a PostgreSQL of the soak's own: %v", err)
	}
	data := filepath.Join(dir, "data")
	t.Cleanup(func() {
		asServer(pgCtl, "-D", data, "-m", "immediate", "stop").Run()
		os.RemoveAll(dir)
	})
	return strings.TrimSpace(string(out)), func() error {
		out, err := asServer(pgCtl, "-D", data, "-l", filepath.Join(dir, "server.log"), "-m", "immediate", "-w", "restart").CombinedOutput()
		if err != nil {
			return fmt.Errorf("pg_ctl restart: %v: %s", err, out)
		}
		return nil
	}
}
