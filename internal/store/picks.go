package store

import (
	"strconv"

	"github.com/fleet/fleet/internal/wire"
)

// JobClaimManyParams claims up to Max jobs of one tenant.
type JobClaimManyParams struct {
	// Tenant is the tenant whose jobs are claimed ("" is wire.DefaultTenant).
	Tenant           string
	Max              int
	ClaimPrefix      string
	Worker           string
	ClaimHost        string
	LeaseExpiresAtMS int64
	NowMS            int64
	// UnlessPaused makes the claim take nothing while claims are paused
	// (ClaimsSetting), read in the claim's own statement: a claim then
	// costs no round trip of its own to read the pause (host/pause).
	UnlessPaused bool
	// Owners, for a pick (JobPickMany) made for several claims at once,
	// are whom its jobs go to: one job to each, up to Max (at most
	// len(Owners)), the first jobs picked to the first owners (which job to
	// which owner is the backend's); Worker and ClaimPrefix are then
	// unused. The claims share the pick's statement rather than each
	// paying its own.
	Owners []ClaimOwner
}

// ClaimOwner is one claim of a pick made for several: the worker its jobs
// go to and its claim ids' prefix.
type ClaimOwner struct {
	Worker      string
	ClaimPrefix string
}

// TenantOrDefault is the tenant whose jobs are claimed.
func (p *JobClaimManyParams) TenantOrDefault() string {
	if p.Tenant == "" {
		return wire.DefaultTenant
	}
	return p.Tenant
}

// Owner is whom the slot-th job picked (from 1) goes to.
func (p *JobClaimManyParams) Owner(slot int) ClaimOwner {
	if slot >= 1 && slot <= len(p.Owners) {
		return p.Owners[slot-1]
	}
	return ClaimOwner{Worker: p.Worker, ClaimPrefix: p.ClaimPrefix}
}

// OwnerNames are the workers of Owners, in order, for a statement that
// assigns the picked jobs' documents.
func (p *JobClaimManyParams) OwnerNames() []string {
	names := make([]string, len(p.Owners))
	for i, o := range p.Owners {
		names[i] = o.Worker
	}
	return names
}

// Claimed is j as JobClaimMany leaves it when it claims j under p, as the
// slot-th job it took (from 1; Owner): what JobPickMany answers for the
// jobs it picks.
func (p *JobClaimManyParams) Claimed(j Job, slot int) Job {
	o := p.Owner(slot)
	j.State, j.ClaimID = wire.Claimed, o.ClaimPrefix+strconv.FormatInt(j.Position, 10)
	j.Worker, j.ClaimHost, j.LeaseExpiresAtMS, j.Reason = o.Worker, p.ClaimHost, p.LeaseExpiresAtMS, ""
	j.ClaimedAtMS, j.StartedAtMS, j.FinishedAtMS, j.UpdatedAtMS = p.NowMS, 0, 0, p.NowMS
	j.Owner = o.Worker
	return j
}
