package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
)

// TestTextComparesAsBytes: in a database whose default collation is a
// locale's (ICU's en-US here; a cluster made in an en_US locale, as the
// official container image makes it, has glibc's), the schema's text
// still compares byte by byte, as SQLite's does, whether the schema was
// created so or migrated from a build before (schema 22) with rows in it.
// Lists by name come out in the same order on both backends, and no key's
// index pays for a locale's comparisons.
func TestTextComparesAsBytes(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	server := newLocaleDatabase(t, "LOCALE_PROVIDER icu ICU_LOCALE 'en-US'")
	// Bytes put '-' and '.' before digits and '_' after them; en-US puts
	// all three before digits, '_' first.
	names := []string{"a_b", "a1", "a.b", "a-b"}
	t.Run("created", func(t *testing.T) {
		location := storetest.NewPostgresLocationOn(t, server)
		db, err := backend.Create(context.Background(), location)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			for _, name := range names {
				if err := tx.TenantInsert(ctx, store.Tenant{Name: name, Weight: 1, CreatedAtMS: 1}); err != nil {
					return err
				}
			}
			return nil
		})
		checkTextAsBytes(t, db, location, names)
	})
	t.Run("migrated", func(t *testing.T) {
		ctx := context.Background()
		location := storetest.NewPostgresLocationOn(t, server)
		if err := postgres.CreateAtVersion(ctx, location, 22); err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			if err := postgres.Exec(ctx, location, `WITH t AS (INSERT INTO tenants (name, created_at_ms) VALUES ($1, 1) RETURNING name)
				INSERT INTO tenant_shards (tenant, shard, spent, reserved) SELECT t.name, g, 0, 0 FROM t, generate_series(0, 15) AS g`, name); err != nil {
				t.Fatal(err)
			}
		}
		checkTextAsBytes(t, storetest.MustOpen(t, location), location, names)
	})
}

// checkTextAsBytes checks that db lists its tenants, names, in byte order
// and that no text column of its schema compares by a locale.
func checkTextAsBytes(t *testing.T, db *store.DB, location string, names []string) {
	t.Helper()
	var listed []string
	storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
		all, err := tx.TenantList(ctx)
		for _, x := range all {
			listed = append(listed, x.Name)
		}
		return err
	})
	want := slices.Sorted(slices.Values(names))
	if !slices.Equal(listed, want) {
		t.Errorf("tenants listed %q, want them in byte order %q, as SQLite lists them", listed, want)
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT c.table_name || '.' || c.column_name FROM information_schema.columns c
		WHERE c.table_schema = current_schema() AND c.data_type IN ('text', 'character varying')
			AND c.collation_name IS DISTINCT FROM 'C'
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	localeColumns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(localeColumns) > 0 {
		t.Errorf("%d text columns compare by the database's locale, not as bytes: %q", len(localeColumns), localeColumns)
	}
}

// newLocaleDatabase creates a database with the given locale clauses on
// the test server, dropped at cleanup, and returns its URL.
func newLocaleDatabase(t *testing.T, locale string) string {
	t.Helper()
	ctx := context.Background()
	suffix := make([]byte, 8)
	rand.Read(suffix)
	name := "test_locale_" + hex.EncodeToString(suffix)
	admin, err := pgx.Connect(ctx, storetest.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template0 "+locale); err != nil {
		t.Fatalf("create a database with %s: %v", locale, err)
	}
	t.Cleanup(func() {
		admin, err := pgx.Connect(ctx, storetest.PostgresURL())
		if err != nil {
			t.Logf("drop database %s: %v", name, err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(storetest.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}
