package tenants

import (
	"context"
	"fmt"
	"time"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Reserve is an admission's tenant level, in the admission's
// transaction: the fleet's cost per report reserved at the tenant if its
// own allowance covers it. A tenant whose period has ended starts its new
// one here first (Rollover), so a period's spent is never judged on the
// figures of the one before. caller is the admission's.
func Reserve(ctx context.Context, l *ledger.Ledger, tx *store.Tx, caller, name string) (store.TenantReservation, error) {
	r, err := tx.TenantReserve(ctx, name)
	if err != nil {
		return r, err
	}
	start, due := budget.PeriodDue(r.Tenant.Period, r.Tenant.PeriodStartMS, tx.Now)
	if !due {
		return r, nil
	}
	rolled, err := Rollover(ctx, l, tx, caller, r.Tenant, start)
	switch {
	case err != nil:
		return r, err
	case r.OK:
		if rolled {
			r.Tenant.Spent, r.Tenant.PeriodStartMS = 0, start
		}
		return r, nil
	}
	// Refused on the ended period's figures: decide on the new one's.
	return tx.TenantReserve(ctx, name)
}

// Rollover starts t's period at startMS if t's period still starts where
// t says: its spent starts again at 0 and its reservations carry over.
// The one transaction that does it signs a rollover receipt (its cost is
// what the ended period spent) and appends the event; rolled is false
// for any other (another host's admission started it first).
func Rollover(ctx context.Context, l *ledger.Ledger, tx *store.Tx, caller string, t store.Tenant, startMS int64) (rolled bool, err error) {
	res, err := tx.TenantRollover(ctx, &store.TenantRolloverParams{Tenant: t.Name, IfPeriodStartMS: t.PeriodStartMS, PeriodStartMS: startMS})
	if err != nil || !res.OK {
		return false, err
	}
	acct, err := tx.AccountingGet(ctx, store.NoLock)
	if err != nil {
		return false, err
	}
	receipt, err := l.IssueReceipt(tx, receipts.Draft{Kind: wire.KindRollover, OperationID: "tenant:" + t.Name, Caller: caller,
		Decision: wire.DecisionPeriodStarted, Cost: res.EndedSpent, Accounting: acct, Tenant: t.Name})
	if err != nil {
		return false, err
	}
	began := time.UnixMilli(startMS).UTC().Format(time.DateOnly)
	return true, ledger.AppendEvent(ctx, tx, wire.EventPeriodStarted, caller,
		fmt.Sprintf("Tenant %s's %s from %s began: %d credits spent in the one before", t.Name, t.Period, began, res.EndedSpent),
		map[string]any{"tenant": t.Name, "period": t.Period, "period_start_ms": startMS, "ended_spent": res.EndedSpent,
			"reserved": t.Reserved, "receipt_id": receipt.ID})
}
