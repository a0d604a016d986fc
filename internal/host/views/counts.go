package views

import (
	"context"
	"time"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// countsFresh is how old the counts that pages and the charts carry may be.
const countsFresh = time.Second

// countsWrite names the saves of a count among the writes GET /admin/stats
// counts by operation.
const countsWrite = "job-counts"

// StateCounts is the number of jobs in each state, counted again once the
// copy is countsFresh old, by one reader however many pages ask. Where
// several hosts serve the database, one count serves them all (shared).
func (vs *Views) StateCounts(ctx context.Context) (map[wire.JobState]int64, error) {
	vs.counts.mu.Lock()
	counts, at := vs.counts.byState, vs.counts.at
	vs.counts.mu.Unlock()
	if counts != nil && fresh(vs.db.Now(), at) {
		return counts, nil
	}
	v, err, _ := vs.counts.read.Do("", func() (any, error) {
		counts, at, err := vs.count(context.WithoutCancel(ctx))
		if err == nil {
			vs.counts.mu.Lock()
			vs.counts.byState, vs.counts.at = counts, at
			vs.counts.mu.Unlock()
		}
		return counts, err
	})
	if err != nil {
		return nil, err
	}
	return v.(map[wire.JobState]int64), nil
}

// fresh reports whether counts taken at taken (by any host's clock) are
// fresh at now. A count dated ahead of now, by a host whose clock runs
// ahead, is not: it would otherwise pass for fresh until now caught up.
func fresh(now, taken time.Time) bool {
	age := now.Sub(taken)
	return age >= 0 && age < countsFresh
}

// count counts the jobs by state, and returns when the count was taken:
// when it ended, so a host ticking each second finds its own count of a
// tick ago fresh and leaves the next to a host whose tick comes later.
//
// Each host's charts count every second, and a count reads every job not
// completed (25 ms at 100,000 queued on PostgreSQL), so where several
// hosts serve the database they share one: a host reads the count saved
// in the database, and only when none is fresh does the one that takes
// the counts lock count and save it. A host that finds the lock taken
// does not wait for it: it keeps the count saved before (or counts for
// itself, with none saved), so a host that stalls holding the lock costs
// the others nothing but a count a second older.
func (vs *Views) count(ctx context.Context) (map[wire.JobState]int64, time.Time, error) {
	now := vs.db.Now()
	if !vs.db.SharedByHosts() {
		return vs.countAlone(ctx)
	}
	var saved store.SavedCounts
	var found bool
	err := vs.db.ReadOne(ctx, func(tx *store.Tx) (err error) {
		saved, found, err = savedCounts(ctx, tx)
		return err
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	if found && fresh(now, time.UnixMilli(saved.TakenMS)) {
		return saved.Counts, time.UnixMilli(saved.TakenMS), nil
	}
	var counts map[wire.JobState]int64
	var at time.Time
	var statements int64 // of a transaction that saved a count
	err = vs.db.WithTx(ctx, func(tx *store.Tx) error {
		statements = 0
		mine, err := tx.TryLockCounts(ctx)
		if err != nil {
			return err
		}
		// Read again under the lock: another host may have saved a count
		// since. Without the lock, that one is kept however old.
		saved, found, err = savedCounts(ctx, tx)
		if err != nil {
			return err
		}
		if found && (!mine || fresh(now, time.UnixMilli(saved.TakenMS))) {
			counts, at = saved.Counts, time.UnixMilli(saved.TakenMS)
			return nil
		}
		counts, err = tx.JobCountByState(ctx)
		at = vs.db.Now()
		if err != nil || !mine {
			return err
		}
		err = tx.JobCountsSave(ctx, store.SavedCounts{Counts: counts, TakenMS: at.UnixMilli()})
		statements = tx.Statements()
		return err
	})
	if err != nil {
		// A database refusing writes (full, read-only) still answers
		// pages with counts: this host's own.
		return vs.countAlone(ctx)
	}
	if statements > 0 {
		vs.db.CountWrite(countsWrite, statements, 0) // GET /admin/stats shows what counting costs
	}
	return counts, at, nil
}

// savedCounts reads the count a host saved; found is false when none has.
func savedCounts(ctx context.Context, tx *store.Tx) (saved store.SavedCounts, found bool, err error) {
	saved, err = tx.JobCountsSaved(ctx)
	if store.IsNotFound(err) {
		return saved, false, nil
	}
	return saved, err == nil, err
}

// countAlone counts the jobs by state for this host only.
func (vs *Views) countAlone(ctx context.Context) (map[wire.JobState]int64, time.Time, error) {
	var counts map[wire.JobState]int64
	err := vs.db.Read(ctx, func(tx *store.Tx) (err error) {
		counts, err = tx.JobCountByState(ctx)
		return err
	})
	return counts, vs.db.Now(), err
}
