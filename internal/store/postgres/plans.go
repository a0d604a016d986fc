package postgres

import "strings"

// planMode is the plan_cache_mode a transaction's statements run under.
type planMode uint8

const (
	planAuto    planMode = iota // the session's: PostgreSQL's own choice
	planGeneric                 // force_generic_plan
	planEither                  // never switches: planned as the transaction is, well either way
	planUnknown                 // after a rollback to a savepoint, or a held switch dropped
)

// statementPlans are the statements that run with a generic plan from
// their first execution on each connection (plan_cache_mode =
// force_generic_plan, set for the transaction just before the first of
// them, or by the statement that already goes before them: pickPlans),
// and those that may run under either mode. Every other
// statement runs under the session's own choice (planAuto).
//
// Left to choose, PostgreSQL plans each of a connection's prepared
// statements afresh for its first five executions, then keeps planning
// afresh whenever that looked cheaper than the generic plan. The batch
// statements (an array a row) looked cheaper planned for their array,
// and were planned again and again: TenantHold, TenantMoveMany,
// AccountingMoveMany and DocumentWriteMany at every call,
// JobClaimWriteMany and JobCompleteMany at one call in four (batches of
// 8) or at every call (the database 1 ms away), each plan 70–550 µs
// (pg_stat_statements, BENCHMARKS.md). Their generic plans, made as
// planSetting says, read each table by its keys (TestGenericPlans), so
// planning them again bought nothing.
//
// A batch's reads, JobGetMany and OperationGetMany, were left to choose
// until four hosts showed what that cost: PostgreSQL planned them afresh
// at most calls (JobGetMany 1,985 plans in 2,500 calls,
// OperationGetMany 2,571, against 256 and 1,462 with one host;
// BENCHMARKS.md). OperationGetMany is matched by document_id = ANY(…)
// as well, or its generic plan made on a young table read all of
// operations.
//
// A single call's statements are left out, but for a claim's: PostgreSQL
// keeps their generic plans after five executions, and a switch would be
// one more statement in each of their transactions. A single claim's
// admission and write follow its pick, whose statement after it leaves
// the plans generic (pickPlans): they run as the transaction is
// (planEither), so generic after a pick and the session's in a separate
// dispatch, at no switch either way. Left to choose after a pick,
// TenantReserveFree was planned afresh at 7,137 of 8,000 calls in a run
// of four hosts (BENCHMARKS.md).
var statementPlans = map[string]planMode{
	"JobPickMany":            planGeneric, // switched with its sorts (pickPlans)
	"JobClaimWriteMany":      planGeneric,
	"JobCompleteMany":        planGeneric,
	"JobSetRunningMany":      planGeneric,
	"DocumentWriteMany":      planGeneric,
	"TenantReserveAhead":     planGeneric,
	"LevelsReserveAhead":     planGeneric,
	"TenantHold":             planGeneric,
	"TenantMoveMany":         planGeneric,
	"AccountingReserveAhead": planGeneric,
	"AccountingHold":         planGeneric,
	"AccountingMoveMany":     planGeneric,
	"JobGetMany":             planGeneric,
	"OperationGetMany":       planGeneric,
	// The sequencer's round: the pending log's statistics see a few live
	// rows, and planned for each round the planner read the whole table,
	// each round's dead rows and all, to list them or find those placed;
	// the pending list cost more to plan than to run.
	"PendingLogList":  planGeneric,
	"PendingLogPlace": planGeneric,
	// A round without listing: its check of the pending log, planned for
	// its arrays at every call, cost as much to plan as to run.
	"PendingLogExpect": planGeneric,
	// A host's look at what another host's round placed for it (a read
	// of one statement, lookElsewhere). Planned for its arrays at nearly
	// every call, it read all of receipts once the planner's figures for
	// it were a young table's, and, grown, read it with parallel workers
	// (processes started for each look). Read by key, four hosts use 8–14 %
	// less of PostgreSQL's CPU a job (BENCHMARKS.md).
	"PendingLogLeft": planGeneric,
	// What each host reads on its own every second or so (the sampler's
	// counts, the lease sweeper's look, the schedules' look), planned
	// afresh at most calls when left to choose (41 plans in 41 calls,
	// 62 in 80, 58 in 80 over 20 s of four idle hosts; BENCHMARKS.md).
	"JobCountByState": planGeneric,
	"JobListExpired":  planGeneric,
	"ScheduleAnyDue":  planGeneric,
	// Inserts from arrays, whose plan is the same either way: a batch's
	// (after the generic statements) and a single call's (with none).
	"MutationInsertMany":  planEither,
	"OperationInsertMany": planEither,
	"PendingLogInsert":    planEither,
	// A single claim's admission and write, after its pick (above).
	"TenantReserveFree":     planEither,
	"AccountingReserveFree": planEither,
	"JobClaimWrite":         planEither,
}

// statementName is the sqlc name of a generated query ("-- name: X :kind"
// on its first line), or "" for any other statement (BEGIN, SAVEPOINT,
// a setting).
func statementName(query string) string {
	rest, ok := strings.CutPrefix(query, "-- name: ")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, " ")
	return name
}

// planFor is the statement that switches the transaction's plan mode to
// what query wants, when it is not that already; ok is false when no
// switch is needed. A read of one statement sends its switch in the same
// round trip: the two run in one implicit transaction (one Sync), so the
// switch holds for the statement and ends with it.
func (p *pipeline) planFor(query string) (switchTo heldStatement, ok bool) {
	name := statementName(query)
	if name == "" {
		return heldStatement{}, false
	}
	want := statementPlans[name]
	if want == planEither || p.plans == want {
		return heldStatement{}, false
	}
	p.plans = want
	p.statements++
	return heldStatement{sql: "SELECT " + planSetting(want), switchesPlans: true}, true
}

// planSetting is the set_config calls that put the transaction in mode.
// A generic plan is made once, and kept until the tables it reads are
// analyzed again: made on a young table (a few jobs), a sequential scan
// or a hash join over the whole table is its cheapest plan, and it would
// then read the whole table at every call after a burst of jobs, until
// autovacuum analyzed it. Every statement of statementPlans reads its rows
// by their keys, so its generic plan is made with the sequential scans and
// the hash and merge joins off: index lookups, whatever the tables' size
// when it was planned (TestGenericPlans).
func planSetting(mode planMode) string {
	if mode == planGeneric {
		return "set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true), " +
			"set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)"
	}
	return "set_config('plan_cache_mode', 'auto', true), set_config('enable_seqscan', 'on', true), " +
		"set_config('enable_hashjoin', 'on', true), set_config('enable_mergejoin', 'on', true)"
}
