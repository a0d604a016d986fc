package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/fleet/fleet/internal/wire"
)

// Where the backend lets several transactions write at once (PostgreSQL),
// each WithTx is its own transaction: no batch, no savepoints, and nothing
// held but the rows the request locks. Hosts then write concurrently: the
// one thing every write used to share, the contiguous log, is appended to
// unnumbered and placed by the sequencer after commit (sequencer.go).

type concurrent struct {
	mu       sync.RWMutex
	closed   bool
	inflight sync.WaitGroup
}

// runConcurrent runs fn in its own transaction once a writer slot is free,
// again from the start if it loses a race to another transaction, and
// returns once what it appended to the log is placed.
func (db *DB) runConcurrent(ctx context.Context, fn func(tx *Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, TxDeadline)
	defer cancel()
	db.cc.mu.RLock()
	if db.cc.closed {
		db.cc.mu.RUnlock()
		return fmt.Errorf("write transaction: %w", ErrClosed)
	}
	db.cc.inflight.Add(1)
	db.cc.mu.RUnlock()
	defer db.cc.inflight.Done()

	var w *waiter
	var err error
	urgent := ctx.Value(urgentKey{}) != nil
	if !urgent {
		db.writers <- true
	}
	for attempt := 1; ; attempt++ {
		var rerun bool
		w, err, rerun = db.tryOne(ctx, fn)
		if !rerun || attempt == maxAttempts {
			break
		}
		// A deadlock or a unique key another host took: this transaction
		// rolled back whole; run it again deciding afresh.
		db.retries.Add(1)
		time.Sleep(time.Duration(rand.IntN(1+2*attempt)) * time.Millisecond)
	}
	if !urgent {
		<-db.writers
	}
	if err != nil {
		return db.driver.Classify(err)
	}
	if w == nil {
		return nil
	}
	return db.seq.await(w)
}

// tryOne runs fn in one transaction; w, when fn appended to the log, is
// what to wait on for it to be placed; rerun reports a lost race.
func (db *DB) tryOne(ctx context.Context, fn func(tx *Tx) error) (w *waiter, err error, rerun bool) {
	conn, err := db.driver.BeginWrite(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin transaction: %w", err), false
	}
	defer conn.Rollback()
	log := &logBuffer{}
	if err := runGuarded(ctx, &Tx{Executor: conn, Now: db.Now(), log: log}, fn); err != nil {
		return nil, err, db.driver.Retryable(err)
	}
	commit := conn.Commit
	if !log.empty() {
		pc, ok := conn.(PendingCommitter)
		if !ok {
			return nil, fmt.Errorf("write the log: a backend with several writers must commit its pending log (store.PendingCommitter)"), false
		}
		commit = func() error {
			return pc.CommitPending(ctx, log.events, log.receiptValues(), func(eventIDs, receiptIDs []int64) {
				log.pendingEvents, log.pendingReceipts = eventIDs, receiptIDs
				w = db.seq.register(log)
			})
		}
	}
	started := time.Now()
	if err := commit(); err != nil {
		if w != nil {
			db.seq.forget(log)
		}
		return nil, fmt.Errorf("commit: %w", err), db.driver.Retryable(err)
	}
	db.commits.Add(1)
	if db.OnCommit != nil {
		db.OnCommit(1, time.Since(started))
	}
	return w, nil, false
}

// PendingCommitter is a Conn that writes a transaction's pending log in
// the same round trip as its commit (PostgreSQL's pipeline); every write
// Conn of a backend with several writers is one. pending gets
// the entries' ids before the commit's outcome is known; the request
// registers with the sequencer then, and if a round placed them in the
// moment between, the sequencer finds them placed when it next looks.
type PendingCommitter interface {
	CommitPending(ctx context.Context, events []wire.Event, receipts []wire.Receipt, pending func(eventIDs, receiptIDs []int64)) error
}

// stopConcurrent refuses new writes, waits for those in flight, then stops
// the sequencer.
func (db *DB) stopConcurrent() {
	db.cc.mu.Lock()
	db.cc.closed = true
	db.cc.mu.Unlock()
	db.cc.inflight.Wait()
	db.seq.stop()
}

// TxDeadline bounds one write transaction on a backend with several
// writers, its reruns included. Past it the transaction is abandoned (its
// connection closed, so the server rolls back whatever it had not
// committed) and the request answered unavailable: a host whose link to
// its database froze answers, rather than waiting for TCP to give up. A
// commit under way when the deadline passed may have taken effect, which
// the answer says; every worker call is answered again when repeated.
const TxDeadline = 15 * time.Second

type urgentKey struct{}

// Urgent marks a write the host's own liveness rests on (its renewal): on
// a backend with several writers it does not queue for a writer slot
// behind requests that may be waiting out a sick peer's locks. It still
// takes a connection, which the pool keeps beyond the slots.
func Urgent(ctx context.Context) context.Context { return context.WithValue(ctx, urgentKey{}, true) }
