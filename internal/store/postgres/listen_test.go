package postgres_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// listening opens another host's bare driver on location and returns its
// Placed channel once its listener has connected.
func listening(t *testing.T, location string) <-chan struct{} {
	t.Helper()
	other, err := postgres.OpenDriver(context.Background(), location)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	placed := other.Placed()
	// The listener announces itself once connected (rounds may have
	// committed while it was away).
	select {
	case <-placed:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener never connected")
	}
	return placed
}

// TestPlacedReachesOtherHosts: when one host's sequencer places log
// entries, another host's driver hears of it (LISTEN/NOTIFY), which is
// what lets that host answer requests whose entries it did not place
// without waiting for its 50 ms recheck.
func TestPlacedReachesOtherHosts(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	t.Run(storetest.Postgres, func(t *testing.T) {
		writer, location := storetest.MustCreate(t)
		placed := listening(t, location)
		storetest.Write(t, writer, func(ctx context.Context, tx *store.Tx) error {
			return tx.AppendEvent(wire.Event{TimestampMS: 1, Kind: wire.EventStarted, Actor: "h", Title: "t", Data: json.RawMessage(`{}`)})
		})
		select {
		case <-placed:
		case <-time.After(10 * time.Second):
			t.Fatal("another host's round was not announced")
		}
	})
}

// TestEmptyRoundIsAnnounced: a round that finds nothing pending is
// announced too, so that a host that found the log lock taken while it
// ran, and waits for news before trying again, tries at once.
func TestEmptyRoundIsAnnounced(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	t.Run(storetest.Postgres, func(t *testing.T) {
		db, location := storetest.MustCreate(t)
		placed := listening(t, location)
		if err := db.PlacePending(context.Background()); err != nil { // a round with nothing to place
			t.Fatal(err)
		}
		select {
		case <-placed:
		case <-time.After(10 * time.Second):
			t.Fatal("a round that placed nothing was not announced")
		}
	})
}
