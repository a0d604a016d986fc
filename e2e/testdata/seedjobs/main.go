// Command seedjobs adds n queued jobs (in one batch, a document each) to a
// SQLite state that no host serves yet, through the store's operations in
// one transaction: the e2e tests' fixture for a host holding 100,000 jobs.
// The tests build it without the race detector.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/wire"
)

func main() {
	state := flag.String("state", "", "the state directory")
	n := flag.Int("n", 0, "how many jobs")
	sections := flag.String("sections", "", "comma-separated sections, taken in turn")
	flag.Parse()
	if err := seed(*state, *n, strings.Split(*sections, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "seedjobs:", err)
		os.Exit(1)
	}
}

func seed(state string, n int, sections []string) error {
	ctx := context.Background()
	db, err := backend.Open(ctx, statedir.Location(state, ""), backend.Options{})
	if err != nil {
		return err
	}
	defer db.Close()
	const document = "A queue to page through."
	digests := map[string]string{}
	for _, s := range sections {
		if digests[s], err = jobs.InputSHA256(wire.Input{Document: document, Section: s}); err != nil {
			return err
		}
	}
	return db.WithTx(ctx, func(tx *store.Tx) error {
		position, err := tx.JobMaxPosition(ctx)
		if err != nil {
			return err
		}
		if err := tx.BatchInsert(ctx, store.Batch{Key: "seed", RequestSHA256: "seed", Document: document, CreatedMS: tx.NowMS()}); err != nil {
			return err
		}
		// A thousand a statement: one at a time the inserts took minutes.
		for start := 0; start < n; start += 1000 {
			docs, queued := []string{}, []store.JobInsertParams{}
			for i := start; i < min(n, start+1000); i++ {
				op := uuid.Must(uuid.NewV7()).String()
				section := sections[i%len(sections)]
				position++
				docs = append(docs, "doc-"+op)
				queued = append(queued, store.JobInsertParams{OperationID: op, Position: position, BatchKey: "seed", Section: section,
					DocumentID: "doc-" + op, InputSHA256: digests[section], CreatedAtMS: tx.NowMS(), MaxAttempts: 3,
					BackoffBaseMS: 1000, BackoffCapMS: 60000})
			}
			if err := tx.DocumentInsertMany(ctx, docs, tx.NowMS()); err != nil {
				return err
			}
			if err := tx.JobInsertMany(ctx, queued); err != nil {
				return err
			}
		}
		return nil
	})
}
