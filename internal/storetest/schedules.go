package storetest

import (
	"context"
	"reflect"
	"testing"

	"github.com/fleet/fleet/internal/store"
)

// testSchedules: a schedule is recorded as given (one name once), listed
// by name; only those due and not paused are read as due; a firing moves
// it on only from the slot it read, counting one; paused and resumed
// with its next slot; removed.
func testSchedules(t *testing.T, s *suite) {
	f := s.setup(t)
	weekly := store.Schedule{Name: "weekly", Spec: "0 9 * * 1", Request: `{"document":"d"}`, NextAtMS: 100, CreatedAtMS: 7}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.ScheduleGet(ctx, "weekly", store.NoLock); !store.IsNotFound(err) {
			t.Fatalf("an absent schedule: %v", err)
		}
		if err := tx.ScheduleInsert(ctx, weekly); err != nil {
			return err
		}
		return tx.ScheduleInsert(ctx, store.Schedule{Name: "daily", Spec: "@daily", Request: "{}", NextAtMS: 300, CreatedAtMS: 7})
	})
	f.refused("one name twice", func(ctx context.Context, tx *store.Tx) error { return tx.ScheduleInsert(ctx, weekly) })
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := must(tx.ScheduleGet(ctx, "weekly", store.NoLock)); !reflect.DeepEqual(got, weekly) {
			t.Fatalf("schedule %+v, want %+v", got, weekly)
		}
		if all := must(tx.ScheduleList(ctx)); len(all) != 2 || all[0].Name != "daily" {
			t.Fatalf("list %+v", all)
		}
		return nil
	})
	// Read ForUpdate, a schedule is locked until the transaction ends:
	// another such read waits (with one writer, every write transaction
	// excludes the others already).
	first := must(f.db.Driver().BeginWrite(context.Background()))
	defer first.Rollback()
	if got, err := first.ScheduleGet(context.Background(), "weekly", store.ForUpdate); err != nil || got.Name != "weekly" {
		t.Fatalf("read for update: %+v (%v)", got, err)
	}
	if f.db.Driver().Writers() > 1 && !waits(t, f, func(ctx context.Context, c store.Conn) error {
		_, err := c.ScheduleGet(ctx, "weekly", store.ForUpdate)
		return err
	}) {
		t.Fatal("a second read for update of a locked schedule did not wait")
	}
	first.Rollback()
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if due := must(tx.ScheduleDue(ctx, 200, 10)); len(due) != 1 || due[0].Name != "weekly" {
			t.Fatalf("due at 200: %+v", due)
		}
		if !must(tx.ScheduleAnyDue(ctx, 100)) || must(tx.ScheduleAnyDue(ctx, 99)) {
			t.Fatal("ScheduleAnyDue disagrees with weekly's next slot, 100")
		}
		if ok := must(tx.ScheduleAdvance(ctx, &store.ScheduleAdvanceParams{Name: "weekly", IfNextAtMS: 99, NextAtMS: 500, LastSlotMS: 100})); ok {
			t.Fatal("moved on from a slot it was not at")
		}
		if ok := must(tx.ScheduleAdvance(ctx, &store.ScheduleAdvanceParams{Name: "weekly", IfNextAtMS: 100, NextAtMS: 500, LastSlotMS: 100})); !ok {
			t.Fatal("not moved on from its slot")
		}
		if due := must(tx.ScheduleDue(ctx, 400, 10)); len(due) != 1 || due[0].Name != "daily" {
			t.Fatalf("due at 400: %+v", due)
		}
		return tx.ScheduleSetPaused(ctx, "daily", true, 300)
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if due := must(tx.ScheduleDue(ctx, 1000, 10)); len(due) != 1 || due[0].Name != "weekly" {
			t.Fatalf("due at 1000 with daily paused: %+v", due)
		}
		if must(tx.ScheduleAnyDue(ctx, 499)) {
			t.Fatal("due at 499, with weekly at 500 and daily paused")
		}
		if ok := must(tx.ScheduleAdvance(ctx, &store.ScheduleAdvanceParams{Name: "daily", IfNextAtMS: 300, NextAtMS: 900, LastSlotMS: 300})); ok {
			t.Fatal("a paused schedule moved on")
		}
		if got := must(tx.ScheduleGet(ctx, "weekly", store.NoLock)); got.Fired != 1 || got.NextAtMS != 500 || got.LastSlotMS != 100 {
			t.Fatalf("weekly after its firing: %+v", got)
		}
		if err := tx.ScheduleSetPaused(ctx, "daily", false, 2000); err != nil {
			return err
		}
		if got := must(tx.ScheduleGet(ctx, "daily", store.NoLock)); got.Paused || got.NextAtMS != 2000 {
			t.Fatalf("daily resumed: %+v", got)
		}
		if err := tx.ScheduleSetPaused(ctx, "nope", true, 1); !store.IsNotFound(err) {
			t.Fatalf("pausing an absent schedule: %v", err)
		}
		if err := tx.ScheduleDelete(ctx, "nope"); !store.IsNotFound(err) {
			t.Fatalf("removing an absent schedule: %v", err)
		}
		return tx.ScheduleDelete(ctx, "daily")
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if all := must(tx.ScheduleList(ctx)); len(all) != 1 {
			t.Fatalf("after removing daily: %+v", all)
		}
		return nil
	})
}
