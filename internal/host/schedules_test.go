package host_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestSchedules, on both backends and on the injectable clock: a schedule
// submits its report once a slot, under the slot's key; two hosts firing
// the same slot at once submit it once; a host opened afresh on the state
// goes on from the next slot; slots missed while no host fired are
// submitted once, saying how many; a paused schedule submits nothing and
// resumes from its next slot; a removed one is gone. Bad schedules are
// refused, naming the problem, with nothing added.
func TestSchedules(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 1_000_000, 1, 2)
		clock := storetest.NewClock(time.Date(2026, 12, 7, 10, 30, 0, 0, time.UTC))
		at := func(hh, mm int) { clock.Advance(time.Date(2026, 12, 7, hh, mm, 1, 0, time.UTC).Sub(clock.Now())) }
		a, b := f.openAs(t, "a", clock), f.openAs(t, "b", clock)
		doc, name, hourly := document, "hourly", "0 * * * *"
		report := &wire.ReportsRequest{Document: &doc, Sections: []string{"summary", "terms"}}

		badTenant, key := "nobody", "k"
		for _, bad := range []struct {
			req  wire.ScheduleRequest
			code wire.Code
			says string
		}{
			{wire.ScheduleRequest{Name: &name, Schedule: ptrTo("every monday"), Report: report}, wire.CodeInvalid, "not a cron expression"},
			{wire.ScheduleRequest{Name: &name, Schedule: ptrTo("@every 30s"), Report: report}, wire.CodeInvalid, "one firing a minute"},
			{wire.ScheduleRequest{Name: ptrTo("Hourly!"), Schedule: &hourly, Report: report}, wire.CodeInvalid, "name"},
			{wire.ScheduleRequest{Name: &name, Schedule: &hourly}, wire.CodeInvalid, "report"},
			{wire.ScheduleRequest{Name: &name, Schedule: &hourly, Report: &wire.ReportsRequest{Document: &doc, Sections: []string{"risks"}}}, wire.CodeInvalid, "risks"},
			{wire.ScheduleRequest{Name: &name, Schedule: &hourly, Report: &wire.ReportsRequest{Document: &doc, Sections: []string{"summary"}, IdempotencyKey: &key}}, wire.CodeInvalid, "idempotency_key"},
			{wire.ScheduleRequest{Name: &name, Schedule: &hourly, Report: &wire.ReportsRequest{Document: &doc, Sections: []string{"summary"}, Tenant: &badTenant}}, wire.CodeNotFound, "nobody"},
		} {
			_, err := a.Schedules().Create(ctx, bad.req)
			if fleet.ErrorCode(err) != bad.code || !strings.Contains(fleet.ErrorMessage(err), bad.says) {
				t.Errorf("%+v: %v; want %s naming %q", bad.req, err, bad.code, bad.says)
			}
		}
		if l, err := a.Schedules().List(ctx); err != nil || len(l.Schedules) != 0 {
			t.Fatalf("schedules after the refusals: %+v, %v", l, err)
		}

		s, err := a.Schedules().Create(ctx, wire.ScheduleRequest{Name: &name, Schedule: &hourly, Report: report})
		if err != nil || s.NextAtMS != time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC).UnixMilli() {
			t.Fatalf("the schedule as added: %+v, %v", s, err)
		}
		if _, err := b.Schedules().Create(ctx, wire.ScheduleRequest{Name: &name, Schedule: &hourly, Report: report}); fleet.ErrorCode(err) != wire.CodeStateConflict {
			t.Fatalf("the name again: %v", err)
		}
		fire := func(h *host.Host, want int) {
			t.Helper()
			if n, err := h.Schedules().Fire(ctx); err != nil || n != want {
				t.Fatalf("at %s: fired %d (%v), want %d", clock.Now().UTC(), n, err, want)
			}
		}
		fire(a, 0)
		at(11, 0)
		fire(a, 1)
		fire(b, 0)
		submitted(t, a, "schedule:hourly@2026-12-07T11:00:00Z", 2)

		// Both hosts at the 12:00 slot at once: one report.
		at(12, 0)
		var wg sync.WaitGroup
		fired := make([]int, 2)
		for i, h := range []*host.Host{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, err := h.Schedules().Fire(ctx)
				if err != nil {
					t.Error(err)
				}
				fired[i] = n
			}()
		}
		wg.Wait()
		if fired[0]+fired[1] != 1 {
			t.Fatalf("two hosts at one slot fired %v", fired)
		}
		submitted(t, a, "schedule:hourly@2026-12-07T12:00:00Z", 2)

		// A host opened afresh goes on at the next slot.
		c := f.openAs(t, "c", clock)
		at(13, 0)
		fire(c, 1)
		fire(a, 0)

		// No host fired from 14:00 to 17:00: one report, for 18:00.
		at(18, 30)
		fire(a, 1)
		submitted(t, a, "schedule:hourly@2026-12-07T18:00:00Z", 2)
		events, err := a.Views().FindEvents(ctx, wire.EventQuery{Kind: wire.EventScheduleFired, Before: 1 << 62, Limit: 1})
		if err != nil || len(events) != 1 || !strings.Contains(events[0].Title, "4 earlier slots passed") {
			t.Fatalf("the catch-up's event: %+v, %v", events, err)
		}

		if s, err := a.Schedules().SetPaused(ctx, name, true); err != nil || !s.Paused {
			t.Fatalf("pause: %+v, %v", s, err)
		}
		at(20, 30)
		fire(a, 0)
		if s, err := b.Schedules().SetPaused(ctx, name, false); err != nil || s.Paused ||
			s.NextAtMS != time.Date(2026, 12, 7, 21, 0, 0, 0, time.UTC).UnixMilli() {
			t.Fatalf("resume: %+v, %v", s, err)
		}
		at(21, 0)
		fire(b, 1)
		l, err := a.Schedules().List(ctx)
		if err != nil || len(l.Schedules) != 1 || l.Schedules[0].Fired != 5 {
			t.Fatalf("the schedule after its firings: %+v, %v", l, err)
		}
		if _, err := a.Schedules().Remove(ctx, name); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Schedules().Remove(ctx, name); fleet.ErrorCode(err) != wire.CodeNotFound {
			t.Fatalf("removing it again: %v", err)
		}
		at(23, 0)
		fire(a, 0)

		// A stored report that can no longer be submitted (its tenant is
		// not there: written past Create, which would refuse it) moves the
		// schedule on all the same, its event saying why.
		if err := a.DB().WithTx(ctx, func(tx *store.Tx) error {
			return tx.ScheduleInsert(ctx, store.Schedule{Name: "orphan", Spec: hourly, Request: `{"document":"d.","sections":["summary"],"tenant":"gone"}`,
				NextAtMS: time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC).UnixMilli(), CreatedAtMS: 1})
		}); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Hour)
		fire(a, 1)
		events, err = a.Views().FindEvents(ctx, wire.EventQuery{Kind: wire.EventScheduleFired, Before: 1 << 62, Limit: 1})
		if err != nil || len(events) != 1 || !strings.Contains(events[0].Title, "could not submit") || !strings.Contains(events[0].Title, "tenant gone") ||
			!strings.Contains(string(events[0].Data), `"operation_ids":[]`) {
			t.Fatalf("the refused firing's event: %+v, %v", events, err)
		}
		fire(a, 0)
		f.verify(t)
	})
}

// TestSchedulePausesRacing, on both backends: pauses of one schedule
// racing from two hosts pause it once, one schedule.changed event, as a
// pause of a paused schedule changes nothing; the same for resumptions.
// Four rounds, since one may not run the race.
func TestSchedulePausesRacing(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 1_000_000, 1, 2)
		clock := storetest.NewClock(time.Date(2026, 12, 7, 10, 30, 0, 0, time.UTC))
		hosts := []*host.Host{f.openAs(t, "a", clock), f.openAs(t, "b", clock)}
		doc, name, hourly := document, "hourly", "0 * * * *"
		if _, err := hosts[0].Schedules().Create(ctx, wire.ScheduleRequest{Name: &name, Schedule: &hourly,
			Report: &wire.ReportsRequest{Document: &doc, Sections: []string{"summary"}}}); err != nil {
			t.Fatal(err)
		}
		changes := func() int {
			t.Helper()
			events, err := hosts[0].Views().FindEvents(ctx, wire.EventQuery{Kind: wire.EventScheduleChanged, Before: 1 << 62, Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			return len(events)
		}
		for round := range 4 {
			paused := round%2 == 0
			before := changes()
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					if s, err := hosts[i%2].Schedules().SetPaused(ctx, name, paused); err != nil || s.Paused != paused {
						t.Errorf("round %d: %+v, %v", round, s, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if n := changes() - before; n != 1 {
				t.Fatalf("round %d: 8 racing calls to set paused %v logged %d changes, want 1", round, paused, n)
			}
		}
	})
}

// submitted checks that the report of key has n jobs.
func submitted(t *testing.T, h *host.Host, key string, n int) {
	t.Helper()
	r, err := h.Views().Report(context.Background(), key)
	if err != nil || len(r.Sections) != n {
		t.Fatalf("report %s: %+v, %v", key, r, err)
	}
}

func ptrTo[T any](v T) *T { return &v }
