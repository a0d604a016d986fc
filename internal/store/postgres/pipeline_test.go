package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// onPostgres runs fn with a fresh database's driver; the pipeline is
// PostgreSQL's alone.
func onPostgres(t *testing.T, fn func(t *testing.T, d store.Driver)) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	t.Run(storetest.Postgres, func(t *testing.T) {
		db, _ := storetest.MustCreate(t)
		fn(t, db.Driver())
	})
}

func begin(t *testing.T, d store.Driver) store.Conn {
	t.Helper()
	c, err := d.BeginWrite(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Rollback() })
	return c
}

// committedSettings reads the settings as another transaction sees them.
func committedSettings(t *testing.T, d store.Driver) map[string]string {
	t.Helper()
	r, err := d.BeginRead(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Rollback()
	settings, err := r.SettingList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return settings
}

// TestPipelineRoundTrips: writes whose results nobody reads wait for the
// next read or the commit, and BEGIN goes with the first; a transaction
// of three writes, a read and a commit is two round trips, and the read
// sees the writes held before it.
func TestPipelineRoundTrips(t *testing.T) {
	onPostgres(t, func(t *testing.T, d store.Driver) {
		ctx := context.Background()
		before := d.RoundTrips()
		c := begin(t, d)
		for _, name := range []string{"a", "b", "c"} {
			if err := c.SettingPut(ctx, "pipeline-"+name, name); err != nil {
				t.Fatal(err)
			}
		}
		if got := d.RoundTrips() - before; got != 0 {
			t.Fatalf("held writes went out on their own: %d round trips", got)
		}
		settings, err := c.SettingList(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if settings["pipeline-a"] != "a" || settings["pipeline-c"] != "c" {
			t.Fatalf("the read did not see the writes held before it: %v", settings)
		}
		if err := c.SettingPut(ctx, "pipeline-d", "d"); err != nil {
			t.Fatal(err)
		}
		if err := c.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := d.RoundTrips() - before; got != 2 {
			t.Fatalf("round trips = %d, want 2 (BEGIN, writes and the read; a write and COMMIT)", got)
		}
		if settings := committedSettings(t, d); settings["pipeline-d"] != "d" {
			t.Fatalf("the write held for the commit was not committed: %v", settings)
		}
	})
}

// TestReadOneRoundTrip: a read of one statement is one round trip, where
// a read transaction is two (BEGIN with the statement; ROLLBACK), sees
// what is committed, leaves its connection outside any transaction, and
// refuses a second statement.
func TestReadOneRoundTrip(t *testing.T) {
	onPostgres(t, func(t *testing.T, d store.Driver) {
		ctx := context.Background()
		w := begin(t, d)
		if err := w.SettingPut(ctx, "read-one", "yes"); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name  string
			begin func(context.Context) (store.Conn, error)
			trips int64
		}{{"a read transaction", d.BeginRead, 2}, {"a read of one statement", d.BeginReadOne, 1}} {
			before := d.RoundTrips()
			r, err := c.begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			v, err := r.SettingGet(ctx, "read-one")
			if err != nil || v != "yes" {
				t.Fatalf("%s read %q, %v", c.name, v, err)
			}
			if err := r.Rollback(); err != nil {
				t.Fatal(err)
			}
			if got := d.RoundTrips() - before; got != c.trips {
				t.Fatalf("%s took %d round trips, want %d", c.name, got, c.trips)
			}
		}
		r, err := d.BeginReadOne(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Rollback()
		if _, err := r.SettingGet(ctx, "read-one"); err != nil {
			t.Fatal(err)
		}
		if _, err := r.SettingGet(ctx, "read-one"); err == nil || !strings.Contains(err.Error(), "second") {
			t.Fatalf("a second statement of a read of one: %v", err)
		}
	})
}

// TestPipelineHeldWriteFails: a held write that fails fails the commit
// it went out with, names itself, keeps the code a rerun is decided on,
// and nothing of the transaction is written. Its connection is rolled
// back and kept, not closed.
func TestPipelineHeldWriteFails(t *testing.T) {
	onPostgres(t, func(t *testing.T, d store.Driver) {
		ctx := context.Background()
		c := begin(t, d)
		opened := postgres.PoolConnsOpened(d)
		if err := c.SettingPut(ctx, "pipeline-first", "x"); err != nil {
			t.Fatal(err)
		}
		// The same credential twice: a unique key.
		for range 2 {
			if err := c.CredentialInsert(ctx, store.Credential{Name: "w", Role: "worker", SHA256: "00", CreatedMS: 1}); err != nil {
				t.Fatalf("a held write reported an error before it was sent: %v", err)
			}
		}
		err := c.Commit()
		if err == nil {
			t.Fatal("commit succeeded with a failed write in it")
		}
		if !strings.Contains(err.Error(), "INSERT INTO credentials") {
			t.Fatalf("the error does not name the failed statement: %v", err)
		}
		if !d.Retryable(err) {
			t.Fatalf("a unique key lost to another writer must stay retryable: %v", err)
		}
		if _, ok := committedSettings(t, d)["pipeline-first"]; ok {
			t.Fatal("a write of the failed transaction was committed")
		}
		if now := postgres.PoolConnsOpened(d); now != opened {
			t.Fatalf("the read after the failed commit opened a connection (%d opened, %d before): the failed one was closed", now, opened)
		}
	})
}

// TestPipelineCommitAfterAbort: a transaction an error aborted cannot
// report success at commit, even when the caller went on past the error
// (PostgreSQL answers COMMIT in an aborted transaction with ROLLBACK and
// no error).
func TestPipelineCommitAfterAbort(t *testing.T) {
	onPostgres(t, func(t *testing.T, d store.Driver) {
		ctx := context.Background()
		c := begin(t, d)
		if err := c.SettingPut(ctx, "pipeline-aborted", "x"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.JobGet(ctx, "no-such-job", store.NoLock); !store.IsNotFound(err) {
			t.Fatalf("read: %v", err)
		}
		// An error the caller ignores: a savepoint that does not exist.
		if err := c.RollbackTo(ctx, "never_made"); err != nil {
			t.Fatalf("held: %v", err)
		}
		if _, err := c.SettingList(ctx); err == nil {
			t.Fatal("the held bad statement did not fail the read it went out with")
		}
		if err := c.Commit(); err == nil {
			t.Fatal("commit reported success for an aborted transaction")
		}
		if _, ok := committedSettings(t, d)["pipeline-aborted"]; ok {
			t.Fatal("a write of the aborted transaction was committed")
		}
	})
}

// TestPipelineLazySavepoints: a savepoint whose statements all wait for
// the commit never goes out (rolling back to it drops them, releasing it
// keeps them), and one a read sent out works as SQL's does: rolling back
// to it undoes what went out and what was held since.
func TestPipelineLazySavepoints(t *testing.T) {
	onPostgres(t, func(t *testing.T, d store.Driver) {
		ctx := context.Background()
		c := begin(t, d)
		put := func(name string) {
			t.Helper()
			if err := c.SettingPut(ctx, "lazy-"+name, name); err != nil {
				t.Fatal(err)
			}
		}
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		statements := c.Statements()
		must(c.Savepoint(ctx, "item0"))
		put("refused")
		must(c.RollbackTo(ctx, "item0"))
		must(c.Release(ctx, "item0"))
		must(c.Savepoint(ctx, "item1"))
		put("kept")
		must(c.Savepoint(ctx, "inner")) // released with item1, never out
		put("inner")
		must(c.Release(ctx, "item1"))
		if got := c.Statements() - statements; got != 2 {
			t.Fatalf("%d statements counted for two held writes and lazy savepoints", got)
		}
		// A read in the savepoint sends it out with what is held.
		must(c.Savepoint(ctx, "item2"))
		put("sent")
		if settings, err := c.SettingList(ctx); err != nil || settings["lazy-sent"] != "sent" || settings["lazy-refused"] != "" {
			t.Fatalf("read in a savepoint: %v, %v", settings, err)
		}
		put("held-after")
		must(c.RollbackTo(ctx, "item2"))
		must(c.Release(ctx, "item2"))
		put("last")
		must(c.Commit())
		settings := committedSettings(t, d)
		for name, want := range map[string]bool{"refused": false, "kept": true, "inner": true, "sent": false, "held-after": false, "last": true} {
			if _, ok := settings["lazy-"+name]; ok != want {
				t.Errorf("lazy-%s committed: %v, want %v (%v)", name, ok, want, settings)
			}
		}
	})
}

// TestPipelineGenericPlans: a statement of statementPlans runs with a
// generic plan from its first execution on a connection, and any other
// statement keeps PostgreSQL's own choice (a fresh connection plans its
// first five executions for their arguments), in the same transaction;
// and a savepoint rolled back, which undoes the switch, does not leave
// the pipeline believing it still holds.
func TestPipelineGenericPlans(t *testing.T) {
	onPostgres(t, func(t *testing.T, d store.Driver) {
		ctx := context.Background()
		c := begin(t, d)
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		plans := func(name string) (generic, custom int64) {
			t.Helper()
			generic, custom, err := postgres.PreparedPlans(ctx, c, name)
			must(err)
			return generic, custom
		}
		hold := func() { t.Helper(); must(c.AccountingHold(ctx, []string{"no-such-job"})) }
		hold()
		if generic, custom := plans("TenantHold"); generic != 1 || custom != 0 {
			t.Errorf("TenantHold, in statementPlans, once: %d generic plans and %d custom; want 1 and 0", generic, custom)
		}
		if _, err := c.JobGet(ctx, "no-such-job", store.NoLock); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("JobGet of no job: %v", err)
		}
		if generic, custom := plans("JobGet"); generic != 0 || custom != 1 {
			t.Errorf("JobGet, not in statementPlans, once after TenantHold: %d generic plans and %d custom; want 0 and 1", generic, custom)
		}
		// Switched to generic inside the savepoint, then rolled back to
		// before the switch: the next generic statement switches again.
		must(c.Savepoint(ctx, "s"))
		hold()
		must(c.RollbackTo(ctx, "s"))
		must(c.Release(ctx, "s"))
		hold()
		if generic, custom := plans("TenantHold"); generic != 3 || custom != 0 {
			t.Errorf("TenantHold three times, across a savepoint rolled back: %d generic plans and %d custom; want 3 and 0", generic, custom)
		}
	})
}

// TestSingleClaimGenericPlans: a single claim's admission runs with the
// generic plans its pick switched to, with no switch of its own: the
// tenant's reservation is planned generically at its first execution on
// a connection (left to choose, four hosts had PostgreSQL plan it afresh
// at most calls), and no switch goes out besides the two around the pick.
func TestSingleClaimGenericPlans(t *testing.T) {
	onPostgres(t, func(t *testing.T, d store.Driver) {
		ctx := context.Background()
		setup := begin(t, d)
		if err := setup.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 100, CostPerReport: 20}); err != nil {
			t.Fatal(err)
		}
		if err := setup.TenantInsert(ctx, store.Tenant{Name: wire.DefaultTenant, Weight: 1, CreatedAtMS: 1}); err != nil {
			t.Fatal(err)
		}
		if err := setup.Commit(); err != nil {
			t.Fatal(err)
		}
		c := begin(t, d)
		statements := c.Statements()
		if _, err := c.JobPickMany(ctx, &store.JobClaimManyParams{Max: 1, ClaimPrefix: "c", Worker: "w", NowMS: 1}, nil); err != nil {
			t.Fatal(err)
		}
		if r, err := c.TenantReserve(ctx, wire.DefaultTenant); err != nil || !r.OK {
			t.Fatalf("reserving at the tenant after a single pick: %+v %v", r, err)
		}
		if got := c.Statements() - statements; got != 5 {
			t.Errorf("a single pick and a reservation sent %d statements, want 5 (the pick, the two switches around it, the reservation and its savepoint)", got)
		}
		generic, custom, err := postgres.PreparedPlans(ctx, c, "TenantReserveFree")
		if err != nil {
			t.Fatal(err)
		}
		if generic != 1 || custom != 0 {
			t.Errorf("TenantReserveFree after a single pick: %d generic plans and %d custom; want 1 and 0", generic, custom)
		}
	})
}

// TestRoundOneSwitch: a sequencer's round switches to generic plans once,
// before its list of the pending log, and its placing runs with them at
// no switch more (it switched before and after each, four in a round).
func TestRoundOneSwitch(t *testing.T) {
	onPostgres(t, func(t *testing.T, d store.Driver) {
		ctx := context.Background()
		c := begin(t, d)
		statements := c.Statements()
		if _, err := c.PendingLogList(ctx, 10); err != nil {
			t.Fatal(err)
		}
		if err := c.PendingLogPlace(ctx, &store.PendingLogPlaceParams{}); err != nil {
			t.Fatal(err)
		}
		if got := c.Statements() - statements; got != 3 {
			t.Errorf("a round's list and place sent %d statements, want 3 (one switch)", got)
		}
		for _, name := range []string{"PendingLogList", "PendingLogPlace"} {
			generic, custom, err := postgres.PreparedPlans(ctx, c, name)
			if err != nil {
				t.Fatal(err)
			}
			if generic != 1 || custom != 0 {
				t.Errorf("%s in a round: %d generic plans and %d custom; want 1 and 0", name, generic, custom)
			}
		}
		if err := c.Commit(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestPeriodicReadsGenericPlans: what each host reads on its own every
// second or so (the sampler's counts, the lease sweeper's and the
// schedules' looks) runs with a generic plan from its first execution on
// a connection; left to choose, PostgreSQL planned each afresh at most
// calls.
func TestPeriodicReadsGenericPlans(t *testing.T) {
	onPostgres(t, func(t *testing.T, d store.Driver) {
		ctx := context.Background()
		c, err := d.BeginRead(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Rollback()
		if _, err := c.JobCountByState(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := c.JobListExpired(ctx, &store.JobListExpiredParams{NowMS: 1, Lock: store.NoLock}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ScheduleAnyDue(ctx, 1); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"JobCountByState", "JobListExpired", "ScheduleAnyDue"} {
			generic, custom, err := postgres.PreparedPlans(ctx, c, name)
			if err != nil {
				t.Fatal(err)
			}
			if generic != 1 || custom != 0 {
				t.Errorf("%s once: %d generic plans and %d custom; want 1 and 0", name, generic, custom)
			}
		}
	})
}

// TestReadOneGenericPlan: a read of one statement that wants a generic
// plan (PendingLogLeft, a host's look at what another host's sequencer
// placed) gets it at its first execution: its switch goes out with it in
// one round trip, and holds for it alone. JobGet, read alone after it on
// the same connection, is planned for its arguments, as the session
// plans.
func TestReadOneGenericPlan(t *testing.T) {
	onPostgres(t, func(t *testing.T, d store.Driver) {
		ctx := context.Background()
		readOne := func(fn func(c store.Conn) error) {
			t.Helper()
			c, err := d.BeginReadOne(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Rollback()
			if err := fn(c); err != nil {
				t.Fatal(err)
			}
		}
		trips := d.RoundTrips()
		readOne(func(c store.Conn) error {
			_, err := c.PendingLogLeft(ctx, store.PendingIDs{Events: []int64{1<<20 | 1}, Receipts: []int64{1<<20 | 1}}, []string{"rcpt-1"})
			return err
		})
		if n := d.RoundTrips() - trips; n != 1 {
			t.Errorf("a look at the pending log took %d round trips, want 1", n)
		}
		readOne(func(c store.Conn) error {
			if _, err := c.JobGet(ctx, "no-such-job", store.NoLock); !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("JobGet of no job: %w", err)
			}
			return nil
		})
		// The pool's one idle connection, which ran both.
		r, err := d.BeginRead(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Rollback()
		for name, want := range map[string][2]int64{"PendingLogLeft": {1, 0}, "JobGet": {0, 1}} {
			generic, custom, err := postgres.PreparedPlans(ctx, r, name)
			if err != nil {
				t.Fatal(err)
			}
			if generic != want[0] || custom != want[1] {
				t.Errorf("%s read alone once: %d generic plans and %d custom; want %d and %d", name, generic, custom, want[0], want[1])
			}
		}
	})
}
