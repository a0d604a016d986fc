package postgres

import (
	"context"
	"fmt"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres/dbsqlc"
)

// A batch's transitions of several jobs, each in one statement (held to
// the batch's end: store/held.go). Each row keeps its own guard, and the
// statement fails its transaction unless every row changed.

func (c *conn) JobSetRunningMany(ctx context.Context, ps []store.JobSetRunningParams) error {
	now, err := oneInstant("set running", ps, func(p store.JobSetRunningParams) (string, int64) { return p.OperationID, p.NowMS })
	if err != nil || len(ps) == 0 {
		return err
	}
	q := &dbsqlc.JobSetRunningManyParams{UpdatedAtMs: now}
	for _, p := range ps {
		q.OperationIds, q.IfClaimIds = append(q.OperationIds, p.OperationID), append(q.IfClaimIds, p.IfClaimID)
		q.Reserved, q.ReserveShards, q.TenantShards = append(q.Reserved, p.Reserved), append(q.ReserveShards, p.ReserveShard), append(q.TenantShards, p.TenantShard)
		q.ReserveCredentials, q.Admissions = append(q.ReserveCredentials, p.ReserveCredential), append(q.Admissions, string(p.Admission))
		q.LeaseExpiresAtMs, q.Reasons = append(q.LeaseExpiresAtMs, p.LeaseExpiresAtMS), append(q.Reasons, p.Reason)
	}
	return wrap(c.q.JobSetRunningMany(ctx, q), "set running", fmt.Sprintf("%d jobs", len(ps)))
}

func (c *conn) JobSetRefusedMany(ctx context.Context, ps []store.JobSetRefusedParams) error {
	now, err := oneInstant("set refused", ps, func(p store.JobSetRefusedParams) (string, int64) { return p.OperationID, p.NowMS })
	if err != nil || len(ps) == 0 {
		return err
	}
	q := &dbsqlc.JobSetRefusedManyParams{UpdatedAtMs: now}
	for _, p := range ps {
		q.OperationIds, q.IfClaimIds = append(q.OperationIds, p.OperationID), append(q.IfClaimIds, p.IfClaimID)
		q.Admissions, q.Reasons = append(q.Admissions, string(p.Admission)), append(q.Reasons, p.Reason)
	}
	return wrap(c.q.JobSetRefusedMany(ctx, q), "set refused", fmt.Sprintf("%d jobs", len(ps)))
}

// oneInstant is the one time a batch's transitions are stamped with (the
// transaction's), which their one statement writes for all.
func oneInstant[P any](what string, ps []P, at func(P) (op string, ms int64)) (int64, error) {
	if len(ps) == 0 {
		return 0, nil
	}
	_, now := at(ps[0])
	for _, p := range ps[1:] {
		if op, ms := at(p); ms != now {
			return 0, fmt.Errorf("%s: %s at %d ms, the others at %d", what, op, ms, now)
		}
	}
	return now, nil
}

func (c *conn) JobCompleteMany(ctx context.Context, ps []store.JobCompleteParams) error {
	now, err := oneInstant("complete", ps, func(p store.JobCompleteParams) (string, int64) { return p.OperationID, p.NowMS })
	if err != nil || len(ps) == 0 {
		return err
	}
	q := &dbsqlc.JobCompleteManyParams{UpdatedAtMs: now}
	for _, p := range ps {
		q.OperationIds, q.IfStates, q.Reasons = append(q.OperationIds, p.OperationID), append(q.IfStates, string(p.IfState)), append(q.Reasons, p.Reason)
	}
	return wrap(c.q.JobCompleteMany(ctx, q), "complete", fmt.Sprintf("%d jobs", len(ps)))
}
