package sqlite

import (
	"context"
	"maps"
	"slices"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/sqlite/dbsqlc"
)

// ahead is what a write transaction has decided at tenants (tenants.go)
// and at the fleet's allowance (allowance.go) and not yet written: each
// as its decisions left it, with what they changed. SQLite's one writer
// holds those rows, so the decisions are made here, on the figures read
// at the first, with the guards the UPDATEs would have had, and written
// once (writeAhead).
type ahead struct {
	cost    int64 // the fleet's cost per report, a reservation's
	tenants map[string]*aheadTenant
	fleet   *aheadAllowance // nil until the transaction touches the allowance
}

func newAhead(cost int64) *ahead {
	return &ahead{cost: cost, tenants: map[string]*aheadTenant{}}
}

type aheadTenant struct {
	store.Tenant
	reserved, spent int64 // this transaction's changes, not yet written
}

func (a *ahead) clone() *ahead {
	if a == nil {
		return nil
	}
	b := &ahead{cost: a.cost, tenants: make(map[string]*aheadTenant, len(a.tenants))}
	for name, t := range a.tenants {
		copied := *t
		b.tenants[name] = &copied
	}
	if a.fleet != nil {
		fleet := *a.fleet
		b.fleet = &fleet
	}
	return b
}

// writeAhead writes what this transaction decided, a statement a tenant
// and one for the allowance, and forgets the figures: anything that reads
// or writes those rows otherwise, and the commit, come after it.
func (c *conn) writeAhead(ctx context.Context) error {
	a := c.ahead
	if a == nil {
		return nil
	}
	c.ahead = nil
	for _, name := range slices.Sorted(maps.Keys(a.tenants)) {
		t := a.tenants[name]
		if t.reserved == 0 && t.spent == 0 {
			continue
		}
		if err := c.q.TenantApply(ctx, &dbsqlc.TenantApplyParams{Reserved: t.reserved, Spent: t.spent, Name: name}); err != nil {
			return wrap(err, "write tenant figures", name)
		}
	}
	if f := a.fleet; f != nil && (f.changed != aheadChange{}) {
		if err := c.q.AccountingApply(ctx, &dbsqlc.AccountingApplyParams{Reserved: f.changed.reserved, Spent: f.changed.spent,
			Calls: f.changed.calls}); err != nil {
			return wrap(err, "write the allowance's figures", "")
		}
	}
	return nil
}
