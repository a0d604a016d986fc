package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/store"
)

// walAfterSteadyLoad commits 3,000 times, about a page each, from one
// goroutine while another runs checkpoints back to back (as the background
// checkpointer would under load, never quite catching up), and returns the
// WAL's size and how often the writer started it over.
func walAfterSteadyLoad(t *testing.T) (int64, int64) {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "fleet.sqlite3")
	db, err := Create(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := db.Driver().(*driver)
	// Every 100 commits the writer signals the checkpointer and carries on,
	// as commits go on while the background checkpointer copies.
	due := make(chan struct{}, 1)
	checkpointed := make(chan struct{})
	go func() {
		defer close(checkpointed)
		for range due {
			d.checkpoint()
		}
	}()
	payload := string(make([]byte, 3000))
	for i := range 3000 {
		if err := db.WithTx(ctx, func(tx *store.Tx) error { return tx.SettingPut(ctx, fmt.Sprint("k", i), payload) }); err != nil {
			t.Fatal(err)
		}
		if i%100 == 99 {
			select {
			case due <- struct{}{}:
			default: // still copying the last lot
			}
		}
	}
	close(due)
	<-checkpointed
	info, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	return info.Size(), d.walRestarts.Load()
}

// TestWALStartsOver: under a steady stream of commits the WAL stays near
// its restart limit; without the restart it grows with every commit.
func TestWALStartsOver(t *testing.T) {
	limit := WALRestartFrames
	t.Cleanup(func() { WALRestartFrames = limit })

	WALRestartFrames = math.MaxInt64 // no restarts: what SQLite does on its own
	unbounded, _ := walAfterSteadyLoad(t)
	WALRestartFrames = 256 // 1 MiB of 4 KiB pages
	bounded, restarts := walAfterSteadyLoad(t)
	t.Logf("WAL after 3,000 commits: %d bytes with no restart, %d bytes restarting every 256 frames (%d restarts)", unbounded, bounded, restarts)
	if unbounded < 8*bounded {
		t.Fatalf("the load did not reproduce the growth it guards against (%d bytes without restarts)", unbounded)
	}
	// Near the 1 MiB limit, plus what the commits add between the
	// checkpoint that notices and the restart (more on a loaded machine).
	if bounded > 6<<20 || restarts == 0 {
		t.Fatalf("the WAL is %d bytes after 3,000 commits, restarted %d times; it should stay within a few MiB", bounded, restarts)
	}
}

// TestWALRestartBesideALongReader: a replicator such as Litestream holds a
// read transaction on the database from another process for as long as it
// runs, so the log can never be started over under it. The writer must not
// wait out its busy timeout on that reader each time the log passes its
// restart limit: no commit waits more than a fraction of BusyTimeout, and
// the log keeps every commit while the reader holds it.
func TestWALRestartBesideALongReader(t *testing.T) {
	limit := WALRestartFrames
	t.Cleanup(func() { WALRestartFrames = limit })
	WALRestartFrames = 64
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "fleet.sqlite3")
	db, err := Create(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := db.Driver().(*driver)
	replicator, err := sql.Open("sqlite", dsn(path, true, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer replicator.Close()
	payload := string(make([]byte, 3000))
	put := func(i int) {
		if err := db.WithTx(ctx, func(tx *store.Tx) error { return tx.SettingPut(ctx, fmt.Sprint("k", i), payload) }); err != nil {
			t.Fatal(err)
		}
	}
	put(0)
	hold, err := replicator.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	var n int
	if err := hold.QueryRow(`SELECT COUNT(*) FROM settings`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	var slowest time.Duration
	for i := 1; i <= 400; i++ {
		began := time.Now()
		put(i)
		slowest = max(slowest, time.Since(began))
		if i%20 == 0 {
			d.checkpoint()
		}
	}
	t.Logf("slowest of 400 commits past the restart limit beside a long reader: %s", slowest)
	if slowest > BusyTimeout/4 {
		t.Fatalf("a commit waited %s on a reader that never lets the log start over", slowest)
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	// With the reader gone the writer starts the log over again.
	for i := 401; i <= 500; i++ {
		put(i)
		if i%20 == 0 {
			d.checkpoint()
		}
	}
	if d.walRestarts.Load() == 0 {
		t.Fatal("the log was never started over once the long reader had gone")
	}
}
