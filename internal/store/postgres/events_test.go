package postgres_test

import (
	"context"
	"math"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
)

// TestEventFiltersMigration: events written before migration 11 name their
// job only in their data; opening the database fills the job in from
// there, so a job's older events are found by it.
func TestEventFiltersMigration(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	t.Run(storetest.Postgres, func(t *testing.T) {
		ctx := context.Background()
		location := storetest.NewLocation(t)
		if err := postgres.CreateAtVersion(ctx, location, 10); err != nil {
			t.Fatal(err)
		}
		for i, data := range []string{`{"operation_id":"op-1","section":"s"}`, `{}`, `{"operation_id":5}`,
			`{"accounting":{"spent":1},"operation_id":"op-1"}`} {
			if err := postgres.Exec(ctx, location, `INSERT INTO events (sequence, timestamp_ms, kind, actor, title, data)
				VALUES ($1, 1, 'fleet.claimed', 'w', 't', $2)`, i+1, data); err != nil {
				t.Fatal(err)
			}
		}
		db := storetest.MustOpen(t, location)
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			evs, err := tx.EventListNewest(ctx, store.EventFilter{Before: math.MaxInt64, OperationID: "op-1", Limit: 10})
			if err != nil || len(evs) != 2 || evs[0].Sequence != 1 || evs[1].Sequence != 4 {
				t.Fatalf("op-1's events after the migration: %+v (%v)", evs, err)
			}
			all, err := tx.EventList(ctx, 0, 10)
			if err != nil || len(all) != 4 || all[1].OperationID != "" || all[2].OperationID != "" {
				t.Fatalf("every event after the migration: %+v (%v)", all, err)
			}
			return nil
		})
	})
}
