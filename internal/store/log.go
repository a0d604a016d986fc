package store

import (
	"context"
	"errors"
	"fmt"
	"runtime"

	jsonv2 "github.com/go-json-experiment/json"
	"golang.org/x/sync/errgroup"

	"github.com/fleet/fleet/internal/wire"
)

// The event log and the receipt chain are numbered in commit order, by one
// sequencer, after the checks and writes of the request that appends to
// them are decided. A request's appends wait in a logBuffer until its
// transaction is about to commit, then:
//
//   - on a backend with one writer (SQLite) the committer is the sequencer:
//     it numbers, links and seals the batch's appends in the order the
//     requests made them (the receipts as each request settles,
//     signing.go) and writes them in the same transaction as everything
//     else (flushPlaced), two statements per batch;
//   - where several transactions commit at once (PostgreSQL, any number of
//     hosts) the appends are written unnumbered to the pending tables in
//     the request's transaction, with its commit (PendingCommitter), which
//     takes no shared lock;
//     the sequencer places what committed right after (sequencer.go), and
//     the request is answered once its entries are placed.
//
// Either way a request's entries commit with its changes or not at all, one
// that rolls back to its savepoint takes them with it, and nobody sees an
// event or receipt before every one numbered below it.

// ChainHead is the receipt chain's newest link: its sequence (0 when the
// chain is empty) and id.
type ChainHead struct {
	Sequence int64
	ID       string
}

// StoredReceipt is a signed receipt and the JSON it is stored as.
type StoredReceipt struct {
	Receipt wire.Receipt
	Stored  []byte
}

// Sealer places a prepared receipt after (prevSequence, prevID) in the
// chain and signs it (receipts.Kernel), returning the JSON to store.
type Sealer interface {
	Seal(r *wire.Receipt, prevSequence int64, prevID string) ([]byte, error)
}

type logBuffer struct {
	events   []wire.Event
	receipts []*wire.Receipt // prepared; sealed where they are placed

	pendingEvents, pendingReceipts []int64 // where they wait, once CommitPending wrote them

	signing settledSigning // one writer: the settled requests' receipts, being signed
}

type logMark struct{ events, receipts int }

func (l *logBuffer) mark() logMark { return logMark{len(l.events), len(l.receipts)} }

// rollback forgets what was appended since m.
func (l *logBuffer) rollback(m logMark) {
	l.events, l.receipts = l.events[:m.events], l.receipts[:m.receipts]
}

func (l *logBuffer) empty() bool { return len(l.events) == 0 && len(l.receipts) == 0 }

// flushPlaced numbers the events after the last committed one, has the
// receipts sealed after the chain's head (signSettled), and writes both.
// Only a backend with one writer calls it: nobody else appends.
func (l *logBuffer) flushPlaced(ctx context.Context, conn Conn, sealer Sealer) error {
	if l.empty() {
		return nil
	}
	// Every request has settled: whatever is not yet being signed starts.
	if err := l.signSettled(ctx, conn, sealer); err != nil {
		return err
	}
	events := make([]wire.Event, len(l.events))
	copy(events, l.events)
	var last int64
	var err error
	if len(events) > 0 {
		if last, err = conn.EventLast(ctx); err != nil {
			return err
		}
	}
	for i := range events {
		events[i].Sequence = last + 1 + int64(i)
	}
	// The events are written while the last receipts are still being signed.
	err = conn.EventInsert(ctx, events)
	stored, sealErr := l.signing.wait()
	if err != nil {
		return err
	}
	if sealErr != nil {
		return sealErr
	}
	if err := conn.ReceiptInsert(ctx, stored); err != nil {
		return err
	}
	for i := range stored {
		*l.receipts[i] = stored[i].Receipt
	}
	return nil
}

// seal links and seals receipts after head, in the order given.
func seal(sealer Sealer, receipts []wire.Receipt, head ChainHead) ([]StoredReceipt, error) {
	if len(receipts) == 0 {
		return nil, nil
	}
	if sealer == nil {
		return nil, errors.New("receipts appended with no sealer set")
	}
	return sealAll(sealer, receipts, head)
}

// sealChunk is how many receipts one goroutine seals: a signature costs
// about 18 µs, so a chunk is worth a goroutine's start.
const sealChunk = 8

// sealAll seals each receipt after the one before it. A receipt's place is
// its predecessor's sequence and id, all known before any is signed, so the
// signatures (most of a placement's CPU) are made on every core rather than
// on the one writer's (SQLite) or sequencer's (PostgreSQL) serial path.
func sealAll(sealer Sealer, receipts []wire.Receipt, head ChainHead) ([]StoredReceipt, error) {
	after := make([]ChainHead, len(receipts))
	for i, link := 0, head; i < len(receipts); i++ {
		after[i] = link
		link = ChainHead{Sequence: link.Sequence + 1, ID: receipts[i].ID}
	}
	stored := make([]StoredReceipt, len(receipts))
	seal := func(from, to int) error {
		for i := from; i < to; i++ {
			r := receipts[i]
			data, err := sealer.Seal(&r, after[i].Sequence, after[i].ID)
			if err != nil {
				return err
			}
			stored[i] = StoredReceipt{Receipt: r, Stored: data}
		}
		return nil
	}
	if len(receipts) <= sealChunk {
		if err := seal(0, len(receipts)); err != nil {
			return nil, err
		}
		return stored, nil
	}
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for from := 0; from < len(receipts); from += sealChunk {
		g.Go(func() error { return seal(from, min(from+sealChunk, len(receipts))) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return stored, nil
}

// receiptValues copies the prepared receipts out (their pointers stay the
// waiter's, to fill in once placed).
func (l *logBuffer) receiptValues() []wire.Receipt {
	receipts := make([]wire.Receipt, len(l.receipts))
	for i, r := range l.receipts {
		receipts[i] = *r
	}
	return receipts
}

var errNoBatch = errors.New("log appends need a write transaction")

// AppendEvent adds e to the event log, numbered after every event placed
// before it.
func (tx *Tx) AppendEvent(e wire.Event) error {
	if tx.log == nil {
		return errNoBatch
	}
	tx.log.events = append(tx.log.events, e)
	return nil
}

// AppendReceipt adds r, prepared (its id set, no place or signature), to
// the receipt chain. The receipt it returns is r as placed and signed once
// WithTx has returned without error; until then only its id is final, which
// is what the transaction may write elsewhere.
func (tx *Tx) AppendReceipt(r wire.Receipt) (*wire.Receipt, error) {
	if tx.log == nil {
		return nil, errNoBatch
	}
	if r.ID == "" || r.Signature != "" || r.Sequence != 0 {
		return nil, fmt.Errorf("receipt %q is not a prepared receipt", r.ID)
	}
	placed := &r
	tx.log.receipts = append(tx.log.receipts, placed)
	return placed, nil
}

// PendingIDs are pending log entries' ids.
type PendingIDs struct {
	Events   []int64
	Receipts []int64
}

// PendingLeft is what PendingLogLeft found.
type PendingLeft struct {
	PendingIDs          // still pending
	Placed     [][]byte // the receipts asked for that are placed, as stored
}

// PendingLogPlaceParams is one sequencer round's writes.
type PendingLogPlaceParams struct {
	// FirstEvent is the sequence the first of Placed.Events takes; the
	// others follow in the order they were appended. The backend copies
	// the events from where they wait: the host never reads them back.
	FirstEvent int64
	Receipts   []StoredReceipt
	Placed     PendingIDs // the pending entries placed
}

// PendingLog is what waits for the sequencer, and where the log it will
// be placed after ends.
type PendingLog struct {
	Events    []int64 // the pending events' ids, in the order they were appended
	Receipts  []PendingReceipt
	LastEvent int64     // the newest placed event's sequence (0 when none)
	Head      ChainHead // the receipt chain's newest link
}

// PendingReceipt is a prepared receipt waiting for its place in the chain.
type PendingReceipt struct {
	Pending int64
	Receipt wire.Receipt
}

// DecodeReceipt reads a receipt as the host wrote it (json.Marshal of a
// wire.Receipt: pending, or placed and read back for another host's
// request) with the faster decoder, about 2 µs where encoding/json took
// 5, twice a job on PostgreSQL's sequencer. Member names are matched
// exactly, as the host wrote them. Receipts from outside (an export being
// verified) go through receipts.Decode.
func DecodeReceipt(b []byte) (wire.Receipt, error) {
	var r wire.Receipt
	err := jsonv2.Unmarshal(b, &r)
	return r, err
}
