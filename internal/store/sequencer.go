package store

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/fleet/fleet/internal/crash"
	"github.com/fleet/fleet/internal/wire"
)

// placeLimit bounds the entries one sequencing transaction places.
const placeLimit = 512

// The sequencer places committed log entries (pending_events,
// pending_receipts) in the order they became visible: under the log lock,
// in one short transaction, it numbers the events after the log's head,
// links and seals the receipts after the chain's head, writes them where
// readers look and deletes them from pending. One sequencer of one host
// runs at a time (the lock), and whichever runs places every host's
// entries; nobody's writes wait for it.
//
// A request that appended is answered only after a round that began after
// its commit has finished, so everything a client is told about is already
// in the log, numbered; a host that dies between commit and placing leaves
// pending entries that the next round of any host (or its own next start)
// places. An entry's number is never shown before the ones below it: they
// become visible in one commit, or earlier ones first.
type sequencer struct {
	db       *DB
	mu       sync.Mutex
	next     *round                   // the round new waiters join; it has not begun
	awaiting map[string]*wire.Receipt // receipts this process's requests wait for, by id
	kick     chan struct{}
	quit     chan struct{}
	stopped  chan struct{}
}

type round struct {
	done chan struct{}
	err  error
}

func newSequencer(db *DB) *sequencer {
	s := &sequencer{db: db, awaiting: map[string]*wire.Receipt{}, kick: make(chan struct{}, 1),
		quit: make(chan struct{}), stopped: make(chan struct{})}
	go s.run()
	return s
}

// await waits for a round that begins after it is called (so after the
// caller's commit) and fills in the caller's receipts as placed.
func (s *sequencer) await(ctx context.Context, receipts []*wire.Receipt) error {
	s.mu.Lock()
	for _, r := range receipts {
		s.awaiting[r.ID] = r
	}
	if s.next == nil {
		s.next = &round{done: make(chan struct{})}
	}
	rd := s.next
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	<-rd.done

	s.mu.Lock()
	var elsewhere []*wire.Receipt
	for _, r := range receipts {
		delete(s.awaiting, r.ID)
		if r.Signature == "" {
			elsewhere = append(elsewhere, r)
		}
	}
	s.mu.Unlock()
	if rd.err != nil {
		return rd.err
	}
	// Another host's sequencer placed these: read them as it stored them.
	for _, r := range elsewhere {
		err := s.db.Read(ctx, func(tx *Tx) error {
			stored, err := tx.ReceiptGet(ctx, r.ID)
			if err != nil {
				return fmt.Errorf("read placed receipt %s: %w", r.ID, err)
			}
			return decodeReceipt(stored, r)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *sequencer) run() {
	defer close(s.stopped)
	for {
		select {
		case <-s.kick:
		case <-s.quit:
			return
		}
		s.mu.Lock()
		rd := s.next
		s.next = nil
		s.mu.Unlock()
		if rd == nil {
			continue
		}
		rd.err = s.placeAll()
		close(rd.done)
	}
}

func (s *sequencer) stop() {
	close(s.quit)
	<-s.stopped
}

// placeAll places every pending entry, a transaction per placeLimit.
func (s *sequencer) placeAll() error {
	for attempt := 1; ; {
		n, err := s.placeSome(context.Background())
		switch {
		case err != nil && s.db.driver.Retryable(err) && attempt < maxAttempts:
			attempt++
			time.Sleep(time.Millisecond)
		case err != nil:
			return s.db.driver.Classify(fmt.Errorf("place the log: %w", err))
		case n < placeLimit:
			return nil
		}
	}
}

func (s *sequencer) placeSome(ctx context.Context) (int, error) {
	conn, err := s.db.driver.BeginWrite(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Rollback()
	if err := conn.LockLog(ctx); err != nil {
		return 0, err
	}
	pending, err := conn.PendingLogList(ctx, placeLimit)
	if err != nil || len(pending.Events)+len(pending.Receipts) == 0 {
		return 0, err
	}
	events := make([]wire.Event, len(pending.Events))
	eventIDs := make([]int64, len(pending.Events))
	for i, p := range pending.Events {
		events[i], eventIDs[i] = p.Event, p.Pending
	}
	receipts := make([]wire.Receipt, len(pending.Receipts))
	receiptIDs := make([]int64, len(pending.Receipts))
	for i, p := range pending.Receipts {
		receipts[i], receiptIDs[i] = p.Receipt, p.Pending
	}
	stored, err := place(s.db.sealer(), events, receipts, pending.LastEvent, pending.Head)
	if err != nil {
		return 0, err
	}
	if err := conn.PendingLogPlace(ctx, events, stored, eventIDs, receiptIDs); err != nil {
		return 0, err
	}
	crash.At("sequence.before-commit")
	if err := conn.Commit(); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	crash.At("sequence.after-commit")
	s.mu.Lock()
	for _, st := range stored {
		if r := s.awaiting[st.Receipt.ID]; r != nil {
			*r = st.Receipt
		}
	}
	s.mu.Unlock()
	return max(len(events), len(receipts)), nil
}

// PlacePending places log entries left pending by a host that died between
// a commit and its sequencer's round; a host runs it as it starts. With one
// writer there are never any.
func (db *DB) PlacePending(ctx context.Context) error {
	if db.seq == nil {
		return nil
	}
	return db.seq.await(ctx, nil)
}

func decodeReceipt(stored []byte, into *wire.Receipt) error {
	if err := json.Unmarshal(stored, into); err != nil {
		return fmt.Errorf("decode receipt: %w", err)
	}
	return nil
}
