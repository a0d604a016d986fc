// Package ledger is what every part of the host writes through: one write
// transaction with its crash points, span and counters (Write), a batch's
// items in one (Batch), the receipt kernel that signs what a transaction
// decides, the event log it appends to, and the wake-up of whoever waits
// for a commit. The parts (claims, admission, publication, failures, the
// registry, credentials, the operator's actions) are handed a *Ledger;
// none reaches another part through it.
package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/fleet/fleet/internal/crash"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// Ledger is an open state's database and kernel key.
type Ledger struct {
	db     *store.DB
	kernel *receipts.Kernel
	// Log receives one structured line per committed decision, carrying
	// operation_id, worker, generation and receipt_id. Discarded unless
	// set (before the host serves).
	Log *slog.Logger

	mu      sync.Mutex
	changed chan struct{} // closed and replaced after every write commit
}

// New writes to db, signing receipts with kernel.
func New(db *store.DB, kernel *receipts.Kernel) *Ledger {
	return &Ledger{db: db, kernel: kernel, Log: slog.New(slog.DiscardHandler), changed: make(chan struct{})}
}

// DB is the database, for reads.
func (l *Ledger) DB() *store.DB { return l.db }

// Kernel is the key that signs the state's receipts.
func (l *Ledger) Kernel() *receipts.Kernel { return l.kernel }

// Changed is closed at the next write commit of this host.
func (l *Ledger) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// Wake releases everyone waiting on Changed: after each of this host's
// commits, and when another host's commits are seen (PostgreSQL).
func (l *Ledger) Wake() {
	l.mu.Lock()
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// Write runs fn in one write transaction, wakes watchers after commit and
// returns what fn decided. fn may run more than once (a rerun after a lost
// race on PostgreSQL): its result is the run that committed, and nothing
// outside the database changes inside it. point names the operation's
// crash points (see package crash): its ".before-commit" point is reached
// with every write made and nothing committed, its ".after-commit" point
// with everything committed and nothing answered. point is given the
// result, since some operations (dispatch) are named by what they decide.
func Write[T any](ctx context.Context, l *Ledger, point func(T) string, fn func(tx *store.Tx) (T, error)) (T, error) {
	var span trace.Span = noop.Span{} // no span of its own while tracing is off
	if tracing.Enabled() {
		var zero T
		ctx, span = tracing.Start(ctx, "fleet."+point(zero))
	}
	var out T
	var statements int64
	var decided time.Time
	err := l.db.WithTx(ctx, func(tx *store.Tx) error {
		start := tx.Statements()
		var err error
		if out, err = fn(tx); err != nil {
			return err
		}
		statements = tx.Statements() - start
		decided = time.Now()
		crash.At(point(out) + ".before-commit")
		return nil
	})
	if tracing.Enabled() && !decided.IsZero() {
		// The commit: from the decision made to the transaction's end (a
		// group commit's wait for the others in it included).
		_, commit := tracing.Tracer().Start(ctx, "fleet.commit", trace.WithTimestamp(decided),
			trace.WithAttributes(attribute.Int64("fleet.statements", statements)))
		commit.End()
	}
	if tracing.Enabled() {
		if err == nil {
			span.SetName("fleet." + point(out)) // dispatch-allow, dispatch-deny, …
		}
		tracing.End(span, err)
	}
	if err != nil {
		var none T
		return none, err
	}
	var jobs int64
	if c, ok := any(out).(JobCounter); ok {
		jobs = c.Jobs()
	}
	l.db.CountWrite(point(out), statements, jobs)
	crash.At(point(out) + ".after-commit")
	l.Wake()
	if err := crash.Lost(point(out) + ".after-commit"); err != nil {
		return out, fleet.Errorf(wire.CodeUnavailable, "%v", err)
	}
	return out, nil
}

// JobCounter is a write's result that says how many jobs it took (a
// claim), for the storage counters.
type JobCounter interface{ Jobs() int64 }

// Named is a fixed crash-point name.
func Named[T any](point string) func(T) string { return func(T) string { return point } }

// Record is Write for an operation that only records, and answers nothing
// but whether it committed (a host's start and stop).
func (l *Ledger) Record(ctx context.Context, point string, fn func(tx *store.Tx) error) error {
	_, err := Write(ctx, l, Named[struct{}](point), func(tx *store.Tx) (struct{}, error) { return struct{}{}, fn(tx) })
	return err
}

// IssueReceipt prepares the receipt of decision d and appends it to the
// chain. Its id is final at once, for the transaction to refer to; the
// rest (sequence, link, signature) is filled in when the log places it, by
// the time the write returns.
func (l *Ledger) IssueReceipt(tx *store.Tx, d receipts.Draft) (*wire.Receipt, error) {
	return tx.AppendReceipt(l.kernel.Prepare(d, tx.NowMS()))
}

// AppendEvent adds an event to the log, numbered when the transaction
// commits.
func AppendEvent(ctx context.Context, tx *store.Tx, kind wire.EventKind, actor, title string, data any) error {
	// An event about a job names it in its data; the log indexes it too.
	var op string
	if m, ok := data.(map[string]any); ok {
		op, _ = m["operation_id"].(string)
	}
	return AppendJobEvent(ctx, tx, kind, actor, title, op, data)
}

// AppendJobEvent is AppendEvent for an event about the job operationID,
// whose data names it as "operation_id": for data written from a struct,
// the events every job has (a struct's JSON costs a fraction of a map's,
// whose keys are sorted at each encoding).
func AppendJobEvent(ctx context.Context, tx *store.Tx, kind wire.EventKind, actor, title, operationID string, data any) error {
	raw, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("encode %s event: %w", kind, err)
	}
	return tx.AppendEvent(wire.Event{TimestampMS: tx.NowMS(), Kind: kind, OperationID: operationID, Actor: actor, Title: title, Data: raw})
}
