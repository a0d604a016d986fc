package tenants_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/tenants"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// clock is the injectable clock the tests move.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

// fixture is a state with a fleet allowance of 1,000 at 20 a report and
// the tenant default.
type fixture struct {
	db       *store.DB
	location string
	ledger   *ledger.Ledger
	tenants  *tenants.Tenants
	clock    *clock
}

func newTenants(t *testing.T, max int) (*store.DB, *ledger.Ledger, *tenants.Tenants, *clock) {
	f := newFixture(t, max)
	return f.db, f.ledger, f.tenants, f.clock
}

func newFixture(t *testing.T, max int) *fixture {
	t.Helper()
	db, location := storetest.MustCreate(t)
	c := &clock{now: time.Date(2026, 12, 5, 13, 0, 0, 0, time.UTC)}
	db.Now = c.Now
	kernel, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	db.SetSealer(kernel)
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 1000, CostPerReport: 20}); err != nil {
			return err
		}
		return tx.TenantInsert(ctx, store.Tenant{Name: wire.DefaultTenant, Weight: 1, CreatedAtMS: 1})
	})
	l := ledger.New(db, kernel)
	return &fixture{db: db, location: location, ledger: l, tenants: tenants.New(l, max), clock: c}
}

// secondHost is a second host's ledger on the fixture's state: its own
// connections, the same kernel.
func (f *fixture) secondHost(t *testing.T) *ledger.Ledger {
	other := storetest.MustOpen(t, f.location)
	other.SetSealer(f.ledger.Kernel())
	return ledger.New(other, f.ledger.Kernel())
}

func str(s string) *string { return &s }
func num(n int64) *int64   { return &n }

// TestCreateAndAllowance, on both backends: a tenant is created with its
// terms, its period starting with the current one; its allowance changes
// by compare-and-swap; every change is receipted and logged; bad input
// and conflicts change nothing.
func TestCreateAndAllowance(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		db, _, ts, _ := newTenants(t, 3)
		got, err := ts.Create(ctx, wire.TenantRequest{Name: str("team-a"), Allowance: num(100), Period: str("week"), Weight: num(3)})
		if err != nil || *got.Allowance != 100 || got.Period != "week" || got.Weight != 3 || got.Available != 100 ||
			got.PeriodStartMS != time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC).UnixMilli() {
			t.Fatalf("create: %+v (%v)", got, err)
		}
		for _, bad := range []struct {
			req  wire.TenantRequest
			code wire.Code
			says string
		}{
			{wire.TenantRequest{}, wire.CodeInvalid, "name"},
			{wire.TenantRequest{Name: str("Team A")}, wire.CodeInvalid, "tenant's name"},
			{wire.TenantRequest{Name: str("team-b"), Allowance: num(-1)}, wire.CodeInvalid, "allowance"},
			{wire.TenantRequest{Name: str("team-b"), Allowance: num(1 << 40)}, wire.CodeInvalid, "allowance"},
			{wire.TenantRequest{Name: str("team-b"), Period: str("hour")}, wire.CodeInvalid, "period"},
			{wire.TenantRequest{Name: str("team-b"), Weight: num(0)}, wire.CodeInvalid, "weight"},
			{wire.TenantRequest{Name: str("team-a")}, wire.CodeStateConflict, "exists"},
		} {
			if _, err := ts.Create(ctx, bad.req); fleet.ErrorCode(err) != bad.code || !strings.Contains(err.Error(), bad.says) {
				t.Errorf("create %+v: %v, want %s naming %s", bad.req, err, bad.code, bad.says)
			}
		}
		if _, err := ts.Create(ctx, wire.TenantRequest{Name: str("team-b")}); err != nil {
			t.Fatal(err)
		}
		if _, err := ts.Create(ctx, wire.TenantRequest{Name: str("team-c")}); fleet.ErrorCode(err) != wire.CodeStateConflict {
			t.Fatalf("a fourth tenant past a cap of 3: %v", err)
		}
		// Compare-and-swap: the expected allowance must be the one held
		// (none for a tenant without).
		if _, err := ts.SetAllowance(ctx, "team-a", wire.TenantAllowanceRequest{ExpectedAllowance: num(99), Allowance: num(50)}); fleet.ErrorCode(err) != wire.CodeAllowanceConflict {
			t.Fatalf("a stale expected allowance: %v", err)
		}
		if _, err := ts.SetAllowance(ctx, "team-b", wire.TenantAllowanceRequest{ExpectedAllowance: num(0), Allowance: num(50)}); fleet.ErrorCode(err) != wire.CodeAllowanceConflict {
			t.Fatalf("expecting an allowance of a tenant with none: %v", err)
		}
		if _, err := ts.SetAllowance(ctx, "nobody", wire.TenantAllowanceRequest{Allowance: num(50)}); fleet.ErrorCode(err) != wire.CodeNotFound {
			t.Fatalf("an unknown tenant: %v", err)
		}
		if got, err := ts.SetAllowance(ctx, "team-a", wire.TenantAllowanceRequest{ExpectedAllowance: num(100), Allowance: num(40)}); err != nil || *got.Allowance != 40 {
			t.Fatalf("set: %+v (%v)", got, err)
		}
		if got, err := ts.SetAllowance(ctx, "team-b", wire.TenantAllowanceRequest{Allowance: num(60)}); err != nil || *got.Allowance != 60 {
			t.Fatalf("cap a tenant with none: %+v (%v)", got, err)
		}
		list, err := tenants.List(ctx, db)
		if err != nil || len(list.Tenants) != 3 || *list.Tenants[1].Allowance != 40 || list.Tenants[0].Name != wire.DefaultTenant ||
			list.Tenants[0].Allowance != nil || list.Tenants[0].Available != 1000 {
			t.Fatalf("list: %+v (%v)", list, err)
		}
		// Three changes receipted, each with its event.
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			var kinds []string
			for _, raw := range must(tx.ReceiptList(ctx, "tenant:team-a")) {
				r, err := receipts.Decode(raw)
				if err != nil {
					return err
				}
				kinds = append(kinds, string(r.Kind)+"/"+string(r.Decision)+"/"+r.Tenant)
			}
			if strings.Join(kinds, " ") != "tenant/added/team-a tenant/allowance_set/team-a" {
				t.Fatalf("team-a's receipts: %v", kinds)
			}
			return nil
		})
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestPeriodRollover, on both backends: a tenant's spent starts again at
// 0 when the injectable clock passes into its next period, by the first
// reservation that finds it due, receipted once even with two hosts
// racing it; the reservations open across it carry over, so nothing is
// spent twice or lost.
func TestPeriodRollover(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFixture(t, 10)
		db, l, ts, c := f.db, f.ledger, f.tenants, f.clock
		if _, err := ts.Create(ctx, wire.TenantRequest{Name: str("team-a"), Allowance: num(60), Period: str("day")}); err != nil {
			t.Fatal(err)
		}
		reserve := func(db *store.DB, l *ledger.Ledger) (r store.TenantReservation) {
			t.Helper()
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) (err error) {
				r, err = tenants.Reserve(ctx, l, tx, "worker-1", "team-a")
				return err
			})
			return r
		}
		// Three reservations fill the day; one settles 20 as spent.
		for i := range 4 {
			if r := reserve(db, l); r.OK != (i < 3) {
				t.Fatalf("reservation %d: %+v", i, r)
			}
		}
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			_, err := tx.TenantMove(ctx, &store.TenantMoveParams{Tenant: "team-a", Shard: -1, FromReserved: 20, ToSpent: 20})
			return err
		})
		// The next day: spent starts at 0, the 40 reserved carry over, so
		// one more fits, not three.
		c.Set(time.Date(2026, 12, 6, 0, 0, 1, 0, time.UTC))
		other := storetest.MustOpen(t, f.location)
		other.Now = c.Now
		otherLedger := ledger.New(other, l.Kernel())
		other.SetSealer(l.Kernel())
		var wg sync.WaitGroup
		results := make([]store.TenantReservation, 2)
		for i, h := range []struct {
			db *store.DB
			l  *ledger.Ledger
		}{{db, l}, {other, otherLedger}} {
			wg.Add(1)
			go func() { defer wg.Done(); results[i] = reserve(h.db, h.l) }()
		}
		wg.Wait()
		if results[0].OK == results[1].OK {
			t.Fatalf("two reservations racing into the new day: %+v, want exactly one of them", results)
		}
		var rollovers []wire.Receipt
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			for _, raw := range must(tx.ReceiptList(ctx, "tenant:team-a")) {
				r := must(receipts.Decode(raw))
				if r.Kind == wire.KindRollover {
					rollovers = append(rollovers, r)
				}
			}
			got := must(tx.TenantGet(ctx, "team-a"))
			if got.Spent != 0 || got.Reserved != 60 || got.PeriodStartMS != time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC).UnixMilli() {
				t.Fatalf("after the rollover: %+v", got)
			}
			return nil
		})
		if len(rollovers) != 1 || rollovers[0].Cost != 20 || rollovers[0].Tenant != "team-a" {
			t.Fatalf("rollover receipts: %+v, want one for the 20 spent", rollovers)
		}
	})
}

// race runs n calls of f at once (released together, for a race to be
// run) and answers their errors.
func race(n int, f func(i int) error) []error {
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = f(i)
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

// TestTenantCapUnderRacingAdds, on both backends: adds of different
// tenants racing from two hosts never take the fleet past its most
// tenants; each is added or refused state_conflict. Four rounds of 32,
// the most two more each round, since one round may not run the race.
func TestTenantCapUnderRacingAdds(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFixture(t, 1)
		second := f.secondHost(t)
		for round := range 4 {
			max := 3 + 2*round // the tenants so far and two more
			hosts := []*tenants.Tenants{tenants.New(f.ledger, max), tenants.New(second, max)}
			errs := race(32, func(i int) error {
				_, err := hosts[i%2].Create(ctx, wire.TenantRequest{Name: str(fmt.Sprintf("team-%d-%d", round, i))})
				return err
			})
			added := 0
			for i, err := range errs {
				switch {
				case err == nil:
					added++
				case fleet.ErrorCode(err) != wire.CodeStateConflict:
					t.Errorf("round %d, add %d: %v, want added or state_conflict", round, i, err)
				}
			}
			list, err := tenants.List(ctx, f.db)
			if err != nil || len(list.Tenants) != max || added != 2 {
				t.Fatalf("round %d: %d tenants after %d of 32 racing adds were answered added (%v), want %d and 2", round, len(list.Tenants), added, err, max)
			}
		}
	})
}

// TestAllowanceCASUnderRacingChanges, on both backends: changes of a
// tenant's allowance racing from two hosts, each expecting the allowance
// they all read, are a compare-and-swap: exactly one of them is made, the
// rest are allowance_conflict. Four rounds, since one may not run the
// race.
func TestAllowanceCASUnderRacingChanges(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFixture(t, 10)
		hosts := []*tenants.Tenants{f.tenants, tenants.New(f.secondHost(t), 10)}
		if _, err := f.tenants.Create(ctx, wire.TenantRequest{Name: str("team-a"), Allowance: num(100)}); err != nil {
			t.Fatal(err)
		}
		expected := int64(100)
		for round := range 4 {
			errs := race(8, func(i int) error {
				_, err := hosts[i%2].SetAllowance(ctx, "team-a", wire.TenantAllowanceRequest{ExpectedAllowance: num(expected), Allowance: num(expected + 1 + int64(i))})
				return err
			})
			made := 0
			for i, err := range errs {
				switch {
				case err == nil:
					made++
				case fleet.ErrorCode(err) != wire.CodeAllowanceConflict:
					t.Errorf("round %d, change %d: %v, want made or allowance_conflict", round, i, err)
				}
			}
			list, err := tenants.List(ctx, f.db)
			if err != nil || made != 1 {
				t.Fatalf("round %d: %d of 8 changes expecting %d were made (%v), want 1", round, made, expected, err)
			}
			expected = *list.Tenants[1].Allowance
		}
	})
}

// TestSetWeight, on both backends: a tenant's weight changes, receipted
// and logged; setting the weight it has writes nothing; bad input and an
// unknown tenant change nothing.
func TestSetWeight(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		db, _, ts, _ := newTenants(t, 3)
		if _, err := ts.Create(ctx, wire.TenantRequest{Name: str("team-a"), Allowance: num(100)}); err != nil {
			t.Fatal(err)
		}
		for _, bad := range []struct {
			name string
			req  wire.TenantWeightRequest
			code wire.Code
			says string
		}{
			{"team-a", wire.TenantWeightRequest{}, wire.CodeInvalid, "weight is required"},
			{"team-a", wire.TenantWeightRequest{Weight: num(0)}, wire.CodeInvalid, "weight must be 1 to 1000"},
			{"team-a", wire.TenantWeightRequest{Weight: num(1001)}, wire.CodeInvalid, "weight must be 1 to 1000"},
			{"nobody", wire.TenantWeightRequest{Weight: num(2)}, wire.CodeNotFound, "tenant nobody not found"},
		} {
			if _, err := ts.SetWeight(ctx, bad.name, bad.req); fleet.ErrorCode(err) != bad.code || !strings.Contains(err.Error(), bad.says) {
				t.Errorf("weight %s %+v: %v, want %s saying %q", bad.name, bad.req, err, bad.code, bad.says)
			}
		}
		got, err := ts.SetWeight(ctx, "team-a", wire.TenantWeightRequest{Weight: num(5)})
		if err != nil || got.Weight != 5 || *got.Allowance != 100 || got.Available != 100 || got.Jobs != nil {
			t.Fatalf("set: %+v (%v)", got, err)
		}
		if again, err := ts.SetWeight(ctx, "team-a", wire.TenantWeightRequest{Weight: num(5)}); err != nil || again.Weight != 5 {
			t.Fatalf("the same weight again: %+v (%v)", again, err)
		}
		list, err := tenants.List(ctx, db)
		if err != nil || list.Tenants[1].Weight != 5 || list.Tenants[0].Weight != 1 {
			t.Fatalf("list: %+v (%v)", list, err)
		}
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			var decisions []string
			for _, raw := range must(tx.ReceiptList(ctx, "tenant:team-a")) {
				r, err := receipts.Decode(raw)
				if err != nil {
					return err
				}
				decisions = append(decisions, string(r.Kind)+"/"+string(r.Decision))
			}
			if strings.Join(decisions, " ") != "tenant/added tenant/weight_set" {
				t.Fatalf("team-a's receipts: %v", decisions)
			}
			if titles := weightTitles(t, tx); strings.Join(titles, "; ") != "The operator set tenant team-a's weight from 1 to 5" {
				t.Fatalf("the weight's events: %q", titles)
			}
			return nil
		})
	})
}

// weightTitles is the titles of the weight changes logged, in order.
func weightTitles(t *testing.T, tx *store.Tx) []string {
	t.Helper()
	var titles []string
	for _, e := range must(tx.EventList(context.Background(), 0, 1000)) {
		if e.Kind == wire.EventTenantWeight {
			titles = append(titles, e.Title)
		}
	}
	return titles
}

// TestWeightChangesRacing, on both backends: changes of one tenant's
// weight racing from two hosts are each logged as the change from the
// weight the one before set, so the log reads as one chain of changes.
func TestWeightChangesRacing(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFixture(t, 10)
		hosts := []*tenants.Tenants{f.tenants, tenants.New(f.secondHost(t), 10)}
		if _, err := f.tenants.Create(ctx, wire.TenantRequest{Name: str("team-a")}); err != nil {
			t.Fatal(err)
		}
		const changes = 16
		for i, err := range race(changes, func(i int) error {
			_, err := hosts[i%2].SetWeight(ctx, "team-a", wire.TenantWeightRequest{Weight: num(int64(2 + i))})
			return err
		}) {
			if err != nil {
				t.Fatalf("change %d: %v", i, err)
			}
		}
		storetest.Read(t, f.db, func(ctx context.Context, tx *store.Tx) error {
			titles := weightTitles(t, tx)
			if len(titles) != changes {
				t.Fatalf("%d weight changes logged, want %d: %q", len(titles), changes, titles)
			}
			last := int64(1)
			for _, title := range titles {
				var from, to int64
				if _, err := fmt.Sscanf(title, "The operator set tenant team-a's weight from %d to %d", &from, &to); err != nil || from != last {
					t.Fatalf("%q follows a change to %d (%v): %q", title, last, err, titles)
				}
				last = to
			}
			if now := must(tx.TenantGet(ctx, "team-a")); now.Weight != last {
				t.Fatalf("weight %d, the last change logged set %d", now.Weight, last)
			}
			return nil
		})
	})
}
