package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// receipts stores rcpt-1..rcpt-3 for op-1, op-2, op-1 at sequences 1..3.
func (f *fixture) receipts() {
	f.t.Helper()
	f.write(func(ctx context.Context, tx *store.Tx) error {
		var rs []store.StoredReceipt
		for i, op := range []string{"op-1", "op-2", "op-1"} {
			r := wire.Receipt{ID: fmt.Sprint("rcpt-", i+1), ReceiptBody: wire.ReceiptBody{Sequence: int64(i + 1), Kind: wire.KindAdmission, OperationID: op}}
			rs = append(rs, store.StoredReceipt{Receipt: r, Stored: []byte(fmt.Sprintf(`{"id":"%s"}`, r.ID))})
		}
		return tx.ReceiptInsert(ctx, rs) // three rows, one statement
	})
}

func testReceiptHead(t *testing.T, s *suite) {
	f := s.setup(t)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if h := must(tx.ReceiptHead(ctx)); h != (store.ChainHead{}) {
			t.Fatalf("head of an empty chain: %+v", h)
		}
		return nil
	})
	f.receipts()
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if h := must(tx.ReceiptHead(ctx)); h != (store.ChainHead{Sequence: 3, ID: "rcpt-3"}) {
			t.Fatalf("head %+v", h)
		}
		return nil
	})
}

func testReceiptInsert(t *testing.T, s *suite) {
	f := s.setup(t)
	f.receipts()
	f.refused("two receipts at one sequence", func(ctx context.Context, tx *store.Tx) error {
		return tx.ReceiptInsert(ctx, []store.StoredReceipt{{Receipt: wire.Receipt{ID: "rcpt-9", ReceiptBody: wire.ReceiptBody{Sequence: 3}}, Stored: []byte("{}")}})
	})
	f.refused("one receipt id twice", func(ctx context.Context, tx *store.Tx) error {
		return tx.ReceiptInsert(ctx, []store.StoredReceipt{{Receipt: wire.Receipt{ID: "rcpt-1", ReceiptBody: wire.ReceiptBody{Sequence: 4}}, Stored: []byte("{}")}})
	})
	f.write(func(ctx context.Context, tx *store.Tx) error { return tx.ReceiptInsert(ctx, nil) })
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if all := must(tx.ReceiptList(ctx, "")); len(all) != 3 {
			t.Fatalf("%d receipts", len(all))
		}
		return nil
	})
}

func testReceiptReads(t *testing.T, s *suite) {
	f := s.setup(t)
	f.receipts()
	f.read(func(ctx context.Context, tx *store.Tx) error {
		all := must(tx.ReceiptList(ctx, ""))
		mine := must(tx.ReceiptList(ctx, "op-1"))
		newest := must(tx.ReceiptNewestByOperation(ctx))
		body := must(tx.ReceiptGet(ctx, "rcpt-2"))
		if len(all) != 3 || string(all[0]) != `{"id":"rcpt-1"}` || len(mine) != 2 || string(mine[1]) != `{"id":"rcpt-3"}` ||
			!reflect.DeepEqual(newest, map[string]string{"op-1": "rcpt-3", "op-2": "rcpt-2"}) || string(body) != `{"id":"rcpt-2"}` {
			t.Fatalf("%q receipts, %q of op-1, newest %v, body %s", all, mine, newest, body)
		}
		if _, err := tx.ReceiptGet(ctx, "nope"); !store.IsNotFound(err) {
			t.Fatalf("an absent receipt: %v", err)
		}
		many := must(tx.ReceiptGetMany(ctx, []string{"rcpt-3", "nope", "rcpt-1"}))
		if len(many) != 2 || string(many[0]) != `{"id":"rcpt-1"}` || string(many[1]) != `{"id":"rcpt-3"}` {
			t.Fatalf("read many: %q", many)
		}
		if some := must(tx.ReceiptNewestFor(ctx, []string{"op-1", "op-3"})); !reflect.DeepEqual(some, map[string]string{"op-1": "rcpt-3"}) {
			t.Fatalf("newest receipts of op-1 and op-3: %v", some)
		}
		return nil
	})
}

func testEvents(t *testing.T, s *suite) {
	// More rows than one statement takes are split, in order.
	f := s.setup(t)
	f.read(func(ctx context.Context, tx *store.Tx) error {
		count, last, err := tx.EventHead(ctx)
		if err != nil || count != 0 || last != 0 || must(tx.EventLast(ctx)) != 0 || len(must(tx.EventList(ctx, 0, 5))) != 0 {
			t.Fatalf("an empty log: %d/%d (%v)", count, last, err)
		}
		return nil
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		evs := make([]wire.Event, 1234)
		for i := range evs {
			evs[i] = wire.Event{Sequence: int64(i + 1), TimestampMS: 1, Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i + 1), Data: json.RawMessage(`{"i":1}`)}
		}
		return tx.EventInsert(ctx, evs)
	})
	f.refused("two events at one sequence", func(ctx context.Context, tx *store.Tx) error {
		return tx.EventInsert(ctx, []wire.Event{{Sequence: 5, TimestampMS: 1, Kind: wire.EventClaimed, Actor: "w", Title: "x", Data: json.RawMessage(`{}`)}})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		count, last, err := tx.EventHead(ctx)
		tail := must(tx.EventLast(ctx))
		page := must(tx.EventList(ctx, 1000, 5))
		if err != nil || count != 1234 || last != 1234 || tail != 1234 || len(page) != 5 || page[0].Sequence != 1001 || page[0].Title != "1001" ||
			page[0].Kind != wire.EventClaimed || string(page[0].Data) != `{"i":1}` || page[4].Sequence != 1005 {
			t.Fatalf("head %d/%d/%d, page %+v (%v)", count, last, tail, page, err)
		}
		return nil
	})
	// Every byte of data as given, whatever it holds; the empty data
	// alone in a statement too.
	data := []string{`{"t":"é—日本 \u2028"}`, `{"q":"\"\\<&>"}`, ``, strings.Repeat(`{"long":"x"}`, 1000)}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		evs := make([]wire.Event, len(data))
		for i, d := range data {
			evs[i] = wire.Event{Sequence: int64(1235 + i), TimestampMS: 2, Kind: wire.EventClaimed, Actor: "é", Title: "t", Data: json.RawMessage(d)}
		}
		if err := tx.EventInsert(ctx, evs); err != nil {
			return err
		}
		return tx.EventInsert(ctx, []wire.Event{{Sequence: 1239, TimestampMS: 2, Kind: wire.EventClaimed, Actor: "w", Title: "t"}})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		page := must(tx.EventList(ctx, 1234, 10))
		if len(page) != len(data)+1 || page[0].Actor != "é" || string(page[len(data)].Data) != "" {
			t.Fatalf("%d events after 1234: %+v", len(page), page)
		}
		for i, d := range data {
			if string(page[i].Data) != d {
				t.Fatalf("event %d's data %q, written %q", page[i].Sequence, page[i].Data, d)
			}
		}
		return nil
	})
}

func testPendingLogInsertList(t *testing.T, s *suite) {
	// Entries written for the sequencer come back oldest first, up to the
	// limit, with the placed log's heads.
	f := s.setup(t)
	var pending store.PendingIDs
	f.write(func(ctx context.Context, tx *store.Tx) (err error) {
		evs := make([]wire.Event, 600)
		for i := range evs {
			evs[i] = wire.Event{TimestampMS: int64(i), Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i), Data: json.RawMessage(`{}`)}
		}
		pending, err = tx.PendingLogInsert(ctx, evs, []wire.Receipt{{ID: "rcpt-a", ReceiptBody: wire.ReceiptBody{OperationID: "op-1", Nonce: "n"}}, {ID: "rcpt-b"}})
		return err
	})
	if len(pending.Events) != 600 || len(pending.Receipts) != 2 || pending.Receipts[0] == pending.Receipts[1] || !slices.IsSorted(pending.Events) {
		t.Fatalf("pending ids: %d events, receipts %v", len(pending.Events), pending.Receipts)
	}
	f.read(func(ctx context.Context, tx *store.Tx) error {
		p := must(tx.PendingLogList(ctx, 550))
		if !reflect.DeepEqual(p.Events, pending.Events[:550]) ||
			len(p.Receipts) != 2 || p.Receipts[0].Receipt.ID != "rcpt-a" || p.Receipts[0].Receipt.Nonce != "n" || p.Receipts[1].Receipt.ID != "rcpt-b" ||
			p.LastEvent != 0 || p.Head != (store.ChainHead{}) {
			t.Fatalf("%d events, receipts %+v, heads %d %+v", len(p.Events), p.Receipts, p.LastEvent, p.Head)
		}
		return nil
	})
}

func testPendingLogPlace(t *testing.T, s *suite) {
	// Placing writes entries where readers look and removes them from
	// pending; PendingLogLeft says which of a request's entries are still
	// waiting.
	f := s.setup(t)
	var pending store.PendingIDs
	f.write(func(ctx context.Context, tx *store.Tx) (err error) {
		evs := make([]wire.Event, 60)
		for i := range evs {
			evs[i] = wire.Event{TimestampMS: int64(i), Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i), Data: json.RawMessage(`{}`)}
		}
		pending, err = tx.PendingLogInsert(ctx, evs, []wire.Receipt{{ID: "rcpt-a", ReceiptBody: wire.ReceiptBody{OperationID: "op-1"}}, {ID: "rcpt-b"}})
		return err
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		p := must(tx.PendingLogList(ctx, 50))
		placed := store.PendingIDs{Events: p.Events, Receipts: []int64{p.Receipts[0].Pending}}
		return tx.PendingLogPlace(ctx, &store.PendingLogPlaceParams{FirstEvent: 1, Placed: placed,
			Receipts: []store.StoredReceipt{{Receipt: wire.Receipt{ID: "rcpt-a", ReceiptBody: wire.ReceiptBody{Sequence: 1, Kind: wire.KindAdmission, OperationID: "op-1"}},
				Stored: []byte(`{"id":"rcpt-a"}`)}}})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		p := must(tx.PendingLogList(ctx, 100))
		if !reflect.DeepEqual(p.Events, pending.Events[50:]) || len(p.Receipts) != 1 || p.Receipts[0].Receipt.ID != "rcpt-b" ||
			p.LastEvent != 50 || p.Head != (store.ChainHead{Sequence: 1, ID: "rcpt-a"}) {
			t.Fatalf("after placing: %d events, receipts %+v, heads %d %+v", len(p.Events), p.Receipts, p.LastEvent, p.Head)
		}
		checkPlacedEvents(t, must(tx.EventList(ctx, 0, 100)), 50)
		if string(must(tx.ReceiptGet(ctx, "rcpt-a"))) != `{"id":"rcpt-a"}` {
			t.Fatal("rcpt-a not placed as stored")
		}
		// Of the receipts asked for by id, only the placed one comes back,
		// as stored: rcpt-b is still pending, and no receipt is "nope".
		left := must(tx.PendingLogLeft(ctx, pending, []string{"rcpt-b", "nope", "rcpt-a"}))
		if !reflect.DeepEqual(left.Events, pending.Events[50:]) || !reflect.DeepEqual(left.Receipts, pending.Receipts[1:]) ||
			len(left.Placed) != 1 || string(left.Placed[0]) != `{"id":"rcpt-a"}` {
			t.Fatalf("left pending: %d events, receipts %v, placed %q", len(left.Events), left.Receipts, left.Placed)
		}
		none := must(tx.PendingLogLeft(ctx, store.PendingIDs{Events: pending.Events[:50]}, nil))
		if len(none.Events)+len(none.Receipts)+len(none.Placed) != 0 {
			t.Fatalf("placed entries still pending: %+v", none)
		}
		return nil
	})
	// A round that takes the rest of one transaction's events and all of
	// the next one's numbers them on, in the order they were appended.
	var more store.PendingIDs
	f.write(func(ctx context.Context, tx *store.Tx) (err error) {
		evs := make([]wire.Event, 5)
		for i := range evs {
			evs[i] = wire.Event{TimestampMS: int64(60 + i), Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(60 + i), Data: json.RawMessage(`{}`)}
		}
		more, err = tx.PendingLogInsert(ctx, evs, nil)
		return err
	})
	f.write(func(ctx context.Context, tx *store.Tx) error {
		p := must(tx.PendingLogList(ctx, 100))
		if want := append(slices.Clone(pending.Events[50:]), more.Events...); !reflect.DeepEqual(p.Events, want) {
			t.Fatalf("pending events %v, want %v", p.Events, want)
		}
		return tx.PendingLogPlace(ctx, &store.PendingLogPlaceParams{FirstEvent: 51, Placed: store.PendingIDs{Events: p.Events}})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		checkPlacedEvents(t, must(tx.EventList(ctx, 0, 100)), 65)
		if p := must(tx.PendingLogList(ctx, 100)); len(p.Events) != 0 || p.LastEvent != 65 {
			t.Fatalf("after the second round: %d events pending, the last placed %d", len(p.Events), p.LastEvent)
		}
		return nil
	})
}

// checkPlacedEvents checks that the log holds exactly the events appended
// 0 to n-1 (titled and timed by their number), numbered 1 to n.
func checkPlacedEvents(t *testing.T, page []wire.Event, n int) {
	t.Helper()
	if len(page) != n {
		t.Fatalf("%d events placed, want %d", len(page), n)
	}
	for i, e := range page {
		if e.Sequence != int64(i+1) || e.Title != fmt.Sprint(i) || e.TimestampMS != int64(i) || e.Kind != wire.EventClaimed ||
			e.Actor != "w" || string(e.Data) != `{}` {
			t.Fatalf("placed event %d: %+v", i, e)
		}
	}
}

func testWorkerActivity(t *testing.T, s *suite) {
	// w1 holds op-1 running (f.run, updated at 11); w2 claimed op-2 at 10
	// and then failed it at 30; op-3 was never claimed.
	f := s.setup(t)
	f.run()
	c := f.claim("w2", 1, 500)[0]
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.JobFail(ctx, &store.JobFailParams{OperationID: c.OperationID, IfState: wire.Claimed, Attempts: 1, LastError: "x", Reason: "gave up", NowMS: 30})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		want := []store.WorkerActivity{{Worker: "w1", Held: 1, LastSeenMS: 11}, {Worker: "w2", Failed: 1, LastSeenMS: 30}}
		if got := must(tx.WorkerActivity(ctx, 20)); !reflect.DeepEqual(got, want) {
			t.Fatalf("since 20: %+v, want %+v", got, want)
		}
		if got := must(tx.WorkerActivity(ctx, 31)); got[1].Failed != 0 {
			t.Fatalf("since 31 a failure at 30 counts: %+v", got)
		}
		return nil
	})
}

func testPendingLogExpect(t *testing.T, s *suite) {
	// A round that knows what is pending places it where it expects the
	// log to end; its transaction fails (ErrGuard), writing nothing, if
	// the log moved on, if what it places is no longer pending or comes
	// after something else still pending, or (where
	// writers run at once) if another transaction holds the log lock.
	f := s.setup(t)
	var a, b store.PendingIDs
	f.write(func(ctx context.Context, tx *store.Tx) (err error) {
		a, err = tx.PendingLogInsert(ctx, claimedEvents(0, 2), []wire.Receipt{{ID: "rcpt-a", ReceiptBody: wire.ReceiptBody{OperationID: "op-1"}}})
		return err
	})
	f.write(func(ctx context.Context, tx *store.Tx) (err error) {
		b, err = tx.PendingLogInsert(ctx, claimedEvents(2, 1), nil)
		return err
	})
	placeA := func(ctx context.Context, tx *store.Tx, last int64, head store.ChainHead) error {
		if err := tx.PendingLogExpect(ctx, last, head, a); err != nil {
			return err
		}
		return tx.PendingLogPlace(ctx, &store.PendingLogPlaceParams{FirstEvent: last + 1, Placed: a,
			Receipts: []store.StoredReceipt{{Receipt: wire.Receipt{ID: "rcpt-a", ReceiptBody: wire.ReceiptBody{Sequence: head.Sequence + 1,
				Kind: wire.KindAdmission, OperationID: "op-1"}}, Stored: []byte(`{"id":"rcpt-a"}`)}}})
	}
	unmoved := func(what string, lastEvent int64, pendingEvents int) {
		f.read(func(ctx context.Context, tx *store.Tx) error {
			p := must(tx.PendingLogList(ctx, 100))
			if p.LastEvent != lastEvent || len(p.Events) != pendingEvents {
				t.Errorf("%s: the log ends at %d with %d events pending, want %d and %d", what, p.LastEvent, len(p.Events), lastEvent, pendingEvents)
			}
			return nil
		})
	}
	// Expecting the log further on than it is.
	if err := f.writeErr(func(ctx context.Context, tx *store.Tx) error { return placeA(ctx, tx, 7, store.ChainHead{}) }); !errors.Is(err, store.ErrGuard) {
		t.Fatalf("placed where the log does not end: %v, want ErrGuard", err)
	}
	unmoved("after a wrong head", 0, 3)
	// b alone, while a, appended before it, is still pending.
	if err := f.writeErr(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.PendingLogExpect(ctx, 0, store.ChainHead{}, b); err != nil {
			return err
		}
		return tx.PendingLogPlace(ctx, &store.PendingLogPlaceParams{FirstEvent: 1, Placed: b})
	}); !errors.Is(err, store.ErrGuard) {
		t.Fatalf("placed b ahead of a, pending before it: %v, want ErrGuard", err)
	}
	unmoved("after placing b ahead of a", 0, 3)
	// Where it ends: a's entries are placed, b's wait.
	f.write(func(ctx context.Context, tx *store.Tx) error { return placeA(ctx, tx, 0, store.ChainHead{}) })
	f.read(func(ctx context.Context, tx *store.Tx) error {
		checkPlacedEvents(t, must(tx.EventList(ctx, 0, 100)), 2)
		if p := must(tx.PendingLogList(ctx, 100)); !reflect.DeepEqual(p.Events, b.Events) || p.Head != (store.ChainHead{Sequence: 1, ID: "rcpt-a"}) {
			t.Errorf("after placing a: pending %v, head %+v", p.Events, p.Head)
		}
		return nil
	})
	// The head a was placed after is no longer the log's.
	if err := f.writeErr(func(ctx context.Context, tx *store.Tx) error {
		return tx.PendingLogExpect(ctx, 0, store.ChainHead{}, b)
	}); !errors.Is(err, store.ErrGuard) {
		t.Fatalf("expected the log where it ended before a was placed: %v, want ErrGuard", err)
	}
	// a's entries are no longer pending.
	if err := f.writeErr(func(ctx context.Context, tx *store.Tx) error {
		return placeA(ctx, tx, 2, store.ChainHead{Sequence: 1, ID: "rcpt-a"})
	}); !errors.Is(err, store.ErrGuard) {
		t.Fatalf("placed entries placed already: %v, want ErrGuard", err)
	}
	unmoved("after placing a again", 2, 1)
	if f.db.Driver().Writers() > 1 {
		// Another transaction holds the log lock (a round of another host).
		ctx := context.Background()
		holder := must(f.db.Driver().BeginWrite(ctx))
		defer holder.Rollback()
		if ok, err := holder.TryLockLog(ctx); err != nil || !ok {
			t.Fatalf("take the log lock: %v %v", ok, err)
		}
		if err := f.writeErr(func(ctx context.Context, tx *store.Tx) error {
			return tx.PendingLogExpect(ctx, 2, store.ChainHead{Sequence: 1, ID: "rcpt-a"}, b)
		}); !errors.Is(err, store.ErrGuard) {
			t.Fatalf("expected the log while another transaction held its lock: %v, want ErrGuard", err)
		}
		holder.Rollback()
	}
	// With the lock free and the head right, b is placed after a.
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.PendingLogExpect(ctx, 2, store.ChainHead{Sequence: 1, ID: "rcpt-a"}, b); err != nil {
			return err
		}
		return tx.PendingLogPlace(ctx, &store.PendingLogPlaceParams{FirstEvent: 3, Placed: b})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		checkPlacedEvents(t, must(tx.EventList(ctx, 0, 100)), 3)
		return nil
	})
}

// claimedEvents are n events titled from first on.
func claimedEvents(first, n int) []wire.Event {
	evs := make([]wire.Event, n)
	for i := range evs {
		evs[i] = wire.Event{TimestampMS: int64(first + i), Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(first + i), Data: json.RawMessage(`{}`)}
	}
	return evs
}
