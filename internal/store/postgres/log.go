package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/dbutil"
	"github.com/fleet/fleet/internal/store/postgres/dbsqlc"
	"github.com/fleet/fleet/internal/wire"
)

// The log's operations. Every host's sequencer rounds take turns on the
// log lock, so a round's length is what another host's answers wait for:
// each step is one statement (log.sql), its rows as arrays.

func (c *conn) ReceiptHead(ctx context.Context) (store.ChainHead, error) {
	h, err := c.q.ReceiptHead(ctx)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ChainHead{}, nil
	}
	return store.ChainHead{Sequence: h.Sequence, ID: h.ID}, wrap(err, "read receipt chain head", "")
}

// receiptColumns are receipts as the statements' arrays.
type receiptColumns struct {
	sequences           []int64
	ids, kinds, ops, bs []string
}

func columnsOfReceipts(receipts []store.StoredReceipt) receiptColumns {
	var c receiptColumns
	for _, r := range receipts {
		c.sequences = append(c.sequences, r.Receipt.Sequence)
		c.ids = append(c.ids, r.Receipt.ID)
		c.kinds = append(c.kinds, string(r.Receipt.Kind))
		c.ops = append(c.ops, r.Receipt.OperationID)
		c.bs = append(c.bs, string(r.Stored))
	}
	return c
}

// eventColumns are events as the statements' arrays.
type eventColumns struct {
	sequences, timestamps             []int64
	kinds, actors, titles, datas, ops []string
}

func columnsOfEvents(events []wire.Event) eventColumns {
	var c eventColumns
	for _, e := range events {
		c.sequences = append(c.sequences, e.Sequence)
		c.timestamps = append(c.timestamps, e.TimestampMS)
		c.kinds = append(c.kinds, string(e.Kind))
		c.actors = append(c.actors, e.Actor)
		c.titles = append(c.titles, e.Title)
		c.datas = append(c.datas, string(e.Data))
		c.ops = append(c.ops, e.OperationID)
	}
	return c
}

func (c *conn) ReceiptInsert(ctx context.Context, receipts []store.StoredReceipt) error {
	if len(receipts) == 0 {
		return nil
	}
	r := columnsOfReceipts(receipts)
	return wrap(c.q.ReceiptInsertMany(ctx, &dbsqlc.ReceiptInsertManyParams{Sequences: r.sequences, Ids: r.ids,
		Kinds: r.kinds, OperationIds: r.ops, Bodies: r.bs}), "store receipts", "")
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
	rows, err := c.q.ReceiptGetMany(ctx, ids)
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
	rows, err := c.q.ReceiptIDsOf(ctx, ops)
	for _, r := range rows {
		out[r.OperationID] = r.ID // in chain order: later rows are newer
	}
	return out, wrap(err, "read newest receipts", "")
}

func (c *conn) EventInsert(ctx context.Context, events []wire.Event) error {
	if len(events) == 0 {
		return nil
	}
	e := columnsOfEvents(events)
	return wrap(c.q.EventInsertMany(ctx, &dbsqlc.EventInsertManyParams{Sequences: e.sequences, Timestamps: e.timestamps,
		Kinds: e.kinds, Actors: e.actors, Titles: e.titles, Data: e.datas, OperationIds: e.ops}), "append events", "")
}

func (c *conn) EventLast(ctx context.Context) (int64, error) {
	n, err := c.q.EventLast(ctx)
	return n, wrap(err, "read the event log's head", "")
}

func (c *conn) EventList(ctx context.Context, after int64, limit int) ([]wire.Event, error) {
	rows, err := c.q.EventList(ctx, after, int32(limit))
	return eventsOf(rows, false), wrap(err, "list events", "")
}

func (c *conn) EventListNewest(ctx context.Context, f store.EventFilter) ([]wire.Event, error) {
	var rows []dbsqlc.Event
	var err error
	switch {
	case f.OperationID != "":
		rows, err = c.q.EventListOfJob(ctx, &dbsqlc.EventListOfJobParams{OperationID: f.OperationID,
			After: f.After, Before: f.Before, Kind: string(f.Kind), Max: int32(f.Limit)})
	case f.Kind != "":
		rows, err = c.q.EventListOfKind(ctx, &dbsqlc.EventListOfKindParams{Kind: string(f.Kind),
			After: f.After, Before: f.Before, Max: int32(f.Limit)})
	default:
		rows, err = c.q.EventListBefore(ctx, &dbsqlc.EventListBeforeParams{After: f.After, Before: f.Before, Max: int32(f.Limit)})
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

// pendingParams is a transaction's log as PendingLogInsert's arrays.
func pendingParams(events []wire.Event, receipts []wire.Receipt) (*dbsqlc.PendingLogInsertParams, error) {
	if len(events) >= pendingPlaces || len(receipts) >= pendingPlaces {
		return nil, fmt.Errorf("append pending log: %d events and %d receipts in one transaction, more than %d of a kind",
			len(events), len(receipts), pendingPlaces-1)
	}
	e := columnsOfEvents(events)
	p := &dbsqlc.PendingLogInsertParams{Timestamps: orEmpty(e.timestamps), Kinds: orEmpty(e.kinds), Actors: orEmpty(e.actors),
		Titles: orEmpty(e.titles), Data: orEmpty(e.datas), OperationIds: orEmpty(e.ops), Bodies: []string{}}
	for _, r := range receipts {
		body, err := dbutil.EncodePendingReceipt(r)
		if err != nil {
			return nil, err
		}
		p.Bodies = append(p.Bodies, body)
	}
	return p, nil
}

// pendingPlaces is how many places a pending row's id spans: an entry's
// pending id is its row's id times pendingPlaces plus its place in the
// row (from 1), so pending ids sort in the order entries were appended
// (migration 0021_pending_log_packed).
const pendingPlaces = 1 << 20

// pendingIDs are the ids of a row's entries, row the one PendingLogInsert
// returned.
func pendingIDs(rows []int64, events, receipts int) store.PendingIDs {
	var ids store.PendingIDs
	if len(rows) != 1 {
		return ids
	}
	for n := 1; n <= events; n++ {
		ids.Events = append(ids.Events, rows[0]*pendingPlaces+int64(n))
	}
	for n := 1; n <= receipts; n++ {
		ids.Receipts = append(ids.Receipts, rows[0]*pendingPlaces+int64(n))
	}
	return ids
}

func (c *conn) PendingLogInsert(ctx context.Context, events []wire.Event, receipts []wire.Receipt) (store.PendingIDs, error) {
	p, err := pendingParams(events, receipts)
	if err != nil {
		return store.PendingIDs{}, err
	}
	rows, err := c.q.PendingLogInsert(ctx, p)
	if err != nil {
		return store.PendingIDs{}, dbutil.Failed(err, "append pending log", "")
	}
	return pendingIDs(rows, len(events), len(receipts)), nil
}

// CommitPending writes the pending log and commits in the one round trip
// that sends whatever else the transaction held back (pipeline.go), and
// gives pending the entries' ids (store.PendingCommitter).
func (c *conn) CommitPending(ctx context.Context, events []wire.Event, receipts []wire.Receipt, pending func(eventIDs, receiptIDs []int64)) error {
	// What Commit writes before committing, in its order.
	if err := c.writeTenantsAhead(ctx); err != nil {
		return err
	}
	if err := c.writeAhead(ctx); err != nil {
		return err
	}
	p, err := pendingParams(events, receipts)
	if err != nil {
		return err
	}
	c.pipe.commitNext = true
	rows, err := c.q.PendingLogInsert(ctx, p)
	if err != nil {
		c.pipe.release()
		return dbutil.Failed(err, "append pending log", "")
	}
	ids := pendingIDs(rows, len(events), len(receipts))
	pending(ids.Events, ids.Receipts)
	return c.pipe.commitErr
}

func (c *conn) PendingLogLeft(ctx context.Context, ids store.PendingIDs, receipts []string) (store.PendingLeft, error) {
	rows, err := c.q.PendingLogLeft(ctx, &dbsqlc.PendingLogLeftParams{Events: orEmpty(ids.Events), Receipts: orEmpty(ids.Receipts),
		ReceiptIds: orEmpty(receipts)})
	if err != nil {
		return store.PendingLeft{}, dbutil.Failed(err, "check pending log", "")
	}
	var left store.PendingLeft
	for _, r := range rows {
		switch r.Tag {
		case "e":
			left.Events = append(left.Events, r.ID)
		case "r":
			left.Receipts = append(left.Receipts, r.ID)
		default:
			left.Placed = append(left.Placed, []byte(r.Body))
		}
	}
	slices.Sort(left.Events)
	slices.Sort(left.Receipts)
	return left, nil
}

// orEmpty sends an empty array, not NULL, for no ids.
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func (c *conn) PendingLogList(ctx context.Context, limit int) (store.PendingLog, error) {
	var p store.PendingLog
	rows, err := c.q.PendingLogList(ctx, int32(limit))
	if err != nil {
		return p, dbutil.Failed(err, "list pending log", "")
	}
	for _, r := range rows {
		if r.Tag == "h" {
			p.LastEvent, p.Head = r.ID, store.ChainHead{Sequence: r.ReceiptsPlaced, ID: r.HeadID}
			continue
		}
		if err := pendingOfRow(&p, r); err != nil {
			return p, err
		}
	}
	// UNION ALL keeps each part's order in practice; SQL does not promise it.
	slices.Sort(p.Events)
	slices.SortFunc(p.Receipts, func(a, b store.PendingReceipt) int { return cmp.Compare(a.Pending, b.Pending) })
	return p, nil
}

// pendingOfRow adds the entries a round takes of one pending row: those
// after the ones placed, as many as it takes (the events by id alone).
func pendingOfRow(p *store.PendingLog, r dbsqlc.PendingLogListRow) error {
	if r.ReceiptsPlaced+r.ReceiptsTaken > int64(len(r.Bodies)) {
		return fmt.Errorf("list pending log: row %d holds %d receipts, fewer than counted", r.ID, len(r.Bodies))
	}
	for n := r.EventsPlaced; n < r.EventsPlaced+r.EventsTaken; n++ {
		p.Events = append(p.Events, r.ID*pendingPlaces+n+1)
	}
	for n := r.ReceiptsPlaced; n < r.ReceiptsPlaced+r.ReceiptsTaken; n++ {
		pr, err := dbutil.DecodePendingReceipt(r.ID*pendingPlaces+n+1, r.Bodies[n])
		if err != nil {
			return err
		}
		p.Receipts = append(p.Receipts, pr)
	}
	return nil
}

// PendingLogPlace writes the placed entries (the events copied from
// their pending rows), counts them placed in their pending rows (deleting
// the rows all placed) and tells every host, in one statement. A round's
// events are the first left in each row it took (PendingLogList), so each
// row's are up to the last of its placed.
func (c *conn) PendingLogPlace(ctx context.Context, p *store.PendingLogPlaceParams) error {
	r := columnsOfReceipts(p.Receipts)
	rows, eventsUpto, receiptsUpto := placedUpto(p.Placed)
	err := c.q.PendingLogPlace(ctx, &dbsqlc.PendingLogPlaceParams{Channel: c.channel, Instance: c.instance,
		FirstEvent: p.FirstEvent, ReceiptSequences: orEmpty(r.sequences), ReceiptIds: orEmpty(r.ids),
		ReceiptKinds: orEmpty(r.kinds), ReceiptOperationIds: orEmpty(r.ops), ReceiptBodies: orEmpty(r.bs),
		Rows: rows, EventsUpto: eventsUpto, ReceiptsUpto: receiptsUpto})
	return wrap(err, "place the log", "")
}

// PendingLogExpect holds back its two guards, the log lock's try and the
// expectation, to go out with the placement and the commit: a round that
// knows what is pending is one round trip.
func (c *conn) PendingLogExpect(ctx context.Context, lastEvent int64, head store.ChainHead, placed store.PendingIDs) error {
	if err := c.q.PendingLogLockOrFail(ctx); err != nil {
		return wrap(err, "try the log lock", "")
	}
	rows, events, receipts := placedUpto(placed)
	return wrap(c.q.PendingLogExpect(ctx, &dbsqlc.PendingLogExpectParams{LastEvent: lastEvent, LastReceipt: head.Sequence,
		LastReceiptID: head.ID, Rows: rows, Events: events, Receipts: receipts}), "expect the log", "")
}

// placedUpto is, for each pending row with an entry placed, how many of
// its events and of its receipts are placed with them: a round places
// the oldest of each kind, so a prefix of each row's.
func placedUpto(placed store.PendingIDs) (rows []int64, events, receipts []int32) {
	upto := map[int64]*[2]int32{} // by row: events, receipts
	rows = []int64{}
	note := func(id int64, kind int) {
		row := id / pendingPlaces
		u, ok := upto[row]
		if !ok {
			u = &[2]int32{}
			upto[row] = u
			rows = append(rows, row)
		}
		u[kind] = max(u[kind], int32(id%pendingPlaces))
	}
	for _, id := range placed.Events {
		note(id, 0)
	}
	for _, id := range placed.Receipts {
		note(id, 1)
	}
	events, receipts = make([]int32, len(rows)), make([]int32, len(rows))
	for i, row := range rows {
		events[i], receipts[i] = upto[row][0], upto[row][1]
	}
	return rows, events, receipts
}
