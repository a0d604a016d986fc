package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/fleet/fleet/internal/client"
	"github.com/fleet/fleet/internal/faultproxy"
	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/wire"
)

// benchRun is one run of Fleet's side of the bench: a fresh state, its
// hosts, the jobs queued, the workers timed.
type benchRun struct {
	c        config
	ctx      context.Context
	state    string
	database string // the hosts' database URL ("" for SQLite), through the latency proxy when there is one
	cmds     []*exec.Cmd
	urls     []string
	hc       *http.Client
	operator string
	// undo is what the run set up, undone last first when it ends.
	undo    []func()
	stopped sync.Once
	schema  string // the fresh schema on PostgreSQL
}

// timedCall is a worker's call to its host, its latency recorded under name.
type timedCall func(name, path string, body any) ([]byte, error)

func benchFleet(c config) (fleetResult, error) {
	var res fleetResult
	r := &benchRun{c: c, ctx: context.Background()}
	defer r.close()
	if err := r.prepare(); err != nil {
		return res, err
	}
	if err := r.startHosts(); err != nil {
		return res, err
	}
	if err := r.enqueue(); err != nil {
		return res, err
	}
	time.Sleep(c.settle)
	if c.warmup > 0 {
		if _, _, err := r.runWorkers(int64(c.warmup)); err != nil {
			return res, fmt.Errorf("warm-up: %w", err)
		}
	}
	before, err := r.storage()
	if err != nil {
		return res, err
	}
	hostCPU0, clientCPU0, pgCPU0 := r.hostsCPU(), selfCPU(), postgresCPU()
	lat, elapsed, workersErr := r.runWorkers(int64(c.jobs))
	res.HostCPUus = float64((r.hostsCPU() - hostCPU0).Microseconds()) / float64(c.jobs)
	res.ClientCPUus = float64((selfCPU() - clientCPU0).Microseconds()) / float64(c.jobs)
	if r.database != "" {
		res.PostgresCPUus = float64((postgresCPU() - pgCPU0).Microseconds()) / float64(c.jobs)
	}
	if workersErr != nil {
		return res, workersErr
	}
	after, err := r.storage()
	if err != nil {
		return res, err
	}
	res.JobsPerSec = float64(c.jobs) / elapsed.Seconds()
	res.DatabaseBytes = r.databaseBytes()
	res.Latency = map[string]percentiles{}
	for name, per := range lat {
		all := slices.Concat(per...)
		if len(all) == 0 { // no dispatch: claims that admit
			continue
		}
		slices.Sort(all)
		res.Latency[name] = percentiles{P50: ms(all[len(all)/2]), P99: ms(all[len(all)*99/100])}
	}
	res.count(c, before, after, r.database != "")
	for _, cmd := range r.cmds {
		res.PeakRSSMiB = max(res.PeakRSSMiB, peakRSS(cmd.Process.Pid))
	}
	if r.schema != "" {
		res.TableUpdates, err = r.tableUpdates()
	}
	return res, err
}

// tableUpdates stops the hosts, so that their connections report what
// they counted, and reads each table's row updates since the schema was
// made (the enqueue's included), HOT ones apart.
func (r *benchRun) tableUpdates() (map[string]postgres.TableUpdates, error) {
	r.stopHosts()
	var last map[string]postgres.TableUpdates
	for range 20 { // the connections' last reports land as they close
		got, err := postgres.SchemaUpdates(r.ctx, r.c.database, r.schema)
		if err != nil || maps.EqualFunc(got, last, func(a, b postgres.TableUpdates) bool { return a == b }) {
			return got, err
		}
		last = got
		time.Sleep(250 * time.Millisecond)
	}
	return last, nil
}

func (r *benchRun) close() {
	for i := len(r.undo) - 1; i >= 0; i-- {
		r.undo[i]()
	}
}

// prepare makes the state: a temporary directory, on PostgreSQL a fresh
// schema (the figures never depend on what an earlier run left behind),
// and, with a latency, the proxy the hosts reach the database through.
func (r *benchRun) prepare() error {
	dir, err := os.MkdirTemp("", "fleet-bench-")
	if err != nil {
		return err
	}
	r.undo = append(r.undo, func() { os.RemoveAll(dir) })
	r.state = filepath.Join(dir, "state")
	in, err := input.Parse([]byte(fmt.Sprintf(
		`{"document":"Benchmark document. It must be short.\n- [ ] done https://example.com","sections":["summary"],"concurrency":%d,"allowance":1000000,"cost_per_report":1}`,
		min(r.c.workers, 64))))
	if err != nil {
		return err
	}
	if r.c.database != "" {
		schema := fmt.Sprintf("bench_%d", time.Now().UnixNano())
		r.schema = schema
		if r.database, err = postgres.CreateSchema(r.ctx, r.c.database, schema); err != nil {
			return err
		}
		r.undo = append(r.undo, func() { postgres.DropSchema(r.ctx, r.c.database, schema) })
	}
	location := statedir.Location(r.state, r.database)
	if err := host.Init(r.ctx, r.state, func(ctx context.Context) (*store.DB, error) { return backend.Create(ctx, location) }, in); err != nil {
		return err
	}
	if r.c.dbLatency > 0 {
		return r.delayDatabase()
	}
	return nil
}

// delayDatabase puts the database in another zone, simulated on loopback.
func (r *benchRun) delayDatabase() error {
	if r.database == "" {
		return fmt.Errorf("-db-latency needs -database")
	}
	u, err := url.Parse(r.database)
	if err != nil {
		return err
	}
	proxy, err := faultproxy.Start(u.Host)
	if err != nil {
		return err
	}
	r.undo = append(r.undo, func() { proxy.Close() })
	proxy.SetDelay(r.c.dbLatency)
	r.database, err = proxy.Via(r.database)
	return err
}

// startHosts starts the host processes, each with an identity of its own
// (they share one state directory), and waits for each to say where it
// listens. They get SIGTERM at the end, so a host finishes its profile.
func (r *benchRun) startHosts() error {
	r.undo = append(r.undo, r.stopHosts)
	for i := range r.c.hosts {
		args := []string{"serve", "--state", r.state, "--sync", r.c.sync, "--max-requests", strconv.Itoa(max(256, 2*r.c.workers)),
			"--host-id", fmt.Sprintf("bench-%d", i+1)}
		if r.database != "" {
			args = append(args, "--database", r.database)
		}
		if r.c.cpuProfile != "" && i == 0 {
			args = append(args, "--cpuprofile", r.c.cpuProfile)
		}
		if err := r.startHost(i, args); err != nil {
			return err
		}
	}
	r.hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: r.c.workers + 4, MaxConnsPerHost: 0}}
	r.operator, _ = statedir.ReadCredential(filepath.Join(r.state, "credentials", "operator"))
	return nil
}

// stopHosts stops the hosts (once): SIGTERM, SIGKILL 10 s later.
func (r *benchRun) stopHosts() {
	r.stopped.Do(func() {
		for _, cmd := range r.cmds {
			cmd.Process.Signal(syscall.SIGTERM)
			time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
			cmd.Wait()
		}
	})
}

func (r *benchRun) startHost(i int, args []string) error {
	cmd := exec.Command(filepath.Join(r.c.bin, "fleet-host"), args...)
	stdout, _ := cmd.StdoutPipe()
	// Kept for a post-mortem: a failed request names it.
	logFile, err := os.Create(filepath.Join(os.TempDir(), fmt.Sprintf("fleet-bench-host-%d.log", i)))
	if err != nil {
		return err
	}
	r.undo = append(r.undo, func() { logFile.Close() })
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return err
	}
	r.cmds = append(r.cmds, cmd)
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("host did not start: %w", err)
	}
	var ready struct{ URL string }
	json.Unmarshal(line, &ready)
	r.urls = append(r.urls, ready.URL)
	return nil
}

func (r *benchRun) hostsCPU() (total time.Duration) {
	for _, cmd := range r.cmds {
		total += processCPU(cmd.Process.Pid)
	}
	return total
}

// callOn makes a call to the host at base.
func (r *benchRun) callOn(base, token, method, path string, body any) ([]byte, error) {
	resp, err := client.Do(r.ctx, r.hc, base, token, method, path, body, nil)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return resp.Body, nil
}

// call makes a call to the first host.
func (r *benchRun) call(token, method, path string, body any) ([]byte, error) {
	return r.callOn(r.urls[0], token, method, path, body)
}

// storage sums the storage counters of every host.
func (r *benchRun) storage() (storageStats, error) {
	return snapshotStorage(r.callOn, r.urls, r.operator)
}

// enqueue queues the jobs (init made one) in batches of 64 sections, and
// the backlog, backing off first when asked.
func (r *benchRun) enqueue() error {
	total := r.c.warmup + r.c.jobs + r.c.backlog
	if r.c.backlogBackingOff {
		if err := enqueueBackingOff(r.ctx, r.call, r.operator, r.state, r.database, r.c.backlog); err != nil {
			return err
		}
		total -= r.c.backlog
	}
	for queued, batch := 1, 0; queued < total; batch++ {
		n := min(64, total-queued)
		sections := slices.Repeat([]string{"summary"}, n)
		if _, err := r.call(r.operator, "POST", "/admin/reports", map[string]any{
			"document": "Benchmark document. It must be short.", "sections": sections, "idempotency_key": fmt.Sprint("b", batch)}); err != nil {
			return err
		}
		queued += n
	}
	return nil
}

// runWorkers runs the workers until jobs more jobs are published, each
// worker's calls to host w % hosts, and answers the latencies by call and
// worker and how long it took. The first worker to fail stops the others.
func (r *benchRun) runWorkers(jobs int64) (map[string][][]time.Duration, time.Duration, error) {
	lat := map[string][][]time.Duration{"claim": make([][]time.Duration, r.c.workers),
		"dispatch": make([][]time.Duration, r.c.workers), "publish": make([][]time.Duration, r.c.workers)}
	workers, failed := errgroup.WithContext(context.Background())
	if r.c.console {
		consoleCtx, stopConsole := context.WithCancel(r.ctx)
		r.undo = append(r.undo, stopConsole)
		go replayConsole(consoleCtx, r.hc, r.urls[0], r.operator)
	}
	var started, done atomic.Int64
	begin := time.Now()
	for w := range r.c.workers {
		token, err := statedir.ReadCredential(filepath.Join(r.state, "credentials", fmt.Sprintf("worker-%d", w%64+1)))
		if err != nil {
			return lat, 0, err
		}
		timed := func(name, path string, body any) ([]byte, error) {
			t0 := time.Now()
			data, err := r.callOn(r.urls[w%len(r.urls)], token, "POST", path, body)
			lat[name][w] = append(lat[name][w], time.Since(t0))
			return data, err
		}
		workers.Go(func() error {
			for {
				// Take up to claim-batch of the jobs still to run.
				from := started.Add(int64(r.c.claimBatch)) - int64(r.c.claimBatch)
				n := min(int64(r.c.claimBatch), jobs-from)
				if n <= 0 || failed.Err() != nil {
					return nil
				}
				if err := r.round(timed, n, &done); err != nil {
					return err
				}
			}
		})
	}
	err := workers.Wait()
	return lat, time.Since(begin), err
}

// round claims n jobs and dispatches and publishes them, in a batch call
// each or one by one.
func (r *benchRun) round(timed timedCall, n int64, done *atomic.Int64) error {
	var body any
	if n > 1 || r.c.admit {
		body = wire.ClaimRequest{Max: ptr(int(n)), Admit: r.c.admit}
	}
	data, err := timed("claim", "/v1/claims", body)
	if err != nil {
		return err
	}
	var claim wire.ClaimResult
	if err := json.Unmarshal(data, &claim); err != nil || int64(len(claim.Jobs)) != n {
		return fmt.Errorf("claimed %d of %d (%s) after %d: %v", len(claim.Jobs), n, claim.Queue, done.Load(), err)
	}
	for _, j := range claim.Jobs {
		if r.c.admit && (j.Admission == nil || j.Admission.Decision != wire.DecisionAllow) {
			return fmt.Errorf("claimed %s without its admission: %+v", j.OperationID, j.Admission)
		}
	}
	if r.c.batchCalls {
		if err := batchedRound(claim.Jobs, timed); err != nil {
			return err
		}
		done.Add(int64(len(claim.Jobs)))
		return nil
	}
	for _, j := range claim.Jobs {
		if err := singleCalls(j, timed); err != nil {
			return err
		}
		done.Add(1)
	}
	return nil
}

// singleCalls dispatches a claimed job and publishes what a deterministic
// worker publishes: the only body the host takes for the job.
func singleCalls(j wire.ClaimedJob, timed timedCall) error {
	ref := wire.ClaimRef{ClaimID: j.Claim.ClaimID, Generation: j.Claim.Generation}
	if j.Admission == nil { // admitted with its claim
		if _, err := timed("dispatch", "/v1/jobs/"+j.OperationID+"/dispatch", ref); err != nil {
			return err
		}
	}
	key, _ := uuid.NewV7()
	section, err := sections.Body(j.OperationID, j.Section, j.InputSHA256, j.Input.Document)
	if err != nil {
		return err
	}
	data, err := timed("publish", "/v1/jobs/"+j.OperationID+"/publish", map[string]any{
		"operation_key": key.String(), "generation": j.Claim.Generation, "expected_version": 0,
		"body": json.RawMessage(section)})
	var outcome wire.Outcome
	if err != nil || json.Unmarshal(data, &outcome) != nil || outcome.Status != wire.StatusPublished {
		return fmt.Errorf("publish: %v %s", err, data)
	}
	return nil
}

// databaseBytes is the SQLite file and its WAL (0 on PostgreSQL).
func (r *benchRun) databaseBytes() (n int64) {
	if r.database != "" {
		return 0
	}
	for _, suffix := range []string{"", "-wal"} {
		if info, err := os.Stat(statedir.Location(r.state, "") + suffix); err == nil {
			n += info.Size()
		}
	}
	return n
}

// count fills in the storage figures per job from the hosts' counters
// before and after the run.
func (res *fleetResult) count(c config, before, after storageStats, onPostgres bool) {
	jobs := float64(c.jobs)
	res.TxPerJob = float64(after.WriteTransactions-before.WriteTransactions) / jobs
	res.HostStorage = after
	res.CommitsPerJob = float64(after.Commits-before.Commits) / jobs
	res.RoundTripsPerJob = float64(after.RoundTrips-before.RoundTrips) / jobs
	claims, claimed := after.Operations["claim"].minus(before.Operations["claim"]), int64(0)
	if c.admit {
		claims = after.Operations["claim-admit"].minus(before.Operations["claim-admit"])
	}
	if claims.Writes > 0 {
		claimed = claims.Rows
		res.StatementsPerClaim = float64(claims.Statements) / float64(claims.Writes)
		res.JobsPerClaim = float64(claimed) / float64(claims.Writes)
	}
	if claimed > 0 {
		res.StatementsPerClaimedJob = float64(claims.Statements) / float64(claimed)
	}
	var statements int64
	for name, op := range after.Operations {
		statements += op.minus(before.Operations[name]).Statements
	}
	res.StatementsPerJob = float64(statements) / jobs
	// Under WAL, FULL syncs the WAL at every commit, and each checkpoint that
	// copies frames adds one sync. Checked against strace -c -e
	// fsync,fdatasync on the host: 688 observed vs 684 computed at FULL, 50
	// vs 44 at NORMAL (the difference is the shutdown's own syncs).
	// On PostgreSQL the server syncs its own WAL (one flush per commit,
	// fewer with its group commit), which the hosts cannot count.
	fsyncs := after.Checkpoints - before.Checkpoints
	if strings.EqualFold(c.sync, "FULL") || onPostgres {
		fsyncs += after.Commits - before.Commits
	}
	res.FsyncsPerJob = float64(fsyncs) / jobs
}

// batchedRound dispatches a claim's jobs in one batch call and publishes
// them in another.
func batchedRound(jobs []wire.ClaimedJob, timed timedCall) error {
	dispatches := wire.BatchRequest{}
	publications := wire.BatchRequest{}
	for _, j := range jobs {
		ref, err := json.Marshal(wire.ClaimRef{ClaimID: j.Claim.ClaimID, Generation: j.Claim.Generation})
		if err != nil {
			return err
		}
		if j.Admission == nil { // admitted with its claim
			dispatches.Items = append(dispatches.Items, wire.BatchItem{OperationID: j.OperationID, Request: ref})
		}
		section, err := sections.Body(j.OperationID, j.Section, j.InputSHA256, j.Input.Document)
		if err != nil {
			return err
		}
		key, _ := uuid.NewV7()
		req, err := json.Marshal(map[string]any{"operation_key": key.String(), "generation": j.Claim.Generation,
			"expected_version": 0, "body": json.RawMessage(section)})
		if err != nil {
			return err
		}
		publications.Items = append(publications.Items, wire.BatchItem{OperationID: j.OperationID, Request: req})
	}
	for _, step := range []struct {
		name, path string
		body       wire.BatchRequest
	}{{"dispatch", "/v1/dispatches", dispatches}, {"publish", "/v1/publications", publications}} {
		if len(step.body.Items) == 0 {
			continue
		}
		data, err := timed(step.name, step.path, step.body)
		if err != nil {
			return err
		}
		var res wire.BatchResult
		if err := json.Unmarshal(data, &res); err != nil || len(res.Results) != len(jobs) {
			return fmt.Errorf("%s: %v %s", step.path, err, data)
		}
		for _, r := range res.Results {
			var outcome wire.Outcome
			if r.Status != 200 || step.name == "publish" && (json.Unmarshal(r.Body, &outcome) != nil || outcome.Status != wire.StatusPublished) {
				return fmt.Errorf("%s of %s: %d %s", step.name, r.OperationID, r.Status, r.Body)
			}
		}
	}
	return nil
}
