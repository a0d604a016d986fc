package budget

import (
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/wire"
)

func TestPeriodStart(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		period, now, want string
	}{
		{wire.PeriodDay, "2026-12-05T13:45:00Z", "2026-12-05T00:00:00Z"},
		{wire.PeriodDay, "2026-12-05T23:30:00-05:00", "2026-12-06T00:00:00Z"}, // UTC, not the caller's zone
		{wire.PeriodWeek, "2026-12-05T13:45:00Z", "2026-11-30T00:00:00Z"},     // a Saturday: the Monday before
		{wire.PeriodWeek, "2026-11-30T00:00:00Z", "2026-11-30T00:00:00Z"},     // Monday's midnight starts it
		{wire.PeriodWeek, "2026-12-06T23:59:59Z", "2026-11-30T00:00:00Z"},     // Sunday still ends it
		{wire.PeriodMonth, "2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z"},
		{wire.PeriodMonth, "2027-01-01T00:00:00Z", "2027-01-01T00:00:00Z"},
	}
	for _, c := range cases {
		if got := PeriodStart(c.period, at(c.now)); !got.Equal(at(c.want)) {
			t.Errorf("PeriodStart(%s, %s) = %s, want %s", c.period, c.now, got, c.want)
		}
	}
	if got := PeriodStart(wire.PeriodNone, at(cases[0].now)); !got.IsZero() {
		t.Errorf("no period starts at %s, want the zero time", got)
	}
}

func TestPeriodDue(t *testing.T) {
	monday := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	held := monday.UnixMilli()
	if _, due := PeriodDue(wire.PeriodWeek, held, monday.Add(6*24*time.Hour)); due {
		t.Error("a week is due again within itself")
	}
	start, due := PeriodDue(wire.PeriodWeek, held, monday.AddDate(0, 0, 7).Add(time.Millisecond))
	if !due || start != monday.AddDate(0, 0, 7).UnixMilli() {
		t.Errorf("the next week: due %v from %d, want true from %d", due, start, monday.AddDate(0, 0, 7).UnixMilli())
	}
	// Weeks skipped (no admission for a while) start the current one, once.
	start, due = PeriodDue(wire.PeriodDay, held, monday.AddDate(0, 0, 10).Add(time.Hour))
	if !due || start != monday.AddDate(0, 0, 10).UnixMilli() {
		t.Errorf("ten days on: due %v from %d", due, start)
	}
	if _, due := PeriodDue(wire.PeriodNone, 0, monday); due {
		t.Error("no period is due")
	}
}

func TestValidatePeriod(t *testing.T) {
	for _, p := range []string{"", "day", "week", "month"} {
		if err := ValidatePeriod(p); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
	for _, p := range []string{"hour", "Day", "year", " week"} {
		if err := ValidatePeriod(p); fleet.ErrorCode(err) != wire.CodeInvalid {
			t.Errorf("%q: %v, want invalid", p, err)
		}
	}
}

// TestAvailable: a level's room is its own allowance's, bounded by the
// fleet's available, never negative; with no allowance, the fleet's.
func TestAvailable(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	for _, c := range []struct {
		allowance                    *int64
		spent, reserved, fleet, want int64
	}{
		{nil, 80, 0, 120, 120},
		{n(40), 40, 0, 120, 0},
		{n(100), 20, 20, 120, 60},
		{n(100), 0, 0, 30, 30},
		{n(10), 20, 0, 120, 0}, // below its spent after a lowered cap: none, not negative
		{nil, 0, 0, 0, 0},
	} {
		if got := Available(c.allowance, c.spent, c.reserved, c.fleet); got != c.want {
			t.Errorf("Available(%v, %d, %d, %d) = %d, want %d", c.allowance, c.spent, c.reserved, c.fleet, got, c.want)
		}
	}
}
