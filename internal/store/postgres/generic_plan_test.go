package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
)

// prepared is a query of the committed .sql files with each sqlc.arg
// numbered as a parameter ($1 for the first name, and so on), and the
// literal args gives for each, in that order.
func prepared(t *testing.T, file, name string, args map[string]string) (query string, values []string) {
	t.Helper()
	numbers := map[string]int{}
	query = sqlcArg.ReplaceAllStringFunc(queryBody(t, file, name), func(m string) string {
		arg := m[len("sqlc.arg('") : len(m)-2]
		if _, ok := numbers[arg]; !ok {
			v, ok := args[arg]
			if !ok {
				t.Fatalf("%s: no value for %s", name, arg)
			}
			values = append(values, v)
			numbers[arg] = len(values)
		}
		return fmt.Sprintf("$%d", numbers[arg])
	})
	return query, values
}

// genericPlan is the plan PostgreSQL keeps for the prepared query in the
// mode the host runs it in (statementPlans, planSetting): planned without
// its arguments, whatever they are. The query is prepared on c as name
// unless it is already, and explained.
func genericPlan(t *testing.T, c *sql.Conn, file, name string, args map[string]string, settings ...string) planNode {
	t.Helper()
	ctx := context.Background()
	query, values := prepared(t, file, name, args)
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, postgres.GenericPlanSetting()); err != nil {
		t.Fatal(err)
	}
	for _, s := range settings {
		if _, err := tx.ExecContext(ctx, "SET LOCAL "+s); err != nil {
			t.Fatal(err)
		}
	}
	var known bool
	if err := tx.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_prepared_statements WHERE name = lower($1))", name).Scan(&known); err != nil {
		t.Fatal(err)
	}
	if !known {
		// PREPARE outlives the transaction rolled back.
		if _, err := tx.ExecContext(ctx, "PREPARE "+name+" AS "+query); err != nil {
			t.Fatalf("prepare %s: %v", name, err)
		}
	}
	execute := "EXECUTE " + name
	if len(values) > 0 {
		execute += "(" + strings.Join(values, ", ") + ")"
	}
	return explainIn(t, tx, execute)
}

// TestGenericPlans: each statement the host runs with a generic plan
// from its first execution (statementPlans) reads no whole table that
// grows with the work (jobs, their keys, documents, operations,
// mutations, assignments, the log), and reads the jobs, documents and the
// queue by the indexes its arguments name: at 100,000 queued jobs and as
// many publications retained, before ANALYZE and after; and planned on a
// young schema of three jobs, then run, that plan kept, once 100,000 more
// are queued and published (a generic plan is made once, without the
// arguments, and kept until the table is analyzed again). A statement
// whose generic plan read a whole table must not be in the list.
func TestGenericPlans(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	ctx := context.Background()
	const publications = `INSERT INTO operations (document_id, operation_key, binding, caller, status, outcome, deliveries, created_at_ms)
		SELECT 'doc-' || i, 'key-' || i, '{}', 'worker-1', 'published', '{}', 1, i FROM generate_series(%d, %d) AS i`
	ops := `'{op-5,op-77,op-99999}'`
	three := func(v string) string { return "'{" + v + "," + v + "," + v + "}'" }
	type check struct {
		file     string
		args     map[string]string
		settings []string
		indexes  []string // that the plan must read by
		noSort   bool
	}
	checks := map[string]check{
		"JobPickMany": {"jobs.sql", map[string]string{"tenant": "'default'", "now_ms": "200000", "max": "32",
			"exclude": `'{op-1,op-2}'`, "worker": "'worker-1'", "unless_paused": "true", "owners": `'{}'`}, []string{"enable_sort = off"}, []string{"jobs_claimable", "documents_pkey"}, true},
		"JobClaimWriteMany": {"jobs.sql", map[string]string{"operation_ids": ops, "states": three("running"), "claim_ids": three("k"),
			"workers": three("w"), "claim_hosts": three("h"), "lease_expires_at_ms": three("400000"), "reasons": three(`""`),
			"claimed_at_ms": three("200001"), "started_at_ms": three("200001"), "finished_at_ms": three("0"), "reserved": three("1"),
			"reserve_shards": three("0"), "tenant_shards": three("0"), "reserve_credentials": three(`""`), "admission_claim_ids": three("k"),
			"admissions": three("x"), "updated_at_ms": three("200001")}, nil, []string{"jobs_pkey"}, false},
		"JobCompleteMany": {"jobs.sql", map[string]string{"operation_ids": ops, "if_states": three("running"), "reasons": three("published"),
			"updated_at_ms": "200002"}, nil, []string{"jobs_pkey"}, false},
		"JobSetRunningMany": {"jobs.sql", map[string]string{"operation_ids": ops, "if_claim_ids": three("c"), "reserved": three("1"),
			"reserve_shards": three("0"), "tenant_shards": three("0"), "reserve_credentials": three(`""`), "admissions": three("x"),
			"lease_expires_at_ms": three("400000"), "reasons": three(`""`), "updated_at_ms": "200001"}, nil, []string{"jobs_pkey"}, false},
		"DocumentWriteMany": {"documents.sql", map[string]string{"ids": `'{doc-5,doc-77}'`, "bodies": `'{"{}","{}"}'`,
			"versions": `'{1,1}'`, "updated_at_ms": `'{1,1}'`}, nil, []string{"documents_pkey"}, false},
		"JobGetMany": {"jobs.sql", map[string]string{"operation_ids": ops}, nil, []string{"jobs_pkey", "documents_pkey", "operations_pkey"}, false},
		"OperationGetMany": {"documents.sql", map[string]string{"document_ids": `'{doc-5,doc-77}'`, "operation_keys": `'{key-5,key-77}'`},
			nil, []string{"operations_pkey"}, false},
		"MutationInsertMany": {"documents.sql", map[string]string{"document_ids": `'{doc-5}'`, "versions": `'{1}'`,
			"operation_keys": `'{k}'`, "callers": `'{w}'`, "at_ms": `'{1}'`}, nil, nil, false},
		"OperationInsertMany": {"documents.sql", map[string]string{"document_ids": `'{doc-5}'`, "operation_keys": `'{k}'`,
			"bindings": `'{"{}"}'`, "callers": `'{w}'`, "statuses": `'{published}'`, "outcomes": `'{"{}"}'`, "deliveries": `'{1}'`,
			"created_at_ms": `'{1}'`}, nil, nil, false},
		"TenantReserveAhead":    {"tenants.sql", map[string]string{"most": "32", "tenant": "'default'"}, nil, nil, false},
		"LevelsReserveAhead":    {"tenants.sql", map[string]string{"at_tenant": "1", "at_fleet": "1", "tenant": "'default'"}, nil, nil, false},
		"TenantReserveFree":     {"tenants.sql", map[string]string{"tenant": "'default'"}, nil, nil, false},
		"JobCountByState":       {"jobs.sql", map[string]string{"states": "'{queued,claimed,running}'"}, nil, nil, false},
		"JobListExpired":        {"jobs.sql", map[string]string{"now_ms": "200000"}, nil, nil, false},
		"ScheduleAnyDue":        {"schedules.sql", map[string]string{"now_ms": "200000"}, nil, nil, false},
		"AccountingReserveFree": {"accounting.sql", map[string]string{}, nil, nil, false},
		"JobClaimWrite": {"jobs.sql", map[string]string{"operation_id": "'op-5'", "state": "'running'", "claim_id": "'k'", "worker": "'w'",
			"claim_host": "'h'", "lease_expires_at_ms": "400000", "reason": "''", "claimed_at_ms": "200001", "started_at_ms": "200001",
			"finished_at_ms": "0", "reserved": "1", "reserve_shard": "0", "tenant_shard": "0", "reserve_credential": "''",
			"admission_claim_id": "'k'", "admission": "'x'", "updated_at_ms": "200001"}, nil, []string{"jobs_pkey"}, false},
		"TenantHold": {"tenants.sql", map[string]string{"operation_ids": ops}, nil, []string{"jobs_pkey"}, false},
		"TenantMoveMany": {"tenants.sql", map[string]string{"tenants": `'{default}'`, "shards": `'{0}'`, "from_reserved": `'{1}'`,
			"to_spent": `'{1}'`}, nil, nil, false},
		"AccountingReserveAhead": {"accounting.sql", map[string]string{"most": "32"}, nil, nil, false},
		"AccountingHold":         {"accounting.sql", map[string]string{"operation_ids": ops}, nil, []string{"jobs_pkey"}, false},
		"AccountingMoveMany": {"accounting.sql", map[string]string{"shards": `'{0}'`, "from_reserved": `'{1}'`, "to_spent": `'{1}'`},
			nil, nil, false},
		"PendingLogInsert": {"log.sql", map[string]string{"timestamps": `'{1}'`, "kinds": `'{k}'`, "actors": `'{a}'`, "titles": `'{t}'`,
			"data": `'{"{}"}'`, "operation_ids": `'{op-5}'`, "bodies": `'{}'`}, nil, nil, false},
		"PendingLogList": {"log.sql", map[string]string{"max": "512"}, nil, nil, false},
		"PendingLogExpect": {"log.sql", map[string]string{"last_event": "0", "last_receipt": "0", "last_receipt_id": "''",
			"rows": `'{1,2}'`, "events": `'{1,1}'`, "receipts": `'{0,1}'`}, nil, []string{"pending_log_pkey"}, false},
		"PendingLogLeft": {"log.sql", map[string]string{"events": `'{1048577,1048578}'`, "receipts": `'{1048577}'`,
			"receipt_ids": `'{rcpt-1,rcpt-2}'`}, nil, []string{"pending_log_pkey", "receipts_id_key"}, false},
		"PendingLogPlace": {"log.sql", map[string]string{"channel": "'fleet'", "instance": "'i'", "first_event": "1",
			"receipt_sequences": `'{}'`, "receipt_ids": `'{}'`, "receipt_kinds": `'{}'`, "receipt_operation_ids": `'{}'`,
			"receipt_bodies": `'{}'`, "rows": `'{1}'`, "events_upto": `'{1}'`, "receipts_upto": `'{0}'`}, nil, nil, false},
	}
	growing := map[string]bool{"jobs": true, "job_keys": true, "documents": true, "operations": true, "mutations": true,
		"assignments": true, "events": true, "receipts": true, "pending_log": true}
	// A table is read whole by a sequential scan, or by an index scan
	// with no condition that no Limit stops (a newest row read by its
	// index in order is one row).
	var wholeUnder func(n planNode, limited bool) string
	wholeUnder = func(n planNode, limited bool) string {
		limited = limited || n.NodeType == "Limit"
		indexScan := strings.HasSuffix(n.NodeType, "Index Scan") || n.NodeType == "Index Only Scan"
		if growing[n.RelationName] && (n.NodeType == "Seq Scan" || indexScan && n.IndexCond == "" && !limited) {
			return n.RelationName
		}
		for _, c := range n.Plans {
			if whole := wholeUnder(c, limited); whole != "" {
				return whole
			}
		}
		return ""
	}
	wholeTable := func(plan planNode) string { return wholeUnder(plan, false) }
	// A batch's rows unnested from its arrays (the statement's parameters),
	// on the inner side of a nested loop with nothing that keeps them, are
	// unnested again for every row on the outer side: 32 rows of 17
	// arrays were unnested 32 times (JobClaimWriteMany, BENCHMARKS.md).
	// An unnest of the outer row's own arrays (a lateral one) names its
	// columns, and is the other row's work each time.
	ofParameters := func(n planNode) bool {
		if n.NodeType != "ProjectSet" || len(n.Output) == 0 {
			return false
		}
		return !slices.ContainsFunc(n.Output, func(o string) bool { return strings.Contains(o, ".") })
	}
	var unnestedAgain func(n planNode) bool
	unnestedAgain = func(n planNode) bool {
		if n.NodeType == "Nested Loop" {
			for _, c := range n.Plans {
				if c.Parent != "Inner" {
					continue
				}
				if ofParameters(c) || c.NodeType == "Subquery Scan" && len(c.Plans) == 1 && ofParameters(c.Plans[0]) {
					return true
				}
			}
		}
		return slices.ContainsFunc(n.Plans, unnestedAgain)
	}
	checkAll := func(c *sql.Conn, when string) {
		t.Helper()
		for _, name := range postgres.GenericPlans() {
			ch, ok := checks[name]
			if !ok {
				t.Errorf("%s runs with a generic plan and this test does not check it", name)
				continue
			}
			plan := genericPlan(t, c, ch.file, name, ch.args, ch.settings...)
			if whole := wholeTable(plan); whole != "" {
				t.Errorf("%s's generic plan %s reads all of %s (%+v)", name, when, whole, plan)
			}
			if unnestedAgain(plan) {
				t.Errorf("%s's generic plan %s unnests its arrays again for each row it joins them to (%+v)", name, when, plan)
			}
			checkPlan(t, name+"'s generic plan "+when, plan, "jobs", ch.indexes, ch.noSort)
		}
	}
	conn := func(location string) *sql.Conn {
		t.Helper()
		db, err := sql.Open("pgx", location)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	location := queued(t, 100000, "1 + i % 4")
	execAll(t, location, fmt.Sprintf(publications, 1, 100000))
	checkAll(conn(location), "at 100,000 jobs before ANALYZE")
	execAll(t, location, `ANALYZE`)
	checkAll(conn(location), "at 100,000 jobs after ANALYZE")

	young := queued(t, 3, "2")
	execAll(t, young, fmt.Sprintf(publications, 1, 3), `ANALYZE`)
	c := conn(young)
	checkAll(c, "on three jobs")
	execAll(t, young,
		`INSERT INTO documents (id, version, body, owner, generation, updated_at_ms)
			SELECT 'doc-' || i, 0, 'null', '', 0, 0 FROM generate_series(4, 100000) AS i`,
		`INSERT INTO jobs (operation_id, position, batch_key, section, document_id, input_sha256, state, created_at_ms, updated_at_ms, priority)
			SELECT 'op-' || i, i, 'seed', 'summary', 'doc-' || i, '', 'queued', i, i, 2 FROM generate_series(4, 100000) AS i`,
		`INSERT INTO job_keys (position, operation_id, document_id, section, tenant, priority)
			SELECT i, 'op-' || i, 'doc-' || i, 'summary', 'default', 2 FROM generate_series(4, 100000) AS i`,
		fmt.Sprintf(publications, 4, 100000))
	checkAll(c, "planned on three jobs, run at 100,000")

}
