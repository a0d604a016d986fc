// Package store opens Fleet's database and runs transactions on it: SQLite
// (a file, the default) or PostgreSQL (a postgres:// URL, see postgres.go).
// Domain code sees only *Tx and portable SQL with $N placeholders; where the
// two differ (row locks, chain locks) it asks the Tx.
//
// On SQLite every write runs in one BEGIN IMMEDIATE transaction on a single pooled
// connection: SQLite allows one writer at a time anyway, and queueing writers
// in Go is fairer and faster than letting them spin in the busy handler.
// Reads use a separate pool so snapshots never wait behind writers (WAL).
package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/fleet/fleet/internal/fleet"
)

// ApplicationID marks a database as Fleet's in the SQLite header
// (PRAGMA application_id), so open can refuse someone else's file.
const ApplicationID = 0x464c4554 // "FLET"

// BusyTimeout bounds how long a connection waits for another process's write
// lock (e.g. `fleet-host credentials add` while the host serves). A busy
// database waits; it never discards state.
const BusyTimeout = 10 * time.Second

//go:embed migrations/sqlite/*.sql migrations/postgres/*.sql
var migrationFiles embed.FS

var sqliteHeader = []byte("SQLite format 3\x00")

// DB is an open Fleet database.
type DB struct {
	pg    bool // PostgreSQL: one pool, no group commit or checkpoints
	write *sql.DB
	read  *sql.DB
	path  string
	// Now is the clock; tests replace it. Each transaction reads it once.
	Now func() time.Time

	writeTxs atomic.Int64 // write transactions run (requests)
	retries  atomic.Int64 // requests run again after losing to another host (PostgreSQL)
	commits  atomic.Int64 // SQLite commits, each one WAL sync under synchronous=FULL

	// checkpoints counts checkpoints that copied frames (one fsync each, as
	// strace shows). lastCopied is only touched by the checkpointer goroutine.
	checkpoints atomic.Int64
	lastCopied  int64

	// stmts caches statements prepared on the write connection, by query
	// text: modernc's driver otherwise parses every statement every time,
	// which cost a fifth of the host's CPU.
	stmts sync.Map // string -> *sql.Stmt

	gc *committer // group commit of write transactions

	checkpointConn  *sql.DB // one connection that copies the WAL into the database
	stopCheckpoints chan struct{}
	checkpointsDone chan struct{}

	closeOnce sync.Once
	closeErr  error

	// OnCommit, if set before writes begin, observes each commit: how many
	// requests it held and how long COMMIT (with its fsync) took.
	OnCommit func(requests int, d time.Duration)
}

// Stats counts what the database has done since it was opened.
type Stats struct {
	WriteTransactions int64 `json:"write_transactions"`
	Commits           int64 `json:"commits"`
	Checkpoints       int64 `json:"checkpoints"` // that copied frames
	Retries           int64 `json:"retries"`     // requests rerun after losing a race to another host
}

// Stats reads the counters.
func (db *DB) Stats() Stats {
	return Stats{WriteTransactions: db.writeTxs.Load(), Commits: db.commits.Load(), Checkpoints: db.checkpoints.Load(),
		Retries: db.retries.Load()}
}

// Options tune how a database is opened.
type Options struct {
	// Synchronous is SQLite's synchronous setting: "FULL" (the default;
	// every commit survives power loss) or "NORMAL" (a commit may be lost
	// on power loss, never on a process crash, and never corrupts).
	Synchronous string
}

func (o Options) synchronous() (string, error) {
	switch strings.ToUpper(o.Synchronous) {
	case "", "FULL":
		return "FULL", nil
	case "NORMAL":
		return "NORMAL", nil
	}
	return "", fmt.Errorf("synchronous must be FULL or NORMAL, got %q", o.Synchronous)
}

// Tx is one transaction. Now is fixed when it begins, so every timestamp a
// transaction writes agrees.
type Tx struct {
	*sql.Tx
	Now time.Time

	db     *DB      // set on SQLite write transactions, whose statements are cached
	missed []string // queries this transaction had to parse
	pg     bool     // PostgreSQL
	write  bool     // a write transaction (may lock rows)
}

// ForUpdate is the row-locking clause for a read whose rows this write
// transaction will change: "FOR UPDATE [OF tables]" on PostgreSQL, where
// other hosts write concurrently, and nothing on SQLite, whose one writer
// already excludes every other.
func (tx *Tx) ForUpdate(tables ...string) string {
	if !tx.pg || !tx.write {
		return ""
	}
	if len(tables) == 0 {
		return " FOR UPDATE"
	}
	return " FOR UPDATE OF " + strings.Join(tables, ", ")
}

// SkipLocked is ForUpdate that passes over rows another transaction holds,
// so concurrent claimers on several hosts take different jobs.
func (tx *Tx) SkipLocked(tables ...string) string {
	if lock := tx.ForUpdate(tables...); lock != "" {
		return lock + " SKIP LOCKED"
	}
	return ""
}

// ChainLog is the one chain lock for the receipt chain and the event log:
// one name for both, so no two transactions can take them in opposite
// orders and deadlock.
const ChainLog = "log"

// LockChain serializes appends to a sequence that must stay contiguous (the
// receipt chain, the event log, job positions) until this transaction ends.
// On PostgreSQL it is a transaction-scoped advisory lock named for the chain
// and the schema; on SQLite the one writer already holds everything.
func (tx *Tx) LockChain(ctx context.Context, name string) error {
	if !tx.pg || !tx.write {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext(current_schema() || '/' || $1))`, name); err != nil {
		return fmt.Errorf("lock %s: %w", name, err)
	}
	return nil
}

// stmt returns the cached statement for query bound to this transaction, or
// nil (and notes the query, to be prepared once the connection is free).
func (tx *Tx) stmt(ctx context.Context, query string) *sql.Stmt {
	if tx.db == nil {
		return nil
	}
	if s, ok := tx.db.stmts.Load(query); ok {
		return tx.StmtContext(ctx, s.(*sql.Stmt))
	}
	tx.missed = append(tx.missed, query)
	return nil
}

// ExecContext runs a statement, prepared once per query text.
func (tx *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if s := tx.stmt(ctx, query); s != nil {
		return s.ExecContext(ctx, args...)
	}
	return tx.Tx.ExecContext(ctx, query, args...)
}

// QueryContext runs a query, prepared once per query text.
func (tx *Tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if s := tx.stmt(ctx, query); s != nil {
		return s.QueryContext(ctx, args...)
	}
	return tx.Tx.QueryContext(ctx, query, args...)
}

// QueryRowContext runs a one-row query, prepared once per query text.
func (tx *Tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if s := tx.stmt(ctx, query); s != nil {
		return s.QueryRowContext(ctx, args...)
	}
	return tx.Tx.QueryRowContext(ctx, query, args...)
}

// prepare caches the queries a transaction missed. It runs after the
// transaction ends: preparing needs the one write connection.
func (db *DB) prepare(queries []string) {
	for _, q := range queries {
		if _, ok := db.stmts.Load(q); ok {
			continue
		}
		s, err := db.write.Prepare(q)
		if err != nil {
			continue // e.g. a PRAGMA; it simply stays unprepared
		}
		if _, loaded := db.stmts.LoadOrStore(q, s); loaded {
			s.Close()
		}
	}
}

// NowMS is the transaction's time in Unix milliseconds.
func (tx *Tx) NowMS() int64 { return tx.Now.UnixMilli() }

// SchemaVersion is the number of embedded migrations: the newest schema this
// build understands (the same on both backends; a test checks).
func SchemaVersion() int { return len(mustMigrations(dialectSQLite)) }

// IsURL reports whether a database location is a PostgreSQL URL rather than
// a SQLite file path.
func IsURL(location string) bool {
	return strings.HasPrefix(location, "postgres://") || strings.HasPrefix(location, "postgresql://")
}

// Create makes a new database and applies the schema: at a path by
// exclusive creation (an existing path is refused, whatever it holds), or in
// an empty PostgreSQL schema named by a URL.
func Create(ctx context.Context, path string) (*DB, error) {
	if IsURL(path) {
		return createPostgres(ctx, path)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("create database %s: refusing a path that already exists", path)
		}
		return nil, fmt.Errorf("create database %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("create database %s: %w", path, err)
	}
	db, err := openPools(path, false, "FULL")
	if err == nil {
		err = db.migrate(ctx, 0)
		if err != nil {
			db.Close()
		}
	}
	if err != nil {
		// Leave nothing half-made behind: the path did not exist before.
		for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
			os.Remove(path + suffix)
		}
		return nil, fmt.Errorf("create database %s: %w", path, err)
	}
	return db, nil
}

// Open opens an existing Fleet database. It refuses a missing path, a file
// that is not SQLite, a SQLite database that is not Fleet's, and a schema
// newer than this build; an older schema is migrated forward.
func Open(ctx context.Context, path string, opts ...Options) (*DB, error) {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if IsURL(path) {
		return openPostgres(ctx, path, false)
	}
	return open(ctx, path, false, o)
}

// OpenReadOnly opens an existing Fleet database for inspection only, e.g.
// `fleet-host verify` while a host serves the same state. It never migrates.
func OpenReadOnly(ctx context.Context, path string) (*DB, error) {
	if IsURL(path) {
		return openPostgres(ctx, path, true)
	}
	return open(ctx, path, true, Options{})
}

func open(ctx context.Context, path string, readOnly bool, opts Options) (*DB, error) {
	sync, err := opts.synchronous()
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	if err := checkHeader(path); err != nil {
		return nil, err
	}
	if !readOnly {
		// WAL needs to write the file and create its -wal and -shm beside it;
		// say so plainly rather than SQLite's "unable to open database file".
		for _, p := range []string{path, filepath.Dir(path)} {
			if err := syscall.Access(p, 2 /* W_OK */); err != nil {
				return nil, fmt.Errorf("open database %s: %s is read-only or not writable (%v); nothing was changed", path, p, err)
			}
		}
	}
	db, err := openPools(path, readOnly, sync)
	if err != nil {
		return nil, err
	}
	var appID, version int
	if err := db.read.QueryRowContext(ctx, "PRAGMA application_id").Scan(&appID); err != nil {
		db.Close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	if err := db.read.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		db.Close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	switch {
	case appID != ApplicationID:
		db.Close()
		return nil, fmt.Errorf("open database %s: not a Fleet database (application_id %#x)", path, appID)
	case version > SchemaVersion() || version < 1:
		db.Close()
		return nil, fmt.Errorf("open database %s: unknown schema version %d (this build knows 1 to %d)", path, version, SchemaVersion())
	case version < SchemaVersion() && readOnly:
		db.Close()
		return nil, fmt.Errorf("open database %s: schema version %d needs migrating to %d; open it read-write first", path, version, SchemaVersion())
	case version < SchemaVersion():
		if err := db.migrate(ctx, version); err != nil {
			db.Close()
			return nil, fmt.Errorf("open database %s: %w", path, err)
		}
	}
	return db, nil
}

func checkHeader(path string) error {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("open database %s: no such file", path)
		}
		return fmt.Errorf("open database %s: %w", path, err)
	}
	defer f.Close()
	header := make([]byte, len(sqliteHeader))
	if _, err := io.ReadFull(f, header); err != nil || string(header) != string(sqliteHeader) {
		return fmt.Errorf("open database %s: not a SQLite database", path)
	}
	return nil
}

func dsn(path string, readOnly bool, sync string) string {
	q := url.Values{}
	// Pragmas go in the DSN so that every pooled connection gets them.
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", BusyTimeout.Milliseconds()))
	q.Add("_pragma", "foreign_keys(1)")
	// Savepoint (statement) journals in memory: group commit runs every
	// request in a savepoint, and a temp file cost a pwrite per page.
	q.Add("_pragma", "temp_store(MEMORY)")
	if readOnly {
		q.Add("_pragma", "query_only(1)")
	} else {
		// WAL lets readers run beside the writer; FULL syncs the WAL on every
		// commit, so an acknowledged commit survives power loss.
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous("+sync+")")
		// Checkpoints run in the background (see checkpointer), so that no
		// commit stalls copying the WAL into the database.
		q.Add("_pragma", "wal_autocheckpoint(0)")
		// Take the write lock at BEGIN, before any read, so a transaction's
		// checks and writes cannot be interleaved with another writer's.
		q.Set("_txlock", "immediate")
	}
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

func openPools(path string, readOnly bool, sync string) (*DB, error) {
	write, err := sql.Open("sqlite", dsn(path, readOnly, sync))
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	// One writer connection: writes queue in Go instead of in SQLite's
	// sleeping busy handler.
	write.SetMaxOpenConns(1)
	write.SetConnMaxIdleTime(0)
	readDSN := dsn(path, true, sync)
	read, err := sql.Open("sqlite", readDSN)
	if err != nil {
		write.Close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	read.SetMaxOpenConns(4)
	db := &DB{write: write, read: read, path: path, Now: time.Now}
	db.startCommitter()
	if !readOnly {
		if err := db.startCheckpointer(path, sync); err != nil {
			db.Close()
			return nil, fmt.Errorf("open database %s: %w", path, err)
		}
	}
	if !readOnly {
		// Switch to WAL before any reader connects, so readers never see a
		// rollback journal.
		if _, err := write.Exec("SELECT 1"); err != nil {
			db.Close()
			return nil, fmt.Errorf("open database %s: %w", path, classify(err))
		}
	}
	return db, nil
}

// CheckpointInterval is how often the background checkpointer runs.
const CheckpointInterval = 250 * time.Millisecond

// startCheckpointer copies the WAL into the database on its own connection,
// PASSIVE so it never waits for or blocks the writer or readers. With
// wal_autocheckpoint off on the writer, commits no longer pay for it.
func (db *DB) startCheckpointer(path, sync string) error {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", BusyTimeout.Milliseconds()))
	q.Add("_pragma", "synchronous("+sync+")")
	cp, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?"+q.Encode())
	if err != nil {
		return err
	}
	cp.SetMaxOpenConns(1)
	db.checkpointConn, db.stopCheckpoints, db.checkpointsDone = cp, make(chan struct{}), make(chan struct{})
	go func() {
		defer close(db.checkpointsDone)
		t := time.NewTicker(CheckpointInterval)
		defer t.Stop()
		for {
			select {
			case <-db.stopCheckpoints:
				return
			case <-t.C:
				// The row is (busy, frames in the WAL, frames checkpointed).
				var busy, logFrames, copied int64
				if err := cp.QueryRow("PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &logFrames, &copied); err == nil && copied > 0 && copied != db.lastCopied {
					db.checkpoints.Add(1)
				}
				db.lastCopied = copied
			}
		}
	}()
	return nil
}

// Postgres reports whether the database is PostgreSQL.
func (db *DB) Postgres() bool { return db.pg }

// Path is the database file (or the redacted URL).
func (db *DB) Path() string { return db.path }

// Close waits for write transactions in flight, then closes the cached
// statements and both pools. Closing twice is harmless.
func (db *DB) Close() error {
	db.closeOnce.Do(func() { db.closeErr = db.close() })
	return db.closeErr
}

func (db *DB) close() error {
	db.stopCommitter()
	if db.pg {
		return db.write.Close()
	}
	if db.checkpointConn != nil {
		close(db.stopCheckpoints)
		<-db.checkpointsDone
		db.checkpointConn.Close()
	}
	db.stmts.Range(func(_, s any) bool { s.(*sql.Stmt).Close(); return true })
	return errors.Join(db.write.Close(), db.read.Close())
}

// WithTx runs fn in one immediate write transaction and commits when fn
// returns nil. The transaction does not inherit ctx's cancellation: a client
// that hangs up must not abort a transaction halfway through deciding, and
// shutdown waits for in-flight transactions to finish.
//
// Concurrent calls share one SQLite transaction and one commit (group
// commit; see committer), each isolated in its own savepoint: fn's checks and
// writes stand or fall together, and WithTx returns only after the commit
// that holds them is durable.
func (db *DB) WithTx(ctx context.Context, fn func(tx *Tx) error) error {
	db.writeTxs.Add(1)
	return db.submit(context.WithoutCancel(ctx), fn)
}

// Read runs fn in a read-only snapshot.
func (db *DB) Read(ctx context.Context, fn func(tx *Tx) error) error {
	return db.runTx(ctx, db.read, db.Now(), true, fn)
}

func (db *DB) runTx(ctx context.Context, pool *sql.DB, now time.Time, readOnly bool, fn func(tx *Tx) error) error {
	opts := &sql.TxOptions{ReadOnly: readOnly}
	if db.pg && readOnly {
		// One snapshot for every statement, as a SQLite read transaction has.
		opts.Isolation = sql.LevelRepeatableRead
	}
	sqlTx, err := pool.BeginTx(ctx, opts)
	if err != nil {
		return db.classify(fmt.Errorf("begin transaction: %w", err))
	}
	// Rollback after Commit is a no-op; on every other path it releases the lock.
	defer sqlTx.Rollback()
	if err := fn(&Tx{Tx: sqlTx, Now: now, pg: db.pg, write: !readOnly}); err != nil {
		return db.classify(err)
	}
	if err := sqlTx.Commit(); err != nil {
		return db.classify(fmt.Errorf("commit: %w", err))
	}
	return nil
}

// SQLite primary result codes that mean the disk, not the request, failed.
const (
	sqliteReadOnly = 8
	sqliteIOErr    = 10
	sqliteFull     = 13
)

// classify maps a backend's failures that are not the request's fault to
// unavailable.
func (db *DB) classify(err error) error {
	if db.pg {
		return classifyPostgres(err)
	}
	return classify(err)
}

// classify turns a full, read-only or failing disk into an unavailable error
// that says so. The transaction has rolled back: nothing was written.
func classify(err error) error {
	var coded interface{ Code() int }
	if !errors.As(err, &coded) {
		return err
	}
	switch coded.Code() & 0xff {
	case sqliteFull:
		return fleet.Errorf(fleet.CodeUnavailable, "the state's disk is full; nothing was written (%v)", err)
	case sqliteReadOnly:
		return fleet.Errorf(fleet.CodeUnavailable, "the state is read-only; nothing was written (%v)", err)
	case sqliteIOErr:
		return fleet.Errorf(fleet.CodeUnavailable, "I/O error on the state's disk; nothing was written (%v)", err)
	}
	return err
}

type migration struct {
	version int
	name    string
	sql     string
}

type dialect string

const (
	dialectSQLite   dialect = "sqlite"
	dialectPostgres dialect = "postgres"
)

func mustMigrations(d dialect) []migration {
	dir := "migrations/" + string(d)
	entries, err := fs.ReadDir(migrationFiles, dir)
	if err != nil {
		panic(err)
	}
	var out []migration
	for _, e := range entries {
		prefix, _, ok := strings.Cut(e.Name(), "_")
		n, err := strconv.Atoi(prefix)
		if !ok || err != nil {
			panic("migration without a numeric prefix: " + e.Name())
		}
		text, err := migrationFiles.ReadFile(dir + "/" + e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, migration{version: n, name: e.Name(), sql: string(text)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			panic(fmt.Sprintf("migrations are not numbered 1..n: %s", m.name))
		}
	}
	return out
}

// migrate applies every migration after `from`, each in its own transaction
// together with the header fields that record it, so a crash leaves the
// database at one version or the next, never between.
func (db *DB) migrate(ctx context.Context, from int) error {
	for _, m := range mustMigrations(dialectSQLite)[from:] {
		// Straight to the connection: DDL has no place in the statement cache.
		err := db.runTx(ctx, db.write, db.Now(), false, func(tx *Tx) error {
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
			if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA application_id = %d", ApplicationID)); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
			if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", m.version)); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
