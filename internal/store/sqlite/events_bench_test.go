package sqlite_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// BenchmarkEventInsert: what the log's job and kind indexes cost an event,
// in the host's shape (a commit of ten jobs' three events each, data as a
// publication's event carries it), against the same inserts with the two
// indexes dropped, as the log was before them.
func BenchmarkEventInsert(b *testing.B) {
	for _, indexed := range []bool{true, false} {
		name := "indexed"
		if !indexed {
			name = "unindexed"
		}
		b.Run(name, func(b *testing.B) {
			db, path := storetest.MustCreate(b)
			if !indexed {
				raw, err := sql.Open("sqlite", path)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := raw.Exec(`DROP INDEX events_by_operation; DROP INDEX events_by_kind`); err != nil {
					b.Fatal(err)
				}
				raw.Close()
			}
			kinds := []wire.EventKind{wire.EventClaimed, wire.EventAllowed, wire.EventPublished}
			seq := int64(0)
			b.ResetTimer()
			for b.Loop() {
				evs := make([]wire.Event, 0, 30)
				for range 10 {
					op := uuid.Must(uuid.NewV7()).String()
					data, _ := json.Marshal(map[string]any{"operation_id": op, "section": "summary", "status": "published",
						"version": 1, "receipt_id": fmt.Sprintf("rcpt-%064d", seq), "accounting": map[string]int{"allowance": 100, "spent": 20}})
					for _, k := range kinds {
						seq++
						evs = append(evs, wire.Event{Sequence: seq, TimestampMS: seq, Kind: k, OperationID: op, Actor: "worker-1",
							Title: "worker-1's publication of summary: published at version 1", Data: data})
					}
				}
				storetest.Write(b, db, func(ctx context.Context, tx *store.Tx) error { return tx.EventInsert(ctx, evs) })
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(seq), "µs/event")
		})
	}
}

// BenchmarkEventRows: one batch's events (32 jobs' three) unpacked from
// their rows' JSON and inserted, all iterations in one transaction so that
// no commit is measured: the statement's own cost a row.
func BenchmarkEventRows(b *testing.B) {
	db, _ := storetest.MustCreate(b)
	kinds := []wire.EventKind{wire.EventClaimed, wire.EventAllowed, wire.EventPublished}
	data := json.RawMessage(`{"section":"summary","status":"published","version":1}`)
	seq := int64(0)
	storetest.Write(b, db, func(ctx context.Context, tx *store.Tx) error {
		for b.Loop() {
			evs := make([]wire.Event, 0, 96)
			for range 32 {
				op := uuid.Must(uuid.NewV7()).String()
				for _, k := range kinds {
					seq++
					evs = append(evs, wire.Event{Sequence: seq, TimestampMS: seq, Kind: k, OperationID: op, Actor: "worker-1",
						Title: "worker-1's publication of summary: published at version 1", Data: data})
				}
			}
			if err := tx.EventInsert(ctx, evs); err != nil {
				return err
			}
		}
		return nil
	})
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(seq), "ns/event")
}
