package sqlite_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/store/sqlite"
)

// TestStateCountPlan: the counts by state read the jobs of each state
// counted through jobs_by_state, and the jobs enqueued by the position's
// index, never every job: completed jobs, which a fleet's history grows
// in, are what is left (JobCountByState). The sampler counts once a
// second.
func TestStateCountPlan(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleet.sqlite3")
	created, err := sqlite.Create(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	created.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	src, err := os.ReadFile(filepath.Join("dbsqlc", "jobs.sql"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"JobCountInState": "SEARCH jobs USING COVERING INDEX jobs_by_state (state=?)",
		"JobMaxPosition": "SEARCH jobs USING COVERING INDEX"} {
		body := string(src[strings.Index(string(src), "-- name: "+name+" :one"):])
		body = body[:strings.Index(body, ";")]
		if plan := queryPlan(t, db, body, sql.Named("state", "queued")); strings.Contains(plan, "SCAN") || !strings.Contains(plan, want) {
			t.Errorf("%s reads every job, or not by its index:\n%s", name, plan)
		}
	}
}

// queryPlan is EXPLAIN QUERY PLAN's lines for query.
func queryPlan(t *testing.T, db *sql.DB, query string, args ...any) string {
	t.Helper()
	rows, err := db.Query("EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var details []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		details = append(details, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(details, "\n")
}
