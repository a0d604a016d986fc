package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// testSealer places receipts with a stand-in signature naming the place.
type testSealer struct{}

func (testSealer) Seal(r *wire.Receipt, prevSequence int64, prevID string) ([]byte, error) {
	r.Sequence, r.Prev, r.Signature = prevSequence+1, nil, fmt.Sprint("sig-", prevSequence+1)
	if prevID != "" {
		r.Prev = &prevID
	}
	return json.Marshal(r)
}

// write runs fn in a write transaction and returns its error.
func write(db *store.DB, fn func(ctx context.Context, tx *store.Tx) error) error {
	ctx := context.Background()
	return db.WithTx(ctx, func(tx *store.Tx) error { return fn(ctx, tx) })
}

// TestLogAppendsContiguous: concurrent requests from two handles on one
// database (two hosts) append events and receipts; a third of them roll
// back. The log is numbered 1..n without a gap, every receipt links to the
// one placed before it, and each request's receipt is placed and sealed by
// the time its write returns, whichever handle's sequencer placed it.
func TestLogAppendsContiguous(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		db, location := storetest.MustCreate(t)
		db.SetSealer(testSealer{})
		other := storetest.MustOpen(t, location)
		other.SetSealer(testSealer{})
		var wg sync.WaitGroup
		errs := make(chan error, 30)
		for i := range 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var placed *wire.Receipt
				err := write([]*store.DB{db, other}[i%2], func(ctx context.Context, tx *store.Tx) error {
					if err := tx.AppendEvent(wire.Event{TimestampMS: 1, Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i),
						Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}); err != nil {
						return err
					}
					var err error
					if placed, err = tx.AppendReceipt(wire.Receipt{ID: fmt.Sprint("rcpt-", i), ReceiptBody: wire.ReceiptBody{OperationID: "op-1"}}); err != nil {
						return err
					}
					if i%3 == 0 {
						return fmt.Errorf("roll back request %d", i)
					}
					return nil
				})
				switch {
				case i%3 == 0 && err == nil:
					errs <- fmt.Errorf("request %d committed", i)
				case i%3 != 0 && err != nil:
					errs <- err
				case i%3 != 0 && (placed.Sequence == 0 || placed.Signature != fmt.Sprint("sig-", placed.Sequence)):
					errs <- fmt.Errorf("request %d's receipt was answered unplaced: %+v", i, *placed)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			count, last, err := tx.EventHead(ctx)
			if err != nil || count != 20 || last != 20 {
				t.Fatalf("event head %d/%d (%v)", count, last, err)
			}
			all := mustList(tx.ReceiptList(ctx, ""))
			if len(all) != 20 {
				t.Fatalf("%d receipts kept, want 20", len(all))
			}
			var prevID string
			for k, raw := range all {
				var r wire.Receipt
				if err := json.Unmarshal(raw, &r); err != nil {
					return err
				}
				if r.Sequence != int64(k+1) || (k == 0) != (r.Prev == nil) || (k > 0 && *r.Prev != prevID) {
					t.Fatalf("receipt %d: sequence %d, prev %v, want a link to %q", k, r.Sequence, r.Prev, prevID)
				}
				prevID = r.ID
			}
			p, err := tx.PendingLogList(ctx, 10)
			if err != nil || len(p.Events)+len(p.Receipts) != 0 || p.LastEvent != 20 || p.Head.Sequence != 20 || p.Head.ID != prevID {
				t.Fatalf("pending after the writes: %+v (%v)", p, err)
			}
			return nil
		})
		// Each placed entry was counted once, by the sequencer that placed
		// it, in rounds of one or more (several writers only).
		if a, b := db.Stats(), other.Stats(); db.Driver().Writers() > 1 {
			rounds, entries := a.SequencerRounds+b.SequencerRounds, a.SequencerEntries+b.SequencerEntries
			if entries != 40 || rounds < 1 || rounds > entries {
				t.Fatalf("sequencers counted %d entries in %d rounds, want 40 entries", entries, rounds)
			}
		} else if a.SequencerRounds != 0 || b.SequencerEntries != 0 {
			t.Fatalf("one writer counted sequencer rounds: %+v %+v", a, b)
		}
		// Only a prepared receipt can be appended.
		if err := write(db, func(ctx context.Context, tx *store.Tx) error {
			_, err := tx.AppendReceipt(wire.Receipt{ID: "x", ReceiptBody: wire.ReceiptBody{Sequence: 99}})
			return err
		}); err == nil {
			t.Fatal("a receipt already placed was appended")
		}
	})
}

func mustList(v [][]byte, err error) [][]byte {
	if err != nil {
		panic(err)
	}
	return v
}
