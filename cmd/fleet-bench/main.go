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
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleet/fleet/internal/client"
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
	admit                  bool
	workers, jobs, backlog int
	backlogBackingOff      bool
	console                bool
	sync, bin, river       string
	cpuProfile             string
	database               string // postgres:// URL of a fresh schema, or "" for SQLite
	hosts                  int
	settle                 time.Duration
	warmup                 int
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
	flag.BoolVar(&c.admit, "admit", false, "claims admit their jobs ({\"admit\": true}): a job in two calls, claim-and-admit then publish, with no dispatch")
	flag.DurationVar(&c.settle, "settle", 2*time.Second, "pause after enqueueing, so the background checkpoint absorbs the bulk insert before measuring")
	flag.IntVar(&c.warmup, "warmup", 0,
		"jobs run through the same hosts and workers before the measured ones, not counted: what each host pays once (its connections' first plans, caches) apart from what each job costs; not with -river")
	flag.Parse()
	if c.bin == "" {
		exe, _ := os.Executable()
		c.bin = filepath.Dir(exe)
	}
	if c.claimBatch < 1 || c.claimBatch > wire.MaxClaimBatch {
		fmt.Fprintf(os.Stderr, "fleet-bench: -claim-batch must be 1 to %d\n", wire.MaxClaimBatch)
		os.Exit(2)
	}
	if c.warmup < 0 || c.warmup > 0 && c.river != "" {
		fmt.Fprintln(os.Stderr, "fleet-bench: -warmup must be 0 or more, and 0 with -river (River's run has no warm-up)")
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
	printFleet(c, fleet)
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

// printFleet prints Fleet's figures for a reader, before the JSON line.
func printFleet(c config, fleet fleetResult) {
	fmt.Printf("fleet: %d jobs, %d workers, backlog %d, %s: %.0f jobs/s\n", c.jobs, c.workers, c.backlog, describeSetup(c), fleet.JobsPerSec)
	for _, name := range []string{"claim", "dispatch", "publish"} {
		l, ok := fleet.Latency[name]
		if !ok { // no dispatch: claims that admit
			continue
		}
		fmt.Printf("  %-8s p50 %6.2f ms  p99 %6.2f ms\n", name, l.P50, l.P99)
	}
	fmt.Printf("  write transactions/job %.2f, commits/job %.2f, fsyncs/job %.2f, batch reruns %d, peak host RSS %.1f MiB\n",
		fleet.TxPerJob, fleet.CommitsPerJob, fleet.FsyncsPerJob, fleet.HostStorage.Retries, fleet.PeakRSSMiB)
	fmt.Printf("  CPU per job: host %.0f µs, client %.0f µs, PostgreSQL %.0f µs\n", fleet.HostCPUus, fleet.ClientCPUus, fleet.PostgresCPUus)
	if fleet.RoundTripsPerJob > 0 {
		fmt.Printf("  round trips to PostgreSQL per job %.2f\n", fleet.RoundTripsPerJob)
	}
	for _, table := range slices.Sorted(maps.Keys(fleet.TableUpdates)) {
		if u := fleet.TableUpdates[table]; u.Updates > 0 {
			fmt.Printf("  %s: %.2f row updates per job, %.0f %% HOT\n", table, float64(u.Updates)/float64(c.jobs+c.warmup), 100*float64(u.HOTUpdates)/float64(u.Updates))
		}
	}
	if st := fleet.HostStorage; st.SequencerRounds > 0 {
		fmt.Printf("  sequencer (since the hosts started): %d rounds placed %d log entries, %.1f a round, %d of the rounds without listing; %d tries found the log lock taken\n",
			st.SequencerRounds, st.SequencerEntries, float64(st.SequencerEntries)/float64(st.SequencerRounds), st.SequencerUnlisted, st.SequencerBusy)
	}
	fmt.Printf("  statements: per claim %.2f (%.2f jobs a claim), per claimed job %.2f; per job, all writes %.2f (log rows not included)\n",
		fleet.StatementsPerClaim, fleet.JobsPerClaim, fleet.StatementsPerClaimedJob, fleet.StatementsPerJob)
	if fleet.DatabaseBytes > 0 {
		fmt.Printf("  database %.1f MiB: %.0f bytes per job\n", float64(fleet.DatabaseBytes)/(1<<20), float64(fleet.DatabaseBytes)/float64(c.jobs+c.backlog+c.warmup))
	}
}

// describeSetup names the backend and the calls' shape.
func describeSetup(c config) string {
	setup := "SQLite sync " + c.sync
	if c.database != "" {
		setup = fmt.Sprintf("PostgreSQL, %d host(s)", c.hosts)
	}
	if c.claimBatch > 1 {
		setup += fmt.Sprintf(", %d jobs a claim", c.claimBatch)
	}
	if c.batchCalls {
		setup += ", batch calls"
	}
	if c.admit {
		setup += ", claims that admit"
	}
	if c.dbLatency > 0 {
		setup += fmt.Sprintf(", %s each way to the database", c.dbLatency)
	}
	if c.warmup > 0 {
		setup += fmt.Sprintf(", after %d jobs' warm-up", c.warmup)
	}
	return setup
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
	// PostgresCPUus is every PostgreSQL process's CPU over the run, per
	// job (the server's, on this machine; 0 on SQLite).
	PostgresCPUus float64 `json:"postgres_cpu_us_per_job"`
	// TableUpdates are PostgreSQL's row updates by table over the run
	// (the enqueue's included), and how many were HOT.
	TableUpdates map[string]postgres.TableUpdates `json:"table_updates,omitempty"`
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
	// River's own process's CPU, and PostgreSQL's, per job while it
	// works the queue (the enqueue before it not counted).
	CPUus         float64 `json:"cpu_us_per_job"`
	PostgresCPUus float64 `json:"postgres_cpu_us_per_job"`
	// TableUpdates are PostgreSQL's row updates by table over the run
	// (the enqueue's included), and how many were HOT.
	TableUpdates map[string]postgres.TableUpdates `json:"table_updates,omitempty"`
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

// postgresCPU is the CPU time of every PostgreSQL process on this
// machine, with what the server's exited backends used (its reaped
// children's).
func postgresCPU() time.Duration {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, path := range stats {
		data, err := os.ReadFile(path)
		open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
		if err != nil || open < 0 || end < open || string(data[open+1:end]) != "postgres" {
			continue
		}
		fields := strings.Fields(string(data[end+2:]))
		for _, i := range []int{11, 12, 13, 14} { // utime, stime, cutime, cstime
			n, _ := strconv.ParseInt(fields[i], 10, 64)
			ticks += n
		}
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
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
	SequencerBusy     int64                     `json:"sequencer_busy"`
	SequencerUnlisted int64                     `json:"sequencer_unlisted"`
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
		total.SequencerBusy += snap.Storage.SequencerBusy
		total.SequencerUnlisted += snap.Storage.SequencerUnlisted
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
