package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleet/fleet/internal/crash"
	"github.com/fleet/fleet/internal/wire"
)

// placeLimit bounds the entries one sequencing transaction places.
const placeLimit = 512

// recheck is how long a waiting sequencer goes without news before it
// looks again: a backstop for a lost notification (or a lock holder that
// died), not the usual path.
const recheck = 50 * time.Millisecond

// The sequencer places committed log entries (pending_events,
// pending_receipts) once they are visible: under the log lock,
// in one short transaction, it numbers the events after the log's head,
// links and seals the receipts after the chain's head, writes them where
// readers look and deletes them from pending. One round of one process
// runs at a time (the lock), and whichever runs places every process's
// entries; nobody's writes wait for it.
//
// A request that appended is answered only once its entries are placed, by
// this process's round or, as another process announces when its round
// commits (Driver.Placed), by that one: so everything a client is told
// about is already in the log, numbered. A process that finds the lock
// taken does not queue behind it; it waits for the announcement and looks,
// and tries no round until then: its requests that commit meanwhile are
// placed by the round that follows the news (each would otherwise have
// tried once more, a transaction and two round trips each, only to find
// the lock still taken). Every round announces its end, an empty one too.
// A host that dies between commit and placing leaves pending entries that
// the next listing round of any host (or its own next start) places. A
// process that knows where the log ends, since its own last round left
// it there and placed everything pending, places its own requests'
// entries without listing (placeKnown) until another process announces a
// round. Such a round places nothing while another entry is pending
// before them, so the entries a dead host left are listed and placed by
// the next round after them of any host that places. An entry's
// number is never shown before the ones below it: they become visible in
// one commit, or earlier ones first.
type sequencer struct {
	db *DB

	mu        sync.Mutex
	byEvent   map[int64]*waiter // pending event id → its request
	byReceipt map[int64]*waiter
	forced    []*waiter // wait for one whole round (PlacePending)

	kick    chan struct{}
	quit    chan struct{}
	stopped chan struct{}

	recheck atomic.Int64 // nanoseconds; tests lengthen it

	// known is where the placed log ends as this process's last round
	// left it, while no other process is known to have placed since (nil
	// when unknown). Then a round places this process's committed entries
	// without listing what is pending (placeKnown), guarded in its
	// transaction. Only the run goroutine touches it.
	known *logHead
}

// logHead is where the placed log ends.
type logHead struct {
	lastEvent int64
	chain     ChainHead
}

// waiter is one committed request whose entries are not yet known placed.
type waiter struct {
	committed bool                     // until then its ids are invisible to others, not placed
	left      int                      // of its pending ids
	receipts  map[string]*wire.Receipt // to fill in as placed, by id
	done      chan error

	// Its entries as appended, for a round that places them unlisted.
	events, receiptIDs []int64
	ordered            []*wire.Receipt // in receiptIDs' order
}

func newSequencer(db *DB) *sequencer {
	s := &sequencer{db: db, byEvent: map[int64]*waiter{}, byReceipt: map[int64]*waiter{},
		kick: make(chan struct{}, 1), quit: make(chan struct{}), stopped: make(chan struct{})}
	s.recheck.Store(int64(recheck))
	go s.run()
	return s
}

// register records a request's pending entries before its transaction
// commits, so that whichever round places them, this process's or
// another's, answers it; forget undoes it when the commit fails.
func (s *sequencer) register(log *logBuffer) *waiter {
	w := &waiter{receipts: map[string]*wire.Receipt{}, done: make(chan error, 1),
		events: log.pendingEvents, receiptIDs: log.pendingReceipts, ordered: log.receipts}
	for _, r := range log.receipts {
		w.receipts[r.ID] = r
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range log.pendingEvents {
		s.byEvent[id] = w
	}
	for _, id := range log.pendingReceipts {
		s.byReceipt[id] = w
	}
	w.left = len(log.pendingEvents) + len(log.pendingReceipts)
	return w
}

func (s *sequencer) forget(log *logBuffer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range log.pendingEvents {
		delete(s.byEvent, id)
	}
	for _, id := range log.pendingReceipts {
		delete(s.byReceipt, id)
	}
}

// await returns once w's entries are placed, its receipts filled in. Its
// transaction has committed.
func (s *sequencer) await(w *waiter) error {
	s.mu.Lock()
	w.committed = true
	s.mu.Unlock()
	s.poke()
	return <-w.done
}

func (s *sequencer) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *sequencer) waiting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byEvent)+len(s.byReceipt)+len(s.forced) > 0
}

func (s *sequencer) run() {
	defer close(s.stopped)
	placed := s.db.driver.Placed()
	news := false // another process placed entries since we last looked
	busy := false // our last try found the log lock taken
	for {
		var timeout <-chan time.Time
		if s.waiting() {
			timeout = time.After(time.Duration(s.recheck.Load()))
		}
		select {
		case <-s.kick:
		case <-placed:
			news, s.known = true, nil
		case <-timeout:
			news, s.known = true, nil
		case <-s.quit:
			s.fail(ErrClosed)
			return
		}
		if news {
			busy = false
		}
		if busy {
			continue // the holder's round announces its end: try then
		}
		for idle := false; s.waiting(); {
			if news {
				news = false
				if err := s.lookElsewhere(); err != nil {
					s.fail(err)
					break
				}
				if !s.waiting() {
					break
				}
			}
			ran, n, err := s.round()
			if err != nil {
				s.fail(err)
				break
			}
			if !ran {
				busy = true // another process holds the lock: wait for its news
				break
			}
			if n > 0 {
				idle = false
				continue
			}
			// Nothing pending: what is awaited was placed by another
			// process (look once), or is not committed yet (its await
			// pokes when it is).
			if idle {
				break
			}
			idle, news = true, true
		}
	}
}

func (s *sequencer) stop() {
	close(s.quit)
	<-s.stopped
}

// fail answers every waiter with err (their transactions committed; their
// entries stay pending for a later round).
func (s *sequencer) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[*waiter]bool{}
	for _, m := range []map[int64]*waiter{s.byEvent, s.byReceipt} {
		for id, w := range m {
			delete(m, id)
			if !seen[w] {
				seen[w] = true
				w.done <- err
			}
		}
	}
	for _, w := range s.forced {
		w.done <- err
	}
	s.forced = nil
}

// round runs sequencing transactions while there is more to place; ran is
// false when another process held the log lock; placed counts entries.
func (s *sequencer) round() (ran bool, placed int, err error) {
	if s.known != nil {
		// Whatever failed it (most often another process that took the
		// lock or placed since: ErrGuard), a listing round places what is
		// pending, and finds what the failed one may have placed at its
		// commit placed, as another process's.
		n, ok, err := s.placeKnown(context.Background())
		if err == nil && ok {
			return true, n, nil
		}
		if err != nil {
			s.known = nil
		}
	}
	for attempt := 1; ; {
		n, ran, err := s.placeSome(context.Background())
		placed += n
		switch {
		case err != nil && s.db.driver.Retryable(err) && attempt < maxAttempts:
			attempt++
			time.Sleep(time.Millisecond)
			continue
		case err != nil:
			return false, placed, s.db.driver.Classify(fmt.Errorf("place the log: %w", err))
		case !ran:
			return false, placed, nil
		case n == placeLimit:
			continue
		}
		s.mu.Lock()
		for _, w := range s.forced {
			w.done <- nil
		}
		s.forced = nil
		s.mu.Unlock()
		return true, placed, nil
	}
}

func (s *sequencer) placeSome(ctx context.Context) (n int, ran bool, err error) {
	conn, err := s.db.driver.BeginWrite(ctx)
	if err != nil {
		return 0, false, err
	}
	defer conn.Rollback()
	s.known = nil
	if ok, err := conn.TryLockLog(ctx); err != nil || !ok {
		if err == nil {
			s.db.seqBusy.Add(1)
		}
		return 0, false, err
	}
	pending, err := conn.PendingLogList(ctx, placeLimit)
	if err != nil {
		return 0, true, err
	}
	if len(pending.Events)+len(pending.Receipts) == 0 {
		// Announced all the same, so that a process that found the lock
		// taken while this round held it tries at once, not at its recheck.
		if err := conn.PendingLogPlace(ctx, &PendingLogPlaceParams{}); err != nil {
			return 0, true, err
		}
		if err := conn.Commit(); err != nil {
			return 0, true, err
		}
		s.known = &logHead{pending.LastEvent, pending.Head}
		return 0, true, nil
	}
	receipts := make([]wire.Receipt, len(pending.Receipts))
	receiptIDs := make([]int64, len(pending.Receipts))
	for i, p := range pending.Receipts {
		receipts[i], receiptIDs[i] = p.Receipt, p.Pending
	}
	stored, err := seal(s.db.sealer(), receipts, pending.Head)
	if err != nil {
		return 0, true, err
	}
	eventIDs := pending.Events
	if err := conn.PendingLogPlace(ctx, &PendingLogPlaceParams{FirstEvent: pending.LastEvent + 1, Receipts: stored,
		Placed: PendingIDs{Events: eventIDs, Receipts: receiptIDs}}); err != nil {
		return 0, true, err
	}
	crash.At("sequence.before-commit")
	if err := conn.Commit(); err != nil {
		return 0, true, fmt.Errorf("commit: %w", err)
	}
	crash.At("sequence.after-commit")
	// The next round places unlisted only if this one placed everything
	// pending, all of it this process's: where other processes append,
	// they place too, and an unlisted round would mostly find the lock
	// taken or the log moved on.
	mine := s.placed(eventIDs, receiptIDs, stored)
	if mine == len(eventIDs)+len(receiptIDs) && len(eventIDs) < placeLimit && len(receipts) < placeLimit {
		s.known = headAfter(pending.LastEvent, pending.Head, len(eventIDs), stored)
	}
	return max(len(eventIDs), len(receipts)), true, nil
}

// headAfter is where the log ends once a round placed events after
// lastEvent and stored after head.
func headAfter(lastEvent int64, head ChainHead, events int, stored []StoredReceipt) *logHead {
	if n := len(stored); n > 0 {
		head = ChainHead{Sequence: stored[n-1].Receipt.Sequence, ID: stored[n-1].Receipt.ID}
	}
	return &logHead{lastEvent + int64(events), head}
}

// placeKnown places the entries of this process's committed requests,
// where known says the log ends, without listing what is pending: one
// round trip, whose guards (PendingLogExpect) fail it with ErrGuard if
// another process holds the lock or placed since. ok is false when it
// had nothing it could place that way (a request partly placed, or more
// than a round takes): a listing round does it.
func (s *sequencer) placeKnown(ctx context.Context) (n int, ok bool, err error) {
	var placed PendingIDs
	var receipts []wire.Receipt
	s.mu.Lock()
	if len(s.forced) > 0 {
		s.mu.Unlock()
		return 0, false, nil
	}
	var mine []*waiter
	seen := map[*waiter]bool{}
	for _, m := range []map[int64]*waiter{s.byEvent, s.byReceipt} {
		for _, w := range m {
			if !w.committed || seen[w] {
				continue
			}
			seen[w] = true
			if w.left != len(w.events)+len(w.receiptIDs) {
				s.mu.Unlock()
				return 0, false, nil
			}
			mine = append(mine, w)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(mine, func(a, b *waiter) int { return cmp.Compare(a.firstID(), b.firstID()) })
	for _, w := range mine {
		placed.Events = append(placed.Events, w.events...)
		placed.Receipts = append(placed.Receipts, w.receiptIDs...)
		for _, r := range w.ordered {
			receipts = append(receipts, *r)
		}
	}
	if len(mine) == 0 || len(placed.Events) >= placeLimit || len(placed.Receipts) >= placeLimit {
		return 0, false, nil
	}
	head := s.known
	stored, err := seal(s.db.sealer(), receipts, head.chain)
	if err != nil {
		return 0, false, err
	}
	conn, err := s.db.driver.BeginWrite(ctx)
	if err != nil {
		return 0, false, err
	}
	defer conn.Rollback()
	if err := conn.PendingLogExpect(ctx, head.lastEvent, head.chain, placed); err != nil {
		return 0, false, err
	}
	if err := conn.PendingLogPlace(ctx, &PendingLogPlaceParams{FirstEvent: head.lastEvent + 1, Receipts: stored,
		Placed: placed}); err != nil {
		return 0, false, err
	}
	crash.At("sequence.before-commit")
	if err := conn.Commit(); err != nil {
		return 0, false, fmt.Errorf("commit: %w", err)
	}
	crash.At("sequence.after-commit")
	s.db.seqUnlisted.Add(1)
	s.known = headAfter(head.lastEvent, head.chain, len(placed.Events), stored)
	s.placed(placed.Events, placed.Receipts, stored)
	return max(len(placed.Events), len(placed.Receipts)), true, nil
}

// firstID is the pending id of w's first entry: requests' entries sort by
// it in the order they were appended.
func (w *waiter) firstID() int64 {
	if len(w.events) > 0 {
		return w.events[0]
	}
	return w.receiptIDs[0]
}

// placed counts a committed round and answers the requests whose entries
// it placed; mine is how many of the entries were this process's.
func (s *sequencer) placed(eventIDs, receiptIDs []int64, stored []StoredReceipt) (mine int) {
	s.db.seqRounds.Add(1)
	s.db.seqEntries.Add(int64(len(eventIDs) + len(stored)))
	byID := make(map[string]wire.Receipt, len(stored))
	for _, st := range stored {
		byID[st.Receipt.ID] = st.Receipt
	}
	return s.settle(eventIDs, receiptIDs, func(w *waiter) error {
		for id, r := range w.receipts {
			placed, ok := byID[id]
			if !ok {
				return fmt.Errorf("receipt %s was placed in another round", id)
			}
			*r = placed
		}
		return nil
	})
}

// settle marks pending ids placed and answers each waiter whose ids are
// all placed, after fill has filled in its receipts. A waiter whose
// receipts were placed across rounds is filled from the database. mine
// counts the ids that were waited on here.
func (s *sequencer) settle(events, receipts []int64, fill func(w *waiter) error) (mine int) {
	var complete []*waiter
	s.mu.Lock()
	for _, pair := range []struct {
		m   map[int64]*waiter
		ids []int64
	}{{s.byEvent, events}, {s.byReceipt, receipts}} {
		for _, id := range pair.ids {
			if w := pair.m[id]; w != nil {
				mine++
				delete(pair.m, id)
				if w.left--; w.left == 0 {
					complete = append(complete, w)
				}
			}
		}
	}
	s.mu.Unlock()
	var fromDB []*waiter
	for _, w := range complete {
		if fill(w) != nil {
			fromDB = append(fromDB, w)
			continue
		}
		w.done <- nil
	}
	if len(fromDB) > 0 {
		err := s.fillFromDB(fromDB)
		for _, w := range fromDB {
			w.done <- err
		}
	}
	return mine
}

// lookElsewhere answers the waiters whose entries another process placed,
// in one read: which of their entries are left pending, and the placed
// receipts among theirs.
func (s *sequencer) lookElsewhere() error {
	s.mu.Lock()
	asked := map[*waiter]bool{}
	var receiptIDs []string
	ask := func(w *waiter) {
		if !asked[w] {
			asked[w] = true
			for id := range w.receipts {
				receiptIDs = append(receiptIDs, id)
			}
		}
	}
	events := make([]int64, 0, len(s.byEvent))
	for id, w := range s.byEvent {
		if w.committed {
			events = append(events, id)
			ask(w)
		}
	}
	receipts := make([]int64, 0, len(s.byReceipt))
	for id, w := range s.byReceipt {
		if w.committed {
			receipts = append(receipts, id)
			ask(w)
		}
	}
	s.mu.Unlock()
	if len(events)+len(receipts) == 0 {
		return nil
	}
	var left PendingLeft
	err := s.db.ReadOne(context.Background(), func(tx *Tx) (err error) {
		left, err = tx.PendingLogLeft(context.Background(), PendingIDs{Events: events, Receipts: receipts}, receiptIDs)
		return err
	})
	if err != nil {
		return err
	}
	placed := make(map[string]wire.Receipt, len(left.Placed))
	for _, raw := range left.Placed {
		r, err := DecodeReceipt(raw)
		if err != nil {
			return fmt.Errorf("decode receipt: %w", err)
		}
		placed[r.ID] = r
	}
	s.settle(without(events, left.Events), without(receipts, left.Receipts), func(w *waiter) error {
		for id, r := range w.receipts {
			p, ok := placed[id]
			if !ok {
				return errNotHere
			}
			*r = p
		}
		return nil
	})
	return nil
}

var errNotHere = fmt.Errorf("placed by another process")

// fillFromDB reads the placed receipts of waiters whose entries another
// process placed, in one read.
func (s *sequencer) fillFromDB(ws []*waiter) error {
	var ids []string
	for _, w := range ws {
		for id := range w.receipts {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	var stored [][]byte
	err := s.db.ReadOne(context.Background(), func(tx *Tx) (err error) {
		stored, err = tx.ReceiptGetMany(context.Background(), ids)
		return err
	})
	if err != nil {
		return err
	}
	byID := make(map[string]wire.Receipt, len(stored))
	for _, raw := range stored {
		r, err := DecodeReceipt(raw)
		if err != nil {
			return fmt.Errorf("decode receipt: %w", err)
		}
		byID[r.ID] = r
	}
	for _, w := range ws {
		for id, r := range w.receipts {
			placed, ok := byID[id]
			if !ok {
				return fmt.Errorf("receipt %s is neither pending nor placed", id)
			}
			*r = placed
		}
	}
	return nil
}

// without is ids minus drop.
func without(ids, drop []int64) []int64 {
	gone := make(map[int64]bool, len(drop))
	for _, id := range drop {
		gone[id] = true
	}
	out := ids[:0:0]
	for _, id := range ids {
		if !gone[id] {
			out = append(out, id)
		}
	}
	return out
}

// PlacePending places log entries left pending by a host that died between
// a commit and its sequencer's round; a host runs it as it starts. With one
// writer there are never any.
func (db *DB) PlacePending(ctx context.Context) error {
	if db.seq == nil {
		return nil
	}
	w := &waiter{done: make(chan error, 1)}
	db.seq.mu.Lock()
	db.seq.forced = append(db.seq.forced, w)
	db.seq.mu.Unlock()
	return db.seq.await(w)
}
