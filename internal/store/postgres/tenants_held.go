package postgres

import (
	"cmp"
	"context"
	"maps"
	"slices"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres/dbsqlc"
)

// tenantShard names one shard of one tenant's figures.
type tenantShard struct {
	tenant string
	shard  int64
}

// heldTenantShards are the tenant shards a transaction holds locked
// (AccountingHold: a batch settling its jobs' parts), each with what is
// reserved there as the settlements decided so far left it, and what
// they took off and added to spent, written in one statement
// (writeTenantMoves) rather than one each.
type heldTenantShards struct {
	reserved map[tenantShard]int64
	moved    map[tenantShard]*shardFigures
}

// holdTenants records the tenant shards AccountingHold locked.
func (c *conn) holdTenants(rows []dbsqlc.TenantHoldRow) {
	h := &heldTenantShards{reserved: make(map[tenantShard]int64, len(rows))}
	for _, r := range rows {
		h.reserved[tenantShard{r.Tenant, r.Shard}] = r.Reserved
	}
	c.tenantsHeld = h
}

// moveHeld settles p on a tenant shard this transaction holds, guarded as
// TenantMoveOn is (no fewer reserved there than it takes off): decided is
// false when the shard is not held, and ok false, with nothing changed,
// when it holds fewer.
func (c *conn) moveHeld(p *store.TenantMoveParams) (decided, ok bool) {
	h := c.tenantsHeld
	if h == nil || p.Shard < 0 {
		return false, false
	}
	at := tenantShard{p.Tenant, p.Shard}
	reserved, held := h.reserved[at]
	if !held {
		return false, false
	}
	if reserved < p.FromReserved || p.ToSpent > p.FromReserved {
		return true, false
	}
	h.reserved[at] = reserved - p.FromReserved
	if h.moved == nil {
		h.moved = map[tenantShard]*shardFigures{}
	}
	m := h.moved[at]
	if m == nil {
		m = &shardFigures{}
		h.moved[at] = m
	}
	m.reserved += p.FromReserved
	m.spent += p.ToSpent
	return true, true
}

// writeTenantMoves writes the settlements held, one statement for all,
// before anything else of the transaction reads or writes a tenant's
// figures, and before it commits; the shards stay held (locked) to the
// transaction's end.
func (c *conn) writeTenantMoves(ctx context.Context) error {
	h := c.tenantsHeld
	if h == nil || len(h.moved) == 0 {
		return nil
	}
	p := &dbsqlc.TenantMoveManyParams{}
	shards := slices.SortedFunc(maps.Keys(h.moved), func(a, b tenantShard) int {
		return cmp.Or(cmp.Compare(a.tenant, b.tenant), cmp.Compare(a.shard, b.shard))
	})
	for _, at := range shards {
		m := h.moved[at]
		p.Tenants, p.Shards = append(p.Tenants, at.tenant), append(p.Shards, at.shard)
		p.FromReserved, p.ToSpent = append(p.FromReserved, m.reserved), append(p.ToSpent, m.spent)
	}
	h.moved = nil
	return wrap(c.q.TenantMoveMany(ctx, p), "settle credits on held tenant shards", "")
}

// clone is a copy that shares nothing, for a savepoint.
func (h *heldTenantShards) clone() *heldTenantShards {
	if h == nil {
		return nil
	}
	out := &heldTenantShards{reserved: maps.Clone(h.reserved)}
	if h.moved != nil {
		out.moved = make(map[tenantShard]*shardFigures, len(h.moved))
		for k, v := range h.moved {
			f := *v
			out.moved[k] = &f
		}
	}
	return out
}
