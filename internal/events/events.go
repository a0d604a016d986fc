// Package events is the event log (SPEC section 8): every state change
// appends an event in the same transaction as the change, numbered
// contiguously from 1 for the life of the state.
package events

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/fleet/fleet/internal/store"
)

// Kinds.
const (
	Started         = "fleet.started"
	HostStarted     = "fleet.host_started"
	HostStopped     = "fleet.host_stopped"
	HostRestarted   = "fleet.host_restarted"
	WorkerStarted   = "fleet.worker_started"
	Enqueued        = "fleet.enqueued"
	Claimed         = "fleet.claimed"
	Allowed         = "call.allowed"
	Denied          = "call.denied"
	Published       = "fleet.published"
	Superseded      = "fleet.superseded"
	VersionConflict = "fleet.version_conflict"
	Replayed        = "fleet.replayed"
	Cancelled       = "fleet.cancelled"
	LeaseExpired    = "fleet.lease_expired"
	Requeued        = "fleet.requeued"
	Reconciled      = "fleet.reconciled"
	Assigned        = "fleet.assigned"
	AllowanceSet    = "fleet.allowance_changed"
)

// Event is one entry of the log.
type Event struct {
	Sequence    int64           `json:"sequence"`
	TimestampMS int64           `json:"timestamp_ms"`
	Kind        string          `json:"kind"`
	Actor       string          `json:"actor"`
	Title       string          `json:"title"`
	Data        json.RawMessage `json:"data"`
}

// Append adds an event as the next in sequence.
func Append(ctx context.Context, tx *store.Tx, kind, actor, title string, data any) (Event, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return Event{}, fmt.Errorf("encode %s event: %w", kind, err)
	}
	e := Event{TimestampMS: tx.NowMS(), Kind: kind, Actor: actor, Title: title, Data: raw}
	// MAX+1 inside the write transaction keeps the sequence contiguous:
	// a rolled-back transaction takes its number with it. The chain lock
	// makes that hold across hosts too.
	if err := tx.LockChain(ctx, store.ChainLog); err != nil {
		return Event{}, err
	}
	err = tx.QueryRowContext(ctx,
		`INSERT INTO events (sequence, timestamp_ms, kind, actor, title, data)
		 VALUES ((SELECT COALESCE(MAX(sequence), 0) + 1 FROM events), $1, $2, $3, $4, $5)
		 RETURNING sequence`,
		e.TimestampMS, kind, actor, title, string(raw)).Scan(&e.Sequence)
	if err != nil {
		return Event{}, fmt.Errorf("append %s event: %w", kind, err)
	}
	return e, nil
}

// List returns up to limit events after sequence `after`, in order.
func List(ctx context.Context, tx *store.Tx, after int64, limit int) ([]Event, error) {
	rows, err := tx.QueryContext(ctx,
		`SELECT sequence, timestamp_ms, kind, actor, title, data FROM events
		 WHERE sequence > $1 ORDER BY sequence LIMIT $2`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	defer rows.Close()
	out := []Event{}
	for rows.Next() {
		var e Event
		var data string
		if err := rows.Scan(&e.Sequence, &e.TimestampMS, &e.Kind, &e.Actor, &e.Title, &data); err != nil {
			return nil, err
		}
		e.Data = json.RawMessage(data)
		out = append(out, e)
	}
	return out, rows.Err()
}
