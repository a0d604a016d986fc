package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/dbutil"
	"github.com/fleet/fleet/internal/store/sqlite/dbsqlc"
	"github.com/fleet/fleet/internal/wire"
)

// The log's operations. Rows and ids travel as JSON arrays, which the
// statements unpack with json_each: one statement however many. Rows of
// several fields go through jsonb_each, which hands each row to
// json_extract as JSONB, read as it is; json_each hands it over as text,
// which each json_extract parsed again (BenchmarkEventRows: 6.3-6.8 µs an
// event that way, 4.7-5.0 this).

func (c *conn) ReceiptHead(ctx context.Context) (store.ChainHead, error) {
	h, err := c.q.ReceiptHead(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return store.ChainHead{}, nil
	}
	return store.ChainHead{Sequence: h.Sequence, ID: h.ID}, wrap(err, "read receipt chain head", "")
}

func (c *conn) ReceiptInsert(ctx context.Context, receipts []store.StoredReceipt) error {
	if len(receipts) == 0 {
		return nil
	}
	size := 0
	for _, r := range receipts {
		size += len(r.Stored)
	}
	bodies := make(packed, 0, size)
	rows := dbutil.NewRows(len(receipts), 160)
	for _, r := range receipts {
		at, n := bodies.add(r.Stored)
		rows.Row().Int(r.Receipt.Sequence).Str(r.Receipt.ID).Str(string(r.Receipt.Kind)).Str(r.Receipt.OperationID).Int(int64(at)).Int(int64(n))
	}
	return wrap(c.q.ReceiptInsertMany(ctx, bodies.blob(), rows.String()), "store receipts", "")
}

func (c *conn) ReceiptGet(ctx context.Context, id string) ([]byte, error) {
	body, err := c.q.ReceiptGet(ctx, id)
	return []byte(body), dbutil.One(err, "read receipt", id)
}

func bodies(rows []string, err error, what string) ([][]byte, error) {
	out := make([][]byte, len(rows))
	for i, b := range rows {
		out[i] = []byte(b)
	}
	return out, wrap(err, what, "")
}

func (c *conn) ReceiptGetMany(ctx context.Context, ids []string) ([][]byte, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := c.q.ReceiptGetMany(ctx, dbutil.Strings(ids))
	return bodies(rows, err, "read receipts")
}

func (c *conn) ReceiptList(ctx context.Context, operationID string) ([][]byte, error) {
	if operationID == "" {
		rows, err := c.q.ReceiptList(ctx)
		return bodies(rows, err, "list receipts")
	}
	rows, err := c.q.ReceiptListByOperation(ctx, operationID)
	return bodies(rows, err, "list receipts")
}

func (c *conn) ReceiptNewestByOperation(ctx context.Context) (map[string]string, error) {
	rows, err := c.q.ReceiptNewestByOperation(ctx)
	out := make(map[string]string, len(rows))
	for _, r := range rows {
		out[r.OperationID] = r.ID
	}
	return out, wrap(err, "read newest receipts", "")
}

func (c *conn) ReceiptNewestFor(ctx context.Context, ops []string) (map[string]string, error) {
	out := map[string]string{}
	if len(ops) == 0 {
		return out, nil
	}
	rows, err := c.q.ReceiptIDsOf(ctx, dbutil.Strings(ops))
	for _, r := range rows {
		out[r.OperationID] = r.ID // in chain order: later rows are newer
	}
	return out, wrap(err, "read newest receipts", "")
}

func (c *conn) EventInsert(ctx context.Context, events []wire.Event) error {
	if len(events) == 0 {
		return nil
	}
	size := 0
	for _, e := range events {
		size += len(e.Data)
	}
	data := make(packed, 0, size)
	rows := dbutil.NewRows(len(events), 200)
	for _, e := range events {
		at, n := data.add(e.Data)
		rows.Row().Int(e.Sequence).Int(e.TimestampMS).Str(string(e.Kind)).Str(e.Actor).Str(e.Title).Int(int64(at)).Int(int64(n)).Str(e.OperationID)
	}
	return wrap(c.q.EventInsertMany(ctx, data.blob(), rows.String()), "append events", "")
}

// packed is many rows' long values in one BLOB, each found by its 1-based
// offset and length (SQLite's substr on a BLOB counts bytes), so that they
// are bound as they are instead of escaped into, and parsed out of, the
// rows' JSON.
type packed []byte

func (p *packed) add(b []byte) (at, n int) {
	at = len(*p) + 1
	*p = append(*p, b...)
	return at, len(b)
}

// blob is never empty: an empty []byte binds as NULL, and substr of NULL
// is NULL, not the empty values the rows then hold.
func (p packed) blob() []byte {
	if len(p) == 0 {
		return []byte{0}
	}
	return p
}

func (c *conn) EventLast(ctx context.Context) (int64, error) {
	n, err := c.q.EventLast(ctx)
	return n, wrap(err, "read the event log's head", "")
}

func (c *conn) EventList(ctx context.Context, after int64, limit int) ([]wire.Event, error) {
	rows, err := c.q.EventList(ctx, after, int64(limit))
	return eventsOf(rows, false), wrap(err, "list events", "")
}

func (c *conn) EventListNewest(ctx context.Context, f store.EventFilter) ([]wire.Event, error) {
	var rows []dbsqlc.Event
	var err error
	switch {
	case f.OperationID != "":
		rows, err = c.q.EventListOfJob(ctx, &dbsqlc.EventListOfJobParams{OperationID: f.OperationID,
			After: f.After, Before: f.Before, Kind: string(f.Kind), Max: int64(f.Limit)})
	case f.Kind != "":
		rows, err = c.q.EventListOfKind(ctx, &dbsqlc.EventListOfKindParams{Kind: string(f.Kind),
			After: f.After, Before: f.Before, Max: int64(f.Limit)})
	default:
		rows, err = c.q.EventListBefore(ctx, &dbsqlc.EventListBeforeParams{After: f.After, Before: f.Before, Max: int64(f.Limit)})
	}
	return eventsOf(rows, true), wrap(err, "list events", "")
}

// eventsOf is rows as events in sequence order (newestFirst rows reversed).
func eventsOf(rows []dbsqlc.Event, newestFirst bool) []wire.Event {
	out := make([]wire.Event, len(rows))
	for i, e := range rows {
		if newestFirst {
			i = len(rows) - 1 - i
		}
		out[i] = wire.Event{Sequence: e.Sequence, TimestampMS: e.TimestampMs, Kind: wire.EventKind(e.Kind),
			OperationID: e.OperationID, Actor: e.Actor, Title: e.Title, Data: []byte(e.Data)}
	}
	return out
}

func (c *conn) EventHead(ctx context.Context) (int64, int64, error) {
	h, err := c.q.EventHead(ctx)
	return h.Events, h.Newest, wrap(err, "read event head", "")
}

// PendingLogInsert inserts entries one at a time for their ids: SQLite's
// writer numbers the log in its own commit, so only the conformance suite
// comes here.
func (c *conn) PendingLogInsert(ctx context.Context, events []wire.Event, receipts []wire.Receipt) (store.PendingIDs, error) {
	var ids store.PendingIDs
	for _, e := range events {
		id, err := c.q.PendingEventInsert(ctx, &dbsqlc.PendingEventInsertParams{TimestampMs: e.TimestampMS, Kind: string(e.Kind),
			Actor: e.Actor, Title: e.Title, Data: string(e.Data), OperationID: e.OperationID})
		if err != nil {
			return ids, dbutil.Failed(err, "append pending events", "")
		}
		ids.Events = append(ids.Events, id)
	}
	for _, r := range receipts {
		body, err := dbutil.EncodePendingReceipt(r)
		if err != nil {
			return ids, err
		}
		id, err := c.q.PendingReceiptInsert(ctx, r.ID, body)
		if err != nil {
			return ids, dbutil.Failed(err, "append pending receipts", "")
		}
		ids.Receipts = append(ids.Receipts, id)
	}
	return ids, nil
}

func (c *conn) PendingLogLeft(ctx context.Context, ids store.PendingIDs, receipts []string) (store.PendingLeft, error) {
	var left store.PendingLeft
	var err error
	if len(ids.Events) > 0 {
		if left.Events, err = c.q.PendingEventLeft(ctx, dbutil.JSON(ids.Events)); err != nil {
			return left, dbutil.Failed(err, "check pending events", "")
		}
	}
	if len(ids.Receipts) > 0 {
		if left.Receipts, err = c.q.PendingReceiptLeft(ctx, dbutil.JSON(ids.Receipts)); err != nil {
			return left, dbutil.Failed(err, "check pending receipts", "")
		}
	}
	left.Placed, err = c.ReceiptGetMany(ctx, receipts)
	return left, err
}

func (c *conn) PendingLogList(ctx context.Context, limit int) (store.PendingLog, error) {
	var p store.PendingLog
	events, err := c.q.PendingEventList(ctx, int64(limit))
	if err != nil {
		return p, dbutil.Failed(err, "list pending events", "")
	}
	p.Events = events
	receipts, err := c.q.PendingReceiptList(ctx, int64(limit))
	if err != nil {
		return p, dbutil.Failed(err, "list pending receipts", "")
	}
	for _, r := range receipts {
		pr, err := dbutil.DecodePendingReceipt(r.ID, r.Body)
		if err != nil {
			return p, err
		}
		p.Receipts = append(p.Receipts, pr)
	}
	if p.LastEvent, err = c.EventLast(ctx); err != nil {
		return p, err
	}
	p.Head, err = c.ReceiptHead(ctx)
	return p, err
}

// PendingLogExpect reads what it checks: with one writer the log lock is
// always this transaction's.
func (c *conn) PendingLogExpect(ctx context.Context, lastEvent int64, head store.ChainHead, placed store.PendingIDs) error {
	last, err := c.EventLast(ctx)
	if err != nil {
		return err
	}
	chain, err := c.ReceiptHead(ctx)
	if err != nil {
		return err
	}
	// placed, and nothing before its last, is what is pending first.
	events, err := c.q.PendingEventList(ctx, int64(len(placed.Events)))
	if err != nil {
		return dbutil.Failed(err, "list pending events", "")
	}
	receipts, err := c.q.PendingReceiptList(ctx, int64(len(placed.Receipts)))
	if err != nil {
		return dbutil.Failed(err, "list pending receipts", "")
	}
	firstReceipts := make([]int64, len(receipts))
	for i, r := range receipts {
		firstReceipts[i] = r.ID
	}
	if last != lastEvent || chain != head || !slices.Equal(events, slices.Sorted(slices.Values(placed.Events))) ||
		!slices.Equal(firstReceipts, slices.Sorted(slices.Values(placed.Receipts))) {
		return fmt.Errorf("expect the log: %w", store.ErrGuard)
	}
	return nil
}

func (c *conn) PendingLogPlace(ctx context.Context, p *store.PendingLogPlaceParams) error {
	if len(p.Placed.Events) > 0 {
		if err := c.q.PendingEventPlace(ctx, p.FirstEvent, dbutil.JSON(p.Placed.Events)); err != nil {
			return dbutil.Failed(err, "place events", "")
		}
	}
	if err := c.ReceiptInsert(ctx, p.Receipts); err != nil {
		return err
	}
	if len(p.Placed.Events) > 0 {
		if err := c.q.PendingEventDelete(ctx, dbutil.JSON(p.Placed.Events)); err != nil {
			return dbutil.Failed(err, "remove placed events", "")
		}
	}
	if len(p.Placed.Receipts) > 0 {
		if err := c.q.PendingReceiptDelete(ctx, dbutil.JSON(p.Placed.Receipts)); err != nil {
			return dbutil.Failed(err, "remove placed receipts", "")
		}
	}
	return nil
}
