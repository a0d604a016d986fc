package e2e

import (
	"os/exec"
	"strings"
	"testing"
)

// TestClientsLinkNoDatabase: the worker, fleetctl and fleet-mcp speak the
// wire types only; none links a database driver or the metrics library, and the
// wire package itself imports nothing outside the standard library.
func TestClientsLinkNoDatabase(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "../cmd/fleet-worker", "../cmd/fleetctl", "../cmd/fleet-mcp").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 20 {
		t.Fatalf("go list -deps printed too little to judge: %q", out)
	}
	for _, d := range deps {
		for _, banned := range []string{"modernc.org/sqlite", "github.com/jackc/pgx", "github.com/prometheus", "/internal/store", "/internal/host"} {
			if strings.Contains(d, banned) {
				t.Errorf("fleet-worker, fleetctl or fleet-mcp links %s", d)
			}
		}
	}
	out, err = exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "../internal/wire").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if got := strings.Fields(string(out)); len(got) != 1 || got[0] != "github.com/fleet/fleet/internal/wire" {
		t.Errorf("internal/wire depends on %v; it must import only the standard library", got)
	}
}
