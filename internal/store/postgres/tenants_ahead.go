package postgres

import (
	"context"
	"maps"
	"slices"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/dbutil"
	"github.com/fleet/fleet/internal/store/postgres/dbsqlc"
)

// tenantAhead is what a transaction took ahead at one tenant
// (TenantReserveAhead) and has not handed out: left reservations on shard,
// and the tenant's figures as the reservations handed out so far left
// them.
type tenantAhead struct {
	shard, left, cost int64
	tenant            store.Tenant
}

// TenantReserveAhead takes up to n reservations at the tenant in one
// statement, as AccountingReserveAhead does at the fleet: a batch's
// dispatches then reserve at the tenant without a statement each, and
// hold one of its shards. It may take fewer, or none (every shard with
// room held elsewhere), and TenantReserve reserves as usual once they are
// gone.
func (c *conn) TenantReserveAhead(ctx context.Context, tenant string, n int) error {
	if err := c.beforeTenantAhead(ctx, tenant); err != nil {
		return err
	}
	r, err := c.q.TenantReserveAhead(ctx, tenant, int64(n))
	switch {
	case isNoRows(err):
		return nil
	case err != nil:
		return dbutil.Failed(err, "reserve ahead at tenant", tenant)
	}
	c.tookAheadAt(tenant, r.Shard, r.Take, r.CostPerReport,
		tenantRow{r.Name, r.Allowance, r.Spent, r.Reserved, r.Weight, r.Period, r.PeriodStartMs, r.CreatedAtMs})
	return nil
}

// LevelsReserveAhead is TenantReserveAhead then AccountingReserveAhead in
// one statement: one round trip where they took two.
func (c *conn) LevelsReserveAhead(ctx context.Context, tenant string, atTenant, atFleet int) error {
	if err := c.beforeTenantAhead(ctx, tenant); err != nil {
		return err
	}
	if err := c.writeAhead(ctx); err != nil {
		return err
	}
	r, err := c.q.LevelsReserveAhead(ctx, &dbsqlc.LevelsReserveAheadParams{Tenant: tenant, AtTenant: int64(atTenant), AtFleet: int64(atFleet)})
	switch {
	case isNoRows(err):
		return nil // no allowance set: each admission finds that out itself
	case err != nil:
		return dbutil.Failed(err, "reserve ahead at tenant and fleet", tenant)
	}
	if r.TenantShard.Valid {
		c.tookAheadAt(tenant, r.TenantShard.Int64, r.TenantTake.Int64, r.CostPerReport, tenantRow{r.TenantName.String, r.TenantAllowance,
			r.TenantSpent.Int64, r.TenantReserved.Int64, r.TenantWeight.Int64, r.TenantPeriod.String, r.TenantPeriodStartMs.Int64, r.TenantCreatedAtMs.Int64})
	}
	if r.FleetShard.Valid {
		c.tookAhead(r.FleetShard.Int64, r.FleetTake.Int64, r.CostPerReport,
			shardFigures{allowance: r.FleetAllowance.Int64, spent: r.FleetSpent.Int64, reserved: r.FleetReserved.Int64, calls: r.FleetCalls.Int64})
	}
	return nil
}

// beforeTenantAhead gives back what was taken ahead at tenant and writes
// the settlements held, before reservations are taken ahead there.
func (c *conn) beforeTenantAhead(ctx context.Context, tenant string) error {
	if err := c.returnAhead(ctx, tenant); err != nil {
		return err
	}
	return c.writeTenantMoves(ctx)
}

// tookAheadAt records take reservations taken ahead at tenant's shard,
// with the tenant's figures before them.
func (c *conn) tookAheadAt(tenant string, shard, take, cost int64, before tenantRow) {
	if c.tenantsAhead == nil {
		c.tenantsAhead = map[string]*tenantAhead{}
	}
	c.tenantsAhead[tenant] = &tenantAhead{shard: shard, left: take, cost: cost, tenant: tenantFrom(before)}
	c.holdTenantShard(tenant, shard)
}

// handOutAhead is a reservation at the tenant taken ahead, with the
// figures it would have had alone; ok is false when none is left.
func (c *conn) handOutAhead(name string) (store.TenantReservation, bool) {
	a := c.tenantsAhead[name]
	if a == nil || a.left == 0 {
		return store.TenantReservation{}, false
	}
	a.left--
	a.tenant.Reserved += a.cost
	return store.TenantReservation{Tenant: a.tenant, Shard: a.shard, OK: true}, true
}

// writeTenantsAhead gives back the reservations taken ahead and not
// handed out, and writes the settlements held (tenants_held.go), before
// the transaction touches a tenant otherwise or commits.
func (c *conn) writeTenantsAhead(ctx context.Context) error {
	if err := c.returnAllAhead(ctx); err != nil {
		return err
	}
	return c.writeTenantMoves(ctx)
}

// returnAllAhead gives back, at every tenant, what was taken ahead and
// not handed out.
func (c *conn) returnAllAhead(ctx context.Context) error {
	for _, name := range slices.Sorted(maps.Keys(c.tenantsAhead)) {
		if err := c.returnAhead(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// returnAhead gives back what was taken ahead at one tenant and not
// handed out.
func (c *conn) returnAhead(ctx context.Context, name string) error {
	a := c.tenantsAhead[name]
	delete(c.tenantsAhead, name)
	if a == nil || a.left == 0 {
		return nil
	}
	if err := c.q.TenantReserveReturn(ctx, &dbsqlc.TenantReserveReturnParams{Unused: a.left, Tenant: name, Shard: a.shard}); err != nil {
		return dbutil.Failed(err, "return reservations taken ahead at tenant", name)
	}
	return nil
}

// cloneTenantsAhead copies what was taken ahead, for a savepoint.
func cloneTenantsAhead(m map[string]*tenantAhead) map[string]*tenantAhead {
	if m == nil {
		return nil
	}
	out := make(map[string]*tenantAhead, len(m))
	for k, v := range m {
		c := *v
		out[k] = &c
	}
	return out
}
