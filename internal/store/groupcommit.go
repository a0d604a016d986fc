package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// maxBatch bounds how many write requests share one commit, so one batch
// cannot hold the write lock for long.
const maxBatch = 256

// maxAttempts bounds reruns of one batch that keeps losing races to other
// hosts.
const maxAttempts = 20

// savepoints are the fixed savepoint names, so their statements are cached.
var savepoints = savepointNames("r", maxBatch)

// savepointNames are n savepoint names: prefix and a number.
func savepointNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// writeRequest is one WithTx call waiting for its batch.
type writeRequest struct {
	ctx  context.Context
	fn   func(tx *Tx) error
	done chan error
}

// committer runs write transactions with group commit: it takes every
// request waiting (up to maxBatch), runs each in its own savepoint inside one
// transaction, so a request that fails rolls back alone (ROLLBACK TO the
// failing request's savepoint undoes only what it wrote, since later ones
// have not begun), commits once (one sync for the whole batch), and only
// then answers the requests. Each request's checks and writes still happen
// in one transaction, and nothing is acknowledged before it is durable.
type committer struct {
	requests chan *writeRequest
	closeMu  sync.RWMutex
	closed   bool
	stopped  chan struct{}
}

func (db *DB) startCommitter() {
	db.gc = &committer{requests: make(chan *writeRequest, maxBatch), stopped: make(chan struct{})}
	go db.commitLoop()
}

func (db *DB) commitLoop() {
	defer close(db.gc.stopped)
	for first := range db.gc.requests {
		batch := []*writeRequest{first}
	drain:
		for len(batch) < maxBatch {
			select {
			case r, ok := <-db.gc.requests:
				if !ok {
					break drain
				}
				batch = append(batch, r)
			default:
				break drain
			}
		}
		db.runBatch(batch)
	}
}

// submit hands fn to the committer and waits for its batch to commit.
func (db *DB) submit(ctx context.Context, fn func(tx *Tx) error) error {
	db.gc.closeMu.RLock()
	defer db.gc.closeMu.RUnlock()
	if db.gc.closed {
		return fmt.Errorf("write transaction: %w", ErrClosed)
	}
	r := &writeRequest{ctx: ctx, fn: fn, done: make(chan error, 1)}
	db.gc.requests <- r
	return <-r.done
}

// stopCommitter waits for requests in flight, then stops the committer.
func (db *DB) stopCommitter() {
	db.gc.closeMu.Lock()
	if !db.gc.closed {
		db.gc.closed = true
		close(db.gc.requests)
	}
	db.gc.closeMu.Unlock()
	<-db.gc.stopped
}

func (db *DB) runBatch(batch []*writeRequest) {
	var errs []error
	var commitErr error
	for attempt := 1; ; attempt++ {
		var rerun bool
		errs, commitErr, rerun = db.tryBatch(batch)
		if !rerun || attempt == maxAttempts {
			break
		}
		// Another host's transaction won a deadlock or a unique key against
		// this batch. Its locks are gone with the rollback: run the whole
		// batch again, each request deciding afresh from what that host
		// committed. Rerunning only the losing request would keep the locks
		// its batch-mates took, and could lose the same deadlock forever.
		db.retries.Add(1)
		time.Sleep(time.Duration(rand.IntN(1+2*attempt)) * time.Millisecond)
	}
	for i, r := range batch {
		if commitErr != nil && errs[i] == nil {
			errs[i] = commitErr // nothing of the batch was committed
		}
		r.done <- errs[i]
	}
}

// tryBatch runs the batch in one transaction. rerun reports that a request
// lost a race to another host and the transaction was rolled back whole.
func (db *DB) tryBatch(batch []*writeRequest) (errs []error, commitErr error, rerun bool) {
	errs = make([]error, len(batch))
	classify := db.driver.Classify
	commitErr = func() error {
		ctx := context.Background()
		conn, err := db.driver.BeginWrite(ctx)
		if err != nil {
			return classify(fmt.Errorf("begin transaction: %w", err))
		}
		defer conn.Rollback()
		// The committer numbers the log itself (flushPlaced), which is only
		// right while nothing else appends: the log lock says so (a no-op on
		// a backend with one writer, the only kind that groups commits).
		if err := conn.LockLog(ctx); err != nil {
			if db.driver.Retryable(err) {
				rerun = true
				return nil
			}
			return classify(err)
		}
		log := &logBuffer{}
		defer log.signing.wg.Wait() // no signing outlives its batch
		sealer := db.sealer()
		for i, r := range batch {
			sp := savepoints[i]
			if err := conn.Savepoint(r.ctx, sp); err != nil {
				return classify(fmt.Errorf("savepoint: %w", err))
			}
			mark := log.mark()
			errs[i] = runGuarded(r.ctx, &Tx{Executor: conn, Now: db.Now(), log: log}, r.fn)
			if errs[i] != nil && db.driver.Retryable(errs[i]) {
				rerun = true
				return nil // the deferred rollback releases every lock
			}
			if errs[i] != nil {
				errs[i] = classify(errs[i])
				log.rollback(mark)
				if err := conn.RollbackTo(r.ctx, sp); err != nil {
					return classify(fmt.Errorf("roll back request: %w", err))
				}
			}
			if err := conn.Release(r.ctx, sp); err != nil {
				return classify(fmt.Errorf("release savepoint: %w", err))
			}
			if errs[i] != nil {
				continue
			}
			// The request has settled: its receipts can be signed meanwhile.
			if err := log.signSettled(ctx, conn, sealer); err != nil {
				if db.driver.Retryable(err) {
					rerun = true
					return nil
				}
				return classify(fmt.Errorf("write the log: %w", err))
			}
		}
		if err := log.flushPlaced(ctx, conn, sealer); err != nil {
			if db.driver.Retryable(err) {
				rerun = true
				return nil
			}
			return classify(fmt.Errorf("write the log: %w", err))
		}
		started := time.Now()
		if err := conn.Commit(); err != nil {
			return classify(fmt.Errorf("commit: %w", err))
		}
		db.commits.Add(1)
		if db.OnCommit != nil {
			db.OnCommit(len(batch), time.Since(started))
		}
		return nil
	}()
	return errs, commitErr, rerun
}

// runGuarded runs fn, turning a panic into this request's error so one bad
// request cannot take the committer (and every other writer) down, then
// writes what fn held (a batch's writes, held.go).
func runGuarded(ctx context.Context, tx *Tx, fn func(tx *Tx) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("write transaction panicked: %v", p)
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.WriteHeld(ctx)
}
