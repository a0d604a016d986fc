package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
)

// TestGroupCommitIsolation: concurrent write transactions that share
// commits stand or fall alone. A request that returns an error or panics
// leaves nothing behind; every other request's writes commit.
func TestGroupCommitIsolation(t *testing.T) {
	t.Parallel()
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
				if _, err := tx.ExecContext(ctx, `INSERT INTO settings (name, value) VALUES ($1, $2)`, fmt.Sprint("k", i), "v"); err != nil {
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
	var kept int
	err := db.Read(ctx, func(tx *store.Tx) error {
		for i, res := range results {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM settings WHERE name = $1`, fmt.Sprint("k", i)).Scan(&n); err != nil {
				return err
			}
			wantKept := i%3 == 0 || (i%3 == 2 && i != 59)
			if (n == 1) != wantKept || (res == nil) != wantKept {
				t.Errorf("request %d: error %v, row kept %v", i, res, n == 1)
			}
			kept += n
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(results[1], errRefused) || results[59] == nil {
		t.Fatalf("errors not returned to their requests: %v, %v", results[1], results[59])
	}
	st := db.Stats()
	if st.WriteTransactions != 60 || st.Commits > st.WriteTransactions {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("%d rows kept; %d transactions in %d commits", kept, st.WriteTransactions, st.Commits)
}

func TestCloseTwice(t *testing.T) {
	db, _ := storetest.MustCreate(t)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.WithTx(context.Background(), func(tx *store.Tx) error { return nil }); err == nil {
		t.Fatal("a write after close succeeded")
	}
}

// TestCreateOpenRefusals: on either backend, opening where no Fleet
// database is fails, creating over an existing one fails, and a created one
// opens again.
func TestCreateOpenRefusals(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		loc := storetest.NewLocation(t)
		if db, err := store.Open(ctx, loc); err == nil {
			db.Close()
			t.Fatal("opened a location with no Fleet database")
		}
		db, err := store.Create(ctx, loc)
		if err != nil {
			t.Fatal(err)
		}
		db.Close()
		if db, err := store.Create(ctx, loc); err == nil {
			db.Close()
			t.Fatal("created a second database over the first")
		}
		for _, open := range []func(context.Context, string) (*store.DB, error){
			func(ctx context.Context, l string) (*store.DB, error) { return store.Open(ctx, l) }, store.OpenReadOnly} {
			db, err := open(ctx, loc)
			if err != nil {
				t.Fatal(err)
			}
			if db.Postgres() != storetest.OnPostgres(t) {
				t.Fatalf("Postgres() = %v under %s", db.Postgres(), t.Name())
			}
			db.Close()
		}
	})
}
