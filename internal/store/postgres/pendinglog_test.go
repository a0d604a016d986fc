package postgres_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestPendingLogRowATransaction: a transaction's pending log is one row
// however many entries it holds (none for an empty log), and a round that
// places part of a row leaves the rest pending in it: the row goes once
// every entry is placed.
func TestPendingLogRowATransaction(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	ctx := context.Background()
	location := storetest.NewPostgresLocation(t)
	created, err := postgres.Create(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	created.Close()
	d, err := postgres.OpenDriver(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	db, err := sql.Open("pgx", location)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows := func() (n int) {
		t.Helper()
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM pending_log`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	events := func(n int) []wire.Event {
		evs := make([]wire.Event, n)
		for i := range evs {
			evs[i] = wire.Event{TimestampMS: int64(i), Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i), Data: json.RawMessage(`{}`)}
		}
		return evs
	}
	write := func(fn func(conn store.Conn) error) {
		t.Helper()
		conn, err := d.BeginWrite(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Rollback()
		if err := fn(conn); err != nil {
			t.Fatal(err)
		}
		if err := conn.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	write(func(conn store.Conn) error {
		_, err := conn.PendingLogInsert(ctx, events(600), []wire.Receipt{{ID: "rcpt-a"}, {ID: "rcpt-b"}})
		return err
	})
	write(func(conn store.Conn) error {
		_, err := conn.PendingLogInsert(ctx, events(1), nil)
		return err
	})
	write(func(conn store.Conn) error {
		ids, err := conn.PendingLogInsert(ctx, nil, nil)
		if len(ids.Events)+len(ids.Receipts) != 0 {
			t.Errorf("an empty log got pending ids %+v", ids)
		}
		return err
	})
	if n := rows(); n != 2 {
		t.Fatalf("three transactions' logs (600 events and 2 receipts, 1 event, nothing) in %d pending rows, want 2", n)
	}
	place := func(limit int) (placedEvents, placedReceipts int) {
		t.Helper()
		write(func(conn store.Conn) error {
			p, err := conn.PendingLogList(ctx, limit)
			if err != nil {
				return err
			}
			params := &store.PendingLogPlaceParams{}
			for i, e := range p.Events {
				e.Event.Sequence = p.LastEvent + int64(i) + 1
				params.Events, params.Placed.Events = append(params.Events, e.Event), append(params.Placed.Events, e.Pending)
			}
			for i, r := range p.Receipts {
				r.Receipt.Sequence = p.Head.Sequence + int64(i) + 1
				params.Receipts = append(params.Receipts, store.StoredReceipt{Receipt: r.Receipt, Stored: []byte(`{}`)})
				params.Placed.Receipts = append(params.Placed.Receipts, r.Pending)
			}
			placedEvents, placedReceipts = len(p.Events), len(p.Receipts)
			return conn.PendingLogPlace(ctx, params)
		})
		return placedEvents, placedReceipts
	}
	if e, r := place(550); e != 550 || r != 2 || rows() != 2 {
		t.Fatalf("a round of 550 placed %d events and %d receipts, leaving %d rows; want 550, 2 and both rows", e, r, rows())
	}
	if e, r := place(550); e != 51 || r != 0 || rows() != 0 {
		t.Fatalf("the next round placed %d events and %d receipts, leaving %d rows; want 51, 0 and none", e, r, rows())
	}
	storetest.Read(t, storetest.MustOpen(t, location), func(ctx context.Context, tx *store.Tx) error {
		if last, err := tx.EventLast(ctx); err != nil || last != 601 {
			t.Errorf("the last event placed: %d (%v), want 601", last, err)
		}
		return nil
	})
}

// TestPendingLogPackedMigration: entries pending when migration 21 runs
// (a host stopped between a commit and its sequencer's round) wait on in
// the packed table, each kind in its order, and a round lists them there.
func TestPendingLogPackedMigration(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	ctx := context.Background()
	location := storetest.NewPostgresLocation(t)
	if err := postgres.CreateAtVersion(ctx, location, 20); err != nil {
		t.Fatal(err)
	}
	execAll(t, location,
		`INSERT INTO pending_events (timestamp_ms, kind, actor, title, data, operation_id) VALUES (1, 'fleet.claimed', 'w', 'first', '{}', 'op-1')`,
		`INSERT INTO pending_receipts (receipt_id, body) VALUES ('rcpt-a', '{"id":"rcpt-a"}')`,
		`INSERT INTO pending_events (timestamp_ms, kind, actor, title, data, operation_id) VALUES (2, 'fleet.claimed', 'w', 'second', '{}', '')`,
	)
	if err := postgres.MigrateBetween(ctx, location, 20, 21); err != nil {
		t.Fatal(err)
	}
	d, err := postgres.OpenDriver(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	conn, err := d.BeginRead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Rollback()
	p, err := conn.PendingLogList(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Events) != 2 || p.Events[0].Event.Title != "first" || p.Events[0].Event.OperationID != "op-1" || p.Events[1].Event.Title != "second" ||
		len(p.Receipts) != 1 || p.Receipts[0].Receipt.ID != "rcpt-a" {
		t.Fatalf("pending after the migration: events %+v, receipts %+v", p.Events, p.Receipts)
	}
}
