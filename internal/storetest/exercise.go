package storetest

// The driver conformance suite, after River's riverdrivertest.Exercise:
// one subtest per store.Executor operation, named after it and grouped by
// table, run by each backend's own test on that backend. A subtest may
// call other operations to set up and to look; it is named for the one it
// is about. EveryOperation fails when an operation has no subtest (or a
// subtest names no operation), so a new operation cannot land untested.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/wire"
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

// run claims op-1 for w1 and admits it, holding 20 credits.
func (f *fixture) run() store.Job {
	f.t.Helper()
	c := f.claim("w1", 1, 500)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		r, err := tx.AccountingReserve(ctx)
		if err != nil || !r.OK {
			return fmt.Errorf("reserve: %v %w", r.OK, err)
		}
		return tx.JobSetRunning(ctx, &store.JobSetRunningParams{OperationID: c[0].OperationID, IfClaimID: c[0].ClaimID,
			Reserved: 20, ReserveShard: r.Shard, Admission: []byte(`{"decision":"allow"}`), LeaseExpiresAtMS: 600, Reason: "admitted", NowMS: 11})
	})
	return f.job(c[0].OperationID)
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
			{"LockClaims", testLockClaims},
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
		{"batches", []operationTest{
			{"BatchInsert", testBatch},
			{"BatchGet", testBatch},
		}},
		{"jobs", []operationTest{
			{"JobMaxPosition", testJobMaxPosition},
			{"JobInsert", testJobInsertGet},
			{"JobGet", testJobInsertGet},
			{"JobGetMany", testJobGetMany},
			{"JobClaimMany", testJobClaimMany},
			{"JobSetRunning", testJobSetRunning},
			{"JobSetRefused", testJobSetRefused},
			{"JobRenewLease", testJobRenewLease},
			{"JobComplete", testJobComplete},
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
			{"WorkerActivity", testWorkerActivity},
			{"JobPage", testJobPage},
		}},
		{"attempts", []operationTest{
			{"AttemptInsert", testAttempts},
			{"AttemptList", testAttempts},
		}},
		{"documents", []operationTest{
			{"DocumentInsert", testDocumentInsertGet},
			{"DocumentGet", testDocumentInsertGet},
			{"DocumentAssign", testDocumentAssign},
			{"DocumentWrite", testDocumentWrite},
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
		}},
	}
}

func testLockLog(t *testing.T, s *suite) {
	// Two transactions that both take the log lock run one after the
	// other: the second's JobMaxPosition sees the first's job.
	f := s.setup(t)
	other := f.open()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			errs <- []*store.DB{f.db, other}[i%2].WithTx(ctx, func(tx *store.Tx) error {
				if err := tx.LockLog(ctx); err != nil {
					return err
				}
				tail, err := tx.JobMaxPosition(ctx)
				if err != nil {
					return err
				}
				op, doc := fmt.Sprint("lock-", i), fmt.Sprint("lock-doc-", i)
				if err := tx.DocumentInsert(ctx, doc, 1); err != nil {
					return err
				}
				return tx.JobInsert(ctx, &store.JobInsertParams{OperationID: op, Position: tail + 1, BatchKey: "b",
					Section: "summary", DocumentID: doc, InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1})
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		all := must(tx.JobList(ctx))
		for i, j := range all {
			if j.Position != int64(i+1) {
				t.Fatalf("positions under the log lock are not contiguous: job %d at %d", i, j.Position)
			}
		}
		if len(all) != 11 {
			t.Fatalf("%d jobs, want 11", len(all))
		}
		return nil
	})
}

func testTryLockLog(t *testing.T, s *suite) {
	// The first transaction takes the log lock; where writers run at once
	// (PostgreSQL) a second is told it is held, without waiting, and takes
	// it once the first has ended. One writer always holds it.
	f := s.setup(t)
	ctx := context.Background()
	first := must(f.db.Driver().BeginWrite(ctx))
	defer first.Rollback()
	if ok, err := first.TryLockLog(ctx); err != nil || !ok {
		t.Fatalf("first: %v %v", ok, err)
	}
	if f.db.Driver().Writers() == 1 {
		return
	}
	second := must(f.db.Driver().BeginWrite(ctx))
	defer second.Rollback()
	if ok, err := second.TryLockLog(ctx); err != nil || ok {
		t.Fatalf("second while the first holds it: %v %v", ok, err)
	}
	second.Rollback()
	first.Rollback()
	third := must(f.db.Driver().BeginWrite(ctx))
	defer third.Rollback()
	if ok, err := third.TryLockLog(ctx); err != nil || !ok {
		t.Fatalf("after the first ended: %v %v", ok, err)
	}
}

func testSettings(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.SettingPut(ctx, "a", "1"); err != nil {
			return err
		}
		if err := tx.SettingPut(ctx, "b", "x"); err != nil {
			return err
		}
		return tx.SettingPut(ctx, "a", "2") // an upsert
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.SettingList(ctx)); !reflect.DeepEqual(got, map[string]string{"a": "2", "b": "x"}) {
			t.Fatalf("settings %v", got)
		}
		if a := must(tx.SettingGet(ctx, "a")); a != "2" {
			t.Fatalf("setting a is %q", a)
		}
		if _, err := tx.SettingGet(ctx, "none"); !store.IsNotFound(err) {
			t.Fatalf("an absent setting: %v", err)
		}
		return nil
	})
}

func testLockClaims(t *testing.T, s *suite) {
	// Shared holders do not wait for each other; the exclusive holder
	// waits for them, and they for it. With one writer every write
	// transaction excludes the others already, and the lock is a no-op.
	f := s.setup(t)
	ctx := context.Background()
	begin := func() store.Conn {
		t.Helper()
		c := must(f.db.Driver().BeginWrite(ctx))
		t.Cleanup(func() { c.Rollback() })
		return c
	}
	first := begin()
	if err := first.LockClaims(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := first.SettingPut(ctx, "x", "1"); err != nil { // sends the held lock statement on
		t.Fatal(err)
	}
	if f.db.Driver().Writers() == 1 {
		return
	}
	second := begin()
	if err := second.LockClaims(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, err := second.SettingGet(ctx, "none"); !store.IsNotFound(err) {
		t.Fatalf("a second shared holder: %v", err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	third := must(f.db.Driver().BeginWrite(ctx))
	defer third.Rollback()
	err := third.LockClaims(waitCtx, true)
	if err == nil {
		_, err = third.SettingGet(waitCtx, "none")
	}
	if store.IsNotFound(err) || err == nil {
		t.Fatal("the exclusive holder did not wait for the shared ones")
	}
}

func testHostGetPutList(t *testing.T, s *suite) {
	f := s.setup(t)
	a := store.Host{ID: "a", Instance: "i1", URL: "http://a", StartedAtMS: 1, SeenAtMS: 1, Serving: true}
	b := store.Host{ID: "b", Instance: "i9", URL: "http://b", StartedAtMS: 2, SeenAtMS: 3}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.HostGet(ctx, "a"); !store.IsNotFound(err) {
			t.Fatalf("an absent host: %v", err)
		}
		if err := tx.HostPut(ctx, b); err != nil {
			return err
		}
		if err := tx.HostPut(ctx, a); err != nil {
			return err
		}
		a.Instance, a.Serving, a.SeenAtMS = "i2", false, 7 // a replace, not a second row
		return tx.HostPut(ctx, a)
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		got := must(tx.HostGet(ctx, "a"))
		all := must(tx.HostList(ctx))
		if got != a || !reflect.DeepEqual(all, []store.Host{a, b}) {
			t.Fatalf("host %+v, list %+v", got, all)
		}
		return nil
	})
}

func testHostSeen(t *testing.T, s *suite) {
	f := s.setup(t)
	a := store.Host{ID: "a", Instance: "i1", URL: "http://a", StartedAtMS: 1, SeenAtMS: 1, Serving: true}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.HostPut(ctx, a); err != nil {
			return err
		}
		if r := must(tx.HostSeen(ctx, &store.HostSeenParams{ID: "a", Instance: "i1", AtMS: 5})); !r.Found || !r.Serving {
			t.Fatalf("renewing its own record: %+v", r)
		}
		if r := must(tx.HostSeen(ctx, &store.HostSeenParams{ID: "a", Instance: "other", AtMS: 9})); r.Found {
			t.Fatalf("another instance renewed a's record: %+v", r)
		}
		if got := must(tx.HostGet(ctx, "a")); got.SeenAtMS != 5 {
			t.Fatalf("seen at %d, want 5", got.SeenAtMS)
		}
		a.SeenAtMS = 5
		if !must(tx.HostRetire(ctx, a)) {
			t.Fatal("retiring")
		}
		if r := must(tx.HostSeen(ctx, &store.HostSeenParams{ID: "a", Instance: "i1", AtMS: 6})); !r.Found || r.Serving {
			t.Fatalf("a retired host renewing: %+v; want found, not serving", r)
		}
		return nil
	})
}

func testHostRetire(t *testing.T, s *suite) {
	// Retiring takes the record as it was read: a renewal since, or a
	// retirement by another, leaves nothing to retire.
	f := s.setup(t)
	a := store.Host{ID: "a", Instance: "i1", URL: "http://a", StartedAtMS: 1, SeenAtMS: 1, Serving: true}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.HostPut(ctx, a); err != nil {
			return err
		}
		must(tx.HostSeen(ctx, &store.HostSeenParams{ID: "a", Instance: "i1", AtMS: 5}))
		if must(tx.HostRetire(ctx, a)) {
			t.Fatal("retired a host that renewed since it was read")
		}
		a.SeenAtMS = 5
		if !must(tx.HostRetire(ctx, a)) {
			t.Fatal("a host unseen since it was read was not retired")
		}
		if must(tx.HostRetire(ctx, a)) {
			t.Fatal("retired a host twice")
		}
		if got := must(tx.HostGet(ctx, "a")); got.Serving {
			t.Fatalf("retired, still serving: %+v", got)
		}
		return nil
	})
}

func testKernel(t *testing.T, s *suite) {
	f := s.setup(t)
	k := store.Kernel{PublicKey: "pub", Seed: []byte{1, 2, 3}, CreatedAtMS: 5}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.KernelGet(ctx); !store.IsNotFound(err) {
			t.Fatalf("no kernel yet: %v", err)
		}
		return nil
	})
	f.write(func(ctx context.Context, tx *store.Tx) error { return tx.KernelInsert(ctx, k) })
	f.refused("a second kernel key", func(ctx context.Context, tx *store.Tx) error {
		return tx.KernelInsert(ctx, store.Kernel{PublicKey: "other", Seed: []byte{4}, CreatedAtMS: 6})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.KernelGet(ctx)); !reflect.DeepEqual(got, k) {
			t.Fatalf("kernel %+v", got)
		}
		return nil
	})
}

func testCredentialInsert(t *testing.T, s *suite) {
	f := s.setup(t)
	c := store.Credential{Name: "worker-1", Role: "worker", SHA256: "ab", CreatedMS: 7}
	op := store.Credential{Name: "operator", Role: "operator", SHA256: "ef", CreatedMS: 8}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.CredentialGet(ctx, "worker-1"); !store.IsNotFound(err) {
			t.Fatalf("an absent credential: %v", err)
		}
		if err := tx.CredentialInsert(ctx, c); err != nil {
			return err
		}
		return tx.CredentialInsert(ctx, op)
	})
	f.refused("two credentials with one digest", func(ctx context.Context, tx *store.Tx) error {
		return tx.CredentialInsert(ctx, store.Credential{Name: "worker-2", Role: "worker", SHA256: "ab", CreatedMS: 7})
	})
	f.refused("two credentials with one name", func(ctx context.Context, tx *store.Tx) error {
		return tx.CredentialInsert(ctx, store.Credential{Name: "worker-1", Role: "worker", SHA256: "cd", CreatedMS: 7})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		got := must(tx.CredentialGet(ctx, "worker-1"))
		all := must(tx.CredentialList(ctx))
		slices.SortFunc(all, func(x, y store.Credential) int { return strings.Compare(x.Name, y.Name) })
		if got != c || !reflect.DeepEqual(all, []store.Credential{op, c}) {
			t.Fatalf("credential %+v, list %+v", got, all)
		}
		return nil
	})
}

func testCredentialUpdate(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.CredentialInsert(ctx, store.Credential{Name: "worker-1", Role: "worker", SHA256: "ab", CreatedMS: 7})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.CredentialUpdate(ctx, store.Credential{Name: "nobody", SHA256: "cd", RevokedMS: 9}); !store.IsNotFound(err) {
			t.Fatalf("updating an absent credential: %v", err)
		}
		// Role and creation time are not the update's to change.
		return tx.CredentialUpdate(ctx, store.Credential{Name: "worker-1", Role: "operator", SHA256: "cd", CreatedMS: 1, RevokedMS: 9})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if c := must(tx.CredentialGet(ctx, "worker-1")); c != (store.Credential{Name: "worker-1", Role: "worker", SHA256: "cd", CreatedMS: 7, RevokedMS: 9}) {
			t.Fatalf("after update: %+v", c)
		}
		return nil
	})
}

func testAccountingInsertGet(t *testing.T, s *suite) {
	f := s.setup(t)
	f.refused("a second allowance", func(ctx context.Context, tx *store.Tx) error {
		return tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 5, CostPerReport: 1})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for _, lock := range []store.Lock{store.NoLock, store.ForUpdate} {
			if a := must(tx.AccountingGet(ctx, lock)); a != (wire.Accounting{Unit: "credits", Allowance: 100, Available: 100, CostPerReport: 20}) {
				t.Fatalf("accounting (%v) %+v", lock, a)
			}
		}
		return nil
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if a := must(tx.AccountingGet(ctx, store.NoLock)); a.Allowance != 100 {
			t.Fatalf("read-only accounting %+v", a)
		}
		return nil
	})
}

func testAccountingReserve(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for i := range 6 {
			r := must(tx.AccountingReserve(ctx))
			if r.OK != (i < 5) || r.Accounting.Reserved != int64(min(i+1, 5))*20 || r.Accounting.Calls != int64(min(i+1, 5)) ||
				r.Accounting.Available < 0 || r.OK && r.Shard < 0 || !r.OK && r.Shard != -1 {
				t.Fatalf("reservation %d: %+v", i, r)
			}
		}
		return nil
	})
	// 48 requests on two handles (hosts) reserve 20 each from 100:
	// exactly 5 succeed, never negative.
	f = s.setup(t)
	other := f.open()
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			err := []*store.DB{f.db, other}[i%2].WithTx(ctx, func(tx *store.Tx) error {
				r, err := tx.AccountingReserve(ctx)
				if r.Accounting.Available < 0 {
					t.Errorf("available went negative: %+v", r)
				}
				if r.OK {
					granted.Add(1)
				}
				return err
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	f.read(func(ctx context.Context, tx *store.Tx) error {
		a := must(tx.AccountingGet(ctx, store.NoLock))
		if granted.Load() != 5 || a.Reserved != 100 || a.Available != 0 || a.Calls != 5 {
			t.Fatalf("granted %d, accounting %+v", granted.Load(), a)
		}
		return nil
	})
}

func testAccountingMove(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		var shards []int64
		for range 5 {
			shards = append(shards, must(tx.AccountingReserve(ctx)).Shard)
		}
		// Settle 20 of one reservation as spent and release another's 20,
		// from any shard.
		m := must(tx.AccountingMove(ctx, &store.AccountingMoveParams{Shard: -1, FromReserved: 40, ToSpent: 20}))
		if a := m.Accounting; !m.OK || a.Spent != 20 || a.Reserved != 60 || a.Available != 20 || a.Calls != 5 {
			t.Fatalf("move: %+v", m)
		}
		// Settling where a reservation was made.
		m = must(tx.AccountingMove(ctx, &store.AccountingMoveParams{Shard: shards[4], FromReserved: 20, ToSpent: 20}))
		if a := m.Accounting; !m.OK || a.Spent != 40 || a.Reserved != 40 {
			t.Fatalf("move on the reserving shard %d: %+v", shards[4], m)
		}
		// Moving more than is reserved is refused and changes nothing.
		m = must(tx.AccountingMove(ctx, &store.AccountingMoveParams{Shard: -1, FromReserved: 41, ToSpent: 41}))
		if m.OK || m.Accounting.Reserved != 40 || m.Accounting.Spent != 40 {
			t.Fatalf("over-move: %+v", m)
		}
		return nil
	})
}

func testAccountingSetAllowance(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		a := must(tx.AccountingSetAllowance(ctx, 150))
		if a != (wire.Accounting{Unit: "credits", Allowance: 150, Available: 150, CostPerReport: 20}) {
			t.Fatalf("%+v", a)
		}
		return nil
	})
	// The database's own check refuses an allowance below what is held.
	f.refused("an allowance below what is reserved", func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.AccountingReserve(ctx); err != nil {
			return err
		}
		_, err := tx.AccountingSetAllowance(ctx, 10)
		return err
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if a := must(tx.AccountingGet(ctx, store.NoLock)); a.Allowance != 150 || a.Reserved != 0 {
			t.Fatalf("after the refusal: %+v", a)
		}
		return nil
	})
}

func testAccountingHold(t *testing.T, s *suite) {
	// The shard holding a job's reservation is the holder's until it ends:
	// where the allowance is sharded (several writers) a settlement on it
	// waits; with one writer it is a no-op. The figures never change.
	f := s.setup(t)
	ctx := context.Background()
	j := f.run() // op-1, holding 20 on its shard
	first := must(f.db.Driver().BeginWrite(ctx))
	defer first.Rollback()
	if err := first.AccountingHold(ctx, []string{j.OperationID, "op-2", "nope", j.OperationID}); err != nil { // unreserved, unknown and repeated jobs are fine
		t.Fatal(err)
	}
	if a := must(first.AccountingGet(ctx, store.NoLock)); a.Reserved != 20 || a.Available != 80 {
		t.Fatalf("holding changed the figures: %+v", a)
	}
	if f.db.Driver().Writers() > 1 {
		waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		second := must(f.db.Driver().BeginWrite(ctx)) // only the settlement is bounded: beginning may wait on a loaded machine
		defer second.Rollback()
		if _, err := second.AccountingMove(waitCtx, &store.AccountingMoveParams{Shard: j.ReserveShard, FromReserved: 20, ToSpent: 20}); err == nil {
			t.Fatal("a settlement on a held shard went through while it was held")
		}
		second.Rollback()
	}
	first.Rollback()
	// Once the holder ends, the same settlement goes through.
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if m := must(tx.AccountingMove(ctx, &store.AccountingMoveParams{Shard: j.ReserveShard, FromReserved: 20, ToSpent: 20})); !m.OK || m.Accounting.Spent != 20 {
			t.Fatalf("settling after the hold ended: %+v", m)
		}
		return nil
	})

	// The holder's own settlements on the held shard are what they would
	// be alone, a savepoint rolled back undoes one, a settlement of more
	// than is reserved is refused, and commit writes them.
	f = s.setup(t)
	j = f.run()
	holder := must(f.db.Driver().BeginWrite(ctx))
	defer holder.Rollback()
	settle := func(from, spent int64) store.Settlement {
		return must(holder.AccountingMove(ctx, &store.AccountingMoveParams{Shard: j.ReserveShard, FromReserved: from, ToSpent: spent}))
	}
	if err := holder.AccountingHold(ctx, []string{j.OperationID}); err != nil {
		t.Fatal(err)
	}
	if err := holder.Savepoint(ctx, "item"); err != nil {
		t.Fatal(err)
	}
	if m := settle(20, 20); !m.OK || m.Accounting.Spent != 20 || m.Accounting.Reserved != 0 {
		t.Fatalf("settling while holding: %+v", m)
	}
	if err := holder.RollbackTo(ctx, "item"); err != nil {
		t.Fatal(err)
	}
	if err := holder.Release(ctx, "item"); err != nil {
		t.Fatal(err)
	}
	if a := must(holder.AccountingGet(ctx, store.NoLock)); a.Reserved != 20 || a.Spent != 0 {
		t.Fatalf("a settlement rolled back to its savepoint stayed: %+v", a)
	}
	if m := settle(20, 5); !m.OK || m.Accounting != (wire.Accounting{Allowance: 100, Spent: 5, Available: 95, Calls: 1, CostPerReport: 20, Unit: "credits"}) {
		t.Fatalf("settling part while holding: %+v", m)
	}
	if m := settle(20, 20); m.OK {
		t.Fatalf("a second settlement of one reservation went through: %+v", m)
	}
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if a := must(tx.AccountingGet(ctx, store.NoLock)); a.Spent != 5 || a.Reserved != 0 || a.Available != 95 {
			t.Fatalf("after the holder committed: %+v", a)
		}
		return nil
	})
}

func testAccountingReserveAhead(t *testing.T, s *suite) {
	// Reservations taken ahead hand out exactly what reserving one at a
	// time would, figures and all, including past those taken ahead and
	// after a savepoint rolled back; what was not handed out goes back at
	// commit, leaving the allowance as the reservations made alone would.
	ctx := context.Background()
	reserve := func(c store.Conn, n int) (out []wire.Accounting) {
		for range n {
			r := must(c.AccountingReserve(ctx))
			if !r.OK || r.Shard < 0 {
				t.Fatalf("reservation refused: %+v", r)
			}
			out = append(out, r.Accounting)
		}
		return out
	}
	for _, takeAhead := range []int{3, 7, 10} {
		f := s.setup(t)
		f.write(func(ctx context.Context, tx *store.Tx) error {
			_, err := tx.AccountingSetAllowance(ctx, 10_000) // shards of many reservations each
			return err
		})
		alone := must(f.db.Driver().BeginWrite(ctx))
		defer alone.Rollback()
		want := reserve(alone, 7)
		wantAfter := must(alone.AccountingGet(ctx, store.NoLock))
		if err := alone.Rollback(); err != nil {
			t.Fatal(err)
		}
		c := must(f.db.Driver().BeginWrite(ctx))
		defer c.Rollback() // a failure ends the test with it open
		if err := c.AccountingReserveAhead(ctx, takeAhead); err != nil {
			t.Fatal(err)
		}
		got := reserve(c, 2)
		if err := c.Savepoint(ctx, "item"); err != nil {
			t.Fatal(err)
		}
		reserve(c, 1) // rolled back: handed out again below
		if err := c.RollbackTo(ctx, "item"); err != nil {
			t.Fatal(err)
		}
		if err := c.Release(ctx, "item"); err != nil {
			t.Fatal(err)
		}
		got = append(got, reserve(c, 5)...)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("taking %d ahead, reservations\n%+v\nwant\n%+v", takeAhead, got, want)
		}
		if err := c.Commit(); err != nil {
			t.Fatal(err)
		}
		f.read(func(ctx context.Context, tx *store.Tx) error {
			if after := must(tx.AccountingGet(ctx, store.NoLock)); after != wantAfter {
				t.Fatalf("taking %d ahead, the allowance after the rest went back: %+v, want %+v", takeAhead, after, wantAfter)
			}
			return nil
		})
	}
	// Once those taken ahead are all handed out, a settlement in the same
	// transaction is the allowance's as usual: 40 reserved in all, 20 of
	// them on the shard reserved ahead and 20 on another (op-1's), settle
	// together.
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		_, err := tx.AccountingSetAllowance(ctx, 10_000)
		return err
	})
	f.run() // op-1 holds 20
	c := must(f.db.Driver().BeginWrite(ctx))
	defer c.Rollback()
	if err := c.AccountingReserveAhead(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r := must(c.AccountingReserve(ctx))
	if !r.OK || r.Accounting.Reserved != 40 {
		t.Fatalf("the reservation taken ahead: %+v", r)
	}
	// Named by the shard the reservation came from, which holds only 20.
	if m := must(c.AccountingMove(ctx, &store.AccountingMoveParams{Shard: r.Shard, FromReserved: 40, ToSpent: 40})); !m.OK {
		t.Fatalf("settling all 40 reserved after reserving ahead: %+v", m)
	}
	if err := c.Commit(); err != nil {
		t.Fatalf("committing a settlement after reserving ahead: %v", err)
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if a := must(tx.AccountingGet(ctx, store.NoLock)); a.Spent != 40 || a.Reserved != 0 {
			t.Fatalf("after the settlement: %+v", a)
		}
		return nil
	})
}

func testBatch(t *testing.T, s *suite) {
	f := s.setup(t)
	f.refused("one idempotency key twice", func(ctx context.Context, tx *store.Tx) error {
		return tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "other", Document: "x", CreatedMS: 2})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		b := must(tx.BatchGet(ctx, "b"))
		ops := must(tx.JobListByBatch(ctx, "b"))
		if b != (store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1}) || !reflect.DeepEqual(ops, []string{"op-1", "op-2", "op-3"}) {
			t.Fatalf("batch %+v, jobs %v", b, ops)
		}
		if _, err := tx.BatchGet(ctx, "nope"); !store.IsNotFound(err) {
			t.Fatalf("an absent batch: %v", err)
		}
		if none := must(tx.JobListByBatch(ctx, "nope")); len(none) != 0 {
			t.Fatalf("an absent batch's jobs: %v", none)
		}
		return nil
	})
}

func testJobMaxPosition(t *testing.T, s *suite) {
	f := s.setup(t)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if tail := must(tx.JobMaxPosition(ctx)); tail != 3 {
			t.Fatalf("queue tail %d", tail)
		}
		return nil
	})
	empty := &fixture{t: t, location: s.newLocation(t)}
	db, err := backend.Create(context.Background(), empty.location)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	empty.db = db
	empty.read(func(ctx context.Context, tx *store.Tx) error {
		if tail := must(tx.JobMaxPosition(ctx)); tail != 0 {
			t.Fatalf("an empty queue's tail %d", tail)
		}
		return nil
	})
}

func testJobInsertGet(t *testing.T, s *suite) {
	f := s.setup(t)
	j := f.job("op-2")
	want := store.Job{OperationID: "op-2", Position: 2, BatchKey: "b", Section: "summary", DocumentID: "doc-2", InputSHA256: "in",
		State: wire.Queued, ReserveShard: -1, CreatedAtMS: 1, UpdatedAtMS: 1, MaxAttempts: 3, BackoffBaseMS: 1000,
		BackoffCapMS: 60000, ClaimableAtMS: 1, ExpectedSHA256: "want-2"}
	if !reflect.DeepEqual(j, want) {
		t.Fatalf("job\n%+v\nwant\n%+v", j, want)
	}
	f.refused("a job whose document does not exist", func(ctx context.Context, tx *store.Tx) error {
		return tx.JobInsert(ctx, &store.JobInsertParams{OperationID: "op-9", Position: 9, BatchKey: "b", Section: "summary",
			DocumentID: "doc-9", InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1})
	})
	f.refused("one position twice", func(ctx context.Context, tx *store.Tx) error {
		if err := tx.DocumentInsert(ctx, "doc-9", 1); err != nil {
			return err
		}
		return tx.JobInsert(ctx, &store.JobInsertParams{OperationID: "op-9", Position: 3, BatchKey: "b", Section: "summary",
			DocumentID: "doc-9", InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.JobGet(ctx, "op-2", store.ForUpdate)); !reflect.DeepEqual(got, want) {
			t.Fatalf("locked read %+v", got)
		}
		if _, err := tx.JobGet(ctx, "nope", store.ForUpdate); !store.IsNotFound(err) {
			t.Fatalf("an absent job: %v", err)
		}
		return nil
	})
}

func testJobGetMany(t *testing.T, s *suite) {
	// The jobs that exist, each as JobGet reads it, in operation id order;
	// where there are several writers, locked until the reader ends.
	f := s.setup(t)
	ctx := context.Background()
	first := must(f.db.Driver().BeginWrite(ctx))
	defer first.Rollback()
	got := must(first.JobGetMany(ctx, []string{"op-3", "nope", "op-1"}))
	want := []store.Job{must(first.JobGet(ctx, "op-1", store.NoLock)), must(first.JobGet(ctx, "op-3", store.NoLock))}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("jobs\n%+v\nwant\n%+v", got, want)
	}
	if none := must(first.JobGetMany(ctx, []string{"nope"})); len(none) != 0 {
		t.Fatalf("an absent job read as %+v", none)
	}
	if f.db.Driver().Writers() > 1 {
		second := must(f.db.Driver().BeginWrite(ctx)) // only the locked read is bounded: beginning may wait on a loaded machine
		defer second.Rollback()
		waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, err := second.JobGet(waitCtx, "op-3", store.ForUpdate); err == nil {
			t.Fatal("a locked read of a job read many went through while its reader held it")
		}
		second.Rollback()
	}
	first.Rollback()
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if j := must(tx.JobGet(ctx, "op-3", store.ForUpdate)); j.OperationID != "op-3" {
			t.Fatalf("after the reader ended: %+v", j)
		}
		return nil
	})
}

func testJobClaimMany(t *testing.T, s *suite) {
	f := s.setup(t)
	// op-1 backs off until 100: it is passed over before then, and the
	// first to claim after (claimable first, then queue order).
	f.write(func(ctx context.Context, tx *store.Tx) error {
		c := must(tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: 1, ClaimPrefix: "x.", Worker: "w0", ClaimHost: "h", LeaseExpiresAtMS: 50, NowMS: 5}))
		return tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: c[0].OperationID, IfState: wire.Claimed, Worker: "w0",
			Attempts: 1, ClaimableAtMS: 100, LastError: "boom", Reason: "retry", NowMS: 6})
	})
	for _, step := range []struct {
		nowMS int64
		max   int
		want  []string
	}{{50, 10, []string{"op-2", "op-3"}}, {99, 10, []string{}}, {100, 10, []string{"op-1"}}, {1000, 10, []string{}}} {
		var got []store.ClaimedJob
		f.write(func(ctx context.Context, tx *store.Tx) (err error) {
			got, err = tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: step.max, ClaimPrefix: fmt.Sprint("k", step.nowMS, "."),
				Worker: "w1", ClaimHost: "host-a", LeaseExpiresAtMS: step.nowMS + 30, NowMS: step.nowMS})
			return err
		})
		if !reflect.DeepEqual(claimedIDs(got), step.want) {
			t.Fatalf("at %d claimed %v, want %v", step.nowMS, claimedIDs(got), step.want)
		}
		for _, c := range got {
			stored := f.job(c.OperationID)
			wantClaim := fmt.Sprint("k", step.nowMS, ".", c.Position)
			if !reflect.DeepEqual(c.Job, stored) || c.BatchDocument != "text" || c.State != wire.Claimed || c.ClaimID != wantClaim ||
				c.Worker != "w1" || c.Owner != "w1" || c.ClaimHost != "host-a" || c.LeaseExpiresAtMS != step.nowMS+30 || c.UpdatedAtMS != step.nowMS {
				t.Fatalf("claimed %+v\nstored %+v", c, stored)
			}
			if c.OperationID == "op-1" && (c.Attempts != 1 || c.LastError != "boom" || c.Generation != 2) {
				t.Fatalf("a retried job lost its history: %+v", c)
			}
		}
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		as := must(tx.AssignmentList(ctx, "doc-2"))
		if len(as) != 1 || as[0].Owner != "w1" || as[0].Generation != 1 || as[0].AtMS != 50 {
			t.Fatalf("doc-2's assignments %+v", as)
		}
		return nil
	})

	// Max bounds a claim; two write transactions open at once never claim
	// the same job: PostgreSQL passes over rows the first holds, SQLite's
	// one writer does not let the second begin until the first ends.
	g := s.setup(t)
	if got := g.claim("w1", 2, 50); !reflect.DeepEqual(claimedIDs(got), []string{"op-1", "op-2"}) {
		t.Fatalf("max 2 claimed %v", claimedIDs(got))
	}
	h := s.setup(t)
	ctx := context.Background()
	first := must(h.db.Driver().BeginWrite(ctx))
	defer first.Rollback()
	params := &store.JobClaimManyParams{Max: 2, ClaimPrefix: "a.", Worker: "w1", ClaimHost: "h", LeaseExpiresAtMS: 50, NowMS: 10}
	one := must(first.JobClaimMany(ctx, params))
	waitCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	second, err := h.db.Driver().BeginWrite(waitCtx)
	if err == nil {
		defer second.Rollback()
		var two []store.ClaimedJob
		two, err = second.JobClaimMany(waitCtx, &store.JobClaimManyParams{Max: 2, ClaimPrefix: "b.", Worker: "w2", ClaimHost: "h", LeaseExpiresAtMS: 50, NowMS: 10})
		if err == nil && (len(two) != 1 || slices.Contains(claimedIDs(one), two[0].OperationID)) {
			t.Fatalf("two open transactions claimed %v and %v", claimedIDs(one), claimedIDs(two))
		}
	}
	if h.db.Driver().Writers() > 1 && err != nil {
		t.Fatalf("the second claimer was blocked instead of passing over: %v", err)
	}
	if h.db.Driver().Writers() == 1 && err == nil {
		t.Fatal("a second writer began while the first was open")
	}
}

func testJobSetRunning(t *testing.T, s *suite) {
	f := s.setup(t)
	c := f.claim("w1", 1, 500)[0]
	admit := func(claim string) func(ctx context.Context, tx *store.Tx) error {
		return func(ctx context.Context, tx *store.Tx) error {
			return tx.JobSetRunning(ctx, &store.JobSetRunningParams{OperationID: c.OperationID, IfClaimID: claim, Reserved: 20,
				ReserveShard: 3, Admission: []byte(`{"decision":"allow"}`), LeaseExpiresAtMS: 600, Reason: "admitted", NowMS: 11})
		}
	}
	f.guardFails("admitting under another claim", c.OperationID, admit("other"))
	f.write(admit(c.ClaimID))
	got := f.job(c.OperationID)
	want := c.Job
	want.State, want.Reserved, want.ReserveShard, want.AdmissionClaimID = wire.Running, 20, 3, c.ClaimID
	want.Admission, want.LeaseExpiresAtMS, want.Reason, want.UpdatedAtMS = []byte(`{"decision":"allow"}`), 600, "admitted", 11
	want.StartedAtMS = 11 // claimed at 10 (f.claim), started now
	if c.ClaimedAtMS != 10 || !reflect.DeepEqual(got, want) {
		t.Fatalf("running\n%+v\nwant\n%+v", got, want)
	}
	f.guardFails("admitting a running job again", c.OperationID, admit(c.ClaimID))
}

func testJobSetRefused(t *testing.T, s *suite) {
	f := s.setup(t)
	c := f.claim("w1", 1, 500)[0]
	f.guardFails("refusing under another claim", c.OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetRefused(ctx, &store.JobSetRefusedParams{OperationID: c.OperationID, IfClaimID: "other", NowMS: 11})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetRefused(ctx, &store.JobSetRefusedParams{OperationID: c.OperationID, IfClaimID: c.ClaimID,
			Admission: []byte(`{"decision":"deny"}`), Reason: "over budget", NowMS: 11})
	})
	if j := f.job(c.OperationID); j.State != wire.Refused || j.Reserved != 0 || j.ReserveShard != -1 || j.AdmissionClaimID != c.ClaimID ||
		string(j.Admission) != `{"decision":"deny"}` || j.Reason != "over budget" || j.UpdatedAtMS != 11 || j.FinishedAtMS != 11 || j.StartedAtMS != 0 {
		t.Fatalf("refused %+v", j)
	}
}

func testJobRenewLease(t *testing.T, s *suite) {
	f := s.setup(t)
	c := f.claim("w1", 1, 500)[0]
	renew := func(claim string, until int64) func(ctx context.Context, tx *store.Tx) error {
		return func(ctx context.Context, tx *store.Tx) error {
			return tx.JobRenewLease(ctx, &store.JobRenewLeaseParams{OperationID: c.OperationID, IfClaimID: claim, LeaseExpiresAtMS: until, NowMS: 20})
		}
	}
	f.guardFails("renewing another claim's lease", c.OperationID, renew("other", 900))
	f.write(renew(c.ClaimID, 900)) // claimed
	if j := f.job(c.OperationID); j.LeaseExpiresAtMS != 900 || j.UpdatedAtMS != 20 || j.State != wire.Claimed {
		t.Fatalf("renewed %+v", j)
	}
	f.run() // op-2, running
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobCancel(ctx, &store.JobCancelParams{OperationID: c.OperationID, IfState: wire.Claimed, To: wire.CancelledBeforeDispatch, NowMS: 30})
	})
	f.guardFails("renewing a cancelled job's lease", c.OperationID, renew(c.ClaimID, 1000))
	r := f.job("op-2")
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobRenewLease(ctx, &store.JobRenewLeaseParams{OperationID: "op-2", IfClaimID: r.ClaimID, LeaseExpiresAtMS: 1200, NowMS: 40})
	})
	if j := f.job("op-2"); j.State != wire.Running || j.LeaseExpiresAtMS != 1200 {
		t.Fatalf("a running job's renewal %+v", j)
	}
}

func testJobComplete(t *testing.T, s *suite) {
	f := s.setup(t)
	j := f.run()
	f.guardFails("completing a job not in the state read", j.OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobComplete(ctx, &store.JobCompleteParams{OperationID: j.OperationID, IfState: wire.Unresolved, Reason: "x", NowMS: 20})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobComplete(ctx, &store.JobCompleteParams{OperationID: j.OperationID, IfState: wire.Running, Reason: "published", NowMS: 20})
	})
	got := f.job(j.OperationID)
	want := j
	want.State, want.Reserved, want.ReserveShard, want.Reason, want.UpdatedAtMS = wire.Completed, 0, -1, "published", 20
	want.FinishedAtMS = 20
	if j.StartedAtMS == 0 || !reflect.DeepEqual(got, want) {
		t.Fatalf("completed\n%+v\nwant\n%+v", got, want)
	}
}

func testJobRequeue(t *testing.T, s *suite) {
	f := s.setup(t)
	j := f.run()
	f.guardFails("requeueing a job not in the state read", j.OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: j.OperationID, IfState: wire.Claimed, NowMS: 20})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: j.OperationID, IfState: wire.Running, Worker: "w1",
			Attempts: 1, ClaimableAtMS: 2000, LastError: "boom", Reason: "retrying", NowMS: 20})
	})
	got := f.job(j.OperationID)
	want := j
	want.State, want.ClaimID, want.ClaimHost, want.LeaseExpiresAtMS, want.Reserved, want.ReserveShard = wire.Queued, "", "", 0, 0, -1
	want.AdmissionClaimID, want.Admission, want.Attempts, want.ClaimableAtMS = "", nil, 1, 2000
	want.LastError, want.Reason, want.UpdatedAtMS = "boom", "retrying", 20
	want.ClaimedAtMS, want.StartedAtMS, want.FinishedAtMS = 0, 0, 0 // queued again: none of its times yet
	if j.ClaimedAtMS == 0 || j.StartedAtMS == 0 || !reflect.DeepEqual(got, want) {
		t.Fatalf("requeued\n%+v\nwant\n%+v", got, want)
	}
}

func testJobFail(t *testing.T, s *suite) {
	f := s.setup(t)
	j := f.run()
	f.guardFails("failing a job not in the state read", j.OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobFail(ctx, &store.JobFailParams{OperationID: j.OperationID, IfState: wire.Queued, NowMS: 20})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobFail(ctx, &store.JobFailParams{OperationID: j.OperationID, IfState: wire.Running, Attempts: 3,
			LastError: "boom", Reason: "out of attempts", NowMS: 20})
	})
	got := f.job(j.OperationID)
	want := j
	want.State, want.ClaimID, want.ClaimHost, want.LeaseExpiresAtMS, want.Reserved, want.ReserveShard = wire.Failed, "", "", 0, 0, -1
	want.Attempts, want.LastError, want.Reason, want.UpdatedAtMS = 3, "boom", "out of attempts", 20
	want.FinishedAtMS = 20
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("failed\n%+v\nwant\n%+v", got, want)
	}
}

func testJobSetUnresolved(t *testing.T, s *suite) {
	f := s.setup(t)
	c := f.claim("w9", 1, 50)[0]
	f.guardFails("a claimed job made unresolved", c.OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetUnresolved(ctx, &store.JobSetUnresolvedParams{OperationID: c.OperationID, Reason: "x", NowMS: 20})
	})
	j := f.run()
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobSetUnresolved(ctx, &store.JobSetUnresolvedParams{OperationID: j.OperationID, Reason: "lease expired", NowMS: 700})
	})
	got := f.job(j.OperationID)
	want := j
	want.State, want.Reason, want.UpdatedAtMS = wire.Unresolved, "lease expired", 700 // keeps its claim and reservation
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("unresolved\n%+v\nwant\n%+v", got, want)
	}
}

func testJobCancel(t *testing.T, s *suite) {
	f := s.setup(t)
	j := f.run()
	f.guardFails("cancelling a job not in the state read", j.OperationID, func(ctx context.Context, tx *store.Tx) error {
		return tx.JobCancel(ctx, &store.JobCancelParams{OperationID: j.OperationID, IfState: wire.Claimed, To: wire.Cancelled, NowMS: 20})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobCancel(ctx, &store.JobCancelParams{OperationID: j.OperationID, IfState: wire.Running, To: wire.Cancelled, Reason: "operator", NowMS: 20})
	})
	got := f.job(j.OperationID)
	want := j // keeps its claim id, so its holder learns of it
	want.State, want.ClaimHost, want.LeaseExpiresAtMS, want.Reserved, want.ReserveShard = wire.Cancelled, "", 0, 0, -1
	want.Reason, want.UpdatedAtMS, want.FinishedAtMS = "operator", 20, 20
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("cancelled\n%+v\nwant\n%+v", got, want)
	}
}

func testJobList(t *testing.T, s *suite) {
	f := s.setup(t)
	f.claim("w1", 1, 50)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		all := must(tx.JobList(ctx))
		if !reflect.DeepEqual(ids(all), []string{"op-1", "op-2", "op-3"}) || all[0].State != wire.Claimed || all[0].Owner != "w1" {
			t.Fatalf("all %+v", all)
		}
		return nil
	})
}

func testJobListExpired(t *testing.T, s *suite) {
	f := s.setup(t)
	f.claim("w1", 1, 50) // op-1
	f.claim("w2", 1, 500)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for _, lock := range []store.Lock{store.NoLock, store.ForUpdate} {
			if got := ids(must(tx.JobListExpired(ctx, &store.JobListExpiredParams{NowMS: 100, Lock: lock}))); !reflect.DeepEqual(got, []string{"op-1"}) {
				t.Fatalf("expired at 100 (%v): %v", lock, got)
			}
		}
		if got := ids(must(tx.JobListExpired(ctx, &store.JobListExpiredParams{NowMS: 50, Lock: store.NoLock}))); len(got) != 0 {
			t.Fatalf("a lease ending at 50 expired at 50: %v", got)
		}
		return nil
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := ids(must(tx.JobListExpired(ctx, &store.JobListExpiredParams{NowMS: 1000, Lock: store.NoLock}))); !reflect.DeepEqual(got, []string{"op-1", "op-2"}) {
			t.Fatalf("expired at 1000, read-only: %v", got)
		}
		return nil
	})
}

func testJobListClaimedBy(t *testing.T, s *suite) {
	f := s.setup(t)
	f.claim("w1", 1, 50) // op-1 by host-w1
	f.claim("w3", 1, 50) // op-2 by host-w3
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if got := ids(must(tx.JobListClaimedBy(ctx, []string{"host-w1", "host-w3", "host-w2"}))); !reflect.DeepEqual(got, []string{"op-1", "op-2"}) {
			t.Fatalf("claimed by either: %v", got)
		}
		if got := ids(must(tx.JobListClaimedBy(ctx, []string{"host-w3", "elsewhere"}))); !reflect.DeepEqual(got, []string{"op-2"}) {
			t.Fatalf("claimed by host-w3: %v", got)
		}
		if none := must(tx.JobListClaimedBy(ctx, nil)); len(none) != 0 {
			t.Fatalf("claimed by no host: %+v", none)
		}
		return nil
	})
}

func testJobListClaimedUnder(t *testing.T, s *suite) {
	f := s.setup(t)
	f.claim("w1", 2, 50) // op-1, op-2 under "c-w1."
	f.write(func(ctx context.Context, tx *store.Tx) error {
		_, err := tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: 1, ClaimPrefix: "other.", Worker: "w1", ClaimHost: "h", LeaseExpiresAtMS: 50, NowMS: 10})
		return err
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		got := must(tx.JobListClaimedUnder(ctx, &store.JobListClaimedUnderParams{Worker: "w1", Prefix: "c-w1."}))
		if !reflect.DeepEqual(claimedIDs(got), []string{"op-1", "op-2"}) || got[0].BatchDocument != "text" || got[1].ClaimID != "c-w1.2" {
			t.Fatalf("claimed under c-w1.: %+v", got)
		}
		if other := must(tx.JobListClaimedUnder(ctx, &store.JobListClaimedUnderParams{Worker: "w2", Prefix: "c-w1."})); len(other) != 0 {
			t.Fatalf("another worker's claims: %+v", other)
		}
		return nil
	})
}

func testJobPending(t *testing.T, s *suite) {
	f := s.setup(t)
	pending := func() bool {
		var p bool
		f.read(func(ctx context.Context, tx *store.Tx) (err error) { p, err = tx.JobPending(ctx); return err })
		return p
	}
	if !pending() {
		t.Fatal("queued jobs are not pending")
	}
	for _, c := range f.claim("w1", 3, 50) {
		f.write(func(ctx context.Context, tx *store.Tx) error {
			return tx.JobCancel(ctx, &store.JobCancelParams{OperationID: c.OperationID, IfState: wire.Claimed, To: wire.CancelledBeforeDispatch, NowMS: 20})
		})
		if c.OperationID != "op-3" && !pending() {
			t.Fatalf("after cancelling %s, the claimed rest are not pending", c.OperationID)
		}
	}
	if pending() {
		t.Fatal("only cancelled jobs, yet pending")
	}
}

func testJobCountByState(t *testing.T, s *suite) {
	f := s.setup(t)
	f.claim("w1", 2, 50)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.JobCountByState(ctx)); !reflect.DeepEqual(got, map[wire.JobState]int64{wire.Queued: 1, wire.Claimed: 2}) {
			t.Fatalf("by state %v", got)
		}
		return nil
	})
}

func testJobPage(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		// op-2 claimed by worker-9; op-1 assigned to nobody at a new generation.
		if _, err := tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: 2, ClaimPrefix: "x.", Worker: "worker-9", ClaimHost: "h", LeaseExpiresAtMS: 50, NowMS: 10}); err != nil {
			return err
		}
		if err := tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: "op-1", IfState: wire.Claimed, Worker: "worker-9", NowMS: 10}); err != nil {
			return err
		}
		_, err := tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: "doc-1", Owner: "", Reason: "requeued", AtMS: 10})
		return err
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		for _, c := range []struct {
			f     store.JobFilter
			after int64
			limit int
			want  []string
		}{
			{store.JobFilter{}, 0, 10, []string{"op-1", "op-2", "op-3"}},
			{store.JobFilter{}, 0, 2, []string{"op-1", "op-2"}},
			{store.JobFilter{}, 2, 2, []string{"op-3"}},
			{store.JobFilter{}, 3, 2, []string{}},
			{store.JobFilter{State: wire.Queued}, 0, 10, []string{"op-1", "op-3"}},
			{store.JobFilter{State: wire.Queued}, 1, 10, []string{"op-3"}},
			{store.JobFilter{Section: "summary"}, 0, 10, []string{"op-1", "op-2", "op-3"}},
			{store.JobFilter{Section: "links"}, 0, 10, []string{}},
			{store.JobFilter{Owner: "worker-9"}, 0, 10, []string{"op-2"}},
			{store.JobFilter{OperationPrefix: "op-"}, 1, 10, []string{"op-2", "op-3"}},
			{store.JobFilter{OperationPrefix: "op-3"}, 0, 10, []string{"op-3"}},
			{store.JobFilter{OperationPrefix: "OP-3"}, 0, 10, []string{}},
			{store.JobFilter{OperationPrefix: "op_"}, 0, 10, []string{}}, // not a pattern
			{store.JobFilter{State: wire.Claimed, Owner: "worker-9", Section: "summary"}, 0, 10, []string{"op-2"}},
			{store.JobFilter{State: wire.Queued, OperationPrefix: "op-1"}, 0, 10, []string{"op-1"}},
		} {
			if got := ids(must(tx.JobPage(ctx, &store.JobPageParams{Filter: c.f, After: c.after, Limit: c.limit}))); !reflect.DeepEqual(got, c.want) {
				t.Errorf("%+v after %d, limit %d: %v, want %v", c.f, c.after, c.limit, got, c.want)
			}
		}
		return nil
	})
}

func testAttempts(t *testing.T, s *suite) {
	f := s.setup(t)
	mk := func(n int64, retryable bool) store.Attempt {
		return store.Attempt{OperationID: "op-1", ClaimID: fmt.Sprint("c-", n), Answer: []byte(`{"state":"queued"}`),
			Attempt: wire.Attempt{Attempt: n, Worker: "w", Generation: n, Reason: fmt.Sprint("reason ", n),
				Retryable: retryable, Outcome: "retry", Cost: 20 * n, AtMS: 100 + n}}
	}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.AttemptInsert(ctx, mk(2, false)); err != nil {
			return err
		}
		return tx.AttemptInsert(ctx, mk(1, true))
	})
	f.refused("one attempt number recorded twice", func(ctx context.Context, tx *store.Tx) error { return tx.AttemptInsert(ctx, mk(1, true)) })
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.AttemptList(ctx, "op-1")); !reflect.DeepEqual(got, []store.Attempt{mk(1, true), mk(2, false)}) {
			t.Fatalf("attempts %+v", got)
		}
		if none := must(tx.AttemptList(ctx, "op-2")); len(none) != 0 {
			t.Fatalf("another job's attempts: %+v", none)
		}
		return nil
	})
}

func testDocumentInsertGet(t *testing.T, s *suite) {
	f := s.setup(t)
	f.refused("one document id twice", func(ctx context.Context, tx *store.Tx) error { return tx.DocumentInsert(ctx, "doc-1", 2) })
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.DocumentInsert(ctx, "doc-new", 5); err != nil {
			return err
		}
		for _, lock := range []store.Lock{store.NoLock, store.ForUpdate} {
			if d := must(tx.DocumentGet(ctx, "doc-new", lock)); d.ID != "doc-new" || d.Version != 0 || d.Generation != 0 || d.Owner != "" || string(d.Body) != "null" {
				t.Fatalf("a new document (%v): %+v", lock, d)
			}
		}
		if _, err := tx.DocumentGet(ctx, "nope", store.NoLock); !store.IsNotFound(err) {
			t.Fatalf("an absent document: %v", err)
		}
		return nil
	})
}

func testDocumentAssign(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		zero, stale := int64(0), int64(5)
		if a := must(tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: "doc-1", IfGeneration: &zero, Owner: "w1", Reason: "operator", AtMS: 9})); !a.OK || a.Generation != 1 {
			t.Fatalf("compare-and-swap at 0: %+v", a)
		}
		if a := must(tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: "doc-1", IfGeneration: &stale, Owner: "w2", Reason: "operator", AtMS: 9})); a.OK {
			t.Fatalf("a stale expectation matched: %+v", a)
		}
		if a := must(tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: "doc-1", Owner: "", Reason: "revoked", AtMS: 10})); !a.OK || a.Generation != 2 {
			t.Fatalf("revoke: %+v", a)
		}
		if a := must(tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: "nope", Owner: "", Reason: "x", AtMS: 9})); a.OK {
			t.Fatalf("an absent document matched: %+v", a)
		}
		d := must(tx.DocumentGet(ctx, "doc-1", store.ForUpdate))
		j := must(tx.JobGet(ctx, "op-1", store.NoLock))
		if d.Generation != 2 || d.Owner != "" || j.Generation != 2 || j.Owner != "" {
			t.Fatalf("document %+v, job sees generation %d", d, j.Generation)
		}
		return nil
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		want := []store.Assignment{{DocumentID: "doc-1", Generation: 1, Owner: "w1", Reason: "operator", AtMS: 9},
			{DocumentID: "doc-1", Generation: 2, Owner: "", Reason: "revoked", AtMS: 10}}
		if got := must(tx.AssignmentList(ctx, "doc-1")); !reflect.DeepEqual(got, want) {
			t.Fatalf("assignments %+v", got)
		}
		return nil
	})
}

func testDocumentWrite(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.DocumentWrite(ctx, &store.DocumentWriteParams{ID: "doc-1", Body: []byte(`{"a":1}`), Version: 1, AtMS: 9})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		d := must(tx.DocumentGet(ctx, "doc-1", store.NoLock))
		j := must(tx.JobGet(ctx, "op-1", store.NoLock))
		if string(d.Body) != `{"a":1}` || d.Version != 1 || j.DocumentVersion != 1 {
			t.Fatalf("document %+v; the job reads version %d", d, j.DocumentVersion)
		}
		if other := must(tx.DocumentGet(ctx, "doc-2", store.NoLock)); other.Version != 0 {
			t.Fatalf("another document changed: %+v", other)
		}
		return nil
	})
}

func testAssignmentList(t *testing.T, s *suite) {
	f := s.setup(t)
	f.claim("w1", 1, 50)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		_, err := tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: "doc-1", Owner: "w2", Reason: "operator", AtMS: 20})
		return err
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		got := must(tx.AssignmentList(ctx, "doc-1"))
		if len(got) != 2 || got[0].Owner != "w1" || got[0].Generation != 1 || got[1] != (store.Assignment{DocumentID: "doc-1", Generation: 2, Owner: "w2", Reason: "operator", AtMS: 20}) {
			t.Fatalf("assignments oldest first: %+v", got)
		}
		if none := must(tx.AssignmentList(ctx, "doc-2")); len(none) != 0 {
			t.Fatalf("an unassigned document's: %+v", none)
		}
		return nil
	})
}

func testMutations(t *testing.T, s *suite) {
	f := s.setup(t)
	m := func(doc string, v int64, key string) store.Mutation {
		return store.Mutation{DocumentID: doc, Version: v, OperationKey: key, Caller: "w", AtMS: 9 + v}
	}
	// One row, then several in one statement (a batch's).
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.MutationInsert(ctx, m("doc-1", 2, "k2")); err != nil {
			return err
		}
		return tx.MutationInsert(ctx, m("doc-1", 1, "k1"), m("doc-2", 1, "k1"))
	})
	// One operation key mutates its document at most once, whatever the
	// code above the database does; a statement of several rows with one
	// such row writes none of them.
	f.refused("an operation key mutating its document twice", func(ctx context.Context, tx *store.Tx) error {
		return tx.MutationInsert(ctx, m("doc-1", 3, "k1"))
	})
	f.refused("a batch's mutations, one of them twice", func(ctx context.Context, tx *store.Tx) error {
		return tx.MutationInsert(ctx, m("doc-2", 2, "k2"), m("doc-1", 3, "k2"))
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		list := must(tx.MutationList(ctx, "doc-1"))
		n := must(tx.MutationCount(ctx, "doc-1"))
		total := must(tx.MutationTotal(ctx))
		byDoc := must(tx.MutationCountByDocument(ctx))
		twice := must(tx.MutationRepeatedOperations(ctx))
		if !reflect.DeepEqual(list, []store.Mutation{m("doc-1", 1, "k1"), m("doc-1", 2, "k2")}) || n != 2 || total != 3 ||
			!reflect.DeepEqual(byDoc, map[string]int64{"doc-1": 2, "doc-2": 1}) || twice != 0 {
			t.Fatalf("list %+v, count %d, total %d, by document %v, repeated %d", list, n, total, byDoc, twice)
		}
		return nil
	})
}

func testOperations(t *testing.T, s *suite) {
	f := s.setup(t)
	op := store.StoredOperation{Binding: []byte(`{"tool":"x"}`), CreatedMS: 9, Operation: wire.Operation{DocumentID: "doc-1",
		OperationKey: "k", Caller: "w", Status: wire.StatusPublished, Outcome: json.RawMessage(`{"status":"published","version":1}`), Deliveries: 1}}
	refusal := store.StoredOperation{Binding: []byte(`{"tool":"y"}`), CreatedMS: 8, Operation: wire.Operation{DocumentID: "doc-1",
		OperationKey: "j", Caller: "w", Status: wire.StatusSuperseded, Outcome: json.RawMessage(`{"status":"superseded","version":0}`), Deliveries: 1}}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.OperationGet(ctx, "doc-1", "k"); !store.IsNotFound(err) {
			t.Fatalf("an absent operation: %v", err)
		}
		if err := tx.OperationInsert(ctx, refusal); err != nil {
			return err
		}
		if err := tx.OperationInsert(ctx, op); err != nil {
			return err
		}
		return tx.OperationCountDelivery(ctx, "doc-1", "k")
	})
	f.refused("one operation key retained twice", func(ctx context.Context, tx *store.Tx) error { return tx.OperationInsert(ctx, op) })
	// Several in one statement (a batch's): all of them, with every byte
	// of binding and outcome as given, or none.
	other := op
	other.DocumentID, other.Binding = "doc-3", []byte(`{"quote":"\"<&>\u2028","n":12345678901234567}`)
	another := refusal
	another.DocumentID = "doc-3"
	f.refused("a batch's operations, one key retained already", func(ctx context.Context, tx *store.Tx) error {
		return tx.OperationInsert(ctx, other, op)
	})
	f.write(func(ctx context.Context, tx *store.Tx) error { return tx.OperationInsert(ctx, other, another) })
	f.read(func(ctx context.Context, tx *store.Tx) error {
		for _, want := range []store.StoredOperation{other, another} {
			if got := must(tx.OperationGet(ctx, want.DocumentID, want.OperationKey)); !reflect.DeepEqual(got, want) {
				t.Fatalf("written in one statement %+v, read %+v", want, got)
			}
		}
		return nil
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		got := must(tx.OperationGet(ctx, "doc-1", "k"))
		list := must(tx.OperationList(ctx, "doc-1"))
		j := must(tx.JobGet(ctx, "op-1", store.NoLock))
		op.Deliveries = 2
		if !reflect.DeepEqual(got, op) || len(list) != 2 || !slices.ContainsFunc(list, func(o wire.Operation) bool { return reflect.DeepEqual(o, op.Operation) }) ||
			string(j.Outcome) != string(op.Outcome) {
			t.Fatalf("operation %+v, list %+v, job outcome %s", got, list, j.Outcome)
		}
		if empty := must(tx.OperationList(ctx, "doc-2")); empty == nil || len(empty) != 0 {
			t.Fatalf("no operations listed as %v", empty)
		}
		return nil
	})
}

func testOperationGetMany(t *testing.T, s *suite) {
	// Every asked pair that is retained, and whatever else comes back is
	// of the asked documents and keys.
	f := s.setup(t)
	stored := func(doc, key string) store.StoredOperation {
		return store.StoredOperation{Binding: []byte(`{"tool":"x"}`), CreatedMS: 9, Operation: wire.Operation{DocumentID: doc,
			OperationKey: key, Caller: "w", Status: wire.StatusSuperseded, Outcome: json.RawMessage(`{"status":"superseded","version":0}`), Deliveries: 1}}
	}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for _, o := range []store.StoredOperation{stored("doc-1", "a"), stored("doc-2", "b"), stored("doc-2", "a"), stored("doc-3", "c")} {
			if err := tx.OperationInsert(ctx, o); err != nil {
				return err
			}
		}
		return nil
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		asked := []store.OperationRef{{DocumentID: "doc-1", Key: "a"}, {DocumentID: "doc-2", Key: "b"}, {DocumentID: "doc-1", Key: "nope"}}
		got := map[store.OperationRef]store.StoredOperation{}
		for _, o := range must(tx.OperationGetMany(ctx, asked)) {
			r := store.OperationRef{DocumentID: o.DocumentID, Key: o.OperationKey}
			if r.DocumentID == "doc-3" || r.Key == "c" || r.Key == "nope" {
				t.Fatalf("an operation not asked for: %+v", r)
			}
			got[r] = o
		}
		for _, r := range asked[:2] {
			if !reflect.DeepEqual(got[r], stored(r.DocumentID, r.Key)) {
				t.Fatalf("%+v read as %+v", r, got[r])
			}
		}
		if _, ok := got[asked[2]]; ok {
			t.Fatal("an absent operation was read")
		}
		return nil
	})
}

// receipts stores rcpt-1..rcpt-3 for op-1, op-2, op-1 at sequences 1..3.
func (f *fixture) receipts() {
	f.t.Helper()
	f.write(func(ctx context.Context, tx *store.Tx) error {
		var rs []store.StoredReceipt
		for i, op := range []string{"op-1", "op-2", "op-1"} {
			r := wire.Receipt{ID: fmt.Sprint("rcpt-", i+1), ReceiptBody: wire.ReceiptBody{Sequence: int64(i + 1), Kind: wire.KindAdmission, OperationID: op}}
			rs = append(rs, store.StoredReceipt{Receipt: r, Stored: []byte(fmt.Sprintf(`{"id":"%s"}`, r.ID))})
		}
		return tx.ReceiptInsert(ctx, rs) // three rows, one statement
	})
}

func testReceiptHead(t *testing.T, s *suite) {
	f := s.setup(t)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if h := must(tx.ReceiptHead(ctx)); h != (store.ChainHead{}) {
			t.Fatalf("head of an empty chain: %+v", h)
		}
		return nil
	})
	f.receipts()
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if h := must(tx.ReceiptHead(ctx)); h != (store.ChainHead{Sequence: 3, ID: "rcpt-3"}) {
			t.Fatalf("head %+v", h)
		}
		return nil
	})
}

func testReceiptInsert(t *testing.T, s *suite) {
	f := s.setup(t)
	f.receipts()
	f.refused("two receipts at one sequence", func(ctx context.Context, tx *store.Tx) error {
		return tx.ReceiptInsert(ctx, []store.StoredReceipt{{Receipt: wire.Receipt{ID: "rcpt-9", ReceiptBody: wire.ReceiptBody{Sequence: 3}}, Stored: []byte("{}")}})
	})
	f.refused("one receipt id twice", func(ctx context.Context, tx *store.Tx) error {
		return tx.ReceiptInsert(ctx, []store.StoredReceipt{{Receipt: wire.Receipt{ID: "rcpt-1", ReceiptBody: wire.ReceiptBody{Sequence: 4}}, Stored: []byte("{}")}})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error { return tx.ReceiptInsert(ctx, nil) })
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if all := must(tx.ReceiptList(ctx, "")); len(all) != 3 {
			t.Fatalf("%d receipts", len(all))
		}
		return nil
	})
}

func testReceiptReads(t *testing.T, s *suite) {
	f := s.setup(t)
	f.receipts()
	f.read(func(ctx context.Context, tx *store.Tx) error {
		all := must(tx.ReceiptList(ctx, ""))
		mine := must(tx.ReceiptList(ctx, "op-1"))
		newest := must(tx.ReceiptNewestByOperation(ctx))
		body := must(tx.ReceiptGet(ctx, "rcpt-2"))
		if len(all) != 3 || string(all[0]) != `{"id":"rcpt-1"}` || len(mine) != 2 || string(mine[1]) != `{"id":"rcpt-3"}` ||
			!reflect.DeepEqual(newest, map[string]string{"op-1": "rcpt-3", "op-2": "rcpt-2"}) || string(body) != `{"id":"rcpt-2"}` {
			t.Fatalf("%q receipts, %q of op-1, newest %v, body %s", all, mine, newest, body)
		}
		if _, err := tx.ReceiptGet(ctx, "nope"); !store.IsNotFound(err) {
			t.Fatalf("an absent receipt: %v", err)
		}
		many := must(tx.ReceiptGetMany(ctx, []string{"rcpt-3", "nope", "rcpt-1"}))
		if len(many) != 2 || string(many[0]) != `{"id":"rcpt-1"}` || string(many[1]) != `{"id":"rcpt-3"}` {
			t.Fatalf("read many: %q", many)
		}
		if some := must(tx.ReceiptNewestFor(ctx, []string{"op-1", "op-3"})); !reflect.DeepEqual(some, map[string]string{"op-1": "rcpt-3"}) {
			t.Fatalf("newest receipts of op-1 and op-3: %v", some)
		}
		return nil
	})
}

func testEvents(t *testing.T, s *suite) {
	// More rows than one statement takes are split, in order.
	f := s.setup(t)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		count, last, err := tx.EventHead(ctx)
		if err != nil || count != 0 || last != 0 || must(tx.EventLast(ctx)) != 0 || len(must(tx.EventList(ctx, 0, 5))) != 0 {
			t.Fatalf("an empty log: %d/%d (%v)", count, last, err)
		}
		return nil
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		evs := make([]wire.Event, 1234)
		for i := range evs {
			evs[i] = wire.Event{Sequence: int64(i + 1), TimestampMS: 1, Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i + 1), Data: json.RawMessage(`{"i":1}`)}
		}
		return tx.EventInsert(ctx, evs)
	})
	f.refused("two events at one sequence", func(ctx context.Context, tx *store.Tx) error {
		return tx.EventInsert(ctx, []wire.Event{{Sequence: 5, TimestampMS: 1, Kind: wire.EventClaimed, Actor: "w", Title: "x", Data: json.RawMessage(`{}`)}})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		count, last, err := tx.EventHead(ctx)
		tail := must(tx.EventLast(ctx))
		page := must(tx.EventList(ctx, 1000, 5))
		if err != nil || count != 1234 || last != 1234 || tail != 1234 || len(page) != 5 || page[0].Sequence != 1001 || page[0].Title != "1001" ||
			page[0].Kind != wire.EventClaimed || string(page[0].Data) != `{"i":1}` || page[4].Sequence != 1005 {
			t.Fatalf("head %d/%d/%d, page %+v (%v)", count, last, tail, page, err)
		}
		return nil
	})
	// Every byte of data as given, whatever it holds; the empty data
	// alone in a statement too.
	data := []string{`{"t":"é—日本 \u2028"}`, `{"q":"\"\\<&>"}`, ``, strings.Repeat(`{"long":"x"}`, 1000)}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		evs := make([]wire.Event, len(data))
		for i, d := range data {
			evs[i] = wire.Event{Sequence: int64(1235 + i), TimestampMS: 2, Kind: wire.EventClaimed, Actor: "é", Title: "t", Data: json.RawMessage(d)}
		}
		if err := tx.EventInsert(ctx, evs); err != nil {
			return err
		}
		return tx.EventInsert(ctx, []wire.Event{{Sequence: 1239, TimestampMS: 2, Kind: wire.EventClaimed, Actor: "w", Title: "t"}})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		page := must(tx.EventList(ctx, 1234, 10))
		if len(page) != len(data)+1 || page[0].Actor != "é" || string(page[len(data)].Data) != "" {
			t.Fatalf("%d events after 1234: %+v", len(page), page)
		}
		for i, d := range data {
			if string(page[i].Data) != d {
				t.Fatalf("event %d's data %q, written %q", page[i].Sequence, page[i].Data, d)
			}
		}
		return nil
	})
}

func testPendingLogInsertList(t *testing.T, s *suite) {
	// Entries written for the sequencer come back oldest first, up to the
	// limit, with the placed log's heads.
	f := s.setup(t)
	var pending store.PendingIDs
	f.write(func(ctx context.Context, tx *store.Tx) (err error) {
		evs := make([]wire.Event, 600)
		for i := range evs {
			evs[i] = wire.Event{TimestampMS: int64(i), Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i), Data: json.RawMessage(`{}`)}
		}
		pending, err = tx.PendingLogInsert(ctx, evs, []wire.Receipt{{ID: "rcpt-a", ReceiptBody: wire.ReceiptBody{OperationID: "op-1", Nonce: "n"}}, {ID: "rcpt-b"}})
		return err
	})
	if len(pending.Events) != 600 || len(pending.Receipts) != 2 || pending.Receipts[0] == pending.Receipts[1] || !slices.IsSorted(pending.Events) {
		t.Fatalf("pending ids: %d events, receipts %v", len(pending.Events), pending.Receipts)
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		p := must(tx.PendingLogList(ctx, 550))
		if len(p.Events) != 550 || p.Events[0].Event.Title != "0" || p.Events[549].Event.Title != "549" || p.Events[0].Pending != pending.Events[0] ||
			string(p.Events[3].Event.Data) != `{}` || p.Events[3].Event.Kind != wire.EventClaimed ||
			len(p.Receipts) != 2 || p.Receipts[0].Receipt.ID != "rcpt-a" || p.Receipts[0].Receipt.Nonce != "n" || p.Receipts[1].Receipt.ID != "rcpt-b" ||
			p.LastEvent != 0 || p.Head != (store.ChainHead{}) {
			t.Fatalf("%d events, receipts %+v, heads %d %+v", len(p.Events), p.Receipts, p.LastEvent, p.Head)
		}
		return nil
	})
}

func testPendingLogPlace(t *testing.T, s *suite) {
	// Placing writes entries where readers look and removes them from
	// pending; PendingLogLeft says which of a request's entries are still
	// waiting.
	f := s.setup(t)
	var pending store.PendingIDs
	f.write(func(ctx context.Context, tx *store.Tx) (err error) {
		evs := make([]wire.Event, 60)
		for i := range evs {
			evs[i] = wire.Event{TimestampMS: int64(i), Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i), Data: json.RawMessage(`{}`)}
		}
		pending, err = tx.PendingLogInsert(ctx, evs, []wire.Receipt{{ID: "rcpt-a", ReceiptBody: wire.ReceiptBody{OperationID: "op-1"}}, {ID: "rcpt-b"}})
		return err
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		p := must(tx.PendingLogList(ctx, 50))
		placed := store.PendingIDs{Receipts: []int64{p.Receipts[0].Pending}}
		events := make([]wire.Event, len(p.Events))
		for i, e := range p.Events {
			placed.Events = append(placed.Events, e.Pending)
			events[i] = e.Event
			events[i].Sequence = int64(i + 1)
		}
		return tx.PendingLogPlace(ctx, &store.PendingLogPlaceParams{Events: events, Placed: placed,
			Receipts: []store.StoredReceipt{{Receipt: wire.Receipt{ID: "rcpt-a", ReceiptBody: wire.ReceiptBody{Sequence: 1, Kind: wire.KindAdmission, OperationID: "op-1"}},
				Stored: []byte(`{"id":"rcpt-a"}`)}}})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		p := must(tx.PendingLogList(ctx, 100))
		if len(p.Events) != 10 || p.Events[0].Event.Title != "50" || len(p.Receipts) != 1 || p.Receipts[0].Receipt.ID != "rcpt-b" ||
			p.LastEvent != 50 || p.Head != (store.ChainHead{Sequence: 1, ID: "rcpt-a"}) {
			t.Fatalf("after placing: %d events, receipts %+v, heads %d %+v", len(p.Events), p.Receipts, p.LastEvent, p.Head)
		}
		page := must(tx.EventList(ctx, 0, 2))
		if len(page) != 2 || page[0].Title != "0" || page[0].Sequence != 1 || string(must(tx.ReceiptGet(ctx, "rcpt-a"))) != `{"id":"rcpt-a"}` {
			t.Fatalf("placed events %+v", page)
		}
		left := must(tx.PendingLogLeft(ctx, pending))
		if !reflect.DeepEqual(left.Events, pending.Events[50:]) || !reflect.DeepEqual(left.Receipts, pending.Receipts[1:]) {
			t.Fatalf("left pending: %d events, receipts %v", len(left.Events), left.Receipts)
		}
		if none := must(tx.PendingLogLeft(ctx, store.PendingIDs{Events: pending.Events[:50]})); len(none.Events)+len(none.Receipts) != 0 {
			t.Fatalf("placed entries still pending: %+v", none)
		}
		return nil
	})
}

func testWorkerActivity(t *testing.T, s *suite) {
	// w1 holds op-1 running (f.run, updated at 11); w2 claimed op-2 at 10
	// and then failed it at 30; op-3 was never claimed.
	f := s.setup(t)
	f.run()
	c := f.claim("w2", 1, 500)[0]
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobFail(ctx, &store.JobFailParams{OperationID: c.OperationID, IfState: wire.Claimed, Attempts: 1, LastError: "x", Reason: "gave up", NowMS: 30})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		want := []store.WorkerActivity{{Worker: "w1", Held: 1, LastSeenMS: 11}, {Worker: "w2", Failed: 1, LastSeenMS: 30}}
		if got := must(tx.WorkerActivity(ctx, 20)); !reflect.DeepEqual(got, want) {
			t.Fatalf("since 20: %+v, want %+v", got, want)
		}
		if got := must(tx.WorkerActivity(ctx, 31)); got[1].Failed != 0 {
			t.Fatalf("since 31 a failure at 30 counts: %+v", got)
		}
		return nil
	})
}
