package store

import (
	"context"
	"sync"

	"github.com/fleet/fleet/internal/wire"
)

// settledSigning signs a one-writer batch's receipts while the batch goes
// on. The committer is the batch's serial path and a signature is most of
// a placement's CPU, so each request's receipts are handed to other cores
// as soon as the request settles: from then on nothing can take them back
// (a later request that fails rolls back only what it appended), and their
// places are known, since nobody but this writer appends.
type settledSigning struct {
	next   ChainHead // the link the next settled receipt follows, once handed > 0
	handed int       // receipts [0, handed) are being signed or are signed
	parts  []*signedPart
	wg     sync.WaitGroup
}

// signedPart is one settled run of receipts, signed by a goroutine of its
// own.
type signedPart struct {
	stored []StoredReceipt
	err    error
}

// signSettled starts signing the receipts appended since the last call,
// all of them settled: the caller's request has succeeded.
func (l *logBuffer) signSettled(ctx context.Context, conn Conn, sealer Sealer) error {
	sg := &l.signing
	if sg.handed == len(l.receipts) {
		return nil
	}
	if sg.handed == 0 {
		head, err := conn.ReceiptHead(ctx)
		if err != nil {
			return err
		}
		sg.next = head
	}
	receipts := make([]wire.Receipt, len(l.receipts)-sg.handed)
	for i, r := range l.receipts[sg.handed:] {
		receipts[i] = *r
	}
	after := sg.next
	sg.next = ChainHead{Sequence: after.Sequence + int64(len(receipts)), ID: receipts[len(receipts)-1].ID}
	sg.handed = len(l.receipts)
	part := &signedPart{}
	sg.parts = append(sg.parts, part)
	sg.wg.Go(func() { part.stored, part.err = seal(sealer, receipts, after) })
	return nil
}

// wait returns every settled receipt, signed, in chain order, once all are.
func (sg *settledSigning) wait() ([]StoredReceipt, error) {
	sg.wg.Wait()
	var stored []StoredReceipt
	for _, p := range sg.parts {
		if p.err != nil {
			return nil, p.err
		}
		stored = append(stored, p.stored...)
	}
	return stored, nil
}
