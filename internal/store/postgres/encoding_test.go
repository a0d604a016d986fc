package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
)

// TestTextTravelsAsUTF8: Fleet's text is UTF-8 (pgx's too), so a database
// that stores another encoding is refused at once, naming it, rather than
// left to store every non-ASCII byte as a character of its own (a LATIN1
// database took "日本" as six Latin-1 characters); a database whose
// sessions default to another client encoding still receives UTF-8 as
// UTF-8; and SQL_ASCII, which converts nothing, keeps it as it is.
func TestTextTravelsAsUTF8(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	t.Run("a LATIN1 database is refused", func(t *testing.T) {
		server := newLocaleDatabase(t, "ENCODING 'LATIN1' LOCALE 'C'")
		db, err := backend.Create(context.Background(), storetest.NewPostgresLocationOn(t, server))
		if err == nil {
			db.Close()
			t.Fatal("created a Fleet database in a LATIN1 database")
		}
		if msg := err.Error(); !strings.Contains(msg, "the database's encoding is LATIN1") || !strings.Contains(msg, "ENCODING 'UTF8'") {
			t.Fatalf("the refusal does not name the encoding it found and the one it needs: %v", err)
		}
	})
	t.Run("a LATIN1 database's schema is not served", func(t *testing.T) {
		// A schema an older build made there, before Create refused it
		// (at version 10: 0011's text holds a character LATIN1 has not).
		location := storetest.NewPostgresLocationOn(t, newLocaleDatabase(t, "ENCODING 'LATIN1' LOCALE 'C'"))
		if err := postgres.CreateAtVersion(context.Background(), location, 10); err != nil {
			t.Fatal(err)
		}
		db, err := backend.Open(context.Background(), location, backend.Options{})
		if err == nil {
			db.Close()
			t.Fatal("opened a Fleet schema in a LATIN1 database")
		}
		// Refused before migrating, not by the first migration whose
		// text LATIN1 cannot hold.
		if msg := err.Error(); !strings.Contains(msg, "the database's encoding is LATIN1") || !strings.Contains(msg, "ENCODING 'UTF8'") {
			t.Fatalf("the refusal does not name the encoding it found and the one it needs: %v", err)
		}
	})
	t.Run("sessions that default to LATIN1", func(t *testing.T) {
		checkStoredAsSent(t, storetest.NewPostgresLocationOn(t, newDatabaseDefaulting(t, "client_encoding", "LATIN1")))
	})
	t.Run("a SQL_ASCII database", func(t *testing.T) {
		checkStoredAsSent(t, storetest.NewPostgresLocationOn(t, newLocaleDatabase(t, "ENCODING 'SQL_ASCII' LOCALE 'C'")))
	})
}

// checkStoredAsSent writes non-ASCII text through Fleet into a new
// database at location and reads it back as UTF-8 on a session of its own.
func checkStoredAsSent(t *testing.T, location string) {
	t.Helper()
	ctx := context.Background()
	db, err := backend.Create(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const value = "日本 ✓ é"
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		return tx.SettingPut(ctx, "greeting", value)
	})
	reader, err := pgx.Connect(ctx, location+"&client_encoding=UTF8")
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close(ctx)
	var stored string
	if err := reader.QueryRow(ctx, "SELECT value FROM settings WHERE name = 'greeting'").Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != value {
		t.Fatalf("stored %q for %q", stored, value)
	}
}
