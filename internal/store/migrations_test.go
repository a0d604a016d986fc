package store

import (
	"strings"
	"testing"
)

// TestMigrationsInStep: both backends have the same numbered migrations, so
// SchemaVersion means the same schema on either.
func TestMigrationsInStep(t *testing.T) {
	lite, pg := mustMigrations(dialectSQLite), mustMigrations(dialectPostgres)
	if len(lite) != len(pg) || len(lite) != SchemaVersion() {
		t.Fatalf("%d SQLite and %d PostgreSQL migrations", len(lite), len(pg))
	}
	for i := range lite {
		if lite[i].name != pg[i].name {
			t.Errorf("migration %d is %s on SQLite and %s on PostgreSQL", i+1, lite[i].name, pg[i].name)
		}
		// Every table SQLite gets, PostgreSQL gets too.
		for _, line := range strings.Split(lite[i].sql, "\n") {
			if strings.HasPrefix(line, "CREATE ") && !strings.Contains(pg[i].sql, strings.Fields(line)[0]+" "+strings.Join(strings.Fields(line)[1:3], " ")) {
				t.Errorf("%s: PostgreSQL lacks %q", lite[i].name, line)
			}
		}
	}
}
