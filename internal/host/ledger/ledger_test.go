package ledger_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

func newLedger(t *testing.T) *ledger.Ledger {
	t.Helper()
	db, _ := storetest.MustCreate(t)
	kernel, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	db.SetSealer(kernel)
	return ledger.New(db, kernel)
}

func events(t *testing.T, l *ledger.Ledger) []wire.Event {
	t.Helper()
	var out []wire.Event
	storetest.Read(t, l.DB(), func(ctx context.Context, tx *store.Tx) (err error) {
		out, err = tx.EventList(ctx, 0, 100)
		return err
	})
	return out
}

// TestWrite: a write's event and receipt are placed when it returns, and
// whoever waits on Changed wakes after its commit; a write that fails
// commits nothing and wakes nobody.
func TestWrite(t *testing.T) {
	ctx := context.Background()
	l := newLedger(t)
	changed := l.Changed()
	receipt, err := ledger.Write(ctx, l, ledger.Named[*wire.Receipt]("test"), func(tx *store.Tx) (*wire.Receipt, error) {
		r, err := l.IssueReceipt(tx, receipts.Draft{Kind: wire.KindAdmission, OperationID: "op-1", Caller: "w", Decision: wire.DecisionAllow})
		if err != nil {
			return nil, err
		}
		return r, ledger.AppendEvent(ctx, tx, wire.EventAllowed, "w", "allowed", map[string]any{"operation_id": "op-1", "receipt_id": r.ID})
	})
	if err != nil || receipt.Sequence != 1 || receipt.Signature == "" {
		t.Fatalf("the write's receipt, once it returned: %+v (%v)", receipt, err)
	}
	select {
	case <-changed:
	default:
		t.Fatal("Changed was not closed by the commit")
	}
	if evs := events(t, l); len(evs) != 1 || evs[0].OperationID != "op-1" || evs[0].Kind != wire.EventAllowed {
		t.Fatalf("the log after the write: %+v", evs)
	}

	changed = l.Changed()
	refused := fleet.Errorf(wire.CodeStateConflict, "no")
	err = l.Record(ctx, "test", func(tx *store.Tx) error {
		if err := ledger.AppendEvent(ctx, tx, wire.EventClaimed, "w", "claimed", map[string]any{}); err != nil {
			return err
		}
		return refused
	})
	if !errors.Is(err, refused) {
		t.Fatalf("a refused write: %v", err)
	}
	select {
	case <-changed:
		t.Fatal("a write that failed woke the watchers")
	default:
	}
	if evs := events(t, l); len(evs) != 1 {
		t.Fatalf("a write that failed left %d events, want the 1 before it", len(evs))
	}
}

// TestBatch: each item's refusal is its own, its writes undone, and the
// other items commit in the batch's one transaction; an event about no
// job names none.
func TestBatch(t *testing.T) {
	ctx := context.Background()
	l := newLedger(t)
	answers, err := ledger.Batch(ctx, l, "test-batch", ledger.BatchReads{Ops: []string{"a", "b", "c"}},
		func(tx *store.Tx, i int) (int, error) {
			if err := ledger.AppendEvent(ctx, tx, wire.EventClaimed, "w", "item", map[string]any{"item": i}); err != nil {
				return 0, err
			}
			if i == 1 {
				return 0, fleet.Errorf(wire.CodeStaleClaim, "item 1 is refused")
			}
			return i * 10, nil
		})
	if err != nil || len(answers) != 3 || answers[0].Value != 0 || answers[2].Value != 20 ||
		answers[0].Err != nil || fleet.ErrorCode(answers[1].Err) != wire.CodeStaleClaim || answers[2].Err != nil {
		t.Fatalf("answers %+v (%v)", answers, err)
	}
	evs := events(t, l)
	if len(evs) != 2 || evs[0].OperationID != "" || string(evs[0].Data) != `{"item":0}` || string(evs[1].Data) != `{"item":2}` {
		t.Fatalf("the log after the batch: %+v", evs)
	}
}
