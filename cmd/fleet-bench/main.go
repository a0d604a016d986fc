// Command fleet-bench measures Fleet end to end: a host process on a fresh
// state, W concurrent workers (goroutines) over loopback HTTP doing claim,
// dispatch and publish for N jobs, and, with -river, River burning down the
// same number of no-op jobs on SQLite for comparison.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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

type config struct {
	dbLatency              time.Duration
	claimBatch             int
	batchCalls             bool
	workers, jobs, backlog int
	backlogBackingOff      bool
	console                bool
	sync, bin, river       string
	cpuProfile             string
	database               string // postgres:// URL of a fresh schema, or "" for SQLite
	hosts                  int
	settle                 time.Duration
}

func main() {
	var c config
	flag.IntVar(&c.workers, "workers", 32, "concurrent workers")
	flag.IntVar(&c.jobs, "jobs", 5000, "jobs to run through claim, dispatch and publish")
	flag.IntVar(&c.backlog, "backlog", 0, "extra jobs left queued behind them (claim cost against queue length)")
	flag.BoolVar(&c.backlogBackingOff, "backlog-backing-off", false,
		"enqueue the backlog first and put it in a retry's backoff until long after the run (claim cost when the oldest jobs are waiting out a backoff)")
	flag.StringVar(&c.sync, "sync", "FULL", "SQLite synchronous: FULL or NORMAL")
	flag.StringVar(&c.database, "database", "", "a postgres:// URL to benchmark PostgreSQL (a fresh schema is made in it) instead of SQLite")
	flag.IntVar(&c.hosts, "hosts", 1, "host processes serving the workers (more than one needs -database)")
	flag.StringVar(&c.bin, "bin", "", "directory with fleet-host (default: this program's)")
	flag.StringVar(&c.river, "river", "", "directory of the River comparison module (bench/river), run on the same backend; empty skips it")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "have the host write a CPU profile here")
	flag.DurationVar(&c.dbLatency, "db-latency", 0, "with -database: delay each way between the hosts and PostgreSQL (a TCP proxy)")
	flag.BoolVar(&c.console, "console", false,
		"replay an open console's requests during the run: follow the event stream and, at most once a second after events, read /admin/stats and a page of /admin/jobs; /admin/series every 2 s")
	flag.IntVar(&c.claimBatch, "claim-batch", 1, "jobs each worker leases per claim (POST /v1/claims {\"max\": N})")
	flag.BoolVar(&c.batchCalls, "batch-calls", false, "dispatch and publish each claim's jobs in one batch call each (POST /v1/dispatches, /v1/publications)")
	flag.DurationVar(&c.settle, "settle", 2*time.Second, "pause after enqueueing, so the background checkpoint absorbs the bulk insert before measuring")
	flag.Parse()
	if c.bin == "" {
		exe, _ := os.Executable()
		c.bin = filepath.Dir(exe)
	}
	if c.claimBatch < 1 || c.claimBatch > wire.MaxClaimBatch {
		fmt.Fprintf(os.Stderr, "fleet-bench: -claim-batch must be 1 to %d\n", wire.MaxClaimBatch)
		os.Exit(2)
	}
	if c.hosts < 1 || c.hosts > 1 && c.database == "" {
		fmt.Fprintln(os.Stderr, "fleet-bench: -hosts must be 1, or more with -database (hosts share PostgreSQL, not a SQLite file)")
		os.Exit(2)
	}
	fleet, err := benchFleet(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet-bench:", err)
		os.Exit(1)
	}
	backend := "SQLite sync " + c.sync
	if c.database != "" {
		backend = fmt.Sprintf("PostgreSQL, %d host(s)", c.hosts)
	}
	if c.claimBatch > 1 {
		backend += fmt.Sprintf(", %d jobs a claim", c.claimBatch)
	}
	if c.batchCalls {
		backend += ", batch calls"
	}
	if c.dbLatency > 0 {
		backend += fmt.Sprintf(", %s each way to the database", c.dbLatency)
	}
	fmt.Printf("fleet: %d jobs, %d workers, backlog %d, %s: %.0f jobs/s\n", c.jobs, c.workers, c.backlog, backend, fleet.JobsPerSec)
	for _, name := range []string{"claim", "dispatch", "publish"} {
		l := fleet.Latency[name]
		fmt.Printf("  %-8s p50 %6.2f ms  p99 %6.2f ms\n", name, l.P50, l.P99)
	}
	fmt.Printf("  write transactions/job %.2f, commits/job %.2f, fsyncs/job %.2f, batch reruns %d, peak host RSS %.1f MiB\n",
		fleet.TxPerJob, fleet.CommitsPerJob, fleet.FsyncsPerJob, fleet.HostStorage.Retries, fleet.PeakRSSMiB)
	fmt.Printf("  CPU per job: host %.0f µs, client %.0f µs\n", fleet.HostCPUus, fleet.ClientCPUus)
	if fleet.RoundTripsPerJob > 0 {
		fmt.Printf("  round trips to PostgreSQL per job %.2f\n", fleet.RoundTripsPerJob)
	}
	if st := fleet.HostStorage; st.SequencerRounds > 0 {
		fmt.Printf("  sequencer (since the hosts started): %d rounds placed %d log entries, %.1f a round\n", st.SequencerRounds,
			st.SequencerEntries, float64(st.SequencerEntries)/float64(st.SequencerRounds))
	}
	fmt.Printf("  statements: per claim %.2f (%.2f jobs a claim), per claimed job %.2f; per job, all writes %.2f (log rows not included)\n",
		fleet.StatementsPerClaim, fleet.JobsPerClaim, fleet.StatementsPerClaimedJob, fleet.StatementsPerJob)
	if fleet.DatabaseBytes > 0 {
		fmt.Printf("  database %.1f MiB: %.0f bytes per job\n", float64(fleet.DatabaseBytes)/(1<<20), float64(fleet.DatabaseBytes)/float64(c.jobs+c.backlog))
	}
	result := map[string]any{"fleet": fleet}
	if c.river != "" {
		river, err := benchRiver(c)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleet-bench: river:", err)
			os.Exit(1)
		}
		ratio := fleet.JobsPerSec / river.JobsPerSec
		on := "sync " + c.sync
		if c.database != "" {
			on = "PostgreSQL"
		}
		fmt.Printf("river: %d jobs, %d workers, %s: %.0f jobs/s\n", c.jobs, c.workers, on, river.JobsPerSec)
		fmt.Printf("ratio fleet/river: %.2f\n", ratio)
		result["river"], result["ratio"] = river, ratio
	}
	line, _ := json.Marshal(result)
	fmt.Println(string(line))
}

type percentiles struct {
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
}

type fleetResult struct {
	JobsPerSec    float64                `json:"jobs_per_sec"`
	Latency       map[string]percentiles `json:"latency"`
	TxPerJob      float64                `json:"write_transactions_per_job"`
	CommitsPerJob float64                `json:"commits_per_job"`
	FsyncsPerJob  float64                `json:"fsyncs_per_job"`
	// RoundTripsPerJob is every host's exchanges with PostgreSQL (writes,
	// reads and sequencer rounds) per job; 0 on SQLite.
	RoundTripsPerJob float64      `json:"round_trips_per_job"`
	PeakRSSMiB       float64      `json:"peak_host_rss_mib"`
	HostStorage      storageStats `json:"host_storage_since_start"`
	HostCPUus        float64      `json:"host_cpu_us_per_job"`
	ClientCPUus      float64      `json:"client_cpu_us_per_job"`
	// DatabaseBytes is the SQLite file and its WAL at the end (0 on PostgreSQL).
	DatabaseBytes int64 `json:"database_bytes"`
	// Statements the writes' own transaction functions ran (the event and
	// receipt rows they append are written after, per commit, and are not
	// counted): per claim (those that found nothing included), per job a
	// claim took, and per job over every write of the run.
	StatementsPerClaim      float64 `json:"statements_per_claim"`
	JobsPerClaim            float64 `json:"jobs_per_claim"`
	StatementsPerClaimedJob float64 `json:"statements_per_claimed_job"`
	StatementsPerJob        float64 `json:"statements_per_job"`
}

type riverResult struct {
	JobsPerSec float64 `json:"jobs_per_sec"`
}

func benchFleet(c config) (fleetResult, error) {
	var res fleetResult
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "fleet-bench-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	state := filepath.Join(dir, "state")
	total := c.jobs + c.backlog
	in, err := input.Parse([]byte(fmt.Sprintf(
		`{"document":"Benchmark document. It must be short.\n- [ ] done https://example.com","sections":["summary"],"concurrency":%d,"allowance":1000000,"cost_per_report":1}`,
		min(c.workers, 64))))
	if err != nil {
		return res, err
	}
	database := ""
	if c.database != "" {
		// A fresh schema per run, dropped after: the figures never depend on
		// what an earlier run left behind.
		schema := fmt.Sprintf("bench_%d", time.Now().UnixNano())
		if database, err = postgres.CreateSchema(ctx, c.database, schema); err != nil {
			return res, err
		}
		defer postgres.DropSchema(ctx, c.database, schema)
	}
	location := statedir.Location(state, database)
	if err := host.Init(ctx, state, func(ctx context.Context) (*store.DB, error) { return backend.Create(ctx, location) }, in); err != nil {
		return res, err
	}
	if c.dbLatency > 0 {
		if database == "" {
			return res, fmt.Errorf("-db-latency needs -database")
		}
		u, err := url.Parse(database)
		if err != nil {
			return res, err
		}
		// A database in another zone, simulated on loopback.
		proxy, err := faultproxy.Start(u.Host)
		if err != nil {
			return res, err
		}
		defer proxy.Close()
		proxy.SetDelay(c.dbLatency)
		if database, err = proxy.Via(database); err != nil {
			return res, err
		}
	}
	var cmds []*exec.Cmd
	var urls []string
	defer func() {
		// SIGTERM lets a host finish its profile; then make sure it is gone.
		for _, cmd := range cmds {
			cmd.Process.Signal(syscall.SIGTERM)
			time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
			cmd.Wait()
		}
	}()
	for i := range c.hosts {
		// The hosts share one state directory, so each needs its own identity.
		args := []string{"serve", "--state", state, "--sync", c.sync, "--max-requests", strconv.Itoa(max(256, 2*c.workers)),
			"--host-id", fmt.Sprintf("bench-%d", i+1)}
		if database != "" {
			args = append(args, "--database", database)
		}
		if c.cpuProfile != "" && i == 0 {
			args = append(args, "--cpuprofile", c.cpuProfile)
		}
		cmd := exec.Command(filepath.Join(c.bin, "fleet-host"), args...)
		stdout, _ := cmd.StdoutPipe()
		// Kept for a post-mortem: a failed request names it.
		logFile, err := os.Create(filepath.Join(os.TempDir(), fmt.Sprintf("fleet-bench-host-%d.log", i)))
		if err != nil {
			return res, err
		}
		defer logFile.Close()
		cmd.Stderr = logFile
		if err := cmd.Start(); err != nil {
			return res, err
		}
		cmds = append(cmds, cmd)
		line, err := bufio.NewReader(stdout).ReadBytes('\n')
		if err != nil {
			return res, fmt.Errorf("host did not start: %w", err)
		}
		var ready struct{ URL string }
		json.Unmarshal(line, &ready)
		urls = append(urls, ready.URL)
	}
	hostsCPU := func() (total time.Duration) {
		for _, cmd := range cmds {
			total += processCPU(cmd.Process.Pid)
		}
		return total
	}

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.workers + 4, MaxConnsPerHost: 0}}
	operator, _ := statedir.ReadCredential(filepath.Join(state, "credentials", "operator"))
	// call goes to the first host; a worker's calls go to host w % hosts.
	callOn := func(base, token, method, path string, body any) ([]byte, error) {
		resp, err := client.Do(ctx, hc, base, token, method, path, body, nil)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
		return resp.Body, nil
	}
	call := func(token, method, path string, body any) ([]byte, error) {
		return callOn(urls[0], token, method, path, body)
	}
	// Enqueue the jobs (init made one) in batches of 64 sections.
	if c.backlogBackingOff {
		if err := enqueueBackingOff(ctx, call, operator, state, database, c.backlog); err != nil {
			return res, err
		}
		total -= c.backlog
	}
	for queued, batch := 1, 0; queued < total; batch++ {
		n := min(64, total-queued)
		sections := slices.Repeat([]string{"summary"}, n)
		if _, err := call(operator, "POST", "/admin/reports", map[string]any{
			"document": "Benchmark document. It must be short.", "sections": sections, "idempotency_key": fmt.Sprint("b", batch)}); err != nil {
			return res, err
		}
		queued += n
	}
	time.Sleep(c.settle)
	before, err := snapshotStorage(callOn, urls, operator)
	if err != nil {
		return res, err
	}

	hostCPU0, clientCPU0 := hostsCPU(), selfCPU()
	var started, done atomic.Int64
	lat := map[string][][]time.Duration{"claim": make([][]time.Duration, c.workers),
		"dispatch": make([][]time.Duration, c.workers), "publish": make([][]time.Duration, c.workers)}
	// The first worker to fail stops the others; Wait returns its error.
	workers, failed := errgroup.WithContext(context.Background())
	if c.console {
		consoleCtx, stopConsole := context.WithCancel(ctx)
		defer stopConsole()
		go replayConsole(consoleCtx, hc, urls[0], operator)
	}
	begin := time.Now()
	for w := range c.workers {
		token, err := statedir.ReadCredential(filepath.Join(state, "credentials", fmt.Sprintf("worker-%d", w%64+1)))
		if err != nil {
			return res, err
		}
		workers.Go(func() error {
			timed := func(name, path string, body any) ([]byte, error) {
				t0 := time.Now()
				data, err := callOn(urls[w%len(urls)], token, "POST", path, body)
				lat[name][w] = append(lat[name][w], time.Since(t0))
				return data, err
			}
			for {
				// Take up to claim-batch of the jobs still to run.
				from := started.Add(int64(c.claimBatch)) - int64(c.claimBatch)
				n := min(int64(c.claimBatch), int64(c.jobs)-from)
				if n <= 0 || failed.Err() != nil {
					return nil
				}
				var body any
				if n > 1 {
					body = wire.ClaimRequest{Max: ptr(int(n))}
				}
				data, err := timed("claim", "/v1/claims", body)
				if err != nil {
					return err
				}
				var claim wire.ClaimResult
				if err := json.Unmarshal(data, &claim); err != nil || int64(len(claim.Jobs)) != n {
					return fmt.Errorf("claimed %d of %d (%s) after %d: %v", len(claim.Jobs), n, claim.Queue, done.Load(), err)
				}
				if c.batchCalls {
					if err := batchedRound(claim.Jobs, timed); err != nil {
						return err
					}
					done.Add(int64(len(claim.Jobs)))
					continue
				}
				for _, j := range claim.Jobs {
					ref := wire.ClaimRef{ClaimID: j.Claim.ClaimID, Generation: j.Claim.Generation}
					if _, err := timed("dispatch", "/v1/jobs/"+j.OperationID+"/dispatch", ref); err != nil {
						return err
					}
					key, _ := uuid.NewV7()
					// What a deterministic worker publishes: the only body
					// the host takes for the job.
					section, err := sections.Body(j.OperationID, j.Section, j.InputSHA256, j.Input.Document)
					if err != nil {
						return err
					}
					data, err = timed("publish", "/v1/jobs/"+j.OperationID+"/publish", map[string]any{
						"operation_key": key.String(), "generation": j.Claim.Generation, "expected_version": 0,
						"body": json.RawMessage(section)})
					var outcome wire.Outcome
					if err != nil || json.Unmarshal(data, &outcome) != nil || outcome.Status != wire.StatusPublished {
						return fmt.Errorf("publish: %v %s", err, data)
					}
					done.Add(1)
				}
			}
		})
	}
	workersErr := workers.Wait()
	elapsed := time.Since(begin)
	res.HostCPUus = float64((hostsCPU() - hostCPU0).Microseconds()) / float64(c.jobs)
	res.ClientCPUus = float64((selfCPU() - clientCPU0).Microseconds()) / float64(c.jobs)
	if workersErr != nil {
		return res, workersErr
	}
	after, err := snapshotStorage(callOn, urls, operator)
	if err != nil {
		return res, err
	}
	res.JobsPerSec = float64(c.jobs) / elapsed.Seconds()
	if database == "" {
		for _, suffix := range []string{"", "-wal"} {
			if info, err := os.Stat(statedir.Location(state, "") + suffix); err == nil {
				res.DatabaseBytes += info.Size()
			}
		}
	}
	res.Latency = map[string]percentiles{}
	for name, per := range lat {
		all := slices.Concat(per...)
		slices.Sort(all)
		res.Latency[name] = percentiles{P50: ms(all[len(all)/2]), P99: ms(all[len(all)*99/100])}
	}
	res.TxPerJob = float64(after.WriteTransactions-before.WriteTransactions) / float64(c.jobs)
	res.HostStorage = after
	res.CommitsPerJob = float64(after.Commits-before.Commits) / float64(c.jobs)
	res.RoundTripsPerJob = float64(after.RoundTrips-before.RoundTrips) / float64(c.jobs)
	claims, claimed := after.Operations["claim"].minus(before.Operations["claim"]), int64(0)
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
	res.StatementsPerJob = float64(statements) / float64(c.jobs)
	// Under WAL, FULL syncs the WAL at every commit, and each checkpoint that
	// copies frames adds one sync. Checked against strace -c -e
	// fsync,fdatasync on the host: 688 observed vs 684 computed at FULL, 50
	// vs 44 at NORMAL (the difference is the shutdown's own syncs).
	// On PostgreSQL the server syncs its own WAL (one flush per commit,
	// fewer with its group commit), which the hosts cannot count.
	fsyncs := after.Checkpoints - before.Checkpoints
	if strings.EqualFold(c.sync, "FULL") || database != "" {
		fsyncs += after.Commits - before.Commits
	}
	res.FsyncsPerJob = float64(fsyncs) / float64(c.jobs)
	for _, cmd := range cmds {
		res.PeakRSSMiB = max(res.PeakRSSMiB, peakRSS(cmd.Process.Pid))
	}
	return res, nil
}

// batchedRound dispatches a claim's jobs in one batch call and publishes
// them in another.
func batchedRound(jobs []wire.ClaimedJob, timed func(name, path string, body any) ([]byte, error)) error {
	dispatches := wire.BatchRequest{}
	publications := wire.BatchRequest{}
	for _, j := range jobs {
		ref, err := json.Marshal(wire.ClaimRef{ClaimID: j.Claim.ClaimID, Generation: j.Claim.Generation})
		if err != nil {
			return err
		}
		dispatches.Items = append(dispatches.Items, wire.BatchItem{OperationID: j.OperationID, Request: ref})
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

// processCPU is a process's user + system CPU time, from /proc.
func processCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type storageStats struct {
	WriteTransactions int64                     `json:"write_transactions"`
	Commits           int64                     `json:"commits"`
	Checkpoints       int64                     `json:"checkpoints"`
	Retries           int64                     `json:"retries"`
	RoundTrips        int64                     `json:"round_trips"`
	SequencerRounds   int64                     `json:"sequencer_rounds"`
	SequencerEntries  int64                     `json:"sequencer_entries"`
	Operations        map[string]operationStats `json:"operations"`
}

type operationStats struct {
	Writes     int64 `json:"writes"`
	Statements int64 `json:"statements"`
	Rows       int64 `json:"rows"`
}

func (o operationStats) minus(earlier operationStats) operationStats {
	return operationStats{o.Writes - earlier.Writes, o.Statements - earlier.Statements, o.Rows - earlier.Rows}
}

// snapshotStorage sums the storage counters of every host.
func snapshotStorage(call func(base, token, method, path string, body any) ([]byte, error), urls []string, operator string) (storageStats, error) {
	var total storageStats
	for _, url := range urls {
		data, err := call(url, operator, "GET", "/admin/stats", nil)
		var snap struct{ Storage storageStats }
		if err == nil {
			err = json.Unmarshal(data, &snap)
		}
		if err != nil {
			return total, err
		}
		total.WriteTransactions += snap.Storage.WriteTransactions
		total.Commits += snap.Storage.Commits
		total.Checkpoints += snap.Storage.Checkpoints
		total.Retries += snap.Storage.Retries
		total.RoundTrips += snap.Storage.RoundTrips
		total.SequencerRounds += snap.Storage.SequencerRounds
		total.SequencerEntries += snap.Storage.SequencerEntries
		if total.Operations == nil {
			total.Operations = map[string]operationStats{}
		}
		for name, op := range snap.Storage.Operations {
			sum := total.Operations[name]
			total.Operations[name] = operationStats{sum.Writes + op.Writes, sum.Statements + op.Statements, sum.Rows + op.Rows}
		}
	}
	return total, nil
}

// replayConsole makes the requests an open console makes (see
// internal/httpapi/console/app.js): it follows the event stream, and after
// events (at most once a second) reads the stats and the first page of
// jobs; every 2 s it reads the series. Errors end it quietly: the
// measurement is the host's, and a console that stops is still measured.
func replayConsole(ctx context.Context, hc *http.Client, base, operator string) {
	get := func(path string) {
		client.Do(ctx, hc, base, operator, "GET", path, nil, nil)
	}
	events := make(chan struct{}, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, "GET", base+"/admin/events/stream", nil)
		if err != nil {
			return
		}
		req.Header.Set("Authorization", "Bearer "+operator)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: ") {
				select {
				case events <- struct{}{}:
				default:
				}
			}
		}
	}()
	series := time.NewTicker(2 * time.Second)
	defer series.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-series.C:
			get("/admin/series")
		case <-events:
			get("/admin/stats")
			get("/admin/jobs?limit=50")
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// enqueueBackingOff enqueues n jobs and then puts them in a retry's
// backoff for a day, as if each had failed once, so that they are the
// oldest queued jobs and none is claimable during the run. The backoff is
// written through the store (JobRequeue, in one transaction): a benchmark
// fixture, standing in for n failed attempts that would take the run
// longer than the measurement.
func enqueueBackingOff(ctx context.Context, call func(token, method, path string, body any) ([]byte, error),
	operator, state, database string, n int) error {
	var keys []string
	for queued := 0; queued < n; {
		k := min(64, n-queued)
		key := fmt.Sprint("backing-off-", len(keys))
		if _, err := call(operator, "POST", "/admin/reports", map[string]any{"document": "Benchmark document. It must be short.",
			"sections": slices.Repeat([]string{"summary"}, k), "idempotency_key": key}); err != nil {
			return err
		}
		keys = append(keys, key)
		queued += k
	}
	db, err := backend.Open(ctx, statedir.Location(state, database), backend.Options{})
	if err != nil {
		return err
	}
	defer db.Close()
	later := time.Now().Add(24 * time.Hour).UnixMilli()
	if err := db.WithTx(ctx, func(tx *store.Tx) error {
		for _, key := range keys {
			ops, err := tx.JobListByBatch(ctx, key)
			if err != nil {
				return err
			}
			for _, op := range ops {
				if err := tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: op, IfState: wire.Queued, Attempts: 1,
					ClaimableAtMS: later, LastError: "benchmark backoff", Reason: "benchmark backoff", NowMS: tx.NowMS()}); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if database != "" {
		return postgres.VacuumAnalyze(ctx, database)
	}
	return nil
}

// peakRSS is the process's high-water resident set (VmHWM) in MiB.
func peakRSS(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

func benchRiver(c config) (riverResult, error) {
	args := []string{"run", ".", "-jobs", strconv.Itoa(c.jobs), "-workers", strconv.Itoa(c.workers), "-sync", c.sync}
	if c.database != "" {
		// River on the same server, directly (no -db-latency proxy).
		args = append(args, "-database", c.database)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = c.river
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return riverResult{}, err
	}
	var r riverResult
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	err = json.Unmarshal([]byte(lines[len(lines)-1]), &r)
	return r, err
}

func ptr[T any](v T) *T { return &v }
