package wire

// DefaultTenant is the tenant a report that names none is in, and the one
// an older state's jobs and figures moved into.
const DefaultTenant = "default"

// Periods a tenant's spending may start again after, in UTC: a day from
// midnight, a week from Monday's midnight, a month from its first day's.
const (
	PeriodNone  = ""
	PeriodDay   = "day"
	PeriodWeek  = "week"
	PeriodMonth = "month"
)

// Budget levels a reservation is made at, each its own allowance: the
// fleet's, a tenant's, a credential's (an agent's own cap).
const (
	LevelFleet      = "fleet"
	LevelTenant     = "tenant"
	LevelCredential = "credential"
)

// Tenant is a team sharing the fleet, as GET /admin/tenants shows it.
type Tenant struct {
	Name string `json:"name"`
	// Allowance is the tenant's own cap in credits; null when only the
	// fleet's allowance bounds it.
	Allowance *int64 `json:"allowance"`
	// Spent counts the current period's settlements (every one, with no
	// period); Reserved is what its running jobs hold.
	Spent    int64 `json:"spent"`
	Reserved int64 `json:"reserved"`
	// Available is what the tenant may still reserve: its own allowance's
	// room, never more than the fleet's.
	Available     int64            `json:"available"`
	Weight        int64            `json:"weight"`
	Period        string           `json:"period"` // "", day, week or month
	PeriodStartMS int64            `json:"period_start_ms"`
	CreatedAtMS   int64            `json:"created_at_ms"`
	Jobs          map[string]int64 `json:"jobs,omitzero"` // by state; left out where not counted (a change's answer and event)
}

// TenantsList is GET /admin/tenants.
type TenantsList struct {
	Tenants []Tenant   `json:"tenants"`
	Fleet   Accounting `json:"fleet"`
}

// TenantRequest is POST /admin/tenants.
type TenantRequest struct {
	Name      *string `json:"name"`
	Allowance *int64  `json:"allowance,omitempty"`
	Period    *string `json:"period,omitempty"`
	Weight    *int64  `json:"weight,omitempty"`
}

// TenantAllowanceRequest is POST /admin/tenants/{name}/allowance: a
// compare-and-swap of the tenant's own allowance, null for none.
type TenantAllowanceRequest struct {
	ExpectedAllowance *int64 `json:"expected_allowance"`
	Allowance         *int64 `json:"allowance"`
}

// TenantWeightRequest is POST /admin/tenants/{name}/weight: the tenant's
// share of claims from then on.
type TenantWeightRequest struct {
	Weight *int64 `json:"weight"`
}

// TenantFigures is a level's side of an admission (a tenant's, or a
// credential's): its own allowance (null for none), what it has spent
// (this period, for a tenant) and holds reserved, and what it may still
// reserve (never more than the fleet's available).
type TenantFigures struct {
	Name      string `json:"name"`
	Allowance *int64 `json:"allowance"`
	Spent     int64  `json:"spent"`
	Reserved  int64  `json:"reserved"`
	Available int64  `json:"available"`
}
