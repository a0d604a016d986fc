package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/fleet/fleet/internal/fleet"
)

// On PostgreSQL several hosts write at once. Each host still groups its
// writes (see committer): one READ COMMITTED transaction per batch, one
// savepoint per request. What SQLite's single writer gave for free is asked
// for explicitly: rows a request will change are read FOR UPDATE
// (Tx.ForUpdate), claims skip rows another host holds (Tx.SkipLocked), and
// the receipt chain, event log and job positions are appended under
// advisory locks (Tx.LockChain). A request that loses a deadlock or a
// serialization race, or trips a unique key another host just took, is
// rolled back to its savepoint and run again; the rerun sees the other
// host's commit and decides from it.

// postgresApplication marks a schema as Fleet's, as SQLite's application_id
// does for a file.
const postgresApplication = "fleet"

// PostgresPoolSize bounds one host's connections.
const PostgresPoolSize = 16

// maxAttempts bounds retries of one write transaction.
const maxAttempts = 20

func openPostgresPool(location string) (*DB, error) {
	pool, err := sql.Open("pgx", location)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", redact(location), err)
	}
	pool.SetMaxOpenConns(PostgresPoolSize)
	pool.SetMaxIdleConns(PostgresPoolSize)
	pool.SetConnMaxIdleTime(5 * time.Minute)
	db := &DB{pg: true, write: pool, read: pool, path: redact(location), Now: time.Now}
	db.startCommitter()
	return db, nil
}

// postgresVersion reads the version recorded in fleet_schema, or 0 when the
// schema holds no Fleet tables at all.
func (db *DB) postgresVersion(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (int, error) {
	var exists bool
	if err := q.QueryRowContext(ctx, `SELECT to_regclass('fleet_schema') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, classifyPostgres(err)
	}
	if !exists {
		return 0, nil
	}
	var app string
	var version int
	if err := q.QueryRowContext(ctx, `SELECT application, version FROM fleet_schema`).Scan(&app, &version); err != nil {
		return 0, fmt.Errorf("read fleet_schema: %w", err)
	}
	if app != postgresApplication {
		return 0, fmt.Errorf("not a Fleet database (application %q)", app)
	}
	return version, nil
}

func createPostgres(ctx context.Context, location string) (*DB, error) {
	db, err := openPostgresPool(location)
	if err != nil {
		return nil, err
	}
	if err := db.migratePostgres(ctx, true); err != nil {
		db.Close()
		return nil, fmt.Errorf("create database %s: %w", redact(location), err)
	}
	return db, nil
}

func openPostgres(ctx context.Context, location string, readOnly bool) (*DB, error) {
	db, err := openPostgresPool(location)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*DB, error) {
		db.Close()
		return nil, fmt.Errorf("open database %s: %w", redact(location), err)
	}
	version, err := db.postgresVersion(ctx, db.read)
	switch {
	case err != nil:
		return fail(err)
	case version == 0:
		return fail(errors.New("no Fleet schema here; run fleet-host init with this --database first"))
	case version > SchemaVersion():
		return fail(fmt.Errorf("unknown schema version %d (this build knows 1 to %d)", version, SchemaVersion()))
	case version < SchemaVersion() && readOnly:
		return fail(fmt.Errorf("schema version %d needs migrating to %d; open it read-write first", version, SchemaVersion()))
	case version < SchemaVersion():
		if err := db.migratePostgres(ctx, false); err != nil {
			return fail(err)
		}
	}
	return db, nil
}

// migratePostgres applies the migrations the schema lacks, each in its own
// transaction with the version that records it. An advisory lock makes
// hosts that start together migrate one at a time. With fresh set, a schema
// that already holds Fleet's tables is refused.
func (db *DB) migratePostgres(ctx context.Context, fresh bool) error {
	for _, m := range mustMigrations(dialectPostgres) {
		err := db.runTx(ctx, db.write, db.Now(), false, func(tx *Tx) error {
			if err := tx.LockChain(ctx, "migrations"); err != nil {
				return err
			}
			version, err := db.postgresVersion(ctx, tx)
			if err != nil {
				return err
			}
			if fresh && m.version == 1 && version != 0 {
				return errors.New("refusing a schema that already holds a Fleet database")
			}
			if fresh && version == 0 {
				// Someone else's tables under our names would make a confusing mix.
				var taken bool
				if err := tx.QueryRowContext(ctx, `SELECT to_regclass('jobs') IS NOT NULL OR to_regclass('documents') IS NOT NULL`).Scan(&taken); err != nil {
					return err
				}
				if taken {
					return errors.New("refusing a schema that already has tables named like Fleet's; use an empty schema (search_path=…)")
				}
			}
			if version >= m.version {
				return nil
			}
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
			if version == 0 {
				_, err = tx.ExecContext(ctx, `CREATE TABLE fleet_schema (application TEXT NOT NULL, version BIGINT NOT NULL);
					INSERT INTO fleet_schema VALUES ('`+postgresApplication+`', 0)`)
				if err != nil {
					return fmt.Errorf("migration %s: %w", m.name, err)
				}
			}
			if _, err := tx.ExecContext(ctx, `UPDATE fleet_schema SET version = $1`, m.version); err != nil {
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

// PostgreSQL error codes a rerun resolves.
const (
	pgSerializationFailure = "40001"
	pgDeadlockDetected     = "40P01"
	pgUniqueViolation      = "23505"
)

func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case pgSerializationFailure, pgDeadlockDetected, pgUniqueViolation:
		return true
	}
	return false
}

// classifyPostgres maps a server that cannot be reached, or one that is out
// of disk or read-only, to unavailable: nothing was committed.
func classifyPostgres(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "53"): // insufficient resources, disk full
			return fleet.Errorf(fleet.CodeUnavailable, "the database is out of resources; nothing was written (%v)", err)
		case pgErr.Code == "25006": // read-only transaction (a standby)
			return fleet.Errorf(fleet.CodeUnavailable, "the database is read-only; nothing was written (%v)", err)
		case strings.HasPrefix(pgErr.Code, "57P"): // shutting down
			return fleet.Errorf(fleet.CodeUnavailable, "the database is shutting down; nothing was written (%v)", err)
		}
		return err
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) || errors.Is(err, sql.ErrConnDone) {
		return fleet.Errorf(fleet.CodeUnavailable, "the database cannot be reached (%v)", err)
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
	pool, err := sql.Open("pgx", location)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	if _, err := pool.ExecContext(ctx, `CREATE SCHEMA `+name); err != nil {
		return "", fmt.Errorf("create schema %s in %s: %w", name, redact(location), classifyPostgres(err))
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// DropSchema removes a schema made by CreateSchema, with everything in it.
func DropSchema(ctx context.Context, location, name string) error {
	if err := checkSchemaName(name); err != nil {
		return err
	}
	pool, err := sql.Open("pgx", location)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, err = pool.ExecContext(ctx, `DROP SCHEMA IF EXISTS `+name+` CASCADE`)
	return err
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
