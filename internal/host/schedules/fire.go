package schedules

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/operator"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// maxMissed bounds the missed slots a firing counts (a schedule left
// for years behind a minute's cron); past it the count says "at least".
const maxMissed = 100_000

// Fire submits the report of every schedule due now (up to dueAtOnce a
// round), each once, in one transaction with the schedules moved on, and
// answers how many it submitted. Each submits at its latest slot at or
// before now; the slots before it that no host fired (every host was
// down) are not submitted again, and its event counts them. A schedule's
// report that cannot be submitted (its tenant not there, say) is moved on all
// the same, its event saying why.
func (ss *Schedules) Fire(ctx context.Context) (int, error) {
	// Most seconds nothing is due: a read says so without taking the
	// writer (SQLite's one, or a write transaction's round trips).
	var due bool
	err := ss.ledger.DB().Read(ctx, func(tx *store.Tx) (err error) {
		due, err = tx.ScheduleAnyDue(ctx, tx.NowMS())
		return err
	})
	if err != nil || !due {
		return 0, err
	}
	return ledger.Write(ctx, ss.ledger, ledger.Named[int]("schedule-fire"), func(tx *store.Tx) (int, error) {
		due, err := tx.ScheduleDue(ctx, tx.NowMS(), dueAtOnce)
		if err != nil {
			return 0, err
		}
		for _, s := range due {
			if err := ss.fire(ctx, tx, s); err != nil {
				return 0, err
			}
		}
		return len(due), nil
	})
}

// fire submits one due schedule's report and moves it on.
func (ss *Schedules) fire(ctx context.Context, tx *store.Tx, s store.Schedule) error {
	spec, err := parse(s.Spec)
	if err != nil {
		return fmt.Errorf("schedule %s: %w", s.Name, err)
	}
	slot, missed := s.NextAtMS, 0
	for next := nextSlot(spec, time.UnixMilli(slot)); next <= tx.NowMS() && missed < maxMissed; next = nextSlot(spec, time.UnixMilli(slot)) {
		slot, missed = next, missed+1
	}
	moved, err := tx.ScheduleAdvance(ctx, &store.ScheduleAdvanceParams{Name: s.Name, IfNextAtMS: s.NextAtMS,
		NextAtMS: nextSlot(spec, tx.Now), LastSlotMS: slot})
	if err != nil {
		return err
	}
	if !moved {
		return fmt.Errorf("schedule %s moved on while its firing held it", s.Name)
	}
	key := slotKey(s.Name, slot)
	data := map[string]any{"schedule": s.Name, "slot_ms": slot, "idempotency_key": key, "missed": missed}
	title := fmt.Sprintf("The schedule %s submitted its report for %s", s.Name, time.UnixMilli(slot).UTC().Format(time.RFC3339))
	if missed > 0 {
		title += fmt.Sprintf("; %d earlier slots passed while no host fired them, and are not submitted", missed)
	}
	res, refusal := ss.submit(ctx, tx, s, key)
	if refusal != nil && !refused(refusal) {
		return refusal
	}
	if refusal != nil {
		title = fmt.Sprintf("The schedule %s could not submit its report for %s: %s", s.Name,
			time.UnixMilli(slot).UTC().Format(time.RFC3339), fleet.ErrorMessage(refusal))
		data["refused"] = fleet.ErrorMessage(refusal)
	}
	if res.OperationIDs == nil {
		res.OperationIDs = []string{} // a list in the event's data, never null
	}
	data["operation_ids"] = res.OperationIDs
	return ledger.AppendEvent(ctx, tx, wire.EventScheduleFired, "schedule:"+s.Name, title, data)
}

// submit submits a schedule's report under key; a refusal of the report
// (a typed error) writes nothing.
func (ss *Schedules) submit(ctx context.Context, tx *store.Tx, s store.Schedule, key string) (wire.ReportsResult, error) {
	var res wire.ReportsResult
	var req wire.ReportsRequest
	if err := json.Unmarshal([]byte(s.Request), &req); err != nil {
		return res, fmt.Errorf("schedule %s: stored report: %w", s.Name, err)
	}
	planned, err := ss.operator.Plan(req)
	if err != nil {
		return res, err
	}
	// SubmitPlanned refuses a tenant not there before it writes anything.
	return operator.SubmitPlanned(ctx, tx, "schedule:"+s.Name, key, planned)
}

// Run fires the schedules due every interval until ctx ends.
func (ss *Schedules) Run(ctx context.Context, interval time.Duration, onError func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := ss.Fire(ctx); err != nil && ctx.Err() == nil {
				onError(err)
			}
		}
	}
}

// refused reports whether err refuses a report (a typed error the caller
// can act on), rather than a failure of the transaction.
func refused(err error) bool {
	switch fleet.ErrorCode(err) {
	case "", wire.CodeInternal, wire.CodeUnavailable:
		return false
	}
	return true
}
