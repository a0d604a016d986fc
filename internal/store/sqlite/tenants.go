package sqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/dbutil"
	"github.com/fleet/fleet/internal/store/sqlite/dbsqlc"
	"github.com/fleet/fleet/internal/wire"
)

// A tenant is one row, with its figures; SQLite's one writer holds it, as
// it holds the fleet's allowance, so no shard is needed (TenantShard is
// always 0). A write transaction decides its reservations and settlements
// at a tenant in the process (ahead.go), on the figures it read at
// the first, with the guard the UPDATE would have had, and writes each
// tenant's once, before it commits: every admission and settlement of a
// one-team fleet touches the tenant default, and a group commit holds
// many (two statements a job would otherwise cost every job about an
// eighth of its host CPU). The CHECKs still guard what is written.

func tenantFrom(t dbsqlc.Tenant) store.Tenant {
	out := store.Tenant{Name: t.Name, Spent: t.Spent, Reserved: t.Reserved, Weight: t.Weight, Period: t.Period,
		PeriodStartMS: t.PeriodStartMs, CreatedAtMS: t.CreatedAtMs}
	if t.Allowance.Valid {
		out.Allowance = &t.Allowance.Int64
	}
	return out
}

func nullable(v *int64) sql.NullInt64 {
	if v == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: *v, Valid: true}
}

func (c *conn) TenantInsert(ctx context.Context, t store.Tenant) error {
	if err := c.writeAhead(ctx); err != nil {
		return err
	}
	return wrap(c.q.TenantInsert(ctx, &dbsqlc.TenantInsertParams{Name: t.Name, Allowance: nullable(t.Allowance), Weight: t.Weight,
		Period: t.Period, PeriodStartMs: t.PeriodStartMS, CreatedAtMs: t.CreatedAtMS}), "add tenant", t.Name)
}

func (c *conn) TenantGet(ctx context.Context, name string) (store.Tenant, error) {
	if err := c.writeAhead(ctx); err != nil {
		return store.Tenant{}, err
	}
	t, err := c.q.TenantGet(ctx, name)
	return tenantFrom(t), dbutil.One(err, "read tenant", name)
}

func (c *conn) TenantList(ctx context.Context) ([]store.Tenant, error) {
	if err := c.writeAhead(ctx); err != nil {
		return nil, err
	}
	rows, err := c.q.TenantList(ctx)
	out := make([]store.Tenant, 0, len(rows))
	for _, t := range rows {
		out = append(out, tenantFrom(t))
	}
	return out, wrap(err, "list tenants", "")
}

func (c *conn) TenantSetAllowance(ctx context.Context, name string, allowance *int64) (store.TenantChange, error) {
	if err := c.writeAhead(ctx); err != nil {
		return store.TenantChange{}, err
	}
	t, err := c.q.TenantSetAllowance(ctx, nullable(allowance), name)
	if errors.Is(err, sql.ErrNoRows) { // the guard refused, or there is no such tenant
		t, err := c.TenantGet(ctx, name)
		return store.TenantChange{Tenant: t}, err
	}
	return store.TenantChange{Tenant: tenantFrom(t), OK: err == nil}, wrap(err, "set tenant allowance", name)
}

func (c *conn) TenantSetWeight(ctx context.Context, name string, weight int64) (store.Tenant, error) {
	if err := c.writeAhead(ctx); err != nil {
		return store.Tenant{}, err
	}
	t, err := c.q.TenantSetWeight(ctx, weight, name)
	return tenantFrom(t), dbutil.One(err, "set tenant weight", name)
}

func (c *conn) TenantReserve(ctx context.Context, name string) (store.TenantReservation, error) {
	t, err := c.tenantAhead(ctx, name)
	if err != nil {
		return store.TenantReservation{Shard: -1}, err
	}
	cost := c.ahead.cost
	if t.Allowance != nil && *t.Allowance-t.Spent-t.Reserved < cost {
		return store.TenantReservation{Tenant: t.Tenant, Shard: -1}, nil
	}
	t.Reserved, t.reserved = t.Reserved+cost, t.reserved+cost
	return store.TenantReservation{Tenant: t.Tenant, Shard: 0, OK: true}, nil
}

func (c *conn) TenantMove(ctx context.Context, p *store.TenantMoveParams) (bool, error) {
	t, err := c.tenantAhead(ctx, p.Tenant)
	if err != nil || t.Reserved < p.FromReserved || p.ToSpent > p.FromReserved {
		return false, err
	}
	t.Reserved, t.reserved = t.Reserved-p.FromReserved, t.reserved-p.FromReserved
	t.Spent, t.spent = t.Spent+p.ToSpent, t.spent+p.ToSpent
	return true, nil
}

func (c *conn) TenantRollover(ctx context.Context, p *store.TenantRolloverParams) (store.TenantRolled, error) {
	before, err := c.TenantGet(ctx, p.Tenant)
	if err != nil {
		return store.TenantRolled{}, err
	}
	_, err = c.q.TenantRollover(ctx, &dbsqlc.TenantRolloverParams{PeriodStartMs: p.PeriodStartMS, Name: p.Tenant,
		IfPeriodStartMs: p.IfPeriodStartMS})
	if errors.Is(err, sql.ErrNoRows) {
		return store.TenantRolled{}, nil
	}
	return store.TenantRolled{OK: err == nil, EndedSpent: before.Spent}, wrap(err, "start a tenant's period", p.Tenant)
}

// tenantAhead is the tenant as this transaction's decisions left it,
// read at its first.
func (c *conn) tenantAhead(ctx context.Context, name string) (*aheadTenant, error) {
	if c.ahead == nil {
		cost, err := c.costPerReport(ctx)
		if err != nil {
			return nil, err
		}
		c.ahead = newAhead(cost)
	}
	if t := c.ahead.tenants[name]; t != nil {
		return t, nil
	}
	row, err := c.q.TenantGet(ctx, name)
	if err != nil {
		return nil, dbutil.One(err, "read tenant", name)
	}
	t := &aheadTenant{Tenant: tenantFrom(row)}
	c.ahead.tenants[name] = t
	return t, nil
}

// costPerReport is the state's cost per report, read once a write
// connection (nothing changes it after init).
func (c *conn) costPerReport(ctx context.Context) (int64, error) {
	if c.cached != nil {
		if cost := c.cached.d.costPerReport.Load(); cost > 0 {
			return cost, nil
		}
	}
	a, err := c.q.AccountingGet(ctx)
	if err != nil {
		return 0, dbutil.One(err, "read accounting", "")
	}
	if c.cached != nil {
		c.cached.d.costPerReport.Store(a.CostPerReport)
	}
	return a.CostPerReport, nil
}

func (c *conn) JobCountByTenant(ctx context.Context) (map[string]map[wire.JobState]int64, error) {
	rows, err := c.q.JobCountByTenant(ctx)
	out := map[string]map[wire.JobState]int64{}
	for _, r := range rows {
		if out[r.Tenant] == nil {
			out[r.Tenant] = map[wire.JobState]int64{}
		}
		out[r.Tenant][wire.JobState(r.State)] = r.Jobs
	}
	return out, wrap(err, "count jobs by tenant", "")
}

func (c *conn) JobTenantsQueued(ctx context.Context) ([]string, error) {
	names, err := c.q.JobTenantsQueued(ctx)
	if names == nil {
		names = []string{}
	}
	return names, wrap(err, "list tenants with queued jobs", "")
}

func (c *conn) JobInFlightByTenant(ctx context.Context) (map[string]int64, error) {
	rows, err := c.q.JobInFlightByTenant(ctx)
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.Tenant] = r.Jobs
	}
	return out, wrap(err, "count jobs in flight by tenant", "")
}
