package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/fleet/fleet/internal/wire"
)

// A batch's appends to the event log and the receipt chain wait in a
// logBuffer until the batch is about to commit. Then they are numbered in
// the order the requests made them and written in one statement each,
// inside the same transaction as everything else the requests wrote: a
// request's events and receipts still commit with its changes or not at
// all, and one that rolls back to its savepoint takes them with it. What
// this saves is two statements per event and receipt on the serial path
// (the head read and the insert) for two per batch.

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

type logBuffer struct {
	events   []wire.Event
	receipts []StoredReceipt
	head     *ChainHead // the chain's head counting this batch's receipts; nil until read
}

type logMark struct {
	events, receipts int
	head             *ChainHead
}

func (l *logBuffer) mark() logMark {
	m := logMark{events: len(l.events), receipts: len(l.receipts)}
	if l.head != nil {
		h := *l.head
		m.head = &h
	}
	return m
}

// rollback forgets what was appended since m.
func (l *logBuffer) rollback(m logMark) {
	l.events, l.receipts, l.head = l.events[:m.events], l.receipts[:m.receipts], m.head
}

// flush numbers the events after the last committed one and writes them
// and the receipts. The batch holds the log lock, so nobody else appends.
func (l *logBuffer) flush(ctx context.Context, conn Conn) error {
	if len(l.events) > 0 {
		last, err := conn.EventLast(ctx)
		if err != nil {
			return err
		}
		for i := range l.events {
			l.events[i].Sequence = last + 1 + int64(i)
		}
		if err := conn.EventInsert(ctx, l.events); err != nil {
			return err
		}
	}
	if len(l.receipts) > 0 {
		return conn.ReceiptInsert(ctx, l.receipts)
	}
	return nil
}

var errNoBatch = errors.New("log appends need a write transaction")

// AppendEvent adds e to the event log, numbered after every event before
// it, when this transaction commits.
func (tx *Tx) AppendEvent(e wire.Event) error {
	if tx.log == nil {
		return errNoBatch
	}
	tx.log.events = append(tx.log.events, e)
	return nil
}

// ChainHead is the receipt chain's newest link, counting the receipts this
// batch has appended.
func (tx *Tx) ChainHead(ctx context.Context) (ChainHead, error) {
	if tx.log == nil {
		return ChainHead{}, errNoBatch
	}
	if tx.log.head == nil {
		seq, id, err := tx.ReceiptHead(ctx)
		if err != nil {
			return ChainHead{}, err
		}
		tx.log.head = &ChainHead{Sequence: seq, ID: id}
	}
	return *tx.log.head, nil
}

// AppendReceipt adds r, the link after ChainHead, to the receipt chain
// when this transaction commits.
func (tx *Tx) AppendReceipt(ctx context.Context, r wire.Receipt, stored []byte) error {
	head, err := tx.ChainHead(ctx)
	if err != nil {
		return err
	}
	prev := ""
	if r.Prev != nil {
		prev = *r.Prev
	}
	if r.Sequence != head.Sequence+1 || prev != head.ID {
		return fmt.Errorf("receipt %s at %d does not follow the chain's head %q at %d", r.ID, r.Sequence, head.ID, head.Sequence)
	}
	tx.log.receipts = append(tx.log.receipts, StoredReceipt{Receipt: r, Stored: stored})
	tx.log.head = &ChainHead{Sequence: r.Sequence, ID: r.ID}
	return nil
}
