package storetest

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/store"
)

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

func testTryLockCounts(t *testing.T, s *suite) {
	// As the log lock (testTryLockLog), and apart from it.
	f := s.setup(t)
	ctx := context.Background()
	first := must(f.db.Driver().BeginWrite(ctx))
	defer first.Rollback()
	if ok, err := first.TryLockCounts(ctx); err != nil || !ok {
		t.Fatalf("first: %v %v", ok, err)
	}
	if f.db.Driver().Writers() == 1 {
		return
	}
	second := must(f.db.Driver().BeginWrite(ctx))
	defer second.Rollback()
	if ok, err := second.TryLockCounts(ctx); err != nil || ok {
		t.Fatalf("second while the first holds it: %v %v", ok, err)
	}
	if ok, err := second.TryLockLog(ctx); err != nil || !ok {
		t.Fatalf("the log lock while the first holds the counts lock: %v %v", ok, err)
	}
	second.Rollback()
	first.Rollback()
	third := must(f.db.Driver().BeginWrite(ctx))
	defer third.Rollback()
	if ok, err := third.TryLockCounts(ctx); err != nil || !ok {
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

func testLockTenants(t *testing.T, s *suite) {
	// A second holder waits for the first to end; with one writer every
	// write transaction excludes the others already, and the lock is a
	// no-op.
	f := s.setup(t)
	ctx := context.Background()
	first := must(f.db.Driver().BeginWrite(ctx))
	defer first.Rollback()
	if err := first.LockTenants(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := first.SettingGet(ctx, "none"); !store.IsNotFound(err) { // a read sends the held lock statement on
		t.Fatalf("the tenants lock's first holder: %v", err)
	}
	if f.db.Driver().Writers() == 1 {
		return
	}
	if !waits(t, f, func(ctx context.Context, c store.Conn) error { return c.LockTenants(ctx) }) {
		t.Fatal("a second holder of the tenants lock did not wait for the first")
	}
	first.Rollback()
	third := must(f.db.Driver().BeginWrite(ctx))
	defer third.Rollback()
	if err := third.LockTenants(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := third.SettingGet(ctx, "none"); !store.IsNotFound(err) {
		t.Fatalf("the tenants lock once its holder ended: %v", err)
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
	c := store.Credential{Name: "worker-1", Role: "worker", SHA256: "ab", CreatedMS: 7, Tenants: []string{"team-a", "team-b"}}
	op := store.Credential{Name: "operator", Role: "operator", SHA256: "ef", CreatedMS: 8}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.CredentialGet(ctx, "worker-1", store.NoLock); !store.IsNotFound(err) {
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
		got := must(tx.CredentialGet(ctx, "worker-1", store.NoLock))
		all := must(tx.CredentialList(ctx))
		slices.SortFunc(all, func(x, y store.Credential) int { return strings.Compare(x.Name, y.Name) })
		if !reflect.DeepEqual(got, c) || !reflect.DeepEqual(all, []store.Credential{op, c}) {
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
		if c := must(tx.CredentialGet(ctx, "worker-1", store.NoLock)); !reflect.DeepEqual(c, store.Credential{Name: "worker-1", Role: "worker", SHA256: "cd", CreatedMS: 7, RevokedMS: 9}) {
			t.Fatalf("after update: %+v", c)
		}
		return nil
	})
	// Read ForUpdate, a credential is locked until the transaction ends:
	// another such read waits (with one writer, every write transaction
	// excludes the others already).
	ctx := context.Background()
	first := must(f.db.Driver().BeginWrite(ctx))
	defer first.Rollback()
	if c, err := first.CredentialGet(ctx, "worker-1", store.ForUpdate); err != nil || c.SHA256 != "cd" {
		t.Fatalf("read for update: %+v (%v)", c, err)
	}
	if f.db.Driver().Writers() == 1 {
		return
	}
	if !waits(t, f, func(ctx context.Context, c store.Conn) error {
		_, err := c.CredentialGet(ctx, "worker-1", store.ForUpdate)
		return err
	}) {
		t.Fatal("a second read for update of a locked credential did not wait")
	}
}

// waits reports whether take, in a write transaction of its own, waits
// past 300 ms for a lock another transaction holds (a read after it sends
// a held statement on).
func waits(t *testing.T, f *fixture, take func(ctx context.Context, c store.Conn) error) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	c := must(f.db.Driver().BeginWrite(context.Background()))
	defer c.Rollback()
	err := take(ctx, c)
	if err == nil {
		_, err = c.SettingGet(ctx, "none")
	}
	return err != nil && !store.IsNotFound(err)
}
