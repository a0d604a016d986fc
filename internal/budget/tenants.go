package budget

import (
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/wire"
)

// ValidatePeriod checks a tenant's period: none, day, week or month.
func ValidatePeriod(period string) error {
	switch period {
	case wire.PeriodNone, wire.PeriodDay, wire.PeriodWeek, wire.PeriodMonth:
		return nil
	}
	return fleet.Errorf(wire.CodeInvalid, "period must be day, week or month, got %.40q", period)
}

// PeriodStart is when the period holding t began, in UTC: midnight for a
// day, Monday's midnight for a week, the first's midnight for a month;
// the zero time with no period (one period for ever).
func PeriodStart(period string, t time.Time) time.Time {
	t = t.UTC()
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	switch period {
	case wire.PeriodDay:
		return day
	case wire.PeriodWeek:
		return day.AddDate(0, 0, -((int(day.Weekday()) + 6) % 7))
	case wire.PeriodMonth:
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Time{}
}

// PeriodDue is the start of the period a tenant is in at now when that is
// later than the start it holds (its spent must start again at 0); false
// when the held period is still current.
func PeriodDue(period string, heldStartMS int64, now time.Time) (startMS int64, due bool) {
	if period == wire.PeriodNone {
		return 0, false
	}
	start := PeriodStart(period, now).UnixMilli()
	return start, start > heldStartMS
}

// MaxTenantNameBytes bounds a tenant's name.
const MaxTenantNameBytes = 64

// ValidateTenantName checks a tenant's name: 1 to MaxTenantNameBytes of
// lower-case letters, digits, '.', '_' and '-', starting with a letter or
// digit (it goes in URLs, metric labels and receipts as it is).
func ValidateTenantName(name string) error {
	ok := name != "" && len(name) <= MaxTenantNameBytes
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '.' || c == '_' || c == '-')
	}
	if !ok {
		return fleet.Errorf(wire.CodeInvalid, "a tenant's name is 1 to %d lower-case letters, digits, '.', '_' or '-', starting with a letter or digit; got %.40q",
			MaxTenantNameBytes, name)
	}
	return nil
}

// Available is what a level (a tenant, or a credential with an allowance
// of its own) may still reserve: its own allowance's room, never more
// than the fleet's available, never below 0; the fleet's available when
// it has no allowance of its own.
func Available(allowance *int64, spent, reserved, fleetAvailable int64) int64 {
	available := fleetAvailable
	if allowance != nil {
		available = min(available, *allowance-spent-reserved)
	}
	return max(available, 0)
}
