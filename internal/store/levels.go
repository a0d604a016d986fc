package store

import (
	"strings"

	"github.com/fleet/fleet/internal/wire"
)

// The budget levels' parameters and outcomes (Executor's Accounting,
// Tenant and Credential operations): the fleet's allowance, a tenant's
// and a credential's own.

// AccountingInsertParams creates the allowance.
type AccountingInsertParams struct {
	Allowance     int64
	CostPerReport int64
}

// Reservation is AccountingReserve's outcome.
type Reservation struct {
	Accounting wire.Accounting
	Shard      int64 // where it is held; -1 when refused
	OK         bool
}

// AccountingMoveParams settles a reservation.
type AccountingMoveParams struct {
	Shard        int64 // where the reservation is held; -1 for any
	FromReserved int64
	ToSpent      int64
}

// Settlement is AccountingMove's outcome.
type Settlement struct {
	Accounting wire.Accounting
	OK         bool
}

// Tenant is a team sharing the fleet: its own figures (spent in the
// current period, reserved) and its terms.
type Tenant struct {
	Name string
	// Allowance is the tenant's own cap; nil when only the fleet's bounds it.
	Allowance     *int64
	Spent         int64
	Reserved      int64
	Weight        int64
	Period        string // "", day, week or month
	PeriodStartMS int64
	CreatedAtMS   int64
}

// CredentialReservation is CredentialReserve's outcome.
type CredentialReservation struct {
	Credential Credential
	OK         bool
}

// CredentialMoveParams settles a credential's part of a reservation.
type CredentialMoveParams struct {
	Name         string
	FromReserved int64
	ToSpent      int64
}

// TenantChange is TenantSetAllowance's outcome.
type TenantChange struct {
	Tenant Tenant
	OK     bool
}

// TenantReservation is TenantReserve's outcome: the tenant as it stands
// after it.
type TenantReservation struct {
	Tenant Tenant
	Shard  int64 // where it is held; -1 when refused
	OK     bool
}

// TenantMoveParams settles a tenant's part of a reservation.
type TenantMoveParams struct {
	Tenant       string
	Shard        int64 // where it is held; -1 for any
	FromReserved int64
	ToSpent      int64
}

// TenantRolloverParams starts a tenant's new period.
type TenantRolloverParams struct {
	Tenant          string
	IfPeriodStartMS int64
	PeriodStartMS   int64
}

// TenantRolled is TenantRollover's outcome.
type TenantRolled struct {
	OK         bool
	EndedSpent int64
}

// JoinTenants is how a credential's tenants are stored: their names,
// which hold no comma, comma-separated (” for every tenant).
func JoinTenants(tenants []string) string { return strings.Join(tenants, ",") }

// SplitTenants reads a credential's stored tenants (nil for every tenant).
func SplitTenants(stored string) []string {
	if stored == "" {
		return nil
	}
	return strings.Split(stored, ",")
}
