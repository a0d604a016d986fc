package store

import "context"

// Schedules are the operations of recurring reports (the Executor embeds
// them).
type Schedules interface {
	ScheduleInsert(ctx context.Context, s Schedule) error
	// ScheduleGet reads one schedule (ErrNotFound when there is none),
	// with ForUpdate locked until the transaction ends, for a change that
	// reads it first; ScheduleList every one, by name.
	ScheduleGet(ctx context.Context, name string, lock Lock) (Schedule, error)
	ScheduleList(ctx context.Context) ([]Schedule, error)
	// ScheduleAnyDue reports whether any schedule not paused has its next
	// slot at or before NowMS, locking nothing (a read transaction may ask).
	ScheduleAnyDue(ctx context.Context, nowMS int64) (bool, error)
	// ScheduleDue is up to Max schedules not paused whose next slot is at
	// or before NowMS, soonest first; on a backend with row locks, locked,
	// passing over one another transaction holds.
	ScheduleDue(ctx context.Context, nowMS int64, max int) ([]Schedule, error)
	// ScheduleAdvance moves a schedule to its next slot, counting a
	// firing, if it is not paused and still at IfNextAtMS; false, and
	// nothing changed, otherwise.
	ScheduleAdvance(ctx context.Context, p *ScheduleAdvanceParams) (bool, error)
	// ScheduleSetPaused pauses or resumes a schedule, its next slot set
	// (ErrNotFound when there is none).
	ScheduleSetPaused(ctx context.Context, name string, paused bool, nextAtMS int64) error
	// ScheduleDelete removes a schedule (ErrNotFound when there is none).
	ScheduleDelete(ctx context.Context, name string) error
}

// Schedule is a recurring report: Spec its cron expression (UTC), Request
// the report it submits (wire.ReportsRequest without its key, as JSON).
type Schedule struct {
	Name        string
	Spec        string
	Request     string
	Paused      bool
	NextAtMS    int64
	Fired       int64
	LastSlotMS  int64
	CreatedAtMS int64
}

// ScheduleAdvanceParams moves a schedule on from the slot a firing read.
type ScheduleAdvanceParams struct {
	Name       string
	IfNextAtMS int64
	NextAtMS   int64
	LastSlotMS int64
}
