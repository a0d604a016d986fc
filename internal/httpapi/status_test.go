package httpapi

import (
	"net/http"
	"testing"

	"github.com/fleet/fleet/internal/wire"
)

// TestEveryCodeHasAStatus: a code missing from statusOf would be answered
// as a 500 and logged as a host failure.
func TestEveryCodeHasAStatus(t *testing.T) {
	for _, c := range wire.Codes {
		status, ok := statusOf[c]
		if !ok {
			t.Errorf("code %q has no HTTP status", c)
			continue
		}
		if (status >= 500) != (c == wire.CodeInternal || c == wire.CodeUnavailable) {
			t.Errorf("code %q maps to %d %s", c, status, http.StatusText(status))
		}
	}
	if len(statusOf) != len(wire.Codes) {
		t.Errorf("statusOf has %d codes, wire.Codes %d", len(statusOf), len(wire.Codes))
	}
}
