package backend_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/store/backend"
)

// TestOpenStateWithoutItsDatabase: a state directory without a SQLite
// database (a state kept in PostgreSQL, opened without --database) is
// refused naming --database; a directory that is not there is refused
// naming it, with nothing made.
func TestOpenStateWithoutItsDatabase(t *testing.T) {
	ctx := context.Background()
	state := t.TempDir()
	if err := os.Mkdir(filepath.Join(state, "credentials"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := backend.OpenState(ctx, state, "", backend.Options{}); err == nil || !strings.Contains(err.Error(), "--database") {
		t.Fatalf("a state directory without its SQLite database: %v, want a refusal naming --database", err)
	}
	if _, err := backend.ExistingStateLocation(state, ""); err == nil || !strings.Contains(err.Error(), "--database") {
		t.Fatalf("the location of a state directory without its SQLite database (fleet-host verify): %v", err)
	}
	missing := filepath.Join(t.TempDir(), "nowhere")
	if _, err := backend.OpenState(ctx, missing, "", backend.Options{}); err == nil || !strings.Contains(err.Error(), "no state at "+missing) {
		t.Fatalf("a state directory that is not there: %v", err)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Fatalf("opening %s made it: %v", missing, err)
	}
}
