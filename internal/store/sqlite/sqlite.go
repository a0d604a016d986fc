// Package sqlite is Fleet's embedded backend: one SQLite file, written by one
// connection (writes queue in Go, fairer and faster than SQLite's sleeping
// busy handler), read through a separate pool so snapshots never wait
// behind the writer (WAL). Its SQL is queries.go and migrations/.
package sqlite

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
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/sqlite/dbsqlc"
	"github.com/fleet/fleet/internal/wire"
)

// ApplicationID marks a database as Fleet's in the SQLite header
// (PRAGMA application_id), so open can refuse someone else's file.
const ApplicationID = 0x464c4554 // "FLET"

// BusyTimeout bounds how long a connection waits for another process's write
// lock (e.g. `fleet-host credentials add` while the host serves). A busy
// database waits; it never discards state.
const BusyTimeout = 10 * time.Second

// CheckpointInterval is how often the background checkpointer runs.
const CheckpointInterval = 250 * time.Millisecond

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations are SQLite's schema changes, numbered like PostgreSQL's.
func Migrations() []store.Migration { return store.Migrations(migrationFiles, "migrations") }

var sqliteHeader = []byte("SQLite format 3\x00")

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

// driver is an open SQLite database.
type driver struct {
	write *sql.DB
	read  *sql.DB
	path  string

	// stmts caches statements prepared on the write connection, by query
	// text: modernc's driver otherwise parses every statement every time,
	// which cost a fifth of the host's CPU.
	stmts sync.Map // string -> *sql.Stmt

	// costPerReport is the state's, once read (0 before): nothing changes
	// it after init, and a tenant's reservation is one.
	costPerReport atomic.Int64

	// checkpoints counts checkpoints that copied frames (one fsync each, as
	// strace shows).
	checkpoints atomic.Int64
	lastCopied  atomic.Int64
	restartWAL  atomic.Bool  // the log is long: start it over after the next commit
	walRestarts atomic.Int64 // times it was
	logFrames   atomic.Int64 // the log's length at the last checkpoint
	// restartAt is the log length at which to try the restart again after a
	// reader would not let it (0: WALRestartFrames).
	restartAt       atomic.Int64
	checkpointConn  *sql.DB
	stopCheckpoints chan struct{}
	checkpointsDone chan struct{}
}

// Create makes a new database at path by exclusive creation (an existing
// path is refused, whatever it holds) and applies the schema.
func Create(ctx context.Context, path string) (*store.DB, error) {
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
	d, err := openPools(path, false, "FULL")
	if err == nil {
		if err = d.migrate(ctx, 0); err != nil {
			d.Close()
		}
	}
	if err != nil {
		// Leave nothing half-made behind: the path did not exist before.
		for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
			os.Remove(path + suffix)
		}
		return nil, fmt.Errorf("create database %s: %w", path, err)
	}
	return store.New(d), nil
}

// Open opens an existing Fleet database. It refuses a missing path, a file
// that is not SQLite, a SQLite database that is not Fleet's, and a schema
// newer than this build; an older schema is migrated forward. readOnly
// opens it for inspection only (`fleet-host verify` while a host serves),
// never migrating.
func Open(ctx context.Context, path string, readOnly bool, opts Options) (*store.DB, error) {
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
	d, err := openPools(path, readOnly, sync)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*store.DB, error) {
		d.Close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	var appID, version int
	if err := d.read.QueryRowContext(ctx, "PRAGMA application_id").Scan(&appID); err != nil {
		return fail(err)
	}
	if err := d.read.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fail(err)
	}
	if appID != ApplicationID {
		return fail(fmt.Errorf("not a Fleet database (application_id %#x)", appID))
	}
	migrate, err := store.CheckVersion(version, len(Migrations()), readOnly)
	if err == nil && migrate {
		err = d.migrate(ctx, version)
	}
	if err != nil {
		return fail(err)
	}
	return store.New(d), nil
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

func openPools(path string, readOnly bool, sync string) (*driver, error) {
	write, err := sql.Open("sqlite", dsn(path, readOnly, sync))
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	// One writer connection: writes queue in Go instead of in SQLite's
	// sleeping busy handler.
	write.SetMaxOpenConns(1)
	write.SetConnMaxIdleTime(0)
	read, err := sql.Open("sqlite", dsn(path, true, sync))
	if err != nil {
		write.Close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	read.SetMaxOpenConns(4)
	d := &driver{write: write, read: read, path: path}
	if !readOnly {
		if err := d.startCheckpointer(path, sync); err != nil {
			d.Close()
			return nil, fmt.Errorf("open database %s: %w", path, err)
		}
		// Switch to WAL before any reader connects, so readers never see a
		// rollback journal.
		if _, err := write.Exec("SELECT 1"); err != nil {
			d.Close()
			return nil, fmt.Errorf("open database %s: %w", path, classify(err))
		}
	}
	return d, nil
}

// startCheckpointer copies the WAL into the database on its own connection,
// PASSIVE so it never waits for or blocks the writer or readers. With
// wal_autocheckpoint off on the writer, commits no longer pay for it.
func (d *driver) startCheckpointer(path, sync string) error {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", BusyTimeout.Milliseconds()))
	q.Add("_pragma", "synchronous("+sync+")")
	cp, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?"+q.Encode())
	if err != nil {
		return err
	}
	cp.SetMaxOpenConns(1)
	d.checkpointConn, d.stopCheckpoints, d.checkpointsDone = cp, make(chan struct{}), make(chan struct{})
	go func() {
		defer close(d.checkpointsDone)
		t := time.NewTicker(CheckpointInterval)
		defer t.Stop()
		for {
			select {
			case <-d.stopCheckpoints:
				return
			case <-t.C:
				d.checkpoint()
			}
		}
	}()
	return nil
}

// WALRestartFrames is how long the WAL may grow, in frames (64 MiB of
// 4 KiB pages), before the writer starts it over. SQLite rewrites the log
// from its start only when a write begins with every frame already copied
// into the database; under a steady stream of commits a passive checkpoint
// never catches up at that instant, so without this the log grows for as
// long as the load lasts (318 MiB for 2,000 jobs one at a time).
var WALRestartFrames int64 = 16384

// checkpoint copies what it can of the WAL without waiting (PASSIVE) and,
// once the log has grown past WALRestartFrames, asks the writer to start it
// over after its next commit (see conn.Commit).
func (d *driver) checkpoint() {
	// The row is (busy, frames in the WAL, frames checkpointed).
	var busy, logFrames, copied int64
	if err := d.checkpointConn.QueryRow("PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &logFrames, &copied); err != nil {
		return
	}
	if prev := d.lastCopied.Swap(copied); copied > 0 && copied != prev {
		d.checkpoints.Add(1)
	}
	d.logFrames.Store(logFrames)
	if logFrames < WALRestartFrames {
		d.restartAt.Store(0) // started over, by the writer or another process
	}
	if logFrames >= max(WALRestartFrames, d.restartAt.Load()) {
		d.restartWAL.Store(true)
	}
}

// RestartWait bounds how long the writer waits for readers to leave the log
// before starting it over. The host's own readers leave within moments; a
// replicator's (Litestream holds a read transaction for as long as it runs)
// never does, and waiting out BusyTimeout on it stalled every commit.
const RestartWait = 100 * time.Millisecond

// restartWALNow copies the rest of the WAL and truncates it, on the write
// connection between two transactions: the committer waits up to
// RestartWait for the readers' snapshots to end, and the next commit writes
// the log from its start. It runs once per WALRestartFrames of log; when a
// reader held the log, not again until it has grown by as much more.
func (d *driver) restartWALNow() {
	if !d.restartWAL.CompareAndSwap(true, false) {
		return
	}
	ctx := context.Background()
	c, err := d.write.Conn(ctx) // the one write connection, held throughout
	if err != nil {
		return
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", RestartWait.Milliseconds())); err != nil {
		return
	}
	defer c.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", BusyTimeout.Milliseconds()))
	var busy, logFrames, copied int64
	if err := c.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &logFrames, &copied); err == nil && busy == 0 {
		d.walRestarts.Add(1)
		d.checkpoints.Add(1)
		d.restartAt.Store(0)
		return
	}
	d.restartAt.Store(d.logFrames.Load() + WALRestartFrames)
}

func (d *driver) Checkpoints() int64 { return d.checkpoints.Load() }
func (d *driver) RoundTrips() int64  { return 0 } // in process
func (d *driver) Location() string   { return d.path }
func (d *driver) Retryable(error) bool {
	return false // one writer: nothing to lose a race to
}

// Close stops the checkpointer and closes the cached statements and pools.
func (d *driver) Close() error {
	if d.checkpointConn != nil {
		close(d.stopCheckpoints)
		<-d.checkpointsDone
		d.checkpointConn.Close()
	}
	d.stmts.Range(func(_, s any) bool { s.(*sql.Stmt).Close(); return true })
	return errors.Join(d.write.Close(), d.read.Close())
}

// conn is one transaction. Write transactions run their statements through
// the statement cache and prepare what they missed once they end.

func (d *driver) BeginWrite(ctx context.Context) (store.Conn, error) {
	tx, err := d.write.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	c := &cachedTx{Tx: tx, d: d}
	return &conn{q: dbsqlc.New(c), tx: tx, cached: c}, nil
}

func (d *driver) BeginRead(ctx context.Context) (store.Conn, error) {
	tx, err := d.read.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	return &conn{q: dbsqlc.New(tx), tx: tx}, nil
}

// BeginReadOne is BeginRead: in process, a transaction costs no round trip.
func (d *driver) BeginReadOne(ctx context.Context) (store.Conn, error) { return d.BeginRead(ctx) }

func (c *conn) Commit() error {
	if err := c.writeAhead(context.Background()); err != nil {
		c.tx.Rollback()
		c.prepareMissed()
		return err
	}
	err := c.tx.Commit()
	c.prepareMissed()
	if c.cached != nil {
		c.cached.d.restartWALNow()
	}
	return err
}

func (c *conn) Rollback() error {
	err := c.tx.Rollback()
	c.prepareMissed()
	return err
}

// Statements counts a write transaction's statements (0 for a read).
func (c *conn) Statements() int64 {
	if c.cached == nil {
		return 0
	}
	return c.cached.statements
}

// count counts a statement run outside the statement cache.
func (c *conn) count() {
	if c.cached != nil {
		c.cached.statements++
	}
}

func (c *conn) prepareMissed() {
	if c.cached != nil {
		c.cached.d.prepare(c.cached.missed)
		c.cached.missed = nil
	}
}

// cachedTx runs a write transaction's statements prepared once per query text.
type cachedTx struct {
	*sql.Tx
	d          *driver
	missed     []string // queries this transaction had to parse
	statements int64    // run so far, for Conn.Statements
}

// stmt returns the cached statement for query bound to this transaction, or
// nil (and notes the query, to be prepared once the connection is free).
func (t *cachedTx) stmt(ctx context.Context, query string) *sql.Stmt {
	t.statements++
	if s, ok := t.d.stmts.Load(query); ok {
		return t.StmtContext(ctx, s.(*sql.Stmt))
	}
	t.missed = append(t.missed, query)
	return nil
}

func (t *cachedTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if s := t.stmt(ctx, query); s != nil {
		return s.ExecContext(ctx, args...)
	}
	return t.Tx.ExecContext(ctx, query, args...)
}

func (t *cachedTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if s := t.stmt(ctx, query); s != nil {
		return s.QueryContext(ctx, args...)
	}
	return t.Tx.QueryContext(ctx, query, args...)
}

func (t *cachedTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if s := t.stmt(ctx, query); s != nil {
		return s.QueryRowContext(ctx, args...)
	}
	return t.Tx.QueryRowContext(ctx, query, args...)
}

// prepare caches the queries a transaction missed. It runs after the
// transaction ends: preparing needs the one write connection.
func (d *driver) prepare(queries []string) {
	for _, q := range queries {
		if _, ok := d.stmts.Load(q); ok {
			continue
		}
		s, err := d.write.Prepare(q)
		if err != nil {
			continue // it simply stays unprepared
		}
		if _, loaded := d.stmts.LoadOrStore(q, s); loaded {
			s.Close()
		}
	}
}

// SQLite primary result codes that mean the disk, not the request, failed.
const (
	sqliteReadOnly = 8
	sqliteIOErr    = 10
	sqliteFull     = 13
)

func (d *driver) Classify(err error) error { return classify(err) }

// Lost is never true: the database is in this process.
func (d *driver) Lost(error) bool { return false }

// classify turns a full, read-only or failing disk into an unavailable error
// that says so. The transaction has rolled back: nothing was written.
func classify(err error) error {
	var coded interface{ Code() int }
	if !errors.As(err, &coded) {
		return err
	}
	switch coded.Code() & 0xff {
	case sqliteFull:
		return fleet.Errorf(wire.CodeUnavailable, "the state's disk is full; nothing was written (%v)", err)
	case sqliteReadOnly:
		return fleet.Errorf(wire.CodeUnavailable, "the state is read-only; nothing was written (%v)", err)
	case sqliteIOErr:
		return fleet.Errorf(wire.CodeUnavailable, "I/O error on the state's disk; nothing was written (%v)", err)
	}
	return err
}

// migrate applies every migration after `from`, each in its own transaction
// together with the header fields that record it, so a crash leaves the
// database at one version or the next, never between.
func (d *driver) migrate(ctx context.Context, from int) error {
	for _, m := range Migrations()[from:] {
		tx, err := d.write.BeginTx(ctx, nil)
		if err != nil {
			return classify(err)
		}
		for _, stmt := range []string{m.SQL, fmt.Sprintf("PRAGMA application_id = %d", ApplicationID),
			fmt.Sprintf("PRAGMA user_version = %d", m.Version)} {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				tx.Rollback()
				return classify(fmt.Errorf("migration %s: %w", m.Name, err))
			}
		}
		if err := tx.Commit(); err != nil {
			return classify(fmt.Errorf("migration %s: %w", m.Name, err))
		}
	}
	return nil
}

// Writers is 1: SQLite has one writer, and the committer numbers the log.
func (d *driver) Writers() int { return 1 }

// Placed never fires: the committer places the log in its own commit.
func (d *driver) Placed() <-chan struct{} { return nil }
