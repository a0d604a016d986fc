package sqlite

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

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
