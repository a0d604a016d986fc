package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// testEventListNewest: the newest page of the log, of one kind, of one
// job, or of one job and kind, within (After, Before), in sequence order;
// every event keeps the job it names, placed directly or by way of the
// pending log.
func testEventListNewest(t *testing.T, s *suite) {
	f := s.setup(t)
	kinds := []wire.EventKind{wire.EventCredential, wire.EventPublished, wire.EventClaimed}
	jobOf := func(seq int64) string {
		switch {
		case seq%3 == 0:
			return "" // the credential events: about no job
		case seq%2 == 0:
			return "op-a"
		}
		return "op-b"
	}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		evs := make([]wire.Event, 30)
		for i := range evs {
			seq := int64(i + 1)
			evs[i] = wire.Event{Sequence: seq, TimestampMS: seq, Kind: kinds[seq%3], OperationID: jobOf(seq), Actor: "w",
				Title: fmt.Sprint(seq), Data: json.RawMessage(`{}`)}
		}
		return tx.EventInsert(ctx, evs)
	})
	sequences := func(evs []wire.Event) []int64 {
		out := []int64{}
		for _, e := range evs {
			if e.OperationID != jobOf(e.Sequence) || e.Kind != kinds[e.Sequence%3] || e.Title != fmt.Sprint(e.Sequence) {
				t.Fatalf("event %d came back as %+v", e.Sequence, e)
			}
			out = append(out, e.Sequence)
		}
		return out
	}
	for _, c := range []struct {
		name   string
		filter store.EventFilter
		want   []int64
	}{
		{"the newest", store.EventFilter{Before: math.MaxInt64, Limit: 4}, []int64{27, 28, 29, 30}},
		{"the newest before", store.EventFilter{After: 2, Before: 6, Limit: 10}, []int64{3, 4, 5}},
		{"of a kind", store.EventFilter{Before: 20, Kind: wire.EventPublished, Limit: 3}, []int64{13, 16, 19}},
		{"of a kind after", store.EventFilter{After: 20, Before: math.MaxInt64, Kind: wire.EventCredential, Limit: 10}, []int64{21, 24, 27, 30}},
		{"of a job", store.EventFilter{Before: math.MaxInt64, OperationID: "op-a", Limit: 4}, []int64{20, 22, 26, 28}},
		{"of a job after", store.EventFilter{After: 22, Before: 28, OperationID: "op-b", Limit: 10}, []int64{23, 25}},
		{"of a job and kind", store.EventFilter{Before: math.MaxInt64, OperationID: "op-b", Kind: wire.EventClaimed, Limit: 10},
			[]int64{5, 11, 17, 23, 29}},
		{"of no such job", store.EventFilter{Before: math.MaxInt64, OperationID: "op-z", Limit: 10}, []int64{}},
	} {
		f.read(func(ctx context.Context, tx *store.Tx) error {
			got := sequences(must(tx.EventListNewest(ctx, c.filter)))
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("%s: %v, want %v", c.name, got, c.want)
			}
			return nil
		})
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if got := sequences(must(tx.EventList(ctx, 10, 3))); fmt.Sprint(got) != "[11 12 13]" {
			t.Fatalf("the oldest after 10: %v", got)
		}
		return nil
	})

	// By way of the sequencer's pending log.
	var pending store.PendingIDs
	f.write(func(ctx context.Context, tx *store.Tx) (err error) {
		pending, err = tx.PendingLogInsert(ctx, []wire.Event{{TimestampMS: 31, Kind: wire.EventPublished, OperationID: "op-c",
			Actor: "w", Title: "31", Data: json.RawMessage(`{}`)}}, nil)
		return err
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		p := must(tx.PendingLogList(ctx, 10))
		if !reflect.DeepEqual(p.Events, pending.Events) {
			t.Fatalf("pending events %v, want %v", p.Events, pending.Events)
		}
		return tx.PendingLogPlace(ctx, &store.PendingLogPlaceParams{FirstEvent: 31, Placed: pending})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		got := must(tx.EventListNewest(ctx, store.EventFilter{Before: math.MaxInt64, OperationID: "op-c", Limit: 10}))
		if len(got) != 1 || got[0].Sequence != 31 || got[0].Kind != wire.EventPublished {
			t.Fatalf("op-c's events once placed: %+v", got)
		}
		return nil
	})
}
