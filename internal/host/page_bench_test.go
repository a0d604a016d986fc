package host_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"

	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// BenchmarkJobPage: one page of 50 jobs (GET /admin/jobs), unfiltered, by
// state and by section, with 100 and with 100,000 jobs, on SQLite and
// (with FLEET_TEST_POSTGRES_URL) on PostgreSQL, analyzed. Keyset paging
// makes each page cost the same; the counts by state that come with it
// are read at most once a second, so they are measured apart: GET
// /admin/stats ("stats") counts them each time, as the sampler does once a
// second on each host, and here every job is queued, so each is counted
// (BenchmarkStateCounts counts a history of completed ones).
//
//	go test ./internal/host -run '^$' -bench JobPage -benchtime 200x
func BenchmarkJobPage(b *testing.B) { onEachBackend(b, benchmarkJobPage) }

// onEachBackend runs bench on SQLite and, with FLEET_TEST_POSTGRES_URL, on
// PostgreSQL.
func onEachBackend(b *testing.B, bench func(b *testing.B)) {
	backends := []string{storetest.SQLite}
	if storetest.PostgresURL() != "" {
		backends = append(backends, storetest.Postgres)
	}
	for _, backend := range backends {
		b.Run(backend, bench)
	}
}

// queuedJobs is a host on a new state of n queued jobs, each section
// "summary" or "terms" of a one-line document, 64 a report.
func queuedJobs(b *testing.B, n int) (fixture, *host.Host) {
	b.Helper()
	f := newState(b, 100, 20, 1, func(m map[string]any) { m["sections"] = []string{"summary"} })
	h := f.open(b)
	for i := 1; i < n; i += 64 {
		doc, key := "Bench document.", fmt.Sprint("b", i)
		if _, err := h.Operator().SubmitReports(context.Background(), wire.ReportsRequest{Document: &doc,
			Sections: slices.Repeat([]string{"terms"}, min(64, n-i)), IdempotencyKey: &key}); err != nil {
			b.Fatal(err)
		}
	}
	return f, h
}

func benchmarkJobPage(b *testing.B) {
	for _, n := range []int{100, 100_000} {
		b.Run(fmt.Sprint(n, "-jobs"), func(b *testing.B) {
			ctx := context.Background()
			f, h := queuedJobs(b, n)
			if f.database != "" {
				analyze(b, f.database)
			}
			b.Run("stats", func(b *testing.B) {
				for b.Loop() {
					if s, err := h.Views().Stats(ctx); err != nil || s.Jobs[wire.Queued] != int64(n) {
						b.Fatalf("%d jobs queued, %v", s.Jobs[wire.Queued], err)
					}
				}
			})
			for name, q := range map[string]wire.JobPageQuery{"all": {}, "state": {State: wire.Queued}, "section": {Section: "terms"}} {
				b.Run(name, func(b *testing.B) {
					for b.Loop() {
						if page, err := h.Views().JobPage(ctx, q); err != nil || len(page.Jobs) != wire.DefaultJobPage {
							b.Fatalf("%d jobs, %v", len(page.Jobs), err)
						}
					}
				})
			}
		})
	}
}

// analyze has PostgreSQL take the statistics autovacuum takes within a
// minute of a burst of jobs: a page measured before would measure the
// planner's guesses about an unseen table (hundreds of milliseconds at
// 100,000 jobs, whichever indexes the jobs have).
func analyze(b *testing.B, database string) {
	b.Helper()
	db, err := sql.Open("pgx", database)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(context.Background(), "ANALYZE"); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStateCounts: GET /admin/stats (the counts by state that the
// sampler reads once a second on each host, and pages carry) with 100 and
// with 100,000 jobs, all but 64 of them completed: a fleet's history, on
// SQLite and (with FLEET_TEST_POSTGRES_URL) on PostgreSQL, vacuumed and
// analyzed as autovacuum leaves a table after a burst. The jobs are
// completed in the database directly: what is counted is the rows, not
// how they got there.
//
//	go test ./internal/host -run '^$' -bench StateCounts -benchtime 200x
func BenchmarkStateCounts(b *testing.B) { onEachBackend(b, benchmarkStateCounts) }

func benchmarkStateCounts(b *testing.B) {
	const open = 64
	for _, n := range []int{100, 100_000} {
		b.Run(fmt.Sprint(n, "-jobs"), func(b *testing.B) {
			ctx := context.Background()
			f, h := queuedJobs(b, n)
			db := f.rawDatabase(b)
			if _, err := db.ExecContext(ctx, `UPDATE jobs SET state = 'completed', finished_at_ms = updated_at_ms WHERE position <= $1`, n-open); err != nil {
				b.Fatal(err)
			}
			if f.database != "" {
				if _, err := db.ExecContext(ctx, `VACUUM ANALYZE`); err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				s, err := h.Views().Stats(ctx)
				if err != nil || s.Jobs[wire.Completed] != int64(n-open) || s.Jobs[wire.Queued] != open {
					b.Fatalf("%v, %v", s.Jobs, err)
				}
			}
		})
	}
}
