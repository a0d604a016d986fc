package e2e

import (
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/crash"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

// TestCrashScheduleFiring: a real host, its clock moved just past a
// schedule's slot (a crash-point build's FLEET_CLOCK_AHEAD), is killed as
// the firing's transaction commits, just before or just after, and
// restarted: the slot's report is submitted exactly once, the schedule
// counts one firing and the log one schedule.fired. On SQLite, and on
// PostgreSQL when FLEET_TEST_POSTGRES_URL is set.
func TestCrashScheduleFiring(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		for _, when := range []string{"before-commit", "after-commit"} {
			t.Run(when, func(t *testing.T) {
				t.Parallel()
				crashScheduleFiring(t, "schedule-fire."+when)
			})
		}
	})
}

func crashScheduleFiring(t *testing.T, point string) {
	c := newCrashHost(t, nil)
	c.ensureUp()
	op := credential(t, c.state, "operator")
	// Hourly, at a minute half an hour away: the host serving now cannot
	// reach the slot itself before it stops.
	var s wire.Schedule
	testkit.MustDecode(t, mustStatus(t, c.call("POST", "/admin/schedules", op, map[string]any{"name": "hourly",
		"schedule": fmt.Sprintf("%d * * * *", (time.Now().UTC().Minute()+30)%60),
		"report":   map[string]any{"document": sampleDocument, "sections": []string{"summary", "terms"}}}), 200).Body, &s)
	c.stop()
	// From now on the host's clock reads a second and a half past the
	// slot: its first firing takes it, with the host killed at its commit.
	ahead := time.Until(time.UnixMilli(s.NextAtMS)) + 1500*time.Millisecond
	c.env = []string{fmt.Sprintf("%s=%dms", crash.EnvClockAhead, ahead.Milliseconds())}
	if !c.start(crash.EnvPoint+"="+point, crash.EnvHit+"=1") {
		c.ensureUp()
	}
	key := "schedule:hourly@" + time.UnixMilli(s.NextAtMS).UTC().Format(time.RFC3339)
	superviseUntil(t, c, 30*time.Second, func() bool {
		return c.call("GET", "/admin/reports/"+url.PathEscape(key), op, nil).Status == 200
	})
	// After the commit the report is there before the dying host's last
	// words reach its log, which they do once its standard error closes.
	waitFor(t, 10*time.Second, "the firing's crash at "+point, func() bool {
		c.ensureUp()
		return c.crashed(point)
	})
	// The report is visible from its commit; on PostgreSQL its event is
	// placed in the log just after, by the sequencer. Killed before that,
	// the event would wait in the pending log for the next host to start
	// (CI at c98c4e6 counted 0, as TestScheduleTwoHosts did at 9879faa).
	superviseUntil(t, c, 20*time.Second, func() bool {
		var page wire.EventPage
		testkit.MustDecode(t, mustStatus(t, c.call("GET", "/admin/events?kind="+string(wire.EventScheduleFired), op, nil), 200).Body, &page)
		return len(page.Events) > 0
	})
	var l wire.SchedulesList
	testkit.MustDecode(t, mustStatus(t, c.call("GET", "/admin/schedules", op, nil), 200).Body, &l)
	c.stop()
	if len(l.Schedules) != 1 || l.Schedules[0].Fired != 1 || l.Schedules[0].LastSlotMS != s.NextAtMS {
		t.Fatalf("the schedule after the crash: %+v", l.Schedules)
	}
	db := openDatabase(t, c.state, c.database)
	if n := count(t, db, `SELECT COUNT(*) FROM jobs WHERE batch_key LIKE 'schedule:%'`); n != 2 {
		t.Fatalf("%d jobs submitted by the schedule, want its report's 2", n)
	}
	if n := count(t, db, `SELECT COUNT(*) FROM events WHERE kind = 'schedule.fired'`); n != 1 {
		t.Fatalf("%d schedule.fired events", n)
	}
	var dbArgs []string
	if c.database != "" {
		dbArgs = []string{"--database", c.database}
	}
	if rep := verifyState(t, c.state, dbArgs...); !rep.OK {
		t.Fatalf("verify: %+v", rep)
	}
}

// TestScheduleTwoHosts: two real host processes serving one state (two
// hosts on PostgreSQL; on SQLite, two sharing its file), their clocks
// moved past a schedule's slot, both firing it each second: the slot's
// report is submitted once, the schedule counts one firing and the log
// one schedule.fired.
func TestScheduleTwoHosts(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		var dbArgs []string
		if storetest.OnPostgres(t) {
			dbArgs = []string{"--database", storetest.NewLocation(t)}
		}
		state := initState(t, sampleInput(t, nil), dbArgs...)
		first := startHost(t, state, append(dbArgs, "--host-id", "a")...)
		op := credential(t, state, "operator")
		var s wire.Schedule
		mustStatus(t, call(t, "POST", first.URL+"/admin/schedules", op, map[string]any{"name": "minutely", "schedule": "* * * * *",
			"report": map[string]any{"document": sampleDocument, "sections": []string{"summary"}}}), 200).decode(t, &s)
		first.kill()
		ahead := time.Until(time.UnixMilli(s.NextAtMS)) + 1500*time.Millisecond
		env := []string{fmt.Sprintf("%s=%dms", crash.EnvClockAhead, ahead.Milliseconds())}
		var hosts []*hostProcess
		for _, id := range []string{"a", "b"} {
			hosts = append(hosts, startHostFrom(t, filepath.Join(binDir, "crash", "fleet-host"), env, state, append(dbArgs, "--host-id", id)...))
		}
		key := "schedule:minutely@" + time.UnixMilli(s.NextAtMS).UTC().Format(time.RFC3339)
		waitFor(t, 20*time.Second, "the slot's report", func() bool {
			return call(t, "GET", hosts[1].URL+"/admin/reports/"+url.PathEscape(key), op, nil).Status == 200
		})
		// The report is visible from its commit; on PostgreSQL its event is
		// placed in the log just after, by whichever host's sequencer runs
		// first. Killed before that, the event would wait in the pending log
		// for the next host to start (CI at 9879faa counted 0).
		waitFor(t, 20*time.Second, "the firing's event placed in the log", func() bool {
			var page wire.EventPage
			mustStatus(t, call(t, "GET", hosts[0].URL+"/admin/events?after=0", op, nil), 200).decode(t, &page)
			return slices.ContainsFunc(page.Events, func(e wire.Event) bool { return e.Kind == wire.EventScheduleFired })
		})
		var l wire.SchedulesList
		mustStatus(t, call(t, "GET", hosts[0].URL+"/admin/schedules", op, nil), 200).decode(t, &l)
		for _, h := range hosts {
			h.kill()
		}
		if len(l.Schedules) != 1 || l.Schedules[0].Fired != 1 {
			t.Fatalf("the schedule after two hosts fired it: %+v", l.Schedules)
		}
		db := openDatabase(t, state, dbURL(dbArgs))
		if n := count(t, db, `SELECT COUNT(*) FROM events WHERE kind = 'schedule.fired'`); n != 1 {
			t.Fatalf("%d schedule.fired events", n)
		}
		if n := count(t, db, `SELECT COUNT(*) FROM jobs WHERE batch_key LIKE 'schedule:%'`); n != 1 {
			t.Fatalf("%d jobs submitted by the schedule", n)
		}
	})
}
