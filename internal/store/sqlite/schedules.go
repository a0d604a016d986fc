package sqlite

import (
	"context"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/dbutil"
	"github.com/fleet/fleet/internal/store/sqlite/dbsqlc"
)

func scheduleFrom(s dbsqlc.Schedule) store.Schedule {
	return store.Schedule{Name: s.Name, Spec: s.Spec, Request: s.Request, Paused: s.Paused == 1, NextAtMS: s.NextAtMs,
		Fired: s.Fired, LastSlotMS: s.LastSlotMs, CreatedAtMS: s.CreatedAtMs}
}

func schedulesFrom(rows []dbsqlc.Schedule) []store.Schedule {
	out := make([]store.Schedule, len(rows))
	for i, r := range rows {
		out[i] = scheduleFrom(r)
	}
	return out
}

func (c *conn) ScheduleInsert(ctx context.Context, s store.Schedule) error {
	return wrap(c.q.ScheduleInsert(ctx, &dbsqlc.ScheduleInsertParams{Name: s.Name, Spec: s.Spec, Request: s.Request,
		NextAtMs: s.NextAtMS, CreatedAtMs: s.CreatedAtMS}), "record schedule", s.Name)
}

func (c *conn) ScheduleGet(ctx context.Context, name string, _ store.Lock) (store.Schedule, error) {
	s, err := c.q.ScheduleGet(ctx, name)
	return scheduleFrom(s), dbutil.One(err, "read schedule", name)
}

func (c *conn) ScheduleList(ctx context.Context) ([]store.Schedule, error) {
	rows, err := c.q.ScheduleList(ctx)
	return schedulesFrom(rows), wrap(err, "list schedules", "")
}

func (c *conn) ScheduleDue(ctx context.Context, nowMS int64, max int) ([]store.Schedule, error) {
	rows, err := c.q.ScheduleDue(ctx, nowMS, int64(max))
	return schedulesFrom(rows), wrap(err, "read the schedules due", "")
}

func (c *conn) ScheduleAdvance(ctx context.Context, p *store.ScheduleAdvanceParams) (bool, error) {
	n, err := c.q.ScheduleAdvance(ctx, &dbsqlc.ScheduleAdvanceParams{NextAtMs: p.NextAtMS, LastSlotMs: p.LastSlotMS,
		Name: p.Name, IfNextAtMs: p.IfNextAtMS})
	return n == 1, wrap(err, "move schedule", p.Name)
}

func (c *conn) ScheduleSetPaused(ctx context.Context, name string, paused bool, nextAtMS int64) error {
	n, err := c.q.ScheduleSetPaused(ctx, &dbsqlc.ScheduleSetPausedParams{Paused: dbutil.Bool(paused), NextAtMs: nextAtMS, Name: name})
	if err == nil && n != 1 {
		err = store.ErrNotFound
	}
	return wrap(err, "pause or resume schedule", name)
}

func (c *conn) ScheduleDelete(ctx context.Context, name string) error {
	n, err := c.q.ScheduleDelete(ctx, name)
	if err == nil && n != 1 {
		err = store.ErrNotFound
	}
	return wrap(err, "remove schedule", name)
}

func (c *conn) ScheduleAnyDue(ctx context.Context, nowMS int64) (bool, error) {
	due, err := c.q.ScheduleAnyDue(ctx, nowMS)
	return due, wrap(err, "ask whether a schedule is due", "")
}
