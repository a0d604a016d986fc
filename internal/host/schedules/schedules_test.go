package schedules

import (
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/wire"
)

// TestSpec: cron expressions and descriptors at most once a minute are
// taken, read in UTC; more often, or not cron, is invalid_request naming
// the problem.
func TestSpec(t *testing.T) {
	for _, ok := range []string{"* * * * *", "0 9 * * 1", "@daily", "@every 2h", "0,1 * * * *"} {
		if _, err := Spec(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for spec, says := range map[string]string{"@every 30s": "one firing a minute", "every monday": "not a cron expression",
		"61 * * * *": "not a cron expression", "": "not a cron expression"} {
		if _, err := Spec(spec); fleet.ErrorCode(err) != wire.CodeInvalid || !strings.Contains(fleet.ErrorMessage(err), says) {
			t.Errorf("%q: %v; want invalid_request saying %q", spec, err, says)
		}
	}
	s, _ := Spec("0 9 * * 1")
	from := time.Date(2026, 12, 7, 9, 0, 0, 0, time.FixedZone("CET", 3600)) // 08:00 UTC, a Monday
	if got := time.UnixMilli(nextSlot(s, from)).UTC(); got != time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC) {
		t.Fatalf("the next slot after 08:00 UTC: %s", got)
	}
	if key := slotKey("weekly", time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC).UnixMilli()); key != "schedule:weekly@2026-12-07T09:00:00Z" {
		t.Fatalf("slot key %s", key)
	}
}
