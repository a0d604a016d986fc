// Package postgres is Fleet's backend for several hosts in front of one
// PostgreSQL database. Each request is its own READ COMMITTED transaction,
// up to WriterSlots at once per host, and the log is placed after commit by
// store's sequencer. What SQLite's single writer gave for free is asked for
// explicitly in queries.go: row locks, SKIP LOCKED claims and, for the
// sequencer and enqueues, the log's advisory lock. A transaction that loses
// a deadlock or a serialization race, or trips a unique key another host
// just took, is rolled back and run again.
package postgres

import (
	"context"
	"crypto/rand"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib" // also registers the "pgx" driver

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres/dbsqlc"
	"github.com/fleet/fleet/internal/wire"
)

// application marks a schema as Fleet's, as SQLite's application_id does
// for a file.
const application = "fleet"

// PoolSize bounds one host's connections: WriterSlots writers, the
// sequencer, the host's liveness renewals, and reads.
const PoolSize = 24

// The server-side bounds on what a session holds (a URL's own options
// override them). A healthy host's write waits behind a sick host's locks
// at most about IdleInTransactionTimeout + LockTimeout; a transaction of
// Fleet's is never idle that long unless its host stalled.
const (
	IdleInTransactionTimeout = 2 * time.Second
	LockTimeout              = time.Second
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations are PostgreSQL's schema changes, numbered like SQLite's.
func Migrations() []store.Migration { return store.Migrations(migrationFiles, "migrations") }

type driver struct {
	conns    *pgxpool.Pool   // transactions, pipelined (pipeline.go)
	pool     *sql.DB         // the same connections, for migrations and setup
	location string          // redacted
	session  *pgx.ConnConfig // the pool's session settings, for the listener's own connection
	channel  string          // where placing the log is announced: one per schema
	instance string          // this process's rounds' announcements carry it

	roundTrips atomic.Int64 // by transactions (pipeline.go)

	listenOnce sync.Once
	placed     chan struct{} // a round of some host's sequencer committed
	stopListen context.CancelFunc
	listening  sync.WaitGroup
}

func openPool(location string) (*driver, error) {
	config, err := pgxpool.ParseConfig(location)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", redact(location), err)
	}
	config.MaxConns = PoolSize
	config.MaxConnIdleTime = 5 * time.Minute
	// What one sick host's session can hold that the healthy hosts need is
	// bounded by the server, whatever became of the host: a transaction
	// left idle (its host paused, or its link frozen or slow) is ended and
	// its locks released, and a statement waits at most LockTimeout for a
	// lock before its transaction is run again from the start.
	for name, v := range map[string]time.Duration{
		"idle_in_transaction_session_timeout": IdleInTransactionTimeout,
		"lock_timeout":                        LockTimeout,
	} {
		if _, set := config.ConnConfig.RuntimeParams[name]; !set {
			config.ConnConfig.RuntimeParams[name] = strconv.FormatInt(v.Milliseconds(), 10)
		}
	}
	// Fleet's statements touch a few rows each, but the planner's guesses
	// for its CTEs over small, rarely analyzed tables (one settings row
	// taken for 1,850) pass jit_above_cost, and compiling the plan cost
	// 100-250 ms an execution, the whole of a batch's reservation (seen
	// with auto_explain). A URL that sets jit keeps its own.
	if _, set := config.ConnConfig.RuntimeParams["jit"]; !set {
		config.ConnConfig.RuntimeParams["jit"] = "off"
	}
	// pgx reads and writes UTF-8 whatever the session says, so the session
	// says UTF-8: a server or database that defaults sessions to another
	// client encoding would otherwise convert Fleet's bytes as that one's.
	config.ConnConfig.RuntimeParams["client_encoding"] = "UTF8"
	// Fleet answers a write once its commit is durable, so no session of
	// its commits asynchronously: a server, database or URL default of
	// synchronous_commit = off is raised to on; a stronger level (for a
	// synchronous standby) is kept. Once a connection, not a statement.
	config.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SELECT set_config('synchronous_commit', 'on', false) WHERE current_setting('synchronous_commit') = 'off'`)
		return err
	}
	conns, err := pgxpool.NewWithConfig(context.Background(), config)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", redact(location), err)
	}
	instance := make([]byte, 8)
	rand.Read(instance)
	return &driver{conns: conns, pool: stdlib.OpenDBFromPool(conns), location: redact(location), session: config.ConnConfig.Copy(),
		instance: hex.EncodeToString(instance)}, nil
}

// checkEncoding refuses a database whose encoding is not UTF-8's.
// Fleet's text is UTF-8: a database in another encoding refuses the
// characters it cannot hold, mid-request, or, before sessions were told
// UTF8, stored each non-ASCII byte as a character of its own, which a dump
// then carried elsewhere as other text. SQL_ASCII (what initdb in the C
// locale makes without -E) converts and checks nothing, so it keeps
// Fleet's bytes as they are and is taken.
func (d *driver) checkEncoding(ctx context.Context) error {
	c, err := d.conns.Acquire(ctx)
	if err != nil {
		return classify(err)
	}
	defer c.Release()
	if enc := c.Conn().PgConn().ParameterStatus("server_encoding"); enc != "UTF8" && enc != "SQL_ASCII" {
		return fmt.Errorf("the database's encoding is %s, and Fleet's text is UTF-8: use a database created with ENCODING 'UTF8' (CREATE DATABASE … ENCODING 'UTF8' TEMPLATE template0)", enc)
	}
	return nil
}

// Create applies the schema to an empty PostgreSQL schema named by a URL
// (search_path picks one); a schema that holds Fleet's tables, or tables
// named like them, is refused.
func Create(ctx context.Context, location string) (*store.DB, error) {
	d, err := openPool(location)
	if err != nil {
		return nil, err
	}
	err = d.checkEncoding(ctx)
	if err == nil {
		err = d.migrate(ctx, true)
	}
	if err == nil {
		err = d.resolveChannel(ctx)
	}
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("create database %s: %w", d.location, err)
	}
	return store.New(d), nil
}

// Open opens an existing Fleet schema, migrating an older one forward
// unless readOnly.
func Open(ctx context.Context, location string, readOnly bool) (*store.DB, error) {
	d, err := openPool(location)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*store.DB, error) {
		d.Close()
		return nil, fmt.Errorf("open database %s: %w", d.location, err)
	}
	if err := d.checkEncoding(ctx); err != nil {
		return fail(err)
	}
	version, err := schemaVersion(ctx, d.pool)
	if err != nil {
		return fail(err)
	}
	migrate, err := store.CheckVersion(version, len(Migrations()), readOnly)
	if err == nil && migrate {
		err = d.migrate(ctx, false)
	}
	if err == nil {
		err = d.resolveChannel(ctx)
	}
	if err != nil {
		return fail(err)
	}
	return store.New(d), nil
}

type queryRower interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

// schemaVersion reads the version recorded in fleet_schema, or 0 when the
// schema holds no Fleet tables at all.
func schemaVersion(ctx context.Context, q queryRower) (int, error) {
	var exists bool
	if err := q.QueryRowContext(ctx, `SELECT to_regclass('fleet_schema') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, classify(err)
	}
	if !exists {
		return 0, nil
	}
	var app string
	var version int
	if err := q.QueryRowContext(ctx, `SELECT application, version FROM fleet_schema`).Scan(&app, &version); err != nil {
		return 0, fmt.Errorf("read fleet_schema: %w", err)
	}
	if app != application {
		return 0, fmt.Errorf("not a Fleet database (application %q)", app)
	}
	return version, nil
}

// migrate applies the migrations the schema lacks, each in its own
// transaction with the version that records it. An advisory lock makes
// hosts that start together migrate one at a time. With fresh set, a schema
// that already holds Fleet's tables is refused.
func (d *driver) migrate(ctx context.Context, fresh bool) error {
	for _, m := range Migrations() {
		if err := d.migrateOne(ctx, m, fresh); err != nil {
			return err
		}
	}
	return nil
}

func (d *driver) migrateOne(ctx context.Context, m store.Migration, fresh bool) error {
	tx, err := d.pool.BeginTx(ctx, nil)
	if err != nil {
		return classify(err)
	}
	defer tx.Rollback()
	// A migration may wait for another host's, and rewrite a large table:
	// no bound a database or URL sets on its sessions applies to it.
	for _, set := range []string{`SET LOCAL lock_timeout = 0`, `SET LOCAL idle_in_transaction_session_timeout = 0`,
		`SET LOCAL statement_timeout = 0`} {
		if _, err := tx.ExecContext(ctx, set); err != nil {
			return fmt.Errorf("migration settings: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext(current_schema() || '/migrations'))`); err != nil {
		return fmt.Errorf("lock migrations: %w", err)
	}
	version, err := schemaVersion(ctx, tx)
	if err != nil {
		return err
	}
	if fresh {
		if err := refuseTaken(ctx, tx, m, version); err != nil {
			return err
		}
	}
	if version >= m.Version {
		return nil
	}
	if err := apply(ctx, tx, m, version); err != nil {
		return fmt.Errorf("migration %s: %w", m.Name, err)
	}
	return classify(tx.Commit())
}

// refuseTaken refuses to create a database in a schema that holds one,
// or tables under Fleet's names: someone else's would make a confusing mix.
func refuseTaken(ctx context.Context, tx *sql.Tx, m store.Migration, version int) error {
	if m.Version == 1 && version != 0 {
		return errors.New("refusing a schema that already holds a Fleet database")
	}
	if version != 0 {
		return nil
	}
	var taken bool
	if err := tx.QueryRowContext(ctx, `SELECT to_regclass('jobs') IS NOT NULL OR to_regclass('documents') IS NOT NULL`).Scan(&taken); err != nil {
		return err
	}
	if taken {
		return errors.New("refusing a schema that already has tables named like Fleet's; use an empty schema (search_path=…)")
	}
	return nil
}

// apply runs a migration from version and records the schema's new one.
func apply(ctx context.Context, tx *sql.Tx, m store.Migration, version int) error {
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return err
	}
	if version == 0 {
		if _, err := tx.ExecContext(ctx, `CREATE TABLE fleet_schema (application TEXT NOT NULL, version BIGINT NOT NULL);
			INSERT INTO fleet_schema VALUES ('`+application+`', 0)`); err != nil {
			return err
		}
	}
	_, err := tx.ExecContext(ctx, `UPDATE fleet_schema SET version = $1`, m.Version)
	return err
}

// BeginWrite takes a connection; BEGIN goes out with the transaction's
// first statement (pipeline.go). It names READ COMMITTED, whatever the
// database's default: the write path counts on each statement seeing
// what committed before it (the sequencer's check runs after its lock to
// see every round committed before; a guarded transition rereads a row
// another transaction changed rather than failing on it).
func (d *driver) BeginWrite(ctx context.Context) (store.Conn, error) {
	return d.begin(ctx, "BEGIN ISOLATION LEVEL READ COMMITTED")
}

// BeginRead takes one snapshot for every statement, as a SQLite read
// transaction has.
func (d *driver) BeginRead(ctx context.Context) (store.Conn, error) {
	return d.begin(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
}

// BeginReadOne sends its one statement alone, outside any transaction
// (pipeline.go): a read of one statement needs no other snapshot.
func (d *driver) BeginReadOne(ctx context.Context) (store.Conn, error) {
	return d.begin(ctx, "")
}

func (d *driver) begin(ctx context.Context, begin string) (store.Conn, error) {
	c, err := d.conns.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	p := &pipeline{ctx: ctx, conn: c, begin: begin, roundTrips: &d.roundTrips}
	return &conn{q: dbsqlc.New(p), pipe: p, channel: d.channel, instance: d.instance}, nil
}

func (d *driver) Checkpoints() int64 { return 0 }
func (d *driver) RoundTrips() int64  { return d.roundTrips.Load() }
func (d *driver) Location() string   { return d.location }

func (d *driver) Close() error {
	if d.stopListen != nil {
		d.stopListen()
		d.listening.Wait()
	}
	err := d.pool.Close()
	d.conns.Close()
	return err
}

// Classify maps err to what the request is told; a lost connection also
// closes every other connection of the pool (those in use as they are
// given back): a restarted server or a reset link cut them all, and the
// pool pings only those idle for over a second when it hands them out.
func (d *driver) Classify(err error) error {
	if lost(err) {
		d.conns.Reset()
	}
	return classify(err)
}

func (d *driver) Lost(err error) bool { return lost(err) }

// lost reports a connection the server or the network ended under a
// request: its end reached (EOF), reset, refused, or the server shutting
// down or starting up. A timeout is not: the server may be slow, and a
// rerun would wait as long again.
func lost(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "57P") // admin shutdown, crash shutdown, cannot connect now
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return false
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) || netErr != nil || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED)
}

// PostgreSQL error codes a rerun resolves.
const (
	pgSerializationFailure = "40001"
	pgDeadlockDetected     = "40P01"
	pgUniqueViolation      = "23505"
	pgLockNotAvailable     = "55P03" // lock_timeout: a sick host held the lock
	// fleetGuardFailed is raised by fleet_guard() (migration 0009) when a
	// guarded transition changed no row.
	fleetGuardFailed = "FLGRD"
)

func (d *driver) Retryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case pgSerializationFailure, pgDeadlockDetected, pgUniqueViolation, pgLockNotAvailable:
		return true
	}
	return false
}

// classify maps a server that cannot be reached, or one that is out of
// disk or read-only, to unavailable: nothing was committed.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "53"): // insufficient resources, disk full
			return fleet.Errorf(wire.CodeUnavailable, "the database is out of resources; nothing was written (%v)", err)
		case pgErr.Code == "25006": // read-only transaction (a standby)
			return fleet.Errorf(wire.CodeUnavailable, "the database is read-only; nothing was written (%v)", err)
		case strings.HasPrefix(pgErr.Code, "57P"): // shutting down
			return fleet.Errorf(wire.CodeUnavailable, "the database is shutting down; nothing was written (%v)", err)
		case pgErr.Code == fleetGuardFailed:
			return fmt.Errorf("%w: %s", store.ErrGuard, pgErr.Message)
		}
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fleet.Errorf(wire.CodeUnavailable,
			"the database did not answer in time and the request was abandoned; if it was committing it may have taken effect, so send it again (%v)", err)
	}
	// A server that cannot be reached, or a connection lost mid-request.
	var connErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connErr) || errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, io.EOF) || errors.Is(err, sql.ErrConnDone) {
		return fleet.Errorf(wire.CodeUnavailable, "the database cannot be reached (%v)", err)
	}
	return err
}

// redact hides a password in a URL for messages.
func redact(location string) string {
	u, err := url.Parse(location)
	if err != nil {
		return "postgres://…"
	}
	return u.Redacted()
}

// CreateSchema makes a new empty schema in the PostgreSQL database at
// location and returns a URL whose connections use it (search_path), so a
// run or a test gets a database of its own without CREATE DATABASE.
func CreateSchema(ctx context.Context, location, name string) (string, error) {
	u, err := url.Parse(location)
	if err != nil {
		return "", fmt.Errorf("database URL: %w", err)
	}
	if err := checkSchemaName(name); err != nil {
		return "", err
	}
	d, err := openPool(location)
	if err != nil {
		return "", err
	}
	defer d.Close()
	if _, err := d.pool.ExecContext(ctx, `CREATE SCHEMA `+name); err != nil {
		return "", fmt.Errorf("create schema %s in %s: %w", name, redact(location), classify(err))
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// TableUpdates are a table's row updates as the server counted them,
// and how many of them were HOT (no index entry written).
type TableUpdates struct {
	Updates    int64 `json:"updates"`
	HOTUpdates int64 `json:"hot_updates"`
}

// SchemaUpdates reads the row updates of each table of a schema made by
// CreateSchema, by table, from pg_stat_user_tables: what the server has
// counted so far (a backend reports its counts when it goes idle a while
// or exits).
func SchemaUpdates(ctx context.Context, location, name string) (map[string]TableUpdates, error) {
	d, err := openPool(location)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	rows, err := d.pool.QueryContext(ctx, `SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = $1`, name)
	if err != nil {
		return nil, fmt.Errorf("read the updates of schema %s: %w", name, classify(err))
	}
	defer rows.Close()
	out := map[string]TableUpdates{}
	for rows.Next() {
		var table string
		var u TableUpdates
		if err := rows.Scan(&table, &u.Updates, &u.HOTUpdates); err != nil {
			return nil, err
		}
		out[table] = u
	}
	return out, rows.Err()
}

// dropLockTimeout bounds how long DropSchema waits for its schema's
// tables. Autovacuum, analyzing tables a run just filled, yields to a
// waiting DROP only after deadlock_timeout (a second by default, as long
// as LockTimeout): under the sessions' bound the drop could give up first
// and leave the schema behind.
const dropLockTimeout = 30 * time.Second

// DropSchema removes a schema made by CreateSchema, with everything in it.
func DropSchema(ctx context.Context, location, name string) error {
	if err := checkSchemaName(name); err != nil {
		return err
	}
	d, err := openPool(location)
	if err != nil {
		return err
	}
	defer d.Close()
	tx, err := d.pool.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, dropLockTimeout.Milliseconds())); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `DROP SCHEMA IF EXISTS `+name+` CASCADE`); err != nil {
		return err
	}
	return tx.Commit()
}

// checkSchemaName keeps names safe to splice into DDL, which takes no
// parameters.
func checkSchemaName(name string) error {
	if name == "" || len(name) > 63 || name[0] >= '0' && name[0] <= '9' {
		return fmt.Errorf("schema name %q: 1 to 63 of a-z, 0-9 and _, not starting with a digit", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return fmt.Errorf("schema name %q: use a-z, 0-9 and _", name)
		}
	}
	return nil
}

// WriterSlots bounds one host's write transactions in flight; the rest of
// the pool serves reads.
const WriterSlots = 12

// Writers is WriterSlots: each request is its own transaction, and the log
// is placed by the sequencer.
func (d *driver) Writers() int { return WriterSlots }

// VacuumAnalyze vacuums and analyzes the jobs table of the database a URL
// names. A fixture that rewrites many jobs at once (fleet-bench's backlog
// in backoff) leaves as many dead row versions in the indexes, which the
// same changes arriving one by one would not (autovacuum keeps up with
// those); this clears them, as the steady state would have.
func VacuumAnalyze(ctx context.Context, location string) error {
	d, err := openPool(location)
	if err != nil {
		return err
	}
	defer d.Close()
	_, err = d.pool.ExecContext(ctx, `VACUUM ANALYZE jobs`)
	return err
}
