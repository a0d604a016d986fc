package postgres_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
)

// planNode is one node of EXPLAIN (FORMAT JSON)'s plan tree.
type planNode struct {
	NodeType     string     `json:"Node Type"`
	Parent       string     `json:"Parent Relationship"` // Outer, Inner, …
	RelationName string     `json:"Relation Name"`
	CTEName      string     `json:"CTE Name"`
	Output       []string   `json:"Output"`       // what the node yields (VERBOSE)
	ActualLoops  int64      `json:"Actual Loops"` // with ANALYZE
	IndexName    string     `json:"Index Name"`
	IndexCond    string     `json:"Index Cond"`
	SharedHit    int64      `json:"Shared Hit Blocks"` // with BUFFERS
	Plans        []planNode `json:"Plans"`
}

// walk calls fn on n and every node under it.
func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// queryBody is a query of the committed .sql files as sqlc reads it, with
// each sqlc.embed replaced by the table's columns.
func queryBody(t *testing.T, file, name string) string {
	t.Helper()
	data, err := os.ReadFile("dbsqlc/" + file)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "-- name: "+name+" ")
	if !ok {
		t.Fatalf("no query %s in %s", name, file)
	}
	_, body, _ := strings.Cut(rest, "\n")
	body, _, _ = strings.Cut(body, "\n-- ")
	body = regexp.MustCompile(`sqlc\.embed\((\w+)\)`).ReplaceAllString(body, "$1.*")
	return strings.TrimSuffix(strings.TrimSpace(body), ";")
}

// sqlcArg is a sqlc.arg in a query's body.
var sqlcArg = regexp.MustCompile(`sqlc\.arg\('(\w+)'\)`)

// statement is a query of the committed .sql files, as sqlc sends it, with
// each sqlc.arg replaced by the literal args gives for it (and each
// sqlc.embed by the table's columns).
func statement(t *testing.T, file, name string, args map[string]string) string {
	t.Helper()
	return sqlcArg.ReplaceAllStringFunc(queryBody(t, file, name), func(m string) string {
		arg := m[len("sqlc.arg('") : len(m)-2]
		v, ok := args[arg]
		if !ok {
			t.Fatalf("%s: no value for %s", name, arg)
		}
		return v
	})
}

// explain is the plan PostgreSQL makes for query in a transaction with the
// settings the host's statement runs under (SET LOCAL), never running it.
func explain(t *testing.T, db *sql.DB, query string, settings ...string) planNode {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, s := range settings {
		if _, err := tx.ExecContext(ctx, "SET LOCAL "+s); err != nil {
			t.Fatal(err)
		}
	}
	return explainIn(t, tx, query)
}

// explainIn is EXPLAIN (VERBOSE, FORMAT JSON)'s plan of query (a
// statement, or EXECUTE of a prepared one) in tx.
func explainIn(t *testing.T, tx *sql.Tx, query string) planNode {
	t.Helper()
	var raw string
	if err := tx.QueryRowContext(context.Background(), "EXPLAIN (VERBOSE, FORMAT JSON) "+query).Scan(&raw); err != nil {
		t.Fatalf("explain %s: %v", query, err)
	}
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(raw), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("explain's answer %s: %v", raw, err)
	}
	return plans[0].Plan
}

// checkPlan fails unless the plan reads table only through the indexes
// named (never a sequential scan of it) and, with noSort, sorts nothing.
func checkPlan(t *testing.T, what string, plan planNode, table string, indexes []string, noSort bool) {
	t.Helper()
	used := map[string]bool{}
	plan.walk(func(n planNode) {
		switch {
		case noSort && n.NodeType == "Sort":
			t.Errorf("%s: the plan sorts (%+v)", what, plan)
		case n.RelationName == table && n.NodeType == "Seq Scan":
			t.Errorf("%s: the plan reads all of %s (%+v)", what, table, plan)
		case n.IndexName != "":
			used[n.IndexName] = true
		}
	})
	for _, index := range indexes {
		if !used[index] {
			t.Errorf("%s: the plan does not use %s (%v used; %+v)", what, index, used, plan)
		}
	}
}

// execAll runs each statement on the schema location names, in order.
func execAll(t *testing.T, location string, statements ...string) {
	t.Helper()
	for _, q := range statements {
		if err := postgres.Exec(context.Background(), location, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// queued is a new schema with n jobs queued (op-1 to op-n, each with its
// document doc-i, at the priority the SQL expression of i gives).
func queued(t *testing.T, n int, priority string) string {
	t.Helper()
	ctx := context.Background()
	location := storetest.NewPostgresLocation(t)
	created, err := postgres.Create(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	created.Close()
	execAll(t, location,
		`INSERT INTO batches (idempotency_key, request_sha256, document, created_at_ms) VALUES ('seed', '', '', 0)`,
		fmt.Sprintf(`INSERT INTO documents (id, version, body, owner, generation, updated_at_ms)
			SELECT 'doc-' || i, 0, 'null', '', 0, 0 FROM generate_series(1, %d) AS i`, n),
		fmt.Sprintf(`INSERT INTO jobs (operation_id, position, batch_key, section, document_id, input_sha256, state, created_at_ms, updated_at_ms, priority)
			SELECT 'op-' || i, i, 'seed', 'summary', 'doc-' || i, '', 'queued', i, i, %s FROM generate_series(1, %d) AS i`, priority, n),
		fmt.Sprintf(`INSERT INTO job_keys (position, operation_id, document_id, section, tenant, priority)
			SELECT i, 'op-' || i, 'doc-' || i, 'summary', 'default', %s FROM generate_series(1, %d) AS i`, priority, n),
	)
	return location
}

// TestHotPathPlans: at 100,000 queued jobs (and as many publications
// retained), before the planner has
// statistics for them (a burst enqueued before autovacuum analyzes it) and
// after, the claim (and a claim that admits' pick) reads one range of
// jobs_claimable per priority and sorts nothing (as the host runs it:
// sorts off for that statement), the batch lookups and a single call's
// transitions read the jobs, documents and operations by their keys, and
// the lease sweep reads only the jobs in flight, never a whole table. A
// planner or index change that loses this fails here rather than only in
// a benchmark.
func TestHotPathPlans(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	ctx := context.Background()
	location := queued(t, 100000, "1 + i % 4")
	// As many publications retained as a fleet that worked as much again.
	if err := postgres.Exec(ctx, location, `INSERT INTO operations (document_id, operation_key, binding, caller, status, outcome, deliveries, created_at_ms)
			SELECT 'doc-' || i, 'key-' || i, '{}', 'worker-1', 'published', '{}', 1, i FROM generate_series(1, 100000) AS i`); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", location)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	claim := statement(t, "jobs.sql", "JobClaimMany", map[string]string{"tenant": "'default'", "now_ms": "200000", "max": "32",
		"claim_prefix": "'k.'", "worker": "'worker-1'", "claim_host": "'a'", "lease_expires_at_ms": "300000", "unless_paused": "true"})
	pick := statement(t, "jobs.sql", "JobPickMany", map[string]string{"tenant": "'default'", "now_ms": "200000", "max": "32",
		"exclude": `'{op-1,op-2}'`, "worker": "'worker-1'", "unless_paused": "true", "owners": `'{}'`})
	sweep := statement(t, "jobs.sql", "JobListExpiredForUpdate", map[string]string{"now_ms": "200000"})
	lookups := map[string]struct {
		query   string
		table   string
		indexes []string
	}{
		"JobGetMany": {statement(t, "jobs.sql", "JobGetMany", map[string]string{"operation_ids": `'{op-5,op-77,op-99999}'`}),
			"jobs", []string{"jobs_pkey", "documents_pkey"}},
		"DocumentWriteMany": {statement(t, "documents.sql", "DocumentWriteMany", map[string]string{"ids": `'{doc-5,doc-77}'`,
			"bodies": `'{"{}","{}"}'`, "versions": `'{1,1}'`, "updated_at_ms": `'{1,1}'`}), "documents", []string{"documents_pkey"}},
		"OperationGetMany": {statement(t, "documents.sql", "OperationGetMany", map[string]string{
			"document_ids": `'{doc-5,doc-77}'`, "operation_keys": `'{k1,k2}'`}), "operations", []string{"operations_pkey"}},
		// A single call's transitions read their job by its key.
		"JobClaimWrite": {statement(t, "jobs.sql", "JobClaimWrite", map[string]string{"state": "'running'", "claim_id": "'k.5'",
			"worker": "'w'", "claim_host": "'h'", "lease_expires_at_ms": "400000", "reason": "''", "claimed_at_ms": "200001",
			"started_at_ms": "200001", "finished_at_ms": "0", "reserved": "1", "reserve_shard": "0", "tenant_shard": "0",
			"reserve_credential": "''", "admission_claim_id": "'k.5'", "admission": "'x'", "updated_at_ms": "200001",
			"operation_id": "'op-5'"}), "jobs", []string{"jobs_pkey"}},
		"JobRenewLease": {statement(t, "jobs.sql", "JobRenewLease", map[string]string{"lease_expires_at_ms": "410000",
			"updated_at_ms": "200002", "operation_id": "'op-5'", "if_claim_id": "'k.5'"}), "jobs", []string{"jobs_pkey"}},
		"JobComplete": {statement(t, "jobs.sql", "JobComplete", map[string]string{"updated_at_ms": "200003", "reason": "''",
			"operation_id": "'op-5'", "if_state": "'running'"}), "jobs", []string{"jobs_pkey"}},
	}
	for _, analyzed := range []bool{false, true} {
		when := "before ANALYZE"
		if analyzed {
			if err := postgres.Exec(ctx, location, `ANALYZE`); err != nil {
				t.Fatal(err)
			}
			when = "after ANALYZE"
		}
		checkPlan(t, "the claim "+when, explain(t, db, claim, "enable_sort = off"), "jobs", []string{"jobs_claimable", "jobs_pkey", "documents_pkey"}, true)
		checkPlan(t, "the claim's pick "+when, explain(t, db, pick, "enable_sort = off"), "jobs", []string{"jobs_claimable", "documents_pkey"}, true)
		for name, l := range lookups {
			checkPlan(t, name+" "+when, explain(t, db, l.query), l.table, l.indexes, false)
		}
		if analyzed {
			pagePlans(t, db, when)
		}
		// The lease sweeper: the lease is not indexed (so a heartbeat is
		// HOT), and lapsed leases are found among the jobs in flight, in an
		// index led by the state.
		explain(t, db, sweep).walk(func(n planNode) {
			ofJobs := n.RelationName == "jobs" && n.NodeType != "Bitmap Heap Scan" || strings.HasPrefix(n.IndexName, "jobs_")
			if ofJobs && n.IndexName != "jobs_by_state" && n.IndexName != "jobs_claimable" {
				t.Errorf("the lease sweep %s reads jobs by %s %q, not by its state", when, n.NodeType, n.IndexName)
			}
		})
	}
	multiRowTransition(t, ctx, db, location)
	hotUpdates(t, ctx)
}

// pagePlans: once ANALYZE has seen the jobs, a page of the console's
// (JobPage, JobPageByState), by each filter, and the reads by what no
// transition changes (a document's job, the last position, a keyed
// claim's jobs by owner) read no whole table of jobs, and a page in queue
// order sorts nothing unless its filter is the owner (a worker's few
// jobs, sorted). Before ANALYZE the planner sorts a filtered page, as it
// did with these indexes on the jobs table (where it read every job for
// an unfiltered page too).
func pagePlans(t *testing.T, db *sql.DB, when string) {
	t.Helper()
	page := func(filter, value string) string {
		args := map[string]string{"after": "10", "section": "''", "owner": "''", "priority": "0", "tenant": "''",
			"prefix": "''", "max": "50"}
		if filter != "" {
			args[filter] = value
		}
		if filter == "state" { // as the executor asks for it
			return statement(t, "jobs.sql", "JobPageByState", args)
		}
		return statement(t, "jobs.sql", "JobPage", args)
	}
	for filter, value := range map[string]string{"": "", "state": "'queued'", "section": "'summary'", "owner": "'worker-1'",
		"tenant": "'default'", "prefix": "'op-7'", "priority": "3"} {
		checkPlan(t, "a page filtered by "+filter+" "+when, explain(t, db, page(filter, value)), "jobs", nil, filter != "owner")
	}
	for name, query := range map[string]string{
		"JobTenantOfDocument": statement(t, "jobs.sql", "JobTenantOfDocument", map[string]string{"document_id": "'doc-77'"}),
		"JobMaxPosition":      statement(t, "jobs.sql", "JobMaxPosition", nil),
		"JobListClaimedUnder": statement(t, "jobs.sql", "JobListClaimedUnder", map[string]string{"worker": "'worker-1'", "prefix": "'k.'"}),
	} {
		checkPlan(t, name+" "+when, explain(t, db, query), "jobs", nil, false)
	}
}

// hotUpdates runs 32 claimed jobs' lives on with the host's own
// statements, committed on one connection: set running, a lease renewed,
// completed. It counts what PostgreSQL says it did with each step's
// updates of the jobs table (pg_stat_user_tables; BENCHMARKS.md). A
// transition changes the state, which indexes hold, so it is never HOT
// and writes an entry into each of the table's indexes. A heartbeat
// changes only the lease, which no index holds, so each of the 32 is HOT.
// A HOT update also needs room on its row's page. So the jobs are in a
// schema of their own, packed a quarter full: a busy server's open
// transactions, which keep VACUUM from freeing the dead versions, cannot
// leave a page without room.
func hotUpdates(t *testing.T, ctx context.Context) {
	t.Helper()
	location := queued(t, 32, "2")
	execAll(t, location,
		`UPDATE jobs SET state = 'claimed', claim_id = 'c-' || position, lease_expires_at_ms = 300000`,
		`ALTER TABLE jobs SET (fillfactor = 25)`,
		`VACUUM FULL jobs`,
	)
	db, err := sql.Open("pgx", location)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	counts := func() (updates, hot int64) {
		t.Helper()
		if _, err := c.ExecContext(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		if err := c.QueryRowContext(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
			WHERE relname = 'jobs' AND schemaname = current_schema()`).Scan(&updates, &hot); err != nil {
			t.Fatal(err)
		}
		return updates, hot
	}
	step := func(what string, query func(op, claim string) string) (updates, hot int64, entries map[string]int) {
		t.Helper()
		updates0, hot0 := counts()
		from := walPosition(t, ctx, c)
		for i := 1; i <= 32; i++ {
			q := query(fmt.Sprintf("'op-%d'", i), fmt.Sprintf("'c-%d'", i))
			if _, err := c.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %s: %v", what, q, err)
			}
		}
		updates, hot = counts()
		if updates-updates0 != 32 {
			t.Fatalf("%s: the jobs table counted %d updates for 32", what, updates-updates0)
		}
		return updates - updates0, hot - hot0, indexWrites(t, ctx, c, "jobs", from)
	}
	_, runningHot, runningEntries := step("set running", func(op, claim string) string {
		return statement(t, "jobs.sql", "JobSetRunning", map[string]string{"updated_at_ms": "200001", "reserved": "1", "reserve_shard": "0",
			"tenant_shard": "0", "reserve_credential": "''", "admission": "'x'", "lease_expires_at_ms": "400000", "reason": "''",
			"operation_id": op, "if_claim_id": claim})
	})
	_, renewedHot, renewedEntries := step("renewed", func(op, claim string) string {
		return statement(t, "jobs.sql", "JobRenewLease", map[string]string{"lease_expires_at_ms": "410000", "updated_at_ms": "200002",
			"operation_id": op, "if_claim_id": claim})
	})
	_, completedHot, completedEntries := step("completed", func(op, claim string) string {
		return statement(t, "jobs.sql", "JobComplete", map[string]string{"updated_at_ms": "200003", "reason": "''",
			"operation_id": op, "if_state": "'running'"})
	})
	if renewedHot != 32 {
		t.Errorf("of 32 heartbeats (a lease renewed, no index holding it), %d were HOT updates of jobs; want all", renewedHot)
	}
	if len(renewedEntries) != 0 {
		t.Errorf("32 heartbeats wrote index entries: %v; want none", renewedEntries)
	}
	// A transition writes its row's new version an entry in each index
	// of the jobs table: the key's and the state's alone. What pages and
	// filters read and no transition changes (the position, the section,
	// the document) is indexed in job_keys, written once at enqueue.
	for what, entries := range map[string]map[string]int{"set running": runningEntries, "completed": completedEntries} {
		if want := map[string]int{"jobs_pkey": 32, "jobs_by_state": 32, "jobs_claimable": 32}; !maps.Equal(entries, want) {
			t.Errorf("32 jobs %s wrote index entries %v; want %v", what, entries, want)
		}
	}
	t.Logf("32 jobs: set running %d HOT, index entries %v; renewed %d HOT; completed %d HOT, index entries %v",
		runningHot, runningEntries, renewedHot, completedHot, completedEntries)
}

// multiRowTransition: with 1,024 jobs in flight (32 workers holding 32
// each) and the planner's statistics from before any was claimed (as
// after a burst of enqueues), 32 jobs set running by the host's own
// statement (JobSetRunning) one at a time each read their job by its key,
// as they do once ANALYZE has seen the jobs in flight (its guard compared
// state as the index did, and read every in-flight job's entry of
// jobs_by_lease); and 32 set running in one UPDATE … FROM unnest(…)
// (JobSetRunningMany, a batch's admissions) read them by key too, as do
// 32 completed in one (JobCompleteMany, a batch's publications).
// Everything is run and rolled back; the times and the pages touched are
// logged (BENCHMARKS.md).
func multiRowTransition(t *testing.T, ctx context.Context, db *sql.DB, location string) {
	t.Helper()
	if err := postgres.Exec(ctx, location, `UPDATE jobs SET state = 'claimed', claim_id = 'c-' || position, lease_expires_at_ms = 300000 WHERE position <= 1024`); err != nil {
		t.Fatal(err)
	}
	ops, claims := make([]string, 32), make([]string, 32)
	for i := range ops {
		ops[i], claims[i] = fmt.Sprintf("op-%d", i+1), fmt.Sprintf("c-%d", i+1)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	analyze := func(query string, args ...any) (planNode, float64) {
		t.Helper()
		var raw string
		if err := tx.QueryRowContext(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+query, args...).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		var plans []struct {
			Plan          planNode `json:"Plan"`
			ExecutionTime float64  `json:"Execution Time"`
		}
		if err := json.Unmarshal([]byte(raw), &plans); err != nil || len(plans) != 1 {
			t.Fatalf("explain's answer %s: %v", raw, err)
		}
		return plans[0].Plan, plans[0].ExecutionTime
	}
	array := func(v string) string { return "'{" + strings.TrimSuffix(strings.Repeat(v+",", 32), ",") + "}'" }
	multi, multiTime := analyze(statement(t, "jobs.sql", "JobSetRunningMany", map[string]string{
		"operation_ids": "'{" + strings.Join(ops, ",") + "}'", "if_claim_ids": "'{" + strings.Join(claims, ",") + "}'",
		"reserved": array("1"), "reserve_shards": array("0"), "tenant_shards": array("0"), "reserve_credentials": array(`""`),
		"admissions": array("x"), "lease_expires_at_ms": array("400000"), "reasons": array(`""`), "updated_at_ms": "200001"}))
	// The host's statement (a batch's admissions, 1b78be7) reads each job
	// by its key, whatever the statistics say of the states.
	checkPlan(t, "32 jobs set running in one statement (JobSetRunningMany)", multi, "jobs", []string{"jobs_pkey"}, false)
	// A batch's publications complete those 32 (now running) by key too.
	completed, _ := analyze(statement(t, "jobs.sql", "JobCompleteMany", map[string]string{
		"operation_ids": "'{" + strings.Join(ops, ",") + "}'", "if_states": array("running"), "reasons": array("published"),
		"updated_at_ms": "200002"}))
	checkPlan(t, "32 jobs completed in one statement (JobCompleteMany)", completed, "jobs", []string{"jobs_pkey"}, false)
	// A claim that admits writes its picked jobs (queued, 32 of those
	// past the ones in flight) by their keys too.
	queuedOps := make([]string, 32)
	for i := range queuedOps {
		queuedOps[i] = fmt.Sprintf("op-%d", 2001+i)
	}
	written, writtenTime := analyze(statement(t, "jobs.sql", "JobClaimWriteMany", map[string]string{
		"operation_ids": "'{" + strings.Join(queuedOps, ",") + "}'", "states": array("running"), "claim_ids": array("k"),
		"workers": array("w"), "claim_hosts": array("h"), "lease_expires_at_ms": array("400000"), "reasons": array(`""`),
		"claimed_at_ms": array("200001"), "started_at_ms": array("200001"), "finished_at_ms": array("0"), "reserved": array("1"),
		"reserve_shards": array("0"), "tenant_shards": array("0"), "reserve_credentials": array(`""`), "admission_claim_ids": array("k"),
		"admissions": array("x"), "updated_at_ms": array("200001")}))
	checkPlan(t, "32 picked jobs written claimed and running in one statement (JobClaimWriteMany)", written, "jobs", []string{"jobs_pkey"}, false)
	// Each reads the batch's rows once: read again for each of the 32
	// jobs, JobClaimWriteMany's 17 columns took about a third of its time
	// (BENCHMARKS.md, "A batch's rows read once …").
	for what, plan := range map[string]planNode{"JobSetRunningMany": multi, "JobCompleteMany": completed, "JobClaimWriteMany": written} {
		scans := 0
		plan.walk(func(n planNode) {
			if n.NodeType == "CTE Scan" && n.CTEName == "d" {
				scans++
				if n.ActualLoops != 1 {
					t.Errorf("%s read the batch's rows %d times", what, n.ActualLoops)
				}
			}
		})
		if scans != 1 {
			t.Errorf("%s's plan scans the batch's rows (d) %d times, not once (%+v)", what, scans, plan)
		}
	}
	singles := func(from int) string {
		var took float64
		var hits int64
		indexes := map[string]bool{}
		for i := from; i < from+32; i++ {
			one, ms := analyze(statement(t, "jobs.sql", "JobSetRunning", map[string]string{"updated_at_ms": "200001", "reserved": "1",
				"reserve_shard": "0", "tenant_shard": "0", "reserve_credential": "''", "admission": "'x'", "lease_expires_at_ms": "400000",
				"reason": "''", "operation_id": fmt.Sprintf("'op-%d'", i), "if_claim_id": fmt.Sprintf("'c-%d'", i)}))
			checkPlan(t, "JobSetRunning", one, "jobs", []string{"jobs_pkey"}, false)
			one.walk(func(n planNode) {
				if n.IndexName != "" {
					indexes[n.IndexName] = true
				}
			})
			took += ms
			hits += one.SharedHit
		}
		return fmt.Sprintf("%.2f ms, %d pages, reading %v", took, hits, slices.Sorted(maps.Keys(indexes)))
	}
	stale := singles(33)
	if _, err := tx.ExecContext(ctx, `ANALYZE jobs`); err != nil {
		t.Fatal(err)
	}
	t.Logf("1,024 in flight of 100,000: 32 set running in one statement %.2f ms, %d shared pages hit; 32 picked written claimed and running in one statement %.2f ms, %d pages; by JobSetRunning one at a time %s; the same once ANALYZE has seen them in flight %s",
		multiTime, multi.SharedHit, writtenTime, written.SharedHit, stale, singles(65))
}

// TestStateCountPlan: at 100,000 jobs, all but 64 of them completed and
// analyzed, the counts by state read the jobs not completed by an index
// led by the state, and the jobs enqueued by job_keys' key: never the
// whole table of jobs, which a fleet's history grows. The sampler counts
// once a second on every host.
func TestStateCountPlan(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	location := queued(t, 100000, "2")
	execAll(t, location, `UPDATE jobs SET state = 'completed' WHERE position <= 99936`, `ANALYZE`)
	db, err := sql.Open("pgx", location)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	count := statement(t, "jobs.sql", "JobCountByState", map[string]string{
		"states": "'{" + strings.Join(store.CountedStates, ",") + "}'"})
	plan := explain(t, db, count)
	checkPlan(t, "JobCountByState", plan, "jobs", []string{"job_keys_pkey"}, false)
	plan.walk(func(n planNode) {
		if n.RelationName == "jobs" && n.IndexName != "jobs_by_state" && n.IndexName != "jobs_claimable" {
			t.Errorf("JobCountByState reads jobs by %s %q, not by their state", n.NodeType, n.IndexName)
		}
	})
}
