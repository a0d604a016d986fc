package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/store/sqlite"
	"github.com/fleet/fleet/internal/storetest"
)

// TestGroupCommitIsolation: concurrent write transactions that share
// commits stand or fall alone. A request that returns an error or panics
// leaves nothing behind; every other request's writes commit.
func TestGroupCommitIsolation(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		db, _ := storetest.MustCreate(t)
		errRefused := errors.New("refused")
		var wg sync.WaitGroup
		results := make([]error, 60)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = db.WithTx(ctx, func(tx *store.Tx) error {
					if err := tx.SettingPut(ctx, fmt.Sprint("k", i), "v"); err != nil {
						return err
					}
					switch i % 3 {
					case 1:
						return errRefused
					case 2:
						if i == 59 {
							panic("a bug in one request")
						}
					}
					return nil
				})
			}()
		}
		wg.Wait()
		var settings map[string]string
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) (err error) {
			settings, err = tx.SettingList(ctx)
			return err
		})
		for i, res := range results {
			_, kept := settings[fmt.Sprint("k", i)]
			wantKept := i%3 == 0 || (i%3 == 2 && i != 59)
			if kept != wantKept || (res == nil) != wantKept {
				t.Errorf("request %d: error %v, row kept %v", i, res, kept)
			}
		}
		if !errors.Is(results[1], errRefused) || results[59] == nil {
			t.Fatalf("errors not returned to their requests: %v, %v", results[1], results[59])
		}
		st := db.Stats()
		if st.WriteTransactions != 60 || st.Commits > st.WriteTransactions {
			t.Fatalf("stats %+v", st)
		}
		t.Logf("%d transactions in %d commits", st.WriteTransactions, st.Commits)
	})
}

func TestCloseTwice(t *testing.T) {
	db, _ := storetest.MustCreate(t)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.WithTx(context.Background(), func(tx *store.Tx) error { return nil }); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("a write after close: %v", err)
	}
}

// TestCreateOpenRefusals: on either backend, opening where no Fleet
// database is fails, creating over an existing one fails, and a created one
// opens again, read-write and read-only.
func TestCreateOpenRefusals(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		loc := storetest.NewLocation(t)
		if db, err := backend.Open(ctx, loc, backend.Options{}); err == nil {
			db.Close()
			t.Fatal("opened a location with no Fleet database")
		}
		db, err := backend.Create(ctx, loc)
		if err != nil {
			t.Fatal(err)
		}
		db.Close()
		if db, err := backend.Create(ctx, loc); err == nil {
			db.Close()
			t.Fatal("created a second database over the first")
		}
		for _, open := range []func(context.Context, string) (*store.DB, error){
			func(ctx context.Context, l string) (*store.DB, error) { return backend.Open(ctx, l, backend.Options{}) },
			backend.OpenReadOnly} {
			db, err := open(ctx, loc)
			if err != nil {
				t.Fatal(err)
			}
			if store.IsURL(db.Location()) != storetest.OnPostgres(t) {
				t.Fatalf("opened %s under %s", db.Location(), t.Name())
			}
			db.Close()
		}
	})
}

// TestMigrationsInStep: both backends have the same numbered migrations, so
// a schema version means the same schema on either.
func TestMigrationsInStep(t *testing.T) {
	lite, pg := sqlite.Migrations(), postgres.Migrations()
	if len(lite) != len(pg) || len(lite) != backend.SchemaVersion() {
		t.Fatalf("%d SQLite and %d PostgreSQL migrations", len(lite), len(pg))
	}
	created := map[string]bool{} // by earlier SQLite migrations
	for i := range lite {
		if lite[i].Name != pg[i].Name {
			t.Errorf("migration %d is %s on SQLite and %s on PostgreSQL", i+1, lite[i].Name, pg[i].Name)
		}
		// Every table and index SQLite gets, PostgreSQL gets too, except
		// what SQLite re-creates when it rebuilds a table (a CHECK cannot
		// change in place): the new table under a name ending in the
		// migration's number, and the indexes it had.
		rebuild := fmt.Sprintf("_%04d", lite[i].Version)
		var names []string
		for _, line := range strings.Split(lite[i].SQL, "\n") {
			if !strings.HasPrefix(line, "CREATE ") {
				continue
			}
			f := strings.Fields(line)
			name := f[2]
			names = append(names, name)
			if created[name] || strings.HasSuffix(name, rebuild) {
				continue
			}
			if !strings.Contains(pg[i].SQL, f[0]+" "+strings.Join(f[1:3], " ")) {
				t.Errorf("%s: PostgreSQL lacks %q", lite[i].Name, line)
			}
		}
		for _, name := range names {
			created[name] = true
		}
	}
}
