package views_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/views"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestCountsSharedByHosts: two hosts on one PostgreSQL database count the
// jobs by state once between them. What one counted, the other reads
// while it is under a second old, and counts afresh after; a host that
// finds another counting (the counts lock held) keeps the count saved
// before, without waiting; a count dated ahead of the host's clock is not
// taken for fresh. Each host's stats count the saves it made. A refused
// save leaves the host counting for itself. On SQLite the one host counts
// for itself and saves nothing.
func TestCountsSharedByHosts(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		db, location := storetest.MustCreate(t)
		clock := storetest.NewClock(time.UnixMilli(1_000_000))
		db.Now = clock.Now
		jobs := 0
		enqueue := func() {
			t.Helper()
			jobs++
			op := fmt.Sprint("op-", jobs)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				if err := tx.DocumentInsert(ctx, "doc-"+op, 1); err != nil {
					return err
				}
				return tx.JobInsert(ctx, &store.JobInsertParams{OperationID: op, Position: int64(jobs), BatchKey: "b",
					Section: "summary", DocumentID: "doc-" + op, InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 3,
					BackoffBaseMS: 1000, BackoffCapMS: 60000, ExpectedSHA256: "want"})
			})
		}
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			return tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1})
		})
		for range 3 {
			enqueue()
		}
		hostA := newViews(t, db)
		queued := func(v *views.Views, want int64, what string) {
			t.Helper()
			counts, err := v.StateCounts(ctx)
			if err != nil || counts[wire.Queued] != want {
				t.Fatalf("%s: %v queued (%v), want %d", what, counts[wire.Queued], err, want)
			}
		}
		saves := func(db *store.DB, want int64, what string) {
			t.Helper()
			if got := db.Stats().Operations["job-counts"].Writes; got != want {
				t.Fatalf("%s: %d saves of a count in the host's stats, want %d", what, got, want)
			}
		}
		queued(hostA, 3, "host a's first count")
		if !storetest.OnPostgres(t) {
			saves(db, 0, "SQLite's host")
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				if saved, err := tx.JobCountsSaved(ctx); !store.IsNotFound(err) {
					t.Fatalf("SQLite's host saved its count: %+v (%v)", saved, err)
				}
				return nil
			})
			enqueue()
			clock.Advance(time.Second)
			queued(hostA, 4, "its count a second later")
			return
		}

		other := storetest.MustOpen(t, location)
		other.Now = clock.Now
		hostB := newViews(t, other)
		enqueue()
		clock.Advance(300 * time.Millisecond)
		queued(hostB, 3, "host b within a second of host a's count")
		saves(db, 1, "host a, which counted")
		saves(other, 0, "host b, which read host a's count")
		clock.Advance(800 * time.Millisecond)
		queued(hostB, 4, "host b once host a's count is a second old")
		queued(hostA, 4, "host a, its own copy a second old, reading host b's")
		saves(db, 1, "host a, which read host b's count")
		saves(other, 1, "host b, which counted")

		// Another transaction holds the counts lock: host b keeps the count
		// saved before, and counts once the lock is free.
		held, err := db.Driver().BeginWrite(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Rollback()
		if ok, err := held.TryLockCounts(ctx); err != nil || !ok {
			t.Fatalf("hold the counts lock: %v %v", ok, err)
		}
		enqueue()
		clock.Advance(1100 * time.Millisecond)
		queued(hostB, 4, "host b while another holds the counts lock")
		held.Rollback()
		queued(hostB, 5, "host b once the lock is free")

		// A count dated ahead of host a's clock (a host whose clock runs
		// ahead saved it) is counted again.
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			return tx.JobCountsSave(ctx, store.SavedCounts{Counts: map[wire.JobState]int64{wire.Queued: 99},
				TakenMS: clock.Now().Add(10 * time.Second).UnixMilli()})
		})
		clock.Advance(1100 * time.Millisecond)
		queued(hostA, 5, "host a with a count dated ahead of its clock")

		// A database that refuses the save (a constraint here, a full disk
		// in life) still answers: the host counts for itself, and the
		// count saved before stays.
		refuseSaves(t, location)
		enqueue()
		clock.Advance(1100 * time.Millisecond)
		queued(hostB, 6, "host b when its save is refused")
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			if saved, err := tx.JobCountsSaved(ctx); err != nil || saved.Counts[wire.Queued] != 5 {
				t.Fatalf("the saved count after a refused save: %+v (%v), want host a's 5 queued", saved, err)
			}
			return nil
		})
	})
}

// refuseSaves makes the PostgreSQL schema at location refuse every new
// saved count.
func refuseSaves(t *testing.T, location string) {
	t.Helper()
	conn, err := sql.Open("pgx", location)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Exec("ALTER TABLE job_counts ADD CONSTRAINT refuse_saves CHECK (taken_ms < 0) NOT VALID"); err != nil {
		t.Fatal(err)
	}
}

// newViews is a host's views of db.
func newViews(t *testing.T, db *store.DB) *views.Views {
	t.Helper()
	kernel, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	db.SetSealer(kernel)
	l := ledger.New(db, kernel)
	return views.New(l, access.New(l, t.TempDir()), time.Minute)
}
