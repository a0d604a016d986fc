package storetest

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// testJobCountsSaved: no count is saved at first; a saved count reads
// back as saved.
func testJobCountsSaved(t *testing.T, s *suite) {
	f := s.setup(t)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.JobCountsSaved(ctx); !store.IsNotFound(err) {
			t.Fatalf("a count before any was saved: %v", err)
		}
		return nil
	})
	want := store.SavedCounts{Counts: map[wire.JobState]int64{wire.Queued: 3}, TakenMS: 1000}
	f.write(func(ctx context.Context, tx *store.Tx) error { return tx.JobCountsSave(ctx, want) })
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.JobCountsSaved(ctx)); !reflect.DeepEqual(got, want) {
			t.Fatalf("saved %+v, read back %+v", want, got)
		}
		return nil
	})
}

// testJobCountsSave: a second count replaces the first, and a transaction
// that saves one and rolls back leaves the one before.
func testJobCountsSave(t *testing.T, s *suite) {
	f := s.setup(t)
	first := store.SavedCounts{Counts: map[wire.JobState]int64{wire.Queued: 3}, TakenMS: 1000}
	second := store.SavedCounts{Counts: map[wire.JobState]int64{wire.Completed: 1, wire.Claimed: 2}, TakenMS: 2000}
	f.write(func(ctx context.Context, tx *store.Tx) error { return tx.JobCountsSave(ctx, first) })
	f.write(func(ctx context.Context, tx *store.Tx) error { return tx.JobCountsSave(ctx, second) })
	f.refused("a save rolled back", func(ctx context.Context, tx *store.Tx) error {
		if err := tx.JobCountsSave(ctx, first); err != nil {
			return err
		}
		return errors.New("rolled back")
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.JobCountsSaved(ctx)); !reflect.DeepEqual(got, second) {
			t.Fatalf("read back %+v, want the second %+v", got, second)
		}
		return nil
	})
}
