package verify

import (
	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// levelLedger is one level's receipts (the fleet's, a tenant's, a
// credential's), summed: what they admitted and released, all they
// settled, and what they settled since the last rollover (a tenant's
// current period's spent).
type levelLedger struct {
	admitted, released, settled, settledInPeriod int64
}

// checkTenants: each tenant's figures never negative nor over its own
// allowance, its spent what its receipts settle since its last rollover
// (each rollover's cost what they settled in the period it ended), its
// reserved what its jobs hold and what its receipts admit and release
// less all they settle. A receipt that names no tenant (a build's before
// tenants) is the tenant default's.
func checkTenants(rep *Report, tenants []store.Tenant, chain []wire.Receipt, all []store.Job) {
	ledgers := levelLedgers(rep, chain)
	held := map[string]int64{}
	for _, j := range all {
		held[j.Tenant] += j.Reserved
	}
	for _, t := range tenants {
		l := ledgers[t.Name]
		if l == nil {
			l = &levelLedger{}
		}
		rep.Tenants = append(rep.Tenants, wire.TenantFigures{Name: t.Name, Allowance: t.Allowance, Spent: t.Spent, Reserved: t.Reserved,
			Available: budget.Available(t.Allowance, t.Spent, t.Reserved, rep.Accounting.Available)})
		checkTenant(rep, "tenant", t, l, held[t.Name])
		delete(ledgers, t.Name)
	}
	for name := range ledgers {
		rep.bad("receipts name tenant %s, which the state does not hold", name)
	}
}

// levelLedgers sums each tenant's receipts, in chain order, checking
// each rollover's cost against what its period settled.
func levelLedgers(rep *Report, chain []wire.Receipt) map[string]*levelLedger {
	ledgers := map[string]*levelLedger{}
	for _, r := range chain {
		name := r.Tenant
		if name == "" {
			name = wire.DefaultTenant
		}
		l := ledgers[name]
		if l == nil {
			l = &levelLedger{}
			ledgers[name] = l
		}
		if r.Kind == wire.KindRollover {
			if r.Cost != l.settledInPeriod {
				rep.bad("receipt %s ends tenant %s's period at %d spent but its receipts settle %d in it", r.ID, name, r.Cost, l.settledInPeriod)
			}
			l.settledInPeriod = 0
		}
		l.add(r)
	}
	return ledgers
}

// add counts what a job's receipt admits, settles and releases.
func (l *levelLedger) add(r wire.Receipt) {
	switch {
	case r.Kind == wire.KindAdmission && r.Decision == wire.DecisionAllow:
		l.admitted += r.Cost
	case r.Kind == wire.KindPublication, r.Kind == wire.KindCancellation, r.Kind == wire.KindRequeue, r.Kind == wire.KindFailure:
		l.settled += r.Cost
		l.settledInPeriod += r.Cost
		if r.Reserved != nil {
			l.released += *r.Reserved - r.Cost
		}
	}
}

// checkTenant checks one level's figures (a tenant's, or a credential's) against its ledger and the
// reservations its jobs hold.
func checkTenant(rep *Report, what string, t store.Tenant, l *levelLedger, held int64) {
	if t.Spent < 0 || t.Reserved < 0 || (t.Allowance != nil && t.Spent+t.Reserved > *t.Allowance) {
		rep.bad("%s %s's figures are out of bounds: spent %d, reserved %d, allowance %v", what, t.Name, t.Spent, t.Reserved, shown(t.Allowance))
	}
	if t.Spent != l.settledInPeriod {
		rep.bad("%s %s's spent is %d but its receipts settle %d this period", what, t.Name, t.Spent, l.settledInPeriod)
	}
	if t.Reserved != held {
		rep.bad("%s %s's reserved is %d but its jobs hold %d", what, t.Name, t.Reserved, held)
	}
	if l.admitted-l.released-l.settled != t.Reserved {
		rep.bad("%s %s's reserved is %d but its receipts admit %d, release %d and settle %d", what, t.Name, t.Reserved, l.admitted, l.released, l.settled)
	}
}

func shown(a *int64) any {
	if a == nil {
		return "none"
	}
	return *a
}

// checkCredentials: each credential with an allowance of its own holds
// figures within it, its spent what the receipts that name it settle, its
// reserved what the jobs it holds a part of hold and what those receipts
// admit and release less all they settle.
func checkCredentials(rep *Report, creds []store.Credential, chain []wire.Receipt, all []store.Job) {
	ledgers := map[string]*levelLedger{}
	for _, r := range chain {
		if r.Credential == "" {
			continue
		}
		l := ledgers[r.Credential]
		if l == nil {
			l = &levelLedger{}
			ledgers[r.Credential] = l
		}
		l.add(r)
	}
	held := map[string]int64{}
	for _, j := range all {
		if j.ReserveCredential != "" {
			held[j.ReserveCredential] += j.Reserved
		}
	}
	for _, c := range creds {
		l := ledgers[c.Name]
		delete(ledgers, c.Name)
		if c.Allowance == nil {
			continue
		}
		if l == nil {
			l = &levelLedger{}
		}
		rep.Credentials = append(rep.Credentials, wire.TenantFigures{Name: c.Name, Allowance: c.Allowance, Spent: c.Spent, Reserved: c.Reserved,
			Available: budget.Available(c.Allowance, c.Spent, c.Reserved, rep.Accounting.Available)})
		checkTenant(rep, "credential", store.Tenant{Name: c.Name, Allowance: c.Allowance, Spent: c.Spent, Reserved: c.Reserved}, l, held[c.Name])
	}
	for name := range ledgers {
		rep.bad("receipts hold credits at credential %s, which has no allowance of its own", name)
	}
}
