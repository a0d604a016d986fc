package e2e

import (
	"os"
	"os/exec"
	"slices"
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

// TestDomainLinksNoDriver (issue 35): the commands choose the database and
// hand the parts a store, as River's client is handed its driver: no
// package under internal/ but the backends and the test support that
// opens them (storetest, hosttest) links store/backend, SQLite or pgx.
func TestDomainLinksNoDriver(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, "../internal/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const module = "github.com/fleet/fleet/internal/"
	backends := []string{"store/backend", "store/sqlite", "store/sqlite/dbsqlc", "store/postgres", "store/postgres/dbsqlc",
		"storetest", "hosttest"}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, " ")
		if slices.Contains(backends, strings.TrimPrefix(pkg, module)) {
			continue
		}
		checked++
		for _, d := range strings.Fields(deps) {
			if strings.HasPrefix(d, "modernc.org/sqlite") || strings.HasPrefix(d, "github.com/jackc/pgx") ||
				d == module+"store/backend" {
				t.Errorf("%s links %s; the commands choose the database and hand it a store", pkg, d)
				break
			}
		}
	}
	if checked < 20 {
		t.Fatalf("go list named %d packages to check: %q", checked, out)
	}
}

// TestArchitectureNamesEveryPackage (issue 35): docs/architecture.md's
// table of packages names every package under internal/.
func TestArchitectureNamesEveryPackage(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(doc), "## Packages")
	table, _, _ = strings.Cut(table, "\n## ")
	out, err := exec.Command("go", "list", "../internal/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	pkgs := strings.Fields(string(out))
	if len(pkgs) < 20 {
		t.Fatalf("go list printed too little to judge: %q", out)
	}
	for _, p := range pkgs {
		name := strings.TrimPrefix(p, "github.com/fleet/fleet/")
		if !strings.Contains(table, "`"+name+"`") {
			t.Errorf("docs/architecture.md's table of packages does not name %s", name)
		}
	}
}
