package store

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// maxBatch bounds how many write requests share one commit, so one batch
// cannot hold the write lock for long.
const maxBatch = 256

// savepoints are the fixed savepoint names, so their statements are cached.
var savepoints = func() []string {
	out := make([]string, maxBatch)
	for i := range out {
		out[i] = fmt.Sprintf("r%d", i)
	}
	return out
}()

// writeRequest is one WithTx call waiting for its batch.
type writeRequest struct {
	ctx  context.Context
	fn   func(tx *Tx) error
	done chan error
}

// committer runs write transactions with group commit: it takes every
// request waiting (up to maxBatch), runs each in its own SAVEPOINT inside one
// BEGIN IMMEDIATE transaction, so a request that fails rolls back alone
// (savepoints nest and are released together by the commit: ROLLBACK TO the
// failing request's savepoint undoes only what it wrote, since later ones
// have not begun),
// commits once (one WAL sync for the whole batch), and only then answers the
// requests. Each request's checks and writes still happen in one
// transaction, and nothing is acknowledged before it is durable.
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
		return fmt.Errorf("write transaction: the database is closed")
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
	errs := make([]error, len(batch))
	var missed []string
	commitErr := func() error {
		sqlTx, err := db.write.BeginTx(context.Background(), nil)
		if err != nil {
			return classify(fmt.Errorf("begin transaction: %w", err))
		}
		defer sqlTx.Rollback()
		shared := &Tx{Tx: sqlTx, db: db}
		for i, r := range batch {
			sp := savepoints[i]
			if _, err := shared.ExecContext(r.ctx, "SAVEPOINT "+sp); err != nil {
				return classify(fmt.Errorf("savepoint: %w", err))
			}
			tx := &Tx{Tx: sqlTx, Now: db.Now(), db: db, write: true}
			errs[i] = runGuarded(tx, r.fn)
			missed = append(missed, tx.missed...)
			if errs[i] != nil {
				errs[i] = classify(errs[i])
				if _, err := shared.ExecContext(r.ctx, "ROLLBACK TO "+sp); err != nil {
					return classify(fmt.Errorf("roll back request: %w", err))
				}
			}
		}
		started := time.Now()
		if err := sqlTx.Commit(); err != nil {
			return classify(fmt.Errorf("commit: %w", err))
		}
		db.commits.Add(1)
		if db.OnCommit != nil {
			db.OnCommit(len(batch), time.Since(started))
		}
		return nil
	}()
	for i, r := range batch {
		if commitErr != nil && errs[i] == nil {
			errs[i] = commitErr // nothing of the batch was committed
		}
		r.done <- errs[i]
	}
	db.prepare(missed)
}

// runGuarded runs fn, turning a panic into this request's error so one bad
// request cannot take the committer (and every other writer) down.
func runGuarded(tx *Tx, fn func(tx *Tx) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("write transaction panicked: %v", p)
		}
	}()
	return fn(tx)
}
