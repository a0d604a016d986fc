package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/sqlite"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestEventFiltersMigration: events written before migration 11 name their
// job only in their data; opening the database fills the job in from
// there, so a job's older events are found by it, and data that is not
// JSON, or names no job as text, leaves the event about none.
func TestEventFiltersMigration(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleet.sqlite3")
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range sqlite.Migrations()[:10] {
		if _, err := raw.Exec(m.SQL); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
	}
	for i, data := range []string{`{"operation_id":"op-1","section":"s"}`, `{}`, `not json`, `{"operation_id":5}`,
		`{"accounting":{"spent":1},"operation_id":"op-1"}`} {
		if _, err := raw.Exec(`INSERT INTO events (sequence, timestamp_ms, kind, actor, title, data) VALUES (?, 1, 'fleet.claimed', 'w', 't', ?)`,
			i+1, data); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := raw.Exec(fmt.Sprintf("PRAGMA application_id = %d; PRAGMA user_version = 10", sqlite.ApplicationID)); err != nil {
		t.Fatal(err)
	}
	raw.Close()

	db := storetest.MustOpen(t, path)
	storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
		evs, err := tx.EventListNewest(ctx, store.EventFilter{Before: math.MaxInt64, OperationID: "op-1", Limit: 10})
		if err != nil || len(evs) != 2 || evs[0].Sequence != 1 || evs[1].Sequence != 5 {
			t.Fatalf("op-1's events after the migration: %+v (%v)", evs, err)
		}
		all, err := tx.EventList(ctx, 0, 10)
		if err != nil || len(all) != 5 || all[1].OperationID != "" || all[2].OperationID != "" || all[3].OperationID != "" ||
			string(all[2].Data) != "not json" {
			t.Fatalf("every event after the migration: %+v (%v)", all, err)
		}
		return nil
	})
}

// TestTenantsMigration: a database from before tenants (schema 12) opens
// with one tenant, default, holding the fleet's figures and no allowance
// of its own.
func TestTenantsMigration(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleet.sqlite3")
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range sqlite.Migrations()[:12] {
		if _, err := raw.Exec(m.SQL); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
	}
	if _, err := raw.Exec(`INSERT INTO accounting (id, allowance, spent, reserved, calls, cost_per_report) VALUES (1, 200, 40, 60, 5, 20)`); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(fmt.Sprintf("PRAGMA application_id = %d; PRAGMA user_version = 12", sqlite.ApplicationID)); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	db := storetest.MustOpen(t, path)
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		all, err := tx.TenantList(ctx)
		if err != nil || len(all) != 1 || all[0].Name != wire.DefaultTenant || all[0].Allowance != nil || all[0].Spent != 40 || all[0].Reserved != 60 {
			t.Fatalf("tenants after the migration: %+v (%v)", all, err)
		}
		if ok, err := tx.TenantMove(ctx, &store.TenantMoveParams{Tenant: wire.DefaultTenant, Shard: -1, FromReserved: 60, ToSpent: 60}); err != nil || !ok {
			t.Fatalf("settling the old reservations at the tenant: %v %v", ok, err)
		}
		return nil
	})
}
