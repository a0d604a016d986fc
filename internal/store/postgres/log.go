package postgres

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/sqlexec"
	"github.com/fleet/fleet/internal/wire"
)

// The log sequencer's two statements, each one round trip: every host's
// rounds take turns on the log lock, so a round's length is what another
// host's answers wait for.

// pendingList reads both pending tables and the placed log's heads.
const pendingList = `
	SELECT 'e', id, timestamp_ms, kind, actor, title, data FROM (SELECT * FROM pending_events ORDER BY id LIMIT $1) AS e
	UNION ALL
	SELECT 'r', id, 0, '', '', '', body FROM (SELECT * FROM pending_receipts ORDER BY id LIMIT $1) AS r
	UNION ALL
	SELECT 'h', COALESCE((SELECT MAX(sequence) FROM events), 0),
		COALESCE((SELECT sequence FROM receipts ORDER BY sequence DESC LIMIT 1), 0), '', '', '',
		COALESCE((SELECT id FROM receipts ORDER BY sequence DESC LIMIT 1), '')`

func (c *conn) PendingLogList(ctx context.Context, limit int) (store.PendingLog, error) {
	var p store.PendingLog
	rows, err := c.DB.Query(ctx, pendingList, limit)
	if err != nil {
		return p, fmt.Errorf("list pending log: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var kind, eventKind, actor, title, data string
		var id, at int64
		if err := rows.Scan(&kind, &id, &at, &eventKind, &actor, &title, &data); err != nil {
			return p, fmt.Errorf("list pending log: %w", err)
		}
		switch kind {
		case "e":
			p.Events = append(p.Events, store.PendingEvent{Pending: id, Event: wire.Event{TimestampMS: at,
				Kind: wire.EventKind(eventKind), Actor: actor, Title: title, Data: json.RawMessage(data)}})
		case "r":
			r := store.PendingReceipt{Pending: id}
			if err := sqlexec.DecodePendingReceipt(data, &r); err != nil {
				return p, err
			}
			p.Receipts = append(p.Receipts, r)
		case "h":
			p.LastEvent, p.Head = id, store.ChainHead{Sequence: at, ID: data}
		}
	}
	if err := rows.Err(); err != nil {
		return p, fmt.Errorf("list pending log: %w", err)
	}
	// UNION ALL keeps each part's order in practice; SQL does not promise it.
	slices.SortFunc(p.Events, func(a, b store.PendingEvent) int { return cmp.Compare(a.Pending, b.Pending) })
	slices.SortFunc(p.Receipts, func(a, b store.PendingReceipt) int { return cmp.Compare(a.Pending, b.Pending) })
	return p, nil
}

// PendingLogInsert writes a transaction's events and receipts for the
// sequencer in one statement, returning their pending ids.
func (c *conn) PendingLogInsert(ctx context.Context, events []wire.Event, receipts []wire.Receipt) ([]int64, []int64, error) {
	query, args, err := pendingInsert(events, receipts)
	if err != nil || query == "" {
		return nil, nil, err
	}
	rows, err := c.DB.Query(ctx, query, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("append pending log: %w", err)
	}
	defer rows.Close()
	return scanPendingIDs(rows)
}

// CommitPending writes the pending log and commits in the one round trip
// that sends whatever else the transaction held back (pipeline.go);
// pending gets the entries' ids before the commit's outcome is known
// (store.PendingCommitter).
func (c *conn) CommitPending(ctx context.Context, events []wire.Event, receipts []wire.Receipt, pending func(eventIDs, receiptIDs []int64)) error {
	query, args, err := pendingInsert(events, receipts)
	if err != nil {
		return err
	}
	return c.pipe.commitWith(ctx, query, args, func(rows sqlexec.Rows) error {
		eventIDs, receiptIDs, err := scanPendingIDs(rows)
		if err == nil {
			pending(eventIDs, receiptIDs)
		}
		return err
	})
}

// pendingInsert is the one statement that appends events and receipts to
// the pending log and returns their ids, tagged e or r; "" when there is
// nothing to append.
func pendingInsert(events []wire.Event, receipts []wire.Receipt) (string, []any, error) {
	var st statement
	if len(events) > 0 {
		rows := make([][]any, len(events))
		for i, e := range events {
			rows[i] = []any{e.TimestampMS, string(e.Kind), e.Actor, e.Title, string(e.Data)}
		}
		st.insert("pending_events (timestamp_ms, kind, actor, title, data)", rows)
	}
	if len(receipts) > 0 {
		rows := make([][]any, len(receipts))
		for i, r := range receipts {
			body, err := json.Marshal(r)
			if err != nil {
				return "", nil, fmt.Errorf("encode pending receipt %s: %w", r.ID, err)
			}
			rows[i] = []any{r.ID, string(body)}
		}
		st.insert("pending_receipts (receipt_id, body)", rows)
	}
	if len(st.parts) == 0 {
		return "", nil, nil
	}
	// Each insert returns its ids, tagged with its table.
	var q strings.Builder
	q.WriteString("WITH ")
	var selects []string
	for i, p := range st.parts {
		if i > 0 {
			q.WriteString(", ")
		}
		fmt.Fprintf(&q, "w%d AS (%s RETURNING id)", i, p)
		tag := "e"
		if strings.HasPrefix(p, "INSERT INTO pending_receipts") {
			tag = "r"
		}
		selects = append(selects, fmt.Sprintf("SELECT '%s', id FROM w%d", tag, i))
	}
	q.WriteString(" " + strings.Join(selects, " UNION ALL "))
	return q.String(), st.args, nil
}

// scanPendingIDs reads what pendingInsert returns.
func scanPendingIDs(rows sqlexec.Rows) ([]int64, []int64, error) {
	var eventIDs, receiptIDs []int64
	for rows.Next() {
		var tag string
		var id int64
		if err := rows.Scan(&tag, &id); err != nil {
			return nil, nil, fmt.Errorf("append pending log: %w", err)
		}
		if tag == "e" {
			eventIDs = append(eventIDs, id)
		} else {
			receiptIDs = append(receiptIDs, id)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("append pending log: %w", err)
	}
	return eventIDs, receiptIDs, nil
}

// PendingLogPlace writes the placed entries and deletes them from pending
// in one statement.
func (c *conn) PendingLogPlace(ctx context.Context, events []wire.Event, receipts []store.StoredReceipt, pendingEvents, pendingReceipts []int64) error {
	var st statement
	if len(events) > 0 {
		rows := make([][]any, len(events))
		for i, e := range events {
			rows[i] = []any{e.Sequence, e.TimestampMS, string(e.Kind), e.Actor, e.Title, string(e.Data)}
		}
		st.insert("events (sequence, timestamp_ms, kind, actor, title, data)", rows)
	}
	if len(receipts) > 0 {
		rows := make([][]any, len(receipts))
		for i, r := range receipts {
			rows[i] = []any{r.Receipt.Sequence, r.Receipt.ID, string(r.Receipt.Kind), r.Receipt.OperationID, string(r.Stored)}
		}
		st.insert("receipts (sequence, id, kind, operation_id, body)", rows)
	}
	if len(pendingEvents) > 0 {
		st.add("DELETE FROM pending_events WHERE id = ANY(" + st.arg(pendingEvents) + ")")
	}
	if len(pendingReceipts) > 0 {
		st.add("DELETE FROM pending_receipts WHERE id = ANY(" + st.arg(pendingReceipts) + ")")
	}
	// Tell every host's sequencer, at commit, that entries were placed.
	st.add("SELECT pg_notify(" + st.arg(c.channel) + ", " + st.arg(c.instance) + ")")
	return st.exec(ctx, c, "place the log")
}

// statement joins writes into one statement, all but the last as
// data-modifying CTEs (which PostgreSQL runs, referenced or not).
type statement struct {
	parts []string
	args  []any
}

func (st *statement) arg(v any) string {
	st.args = append(st.args, v)
	return "$" + strconv.Itoa(len(st.args))
}

func (st *statement) add(part string) { st.parts = append(st.parts, part) }

func (st *statement) insert(into string, rows [][]any) {
	var b strings.Builder
	b.WriteString("INSERT INTO " + into + " VALUES ")
	for i, row := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('(')
		for k, v := range row {
			if k > 0 {
				b.WriteByte(',')
			}
			b.WriteString(st.arg(v))
		}
		b.WriteByte(')')
	}
	st.add(b.String())
}

func (st *statement) exec(ctx context.Context, c *conn, what string) error {
	if len(st.parts) == 0 {
		return nil
	}
	var q strings.Builder
	if len(st.parts) > 1 {
		q.WriteString("WITH ")
		for i, p := range st.parts[:len(st.parts)-1] {
			if i > 0 {
				q.WriteString(", ")
			}
			fmt.Fprintf(&q, "w%d AS (%s)", i, p)
		}
		q.WriteByte(' ')
	}
	q.WriteString(st.parts[len(st.parts)-1])
	if err := c.DB.Exec(ctx, q.String(), st.args...); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
