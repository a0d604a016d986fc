package postgres_test

import (
	"testing"

	"github.com/fleet/fleet/internal/storetest"
)

// TestExercise runs the driver conformance suite on PostgreSQL, each test
// in a schema of its own.
func TestExercise(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres + " (.ci/run starts one)")
	}
	t.Parallel()
	storetest.Exercise(t, storetest.NewPostgresLocation)
}
