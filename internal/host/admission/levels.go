package admission

import (
	"context"
	"fmt"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/tenants"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// levels is an admission's reservation at each budget level, and the
// level that was short ("" when every one covered it).
type levels struct {
	tenant     store.TenantReservation
	credential *store.CredentialReservation // nil for a credential with no allowance of its own
	fleet      store.Reservation
	short      string
	job        store.Job
}

// reserveLevels reserves the cost per report at every level that applies,
// in the admission's transaction, all or none: the job's tenant, the
// caller's own allowance when its credential has one, then the fleet. A
// level that is short leaves nothing reserved at any (what the levels
// before it reserved goes back); the fleet's figures are read either way.
func reserveLevels(ctx context.Context, l *ledger.Ledger, tx *store.Tx, caller fleet.Caller, j store.Job) (levels, error) {
	lv := levels{job: j, fleet: store.Reservation{Shard: -1}}
	var err error
	if lv.tenant, err = tenants.Reserve(ctx, l, tx, caller.ID, j.Tenant); err != nil {
		return lv, err
	}
	switch {
	case !lv.tenant.OK:
		lv.short = wire.LevelTenant
	case caller.Capped:
		cr, err := tx.CredentialReserve(ctx, caller.ID)
		if err != nil {
			return lv, err
		}
		lv.credential = &cr
		if !cr.OK {
			lv.short = wire.LevelCredential
		}
	}
	if lv.short == "" {
		if lv.fleet, err = tx.AccountingReserve(ctx); err != nil || lv.fleet.OK {
			return lv, err
		}
		lv.short = wire.LevelFleet
	} else if lv.fleet.Accounting, err = tx.AccountingGet(ctx, store.NoLock); err != nil {
		return lv, err
	}
	return lv, lv.giveBack(ctx, tx)
}

// giveBack returns what the levels before the short one reserved.
func (lv *levels) giveBack(ctx context.Context, tx *store.Tx) error {
	cost, j := lv.fleet.Accounting.CostPerReport, lv.job
	if lv.credential != nil && lv.credential.OK {
		ok, err := tx.CredentialMove(ctx, &store.CredentialMoveParams{Name: lv.credential.Credential.Name, FromReserved: cost})
		if err == nil && !ok {
			err = fmt.Errorf("dispatch %s: credential %s no longer holds the %d credits just reserved", j.OperationID, lv.credential.Credential.Name, cost)
		}
		if err != nil {
			return err
		}
		lv.credential.Credential.Reserved -= cost
	}
	if !lv.tenant.OK {
		return nil
	}
	ok, err := tx.TenantMove(ctx, &store.TenantMoveParams{Tenant: j.Tenant, Shard: lv.tenant.Shard, FromReserved: cost})
	if err == nil && !ok {
		err = fmt.Errorf("dispatch %s: tenant %s no longer holds the %d credits just reserved", j.OperationID, j.Tenant, cost)
	}
	lv.tenant.Tenant.Reserved -= cost
	return err
}

// credentialHeld names the credential whose own allowance holds part of
// the reservation ("" for none, or a denial).
func (lv *levels) credentialHeld() string {
	if lv.short != "" || lv.credential == nil {
		return ""
	}
	return lv.credential.Credential.Name
}

// admission is the decision the levels make: its answer (each level's
// figures, and on a denial the level that was short and why), the cost
// it reserved and its event's kind.
func (lv *levels) admission() (adm wire.Admission, cost int64, kind wire.EventKind) {
	acct := lv.fleet.Accounting
	tenant := tenants.Figures(lv.tenant.Tenant, acct)
	adm = wire.Admission{Decision: wire.DecisionAllow, Accounting: acct, Tenant: &tenant,
		Reason: fmt.Sprintf("reserved %d credits; %d of %d available", acct.CostPerReport, acct.Available, acct.Allowance)}
	if lv.credential != nil {
		c := lv.credential.Credential
		figures := tenants.Figures(store.Tenant{Name: c.Name, Allowance: c.Allowance, Spent: c.Spent, Reserved: c.Reserved}, acct)
		adm.Credential = &figures
	}
	if lv.short == "" {
		return adm, acct.CostPerReport, wire.EventAllowed
	}
	adm.Decision, adm.Level = wire.DecisionDeny, lv.short
	switch lv.short {
	case wire.LevelTenant:
		adm.Reason = fmt.Sprintf("tenant %s's allowance exhausted: %d credits available, %d needed", lv.job.Tenant, tenant.Available, acct.CostPerReport)
	case wire.LevelCredential:
		adm.Reason = fmt.Sprintf("credential %s's own allowance exhausted: %d credits available, %d needed", adm.Credential.Name,
			adm.Credential.Available, acct.CostPerReport)
	default:
		adm.Reason = fmt.Sprintf("the fleet's allowance exhausted: %d credits available, %d needed", acct.Available, acct.CostPerReport)
	}
	return adm, 0, wire.EventDenied
}
