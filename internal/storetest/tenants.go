package storetest

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/wire"
)

func ptr(v int64) *int64 { return &v }

// addTenant adds a tenant capped at allowance (nil: none).
func (f *fixture) addTenant(name string, allowance *int64, period string, startMS int64) {
	f.t.Helper()
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.TenantInsert(ctx, store.Tenant{Name: name, Allowance: allowance, Weight: 2, Period: period,
			PeriodStartMS: startMS, CreatedAtMS: 7})
	})
}

func (f *fixture) tenant(name string) store.Tenant {
	f.t.Helper()
	var t store.Tenant
	f.read(func(ctx context.Context, tx *store.Tx) error {
		t = must(tx.TenantGet(ctx, name))
		return nil
	})
	return t
}

func testTenantInsertGet(t *testing.T, s *suite) {
	f := s.setup(t)
	f.addTenant("team-a", ptr(60), wire.PeriodDay, 86_400_000)
	f.addTenant("team-b", nil, "", 0)
	want := store.Tenant{Name: "team-a", Allowance: ptr(60), Weight: 2, Period: wire.PeriodDay, PeriodStartMS: 86_400_000, CreatedAtMS: 7}
	if got := f.tenant("team-a"); !reflect.DeepEqual(got, want) {
		t.Fatalf("tenant\n%+v\nwant\n%+v", got, want)
	}
	f.refused("a second tenant of one name", func(ctx context.Context, tx *store.Tx) error {
		return tx.TenantInsert(ctx, store.Tenant{Name: "team-a", Weight: 1, CreatedAtMS: 8})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.TenantGet(ctx, "nobody"); !store.IsNotFound(err) {
			t.Fatalf("an unknown tenant: %v", err)
		}
		all := must(tx.TenantList(ctx))
		var names []string
		for _, x := range all {
			names = append(names, x.Name)
		}
		if !reflect.DeepEqual(names, []string{"default", "team-a", "team-b"}) || all[2].Allowance != nil {
			t.Fatalf("tenants %+v", all)
		}
		return nil
	})
}

func testTenantSetAllowance(t *testing.T, s *suite) {
	f := s.setup(t)
	f.addTenant("team-a", ptr(60), "", 0)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if r := must(tx.TenantReserve(ctx, "team-a")); !r.OK {
			t.Fatalf("reserve: %+v", r)
		}
		// Below what it holds: refused, unchanged.
		if c := must(tx.TenantSetAllowance(ctx, "team-a", ptr(19))); c.OK || *c.Tenant.Allowance != 60 {
			t.Fatalf("an allowance below what is reserved: %+v", c)
		}
		// Down to what it holds: no room left.
		if c := must(tx.TenantSetAllowance(ctx, "team-a", ptr(20))); !c.OK || *c.Tenant.Allowance != 20 || c.Tenant.Reserved != 20 {
			t.Fatalf("an allowance of what is reserved: %+v", c)
		}
		if r := must(tx.TenantReserve(ctx, "team-a")); r.OK {
			t.Fatalf("reserved with no room: %+v", r)
		}
		// Raised: room again, however it is split.
		if c := must(tx.TenantSetAllowance(ctx, "team-a", ptr(100))); !c.OK {
			t.Fatalf("raise: %+v", c)
		}
		for i := range 5 {
			if r := must(tx.TenantReserve(ctx, "team-a")); r.OK != (i < 4) {
				t.Fatalf("reservation %d after the raise: %+v", i, r)
			}
		}
		// None of its own: only the fleet bounds it.
		if c := must(tx.TenantSetAllowance(ctx, "team-a", nil)); !c.OK || c.Tenant.Allowance != nil {
			t.Fatalf("no allowance: %+v", c)
		}
		if r := must(tx.TenantReserve(ctx, "team-a")); !r.OK || r.Tenant.Reserved != 120 {
			t.Fatalf("reserve with none: %+v", r)
		}
		return nil
	})
	if got := f.tenant("team-a"); got.Allowance != nil || got.Reserved != 120 {
		t.Fatalf("after commit: %+v", got)
	}
}

func testTenantSetWeight(t *testing.T, s *suite) {
	f := s.setup(t)
	f.addTenant("team-a", ptr(60), "", 0)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		// A reservation made ahead in the process is in the figures the
		// change answers with, and still held after it.
		if r := must(tx.TenantReserve(ctx, "team-a")); !r.OK {
			t.Fatalf("reserve: %+v", r)
		}
		if got := must(tx.TenantSetWeight(ctx, "team-a", 7)); got.Weight != 7 || got.Reserved != 20 || *got.Allowance != 60 {
			t.Fatalf("the weight set: %+v", got)
		}
		if _, err := tx.TenantSetWeight(ctx, "nobody", 3); !store.IsNotFound(err) {
			t.Fatalf("an unknown tenant's weight: %v", err)
		}
		return nil
	})
	if got := f.tenant("team-a"); got.Weight != 7 || got.Reserved != 20 {
		t.Fatalf("after commit: %+v", got)
	}
	if got := f.tenant("default"); got.Weight != 1 {
		t.Fatalf("another tenant's weight moved: %+v", got)
	}
}

func testTenantReserve(t *testing.T, s *suite) {
	f := s.setup(t)
	f.addTenant("team-a", ptr(100), "", 0)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for i := range 6 {
			r := must(tx.TenantReserve(ctx, "team-a"))
			if r.OK != (i < 5) || r.Tenant.Reserved != int64(min(i+1, 5))*20 || r.Tenant.Name != "team-a" ||
				r.OK && r.Shard < 0 || !r.OK && r.Shard != -1 {
				t.Fatalf("reservation %d: %+v", i, r)
			}
		}
		// An uncapped tenant always reserves.
		for range 10 {
			if r := must(tx.TenantReserve(ctx, "default")); !r.OK || r.Tenant.Allowance != nil {
				t.Fatalf("uncapped: %+v", r)
			}
		}
		return nil
	})
	// A reservation rolled back to its savepoint is undone; one released
	// with its savepoint is kept; the commit writes them.
	f = s.setup(t)
	f.addTenant("team-a", ptr(100), "", 0)
	ctx := context.Background()
	c := must(f.db.Driver().BeginWrite(ctx))
	defer c.Rollback()
	reserve := func() store.TenantReservation { return must(c.TenantReserve(ctx, "team-a")) }
	reserve()
	for _, undo := range []bool{true, false} {
		if err := c.Savepoint(ctx, "item"); err != nil {
			t.Fatal(err)
		}
		if r := reserve(); !r.OK || r.Tenant.Reserved != 40 {
			t.Fatalf("in the savepoint: %+v", r)
		}
		if undo {
			if err := c.RollbackTo(ctx, "item"); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Release(ctx, "item"); err != nil {
			t.Fatal(err)
		}
	}
	if r := reserve(); !r.OK || r.Tenant.Reserved != 60 {
		t.Fatalf("after a savepoint rolled back and one released: %+v", r)
	}
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := f.tenant("team-a"); got.Reserved != 60 {
		t.Fatalf("after commit: %+v", got)
	}

	// 48 requests on two handles (hosts) reserve 20 each from a tenant's
	// 100: exactly 5 succeed, never over.
	f = s.setup(t)
	f.addTenant("team-a", ptr(100), "", 0)
	other := f.open()
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			err := []*store.DB{f.db, other}[i%2].WithTx(ctx, func(tx *store.Tx) error {
				r, err := tx.TenantReserve(ctx, "team-a")
				if r.Tenant.Allowance != nil && r.Tenant.Spent+r.Tenant.Reserved > *r.Tenant.Allowance {
					t.Errorf("over the tenant's allowance: %+v", r)
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
	if got := f.tenant("team-a"); granted.Load() != 5 || got.Reserved != 100 {
		t.Fatalf("granted %d, tenant %+v", granted.Load(), got)
	}
}

func testTenantMove(t *testing.T, s *suite) {
	f := s.setup(t)
	f.addTenant("team-a", ptr(100), "", 0)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		var shards []int64
		for range 5 {
			shards = append(shards, must(tx.TenantReserve(ctx, "team-a")).Shard)
		}
		// Settle 20 of one reservation as spent and release another's 20.
		if !must(tx.TenantMove(ctx, &store.TenantMoveParams{Tenant: "team-a", Shard: -1, FromReserved: 40, ToSpent: 20})) {
			t.Fatal("move from any shard refused")
		}
		if !must(tx.TenantMove(ctx, &store.TenantMoveParams{Tenant: "team-a", Shard: shards[4], FromReserved: 20, ToSpent: 20})) {
			t.Fatal("move on the reserving shard refused")
		}
		// More than is reserved: refused, nothing changed.
		if must(tx.TenantMove(ctx, &store.TenantMoveParams{Tenant: "team-a", Shard: -1, FromReserved: 41, ToSpent: 41})) {
			t.Fatal("an over-move went through")
		}
		return nil
	})
	if got := f.tenant("team-a"); got.Spent != 40 || got.Reserved != 40 {
		t.Fatalf("after the moves: %+v", got)
	}
}

func testTenantRollover(t *testing.T, s *suite) {
	f := s.setup(t)
	f.addTenant("team-a", ptr(100), wire.PeriodDay, 1000)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for range 3 {
			must(tx.TenantReserve(ctx, "team-a"))
		}
		must(tx.TenantMove(ctx, &store.TenantMoveParams{Tenant: "team-a", Shard: -1, FromReserved: 40, ToSpent: 30}))
		return nil
	})
	// Two hosts race to start the next period: one does, once.
	other := f.open()
	var rolled atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			err := []*store.DB{f.db, other}[i%2].WithTx(ctx, func(tx *store.Tx) error {
				r, err := tx.TenantRollover(ctx, &store.TenantRolloverParams{Tenant: "team-a", IfPeriodStartMS: 1000, PeriodStartMS: 2000})
				if r.OK {
					if r.EndedSpent != 30 {
						t.Errorf("ended spent %d, want 30", r.EndedSpent)
					}
					rolled.Add(1)
				}
				return err
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	// Spent starts again; the open reservation carries over.
	got := f.tenant("team-a")
	if rolled.Load() != 1 || got.Spent != 0 || got.Reserved != 20 || got.PeriodStartMS != 2000 {
		t.Fatalf("rolled %d times; tenant %+v", rolled.Load(), got)
	}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for i := range 5 {
			if r := must(tx.TenantReserve(ctx, "team-a")); r.OK != (i < 4) {
				t.Fatalf("reservation %d in the new period: %+v", i, r)
			}
		}
		return nil
	})
}

func testJobCountByTenant(t *testing.T, s *suite) {
	f := s.setup(t)
	f.run()
	f.read(func(ctx context.Context, tx *store.Tx) error {
		got := must(tx.JobCountByTenant(ctx))
		want := map[string]map[wire.JobState]int64{"default": {wire.Queued: 2, wire.Running: 1}}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("counts %v, want %v", got, want)
		}
		return nil
	})
}

func testCredentialReserve(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.CredentialInsert(ctx, store.Credential{Name: "agent-1", Role: "worker", SHA256: "a1", CreatedMS: 7, Allowance: ptr(50)}); err != nil {
			return err
		}
		return tx.CredentialInsert(ctx, store.Credential{Name: "worker-1", Role: "worker", SHA256: "w1", CreatedMS: 7})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		got := must(tx.CredentialGet(ctx, "agent-1", store.NoLock))
		if got.Allowance == nil || *got.Allowance != 50 || got.Spent != 0 || got.Reserved != 0 {
			t.Fatalf("a capped credential: %+v", got)
		}
		// 50 at 20 a report: two, not three.
		for i := range 3 {
			r := must(tx.CredentialReserve(ctx, "agent-1"))
			if r.OK != (i < 2) || r.Credential.Reserved != int64(min(i+1, 2))*20 || r.Credential.Name != "agent-1" {
				t.Fatalf("reservation %d: %+v", i, r)
			}
		}
		// A credential with no allowance of its own reserves nothing here.
		if r := must(tx.CredentialReserve(ctx, "worker-1")); r.OK || r.Credential.Reserved != 0 || r.Credential.Allowance != nil {
			t.Fatalf("an uncapped credential: %+v", r)
		}
		return nil
	})
}

func testCredentialMove(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.CredentialInsert(ctx, store.Credential{Name: "agent-1", Role: "worker", SHA256: "a1", CreatedMS: 7, Allowance: ptr(60)})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for range 3 {
			must(tx.CredentialReserve(ctx, "agent-1"))
		}
		// One reservation given back whole, another settled in part.
		if !must(tx.CredentialMove(ctx, &store.CredentialMoveParams{Name: "agent-1", FromReserved: 20})) ||
			!must(tx.CredentialMove(ctx, &store.CredentialMoveParams{Name: "agent-1", FromReserved: 20, ToSpent: 5})) {
			t.Error("a settlement refused")
			return nil
		}
		if must(tx.CredentialMove(ctx, &store.CredentialMoveParams{Name: "agent-1", FromReserved: 21, ToSpent: 21})) {
			t.Error("an over-move went through")
			return nil
		}
		// Room again for one: 60 - 5 spent - 20 reserved; then none.
		if r := must(tx.CredentialReserve(ctx, "agent-1")); !r.OK || r.Credential.Spent != 5 || r.Credential.Reserved != 40 {
			t.Errorf("after the settlements: %+v", r)
		}
		if r := must(tx.CredentialReserve(ctx, "agent-1")); r.OK {
			t.Errorf("past the allowance: %+v", r)
		}
		return nil
	})
}

func testJobTenantsQueued(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for i, tenant := range []string{"team-b", "team-a", "team-b"} {
			doc := fmt.Sprint("doc-t", i)
			if err := tx.DocumentInsert(ctx, doc, 1); err != nil {
				return err
			}
			if err := tx.JobInsert(ctx, &store.JobInsertParams{OperationID: fmt.Sprint("op-t", i), Position: int64(10 + i), BatchKey: "b",
				Section: "summary", DocumentID: doc, InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 1, Tenant: tenant}); err != nil {
				return err
			}
		}
		return nil
	})
	f.run() // op-1 of default, running
	f.write(func(ctx context.Context, tx *store.Tx) error {
		_, err := tx.JobClaimMany(ctx, &store.JobClaimManyParams{Tenant: "team-b", Max: 1, ClaimPrefix: "b.", Worker: "w2", ClaimHost: "h",
			LeaseExpiresAtMS: 50, NowMS: 10})
		return err
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.JobTenantsQueued(ctx)); !reflect.DeepEqual(got, []string{"default", "team-a", "team-b"}) {
			t.Fatalf("tenants with queued jobs: %v", got)
		}
		if got := must(tx.JobInFlightByTenant(ctx)); !reflect.DeepEqual(got, map[string]int64{"default": 1, "team-b": 1}) {
			t.Fatalf("in flight by tenant: %v", got)
		}
		if got := must(tx.JobTenantOfDocument(ctx, "doc-t1")); got != "team-a" {
			t.Fatalf("doc-t1's tenant: %q", got)
		}
		if got := must(tx.JobTenantOfDocument(ctx, "doc-1")); got != "default" {
			t.Fatalf("doc-1's tenant: %q", got)
		}
		if _, err := tx.JobTenantOfDocument(ctx, "doc-none"); !store.IsNotFound(err) {
			t.Fatalf("the tenant of a document no job has: %v", err)
		}
		return nil
	})
	// A claim takes only its tenant's jobs.
	f.write(func(ctx context.Context, tx *store.Tx) error {
		got := must(tx.JobClaimMany(ctx, &store.JobClaimManyParams{Tenant: "team-b", Max: 5, ClaimPrefix: "c.", Worker: "w2", ClaimHost: "h",
			LeaseExpiresAtMS: 50, NowMS: 10}))
		if len(got) != 1 || got[0].Tenant != "team-b" {
			t.Errorf("team-b's claim: %+v", got)
		}
		return nil
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.JobTenantsQueued(ctx)); !reflect.DeepEqual(got, []string{"default", "team-a"}) {
			t.Errorf("tenants with queued jobs after team-b's are claimed: %v", got)
		}
		return nil
	})
}

func testTenantReserveAhead(t *testing.T, s *suite) {
	// Reservations taken ahead at a tenant hand out exactly what reserving
	// one at a time would, figures and refusals included, past those taken
	// ahead and after a savepoint rolled back; what was not handed out goes
	// back at commit, leaving the tenant as the reservations made alone
	// would.
	ctx := context.Background()
	type outcome struct {
		OK              bool
		Allowance       *int64
		Spent, Reserved int64
	}
	reserve := func(c store.Conn, n int) (out []outcome) {
		for range n {
			r := must(c.TenantReserve(ctx, "team-a"))
			out = append(out, outcome{r.OK, r.Tenant.Allowance, r.Tenant.Spent, r.Tenant.Reserved})
		}
		return out
	}
	for _, takeAhead := range []int{2, 3, 9} {
		f := s.setup(t)
		f.addTenant("team-a", ptr(100), "", 0) // five reservations of 20
		alone := must(f.db.Driver().BeginWrite(ctx))
		want := reserve(alone, 7)
		if err := alone.Rollback(); err != nil {
			t.Fatal(err)
		}
		c := must(f.db.Driver().BeginWrite(ctx))
		defer c.Rollback() // a failure ends the test with it open
		if err := c.TenantReserveAhead(ctx, "team-a", takeAhead); err != nil {
			t.Fatal(err)
		}
		got := reserve(c, 1)
		rolledBack(t, c, func() { reserve(c, 1) }) // handed out again below
		got = append(got, reserve(c, 6)...)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("taking %d ahead, reservations\n%+v\nwant\n%+v", takeAhead, got, want)
		}
		commitAsHosts(t, c)
		f.read(func(ctx context.Context, tx *store.Tx) error {
			if tn := must(tx.TenantGet(ctx, "team-a")); tn.Reserved != 100 || tn.Spent != 0 {
				t.Fatalf("taking %d ahead, the tenant after the rest went back: %+v", takeAhead, tn)
			}
			return nil
		})
	}
	// Four taken ahead and one handed out: three go back at the commit.
	f := s.setup(t)
	f.addTenant("team-a", ptr(100), "", 0)
	c := must(f.db.Driver().BeginWrite(ctx))
	defer c.Rollback()
	if err := c.TenantReserveAhead(ctx, "team-a", 4); err != nil {
		t.Fatal(err)
	}
	reserve(c, 1)
	commitAsHosts(t, c)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if tn := must(tx.TenantGet(ctx, "team-a")); tn.Reserved != 20 {
			t.Fatalf("after four taken ahead and one handed out: %+v, want 20 reserved", tn)
		}
		return nil
	})
}

func testTenantMoveHeld(t *testing.T, s *suite) {
	// A batch's settlements at the tenant shards it holds (AccountingHold)
	// are what they would be alone: a savepoint rolled back undoes one,
	// one of more than is reserved is refused with nothing changed, a
	// read of the tenant in the transaction sees them, and the commit
	// writes those still held (as a host commits: with its log).
	f := s.setup(t)
	ctx := context.Background()
	j, k := f.run(), f.run() // op-1 and op-2, each holding 20 at its tenant's shard
	holder := must(f.db.Driver().BeginWrite(ctx))
	defer holder.Rollback()
	if err := holder.AccountingHold(ctx, []string{j.OperationID, k.OperationID}); err != nil {
		t.Fatal(err)
	}
	move := func(of store.Job, from, spent int64) bool {
		return must(holder.TenantMove(ctx, &store.TenantMoveParams{Tenant: of.Tenant, Shard: of.TenantShard, FromReserved: from, ToSpent: spent}))
	}
	figures := func(c store.Conn) (spent, reserved int64) {
		tn := must(c.TenantGet(ctx, j.Tenant))
		return tn.Spent, tn.Reserved
	}
	rolledBack(t, holder, func() {
		if !move(j, 20, 20) {
			t.Fatal("settling at a held tenant shard was refused")
		}
	})
	if spent, reserved := figures(holder); spent != 0 || reserved != 40 {
		t.Fatalf("a settlement rolled back to its savepoint stayed: spent %d, reserved %d", spent, reserved)
	}
	if !move(j, 20, 5) {
		t.Fatal("settling part at a held tenant shard was refused")
	}
	if j.TenantShard == k.TenantShard && move(j, 40, 40) || j.TenantShard != k.TenantShard && move(j, 20, 20) {
		t.Fatal("a settlement of more than the shard holds went through")
	}
	if spent, reserved := figures(holder); spent != 5 || reserved != 20 {
		t.Fatalf("in the holder: spent %d, reserved %d; want 5, 20", spent, reserved)
	}
	if !move(k, 20, 20) {
		t.Fatal("settling the second job at its held shard was refused")
	}
	commitAsHosts(t, holder)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if tn := must(tx.TenantGet(ctx, j.Tenant)); tn.Spent != 25 || tn.Reserved != 0 {
			t.Fatalf("after the holder committed: %+v", tn)
		}
		return nil
	})
}

// commitAsHosts commits c as a host's write does: with its (here empty)
// log in the commit's round trip where the backend has several writers
// (store.PendingCommitter), else plainly.
func commitAsHosts(t *testing.T, c store.Conn) {
	t.Helper()
	var err error
	if pc, ok := c.(store.PendingCommitter); ok {
		err = pc.CommitPending(context.Background(), nil, nil, func([]int64, []int64) {})
	} else {
		err = c.Commit()
	}
	if err != nil {
		t.Fatal(err)
	}
}

func testLevelsReserveAhead(t *testing.T, s *suite) {
	// Reservations taken ahead at a tenant and the fleet together hand out,
	// level by level, exactly what reserving one at a time would: as an
	// admission, the tenant then the fleet, figures and the tenant's
	// refusals included, past those taken ahead. What was not handed out
	// goes back at commit at both levels, including the fleet's, taken
	// ahead for jobs the tenant then refused.
	ctx := context.Background()
	type outcome struct {
		TenantOK        bool
		Spent, Reserved int64
		Fleet           wire.Accounting
	}
	admit := func(c store.Conn, n int) (out []outcome) {
		for range n {
			tr := must(c.TenantReserve(ctx, "team-a"))
			o := outcome{TenantOK: tr.OK, Spent: tr.Tenant.Spent, Reserved: tr.Tenant.Reserved}
			if tr.OK {
				fr := must(c.AccountingReserve(ctx))
				if !fr.OK {
					t.Fatalf("the fleet refused a reservation: %+v", fr)
				}
				o.Fleet = fr.Accounting
			}
			out = append(out, o)
		}
		return out
	}
	for _, ahead := range []struct{ atTenant, atFleet int }{{1, 1}, {3, 3}, {2, 7}, {9, 9}} {
		f := s.setup(t)
		f.write(func(ctx context.Context, tx *store.Tx) error {
			_, err := tx.AccountingSetAllowance(ctx, 10_000)
			return err
		})
		f.addTenant("team-a", ptr(100), "", 0) // five reservations of 20
		alone := must(f.db.Driver().BeginWrite(ctx))
		want := admit(alone, 7)
		if err := alone.Rollback(); err != nil {
			t.Fatal(err)
		}
		c := must(f.db.Driver().BeginWrite(ctx))
		defer c.Rollback() // a failure ends the test with it open
		if err := c.LevelsReserveAhead(ctx, "team-a", ahead.atTenant, ahead.atFleet); err != nil {
			t.Fatal(err)
		}
		if got := admit(c, 7); !reflect.DeepEqual(got, want) {
			t.Fatalf("taking %+v ahead, admissions\n%+v\nwant\n%+v", ahead, got, want)
		}
		commitAsHosts(t, c)
		f.read(func(ctx context.Context, tx *store.Tx) error {
			if tn := must(tx.TenantGet(ctx, "team-a")); tn.Reserved != 100 || tn.Spent != 0 {
				t.Fatalf("taking %+v ahead, the tenant after the rest went back: %+v", ahead, tn)
			}
			if a := must(tx.AccountingGet(ctx, store.NoLock)); a.Reserved != 100 || a.Calls != 5 {
				t.Fatalf("taking %+v ahead, the fleet after the rest went back: %+v, want 100 reserved in 5 calls", ahead, a)
			}
			return nil
		})
	}
	// With no allowance set there is nothing to take ahead: no error, and
	// an admission finds out for itself.
	db, err := backend.Create(ctx, s.newLocation(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c := must(db.Driver().BeginWrite(ctx))
	defer c.Rollback()
	if err := c.TenantInsert(ctx, store.Tenant{Name: "team-a", Weight: 1, CreatedAtMS: 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.LevelsReserveAhead(ctx, "team-a", 1, 1); err != nil {
		t.Fatalf("reserving ahead with no allowance set: %v", err)
	}
}
