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

// pendingTable is a schema's pending log, written and placed through a
// bare driver (no sequencer places behind the test's back).
type pendingTable struct {
	t  testing.TB
	d  store.Driver
	db *sql.DB
}

func newPendingTable(t testing.TB, location string) *pendingTable {
	t.Helper()
	ctx := context.Background()
	created, err := postgres.Create(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	created.Close()
	d, err := postgres.OpenDriver(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	db, err := sql.Open("pgx", location)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &pendingTable{t: t, d: d, db: db}
}

// rows is how many rows the pending log holds.
func (p *pendingTable) rows() (n int) {
	p.t.Helper()
	if err := p.db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM pending_log`).Scan(&n); err != nil {
		p.t.Fatal(err)
	}
	return n
}

// write runs fn in a write transaction and commits it.
func (p *pendingTable) write(fn func(ctx context.Context, conn store.Conn) error) {
	p.t.Helper()
	ctx := context.Background()
	conn, err := p.d.BeginWrite(ctx)
	if err != nil {
		p.t.Fatal(err)
	}
	defer conn.Rollback()
	if err := fn(ctx, conn); err != nil {
		p.t.Fatal(err)
	}
	if err := conn.Commit(); err != nil {
		p.t.Fatal(err)
	}
}

// place runs a sequencer's round of up to limit entries of each kind,
// numbered after the placed log's heads, and says how many it placed.
func (p *pendingTable) place(limit int) (events, receipts int) {
	p.t.Helper()
	p.write(func(ctx context.Context, conn store.Conn) error {
		pending, err := conn.PendingLogList(ctx, limit)
		if err != nil {
			return err
		}
		params := &store.PendingLogPlaceParams{FirstEvent: pending.LastEvent + 1, Placed: store.PendingIDs{Events: pending.Events}}
		for i, r := range pending.Receipts {
			r.Receipt.Sequence = pending.Head.Sequence + int64(i) + 1
			params.Receipts = append(params.Receipts, store.StoredReceipt{Receipt: r.Receipt, Stored: []byte(`{}`)})
			params.Placed.Receipts = append(params.Placed.Receipts, r.Pending)
		}
		events, receipts = len(pending.Events), len(pending.Receipts)
		return conn.PendingLogPlace(ctx, params)
	})
	return events, receipts
}

func claimedEvents(n int) []wire.Event {
	evs := make([]wire.Event, n)
	for i := range evs {
		evs[i] = wire.Event{TimestampMS: int64(i), Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i), Data: json.RawMessage(`{}`)}
	}
	return evs
}

// TestPendingLogRowATransaction: a transaction's pending log is one row
// however many entries it holds (none for an empty log), and a round that
// places part of a row leaves the rest pending in it: the row goes once
// every entry is placed.
func TestPendingLogRowATransaction(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	location := storetest.NewPostgresLocation(t)
	p := newPendingTable(t, location)
	p.write(func(ctx context.Context, conn store.Conn) error {
		_, err := conn.PendingLogInsert(ctx, claimedEvents(600), []wire.Receipt{{ID: "rcpt-a"}, {ID: "rcpt-b"}})
		return err
	})
	p.write(func(ctx context.Context, conn store.Conn) error {
		_, err := conn.PendingLogInsert(ctx, claimedEvents(1), nil)
		return err
	})
	p.write(func(ctx context.Context, conn store.Conn) error {
		ids, err := conn.PendingLogInsert(ctx, nil, nil)
		if len(ids.Events)+len(ids.Receipts) != 0 {
			t.Errorf("an empty log got pending ids %+v", ids)
		}
		return err
	})
	if n := p.rows(); n != 2 {
		t.Fatalf("three transactions' logs (600 events and 2 receipts, 1 event, nothing) in %d pending rows, want 2", n)
	}
	if e, r := p.place(550); e != 550 || r != 2 || p.rows() != 2 {
		t.Fatalf("a round of 550 placed %d events and %d receipts, leaving %d rows; want 550, 2 and both rows", e, r, p.rows())
	}
	if e, r := p.place(550); e != 51 || r != 0 || p.rows() != 0 {
		t.Fatalf("the next round placed %d events and %d receipts, leaving %d rows; want 51, 0 and none", e, r, p.rows())
	}
	storetest.Read(t, storetest.MustOpen(t, location), func(ctx context.Context, tx *store.Tx) error {
		if last, err := tx.EventLast(ctx); err != nil || last != 601 {
			t.Errorf("the last event placed: %d (%v), want 601", last, err)
		}
		// Each event copied from its row in the order appended: the first
		// row's 600 (a round's worth, then the rest), then the second's.
		events, err := tx.EventList(ctx, 0, 1000)
		if err != nil {
			return err
		}
		for i, e := range events {
			want := fmt.Sprint(i % 600)
			if e.Sequence != int64(i+1) || e.Title != want || e.TimestampMS != int64(i%600) {
				t.Fatalf("event %d: sequence %d, title %q, at %d; want %d, %q", i, e.Sequence, e.Title, e.TimestampMS, i+1, want)
			}
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
	conn, err := d.BeginWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Rollback()
	p, err := conn.PendingLogList(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Events) != 2 || len(p.Receipts) != 1 || p.Receipts[0].Receipt.ID != "rcpt-a" {
		t.Fatalf("pending after the migration: events %v, receipts %+v", p.Events, p.Receipts)
	}
	if err := conn.PendingLogPlace(ctx, &store.PendingLogPlaceParams{FirstEvent: 1, Placed: store.PendingIDs{Events: p.Events}}); err != nil {
		t.Fatal(err)
	}
	events, err := conn.EventList(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 2 || events[0].Title != "first" || events[0].OperationID != "op-1" || events[0].Sequence != 1 ||
		events[1].Title != "second" || events[1].Sequence != 2 {
		t.Fatalf("the migrated events placed: %+v", events)
	}
}
