package storetest

// The driver conformance suite, after River's riverdrivertest.Exercise:
// one subtest per store.Executor operation, named after it and grouped by
// table, run by each backend's own test on that backend. A subtest may
// call other operations to set up and to look; it is named for the one it
// is about. EveryOperation fails when an operation has no subtest (or a
// subtest names no operation), so a new operation cannot land untested.
// The subtests live in a file per group of tables, as the backends' SQL
// does: meta.go (locks, settings, hosts, kernel, credentials),
// accounting.go, jobs.go (batches, jobs, attempts), documents.go
// (documents, mutations, operations), log.go and events.go.

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
)

// Exercise runs the conformance suite on the backend whose fresh, empty
// databases newLocation names (a SQLite path, a PostgreSQL URL).
func Exercise(t *testing.T, newLocation func(tb testing.TB) string) {
	t.Helper()
	s := &suite{newLocation: newLocation}
	for _, table := range operationTests() {
		t.Run(table.name, func(t *testing.T) {
			for _, op := range table.ops {
				t.Run(op.name, func(t *testing.T) {
					t.Parallel()
					op.test(t, s)
				})
			}
		})
	}
	t.Run("EveryOperation", func(t *testing.T) {
		if missing, unknown := untested(); len(missing) > 0 || len(unknown) > 0 {
			t.Fatalf("store.Executor operations without a subtest: %v; subtests naming no operation: %v", missing, unknown)
		}
	})
}

// untested compares store.Executor's operations with the suite's subtests.
func untested() (missing, unknown []string) {
	tested := map[string]bool{}
	for _, table := range operationTests() {
		for _, op := range table.ops {
			tested[op.name] = true
		}
	}
	executor := reflect.TypeFor[store.Executor]()
	for i := range executor.NumMethod() {
		name := executor.Method(i).Name
		if !tested[name] {
			missing = append(missing, name)
		}
		delete(tested, name)
	}
	for name := range tested {
		unknown = append(unknown, name)
	}
	sort.Strings(unknown)
	return missing, unknown
}

type suite struct {
	newLocation func(tb testing.TB) string
}

type table struct {
	name string
	ops  []operationTest
}

type operationTest struct {
	name string
	test func(t *testing.T, s *suite)
}

// fixture is a fresh database with an accounting row (allowance 100, cost
// 20) and one batch "b" (document "text") of three queued jobs op-1..op-3,
// section "summary", on documents doc-1..doc-3, at positions 1..3.
type fixture struct {
	t        *testing.T
	db       *store.DB
	location string
}

func (s *suite) setup(t *testing.T) *fixture {
	t.Helper()
	location := s.newLocation(t)
	db, err := backend.Create(context.Background(), location)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f := &fixture{t: t, db: db, location: location}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 100, CostPerReport: 20}); err != nil {
			return err
		}
		if err := tx.TenantInsert(ctx, store.Tenant{Name: "default", Weight: 1, CreatedAtMS: 1}); err != nil {
			return err
		}
		if err := tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1}); err != nil {
			return err
		}
		for i := 1; i <= 3; i++ {
			doc := fmt.Sprint("doc-", i)
			if err := tx.DocumentInsert(ctx, doc, 1); err != nil {
				return err
			}
			if err := tx.JobInsert(ctx, &store.JobInsertParams{OperationID: fmt.Sprint("op-", i), Position: int64(i), BatchKey: "b",
				Section: "summary", DocumentID: doc, InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 3,
				BackoffBaseMS: 1000, BackoffCapMS: 60000, ExpectedSHA256: fmt.Sprint("want-", i)}); err != nil {
				return err
			}
		}
		return nil
	})
	return f
}

// open is another handle on the fixture's database, with its own
// connections (another host).
func (f *fixture) open() *store.DB {
	f.t.Helper()
	db, err := backend.Open(context.Background(), f.location, backend.Options{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { db.Close() })
	return db
}

// write runs fn in one write transaction and fails the test on error.
func (f *fixture) write(fn func(ctx context.Context, tx *store.Tx) error) {
	f.t.Helper()
	if err := f.writeErr(fn); err != nil {
		f.t.Fatal(err)
	}
}

// writeErr runs fn in one write transaction and returns its error.
func (f *fixture) writeErr(fn func(ctx context.Context, tx *store.Tx) error) error {
	ctx := context.Background()
	return f.db.WithTx(ctx, func(tx *store.Tx) error { return fn(ctx, tx) })
}

// refused runs fn, which must fail: its transaction rolls back whole.
func (f *fixture) refused(what string, fn func(ctx context.Context, tx *store.Tx) error) error {
	f.t.Helper()
	err := f.writeErr(fn)
	if err == nil {
		f.t.Fatalf("%s was not refused", what)
	}
	return err
}

// guardFails runs a transition whose guard does not hold: the whole
// transaction fails with ErrGuard (on PostgreSQL the error may surface
// at the next statement or the commit) and leaves the job as it was.
func (f *fixture) guardFails(what, op string, fn func(ctx context.Context, tx *store.Tx) error) {
	f.t.Helper()
	before := f.job(op)
	if err := f.writeErr(fn); !errors.Is(err, store.ErrGuard) {
		f.t.Fatalf("%s: %v, want ErrGuard", what, err)
	}
	if after := f.job(op); !reflect.DeepEqual(after, before) {
		f.t.Fatalf("%s changed the job:\n%+v\nto\n%+v", what, before, after)
	}
}

// read runs fn in one read transaction and fails the test on error.
func (f *fixture) read(fn func(ctx context.Context, tx *store.Tx) error) {
	f.t.Helper()
	ctx := context.Background()
	if err := f.db.Read(ctx, func(tx *store.Tx) error { return fn(ctx, tx) }); err != nil {
		f.t.Fatal(err)
	}
}

// job reads a job as it stands.
func (f *fixture) job(op string) store.Job {
	f.t.Helper()
	var j store.Job
	f.read(func(ctx context.Context, tx *store.Tx) (err error) {
		j, err = tx.JobGet(ctx, op, store.NoLock)
		return err
	})
	return j
}

// claim claims up to max jobs for worker w (claim prefix "c-<w>.", lease
// until leaseMS, at nowMS 10).
func (f *fixture) claim(w string, max int, leaseMS int64) []store.ClaimedJob {
	f.t.Helper()
	var got []store.ClaimedJob
	f.write(func(ctx context.Context, tx *store.Tx) (err error) {
		got, err = tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: max, ClaimPrefix: "c-" + w + ".", Worker: w,
			ClaimHost: "host-" + w, LeaseExpiresAtMS: leaseMS, NowMS: 10})
		return err
	})
	return got
}

// run claims op-1 for w1 and admits it, holding 20 credits at its tenant
// and the fleet.
func (f *fixture) run() store.Job {
	f.t.Helper()
	c := f.claim("w1", 1, 500)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		tr, err := tx.TenantReserve(ctx, c[0].Tenant)
		if err != nil || !tr.OK {
			return fmt.Errorf("reserve at the tenant: %v %w", tr.OK, err)
		}
		r, err := tx.AccountingReserve(ctx)
		if err != nil || !r.OK {
			return fmt.Errorf("reserve: %v %w", r.OK, err)
		}
		return tx.JobSetRunning(ctx, &store.JobSetRunningParams{OperationID: c[0].OperationID, IfClaimID: c[0].ClaimID,
			Reserved: 20, ReserveShard: r.Shard, TenantShard: tr.Shard, Admission: []byte(`{"decision":"allow"}`), LeaseExpiresAtMS: 600, Reason: "admitted", NowMS: 11})
	})
	return f.job(c[0].OperationID)
}

// rolledBack runs fn in a savepoint of c that is then rolled back and
// released, as a batch item the host refuses is.
func rolledBack(t *testing.T, c store.Conn, fn func()) {
	t.Helper()
	ctx := context.Background()
	if err := c.Savepoint(ctx, "item"); err != nil {
		t.Fatal(err)
	}
	fn()
	if err := c.RollbackTo(ctx, "item"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, "item"); err != nil {
		t.Fatal(err)
	}
}

// must returns v, or panics with err: inside a transaction the panic fails
// the test (WithTx returns it as the request's error).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func ids(jobs []store.Job) []string {
	out := []string{}
	for _, j := range jobs {
		out = append(out, j.OperationID)
	}
	return out
}

func claimedIDs(jobs []store.ClaimedJob) []string {
	out := []string{}
	for _, j := range jobs {
		out = append(out, j.OperationID)
	}
	return out
}

func operationTests() []table {
	return []table{
		{"log", []operationTest{
			{"LockLog", testLockLog},
			{"TryLockLog", testTryLockLog},
			{"TryLockCounts", testTryLockCounts},
			{"LockClaims", testLockClaims},
			{"LockTenants", testLockTenants},
		}},
		{"settings", []operationTest{
			{"SettingList", testSettings},
			{"SettingPut", testSettings},
			{"SettingGet", testSettings},
		}},
		{"hosts", []operationTest{
			{"HostGet", testHostGetPutList},
			{"HostList", testHostGetPutList},
			{"HostPut", testHostGetPutList},
			{"HostSeen", testHostSeen},
			{"HostRetire", testHostRetire},
		}},
		{"kernel", []operationTest{
			{"KernelInsert", testKernel},
			{"KernelGet", testKernel},
		}},
		{"credentials", []operationTest{
			{"CredentialInsert", testCredentialInsert},
			{"CredentialGet", testCredentialInsert},
			{"CredentialList", testCredentialInsert},
			{"CredentialUpdate", testCredentialUpdate},
			{"CredentialReserve", testCredentialReserve},
			{"CredentialMove", testCredentialMove},
		}},
		{"accounting", []operationTest{
			{"AccountingInsert", testAccountingInsertGet},
			{"AccountingGet", testAccountingInsertGet},
			{"AccountingReserve", testAccountingReserve},
			{"AccountingMove", testAccountingMove},
			{"AccountingSetAllowance", testAccountingSetAllowance},
			{"AccountingHold", testAccountingHold},
			{"AccountingReserveAhead", testAccountingReserveAhead},
		}},
		{"tenants", []operationTest{
			{"TenantInsert", testTenantInsertGet},
			{"TenantGet", testTenantInsertGet},
			{"TenantList", testTenantInsertGet},
			{"TenantSetAllowance", testTenantSetAllowance},
			{"TenantSetWeight", testTenantSetWeight},
			{"TenantReserve", testTenantReserve},
			{"TenantReserveAhead", testTenantReserveAhead},
			{"LevelsReserveAhead", testLevelsReserveAhead},
			{"TenantMove", testTenantMove},
			{"TenantRollover", testTenantRollover},
			{"JobCountByTenant", testJobCountByTenant},
			{"JobTenantsQueued", testJobTenantsQueued},
			{"JobInFlightByTenant", testJobTenantsQueued},
			{"JobTenantOfDocument", testJobTenantsQueued},
		}},
		{"dependencies", []operationTest{
			{"JobDependencyInsertMany", testDependencies},
			{"JobDependencyList", testDependencies},
			{"JobReleaseDependents", testDependencies},
			{"JobUnblock", testDependencies},
		}},
		{"schedules", []operationTest{
			{"ScheduleInsert", testSchedules},
			{"ScheduleGet", testSchedules},
			{"ScheduleList", testSchedules},
			{"ScheduleDue", testSchedules},
			{"ScheduleAnyDue", testSchedules},
			{"ScheduleAdvance", testSchedules},
			{"ScheduleSetPaused", testSchedules},
			{"ScheduleDelete", testSchedules},
		}},
		{"batches", []operationTest{
			{"BatchInsert", testBatch},
			{"BatchGet", testBatch},
		}},
		{"jobs", []operationTest{
			{"JobMaxPosition", testJobMaxPosition},
			{"JobInsert", testJobInsertGet},
			{"JobInsertMany", testJobInsertMany},
			{"JobGet", testJobInsertGet},
			{"JobGetMany", testJobGetMany},
			{"JobClaimMany", testJobClaimMany},
			{"JobPickMany", testJobPickMany},
			{"JobClaimMany", testClaimUnlessPaused},
			{"JobPickMany", testClaimUnlessPaused},
			{"JobPickMany", testPickForOwners},
			{"JobClaimWriteMany", testJobClaimWriteMany},
			{"JobSetRunning", testJobSetRunning},
			{"JobSetRefused", testJobSetRefused},
			{"JobSetRunningMany", testJobSetRunningMany},
			{"JobSetRefusedMany", testJobSetRefusedMany},
			{"JobRenewLease", testJobRenewLease},
			{"JobComplete", testJobComplete},
			{"JobCompleteMany", testJobCompleteMany},
			{"JobRequeue", testJobRequeue},
			{"JobFail", testJobFail},
			{"JobSetUnresolved", testJobSetUnresolved},
			{"JobCancel", testJobCancel},
			{"JobList", testJobList},
			{"JobListByBatch", testBatch},
			{"JobListExpired", testJobListExpired},
			{"JobListClaimedBy", testJobListClaimedBy},
			{"JobListClaimedUnder", testJobListClaimedUnder},
			{"JobPending", testJobPending},
			{"JobCountByState", testJobCountByState},
			{"JobCountsSaved", testJobCountsSaved},
			{"JobCountsSave", testJobCountsSave},
			{"WorkerActivity", testWorkerActivity},
			{"JobPage", testJobPage},
		}},
		{"attempts", []operationTest{
			{"AttemptInsert", testAttempts},
			{"AttemptList", testAttempts},
		}},
		{"documents", []operationTest{
			{"DocumentInsert", testDocumentInsertGet},
			{"DocumentInsertMany", testDocumentInsertMany},
			{"DocumentGet", testDocumentInsertGet},
			{"DocumentAssign", testDocumentAssign},
			{"DocumentWrite", testDocumentWrite},
			{"DocumentWriteMany", testDocumentWriteMany},
			{"AssignmentList", testAssignmentList},
		}},
		{"mutations", []operationTest{
			{"MutationInsert", testMutations},
			{"MutationList", testMutations},
			{"MutationCount", testMutations},
			{"MutationTotal", testMutations},
			{"MutationCountByDocument", testMutations},
			{"MutationRepeatedOperations", testMutations},
		}},
		{"operations", []operationTest{
			{"OperationGet", testOperations},
			{"OperationGetMany", testOperationGetMany},
			{"OperationCountDelivery", testOperations},
			{"OperationInsert", testOperations},
			{"OperationList", testOperations},
		}},
		{"receipts", []operationTest{
			{"ReceiptHead", testReceiptHead},
			{"ReceiptInsert", testReceiptInsert},
			{"ReceiptGet", testReceiptReads},
			{"ReceiptGetMany", testReceiptReads},
			{"ReceiptList", testReceiptReads},
			{"ReceiptNewestByOperation", testReceiptReads},
			{"ReceiptNewestFor", testReceiptReads},
		}},
		{"events", []operationTest{
			{"EventInsert", testEvents},
			{"EventLast", testEvents},
			{"EventList", testEvents},
			{"EventListNewest", testEventListNewest},
			{"EventHead", testEvents},
		}},
		{"pending_log", []operationTest{
			{"PendingLogInsert", testPendingLogInsertList},
			{"PendingLogList", testPendingLogInsertList},
			{"PendingLogPlace", testPendingLogPlace},
			{"PendingLogLeft", testPendingLogPlace},
			{"PendingLogExpect", testPendingLogExpect},
		}},
	}
}
