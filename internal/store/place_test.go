package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// placeable is n prepared receipts, as a batch's requests append them.
func placeable(t testing.TB, kernel *receipts.Kernel, n int) []wire.Receipt {
	out := make([]wire.Receipt, n)
	for i := range out {
		out[i] = kernel.Prepare(receipts.Draft{Kind: wire.KindAdmission, OperationID: fmt.Sprint("op-", i), Decision: wire.DecisionAllow}, int64(1000+i))
		if out[i].ID == "" {
			t.Fatalf("receipt %d prepared without an id", i)
		}
	}
	return out
}

// TestPlaceSealsInChainOrder: a placement of many receipts stores exactly
// what sealing them one after another would, each linked to the one
// before it and signed by the host's key, whatever order the signatures
// are made in.
func TestPlaceSealsInChainOrder(t *testing.T) {
	t.Parallel()
	kernel, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 7, 8, 9, 100} {
		prepared := placeable(t, kernel, n)
		head := store.ChainHead{Sequence: 41, ID: "rcpt-head"}
		stored, err := store.Seal(kernel, append([]wire.Receipt(nil), prepared...), head)
		if err != nil {
			t.Fatal(err)
		}
		if len(stored) != n {
			t.Fatalf("%d receipts placed as %d", n, len(stored))
		}
		seq, prev := head.Sequence, head.ID
		for i, r := range prepared {
			want, err := kernel.Seal(&r, seq, prev)
			if err != nil {
				t.Fatal(err)
			}
			if got := stored[i]; string(got.Stored) != string(want) || got.Receipt.Sequence != seq+1 {
				t.Fatalf("of %d, receipt %d stored as\n%s\nwant (sealed after %d, %s)\n%s", n, i, got.Stored, seq, prev, want)
			}
			if err := receipts.Verify(stored[i].Receipt, kernel.PublicKey); err != nil {
				t.Fatalf("of %d, receipt %d: %v", n, i, err)
			}
			seq, prev = r.Sequence, r.ID
		}
	}
}

// failingSealer refuses to seal one receipt.
type failingSealer struct{ refuse string }

func (f failingSealer) Seal(r *wire.Receipt, prevSequence int64, prevID string) ([]byte, error) {
	if r.ID == f.refuse {
		return nil, errors.New("cannot seal " + r.ID)
	}
	return testSealer{}.Seal(r, prevSequence, prevID)
}

// TestPlaceFailsWhenASealFails: one receipt that cannot be sealed fails the
// whole placement, wherever it is in the batch.
func TestPlaceFailsWhenASealFails(t *testing.T) {
	t.Parallel()
	kernel, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	prepared := placeable(t, kernel, 40)
	for _, at := range []int{0, 17, 39} {
		stored, err := store.Seal(failingSealer{refuse: prepared[at].ID}, append([]wire.Receipt(nil), prepared...), store.ChainHead{})
		if err == nil || stored != nil {
			t.Fatalf("refusing receipt %d: placed %d, error %v", at, len(stored), err)
		}
	}
}

// BenchmarkPlace: a batch's 64 receipts sealed for their place, the
// signatures most of it (go test -bench Place -cpu 1,2 ./internal/store).
func BenchmarkPlace(b *testing.B) {
	kernel, err := receipts.NewKernel()
	if err != nil {
		b.Fatal(err)
	}
	prepared := placeable(b, kernel, 64)
	batch := make([]wire.Receipt, len(prepared))
	for b.Loop() {
		copy(batch, prepared)
		if _, err := store.Seal(kernel, batch, store.ChainHead{Sequence: 1, ID: "rcpt-head"}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(prepared)), "ns/receipt")
}

// TestOneWriterCommitsNothingWhenASealFails: with one writer (SQLite) a
// request's receipts are sealed off the committer's path, once it has
// settled; a receipt that cannot be sealed still fails the request, and
// neither its event nor its receipt is kept.
func TestOneWriterCommitsNothingWhenASealFails(t *testing.T) {
	t.Parallel()
	db, _ := storetest.MustCreate(t)
	db.SetSealer(failingSealer{refuse: "rcpt-refused"})
	appendBoth := func(receiptID string) error {
		return write(db, func(ctx context.Context, tx *store.Tx) error {
			if err := tx.AppendEvent(wire.Event{TimestampMS: 1, Kind: wire.EventClaimed, Actor: "w", Title: receiptID, Data: json.RawMessage(`{}`)}); err != nil {
				return err
			}
			_, err := tx.AppendReceipt(wire.Receipt{ID: receiptID, ReceiptBody: wire.ReceiptBody{OperationID: "op-1"}})
			return err
		})
	}
	if err := appendBoth("rcpt-kept"); err != nil {
		t.Fatal(err)
	}
	if err := appendBoth("rcpt-refused"); err == nil || !strings.Contains(err.Error(), "cannot seal rcpt-refused") {
		t.Fatalf("a write whose receipt could not be sealed answered %v", err)
	}
	storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
		count, last, err := tx.EventHead(ctx)
		if err != nil || count != 1 || last != 1 {
			t.Fatalf("event head %d/%d (%v), want the first write's event alone", count, last, err)
		}
		if all := mustList(tx.ReceiptList(ctx, "")); len(all) != 1 || !strings.Contains(string(all[0]), "rcpt-kept") {
			t.Fatalf("receipts kept: %q", all)
		}
		return nil
	})
}

// TestOneWriterSignsSettledRequests: with one writer, each request's
// receipts are signed as soon as it settles, while the batch goes on. In
// one batch of requests, some of which fail after appending, the chain
// holds exactly the settled requests' receipts, contiguous, each linked to
// the one before it and signed by the kernel, and each request's receipts
// are answered as placed.
func TestOneWriterSignsSettledRequests(t *testing.T) {
	t.Parallel()
	kernel, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	db, _ := storetest.MustCreate(t)
	db.SetSealer(kernel)
	ctx := context.Background()
	appendTwo := func(tx *store.Tx, k int) ([]*wire.Receipt, error) {
		var placed []*wire.Receipt
		for j := range 2 {
			r, err := tx.AppendReceipt(kernel.Prepare(receipts.Draft{Kind: wire.KindAdmission, OperationID: fmt.Sprint("op-", k, "-", j), Decision: wire.DecisionAllow}, int64(k)))
			if err != nil {
				return nil, err
			}
			placed = append(placed, r)
		}
		return placed, tx.AppendEvent(wire.Event{TimestampMS: 1, Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(k), Data: json.RawMessage(`{}`)})
	}

	// A first request holds the committer until the others are queued, so
	// that they share the next batch.
	started, release := make(chan struct{}), make(chan struct{})
	blocked := make(chan error, 1)
	go func() {
		blocked <- db.WithTx(ctx, func(tx *store.Tx) error {
			if _, err := appendTwo(tx, 0); err != nil {
				return err
			}
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	const n = 12
	placed := make([][]*wire.Receipt, n+1)
	results := make([]error, n+1)
	var wg sync.WaitGroup
	for k := 1; k <= n; k++ {
		wg.Go(func() {
			results[k] = db.WithTx(ctx, func(tx *store.Tx) error {
				var err error
				if placed[k], err = appendTwo(tx, k); err != nil {
					return err
				}
				if k%4 == 1 {
					return fmt.Errorf("request %d fails after appending", k)
				}
				return nil
			})
		})
	}
	for deadline := time.Now().Add(time.Minute); store.QueuedWrites(db) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests queued", store.QueuedWrites(db), n)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if err := <-blocked; err != nil {
		t.Fatal(err)
	}
	if st := db.Stats(); st.Commits != 2 {
		t.Fatalf("%d commits, want the first request's and one for the %d queued", st.Commits, n)
	}

	kept := map[string]int64{} // each kept receipt's sequence
	storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
		var prevID string
		for i, raw := range mustList(tx.ReceiptList(ctx, "")) {
			var r wire.Receipt
			if err := json.Unmarshal(raw, &r); err != nil {
				return err
			}
			if r.Sequence != int64(i+1) || (i == 0) != (r.Prev == nil) || (i > 0 && *r.Prev != prevID) {
				t.Fatalf("receipt %d: sequence %d, prev %v, want a link to %q", i, r.Sequence, r.Prev, prevID)
			}
			if err := receipts.Verify(r, kernel.PublicKey); err != nil {
				t.Fatalf("receipt %d: %v", i, err)
			}
			kept[r.ID], prevID = r.Sequence, r.ID
		}
		return nil
	})
	settled := 1 // the first request
	for k := 1; k <= n; k++ {
		if (results[k] != nil) != (k%4 == 1) {
			t.Fatalf("request %d answered %v", k, results[k])
		}
		for j, r := range placed[k] {
			seq, ok := kept[r.ID]
			switch {
			case results[k] != nil && ok:
				t.Fatalf("request %d failed and its receipt %s was kept", k, r.ID)
			case results[k] == nil && (!ok || r.Sequence != seq || r.Signature == ""):
				t.Fatalf("request %d's receipt %s answered at %d, kept %v at %d", k, r.ID, r.Sequence, ok, seq)
			case results[k] == nil && j == 1 && seq != placed[k][0].Sequence+1:
				t.Fatalf("request %d's receipts are at %d and %d, not one after the other", k, placed[k][0].Sequence, seq)
			}
		}
		if results[k] == nil {
			settled++
		}
	}
	if len(kept) != 2*settled {
		t.Fatalf("%d receipts kept, want %d: two for each of the %d settled requests", len(kept), 2*settled, settled)
	}
}
