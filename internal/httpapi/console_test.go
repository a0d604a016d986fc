package httpapi_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/wire"
)

// TestConsoleKnowsEveryKind: the console's kind filter offers every kind
// of event the host writes, and no other.
func TestConsoleKnowsEveryKind(t *testing.T) {
	js, err := os.ReadFile("console/app.js")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)const EVENT_KINDS = \[(.*?)\];`).FindSubmatch(js)
	if m == nil {
		t.Fatal("app.js has no EVENT_KINDS list")
	}
	var listed []string
	for _, q := range regexp.MustCompile(`"([^"]+)"`).FindAllSubmatch(m[1], -1) {
		listed = append(listed, string(q[1]))
	}
	var want []string
	for _, k := range wire.EventKinds {
		want = append(want, string(k))
	}
	if strings.Join(listed, " ") != strings.Join(want, " ") {
		t.Fatalf("the console's kinds:\n%v\nthe host's:\n%v", listed, want)
	}
}
