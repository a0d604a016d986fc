package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

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
// batch's receipts are sealed while its events are written; a receipt
// that cannot be sealed fails the request, and neither its event nor its
// receipt is kept.
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
