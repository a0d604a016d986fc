package store

import "time"

// SetRecheck sets how long db's sequencer waits without news before it
// looks again (several writers only).
func SetRecheck(db *DB, d time.Duration) {
	if db.seq != nil {
		db.seq.recheck.Store(int64(d))
	}
}

// Seal links and seals receipts as a placement does.
var Seal = seal

// QueuedWrites is how many write requests wait for db's committer (one
// writer only).
func QueuedWrites(db *DB) int {
	if db.gc == nil {
		return 0
	}
	return len(db.gc.requests)
}
