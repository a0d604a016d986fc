// Package tenants is the teams that share the fleet: creating one, its
// allowance's compare-and-swap, its weight, the view of every tenant's
// figures, and the tenant level of an admission, which starts a tenant's
// new period (receipted, once) before it reserves. Each runs in the
// transaction of the decision it belongs to.
package tenants

import (
	"context"
	"fmt"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// operatorName is the caller of the operator's changes.
const operatorName = statedir.OperatorName

// MaxWeight bounds a tenant's weight.
const MaxWeight = 1000

// DefaultMaxTenants is how many tenants a fleet may have unless told
// otherwise: each is a label value of the per-tenant metrics.
const DefaultMaxTenants = 1000

// Tenants creates and changes tenants through the ledger.
type Tenants struct {
	ledger *ledger.Ledger
	max    int // the most tenants the fleet may have
}

// New acts through l, allowing at most max tenants.
func New(l *ledger.Ledger, max int) *Tenants {
	return &Tenants{ledger: l, max: max}
}

// Max is the most tenants the fleet may have.
func (ts *Tenants) Max() int { return ts.max }

// checkRequest checks a new tenant's fields, reading no state.
func checkRequest(req wire.TenantRequest) (store.Tenant, error) {
	if req.Name == nil {
		return store.Tenant{}, fleet.Errorf(wire.CodeInvalid, "name is required")
	}
	t := store.Tenant{Name: *req.Name, Allowance: req.Allowance, Weight: 1}
	if err := budget.ValidateTenantName(t.Name); err != nil {
		return t, err
	}
	if t.Allowance != nil {
		if err := budget.ValidateAllowance(*t.Allowance); err != nil {
			return t, err
		}
	}
	if req.Period != nil {
		if err := budget.ValidatePeriod(*req.Period); err != nil {
			return t, err
		}
		t.Period = *req.Period
	}
	if req.Weight != nil {
		if err := checkWeight(*req.Weight); err != nil {
			return t, err
		}
		t.Weight = *req.Weight
	}
	return t, nil
}

func checkWeight(w int64) error {
	if w < 1 || w > MaxWeight {
		return fleet.Errorf(wire.CodeInvalid, "weight must be 1 to %d, got %d", MaxWeight, w)
	}
	return nil
}

// Create adds a tenant holding nothing, its period (if any) starting with
// the current one. A name in use is state_conflict; past the most tenants
// the fleet may have, state_conflict too.
func (ts *Tenants) Create(ctx context.Context, req wire.TenantRequest) (wire.Tenant, error) {
	t, err := checkRequest(req)
	if err != nil {
		return wire.Tenant{}, err
	}
	out, err := ledger.Write(ctx, ts.ledger, ledger.Named[wire.Tenant]("tenant-add"), func(tx *store.Tx) (wire.Tenant, error) {
		// Without it two hosts' adds would each count the tenants without
		// the other's, and both pass the most.
		if err := tx.LockTenants(ctx); err != nil {
			return wire.Tenant{}, err
		}
		all, err := tx.TenantList(ctx)
		if err != nil {
			return wire.Tenant{}, err
		}
		for _, other := range all {
			if other.Name == t.Name {
				return wire.Tenant{}, fleet.Errorf(wire.CodeStateConflict, "tenant %s exists", t.Name)
			}
		}
		if len(all) >= ts.max {
			return wire.Tenant{}, fleet.Errorf(wire.CodeStateConflict, "the fleet has its most tenants, %d (fleet-host --max-tenants)", ts.max)
		}
		t.CreatedAtMS = tx.NowMS()
		t.PeriodStartMS = budget.PeriodStart(t.Period, tx.Now).UnixMilli()
		if t.Period == wire.PeriodNone {
			t.PeriodStartMS = 0
		}
		if err := tx.TenantInsert(ctx, t); err != nil {
			return wire.Tenant{}, err
		}
		return ts.changed(ctx, tx, t, wire.DecisionAdded, wire.EventTenantAdded,
			fmt.Sprintf("The operator added the tenant %s, %s", t.Name, terms(t)))
	})
	if err == nil {
		out.Jobs = map[string]int64{} // a new tenant has none
		ts.ledger.Log.Info("tenant added", "tenant", out.Name, "allowance", out.Allowance, "period", out.Period, "weight", out.Weight)
	}
	return out, err
}

// terms says a tenant's allowance and period in words, for a title.
func terms(t store.Tenant) string {
	s := "with no allowance of its own"
	if t.Allowance != nil {
		s = fmt.Sprintf("with an allowance of %d credits", *t.Allowance)
	}
	if t.Period != wire.PeriodNone {
		s += " a " + t.Period
	}
	return fmt.Sprintf("%s, weight %d", s, t.Weight)
}

// SetAllowance changes a tenant's own allowance if it is still the
// expected one (compare-and-swap; expected null for a tenant with none).
// It may not fall below what the tenant holds (spent + reserved).
func (ts *Tenants) SetAllowance(ctx context.Context, name string, req wire.TenantAllowanceRequest) (wire.Tenant, error) {
	if req.Allowance == nil {
		return wire.Tenant{}, fleet.Errorf(wire.CodeInvalid, "allowance is required")
	}
	if err := budget.ValidateAllowance(*req.Allowance); err != nil {
		return wire.Tenant{}, err
	}
	out, err := ledger.Write(ctx, ts.ledger, ledger.Named[wire.Tenant]("tenant-allowance"), func(tx *store.Tx) (wire.Tenant, error) {
		// The compare reads the allowance after every change before it
		// committed: two hosts' changes expecting the same one are one
		// change and one conflict.
		if err := tx.LockTenants(ctx); err != nil {
			return wire.Tenant{}, err
		}
		t, err := Get(ctx, tx, name)
		if err != nil {
			return wire.Tenant{}, err
		}
		if !sameAllowance(t.Allowance, req.ExpectedAllowance) {
			return wire.Tenant{}, fleet.Errorf(wire.CodeAllowanceConflict, "tenant %s's allowance is %s, not the expected %s",
				name, shown(t.Allowance), shown(req.ExpectedAllowance))
		}
		c, err := tx.TenantSetAllowance(ctx, name, req.Allowance)
		if err != nil {
			return wire.Tenant{}, err
		}
		if !c.OK {
			return wire.Tenant{}, fleet.Errorf(wire.CodeInvalid, "allowance %d is below tenant %s's spent + reserved (%d)",
				*req.Allowance, name, c.Tenant.Spent+c.Tenant.Reserved)
		}
		return ts.changed(ctx, tx, c.Tenant, wire.DecisionAllowanceSet, wire.EventTenantAllowance,
			fmt.Sprintf("The operator set tenant %s's allowance from %s to %d", name, shown(req.ExpectedAllowance), *req.Allowance))
	})
	if err == nil {
		ts.ledger.Log.Info("tenant allowance changed", "tenant", name, "allowance", *req.Allowance, "available", out.Available)
	}
	return out, err
}

// SetWeight changes a tenant's share of claims. Every host's claims take
// it within a second (each host reads the weights again once its copy is
// a second old). Setting the weight it has changes nothing and writes
// nothing, so a change repeated after a lost answer signs no second
// receipt.
func (ts *Tenants) SetWeight(ctx context.Context, name string, req wire.TenantWeightRequest) (wire.Tenant, error) {
	if req.Weight == nil {
		return wire.Tenant{}, fleet.Errorf(wire.CodeInvalid, "weight is required")
	}
	weight := *req.Weight
	if err := checkWeight(weight); err != nil {
		return wire.Tenant{}, err
	}
	var from int64
	out, err := ledger.Write(ctx, ts.ledger, ledger.Named[wire.Tenant]("tenant-weight"), func(tx *store.Tx) (wire.Tenant, error) {
		// Under the lock the weight read is the one this change replaces,
		// whichever host made the last.
		if err := tx.LockTenants(ctx); err != nil {
			return wire.Tenant{}, err
		}
		t, err := Get(ctx, tx, name)
		if err != nil {
			return wire.Tenant{}, err
		}
		if from = t.Weight; from == weight {
			acct, err := tx.AccountingGet(ctx, store.NoLock)
			return View(t, acct, nil), err
		}
		if t, err = tx.TenantSetWeight(ctx, name, weight); err != nil {
			return wire.Tenant{}, err
		}
		return ts.changed(ctx, tx, t, wire.DecisionWeightSet, wire.EventTenantWeight,
			fmt.Sprintf("The operator set tenant %s's weight from %d to %d", name, from, weight))
	})
	if err == nil && from != weight {
		ts.ledger.Log.Info("tenant weight changed", "tenant", name, "from", from, "weight", weight)
	}
	return out, err
}

func sameAllowance(a, b *int64) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

func shown(a *int64) string {
	if a == nil {
		return "none"
	}
	return fmt.Sprint(*a)
}

// changed signs a tenant's change (a tenant receipt) and logs it, in the
// change's transaction, and answers the tenant as it now stands, without
// its jobs: a change does not count them (that reads every job).
func (ts *Tenants) changed(ctx context.Context, tx *store.Tx, t store.Tenant, decision wire.Decision, kind wire.EventKind, title string) (wire.Tenant, error) {
	acct, err := tx.AccountingGet(ctx, store.NoLock)
	if err != nil {
		return wire.Tenant{}, err
	}
	r, err := ts.ledger.IssueReceipt(tx, receipts.Draft{Kind: wire.KindTenant, OperationID: "tenant:" + t.Name,
		Caller: operatorName, Decision: decision, Accounting: acct, Tenant: t.Name})
	if err != nil {
		return wire.Tenant{}, err
	}
	view := View(t, acct, nil)
	return view, ledger.AppendEvent(ctx, tx, kind, operatorName, title,
		map[string]any{"tenant": view, "receipt_id": r.ID})
}

// Get reads a tenant; an unknown one is not_found.
func Get(ctx context.Context, tx *store.Tx, name string) (store.Tenant, error) {
	t, err := tx.TenantGet(ctx, name)
	if store.IsNotFound(err) {
		return t, fleet.Errorf(wire.CodeNotFound, "tenant %s not found", name)
	}
	return t, err
}

// View is a tenant as the operator sees it, with the fleet's figures
// bounding what it may still reserve, and its jobs by state (none shown
// when jobs is nil: not counted).
func View(t store.Tenant, fleetAcct wire.Accounting, jobs map[wire.JobState]int64) wire.Tenant {
	var counts map[string]int64
	if jobs != nil {
		counts = make(map[string]int64, len(jobs))
	}
	for state, n := range jobs {
		counts[string(state)] = n
	}
	return wire.Tenant{Name: t.Name, Allowance: t.Allowance, Spent: t.Spent, Reserved: t.Reserved, Available: Figures(t, fleetAcct).Available,
		Weight: t.Weight, Period: t.Period, PeriodStartMS: t.PeriodStartMS, CreatedAtMS: t.CreatedAtMS, Jobs: counts}
}

// Figures is a tenant's side of an admission: what it may still reserve
// is its own allowance's room, never more than the fleet's available.
func Figures(t store.Tenant, fleetAcct wire.Accounting) wire.TenantFigures {
	return wire.TenantFigures{Name: t.Name, Allowance: t.Allowance, Spent: t.Spent, Reserved: t.Reserved,
		Available: budget.Available(t.Allowance, t.Spent, t.Reserved, fleetAcct.Available)}
}

// List reads every tenant with its figures and jobs by state, and the
// fleet's figures.
func List(ctx context.Context, db *store.DB) (wire.TenantsList, error) {
	out := wire.TenantsList{Tenants: []wire.Tenant{}}
	err := db.Read(ctx, func(tx *store.Tx) error {
		all, err := tx.TenantList(ctx)
		if err != nil {
			return err
		}
		counts, err := tx.JobCountByTenant(ctx)
		if err != nil {
			return err
		}
		if out.Fleet, err = tx.AccountingGet(ctx, store.NoLock); err != nil {
			return err
		}
		for _, t := range all {
			jobs := counts[t.Name]
			if jobs == nil {
				jobs = map[wire.JobState]int64{} // counted: none
			}
			out.Tenants = append(out.Tenants, View(t, out.Fleet, jobs))
		}
		return nil
	})
	return out, err
}
