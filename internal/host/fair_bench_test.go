package host_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// BenchmarkFairClaim: a claim of one job, then its release (so the queue
// and what is in flight stay as they are), through the host: with 1,000
// jobs queued in one tenant, and with 100,000 across 100 tenants of equal
// weight, on SQLite and on PostgreSQL (with FLEET_TEST_POSTGRES_URL). The
// fair claim reads the tenants with queued jobs a seek each and takes
// the chosen tenant's jobs through its own range of jobs_claimable, so
// the queue's length costs it nothing; the number of tenants with work
// costs it a seek each.
//
//	go test ./internal/host -run '^$' -bench FairClaim -benchtime 300x
func BenchmarkFairClaim(b *testing.B) {
	for _, backend := range []string{storetest.SQLite, storetest.Postgres} {
		b.Run(backend, func(b *testing.B) {
			if backend == storetest.Postgres && storetest.PostgresURL() == "" {
				b.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
			}
			for _, c := range []struct{ jobs, tenants int }{{1_000, 1}, {100_000, 100}} {
				b.Run(fmt.Sprintf("%d-jobs-%d-tenants", c.jobs, c.tenants), func(b *testing.B) {
					benchFairClaim(b, c.jobs, c.tenants)
				})
			}
		})
	}
}

func benchFairClaim(b *testing.B, jobs, tenants int) {
	ctx := context.Background()
	f := newState(b, 100, 20, 1, func(m map[string]any) { m["sections"] = []string{"summary"} })
	h := f.open(b)
	names := []string{wire.DefaultTenant}
	for i := 1; i < tenants; i++ {
		name := fmt.Sprintf("team-%03d", i)
		weight := int64(1)
		if _, err := h.Tenants().Create(ctx, wire.TenantRequest{Name: &name, Weight: &weight}); err != nil {
			b.Fatal(err)
		}
		names = append(names, name)
	}
	for i, per := 0, jobs/tenants; i < tenants; i++ {
		for n := 0; n < per; n += 64 {
			doc, key, tenant := "Bench document.", fmt.Sprint("b", i, "-", n), names[i]
			if _, err := h.Operator().SubmitReports(ctx, wire.ReportsRequest{Document: &doc,
				Sections: slices.Repeat([]string{"terms"}, min(64, per-n)), IdempotencyKey: &key, Tenant: &tenant}); err != nil {
				b.Fatal(err)
			}
		}
	}
	w := caller("worker-1")
	for b.Loop() {
		res, err := h.Claims().Claim(ctx, w, 0, 1)
		if err != nil || res.Job == nil {
			b.Fatalf("claim: %+v, %v", res, err)
		}
		if _, err := h.Claims().Release(ctx, w, res.Job.OperationID, refOf(*res.Job)); err != nil {
			b.Fatal(err)
		}
	}
}
