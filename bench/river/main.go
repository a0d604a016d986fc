// Command river burns down N no-op River jobs on SQLite (riversqlite over
// modernc.org/sqlite, WAL, one connection) or, with -database, on
// PostgreSQL (riverpgxv5, a fresh schema dropped afterwards) with W workers
// and prints one JSON line with the throughput. It is Fleet's yardstick: a
// separate module so that Fleet itself does not depend on River.
package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"crypto/rand"
	"encoding/hex"
	"net/url"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	_ "modernc.org/sqlite"
)

type noopArgs struct {
	N int `json:"n"`
}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (w *noopWorker) Work(ctx context.Context, job *river.Job[noopArgs]) error { return nil }

func main() {
	jobs := flag.Int("jobs", 5000, "jobs to burn down")
	workers := flag.Int("workers", 32, "River MaxWorkers")
	syncMode := flag.String("sync", "FULL", "SQLite synchronous: FULL or NORMAL")
	database := flag.String("database", "", "a postgres:// URL: run on PostgreSQL, in a fresh schema")
	flag.Parse()
	var err error
	if *database != "" {
		err = runPostgres(*database, *jobs, *workers)
	} else {
		err = run(*jobs, *workers, strings.ToUpper(*syncMode))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "river bench:", err)
		os.Exit(1)
	}
}

func run(jobs, workers int, syncMode string) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "river-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dsn := "file:" + filepath.Join(dir, "river.sqlite3") + "?_pragma=journal_mode(WAL)&_pragma=synchronous(" + syncMode +
		")&_pragma=busy_timeout(10000)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	// One connection: SQLite has one writer, as River's SQLite docs advise.
	db.SetMaxOpenConns(1)
	return burn(ctx, riversqlite.New(db), jobs, workers, syncMode)
}

// runPostgres burns down on PostgreSQL, in a schema of its own.
func runPostgres(location string, jobs, workers int) error {
	ctx := context.Background()
	suffix := make([]byte, 6)
	rand.Read(suffix)
	schema := "river_bench_" + hex.EncodeToString(suffix)
	admin, err := pgx.Connect(ctx, location)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return err
	}
	defer admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	u, err := url.Parse(location)
	if err != nil {
		return err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		return err
	}
	defer pool.Close()
	return burn(ctx, riverpgxv5.New(pool), jobs, workers, "postgres")
}

// quiet is how long burn waits for the next completion before it gives up.
var quiet = 60 * time.Second

// burn inserts jobs no-op jobs, then times River working them down.
func burn[TTx any](ctx context.Context, driver riverdriver.Driver[TTx], jobs, workers int, syncMode string) error {
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	ws := river.NewWorkers()
	river.AddWorker(ws, &noopWorker{})
	client, err := river.NewClient(driver, &river.Config{
		// The fetch settings River's own benchmark uses for throughput.
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:           ws,
	})
	if err != nil {
		return err
	}
	for inserted := 0; inserted < jobs; {
		batch := make([]river.InsertManyParams, 0, 1000)
		for ; len(batch) < cap(batch) && inserted < jobs; inserted++ {
			batch = append(batch, river.InsertManyParams{Args: noopArgs{N: inserted}})
		}
		if _, err := client.InsertMany(ctx, batch); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
	}
	// Room for every job's event: River drops what its buffer (1,000 by
	// default) cannot take, and workers finish in bursts larger than that.
	done, cancel := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: jobs,
		Kinds: []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed}})
	defer cancel()
	cpu0, pg0 := selfCPU(), postgresCPU()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	var last time.Time
	for worked := 0; worked < jobs; worked++ {
		select {
		case ev := <-done:
			if ev.Kind != river.EventKindJobCompleted {
				return fmt.Errorf("job %d failed", ev.Job.ID)
			}
			last = time.Now()
		case <-time.After(quiet):
			return fmt.Errorf("only %d of %d jobs completed", worked, jobs)
		}
	}
	elapsed := last.Sub(start)
	perJob := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(jobs) }
	cpu, pg := perJob(selfCPU()-cpu0), perJob(postgresCPU()-pg0)
	stopCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	client.Stop(stopCtx)
	out, _ := json.Marshal(map[string]any{"system": "river", "jobs": jobs, "workers": workers, "sync": syncMode,
		"elapsed_ms": elapsed.Milliseconds(), "jobs_per_sec": float64(jobs) / elapsed.Seconds(),
		"cpu_us_per_job": cpu, "postgres_cpu_us_per_job": pg})
	fmt.Println(string(out))
	return nil
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// postgresCPU is the CPU time of every PostgreSQL process on this
// machine, with what the server's exited backends used (its reaped
// children's): 0 where there is none (SQLite).
func postgresCPU() time.Duration {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, path := range stats {
		data, err := os.ReadFile(path)
		open := bytes.IndexByte(data, '(')
		end := bytes.LastIndexByte(data, ')')
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
