package views

import (
	"context"
	"slices"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Report reads one submitted report (by its idempotency key): its jobs in
// submission order, each with the sections it waits for.
func (vs *Views) Report(ctx context.Context, key string) (wire.Report, error) {
	var r wire.Report
	err := vs.db.Read(ctx, func(tx *store.Tx) error {
		b, err := tx.BatchGet(ctx, key)
		if store.IsNotFound(err) {
			return fleet.Errorf(wire.CodeNotFound, "no report with the key %.80q", key)
		}
		if err != nil {
			return err
		}
		ops, err := tx.JobListByBatch(ctx, key)
		if err != nil {
			return err
		}
		jobs := make([]store.Job, len(ops))
		for i, op := range ops {
			if jobs[i], err = tx.JobGet(ctx, op, store.NoLock); err != nil {
				return err
			}
		}
		sectionOf := map[string]string{}
		for _, j := range jobs {
			sectionOf[j.OperationID] = j.Section
		}
		r = wire.Report{Key: key, CreatedAtMS: b.CreatedMS, Sections: make([]wire.ReportSection, 0, len(jobs))}
		for _, j := range jobs {
			deps, err := tx.JobDependencyList(ctx, j.OperationID)
			if err != nil {
				return err
			}
			after := make([]string, 0, len(deps))
			for _, d := range deps {
				after = append(after, sectionOf[d])
			}
			slices.Sort(after)
			r.Sections = append(r.Sections, wire.ReportSection{OperationID: j.OperationID, Section: j.Section, State: j.State,
				Reason: j.Reason, Tenant: j.Tenant, After: after, WaitingOn: j.WaitingOn})
		}
		return nil
	})
	return r, err
}
