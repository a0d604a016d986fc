// Package store is the seam between Fleet and its database: the Executor of
// named operations (executor.go), the Driver each backend provides
// (internal/store/sqlite, internal/store/postgres), and the DB that runs
// write transactions with group commit on either. It holds no SQL.
package store

//go:generate ../../.ci/sqlc.sh generate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleet/fleet/internal/retry"
	"github.com/fleet/fleet/internal/wire"
)

// Driver is one backend's connection to a Fleet database.
type Driver interface {
	// BeginWrite starts the one transaction a batch of write requests shares.
	BeginWrite(ctx context.Context) (Conn, error)
	// BeginRead starts a read-only transaction: one snapshot for all its reads.
	BeginRead(ctx context.Context) (Conn, error)
	// BeginReadOne starts a read of one statement, which ends it: a
	// server's statement goes out alone, its own snapshot, in one round
	// trip with no BEGIN or ROLLBACK. A second statement is refused.
	BeginReadOne(ctx context.Context) (Conn, error)
	// Retryable reports that a write lost a race to another host (a
	// deadlock, a serialization failure, a unique key another host took):
	// the batch rolls back and runs again.
	Retryable(err error) bool
	// Classify maps a failure that is not the request's fault (a full or
	// read-only disk, an unreachable server) to an unavailable error. A
	// connection lost under a request also drops the connections the
	// driver holds idle: what cut one (a server restart, a reset link) cut
	// them all, and each would otherwise fail a request of its own.
	Classify(err error) error
	// Lost reports that err is a connection lost under a request, before
	// anything it read could be trusted: a read may run again on a fresh
	// one. Never true in-process (SQLite).
	Lost(err error) bool
	// Checkpoints counts background checkpoints that copied pages (SQLite).
	Checkpoints() int64
	// RoundTrips counts the exchanges with a database server (0 when the
	// database runs in this process).
	RoundTrips() int64
	// Location is the database's path or redacted URL, for messages.
	Location() string
	// Writers is how many write transactions may run at once. 1 (SQLite)
	// groups every write into one serial committer that numbers the log
	// itself; more (PostgreSQL) runs each request in its own transaction,
	// concurrently, with the log placed after commit by the sequencer (its
	// write Conns are then PendingCommitters).
	Writers() int
	// Placed fires (coalesced) when a sequencer round of any process on
	// this database has committed; nil where the log is placed in the
	// writer's own commit.
	Placed() <-chan struct{}
	Close() error
}

// Conn is one open transaction of a driver.
type Conn interface {
	Executor
	// Statements counts the statements this transaction has run so far
	// (its own: not BEGIN or COMMIT).
	Statements() int64
	Savepoint(ctx context.Context, name string) error
	// RollbackTo undoes what was done since the savepoint, which stays
	// open; Release closes it, keeping what was done. Closing each
	// savepoint keeps them from nesting deeper with every request or
	// item: SQLite checks every open savepoint at each page it writes.
	RollbackTo(ctx context.Context, name string) error
	Release(ctx context.Context, name string) error
	Commit() error
	// Rollback ends the transaction unless Commit did; calling it after
	// Commit is harmless.
	Rollback() error
}

// DB is an open Fleet database.
type DB struct {
	driver Driver
	// Now is the clock; tests replace it. Each transaction reads it once.
	Now func() time.Time

	writeTxs atomic.Int64 // write transactions run (requests)
	ops      sync.Map     // operation name → *operationCounts
	retries  atomic.Int64 // batches run again after losing to another host
	commits  atomic.Int64
	// seqRounds counts the sequencer's transactions that placed entries,
	// seqEntries the entries they placed, seqBusy its tries that found
	// the log lock taken, seqUnlisted its rounds that placed without listing
	// (several writers only).
	seqRounds, seqEntries, seqBusy, seqUnlisted atomic.Int64

	gc      *committer // with one writer
	writers chan bool  // with several: a slot per transaction in flight
	seq     *sequencer // with several
	cc      concurrent
	seal    atomic.Value // Sealer

	closeOnce sync.Once
	closeErr  error

	// OnCommit, if set before writes begin, observes each commit: how many
	// requests it held and how long the commit (with its sync) took.
	OnCommit func(requests int, d time.Duration)
}

// New runs transactions on a driver's database.
func New(d Driver) *DB {
	db := &DB{driver: d, Now: time.Now}
	if n := d.Writers(); n > 1 {
		db.writers = make(chan bool, n)
		db.seq = newSequencer(db)
	} else {
		db.startCommitter()
	}
	return db
}

// SharedByHosts reports whether several hosts may serve this database at
// once: a backend with several writers (PostgreSQL).
func (db *DB) SharedByHosts() bool { return db.seq != nil }

// Stats reads the counters.
func (db *DB) Stats() wire.StorageStats {
	s := wire.StorageStats{WriteTransactions: db.writeTxs.Load(), Commits: db.commits.Load(),
		Checkpoints: db.driver.Checkpoints(), Retries: db.retries.Load(),
		RoundTrips: db.driver.RoundTrips(), SequencerRounds: db.seqRounds.Load(), SequencerEntries: db.seqEntries.Load(),
		SequencerBusy: db.seqBusy.Load(), SequencerUnlisted: db.seqUnlisted.Load(),
		Operations: map[string]wire.OperationStats{}}
	db.ops.Range(func(name, c any) bool {
		counts := c.(*operationCounts)
		s.Operations[name.(string)] = wire.OperationStats{Writes: counts.writes.Load(), Statements: counts.statements.Load(),
			Rows: counts.rows.Load()}
		return true
	})
	return s
}

type operationCounts struct{ writes, statements, rows atomic.Int64 }

// CountWrite records a committed write of a named operation: the
// statements its transaction function ran and the rows (jobs, say) it
// acted on.
func (db *DB) CountWrite(operation string, statements, rows int64) {
	c, ok := db.ops.Load(operation)
	if !ok {
		c, _ = db.ops.LoadOrStore(operation, &operationCounts{})
	}
	counts := c.(*operationCounts)
	counts.writes.Add(1)
	counts.statements.Add(statements)
	counts.rows.Add(rows)
}

// Location is the database file or the redacted URL.
func (db *DB) Location() string { return db.driver.Location() }

// Driver is the backend, for tests that reach below the named operations.
func (db *DB) Driver() Driver { return db.driver }

// Tx is one request's transaction: the named operations, and the time fixed
// when it began so every timestamp it writes agrees.
type Tx struct {
	Executor
	Now time.Time
	log *logBuffer // the batch's pending log appends; nil in reads
	// ahead is what a batch request read for its items (ReadAhead).
	ahead *readAhead
	// held is a batch request's writes held to its end (held.go); nil
	// when its reads did not go ahead.
	held *heldWrites
}

// Statements counts the statements the transaction has run so far: the
// difference across a request's function is what that request ran
// (entries it appends to the log are written after it, for its whole
// commit).
func (tx *Tx) Statements() int64 {
	if c, ok := tx.Executor.(Conn); ok {
		return c.Statements()
	}
	return 0
}

// NowMS is the transaction's time in Unix milliseconds.
func (tx *Tx) NowMS() int64 { return tx.Now.UnixMilli() }

// IsURL reports whether a database location is a PostgreSQL URL rather than
// a SQLite file path.
func IsURL(location string) bool {
	return strings.HasPrefix(location, "postgres://") || strings.HasPrefix(location, "postgresql://")
}

// SetSealer sets what seals receipts as the log places them (the host's
// kernel), before the first write that appends one.
func (db *DB) SetSealer(s Sealer) { db.seal.Store(&s) }

func (db *DB) sealer() Sealer {
	if s, ok := db.seal.Load().(*Sealer); ok {
		return *s
	}
	return nil
}

// Close waits for write transactions in flight, then closes the driver.
// Closing twice is harmless.
func (db *DB) Close() error {
	db.closeOnce.Do(func() {
		if db.gc != nil {
			db.stopCommitter()
		} else {
			db.stopConcurrent()
		}
		db.closeErr = db.driver.Close()
	})
	return db.closeErr
}

// WithTx runs fn in a write transaction and returns once what fn wrote is
// durably committed (or nothing of it is). The transaction does not inherit
// ctx's cancellation: a client that hangs up must not abort a transaction
// halfway through deciding, and shutdown waits for transactions in flight.
//
// With one writer, concurrent calls share one transaction and one commit
// (group commit; see committer), each isolated in its own savepoint; with
// several, each call is its own transaction (concurrent.go). Either way
// fn's checks and writes stand or fall together, and what fn appended to
// the log is placed before WithTx returns.
func (db *DB) WithTx(ctx context.Context, fn func(tx *Tx) error) error {
	db.writeTxs.Add(1)
	if db.gc == nil {
		return db.runConcurrent(context.WithoutCancel(ctx), fn)
	}
	return db.submit(context.WithoutCancel(ctx), fn)
}

// Read runs fn in a read-only snapshot. A read whose connection was lost
// runs again, on a fresh one (the driver's Lost), up to maxReadAttempts
// times: fn may run more than once, so it sets what it reads into rather
// than adding to it.
func (db *DB) Read(ctx context.Context, fn func(tx *Tx) error) error {
	return db.read(ctx, db.driver.BeginRead, fn)
}

// ReadOne is Read for fn that reads with one statement: on PostgreSQL one
// round trip where a transaction takes two (the sequencer's looks).
func (db *DB) ReadOne(ctx context.Context, fn func(tx *Tx) error) error {
	return db.read(ctx, db.driver.BeginReadOne, fn)
}

func (db *DB) read(ctx context.Context, begin func(context.Context) (Conn, error), fn func(tx *Tx) error) error {
	pauses := retry.New(10*time.Millisecond, 100*time.Millisecond)
	for attempt := 1; ; attempt++ {
		err := db.readOnce(ctx, begin, fn)
		if err == nil {
			return nil
		}
		classified := db.driver.Classify(err)
		if attempt == maxReadAttempts || !db.driver.Lost(err) || ctx.Err() != nil {
			return classified
		}
		select {
		case <-ctx.Done():
			return classified
		case <-time.After(pauses.NextBackOff()):
		}
	}
}

// maxReadAttempts bounds a read's runs when connections are lost: a
// server that restarted answers the second (Classify dropped the pool's
// other connections, cut with the first), one still down fails them all.
const maxReadAttempts = 3

func (db *DB) readOnce(ctx context.Context, begin func(context.Context) (Conn, error), fn func(tx *Tx) error) error {
	conn, err := begin(ctx)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	defer conn.Rollback()
	return fn(&Tx{Executor: conn, Now: db.Now()})
}

// ErrClosed is returned by writes submitted after Close.
var ErrClosed = errors.New("the database is closed")
