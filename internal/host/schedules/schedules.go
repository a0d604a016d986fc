// Package schedules is recurring reports: an operator registers a report
// and a cron expression (UTC), and at each slot a host submits the report
// once, under a key made of the schedule's name and the slot, in the
// transaction that moves the schedule on, guarded by the slot it read: a
// restart, two hosts firing at once or a repeated firing never submit
// twice, and slots missed while no host was up are submitted once.
package schedules

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/operator"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Schedules is one host's view of the recurring reports.
type Schedules struct {
	ledger   *ledger.Ledger
	operator *operator.Operator
}

// New acts through l, planning reports as o does.
func New(l *ledger.Ledger, o *operator.Operator) *Schedules {
	return &Schedules{ledger: l, operator: o}
}

// MinGap is the floor between two slots of a schedule.
const MinGap = time.Minute

// dueAtOnce bounds the schedules one firing round submits; the rest wait
// for the next round, a second later.
const dueAtOnce = 16

var scheduleName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// Spec parses a schedule: a cron expression of five fields or a
// descriptor (@hourly, @every 2h), read in UTC, whose slots are at least
// MinGap apart.
func Spec(spec string) (cron.Schedule, error) {
	s, err := parse(spec)
	if err != nil {
		return nil, err
	}
	// The slots of the next two days: the floor holds between each two.
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prev := s.Next(from)
	for range 2 * 24 * 60 {
		next := s.Next(prev)
		if next.IsZero() {
			break
		}
		if gap := next.Sub(prev); gap < MinGap {
			return nil, fleet.Errorf(wire.CodeInvalid, "schedule %.80q fires %s apart; the floor is one firing a minute", spec, gap)
		}
		prev = next
	}
	return s, nil
}

// parse reads a schedule as cron does, without Spec's floor: a stored
// schedule passed it when it was added.
func parse(spec string) (cron.Schedule, error) {
	s, err := cron.ParseStandard(spec)
	if err != nil {
		return nil, fleet.Errorf(wire.CodeInvalid, "schedule %.80q is not a cron expression: %v", spec, err)
	}
	return s, nil
}

// nextSlot is the first slot of s after t (in UTC), in Unix ms.
func nextSlot(s cron.Schedule, t time.Time) int64 { return s.Next(t.UTC()).UnixMilli() }

// slotKey is the idempotency key of the report a schedule submits at a
// slot.
func slotKey(name string, slotMS int64) string {
	return "schedule:" + name + "@" + time.UnixMilli(slotMS).UTC().Format(time.RFC3339)
}

// Create registers a recurring report. Its report is checked as POST
// /admin/reports checks one (it names no idempotency_key: each firing's is
// the schedule's name and slot) and its tenant must exist; its first slot
// is the schedule's first after now. A name taken is state_conflict.
func (ss *Schedules) Create(ctx context.Context, req wire.ScheduleRequest) (wire.Schedule, error) {
	if req.Name == nil || req.Schedule == nil || req.Report == nil {
		return wire.Schedule{}, fleet.Errorf(wire.CodeInvalid, "name, schedule and report are required")
	}
	name := *req.Name
	if !scheduleName.MatchString(name) {
		return wire.Schedule{}, fleet.Errorf(wire.CodeInvalid, "a schedule's name is 1 to 64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit; got %.40q", name)
	}
	spec, err := Spec(*req.Schedule)
	if err != nil {
		return wire.Schedule{}, err
	}
	if req.Report.IdempotencyKey != nil {
		return wire.Schedule{}, fleet.Errorf(wire.CodeInvalid, "report.idempotency_key is the schedule's own (its name and each slot); leave it out")
	}
	planned, err := ss.operator.Plan(*req.Report)
	if err != nil {
		return wire.Schedule{}, err
	}
	request, err := json.Marshal(req.Report)
	if err != nil {
		return wire.Schedule{}, err
	}
	return ledger.Write(ctx, ss.ledger, ledger.Named[wire.Schedule]("schedule"), func(tx *store.Tx) (wire.Schedule, error) {
		switch _, err := tx.ScheduleGet(ctx, name, store.NoLock); {
		case err == nil:
			return wire.Schedule{}, fleet.Errorf(wire.CodeStateConflict, "schedule %s exists", name)
		case !store.IsNotFound(err):
			return wire.Schedule{}, err
		}
		if _, err := tx.TenantGet(ctx, planned.Tenant()); store.IsNotFound(err) {
			return wire.Schedule{}, fleet.Errorf(wire.CodeNotFound, "tenant %s not found (fleetctl tenant add makes one)", planned.Tenant())
		} else if err != nil {
			return wire.Schedule{}, err
		}
		s := store.Schedule{Name: name, Spec: *req.Schedule, Request: string(request), NextAtMS: nextSlot(spec, tx.Now), CreatedAtMS: tx.NowMS()}
		if err := tx.ScheduleInsert(ctx, s); err != nil {
			return wire.Schedule{}, err
		}
		return view(s), changed(ctx, tx, s, "added", fmt.Sprintf("The operator added the schedule %s (%s)", name, s.Spec))
	})
}

// view is what the API shows of a schedule.
func view(s store.Schedule) wire.Schedule {
	out := wire.Schedule{Name: s.Name, Schedule: s.Spec, Paused: s.Paused, NextAtMS: s.NextAtMS, Fired: s.Fired,
		LastSlotMS: s.LastSlotMS, CreatedAtMS: s.CreatedAtMS}
	_ = json.Unmarshal([]byte(s.Request), &out.Report) // the host wrote it from a checked request
	return out
}

// changed logs a change of a schedule, in its transaction.
func changed(ctx context.Context, tx *store.Tx, s store.Schedule, what, title string) error {
	return ledger.AppendEvent(ctx, tx, wire.EventScheduleChanged, operator.OperatorName, title,
		map[string]any{"schedule": s.Name, "change": what, "spec": s.Spec, "next_at_ms": s.NextAtMS})
}

// List is every schedule, by name.
func (ss *Schedules) List(ctx context.Context) (wire.SchedulesList, error) {
	out := wire.SchedulesList{Schedules: []wire.Schedule{}}
	err := ss.ledger.DB().Read(ctx, func(tx *store.Tx) error {
		all, err := tx.ScheduleList(ctx)
		out.Schedules = make([]wire.Schedule, 0, len(all)) // a read may run again
		for _, s := range all {
			out.Schedules = append(out.Schedules, view(s))
		}
		return err
	})
	return out, err
}

// SetPaused pauses a schedule (no slot fires while it is) or resumes it,
// from its first slot after now: the slots it was paused through are not
// submitted.
func (ss *Schedules) SetPaused(ctx context.Context, name string, paused bool) (wire.Schedule, error) {
	return ledger.Write(ctx, ss.ledger, ledger.Named[wire.Schedule]("schedule"), func(tx *store.Tx) (wire.Schedule, error) {
		s, err := get(ctx, tx, name)
		if err != nil || s.Paused == paused {
			return view(s), err
		}
		spec, err := parse(s.Spec)
		if err != nil {
			return wire.Schedule{}, err
		}
		s.Paused, s.NextAtMS = paused, nextSlot(spec, tx.Now)
		if err := tx.ScheduleSetPaused(ctx, name, paused, s.NextAtMS); err != nil {
			return wire.Schedule{}, err
		}
		what := map[bool]string{true: "paused", false: "resumed"}[paused]
		return view(s), changed(ctx, tx, s, what, fmt.Sprintf("The operator %s the schedule %s", what, name))
	})
}

// Remove removes a schedule; the reports it submitted stay.
func (ss *Schedules) Remove(ctx context.Context, name string) (wire.Schedule, error) {
	return ledger.Write(ctx, ss.ledger, ledger.Named[wire.Schedule]("schedule"), func(tx *store.Tx) (wire.Schedule, error) {
		s, err := get(ctx, tx, name)
		if err != nil {
			return wire.Schedule{}, err
		}
		if err := tx.ScheduleDelete(ctx, name); err != nil {
			return wire.Schedule{}, err
		}
		return view(s), changed(ctx, tx, s, "removed", fmt.Sprintf("The operator removed the schedule %s", name))
	})
}

func get(ctx context.Context, tx *store.Tx, name string) (store.Schedule, error) {
	// Locked: a pause racing another from a second host would otherwise
	// find the schedule running too, and both log a change.
	s, err := tx.ScheduleGet(ctx, name, store.ForUpdate)
	if store.IsNotFound(err) {
		return s, fleet.Errorf(wire.CodeNotFound, "no schedule named %.80q", name)
	}
	return s, err
}
