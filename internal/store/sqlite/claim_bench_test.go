package sqlite_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// BenchmarkClaim: a claim of one job, and of 32, from a queue of 10,000,
// and the same jobs queued again: what the claim's statements cost the
// single path, per claim (its requeues included). The claim reads each
// priority's claimable range; the queue's jobs all have the default.
func BenchmarkClaim(b *testing.B) {
	for _, max := range []int{1, 32} {
		b.Run(fmt.Sprint("max-", max), func(b *testing.B) {
			db, _ := storetest.MustCreate(b)
			storetest.Write(b, db, func(ctx context.Context, tx *store.Tx) error {
				if err := tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1}); err != nil {
					return err
				}
				for i := 1; i <= 10_000; i++ {
					doc := fmt.Sprint("doc-", i)
					if err := tx.DocumentInsert(ctx, doc, 1); err != nil {
						return err
					}
					if err := tx.JobInsert(ctx, &store.JobInsertParams{OperationID: fmt.Sprint("op-", i), Position: int64(i), BatchKey: "b",
						Section: "summary", DocumentID: doc, InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 3}); err != nil {
						return err
					}
				}
				return nil
			})
			// A hundred claims a transaction, so the commit's fsync does not
			// hide what the statements cost; each claimed job is queued
			// again at once, so the queue never runs dry.
			now := int64(10)
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(100, b.N-done)
				storetest.Write(b, db, func(ctx context.Context, tx *store.Tx) error {
					for range n {
						now++
						claimed, err := tx.JobClaimMany(ctx, &store.JobClaimManyParams{Max: max, ClaimPrefix: fmt.Sprint("c", now, "."),
							Worker: "w", ClaimHost: "h", LeaseExpiresAtMS: now + 1000, NowMS: now})
						if err != nil || len(claimed) != max {
							return fmt.Errorf("claimed %d of %d: %v", len(claimed), max, err)
						}
						for _, c := range claimed {
							if err := tx.JobRequeue(ctx, &store.JobRequeueParams{OperationID: c.OperationID, IfState: wire.Claimed,
								Worker: "w", ClaimableAtMS: now, NowMS: now}); err != nil {
								return err
							}
						}
					}
					return nil
				})
				done += n
			}
		})
	}
}
