package host_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// submit queues n jobs of tenant (in reports of up to 64) at priority.
func submit(t *testing.T, h *host.Host, tenant string, n int, priority int64) []string {
	t.Helper()
	var ops []string
	for i := 0; n > 0; i++ {
		k := min(n, 64)
		doc, key := "Fair text. It must be read.", fmt.Sprintf("%s-%d-%d-%d", tenant, priority, len(ops), i)
		res, err := h.Operator().SubmitReports(context.Background(), wire.ReportsRequest{Document: &doc,
			Sections: slices.Repeat([]string{"summary"}, k), IdempotencyKey: &key, Tenant: &tenant, Priority: &priority})
		if err != nil {
			t.Fatal(err)
		}
		ops, n = append(ops, res.OperationIDs...), n-k
	}
	return ops
}

func addTenant(t *testing.T, h *host.Host, name string, weight int64) {
	t.Helper()
	if _, err := h.Tenants().Create(context.Background(), wire.TenantRequest{Name: &name, Weight: &weight}); err != nil {
		t.Fatal(err)
	}
}

// claimTenants claims n jobs one at a time, leaving them in flight, and
// answers each one's tenant.
func claimTenants(t *testing.T, h *host.Host, n int) []string {
	t.Helper()
	var out []string
	for range n {
		res, err := h.Claims().Claim(context.Background(), caller("worker-1"), 0, 1)
		if err != nil || res.Job == nil {
			t.Fatalf("claim: %+v, %v", res, err)
		}
		d, err := h.Views().Job(context.Background(), res.Job.OperationID)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d.Tenant)
	}
	return out
}

// TestFairClaims, on both backends: a tenant that submits ten jobs
// behind another's five thousand has all ten claimed within the next
// twenty (equal weights); claims take tenants in proportion to their
// weights, as they are changed; within a tenant, by priority.
func TestFairClaims(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		f := newState(t, 1_000_000, 1, 2)
		clock := storetest.NewClock(time.Now()) // after the state's jobs were made: they are claimable
		h := f.openAs(t, "", clock)
		// The sample's four jobs (default's) go first, as anything queued would.
		claimTenants(t, h, 4)
		addTenant(t, h, "team-a", 1)
		addTenant(t, h, "team-b", 1)
		submit(t, h, "team-a", 5000, wire.DefaultPriority)
		claimTenants(t, h, 5)
		submit(t, h, "team-b", 9, wire.DefaultPriority)
		urgent := submit(t, h, "team-b", 1, wire.MinPriority)[0]
		next := claimTenants(t, h, 20)
		if n := countOf(next, "team-b"); n != 10 {
			t.Fatalf("of the 20 claims after team-b's ten arrived, %d were team-b's: %v", n, next)
		}
		// team-b's priority-1 job was the first of its jobs claimed.
		d, err := h.Views().Job(context.Background(), urgent)
		if err != nil || d.State != wire.Claimed {
			t.Fatalf("team-b's priority-1 job: %s (%v)", d.State, err)
		}

		// Weights 3 to 1: three of every four claims go to the heavier. A
		// host reads the weights again once its copy is a second old.
		addTenant(t, h, "heavy", 3)
		addTenant(t, h, "light", 1)
		clock.Advance(2 * time.Second)
		submit(t, h, "heavy", 100, wire.DefaultPriority)
		submit(t, h, "light", 100, wire.DefaultPriority)
		// team-a's backlog is in flight by now more than the new tenants'.
		got := claimTenants(t, h, 40)
		if heavy, light := countOf(got, "heavy"), countOf(got, "light"); heavy != 30 || light != 10 {
			t.Fatalf("40 claims with weights 3 and 1: heavy %d, light %d, the rest %d: %v", heavy, light, 40-heavy-light, got)
		}

		// The weights turned round, 1 and 3, and read again: light, with a
		// third of heavy's in flight and three times its weight, takes the
		// next twenty (team-a's fifteen in flight keep it behind light too).
		for name, weight := range map[string]int64{"heavy": 1, "light": 3} {
			if _, err := h.Tenants().SetWeight(context.Background(), name, wire.TenantWeightRequest{Weight: &weight}); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(2 * time.Second)
		if got := claimTenants(t, h, 20); countOf(got, "light") != 20 {
			t.Fatalf("20 claims after the weights turned to 1 and 3: %v", got)
		}
	})
}

func countOf(tenants []string, name string) int {
	n := 0
	for _, t := range tenants {
		if t == name {
			n++
		}
	}
	return n
}
