package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestJobKeysMigration: jobs enqueued before migration 20 get their keys
// (job_keys) when the database is opened, so pages, filters and a
// document's tenant find them, and the next job is enqueued after them.
func TestJobKeysMigration(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	ctx := context.Background()
	location := storetest.NewPostgresLocation(t)
	if err := postgres.CreateAtVersion(ctx, location, 19); err != nil {
		t.Fatal(err)
	}
	execAll(t, location,
		`INSERT INTO batches (idempotency_key, request_sha256, document, created_at_ms) VALUES ('seed', '', '', 0)`,
		`INSERT INTO documents (id, version, body, owner, generation, updated_at_ms)
			SELECT 'doc-' || i, 0, 'null', '', 0, 0 FROM generate_series(1, 3) AS i`,
		`INSERT INTO jobs (operation_id, position, batch_key, section, document_id, input_sha256, state, created_at_ms, updated_at_ms,
			priority, tenant)
			VALUES ('op-1', 1, 'seed', 'summary', 'doc-1', '', 'completed', 1, 1, 2, 'default'),
				('op-2', 2, 'seed', 'terms', 'doc-2', '', 'queued', 2, 2, 1, 'acme'),
				('op-3', 3, 'seed', 'summary', 'doc-3', '', 'queued', 3, 3, 2, 'acme')`,
	)
	db := storetest.MustOpen(t, location)
	storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
		page := func(f store.JobFilter) []string {
			t.Helper()
			jobs, err := tx.JobPage(ctx, &store.JobPageParams{Filter: f, Limit: 10})
			if err != nil {
				t.Fatal(err)
			}
			ops := []string{}
			for _, j := range jobs {
				ops = append(ops, j.OperationID)
			}
			return ops
		}
		for what, got := range map[string][]string{
			"op-1 op-2 op-3": page(store.JobFilter{}),
			"op-1 op-3":      page(store.JobFilter{Section: "summary"}),
			"op-2 op-3":      page(store.JobFilter{Tenant: "acme"}),
			"op-2":           page(store.JobFilter{Priority: 1}),
			"op-3":           page(store.JobFilter{State: wire.Queued, Section: "summary"}),
		} {
			if joined := strings.Join(got, " "); joined != what {
				t.Errorf("a page after the migration: %s, want %s", joined, what)
			}
		}
		if tenant, err := tx.JobTenantOfDocument(ctx, "doc-2"); err != nil || tenant != "acme" {
			t.Errorf("doc-2's tenant after the migration: %q (%v)", tenant, err)
		}
		if last, err := tx.JobMaxPosition(ctx); err != nil || last != 3 {
			t.Errorf("the last position after the migration: %d (%v)", last, err)
		}
		return nil
	})
}
