package httpapi_test

import (
	"encoding/json"
	"net/url"
	"testing"

	"github.com/fleet/fleet/internal/wire"
)

// TestReportKeysInThePath: a report is found by its key escaped in the
// path (url.PathEscape, as fleetctl sends it) whatever the key holds: a
// '%' (which a second unescaping refused), a '/' (escaped), and a key
// that reads as an escape ("a%2Fb") is that key, not "a/b".
func TestReportKeysInThePath(t *testing.T) {
	th := newTestHost(t, fourSections)
	for _, key := range []string{"q3-50%", "team/q3", "a%2Fb", "a/b", "x?y#z", "plain"} {
		body, _ := json.Marshal(map[string]any{"document": "Keyed notes.", "sections": []string{"summary"}, "idempotency_key": key})
		if rec := th.do("POST", "/admin/reports", th.operator, string(body)); rec.Code != 200 {
			t.Fatalf("submit %q: %d %s", key, rec.Code, rec.Body)
		}
	}
	for _, key := range []string{"q3-50%", "team/q3", "a%2Fb", "a/b", "x?y#z", "plain"} {
		rec := th.do("GET", "/admin/reports/"+url.PathEscape(key), th.operator, "")
		var r wire.Report
		if err := json.Unmarshal(rec.Body.Bytes(), &r); rec.Code != 200 || err != nil || r.Key != key {
			t.Errorf("GET the report %q: %d %s", key, rec.Code, rec.Body)
		}
	}
}
