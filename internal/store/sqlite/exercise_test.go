package sqlite_test

import (
	"path/filepath"
	"testing"

	"github.com/fleet/fleet/internal/storetest"
)

// TestExercise runs the driver conformance suite on SQLite.
func TestExercise(t *testing.T) {
	t.Parallel()
	storetest.Exercise(t, func(tb testing.TB) string { return filepath.Join(tb.TempDir(), "fleet.sqlite3") })
}
