package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/dbutil"
	"github.com/fleet/fleet/internal/store/postgres/dbsqlc"
	"github.com/fleet/fleet/internal/wire"
)

// A tenant's figures are held in shards (tenant_shards, migration 0013),
// for the reason the fleet's allowance is (accounting.go): the tenant
// default of a one-team fleet is in every admission and settlement. A
// capped tenant's shards' allowances add up to its allowance; each shard
// keeps the guard. Reservations and settlements take one shard the way
// the allowance's do (onOneShard); only when none covers are all the
// tenant's shards locked, in order, and its available credits spread.

// tenantShards is how many shards a new tenant gets: enough that the
// hosts' concurrent admissions of one tenant rarely wait on each other,
// as many as the fleet's. With 16, four hosts' batches held every shard
// of the tenant, their reservations ahead came back empty and deadlocked
// batches ran again (BENCHMARKS.md, issue 39); 64 measured no better
// than 32. A tenant keeps the shards it was created with (the default
// tenant of a database from before migration 0013 has 16).
const tenantShards = 32

func int8Of(v *int64) pgtype.Int8 {
	if v == nil {
		return pgtype.Int8{}
	}
	return pgtype.Int8{Int64: *v, Valid: true}
}

// tenantRow is every query's tenant, with its figures summed.
type tenantRow = struct {
	Name          string
	Allowance     pgtype.Int8
	Spent         int64
	Reserved      int64
	Weight        int64
	Period        string
	PeriodStartMs int64
	CreatedAtMs   int64
}

func tenantFrom(t tenantRow) store.Tenant {
	out := store.Tenant{Name: t.Name, Spent: t.Spent, Reserved: t.Reserved, Weight: t.Weight, Period: t.Period,
		PeriodStartMS: t.PeriodStartMs, CreatedAtMS: t.CreatedAtMs}
	if t.Allowance.Valid {
		out.Allowance = &t.Allowance.Int64
	}
	return out
}

func (c *conn) TenantInsert(ctx context.Context, t store.Tenant) error {
	return wrap(c.q.TenantInsert(ctx, &dbsqlc.TenantInsertParams{Shards: tenantShards, Name: t.Name, Allowance: int8Of(t.Allowance),
		Weight: t.Weight, Period: t.Period, PeriodStartMs: t.PeriodStartMS, CreatedAtMs: t.CreatedAtMS}), "add tenant", t.Name)
}

func (c *conn) TenantGet(ctx context.Context, name string) (store.Tenant, error) {
	if err := c.writeTenantsAhead(ctx); err != nil {
		return store.Tenant{}, err
	}
	t, err := c.q.TenantGet(ctx, name)
	return tenantFrom(tenantRow(t)), dbutil.One(err, "read tenant", name)
}

func (c *conn) TenantList(ctx context.Context) ([]store.Tenant, error) {
	if err := c.writeTenantsAhead(ctx); err != nil {
		return nil, err
	}
	rows, err := c.q.TenantList(ctx)
	out := make([]store.Tenant, 0, len(rows))
	for _, t := range rows {
		out = append(out, tenantFrom(tenantRow(t)))
	}
	return out, wrap(err, "list tenants", "")
}

func (c *conn) TenantSetAllowance(ctx context.Context, name string, allowance *int64) (store.TenantChange, error) {
	if err := c.writeTenantsAhead(ctx); err != nil {
		return store.TenantChange{}, err
	}
	if err := c.lockTenant(ctx, name); err != nil {
		return store.TenantChange{}, err
	}
	t, err := c.TenantGet(ctx, name)
	if err != nil || (allowance != nil && *allowance < t.Spent+t.Reserved) {
		return store.TenantChange{Tenant: t}, err
	}
	if err := c.q.TenantSpread(ctx, int8Of(allowance), name); err != nil {
		return store.TenantChange{Tenant: t}, wrap(err, "set tenant allowance", name)
	}
	t.Allowance = allowance
	return store.TenantChange{Tenant: t, OK: true}, nil
}

func (c *conn) TenantSetWeight(ctx context.Context, name string, weight int64) (store.Tenant, error) {
	if _, err := c.q.TenantSetWeight(ctx, weight, name); err != nil {
		return store.Tenant{}, dbutil.One(err, "set tenant weight", name)
	}
	return c.TenantGet(ctx, name)
}

func (c *conn) lockTenant(ctx context.Context, name string) error {
	_, err := c.q.TenantLockShards(ctx, name)
	return wrap(err, "lock tenant", name)
}

// reservedAt reads a guarded reservation on one shard of a tenant.
func reservedAt[R ~struct {
	Shard         int64
	Name          string
	Allowance     pgtype.Int8
	Spent         int64
	Reserved      int64
	Weight        int64
	Period        string
	PeriodStartMs int64
	CreatedAtMs   int64
}](r R, err error) (store.Tenant, int64, bool, error) {
	switch {
	case isNoRows(err):
		return store.Tenant{}, -1, false, nil
	case err != nil:
		return store.Tenant{}, -1, false, dbutil.Failed(err, "reserve at tenant", "")
	}
	x := dbsqlc.TenantReserveFreeRow(r)
	return tenantFrom(tenantRow{x.Name, x.Allowance, x.Spent, x.Reserved, x.Weight, x.Period, x.PeriodStartMs, x.CreatedAtMs}), x.Shard, true, nil
}

func (c *conn) TenantReserve(ctx context.Context, name string) (store.TenantReservation, error) {
	// Those taken ahead first (tenants_ahead.go), then the shard of the
	// tenant this transaction already holds: it waits for no one. Picking
	// a random free shard for each job, a batch of 32 held most of a
	// tenant's shards (16 then) to its commit, and the other batches waited on
	// them or deadlocked (BENCHMARKS.md, issue 39).
	if r, ok := c.handOutAhead(name); ok {
		return r, nil
	}
	if err := c.returnAhead(ctx, name); err != nil {
		return store.TenantReservation{Shard: -1}, err
	}
	if err := c.writeTenantMoves(ctx); err != nil {
		return store.TenantReservation{Shard: -1}, err
	}
	if shard, held := c.tenantHeld[name]; held {
		if t, at, ok, err := reservedAt(c.q.TenantReserveOn(ctx, name, shard)); err != nil || ok {
			return store.TenantReservation{Tenant: t, Shard: at, OK: ok}, err
		}
	}
	r, err := c.tenantReserveAny(ctx, name)
	if err == nil && r.OK {
		c.holdTenantShard(name, r.Shard)
	}
	return r, err
}

// holdTenantShard records the shard of the tenant this transaction now
// holds, for its next reservations there.
func (c *conn) holdTenantShard(name string, shard int64) {
	if c.tenantHeld == nil {
		c.tenantHeld = map[string]int64{}
	}
	c.tenantHeld[name] = shard
}

// tenantReserveAny reserves on any shard of the tenant that covers the
// cost, or on the whole when none does alone.
func (c *conn) tenantReserveAny(ctx context.Context, name string) (store.TenantReservation, error) {
	free := func() (store.Tenant, int64, bool, error) { return reservedAt(c.q.TenantReserveFree(ctx, name)) }
	covering := func() ([]int64, error) { return c.q.TenantReserveCovering(ctx, name) }
	on := func(shard int64) func() (store.Tenant, int64, bool, error) {
		return func() (store.Tenant, int64, bool, error) { return reservedAt(c.q.TenantReserveOn(ctx, name, shard)) }
	}
	if t, shard, ok, err := onOneShard(ctx, c, "reserve at tenant", free, covering, on); err != nil || ok {
		return store.TenantReservation{Tenant: t, Shard: shard, OK: ok}, err
	}
	// No shard covers it alone: decide on the whole, holding every shard.
	if err := c.lockTenant(ctx, name); err != nil {
		return store.TenantReservation{Shard: -1}, err
	}
	t, err := c.TenantGet(ctx, name)
	cost, cerr := c.costPerReport(ctx)
	if err == nil {
		err = cerr
	}
	if err != nil || (t.Allowance != nil && *t.Allowance-t.Spent-t.Reserved < cost) {
		return store.TenantReservation{Tenant: t, Shard: -1}, err
	}
	if err := c.q.TenantSpread(ctx, int8Of(t.Allowance), name); err != nil {
		return store.TenantReservation{Tenant: t, Shard: -1}, wrap(err, "reserve at tenant", name)
	}
	t, shard, ok, err := free()
	if err == nil && !ok {
		err = fmt.Errorf("reserve at tenant %s: no shard covers %d after spreading its credits", name, cost)
	}
	return store.TenantReservation{Tenant: t, Shard: shard, OK: ok}, err
}

func (c *conn) costPerReport(ctx context.Context) (int64, error) {
	a, err := c.AccountingGet(ctx, store.NoLock)
	return a.CostPerReport, err
}

// movedAt reads a guarded settlement on one shard of a tenant.
func movedAt[R ~struct {
	Shard    int64
	Spent    int64
	Reserved int64
}](r R, err error) (struct{}, int64, bool, error) {
	switch {
	case isNoRows(err):
		return struct{}{}, -1, false, nil
	case err != nil:
		return struct{}{}, -1, false, dbutil.Failed(err, "settle credits at tenant", "")
	}
	return struct{}{}, dbsqlc.TenantMoveOnRow(r).Shard, true, nil
}

func (c *conn) TenantMove(ctx context.Context, p *store.TenantMoveParams) (bool, error) {
	if err := c.returnAllAhead(ctx); err != nil {
		return false, err
	}
	// On a shard a batch holds: decided on its figures, written with the
	// batch's others in one statement.
	if decided, ok := c.moveHeld(p); decided {
		return ok, nil
	}
	if err := c.writeTenantMoves(ctx); err != nil {
		return false, err
	}
	on := func(shard int64) func() (struct{}, int64, bool, error) {
		return func() (struct{}, int64, bool, error) {
			return movedAt(c.q.TenantMoveOn(ctx, &dbsqlc.TenantMoveOnParams{FromReserved: p.FromReserved, ToSpent: p.ToSpent,
				Tenant: p.Tenant, Shard: shard}))
		}
	}
	if p.Shard >= 0 {
		// Where the job's part is held: settle there, waiting for the
		// shard if another transaction holds it, with the next statement
		// (a round trip saved: the reservation is there, so the guard
		// holds, and fails the transaction if it does not).
		return true, wrap(c.q.TenantMoveHeld(ctx, &dbsqlc.TenantMoveHeldParams{FromReserved: p.FromReserved, ToSpent: p.ToSpent,
			Tenant: p.Tenant, Shard: p.Shard}), "settle credits at tenant", p.Tenant)
	}
	free := func() (struct{}, int64, bool, error) {
		return movedAt(c.q.TenantMoveFree(ctx, &dbsqlc.TenantMoveFreeParams{FromReserved: p.FromReserved, ToSpent: p.ToSpent, Tenant: p.Tenant}))
	}
	covering := func() ([]int64, error) { return c.q.TenantMoveCovering(ctx, p.Tenant, p.FromReserved) }
	if _, _, ok, err := onOneShard(ctx, c, "settle credits at tenant", free, covering, on); err != nil || ok {
		return ok, err
	}
	return c.tenantSettleSpread(ctx, p)
}

// tenantSettleSpread settles a tenant's part spread over its shards,
// shard by shard, holding every one.
func (c *conn) tenantSettleSpread(ctx context.Context, p *store.TenantMoveParams) (bool, error) {
	if err := c.lockTenant(ctx, p.Tenant); err != nil {
		return false, err
	}
	shards, err := c.q.TenantShardList(ctx, p.Tenant)
	if err != nil {
		return false, wrap(err, "settle credits at tenant", p.Tenant)
	}
	var held int64
	for _, s := range shards {
		held += s.Reserved
	}
	if held < p.FromReserved {
		return false, nil
	}
	leftReserved, leftSpent := p.FromReserved, p.ToSpent
	for _, s := range shards {
		take := min(s.Reserved, leftReserved)
		if take == 0 {
			continue
		}
		spend := min(take, leftSpent)
		if err := c.q.TenantShardSettle(ctx, &dbsqlc.TenantShardSettleParams{FromReserved: take, ToSpent: spend, Tenant: p.Tenant, Shard: s.Shard}); err != nil {
			return false, wrap(err, "settle credits at tenant", p.Tenant)
		}
		leftReserved, leftSpent = leftReserved-take, leftSpent-spend
	}
	if leftReserved != 0 || leftSpent != 0 {
		return false, fmt.Errorf("settle credits at tenant %s: %d reserved and %d spent left over", p.Tenant, leftReserved, leftSpent)
	}
	return true, nil
}

func (c *conn) TenantRollover(ctx context.Context, p *store.TenantRolloverParams) (store.TenantRolled, error) {
	if err := c.writeTenantsAhead(ctx); err != nil {
		return store.TenantRolled{}, err
	}
	_, err := c.q.TenantPeriodMove(ctx, &dbsqlc.TenantPeriodMoveParams{PeriodStartMs: p.PeriodStartMS, Name: p.Tenant,
		IfPeriodStartMs: p.IfPeriodStartMS})
	switch {
	case isNoRows(err):
		return store.TenantRolled{}, nil // another transaction started it, or it was never due
	case err != nil:
		return store.TenantRolled{}, wrap(err, "start a tenant's period", p.Tenant)
	}
	ended, err := c.q.TenantSpentReset(ctx, p.Tenant)
	return store.TenantRolled{OK: err == nil, EndedSpent: ended}, wrap(err, "start a tenant's period", p.Tenant)
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
