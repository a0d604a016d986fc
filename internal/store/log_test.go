package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

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

// TestUnlistedRoundPlacesNothingAhead: entries left pending by another
// process without a round (one that died between its commit and its
// round), appended before a request of a process that knows the log's
// head, are placed before that request's, in the same round: a request
// may have read what the other committed, so nothing of its is numbered
// ahead.
func TestUnlistedRoundPlacesNothingAhead(t *testing.T) {
	withSequencer(t, func(t *testing.T, db *store.DB, location string) {
		store.SetRecheck(db, time.Hour)
		appendOne := func(i int) error {
			return write(db, func(ctx context.Context, tx *store.Tx) error {
				return tx.AppendEvent(wire.Event{TimestampMS: 1, Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint("mine-", i), Data: json.RawMessage(`{}`)})
			})
		}
		// Until a round goes unlisted, the head is known and the listener's
		// first news is behind.
		for i := 0; db.Stats().SequencerUnlisted == 0; i++ {
			if i == 20 {
				t.Fatal("no round went unlisted in 20 requests")
			}
			if err := appendOne(i); err != nil {
				t.Fatal(err)
			}
		}
		// Another process's committed entry, which no round of its placed.
		other := storetest.MustOpen(t, location)
		ctx := context.Background()
		conn, err := other.Driver().BeginWrite(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.PendingLogInsert(ctx, []wire.Event{{TimestampMS: 1, Kind: wire.EventClaimed, Actor: "other", Title: "orphan",
			Data: json.RawMessage(`{}`)}}, nil); err != nil {
			t.Fatal(err)
		}
		if err := conn.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := appendOne(99); err != nil {
			t.Fatal(err)
		}
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			events := mustEvents(tx.EventList(ctx, 0, 100))
			n := len(events)
			if p, err := tx.PendingLogList(ctx, 10); err != nil || len(p.Events) != 0 {
				t.Fatalf("pending after the request was answered: %+v (%v)", p, err)
			}
			if n < 2 || events[n-2].Title != "orphan" || events[n-1].Title != "mine-99" {
				t.Fatalf("the last two events placed: %+v, want the orphan, then the request's", events[max(n-2, 0):])
			}
			for k, e := range events {
				if e.Sequence != int64(k+1) {
					t.Fatalf("event %d numbered %d", k, e.Sequence)
				}
			}
			return nil
		})
	})
}

// withSequencer runs fn, in parallel, on a fresh database of several
// writers (PostgreSQL), whose log a sequencer places, with the test
// sealer set; location opens another handle on it.
func withSequencer(t *testing.T, fn func(t *testing.T, db *store.DB, location string)) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs several writers (PostgreSQL); set " + storetest.EnvPostgres)
	}
	t.Parallel()
	t.Run(storetest.Postgres, func(t *testing.T) {
		db, location := storetest.MustCreate(t)
		db.SetSealer(testSealer{})
		fn(t, db, location)
	})
}

func mustList(v [][]byte, err error) [][]byte {
	if err != nil {
		panic(err)
	}
	return v
}

// TestBusyLogWaitsForNews: a host whose sequencer finds the log lock
// taken tries no round again until the holder's round is announced. Its
// requests that commit meanwhile cost no try each, and the announcement
// answers them all, their receipts sealed by the other host's round.
func TestBusyLogWaitsForNews(t *testing.T) {
	withSequencer(t, func(t *testing.T, db *store.DB, location string) {
		other := storetest.MustOpen(t, location)
		other.SetSealer(testSealer{})
		store.SetRecheck(db, time.Hour) // only the announcement may let it try again

		held, release, holder := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		var releaseOnce sync.Once
		letGo := func() { releaseOnce.Do(func() { close(release) }) }
		defer letGo() // a failed test lets the holder end before the handles close
		go func() {
			holder <- write(other, func(ctx context.Context, tx *store.Tx) error {
				if ok, err := tx.TryLockLog(ctx); err != nil || !ok {
					return fmt.Errorf("take the log lock: %v, %v", ok, err)
				}
				close(held)
				<-release
				return tx.AppendEvent(wire.Event{TimestampMS: 1, Kind: wire.EventStarted, Actor: "h", Title: "holder", Data: json.RawMessage(`{}`)})
			})
		}()
		select {
		case <-held:
		case err := <-holder:
			t.Fatal(err)
		}

		const requests = 10
		receipts := make([]*wire.Receipt, requests)
		answered := make(chan error, requests)
		for i := range requests {
			go func() {
				answered <- write(db, func(ctx context.Context, tx *store.Tx) error {
					if err := tx.AppendEvent(wire.Event{TimestampMS: 1, Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i), Data: json.RawMessage(`{}`)}); err != nil {
						return err
					}
					var err error
					receipts[i], err = tx.AppendReceipt(wire.Receipt{ID: fmt.Sprint("rcpt-", i), ReceiptBody: wire.ReceiptBody{OperationID: "op-1"}})
					return err
				})
			}()
			// The next request commits only once this one has, so each
			// commit finds the sequencer idle, as requests spread in time do.
			waitPending(t, other, i+1)
		}
		// The sequencer runs behind the commits: its first try may land
		// after the last commit shows.
		for deadline := time.Now().Add(30 * time.Second); db.Stats().SequencerBusy == 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the sequencer never found the log lock taken")
			}
		}

		letGo()
		if err := <-holder; err != nil {
			t.Fatal(err)
		}
		for range requests {
			select {
			case err := <-answered:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("requests unanswered after the holder's round was announced")
			}
		}
		// Counted once all are answered: every try is over by then.
		if busy := db.Stats().SequencerBusy; busy > 2 {
			t.Fatalf("the sequencer found the log lock taken %d times for %d requests, want once (twice if its listener's first news came between)", busy, requests)
		}
		for i, r := range receipts {
			if r.Sequence == 0 || r.Signature != fmt.Sprint("sig-", r.Sequence) {
				t.Fatalf("request %d's receipt was answered unplaced: %+v", i, *r)
			}
		}
	})
}

// waitPending waits until n pending events are visible to db.
func waitPending(t *testing.T, db *store.DB, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var seen int
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			p, err := tx.PendingLogList(ctx, 100)
			seen = len(p.Events)
			return err
		})
		if seen == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pending events, want %d", seen, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestUnlistedRounds: a process whose own rounds are the only ones places
// its next requests' entries without listing what is pending, one round
// trip a round, and the log it leaves is the one a listing round would:
// numbered without a gap, each receipt linked to the one before.
func TestUnlistedRounds(t *testing.T) {
	withSequencer(t, func(t *testing.T, db *store.DB, _ string) {
		store.SetRecheck(db, time.Hour) // no look for want of news: only its listener's first news may list
		const requests = 8
		receipts := make([]*wire.Receipt, requests)
		oneTripRounds := 0 // requests answered in two round trips: their transaction's, their round's
		for i := range requests {
			before := db.Driver().RoundTrips()
			if err := write(db, func(ctx context.Context, tx *store.Tx) error {
				if err := tx.AppendEvent(wire.Event{TimestampMS: 1, Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i), Data: json.RawMessage(`{}`)}); err != nil {
					return err
				}
				var err error
				receipts[i], err = tx.AppendReceipt(wire.Receipt{ID: fmt.Sprint("rcpt-", i), ReceiptBody: wire.ReceiptBody{OperationID: "op-1"}})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if r := receipts[i]; r.Sequence != int64(i+1) || r.Signature != fmt.Sprint("sig-", i+1) || (i > 0) != (r.Prev != nil) ||
				(i > 0 && *r.Prev != fmt.Sprint("rcpt-", i-1)) {
				t.Fatalf("request %d's receipt: %+v", i, *r)
			}
			if db.Driver().RoundTrips()-before == 2 {
				oneTripRounds++
			}
		}
		// The first lists, and so may the one the listener's first news
		// comes during, however late a loaded machine connects it.
		if oneTripRounds < requests-2 {
			t.Fatalf("%d of %d requests took two round trips (their transaction, their round), want at least %d", oneTripRounds, requests, requests-2)
		}
		// The first round lists; so may one after the listener's first
		// news, which tells of rounds it may have missed while connecting.
		st := db.Stats()
		if st.SequencerRounds != requests || st.SequencerUnlisted < requests-2 {
			t.Fatalf("%d rounds, %d of them unlisted, for %d requests one after another: want %d, at least %d unlisted",
				st.SequencerRounds, st.SequencerUnlisted, requests, requests, requests-2)
		}
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			events := mustEvents(tx.EventList(ctx, 0, 100))
			for k, e := range events {
				if e.Sequence != int64(k+1) || e.Title != fmt.Sprint(k) {
					t.Fatalf("event %d: %+v", k, e)
				}
			}
			if p, err := tx.PendingLogList(ctx, 10); err != nil || len(events) != requests || len(p.Events)+len(p.Receipts) != 0 {
				t.Fatalf("%d events placed, pending %+v (%v)", len(events), p, err)
			}
			return nil
		})
	})
}

func mustEvents(v []wire.Event, err error) []wire.Event {
	if err != nil {
		panic(err)
	}
	return v
}
